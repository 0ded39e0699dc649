"""Macro-batching (BatchGNN) with the structure in memory and the features on disk.

One run, one machine: the out-of-core benchmark's store (`tools/bench_outofcore.py`), whose
features are at least 3x a cgroup v1 memory cap (the page cache counts against it). Every
system trains the same 2-layer GraphSage (hidden 128, mean, Adam) on the same seeded
training targets with the same fanouts and batch size, each in its own child process after
dropping the page cache, and is tested on the same test targets with the same fanouts.

Systems
-------
* ``graphstore-minibatch-disk``: scheme ``macrobatch`` with ``B = 1``: each mini-batch
  fetches its own input rows from the store (the structure-in-memory, features-on-disk
  baseline, through our verified block reads).
* ``graphstore-macrobatch``: ``B`` in ``--macro-batches`` (8, 64, all): the union of B
  mini-batches' input rows fetched once, in rounds of at most ``--macro-batch-bytes``.
* ``graphstore-macrobatch`` with a feature cache (``--cache-bytes``) at ``--cache-at`` B:
  ``belady`` and ``lru`` (the same samples: the rows asked for are equal; compare hits).
* ``graphstore-macrobatch-B1-aggregated``, ``-B{cache-at}-aggregated``: BatchGNN's aggregation
  cache (``graphstore aggregate STORE --op mean``, computed once before the runs, its time
  recorded): the first GraphSage layer reads each input node's stored mean of all its
  in-neighbours with its own row, so only ``fanouts[:-1]`` are sampled and the outermost
  hop's rows are never read. Not the same computation: that layer sees every neighbour.
* ``graphstore-macrobatch-Ball-uncapped``: B = all in one round, no cap: the rows and bytes
  macro-batching fetches when the whole union fits in memory.
* ``graphstore-memory``: scheme ``minibatch``, the whole store resident, no cap.
* ``dgl-memmap``: DGL 1.1.3 over a CSC in memory and a ``np.memmap`` of the features
  (``MADV_RANDOM``), loader workers gathering rows (bench_outofcore's child, unchanged), at
  ``--dgl-workers`` (4, its best in the out-of-core run); under the cap plus its int64
  structure plus 512 MiB when the cap kills it (the row says so).

Every graphstore row samples with DENSE over the whole graph, so the mini-batches are those
of in-memory minibatch training (exact sampling): rows per epoch differ by B only through
what is fetched, never through what is trained. Per epoch: wall time, the time waiting on the
loader, rows requested (each mini-batch's input rows), rows of the rounds' unions, rows read
from the store, cache hits, bytes read (the loader's count and the device's, from
``/proc/<pid>/io``). The epoch time is the median of the warm epochs (epoch >= 1; epoch 0
builds the structure). ``dd iflag=direct`` gives the disk's sequential bandwidth in the same
run.

Usage::

    sudo .venv/bin/python tools/bench_macrobatch.py --json docs/benchmarks/macrobatch.json \
        [--quick] [--store S.gs] [--targets N] [--cap-mib M] [--dgl-python PY]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

try:
    from tools import bench_outofcore as ooc
    from tools import benchkit
except ImportError:  # run as a script: tools/ is on sys.path
    import bench_outofcore as ooc
    import benchkit

REPO = Path(__file__).resolve().parents[1]
MEMORY = "graphstore-memory"
PER_BATCH = "graphstore-minibatch-disk"
MACRO = "graphstore-macrobatch"
DGL = "dgl-memmap"


# ---------------------------------------------------------------------- the child

def _loader_kwargs(spec: dict) -> dict:
    """The training loader's options (the evaluation's too, less the feature cache)."""
    # With the aggregation cache the first layer reads the stored aggregate: the outermost
    # hop (fanouts[-1]) is neither sampled nor fetched.
    aggregated = spec.get("aggregated")
    kw = {"fanouts": spec["fanouts"][:-1] if aggregated else spec["fanouts"], "batch_size": spec["batch_size"],
          "scheme": spec["scheme"], "seed": spec["seed"], "prefetch": True}
    if aggregated:
        kw["aggregated"] = aggregated
    if spec["scheme"] == "macrobatch":
        kw.update(macro_batches=spec["macro_batches"], macro_batch_bytes=spec["macro_batch_bytes"])
    return kw


def child_graphstore(spec: dict) -> dict:
    """One row: bench_outofcore's model, step and epochs over a macro-batching (or in-memory)
    loader, then the test targets once with the same scheme and B, without the cache."""
    import numpy as np
    import torch

    torch.set_num_threads(spec["threads"])
    sys.path.insert(0, str(REPO))
    import graphstore
    from graphstore.loaders import NodeLoader

    t0 = time.perf_counter()
    store = graphstore.open(spec["store"])
    kw = _loader_kwargs(spec)
    cache_kw = ({"feature_cache_bytes": spec["cache_bytes"], "feature_cache": spec["cache"],
                 "cache_lookahead": spec["cache_lookahead"]} if spec.get("cache") else {})
    loader = NodeLoader(store, nodes=np.load(spec["targets"]), shuffle=True, **kw, **cache_kw)
    model, opt = ooc.sage_and_adam(spec, store)
    setup_s = time.perf_counter() - t0

    def forward(batch):
        return model(batch.features, batch.dense, aggregated=batch.aggregated, aggregated_from=batch.aggregated_from)

    def stats() -> dict:
        s, fetched = loader.epoch_stats[-1], loader.fetch_stats
        # The loader's epoch stats count macro-batching's rows with the structure.
        out = {"structure_bytes_read": s.bytes_read - fetched.bytes_read if fetched is not None else None,
               "loader_bytes_read": s.bytes_read}
        if fetched is not None:
            out["fetch"] = fetched.to_dict()
        return out

    model.train()
    epochs = ooc._train_epochs(spec, lambda e, last: loader.epoch(e, lookahead=not last),
                               ooc.sage_step(opt, forward), stats)
    graph = getattr(loader.walk, "graph", None)
    structure = None if graph is None else sum(t.numel() * t.element_size() for t in (
        graph.indptr, graph.indices, graph.node_ids, graph.labels))
    settings = loader.settings.to_dict()
    acc = None
    if not spec.get("skip_eval"):
        # The same scheme and B without a cache, every test target once; the structure is
        # the training loader's (one copy under the cap).
        ev = NodeLoader(store, nodes=np.load(spec["eval_targets"]), shuffle=False, **dict(kw, seed=spec["seed"] + 1))
        if graph is not None:
            ev.walk.graph = graph
        loader = None
        acc = ooc.held_out_accuracy(model, ev.epoch(0, lookahead=False), forward)
    return {"setup_s": setup_s, "epochs": epochs, "test_acc": acc, "settings": settings,
            "structure_bytes": structure, "child_max_rss_bytes": ooc._max_rss_bytes()}


# ---------------------------------------------------------------------- the parent

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--store", type=Path, default=None,
                    help=f"node-classification store (default {ooc.DEFAULT_STORE}; --quick: the out-of-core "
                         "benchmark's cached quick store)")
    ap.add_argument("--cache-dir", type=Path, default=ooc.DEFAULT_CACHE_DIR)
    ap.add_argument("--workdir", type=Path, default=None, help="targets, DGL's inputs, dd file (cached)")
    ap.add_argument("--quick", action="store_true", help="the small cached store, few targets")
    ap.add_argument("--cap-mib", type=int, default=None,
                    help="memory cap (default: a third of the features; --quick: at least 1024)")
    ap.add_argument("--targets", type=int, help="training targets (default 100000, quick 10000)")
    ap.add_argument("--eval-targets", type=int, help="test targets (default 5000, quick 1000)")
    ap.add_argument("--epochs", type=int, default=2, help="epochs per system (>= 2: epoch 0 is cold)")
    ap.add_argument("--fanouts", default="10,5")
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--macro-batches", default="8,64,all", help="B of the macro-batch rows (B = 1 is its own row)")
    ap.add_argument("--macro-batch-bytes", default="32MiB",
                    help="most bytes of samples a macro-batch holds and of rows a round holds")
    ap.add_argument("--cache-bytes", default="32MiB", help="the feature cache of the cache rows")
    ap.add_argument("--cache-at", type=int, default=8, help="B of the cache rows")
    ap.add_argument("--cache-lookahead", type=int, default=8,
                    help="mini-batches the belady row samples ahead (their samples count against the cap)")
    ap.add_argument("--aggregate-bytes", default="2GiB",
                    help="walk memory of `graphstore aggregate` when the store has no mean aggregate yet (a "
                         "one-time step before training, run uncapped; at the walk's floor it rereads "
                         "partitions many times)")
    ap.add_argument("--dgl-workers", type=int, default=4)
    ap.add_argument("--dgl-python", default=None)
    ap.add_argument("--dgl-venv", default=str(REPO / ".venv-dgl"))
    ap.add_argument("--systems", default=None, help="comma-separated row names (default all)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return args
    if args.json is None:
        ap.error("--json is required")
    if args.epochs < 2:
        ap.error("--epochs must be at least 2")
    sys.path.insert(0, str(REPO))
    from graphstore.units import parse_byte_size

    args.macro_batch_bytes = parse_byte_size(args.macro_batch_bytes)
    args.cache_bytes = parse_byte_size(args.cache_bytes)
    args.aggregate_bytes = parse_byte_size(args.aggregate_bytes)
    args.targets = args.targets or (10000 if args.quick else 100000)
    args.eval_targets = args.eval_targets or (1000 if args.quick else 5000)
    args.fanouts = [int(f) for f in args.fanouts.split(",")]
    args.macro_batches = [-1 if b == "all" else int(b) for b in args.macro_batches.split(",")]
    args.cache_dir = args.cache_dir.expanduser()
    args.workdir = args.workdir or (args.cache_dir / "work" if args.quick else Path("/work/bench_outofcore"))
    args.iso = ooc.isolation()
    args.dgl_epochs = args.epochs
    return args


def systems(args) -> list[dict]:
    """Each row's name and what its child is given."""
    macro = {"scheme": "macrobatch", "macro_batch_bytes": args.macro_batch_bytes, "capped": True}
    rows = [dict(macro, system=PER_BATCH, macro_batches=1)]
    rows += [dict(macro, system=f"{MACRO}-B{'all' if b == -1 else b}", macro_batches=b) for b in args.macro_batches]
    rows += [dict(macro, system=f"{MACRO}-B{args.cache_at}-{cache}", macro_batches=args.cache_at, cache=cache,
                  cache_bytes=args.cache_bytes, cache_lookahead=args.cache_lookahead) for cache in ("belady", "lru")]
    # BatchGNN's aggregation cache: the first layer reads each input node's stored mean of all
    # its in-neighbours, so the outermost hop is neither sampled nor read.
    rows += [dict(macro, system=f"{MACRO}-B{b}-aggregated", macro_batches=b, aggregated="mean")
             for b in (1, args.cache_at)]
    # B = all in one round, without the cap: what macro-batching fetches when the union fits.
    rows += [dict(macro, system=f"{MACRO}-Ball-uncapped", macro_batches=-1, macro_batch_bytes=None, capped=False)]
    rows += [{"system": MEMORY, "scheme": "minibatch", "capped": False},
             {"system": DGL, "scheme": "dgl", "capped": True, "num_workers": args.dgl_workers, "madvise_random": True}]
    wanted = None if args.systems is None else set(args.systems.split(","))
    return [r for r in rows if wanted is None or r["system"] in wanted]


