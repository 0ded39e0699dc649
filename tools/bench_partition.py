"""Partitioners against METIS on graphs with communities: edge cut, seconds, peak memory.

Usage::

    .venv/bin/python tools/bench_partition.py --json docs/benchmarks/partition.json \\
        [--quick] [--sizes 1000000,7340032] [--partitions 64] [--partitioners metis,stream,random] \\
        [--stream-memory-mib 1024] [--cap-budget-mib 384 --cap-headroom-mib 160 | --no-cap] [--no-numpy] \\
        [--cache-dir DIR] [--seed 0] [--keep-going] [--warm]

What it does, per graph size (full: 1,048,576 and 7,340,032 nodes; ``--quick``: 100,000
and 400,000; ``--sizes`` to choose):

* **Graph.** ``tools/make_synthetic.py --kind node --num-nodes N --avg-degree 10
  --feature-dim 0 --num-classes 10 --layout npz --communities C --locality 0.75
  --homophily 0.2 --seed 0``, the generator and parameters of the out-of-core benchmark
  (``tools/bench_outofcore.py``: 7,340,032 nodes in 1,280 communities), with ``C`` scaled
  so that a community keeps about 5,734 nodes (rounded to a multiple of the 10 classes,
  at least 10). The edges go through graphstore's own source reader and are staged as
  the converter stores them: self loops dropped, both directions, duplicates merged. Graph
  and staged edges are cached under ``--cache-dir`` (default
  ``~/.cache/graphstore-bench/partition``) and made again only when missing.
* **Cases.** Each partitioner (`graphstore.layout.partition.partition_nodes`, ``p``
  partitions, default 64 as in the out-of-core benchmark) runs in a child process that
  does nothing else, after the page cache is dropped (as root; conversion drops the
  staged edges from the cache too). ``stream`` runs with ``partition_memory_bytes`` =
  ``--stream-memory-mib`` and, as root, once more with a smaller budget
  (``--cap-budget-mib``) inside a cgroup v1 memory group capped at that budget plus
  ``--cap-headroom-mib`` (the interpreter and libraries, about 100 MiB, and a little page
  cache; the page cache counts against the cap), case ``stream-capped``; and once more
  without its compiled kernels (case ``stream-numpy``, unless ``--no-numpy``): the same
  labels by construction, checked by their hash, and ``summary[...]["stream_kernels"]``
  gives the kernels' speedup, side by side in the same run.
* **Measured.** ``edge_cut``: the share of stored edges (both directions) whose endpoints
  are in different partitions, from the labels the child saved; ``seconds``: the
  partitioner's own time (``partition_nodes``' ``info["seconds"]``: reading the staged
  edges included, the interpreter's start not), ``wall_seconds`` the child's,
  ``cpu_seconds`` the process CPU time of the partitioning (``stream`` runs its per-group
  work on up to 4 threads, the CPUs the process may use; METIS runs on one);
  ``peak_rss_bytes``: the child's peak RSS (its ``VmHWM``); for the capped
  case ``cap_bytes``, the cgroup's peak (RSS + page cache), cap hits and OOM kills; the
  partitioner's ``info`` (METIS's own time, ``stream``'s levels and phase times).
  ``cut_ratio_vs_metis`` and ``speed_ratio_vs_metis`` (METIS's seconds over the case's)
  (and ``cpu_ratio_vs_metis``) compare with METIS on the same graph in the same run: the
  machine is shared, so ratios are the figures to read. ``summary`` puts them side by side per size, and ``goals``
  checks the issue's targets on the largest size: ``stream`` within 1.3x of METIS's cut,
  at least 5x faster, and within its cap.

The JSON: ``{"cases": [{"partitioner", "num_nodes", "num_edges", "edge_cut", "seconds",
"peak_rss_bytes", ...}], "summary": [...], "goals": {...}, "settings": {...},
"machine": {...}}``. A case that fails carries ``"error"``; a case that cannot run here
(the capped one without root) carries ``"skipped": reason``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

try:
    from tools import benchkit
except ImportError:  # run as a script: tools/ is on sys.path
    import benchkit

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FULL_SIZES = (1 << 20, 7_340_032)
QUICK_SIZES = (100_000, 400_000)
NODES_PER_COMMUNITY = 7_340_032 / 1280
"""The out-of-core benchmark's graph: 7,340,032 nodes in 1,280 communities."""
NUM_CLASSES = 10
GENERATOR_ARGS = ("--kind", "node", "--avg-degree", "10", "--feature-dim", "0", "--num-classes",
                  str(NUM_CLASSES), "--layout", "npz", "--locality", "0.75", "--homophily", "0.2",
                  "--seed", "0", "--no-progress")
