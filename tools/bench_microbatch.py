"""Micro-batching (Betty): redundancy, split time, memory estimate and epoch time per strategy.

Usage::

    python tools/bench_microbatch.py [--quick] --json OUT.json [--work-dir DIR]
                                     [--datasets amazon_photo,synthetic] [--ks 2,4,8,16,32]
                                     [--memory-kinds gat,gcn,gin,rgcn,sage]
                                     [--hub-ks 2,8,32] [--hub-thresholds 64,256,1024,none]

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
  random seeded with the batch index; ``reg`` with ``reg_hops`` 1 and ``hub_threshold`` 64,
  the library defaults, recorded in ``settings``):

  - ``total_inputs``: input nodes summed over the K micro-batches, mean over the batches
    (``total_inputs_per_batch`` lists them; ``redundancy`` = ``total_inputs`` over the whole
    batch's input nodes);
  - ``split_s``: time of `split_dense` (partition + building the micro-batches), mean;
  - memory, on the first batch: the micro-batch with the largest estimated total
    (`estimate_step_memory`, Adam) is measured (`measure_step_memory`): one forward, loss,
    backward and Adam step on a copy of the model whose Adam state already exists and
    whose gradients are None. ``measured_peak_bytes`` is the allocator's peak during that
    step above what it held before (``peak_source``: ``"cpu_allocator"``, the CPU
    allocator's events from ``torch.profiler``, or ``"cuda_allocator"``,
    ``torch.cuda.max_memory_allocated``); ``est_peak_bytes`` the estimate of it;
    ``est_error`` = est / measured - 1 (``est_minus_measured_bytes`` the difference).
    ``held_bytes`` (inputs, the DENSE's index tensors, parameters, Adam state; the same in
    both) plus the peak is the step's total (``measured_total_bytes``, ``est_total_bytes``,
    ``est_total_error``).
    ``saved_tensor_bytes`` is the other figure: inputs + the tensors autograd saves +
    parameters + gradients + Adam state (``est_saved_tensor_bytes`` reproduces it to the
    byte); ``total_over_saved`` = measured total / saved-tensor sum;
  - ``epoch_s``: one training epoch over the batches (split, `micro_batch_backward`, one
    Adam step per batch; sampling and the feature gather excluded, being the same for every
    case), the fastest of ``--repeats`` epochs (default 2, all in ``epoch_s_repeats``;
    ``split_s`` is from that epoch), and ``train_s`` = its part without the split;
    ``epoch_cpu_s`` is that epoch's process CPU time, which other jobs on a shared machine
    inflate less.

  ``baselines`` holds the unsplit batch (K = 1) per dataset: its inputs, memory and epoch.
* **Memory per layer type.** ``memory_cases``: for every layer type in
  ``--memory-kinds`` (default all of `graphstore.nn.LAYERS`) and K in 1 and ``--ks``, the
  first batch split with ``reg``, the same 3-layer model shape (hidden 128, Adam, no
  dropout; GAT with 4 heads, RGCN with 4 random relation types per sampled edge and 2
  bases, GCN given the whole batch's sampled degrees as `micro_batch_backward` is), the
  largest micro-batch measured as above. Untrained: memory does not depend on weights.
* **Hub threshold.** ``hub_threshold_cases``: REG departs from Betty's ``C = A^T A`` by
  leaving out nodes shared by more than ``hub_threshold`` targets (each adds H * (H - 1)
  entries). For ``reg`` on the same batches and seeds as the cases, every K in ``--hub-ks``
  (full: 2, 8, 32; quick: 8) and threshold in ``--hub-thresholds`` (full: 64 = the default,
  256, 1024, ``none``; quick: 64, none; ``none`` = the batch's target count + 1, so no node
  is left out: exact ``A^T A``): ``total_inputs`` (mean over the batches, as the cases;
  the default's equals the ``reg`` case's), ``split_s`` (`split_dense` with that
  threshold, the fastest of ``--repeats`` per batch, mean over the batches),
  ``target_graph_s`` (the REG alone, timed the same way), ``metis_entries`` (entries of the
  target graph METIS receives, both directions: the length of ``_reg_edges``'s output,
  mean over the batches), and per batch ``hub_nodes_per_batch`` (nodes left out, shared by
  more targets than the threshold) and ``max_shared_per_batch`` (the most targets sharing
  one node). ``hub_threshold_summary`` gives, per dataset and K, the default against exact
  ``A^T A``: inputs, METIS entries and split time, and ``inputs_default_over_exact`` =
  default / exact - 1 (negative: the default needs fewer inputs).

The JSON: ``{"cases": [...], "baselines": [...], "memory_cases": [...],
"hub_threshold_cases": [...], "hub_threshold_summary": {...}, "datasets": {...},
"goals": {...}, "settings": {...}, "machine": {...}}``. ``goals`` checks, per dataset and
K, that ``reg`` has fewer total inputs than every other strategy; ``goals["memory"]``
gives, per layer type, the largest estimator error against the allocator's peak over
both datasets and every K, and ``est_error_under_5pct`` whether every case is under 5 %.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from graphstore.nn import (
    GNN,
    LAYERS,
    estimate_step_memory,
    layer_degrees,
    measure_step_memory,
    micro_batch_backward,
)
from graphstore.sample import Batch, CSCGraph, sample_dense, split_dense, total_inputs
from graphstore.sample.microbatch import DEFAULT_HUB_THRESHOLD, _closures, _reg_edges

try:
    from tools import benchkit
    from tools.bench_sampling import chung_lu
except ImportError:  # run as a script: tools/ is on sys.path
    import benchkit
    from bench_sampling import chung_lu

STRATEGIES = ("reg", "metis", "random", "range")
FANOUTS = (10, 10, 10)
HIDDEN = 128
GAT_HEADS = 4
RGCN_RELATIONS, RGCN_BASES = 4, 2
UNDER = 0.05  # the estimator's error goal against the allocator's peak
# reg's settings in the strategy and memory cases (the library defaults), passed explicitly
# so that what settings records is what ran.
REG_HOPS = 1
HUB_THRESHOLD = DEFAULT_HUB_THRESHOLD
AMAZON_SOURCE = REPO.parent / "shared" / "data" / "amazon_photo" / "amazon-photo.zip"


# ---------------------------------------------------------------------------- datasets

def load_amazon(work_dir: Path, source: Path) -> tuple[CSCGraph, torch.Tensor, torch.Tensor, dict]:
    """Convert Amazon Photo once into ``work_dir`` and read it whole."""
    import graphstore
    from graphstore.layout.dtypes import decode

    out = work_dir / "amazon_photo.gs"
    if not out.exists():  # converted once; later runs reuse it
        subprocess.run([sys.executable, "-m", "graphstore", "convert", str(source), str(out),
                        "--partitions", "8"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    with graphstore.open(out) as store:
        src = torch.from_numpy(np.asarray(store.array("edges/src")[...], dtype=np.int64))
        dst = torch.from_numpy(np.asarray(store.array("edges/dst")[...], dtype=np.int64))
        features = torch.from_numpy(decode(store.features[...], store.manifest.feature_dtype))  # bfloat16: its bits
        labels = torch.from_numpy(np.asarray(store.labels[...], dtype=np.int64))
        n = store.num_nodes
    graph = CSCGraph.from_edges(src, dst, n, out_edges=False)
    meta = {"source": str(source), "store": str(out), "num_nodes": n, "num_edges": graph.num_edges,
            "feature_dim": features.shape[1], "num_classes": int(labels.max()) + 1}
    return graph, features, labels, meta


def load_synthetic(num_nodes: int, num_edges: int, *, feature_dim: int, num_classes: int,
                   seed: int) -> tuple[CSCGraph, torch.Tensor, torch.Tensor, dict]:
    """A Chung-Lu graph (power law 2.5, expected degree capped at 2,000) with random data."""
    src, dst = chung_lu(num_nodes, num_edges, gamma=2.5, max_degree=2000.0, seed=seed)
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

def new_model(in_dim: int, out_dim: int, seed: int, kind: str = "sage") -> tuple[GNN, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = GNN(kind, in_dim=in_dim, hidden_dim=HIDDEN, out_dim=out_dim, num_layers=len(FANOUTS),
                heads=GAT_HEADS, num_relations=RGCN_RELATIONS, num_bases=RGCN_BASES)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _error(est: int, measured: int) -> float:
    return round(est / measured - 1.0, 6)


def peak_memory(model: GNN, batch: Batch, parts, *, edge_type: torch.Tensor | None = None,
                degrees: torch.Tensor | None = None) -> dict:
    """Estimate every micro-batch; measure the one with the largest estimated total.

    ``edge_type`` / ``degrees`` are the whole batch's (RGCN / GCN), sliced per micro-batch
    as `micro_batch_backward` slices them.
    """
    estimates = [estimate_step_memory(model, p.dense) for p in parts]
    top = int(np.argmax([e.total_bytes for e in estimates]))
    est, part = estimates[top], parts[top]
    sub = part.batch(batch)
    kwargs = {}
    if edge_type is not None:
        kwargs["edge_type"] = edge_type[part.edges]
    if degrees is not None:
        kwargs["degrees"] = degrees[part.rows]
    got = measure_step_memory(model, part.dense, sub.features, sub.labels, **kwargs)
    if got.held_bytes != est.held_bytes:  # both count the same tensors: a mismatch is a bug
        raise AssertionError(f"held bytes differ: estimate {est.held_bytes}, measured {got.held_bytes}")
    return {"peak_source": got.peak_source,
            "est_peak_bytes": est.peak_bytes, "measured_peak_bytes": got.peak_bytes,
            "est_error": _error(est.peak_bytes, got.peak_bytes),
            "est_minus_measured_bytes": est.peak_bytes - got.peak_bytes,
            "held_bytes": got.held_bytes,
            "est_total_bytes": est.total_bytes, "measured_total_bytes": got.total_bytes,
            "est_total_error": _error(est.total_bytes, got.total_bytes),
            "saved_tensor_bytes": got.saved_tensor_bytes, "est_saved_tensor_bytes": est.saved_tensor_bytes,
            "total_over_saved": round(got.total_bytes / got.saved_tensor_bytes, 4),
            "largest_inputs": int(part.dense.num_nodes), "largest_edges": int(part.dense.num_edges)}


def run_memory(name: str, batch: Batch, ks: list[int], kinds: list[str], *, in_dim: int, out_dim: int,
               seed: int) -> list[dict]:
    """The estimate against the allocator's peak for every layer type and K (reg split)."""
    t = batch.dense.num_targets
    gen = torch.Generator().manual_seed(seed)
    edge_type = torch.randint(RGCN_RELATIONS, (batch.dense.num_edges,), generator=gen)
    degrees = layer_degrees(batch.dense)[0]
    splits = {}
    for k in [1] + [k for k in ks if k != 1]:
        splits[min(k, t)] = split_dense(batch.dense, min(k, t), strategy="reg", seed=seed, reg_hops=REG_HOPS,
                                        hub_threshold=HUB_THRESHOLD)
    cases = []
    for kind in kinds:
        model, _ = new_model(in_dim, out_dim, seed, kind)
        for k, parts in splits.items():
            t0 = time.perf_counter()
            memory = peak_memory(model, batch, parts, edge_type=edge_type if kind == "rgcn" else None,
                                 degrees=degrees if kind == "gcn" else None)
            cases.append({"dataset": name, "kind": kind, "k": k, "strategy": "reg", **memory,
                          "measure_s": round(time.perf_counter() - t0, 2)})
            print(f"{name} {kind} k={k}: peak est {memory['est_peak_bytes'] / 2**20:.1f} MiB, measured "
                  f"{memory['measured_peak_bytes'] / 2**20:.1f} MiB ({100 * memory['est_error']:+.2f} %), "
                  f"saved-tensor sum x{memory['total_over_saved']:.3f}", file=sys.stderr)
    return cases


