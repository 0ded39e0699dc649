"""Figures of the benchmark tables in docs/benchmarks.md, drawn from their JSON.

One figure per main table, each read from the JSON the table was written from (the
benchmark scripts' ``--json`` output in ``docs/benchmarks/``) and written to
``docs/figures/<name>.png``; docs/benchmarks.md shows each right after its table:

==================  =========================================================================
outofcore_300k      out-of-core training, issue 13's run: epoch time, samples/s, test accuracy
outofcore           the earlier out-of-core run (60,000 targets): the same three panels
macrobatch          macro-batching (structure in memory): epoch time and bytes read
inference           exact inference out of core: time against in memory and the disk limit; error
microbatch          micro-batching: total input nodes and epoch time per K and strategy
sampling            DENSE against DGL and the reference sampler: ms per batch
buffer              the partition buffer: load bandwidth against dd; stall with and without prefetch
convert             conversion under a 1 GiB cap: time by phase, peak memory
partition           the partitioners: edge cut, time, peak memory, at 1M and 7.3M nodes
scale               doubling sizes: each stage's seconds and peak RSS, conversion per edge
==================  =========================================================================

Usage (from the repository root; needs matplotlib, ``pip install -e .[plot]``)::

    .venv/bin/python tools/plot_benchmarks.py [--bench-dir docs/benchmarks] [--out docs/figures]
        [--only outofcore_300k,macrobatch] [--dpi 110]

A JSON without a field a figure needs stops the script with one line naming the file and
the field, exit code 1.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30
MIB = 2**20
# One colour per family of system, the same in every figure.
GRAPHSTORE, DGL, MEMORY, OTHER = "C0", "C1", "C2", "C7"


class BenchmarkFileError(ValueError):
    """A benchmark JSON lacks what a figure needs; the message names the file and field."""


class Bench:
    """A benchmark JSON whose fields are looked up by path, naming the file when one is missing."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.data = json.loads(path.read_text())
        except FileNotFoundError:
            raise BenchmarkFileError(f"{path}: no such file") from None
        except json.JSONDecodeError as exc:
            raise BenchmarkFileError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None

    def get(self, *keys: str | int, within: Any = None, where: str = "") -> Any:
        """``data[k0][k1]...`` (or ``within[k0]...``, a part of the file at ``where``)."""
        value = self.data if within is None else within
        for i, key in enumerate(keys):
            try:
                value = value[key]
            except (KeyError, IndexError, TypeError):
                dotted = ".".join(map(str, keys[:i + 1]))
                raise BenchmarkFileError(f"{self.path}: no field {where}{dotted}") from None
        return value

    def column(self, rows: list, key: str, *, where: str) -> np.ndarray:
        """float64 [len(rows)]: ``rows[i][key]``, NaN where it is null (a run that did not finish)."""
        values = [self.get(key, within=row, where=f"{where}[{i}].") for i, row in enumerate(rows)]
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # No pyplot: nothing global changes, and the Agg canvas needs no display.
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _barh(ax, labels: list[str], values: np.ndarray, colors: list[str], *, fmt: str, log: bool = False,
          missing: list[str] | None = None) -> None:
    """Horizontal bars top-down in ``labels`` order, each labelled with its value; rows whose value
    is NaN get the text of ``missing`` instead of a bar."""
    y = np.arange(len(labels))[::-1]  # the first row on top
    shown = np.nan_to_num(values, nan=0.0)
    bars = ax.barh(y, shown, color=colors)
    ax.bar_label(bars, labels=["" if np.isnan(v) else fmt.format(v) for v in values], padding=3,
                 fontsize="small")
    ax.set_yticks(y, labels)
    if log:
        ax.set_xscale("log")
    if missing is not None:
        left = ax.get_xlim()[0]
        for row in np.flatnonzero(np.isnan(values)):  # a handful of failed runs, one text each
            ax.text(left, y[row], "  " + missing[row], va="center", fontsize="small", color="0.35")
    ax.grid(True, axis="x", alpha=0.3)
    # Room on the right for the value labels.
    low, high = ax.get_xlim()
    ax.set_xlim(low, high * (3.0 if log else 1.18))


