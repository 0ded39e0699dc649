"""The partition buffer out of core: load bandwidth, prefetch, COMET vs BETA, cold cache.

Builds (once, cached in ``--workdir``) a synthetic node-classification store a few times
larger than a cgroup v1 memory cap (tools/make_synthetic.py, then ``graphstore convert
--partitioner random``), and runs every measurement in a child process inside that cap
(the page cache counts against it) after dropping the page cache:

1. **Disk.** ``dd iflag=direct`` of a file the size of one buffer state, right before
   every load (the physical limit, measured in the same run), and one cold O_DIRECT read
   of every chunk file of ``nodes/features`` (the store's own files, sequentially).
2. **Partition-load bandwidth.** One `BufferManager` pass (no prefetch, no compute) over a
   ``hierbatching`` plan at p=64, c=4 (every state admits c new partitions):
   ``bytes_read / read_seconds`` and its ratio to dd's bandwidth; bytes read vs
   `planned_read_bytes` and vs the plan's lower bound (each admitted partition's rows plus
   each bucket the plan needs, read once).
3. **Prefetch.** The same plan with a consumer that sleeps per state for as long as one
   state's load took (read + assemble, from step 2), with prefetch on and off:
   ``stall_seconds / read_seconds``. Sleep, not a Python busy loop: training releases the
   GIL (torch kernels), a pure-Python loop would not, and the loader thread needs it.
4. **COMET vs BETA** at MariusGNN's settings (p=16, c=4; COMET with its default number of
   logical partitions): states, partitions loaded, bytes read per epoch, side by side.
5. **What verification costs.** The load pass of step 2 with every read verified (whole
   chunks by their crc32c, edge buckets and partitions by the store's segment checksums)
   and with a reader that computes no checksum, alternating which goes first, each cold:
   ``read_seconds`` with / without - 1 (goal: under 5 %). ``--only-verify-cost`` runs just
   this (and the disk reference).
   A state here is a quarter of the store and the manager keeps about three states'
   worth of arrays at once, so this runs under a larger cap (reported; see the JSON).

Needs root (drop_caches, cgroups). Usage::

    sudo .venv/bin/python tools/bench_buffer.py --json docs/benchmarks/buffer.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import statistics
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


# ---------------------------------------------------------------------- disk references


def direct_read_files(files: list[Path]) -> dict:
    """Cold O_DIRECT read of ``files`` one after another (dd's method without a process per file)."""
    benchkit.drop_caches()
    buf = mmap.mmap(-1, 8 << 20)  # page aligned, as O_DIRECT wants
    total, start = 0, time.perf_counter()
    for f in files:
        fd = os.open(f, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
        try:
            while (n := os.readv(fd, [buf])) > 0:
                total += n
        finally:
            os.close(fd)
    seconds = time.perf_counter() - start
    return {"bytes": total, "files": len(files), "seconds": seconds, "bytes_per_s": total / seconds}


# ---------------------------------------------------------------------- byte accounting


def plan_bytes(store, states) -> dict:
    """Planned bytes (`planned_read_bytes`), the plan's lower bound, and the store's arrays."""
    import numpy as np

    from graphstore.buffer import planned_read_bytes
    from graphstore.layout.dtypes import storage_dtype

    m = store.manifest
    row_bytes = (m.feature_dim * storage_dtype(m.feature_dtype).itemsize if m.has_features else 0) + (4 if m.has_labels else 0)
    edge_bytes = 2 * np.dtype(m.index_dtype).itemsize + (4 if m.has_relations else 0)
    p, offsets = store.num_partitions, store.bucket_offsets
    admissions, prev, needed = 0, set(), set()
    for parts in states:
        for k in set(parts) - prev:
            start, stop = store.partition_range(k)
            admissions += (stop - start) * row_bytes
        needed.update((i, j) for i in parts for j in parts)
        prev = set(parts)
    buckets = sum((int(offsets[j * p + i + 1]) - int(offsets[j * p + i])) * edge_bytes for i, j in needed)
    loads = len(states[0]) + sum(len(set(b) - set(a)) for a, b in zip(states, states[1:]))
    return {"planned_read_bytes": planned_read_bytes(store, states), "lower_bound_bytes": admissions + buckets,
            "lower_bound_row_bytes": admissions, "lower_bound_bucket_bytes": buckets,
            "store_array_bytes": store.num_nodes * row_bytes + int(offsets[-1]) * edge_bytes,
            "partition_loads": loads}


# ---------------------------------------------------------------------- the child


def child(spec: dict) -> None:
    """BufferManager passes over one or more epochs, inside the cap; writes its numbers to
    ``spec['out']``. Epochs share one `BufferMemory`, and each (with prefetch) reads the next
    epoch's first state during its last one, as the loaders do."""
    import graphstore
    from graphstore.buffer import BufferManager, BufferMemory
    from graphstore.buffer.slots import slots_needed

    if not spec.get("verify", True):
        # The cost-of-verification baseline: the same reads, no checksum computed.
        from graphstore.layout import _chunkio

        _chunkio._SHARED = _chunkio.ChunkReader(verify=False, name="graphstore-unverified")
    store = graphstore.open(spec["store"])
    epochs = [[tuple(s) for s in states] for states in spec["epochs"]]
    by_array = _time_reads_by_array()
    compute = spec["compute_seconds"]
    prefetch = spec["prefetch"]
    need = max(slots_needed(states + (nxt[:1] if prefetch else []), prefetch=prefetch)
               for states, nxt in zip(epochs, epochs[1:] + [[]]))
    memory = BufferMemory.allocate(store, need)
    io_before = benchkit.proc_io()
    per_epoch = []
    start = time.perf_counter()
    for e, states in enumerate(epochs):
        ahead = epochs[e + 1][0] if e + 1 < len(epochs) else None
        waits = []  # the consumer's own view: seconds from asking for a state to getting it
        t_epoch = time.perf_counter()
        with BufferManager(store, states, prefetch=prefetch, memory=memory, lookahead=ahead) as buf:
            states_iter = iter(buf)
            while True:
                t0 = time.perf_counter()
                loaded = next(states_iter, None)
                waits.append(time.perf_counter() - t0)
                if loaded is None:
                    break
                del loaded
                if compute:
                    time.sleep(compute)
        s = buf.stats
        per_epoch.append({
            "epoch": e, "states": s.states, "partitions_loaded": s.partitions_loaded, "swaps": s.swaps,
            "buckets_read": s.buckets_read, "requests": s.requests, "bytes_read": s.bytes_read,
            "planned_bytes": s.planned_bytes, "read_seconds": s.read_seconds,
            "assemble_seconds": s.assemble_seconds, "stall_seconds": s.stall_seconds,
            "read_bytes_per_s": s.read_bandwidth, "first_state_wait_seconds": waits[0],
            "consumer_wait_seconds": sum(waits), "wall_seconds": time.perf_counter() - t_epoch,
            "chunks_verified": s.chunks_verified, "segments_verified": s.segments_verified,
            "unverified_reads": s.unverified_reads,
        })
    wall = time.perf_counter() - start
    io_after = benchkit.proc_io()
    total = {key: sum(ep[key] for ep in per_epoch) for key in (
        "states", "partitions_loaded", "swaps", "buckets_read", "requests", "bytes_read", "planned_bytes",
        "read_seconds", "assemble_seconds", "stall_seconds", "consumer_wait_seconds", "chunks_verified",
        "segments_verified", "unverified_reads")}
    Path(spec["out"]).write_text(json.dumps({
        **total, "read_bytes_per_s": total["bytes_read"] / max(total["read_seconds"], 1e-9),
        "wall_seconds": wall, "first_state_wait_seconds": per_epoch[0]["first_state_wait_seconds"],
        "memory_bytes": memory.nbytes, "slots": memory.num_slots, "epochs": per_epoch,
        "disk_read_bytes": io_after.get("read_bytes", 0) - io_before.get("read_bytes", 0),
        "by_array": by_array,
    }))


def _time_reads_by_array() -> dict:
    """Wrap the loader's private read to split bytes and requests by array (diagnostic only;
    a state's ranges are read together, so time is not split; empty if internals changed)."""
    from graphstore.buffer import manager

    loader = getattr(manager, "_Loader", None)
    original = getattr(loader, "_read", None)
    table: dict = {}
    if original is None:
        return table

    def counted(self, requests):
        got = original(self, requests)
        for (name, *_), out in zip(requests, got):
            row = table.setdefault(str(name), {"bytes": 0, "requests": 0})
            row["bytes"] += out.nbytes
            row["requests"] += 1
        return got

    loader._read = counted
    return table


def run_child(args, store_path: Path, epochs, *, prefetch: bool, compute: float, cap_bytes: int,
              verify: bool = True) -> dict:
    """``epochs``: a list of epochs' states (one plan's states for a single epoch)."""
    out = args.workdir / "child.json"
    out.unlink(missing_ok=True)
    spec = {"store": str(store_path), "epochs": [[list(map(int, s)) for s in states] for states in epochs],
            "prefetch": prefetch, "compute_seconds": compute, "out": str(out), "verify": verify}
    run = benchkit.run_child(__file__, spec, cap_bytes=cap_bytes, name="graphstore_bench_buffer")
    if run["returncode"] != 0:
        raise RuntimeError(f"child failed (rc={run['returncode']}, cap {cap_bytes >> 20} MiB):\n{run['stderr']}")
    result = json.loads(out.read_text())
    result.update(prefetch=prefetch, compute_seconds_per_state=compute, child_seconds=run["seconds"],
                  peak_rss_bytes=run["peak_rss_bytes"], cgroup_peak_bytes=run["cgroup_peak_bytes"],
                  cap_bytes=cap_bytes, cap_hits=run["cap_hits"], oom_kills=run["oom_kills"])
    return result


# ---------------------------------------------------------------------- building the store


def build(args, num_nodes: int, partitions: int) -> tuple[Path, dict]:
    python = sys.executable
    dataset = args.dataset or args.workdir / f"synthetic_n{num_nodes}_d{args.feature_dim}"
    if not (dataset / "synthetic.json").exists():
        gen = benchkit.run_measured([python, str(REPO / "tools" / "make_synthetic.py"), "--out", str(dataset),
                                     "--kind", "node", "--layout", "npz", "--num-nodes", str(num_nodes),
                                     "--feature-dim", str(args.feature_dim), "--avg-degree", str(args.avg_degree),
                                     "--seed", "0", "--no-progress", "--overwrite"])
        if gen["returncode"]:
            raise RuntimeError(gen["stderr"])
    store = args.workdir / f"store_n{num_nodes}_p{partitions}.gs"
    if not (store / ".bench_done").exists():  # a marker the converter does not write: complete builds only
        conv = benchkit.run_measured([python, "-m", "graphstore", "convert", str(dataset), str(store),
                                      "--partitioner", "random", "--partitions", str(partitions), "--seed", "0",
                                      "--overwrite"])
        if conv["returncode"]:
            raise RuntimeError(conv["stderr"])
        (store / ".bench_done").touch()
    return store, {"path": str(store), "bytes_on_disk": benchkit.du(store), "num_partitions": partitions}


# ---------------------------------------------------------------------- verification cost


def verify_cost(args, load_path: Path, states, cap: int, repeats: int) -> dict:
    """Step 5: the load pass verified and unverified, alternating order, cold each time."""
    runs = []
    for r in range(max(repeats, 3)):
        pair = {}
        for verify in ((True, False) if r % 2 == 0 else (False, True)):
            pair[verify] = run_child(args, load_path, [states], prefetch=False, compute=0.0, cap_bytes=cap,
                                     verify=verify)
        on, off = pair[True], pair[False]
        if on["bytes_read"] != off["bytes_read"]:
            raise RuntimeError(f"verified and unverified passes read different bytes: {on['bytes_read']} vs "
                               f"{off['bytes_read']}")
        cost = on["read_seconds"] / off["read_seconds"] - 1
        if on["unverified_reads"] or not on["segments_verified"] or off["chunks_verified"]:
            raise RuntimeError(f"the verified pass must check every read and the other none: {on['chunks_verified']} "
                               f"chunks and {on['segments_verified']} segments checked, {on['unverified_reads']} "
                               f"unchecked; unverified pass checked {off['chunks_verified']} chunks")
        runs.append({"verified_read_seconds": on["read_seconds"], "unverified_read_seconds": off["read_seconds"],
                     "chunks_verified": on["chunks_verified"], "segments_verified": on["segments_verified"],
                     "unverified_reads": on["unverified_reads"],
                     "verified_read_bytes_per_s": on["read_bytes_per_s"],
                     "unverified_read_bytes_per_s": off["read_bytes_per_s"], "bytes_read": on["bytes_read"],
                     "cost": cost, "first": "verified" if r % 2 == 0 else "unverified"})
        print(f"verification run {r}: read {on['read_seconds']:.2f} s verified, {off['read_seconds']:.2f} s "
              f"unverified: cost {cost:+.1%} ({on['bytes_read'] / 1e9:.2f} GB)", flush=True)
    cost = median_range([x["cost"] for x in runs])
    return {"what": "read_seconds of one hierbatching pass (p, c as the load measurement) with checksums "
                    "(whole chunks + segment tables) over the same pass with a reader that computes none",
            "cost": cost, "goal": "cost < 0.05", "goal_met": cost["median"] < 0.05,
            "verified_read_bytes_per_s": median_range([x["verified_read_bytes_per_s"] for x in runs]),
            "unverified_read_bytes_per_s": median_range([x["unverified_read_bytes_per_s"] for x in runs]),
            "runs": runs}


# ---------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write results here")
    ap.add_argument("--workdir", type=Path, default=Path("/work/bench_buffer"), help="dataset and stores (cached)")
    ap.add_argument("--quick", action="store_true", help="small store (~600 MB) under a 512 MiB cap")
    ap.add_argument("--num-nodes", type=int, help="default 5M (~3 GB store), quick 1M")
    ap.add_argument("--cap-mib", type=int, help="default 1024, quick 512 (importing torch alone takes ~270 MiB)")
    ap.add_argument("--feature-dim", type=int, default=128)
    ap.add_argument("--avg-degree", type=float, default=10.0)
    ap.add_argument("--load-partitions", type=int, default=64, help="p of the store for measurements 2 and 3")
    ap.add_argument("--capacity", type=int, default=4)
    ap.add_argument("--loose-cap-mib", type=int, default=8192, help="cap of the one reference load run")
    ap.add_argument("--compute-factors", default="1.0,1.5",
                    help="simulated compute per state, in units of one state's measured load time")
    ap.add_argument("--repeats", type=int, help="runs of measurements 2 and 3 (default 3, quick 1)")
    ap.add_argument("--epochs", type=int, default=3, help="epochs per prefetch run (sharing the buffer's memory)")
    ap.add_argument("--dataset", type=Path, help="an existing make_synthetic.py node dataset (skips generating one)")
    ap.add_argument("--only-verify-cost", action="store_true",
                    help="run only the disk reference and the cost of verification (step 5)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return args
    if args.json is None:
        ap.error("--json is required")
    benchkit.require_root(ap)
    args.num_nodes = args.num_nodes or (1_000_000 if args.quick else 5_000_000)
    if args.dataset:
        meta = json.loads((args.dataset / "synthetic.json").read_text())
        args.num_nodes = meta["num_nodes"]
        args.avg_degree = 2 * meta["num_edges"] / args.num_nodes
    args.cap = (args.cap_mib or (512 if args.quick else 1024)) << 20
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


class Setup:
    """The run's stores (built or reused), their sizes, the dd file of one state's size, and the
    results' opening fields."""

    def __init__(self, args) -> None:
        import graphstore

        args.workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        self.load_path, load_info = build(args, args.num_nodes, args.load_partitions)
        self.lp_path, lp_info = build(args, args.num_nodes, 16)
        build_seconds = time.perf_counter() - t0
        self.store = graphstore.open(self.load_path)
        P = self.store.partition_size
        self.row_bytes = args.feature_dim * 4 + 4
        state_bytes = args.capacity * P * self.row_bytes
        # A dd file the size of one state's rows, written once with direct IO.
        dd_mib = max(4, math.ceil(state_bytes / (4 << 20)) * 4)
        self.dd_file = benchkit.ensure_dd_file(args.workdir / "dd_state.bin", dd_mib << 20)
        self.feature_files = sorted(f for f in (self.load_path / "nodes" / "features").rglob("*")
                                    if f.is_file() and f.name != "zarr.json")
        cwd = str(Path.cwd())
        python = os.path.relpath(sys.executable, Path.cwd()) if sys.executable.startswith(cwd) else sys.executable
        self.results: dict = {
            "command": " ".join([python] + sys.argv),
            "machine": benchkit.machine_record("python", "cpus", "platform", "mem_total_bytes"),
            "quick": args.quick, "cap_bytes": args.cap, "build_seconds": build_seconds,
            "stores": {"load": load_info, "link": lp_info},
            "dataset": {"num_nodes": args.num_nodes, "feature_dim": args.feature_dim, "avg_degree": args.avg_degree,
                        "num_edges": self.store.num_edges, "partitioner": "random"},
            "store_vs_cap": load_info["bytes_on_disk"] / args.cap,
        }
        print(f"store {load_info['bytes_on_disk'] / 1e9:.2f} GB ({self.results['store_vs_cap']:.1f}x the "
              f"{args.cap >> 20} MiB cap), p={args.load_partitions}, partition {P * self.row_bytes / 1e6:.1f} MB, "
              f"state (c={args.capacity}) {state_bytes / 1e6:.0f} MB", flush=True)


def measure_disk(setup: Setup) -> dict:
    """Step 1: the store's feature chunk files read cold with O_DIRECT."""
    disk = {"features_file_set": direct_read_files(setup.feature_files), "dd_file_bytes": setup.dd_file.stat().st_size}
    print(f"disk: O_DIRECT read of the {len(setup.feature_files)} feature chunk files "
          f"{disk['features_file_set']['bytes_per_s'] / 1e9:.2f} GB/s", flush=True)
    return disk


def measure_load_bandwidth(args, setup: Setup, plan) -> tuple[dict, list[dict]]:
    """Step 2: load passes without prefetch or compute, each after dd's reference; and one under
    a cap the store fits in. The summary and the runs."""
    accounting = plan_bytes(setup.store, plan.states)
    bw_runs = []
    for r in range(args.repeats):
        dd = benchkit.dd_read(setup.dd_file)
        dd4 = benchkit.dd_read_parallel(setup.dd_file)
        run = run_child(args, setup.load_path, [plan.states], prefetch=False, compute=0.0, cap_bytes=args.cap)
        run["dd_before"] = dd
        run["dd4_before"] = dd4
        run["vs_dd"] = run["read_bytes_per_s"] / dd["bytes_per_s"]
        run["vs_dd4"] = run["read_bytes_per_s"] / dd4["bytes_per_s"]
        run["disk_read_vs_bytes_read"] = run["disk_read_bytes"] / run["bytes_read"]
        bw_runs.append(run)
        print(f"load run {r}: dd {dd['bytes_per_s'] / 1e9:.2f} GB/s (4 streams {dd4['bytes_per_s'] / 1e9:.2f}), loads "
              f"{run['read_bytes_per_s'] / 1e9:.2f} GB/s ({run['vs_dd']:.2f}x dd, {run['vs_dd4']:.2f}x 4 streams), "
              f"{run['bytes_read'] / 1e9:.2f} GB in {run['requests']} requests, "
              f"(device read {run['disk_read_bytes'] / 1e9:.2f} GB), "
              f"assemble {run['assemble_seconds']:.2f} s, cgroup peak {run['cgroup_peak_bytes'] >> 20} MiB",
              flush=True)
    # The same pass under a cap the store fits in: does the 1 GiB cap (page cache squeezed next to
    # ~800 MiB of process memory) cost bandwidth?
    dd = benchkit.dd_read(setup.dd_file)
    loose = run_child(args, setup.load_path, [plan.states], prefetch=False, compute=0.0,
                      cap_bytes=args.loose_cap_mib << 20)
    loose["dd_before"] = dd
    loose["vs_dd"] = loose["read_bytes_per_s"] / dd["bytes_per_s"]
    print(f"load, cap {args.loose_cap_mib} MiB: dd {dd['bytes_per_s'] / 1e9:.2f} GB/s, loads "
          f"{loose['read_bytes_per_s'] / 1e9:.2f} GB/s ({loose['vs_dd']:.2f}x)", flush=True)
    b0 = bw_runs[0]
    lb = {
        "policy": "hierbatching", "num_partitions": args.load_partitions, "capacity": args.capacity,
        "states": plan.num_states, **accounting,
        "bytes_read": b0["bytes_read"],
        "bytes_read_vs_planned": b0["bytes_read"] / accounting["planned_read_bytes"],
        "bytes_read_vs_lower_bound": b0["bytes_read"] / accounting["lower_bound_bytes"],
        "read_bytes_per_s": median_range([r["read_bytes_per_s"] for r in bw_runs]),
        "dd_bytes_per_s": median_range([r["dd_before"]["bytes_per_s"] for r in bw_runs]),
        "vs_dd": median_range([r["vs_dd"] for r in bw_runs]),
        "dd4_bytes_per_s": median_range([r["dd4_before"]["bytes_per_s"] for r in bw_runs]),
        "vs_dd4": median_range([r["vs_dd4"] for r in bw_runs]),
        "disk_read_vs_bytes_read": median_range([r["disk_read_vs_bytes_read"] for r in bw_runs]),
        "load_bytes_per_s_incl_assemble": median_range(
            [r["bytes_read"] / (r["read_seconds"] + r["assemble_seconds"]) for r in bw_runs]),
        "goal": "vs_dd >= 0.8 and bytes_read within 10 % of the minimum",
        "runs": bw_runs,
        "loose_cap_run": loose,
    }
    lb["goal_bandwidth_met"] = lb["vs_dd"]["median"] >= 0.8
    lb["goal_bytes_met"] = abs(lb["bytes_read_vs_lower_bound"] - 1) <= 0.10
    return lb, bw_runs


def measure_prefetch(args, setup: Setup, plan, bw_runs: list[dict]) -> dict:
    """Step 3: prefetch on and off, with compute per state = one state's load time (read +
    assemble, the median over step 2's runs) times each factor."""
    from graphstore.buffer import plan_epoch

    c = args.capacity
    per_state_load = statistics.median((r["read_seconds"] + r["assemble_seconds"]) / r["states"] for r in bw_runs)
    factors = [float(f) for f in args.compute_factors.split(",")]
    pf_epochs = [plan_epoch("hierbatching", num_partitions=args.load_partitions, capacity=c, epoch=e, seed=0).states
                 for e in range(args.epochs)]
    pf_runs = []
    for r in range(args.repeats):
        for factor in factors:
            for prefetch in (True, False):
                dd = benchkit.dd_read(setup.dd_file)
                run = run_child(args, setup.load_path, pf_epochs, prefetch=prefetch,
                                compute=factor * per_state_load, cap_bytes=args.cap)
                run["compute_factor"] = factor
                run["dd_before"] = dd
                run["stall_vs_read"] = run["stall_seconds"] / run["read_seconds"]
                run["stall_after_first_vs_read"] = (run["stall_seconds"] - run["first_state_wait_seconds"]) / run["read_seconds"]
                later = run["epochs"][1:]
                run["stall_later_epochs_vs_read"] = (sum(ep["stall_seconds"] for ep in later)
                                                     / max(sum(ep["read_seconds"] for ep in later), 1e-9)) if later else None
                pf_runs.append(run)
                print(f"prefetch={prefetch!s:5} compute {factor}x = {factor * per_state_load:.3f} s/state, run {r}: "
                      f"read {run['read_seconds']:.2f} s, stall {run['stall_seconds']:.2f} s ({run['stall_vs_read']:.2f}x "
                      f"read; after state 0 {run['stall_after_first_vs_read']:.2f}x; epochs 1+ "
                      f"{run['stall_later_epochs_vs_read'] or 0:.2f}x), wall {run['wall_seconds']:.2f} s, "
                      f"cgroup peak {run['cgroup_peak_bytes'] >> 20} MiB", flush=True)
    pf = {
        "policy": "hierbatching", "num_partitions": args.load_partitions, "capacity": c, "states": plan.num_states,
        "compute_seconds_per_state": per_state_load,
        "compute": "time.sleep per state: factor x the median (read + assemble) seconds per state of measurement 2",
        "compute_factors": factors,
        "goal": "stall_seconds / read_seconds < 0.10 with prefetch; not so without",
        "runs": pf_runs,
    }
    for factor in factors:
        for prefetch in (True, False):
            mine = [r for r in pf_runs if r["prefetch"] == prefetch and r["compute_factor"] == factor]
            pf[f"compute_{factor}x_prefetch_{'on' if prefetch else 'off'}"] = {
                "stall_vs_read": median_range([r["stall_vs_read"] for r in mine]),
                "stall_after_first_vs_read": median_range([r["stall_after_first_vs_read"] for r in mine]),
                "stall_later_epochs_vs_read": median_range([r["stall_later_epochs_vs_read"] or 0.0 for r in mine]),
                "first_state_wait_seconds": median_range([r["first_state_wait_seconds"] for r in mine]),
                "stall_seconds": median_range([r["stall_seconds"] for r in mine]),
                "read_seconds": median_range([r["read_seconds"] for r in mine]),
                "wall_seconds": median_range([r["wall_seconds"] for r in mine]),
            }
    on, off = pf[f"compute_{factors[0]}x_prefetch_on"], pf[f"compute_{factors[0]}x_prefetch_off"]
    pf["goal_met"] = on["stall_vs_read"]["median"] < 0.10 and off["stall_vs_read"]["median"] >= 0.10
    pf["goal_met_after_first_state"] = (on["stall_after_first_vs_read"]["median"] < 0.10
                                        and off["stall_after_first_vs_read"]["median"] >= 0.10)
    pf["epochs"] = args.epochs
    return pf


def measure_comet_vs_beta(args, setup: Setup) -> dict:
    """Step 4: COMET and BETA at p=16, c=4: one load pass each, and five epochs' pure plans."""
    import graphstore
    from graphstore.buffer import plan_epoch

    c = args.capacity
    lp_store = graphstore.open(setup.lp_path)
    lp_state_bytes = c * lp_store.partition_size * setup.row_bytes
    lp_cap = max(args.cap, (512 << 20) + math.ceil(4 * lp_state_bytes / (64 << 20)) * (64 << 20))
    configs = [("beta", {}), ("comet", {})]
    lp = {"num_partitions": 16, "capacity": c, "cap_bytes": lp_cap,
          "cap_note": "a state is c/p = 1/4 of the store; the manager holds ~3 states of arrays, so 4 states' "
                      "bytes of cap (the store then fits in the cap: bytes are exact, bandwidth is not out of core)",
          "policies": []}
    for name, options in configs:
        lp_plan = plan_epoch(name, num_partitions=16, capacity=c, epoch=0, seed=0, **options)
        acc = plan_bytes(lp_store, lp_plan.states)
        dd = benchkit.dd_read(setup.dd_file)
        run = run_child(args, setup.lp_path, [lp_plan.states], prefetch=True, compute=0.0, cap_bytes=lp_cap)
        epochs = []
        for e in range(5):  # pure plans: how the counts vary over epochs (COMET regroups each epoch)
            pe = plan_epoch(name, num_partitions=16, capacity=c, epoch=e, seed=0, **options)
            pb = plan_bytes(lp_store, pe.states)
            epochs.append({"epoch": e, "states": pe.num_states, "partition_loads": pb["partition_loads"],
                           "planned_read_bytes": pb["planned_read_bytes"]})
        entry = {"policy": name, "options": lp_plan.options, "states": lp_plan.num_states, **acc,
                 "partitions_loaded": run["partitions_loaded"], "bytes_read": run["bytes_read"],
                 "bytes_read_vs_planned": run["bytes_read"] / acc["planned_read_bytes"],
                 "bytes_read_vs_lower_bound": run["bytes_read"] / acc["lower_bound_bytes"],
                 "bytes_read_vs_store": run["bytes_read"] / acc["store_array_bytes"],
                 "dd_before": dd, "run": run, "plans_epochs_0_4": epochs}
        lp["policies"].append(entry)
        print(f"{name:5s} {lp_plan.options}: {entry['states']} states, {entry['partitions_loaded']} partitions loaded, "
              f"{entry['bytes_read'] / 1e9:.2f} GB read ({entry['bytes_read_vs_store']:.2f}x the store, "
              f"{entry['bytes_read_vs_planned']:.3f}x planned, {entry['bytes_read_vs_lower_bound']:.3f}x lower bound), "
              f"{run['read_bytes_per_s'] / 1e9:.2f} GB/s (dd {dd['bytes_per_s'] / 1e9:.2f})", flush=True)
    return lp


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    sys.path.insert(0, str(REPO))
    from graphstore.buffer import plan_epoch

    setup = Setup(args)
    results = setup.results
    results["disk"] = measure_disk(setup)
    # 2. + 3. load bandwidth and prefetch on a hierbatching plan
    plan = plan_epoch("hierbatching", num_partitions=args.load_partitions, capacity=args.capacity, epoch=0, seed=0)
    if args.only_verify_cost:
        results["verify_cost"] = verify_cost(args, setup.load_path, plan.states, args.cap, args.repeats)
        benchkit.write_json(args.json, results, indent=2, final_newline=False)
        print(f"wrote {args.json}; verification goal met: {results['verify_cost']['goal_met']}")
        return 0
    results["load_bandwidth"], bw_runs = measure_load_bandwidth(args, setup, plan)
    results["verify_cost"] = verify_cost(args, setup.load_path, plan.states, args.cap, args.repeats)
    results["prefetch"] = measure_prefetch(args, setup, plan, bw_runs)
    results["comet_vs_beta"] = measure_comet_vs_beta(args, setup)
    benchkit.write_json(args.json, results, indent=2, final_newline=False)
    lb, pf = results["load_bandwidth"], results["prefetch"]
    print(f"wrote {args.json}; bandwidth goal met: {lb['goal_bandwidth_met']}, bytes goal met: "
          f"{lb['goal_bytes_met']}, prefetch goal met: {pf['goal_met']}, verification goal met: "
          f"{results['verify_cost']['goal_met']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