def run_epoch(model: GNN, opt: torch.optim.Optimizer, batches: list[Batch], k: int, strategy: str, *,
              seed: int, measure: bool) -> dict:
    """One training epoch over ``batches``, each split into ``k`` micro-batches."""
    inputs, split_times, train_times, memory = [], [], [], None
    # Process CPU time too: other jobs on a shared machine inflate it less than wall time.
    cpu = 0.0
    for b, batch in enumerate(batches):
        c0 = time.process_time()
        t0 = time.perf_counter()
        parts = split_dense(batch.dense, k, strategy=strategy, seed=seed + b, reg_hops=REG_HOPS,
                            hub_threshold=HUB_THRESHOLD)
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


def _shared_counts(batch: Batch) -> torch.Tensor:
    """How many targets' ``REG_HOPS`` closures hold each node (REG's H per node)."""
    dense = batch.dense
    blocks = _closures(dense, torch.arange(dense.num_targets, device=dense.node_ids.device), REG_HOPS)
    return torch.unique(torch.cat([index for _, index in blocks]), return_counts=True)[1]


def _fastest(fn, repeats: int) -> tuple[float, object]:
    """The fastest of ``repeats`` calls (seconds) and the last call's result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run_hub_thresholds(name: str, batches: list[Batch], ks: list[int], thresholds: list[int | None], *,
                       seed: int, repeats: int) -> list[dict]:
    """``reg`` at every K and hub threshold (None: exact A^T A) on the cases' batches and seeds."""
    shared = [_shared_counts(b) for b in batches]
    cases = []
    for k in ks:
        for threshold in thresholds:
            inputs, split, graph, entries, hubs, values = [], [], [], [], [], []
            for b, batch in enumerate(batches):
                dense = batch.dense
                kk = min(k, dense.num_targets)
                # A node is in at most T closures: a threshold above T leaves none out.
                value = dense.num_targets + 1 if threshold is None else threshold
                split_s, parts = _fastest(functools.partial(split_dense, dense, kk, strategy="reg", seed=seed + b,
                                                            reg_hops=REG_HOPS, hub_threshold=value), repeats)
                graph_s, (src, _, _) = _fastest(functools.partial(_reg_edges, dense, REG_HOPS, value),
                                                repeats)
                inputs.append(total_inputs(parts))
                split.append(split_s)
                graph.append(graph_s)
                entries.append(int(src.numel()))
                hubs.append(int((shared[b] > value).sum()))
                values.append(value)
            case = {"dataset": name, "strategy": "reg", "k": min(k, batches[0].dense.num_targets),
                    "hub_threshold": "none" if threshold is None else threshold,
                    "hub_threshold_value_per_batch": values, "reg_hops": REG_HOPS,
                    "total_inputs": round(statistics.fmean(inputs)), "total_inputs_per_batch": inputs,
                    "split_s": round(statistics.fmean(split), 5),
                    "target_graph_s": round(statistics.fmean(graph), 5),
                    "metis_entries": round(statistics.fmean(entries)), "metis_entries_per_batch": entries,
                    "hub_nodes_per_batch": hubs, "max_shared_per_batch": [int(c.max()) for c in shared],
                    "batches": len(batches)}
            cases.append(case)
            print(f"{name} k={k} hub_threshold={case['hub_threshold']}: inputs {case['total_inputs']:,} "
                  f"split {1e3 * case['split_s']:.1f} ms, METIS entries {case['metis_entries']:,}, "
                  f"hubs left out {hubs}", file=sys.stderr)
    return cases


