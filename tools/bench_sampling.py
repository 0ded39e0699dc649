"""Sampling speed: DENSE (`sample_dense`) against DGL 1.1.3 and the reference sampler.

One run, one machine, one synthetic power-law graph, the same target batches for every
sampler. Usage::

    python tools/bench_sampling.py [--quick] --json OUT.json [--cache-dir DIR]
                                   [--dgl-python PATH | --no-dgl]

What it does:

* **Graph.** Chung-Lu with a power-law weight sequence (exponent ``--gamma``), the expected
  degree of each node capped at ``--max-degree``, and node ids randomly permuted, so
  neighbourhoods spread over the whole graph rather than over a few hubs or an id range.
  Full mode: 2,097,152 nodes and 42M directed edges; ``--quick``: 131,072 nodes and 2.6M
  edges. Generated with vectorised numpy from a seed and saved once as ``src.npy`` /
  ``dst.npy`` (int64) plus ``targets.npy`` ([batches, batch_size]) in the cache directory,
  so the DGL process loads exactly the same graph and batches.
* **Cases.** Fanouts (15, 10, 5) and (20, 20, 20, 20) in this package's order
  (``fanouts[0]`` is the hop nearest the targets; DGL gets the reverse). Batches of 1000
  distinct random targets; a few warm-up batches, then timed batches until ``--batches`` are
  done or a case's time budget is spent (at least ``--min-batches``). Everything runs with
  ``torch.set_num_threads(1)`` (and ``OMP_NUM_THREADS=1`` for DGL); DENSE is also timed
  with 2 threads (``ms_median_2threads``).
* **Backend.** ``sample_dense``'s backend is ``--dense-backend`` (default ``auto``: the
  compiled kernel when it was built); each DENSE case records the one used in ``backend``.
* **Work done.** DENSE: ``nodes_per_batch`` = distinct nodes in the DENSE, and
  ``edges_per_batch`` = sampled edges (each node sampled once). DGL and the reference
  sampler: ``nodes_per_batch`` = distinct input nodes (``blocks[0].src_nodes``, the same
  set DENSE's nodes are), ``edges_per_batch`` = sum of the blocks' edges (a node reached by
  several layers is sampled again per block), and ``src_nodes_sum_per_batch`` = the sum
  over blocks of src nodes (the rows the layers process).
* **DGL** runs in its own virtual environment (default ``<repo>/.venv-dgl``, created when
  missing: ``torch==2.13.0``, ``dgl==1.1.3``, then ``setuptools<70`` and ``packaging``) in a
  subprocess that reads the cached graph and batches and prints JSON. If it cannot be
  installed or run, its cases are reported with ``"skipped": reason``.
* **GraphSage.** Forward + backward of a 3-layer mean-aggregator GraphSage (hidden 128,
  random input features [N, 100] float32) on DENSE and on the reference blocks, fanouts
  (15, 10, 5), sampled for the same targets; the feature gather is not timed. The model
  is a benchmark helper written here, not a library layer.

The JSON: ``{"cases": [...], "graph": {...}, "graphsage": [...], "ratios": {...},
"machine": {...}, "settings": {...}}``; ``ratios`` holds ``dgl_ms / dense_ms`` and
``reference_ms / dense_ms`` (medians) per fanout setting, and ``dgl_cpu_ms / dense_cpu_ms``:
each sampling case also records ``cpu_ms_median``, the process CPU time per batch, which
other jobs on a shared machine inflate less than wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

try:
    from tools import benchkit
except ImportError:  # run as a script: tools/ is on sys.path
    import benchkit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FANOUT_CASES = ((15, 10, 5), (20, 20, 20, 20))


# ----------------------------------------------------------------------------- graph

def chung_lu(num_nodes: int, num_edges: int, *, gamma: float, max_degree: float,
             seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Directed Chung-Lu edges ``src -> dst``, int64, with randomly permuted node ids.

    Both endpoints of every edge are drawn independently with probability proportional to
    a power-law weight ``(i + 1) ** (-1 / (gamma - 1))``, each weight capped so that no node
    expects more than ``max_degree`` in- (or out-) edges.
    """
    rng = np.random.default_rng(seed)
    w = (np.arange(num_nodes, dtype=np.float64) + 1.0) ** (-1.0 / (gamma - 1.0))
    for _ in range(20):  # capping lowers the sum, which raises the others: iterate to a fixpoint
        cap = max_degree / num_edges * w.sum()
        if w.max() <= cap * (1 + 1e-9):
            break
        w = np.minimum(w, cap)
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    perm = rng.permutation(num_nodes).astype(np.int64)
    ends = []
    for _ in range(2):
        out = np.empty(num_edges, dtype=np.int64)
        step = 1 << 22
        for lo in range(0, num_edges, step):
            hi = min(lo + step, num_edges)
            idx = np.searchsorted(cdf, rng.random(hi - lo), side="right")
            np.minimum(idx, num_nodes - 1, out=idx)
            out[lo:hi] = perm[idx]
        ends.append(out)
    return ends[0], ends[1]