def _dots(ax, values: np.ndarray, colors: list[str], *, missing: list[str]) -> None:
    from matplotlib.ticker import MaxNLocator
    """Accuracies as dots on stems from the axis' left edge (a bar from 0 would hide the
    differences; a bar from an arbitrary floor would exaggerate them), rows as in `_barh`."""
    y = np.arange(values.size)[::-1]  # rows as in `_barh`
    finite = np.isfinite(values)
    low = np.floor(values[finite].min() * 100 - 1) / 100
    ax.set_xlim(low, np.ceil(values[finite].max() * 100 + 1) / 100)
    ax.hlines(y[finite], low, values[finite], colors=np.array(colors)[finite], linewidth=2)
    ax.scatter(values[finite], y[finite], c=np.array(colors)[finite], zorder=3)
    for row in range(values.size):  # one label per row (a dozen rows)
        text = f"  {values[row]:.4f}" if finite[row] else "  " + missing[row]
        ax.text(values[row] if finite[row] else low, y[row], text, va="center", fontsize="small",
                color="black" if finite[row] else "0.35")
    ax.xaxis.set_major_locator(MaxNLocator(4))
    ax.grid(True, axis="x", alpha=0.3)


# ---------------------------------------------------------------------- out-of-core training

def _outofcore_rows(b: Bench) -> list[dict]:
    """The table's rows: each run, DGL's expanded into its worker settings when it has them."""
    rows = []
    for i, run in enumerate(b.get("runs")):
        system = b.get("system", within=run, where=f"runs[{i}].")
        per_workers = run.get("num_workers_results")
        if per_workers:
            best = str(run.get("best_num_workers"))
            for workers, result in per_workers.items():
                name = f"{system.removesuffix('-widecap')}, {workers} workers" + (" (best)" if workers == best else "")
                rows.append({**result, "label": name})
            continue
        label = system + (" (projected)" if run.get("projected") else "")
        rows.append({**run, "label": label})
    return rows


def _why_missing(row: dict) -> str:
    if row.get("oom_kills") or row.get("oom"):
        return "killed by the memory cap (OOM)"
    if "budget" in str(row.get("error", "")):
        return "refused by the buffer budget"
    return "did not finish"


def plot_outofcore(b: Bench, heading: str = "Out-of-core training"):
    rows = _outofcore_rows(b)
    caps = [row.get("mem_cap_bytes") for row in rows]
    labels = [f"{row['label']}  [{'no cap' if cap is None else f'{cap / MIB:,.0f} MiB'}]"
              for row, cap in zip(rows, caps)]
    colors = [MEMORY if row["label"].startswith("graphstore-memory") else
              DGL if row["label"].startswith("dgl") else GRAPHSTORE for row in rows]
    epoch_s = b.column(rows, "epoch_s_median", where="runs")
    samples = np.array([np.nan if row.get("samples_per_s") is None else row["samples_per_s"] for row in rows])
    acc = np.array([np.nan if row.get("test_acc") is None else row["test_acc"] for row in rows])
    missing = [_why_missing(row) for row in rows]

    fig = _figure(13, 0.42 * len(rows) + 2.2)
    ax_time, ax_rate, ax_acc = fig.subplots(1, 3, sharey=True, width_ratios=[1.25, 1, 1])
    _barh(ax_time, labels, epoch_s, colors, fmt="{:.1f}", log=True, missing=missing)
    ax_time.set_xlabel("epoch time, s, log scale\n(median of the warm epochs)")
    _barh(ax_rate, labels, samples / 1000, colors, fmt="{:.1f}", missing=[""] * len(rows))
    ax_rate.set_xlabel("training samples / s, thousands\n(reuse 2 trains each target twice an epoch)")
    _dots(ax_acc, acc, colors, missing=["no test (projected)" if "projected" in r["label"] else ""
                                        for r in rows])
    ax_acc.set_xlabel("test accuracy after the last epoch\n(no model selection)")
    settings, store = b.get("settings"), b.get("stores", "main") if "stores" in b.data else b.get("store")
    fig.suptitle(
        f"{heading}\n{b.get('num_nodes', within=store, where='store.'):,} nodes, features "
        f"{b.get('data_vs_cap'):.1f}x the {b.get('mem_cap_bytes') / GIB:.0f} GiB cap (each system's cap in "
        f"brackets), {b.get('targets', within=settings, where='settings.'):,} training targets\n"
        f"{b.get('model', within=settings, where='settings.')}, fanouts "
        f"{tuple(b.get('fanouts', within=settings, where='settings.'))}, batch "
        f"{b.get('batch_size', within=settings, where='settings.')}. Blue: graphstore out of core; "
        "orange: DGL + memmap; green: graphstore in memory", fontsize="medium")
    return fig