def ensure_aggregate(path: Path, store, op: str, *, buffer_bytes: int, log) -> dict:
    """The store's stored ``op`` aggregate (``graphstore aggregate``), computed once and kept
    (its record says how long it took, in ``buffer_bytes`` of walk memory, uncapped)."""
    from graphstore.inference import aggregate_store, min_buffer_bytes
    from graphstore.nn import AggregationModel

    record = store.aggregates.get(op)
    if record is not None:
        return {**record, "reused": True}
    # Two partitions at least (the walk's floor: the quick store's partitions are large).
    buffer_bytes = max(buffer_bytes, min_buffer_bytes(AggregationModel(op, store.feature_dim), store))
    log(f"{path}: computing the {op} aggregate of every node (graphstore aggregate, {buffer_bytes >> 20} MiB)")
    store.close()
    record = aggregate_store(path, op, buffer_bytes=buffer_bytes)
    log(f"{path}: {record['array']} in {record['seconds']:.1f} s, {record['bytes_read'] / 2**30:.2f} GiB read")
    return {**record, "reused": False, "buffer_bytes": buffer_bytes}


def summarize(row: dict) -> dict:
    """The JSON row the issue asks for, from a child's result."""
    epochs = row.get("epochs") or []
    warm = [e for e in epochs if e["epoch"] >= 1]
    fetch = [e.get("fetch") for e in warm if e.get("fetch")]
    med = (lambda key: statistics.median(f[key] for f in fetch)) if fetch else (lambda key: None)
    out = {
        "epoch_s_median": statistics.median(e["time_s"] for e in warm) if warm else None,
        "epoch0_s": epochs[0]["time_s"] if epochs else None,
        "loader_wait_s_median": statistics.median(e["loader_wait_s"] for e in warm) if warm else None,
        "rows_requested": med("rows_requested"), "rows_union": med("rows_union"), "rows_fetched": med("rows_fetched"),
        "cache_hits": med("cache_hits"), "requests": med("requests"),
        "bytes_read": med("bytes_read") if fetch else (
            statistics.median(e["device_read_bytes"] for e in warm) if warm else None),
        "device_read_bytes_median": statistics.median(e["device_read_bytes"] for e in warm) if warm else None,
        "input_rows_per_target": statistics.median(e["input_nodes_per_target"] for e in warm) if warm else None,
    }
    return out


