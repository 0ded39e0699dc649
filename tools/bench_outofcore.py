"""Out-of-core training: graphstore's mega-batch and disk schemes against DGL + numpy memmap.

One run, one machine, one synthetic node-classification store whose features are several
times a cgroup v1 memory cap (the page cache counts against it). Each system trains the
same 2-layer GraphSage (hidden 128, mean aggregator, Adam) on the same fixed subset of
training nodes, with the same fanouts and batch size, in its own child process, after
dropping the page cache:

* ``graphstore-megabatch``: `NodeLoader` scheme ``megabatch`` (HierBatching), capacity from
  ``buffer_bytes`` (the cap minus the process's own memory), no static cache (see
  ``-cache`` below), ``reuse=1`` so every system trains each target once an epoch (``-reuse2``: HierBatching's
  default of two passes per mega-batch, twice the samples, reported as samples/s);
* ``graphstore-disk``: scheme ``disk`` (the loader's rule picks ``sequential`` when every
  training partition fits, else ``dispersed``), capacity from the same budget;
* ``dgl-memmap``: DGL 1.1.3 ``NeighborSampler`` + ``DataLoader`` (``num_workers=0``) on a
  graph built from a CSC alone (``formats("csc")``: no COO/CSR copies), features gathered
  from a ``np.memmap`` of a raw float32 file in store order with ``madvise(MADV_RANDOM)``: without
  it a fault reads up to ``read_ahead_kb`` (8 MiB on this disk) for a 512-byte row;
  ``dgl-memmap-readahead`` is the same without the madvise, stopped after a time budget and
  its epoch projected (it is the slowest by far). If DGL is killed by the cap, it runs
  again under a cap that fits its structure plus the same room for the page cache. The ids
  are int64: with int32 ids DGL 1.1.3 (with torch 2.13) corrupts its heap in the first
  batches (``COOToCSR`` check failures, segfaults in ``gspmm``, with or without libxsmm
  and with one OpenMP thread), so the smallest structure that runs is int64;
* ``graphstore-megabatch-cache``: the mega-batch scheme with HierBatching's static cache
  of the 1 % highest-degree nodes (the loader's default). On a power-law graph those nodes
  touch a large share of the edges (18-32 % on the generator's graphs); the cache's rows and
  edges come out of the same byte budget, so fewer partitions fit beside it;
* ``graphstore-memory``: scheme ``minibatch`` (the whole store resident), no cap.

Per system: epoch times (epoch 0 is cold: it includes the first state's read, or for
``graphstore-memory`` the whole store's), samples/s, the device bytes read per epoch
(``/proc/self/io`` ``read_bytes`` in the child), the buffer's ``bytes_read`` and
``planned_bytes`` (the minimum the plan must read), stall seconds, the time spent outside
the loader's iteration (the model's share), peak RSS, the cgroup's peak and OOM kills,
test accuracy on a fixed subset of the test split (same fanouts, same scheme), and ratios
against graphstore-megabatch and graphstore-memory. The disk's sequential read bandwidth
(``dd iflag=direct``) is measured in the same run; ``planned_bytes / dd bandwidth`` is
the physical limit of a graphstore epoch.

Needs root (drop_caches, cgroups). The default store is a synthetic graph with locality
(communities the METIS partitions can find, as in real graphs), made once with::

    .venv/bin/python tools/make_synthetic.py --kind node --num-nodes 7340032 --avg-degree 10 \
        --feature-dim 128 --num-classes 10 --layout npz --communities 1280 --locality 0.75 \
        --homophily 0.2 --out /work/bench_local/synthetic_local_n7340032_d128
    .venv/bin/python -m graphstore convert /work/bench_local/synthetic_local_n7340032_d128 \
        /work/bench_local/store_local_n7340032_p64.gs --partitions 64 --partitioner metis

Usage::

    .venv/bin/python tools/bench_outofcore.py --json docs/benchmarks/outofcore.json \
        [--quick] [--targets N] [--wait-idle-s 600] [--dgl-wide-cap-only]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import mmap
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SYSTEMS = ("graphstore-megabatch", "graphstore-megabatch-reuse2", "graphstore-megabatch-cache", "graphstore-disk",
           "dgl-memmap", "dgl-memmap-readahead", "graphstore-memory")


def _tool(name: str):
    """A sibling benchmark module (its helpers are reused, not copied). Loaded lazily: the
    DGL child runs this file in DGL's own environment, which has no graphstore."""
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _proc_io() -> int:
    """This process's ``read_bytes`` (bytes it caused to be fetched from the device,
    page faults of a memory map included)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def _max_rss_bytes() -> int:
    """This process's peak RSS (VmHWM: per address space, so unlike ``ru_maxrss`` it does
    not inherit the forking parent's RSS, which Linux carries over through fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------------- children

