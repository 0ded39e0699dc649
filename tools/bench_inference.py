"""Exact layer-wise inference out of core (`graphstore.inference.infer_layerwise`): exactness
against the in-memory full-graph forward, and time, bytes and memory under a cgroup cap.

    sudo .venv/bin/python tools/bench_inference.py --json docs/benchmarks/inference.json \\
        [--store S.gs] [--cap-mib C] [--models sage,gcn,gat] [--layers 2,3]
    sudo .venv/bin/python tools/bench_inference.py --quick --json out.json     # Cora + a 100k-node graph

Per (dataset, model, layers), the same randomly initialised model (seeded) runs:

* **out of core**: a child process under a cgroup v1 memory cap (page cache counted), after
  dropping the page cache, holding as many partitions as the cap allows;
* **in memory**: a child without a cap, every partition resident (``capacity = p``): the
  same code with nothing to evict, the in-memory layer-wise baseline;
* **full-graph forward**: the model's own forward over the whole graph, no layer-wise walk:
  a child without a cap (the same conditions as the in-memory run: a fresh process after
  dropping the page cache) loads every partition's features into one tensor and every
  bucket's edges into one edge index (``load`` seconds), then runs `GNN.forward` once over
  a `LayerView` of every edge (``forward`` seconds); its peak RSS is its ``VmHWM``. It is
  the independent in-memory baseline and the reference: ``max_abs_diff`` compares the
  out-of-core outputs with its outputs, ``max_abs_diff_in_memory`` the in-memory run's.

The physical limit of a case is its bytes read over the disk's sequential bandwidth (``dd
iflag=direct`` of a 1 GiB file in the same run): ``seconds / (bytes_read / dd_bytes_per_s)``
is how far from it the run is. Its own reads count re-reads and scratch traffic as the limit;
``least_bytes`` is what any exact layer-wise run must move (the features once, the edges'
int32 source and destination once per layer, each hidden layer's rows written and read once,
float32), and ``vs_least_bytes_limit`` divides the time by those bytes' time at the dd rate.
Each timed span is also given in CPU seconds (``time.process_time``, every thread), and each
case records the load average at its start and end: on a shared machine wall times swing
with what else runs.
Default store: the out-of-core benchmark's cached 2.1M-node store
(``tools/bench_outofcore.py --quick`` builds it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

try:
    from tools import benchkit
except ImportError:  # run as a script
    import benchkit

REPO = Path(__file__).resolve().parents[1]
DEFAULT_STORE = Path.home() / ".cache" / "graphstore-bench" / "outofcore" / "quick_metis.gs"
PROCESS_BYTES = 450 << 20
"""What the child holds besides the partitions: the interpreter, torch and the store's maps."""


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, help="write the results here (required)")
    p.add_argument("--quick", action="store_true", help="Cora and a generated 100k-node graph")
    p.add_argument("--store", type=Path, help=f"the large store (default {DEFAULT_STORE})")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bench_inference"))
    p.add_argument("--cap-mib", type=int, help="memory cap of the out-of-core runs (default: features / 3)")
    p.add_argument("--models", default="sage,gcn,gat")
    p.add_argument("--layers", default="2,3")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--quick-nodes", type=int, default=100_000, help="nodes of --quick's generated graph")
    p.add_argument("--dd-mib", type=int, default=1024, help="size of the dd file that measures the disk")
    p.add_argument("--no-drop-caches", action="store_true",
                   help="leave the page cache (reads are then not cold; for tests)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------------- the child


def child(spec: dict) -> None:
    """One inference run: load the model, infer every node, write the outputs and the stats."""
    if spec.get("mode") == "full_graph":
        full_graph_child(spec)
        return
    import numpy as np

    import graphstore
    from graphstore.inference import InferenceStats, infer_layerwise, load_model

    with graphstore.open(spec["store"]) as store:
        model, _ = load_model(spec["model"])
        stats = InferenceStats()
        start, cpu_start = time.perf_counter(), time.process_time()
        io_before = benchkit.proc_io()
        out = infer_layerwise(model, store, capacity=spec["capacity"], buffer_bytes=spec["buffer_bytes"],
                              stats=stats, work_dir=spec["scratch"])
        io_after = benchkit.proc_io()
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        np.save(spec["out"], out)
    Path(spec["stats"]).write_text(json.dumps({
        "infer_seconds": seconds, "infer_cpu_seconds": cpu_seconds, "bytes_read": stats.bytes_read,
        "planned_bytes": stats.planned_bytes,
        "spill_bytes": stats.spill_bytes, "bytes_written": stats.bytes_written,
        "max_resident_partitions": stats.max_resident_partitions, "per_layer_seconds": stats.per_layer_seconds,
        "capacities": stats.capacities,
        # What the disk delivered (the rest of bytes_read came from the page cache: scratch
        # written in this run and not yet evicted under the cap).
        "disk_bytes_read": io_after["read_bytes"] - io_before["read_bytes"],
        # VmHWM restarts at exec; the rusage of a forked child starts from the parent's size.
        "vm_hwm_bytes": benchkit.vm_hwm_bytes()}))


# ---------------------------------------------------------------------- datasets


def cora(workdir: Path) -> Path:
    import graphstore

    out = workdir / "cora.gs"
    if not out.exists():
        graphstore.convert(REPO / "data" / "cora", out, num_partitions=8, partitioner="metis")
    return out


def synthetic(workdir: Path, num_nodes: int) -> Path:
    import graphstore

    out = workdir / f"synthetic_{num_nodes}.gs"
    if not out.exists():
        raw = workdir / f"synthetic_{num_nodes}"
        subprocess.run([sys.executable, str(REPO / "tools" / "make_synthetic.py"), "--out", str(raw),
                        "--num-nodes", str(num_nodes), "--feature-dim", "64", "--layout", "npz", "--locality",
                        "0.75", "--communities", "100", "--no-progress", "--overwrite"], check=True)
        graphstore.convert(raw, out, num_partitions=16, partitioner="metis")
    return out


def load_full_graph(store):
    """The whole graph in memory as torch tensors: features float32 [n, f] (store order), a
    `LayerView` of every edge (every node an output, all its in-edges, by destination
    partition) and the in-degrees int64 [n]."""
    import numpy as np
    import torch

    from graphstore.layout.dtypes import decode
    from graphstore.nn import LayerView

    p, n = store.num_partitions, store.num_nodes
    parts = [store.read_bucket(i, j) for j in range(p) for i in range(p)]
    src = torch.from_numpy(np.concatenate([b[0] for b in parts]).astype(np.int64))
    dst = torch.from_numpy(np.concatenate([b[1] for b in parts]).astype(np.int64))
    del parts
    view = LayerView(n, n, slice(0, n), src, torch.bincount(dst, minlength=n), dst)  # bucket order: dst-sorted
    x = torch.from_numpy(decode(np.concatenate([store.read_features(k) for k in range(p)]), store.manifest.feature_dtype))
    degrees = torch.from_numpy(store.read_degree("in").astype(np.int64))
    return x, view, degrees


def full_graph_child(spec: dict) -> None:
    """The independent baseline, timed: load the whole graph into tensors, then one forward of
    the model over it; writes the outputs and ``load_seconds``, ``forward_seconds``, the
    bytes it read from the disk and its peak RSS."""
    import numpy as np
    import torch

    import graphstore
    from graphstore.inference import load_model

    with graphstore.open(spec["store"]) as store:
        model, _ = load_model(spec["model"])
        io_before = benchkit.proc_io()
        start, cpu_start = time.perf_counter(), time.process_time()
        x, view, degrees = load_full_graph(store)
        loaded, cpu_loaded = time.perf_counter(), time.process_time()
        with torch.no_grad():
            out = model.eval()(x, [view] * model.num_layers, degrees=degrees if model.kind == "gcn" else None)
        done, cpu_done = time.perf_counter(), time.process_time()
        io_after = benchkit.proc_io()
        np.save(spec["out"], out.numpy())
    Path(spec["stats"]).write_text(json.dumps({
        "load_seconds": loaded - start, "forward_seconds": done - loaded,
        "load_cpu_seconds": cpu_loaded - cpu_start, "forward_cpu_seconds": cpu_done - cpu_loaded,
        "input_bytes": x.nbytes + view.nbr_index.nbytes + view.segment.nbytes + view.nbr_counts.nbytes,
        "disk_bytes_read": io_after["read_bytes"] - io_before["read_bytes"],
        "vm_hwm_bytes": benchkit.vm_hwm_bytes()}))


def least_bytes(store, layers: int, hidden: int) -> int:
    """What any exact layer-wise run must move: the features once, each edge's int32 source and
    destination once per layer, and each hidden layer's float32 rows written and read once."""
    feature_bytes = store.num_nodes * store.feature_dim * 4
    return feature_bytes + layers * store.num_edges * 8 + (layers - 1) * 2 * store.num_nodes * hidden * 4


# ---------------------------------------------------------------------- one case


def budget_for(cap_bytes: int | None) -> int | None:
    """The inference's byte budget under a cap: the cap less what the process holds anyway."""
    return None if cap_bytes is None else cap_bytes - PROCESS_BYTES


def run_case(store_path: Path, kind: str, layers: int, args, cap_bytes: int | None, dd_bytes_per_s: float) -> dict:
    import numpy as np
    import torch

    import graphstore
    from graphstore.inference import save_model
    from graphstore.nn import GNN

    work = args.workdir / "case"
    work.mkdir(parents=True, exist_ok=True)
    with graphstore.open(store_path) as store:
        torch.manual_seed(0)
        model = GNN(kind, in_dim=store.feature_dim, hidden_dim=args.hidden, out_dim=store.num_classes,
                    num_layers=layers, heads=2)
        save_model(model, work / "model.pt")
        p = store.num_partitions
        least = least_bytes(store, layers, args.hidden)
    runs = {}
    load_average = os.getloadavg()  # a shared machine: how busy it was, beside the times
    # Capped: the budget picks each layer's capacity; in memory: every partition resident;
    # full graph: the model's own forward, no walk (its outputs are the reference).
    for name, cap, c, budget in (("capped", cap_bytes, None, budget_for(cap_bytes)), ("memory", None, p, None),
                                 ("full_graph", None, None, None)):
        if name == "capped" and cap is None:
            c, budget = 2, None  # Cora: two partitions at a time, the most swapping
        spec = {"store": str(store_path), "model": str(work / "model.pt"), "capacity": c, "buffer_bytes": budget,
                "out": str(work / f"{name}.npy"), "stats": str(work / f"{name}.json"), "scratch": str(work / "scratch"),
                "mode": "full_graph" if name == "full_graph" else "layerwise"}
        measured = benchkit.run_child(__file__, spec, cap_bytes=cap, name="bench_inference",
                                      drop_cache=not args.no_drop_caches)
        if measured["returncode"] != 0:
            raise RuntimeError(f"{kind} x{layers} {name} run failed: {measured['stderr'][-800:]}")
        runs[name] = {**json.loads(Path(spec["stats"]).read_text()), **measured}
    want = np.load(work / "full_graph.npy")
    got = np.load(work / "capped.npy")
    capped, full = runs["capped"], runs["full_graph"]
    limit = capped["bytes_read"] / dd_bytes_per_s  # the inference's own time below, not the process's
    least_limit = least / dd_bytes_per_s
    full_seconds = full["load_seconds"] + full["forward_seconds"]
    return {"dataset": store_path.stem, "model": kind, "layers": layers, "capacities": capped["capacities"],
            "buffer_bytes": budget_for(cap_bytes), "disk_bytes_read": capped["disk_bytes_read"],
            "num_partitions": p, "max_abs_diff": float(np.abs(got - want).max()),
            "seconds": capped["infer_seconds"], "seconds_in_memory": runs["memory"]["infer_seconds"],
            "process_seconds": capped["seconds"],
            "bytes_read": capped["bytes_read"], "planned_bytes": capped["planned_bytes"],
            "spill_bytes": capped["spill_bytes"], "peak_rss_bytes": capped["vm_hwm_bytes"],
            "cgroup_peak_bytes": capped["cgroup_peak_bytes"], "mem_cap_bytes": cap_bytes,
            "oom_kills": capped["oom_kills"], "physical_limit_s": limit,
            "vs_physical_limit": capped["infer_seconds"] / limit,
            "vs_in_memory": capped["infer_seconds"] / runs["memory"]["infer_seconds"],
            # The in-memory run reads each input once (cold cache) and holds everything: how far
            # its time is from its own bytes at the disk's rate is the CPU's share, the floor
            # the out-of-core run cannot go under on this machine.
            "bytes_read_in_memory": runs["memory"]["bytes_read"],
            "in_memory_vs_physical_limit": runs["memory"]["infer_seconds"] / (runs["memory"]["bytes_read"] / dd_bytes_per_s),
            "per_layer_seconds": capped["per_layer_seconds"], "max_resident_partitions": capped["max_resident_partitions"],
            # The independent baseline: the model's own forward over the whole graph in memory.
            "max_abs_diff_in_memory": float(np.abs(np.load(work / "memory.npy") - want).max()),
            "full_graph_load_seconds": full["load_seconds"], "full_graph_forward_seconds": full["forward_seconds"],
            # CPU seconds (every thread) of the same spans: less sensitive than wall time to
            # other processes on the machine; ``load_average`` at the start and end of the case.
            "cpu_seconds": capped["infer_cpu_seconds"], "cpu_seconds_in_memory": runs["memory"]["infer_cpu_seconds"],
            "full_graph_load_cpu_seconds": full["load_cpu_seconds"],
            "full_graph_forward_cpu_seconds": full["forward_cpu_seconds"],
            "load_average": list(load_average), "load_average_end": list(os.getloadavg()),
            "full_graph_process_seconds": full["seconds"], "full_graph_peak_rss_bytes": full["vm_hwm_bytes"],
            "full_graph_input_bytes": full["input_bytes"], "full_graph_disk_bytes_read": full["disk_bytes_read"],
            "vs_full_graph_forward": capped["infer_seconds"] / full["forward_seconds"],
            "vs_full_graph_load_and_forward": capped["infer_seconds"] / full_seconds,
            "in_memory_vs_full_graph_load_and_forward": runs["memory"]["infer_seconds"] / full_seconds,
            "least_bytes": least, "least_bytes_limit_s": least_limit,
            "vs_least_bytes_limit": capped["infer_seconds"] / least_limit,
            "in_memory_vs_least_bytes_limit": runs["memory"]["infer_seconds"] / least_limit,
            "full_graph_vs_least_bytes_limit": full_seconds / least_limit}


def goals(cases: list[dict]) -> dict:
    big = [c for c in cases if c["mem_cap_bytes"]]
    return {
        "exact": {"value": max(c["max_abs_diff"] for c in cases), "goal": "< 1e-4 (float32)",
                  "met": all(c["max_abs_diff"] < 1e-4 for c in cases)},
        # The cgroup's peak (resident memory and page cache charged to the run) cannot pass the
        # cap; what shows the run fits is that it completes with no OOM kill. (Its RSS can read
        # above the cap: shared library pages first read by another process are charged there.)
        "under_the_cap": {"value": max((c["cgroup_peak_bytes"] / c["mem_cap_bytes"] for c in big), default=None),
                          "goal": "every out-of-core run completes under its cap with no OOM kill",
                          "met": all(c["oom_kills"] == 0 for c in big)},
        "physical_limit": {"value": max((c["vs_physical_limit"] for c in big), default=None),
                           "goal": "<= 1.5 (seconds / (bytes read / dd bandwidth))",
                           "met": all(c["vs_physical_limit"] <= 1.5 for c in big)},
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    if args.json is None:
        raise SystemExit("bench_inference.py: --json OUT is required")
    benchkit.require_root(argparse.ArgumentParser())
    args.workdir.mkdir(parents=True, exist_ok=True)
    large = synthetic(args.workdir, args.quick_nodes) if args.quick else (args.store or DEFAULT_STORE)
    if not Path(large).exists():
        raise SystemExit(f"bench_inference.py: {large}: no store (tools/bench_outofcore.py --quick builds it, "
                         "or pass --store)")
    dd_file = benchkit.ensure_dd_file(args.workdir / "dd.bin", args.dd_mib << 20)
    dd = benchkit.dd_read(dd_file, drop_cache=not args.no_drop_caches)
    feature_bytes = Path(large).joinpath("nodes", "features")
    cap = (args.cap_mib << 20) if args.cap_mib else max(512 << 20, benchkit.du(feature_bytes) // 3)
    cases = []
    for store, cap_bytes in ((cora(args.workdir), None), (Path(large), cap)):
        for kind in args.models.split(","):
            for layers in (int(x) for x in args.layers.split(",")):
                cases.append(run_case(store, kind, layers, args, cap_bytes, dd["bytes_per_s"]))
                c = cases[-1]
                print(f"{c['dataset']} {kind} x{layers}: diff {c['max_abs_diff']:.1e}, {c['seconds']:.1f} s "
                      f"({c['vs_physical_limit']:.1f}x the disk, {c['vs_in_memory']:.2f}x in memory), "
                      f"read {c['bytes_read'] / 2**30:.2f} GiB, peak {c['peak_rss_bytes'] / 2**20:.0f} MiB; "
                      f"full-graph forward {c['full_graph_forward_seconds']:.1f} s (load "
                      f"{c['full_graph_load_seconds']:.1f} s, peak {c['full_graph_peak_rss_bytes'] / 2**20:.0f} MiB)",
                      flush=True)
    result = {"cases": cases, "dd_bytes_per_s": dd["bytes_per_s"], "goals": goals(cases),
              "command": benchkit.command_line(__file__, argv),
              "machine": benchkit.machine_record("cpu", "cores", "mem_total_bytes", "python", "torch")}
    benchkit.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