@dataclass
class Inputs:
    """What every row's child is given, prepared once (cached in ``--workdir`` where it can be)."""

    store: object
    """The open store (reopened after its aggregate was written)."""
    cap: int
    """The memory cap of the capped rows, in bytes."""
    files: dict
    """``targets`` and ``eval_targets``: .npy files of store ids."""
    aggregate: dict | None
    """The stored mean aggregate's record, when an aggregated row runs."""
    dgl_files: dict | None
    """DGL's inputs (bench_outofcore's), when the DGL row runs."""
    dgl_python: str | None
    """DGL's interpreter, or None (then ``dgl_why`` says why)."""
    dgl_why: str | None
    """Why DGL's row is skipped, when ``dgl_python`` is None and it was asked for."""
    wide_cap: int | None
    """DGL's second cap, when the first kills it: the cap, its int64 structure and 512 MiB."""


def open_store(args, log) -> tuple:
    """The store (``--store``, or --quick's cached one, built once) with block checksums on its
    features, and the --quick store's record for the JSON (None otherwise)."""
    sys.path.insert(0, str(REPO))
    import graphstore
    from graphstore.layout._upgrade import upgrade_store

    quick_store = None
    if args.quick and args.store is None:
        built, quick_store = ooc.cached_quick_stores(args.cache_dir, log)
        args.store = built["metis"]
    args.store = args.store or ooc.DEFAULT_STORE
    store = graphstore.open(args.store)
    if store._layout("nodes/features").segments is None or store._layout("nodes/features").segments.kind != "blocks":
        log(f"{args.store}: no block checksums for its features; running graphstore upgrade")
        upgrade_store(args.store)
        store = graphstore.open(args.store)
    return store, quick_store