# ---------------------------------------------------------------------- macro-batching

def plot_macrobatch(b: Bench):
    runs = b.get("runs")
    systems = [b.get("system", within=r, where=f"runs[{i}].") for i, r in enumerate(runs)]
    caps = [r.get("mem_cap_bytes") for r in runs]
    labels = [f"{s}  [{'no cap' if c is None else f'{c / MIB:,.0f} MiB'}]" for s, c in zip(systems, caps)]
    colors = [MEMORY if s == "graphstore-memory" else DGL if s.startswith("dgl") else GRAPHSTORE for s in systems]
    epoch_s = b.column(runs, "epoch_s_median", where="runs")
    gb = b.column(runs, "bytes_read", where="runs") / 1e9
    acc = b.column(runs, "test_acc", where="runs")
    settings = b.get("settings")

    fig = _figure(12, 0.42 * len(runs) + 2.2)
    ax_time, ax_gb = fig.subplots(1, 2, sharey=True)
    _barh(ax_time, labels, epoch_s, colors, fmt="{:.1f}", log=True)
    ax_time.set_xlabel("epoch time, s (epoch 1; log scale)")
    _barh(ax_gb, labels, gb, colors, fmt="{:.2f}")
    ax_gb.set_xlabel("GB read per epoch (DGL: the device's read_bytes)")
    graphstore_acc = np.unique(acc[np.char.startswith(np.array(systems), "graphstore")])
    fig.suptitle(
        f"Macro-batching (structure in memory, features on disk) under a "
        f"{b.get('mem_cap_bytes') / MIB:,.0f} MiB cap: features {b.get('features_vs_cap'):.2f}x the cap\n"
        f"{b.get('targets', within=settings, where='settings.'):,} targets, fanouts "
        f"{tuple(b.get('fanouts', within=settings, where='settings.'))}, batch "
        f"{b.get('batch_size', within=settings, where='settings.')}, "
        f"macro-batches cut at {b.get('macro_batch_bytes', within=settings, where='settings.') / MIB:.0f} MiB; "
        f"test accuracy: every graphstore row {', '.join(f'{a:.4f}' for a in graphstore_acc)} "
        f"(the same model), DGL {acc[[s.startswith('dgl') for s in systems]].max():.4f}",
        fontsize="medium")
    return fig


# ---------------------------------------------------------------------- exact inference

def plot_inference(b: Bench):
    cases = b.get("cases")
    # The table's rows: the capped runs on the large store (Cora's are a footnote).
    capped = [c for c in cases if c.get("mem_cap_bytes")]
    if not capped:
        raise BenchmarkFileError(f"{b.path}: no case with mem_cap_bytes (the out-of-core runs)")
    labels = [f"{b.get('model', within=c, where='cases[].')} x{b.get('layers', within=c, where='cases[].')}"
              for c in capped]
    out_of_core = b.column(capped, "seconds", where="cases")
    in_memory = b.column(capped, "seconds_in_memory", where="cases")
    limit = b.column(capped, "physical_limit_s", where="cases")
    diff = b.column(capped, "max_abs_diff", where="cases")

    fig = _figure(11, 4.6)
    ax_time, ax_diff = fig.subplots(1, 2, width_ratios=[2, 1])
    x = np.arange(len(capped))
    width = 0.27
    for offset, values, name, color in ((-width, out_of_core, "out of core", GRAPHSTORE),
                                        (0.0, in_memory, "in memory (same code, nothing evicted)", MEMORY),
                                        (width, limit, "disk limit (bytes read / dd)", OTHER)):
        bars = ax_time.bar(x + offset, values, width, label=name, color=color)
        ax_time.bar_label(bars, fmt="%.1f", fontsize="x-small", padding=1)
    ax_time.set_xticks(x, labels)
    ax_time.set_xlabel("model x layers")
    ax_time.set_ylabel("seconds, whole graph, every layer")
    ax_time.legend(fontsize="small")
    ax_time.grid(True, axis="y", alpha=0.3)
    ax_diff.bar(x, diff, color=GRAPHSTORE)
    ax_diff.axhline(1e-4, color="C3", linestyle="--", label="goal: 1e-4")
    ax_diff.set_yscale("log")
    ax_diff.set_xticks(x, labels, rotation=45)
    ax_diff.set_ylabel("max |out of core - in-memory forward|")
    ax_diff.legend(fontsize="small")
    ax_diff.grid(True, axis="y", alpha=0.3)
    partitions = int(b.get("num_partitions", within=capped[0], where="cases[]."))
    fig.suptitle(f"Exact inference out of core: the out-of-core benchmark's graph, {partitions} partitions, "
                 f"under a {capped[0]['mem_cap_bytes'] / MIB:,.1f} MiB cap; disk "
                 f"{b.get('dd_bytes_per_s') / 1e9:.2f} GB/s (dd)", fontsize="medium")
    return fig


