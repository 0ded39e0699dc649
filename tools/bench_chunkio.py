"""Reading a store's chunk files directly (`ChunkReader`) vs zarr vs dd, cold, under a memory cap.

Uses (and builds once, if missing) a store several times larger than a cgroup v1 memory cap:
the synthetic 7.3M-node, 128-float dataset of tools/bench_convert.py converted with
``--partitioner sequential --partitions 64`` (features 3.5 GiB in 8 MiB chunks, edges in
4 MiB chunks). Every measurement runs in a child process inside the cap (the page cache
counts against it) right after dropping the page cache, and rotates over different rows:

1. **Disk.** ``dd iflag=direct bs=4M`` of a file the size of one read below (dd's own
   transfer time, no process start-up), before every repeat.
2. **Whole partitions.** The feature rows of ``--read-partitions`` consecutive partitions
   (what one buffer state admits): zarr slicing, and `ChunkReader` into an aligned array,
   O_DIRECT or buffered, at each thread count (requests in flight), with chunk reads
   split into pieces of ``--piece-mib`` or not. Ratio to dd's bandwidth of the same repeat.
3. **Edge buckets.** The ``edges/src`` ranges of real buckets (``--bucket-states`` random
   groups of ``--read-partitions`` partitions, all p x p of each group's buckets: the
   manager's requests): zarr one range at a time, and `ChunkReader` with every range in
   one call (O_DIRECT through an aligned scratch block, or buffered without readahead)
   and one range per call.

Needs root (drop_caches, cgroups). Usage::

    sudo .venv/bin/python tools/bench_chunkio.py --json /work/bench_chunkio/chunkio.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

try:
    from tools import benchkit
    from tools.benchkit import median_range
except ImportError:  # run as a script: tools/ is on sys.path
    import benchkit
    from benchkit import median_range

REPO = Path(__file__).resolve().parents[1]
DATASET = Path("/work/bench_convert/synthetic_n7340032_d128")


# ---------------------------------------------------------------------- the child


def child(spec: dict) -> None:
    """One measurement inside the cap; writes its numbers to ``spec['out']``."""
    import numpy as np

    import graphstore
    from graphstore.layout._chunkio import ChunkReader, aligned_empty

    store = graphstore.open(spec["store"])
    kind, system = spec["kind"], spec["system"]
    arr = store.array("nodes/features" if kind == "rows" else "edges/src")
    ranges = [tuple(r) for r in spec["ranges"]]
    outs = [aligned_empty((hi - lo, *arr.shape[1:]), arr.dtype) for lo, hi in ranges]
    for out in outs:  # fault the pages in now: the reads are timed, allocation is not
        out.fill(0)
    io_before = benchkit.proc_io()
    stats = None
    start = time.perf_counter()
    if system == "zarr":
        for (lo, hi), out in zip(ranges, outs, strict=True):
            out[...] = arr[lo:hi]
    else:
        with ChunkReader(**spec["options"]) as reader:
            layout = reader.layout(arr)
            if spec.get("one_by_one"):
                stats = None
                for (lo, hi), out in zip(ranges, outs, strict=True):
                    s = reader.read_rows(layout, lo, hi, out)
                    stats = s if stats is None else stats + s
            else:
                stats = reader.read_into([(layout, lo, hi, out) for (lo, hi), out in zip(ranges, outs, strict=True)])
    seconds = time.perf_counter() - start
    io_after = benchkit.proc_io()
    if spec.get("check"):
        for (lo, hi), out in zip(ranges, outs, strict=True):
            if not np.array_equal(out, arr[lo:hi]):
                raise SystemExit(f"rows [{lo}, {hi}) differ from zarr's read")
    delivered = sum(o.nbytes for o in outs)
    result = {"bytes": delivered, "seconds": seconds, "bytes_per_s": delivered / seconds, "requests": len(ranges),
              "disk_read_bytes": io_after.get("read_bytes", 0) - io_before.get("read_bytes", 0)}
    if stats is not None:
        result["stats"] = {f: getattr(stats, f) for f in stats.__slots__}
    Path(spec["out"]).write_text(json.dumps(result))


def run_child(args, spec: dict) -> dict:
    out = args.workdir / "child.json"
    out.unlink(missing_ok=True)
    spec = {**spec, "store": str(args.store), "out": str(out)}
    run = benchkit.run_child(__file__, spec, cap_bytes=args.cap_mib << 20, name="graphstore_bench_chunkio")
    if run["returncode"] != 0:
        raise RuntimeError(f"child failed (rc={run['returncode']}):\n{run['stderr']}")
    result = json.loads(out.read_text())
    result.update(cgroup_peak_bytes=run["cgroup_peak_bytes"], cap_hits=run["cap_hits"], oom_kills=run["oom_kills"])
    return result


# ---------------------------------------------------------------------- main


def build(args) -> None:
    if (args.store / "zarr.json").exists():
        return
    conv = benchkit.run_measured([sys.executable, "-m", "graphstore", "convert", str(args.dataset), str(args.store),
                                  "--partitioner", "sequential", "--partitions", "64"])
    if conv["returncode"]:
        raise RuntimeError(conv["stderr"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write results here")
    ap.add_argument("--workdir", type=Path, default=Path("/work/bench_chunkio"), help="dd file, child output")
    ap.add_argument("--store", type=Path, default=Path("/work/bench_chunkio/store.gs"))
    ap.add_argument("--dataset", type=Path, default=DATASET, help="converted into --store when it is missing")
    ap.add_argument("--cap-mib", type=int, default=1024)
    ap.add_argument("--read-partitions", type=int, default=4, help="consecutive partitions per read (a state)")
    ap.add_argument("--threads", default="1,2,4,8", help="ChunkReader thread counts (requests in flight)")
    ap.add_argument("--piece-mib", type=float, default=2.0, help="the split-chunk variant's piece size")
    ap.add_argument("--bucket-states", type=int, default=30, help="groups of partitions whose buckets are read")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one repeat, threads 1 and 4")
    ap.add_argument("--only", help="run only the variants whose 'rows <name>' or 'buckets <name>' matches this regex")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return args
    if args.json is None:
        ap.error("--json is required")
    benchkit.require_root(ap)
    if args.quick:
        args.repeats, args.threads = 1, "1,4"
    return args


def variants(args, threads: list[int]) -> tuple[list[tuple], list[tuple]]:
    """The row variants ``(name, system, reader options)`` and the bucket variants ``(name,
    system, reader options, one range per call)``, filtered by ``--only``."""
    piece = int(args.piece_mib * (1 << 20))
    row_variants = [("zarr", "zarr", {}), ("reader_default", "reader", {})]
    for direct in (True, False):
        for t in threads:
            row_variants.append((f"reader_{'direct' if direct else 'buffered'}_t{t}", "reader",
                                 {"threads": t, "direct": direct}))
        for t in threads[1:]:
            row_variants.append((f"reader_{'direct' if direct else 'buffered'}_t{t}_piece{args.piece_mib:g}MiB",
                                 "reader", {"threads": t, "direct": direct, "piece_bytes": piece}))
    bucket_variants = [("zarr", "zarr", {}, False), ("reader_default", "reader", {}, False)]
    for t in threads:
        for partial_direct in (True, False):
            bucket_variants.append((f"reader_{'direct' if partial_direct else 'buffered'}_t{t}", "reader",
                                    {"threads": t, "direct": True, "partial_direct": partial_direct}, False))
    bucket_variants.append(("reader_default_one_by_one", "reader", {}, True))
    if args.only:
        row_variants = [v for v in row_variants if re.search(args.only, f"rows {v[0]}")]
        bucket_variants = [v for v in bucket_variants if re.search(args.only, f"buckets {v[0]}")]
    return row_variants, bucket_variants


def random_bucket_sets(store, k: int, states: int) -> list[list[tuple[int, int]]]:
    """``states`` random groups of ``k`` partitions, each as the edge ranges of its k x k buckets."""
    import numpy as np

    p, offsets = store.num_partitions, store.bucket_offsets
    rng = np.random.default_rng(0)
    bucket_sets = []
    for _ in range(states):
        parts = sorted(rng.choice(p, size=k, replace=False).tolist())
        bucket_sets.append([(int(offsets[j * p + i]), int(offsets[j * p + i + 1])) for j in parts for i in parts])
    return bucket_sets


def run_repeats(args, store, dd_file: Path, bucket_sets, row_variants, bucket_variants) -> tuple[dict, dict, list]:
    """Every variant once per repeat, after dd's reference: the runs per row and bucket
    variant, and dd's runs."""
    P, n, k = store.partition_size, store.num_nodes, args.read_partitions
    groups = store.num_partitions // k
    rows: dict = {name: [] for name, *_ in row_variants}
    buckets: dict = {name: [] for name, *_ in bucket_variants}
    dds, turn = [], 0
    for r in range(args.repeats):
        dd = benchkit.dd_read(dd_file, dd_seconds=True)
        dds.append(dd)
        print(f"repeat {r}: dd {dd['bytes_per_s'] / 1e9:.2f} GB/s", flush=True)
        for name, system, options in row_variants:
            g = (turn * 7) % groups  # different rows every time: nothing is left in any cache
            turn += 1
            lo, hi = g * k * P, min((g + 1) * k * P, n)
            res = run_child(args, {"kind": "rows", "system": system, "options": options, "ranges": [[lo, hi]],
                                   "check": r == 0 and system == "reader"})
            res.update(vs_dd=res["bytes_per_s"] / dd["bytes_per_s"], partitions=[g * k, (g + 1) * k])
            rows[name].append(res)
            print(f"  rows    {name:34s} {res['bytes_per_s'] / 1e9:5.2f} GB/s ({res['vs_dd']:.2f}x dd), "
                  f"cgroup peak {res['cgroup_peak_bytes'] >> 20} MiB", flush=True)
        for name, system, options, one_by_one in bucket_variants:
            # every group's buckets in one child: read_partitions^2 x bucket_states ranges
            ranges = [rg for s in bucket_sets for rg in s if rg[1] > rg[0]]
            res = run_child(args, {"kind": "buckets", "system": system, "options": options, "ranges": ranges,
                                   "one_by_one": one_by_one, "check": r == 0 and system == "reader"})
            res.update(vs_dd=res["bytes_per_s"] / dd["bytes_per_s"])
            buckets[name].append(res)
            print(f"  buckets {name:34s} {res['bytes_per_s'] / 1e9:5.2f} GB/s ({res['vs_dd']:.2f}x dd) "
                  f"{res['seconds'] * 1e3:7.1f} ms for {res['requests']} ranges, "
                  f"{res['bytes'] / 1e6:.1f} MB, device read {res['disk_read_bytes'] / 1e6:.1f} MB", flush=True)
    return rows, buckets, dds