def feature_bytes_of(store) -> int:
    return store.num_nodes * store.feature_dim * 4


def memory_cap(args, store) -> int:
    """A third of the features (16 MiB steps), or ``--cap-mib``. --quick's store is too small
    for that: Python and torch alone take ~600 MiB of a cap (the cgroup charges their
    libraries' page cache), so its cap is at least 1 GiB, a harness check and not the goal's
    setting."""
    cap = (args.cap_mib << 20) if args.cap_mib else feature_bytes_of(store) // 3 >> 24 << 24
    if args.quick and not args.cap_mib:
        cap = max(cap, 1 << 30)
    return cap


def prepare_inputs(args, store, rows: list[dict], log) -> Inputs:
    """The targets, the stored aggregate and DGL's inputs, each only when a row needs it."""
    import graphstore

    cap = memory_cap(args, store)
    args.workdir.mkdir(parents=True, exist_ok=True)
    train, test = ooc.choose_targets(store, seed=args.seed, targets=args.targets, eval_targets=args.eval_targets)
    files = ooc.write_targets(args.workdir, f"macro_{ooc._store_tag(args.store, store)}", train, test)
    aggregate = None
    if any(r.get("aggregated") for r in rows):
        aggregate = ensure_aggregate(args.store, store, "mean", buffer_bytes=args.aggregate_bytes, log=log)
        store = graphstore.open(args.store)
    dgl_files = ooc.prepare_dgl_inputs(store, args.store, args.workdir) if any(r["scheme"] == "dgl" for r in rows) \
        else None
    dgl_py, dgl_why = ooc.find_dgl_python(args, log) if dgl_files else (None, None)
    wide_cap = -(-(cap + dgl_files["structure_bytes"] + (512 << 20)) // (64 << 20)) * (64 << 20) if dgl_files \
        else None
    feature_bytes = feature_bytes_of(store)
    log(f"{args.store.name}: {store.num_nodes} nodes, {store.num_edges} edges; features {feature_bytes / 2**30:.2f} GiB "
        f"= {feature_bytes / cap:.2f}x the {cap >> 20} MiB cap ({'enforced' if args.iso['cap_enforced'] else 'NOT enforced'})")
    return Inputs(store=store, cap=cap, files=files, aggregate=aggregate, dgl_files=dgl_files, dgl_python=dgl_py,
                  dgl_why=dgl_why, wide_cap=wide_cap)


def child_spec(args, inputs: Inputs, row: dict, out: Path) -> dict:
    """A row's child spec: the settings every row shares, then the row's own."""
    store = inputs.store
    spec = {"fanouts": args.fanouts, "batch_size": args.batch_size, "hidden": args.hidden, "lr": args.lr,
            "threads": args.threads, "seed": args.seed, "epochs": args.epochs, "store": str(args.store),
            "targets": str(inputs.files["targets"]), "eval_targets": str(inputs.files["eval_targets"]),
            "num_nodes": store.num_nodes, "feature_dim": store.feature_dim, "num_classes": store.num_classes,
            **{k: v for k, v in row.items() if k != "capped"}, "out": str(out)}
    if row["scheme"] == "dgl":
        spec.update({k: str(inputs.dgl_files[k]) for k in ("features", "indptr", "indices", "labels")})
    return spec


def run_row(args, inputs: Inputs, row: dict, log) -> dict:
    """One system in its own child (DGL in bench_outofcore's, under its wider cap when the
    first kills it), as its JSON row."""
    name, is_dgl = row["system"], row["scheme"] == "dgl"
    if is_dgl and inputs.dgl_python is None:
        return {"system": name, "skipped": f"DGL {inputs.dgl_why}"}
    out = args.workdir / f"child_macro_{name}.json"
    out.unlink(missing_ok=True)
    spec = child_spec(args, inputs, row, out)
    caps = [inputs.cap if row["capped"] and args.iso["cap_enforced"] else None]
    if is_dgl:
        caps.append(inputs.wide_cap)
    for attempt, cap_bytes in enumerate(caps):
        run = benchkit.run_child(Path(ooc.__file__) if is_dgl else Path(__file__), spec, cap_bytes=cap_bytes,
                                 name="graphstore_bench_macrobatch", drop_cache=args.iso["page_cache_dropped"],
                                 python=inputs.dgl_python if is_dgl else None)
        result = json.loads(out.read_text()) if run["returncode"] == 0 and out.exists() else None
        if result is not None or not run["oom_kills"] or attempt + 1 == len(caps):
            break
        log(f"{name}: killed by the {cap_bytes >> 20} MiB cap; again under {caps[-1] >> 20} MiB "
            "(the cap, its int64 structure and 512 MiB)")
    out_row = {"system": name, "macro_batches": row.get("macro_batches"), "cache": row.get("cache"),
               "aggregated": row.get("aggregated"),
               "mem_cap_bytes": cap_bytes, "returncode": run["returncode"], "oom_kills": run["oom_kills"],
               "cgroup_peak_bytes": run["cgroup_peak_bytes"], "child_seconds": run["seconds"]}
    if result is None:
        out_row["error"] = (run["stderr"] or run["stdout"])[-1500:]
    else:
        out_row.update(summarize(result), test_acc=result.get("test_acc"), epochs=result["epochs"],
                       peak_rss_bytes=result["child_max_rss_bytes"], structure_bytes=result.get("structure_bytes"),
                       settings={**(result.get("settings") or {}), "mem_cap_bytes": cap_bytes,
                                 "cache_bytes": row.get("cache_bytes"), "fanouts": args.fanouts,
                                 "batch_size": args.batch_size})
    log(f"{name}: epoch {out_row.get('epoch_s_median')} s, rows fetched {out_row.get('rows_fetched')}, "
        f"bytes {out_row.get('bytes_read')}, acc {out_row.get('test_acc')}, peak RSS {out_row.get('peak_rss_bytes')}, "
        f"cgroup peak {out_row.get('cgroup_peak_bytes')}, oom {out_row.get('oom_kills')}")
    return out_row


def add_ratios(runs: list[dict]) -> None:
    """Each row against B = 1, the in-memory row and DGL (None where either side is missing)."""
    by = {r["system"]: r for r in runs}
    base, mem, dgl = by.get(PER_BATCH, {}), by.get(MEMORY, {}), by.get(DGL, {})

    def ratio(a, b):
        return a / b if a is not None and b else None

    for r in runs:
        r["rows_fetched_vs_B1"] = ratio(r.get("rows_fetched"), base.get("rows_fetched"))
        r["bytes_vs_B1"] = ratio(r.get("bytes_read"), base.get("bytes_read"))
        r["epoch_vs_memory"] = ratio(r.get("epoch_s_median"), mem.get("epoch_s_median"))
        r["dgl_vs_this"] = ratio(dgl.get("epoch_s_median"), r.get("epoch_s_median"))
        r["acc_minus_memory"] = (None if r.get("test_acc") is None or mem.get("test_acc") is None
                                 else r["test_acc"] - mem["test_acc"])


def result_record(args, argv, inputs: Inputs, runs: list[dict], dd: list[dict], quick_store: dict | None) -> dict:
    """The JSON docs/benchmarks.md reads."""
    feature_bytes = feature_bytes_of(inputs.store)
    return {"command": benchkit.command_line("tools/bench_macrobatch.py", argv), "quick": args.quick,
            "runs": runs, "store": ooc.store_info(inputs.store, args.store, "main"), "quick_store": quick_store,
            "feature_bytes": feature_bytes, "mem_cap_bytes": inputs.cap, "features_vs_cap": feature_bytes / inputs.cap,
            "dgl_wide_cap_bytes": inputs.wide_cap, "dd_runs": dd, "aggregate": inputs.aggregate,
            "dd_bytes_per_s": statistics.median(d["bytes_per_s"] for d in dd),
            "settings": {"targets": args.targets, "eval_targets": args.eval_targets, "epochs": args.epochs,
                         "fanouts": args.fanouts, "fanouts_order": "fanouts[0] is the hop nearest the targets",
                         "batch_size": args.batch_size, "hidden": args.hidden, "lr": args.lr,
                         "model": "2-layer GraphSage, mean", "threads": args.threads,
                         "macro_batch_bytes": args.macro_batch_bytes, "cache_bytes": args.cache_bytes,
                         "cache_lookahead": args.cache_lookahead,
                         "cap_enforced": args.iso["cap_enforced"], "page_cache_dropped": args.iso["page_cache_dropped"],
                         "isolation_note": args.iso["why"]},
            "machine": benchkit.machine_record(*benchkit.MACHINE_FACTS, loadavg=list(os.getloadavg()))}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        Path(spec["out"]).write_text(json.dumps(child_graphstore(spec)))
        return 0
    log = benchkit.elapsed_logger()
    store, quick_store = open_store(args, log)
    rows = systems(args)
    inputs = prepare_inputs(args, store, rows, log)
    # The disk's sequential bandwidth before and after the rows (direct IO: no page cache).
    mib = 256 if args.quick else 1024
    ddf = benchkit.ensure_dd_file(args.workdir / f"dd_{mib}MiB.bin", mib << 20)
    dd = [benchkit.dd_read(ddf, drop_cache=False)]
    log(f"dd: {dd[0]['bytes_per_s'] / 1e9:.2f} GB/s")
    runs = [run_row(args, inputs, r, log) for r in rows]
    dd.append(benchkit.dd_read(ddf, drop_cache=False))
    add_ratios(runs)
    benchkit.write_json(args.json, result_record(args, argv, inputs, runs, dd, quick_store))
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