# ---------------------------------------------------------------------- micro-batching

def plot_microbatch(b: Bench):
    from matplotlib.ticker import StrMethodFormatter

    cases, baselines, settings = b.get("cases"), b.get("baselines"), b.get("settings")
    datasets = list(dict.fromkeys(b.get("dataset", within=c, where="cases[].") for c in cases))
    strategies = list(dict.fromkeys(b.get("strategy", within=c, where="cases[].") for c in cases))
    k = b.column(cases, "k", where="cases")
    inputs = b.column(cases, "total_inputs", where="cases")
    epoch = b.column(cases, "epoch_s", where="cases")
    dataset_of = np.array([c["dataset"] for c in cases])
    strategy_of = np.array([c["strategy"] for c in cases])

    fig = _figure(10.5, 6.5)
    grid = fig.subplots(2, len(datasets), squeeze=False)
    for col, dataset in enumerate(datasets):
        base = next((x for x in baselines if x.get("dataset") == dataset), None)
        for strategy_index, strategy in enumerate(strategies):
            mask = (dataset_of == dataset) & (strategy_of == strategy)
            order = np.argsort(k[mask])
            style = {"marker": "o", "color": f"C{strategy_index}", "label": strategy}
            grid[0, col].plot(k[mask][order], inputs[mask][order], **style)
            grid[1, col].plot(k[mask][order], epoch[mask][order], **style)
        if base is not None:
            grid[0, col].axhline(base["total_inputs"], color="0.4", linestyle=":", label="whole batch (K = 1)")
            grid[1, col].axhline(base["epoch_s"], color="0.4", linestyle=":", label="whole batch (K = 1)")
        grid[0, col].set_title(dataset)
        grid[0, col].set_ylabel("input nodes, sum over the K micro-batches")
        grid[0, col].yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        grid[1, col].set_ylabel("epoch s (3 batches, fastest of 2)")
        for ax in grid[:, col]:
            ax.set_xscale("log", base=2)
            ax.set_xticks(settings["ks"], [str(v) for v in settings["ks"]])
            ax.set_xlabel("K (micro-batches per batch)")
            ax.grid(True, alpha=0.3)
    grid[0, 0].legend(fontsize="small")
    fig.suptitle(f"Micro-batching: {b.get('batches', within=settings, where='settings.')} batches of "
                 f"{b.get('batch_size', within=settings, where='settings.'):,} targets, fanouts "
                 f"{tuple(b.get('fanouts', within=settings, where='settings.'))}, "
                 f"{b.get('num_layers', within=settings, where='settings.')}-layer "
                 f"{b.get('model', within=settings, where='settings.')}, hidden "
                 f"{b.get('hidden_dim', within=settings, where='settings.')}, one thread "
                 "(reg: Betty's REG partitioned with METIS)", fontsize="medium")
    return fig


# ---------------------------------------------------------------------- sampling