STAGE_CHUNK = 1 << 22
"""Edges per step when staging and when counting the cut."""


def communities_for(num_nodes: int) -> int:
    """Communities of about `NODES_PER_COMMUNITY` nodes, a multiple of the classes."""
    return max(NUM_CLASSES, round(num_nodes / NODES_PER_COMMUNITY / NUM_CLASSES) * NUM_CLASSES)


# ------------------------------------------------------------------------------ graphs


def ensure_graph(cache: Path, num_nodes: int) -> dict:
    """The generated dataset and its staged edges under ``cache``; made when missing.

    Returns the staged edges' description (``StagedEdges`` fields) plus the generator's
    parameters, as written to ``staged.json`` once everything is in place.
    """
    communities = communities_for(num_nodes)
    root = cache / f"synthetic_local_n{num_nodes}_c{communities}"
    marker = root / "staged.json"
    if marker.exists():
        return json.loads(marker.read_text())
    # In a child: staging holds every edge key, and this process should stay small (its
    # children's ``ru_maxrss`` would otherwise start from its size).
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--prepare", str(num_nodes),
                    "--cache-dir", str(cache)], check=True)
    return json.loads(marker.read_text())


def prepare(cache: Path, num_nodes: int) -> int:
    """``--prepare``: generate and stage one size under ``cache``."""
    communities = communities_for(num_nodes)
    root = cache / f"synthetic_local_n{num_nodes}_c{communities}"
    marker = root / "staged.json"
    dataset = root / "dataset"
    if not (dataset / "synthetic.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(REPO / "tools" / "make_synthetic.py"), "--out", str(dataset),
                        "--num-nodes", str(num_nodes), "--communities", str(communities), "--overwrite",
                        *GENERATOR_ARGS], check=True, capture_output=True, text=True)
    staged = stage_stored_edges(dataset, root / "staged")
    description = {**staged, "communities": communities, "dataset": str(dataset),
                   "generator": " ".join(["tools/make_synthetic.py", "--num-nodes", str(num_nodes),
                                          "--communities", str(communities), *GENERATOR_ARGS])}
    marker.write_text(json.dumps(description, indent=2))
    return 0


def stage_stored_edges(dataset: Path, directory: Path) -> dict:
    """Stage the edges the converter would store: no self loops, duplicates merged, an
    undirected source in both directions. In memory (one int64 key per edge): the
    benchmark's own preparation, not measured."""
    import numpy as np

    from graphstore.layout._fast import unique
    from graphstore.layout._staging import EdgeStager
    from graphstore.layout.sources import read_source

    graph = read_source(dataset, work_dir=directory / "source")
    n = graph.num_nodes
    keys = []
    for chunk in graph.edges():
        src = np.asarray(chunk.src, dtype=np.int64)
        dst = np.asarray(chunk.dst, dtype=np.int64)
        keep = src != dst
        src, dst = src[keep], dst[keep]
        if not graph.directed:
            src, dst = np.minimum(src, dst), np.maximum(src, dst)
        keys.append(unique(src * n + dst))
    merged = unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64)
    del keys
    with EdgeStager(str(directory), num_nodes=n, with_rel=False) as stager:
        for start in range(0, merged.shape[0], STAGE_CHUNK):
            src, dst = np.divmod(merged[start : start + STAGE_CHUNK], n)
            stager.append(src, dst, None)
            if not graph.directed:  # marked as the converter marks the reverses it adds
                stager.append(dst, src, None, added_reverse=True)
        staged = stager.finish()
    return {"src_path": staged.src_path, "dst_path": staged.dst_path, "num_edges": staged.num_edges,
            "num_nodes": staged.num_nodes, "directed": bool(graph.directed)}


def staged_edges(description: dict):
    from graphstore.layout._staging import StagedEdges

    return StagedEdges(src_path=description["src_path"], dst_path=description["dst_path"], rel_path=None,
                       num_edges=description["num_edges"], num_nodes=description["num_nodes"],
                       reverse_runs=reverse_runs(description["num_edges"], description["directed"]))


def reverse_runs(num_edges: int, directed: bool):
    """The rows `stage_stored_edges` added as reverses (each chunk's second half), as the
    converter records them; None for a directed graph."""
    import numpy as np

    if directed:
        return None
    half, runs, at = num_edges // 2, [], 0
    for start in range(0, half, STAGE_CHUNK):
        count = min(STAGE_CHUNK, half - start)
        runs.append((at + count, at + 2 * count))
        at += 2 * count
    return np.array(runs, dtype=np.int64).reshape(-1, 2)


