"""Out-of-core training: graphstore's mega-batch and disk schemes against DGL + numpy memmap.

One run, one machine, one synthetic node-classification store whose features are several
times a cgroup v1 memory cap (the page cache counts against it). Each system trains the
same 2-layer GraphSage (hidden 128, mean aggregator, Adam) on the same fixed subset of
training nodes, with the same fanouts and batch size, in its own child process, after
dropping the page cache.

Systems
-------
graphstore (``NodeLoader``), capped unless said otherwise:

* ``graphstore-megabatch-paper``: HierBatching as the paper configures it: scheme
  ``megabatch``, a static cache of the 1 % highest-degree nodes, ``reuse=2`` (two passes
  over each mega-batch's targets, so twice the samples per epoch), and a capacity of at
  least p/16 partitions (4 of 64): what ``buffer_bytes`` admits when that is more,
  otherwise exactly p/16 (the row records the budget's own answer as ``budget_capacity``;
  the cap then decides whether it fits). A budget that refuses the cache at any capacity is
  reported as a row (``refused``), not worked around. These rows run under DGL's wide cap
  (below) with the budget it leaves, not under the cap: the paper's capacity and cache need
  more than the cap's 448 MiB budget on the full store, and so the comparison with DGL +
  memmap, which needs that memory for its structure, is at equal memory.
* ``graphstore-megabatch-paper-stream``: the same on ``--store-stream``, a conversion of the
  same dataset by the large-graph default partitioner (``--partitioner stream``), trained
  and tested on the same source nodes. Without ``--store-stream`` the row says it was skipped.
* ``graphstore-megabatch``: capacity from ``buffer_bytes`` (the cap minus the process's own
  memory), no static cache, ``reuse=1`` so every target is trained once an epoch, as DGL
  does; ``-reuse2``: the same with two passes (twice the samples: compare samples/s);
  ``-cache``: the 1 % static cache at ``reuse=1``.
* ``graphstore-disk``: scheme ``disk`` (the loader picks ``sequential`` when every training
  partition fits, else ``dispersed``), capacity from the same budget.
* ``graphstore-memory``: scheme ``minibatch`` (the whole store resident), no cap.

DGL 1.1.3 (in its own interpreter, ``--dgl-python``), on a graph built from a CSC alone
(``formats("csc")``: no COO/CSR copies) with int64 ids (with int32 ids DGL 1.1.3 under torch
2.13 corrupts its heap: ``COOToCSR`` check failures, segfaults in ``gspmm``), features in a
``np.memmap`` of a raw float32 file in store order:

* ``dgl-memmap``: DGL at its best. ``NeighborSampler`` + ``DataLoader`` whose workers each
  sample a batch *and* gather its feature rows and labels (`GatheringSampler`), so the
  workers overlap the page faults; rows are gathered in ascending id order and put back in
  the block's order (`gather_rows_sorted`); the map has ``MADV_RANDOM`` (without it a fault
  reads up to ``read_ahead_kb``, 8 MiB on this disk, for a 512-byte row). Run once per
  ``--dgl-workers`` setting (0, 2, 4, 8; workers persistent across epochs); the row is the
  fastest setting's (warm-epoch median), ``num_workers_results`` keeps every setting's row
  and ``best_num_workers`` names the best.
* ``dgl-memmap-readahead``: the same without the madvise, at the best ``num_workers``,
  stopped after a time budget and its epoch projected (it is the slowest by far).

If a DGL run is killed by the cap (its structure does not fit beside the features' page
cache), it runs again under a wide cap, the cap plus its structure plus 512 MiB (the same
room for the page cache); the row is then named ``...-widecap`` and says which settings the
cap killed.

Timing (the same on both sides)
-------------------------------
At least 2 epochs per system (``--epochs``, ``--dgl-epochs``); the reported epoch time is
the median of the warm epochs (epochs >= 1), and the cold epoch 0 is reported apart (the
first state's read; for ``graphstore-memory`` the whole store's; for DGL a cold page cache
and the workers' start). Per epoch: wall and process CPU time, time waiting on the loader's
iterator (the rest is the model's), samples, device bytes read (``/proc/<pid>/io``
``read_bytes`` of the child and its live workers), and input rows per target: the distinct
input nodes of the first layer summed over the epoch's batches, over the samples trained
(``Batch.features`` rows for graphstore, ``blocks[0].num_src_nodes()`` for DGL). Also: the
buffer's ``bytes_read`` and ``planned_bytes`` (the minimum the plan must read), stall
seconds, peak RSS, the cgroup's peak and OOM kills, test accuracy on a fixed subset of the
test split (same fanouts; graphstore with the same scheme and capacity), and ratios against
``graphstore-megabatch``, ``-paper`` and ``-memory``. The disk's sequential read bandwidth
(``dd iflag=direct``) is measured in the same run; ``planned_bytes / dd bandwidth`` is the
physical limit of a graphstore epoch.

What differs between the sides: graphstore reads whole partitions (sequential IO) into a
byte budget and samples only among resident nodes (fewer input rows per target than DGL,
which samples the whole graph); DGL keeps its whole structure in memory (outside the
budget: why it needs the wide cap on the big store) and reads feature rows by page faults.

Every run records ``settings`` (scheme, policy, capacity, partitions, static cache fraction
and nodes, reuse, buffer bytes, cap and whether it was enforced, fanouts, batch size, DGL's
``num_workers``, the store and its partitioner); ``goals`` checks the issue's targets
(`compute_goals`), each with ``value``, ``goal`` and ``met``.

Stores and modes
----------------
The full run needs root (drop_caches, cgroups). Its store is a synthetic graph with locality
(communities the METIS partitions can find, as in real graphs), made once with::

    .venv/bin/python tools/make_synthetic.py --kind node --num-nodes 7340032 --avg-degree 10 \
        --feature-dim 128 --num-classes 10 --layout npz --communities 1280 --locality 0.75 \
        --homophily 0.2 --out /work/bench_local/synthetic_local_n7340032_d128
    .venv/bin/python -m graphstore convert /work/bench_local/synthetic_local_n7340032_d128 \
        /work/bench_local/store_local_n7340032_p64.gs --partitions 64 --partitioner metis
    .venv/bin/python -m graphstore convert /work/bench_local/synthetic_local_n7340032_d128 \
        /work/bench_local/store_local_n7340032_p64_stream.gs --partitions 64 --partitioner stream

``--quick`` needs no argument: it builds (once, cached in ``--cache-dir``, rebuilt when its
parameters or the store-writing code change) a smaller store of the same kind with both
partitioners (`QUICK_STORE`), scales the cap to it (`quick_cap_mib`: 2 GiB of features,
2x the cap, 4.6x the buffer budget), and trains 6,000 targets for 2 epochs. It checks the
harness, not the claims: 12 steps are too few for the accuracies to mean much. As root it
drops the page cache and caps memory as the full run does; without root it does neither
(``settings`` and ``goals_conditions`` say so). Without ``--dgl-python`` it uses an
existing ``--dgl-venv`` and never creates one; otherwise the DGL rows say why DGL is not
available.

Usage::

    .venv/bin/python tools/bench_outofcore.py --json docs/benchmarks/outofcore.json \
        [--quick] [--store S.gs] [--store-stream S_stream.gs] [--targets N] [--dgl-python PY]
        [--dgl-workers 0,2,4,8] [--wait-idle-s 600] [--dgl-wide-cap-only]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import itertools
import json
import math
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where used: this file also runs in DGL's interpreter
    import numpy as np

try:
    from tools import benchkit
except ImportError:  # run as a script (also in DGL's interpreter): tools/ is on sys.path
    import benchkit

REPO = Path(__file__).resolve().parents[1]
PAPER, PAPER_STREAM, MEMORY = "graphstore-megabatch-paper", "graphstore-megabatch-paper-stream", "graphstore-memory"
SYSTEMS = ("graphstore-megabatch", "graphstore-megabatch-reuse2", "graphstore-megabatch-cache", PAPER, PAPER_STREAM,
           "graphstore-disk", "dgl-memmap", "dgl-memmap-readahead", MEMORY)
DGL_WORKERS = (0, 2, 4, 8)
DEFAULT_STORE = Path("/work/bench_local/store_local_n7340032_p64.gs")
DEFAULT_CACHE_DIR = Path("~/.cache/graphstore-bench/outofcore")
QUICK_STORE = {"num_nodes": 2_097_152, "avg_degree": 10, "feature_dim": 256, "num_classes": 10, "communities": 320,
               "locality": 0.75, "homophily": 0.2, "num_partitions": 64, "seed": 0}
"""The --quick store: the full store's kind (communities inside classes, the same locality and
homophily, 64 partitions) at 2 GiB of features; wider rows than the full store's 128 keep the
graph, hence METIS, small. Builds in about 3 minutes on 2 cores."""
SETTINGS_KEYS = ("scheme", "policy", "capacity", "num_partitions", "static_cache_fraction", "static_cache_nodes",
                 "reuse", "buffer_bytes", "mem_cap_bytes", "cap_enforced", "page_cache_dropped", "fanouts",
                 "batch_size", "num_workers", "store", "store_role", "partitioner", "edge_cut")
"""Keys every run's ``settings`` has (None where they do not apply)."""