def plot_sampling(b: Bench):
    from matplotlib.ticker import NullFormatter, StrMethodFormatter

    cases, graph = b.get("cases"), b.get("graph")
    names = {"dense": "DENSE (kernel)", "reference": "reference", "dgl": "DGL 1.1.3"}
    colors = {"dense": GRAPHSTORE, "reference": OTHER, "dgl": DGL}
    fanouts = list(dict.fromkeys(tuple(b.get("fanouts", within=c, where="cases[].")) for c in cases))
    fig = _figure(11, 4.4)
    axes = fig.subplots(1, len(fanouts), squeeze=False)[0]
    for ax, fan in zip(axes, fanouts):
        group = [c for c in cases if tuple(c["fanouts"]) == fan and not c.get("skipped")]
        samplers = [b.get("sampler", within=c, where="cases[].") for c in group]
        median = b.column(group, "ms_median", where="cases")
        low, high = b.column(group, "ms_min", where="cases"), b.column(group, "ms_max", where="cases")
        x = np.arange(len(group))
        ax.bar(x, median, color=[colors.get(s, OTHER) for s in samplers],
                      yerr=np.stack([median - low, high - median]), capsize=4)
        dgl = median[[s == "dgl" for s in samplers]]
        speed = [f"{m:,.1f} ms" + (f"\nDGL / this {dgl[0] / m:.2f}x" if dgl.size and s != "dgl" else "")
                 for s, m in zip(samplers, median)]
        for xi, top, text in zip(x, high, speed):  # above the whisker, which a bar label would cross
            ax.text(xi, top * 1.15, text, ha="center", va="bottom", fontsize="small")
        ax.set_xticks(x, [names.get(s, s) for s in samplers])
        ax.set_yscale("log")
        # From 1 ms, so a bar's height is its time on the log scale, not an artefact of the floor.
        ax.set_ylim(1.0, high.max() * 8)
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("ms per batch (median; bars: min-max), log scale")
        ax.set_title(f"fanouts {', '.join(map(str, fan))} (fanouts[0] nearest the targets)")
        ax.grid(True, axis="y", alpha=0.3)
    batch = b.get("batch_size", within=cases[0], where="cases[0].")
    fig.suptitle(f"Sampling: {b.get('num_edges', within=graph, where='graph.'):,} edges over "
                 f"{b.get('num_nodes', within=graph, where='graph.'):,} nodes (Chung-Lu, power law "
                 f"{b.get('gamma', within=graph, where='graph.')}), batches of {batch:,} targets, one thread",
                 fontsize="medium")
    return fig


# ---------------------------------------------------------------------- partition buffer

def plot_buffer(b: Bench):
    from matplotlib.ticker import StrMethodFormatter

    load, prefetch = b.get("load_bandwidth"), b.get("prefetch")
    names = [("dd_bytes_per_s", "dd, one stream"), ("dd4_bytes_per_s", "dd, four streams"),
             ("read_bytes_per_s", "buffer loads"), ("load_bytes_per_s_incl_assemble", "loads + CSC assembly")]
    stats = np.array([[b.get(key, part, within=load, where="load_bandwidth.") for part in ("median", "min", "max")]
                      for key, _ in names]) / 1e9
    fig = _figure(11, 4.4)
    ax_bw, ax_stall = fig.subplots(1, 2)
    x = np.arange(len(names))
    bars = ax_bw.bar(x, stats[:, 0], yerr=np.stack([stats[:, 0] - stats[:, 1], stats[:, 2] - stats[:, 0]]),
                     capsize=4, color=[OTHER, OTHER, GRAPHSTORE, GRAPHSTORE])
    ax_bw.bar_label(bars, fmt="%.2f", fontsize="small", label_type="center", color="white")
    ax_bw.set_xticks(x, [n for _, n in names], fontsize="small")
    ax_bw.set_ylabel("GB/s (median of 3 runs; bars: min-max)")
    ax_bw.set_title(f"load bandwidth: {b.get('policy', within=load, where='load_bandwidth.')}, "
                    f"p={b.get('num_partitions', within=load, where='load_bandwidth.')}, "
                    f"c={b.get('capacity', within=load, where='load_bandwidth.')}, one epoch, no compute\n"
                    f"bytes read / the plan's minimum: "
                    f"{b.get('bytes_read_vs_planned', within=load, where='load_bandwidth.'):.3f}",
                    fontsize="medium")
    ax_bw.grid(True, axis="y", alpha=0.3)

    factors = b.get("compute_factors", within=prefetch, where="prefetch.")
    per_state = b.get("compute_seconds_per_state", within=prefetch, where="prefetch.")
    x = np.arange(len(factors))
    width = 0.38
    for offset, mode, color in ((-width / 2, "on", GRAPHSTORE), (width / 2, "off", OTHER)):
        key = [f"compute_{f}x_prefetch_{mode}" for f in factors]
        values = np.array([[b.get(k, "stall_vs_read", part, within=prefetch, where="prefetch.")
                            for part in ("median", "min", "max")] for k in key])
        ax_stall.bar(x + offset, values[:, 0], width, color=color, label=f"prefetch {mode}",
                     yerr=np.stack([values[:, 0] - values[:, 1], values[:, 2] - values[:, 0]]), capsize=4)
        for xi, median, top in zip(x + offset, values[:, 0], values[:, 2]):  # above the whisker
            ax_stall.text(xi, top * 1.12, f"{median:.3f}", ha="center", va="bottom", fontsize="small")
    ax_stall.axhline(0.10, color="C3", linestyle="--", label="goal with prefetch: < 0.10")
    # Log: the prefetched stalls (~0.05) and the unhidden ones (~1.1) on one readable axis.
    ax_stall.set_yscale("log")
    ax_stall.set_ylim(0.01, 40)  # headroom above the bars for the legend
    ax_stall.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    ax_stall.set_xticks(x, [f"compute {f}x the load time\n({f * per_state:.3f} s a state)" for f in factors])
    ax_stall.set_ylabel("stall / read time (3 epochs; median of 3 runs)")
    ax_stall.set_title("prefetch: time the consumer waits, over read time", fontsize="medium")
    ax_stall.legend(fontsize="small", loc="upper left")
    ax_stall.grid(True, axis="y", alpha=0.3)
    dataset = b.get("dataset")
    fig.suptitle(f"Partition buffer: {b.get('num_nodes', within=dataset, where='dataset.'):,} nodes, "
                 f"{b.get('feature_dim', within=dataset, where='dataset.')} float32 features, store "
                 f"{b.get('store_vs_cap'):.1f}x the {b.get('cap_bytes') / GIB:.0f} GiB cgroup cap, cold cache",
                 fontsize="medium")
    return fig


