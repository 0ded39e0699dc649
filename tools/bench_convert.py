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

Needs root (drop_caches, cgroups). Usage::

    python tools/bench_convert.py --json out.json [--quick] [--cap-mib 1024 --feature-gib 3.5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def dd_bandwidth(path: Path, size_mib: int) -> dict:
    """Sequential write then cold read of ``size_mib`` MiB with direct IO, in bytes/s."""
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={size_mib // 4}",
                    "oflag=direct", "conv=fsync"], check=True, capture_output=True)
    write_s = time.perf_counter() - start
    drop_caches()
    start = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4M", "iflag=direct"],
                   check=True, capture_output=True)
    read_s = time.perf_counter() - start
    path.unlink()
    size = size_mib // 4 * 4 << 20
    return {"bytes": size, "write_bytes_per_s": size / write_s, "read_bytes_per_s": size / read_s}


class MemoryCap:
    """A cgroup v1 memory group capped at ``limit_bytes``; processes join via `prefix`."""

    def __init__(self, name: str, limit_bytes: int) -> None:
        self.path = CGROUP_ROOT / name
        if self.path.exists():
            self.path.rmdir()
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        self.limit_bytes = limit_bytes

    def prefix(self) -> list[str]:
        # The shell joins the group, then execs the command: every byte it maps is charged.
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "capped"]

    def stats(self) -> dict:
        read = lambda name: int((self.path / name).read_text().split()[0])  # noqa: E731
        oom = dict(line.split() for line in (self.path / "memory.oom_control").read_text().splitlines())
        return {"cap_bytes": self.limit_bytes, "cgroup_peak_bytes": read("memory.max_usage_in_bytes"),
                "cap_hits": read("memory.failcnt"), "oom_kills": int(oom.get("oom_kill", 0))}

    def close(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass


def run_measured(argv: list[str]) -> dict:
    """Run a child; wall time, exit code and its own peak RSS (wait4's rusage)."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"seconds": seconds, "returncode": proc.returncode, "peak_rss_bytes": usage.ru_maxrss * 1024,
                "stdout": out.read()[-2000:], "stderr": err.read()[-2000:]}


def run_capped(argv: list[str], cap_bytes: int | None, name: str) -> dict:
    """`run_measured` inside a `MemoryCap` of ``cap_bytes`` named ``name`` (removed after),
    with its stats; ``cap_bytes`` None runs uncapped and reports the cap fields as None."""
    if cap_bytes is None:
        return dict(run_measured(argv), cap_bytes=None, cgroup_peak_bytes=None, cap_hits=None, oom_kills=None)
    cap = MemoryCap(f"{name}_{os.getpid()}", cap_bytes)
    try:
        return dict(run_measured(cap.prefix() + argv), **cap.stats())
    finally:
        cap.close()


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
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
    if os.geteuid() != 0:
        ap.error("needs root: it drops the page cache and creates a cgroup")

    python = sys.executable
    row_bytes = args.feature_dim * 4
    num_nodes = int(args.feature_gib * (1 << 30) / row_bytes)
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    dataset = work / f"synthetic_n{num_nodes}_d{args.feature_dim}"
    marker = dataset / "synthetic.json"
    gen = None
    if not marker.exists():
        shutil.rmtree(dataset, ignore_errors=True)
        gen = run_measured([python, str(REPO / "tools" / "make_synthetic.py"), "--out", str(dataset),
                            "--kind", "node", "--layout", "npz", "--num-nodes", str(num_nodes),
                            "--feature-dim", str(args.feature_dim), "--avg-degree", str(args.avg_degree),
                            "--seed", "0", "--no-progress"])
        if gen["returncode"]:
            print(gen["stderr"], file=sys.stderr)
            return 1
    meta = json.loads(marker.read_text())

    disk = dd_bandwidth(work / "dd.bin", 2048 if not args.quick else 512)
    results = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                           "platform": platform.platform()},
               "dataset": {"path": str(dataset), "num_nodes": num_nodes, "feature_dim": args.feature_dim,
                           "feature_bytes": num_nodes * row_bytes, "source_bytes": du(dataset / "raw"),
                           "generator": meta, "generate_seconds": gen and gen["seconds"]},
               "disk": disk, "cap_bytes": args.cap_mib << 20, "runs": []}
    feature_bytes = num_nodes * row_bytes
    print(f"dataset {dataset.name}: features {feature_bytes / 2**30:.2f} GiB, cap {args.cap_mib} MiB "
          f"({feature_bytes / (args.cap_mib << 20):.1f}x); disk write "
          f"{disk['write_bytes_per_s'] / 1e9:.2f} GB/s, read {disk['read_bytes_per_s'] / 1e9:.2f} GB/s", flush=True)
    # Each partitioner under the cap; then `random` again without it, the in-memory reference.
    plan = [(m, True) for m in args.partitioners.split(",")] + [("random", False)]
    for method, capped in plan:
        out = work / f"{method}.gs"
        shutil.rmtree(out, ignore_errors=True)
        drop_caches()
        command = [python, "-m", "graphstore", "convert", str(dataset), str(out), "--partitioner", method,
                   "--overwrite"]
        if capped:
            cap = MemoryCap(f"graphstore_bench_{os.getpid()}", args.cap_mib << 20)
            try:
                run = run_measured(cap.prefix() + command)
                run.update(cap.stats())
            finally:
                cap.close()
        else:
            run = run_measured(command)
            run.update(cap_bytes=None, cgroup_peak_bytes=None, cap_hits=None, oom_kills=None)
        run["partitioner"] = method
        run["capped"] = capped
        if run["returncode"] == 0:
            info = json.loads(subprocess.run([python, "-m", "graphstore", "info", str(out), "--json"],
                                             capture_output=True, text=True, check=True).stdout)
            run.update(store_bytes=info["bytes_on_disk"], num_partitions=info["num_partitions"],
                       num_edges=info["num_edges"], edge_cut=info["edge_cut"],
                       phase_seconds=info["conversion"]["seconds"])
            run["feature_bytes_per_s"] = feature_bytes / run["seconds"]
            run["store_bytes_per_s"] = run["store_bytes"] / run["seconds"]
            run["feature_throughput_vs_disk_write"] = run["feature_bytes_per_s"] / disk["write_bytes_per_s"]
            run["peak_rss_vs_features"] = run["peak_rss_bytes"] / feature_bytes
        results["runs"].append(run)
        cgroup = f"cgroup peak {run['cgroup_peak_bytes'] / 2**20:.0f} MiB" if capped else "no cap"
        print(f"{method:10s} rc={run['returncode']} {run['seconds']:.1f} s, peak RSS "
              f"{run['peak_rss_bytes'] / 2**20:.0f} MiB, {cgroup}, "
              + (f"features {run['feature_bytes_per_s'] / 1e6:.0f} MB/s "
                 f"({run['feature_throughput_vs_disk_write']:.2f}x disk write), edge cut {run['edge_cut']:.1%}"
                 if run["returncode"] == 0 else run["stderr"][-300:]), flush=True)
        shutil.rmtree(out, ignore_errors=True)
    if not args.keep:
        shutil.rmtree(dataset, ignore_errors=True)
    reference = next((r for r in results["runs"] if not r["capped"] and r["returncode"] == 0), None)
    if reference:
        for r in results["runs"]:
            if r["capped"] and r["returncode"] == 0:
                r["time_vs_uncapped_random"] = r["seconds"] / reference["seconds"]
    args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["returncode"] == 0 for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
