"""Scale: generate, convert, train and infer papers100M-shaped graphs of doubling sizes.

For each size, in order, each stage a child process (``--child``) after dropping the page
cache, inside a cgroup v1 memory cap (the page cache counted), measured by its own ``VmHWM``
and the cgroup's peak (`tools.benchkit.run_child`):

* ``generate``: tools/make_synthetic.py in the ``raw/data.npz`` layout of ogbn-papers100M
  (power-law degrees, ``--avg-degree`` 28: about 14 directed edges per node before the
  converter symmetrises them, communities and locality as bench_outofcore's store, features
  written as float16), uncapped: it is the benchmark's input, not its subject;
* ``convert``: ``python -m graphstore convert SOURCE STORE --feature-dtype float16`` with
  every other option its default (partitions from ``--partition-bytes``, the partitioner
  the graph's size picks), through the CLI's own ``main``, under ``--convert-cap-mib`` (4 GiB);
  the source is deleted once the store is written;
* ``epoch_megabatch``, ``epoch_disk``, ``epoch_macrobatch``: one epoch of a 2-layer GraphSage
  (bench_outofcore's model, fanouts and batch size) over a fixed, seeded subset of
  ``--targets`` training nodes (60,000), so an epoch's work is the same at every size, with
  the buffer's byte budget the cap less the process; macro-batching holds the whole structure
  in memory, so its cap is the training cap plus the structure's bytes;
* ``infer``: one layer of exact inference (`graphstore.inference.infer_layerwise`, a one-layer
  GraphSage) over every node, its outputs streamed away, under the training cap.

Every stage records ``s`` (the stage's own seconds: the child's wall time for generate and
convert, the epoch or the inference for the rest), ``process_s``, ``peak_rss_bytes``
(VmHWM), ``cgroup_peak_bytes`` (RSS + page cache), ``mem_cap_bytes`` and the run folder's
largest size while it ran (``disk_peak_bytes``, sampled every 5 s: the conversion's source,
staging and store together). A stage recorded in
``WORK/<run>/stages.json`` is not run again (resumable); the store is removed after a run's
last stage unless ``--keep-stores``.

A structure-heavy run (``--heavy-nodes``: features ``--heavy-feature-dim`` wide, default 4,
and ``--heavy-avg-degree``) stores many edges per byte of features; past 2**31 stored edges it
proves 64-bit edge counts through every stage, and its ``verify`` stage runs ``graphstore
verify`` over the whole store.

The fit (`fit_runs`): per stage, least squares of seconds on ``[1, stored_edges,
feature_bytes]`` (when the runs separate edges from feature bytes: a structure-heavy run does;
else on ``[1, stored_edges]``) and of peak RSS on ``[1, num_nodes]``, and the projection
(`project`) of every stage to ogbn-papers100M (111M nodes, 1.6B edges, 128-d) and MAG240M's
paper graph (122M nodes, 1.3B edges, 768-d), both float16 and stored symmetrised (twice the
edges). A run named in ``--timings-contended`` (its stages shared the machine with other
work, e.g. a long run at ``nice 19`` beside a session's own jobs) keeps its memory, its
counts and its checks in every fit and table, but not its seconds: they time the scheduler
as much as graphstore. ``projection_including_contended`` is the projection with them.

Usage::

    sudo .venv/bin/python tools/bench_scale.py --quick --json docs/benchmarks/scale_quick.json
    sudo nice -n 19 .venv/bin/python tools/bench_scale.py --json docs/benchmarks/scale.json \\
        --work /work/bench_scale --sizes 2M,4M,8M,16M,50000000 --feature-dim 64   # scale.json's run
    # rerunning the same line assembles the JSON from the stage records without running anything again

A size whose stages are recorded under ``--work`` is not run again; a store is deleted
after its stages unless ``--keep-stores`` (a later ``--stages`` then reuses it).
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

try:
    from tools import bench_outofcore, benchkit
except ImportError:  # run as a script: tools/ is on sys.path
    import bench_outofcore
    import benchkit

REPO = Path(__file__).resolve().parents[1]
STAGES = ("generate", "convert", "epoch_megabatch", "epoch_disk", "epoch_macrobatch", "infer")
"""The stages of every run, in order (a structure-heavy run adds ``verify`` after ``infer``)."""
SCHEMES = {"epoch_megabatch": "megabatch", "epoch_disk": "disk", "epoch_macrobatch": "macrobatch"}
PROCESS_BYTES = 512 << 20
"""What a training or inference child holds besides its byte budget: interpreter, torch, maps."""
DEFAULT_SIZES = tuple(1 << k for k in range(20, 27))
"""1Mi to 64Mi nodes, doubling (``--max-size`` cuts the list)."""
QUICK_SIZES = (20_000, 40_000, 80_000)
TARGETS = {"papers100m": {"num_nodes": 111_059_956, "num_edges": 1_615_685_872, "feature_dim": 128},
           "mag240m_papers": {"num_nodes": 121_751_666, "num_edges": 1_297_748_926, "feature_dim": 768}}
"""The graphs projected to: nodes, directed source edges (stored twice, symmetrised), width."""
FEATURE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


# ---------------------------------------------------------------------- the fit

def solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """``x`` with ``a x = b`` (Gaussian elimination, partial pivoting); None when ``a`` is
    singular (relative to its largest entry).

    >>> solve([[2.0, 0.0], [0.0, 4.0]], [2.0, 8.0])
    [1.0, 2.0]
    """
    n = len(b)
    m = [list(row) + [rhs] for row, rhs in zip(a, b)]
    scale = max((abs(v) for row in a for v in row), default=0.0) or 1.0
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-12 * scale:
            return None
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[r][n] / m[r][r] for r in range(n)]


def least_squares(rows: list[list[float]], y: list[float]) -> list[float] | None:
    """Ordinary least squares by the normal equations, columns scaled to unit size first (edge
    counts and bytes are 1e9 apart from the intercept); None when the columns are dependent
    or there are fewer rows than columns.

    >>> [round(c, 6) for c in least_squares([[1, 1], [1, 2], [1, 3]], [3, 5, 7])]
    [1.0, 2.0]
    """
    k = len(rows[0]) if rows else 0
    if len(rows) < k or k == 0:
        return None
    norms = [max(abs(r[j]) for r in rows) or 1.0 for j in range(k)]
    x = [[r[j] / norms[j] for j in range(k)] for r in rows]
    ata = [[sum(r[i] * r[j] for r in x) for j in range(k)] for i in range(k)]
    aty = [sum(r[i] * v for r, v in zip(x, y)) for i in range(k)]
    coef = solve(ata, aty)
    return None if coef is None else [c / n for c, n in zip(coef, norms)]


def _features(run: dict, names: tuple[str, ...]) -> list[float]:
    return [1.0 if name == "intercept" else float(run[name]) for name in names]


def fit_stage(runs: list[dict], stage: str, *, include_contended: bool = False) -> dict | None:
    """Least squares of ``stage``'s seconds on ``[1, stored_edges, feature_bytes]`` (on
    ``[1, stored_edges]`` when the runs do not separate the two, every run's features being
    the same bytes per edge; on ``[stored_edges]`` when a fit's rate would be negative) and of
    its peak RSS on ``[1, num_nodes]``; None with fewer than
    two runs that finished the stage. Runs marked ``timings_contended`` count for memory
    only, unless ``include_contended``."""
    done = [r for r in runs if r["stages"].get(stage, {}).get("s") is not None]
    if len({r["num_nodes"] for r in done}) < 2:
        return None
    timed = [r for r in done if include_contended or not r.get("timings_contended")]
    seconds = [r["stages"][stage]["s"] for r in timed]
    time_fit = None
    # The last model, a rate through the origin, is always positive: tiny runs dominated by
    # start-up can fall with size.
    for names in (("intercept", "stored_edges", "feature_bytes"), ("intercept", "stored_edges"), ("stored_edges",)):
        if len({r["num_nodes"] for r in timed}) < 2:
            break
        coef = least_squares([_features(r, names) for r in timed], seconds)
        # A negative rate extrapolates to negative seconds: drop to the simpler model.
        if coef is not None and all(c >= 0 for c in coef[1:]):
            time_fit = dict(zip(names, coef))
            break
    mem = [(r["num_nodes"], r["stages"][stage]["peak_rss_bytes"]) for r in done
           if r["stages"][stage].get("peak_rss_bytes") is not None]
    mem_coef = least_squares([[1.0, float(n)] for n, _ in mem], [float(v) for _, v in mem]) if len(mem) >= 2 else None
    return {"runs": len(done), "timed_runs": len(timed), "seconds": time_fit,
            "peak_rss_bytes": None if mem_coef is None else dict(zip(("intercept", "num_nodes"), mem_coef)),
            "max_peak_rss_bytes": max((v for _, v in mem), default=None)}


def predict(model: dict | None, point: dict) -> float | None:
    """A fitted linear model at ``point`` (``intercept`` is 1)."""
    if model is None:
        return None
    return sum(c * (1.0 if name == "intercept" else point[name]) for name, c in model.items())


def target_point(spec: dict, feature_dtype: str = "float16") -> dict:
    """A projected graph's regressors: its edges stored both ways, its features in ``feature_dtype``."""
    return {"num_nodes": spec["num_nodes"], "stored_edges": 2 * spec["num_edges"],
            "feature_bytes": spec["num_nodes"] * spec["feature_dim"] * FEATURE_BYTES[feature_dtype]}