def edge_cut(description: dict, labels) -> float:
    """Share of the staged (stored) edges whose endpoints have different labels."""
    cut = 0
    edges = staged_edges(description)
    for _, src, dst, _rel in edges.iter_chunks(STAGE_CHUNK):
        cut += int((labels[src] != labels[dst]).sum())
    return cut / max(edges.num_edges, 1)


# ------------------------------------------------------------------------------- cases


def child(spec: dict) -> int:
    """Partition once and save the labels: the process whose peak memory is measured."""
    import numpy as np

    from graphstore.layout import partition as part_mod
    from graphstore.layout.partition import partition_nodes

    # stream-numpy: the same partitioner without its compiled kernels (the same labels).
    part_mod._USE_COMPILED = spec.get("compiled", True)
    cpu = time.process_time()
    result = partition_nodes(spec["partitioner"], edges=staged_edges(spec["graph"]),
                             num_partitions=spec["num_partitions"], seed=spec["seed"],
                             partition_memory_bytes=spec.get("memory_bytes"))
    cpu = time.process_time() - cpu
    np.save(spec["labels"], np.asarray(result.labels))
    Path(spec["info"]).write_text(json.dumps({"info": result.info, "vm_hwm_bytes": benchkit.vm_hwm_bytes(),
                                              "cpu_seconds": round(cpu, 3)}))
    return 0


def measure(case: str, method: str, description: dict, args, cap_bytes: int | None,
            memory_bytes: int | None, work: Path, compiled: bool = True) -> dict:
    """One partitioner's child run (after dropping the page cache unless ``--warm``, as root;
    inside a cgroup if capped) and its row."""
    import numpy as np

    labels_path = work / f"labels_{case}_n{description['num_nodes']}.npy"
    info_path = labels_path.with_suffix(".json")
    spec = {"partitioner": method, "graph": description, "num_partitions": args.partitions,
            "seed": args.seed, "memory_bytes": memory_bytes, "labels": str(labels_path),
            "info": str(info_path), "compiled": compiled}
    run = benchkit.run_child(__file__, spec, cap_bytes=cap_bytes, name="graphstore_bench_partition",
                             drop_cache=not args.warm and os.geteuid() == 0)
    row = {"case": case, "partitioner": method, "num_nodes": description["num_nodes"],
           "num_edges": description["num_edges"], "num_partitions": args.partitions,
           "memory_bytes": memory_bytes, "wall_seconds": round(run["seconds"], 3),
           "peak_rss_bytes": run["peak_rss_bytes"], "cap_bytes": run["cap_bytes"],
           "cgroup_peak_bytes": run["cgroup_peak_bytes"], "cap_hits": run["cap_hits"],
           "oom_kills": run["oom_kills"], "returncode": run["returncode"]}
    if run["returncode"] != 0:
        row.update(edge_cut=None, seconds=None, error=run["stderr"][-1500:])
        return row
    reported = json.loads(info_path.read_text())
    info = reported["info"]
    if reported["vm_hwm_bytes"] is not None:
        row["peak_rss_bytes"] = reported["vm_hwm_bytes"]
    labels = np.load(labels_path)
    labels_path.unlink()
    info_path.unlink()
    row.update(edge_cut=round(edge_cut(description, labels), 6), seconds=info["seconds"],
               labels_sha1=hashlib.sha1(np.ascontiguousarray(labels).tobytes()).hexdigest(),
               cpu_seconds=reported["cpu_seconds"], info=info)
    return row


# ---------------------------------------------------------------------------- reporting


