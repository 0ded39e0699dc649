"""Conversion out of core: peak memory, time and throughput under a cgroup memory cap.

Writes a synthetic OGB-layout dataset (tools/make_synthetic.py, the ``raw/data.npz``
variant of ogbn-papers100M) whose features are several times a memory cap, drops the
page cache, and runs ``python -m graphstore convert`` inside a cgroup v1 memory group
with that cap (the page cache counts against it). In the same run it measures the disk's
sequential write and read bandwidth with ``dd`` (direct IO), the physical limit to
compare against.

Reported per partitioner: wall time, peak RSS of the converter (``ru_maxrss``), the
cgroup's peak usage (RSS + page cache), whether the cap was hit, feature and total
throughput, and their ratio to the disk's sequential write speed. Conversion writes
every feature byte twice when the store order differs from the source order (once to
a per-partition staging file, once into the store): the ``sequential`` partitioner,
whose store order is the source order, shows the cost without that copy.

The edge phase (``write edges``: staged edges mapped to store ids, grouped by destination
partition, sorted, merged, written as buckets with degrees) is reported on its own too:
staged edges per second, and the bytes it writes into the store (``edges/*``,
``nodes/in_degree``, ``nodes/out_degree``) per second against the disk's write speed.

Needs root (drop_caches, cgroups). Usage::

    python tools/bench_convert.py --json out.json [--quick] [--cap-mib 1024 --feature-gib 3.5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

try:
    from tools import benchkit
except ImportError:  # run as a script: tools/ is on sys.path
    import benchkit

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True, type=Path, help="write results here")
    ap.add_argument("--workdir", type=Path, default=Path("/work/bench_convert"),
                    help="dataset and stores (needs a few times the feature size free)")
    ap.add_argument("--cap-mib", type=int, default=1024, help="cgroup memory cap")
    ap.add_argument("--feature-gib", type=float, default=3.5, help="feature bytes of the dataset")
    ap.add_argument("--feature-dim", type=int, default=128)
    ap.add_argument("--avg-degree", type=float, default=10.0)
    ap.add_argument("--partitioners", default="sequential,random,stream")
    ap.add_argument("--quick", action="store_true", help="small sizes, to check the harness")
    ap.add_argument("--keep", action="store_true", help="keep the dataset for the next run")
    args = ap.parse_args(argv)
    if args.quick:
        args.cap_mib, args.feature_gib = 384, 1.2
    benchkit.require_root(ap)
    return args


def ensure_dataset(args, num_nodes: int) -> tuple[Path, dict | None]:
    """The synthetic dataset in ``args.workdir`` and its generator's run (None when it was
    already there: its ``synthetic.json`` marks a complete one)."""
    dataset = args.workdir / f"synthetic_n{num_nodes}_d{args.feature_dim}"
    if (dataset / "synthetic.json").exists():
        return dataset, None
    shutil.rmtree(dataset, ignore_errors=True)
    gen = benchkit.run_measured([sys.executable, str(REPO / "tools" / "make_synthetic.py"), "--out", str(dataset),
                                 "--kind", "node", "--layout", "npz", "--num-nodes", str(num_nodes),
                                 "--feature-dim", str(args.feature_dim), "--avg-degree", str(args.avg_degree),
                                 "--seed", "0", "--no-progress"])
    return dataset, gen


def convert_once(dataset: Path, out: Path, method: str, cap_bytes: int | None, *, feature_bytes: int,
                 disk: dict) -> dict:
    """One cold conversion by ``method`` (under ``cap_bytes`` unless None), with the store's
    figures and throughputs when it succeeded."""
    shutil.rmtree(out, ignore_errors=True)
    benchkit.drop_caches()
    python = sys.executable
    command = [python, "-m", "graphstore", "convert", str(dataset), str(out), "--partitioner", method,
               "--overwrite"]
    run = benchkit.run_capped(command, cap_bytes, "graphstore_bench")
    run["partitioner"] = method
    run["capped"] = cap_bytes is not None
    if run["returncode"] == 0:
        info = json.loads(subprocess.run([python, "-m", "graphstore", "info", str(out), "--json"],
                                         capture_output=True, text=True, check=True).stdout)
        run.update(store_bytes=info["bytes_on_disk"], num_partitions=info["num_partitions"],
                   num_edges=info["num_edges"], edge_cut=info["edge_cut"],
                   phase_seconds=info["conversion"]["seconds"])
        run["edge_phase"] = edge_phase(info, disk)
        run["feature_bytes_per_s"] = feature_bytes / run["seconds"]
        run["store_bytes_per_s"] = run["store_bytes"] / run["seconds"]
        run["feature_throughput_vs_disk_write"] = run["feature_bytes_per_s"] / disk["write_bytes_per_s"]
        run["peak_rss_vs_features"] = run["peak_rss_bytes"] / feature_bytes
    shutil.rmtree(out, ignore_errors=True)
    return run


EDGE_PHASE_ARRAYS = ("edges/src", "edges/dst", "edges/rel", "edges/bucket_offsets", "nodes/in_degree",
                     "nodes/out_degree")
"""What the edge phase writes into the store."""


def edge_phase(info: dict, disk: dict) -> dict:
    """The ``write edges`` phase of one conversion (``graphstore info --json`` of its store):
    seconds, staged and stored edges per second, and the bytes it wrote into the store per
    second, also as a fraction of the disk's sequential write speed."""
    seconds = info["conversion"]["seconds"]["write edges"]
    staged = info["conversion"]["staged_edges"]
    written = sum(info["arrays"][name]["bytes_on_disk"] for name in EDGE_PHASE_ARRAYS if name in info["arrays"])
    return {"seconds": seconds, "staged_edges": staged, "stored_edges": info["num_edges"],
            "staged_edges_per_s": staged / seconds, "stored_edges_per_s": info["num_edges"] / seconds,
            "store_bytes": written, "store_bytes_per_s": written / seconds,
            "store_bytes_vs_disk_write": written / seconds / disk["write_bytes_per_s"]}