# ---------------------------------------------------------------------- conversion

def plot_convert(b: Bench):
    runs = b.get("runs")
    caps = [r.get("cap_bytes") for r in runs]
    labels = [f"{b.get('partitioner', within=r, where=f'runs[{i}].')}, "
              + ("no cap" if cap is None else f"cap {cap / GIB:g} GiB") for i, (r, cap) in enumerate(zip(runs, caps))]
    phases = list(dict.fromkeys(p for i, r in enumerate(runs)
                                for p in b.get("phase_seconds", within=r, where=f"runs[{i}].")))
    seconds = np.array([[r["phase_seconds"].get(p, 0.0) for p in phases] for r in runs])
    wall = b.column(runs, "seconds", where="runs")
    other = np.maximum(wall - seconds.sum(1), 0.0)  # start-up and what no phase timed
    rss = b.column(runs, "peak_rss_bytes", where="runs") / MIB

    fig = _figure(12, 4.4)
    ax_time, ax_mem = fig.subplots(1, 2, sharey=True, width_ratios=[2, 1])
    y = np.arange(len(runs))
    left = np.zeros(len(runs))
    for i, (name, values) in enumerate(zip([*phases, "outside the phases"], [*seconds.T, other])):
        ax_time.barh(y, values, left=left, label=name, color=f"C{i}" if i < 7 else OTHER)
        left += values
    ax_time.bar_label(ax_time.containers[-1], labels=[f"{w:.1f} s" for w in wall], padding=3, fontsize="small")
    ax_time.set_yticks(y, labels)
    ax_time.invert_yaxis()
    ax_time.set_xlim(0, wall.max() * 1.15)
    ax_time.set_xlabel("wall seconds, by phase")
    ax_time.legend(fontsize="small", ncols=2, loc="lower right")
    ax_time.grid(True, axis="x", alpha=0.3)
    bars = ax_mem.barh(y, rss, color=GRAPHSTORE)
    ax_mem.bar_label(bars, fmt="%.0f", padding=3, fontsize="small")
    ax_mem.axvline(b.get("cap_bytes") / MIB, color="C3", linestyle="--", label="cgroup cap (capped rows)")
    ax_mem.set_xlabel("peak RSS, MiB")
    ax_mem.legend(fontsize="small", loc="lower right")
    ax_mem.grid(True, axis="x", alpha=0.3)
    dataset = b.get("dataset")
    fig.suptitle(f"Conversion out of core: {b.get('num_nodes', within=dataset, where='dataset.'):,} nodes, "
                 f"{b.get('feature_bytes', within=dataset, where='dataset.') / GIB:.2f} GiB of features "
                 f"({b.get('feature_bytes', within=dataset, where='dataset.') / b.get('cap_bytes'):.1f}x the "
                 f"cap), {int(runs[0].get('num_partitions', 0)):,} partitions; page cache dropped before each run",
                 fontsize="medium")
    return fig


