"""The data path alone: each loader's batches per second with a sink in place of the model.

Issue 32 item 4. Every benchmark before this one trains a model on the same cores that load
the data, so the model's compute hides the loader. Here each loader runs for one epoch
(``--epochs``) into a *sink* that touches every tensor of a batch and hashes it, for each
loader thread count (``loader_threads``, 1..nproc by default), each run in its own child
process, as ``tools/bench_outofcore.py`` runs its systems: the page cache dropped before an
out-of-core run and the out-of-core benchmark's cgroup v1 memory cap around it.

Systems
-------
* ``graphstore-memory``: scheme ``minibatch``, the whole store resident, no cap.
* ``graphstore-megabatch``: scheme ``megabatch`` with ``reuse=1`` and no static cache (each
  target once an epoch, as bench_outofcore's row of that name), capacity from the buffer
  budget (the cap minus ``--process-mib``), under the cap.
* ``graphstore-disk``: scheme ``disk``, the same budget, under the cap.
* ``graphstore-macrobatch``: scheme ``macrobatch`` (the structure resident, feature rows
  read from the store per round of rows up to ``--macro-batch-bytes``, by default the
  trainer's rule on the same buffer budget: a third of it, for the three rounds alive at
  once, `graphstore.loaders.defaults.macro_batch_bytes`), under the cap.
* ``dgl-memmap``: DGL 1.1.3's ``NeighborSampler`` + ``DataLoader`` over the same graph
  (bench_outofcore's DGL child: a CSC of int64 ids, the features in a ``np.memmap`` with
  ``MADV_RANDOM``, rows gathered in the loader's workers in ascending order), one run per
  ``--dgl-workers`` setting (its ``threads`` is ``num_workers``), under the cap (under the
  cap plus its structure plus 512 MiB when the cap kills it, every setting then). Runs in
  DGL's own interpreter; without one, a row with ``samples_per_s: null`` and the reason.

Every run: a warm-up of ``--warmup-batches`` batches of epoch 0 (untimed: the minibatch
loader's whole-store read, macro-batching's structure, DGL's workers' start), then epochs
1..E timed into the sink. One row per (system, threads):

* ``samples_per_s``: targets of the timed epochs over their wall time;
* ``bytes_read``: the loader's `BufferStats` (macro-batching's row reads included), and
  ``proc_read_bytes``, the child's ``/proc/self/io`` ``read_bytes`` (plus its live workers')
  over the same epochs: what reached the device, page cache misses only;
* ``disk_limit_samples_per_s``: the samples at the disk's read speed for the bytes the
  epoch must read (`BufferStats.planned_bytes`, else ``bytes_read``; DGL: its device bytes),
  the disk measured in the same run (`measure_disk`: the fastest of one ``dd`` stream, four,
  and the store's files read by eight threads); None when the epoch reads nothing.
  Macro-batching and DGL read scattered 4 KiB blocks: for them it is an upper bound;
  macro-batching's rows also get ``rows_limit_samples_per_s``, the same speed over the
  bytes of the rows its rounds needed (their unions; ``rows_union`` x ``row_bytes``):
  what its reads would allow if they read nothing else;
* ``gathered_bytes_per_s``: feature bytes handed to the sink per second; for the memory
  loader also ``numpy_gather_bytes_per_s``, a plain ``np.take`` of the same rows from the
  same resident array on as many threads, and the ratio of the two: the memory bandwidth a
  gather can reach is the memory loader's physical limit;
* ``peak_rss_bytes`` (`benchkit.vm_hwm_bytes` of the child), ``mem_cap_bytes`` (the cap
  enforced, None for none), the cgroup's peak and OOM kills, ``settings`` (the loader's
  ``settings.to_dict()``, ``loader_threads`` included, and this run's conditions);
* ``same_batches``: whether the sequence of batch hashes equals that of the same system's
  run at 1 thread (the lowest count run, named in ``same_batches_reference``).

The sink
--------
Per batch, in the consumer's thread: a sum over every DENSE tensor, the labels and the
features (the features as one sum per row, ``features.sum(1)``: every byte read once, as a
first layer would), and a blake2b digest of the store ids of ``dense.node_ids``, the hop
offsets, the sampled neighbours and their offsets, the labels, and the feature rows' sums
(``--hash bytes``: every feature byte instead; hashing 60 MB a batch costs more than the
gather it checks, so the default hashes the per-row sums, which differ for any row that
moved or changed beyond a float's rounding). DGL's batch: input nodes, output nodes, each
block's edges, labels, features, the same way.

Goals (``goals``, each ``{"value", "goal", "met"}``; ``met`` None without the rows it needs):
``memory_2_threads_vs_1`` >= 1.6; per out-of-core system ``<system>_vs_limit`` >= 0.8, its
samples/s over min(the memory loader's, its disk limit) at the same thread count (the value
is the worst thread count, ``by_threads`` has each); ``best_out_of_core_vs_dgl`` >= 10. And
``memory_scaling``: the memory loader's samples/s at N threads over N times its 1-thread
rate (the issue says near-linear to 16 threads, without a number: reported, not judged).

Stores: by default bench_outofcore's full store when it exists (``DEFAULT_STORE``, its cap
of 1 GiB), else bench_outofcore's quick store (cached in ``--cache-dir``, built when
missing, its cap scaled to it: `bench_outofcore.quick_cap_mib`); ``--quick``: the quick
store, 6,000 targets, threads 1,2, DGL only where its interpreter exists; ``--store PATH``:
any node-classification store. As root the full run drops the page cache before every
out-of-core child and caps it; ``--no-drop-caches`` keeps the page cache (a shared
machine's, or a test's); without root only ``--quick`` runs, uncapped, and the JSON says so.

Usage::

    .venv/bin/python tools/bench_loader.py --json OUT.json [--quick] [--store S.gs]
        [--threads 1,4,8,16] [--systems ...] [--epochs 1] [--dgl-workers 0,2,4,8]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

try:
    from tools import bench_outofcore as bo
    from tools import benchkit
except ImportError:  # run as a script (also in DGL's interpreter): tools/ is on sys.path
    import bench_outofcore as bo
    import benchkit

REPO = Path(__file__).resolve().parents[1]
MEMORY, MEGABATCH, DISK, MACROBATCH, DGL = ("graphstore-memory", "graphstore-megabatch", "graphstore-disk",
                                            "graphstore-macrobatch", "dgl-memmap")
SYSTEMS = (MEMORY, MEGABATCH, DISK, MACROBATCH, DGL)
OUT_OF_CORE = (MEGABATCH, DISK, MACROBATCH)
SCHEMES = {MEMORY: "minibatch", MEGABATCH: "megabatch", DISK: "disk", MACROBATCH: "macrobatch"}
ROW_KEYS = ("system", "scheme", "threads", "samples_per_s", "bytes_read", "disk_limit_samples_per_s",
            "peak_rss_bytes", "mem_cap_bytes", "same_batches", "settings")
"""Keys every row has (issue 32's JSON), None where they do not apply."""


# ---------------------------------------------------------------------- the sink

class BatchParts(NamedTuple):
    """What the sink reads of one batch, whatever loader made it."""

    hashed: list
    """Tensors whose bytes identify the batch (ids, offsets, labels), in a fixed order."""
    features: Any
    """float [N, D] input rows."""
    touched: list
    """Every other tensor of the batch (summed, not hashed)."""
    samples: int
    """Targets of the batch."""


def graphstore_parts(batch) -> BatchParts:
    """A `NodeBatch`'s tensors: ids as store ids (local ids depend on slots, store ids on
    nothing but the batch)."""
    d = batch.dense
    ids = d.node_ids if batch.graph is None else batch.store_ids
    optional = [d.edge_ids, batch.class_weights, batch.aggregated]
    return BatchParts(hashed=[ids, d.node_id_offsets, d.nbrs, d.nbr_offsets, batch.labels],
                      features=batch.features, samples=d.num_targets,
                      touched=[d.node_ids, *d.repr_map[1:], *(t for t in optional if t is not None)])


def dgl_parts(batch) -> BatchParts:
    """A `bench_outofcore.GatheringSampler` batch: ``(input_nodes, output_nodes, blocks, x, y)``."""
    input_nodes, output_nodes, blocks, x, y = batch
    edges = [t for block in blocks for t in block.edges()]
    return BatchParts(hashed=[input_nodes, output_nodes, *edges, y], features=x, touched=[],
                      samples=int(y.numel()))


class Sink:
    """Consumes batches in place of a model: reads every tensor once and keeps one digest per
    batch, so two runs' batches can be compared (`same_batches`)."""

    def __init__(self, *, hash_bytes: bool = False) -> None:
        self.hash_bytes = hash_bytes
        self.batches = self.samples = self.gathered_bytes = 0
        self.checksum = 0.0
        self.digests: list[str] = []

    def __call__(self, parts: BatchParts) -> None:
        h = hashlib.blake2b(digest_size=8)
        for t in parts.hashed:
            if t is not None:
                h.update(_buffer(t))
        row_sums = parts.features.sum(dim=1)  # every feature byte read once
        h.update(_buffer(parts.features if self.hash_bytes else row_sums))
        # float(): the reduction runs now, whatever the tensor's laziness.
        self.checksum += float(row_sums.sum()) + sum(float(t.sum()) for t in parts.hashed + parts.touched
                                                     if t is not None)
        self.digests.append(h.hexdigest())
        self.batches += 1
        self.samples += parts.samples
        self.gathered_bytes += parts.features.numel() * parts.features.element_size()

    def sequence_digest(self) -> str:
        """One digest of the whole sequence of batches."""
        return hashlib.blake2b("".join(self.digests).encode(), digest_size=16).hexdigest()


def _buffer(t):
    """A tensor's bytes without a copy where it is contiguous (hashlib reads the buffer)."""
    return t.detach().contiguous().numpy()


# ---------------------------------------------------------------------- the child's epochs

def warm_up(batches, sink, parts, n: int) -> None:
    """The first ``n`` batches of ``batches`` into ``sink``; then the iterator is closed
    (the loader's threads join) so the timed epochs start from a quiet process."""
    it = iter(batches)
    try:
        for batch in itertools.islice(it, n):
            sink(parts(batch))
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def timed_epochs(epoch_batches, sink, parts, epochs: int, after_epoch=None) -> dict:
    """Epochs 1..``epochs`` of ``epoch_batches(e, last)`` into ``sink``: wall and CPU time,
    the device bytes of this process and its live workers, ``after_epoch()`` of each."""
    io0, cpu0, t0 = bo._tree_read_bytes(), time.process_time(), time.perf_counter()
    per_epoch = []
    for e in range(1, epochs + 1):
        for batch in epoch_batches(e, e == epochs):
            sink(parts(batch))
        if after_epoch is not None:
            per_epoch.append(after_epoch())
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "cpu_s": time.process_time() - cpu0,
            "proc_read_bytes": bo._tree_read_bytes() - io0, "batches": sink.batches, "samples": sink.samples,
            "gathered_bytes": sink.gathered_bytes, "per_epoch": per_epoch,
            "samples_per_s": sink.samples / seconds if seconds > 0 else None, "batch_digests": sink.digests,
            "sequence_digest": sink.sequence_digest(), "checksum": sink.checksum}