def add_ratios(rows: list[dict]) -> list[dict]:
    """``*_vs_metis`` on every row; one summary row per size."""
    summary = []
    for n in sorted({r["num_nodes"] for r in rows}):
        same = [r for r in rows if r["num_nodes"] == n]
        metis = next((r for r in same if r["case"] == "metis" and r.get("edge_cut") is not None), None)
        for r in same:
            ok = metis is not None and r.get("edge_cut") is not None
            r["cut_ratio_vs_metis"] = round(r["edge_cut"] / metis["edge_cut"], 4) if ok else None
            r["speed_ratio_vs_metis"] = round(metis["seconds"] / r["seconds"], 3) if ok else None
            r["cpu_ratio_vs_metis"] = round(metis["cpu_seconds"] / r["cpu_seconds"], 3) if ok else None
            r["memory_ratio_vs_metis"] = round(r["peak_rss_bytes"] / metis["peak_rss_bytes"], 4) \
                if ok else None
        summary.append({"num_nodes": n, "num_edges": same[0]["num_edges"], "cases": {
            r["case"]: {k: r.get(k) for k in ("edge_cut", "cut_ratio_vs_metis", "seconds",
                                             "speed_ratio_vs_metis", "cpu_seconds", "cpu_ratio_vs_metis",
                                             "peak_rss_bytes", "cap_bytes", "cgroup_peak_bytes",
                                             "oom_kills", "skipped", "error")}
            for r in same}})
        compiled = next((r for r in same if r["case"] == "stream" and r.get("seconds")), None)
        numpy_ = next((r for r in same if r["case"] == "stream-numpy" and r.get("seconds")), None)
        if compiled and numpy_:  # the compiled kernels' gain, side by side
            summary[-1]["stream_kernels"] = {
                "speedup": round(numpy_["seconds"] / compiled["seconds"], 3),
                "cpu_speedup": round(numpy_["cpu_seconds"] / compiled["cpu_seconds"], 3),
                "phase_seconds": {"c": compiled["info"].get("phase_seconds"),
                                  "numpy": numpy_["info"].get("phase_seconds")},
                "same_labels": compiled["labels_sha1"] == numpy_["labels_sha1"]}
    return summary


def goals(rows: list[dict]) -> dict:
    """The issue's targets, on the largest size that has both METIS and stream."""
    sizes = sorted({r["num_nodes"] for r in rows if r["case"] == "stream" and r.get("cut_ratio_vs_metis")})
    if not sizes:
        return {"checked": False, "reason": "no size with both metis and stream results"}
    n = sizes[-1]
    stream = next(r for r in rows if r["num_nodes"] == n and r["case"] == "stream")
    capped = next((r for r in rows if r["num_nodes"] == n and r["case"] == "stream-capped"), None)
    result = {"checked": True, "num_nodes": n,
              "cut_within_1.3x_of_metis": stream["cut_ratio_vs_metis"] <= 1.3,
              "at_least_5x_faster_than_metis": stream["speed_ratio_vs_metis"] >= 5,
              "cut_ratio_vs_metis": stream["cut_ratio_vs_metis"],
              "speed_ratio_vs_metis": stream["speed_ratio_vs_metis"]}
    if capped is None or capped.get("skipped"):
        result["within_memory_cap"] = None
        result["cap_note"] = capped["skipped"] if capped else "capped case not run"
    else:
        result["within_memory_cap"] = capped["returncode"] == 0 and not capped["oom_kills"]
        result["capped_cut_ratio_vs_metis"] = capped["cut_ratio_vs_metis"]
        result["capped_speed_ratio_vs_metis"] = capped["speed_ratio_vs_metis"]
    return result


def print_row(r: dict) -> None:
    if r.get("skipped"):
        print(f"  {r['case']:14s} skipped: {r['skipped']}", flush=True)
        return
    if r.get("error"):
        print(f"  {r['case']:14s} FAILED (rc {r['returncode']}): {r['error'][-300:]}", flush=True)
        return
    cap = f", cap {r['cap_bytes'] >> 20} MiB (cgroup peak {r['cgroup_peak_bytes'] >> 20} MiB, " \
          f"OOM kills {r['oom_kills']})" if r["cap_bytes"] else ""
    print(f"  {r['case']:14s} cut {r['edge_cut']:.4f}  {r['seconds']:8.2f} s  peak RSS "
          f"{r['peak_rss_bytes'] >> 20:6d} MiB{cap}", flush=True)