def _train_epochs(spec: dict, epoch_iter, step, extra_stats=None) -> list[dict]:
    """Run ``spec['epochs']`` epochs: ``epoch_iter(e, last)`` yields batches, ``step(batch)``
    trains one and returns (targets, input nodes: the feature rows the batch gathered). Times
    the whole epoch and, separately, the time spent waiting on the loader's iterator (the
    rest is the model's: forward, backward, optimizer). Process CPU time is recorded too:
    other jobs on a shared machine stretch wall time more than CPU time."""
    out = []
    budget = spec.get("time_budget_s")
    for e in range(spec["epochs"]):
        io0, t0, c0 = _proc_io(), time.perf_counter(), time.process_time()
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
               "compute_share": (seconds - wait) / seconds, "device_read_bytes": _proc_io() - io0,
               "stopped_by_time_budget": stopped}
        if extra_stats:
            row.update(extra_stats())
        out.append(row)
        print(f"epoch {e}: {seconds:.1f} s, {samples} samples, {batches} batches", flush=True)
        if stopped:
            break
    return out


def child_graphstore(spec: dict) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(spec["threads"])
    sys.path.insert(0, str(REPO))
    import graphstore
    from graphstore.loaders import NodeLoader
    from graphstore.nn import GNN

    t_setup = time.perf_counter()
    store = graphstore.open(spec["store"])
    kw = dict(fanouts=spec["fanouts"], batch_size=spec["batch_size"], scheme=spec["scheme"], seed=spec["seed"],
              prefetch=True, buffer_bytes=spec["buffer_bytes"], reuse=spec["reuse"],
              static_cache=spec.get("static_cache"))
    loader = NodeLoader(store, nodes=np.load(spec["targets"]), shuffle=True, **kw)
    torch.manual_seed(spec["seed"])
    model = GNN("sage", in_dim=store.feature_dim, hidden_dim=spec["hidden"], out_dim=store.num_classes,
                num_layers=len(spec["fanouts"]))
    opt = torch.optim.Adam(model.parameters(), lr=spec["lr"])
    setup_s = time.perf_counter() - t_setup

    def step(batch) -> tuple[int, int]:
        loss = F.cross_entropy(model(batch.features, batch.dense), batch.labels, ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return int(batch.labels.numel()), int(batch.features.shape[0])

    def stats() -> dict:
        s = loader.epoch_stats[-1]
        return {"buffer": {"states": s.states, "partitions_loaded": s.partitions_loaded, "bytes_read": s.bytes_read,
                           "planned_bytes": s.planned_bytes, "read_seconds": s.read_seconds,
                           "assemble_seconds": s.assemble_seconds, "stall_seconds": s.stall_seconds}}

    model.train()
    # The last epoch does not read ahead into an epoch that will not run (its bytes would count).
    epochs = _train_epochs(spec, lambda e, last: loader.epoch(e, lookahead=not last), step, stats)
    settings = dict(loader.settings)
    footprint = getattr(loader, "footprint", None)
    if footprint is not None:
        settings["footprint_bytes"] = footprint.total
    buffer_memory = 0 if loader.memory is None else loader.memory.nbytes
    # One buffer at a time under the cap: the evaluation loader gets its own memory.
    loader = None
    gc.collect()
    acc = None
    if not spec.get("skip_eval"):
        ev = NodeLoader(store, nodes=np.load(spec["eval_targets"]), shuffle=False,
                        **dict(kw, reuse=1, seed=spec["seed"] + 1))
        model.eval()
        correct = seen = 0
        with torch.no_grad():
            for batch in ev.epoch(0, lookahead=False):
                pred = model(batch.features, batch.dense).argmax(1)
                mask = batch.labels >= 0
                correct += int((pred[mask] == batch.labels[mask]).sum())
                seen += int(mask.sum())
        acc = correct / max(seen, 1)
    return {"setup_s": setup_s, "epochs": epochs, "test_acc": acc, "settings": settings,
            "buffer_memory_bytes": buffer_memory, "child_max_rss_bytes": _max_rss_bytes()}


def child_dgl(spec: dict) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(spec["threads"])
    import dgl
    from dgl.nn import SAGEConv

    t_setup = time.perf_counter()
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
    sampler = dgl.dataloading.NeighborSampler(list(spec["fanouts"])[::-1])  # DGL: input layer first

    class Sage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            dims = [d] + [spec["hidden"]] * (len(spec["fanouts"]) - 1) + [spec["num_classes"]]
            self.layers = torch.nn.ModuleList(SAGEConv(a, b, "mean") for a, b in zip(dims, dims[1:]))

        def forward(self, blocks, h):
            for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                h = layer(block, h)
                if i + 1 < len(self.layers):
                    h = F.relu(h)
            return h

    torch.manual_seed(spec["seed"])
    model = Sage()
    opt = torch.optim.Adam(model.parameters(), lr=spec["lr"])
    setup_s = time.perf_counter() - t_setup

    def batches(targets: np.ndarray, shuffle: bool):
        loader = dgl.dataloading.DataLoader(g, torch.from_numpy(targets.astype(np.int64)), sampler,
                                            batch_size=spec["batch_size"], shuffle=shuffle, drop_last=False,
                                            num_workers=0)
        for input_nodes, output_nodes, blocks in loader:
            # The gather from the map is where the page faults (the reads) happen: part of
            # the loader's time, as graphstore's gather is.
            x = torch.from_numpy(feats[input_nodes.numpy()])
            yield blocks, x, labels[output_nodes.long()]

    def step(batch) -> tuple[int, int]:
        blocks, x, y = batch
        loss = F.cross_entropy(model(blocks, x), y, ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return int(y.numel()), int(x.shape[0])

    model.train()
    targets = np.load(spec["targets"])
    epochs = _train_epochs(spec, lambda e, last: batches(targets, True), step)
    acc = None
    if not spec.get("skip_eval"):
        model.eval()
        correct = seen = 0
        with torch.no_grad():
            for blocks, x, y in batches(np.load(spec["eval_targets"]), False):
                pred = model(blocks, x).argmax(1)
                mask = y >= 0
                correct += int((pred[mask] == y[mask]).sum())
                seen += int(mask.sum())
        acc = correct / max(seen, 1)
    return {"setup_s": setup_s, "epochs": epochs, "test_acc": acc, "child_max_rss_bytes": _max_rss_bytes(),
            "settings": {"dgl_version": dgl.__version__, "torch_version": torch.__version__,
                         "graph_formats": g.formats(), "idtype": str(g.idtype), "num_workers": 0,
                         "madvise_random": spec["madvise_random"],
                         "fanouts_dgl_order": list(spec["fanouts"])[::-1]}}


def child(spec: dict) -> None:
    import faulthandler

    faulthandler.enable()  # a crash (e.g. a native library under memory pressure) leaves a traceback
    result = child_dgl(spec) if spec["system"].startswith("dgl") else child_graphstore(spec)
    Path(spec["out"]).write_text(json.dumps(result))


# ---------------------------------------------------------------------- preparation

def prepare(args, store) -> dict:
    """Files every system reads, written once into ``--workdir`` (cached across runs): the
    DGL inputs (raw features, CSC, labels) and the fixed target subsets."""
    import numpy as np

    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    n, d, p = store.num_nodes, store.feature_dim, store.num_partitions
    # Keyed by the store: two stores of one size hold different graphs and orders.
    tag = f"{args.store.resolve().name.removesuffix('.gs')}_n{n}_d{d}"
    files = {"features": work / f"features_{tag}.f32", "indptr": work / f"csc64_indptr_{tag}.npy",
             "indices": work / f"csc64_indices_{tag}.npy", "labels": work / f"labels_{tag}.npy"}
    done = work / f".prepared64_{tag}"
    if not done.exists():
        t0 = time.perf_counter()
        with open(files["features"], "wb") as fh:  # store order = node order of the DGL graph
            for k in range(p):
                lo, hi = store.partition_range(k)
                fh.write(store.read_rows("nodes/features", lo, hi).astype(np.float32, copy=False).tobytes())
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
        done.write_text(json.dumps({"seconds": time.perf_counter() - t0}))
    # The same targets for every system: a seeded subset of the train split (and of test).
    rng = np.random.default_rng(args.seed)
    train = np.asarray(store.read_node_split("train"), np.int64)
    test = np.asarray(store.read_node_split("test"), np.int64)
    targets = np.sort(rng.choice(train, size=min(args.targets, train.size), replace=False))
    eval_targets = np.sort(rng.choice(test, size=min(args.eval_targets, test.size), replace=False))
    files["targets"], files["eval_targets"] = work / "targets.npy", work / "eval_targets.npy"
    np.save(files["targets"], targets)
    np.save(files["eval_targets"], eval_targets)
    files["structure_bytes"] = files["indptr"].stat().st_size + files["indices"].stat().st_size
    return files


def dd_file(work: Path, mib: int) -> Path:
    path = work / f"dd_{mib}MiB.bin"
    if not path.exists() or path.stat().st_size != mib << 20:
        subprocess.run(["dd", "if=/dev/urandom", f"of={path}", "bs=4M", f"count={mib // 4}", "oflag=direct",
                        "conv=fsync"], check=True, capture_output=True)
    return path


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


# ---------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write results here")
    ap.add_argument("--store", type=Path, default=Path("/work/bench_local/store_local_n7340032_p64.gs"),
                    help="a converted synthetic node-classification store (see the module docstring)")
    ap.add_argument("--workdir", type=Path, default=Path("/work/bench_outofcore"),
                    help="DGL's inputs, target subsets, dd file (cached)")
    ap.add_argument("--quick", action="store_true", help="few targets, one epoch: checks the harness")
    ap.add_argument("--cap-mib", type=int, default=1024, help="cgroup memory cap of the out-of-core systems")
    ap.add_argument("--process-mib", type=int, default=576,
                    help="the cap minus this is the graphstore buffer's byte budget (torch ~300 MiB, "
                         "model, batches, autograd)")
    ap.add_argument("--targets", type=int, help="training targets per epoch (default 60000, quick 3000)")
    ap.add_argument("--eval-targets", type=int, help="test targets evaluated (default 5000, quick 1000)")
    ap.add_argument("--epochs", type=int, help="epochs per graphstore system (default 3, quick 1)")
    ap.add_argument("--dgl-epochs", type=int, default=1,
                    help="epochs of the DGL systems (its page cache is a small part of the features, so "
                         "its epochs are alike; one keeps the slowest system within minutes)")
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
    ap.add_argument("--dgl-venv", default=str(REPO / ".venv-dgl"), help="DGL venv, created when missing")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    if args.json is None:
        ap.error("--json is required")
    if os.geteuid() != 0:
        ap.error("needs root: it drops the page cache and creates a cgroup")
    args.targets = args.targets or (3000 if args.quick else 60000)
    args.eval_targets = args.eval_targets or (1000 if args.quick else 5000)
    args.epochs = args.epochs or (1 if args.quick else 3)
    budget_s = args.readahead_budget_s or (20.0 if args.quick else 90.0)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    systems = [s for s in (args.systems or ",".join(x for x in SYSTEMS if not (
        args.quick and x == "dgl-memmap-readahead"))).split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        ap.error(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", flush=True)

    waited = 0.0
    while args.wait_idle_s and (others := other_benchmarks()) and waited < args.wait_idle_s:
        log(f"waiting for {len(others)} other benchmark(s): {others[0]}")
        time.sleep(30)
        waited += 30
    loadavg_start = list(os.getloadavg())
    bench_convert, bench_buffer, bench_sampling = _tool("bench_convert"), _tool("bench_buffer"), _tool("bench_sampling")
    drop_caches, MemoryCap, run_measured = bench_convert.drop_caches, bench_convert.MemoryCap, bench_convert.run_measured

    sys.path.insert(0, str(REPO))
    import graphstore

    store = graphstore.open(args.store)
    n, d = store.num_nodes, store.feature_dim
    feature_bytes = n * d * 4
    cap = args.cap_mib << 20
    buffer_bytes = cap - (args.process_mib << 20)
    t0 = time.perf_counter()
    files = prepare(args, store)
    log(f"store {args.store.name}: {n} nodes, {store.num_edges} edges, p={store.num_partitions}; features "
        f"{feature_bytes / 2**30:.2f} GiB = {feature_bytes / cap:.1f}x the {args.cap_mib} MiB cap; buffer budget "
        f"{buffer_bytes >> 20} MiB; {args.targets} targets; prepared in {time.perf_counter() - t0:.1f} s")

    dgl_py, dgl_reason = None, None
    if any(s.startswith("dgl") for s in systems):
        dgl_py, dgl_reason = bench_sampling.ensure_dgl_python(args, log)
        if dgl_py is None:
            log(f"DGL unavailable: {dgl_reason}")

    ddf = dd_file(args.workdir, 1024)
    dd_runs = [bench_buffer.dd_read(ddf)]
    log(f"dd: {dd_runs[0]['bytes_per_s'] / 1e9:.2f} GB/s")

    common = {"store": str(args.store), "targets": str(files["targets"]), "eval_targets": str(files["eval_targets"]),
              "fanouts": fanouts, "batch_size": args.batch_size, "hidden": args.hidden, "lr": args.lr,
              "threads": args.threads, "seed": args.seed, "epochs": args.epochs, "num_nodes": n, "feature_dim": d,
              "num_classes": store.num_classes}
    specs = {
        "graphstore-megabatch": dict(scheme="megabatch", buffer_bytes=buffer_bytes, reuse=1, static_cache=0.0,
                                     capped=True),
        "graphstore-megabatch-reuse2": dict(scheme="megabatch", buffer_bytes=buffer_bytes, reuse=2, static_cache=0.0,
                                            capped=True),
        "graphstore-megabatch-cache": dict(scheme="megabatch", buffer_bytes=buffer_bytes, reuse=1, static_cache=0.01,
                                           capped=True),
        "graphstore-disk": dict(scheme="disk", buffer_bytes=buffer_bytes, reuse=None, capped=True),
        "dgl-memmap": dict(madvise_random=True, capped=True, epochs=args.dgl_epochs),
        "dgl-memmap-readahead": dict(madvise_random=False, capped=True, time_budget_s=budget_s, skip_eval=True,
                                     epochs=1),
        "graphstore-memory": dict(scheme="minibatch", buffer_bytes=None, reuse=None, capped=False),
    }
    dgl_files = {k: str(files[k]) for k in ("features", "indptr", "indices", "labels")}

    def run_system(name: str, cap_bytes: int | None) -> dict:
        out = args.workdir / f"child_{name}.json"
        out.unlink(missing_ok=True)
        spec = dict(common, **specs[name], system=name, out=str(out))
        is_dgl = name.startswith("dgl")
        if is_dgl:
            spec.update(dgl_files)
        python = dgl_py if is_dgl else sys.executable
        env_cmd = [python, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
        drop_caches()
        load = list(os.getloadavg())
        if cap_bytes:
            group = MemoryCap(f"graphstore_bench_outofcore_{os.getpid()}", cap_bytes)
            try:
                run = run_measured(group.prefix() + env_cmd)
                run.update(group.stats())
            finally:
                group.close()
        else:
            run = run_measured(env_cmd)
            run.update(cap_bytes=None, cgroup_peak_bytes=None, cap_hits=None, oom_kills=None)
        row = {"system": name, "mem_cap_bytes": cap_bytes, "returncode": run["returncode"],
               "child_seconds": run["seconds"], "wait4_maxrss_bytes": run["peak_rss_bytes"],
               "cgroup_peak_bytes": run["cgroup_peak_bytes"], "cap_hits": run["cap_hits"],
               "oom_kills": run["oom_kills"], "loadavg_before": load,
               "spec": {k: v for k, v in spec.items() if k not in ("out",)}}
        if run["returncode"] == 0 and out.exists():
            row.update(json.loads(out.read_text()))
            row["peak_rss_bytes"] = row["child_max_rss_bytes"]
            eps = row["epochs"]
            # Epoch 0 is cold (the first state's read; for graphstore-memory the whole store);
            # the median is over the later, steady epochs when there are any.
            steady = eps[1:] if len(eps) > 1 else eps
            row["epoch_s_median"] = statistics.median(e["time_s"] for e in steady)
            row["epoch0_s"] = eps[0]["time_s"]
            row["samples_per_epoch"] = eps[0]["samples"]
            row["bytes_read"] = statistics.median(e["device_read_bytes"] for e in steady)
            row["samples_per_s"] = statistics.median(e["samples_per_s"] for e in steady)
            row["compute_share"] = statistics.median(e["compute_share"] for e in steady)
            row["cpu_s_median"] = statistics.median(e["cpu_s"] for e in steady)
            row["input_nodes_per_target"] = eps[0]["input_nodes_per_target"]
            row["projected"] = any(e["stopped_by_time_budget"] for e in eps)
            if row["projected"]:
                # Stopped early: the epoch's time at the measured rate (same targets, same batches).
                total_batches = -(-args.targets // args.batch_size)
                row["epoch_s_median"] = row["epoch0_s"] = eps[0]["time_s"] / eps[0]["batches"] * total_batches
                row["bytes_read"] = eps[0]["device_read_bytes"] / eps[0]["batches"] * total_batches
                row["samples_per_epoch"] = args.targets
            if "buffer" in eps[0]:
                row["stall_s"] = statistics.median(e["buffer"]["stall_seconds"] for e in steady)
                row["buffer_bytes_read"] = statistics.median(e["buffer"]["bytes_read"] for e in steady)
                row["planned_bytes"] = statistics.median(e["buffer"]["planned_bytes"] for e in steady)
            else:
                row["stall_s"] = None
        else:
            row.update(error=(run["stderr"] or run["stdout"])[-1500:], oom=bool(run["oom_kills"]), peak_rss_bytes=None,
                       epoch_s_median=None, bytes_read=None, stall_s=None, test_acc=None)
        state = (f"{row['epoch_s_median']:.1f} s/epoch (epoch 0 {row['epoch0_s']:.1f} s), "
                 f"{row['samples_per_s']:.0f} samples/s, read {row['bytes_read'] / 1e9:.2f} GB, "
                 f"stall {row['stall_s'] if row['stall_s'] is None else round(row['stall_s'], 2)} s, "
                 f"compute share {row['compute_share']:.2f}, acc {row['test_acc']}"
                 if row["epoch_s_median"] is not None else f"FAILED rc={row['returncode']} oom={row['oom']}: "
                 f"{row['error'][-300:]}")
        peak = "" if cap_bytes is None else f", cgroup peak {row['cgroup_peak_bytes'] >> 20} MiB"
        rss = "?" if row["peak_rss_bytes"] is None else row["peak_rss_bytes"] >> 20
        log(f"{name} (cap {cap_bytes and cap_bytes >> 20} MiB): {state}; peak RSS {rss} MiB{peak}")
        return row

    # If DGL is killed by the cap: its structure did not fit next to the features' page cache.
    # It then runs under a cap with room for its structure and process on top of the same
    # room for the page cache.
    wide = cap + files["structure_bytes"] + (512 << 20)
    wide = -(-wide // (64 << 20)) * (64 << 20)
    runs, dgl_oom = [], False
    for name in systems:
        if name.startswith("dgl") and dgl_py is None:
            runs.append({"system": name, "skipped": dgl_reason, "epoch_s_median": None, "bytes_read": None,
                         "stall_s": None, "test_acc": None, "mem_cap_bytes": cap})
            continue
        if name == "dgl-memmap-readahead" and dgl_oom:
            # The same structure as dgl-memmap, which the cap already killed: only the wide cap.
            row = run_system(name, wide)
            row["system"] = name + "-widecap"
            row["note"] = "not run under the cap: dgl-memmap, with the same structure, was killed by it"
            runs.append(row)
            continue
        if name.startswith("dgl") and args.dgl_wide_cap_only:
            row = run_system(name, wide)
            row["system"] = name + "-widecap"
            row["note"] = "run only under the wide cap (--dgl-wide-cap-only)"
            runs.append(row)
            continue
        row = run_system(name, cap if specs[name]["capped"] else None)
        runs.append(row)
        if name.startswith("dgl") and row.get("oom"):
            dgl_oom = True
            extra = run_system(name, wide)
            extra["system"] = name + "-widecap"
            runs.append(extra)
    dd_runs.append(bench_buffer.dd_read(ddf))
    disk_bw = statistics.median(r["bytes_per_s"] for r in dd_runs)

    by = {r["system"]: r for r in runs if r.get("epoch_s_median")}
    mega, mem = by.get("graphstore-megabatch"), by.get("graphstore-memory")
    for r in runs:
        if not r.get("epoch_s_median"):
            continue
        if mega:
            r["epoch_vs_megabatch"] = r["epoch_s_median"] / mega["epoch_s_median"]
            r["epoch0_vs_megabatch"] = r["epoch0_s"] / mega["epoch0_s"]
        if mem:
            r["epoch_vs_memory"] = r["epoch_s_median"] / mem["epoch_s_median"]
        if r.get("planned_bytes"):
            # The physical limit: what the policy must read, at the disk's sequential speed.
            r["physical_limit_s"] = r["planned_bytes"] / disk_bw
            r["epoch_vs_physical_limit"] = r["epoch_s_median"] / r["physical_limit_s"]
    goals = {}
    dgl = by.get("dgl-memmap") or by.get("dgl-memmap-widecap")
    if dgl and mega:
        goals["dgl_system"], goals["dgl_cap_bytes"] = dgl["system"], dgl["mem_cap_bytes"]
    if mega and dgl:
        goals["dgl_over_megabatch"] = dgl["epoch_s_median"] / mega["epoch_s_median"]
        goals["faster_than_memmap_10x_met"] = goals["dgl_over_megabatch"] >= 10
    if mega and mem:
        goals["megabatch_over_memory"] = mega["epoch_s_median"] / mem["epoch_s_median"]
        goals["within_1_25x_memory_met"] = goals["megabatch_over_memory"] <= 1.25
    if mega and mega.get("stall_s") is not None:
        goals["megabatch_stall_share"] = mega["stall_s"] / mega["epoch_s_median"]

    machine = bench_sampling.machine_info(loadavg_start)
    machine["mem_total_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        dev = os.stat(args.store).st_dev
        machine["read_ahead_kb"] = int(Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/queue/read_ahead_kb")
                                       .read_text())
    except OSError:
        machine["read_ahead_kb"] = None
    result = {
        "command": " ".join(["python", "tools/bench_outofcore.py"] + (argv if argv is not None else sys.argv[1:])),
        "quick": args.quick, "runs": runs, "goals": goals,
        "data_bytes": feature_bytes, "mem_cap_bytes": cap, "data_vs_cap": feature_bytes / cap,
        "disk_seq_read_bytes_per_s": disk_bw, "dd_runs": dd_runs,
        "store": {"path": str(args.store), "num_nodes": n, "num_edges": store.num_edges,
                  "num_partitions": store.num_partitions, "partitioner": store.manifest.partitioner.get("method"),
                  "bytes_on_disk": bench_convert.du(args.store)},
        "settings": {"targets": args.targets, "eval_targets": args.eval_targets, "epochs": args.epochs,
                     "dgl_epochs": args.dgl_epochs, "fanouts": fanouts,
                     "fanouts_order": "fanouts[0] is the hop nearest the targets",
                     "batch_size": args.batch_size, "hidden": args.hidden, "lr": args.lr, "optimizer": "Adam",
                     "model": "2-layer GraphSage, mean aggregator", "threads": args.threads,
                     "buffer_bytes": buffer_bytes, "readahead_budget_s": budget_s,
                     "dgl_structure_bytes": files["structure_bytes"]},
        "waited_for_other_benchmarks_s": waited, "other_benchmarks_at_end": other_benchmarks(),
        "machine": machine, "wall_s": time.perf_counter() - t_start,
    }
    if args.json.parent:
        args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {args.json}; goals {goals}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