def hub_threshold_summary(rows: list[dict]) -> dict:
    """Per dataset and K: the default hub threshold against exact A^T A ("none")."""
    out = {}
    for d in rows:
        if d["hub_threshold"] != HUB_THRESHOLD:
            continue
        exact = next((e for e in rows if e["dataset"] == d["dataset"] and e["k"] == d["k"]
                      and e["hub_threshold"] == "none"), None)
        if exact is None:
            continue
        out[f"{d['dataset']}/k={d['k']}"] = {
            "default_hub_threshold": HUB_THRESHOLD,
            "inputs_default": d["total_inputs"], "inputs_exact": exact["total_inputs"],
            "inputs_default_over_exact": round(d["total_inputs"] / exact["total_inputs"] - 1.0, 5),
            "metis_entries_default": d["metis_entries"], "metis_entries_exact": exact["metis_entries"],
            "split_ms_default": round(1e3 * d["split_s"], 2), "split_ms_exact": round(1e3 * exact["split_s"], 2),
            "batches_with_hubs_left_out": sum(h > 0 for h in d["hub_nodes_per_batch"]),
            "batches": d["batches"]}
    return out


def memory_goals(rows: list[dict]) -> dict:
    """Per layer type: the largest estimator errors (peak above held, and total) against the
    allocator, and how far the saved-tensor sum falls short of the total."""
    per_kind = {}
    for kind in sorted({c["kind"] for c in rows}):
        mine = [c for c in rows if c["kind"] == kind]
        worst = max(mine, key=lambda c: abs(c["est_error"]))
        per_kind[kind] = {
            "cases": len(mine),
            "max_abs_est_error": abs(worst["est_error"]),
            "worst_case": {"dataset": worst["dataset"], "k": worst["k"], "strategy": worst["strategy"]},
            "max_abs_est_total_error": max(abs(c["est_total_error"]) for c in mine),
            "max_total_over_saved": max(c["total_over_saved"] for c in mine),
            "under_5pct": all(abs(c["est_error"]) < UNDER for c in mine)}
    return per_kind