def numpy_gather_bytes_per_s(features, id_batches: list, threads: int, min_seconds: float) -> float:
    """Bytes/s of ``np.take(features, ids, axis=0)`` over ``id_batches`` on ``threads``
    threads (np.take releases the GIL), repeated for at least ``min_seconds``: what memory
    lets a gather of these rows reach, with no sampling and no Python around it."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    threads = max(1, threads)
    jobs = [id_batches[k % len(id_batches)] for k in range(max(len(id_batches), 2 * threads))]
    outs = [np.empty((ids.size, *features.shape[1:]), features.dtype) for ids in jobs]

    def gather(k: int) -> None:
        np.take(features, jobs[k], axis=0, out=outs[k])

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(gather, range(len(jobs))))  # the outputs' pages and the threads exist
        rounds, t0 = 0, time.perf_counter()
        while rounds == 0 or time.perf_counter() - t0 < min_seconds:
            list(pool.map(gather, range(len(jobs))))
            rounds += 1
        seconds = time.perf_counter() - t0
    return rounds * sum(o.nbytes for o in outs) / seconds


def buffer_counters(stats) -> dict:
    """The `BufferStats` fields a row reports."""
    return {k: getattr(stats, k) for k in ("bytes_read", "planned_bytes", "read_seconds", "stall_seconds",
                                           "partitions_loaded", "states")}


def epoch_counters(loader) -> dict:
    """`buffer_counters`, and for macro-batching the rows its rounds needed (their unions)."""
    out = buffer_counters(loader.last_stats)
    if loader.fetch_stats is not None:
        out.update(rows_union=loader.fetch_stats.rows_union, rounds=loader.fetch_stats.rounds)
    return out


# ---------------------------------------------------------------------- the children

def loader_kwargs(spec: dict) -> dict:
    """NodeLoader's arguments for ``spec``'s system (bench_outofcore's rows of the same names)."""
    kw = {"fanouts": spec["fanouts"], "batch_size": spec["batch_size"], "scheme": spec["scheme"],
          "seed": spec["seed"], "shuffle": True, "prefetch": True, "loader_threads": spec["threads"]}
    if spec["scheme"] in ("megabatch", "disk"):
        kw["buffer_bytes"] = spec["buffer_bytes"]
    if spec["scheme"] == "megabatch":
        kw.update(reuse=1, static_cache=0.0)  # every target once an epoch, as the other rows
    if spec["scheme"] == "macrobatch":
        kw["macro_batch_bytes"] = spec["macro_batch_bytes"]
    return kw


def child_graphstore(spec: dict) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(spec["torch_threads"])
    sys.path.insert(0, str(REPO))
    import graphstore
    from graphstore.errors import ConfigError
    from graphstore.layout.dtypes import storage_dtype
    from graphstore.loaders import NodeLoader

    store = graphstore.open(spec["store"])
    try:
        loader = NodeLoader(store, nodes=np.load(spec["targets"]), **loader_kwargs(spec))
    except ConfigError as exc:
        return {"refused": str(exc), "peak_rss_bytes": benchkit.vm_hwm_bytes()}
    kept: list = []  # the memory loader's resident rows and a few batches' ids, for the numpy gather

    def keep_rows(batch) -> BatchParts:
        if spec["scheme"] == "minibatch" and batch.graph is not None:
            kept.append((batch.graph.features, batch.dense.node_ids.clone()))
        return graphstore_parts(batch)

    warm_up(loader.epoch(0, lookahead=False), Sink(), keep_rows, spec["warmup_batches"])
    sink = Sink(hash_bytes=spec["hash"] == "bytes")
    out = timed_epochs(lambda e, last: loader.epoch(e, lookahead=not last), sink, graphstore_parts,
                       spec["epochs"], after_epoch=lambda: epoch_counters(loader))
    for key in ("bytes_read", "planned_bytes", "read_seconds", "stall_seconds"):
        out[key] = sum(s[key] for s in out["per_epoch"])
    if loader.fetch_stats is not None:
        out["rows_union"] = sum(s["rows_union"] for s in out["per_epoch"])
        out["rounds"] = sum(s["rounds"] for s in out["per_epoch"])
        out["row_bytes"] = store.feature_dim * storage_dtype(store.manifest.feature_dtype).itemsize
    if kept:
        features = kept[0][0].numpy()
        out["numpy_gather_bytes_per_s"] = numpy_gather_bytes_per_s(
            features, [ids.numpy() for _, ids in kept], spec["threads"], spec["gather_seconds"])
    out["settings"] = loader.settings.to_dict()
    out["peak_rss_bytes"] = benchkit.vm_hwm_bytes()
    return out


def dgl_loader(g, sampler, targets, spec: dict):
    """DGL's DataLoader as bench_outofcore's DGL child makes it: forked, persistent workers."""
    import dgl
    import torch

    workers = int(spec["num_workers"])
    kwargs = {"num_workers": workers}
    if workers:
        kwargs.update(multiprocessing_context="fork", persistent_workers=True)
    return dgl.dataloading.DataLoader(g, torch.from_numpy(targets), sampler, batch_size=spec["batch_size"],
                                      shuffle=True, drop_last=False, **kwargs)


def child_dgl(spec: dict) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(spec["torch_threads"])
    import dgl

    torch.manual_seed(spec["seed"])
    g, labels, feats = bo.load_dgl_inputs(spec)
    # DGL's fanouts run from the input layer; ours from the targets.
    sampler = bo.GatheringSampler(dgl.dataloading.NeighborSampler(list(spec["fanouts"])[::-1]), feats, labels)
    loader = dgl_loader(g, sampler, np.load(spec["targets"]).astype(np.int64), spec)
    warm_up(loader, Sink(), dgl_parts, spec["warmup_batches"])
    sink = Sink(hash_bytes=spec["hash"] == "bytes")
    out = timed_epochs(lambda e, last: loader, sink, dgl_parts, spec["epochs"])
    out["bytes_read"] = out["proc_read_bytes"]  # DGL reads by page faults: the device's count is its own
    out["planned_bytes"] = None
    out["workers_peak_rss_bytes"] = [benchkit.vm_hwm_bytes(pid) for pid in bo._child_pids()]
    out["settings"] = {"scheme": "dgl NeighborSampler + DataLoader", "num_workers": int(spec["num_workers"]),
                       "gather": "in the loader's workers, ascending ids (bench_outofcore.GatheringSampler)",
                       "madvise_random": spec["madvise_random"], "dgl_version": dgl.__version__,
                       "torch_version": torch.__version__, "fanouts_dgl_order": list(spec["fanouts"])[::-1],
                       "batch_size": spec["batch_size"]}
    out["peak_rss_bytes"] = benchkit.vm_hwm_bytes()
    return out


def child(spec: dict) -> None:
    import faulthandler

    faulthandler.enable()  # a native crash leaves a traceback in the row
    result = child_dgl(spec) if spec["system"] == DGL else child_graphstore(spec)
    Path(spec["out"]).write_text(json.dumps(result))


# ---------------------------------------------------------------------- the parent's rows

def row_from_child(system: str, threads: int, run: dict, result: dict | None, cap_bytes: int | None) -> dict:
    """A run's row from its child's exit (`benchkit.run_capped`'s) and the JSON it wrote."""
    row = {k: None for k in ROW_KEYS}
    row.update(system=system, scheme=SCHEMES.get(system, "dgl"), threads=threads, mem_cap_bytes=cap_bytes,
               returncode=run["returncode"], child_seconds=run["seconds"], oom_kills=run["oom_kills"],
               cgroup_peak_bytes=run["cgroup_peak_bytes"], settings={})
    if result is None:
        row.update(error=(run["stderr"] or run["stdout"])[-1500:], oom=bool(run["oom_kills"]))
    elif "refused" in result:
        row.update(refused=result["refused"], peak_rss_bytes=result["peak_rss_bytes"])
    else:
        row.update(result)
        row["gathered_bytes_per_s"] = result["gathered_bytes"] / result["seconds"]
    return row


def not_run_row(system: str, threads: int | None, why: str, settings: dict) -> dict:
    """The row of a run that could not start (DGL absent): why, and what it would have run."""
    row = {k: None for k in ROW_KEYS}
    row.update(system=system, scheme=SCHEMES.get(system, "dgl"), threads=threads, skipped=why,
               settings=settings)
    return row


def add_limits(runs: list[dict], disk_bytes_per_s: float) -> None:
    """Each row's physical limits: its epoch's bytes at the disk's sequential speed, and the
    memory loader's gather against a plain numpy gather at the same thread count."""
    for r in runs:
        if not r.get("samples_per_s"):
            continue
        need = r.get("planned_bytes") or r.get("bytes_read") or 0
        r["disk_limit_bytes"] = need
        r["disk_limit_samples_per_s"] = r["samples"] / (need / disk_bytes_per_s) if need else None
        if r.get("rows_union") and r.get("row_bytes"):
            # Macro-batching: the rows its rounds needed, at the same speed; reading them
            # costs at least this whatever the blocks or chunks around them.
            rows = r["rows_union"] * r["row_bytes"]
            r["rows_limit_bytes"] = rows
            r["rows_limit_samples_per_s"] = r["samples"] / (rows / disk_bytes_per_s)
        if r.get("numpy_gather_bytes_per_s"):
            r["gather_vs_numpy_gather"] = r["gathered_bytes_per_s"] / r["numpy_gather_bytes_per_s"]


def mark_same_batches(runs: list[dict]) -> None:
    """``same_batches`` of each finished row: its batch digests equal those of the same
    system's run at 1 thread (else its lowest thread count), compared in this run."""
    by_system: dict[str, list[dict]] = {}
    for r in runs:
        if r.get("batch_digests") is not None:
            by_system.setdefault(r["system"], []).append(r)
    for rows in by_system.values():
        ref = min(rows, key=lambda r: (r["threads"] != 1, r["threads"]))
        for r in rows:
            r["same_batches"] = r["batch_digests"] == ref["batch_digests"]
            r["same_batches_reference"] = {"threads": ref["threads"],
                                           "sequence_digest": ref["sequence_digest"]}
            if not r["same_batches"]:
                pairs = itertools.zip_longest(r["batch_digests"], ref["batch_digests"])
                r["first_different_batch"] = next(i for i, (a, b) in enumerate(pairs) if a != b)


def compute_goals(runs: list[dict]) -> dict:
    """Issue 32's goals from one run's rows (see the module docstring)."""
    done = [r for r in runs if r.get("samples_per_s")]
    mem = {r["threads"]: r for r in done if r["system"] == MEMORY}

    def rate(threads: int) -> float | None:
        return mem[threads]["samples_per_s"] if threads in mem else None

    def missing(what: str) -> str:
        why = [f"{r['system']}@{r['threads']}: {_failure(r)[-200:]}"
               for r in runs if not r.get("samples_per_s")]
        return f"no {what} row finished" + (f" ({'; '.join(why)})" if why else "")

    two = rate(2) / rate(1) if rate(1) and rate(2) else None
    goals = {"memory_2_threads_vs_1": bo._goal(
        two, ">= 1.6 (graphstore-memory's samples/s at 2 threads over 1)", lambda v: v >= 1.6,
        missing("graphstore-memory at 1 and 2 threads"))}
    for system in OUT_OF_CORE:
        by = {}
        for r in (r for r in done if r["system"] == system and r["threads"] in mem):
            limit = min(x for x in (rate(r["threads"]), r["disk_limit_samples_per_s"]) if x)
            by[r["threads"]] = r["samples_per_s"] / limit
        goals[f"{system}_vs_limit"] = bo._goal(
            min(by.values()) if by else None, ">= 0.8 (samples/s over min(graphstore-memory's, the disk "
            "limit) at the same thread count; value: the worst thread count)", lambda v: v >= 0.8,
            missing(f"{system} with a graphstore-memory row at its thread count"), by_threads=by)
    goals["best_out_of_core_vs_dgl"] = _vs_dgl(done, missing)
    goals["memory_scaling"] = _memory_scaling(mem)
    return goals


def _vs_dgl(done: list[dict], missing) -> dict:
    ooc = [r for r in done if r["system"] in OUT_OF_CORE]
    dgl = [r for r in done if r["system"] == DGL]
    best = max(ooc, key=lambda r: r["samples_per_s"], default=None)
    best_dgl = max(dgl, key=lambda r: r["samples_per_s"], default=None)
    value = best["samples_per_s"] / best_dgl["samples_per_s"] if best and best_dgl else None
    return bo._goal(value, ">= 10 (the best out-of-core loader's samples/s over dgl-memmap's best)",
                    lambda v: v >= 10, missing("out-of-core or dgl-memmap"),
                    best=best and {"system": best["system"], "threads": best["threads"]},
                    dgl_best_num_workers=best_dgl and best_dgl["threads"])


def _memory_scaling(mem: dict) -> dict:
    one = mem[1]["samples_per_s"] if 1 in mem else None
    eff = {t: r["samples_per_s"] / (t * one) for t, r in mem.items() if t >= 1 and one}
    top = max(eff, default=None)
    return {"value": eff.get(top), "goal": "near-linear to 16 threads on a 16-core machine (the issue gives "
            "no number: samples/s at N threads over N x 1 thread's, reported, not judged)", "met": None,
            "threads": top, "by_threads": eff}


def limits(runs: list[dict], disk: dict) -> dict:
    """The physical limits of the run: the disk's sequential read, and the gather's memory
    bandwidth by thread count with the memory loader's gathered bytes/s against it."""
    gather = {r["threads"]: {"numpy_gather_bytes_per_s": r["numpy_gather_bytes_per_s"],
                             "memory_loader_gathered_bytes_per_s": r["gathered_bytes_per_s"],
                             "loader_vs_numpy_gather": r["gather_vs_numpy_gather"]}
              for r in runs if r["system"] == MEMORY and r.get("numpy_gather_bytes_per_s")}
    return {"disk": disk, "memory_gather_by_threads": gather}


# ---------------------------------------------------------------------- the parent

class Bench:
    """One run: the store, targets, caps and DGL's inputs; every (system, threads) in a child."""

    def __init__(self, args, store, log) -> None:
        self.args, self.log, self.iso = args, log, args.iso
        self.feature_bytes = store.num_nodes * store.feature_dim * 4
        full = args.store.resolve() == bo.DEFAULT_STORE.resolve()
        # bench_outofcore's caps: 1 GiB on its full store, scaled to any other.
        args.cap_mib = args.cap_mib or (1024 if full else
                                        bo.quick_cap_mib(self.feature_bytes, args.process_mib))
        self.cap = args.cap_mib << 20
        args.workdir = args.workdir or (Path("/work/bench_outofcore") if full else args.cache_dir / "work")
        args.workdir.mkdir(parents=True, exist_ok=True)
        tag = bo._store_tag(args.store, store)
        train, test = bo.choose_targets(store, seed=args.seed, targets=args.targets, eval_targets=1)
        self.targets = bo.write_targets(args.workdir, f"loader_{tag}", train, test)["targets"]
        self.num_targets = int(train.size)
        self.store = store
        from graphstore.loaders.defaults import MACRO_ROUNDS_HELD

        budget = self.cap - (args.process_mib << 20)
        self.common = {"fanouts": args.fanouts, "batch_size": args.batch_size, "seed": args.seed,
                       "epochs": args.epochs, "warmup_batches": args.warmup_batches, "hash": args.hash,
                       "torch_threads": args.torch_threads, "store": str(args.store),
                       "targets": str(self.targets), "buffer_bytes": budget,
                       "macro_batch_bytes": (args.macro_batch_bytes if args.macro_batch_bytes is not None
                                             else budget // MACRO_ROUNDS_HELD),
                       "gather_seconds": args.gather_seconds}

    def describe(self) -> None:
        a, enforced = self.args, "enforced" if self.iso["cap_enforced"] else "NOT enforced"
        self.log(f"{a.store}: {self.store.num_nodes:,} nodes, features {self.feature_bytes / 2**30:.2f} GiB, "
                 f"cap {a.cap_mib} MiB ({enforced}), {self.num_targets} targets, threads {a.threads}")

    def conditions(self, capped: bool) -> dict:
        """What every row's settings say about how it ran."""
        enforced = capped and self.iso["cap_enforced"]
        return {"cap_enforced": enforced, "page_cache_dropped": capped and self.iso["page_cache_dropped"],
                "cap_intended_bytes": self.cap if capped else None, "torch_threads": self.args.torch_threads,
                "epochs": self.args.epochs, "warmup_batches": self.args.warmup_batches,
                "targets": self.num_targets, "fanouts": self.args.fanouts, "hash": self.args.hash,
                "store": str(self.args.store)}

    def run(self, system: str, threads: int, extra: dict, cap_bytes: int | None,
            python: str | None = None) -> dict:
        """One child after drop_caches (out of core only), under ``cap_bytes``."""
        out = self.args.workdir / f"child_loader_{system}_{threads}.json"
        out.unlink(missing_ok=True)
        capped = system != MEMORY
        spec = {**self.common, **extra, "system": system, "scheme": SCHEMES.get(system, "dgl"),
                "threads": threads, "out": str(out)}
        enforce = cap_bytes if self.iso["cap_enforced"] else None
        run = benchkit.run_child(__file__, spec, cap_bytes=enforce, name="graphstore_bench_loader",
                                 drop_cache=capped and self.iso["page_cache_dropped"], python=python)
        result = json.loads(out.read_text()) if run["returncode"] == 0 and out.exists() else None
        row = row_from_child(system, threads, run, result, enforce)
        row["settings"] = {**self.conditions(capped), **row["settings"]}
        if system == DGL:
            row["settings"]["num_workers"] = threads
            row["same_batches_note"] = ("DGL draws each worker's samples from that worker's own random "
                                        "stream: other num_workers, other batches")
        log_row(row, self.log)
        return row

    def graphstore_runs(self) -> list[dict]:
        return [self.run(system, threads, {}, None if system == MEMORY else self.cap)
                for system in self.args.systems if system != DGL for threads in self.args.threads]

    def dgl_runs(self) -> list[dict]:
        """dgl-memmap at each ``--dgl-workers``, all under the cap, or all under the wide
        cap (its structure and 512 MiB more) once the cap killed one: one cap for all, so
        the best setting is chosen among equals."""
        if DGL not in self.args.systems:
            return []
        py, why = bo.find_dgl_python(self.args, self.log)
        if py is None:
            self.log(f"{DGL}: {why}")
            return [not_run_row(DGL, w, f"DGL {why}", dict(self.conditions(True), num_workers=w))
                    for w in self.args.dgl_workers]
        files = bo.prepare_dgl_inputs(self.store, self.args.store, self.args.workdir)
        extra = {k: str(files[k]) for k in ("features", "indptr", "indices", "labels")}
        extra.update(num_nodes=self.store.num_nodes, feature_dim=self.store.feature_dim, madvise_random=True)
        rows = [self.run(DGL, w, dict(extra, num_workers=w), self.cap, py) for w in self.args.dgl_workers]
        if any(r.get("oom") for r in rows):
            wide = -(-(self.cap + files["structure_bytes"] + (512 << 20)) // (64 << 20)) * (64 << 20)
            self.log(f"{DGL}: the {self.cap >> 20} MiB cap killed a setting; all again under "
                     f"{wide >> 20} MiB")
            killed = [w for w, r in zip(self.args.dgl_workers, rows, strict=True) if r.get("oom")]
            rows = [dict(self.run(DGL, w, dict(extra, num_workers=w), wide, py),
                         note=f"under the wide cap: the cap killed num_workers {killed}")
                    for w in self.args.dgl_workers]
        return rows


def measure_disk(args) -> dict:
    """The disk's read speed, three ways where the page cache may be dropped: one ``dd`` stream
    (`benchkit.dd_bandwidth`: write, drop the page cache, direct-IO read), four direct-IO
    streams (`benchkit.dd_read_parallel`), and the store's own feature files read cold by
    eight threads (`store_read_bytes_per_s`), as the buffer reads partitions. On the 2-core
    development machine one stream gave 0.8-1.1 GB/s, four 0.3-1.0, the store's files 1.0-1.7,
    and the megabatch loader's own reads 2.2 (2.28 GB in 1.04 s): one stream is no limit, and
    even the fastest can fall short of what the buffer gets (a row above 1x its disk limit says
    so). The limit is the fastest. Without dropping the page cache: one stream of a kept file
    (direct IO bypasses the page cache anyway)."""
    path = args.workdir / "dd_bench_loader.bin"
    if not args.iso["page_cache_dropped"]:
        benchkit.ensure_dd_file(path, args.dd_mib << 20)
        one = benchkit.dd_read(path, drop_cache=False)["bytes_per_s"]
        return {"read_bytes_per_s": one, "one_stream_bytes_per_s": one, "four_streams_bytes_per_s": None,
                "store_files_bytes_per_s": None}
    one = benchkit.dd_bandwidth(path, args.dd_mib)
    kept = benchkit.ensure_dd_file(args.workdir / "dd_bench_loader_parallel.bin", args.dd_mib << 20)
    four = benchkit.dd_read_parallel(kept, streams=4)["bytes_per_s"]
    files = store_read_bytes_per_s(args.store)
    return {"read_bytes_per_s": max(one["read_bytes_per_s"], four, files),
            "one_stream_bytes_per_s": one["read_bytes_per_s"], "four_streams_bytes_per_s": four,
            "store_files_bytes_per_s": files, "write_bytes_per_s": one["write_bytes_per_s"]}


def store_read_bytes_per_s(store_path: Path, threads: int = 8) -> float:
    """Bytes/s of a cold, buffered read of the store's feature files (its whole folder when
    it has no ``nodes/features``) by ``threads`` threads, after `benchkit.drop_caches`."""
    from concurrent.futures import ThreadPoolExecutor

    folder = store_path / "nodes" / "features"
    files = [f for f in (folder if folder.is_dir() else store_path).rglob("*") if f.is_file()]

    def read(path: Path) -> int:
        buf, total = bytearray(8 << 20), 0
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                total += n
        return total

    benchkit.drop_caches()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(read, files))
    return total / (time.perf_counter() - t0)


def log_row(row: dict, log) -> None:
    label = f"{row['system']} @ {row['threads']} {'workers' if row['system'] == DGL else 'threads'}"
    if row.get("samples_per_s"):
        state = (f"{row['samples_per_s']:,.0f} samples/s ({row['batches']} batches, {row['seconds']:.2f} s, "
                 f"cpu {row['cpu_s']:.2f} s), read {row['bytes_read']} (device {row['proc_read_bytes']})")
    else:
        state = f"NO RESULT: {_failure(row)[-400:]}"
    rss, cap = row.get("peak_rss_bytes"), row["mem_cap_bytes"]
    log(f"{label}: {state}; peak RSS {rss and rss >> 20} MiB, cap {cap and cap >> 20} MiB")


def _failure(row: dict) -> str:
    """Why a row has no result."""
    return str(row.get("refused") or row.get("error") or row.get("skipped"))


def open_store(args, log) -> tuple:
    """The store to measure, its record (with how it was chosen) and the quick store's cache
    record (None unless it is the quick store): ``--store``; else (not --quick) the out-of-core
    benchmark's full store when it exists; else its cached quick store."""
    sys.path.insert(0, str(REPO))
    import graphstore

    quick = None
    if args.store is not None:
        choice = "--store"
    elif not args.quick and bo.DEFAULT_STORE.exists():
        args.store, choice = bo.DEFAULT_STORE, "bench_outofcore's full store"
    else:
        built, quick = bo.cached_quick_stores(args.cache_dir, log)
        args.store = built["metis"]
        choice = "bench_outofcore's quick store" + ("" if args.quick else f" ({bo.DEFAULT_STORE} is absent)")
    store = graphstore.open(args.store)
    return store, dict(bo.store_info(store, args.store, "main"), choice=choice), quick


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = ap.add_argument
    add("--json", type=Path, help="write the results here (required)")
    add("--quick", action="store_true", help="the quick store, 6,000 targets, threads 1,2: the harness")
    add("--store", type=Path, default=None, help="a node-classification store (default: bench_outofcore's "
        f"full store {bo.DEFAULT_STORE} when present, else its cached quick store)")
    add("--cache-dir", type=Path, default=bo.DEFAULT_CACHE_DIR, help="bench_outofcore's quick store cache")
    add("--workdir", type=Path, default=None, help="targets, DGL's inputs, dd file, children's JSON "
        "(default: bench_outofcore's: /work/bench_outofcore for its full store, else CACHE_DIR/work)")
    add("--threads", default=None, help="loader thread counts, comma-separated (0: inline in the consumer); "
        "default 1..nproc, --quick 1,2")
    add("--systems", default=",".join(SYSTEMS), help="comma-separated, from: " + ", ".join(SYSTEMS))
    add("--targets", type=int, default=None, help="training targets (default 60000, --quick 6000)")
    add("--epochs", type=int, default=1, help="timed epochs per run")
    add("--warmup-batches", type=int, default=None, help="untimed batches first (default 3, --quick 2)")
    add("--fanouts", default="10,5", help="fanouts[0] is the hop nearest the targets")
    add("--batch-size", type=int, default=1000)
    add("--cap-mib", type=int, default=None, help="the out-of-core runs' cgroup cap (default: "
        "bench_outofcore's, 1024 on its full store, else scaled to the store)")
    add("--process-mib", type=int, default=576, help="the buffer budget is the cap minus this")
    add("--macro-batch-bytes", type=int, default=None, help="macrobatch's rows per round (bytes; default: "
        "the trainer's rule, a third of the buffer budget megabatch and disk get)")
    add("--torch-threads", type=int, default=1, help="torch's intra-op threads in every child: the loader "
        "threads are the only parallelism measured")
    add("--hash", choices=("rows", "bytes"), default="rows", help="features enter a batch's digest as "
        "per-row sums, or as every byte (slower than the gather it checks)")
    add("--gather-seconds", type=float, default=1.0, help="time of the numpy gather per memory run")
    add("--dd-mib", type=int, default=None, help="the dd measurement's size (default 1024, --quick 256)")
    add("--no-drop-caches", action="store_true", help="keep the page cache (a shared machine's, a test's); "
        "the cap still applies where it can")
    add("--dgl-workers", default="0,2,4,8", help="DGL num_workers settings, each a dgl-memmap row")
    add("--dgl-python", default=None, help="an interpreter with dgl")
    add("--dgl-venv", default=str(REPO / ".venv-dgl"),
        help="DGL's venv (created when missing, not with --quick)")
    add("--seed", type=int, default=0)
    add("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return args
    if args.json is None:
        ap.error("--json is required")
    args.iso = isolation(args.no_drop_caches)
    if not args.quick and not args.iso["cap_enforced"]:
        ap.error(f"the full run needs a memory cap ({args.iso['why']}); --quick runs without one")
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown:
        ap.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    every_core = ",".join(map(str, range(1, os.cpu_count() + 1)))
    args.threads = [int(t) for t in (args.threads or ("1,2" if args.quick else every_core)).split(",")]
    if min(args.threads) < 0 or args.epochs < 1:
        ap.error("--threads must be >= 0 and --epochs >= 1")
    args.dgl_workers = [int(w) for w in args.dgl_workers.split(",") if w]
    args.fanouts = [int(f) for f in args.fanouts.split(",")]
    args.targets = args.targets or (6000 if args.quick else 60000)
    args.warmup_batches = args.warmup_batches if args.warmup_batches is not None else (2 if args.quick else 3)
    args.dd_mib = args.dd_mib or (256 if args.quick else 1024)
    args.cache_dir = args.cache_dir.expanduser()
    return args


def isolation(keep_page_cache: bool) -> dict:
    """`bench_outofcore.isolation`, less the page cache drops with ``keep_page_cache``."""
    iso = bo.isolation()
    if not keep_page_cache or not iso["page_cache_dropped"]:
        return iso
    why = "--no-drop-caches: the page cache is kept (warm reads)"
    return dict(iso, page_cache_dropped=False, why=why + (f"; {iso['why']}" if iso["why"] else ""))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    log, started = benchkit.elapsed_logger(), {"t": time.perf_counter(), "loadavg": list(os.getloadavg())}
    if args.iso["why"]:
        log(f"isolation: {args.iso['why']}")
    store, store_record, quick_store = open_store(args, log)
    bench = Bench(args, store, log)
    bench.describe()
    disk = [measure_disk(args)]
    runs = bench.graphstore_runs() + bench.dgl_runs()
    disk.append(measure_disk(args))
    disk_bw = statistics.median(d["read_bytes_per_s"] for d in disk)
    add_limits(runs, disk_bw)
    mark_same_batches(runs)
    goals = compute_goals(runs)
    physical = limits(runs, {"read_bytes_per_s": disk_bw, "runs": disk})
    result = result_record(args, argv, bench, runs, goals, physical, store=store_record,
                           quick_store=quick_store, started=started)
    benchkit.write_json(args.json, result)
    log(f"wrote {args.json}; goals " + json.dumps({k: (g["value"], g["met"]) for k, g in goals.items()}))
    return 0


def result_record(args, argv, bench, runs, goals, limits_record, *, store, quick_store, started) -> dict:
    """The JSON: the rows (without their per-batch digests), goals, limits, the run's conditions."""
    machine = benchkit.machine_record("cpu", "cores", "python", "torch", "numpy", "mem_total_bytes",
                                      loadavg_at_start=started["loadavg"],
                                      loadavg_at_end=list(os.getloadavg()), note=benchkit.SHARED_MACHINE_NOTE)
    return {"command": benchkit.command_line("tools/bench_loader.py", argv), "quick": args.quick,
            "runs": [{k: v for k, v in r.items() if k != "batch_digests"} for r in runs], "goals": goals,
            "limits": limits_record, "goals_conditions": _conditions(args), "store": store,
            "quick_store": quick_store, "feature_bytes": bench.feature_bytes, "mem_cap_bytes": bench.cap,
            "features_vs_cap": bench.feature_bytes / bench.cap, "machine": machine,
            "wall_s": time.perf_counter() - started["t"]}


def _conditions(args) -> str:
    iso = ("cap enforced, page cache dropped before each out-of-core run" if args.iso["cap_enforced"]
           and args.iso["page_cache_dropped"] else f"NOT fully out-of-core: {args.iso['why']}")
    return iso + ("; --quick: a harness check (few batches), not the goals' setting" if args.quick else "")


if __name__ == "__main__":
    sys.exit(main())