def _child_pids() -> list[int]:
    """Live child processes of this one (DataLoader workers); /proc has no children list here."""
    me, found = os.getpid(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        # The command name (2nd field) may hold spaces: the ppid is the 2nd field after ')'.
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:
            found.append(int(proc.name))
    return found


def _tree_read_bytes() -> int:
    """This process's ``read_bytes`` plus its live workers' (persistent DataLoader workers are
    not reaped between epochs, so their faults would not show in ours)."""
    return sum(benchkit.proc_io(pid).get("read_bytes", 0) for pid in ["self", *_child_pids()])


def _max_rss_bytes(pid: int | str = "self") -> int:
    """A process's peak RSS (`benchkit.vm_hwm_bytes`), 0 when unreadable."""
    return benchkit.vm_hwm_bytes(pid) or 0


# ---------------------------------------------------------------------- DGL's worker side

def gather_rows_sorted(features, ids) -> np.ndarray:
    """``features[ids]`` ([len(ids), D]), read in ascending id order.

    Sorting first walks a memory map's file forwards, and rows sharing a page are read one
    after the other; the rows are then put back in ``ids``'s order (the block's source
    nodes), so the caller sees a plain gather.

    >>> import numpy as np
    >>> gather_rows_sorted(np.arange(10.0).reshape(5, 2), np.array([3, 0, 3, 1])).tolist()
    [[6.0, 7.0], [0.0, 1.0], [6.0, 7.0], [2.0, 3.0]]
    """
    import numpy as np

    ids = np.asarray(ids)
    order = np.argsort(ids, kind="stable")
    out = np.empty((ids.size, *features.shape[1:]), dtype=features.dtype)
    out[order] = features[ids[order]]
    return out


class GatheringSampler:
    """A DGL block sampler whose batches carry their feature rows and labels.

    With a ``DataLoader`` of N workers each worker samples a batch and gathers its rows, so N
    batches' page faults are in flight at once; gathering in the main process (DGL's usual
    loop over ``input_nodes``) faults one batch at a time. Duck-typed: DGL's ``DataLoader``
    only calls ``sample(g, seeds)``.

    Parameters
    ----------
    sampler : dgl.dataloading.BlockSampler
        Returns ``(input_nodes, output_nodes, blocks)``.
    features : array [num_nodes, D]
        A ``np.memmap`` in the benchmark (any array supporting fancy indexing).
    labels : torch.Tensor [num_nodes] int64
    """

    def __init__(self, sampler, features, labels) -> None:
        self.sampler, self.features, self.labels = sampler, features, labels

    def sample(self, g, seeds):
        """``(input_nodes, output_nodes, blocks, x [len(input_nodes), D], y [len(output_nodes)])``."""
        import torch

        input_nodes, output_nodes, blocks = self.sampler.sample(g, seeds)
        x = torch.from_numpy(gather_rows_sorted(self.features, input_nodes.numpy()))
        return input_nodes, output_nodes, blocks, x, self.labels[output_nodes.long()]


# ---------------------------------------------------------------------- children

def _train_epochs(spec: dict, epoch_iter, step, extra_stats=None) -> list[dict]:
    """Run ``spec['epochs']`` epochs: ``epoch_iter(e, last)`` yields batches, ``step(batch)``
    trains one and returns (targets, input nodes: the distinct rows of its first layer). Times
    the whole epoch and, separately, the time spent waiting on the loader's iterator (the
    rest is the model's: forward, backward, optimizer). Process CPU time is recorded too:
    other jobs on a shared machine stretch wall time more than CPU time."""
    out = []
    budget = spec.get("time_budget_s")
    for e in range(spec["epochs"]):
        io0, t0, c0 = _tree_read_bytes(), time.perf_counter(), time.process_time()
        wait, samples, inputs, batches, stopped = 0.0, 0, 0, 0, False
        it = iter(epoch_iter(e, e + 1 == spec["epochs"]))
        while True:
            a = time.perf_counter()
            batch = next(it, None)
            wait += time.perf_counter() - a
            if batch is None:
                break
            targets, rows = step(batch)
            samples, inputs, batches = samples + targets, inputs + rows, batches + 1
            if budget and time.perf_counter() - t0 > budget:
                stopped = True  # a projection, not a full epoch (reported as such)
                break
        seconds = time.perf_counter() - t0
        row = {"epoch": e, "time_s": seconds, "cpu_s": time.process_time() - c0, "samples": samples,
               "batches": batches, "input_nodes_per_target": inputs / max(samples, 1),
               "samples_per_s": samples / seconds, "loader_wait_s": wait, "compute_s": seconds - wait,
               "compute_share": (seconds - wait) / seconds, "device_read_bytes": _tree_read_bytes() - io0,
               "stopped_by_time_budget": stopped}
        if extra_stats:
            row.update(extra_stats())
        out.append(row)
        print(f"epoch {e}: {seconds:.1f} s, {samples} samples, {batches} batches", flush=True)
        if stopped:
            break
    return out


def _loader_kwargs(spec: dict) -> dict:
    # Inline batches (no loader threads), as the published runs made them: the children pin
    # torch to its threads, which would leave the default a loader thread and move the
    # budget's split; tools/bench_loader.py measures the threads.
    return {"fanouts": spec["fanouts"], "batch_size": spec["batch_size"], "scheme": spec["scheme"],
            "seed": spec["seed"], "prefetch": True, "reuse": spec["reuse"], "static_cache": spec.get("static_cache"),
            "loader_threads": spec.get("loader_threads", 0)}


def build_train_loader(loader_cls, store, spec: dict, nodes) -> tuple[object, dict]:
    """The training loader and how its capacity was chosen.

    Capacity comes from ``spec['buffer_bytes']`` (or the scheme when it is None). With
    ``spec['min_capacity']`` (the paper's systems) a budget admitting fewer partitions is
    overruled: the loader gets exactly ``min_capacity`` and the budget's answer is returned
    as ``budget_capacity``. A budget that refuses the configuration outright raises the
    loader's ``ConfigError`` (reported as a refusal, not worked around).
    """
    kw = _loader_kwargs(spec)
    loader = loader_cls(store, nodes=nodes, shuffle=True, buffer_bytes=spec["buffer_bytes"], **kw)
    floor = spec.get("min_capacity")
    rule = "buffer_bytes" if spec["buffer_bytes"] is not None else "scheme default"
    if not floor or spec["buffer_bytes"] is None or loader.capacity >= floor:
        return loader, {"capacity_rule": rule, "budget_capacity": loader.capacity, "min_capacity": floor}
    admitted = loader.capacity
    loader = None
    gc.collect()  # one static cache at a time under the cap
    loader = loader_cls(store, nodes=nodes, shuffle=True, capacity=floor, **kw)
    return loader, {"capacity_rule": f"at least p/16 = {floor} partitions; the budget admits {admitted}",
                    "budget_capacity": admitted, "min_capacity": floor, "budget_bytes": spec["buffer_bytes"]}


def sage_and_adam(spec: dict, store) -> tuple:
    """The model every graphstore child trains, seeded by ``spec['seed']``: a GraphSage of
    ``len(spec['fanouts'])`` layers (``spec['hidden']`` wide) and its Adam (``spec['lr']``)."""
    import torch
    from graphstore.nn import GNN

    torch.manual_seed(spec["seed"])
    model = GNN("sage", in_dim=store.feature_dim, hidden_dim=spec["hidden"], out_dim=store.num_classes,
                num_layers=len(spec["fanouts"]))
    return model, torch.optim.Adam(model.parameters(), lr=spec["lr"])


def sage_step(opt, forward):
    """``step(batch) -> (targets, input rows)`` for `_train_epochs`: one optimizer step on the
    cross-entropy of ``forward(batch)``'s logits (label -1: not counted)."""
    import torch.nn.functional as F

    def step(batch) -> tuple[int, int]:
        loss = F.cross_entropy(forward(batch), batch.labels, ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        # A DENSE holds each input node once: its rows are the first layer's distinct inputs.
        return int(batch.labels.numel()), int(batch.features.shape[0])

    return step


def held_out_accuracy(model, batches, forward) -> float:
    """The share of the batches' labelled targets whose argmax of ``forward(batch)`` is right."""
    import torch

    model.eval()
    correct = seen = 0
    with torch.no_grad():
        for batch in batches:
            pred = forward(batch).argmax(1)
            mask = batch.labels >= 0
            correct += int((pred[mask] == batch.labels[mask]).sum())
            seen += int(mask.sum())
    return correct / max(seen, 1)


def child_graphstore(spec: dict) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(spec["threads"])
    sys.path.insert(0, str(REPO))
    import graphstore
    from graphstore.errors import ConfigError
    from graphstore.loaders import NodeLoader

    t_setup = time.perf_counter()
    store = graphstore.open(spec["store"])
    try:
        loader, capacity_choice = build_train_loader(NodeLoader, store, spec, np.load(spec["targets"]))
    except ConfigError as exc:
        return {"refused": str(exc), "child_max_rss_bytes": _max_rss_bytes()}
    model, opt = sage_and_adam(spec, store)
    setup_s = time.perf_counter() - t_setup

    def forward(batch):
        return model(batch.features, batch.dense)

    step = sage_step(opt, forward)

    def stats() -> dict:
        s = loader.epoch_stats[-1]
        return {"buffer": {"states": s.states, "partitions_loaded": s.partitions_loaded, "bytes_read": s.bytes_read,
                           "planned_bytes": s.planned_bytes, "read_seconds": s.read_seconds,
                           "assemble_seconds": s.assemble_seconds, "stall_seconds": s.stall_seconds}}

    model.train()
    # The last epoch does not read ahead into an epoch that will not run (its bytes would count).
    epochs = _train_epochs(spec, lambda e, last: loader.epoch(e, lookahead=not last), step, stats)
    settings = {**loader.settings.to_dict(), **capacity_choice}
    if spec["scheme"] != "minibatch":
        from graphstore.buffer.manager import _assemble_where

        settings["buffer_assemble"] = _assemble_where()  # where the default put each state's assembly
    footprint = getattr(loader, "footprint", None)
    if footprint is not None:
        settings["footprint_bytes"] = footprint.total
    buffer_memory = 0 if loader.memory is None else loader.memory.nbytes
    capacity = loader.capacity
    # One buffer at a time under the cap: the evaluation loader gets its own memory.
    loader = None
    gc.collect()
    acc = None
    if not spec.get("skip_eval"):
        # The training loader's capacity and cache, one pass over each test target.
        kw = dict(_loader_kwargs(spec), reuse=1, seed=spec["seed"] + 1)
        ev = NodeLoader(store, nodes=np.load(spec["eval_targets"]), shuffle=False,
                        capacity=None if spec["scheme"] == "minibatch" else capacity, **kw)
        acc = held_out_accuracy(model, ev.epoch(0, lookahead=False), forward)
    return {"setup_s": setup_s, "epochs": epochs, "test_acc": acc, "settings": settings,
            "buffer_memory_bytes": buffer_memory, "child_max_rss_bytes": _max_rss_bytes()}


def load_dgl_inputs(spec: dict) -> tuple:
    """``(graph, labels, features)`` for a DGL child: the int64 CSC of ``spec["indptr"]`` and
    ``spec["indices"]`` as a CSC-only DGL graph, the labels, and the feature file as a
    read-only ``np.memmap`` (``MADV_RANDOM`` when ``spec["madvise_random"]``)."""
    import dgl
    import numpy as np
    import torch

    n, d = spec["num_nodes"], spec["feature_dim"]
    # One copy of the structure: DGL wraps these tensors without copying (measured: RSS
    # grows by the arrays' size only), the smallest footprint DGL can have for it.
    indptr = torch.from_numpy(np.load(spec["indptr"]))
    indices = torch.from_numpy(np.load(spec["indices"]))
    g = dgl.graph(("csc", (indptr, indices, torch.empty(0, dtype=torch.int64))), num_nodes=n)
    g = g.formats("csc")  # in-neighbour sampling reads only the CSC; no COO/CSR copies
    del indptr, indices
    labels = torch.from_numpy(np.load(spec["labels"]).astype(np.int64))
    feats = np.memmap(spec["features"], dtype=np.float32, mode="r", shape=(n, d))
    if spec["madvise_random"]:
        # A fault then reads the faulting page only, not read_ahead_kb around it.
        feats._mmap.madvise(mmap.MADV_RANDOM)
    return g, labels, feats


def dgl_sage(spec: dict):
    """DGL's GraphSage (mean) with the trainer's shape: ``len(spec["fanouts"])`` layers,
    ``spec["hidden"]`` wide, ReLU and ``spec.get("dropout", 0)`` dropout between layers."""
    import torch
    import torch.nn.functional as F
    from dgl.nn import SAGEConv

    dims = [spec["feature_dim"]] + [spec["hidden"]] * (len(spec["fanouts"]) - 1) + [spec["num_classes"]]
    dropout = float(spec.get("dropout", 0.0))

    class Sage(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(SAGEConv(a, b, "mean") for a, b in itertools.pairwise(dims))

        def forward(self, blocks, h):
            for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                h = layer(block, h)
                if i + 1 < len(self.layers):
                    h = F.dropout(F.relu(h), dropout, self.training)
            return h

    return Sage()


def child_dgl(spec: dict) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(spec["threads"])
    import dgl

    t_setup = time.perf_counter()
    g, labels, feats = load_dgl_inputs(spec)
    sampler = GatheringSampler(dgl.dataloading.NeighborSampler(list(spec["fanouts"])[::-1]),  # input layer first
                               feats, labels)
    workers = int(spec["num_workers"])

    def loader_for(targets: np.ndarray, *, shuffle: bool, persistent: bool):
        kwargs = {"num_workers": workers}
        if workers:
            # fork: workers share the graph and the memory map instead of pickling them;
            # persistent: warm epochs do not pay for starting the workers again.
            kwargs.update(multiprocessing_context="fork", persistent_workers=persistent)
        return dgl.dataloading.DataLoader(g, torch.from_numpy(targets.astype(np.int64)), sampler,
                                          batch_size=spec["batch_size"], shuffle=shuffle, drop_last=False, **kwargs)

    torch.manual_seed(spec["seed"])
    model = dgl_sage(spec)
    opt = torch.optim.Adam(model.parameters(), lr=spec["lr"])
    train = loader_for(np.load(spec["targets"]), shuffle=True, persistent=True)
    setup_s = time.perf_counter() - t_setup

    def step(batch) -> tuple[int, int]:
        _, _, blocks, x, y = batch
        loss = F.cross_entropy(model(blocks, x), y, ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return int(y.numel()), int(blocks[0].num_src_nodes())

    model.train()
    epochs = _train_epochs(spec, lambda e, last: train, step)
    workers_rss = [_max_rss_bytes(pid) for pid in _child_pids()]
    train = None
    gc.collect()
    acc = None
    if not spec.get("skip_eval"):
        model.eval()
        correct = seen = 0
        with torch.no_grad():
            for _, _, blocks, x, y in loader_for(np.load(spec["eval_targets"]), shuffle=False, persistent=False):
                pred = model(blocks, x).argmax(1)
                mask = y >= 0
                correct += int((pred[mask] == y[mask]).sum())
                seen += int(mask.sum())
        acc = correct / max(seen, 1)
    return {"setup_s": setup_s, "epochs": epochs, "test_acc": acc, "child_max_rss_bytes": _max_rss_bytes(),
            "workers_max_rss_bytes": workers_rss,
            "settings": {"scheme": "dgl NeighborSampler + DataLoader", "num_workers": workers,
                         "gather": "in the loader's workers, ascending ids" if workers else "ascending ids",
                         "persistent_workers": bool(workers), "dgl_version": dgl.__version__,
                         "torch_version": torch.__version__, "graph_formats": g.formats(), "idtype": str(g.idtype),
                         "madvise_random": spec["madvise_random"], "fanouts_dgl_order": list(spec["fanouts"])[::-1]}}


def child(spec: dict) -> None:
    import faulthandler

    faulthandler.enable()  # a crash (e.g. a native library under memory pressure) leaves a traceback
    result = child_dgl(spec) if spec["system"].startswith("dgl") else child_graphstore(spec)
    Path(spec["out"]).write_text(json.dumps(result))


# ---------------------------------------------------------------------- the --quick store

def _layout_code_digest() -> str:
    """A digest of the code that writes stores: a cached quick store made by other code may
    lack what the loaders now read (e.g. a new array group), so it is rebuilt."""
    h = hashlib.sha256()
    for path in sorted((REPO / "graphstore" / "layout").rglob("*.py")):
        h.update(path.relative_to(REPO).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def quick_store_paths(cache_dir: Path, feature_dtype: str | None = None) -> dict[str, Path]:
    """The quick stores' paths; another feature dtype than float32 has its own (``_float16``
    suffixed), so both stay cached side by side."""
    tag = "" if feature_dtype in (None, "float32") else f"_{feature_dtype}"
    return {"metis": cache_dir / f"quick_metis{tag}.gs", "stream": cache_dir / f"quick_stream{tag}.gs",
            "marker": cache_dir / f"quick_stores{tag}.json"}


def quick_stores_invalid(cache_dir: Path, params: dict) -> str | None:
    """Why the cached quick stores cannot be reused (None when they can): the marker written
    after a complete build must hold ``params``, and each store must open with its size,
    partitions and partitioner."""
    sys.path.insert(0, str(REPO))
    import graphstore
    from graphstore.errors import GraphStoreError

    paths = quick_store_paths(cache_dir, params.get("feature_dtype"))
    if not paths["marker"].exists():
        return f"no {paths['marker'].name} in {cache_dir}"
    try:
        recorded = json.loads(paths["marker"].read_text()).get("params")
    except (OSError, ValueError) as exc:
        return f"unreadable {paths['marker']}: {exc}"
    if recorded != params:
        changed = sorted(k for k in set(params) | set(recorded or {}) if (recorded or {}).get(k) != params.get(k))
        return f"built with other parameters ({', '.join(changed)})"
    for method in ("metis", "stream"):
        try:
            store = graphstore.open(paths[method])
        except (GraphStoreError, OSError, ValueError) as exc:  # damaged or partial: build it again
            return f"{paths[method]} does not open: {exc}"
        got = (store.num_nodes, store.feature_dim, store.num_partitions, store.manifest.partitioner.get("method"))
        want = (params["num_nodes"], params["feature_dim"], params["num_partitions"], method)
        if got != want:
            return f"{paths[method]} is (nodes, dim, partitions, partitioner) {got}, expected {want}"
    return None


def ensure_quick_stores(cache_dir: Path, params: dict, log) -> dict:
    """The quick stores (METIS and stream partitions of one synthetic dataset) in
    ``cache_dir``, built with tools/make_synthetic.py and ``graphstore convert`` when the
    cached ones are missing or invalid; the dataset itself is removed after conversion."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    paths = quick_store_paths(cache_dir, params.get("feature_dtype"))
    why = quick_stores_invalid(cache_dir, params)
    if why is None:
        return {"metis": paths["metis"], "stream": paths["stream"], "reused": True, "build_s": 0.0}
    log(f"building the quick stores in {cache_dir} ({why})")
    t0 = time.perf_counter()
    for path in (paths["marker"], paths["metis"], paths["stream"], cache_dir / "synthetic"):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    dataset = cache_dir / "synthetic"
    cast = ["--feature-dtype", params["feature_dtype"]] if params.get("feature_dtype") else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    steps = [[sys.executable, str(REPO / "tools" / "make_synthetic.py"), "--kind", "node", "--layout", "npz",
              "--num-nodes", str(params["num_nodes"]), "--avg-degree", str(params["avg_degree"]),
              "--feature-dim", str(params["feature_dim"]), "--num-classes", str(params["num_classes"]),
              "--communities", str(params["communities"]), "--locality", str(params["locality"]),
              "--homophily", str(params["homophily"]), "--seed", str(params["seed"]), "--no-progress",
              "--out", str(dataset)]]
    steps += [[sys.executable, "-m", "graphstore", "convert", str(dataset), str(paths[method]), "--partitions",
               str(params["num_partitions"]), "--partitioner", method, "--seed", str(params["seed"]), *cast]
              for method in ("metis", "stream")]
    for cmd in steps:
        r = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, cwd=REPO)
        if r.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed ({r.returncode}): {r.stderr.strip()[-800:]}")
        log(f"  {' '.join(cmd[1:4])}...: done at {time.perf_counter() - t0:.0f} s")
    shutil.rmtree(dataset)
    seconds = time.perf_counter() - t0
    paths["marker"].write_text(json.dumps({"params": params, "build_s": seconds}, indent=1) + "\n")
    return {"metis": paths["metis"], "stream": paths["stream"], "reused": False, "build_s": seconds}


def cached_quick_stores(cache_dir: Path, log, feature_dtype: str = "float32") -> tuple[dict, dict]:
    """`ensure_quick_stores` of `QUICK_STORE` (rebuilt when it or the layout code changes),
    its features converted to ``feature_dtype``, and the record of it a result's
    ``quick_store`` holds."""
    params = dict(QUICK_STORE, layout_code=_layout_code_digest())
    if feature_dtype != "float32":  # float32 keeps the parameters (and the cache) it always had
        params["feature_dtype"] = feature_dtype
    built = ensure_quick_stores(cache_dir, params, log)
    return built, {"params": params, "reused": built["reused"], "build_s": built["build_s"],
                   "cache_dir": str(cache_dir)}


def quick_cap_mib(feature_bytes: int, process_mib: int) -> int:
    """The --quick cap: the process's own memory plus a buffer budget of about a fifth of
    the features (64 MiB steps, at least 64), which leaves the features a few times the
    memory the cap has for data, as in the full run (3.5 GiB against 448 MiB)."""
    budget_mib = max(64, int(feature_bytes / 4.5) >> 20 >> 6 << 6)
    return process_mib + budget_mib


# ---------------------------------------------------------------------- preparation

def store_info(store, path: Path, role: str) -> dict:
    partitioner = store.manifest.partitioner
    return {"path": str(path), "role": role, "num_nodes": store.num_nodes, "num_edges": store.num_edges,
            "num_partitions": store.num_partitions, "feature_dim": store.feature_dim,
            "feature_dtype": store.manifest.feature_dtype,
            "partitioner": partitioner.get("method"), "edge_cut": partitioner.get("edge_cut")}


def _store_tag(path: Path, store) -> str:
    # Keyed by the store: two stores of one size hold different graphs and orders.
    return f"{path.resolve().name.removesuffix('.gs')}_n{store.num_nodes}_d{store.feature_dim}"


def _store_stamp(store) -> str:
    """A digest of the store's manifest (its conversion's timings included): a store rebuilt
    under the same path gets a new stamp, so inputs derived from the old one are remade."""
    import dataclasses

    text = json.dumps(dataclasses.asdict(store.manifest), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prepare_dgl_inputs(store, path: Path, work: Path) -> dict:
    """DGL's inputs, written once into ``work`` (cached across runs): the features as a raw
    float32 file in store order, the CSC as int64, the labels."""
    import numpy as np

    from graphstore.layout.dtypes import decode

    work.mkdir(parents=True, exist_ok=True)
    n, tag = store.num_nodes, _store_tag(path, store)
    files = {"features": work / f"features_{tag}.f32", "indptr": work / f"csc64_indptr_{tag}.npy",
             "indices": work / f"csc64_indices_{tag}.npy", "labels": work / f"labels_{tag}.npy"}
    done, stamp = work / f".prepared64_{tag}", _store_stamp(store)
    if not done.exists() or json.loads(done.read_text()).get("store_stamp") != stamp:
        t0 = time.perf_counter()
        with open(files["features"], "wb") as fh:  # store order = node order of the DGL graph
            for k in range(store.num_partitions):
                lo, hi = store.partition_range(k)
                # DGL's memmap is float32 numbers (a bfloat16 store's bits decoded, not cast).
                fh.write(decode(store.read_rows("nodes/features", lo, hi), store.manifest.feature_dtype).tobytes())
        np.save(files["labels"], store.read_rows("nodes/labels", 0, n))
        src = store.read_rows("edges/src", 0, store.num_edges)
        dst = store.read_rows("edges/dst", 0, store.num_edges)
        order = np.argsort(dst, kind="stable")  # CSC: in-edges of each node together
        np.save(files["indices"], src[order].astype(np.int64))
        del src, order
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
        del dst
        np.save(files["indptr"], indptr)
        done.write_text(json.dumps({"seconds": time.perf_counter() - t0, "store_stamp": stamp}))
    files["structure_bytes"] = files["indptr"].stat().st_size + files["indices"].stat().st_size
    return files


def choose_targets(store, *, seed: int, targets: int, eval_targets: int) -> tuple:
    """The same targets for every system: seeded subsets of the train and test splits (store ids)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    train = np.asarray(store.read_node_split("train"), np.int64)
    test = np.asarray(store.read_node_split("test"), np.int64)
    return (np.sort(rng.choice(train, size=min(targets, train.size), replace=False)),
            np.sort(rng.choice(test, size=min(eval_targets, test.size), replace=False)))


def same_nodes_in(other, store, ids):
    """``ids`` (store ids of ``store``) as store ids of ``other``, a conversion of the same
    dataset: both sides then train and test the same source nodes."""
    import numpy as np

    return np.sort(other.to_store_ids(store.to_source_ids(ids)))


def write_targets(work: Path, tag: str, train, test) -> dict:
    import numpy as np

    files = {"targets": work / f"targets_{tag}.npy", "eval_targets": work / f"eval_targets_{tag}.npy"}
    np.save(files["targets"], train)
    np.save(files["eval_targets"], test)
    return files


def other_benchmarks() -> list[str]:
    """Command lines of other benchmarks running now (not this process or its children)."""
    mine = {os.getpid(), os.getppid()}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in mine:
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "bench_" in cmd and "bench_outofcore" not in cmd and "python" in cmd:
            found.append(cmd.strip()[:160])
    return found


def isolation() -> dict:
    """Whether runs can be isolated: drop_caches and a cgroup v1 memory cap need root."""
    if os.geteuid() != 0:
        return {"cap_enforced": False, "page_cache_dropped": False,
                "why": "not root: no drop_caches and no cgroup memory cap; every system reads through a warm, "
                       "unbounded page cache, so these timings are not out-of-core"}
    if not benchkit.CGROUP_ROOT.is_dir():
        return {"cap_enforced": False, "page_cache_dropped": True,
                "why": "no cgroup v1 memory controller at /sys/fs/cgroup/memory: no memory cap"}
    return {"cap_enforced": True, "page_cache_dropped": True, "why": None}


# ---------------------------------------------------------------------- specs, results, goals

def system_specs(*, buffer_bytes: int, num_partitions: int, dgl_epochs: int, readahead_budget_s: float) -> dict:
    """What each system's child is given beyond the common settings."""
    mega = {"scheme": "megabatch", "buffer_bytes": buffer_bytes, "capped": True}
    # The paper's configuration (p/16 resident beside a 1 % cache) needs more than the cap:
    # it runs under DGL's wide cap, the memory DGL + memmap needs, so the two compare at
    # equal memory (`Bench.cap_for`).
    paper = dict(mega, reuse=2, static_cache=0.01, min_capacity=math.ceil(num_partitions / 16), cap="dgl_wide")
    dgl = {"scheme": "dgl", "capped": True, "epochs": dgl_epochs, "num_workers": 0}
    return {
        "graphstore-megabatch": dict(mega, reuse=1, static_cache=0.0),
        "graphstore-megabatch-reuse2": dict(mega, reuse=2, static_cache=0.0),
        "graphstore-megabatch-cache": dict(mega, reuse=1, static_cache=0.01),
        PAPER: dict(paper, store_role="main"),
        PAPER_STREAM: dict(paper, store_role="stream"),
        "graphstore-disk": {"scheme": "disk", "buffer_bytes": buffer_bytes, "reuse": None, "capped": True},
        "dgl-memmap": dict(dgl, madvise_random=True),
        # A projection: its one epoch stops after the time budget (it takes minutes a batch).
        "dgl-memmap-readahead": dict(dgl, madvise_random=False, time_budget_s=readahead_budget_s, skip_eval=True,
                                     epochs=1),
        MEMORY: {"scheme": "minibatch", "buffer_bytes": None, "reuse": None, "capped": False},
    }


def run_settings(spec: dict, reported: dict | None, *, store: dict, cap_bytes: int | None, iso: dict) -> dict:
    """A run's settings: what the parent asked for, overridden by what the child reports it
    chose (the loader's ``settings``, DGL's), with every key of `SETTINGS_KEYS`."""
    is_dgl = spec["system"].startswith("dgl")
    asked = {
        "scheme": spec.get("scheme"), "policy": None, "capacity": None, "num_partitions": store["num_partitions"],
        "static_cache_fraction": 0.0 if is_dgl else spec.get("static_cache"), "static_cache_nodes": 0 if is_dgl else None,
        "reuse": 1 if is_dgl else spec.get("reuse"), "buffer_bytes": spec.get("buffer_bytes"),
        "mem_cap_bytes": cap_bytes, "cap_enforced": bool(cap_bytes) and iso["cap_enforced"],
        "page_cache_dropped": iso["page_cache_dropped"], "fanouts": list(spec["fanouts"]),
        "batch_size": spec["batch_size"], "num_workers": spec.get("num_workers") if is_dgl else None,
        "store": store["path"], "store_role": store["role"], "partitioner": store["partitioner"],
        "edge_cut": store["edge_cut"], "epochs": spec["epochs"], "min_capacity": spec.get("min_capacity"),
    }
    if is_dgl:
        # DGL samples the whole graph: the store's partitions play no part in its batches.
        asked["num_partitions"] = None
    settings = {**asked, **(reported or {})}
    settings["store"], settings["store_role"] = store["path"], store["role"]  # the store's path, not the loader's
    return settings


def summarize_epochs(epochs: list[dict], *, targets: int, batch_size: int) -> dict:
    """A run's figures from its epochs: epoch 0 (cold) apart, the rest (warm) by their median;
    a run stopped by its time budget is projected to the whole epoch at its measured rate."""
    warm = epochs[1:] if len(epochs) > 1 else epochs

    def med(key: str) -> float:
        return statistics.median(e[key] for e in warm)

    out = {"epoch_s_median": med("time_s"), "warm_epochs_s": [e["time_s"] for e in warm],
           "warm_epochs": len(epochs) - 1, "epoch0_s": epochs[0]["time_s"], "samples_per_epoch": epochs[0]["samples"],
           "bytes_read": med("device_read_bytes"), "samples_per_s": med("samples_per_s"),
           "compute_share": med("compute_share"), "cpu_s_median": med("cpu_s"),
           "input_nodes_per_target": epochs[0]["input_nodes_per_target"],
           "projected": any(e["stopped_by_time_budget"] for e in epochs), "stall_s": None}
    if len(epochs) < 2:
        out["note_warm"] = "one epoch only: the 'median' is the cold epoch"
    if out["projected"]:
        first, total_batches = epochs[0], -(-targets // batch_size)
        out["epoch_s_median"] = out["epoch0_s"] = first["time_s"] / first["batches"] * total_batches
        out["bytes_read"] = first["device_read_bytes"] / first["batches"] * total_batches
        out["samples_per_epoch"] = targets
    if "buffer" in epochs[0]:
        out["stall_s"] = statistics.median(e["buffer"]["stall_seconds"] for e in warm)
        out["buffer_bytes_read"] = statistics.median(e["buffer"]["bytes_read"] for e in warm)
        out["planned_bytes"] = statistics.median(e["buffer"]["planned_bytes"] for e in warm)
    return out


def not_run_row(system: str, why: str, settings: dict) -> dict:
    """The row of a system that could not run (DGL missing, no stream store): why, and the
    settings it would have had."""
    return {"system": system, "skipped": why, "epoch_s_median": None, "bytes_read": None, "stall_s": None,
            "test_acc": None, "mem_cap_bytes": settings["mem_cap_bytes"], "settings": settings}


def best_dgl_row(results: dict[str, dict]) -> dict:
    """The ``dgl-memmap`` row from one row per ``num_workers`` setting (keys: the setting):
    the setting with the shortest warm epoch, with every setting's row kept in
    ``num_workers_results``; a failure row naming each setting's failure when none finished."""
    done = {w: r for w, r in results.items() if r.get("epoch_s_median") is not None and not r.get("projected")}
    if done:
        best = min(done, key=lambda w: done[w]["epoch_s_median"])
        row = dict(done[best], best_num_workers=int(best))
    else:
        why = "; ".join(f"{w} workers: {r.get('refused') or r.get('skipped') or (r.get('error') or '?')[-200:]}"
                        for w, r in results.items())
        row = {"system": "dgl-memmap", "error": f"no num_workers setting finished: {why}", "epoch_s_median": None,
               "bytes_read": None, "stall_s": None, "test_acc": None, "best_num_workers": None,
               "mem_cap_bytes": next(iter(results.values()), {}).get("mem_cap_bytes")}
    row["num_workers_tried"] = [int(w) for w in results]
    row["num_workers_epoch_s"] = {w: r.get("epoch_s_median") for w, r in results.items()}
    row["num_workers_results"] = results
    return row


def _goal(value: float | None, goal: str, test, why_missing: str | None = None, **extra) -> dict:
    row = {"value": value, "goal": goal, "met": None if value is None else bool(test(value)), **extra}
    if value is None:
        row["why_no_value"] = why_missing
    return row


def compute_goals(runs: list[dict], *, targets: int) -> dict:
    """The issue's goals from a run's rows, each ``{"value", "goal", "met"}`` (``met`` None
    when a row it needs did not finish, or the goal is stated for another run):

    * ``paper_vs_dgl_best``: DGL's time per training sample (its best warm epoch over the
      samples it trained) over the paper configuration's, >= 10;
    * ``paper_vs_memory``: the paper configuration's time per training sample over
      in-memory's, <= 1.25, checked at the 300,000-target run (the value is reported at
      every size);

    Both ratios compare equal work: the paper configuration trains each mega-batch twice
    (reuse 2), so its epoch trains every target twice, the others' once. The ratio of warm
    epochs is reported beside each (``epoch_ratio``).
    * ``paper_accuracy_gap``: test accuracy points below in-memory, <= 1;
    * ``stream_accuracy_gap``: the same for the stream-partitioned store, <= 2.
    """
    by = {r["system"]: r for r in runs}
    done = {s: r for s, r in by.items() if r.get("epoch_s_median") is not None and not r.get("projected")}
    dgl = done.get("dgl-memmap") or done.get("dgl-memmap-widecap")

    def missing(*names: str) -> str | None:
        whys = []
        for name in names:
            if name in done:
                continue
            r = by.get(name) or (by.get(name + "-widecap") if name == "dgl-memmap" else None)
            why = None if r is None else (r.get("skipped") or r.get("refused") or r.get("error"))
            whys.append(f"{name}: {str(why)[-300:] if why else 'not run'}")
        return "; ".join(whys) or None

    def epoch_ratio(a: dict | None, b: dict | None) -> float | None:
        return a["epoch_s_median"] / b["epoch_s_median"] if a and b else None

    def ratio(a: dict | None, b: dict | None) -> float | None:
        """a's time per training sample over b's (a warm epoch over the samples it trained)."""
        if not a or not b or not a.get("samples_per_epoch") or not b.get("samples_per_epoch"):
            return None
        return (a["epoch_s_median"] / a["samples_per_epoch"]) / (b["epoch_s_median"] / b["samples_per_epoch"])

    def gap(system: str) -> float | None:
        r, mem = done.get(system), done.get(MEMORY)
        if not r or not mem or r.get("test_acc") is None or mem.get("test_acc") is None:
            return None
        return 100.0 * (mem["test_acc"] - r["test_acc"])

    paper, mem = done.get(PAPER), done.get(MEMORY)
    at_300k = targets == 300_000
    vs_memory = ratio(paper, mem)
    goals = {
        "paper_vs_dgl_best": _goal(ratio(dgl, paper), ">= 10 (DGL's best time per training sample / the paper "
                                   "configuration's)", lambda v: v >= 10, missing("dgl-memmap", PAPER),
                                   epoch_ratio=epoch_ratio(dgl, paper),
                                   dgl_system=dgl and dgl["system"], dgl_num_workers=dgl and dgl.get("best_num_workers"),
                                   dgl_cap_bytes=dgl and dgl.get("mem_cap_bytes"),
                                   paper_cap_bytes=paper and paper.get("mem_cap_bytes")),
        "paper_vs_memory": {**_goal(vs_memory, "<= 1.25 at 300,000 targets (the paper configuration's time per "
                                    "training sample / in-memory's)", lambda v: v <= 1.25, missing(PAPER, MEMORY),
                                    epoch_ratio=epoch_ratio(paper, mem)),
                            "targets": targets},
        "paper_accuracy_gap": _goal(gap(PAPER), "<= 1 point below graphstore-memory's test accuracy",
                                    lambda v: v <= 1.0, missing(PAPER, MEMORY)),
        "stream_accuracy_gap": _goal(gap(PAPER_STREAM), "<= 2 points below graphstore-memory's test accuracy",
                                     lambda v: v <= 2.0, missing(PAPER_STREAM, MEMORY)),
    }
    if vs_memory is not None and not at_300k:
        goals["paper_vs_memory"]["met"] = None
        goals["paper_vs_memory"]["why_not_checked"] = f"the goal is for 300,000 targets; this run has {targets:,}"
    return goals


def add_ratios(runs: list[dict], disk_bytes_per_s: float) -> None:
    """Each finished row's epoch against the reference systems', and against its physical
    limit (what its plan must read, at the disk's sequential speed)."""
    done = {r["system"]: r for r in runs if r.get("epoch_s_median")}
    refs = {"megabatch": done.get("graphstore-megabatch"), "paper": done.get(PAPER), "memory": done.get(MEMORY)}
    for r in runs:
        if not r.get("epoch_s_median"):
            continue
        for name, ref in refs.items():
            if ref:
                r[f"epoch_vs_{name}"] = r["epoch_s_median"] / ref["epoch_s_median"]
                r[f"epoch0_vs_{name}"] = r["epoch0_s"] / ref["epoch0_s"]
        if r.get("planned_bytes"):
            r["physical_limit_s"] = r["planned_bytes"] / disk_bytes_per_s
            r["epoch_vs_physical_limit"] = r["epoch_s_median"] / r["physical_limit_s"]


# ---------------------------------------------------------------------- main

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write results here")
    ap.add_argument("--store", type=Path, default=None,
                    help=f"a converted synthetic node-classification store (default {DEFAULT_STORE}; "
                         "--quick: its own cached store)")
    ap.add_argument("--store-stream", type=Path, default=None,
                    help="the same dataset converted with --partitioner stream: adds " + PAPER_STREAM
                         + " (--quick: its own cached one)")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="DGL's inputs, target subsets, dd file (cached; default /work/bench_outofcore, "
                         "--quick: CACHE_DIR/work)")
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR,
                    help="where --quick keeps its stores (created if missing)")
    ap.add_argument("--feature-dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                    help="--quick: the dtype its store's features are converted to (`graphstore convert "
                         "--feature-dtype`; cached apart from float32's); with --store, that store's own "
                         "(default: float32)")
    ap.add_argument("--quick", action="store_true",
                    help="small cached store, few targets, 2 epochs: checks the harness in minutes")
    ap.add_argument("--cap-mib", type=int, default=None,
                    help="cgroup memory cap of the out-of-core systems (default 1024; --quick: scaled to its store)")
    ap.add_argument("--process-mib", type=int, default=576,
                    help="the cap minus this is the graphstore buffer's byte budget (torch ~300 MiB, "
                         "model, batches, autograd)")
    ap.add_argument("--targets", type=int, help="training targets per epoch (default 60000, quick 6000)")
    ap.add_argument("--eval-targets", type=int, help="test targets evaluated (default 5000, quick 1000)")
    ap.add_argument("--epochs", type=int, help="epochs per graphstore system (default 3, quick 2; at least 2)")
    ap.add_argument("--dgl-epochs", type=int, help="epochs per DGL setting (default as --epochs; at least 2)")
    ap.add_argument("--dgl-workers", default=",".join(map(str, DGL_WORKERS)),
                    help="DataLoader num_workers settings tried for dgl-memmap; the fastest is its row")
    ap.add_argument("--fanouts", default="10,5", help="fanouts[0] is the hop nearest the targets")
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--systems", help="comma-separated, from: " + ", ".join(SYSTEMS)
                    + " (default all; --quick leaves out dgl-memmap-readahead, minutes a batch)")
    ap.add_argument("--readahead-budget-s", type=float, default=None,
                    help="dgl-memmap-readahead stops its epoch after this long (default 90, quick 20)")
    ap.add_argument("--wait-idle-s", type=float, default=0.0,
                    help="first wait up to this long (polling every 30 s) for other bench_*.py to finish")
    ap.add_argument("--dgl-wide-cap-only", action="store_true",
                    help="run DGL only under the wide cap (its structure plus the same page-cache room), "
                         "skipping the attempt under --cap-mib when an earlier run showed it is killed there")
    ap.add_argument("--dgl-python", default=None, help="an interpreter with dgl (skips venv creation)")
    ap.add_argument("--dgl-venv", default=str(REPO / ".venv-dgl"),
                    help="DGL venv, created when missing (--quick only uses an existing one)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return ap, args
    if args.json is None:
        ap.error("--json is required")
    iso = isolation()
    if not args.quick and not iso["cap_enforced"]:
        ap.error(f"the full run needs a memory cap ({iso['why']}); --quick runs without one")
    args.targets = args.targets or (6000 if args.quick else 60000)
    args.eval_targets = args.eval_targets or (1000 if args.quick else 5000)
    args.epochs = args.epochs or (2 if args.quick else 3)
    args.dgl_epochs = args.dgl_epochs or args.epochs
    if min(args.epochs, args.dgl_epochs) < 2:
        ap.error("--epochs and --dgl-epochs must be at least 2: the reported time is the warm epochs' median")
    args.readahead_budget_s = args.readahead_budget_s or (20.0 if args.quick else 90.0)
    args.fanouts = [int(f) for f in args.fanouts.split(",")]
    args.dgl_workers = [int(w) for w in args.dgl_workers.split(",") if w != ""]
    args.systems = [s for s in (args.systems or ",".join(x for x in SYSTEMS if not (
        args.quick and x == "dgl-memmap-readahead"))).split(",") if s]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        ap.error(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
    args.cache_dir = args.cache_dir.expanduser()
    args.workdir = args.workdir or (args.cache_dir / "work" if args.quick else Path("/work/bench_outofcore"))
    args.iso = iso
    return ap, args


def find_dgl_python(args, log) -> tuple[str | None, str | None]:
    """DGL's interpreter, or (None, why not). --quick never creates the venv (minutes of
    downloads); it uses --dgl-python or an existing --dgl-venv."""
    if args.quick and not args.dgl_python:
        py = Path(args.dgl_venv) / "bin" / "python"
        if not py.exists():
            return None, (f"not available: no --dgl-python given and no DGL venv at {args.dgl_venv} "
                          "(--quick does not create one; tools/bench_sampling.py does)")
        args.dgl_python = str(py)
    py, why = benchkit.ensure_dgl_python(args, log)
    return py, None if py else f"not available: {why}"


def open_stores(args, ap, log) -> tuple:
    """The main store, the stream store (or None), their descriptions for the JSON, and the
    --quick store's cache record (or None). --quick without --store builds or reuses its own."""
    sys.path.insert(0, str(REPO))
    import graphstore

    quick_store = None
    if args.quick and args.store is None:
        built, quick_store = cached_quick_stores(args.cache_dir, log, args.feature_dtype)
        args.store = built["metis"]
        args.store_stream = args.store_stream or built["stream"]
    args.store = args.store or DEFAULT_STORE
    store = graphstore.open(args.store)
    stores = {"main": store_info(store, args.store, "main")}
    stream = None
    if args.store_stream is not None:
        stream = graphstore.open(args.store_stream)
        if (stream.num_nodes, stream.num_edges, stream.feature_dim) != (store.num_nodes, store.num_edges,
                                                                         store.feature_dim):
            ap.error(f"--store-stream {args.store_stream} is not a conversion of {args.store}'s dataset "
                     "(nodes, edges or feature dim differ)")
        stores["stream"] = store_info(stream, args.store_stream, "stream")
    else:
        stores["stream"] = {"skipped": f"no --store-stream given: no {PAPER_STREAM} row"}
    return store, stream, stores, quick_store


def log_row(row: dict, log) -> None:
    """One line per run: its warm epoch and what explains it, or why it has none."""
    if row["epoch_s_median"] is not None:
        stall = "-" if row["stall_s"] is None else f"{row['stall_s']:.2f} s"
        state = (f"{row['epoch_s_median']:.1f} s/epoch (epoch 0 {row['epoch0_s']:.1f} s), "
                 f"{row['samples_per_s']:.0f} samples/s, {row['input_nodes_per_target']:.1f} inputs/target, "
                 f"read {row['bytes_read'] / 1e9:.2f} GB, stall {stall}, "
                 f"capacity {row['settings'].get('capacity')}, acc {row['test_acc']}")
    elif "refused" in row:
        state = f"REFUSED: {row['refused'][-300:]}"
    else:
        state = f"FAILED rc={row['returncode']} oom={row['oom']}: {row['error'][-300:]}"
    cap_bytes = row["mem_cap_bytes"]
    peak = "" if row["cgroup_peak_bytes"] is None else f", cgroup peak {row['cgroup_peak_bytes'] >> 20} MiB"
    rss = "?" if row["peak_rss_bytes"] is None else row["peak_rss_bytes"] >> 20
    workers = row["settings"].get("num_workers")
    label = row["system"] + ("" if workers is None else f" ({workers} workers)")
    enforced = "" if cap_bytes is None or row["settings"]["cap_enforced"] else ", not enforced"
    log(f"{label} (cap {cap_bytes and cap_bytes >> 20} MiB{enforced}): {state}; peak RSS {rss} MiB{peak}")


def row_from_child(name: str, run: dict, result: dict | None, *, targets: int, batch_size: int) -> dict:
    """A run's row from its child's exit (``run``: `benchkit.run_capped`'s, with the cgroup's
    counters) and the JSON it wrote (None when it did not finish)."""
    row = {"system": name, "returncode": run["returncode"], "child_seconds": run["seconds"],
           "wait4_maxrss_bytes": run["peak_rss_bytes"], "cgroup_peak_bytes": run["cgroup_peak_bytes"],
           "cap_hits": run["cap_hits"], "oom_kills": run["oom_kills"]}
    empty = {"epoch_s_median": None, "bytes_read": None, "stall_s": None, "test_acc": None}
    if result and "refused" in result:
        row.update(empty, refused=result["refused"], peak_rss_bytes=result["child_max_rss_bytes"])
    elif result:
        row.update(result)
        row["peak_rss_bytes"] = row["child_max_rss_bytes"]
        row.update(summarize_epochs(row["epochs"], targets=targets, batch_size=batch_size))
    else:
        row.update(empty, error=(run["stderr"] or run["stdout"])[-1500:], oom=bool(run["oom_kills"]),
                   peak_rss_bytes=None)
    return row


class Bench:
    """One benchmark run: the stores, the targets, DGL's inputs, the caps; runs every system
    in a child process and keeps their rows."""

    def __init__(self, args, *, store, stream, stores: dict, log) -> None:
        from graphstore.layout.dtypes import storage_dtype

        self.args, self.iso, self.stores, self.log, self.stream = args, args.iso, stores, log, stream
        # As stored: a float16 store's features are half the bytes (and --quick's cap scales with them).
        self.feature_bytes = store.num_nodes * store.feature_dim * storage_dtype(store.manifest.feature_dtype).itemsize
        if args.cap_mib is None:
            args.cap_mib = quick_cap_mib(self.feature_bytes, args.process_mib) if args.quick else 1024
        self.cap = args.cap_mib << 20
        self.buffer_bytes = self.cap - (args.process_mib << 20)
        t0 = time.perf_counter()
        args.workdir.mkdir(parents=True, exist_ok=True)
        train, test = choose_targets(store, seed=args.seed, targets=args.targets, eval_targets=args.eval_targets)
        self.target_files = {"main": write_targets(args.workdir, _store_tag(args.store, store), train, test)}
        if stream is not None:
            self.target_files["stream"] = write_targets(args.workdir, _store_tag(args.store_stream, stream),
                                                        same_nodes_in(stream, store, train),
                                                        same_nodes_in(stream, store, test))
        wants_dgl = any(s.startswith("dgl") for s in args.systems)
        self.dgl_files = prepare_dgl_inputs(store, args.store, args.workdir) if wants_dgl else None
        log(f"store {args.store.name}: {store.num_nodes} nodes, {store.num_edges} edges, p={store.num_partitions}; "
            f"features {self.feature_bytes / 2**30:.2f} GiB = {self.feature_bytes / self.cap:.1f}x the "
            f"{args.cap_mib} MiB cap ({'enforced' if self.iso['cap_enforced'] else 'NOT enforced'}); buffer "
            f"budget {self.buffer_bytes >> 20} MiB; {args.targets} targets; prepared in {time.perf_counter() - t0:.1f} s")
        self.dgl_py, self.dgl_reason = find_dgl_python(args, log) if wants_dgl else (None, None)
        if wants_dgl and self.dgl_py is None:
            log(f"DGL {self.dgl_reason}")
        self.common = {"fanouts": args.fanouts, "batch_size": args.batch_size, "hidden": args.hidden, "lr": args.lr,
                       "threads": args.threads, "seed": args.seed, "epochs": args.epochs,
                       "num_nodes": store.num_nodes, "feature_dim": store.feature_dim,
                       "num_classes": store.num_classes}
        self.specs = system_specs(buffer_bytes=self.buffer_bytes, num_partitions=store.num_partitions,
                                  dgl_epochs=args.dgl_epochs, readahead_budget_s=args.readahead_budget_s)
        self.paths = {"main": args.store, "stream": args.store_stream}
        # If DGL is killed by the cap, its structure did not fit next to the features' page
        # cache: it then runs under a cap with room for its structure and process on top of
        # the same room for the page cache.
        # DGL's structure is a CSC of int64 ids (`prepare_dgl_inputs`): its size follows from
        # the store, so the paper's rows get the same cap whether or not DGL runs.
        structure = (store.num_nodes + 1) * 8 + store.num_edges * 8
        wide = self.cap + (self.dgl_files["structure_bytes"] if self.dgl_files else structure) + (512 << 20)
        self.wide_cap = -(-wide // (64 << 20)) * (64 << 20)
        self.dgl_killed: list[str] = []

    def run_all(self) -> list[dict]:
        runs, best_workers = [], 0
        for name in self.args.systems:
            if name.startswith("dgl") and self.dgl_py is None:
                runs.append(not_run_row(name, self.dgl_reason, self.intended_settings(name)))
            elif name == PAPER_STREAM and self.stream is None:
                runs.append(not_run_row(name, self.stores["stream"]["skipped"], self.intended_settings(name)))
            elif name == "dgl-memmap":
                row = best_dgl_row(self.dgl_sweep())
                best_workers = row["best_num_workers"] or 0
                self.log(f"dgl-memmap: warm epoch s by num_workers {row['num_workers_epoch_s']}; "
                         f"best {row['best_num_workers']}")
                runs.append(row)
            elif name == "dgl-memmap-readahead":
                runs.append(self.run_dgl(name, {"num_workers": best_workers}))
            else:
                runs.append(self.run_system(name, *self.cap_for(name)))
        return runs

    def cap_for(self, name: str) -> tuple[int | None, dict | None]:
        """``name``'s memory cap and spec overrides: none for uncapped rows; DGL's wide cap,
        with the buffer budget it leaves, for the rows that ask for it (the paper's
        configuration); the cap otherwise."""
        spec = self.specs[name]
        if not spec["capped"]:
            return None, None
        if spec.get("cap") == "dgl_wide":
            return self.wide_cap, {"buffer_bytes": self.wide_cap - (self.args.process_mib << 20)}
        return self.cap, None

    def intended_settings(self, name: str) -> dict:
        """The settings ``name`` would run with (for a row that could not run)."""
        spec = {**self.common, **self.specs[name], "system": name}
        role = spec.pop("store_role", "main")
        store = self.stores.get(role) if "path" in self.stores.get(role, {}) else None
        store = store or {"path": None, "role": role, "num_partitions": None, "partitioner": role, "edge_cut": None}
        cap, overrides = self.cap_for(name)
        spec.update(overrides or {})
        return run_settings(spec, None, store=store, cap_bytes=cap, iso=self.iso)

    def run_system(self, name: str, cap_bytes: int | None, overrides: dict | None = None) -> dict:
        """One child: ``name``'s spec on its store, after drop_caches, under ``cap_bytes``."""
        out = self.args.workdir / f"child_{name}.json"
        out.unlink(missing_ok=True)
        spec = {**self.common, **self.specs[name], **(overrides or {}), "system": name, "out": str(out)}
        role = spec.pop("store_role", "main")
        spec.update(store=str(self.paths[role]), **{k: str(v) for k, v in self.target_files[role].items()})
        is_dgl = name.startswith("dgl")
        if is_dgl:
            spec.update({k: str(self.dgl_files[k]) for k in ("features", "indptr", "indices", "labels")})
        load = list(os.getloadavg())
        run = benchkit.run_child(__file__, spec, cap_bytes=cap_bytes if self.iso["cap_enforced"] else None,
                                 name="graphstore_bench_outofcore", drop_cache=self.iso["page_cache_dropped"],
                                 python=self.dgl_py if is_dgl else None)
        result = json.loads(out.read_text()) if run["returncode"] == 0 and out.exists() else None
        row = row_from_child(name, run, result, targets=self.args.targets, batch_size=self.args.batch_size)
        row.update(mem_cap_bytes=cap_bytes, loadavg_before=load, spec={k: v for k, v in spec.items() if k != "out"})
        row["settings"] = run_settings(spec, (result or {}).get("settings"), store=self.stores[role],
                                       cap_bytes=cap_bytes if self.specs[name]["capped"] else None, iso=self.iso)
        log_row(row, self.log)
        return row

    def dgl_sweep(self) -> dict[str, dict]:
        """dgl-memmap at each ``num_workers`` setting, every one under the same cap: when the
        cap killed a later setting, the earlier ones run again under the wide cap (their run
        under the cap kept as ``under_cap_result``), so the best is chosen among equals."""
        results = {str(w): self.run_dgl("dgl-memmap", {"num_workers": w}) for w in self.args.dgl_workers}
        if not self.dgl_killed:
            return results
        for w, row in results.items():
            if row["mem_cap_bytes"] == self.wide_cap or row.get("epoch_s_median") is None:
                continue
            again = self.run_dgl("dgl-memmap", {"num_workers": int(w)})  # the wide cap, now that it was killed
            again["note"] = "run again under the wide cap: the cap killed another setting"
            again["under_cap_result"] = {k: row.get(k) for k in ("mem_cap_bytes", "epoch_s_median", "epoch0_s",
                                                                 "bytes_read", "test_acc", "cgroup_peak_bytes")}
            results[w] = again
        return results

    def run_dgl(self, name: str, overrides: dict) -> dict:
        """One DGL setting under the cap, or under the wide cap once the cap has killed DGL."""
        if not self.iso["cap_enforced"]:
            return self.run_system(name, None, overrides)
        if self.args.dgl_wide_cap_only or self.dgl_killed:
            row = self.run_system(name, self.wide_cap, overrides)
            row["note"] = ("run only under the wide cap (--dgl-wide-cap-only)" if self.args.dgl_wide_cap_only else
                           f"not run under the cap: it killed DGL, with the same structure, in {self.dgl_killed[0]}")
        else:
            row = self.run_system(name, self.cap, overrides)
            if not row.get("oom"):
                return row
            self.dgl_killed.append(f"{name} with {overrides.get('num_workers')} workers")
            killed = {k: row.get(k) for k in ("mem_cap_bytes", "returncode", "oom_kills", "cgroup_peak_bytes",
                                              "error")}
            row = self.run_system(name, self.wide_cap, overrides)
            row["killed_under_cap"] = killed
        row["system"] = name + "-widecap"
        return row

    def settings(self) -> dict:
        a = self.args
        return {"targets": a.targets, "eval_targets": a.eval_targets, "epochs": a.epochs, "dgl_epochs": a.dgl_epochs,
                "dgl_workers": a.dgl_workers, "fanouts": a.fanouts,
                "fanouts_order": "fanouts[0] is the hop nearest the targets", "batch_size": a.batch_size,
                "hidden": a.hidden, "lr": a.lr, "optimizer": "Adam", "model": "2-layer GraphSage, mean aggregator",
                "threads": a.threads, "buffer_bytes": self.buffer_bytes, "process_bytes": a.process_mib << 20,
                "mem_cap_bytes": self.cap, "dgl_wide_cap_bytes": self.wide_cap if self.dgl_files else None,
                "readahead_budget_s": a.readahead_budget_s,
                "dgl_structure_bytes": self.dgl_files and self.dgl_files["structure_bytes"],
                "cap_enforced": self.iso["cap_enforced"], "page_cache_dropped": self.iso["page_cache_dropped"],
                "isolation_note": self.iso["why"]}


def machine_facts(store_path: Path, loadavg_start: list[float]) -> dict:
    return benchkit.machine_record("cpu", "cores", "python", "torch", "numpy", loadavg_at_start=loadavg_start,
                                   loadavg_at_end=list(os.getloadavg()), note=benchkit.SHARED_MACHINE_NOTE,
                                   mem_total_bytes=benchkit.mem_total_bytes(),
                                   read_ahead_kb=benchkit.read_ahead_kb(store_path))


def main(argv: list[str] | None = None) -> int:
    ap, args = parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    t_start = time.perf_counter()
    log = benchkit.elapsed_logger()

    if not args.iso["cap_enforced"]:
        log(f"no isolation: {args.iso['why']}")
    waited = 0.0
    while args.wait_idle_s and (others := other_benchmarks()) and waited < args.wait_idle_s:
        log(f"waiting for {len(others)} other benchmark(s): {others[0]}")
        time.sleep(30)
        waited += 30
    loadavg_start = list(os.getloadavg())
    store, stream, stores, quick_store = open_stores(args, ap, log)
    bench = Bench(args, store=store, stream=stream, stores=stores, log=log)
    mib = 256 if args.quick else 1024
    ddf = benchkit.ensure_dd_file(args.workdir / f"dd_{mib}MiB.bin", mib << 20)
    dd_runs = [benchkit.dd_read(ddf, drop_cache=False)]  # direct IO: the page cache plays no part
    log(f"dd: {dd_runs[0]['bytes_per_s'] / 1e9:.2f} GB/s")
    runs = bench.run_all()
    dd_runs.append(benchkit.dd_read(ddf, drop_cache=False))
    disk_bw = statistics.median(r["bytes_per_s"] for r in dd_runs)
    add_ratios(runs, disk_bw)
    goals = compute_goals(runs, targets=args.targets)
    stores["main"]["bytes_on_disk"] = benchkit.du(args.store)
    result = {
        "command": benchkit.command_line("tools/bench_outofcore.py", argv),
        "quick": args.quick, "runs": runs, "goals": goals,
        "goals_conditions": ("cap enforced, page cache dropped before each run" if args.iso["cap_enforced"]
                             else f"NOT out-of-core: {args.iso['why']}"),
        "data_bytes": bench.feature_bytes, "mem_cap_bytes": bench.cap, "data_vs_cap": bench.feature_bytes / bench.cap,
        "data_vs_buffer": bench.feature_bytes / bench.buffer_bytes,
        "disk_seq_read_bytes_per_s": disk_bw, "dd_runs": dd_runs, "stores": stores, "quick_store": quick_store,
        "settings": bench.settings(),
        "waited_for_other_benchmarks_s": waited, "other_benchmarks_at_end": other_benchmarks(),
        "machine": machine_facts(args.store, loadavg_start), "wall_s": time.perf_counter() - t_start,
    }
    benchkit.write_json(args.json, result)
    log(f"wrote {args.json}; goals " + json.dumps({k: (g["value"], g["met"]) for k, g in goals.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