# ---------------------------------------------------------------------- partitioning

def plot_partition(b: Bench):
    cases = b.get("cases")
    nodes = b.column(cases, "num_nodes", where="cases")
    budget = [c.get("memory_bytes") for c in cases]
    caps = [c.get("cap_bytes") for c in cases]
    labels = [f"{b.get('partitioner', within=c, where=f'cases[{i}].')}"
              + ("" if m is None or c["partitioner"] != "stream" else f", budget {m / MIB:,.0f} MiB")
              + ("" if cap is None else f", cap {cap / MIB:,.0f} MiB")
              + f"  [{n / 1e6:.1f}M nodes]" for i, (c, m, cap, n) in enumerate(zip(cases, budget, caps, nodes))]
    palette = {"metis": "C0", "stream": "C2", "random": OTHER}
    colors = [palette.get(c["partitioner"], "C4") for c in cases]
    cut = b.column(cases, "edge_cut", where="cases") * 100
    seconds = b.column(cases, "seconds", where="cases")
    rss = b.column(cases, "peak_rss_bytes", where="cases") / MIB

    fig = _figure(13, 0.42 * len(cases) + 2.0)
    ax_cut, ax_time, ax_rss = fig.subplots(1, 3, sharey=True)
    _barh(ax_cut, labels, cut, colors, fmt="{:.1f} %")
    ax_cut.set_xlabel("edge cut, % of stored edges\n(lower is better)")
    _barh(ax_time, labels, seconds, colors, fmt="{:,.2f}", log=True)
    ax_time.set_xlabel("seconds, log scale\n(reading the staged edges included)")
    _barh(ax_rss, labels, rss, colors, fmt="{:,.0f}", log=True)
    ax_rss.set_xlabel("peak RSS, MiB, log scale\n(the child's VmHWM)")
    fig.suptitle(f"Partitioning into {int(b.get('num_partitions', within=cases[0], where='cases[0].'))} parts: "
                 "graphs with communities (the out-of-core benchmark's generator), each partitioner in its "
                 "own process, cold cache", fontsize="medium")
    return fig


# ---------------------------------------------------------------------- scale

