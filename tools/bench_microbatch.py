"""Micro-batching (Betty): redundancy, split time, memory estimate and epoch time per strategy.

Usage::

    python tools/bench_microbatch.py [--quick] --json OUT.json [--work-dir DIR]
                                     [--datasets amazon_photo,synthetic] [--ks 2,4,8,16,32]

What it does, per dataset:

* **Datasets.** ``amazon_photo``: ``../shared/data/amazon_photo/amazon-photo.zip`` converted
  once with ``python -m graphstore convert ... --partitions 8`` into ``--work-dir`` (default
  ``/work/bench_microbatch``) and read whole into memory (7,650 nodes, 238k edges both ways,
  745 features, 8 classes); skipped with a note when the source is missing. ``synthetic``:
  a directed Chung-Lu power-law graph built in memory (`bench_sampling.chung_lu`; full:
  500,000 nodes and 5M edges, ``--quick``: 5,000 and 50,000), random float32 features
  [N, 64] and 16 random classes. Node ids are store ids (METIS-partitioned for Amazon).
* **Batches.** ``--batches`` batches of ``--batch-size`` targets (full: 3 x 1024, quick:
  1 x 128, synthetic only unless ``--datasets`` says otherwise) drawn without replacement
  from a seeded permutation of all nodes, in that shuffled order (as a shuffling loader
  yields them; ``range`` slices this order). Each is sampled once with fanouts (10, 10, 10)
  (``fanouts[0]`` nearest the targets), so every strategy and K splits the same DENSE.
* **Model.** 3-layer GraphSage (`graphstore.nn.GNN("sage")`, hidden 128, no dropout),
  float32, Adam; re-initialised from the same seed for every case. One torch thread by
  default (``--threads``).
* **Cases.** Every K in ``--ks`` and strategy in reg / metis / random / range (METIS and
  random seeded with the batch index):

  - ``total_inputs``: input nodes summed over the K micro-batches, mean over the batches
    (``total_inputs_per_batch`` lists them; ``redundancy`` = ``total_inputs`` over the whole
    batch's input nodes);
  - ``split_s``: time of `split_dense` (partition + building the micro-batches), mean;
  - ``est_peak_bytes`` / ``measured_peak_bytes``: on the first batch, the micro-batch with
    the largest estimate (`estimate_step_memory`, Adam) is measured
    (`measure_step_memory`, CPU: saved-for-backward tensors + inputs + parameters,
    gradients and Adam state); ``est_error`` = est / measured - 1;
  - ``epoch_s``: one training epoch over the batches (split, `micro_batch_backward`, one
    Adam step per batch; sampling and the feature gather excluded, being the same for every
    case), the fastest of ``--repeats`` epochs (default 2, all in ``epoch_s_repeats``;
    ``split_s`` is from that epoch), and ``train_s`` = its part without the split;
    ``epoch_cpu_s`` is that epoch's process CPU time, which other jobs on a shared machine
    inflate less.

  ``baselines`` holds the unsplit batch (K = 1) per dataset: its inputs, memory and epoch.

The JSON: ``{"cases": [...], "baselines": [...], "datasets": {...}, "goals": {...},
"settings": {...}, "machine": {...}}``. ``goals`` checks, per dataset and K, that ``reg``
has fewer total inputs than every other strategy, and the largest estimator error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from graphstore.nn import GNN, estimate_step_memory, measure_step_memory, micro_batch_backward  # noqa: E402
from graphstore.sample import Batch, CSCGraph, sample_dense, split_dense, total_inputs  # noqa: E402

STRATEGIES = ("reg", "metis", "random", "range")
FANOUTS = (10, 10, 10)
HIDDEN = 128
AMAZON_SOURCE = REPO.parent / "shared" / "data" / "amazon_photo" / "amazon-photo.zip"


def _bench_sampling():
    # tools/ is not a package: load the Chung-Lu generator from its file rather than copy it.
    spec = importlib.util.spec_from_file_location("bench_sampling", REPO / "tools" / "bench_sampling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------- datasets

def load_amazon(work_dir: Path, source: Path) -> tuple[CSCGraph, torch.Tensor, torch.Tensor, dict]:
    """Convert Amazon Photo once into ``work_dir`` and read it whole."""
    import graphstore

    out = work_dir / "amazon_photo.gs"
    if not out.exists():  # converted once; later runs reuse it
        subprocess.run([sys.executable, "-m", "graphstore", "convert", str(source), str(out),
                        "--partitions", "8"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    with graphstore.open(out) as store:
        src = torch.from_numpy(np.asarray(store.array("edges/src")[...], dtype=np.int64))
        dst = torch.from_numpy(np.asarray(store.array("edges/dst")[...], dtype=np.int64))
        features = torch.from_numpy(np.asarray(store.features[...], dtype=np.float32))
        labels = torch.from_numpy(np.asarray(store.labels[...], dtype=np.int64))
        n = store.num_nodes
    graph = CSCGraph.from_edges(src, dst, n, out_edges=False)
    meta = {"source": str(source), "store": str(out), "num_nodes": n, "num_edges": graph.num_edges,
            "feature_dim": features.shape[1], "num_classes": int(labels.max()) + 1}
    return graph, features, labels, meta


def load_synthetic(num_nodes: int, num_edges: int, *, feature_dim: int, num_classes: int,
                   seed: int) -> tuple[CSCGraph, torch.Tensor, torch.Tensor, dict]:
    """A Chung-Lu graph (power law 2.5, expected degree capped at 2,000) with random data."""
    src, dst = _bench_sampling().chung_lu(num_nodes, num_edges, gamma=2.5, max_degree=2000.0, seed=seed)
    graph = CSCGraph.from_edges(torch.from_numpy(src), torch.from_numpy(dst), num_nodes, out_edges=False)
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(num_nodes, feature_dim, generator=gen)
    labels = torch.randint(num_classes, (num_nodes,), generator=gen)
    meta = {"generator": "chung-lu (tools/bench_sampling.py)", "gamma": 2.5, "max_degree": 2000.0,
            "seed": seed, "num_nodes": num_nodes, "num_edges": num_edges, "feature_dim": feature_dim,
            "num_classes": num_classes}
    return graph, features, labels, meta


def make_batches(graph: CSCGraph, features: torch.Tensor, labels: torch.Tensor, *, num_batches: int,
                 batch_size: int, seed: int) -> list[Batch]:
    """Sample the fixed target set once, so every case splits the same DENSEs."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(graph.num_nodes, generator=gen)
    batch_size = min(batch_size, graph.num_nodes // num_batches)
    out = []
    for b in range(num_batches):
        targets = order[b * batch_size:(b + 1) * batch_size]
        dense = sample_dense(graph, targets, FANOUTS, generator=torch.Generator().manual_seed(seed + b))
        out.append(Batch(dense, features.index_select(0, dense.node_ids),
                         labels.index_select(0, dense.targets)))
    return out


# ---------------------------------------------------------------------------- cases

def new_model(in_dim: int, out_dim: int, seed: int) -> tuple[GNN, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = GNN("sage", in_dim=in_dim, hidden_dim=HIDDEN, out_dim=out_dim, num_layers=len(FANOUTS))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def peak_memory(model: GNN, batch: Batch, parts) -> dict:
    """Estimate every micro-batch; measure the one with the largest estimate."""
    estimates = [estimate_step_memory(model, p.dense).total_bytes for p in parts]
    top = int(np.argmax(estimates))
    sub = parts[top].batch(batch)
    measured = measure_step_memory(model, parts[top].dense, sub.features, sub.labels).total_bytes
    return {"est_peak_bytes": int(estimates[top]), "measured_peak_bytes": int(measured),
            "est_error": round(estimates[top] / measured - 1.0, 6),
            "largest_inputs": int(parts[top].dense.num_nodes)}


def run_epoch(model: GNN, opt: torch.optim.Optimizer, batches: list[Batch], k: int, strategy: str, *,
              seed: int, measure: bool) -> dict:
    """One training epoch over ``batches``, each split into ``k`` micro-batches."""
    inputs, split_times, train_times, memory = [], [], [], None
    # Process CPU time too: other jobs on a shared machine inflate it less than wall time.
    cpu = 0.0
    for b, batch in enumerate(batches):
        c0 = time.process_time()
        t0 = time.perf_counter()
        parts = split_dense(batch.dense, k, strategy=strategy, seed=seed + b)
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        micro_batch_backward(model, batch, parts)
        opt.step()
        t2 = time.perf_counter()
        cpu += time.process_time() - c0
        split_times.append(t1 - t0)
        train_times.append(t2 - t1)
        inputs.append(total_inputs(parts))
        if measure and b == 0:
            # Outside the timed span: measuring runs one more forward and backward pass.
            memory = peak_memory(model, batch, parts)
    return {"inputs": inputs, "split": split_times, "train": train_times, "cpu": cpu, "memory": memory}


def run_case(name: str, batches: list[Batch], k: int, strategy: str, *, in_dim: int, out_dim: int,
             seed: int, repeats: int) -> dict:
    model, opt = new_model(in_dim, out_dim, seed)
    epochs = [run_epoch(model, opt, batches, k, strategy, seed=seed, measure=r == 0) for r in range(repeats)]
    memory = epochs[0]["memory"]
    inputs = epochs[0]["inputs"]  # the same every repeat: the splits are seeded
    # The fastest repeat: on a shared machine the others carry more of other jobs' load.
    best = min(epochs, key=lambda e: sum(e["split"]) + sum(e["train"]))
    whole = statistics.fmean(b.dense.num_nodes for b in batches)
    mean_inputs = statistics.fmean(inputs)
    return {"dataset": name, "strategy": strategy, "k": k, "total_inputs": round(mean_inputs),
            "split_s": round(statistics.fmean(best["split"]), 5), **memory,
            "epoch_s": round(sum(best["split"]) + sum(best["train"]), 4),
            "train_s": round(sum(best["train"]), 4), "epoch_cpu_s": round(best["cpu"], 4),
            "epoch_s_repeats": [round(sum(e["split"]) + sum(e["train"]), 4) for e in epochs],
            "redundancy": round(mean_inputs / whole, 4), "total_inputs_per_batch": inputs,
            "batches": len(batches)}


def run_baseline(name: str, batches: list[Batch], *, in_dim: int, out_dim: int, seed: int,
                 repeats: int) -> dict:
    case = run_case(name, batches, 1, "range", in_dim=in_dim, out_dim=out_dim, seed=seed, repeats=repeats)
    case.pop("strategy")
    case["inputs_per_batch"] = [b.dense.num_nodes for b in batches]
    case["edges_per_batch"] = [b.dense.num_edges for b in batches]
    case["targets_per_batch"] = batches[0].dense.num_targets
    return case


def goals(cases: list[dict]) -> dict:
    """Per dataset and K: does reg need fewer inputs than every other strategy; estimator error."""
    fewest = {}
    for c in cases:
        if c["strategy"] != "reg":
            continue
        others = {o["strategy"]: o["total_inputs"] for o in cases
                  if o["dataset"] == c["dataset"] and o["k"] == c["k"] and o["strategy"] != "reg"}
        fewest[f"{c['dataset']}/k={c['k']}"] = {
            "reg": c["total_inputs"], **others,
            "reg_fewest": all(c["total_inputs"] < v for v in others.values())}
    errors = [abs(c["est_error"]) for c in cases]
    return {"reg_fewest_inputs": fewest,
            "reg_fewest_everywhere": all(v["reg_fewest"] for v in fewest.values()),
            "max_abs_est_error": max(errors) if errors else None,
            "est_error_under_5pct": bool(errors) and max(errors) < 0.05}


def print_table(cases: list[dict], baselines: list[dict]) -> None:
    base = {b["dataset"]: b for b in baselines}
    print("| dataset | K | strategy | total inputs | x whole | split ms | epoch s | est MiB | "
          "measured MiB | est err |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for b in baselines:
        print(f"| {b['dataset']} | 1 | (whole batch) | {b['total_inputs']:,} | 1.00 | - | "
              f"{b['epoch_s']:.2f} | {b['est_peak_bytes'] / 2**20:.1f} | "
              f"{b['measured_peak_bytes'] / 2**20:.1f} | "
              f"{100 * b['est_error']:+.2f} % |")
    for c in cases:
        print(f"| {c['dataset']} | {c['k']} | {c['strategy']} | {c['total_inputs']:,} | "
              f"{c['total_inputs'] / base[c['dataset']]['total_inputs']:.2f} | {1e3 * c['split_s']:.1f} | "
              f"{c['epoch_s']:.2f} | {c['est_peak_bytes'] / 2**20:.1f} | "
              f"{c['measured_peak_bytes'] / 2**20:.1f} | "
              f"{100 * c['est_error']:+.2f} % |")


# ---------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small synthetic graph, one small batch (CI smoke)")
    p.add_argument("--json", required=True, type=Path, help="write the results here")
    p.add_argument("--work-dir", type=Path, default=Path("/work/bench_microbatch"),
                   help="where the converted Amazon Photo store is kept")
    p.add_argument("--amazon-source", type=Path, default=AMAZON_SOURCE)
    p.add_argument("--datasets", help="comma-separated subset of amazon_photo,synthetic (default both; "
                   "quick: synthetic)")
    p.add_argument("--ks", default="2,4,8,16,32", help="numbers of micro-batches")
    p.add_argument("--batches", type=int, help="batches per case (default 3, quick 1)")
    p.add_argument("--batch-size", type=int, help="targets per batch (default 1024, quick 128)")
    p.add_argument("--synthetic-nodes", type=int, help="default 500,000 (quick 5,000)")
    p.add_argument("--synthetic-degree", type=int, default=10, help="mean in-degree of the synthetic graph")
    p.add_argument("--repeats", type=int, help="epochs per case, the fastest reported (default 2, quick 1)")
    # One thread: with two, a core taken by another job leaves OpenMP spinning, which
    # inflates even the CPU time several-fold on a shared machine.
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    num_batches = args.batches or (1 if args.quick else 3)
    repeats = args.repeats or (1 if args.quick else 2)
    batch_size = args.batch_size or (128 if args.quick else 1024)
    synthetic_nodes = args.synthetic_nodes or (5_000 if args.quick else 500_000)
    ks = [int(k) for k in args.ks.split(",")]
    # Quick is a CI smoke run: the small synthetic graph alone needs no shared data.
    datasets_arg = args.datasets or ("synthetic" if args.quick else "amazon_photo,synthetic")
    names = [d for d in datasets_arg.split(",") if d]
    unknown = set(names) - {"amazon_photo", "synthetic"}
    if unknown:
        print(f"unknown dataset(s) {sorted(unknown)}; known: amazon_photo, synthetic", file=sys.stderr)
        return 2
    args.work_dir.mkdir(parents=True, exist_ok=True)
    cases, baselines, datasets = [], [], {}
    for name in names:
        t0 = time.perf_counter()
        if name == "amazon_photo":
            if not args.amazon_source.exists():
                datasets[name] = {"skipped": f"{args.amazon_source} not found"}
                print(f"{name}: skipped ({args.amazon_source} not found)", file=sys.stderr)
                continue
            graph, features, labels, meta = load_amazon(args.work_dir, args.amazon_source)
        else:
            graph, features, labels, meta = load_synthetic(
                synthetic_nodes, synthetic_nodes * args.synthetic_degree, feature_dim=64, num_classes=16,
                seed=args.seed)
        batches = make_batches(graph, features, labels, num_batches=num_batches, batch_size=batch_size,
                               seed=args.seed)
        meta["load_s"] = round(time.perf_counter() - t0, 2)
        datasets[name] = meta
        in_dim, out_dim = features.shape[1], meta["num_classes"]
        baselines.append(run_baseline(name, batches, in_dim=in_dim, out_dim=out_dim, seed=args.seed,
                                      repeats=repeats))
        for k in ks:
            for strategy in STRATEGIES:
                case = run_case(name, batches, min(k, batches[0].dense.num_targets), strategy,
                                in_dim=in_dim, out_dim=out_dim, seed=args.seed, repeats=repeats)
                cases.append(case)
                print(f"{name} k={k} {strategy}: inputs {case['total_inputs']:,} "
                      f"split {case['split_s']:.3f}s epoch {case['epoch_s']:.2f}s "
                      f"est {case['est_error']:+.4f}", file=sys.stderr)
    result = {"cases": cases, "baselines": baselines, "datasets": datasets, "goals": goals(cases),
              "settings": {"quick": args.quick, "fanouts": list(FANOUTS), "model": "sage",
                           "num_layers": len(FANOUTS),
                           "hidden_dim": HIDDEN, "dropout": 0.0, "optimizer": "adam", "dtype": "float32",
                           "batches": num_batches, "batch_size": batch_size, "ks": ks, "repeats": repeats,
                           "threads": args.threads, "seed": args.seed},
              "machine": {"python": platform.python_version(), "torch": torch.__version__,
                          "cpu_count": os.cpu_count(), "platform": platform.platform()}}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print_table(cases, baselines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