def goals(cases: list[dict], baselines: list[dict] | None = None, memory_cases: list[dict] | None = None) -> dict:
    """Per dataset and K: does reg need fewer inputs than every other strategy; per layer
    type, the estimator's error against the allocator's peak."""
    fewest = {}
    for c in cases:
        if c["strategy"] != "reg":
            continue
        others = {o["strategy"]: o["total_inputs"] for o in cases
                  if o["dataset"] == c["dataset"] and o["k"] == c["k"] and o["strategy"] != "reg"}
        fewest[f"{c['dataset']}/k={c['k']}"] = {
            "reg": c["total_inputs"], **others,
            "reg_fewest": all(c["total_inputs"] < v for v in others.values())}
    # Every measured step: the sage strategy cases, the unsplit batches, the per-layer cases.
    rows = ([dict(c, kind="sage") for c in cases]
            + [dict(b, kind="sage", k=1, strategy="(whole batch)") for b in baselines or []]
            + list(memory_cases or []))
    errors = [abs(c["est_error"]) for c in rows]
    return {"reg_fewest_inputs": fewest,
            "reg_fewest_everywhere": all(v["reg_fewest"] for v in fewest.values()),
            "peak_sources": sorted({c["peak_source"] for c in rows}),
            "max_abs_est_error": max(errors) if errors else None,
            "est_error_under_5pct": bool(errors) and max(errors) < UNDER,
            "not_under_5pct": [{k: c[k] for k in ("dataset", "kind", "k", "strategy", "est_error")}
                               for c in rows if abs(c["est_error"]) >= UNDER],
            "memory": memory_goals(rows)}