def summarise(results: dict, rows: dict, buckets: dict, dds: list) -> None:
    """dd's, each row variant's and each bucket variant's medians into ``results``."""
    results["dd"] = {"bytes_per_s": median_range([d["bytes_per_s"] for d in dds]), "runs": dds}
    results["rows"] = {name: {"bytes_per_s": median_range([x["bytes_per_s"] for x in runs]),
                              "vs_dd": median_range([x["vs_dd"] for x in runs]), "runs": runs}
                       for name, runs in rows.items()}
    results["buckets"] = {name: {"seconds": median_range([x["seconds"] for x in runs]),
                                 "bytes_per_s": median_range([x["bytes_per_s"] for x in runs]),
                                 "vs_dd": median_range([x["vs_dd"] for x in runs]), "runs": runs}
                          for name, runs in buckets.items()}
    if buckets:
        first = next(iter(buckets.values()))[0]
        results["bucket_reads"] = {"ranges": first["requests"], "bytes": first["bytes"],
                                   "mean_edges": first["bytes"] / first["requests"] / 4}


def print_medians(results: dict) -> None:
    print("\nmedians (vs dd):")
    for name, row in results["rows"].items():
        print(f"  rows    {name:34s} {row['bytes_per_s']['median'] / 1e9:5.2f} GB/s  {row['vs_dd']['median']:.2f}x "
              f"[{row['vs_dd']['min']:.2f}, {row['vs_dd']['max']:.2f}]")
    for name, row in results["buckets"].items():
        print(f"  buckets {name:34s} {row['seconds']['median'] * 1e3:7.1f} ms  {row['vs_dd']['median']:.2f}x dd")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    threads = [int(t) for t in args.threads.split(",")]
    args.workdir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    import graphstore

    build(args)
    store = graphstore.open(args.store)
    P, p, n = store.partition_size, store.num_partitions, store.num_nodes
    feats = store.array("nodes/features")
    k = args.read_partitions
    read_bytes = k * P * feats.shape[1] * feats.dtype.itemsize
    dd_file = benchkit.ensure_dd_file(args.workdir / f"dd_{read_bytes >> 20}MiB.bin", read_bytes, block_bytes=1 << 20)
    bucket_sets = random_bucket_sets(store, k, args.bucket_states)
    results: dict = {
        "command": " ".join(["python"] + sys.argv),
        "machine": benchkit.machine_record("python", "cpus", "platform", "mem_total_bytes",
                                           read_ahead_kb=benchkit.sysfs_int("/sys/block/vda/queue/read_ahead_kb")),
        "cap_bytes": args.cap_mib << 20,
        "store": {"path": str(args.store), "bytes_on_disk": benchkit.du(args.store), "num_nodes": n,
                  "num_partitions": p, "partition_size": P, "feature_chunk_rows": feats.chunks[0],
                  "feature_chunk_bytes": feats.chunks[0] * feats.shape[1] * feats.dtype.itemsize,
                  "edge_chunk_rows": store.array("edges/src").chunks[0], "num_edges": store.num_edges},
        "read_partitions": k, "read_bytes": read_bytes, "repeats": args.repeats,
    }
    print(f"store {results['store']['bytes_on_disk'] / 1e9:.2f} GB, cap {args.cap_mib} MiB, reads of {k} partitions "
          f"= {read_bytes / 1e6:.0f} MB", flush=True)
    row_variants, bucket_variants = variants(args, threads)
    rows, buckets, dds = run_repeats(args, store, dd_file, bucket_sets, row_variants, bucket_variants)
    summarise(results, rows, buckets, dds)
    print_medians(results)
    benchkit.write_json(args.json, results, indent=2, final_newline=False)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