def project(fits: dict[str, dict | None], targets: dict | None = None, phases: dict | None = None) -> dict:
    """Every stage's fit at each target graph: ``{name: {"convert_s", "peak_rss_bytes",
    "stages": {stage: {"s", "peak_rss_bytes"}}, ...}}``; a peak RSS is at least the largest
    measured (a cap bounds it; a flat fit should not project less than was seen). With
    ``phases`` (`fit_phases`), ``convert_s`` is the sum of the phases' projections and the
    conversion fit's own is ``convert_s_stage_fit``."""
    out = {}
    for name, spec in (targets or TARGETS).items():
        point = target_point(spec)
        stages = {}
        for stage, fit in fits.items():
            if fit is None:
                continue
            rss = predict(fit["peak_rss_bytes"], point)
            if rss is not None and fit["max_peak_rss_bytes"] is not None:
                rss = max(rss, fit["max_peak_rss_bytes"])
            stages[stage] = {"s": predict(fit["seconds"], point), "peak_rss_bytes": None if rss is None else int(rss)}
        conv = stages.get("convert", {})
        out[name] = {**point, "feature_dim": spec["feature_dim"], "feature_dtype": "float16",
                     "convert_s": conv.get("s"), "peak_rss_bytes": conv.get("peak_rss_bytes"), "stages": stages}
        if phases:
            by_phase = {phase: predict(model, point) for phase, model in phases.items()}
            out[name].update(convert_s=sum(by_phase.values()), convert_s_stage_fit=conv.get("s"),
                             convert_phases_s=by_phase)
    return out