def print_run(run: dict) -> None:
    method = run["partitioner"]
    cgroup = f"cgroup peak {run['cgroup_peak_bytes'] / 2**20:.0f} MiB" if run["capped"] else "no cap"
    print(f"{method:10s} rc={run['returncode']} {run['seconds']:.1f} s, peak RSS "
          f"{run['peak_rss_bytes'] / 2**20:.0f} MiB, {cgroup}, "
          + (f"features {run['feature_bytes_per_s'] / 1e6:.0f} MB/s "
             f"({run['feature_throughput_vs_disk_write']:.2f}x disk write), edge cut {run['edge_cut']:.1%}; "
             f"edge phase {run['edge_phase']['seconds']:.1f} s, "
             f"{run['edge_phase']['staged_edges_per_s'] / 1e6:.1f}M staged edges/s, "
             f"{run['edge_phase']['store_bytes_per_s'] / 1e6:.0f} MB/s into the store "
             f"({run['edge_phase']['store_bytes_vs_disk_write']:.2f}x disk write)"
             if run["returncode"] == 0 else run["stderr"][-300:]), flush=True)


def add_time_vs_uncapped(runs: list[dict]) -> None:
    """Each finished capped run's time over the uncapped ``random`` run's (the in-memory reference)."""
    reference = next((r for r in runs if not r["capped"] and r["returncode"] == 0), None)
    if reference:
        for r in runs:
            if r["capped"] and r["returncode"] == 0:
                r["time_vs_uncapped_random"] = r["seconds"] / reference["seconds"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    row_bytes = args.feature_dim * 4
    num_nodes = int(args.feature_gib * (1 << 30) / row_bytes)
    feature_bytes = num_nodes * row_bytes
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    dataset, gen = ensure_dataset(args, num_nodes)
    if gen and gen["returncode"]:
        print(gen["stderr"], file=sys.stderr)
        return 1
    meta = json.loads((dataset / "synthetic.json").read_text())

    disk = benchkit.dd_bandwidth(work / "dd.bin", 2048 if not args.quick else 512)
    results = {"machine": benchkit.machine_record("python", "cpus", "platform"),
               "dataset": {"path": str(dataset), "num_nodes": num_nodes, "feature_dim": args.feature_dim,
                           "feature_bytes": feature_bytes, "source_bytes": benchkit.du(dataset / "raw"),
                           "generator": meta, "generate_seconds": gen and gen["seconds"]},
               "disk": disk, "cap_bytes": args.cap_mib << 20, "runs": []}
    print(f"dataset {dataset.name}: features {feature_bytes / 2**30:.2f} GiB, cap {args.cap_mib} MiB "
          f"({feature_bytes / (args.cap_mib << 20):.1f}x); disk write "
          f"{disk['write_bytes_per_s'] / 1e9:.2f} GB/s, read {disk['read_bytes_per_s'] / 1e9:.2f} GB/s", flush=True)
    # Each partitioner under the cap; then `random` again without it, the in-memory reference.
    plan = [(m, True) for m in args.partitioners.split(",")] + [("random", False)]
    for method, capped in plan:
        run = convert_once(dataset, work / f"{method}.gs", method, args.cap_mib << 20 if capped else None,
                           feature_bytes=feature_bytes, disk=disk)
        results["runs"].append(run)
        print_run(run)
    if not args.keep:
        shutil.rmtree(dataset, ignore_errors=True)
    add_time_vs_uncapped(results["runs"])
    benchkit.write_json(args.json, results, indent=2, final_newline=False)
    return 0 if all(r["returncode"] == 0 for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