def print_table(cases: list[dict], baselines: list[dict], memory_cases: list[dict]) -> None:
    base = {b["dataset"]: b for b in baselines}
    print("| dataset | K | strategy | total inputs | x whole | split ms | epoch s | peak est MiB | "
          "peak measured MiB | est err | total MiB | x saved-tensor sum |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in [dict(b, k=1, strategy="(whole batch)", split_s=None) for b in baselines] + cases:
        split = "-" if c["split_s"] is None else f"{1e3 * c['split_s']:.1f}"
        print(f"| {c['dataset']} | {c['k']} | {c['strategy']} | {c['total_inputs']:,} | "
              f"{c['total_inputs'] / base[c['dataset']]['total_inputs']:.2f} | {split} | "
              f"{c['epoch_s']:.2f} | {c['est_peak_bytes'] / 2**20:.1f} | "
              f"{c['measured_peak_bytes'] / 2**20:.1f} | {100 * c['est_error']:+.2f} % | "
              f"{c['measured_total_bytes'] / 2**20:.1f} | {c['total_over_saved']:.3f} |")
    print()
    print("| dataset | layer | K | largest inputs | peak est MiB | peak measured MiB | est err | "
          "total MiB | total err | x saved-tensor sum |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in memory_cases:
        print(f"| {c['dataset']} | {c['kind']} | {c['k']} | {c['largest_inputs']:,} | "
              f"{c['est_peak_bytes'] / 2**20:.1f} | {c['measured_peak_bytes'] / 2**20:.1f} | "
              f"{100 * c['est_error']:+.3f} % | {c['measured_total_bytes'] / 2**20:.1f} | "
              f"{100 * c['est_total_error']:+.3f} % | {c['total_over_saved']:.3f} |")


def print_hub_table(rows: list[dict]) -> None:
    if not rows:
        return
    print()
    print("| dataset | K | hub threshold | total inputs | split ms | REG ms | METIS entries | hubs left out |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for c in rows:
        print(f"| {c['dataset']} | {c['k']} | {c['hub_threshold']} | {c['total_inputs']:,} | "
              f"{1e3 * c['split_s']:.1f} | {1e3 * c['target_graph_s']:.1f} | {c['metis_entries']:,} | "
              f"{c['hub_nodes_per_batch']} |")


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
    p.add_argument("--memory-kinds", default=",".join(LAYERS),
                   help="layer types of the memory cases (comma-separated; empty: none)")
    p.add_argument("--hub-ks", help="K of the hub-threshold cases (comma-separated; default 2,8,32, quick 8; "
                   "empty: none)")
    p.add_argument("--hub-thresholds", help="hub thresholds of those cases, 'none' = exact A^T A (default "
                   "64,256,1024,none, quick 64,none)")
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


def resolve_options(args) -> str | None:
    """Fill in the defaults that depend on ``--quick`` and parse the lists; a usage error's
    message, or None."""
    args.num_batches = args.batches or (1 if args.quick else 3)
    args.repeats = args.repeats or (1 if args.quick else 2)
    args.batch_size = args.batch_size or (128 if args.quick else 1024)
    args.synthetic_nodes = args.synthetic_nodes or (5_000 if args.quick else 500_000)
    args.ks = [int(k) for k in args.ks.split(",")]
    # Quick is a CI smoke run: the small synthetic graph alone needs no shared data.
    datasets_arg = args.datasets or ("synthetic" if args.quick else "amazon_photo,synthetic")
    args.names = [d for d in datasets_arg.split(",") if d]
    unknown = set(args.names) - {"amazon_photo", "synthetic"}
    if unknown:
        return f"unknown dataset(s) {sorted(unknown)}; known: amazon_photo, synthetic"
    hub_ks_arg = args.hub_ks if args.hub_ks is not None else ("8" if args.quick else "2,8,32")
    args.hub_ks = [int(k) for k in hub_ks_arg.split(",") if k]
    thresholds_arg = args.hub_thresholds or ("64,none" if args.quick else "64,256,1024,none")
    args.thresholds = [None if h.strip().lower() == "none" else int(h) for h in thresholds_arg.split(",") if h]
    if any(h is not None and h < 2 for h in args.thresholds):
        return f"hub thresholds must be at least 2 or 'none' (got {thresholds_arg})"
    args.kinds = [k for k in args.memory_kinds.split(",") if k]
    if set(args.kinds) - set(LAYERS):
        return f"unknown layer type(s) {sorted(set(args.kinds) - set(LAYERS))}; known: {', '.join(LAYERS)}"
    return None


def run_dataset(name: str, args, out: dict) -> None:
    """Every case of one dataset, appended to ``out``'s lists; its description (or why it was
    skipped) in ``out["datasets"]``."""
    t0 = time.perf_counter()
    if name == "amazon_photo":
        if not args.amazon_source.exists():
            out["datasets"][name] = {"skipped": f"{args.amazon_source} not found"}
            print(f"{name}: skipped ({args.amazon_source} not found)", file=sys.stderr)
            return
        graph, features, labels, meta = load_amazon(args.work_dir, args.amazon_source)
    else:
        graph, features, labels, meta = load_synthetic(
            args.synthetic_nodes, args.synthetic_nodes * args.synthetic_degree, feature_dim=64, num_classes=16,
            seed=args.seed)
    batches = make_batches(graph, features, labels, num_batches=args.num_batches, batch_size=args.batch_size,
                           seed=args.seed)
    meta["load_s"] = round(time.perf_counter() - t0, 2)
    out["datasets"][name] = meta
    in_dim, out_dim = features.shape[1], meta["num_classes"]
    out["baselines"].append(run_baseline(name, batches, in_dim=in_dim, out_dim=out_dim, seed=args.seed,
                                         repeats=args.repeats))
    for k in args.ks:
        for strategy in STRATEGIES:
            case = run_case(name, batches, min(k, batches[0].dense.num_targets), strategy,
                            in_dim=in_dim, out_dim=out_dim, seed=args.seed, repeats=args.repeats)
            out["cases"].append(case)
            print(f"{name} k={k} {strategy}: inputs {case['total_inputs']:,} "
                  f"split {case['split_s']:.3f}s epoch {case['epoch_s']:.2f}s "
                  f"est {case['est_error']:+.4f}", file=sys.stderr)
    out["memory_cases"] += run_memory(name, batches[0], args.ks, args.kinds, in_dim=in_dim, out_dim=out_dim,
                                      seed=args.seed)
    out["hub_cases"] += run_hub_thresholds(name, batches, args.hub_ks, args.thresholds, seed=args.seed,
                                           repeats=args.repeats)


def settings(args) -> dict:
    return {"quick": args.quick, "fanouts": list(FANOUTS), "model": "sage", "num_layers": len(FANOUTS),
            "hidden_dim": HIDDEN, "dropout": 0.0, "optimizer": "adam", "dtype": "float32",
            "memory_kinds": args.kinds, "gat_heads": GAT_HEADS, "rgcn_relations": RGCN_RELATIONS,
            "rgcn_bases": RGCN_BASES, "memory_strategy": "reg",
            "reg_hops": REG_HOPS, "hub_threshold": HUB_THRESHOLD,
            "hub_threshold_ks": args.hub_ks,
            "hub_thresholds": ["none" if h is None else h for h in args.thresholds],
            "batches": args.num_batches, "batch_size": args.batch_size, "ks": args.ks, "repeats": args.repeats,
            "threads": args.threads, "seed": args.seed}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    error = resolve_options(args)
    if error:
        print(error, file=sys.stderr)
        return 2
    args.work_dir.mkdir(parents=True, exist_ok=True)
    out = {"cases": [], "baselines": [], "memory_cases": [], "hub_cases": [], "datasets": {}}
    for name in args.names:
        run_dataset(name, args, out)
    cases, baselines, memory_cases, hub_cases = out["cases"], out["baselines"], out["memory_cases"], out["hub_cases"]
    result = {"cases": cases, "baselines": baselines, "memory_cases": memory_cases,
              "hub_threshold_cases": hub_cases, "hub_threshold_summary": hub_threshold_summary(hub_cases),
              "datasets": out["datasets"], "goals": goals(cases, baselines, memory_cases),
              "settings": settings(args),
              "machine": benchkit.machine_record("python", "torch", "cpu_count", "platform")}
    benchkit.write_json(args.json, result)
    print_table(cases, baselines, memory_cases)
    print_hub_table(hub_cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