def _large_graph_runs(runs: list[dict]) -> list[dict]:
    """The runs converted by the partitioner the projected graphs get (``stream``: the default
    above 50M staged edges), when two sizes have it; else every run."""
    stream = [r for r in runs if r.get("partitioner") == "stream"]
    return stream if len({r["num_nodes"] for r in stream}) >= 2 else runs


def fit_runs(runs: list[dict], *, include_contended: bool = False) -> dict:
    """`fit_stage` of every stage (the structure-heavy run's ``verify`` is not fitted); the
    conversion's over `_large_graph_runs` (METIS, the default below 50M staged edges, costs
    five times as much per edge and never runs on the projected graphs)."""
    fits = {stage: fit_stage(runs, stage, include_contended=include_contended) for stage in STAGES}
    large = _large_graph_runs(runs)
    if large is not runs:
        fits["convert"] = fit_stage(large, "convert", include_contended=include_contended)
        if fits["convert"] is not None:
            fits["convert"]["partitioner"] = "stream"
    return fits


def fit_phases(runs: list[dict], *, include_contended: bool = False) -> dict | None:
    """Per conversion phase (as ``graphstore info`` times them), least squares of its seconds
    on ``[1, feature_bytes]`` for ``write features`` and ``[1, stored_edges]`` for the rest
    (a rate through the origin where the slope would be negative), over `_large_graph_runs`:
    a projection that scales the features by their own bytes, which one fit over runs of one
    width cannot (MAG240M's rows are 6x papers100M's). Runs marked ``timings_contended`` are
    left out unless ``include_contended``."""
    done = [r for r in _large_graph_runs(runs)
            if (r["stages"].get("convert", {}).get("detail") or {}).get("phases_s")
            and (include_contended or not r.get("timings_contended"))]
    if len({r["num_nodes"] for r in done}) < 2:
        return None
    phases = {p for r in done for p in r["stages"]["convert"]["detail"]["phases_s"]}
    out = {}
    for phase in sorted(phases):
        x_name = "feature_bytes" if phase == "write features" else "stored_edges"
        xs = [float(r[x_name]) for r in done]
        ys = [float(r["stages"]["convert"]["detail"]["phases_s"].get(phase, 0.0)) for r in done]
        coef = least_squares([[1.0, x] for x in xs], ys)
        model = None if coef is None or coef[1] < 0 else {"intercept": coef[0], x_name: coef[1]}
        if model is None:
            rate = least_squares([[x] for x in xs], ys)
            model = {x_name: max(rate[0], 0.0) if rate else 0.0}
        out[phase] = model
    return out


def per_edge(runs: list[dict], stage: str = "convert") -> dict | None:
    """Seconds per stored edge of ``stage`` in each run of the same feature width, and the
    largest over the smallest (the goal: within 1.3x)."""
    rates = {str(r["num_nodes"]): r["stages"][stage]["s"] / r["stored_edges"] for r in runs
             if not r.get("structure_heavy") and r["stages"].get(stage, {}).get("s") and r.get("stored_edges")}
    if not rates:
        return None
    return {"s_per_edge": rates, "max_over_min": max(rates.values()) / min(rates.values())}


# ---------------------------------------------------------------------- sizes and disk

def parse_size(text: str) -> int:
    """``"4M"`` -> 4,194,304 (binary multiples, as the doubling sizes are), ``"20000"`` -> 20000.

    >>> parse_size("1M"), parse_size("20k"), parse_size("1500")
    (1048576, 20480, 1500)
    """
    text = text.strip()
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:].lower())
    return int(float(text[:-1]) * mult) if mult else int(text)


def communities_for(num_nodes: int, num_classes: int) -> int:
    """About 6,000 nodes a community, a multiple of the classes (bench_outofcore's stores: 320
    for 2.1M nodes, 1280 for 7.3M)."""
    return max(num_classes, round(num_nodes / 6144 / num_classes) * num_classes)


def disk_estimate_bytes(num_nodes: int, avg_degree: float, feature_dim: int, feature_dtype: str, *,
                       edge_bytes: int = 8, staged_removed: bool = True) -> dict:
    """Bytes a run needs on disk: the source (``edge_index`` of ``d = N deg / 2`` edges at
    ``edge_bytes`` an endpoint, features, float64 labels), the store (23 bytes a source edge:
    each edge twice as int32 pairs, the hub group, id maps, degrees; and the features) and the
    conversion's scratch at its largest, a number of bytes a source edge: while partitioning,
    the int32 staged endpoints of both directions (16) and the stream partitioner's input
    level in row blocks (its raw pairs becoming CSR files: about 30), 46 in all; in the edge
    phase the staged endpoints and their 8-byte grouping keys (32), 48 with the staged
    endpoints kept to the end (``staged_removed=False``: the conversion before they were
    dropped once grouped). The store's features are written before its edges, so the peak is
    the source, the features and the larger scratch, plus a twentieth. Measured
    (`docs/benchmarks/scale.json`): the 64-d float16 runs of 2M to 50M nodes stored 22.9-23.7
    bytes a source edge besides their features; with the staged endpoints kept (d2fb991, in
    the file's history) they peaked at 60.6 GB at 50M nodes (this estimate with
    ``staged_removed=False``: 61.3 GB), dropped once grouped (746540e) at 2.1-52.5 GB,
    0.84-0.88x this estimate; the 4-d run of 36M nodes, 1.19B int32 source edges, peaked at
    67.9 GB while partitioning (this estimate: 68.6 GB; 51.1 GB before the partitioner's
    scratch was counted)."""
    directed = num_nodes * avg_degree / 2
    feats = num_nodes * feature_dim * FEATURE_BYTES[feature_dtype]
    source = 2 * edge_bytes * directed + feats + 16 * num_nodes
    store = 23 * directed + feats
    staging = max(46, 32 if staged_removed else 48) * directed
    return {"source": int(source), "store": int(store), "peak": int(1.05 * (source + feats + staging))}