def target_batches(num_nodes: int, num_batches: int, batch_size: int, seed: int) -> np.ndarray:
    """int64 [num_batches, batch_size], each row distinct uniformly random node ids."""
    rng = np.random.default_rng(seed + 1)
    return np.stack([rng.choice(num_nodes, size=batch_size, replace=False) for _ in range(num_batches)])


def load_or_make(cache: Path, num_nodes: int, num_edges: int, num_batches: int, batch_size: int,
                 args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    cache.mkdir(parents=True, exist_ok=True)
    meta = {"generator": "chung-lu", "num_nodes": num_nodes, "num_edges": num_edges,
            "gamma": args.gamma, "max_degree": args.max_degree, "seed": args.seed,
            "num_batches": num_batches, "batch_size": batch_size}
    meta_path = cache / "meta.json"
    if meta_path.exists() and json.loads(meta_path.read_text()) == meta:
        t0 = time.perf_counter()
        src, dst = np.load(cache / "src.npy"), np.load(cache / "dst.npy")
        targets = np.load(cache / "targets.npy")
        return src, dst, targets, {"generated": False, "load_s": round(time.perf_counter() - t0, 2)}
    t0 = time.perf_counter()
    src, dst = chung_lu(num_nodes, num_edges, gamma=args.gamma, max_degree=args.max_degree, seed=args.seed)
    targets = target_batches(num_nodes, num_batches, batch_size, args.seed)
    gen_s = time.perf_counter() - t0
    np.save(cache / "src.npy", src)
    np.save(cache / "dst.npy", dst)
    np.save(cache / "targets.npy", targets)
    meta_path.write_text(json.dumps(meta))
    return src, dst, targets, {"generated": True, "generate_s": round(gen_s, 2)}


# ----------------------------------------------------------------------------- timing

def summarise(sampler: str, fanouts, batch_size: int, times: list[float], nodes: list[float],
              edges: list[float], cpu_times: list[float] | None = None, **extra) -> dict:
    case = {"sampler": sampler, "fanouts": list(fanouts), "batch_size": batch_size,
            "ms_median": round(1e3 * statistics.median(times), 3),
            "ms_min": round(1e3 * min(times), 3), "ms_max": round(1e3 * max(times), 3),
            "nodes_per_batch": round(statistics.fmean(nodes), 1),
            "edges_per_batch": round(statistics.fmean(edges), 1),
            "timed_batches": len(times)}
    if cpu_times:
        # Process CPU time per batch: unlike wall time it does not grow while other jobs hold
        # the cores, so it is the steadier figure on a shared machine (both are reported).
        case["cpu_ms_median"] = round(1e3 * statistics.median(cpu_times), 3)
    case.update(extra)
    return case


def run_batches(fn, targets, warmup: int, max_batches: int, min_batches: int, budget_s: float):
    """Call ``fn(batch)`` on warm-up then timed batches; returns (times, results, cpu_times)."""
    for i in range(warmup):
        fn(targets[i % len(targets)])
    times, results, cpu_times = [], [], []
    start = time.perf_counter()
    for i in range(max_batches):
        batch = targets[(warmup + i) % len(targets)]
        t0, c0 = time.perf_counter(), time.process_time()
        res = fn(batch)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        results.append(res)
        if len(times) >= min_batches and time.perf_counter() - start > budget_s:
            break
    return times, results, cpu_times


# ----------------------------------------------------------------------------- DGL

DGL_SCRIPT = r"""
import json, os, statistics, sys, time
import numpy as np
import torch
cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
import dgl
from dgl.dataloading import MultiLayerNeighborSampler
cache = cfg["cache"]
t0 = time.perf_counter()
src = torch.from_numpy(np.load(os.path.join(cache, "src.npy")))
dst = torch.from_numpy(np.load(os.path.join(cache, "dst.npy")))
targets = np.load(os.path.join(cache, "targets.npy"))
g = dgl.graph((src, dst), num_nodes=cfg["num_nodes"])
del src, dst
g = g.formats(["csc"])  # in-neighbour sampling reads the CSC; build it before timing
g.create_formats_()
setup_s = time.perf_counter() - t0
out = {"dgl_version": dgl.__version__, "torch_version": torch.__version__, "setup_s": setup_s,
       "cases": []}
for fanouts in cfg["fanouts"]:  # DGL order: input layer first
    sampler = MultiLayerNeighborSampler(list(fanouts))
    def run(batch):
        seeds = torch.from_numpy(batch)
        input_nodes, output_nodes, blocks = sampler.sample(g, seeds)
        return (int(input_nodes.numel()), sum(b.num_src_nodes() for b in blocks),
                sum(b.num_edges() for b in blocks))
    for i in range(cfg["warmup"]):
        run(targets[i % len(targets)])
    times, stats, cpu = [], [], []
    start = time.perf_counter()
    for i in range(cfg["max_batches"]):
        batch = targets[(cfg["warmup"] + i) % len(targets)]
        t1, c1 = time.perf_counter(), time.process_time()
        res = run(batch)
        times.append(time.perf_counter() - t1)
        cpu.append(time.process_time() - c1)
        stats.append(res)
        if len(times) >= cfg["min_batches"] and time.perf_counter() - start > cfg["budget_s"]:
            break
    out["cases"].append({"fanouts_dgl": list(fanouts), "times": times, "stats": stats, "cpu_times": cpu})
print("DGL_JSON " + json.dumps(out))
"""


def run_dgl(py: str, cache: Path, num_nodes: int, args: argparse.Namespace, budget: dict) -> tuple[dict | None, str | None]:
    cfg = {"cache": str(cache), "num_nodes": num_nodes, "threads": 1,
           "fanouts": [list(f)[::-1] for f in FANOUT_CASES], "warmup": budget["warmup"],
           "max_batches": budget["batches"], "min_batches": budget["min_batches"],
           "budget_s": budget["budget_s"]}
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", DGLBACKEND="pytorch")
    with tempfile.NamedTemporaryFile("w", suffix="_dgl_bench.py", delete=False) as fh:
        fh.write(DGL_SCRIPT)
        script = fh.name
    try:
        r = subprocess.run([py, script, json.dumps(cfg)], capture_output=True, text=True, env=env,
                           timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"DGL subprocess failed: {exc}"
    finally:
        os.unlink(script)
    for line in r.stdout.splitlines():
        if line.startswith("DGL_JSON "):
            return json.loads(line[len("DGL_JSON "):]), None
    tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
    return None, f"DGL subprocess exited {r.returncode}: {tail}"


# ----------------------------------------------------------------------------- cases

def build_graph(args, cache: Path, num_nodes: int, num_edges: int, num_batches: int, log):
    """The cached (or new) graph as a CSC, its description, and the target batches as tensors."""
    import torch

    from graphstore.sample import CSCGraph

    src, dst, targets, gen_info = load_or_make(cache, num_nodes, num_edges, num_batches, args.batch_size, args)
    log(f"graph: {num_nodes} nodes, {num_edges} edges {gen_info}")
    t0 = time.perf_counter()
    graph = CSCGraph.from_edges(torch.from_numpy(src), torch.from_numpy(dst), num_nodes, out_edges=False)
    csc_s = time.perf_counter() - t0
    deg = (graph.indptr[1:] - graph.indptr[:-1]).numpy()
    graph_info = {"num_nodes": num_nodes, "num_edges": int(graph.num_edges), "generator": "chung-lu",
                  "gamma": args.gamma, "max_expected_degree": args.max_degree, "seed": args.seed,
                  "ids": "randomly permuted", "in_degree_max": int(deg.max()),
                  "in_degree_median": float(np.median(deg)), "isolated_in": int((deg == 0).sum()),
                  "top100_in_edge_share": float(np.sort(deg)[-100:].sum() / deg.sum()),
                  "csc_build_s": round(csc_s, 2), **gen_info}
    del src, dst
    log(f"CSC built in {csc_s:.1f}s; in-degree max {deg.max()}, median {np.median(deg)}")
    return graph, graph_info, [torch.from_numpy(t) for t in targets]


def run_local_cases(args, graph, batches, workspace, budget: dict, log) -> tuple[list[dict], dict, dict]:
    """DENSE (1 and 2 threads) and the reference sampler on every fanout setting: the cases,
    and DENSE's and the reference's case per fanouts."""
    import torch

    from graphstore.sample import native_available, sample_blocks, sample_dense

    cases: list[dict] = []
    dense_by_fanouts: dict[tuple, dict] = {}
    ref_by_fanouts: dict[tuple, dict] = {}
    dense_backend = args.dense_backend
    if dense_backend == "auto":
        dense_backend = "native" if native_available() else "torch"
    log(f"DENSE backend: {dense_backend}")
    for fanouts in FANOUT_CASES:
        gen = torch.Generator().manual_seed(args.seed)

        def dense_fn(t):
            d = sample_dense(graph, t, fanouts, generator=gen, workspace=workspace,
                             backend=args.dense_backend)
            return d.num_nodes, d.num_edges

        results = {}
        for threads in (1, 2):
            # The 2-thread figure is a side note: fewer batches, a quarter of the budget.
            torch.set_num_threads(threads)
            results[threads] = run_batches(dense_fn, batches, budget["warmup"],
                                           budget["batches"] if threads == 1 else min(budget["batches"], 10),
                                           budget["min_batches"] if threads == 1 else 3,
                                           budget["budget_s"] if threads == 1 else budget["budget_s"] / 4)
        torch.set_num_threads(1)
        times, res, cpu = results[1]
        case = summarise("dense", fanouts, args.batch_size, times, [r[0] for r in res], [r[1] for r in res],
                         cpu,
                         threads=1, ms_median_2threads=round(1e3 * statistics.median(results[2][0]), 3),
                         backend=dense_backend)
        cases.append(case)
        dense_by_fanouts[fanouts] = case
        log(f"dense {fanouts}: {case['ms_median']} ms, {case['nodes_per_batch']} nodes, "
            f"{case['edges_per_batch']} edges; 2 threads {case['ms_median_2threads']} ms")

        def ref_fn(t):
            blocks = sample_blocks(graph, t, fanouts, generator=gen)
            return (int(blocks[0].src_nodes.numel()), sum(int(b.src_nodes.numel()) for b in blocks),
                    sum(b.num_edges for b in blocks))

        times, res, cpu = run_batches(ref_fn, batches, budget["warmup"], budget["batches"],
                                      budget["min_batches"], budget["budget_s"])
        case = summarise("reference", fanouts, args.batch_size, times, [r[0] for r in res], [r[2] for r in res],
                         cpu,
                         threads=1, src_nodes_sum_per_batch=round(statistics.fmean(r[1] for r in res), 1))
        cases.append(case)
        ref_by_fanouts[fanouts] = case
        log(f"reference {fanouts}: {case['ms_median']} ms, {case['nodes_per_batch']} nodes, "
            f"{case['edges_per_batch']} edges")
    return cases, dense_by_fanouts, ref_by_fanouts


def run_dgl_cases(args, cache: Path, num_nodes: int, budget: dict, log) -> tuple[list[dict], dict, dict, str | None]:
    """DGL's cases, in its own interpreter (or skipped rows saying why): the cases, DGL's case
    per fanouts, its description, and why it did not run (None when it did)."""
    cases: list[dict] = []
    dgl_info: dict = {}
    dgl_by_fanouts: dict[tuple, dict] = {}
    if args.no_dgl:
        reason = "--no-dgl given"
    else:
        py, reason = benchkit.ensure_dgl_python(args, log)
        if py is not None:
            log(f"DGL: running with {py}")
            out, reason = run_dgl(py, cache, num_nodes, args, budget)
            if out is not None:
                dgl_info = {"python": py, "dgl_version": out["dgl_version"],
                            "torch_version": out["torch_version"], "setup_s": round(out["setup_s"], 2)}
                for fanouts, rc in zip(FANOUT_CASES, out["cases"]):
                    st = rc["stats"]
                    case = summarise("dgl", fanouts, args.batch_size, rc["times"], [s[0] for s in st],
                                     [s[2] for s in st], rc.get("cpu_times"), threads=1,
                                     fanouts_dgl_order=rc["fanouts_dgl"],
                                     src_nodes_sum_per_batch=round(statistics.fmean(s[1] for s in st), 1))
                    cases.append(case)
                    dgl_by_fanouts[fanouts] = case
                    log(f"dgl {fanouts}: {case['ms_median']} ms, {case['nodes_per_batch']} nodes, "
                        f"{case['edges_per_batch']} edges")
    if not dgl_by_fanouts:
        log(f"DGL skipped: {reason}")
        for fanouts in FANOUT_CASES:
            cases.append({"sampler": "dgl", "fanouts": list(fanouts), "batch_size": args.batch_size,
                          "ms_median": None, "ms_min": None, "ms_max": None, "nodes_per_batch": None,
                          "edges_per_batch": None, "skipped": reason})
    return cases, dgl_by_fanouts, dgl_info, reason


def sampler_ratios(dense_by_fanouts: dict, ref_by_fanouts: dict, dgl_by_fanouts: dict) -> dict:
    """Per fanout setting: the reference's and DGL's median over DENSE's, and DGL's CPU time over DENSE's."""
    ratios = {}
    for fanouts in FANOUT_CASES:
        key = ",".join(map(str, fanouts))
        dense_ms = dense_by_fanouts[fanouts]["ms_median"]
        r = {"reference_ms_over_dense_ms": round(ref_by_fanouts[fanouts]["ms_median"] / dense_ms, 2)}
        r["dgl_ms_over_dense_ms"] = (round(dgl_by_fanouts[fanouts]["ms_median"] / dense_ms, 2)
                                     if fanouts in dgl_by_fanouts else None)
        dgl_cpu = dgl_by_fanouts.get(fanouts, {}).get("cpu_ms_median")
        r["dgl_cpu_ms_over_dense_cpu_ms"] = (round(dgl_cpu / dense_by_fanouts[fanouts]["cpu_ms_median"], 2)
                                             if dgl_cpu else None)
        ratios[key] = r
    return ratios


def run_graphsage(args, graph, batches, workspace, num_nodes: int, budget: dict, log) -> list[dict]:
    """GraphSage forward + backward on DENSE and on the reference blocks (the first fanouts)."""
    import torch

    from graphstore.nn import GNN
    from graphstore.sample import sample_blocks, sample_dense

    sage = []
    torch.set_num_threads(1)
    fanouts = FANOUT_CASES[0]
    feats = torch.rand(num_nodes, 100, generator=torch.Generator().manual_seed(args.seed + 7))
    torch.manual_seed(args.seed)
    # graphstore.nn's GraphSage; the same module runs on DENSE and on reference blocks.
    model = GNN("sage", in_dim=100, hidden_dim=128, out_dim=128, num_layers=3)
    sage_budget = dict(budget, batches=min(budget["batches"], 10), min_batches=3,
                       budget_s=budget["budget_s"] / 2)
    for on in ("dense", "reference"):
        gen = torch.Generator().manual_seed(args.seed)
        prepared = []
        n_prep = sage_budget["warmup"] + sage_budget["batches"]
        for t in batches[:n_prep]:
            if on == "dense":
                d = sample_dense(graph, t, fanouts, generator=gen, workspace=workspace,
                                 backend=args.dense_backend)
                prepared.append((d, feats.index_select(0, d.node_ids), d.num_nodes, d.num_edges))
            else:
                blocks = sample_blocks(graph, t, fanouts, generator=gen)
                prepared.append((blocks, feats.index_select(0, blocks[0].src_nodes),
                                 int(blocks[0].src_nodes.numel()), sum(b.num_edges for b in blocks)))

        def step(item, on=on):
            model.zero_grad()
            s, x, _, _ = item
            out = model(x, s)
            out.square().mean().backward()
            return item[2], item[3]

        times, res, _ = run_batches(step, prepared, sage_budget["warmup"], sage_budget["batches"],
                                    sage_budget["min_batches"], sage_budget["budget_s"])
        entry = summarise(on, fanouts, args.batch_size, times, [r[0] for r in res], [r[1] for r in res],
                          model="graphstore.nn.GNN('sage'), 3 layers, 100->128->128->128", threads=1)
        sage.append(entry)
        log(f"graphsage fwd+bwd on {on}: {entry['ms_median']} ms")
        del prepared
    return sage


# ----------------------------------------------------------------------------- main

def machine_info(loadavg_at_start: list[float]) -> dict:
    return benchkit.machine_record("cpu", "cores", "python", "torch", "numpy", loadavg_at_start=loadavg_at_start,
                                   loadavg_at_end=list(os.getloadavg()), note=benchkit.SHARED_MACHINE_NOTE)


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small graph, few batches (under a minute)")
    p.add_argument("--json", required=True, help="where to write the results")
    p.add_argument("--cache-dir", default="/work/bench_sampling_cache")
    p.add_argument("--dgl-python", default=None, help="an interpreter with dgl (skips venv creation)")
    p.add_argument("--dgl-venv", default=str(REPO / ".venv-dgl"), help="DGL venv, created when missing")
    p.add_argument("--no-dgl", action="store_true", help="report the DGL cases as skipped")
    p.add_argument("--no-sage", action="store_true", help="skip the GraphSage forward+backward timing")
    p.add_argument("--nodes", type=int, default=None)
    p.add_argument("--edges", type=int, default=None)
    p.add_argument("--gamma", type=float, default=2.3, help="power-law exponent of the degree sequence")
    p.add_argument("--max-degree", type=float, default=None, help="cap on a node's expected degree")
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--batches", type=int, default=None, help="timed batches per case (at most)")
    p.add_argument("--budget-s", type=float, default=None, help="stop timing a case after this long")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dense-backend", default="auto", choices=("auto", "native", "torch"),
                   help="sample_dense's backend (auto: the compiled kernel when built)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    loadavg_at_start = list(os.getloadavg())

    import torch

    from graphstore.sample import new_workspace

    quick = args.quick
    num_nodes = args.nodes or (1 << 17 if quick else 1 << 21)
    num_edges = args.edges or 20 * num_nodes
    if args.max_degree is None:
        args.max_degree = 2000.0 if quick else 10000.0
    budget = {"warmup": 2 if quick else 3, "batches": args.batches or (10 if quick else 30),
              "min_batches": 3 if quick else 5, "budget_s": args.budget_s or (3.0 if quick else 60.0)}
    cache = Path(args.cache_dir) / ("quick" if quick else "full")
    t_start = time.perf_counter()
    log = benchkit.elapsed_logger(sys.stderr)

    torch.set_num_threads(2)
    graph, graph_info, batches = build_graph(args, cache, num_nodes, num_edges,
                                             budget["warmup"] + budget["batches"], log)
    workspace = new_workspace(graph)
    cases, dense_by_fanouts, ref_by_fanouts = run_local_cases(args, graph, batches, workspace, budget, log)
    dgl_cases, dgl_by_fanouts, dgl_info, reason = run_dgl_cases(args, cache, num_nodes, budget, log)
    cases += dgl_cases
    ratios = sampler_ratios(dense_by_fanouts, ref_by_fanouts, dgl_by_fanouts)
    sage = [] if args.no_sage else run_graphsage(args, graph, batches, workspace, num_nodes, budget, log)
    if len(sage) == 2:
        ratios["graphsage_reference_ms_over_dense_ms"] = round(sage[1]["ms_median"] / sage[0]["ms_median"], 2)

    result = {"cases": cases, "graph": graph_info, "ratios": ratios, "graphsage": sage,
              "dgl": dgl_info or {"skipped": reason}, "machine": machine_info(loadavg_at_start),
              "settings": {"quick": quick, "command": benchkit.command_line("tools/bench_sampling.py", argv),
                           "fanouts_order": "fanouts[0] is the hop nearest the targets (DGL gets the reverse)",
                           "threads": 1, **budget, "wall_s": round(time.perf_counter() - t_start, 1)}}
    benchkit.write_json(Path(args.json), result)
    log(f"wrote {args.json}; ratios {ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