# --------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES} (a few minutes)")
    ap.add_argument("--sizes", help="comma-separated node counts (overrides --quick)")
    ap.add_argument("--partitions", type=int, default=64, help="p (default 64)")
    ap.add_argument("--partitioners", default="metis,stream,random",
                    help="comma-separated; metis is the reference of the ratios")
    ap.add_argument("--stream-memory-mib", type=int, default=1024,
                    help="stream's partition_memory_bytes in the uncapped case")
    ap.add_argument("--cap-budget-mib", type=int, default=384,
                    help="stream's partition_memory_bytes in the capped case")
    ap.add_argument("--cap-headroom-mib", type=int, default=160,
                    help="cgroup cap = budget + this (interpreter, libraries, page cache)")
    ap.add_argument("--no-cap", action="store_true", help="leave out the capped stream case")
    ap.add_argument("--no-numpy", action="store_true",
                    help="leave out stream-numpy (stream without its compiled kernels, beside it for their speedup)")
    ap.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "graphstore-bench" / "partition",
                    help="generated graphs and staged edges (kept between runs)")
    ap.add_argument("--seed", type=int, default=0, help="partitioner seed")
    ap.add_argument("--keep-going", action="store_true", help="record a failed case and go on")
    ap.add_argument("--warm", action="store_true",
                    help="keep the page cache between cases (faster; the default drops it as root)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--prepare", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is None and args.prepare is None and args.json is None:
        ap.error("--json is required")
    return args


def run_sizes(args, sizes: list[int], methods: list[str], work: Path) -> list[dict]:
    """Every case on every size, one row each (printed as it comes)."""
    root = os.geteuid() == 0
    rows: list[dict] = []
    for n in sizes:
        made = time.perf_counter()
        description = ensure_graph(args.cache_dir, n)
        print(f"n={n:,}: {description['num_edges']:,} stored edges, {description['communities']} "
              f"communities (graph ready in {time.perf_counter() - made:.1f} s)", flush=True)
        plan = [(m, m, None, args.stream_memory_mib << 20 if m == "stream" else None, True) for m in methods]
        if "stream" in methods and not args.no_numpy:
            plan.append(("stream-numpy", "stream", None, args.stream_memory_mib << 20, False))
        if "stream" in methods and not args.no_cap:
            budget = args.cap_budget_mib << 20
            plan.append(("stream-capped", "stream", budget + (args.cap_headroom_mib << 20), budget, True))
        for case, method, cap_bytes, memory_bytes, compiled in plan:
            if cap_bytes is not None and not root:
                row = {"case": case, "partitioner": method, "num_nodes": n,
                       "num_edges": description["num_edges"], "cap_bytes": cap_bytes,
                       "skipped": "needs root for a cgroup v1 memory cap"}
            else:
                row = measure(case, method, description, args, cap_bytes, memory_bytes, work, compiled)
            rows.append(row)
            print_row(row)
            if row.get("error") and not args.keep_going:
                raise SystemExit(f"{case} failed on n={n}; --keep-going records it and goes on")
    return rows


def settings(args, sizes: list[int], methods: list[str]) -> dict:
    return {"sizes": sizes, "num_partitions": args.partitions, "partitioners": methods,
            "stream_memory_bytes": args.stream_memory_mib << 20,
            "cap_budget_bytes": None if args.no_cap else args.cap_budget_mib << 20,
            "cap_headroom_bytes": None if args.no_cap else args.cap_headroom_mib << 20,
            "seed": args.seed, "generator": {str(n): communities_for(n) for n in sizes},
            "generator_args": list(GENERATOR_ARGS), "cache_dir": str(args.cache_dir),
            "dropped_page_cache": os.geteuid() == 0 and not args.warm}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return child(json.loads(args.child))
    if args.prepare is not None:
        return prepare(args.cache_dir, args.prepare)
    from graphstore.layout.partition import available_partitioners

    methods = [m for m in args.partitioners.split(",") if m]
    unknown = sorted(set(methods) - set(available_partitioners()))
    if unknown:
        print(f"unknown partitioner(s) {', '.join(unknown)}; known: {', '.join(available_partitioners())}",
              file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else list(QUICK_SIZES if args.quick
                                                                           else FULL_SIZES)
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    work = args.cache_dir / f"run-{os.getpid()}"
    work.mkdir()
    load_before = os.getloadavg()
    began = time.perf_counter()
    try:
        rows = run_sizes(args, sizes, methods, work)
    finally:
        for leftover in work.glob("*"):
            leftover.unlink()
        work.rmdir()
    summary = add_ratios(rows)
    result = {
        "cases": rows,
        "summary": summary,
        "goals": goals(rows),
        "settings": settings(args, sizes, methods),
        "machine": benchkit.machine_record("python", "cpus", "platform", load_average_before=load_before,
                                           load_average_after=os.getloadavg(),
                                           seconds=round(time.perf_counter() - began, 1)),
    }
    benchkit.write_json(args.json, result, indent=2)
    for s in summary:
        stream = s["cases"].get("stream") or {}
        if stream.get("cut_ratio_vs_metis") is not None:
            print(f"n={s['num_nodes']:,}: stream cut {stream['cut_ratio_vs_metis']:.3f}x METIS's, "
                  f"{stream['speed_ratio_vs_metis']:.1f}x faster", flush=True)
        if "stream_kernels" in s:
            k = s["stream_kernels"]
            print(f"n={s['num_nodes']:,}: stream's compiled kernels {k['speedup']:.2f}x numpy's time "
                  f"({k['cpu_speedup']:.2f}x CPU), same labels: {k['same_labels']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