def width_for_disk(num_nodes: int, avg_degree: float, feature_dim: int, feature_dtype: str, free_bytes: int,
                   *, least: int = 16) -> int | None:
    """``feature_dim``, halved until `disk_estimate_bytes`'s peak fits in ``free_bytes`` (the
    issue: "narrower where the disk is short"); None when even ``least`` columns do not fit.

    >>> [width_for_disk(50_000_000, 28, 128, "float16", gb * 10**9) for gb in (80, 50, 30)]
    [128, 64, None]
    """
    dim = feature_dim
    while disk_estimate_bytes(num_nodes, avg_degree, dim, feature_dtype)["peak"] > free_bytes:
        if dim <= least:
            return None
        dim = max(least, dim // 2)
    return dim


# ---------------------------------------------------------------------- children

def child(spec: dict) -> None:
    """One stage in this fresh process; writes its result (with ``VmHWM``) to ``spec['out']``."""
    import faulthandler

    faulthandler.enable()
    sys.path.insert(0, str(REPO))
    t0 = time.perf_counter()
    result = CHILDREN[spec["stage_kind"]](spec)
    result.setdefault("s", time.perf_counter() - t0)
    result["vm_hwm_bytes"] = benchkit.vm_hwm_bytes()
    Path(spec["out"]).write_text(json.dumps(result))


def _child_generate(spec: dict) -> dict:
    from tools import make_synthetic

    code = make_synthetic.main(spec["argv"])
    if code:
        raise SystemExit(code)
    return {}


def _child_convert(spec: dict) -> dict:
    from graphstore import cli

    t0 = time.perf_counter()
    code = cli.main(["convert", *spec["argv"]])
    seconds = time.perf_counter() - t0
    if code:
        raise SystemExit(code)
    import graphstore

    store = graphstore.open(spec["store"])
    return {"s": seconds, "num_nodes": store.num_nodes, "stored_edges": int(store.num_edges),
            "num_partitions": store.num_partitions, "feature_dim": store.feature_dim,
            "feature_dtype": store.manifest.feature_dtype, "partitioner": store.manifest.partitioner.get("method"),
            "index_dtype": store.manifest.index_dtype, "store_bytes": benchkit.du(Path(spec["store"])),
            "phases_s": (store.manifest.conversion or {}).get("seconds")}


def _child_targets(spec: dict) -> dict:
    import numpy as np

    import graphstore

    store = graphstore.open(spec["store"])
    train, _ = bench_outofcore.choose_targets(store, seed=spec["seed"], targets=spec["targets"], eval_targets=1)
    np.save(spec["targets_file"], train)
    return {"targets": int(train.size)}


def _child_epoch(spec: dict) -> dict:
    import gc

    import numpy as np
    import torch

    import graphstore
    from graphstore.loaders import NodeLoader

    torch.set_num_threads(spec["threads"])
    t0 = time.perf_counter()
    store = graphstore.open(spec["store"])
    loader, _ = bench_outofcore.build_train_loader(NodeLoader, store, spec, np.load(spec["targets"]))
    model, opt = bench_outofcore.sage_and_adam(spec, store)
    setup_s = time.perf_counter() - t0
    step = bench_outofcore.sage_step(opt, lambda batch: model(batch.features, batch.dense))
    model.train()
    epochs = bench_outofcore._train_epochs(spec, lambda e, last: loader.epoch(e, lookahead=False), step)
    settings = loader.settings.to_dict()
    loader = None
    gc.collect()
    return {"s": epochs[0]["time_s"], "setup_s": setup_s, "epoch": epochs[0],
            "settings": {k: settings.get(k) for k in ("scheme", "policy", "capacity", "num_partitions",
                                                      "buffer_bytes", "macro_batches")}}


def _child_infer(spec: dict) -> dict:
    import torch

    import graphstore
    from graphstore.inference import InferenceStats, infer_layerwise
    from graphstore.nn import GNN

    torch.set_num_threads(spec["threads"])
    store = graphstore.open(spec["store"])
    torch.manual_seed(spec["seed"])
    model = GNN("sage", in_dim=store.feature_dim, hidden_dim=spec["hidden"], out_dim=store.num_classes, num_layers=1)
    stats, rows = InferenceStats(), [0]

    def output(k, out) -> None:  # streamed away: a 50M-node output is 2 GB
        rows[0] += int(out.shape[0])

    t0 = time.perf_counter()
    infer_layerwise(model, store, buffer_bytes=spec["buffer_bytes"], stats=stats, work_dir=spec["scratch"],
                    output=output)
    seconds = time.perf_counter() - t0
    if rows[0] != store.num_nodes:
        raise RuntimeError(f"inference returned {rows[0]} rows, expected {store.num_nodes}")
    return {"s": seconds, "rows": rows[0], "bytes_read": stats.bytes_read, "capacities": stats.capacities,
            "max_resident_partitions": stats.max_resident_partitions}


def _child_verify(spec: dict) -> dict:
    """``graphstore verify`` over the whole store (every checksum), then the counts and a
    sample of neighbourhoods checked against the source itself (`check_neighbourhoods`)."""
    from graphstore import cli

    code = cli.main(["verify", spec["store"]])
    if code:
        raise SystemExit(code)
    return {"verified": True, **check_neighbourhoods(spec["store"], spec["source"], seed=spec["seed"])}


def _npz_rows(path: Path, member: str):
    """``(dtype, length, open_row)`` of a stored (uncompressed) [2, E] member of an npz:
    ``open_row(r)`` is a plain file positioned at the start of row r. Found from the zip's
    local header and numpy's npy header, not by graphstore's source reader, so that the check
    does not share the code it checks."""
    import struct
    import zipfile

    import numpy as np

    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member + ".npy")
    if info.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"{path}: {member} is compressed; the check reads stored members")
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        f.seek(info.header_offset + 30 + name_len + extra_len)
        version = np.lib.format.read_magic(f)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read_header(f)
        start = f.tell()
    if len(shape) != 2 or shape[0] != 2 or fortran:
        raise ValueError(f"{path}: {member} is {shape}, expected C-order [2, E]")

    def open_row(r: int):
        f = open(path, "rb")
        f.seek(start + r * shape[1] * dtype.itemsize)
        return f

    return dtype, int(shape[1]), open_row