def plot_scale(b: Bench):
    runs = b.get("runs")
    main = [r for r in runs if not r.get("structure_heavy")]
    stages = ("generate", "convert", "epoch_megabatch", "epoch_disk", "epoch_macrobatch", "infer")
    fig = _figure(14, 4.6)
    ax_time, ax_edge, ax_rss = fig.subplots(1, 3)
    for i, stage in enumerate(stages):
        done = [(r["stored_edges"], r["num_nodes"], r["stages"][stage]) for r in main
                if r.get("stored_edges") and r["stages"].get(stage, {}).get("s") is not None]
        if not done:
            continue
        edges = np.array([e for e, _, _ in done], dtype=np.float64)
        nodes = np.array([n for _, n, _ in done], dtype=np.float64)
        ax_time.plot(edges, [s["s"] for _, _, s in done], "o-", color=f"C{i}", label=stage)
        ax_rss.plot(nodes, [s["peak_rss_bytes"] / MIB for _, _, s in done], "o-", color=f"C{i}", label=stage)
    for r in runs:  # the structure-heavy runs as open markers
        if r.get("structure_heavy") and r.get("stored_edges"):
            for i, stage in enumerate(stages):
                rec = r["stages"].get(stage, {})
                if rec.get("s") is not None:
                    ax_time.plot([r["stored_edges"]], [rec["s"]], "o", mfc="none", color=f"C{i}")
                    ax_rss.plot([r["num_nodes"]], [rec["peak_rss_bytes"] / MIB], "o", mfc="none", color=f"C{i}")
    targets = b.get("settings", "targets")
    ax_time.set(xscale="log", yscale="log", xlabel="stored edges (open: narrow-feature runs; their seconds\n"
                "are left out of the fit where the JSON marks them timings_contended)",
                ylabel=f"seconds (epochs: {targets:,} targets; infer: one layer)")
    ax_time.legend(fontsize="small")
    ax_time.grid(True, which="both", alpha=0.3)
    conv = [(r["stored_edges"], r["stages"]["convert"]["s"], r.get("partitioner")) for r in main
            if r.get("stored_edges") and r["stages"].get("convert", {}).get("s") is not None]
    if conv:
        e = np.array([c[0] for c in conv], dtype=np.float64)
        per = np.array([c[1] for c in conv]) / e * 1e6
        ax_edge.plot(e, per, "o-", color="C1")
        for x, y, part in zip(e, per, (c[2] for c in conv)):
            ax_edge.annotate(str(part), (x, y), textcoords="offset points", xytext=(4, 4), fontsize="small")
        ax_edge.axhspan(per.min(), per.min() * 1.3, color="C2", alpha=0.15, label="goal: within 1.3x of the least")
        ax_edge.legend(fontsize="small")
    ax_edge.set(xscale="log", xlabel="stored edges", ylabel="conversion seconds per million stored edges")
    ax_edge.set_ylim(bottom=0)
    ax_edge.grid(True, which="both", alpha=0.3)
    settings = b.get("settings")
    ax_rss.axhline(b.get("convert_cap_bytes", within=settings, where="settings.") / MIB, color="C3", linestyle="--",
                   label="cap (macrobatch: plus its structure)")
    ax_rss.set(xscale="log", xlabel="nodes", ylabel="peak RSS, MiB (VmHWM)")
    ax_rss.legend(fontsize="small")
    ax_rss.grid(True, which="both", alpha=0.3)
    proj = b.get("projection", "papers100m")
    convert_s = proj.get("convert_s")
    fig.suptitle(f"Scale: papers100M-shaped graphs ({settings['feature_dim']}-d {settings['feature_dtype']}, "
                 f"about {settings['avg_degree'] / 2:g} edges a node before symmetrising), every stage in its own "
                 f"capped process, cold cache; projected papers100M conversion "
                 + ("n/a" if convert_s is None else f"{convert_s / 60:,.0f} min"), fontsize="medium")
    return fig


#: figure name (= the JSON's stem and the PNG's) -> its drawing function
FIGURES: dict[str, Callable[[Bench], Any]] = {
    "outofcore_300k": functools.partial(plot_outofcore, heading="Out-of-core training, issue 13's run"),
    "outofcore": functools.partial(plot_outofcore, heading="Out-of-core training, the earlier run (before "
                                   "issue 13: DGL then at 0 workers, not at its best)"),
    "macrobatch": plot_macrobatch,
    "inference": plot_inference,
    "microbatch": plot_microbatch,
    "sampling": plot_sampling,
    "buffer": plot_buffer,
    "convert": plot_convert,
    "partition": plot_partition,
    "scale": plot_scale,
}


def make_figures(bench_dir: Path, names: list[str] | None = None) -> dict[str, Any]:
    """name -> matplotlib Figure, each drawn from ``bench_dir/<name>.json``."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BenchmarkFileError("plotting needs matplotlib: pip install graphstore[plot]") from None
    unknown = sorted(set(names or ()) - set(FIGURES))
    if unknown:
        raise BenchmarkFileError(f"unknown figure(s) {unknown}; known: {', '.join(FIGURES)}")
    return {name: FIGURES[name](Bench(bench_dir / f"{name}.json")) for name in (names or FIGURES)}


def write_figures(figures: dict[str, Any], out_dir: Path, *, dpi: int) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    from graphstore.plot import save_png  # 256 colours, written whole or not at all

    return [save_png(fig, out_dir / f"{name}.png", dpi=dpi) for name, fig in figures.items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench-dir", type=Path, default=REPO / "docs" / "benchmarks", help="the benchmark JSON")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "figures", help="directory of the PNGs")
    ap.add_argument("--only", type=lambda s: [n for n in s.split(",") if n], help="comma-separated names")
    ap.add_argument("--dpi", type=int, default=110)
    args = ap.parse_args(argv)
    try:
        figures = make_figures(args.bench_dir, args.only)
    except BenchmarkFileError as exc:
        print(f"plot_benchmarks.py: error: {exc}", file=sys.stderr)
        return 1
    for path in write_figures(figures, args.out, dpi=args.dpi):
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