def check_neighbourhoods(store_path: str, source: str, *, seed: int, partitions: int = 3, nodes: int = 300,
                         chunk: int = 1 << 24) -> dict:
    """The store's edges against the source's, independently of the converter.

    Counts: the stored edges equal the in-degrees' sum and the last bucket offset (int64
    all). Neighbourhoods: ``nodes`` nodes in each of ``partitions`` destination partitions
    (the first, the middle and the last: the last one's buckets start past 2**31 edges in a
    run that stores more), their in-neighbours read bucket by bucket from the store and mapped
    back to source ids, must equal the source's symmetrised, de-duplicated, loop-free
    neighbours, found by one streaming pass over ``edge_index``. Raises on any difference."""
    import numpy as np

    import graphstore

    store = graphstore.open(store_path)
    n, p, size = store.num_nodes, store.num_partitions, store.partition_size
    offsets = np.asarray(store.bucket_offsets[...], dtype=np.int64)
    degree_sum = int(store.read_degree("in").sum())
    if not int(offsets[-1]) == degree_sum == int(store.num_edges):
        raise RuntimeError(f"edge counts disagree: num_edges {store.num_edges}, last bucket offset "
                           f"{int(offsets[-1])}, in-degree sum {degree_sum}")
    rng = np.random.default_rng(seed)
    parts = sorted({0, p // 2, p - 1})[:partitions]
    expected_store, sample = [], []
    for j in parts:
        lo, hi = store.partition_range(j)
        dst_ids = rng.choice(np.arange(lo, hi), size=min(nodes, hi - lo), replace=False)
        chosen = np.zeros(hi - lo, dtype=bool)
        chosen[dst_ids - lo] = True
        for i in range(p):
            s, d, _ = store.read_bucket(i, j)
            keep = chosen[d.astype(np.int64) - lo]
            expected_store.append(np.stack([d[keep], s[keep]]).astype(np.int64))
        sample.append(dst_ids)
    stored = np.concatenate(expected_store, axis=1)
    sample_store = np.concatenate(sample)
    got = np.unique(store.to_source_ids(stored[0]) * n + store.to_source_ids(stored[1]))
    # The source's view: every edge touching a sampled node, both directions, loops dropped.
    wanted = np.zeros(n, dtype=bool)
    wanted[store.to_source_ids(sample_store)] = True
    dtype, num_edges, open_row = _npz_rows(Path(source) / "raw" / "data.npz", "edge_index")
    found = []
    with open_row(0) as src_f, open_row(1) as dst_f:
        for a in range(0, num_edges, chunk):
            count = min(chunk, num_edges - a)
            u = np.fromfile(src_f, dtype=dtype, count=count).astype(np.int64)
            v = np.fromfile(dst_f, dtype=dtype, count=count).astype(np.int64)
            if len(u) != count or len(v) != count:
                raise RuntimeError(f"{source}: edge_index ends early at edge {a}")
            loop = u == v
            for a, b in ((u, v), (v, u)):  # (a, b) stored as the edge b -> a
                hit = wanted[a] & ~loop
                found.append(a[hit] * n + b[hit])
    want = np.unique(np.concatenate(found))
    if not np.array_equal(got, want):
        missing, extra = np.setdiff1d(want, got), np.setdiff1d(got, want)
        raise RuntimeError(f"neighbourhoods differ: {len(missing)} source edges missing from the store, "
                           f"{len(extra)} stored edges not in the source (first missing "
                           f"{missing[:1] // n}->{missing[:1] % n})")
    return {"stored_edges": int(store.num_edges), "last_bucket_offset": int(offsets[-1]),
            "in_degree_sum": degree_sum, "checked_partitions": parts, "checked_nodes": int(len(sample_store)),
            "checked_edges": int(len(got)), "source_edges_scanned": num_edges,
            "last_checked_bucket_starts_at": int(offsets[parts[-1] * p])}


CHILDREN = {"generate": _child_generate, "convert": _child_convert, "targets": _child_targets,
            "epoch": _child_epoch, "infer": _child_infer, "verify": _child_verify}


# ---------------------------------------------------------------------- one run

def git_head() -> str | None:
    """The checkout's commit, with ``+`` when graphstore/ has uncommitted changes (None without git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "graphstore"], cwd=REPO, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+" if dirty else "")


class DiskPeak:
    """The largest size of the files under ``path`` while the block runs, sampled every
    ``interval_s`` by a thread (a conversion's staging lives beside its store)."""

    def __init__(self, path: Path, interval_s: float = 5.0) -> None:
        self.path, self.interval_s, self.peak_bytes = path, interval_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="disk-peak", daemon=True)

    def _poll(self) -> None:
        while True:
            try:
                self.peak_bytes = max(self.peak_bytes, benchkit.du(self.path))
            except OSError:  # a file removed while walking: the next sample counts it
                pass
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class Run:
    """One graph's stages in ``work/<name>``, recorded in its ``stages.json`` as they finish."""

    def __init__(self, args, *, num_nodes: int, feature_dim: int, avg_degree: float, structure_heavy: bool,
                 log) -> None:
        self.args, self.log = args, log
        self.num_nodes, self.feature_dim, self.avg_degree = num_nodes, feature_dim, avg_degree
        self.structure_heavy = structure_heavy
        # A structure-heavy run's source keeps its endpoints in int32 (half OGB's int64): the
        # disk's room for one past 2**31 stored edges. The series keeps papers100M's int64.
        self.edge_dtype = "int32" if structure_heavy else "int64"
        self.name = self.name_of(num_nodes=num_nodes, feature_dim=feature_dim, avg_degree=avg_degree)
        self.dir = args.work / self.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.record_path = self.dir / "stages.json"
        self.record = json.loads(self.record_path.read_text()) if self.record_path.exists() else {}
        self.source, self.store = self.dir / "source", self.dir / "store.gs"
        self.failed: dict | None = None
        """The stage that failed in this invocation: exit code, OOM kills, the cgroup's peak."""

    @staticmethod
    def name_of(*, num_nodes: int, feature_dim: int, avg_degree: float, **_) -> str:
        return f"n{num_nodes}_d{feature_dim}_deg{avg_degree:g}"

    def save(self) -> None:
        benchkit.write_json(self.record_path, self.record)

    def spawn(self, stage: str, kind: str, spec: dict, cap_bytes: int | None) -> dict:
        out = self.dir / f"{stage}.result.json"
        out.unlink(missing_ok=True)
        spec = dict(spec, stage_kind=kind, out=str(out))
        cap = cap_bytes if self.args.iso["cap_enforced"] else None
        measured = benchkit.run_child(__file__, spec, cap_bytes=cap, name="bench_scale",
                                      drop_cache=self.args.iso["page_cache_dropped"])
        if measured["returncode"] != 0 or not out.exists():
            self.failed = {"stage": stage, "returncode": measured["returncode"], "process_s": measured["seconds"],
                           "oom_kills": measured["oom_kills"], "cgroup_peak_bytes": measured["cgroup_peak_bytes"],
                           "mem_cap_bytes": cap, "stderr_tail": measured["stderr"][-800:],
                           "command": spec.get("command")}
            raise RuntimeError(f"{self.name} {stage} failed ({measured['returncode']}, oom kills "
                               f"{measured.get('oom_kills')}): {measured['stderr'][-1500:]}")
        result = json.loads(out.read_text())
        out.unlink()
        peak = result.pop("vm_hwm_bytes")
        return {**result, "process_s": measured["seconds"], "peak_rss_bytes": peak,
                "cgroup_peak_bytes": measured["cgroup_peak_bytes"], "cap_hits": measured["cap_hits"],
                "oom_kills": measured["oom_kills"], "mem_cap_bytes": cap}

    def stage(self, stage: str, kind: str, spec: dict, cap_bytes: int | None) -> dict:
        if stage in self.record:
            self.log(f"{self.name} {stage}: recorded, not rerun ({self.record[stage]['s']:.1f} s)")
            return self.record[stage]
        self.log(f"{self.name} {stage}: starting (cap {None if cap_bytes is None else cap_bytes >> 20} MiB)")
        with DiskPeak(self.dir) as disk:
            result = self.spawn(stage, kind, spec, cap_bytes)
        result["disk_peak_bytes"] = disk.peak_bytes  # the run's folder: source, staging and store
        result["commit"] = git_head()  # a long sequence may span commits of the package
        self.record[stage] = result
        self.save()
        self.log(f"{self.name} {stage}: {result['s']:.1f} s, peak RSS {result['peak_rss_bytes'] / 2**20:.0f} MiB, "
                 f"cgroup peak {(result['cgroup_peak_bytes'] or 0) / 2**20:.0f} MiB")
        return result

    def execute(self) -> dict:
        a = self.args
        if "convert" not in self.record:
            need = disk_estimate_bytes(self.num_nodes, self.avg_degree, self.feature_dim, a.feature_dtype,
                                       edge_bytes=4 if self.edge_dtype == "int32" else 8)["peak"]
            free = shutil.disk_usage(a.work).free
            if need > free:
                raise RuntimeError(f"{self.name} needs about {need / 1e9:.1f} GB of disk, {free / 1e9:.1f} GB free: "
                                   f"narrow --feature-dim or free the disk")
            classes = a.num_classes
            gen_argv = ["--kind", "node", "--layout", "npz", "--num-nodes", str(self.num_nodes),
                        "--avg-degree", str(self.avg_degree), "--feature-dim", str(self.feature_dim),
                        "--feature-dtype", a.feature_dtype if a.feature_dtype == "float16" else "float32",
                        "--edge-dtype", self.edge_dtype,
                        "--num-classes", str(classes), "--communities", str(communities_for(self.num_nodes, classes)),
                        "--locality", "0.75", "--homophily", "0.2", "--seed", str(a.seed), "--no-progress",
                        "--overwrite", "--out", str(self.source)]
            if "generate" not in self.record:
                gen = self.stage("generate", "generate", {"argv": gen_argv}, None)
                gen["source_bytes"] = benchkit.du(self.source)
                self.save()
            conv_argv = [str(self.source), str(self.store), "--feature-dtype", a.feature_dtype, "--overwrite"]
            conv = self.stage("convert", "convert", {"argv": conv_argv, "store": str(self.store),
                                                     "command": "python -m graphstore convert " + " ".join(conv_argv)},
                              a.convert_cap_bytes)
            if not a.keep_sources and not self.structure_heavy:  # a heavy run's verify reads it
                shutil.rmtree(self.source, ignore_errors=True)
        conv = self.record["convert"]
        targets = self.dir / "targets.npy"
        if not targets.exists() and any(s not in self.record and s in a.stages for s in SCHEMES):
            self.spawn("targets", "targets", {"store": str(self.store), "seed": a.seed, "targets": a.targets,
                                              "targets_file": str(targets)}, None)
        common = {"store": str(self.store), "targets": str(targets), "fanouts": a.fanouts, "batch_size": a.batch_size,
                  "hidden": a.hidden, "lr": 0.003, "seed": a.seed, "threads": a.threads, "epochs": 1, "reuse": 1,
                  "static_cache": 0.0}
        # Macro-batching holds the whole structure (int32 or int64 indices, int64 indptr) beside its rows.
        index_bytes = 8 if conv.get("index_dtype") == "int64" else 4
        structure = conv["stored_edges"] * index_bytes + 16 * conv["num_nodes"]
        for stage, scheme in SCHEMES.items():
            if stage not in a.stages:
                continue
            cap = a.train_cap_bytes + (structure if scheme == "macrobatch" else 0)
            budget = a.train_cap_bytes - PROCESS_BYTES
            self.stage(stage, "epoch", dict(common, scheme=scheme, buffer_bytes=budget), cap)
        if "infer" in a.stages:
            self.stage("infer", "infer", {"store": str(self.store), "seed": a.seed, "threads": a.threads,
                                          "hidden": a.hidden, "buffer_bytes": a.train_cap_bytes - PROCESS_BYTES,
                                          "scratch": str(self.dir)}, a.train_cap_bytes)
        if self.structure_heavy:
            self.stage("verify", "verify", {"store": str(self.store), "source": str(self.source), "seed": a.seed},
                       a.convert_cap_bytes)
            if not a.keep_sources:
                shutil.rmtree(self.source, ignore_errors=True)
        if not a.keep_stores:
            shutil.rmtree(self.store, ignore_errors=True)
            targets.unlink(missing_ok=True)
        return self.row()

    def row(self) -> dict:
        conv = self.record.get("convert", {})
        keep = ("s", "process_s", "peak_rss_bytes", "cgroup_peak_bytes", "mem_cap_bytes", "oom_kills", "cap_hits",
                "disk_peak_bytes", "commit")
        stages = {}
        for stage, rec in self.record.items():
            stages[stage] = {k: rec.get(k) for k in keep}
            extra = {k: v for k, v in rec.items() if k not in keep}
            if extra:
                stages[stage]["detail"] = extra
        stored = conv.get("stored_edges")
        return {"name": self.name, "num_nodes": self.num_nodes, "stored_edges": stored,
                "over_2_31_edges": None if stored is None else stored > 2**31,
                "avg_degree_generated": self.avg_degree, "feature_dim": self.feature_dim,
                "feature_dtype": self.args.feature_dtype, "source_edge_dtype": self.edge_dtype,
                "feature_bytes": self.num_nodes * self.feature_dim * FEATURE_BYTES[self.args.feature_dtype],
                "structure_heavy": self.structure_heavy, "failed": self.failed,
                "partitions": conv.get("num_partitions"),
                "partitioner": conv.get("partitioner"), "index_dtype": conv.get("index_dtype"),
                "store_bytes": conv.get("store_bytes"),
                "source_bytes": self.record.get("generate", {}).get("source_bytes"),
                "stages": stages}


# ---------------------------------------------------------------------- the command line

class Parser(argparse.ArgumentParser):
    """Answers an unknown option in one line with the closest known one."""

    def error(self, message: str):
        if message.startswith("unrecognized arguments"):
            known = [o for a in self._actions for o in a.option_strings]
            bad = message.split(": ", 1)[-1].split()[0].split("=")[0]
            close = difflib.get_close_matches(bad, known, n=1)
            if close:
                message += f" (did you mean {close[0]}?)"
        super().error(message)


def parse_args(argv: list[str] | None):
    ap = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--json", type=Path, required=True, help="write the results here")
    ap.add_argument("--quick", action="store_true",
                    help=f"sizes {','.join(map(str, QUICK_SIZES))} and a structure-heavy run at the smallest, "
                         "2,000 targets, 512 MiB caps: the harness in minutes")
    ap.add_argument("--sizes", help="comma-separated node counts (k, M: binary multiples); default 1M doubling "
                                    "to --max-size")
    ap.add_argument("--max-size", type=parse_size, default=64 << 20, help="largest node count of the default sizes")
    ap.add_argument("--work", type=Path, default=Path("/work/bench_scale"), help="sources, stores, stage records")
    ap.add_argument("--feature-dim", type=int, default=128)
    ap.add_argument("--feature-dtype", choices=("float16", "float32"), default="float16")
    ap.add_argument("--avg-degree", type=float, default=28.0, help="mean degree 2E/N of the generated graph "
                                                                   "(14 directed edges per node)")
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--heavy-nodes", type=parse_size, help="add a structure-heavy run of this many nodes")
    ap.add_argument("--heavy-feature-dim", type=int, default=4)
    ap.add_argument("--heavy-avg-degree", type=float, default=60.0)
    ap.add_argument("--convert-cap-mib", type=int, default=4096)
    ap.add_argument("--train-cap-mib", type=int, default=4096, help="cap of the epochs and inference "
                                                                    "(macrobatch: plus its structure)")
    ap.add_argument("--targets", type=int, default=60_000, help="training targets of every epoch")
    ap.add_argument("--fanouts", default="10,5", help="fanouts[0] is the hop nearest the targets")
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep-sources", action="store_true", help="do not delete a source once converted")
    ap.add_argument("--keep-stores", action="store_true", help="do not delete a store after its stages")
    ap.add_argument("--stages", default=",".join(STAGES),
                    help="stages to run (generate and convert always run when the store is missing)")
    ap.add_argument("--no-drop-caches", action="store_true",
                    help="leave the page cache (reads are then not cold; for tests)")
    ap.add_argument("--timings-contended", default="", metavar="RUN[,RUN]",
                    help="runs (by name, e.g. n36000000_d4_deg66) whose stages shared the machine: their "
                         "seconds stay out of the time fits and the projection (memory and checks stay in)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.contended = {x for x in args.timings_contended.split(",") if x}
    if args.quick:
        args.sizes = args.sizes or ",".join(map(str, QUICK_SIZES))
        args.heavy_nodes = args.heavy_nodes or QUICK_SIZES[0]
        args.targets = min(args.targets, 2000)
        args.convert_cap_mib = min(args.convert_cap_mib, 1024)
        args.train_cap_mib = min(args.train_cap_mib, 1024)
        if args.work == ap.get_default("work"):
            args.work = Path("/tmp/bench_scale_quick")
    args.size_list = ([parse_size(s) for s in args.sizes.split(",") if s] if args.sizes
                      else [n for n in DEFAULT_SIZES if n <= args.max_size])
    args.fanouts = [int(f) for f in args.fanouts.split(",")]
    args.convert_cap_bytes, args.train_cap_bytes = args.convert_cap_mib << 20, args.train_cap_mib << 20
    args.stages = [x for x in args.stages.split(",") if x]
    unknown = sorted(set(args.stages) - set(STAGES))
    if unknown:
        ap.error(f"unknown stages {unknown}; known: {', '.join(STAGES)}")
    args.iso = bench_outofcore.isolation()
    if args.no_drop_caches:
        args.iso = dict(args.iso, page_cache_dropped=False)
    return args


def document(args, runs: list[dict], argv, started: float, errors: list[str]) -> dict:
    for r in runs:
        r["timings_contended"] = r["name"] in args.contended
    fits, phases = fit_runs(runs), fit_phases(runs)
    contended = [r["name"] for r in runs if r["timings_contended"]]
    with_contended = None
    if contended:
        with_contended = {"runs": contended, **project(fit_runs(runs, include_contended=True),
                                                        phases=fit_phases(runs, include_contended=True))}
    return {"command": benchkit.command_line("tools/bench_scale.py", argv), "quick": args.quick,
            "settings": {"avg_degree": args.avg_degree, "feature_dim": args.feature_dim,
                         "feature_dtype": args.feature_dtype, "targets": args.targets, "fanouts": args.fanouts,
                         "batch_size": args.batch_size, "hidden": args.hidden, "threads": args.threads,
                         "convert_cap_bytes": args.convert_cap_bytes, "train_cap_bytes": args.train_cap_bytes,
                         **args.iso},
            "machine": benchkit.machine_record("cpus", "python", note=benchkit.SHARED_MACHINE_NOTE,
                                               load_average=list(os.getloadavg())),
            "runs": runs, "errors": errors, "fit": fits, "convert_phases_fit": phases,
            "convert_per_edge": per_edge(runs),
            "convert_per_edge_stream": per_edge(_large_graph_runs(runs)),
            "projection": project(fits, phases=phases), "projection_assumes": "edges stored both ways (2x the source's), float16 "
                                                              "features, the fit's model extrapolated",
            "projection_including_contended": with_contended,
            "seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    if argv is None and "--child" in sys.argv:
        child(json.loads(sys.argv[sys.argv.index("--child") + 1]))
        return 0
    args = parse_args(argv)
    log = benchkit.elapsed_logger()
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    plan = [dict(num_nodes=n, feature_dim=args.feature_dim, avg_degree=args.avg_degree, structure_heavy=False)
            for n in args.size_list]
    if args.heavy_nodes:
        plan.append(dict(num_nodes=args.heavy_nodes, feature_dim=args.heavy_feature_dim,
                         avg_degree=args.heavy_avg_degree, structure_heavy=True))
    plan.sort(key=lambda item: item["num_nodes"] * item["avg_degree"])  # as far as it gets: smallest first
    runs, errors = [], []
    for item in plan:
        if not item["structure_heavy"] and not (args.work / Run.name_of(**item) / "stages.json").exists():
            free = shutil.disk_usage(args.work).free
            dim = width_for_disk(item["num_nodes"], item["avg_degree"], item["feature_dim"], args.feature_dtype, free)
            if dim is not None and dim != item["feature_dim"]:
                log(f"{item['num_nodes']:,} nodes: {dim}-d features, not {item['feature_dim']}-d: the disk has "
                    f"{free / 1e9:.0f} GB free")
                item = dict(item, feature_dim=dim)
        run = Run(args, log=log, **item)
        try:
            runs.append(run.execute())
        except (RuntimeError, OSError) as exc:
            errors.append(f"{run.name}: {exc}")
            log(f"{run.name} stopped: {exc}")
            runs.append(run.row())
        benchkit.write_json(args.json, document(args, runs, argv, started, errors))
    if not runs:
        benchkit.write_json(args.json, document(args, runs, argv, started, errors))
    log(f"wrote {args.json}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
