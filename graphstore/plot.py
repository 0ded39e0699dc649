"""Figures of trainer runs: ``graphstore plot RUN.json [RUN2.json ...] -o runs.png``.

Reads the metrics files the trainer scripts write (``--metrics-out``,
`trainers/common.py`'s ``MetricsWriter``) and draws, per epoch, one line per run:

- training loss (``epochs[i].train_loss``);
- the validation metric the trainer selects on (``epochs[i].valid.acc`` for node
  classification, ``valid.mrr``, or ``valid["hits@20"]`` under OGB evaluation, for link
  prediction; epochs without evaluation are left out, the evaluated ones joined);
- training time split into compute (solid) and stall (dashed): ``time_s`` is the wall time
  of the epoch's training pass (evaluation excluded), ``io.stall_s`` the part of it spent
  waiting for the partition buffer's reads (or macro-batching's rows), and compute the rest
  (sampling, gathering, forward, backward, the step, assembling resident graphs);
- bytes the training pass read from the store (``io.bytes_read``, MiB: the buffer's, or
  macro-batching's rows and structure; evaluation's reads are not counted).

The legend names each run by its scheme (and its file, when two runs share a scheme).
matplotlib is an optional dependency (``pip install graphstore[plot]``), imported only when
a figure is drawn.

Examples
--------
>>> validation_metric("node_classification", {})
'acc'
>>> validation_metric("link_prediction", {"eval": "ogb"})
'hits@20'
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from graphstore.errors import ConfigError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["PANELS", "RunCurves", "plot_runs", "read_run", "save_png", "validation_metric"]

#: The figure's panels, in drawing order (also each axes' ``get_label()``).
PANELS = ("loss", "valid", "time", "bytes")

_METRIC_NAMES = {"acc": "accuracy", "mrr": "MRR", "hits@20": "Hits@20"}


@dataclass(frozen=True)
class RunCurves:
    """One metrics file's per-epoch series, every array [E] in epoch order."""

    path: Path
    """The metrics file."""
    task: str
    """``"node_classification"`` or ``"link_prediction"``."""
    scheme: str
    """The training scheme (``config.scheme``)."""
    store: str
    """The store trained on (``config.store``)."""
    metric: str
    """Name of the validation metric (a key of ``epochs[i].valid``)."""
    epoch: np.ndarray
    """int64: epoch numbers, counted from 1 as the trainers print them."""
    train_loss: np.ndarray
    """float64: mean training loss of the epoch."""
    valid: np.ndarray
    """float64: the validation metric, NaN for epochs that were not evaluated (drawn as
    the evaluated epochs joined)."""
    time_s: np.ndarray
    """float64: wall seconds of the training pass."""
    stall_s: np.ndarray
    """float64: seconds of ``time_s`` spent waiting for the buffer's reads."""
    bytes_read: np.ndarray
    """float64: bytes the training pass read from the store."""

    @property
    def compute_s(self) -> np.ndarray:
        """float64 [E]: training time not spent waiting for reads."""
        # Both are measured by separate clocks; a stall can exceed the pass by rounding.
        return np.maximum(self.time_s - self.stall_s, 0.0)


def validation_metric(task: str, config: dict[str, Any]) -> str:
    """The validation metric the trainer of ``task`` selects its best epoch on.

    Mirrors the trainers (node classification: accuracy; link prediction: MRR, or Hits@20
    under OGB's evaluation), so the plotted curve is the one model selection used.

    Raises
    ------
    ConfigError
        For a task no trainer writes.
    """
    if task == "node_classification":
        return "acc"
    if task == "link_prediction":
        return "hits@20" if config.get("eval") == "ogb" else "mrr"
    raise ConfigError(f"unknown task {task!r} (expected node_classification or link_prediction)")


def _field(path: Path, epochs: list, name: str, *, allow_none: bool = False) -> np.ndarray:
    """The dotted field ``name`` of every epoch record as float64 [E]; None -> NaN when allowed."""
    values = []
    for i, record in enumerate(epochs):  # a walk over parsed JSON: one dict per epoch
        value: Any = record
        for key in name.split("."):
            if value is None and allow_none:
                break
            if not isinstance(value, dict) or key not in value:
                raise ConfigError(f"{path}: epochs[{i}] has no {name!r} field")
            value = value[key]
        if value is None and allow_none:
            value = float("nan")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: epochs[{i}].{name} is {value!r}, expected a number")
        values.append(value)
    return np.asarray(values, dtype=np.float64)


def read_run(path: str | os.PathLike) -> RunCurves:
    """The per-epoch series of one trainer metrics file.

    Raises
    ------
    ConfigError
        When the file is missing, not JSON, or lacks a field (the message names the file
        and the field).
    """
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such metrics file") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (expected a trainer's metrics JSON)") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{path}: expected a trainer's metrics file (an object with 'task', 'config' "
                          f"and 'epochs'), got a JSON {type(record).__name__}")
    for key, kind in (("task", str), ("config", dict), ("epochs", list)):
        if not isinstance(record.get(key), kind):
            raise ConfigError(f"{path}: no {key!r} {kind.__name__} (expected a trainer's metrics file, "
                              "as written by --metrics-out)")
    epochs, config = record["epochs"], record["config"]
    if not epochs:
        raise ConfigError(f"{path}: 'epochs' is empty (the run finished no epoch)")
    for key in ("scheme", "store"):
        if not isinstance(config.get(key), str):
            raise ConfigError(f"{path}: no 'config.{key}' field")
    try:
        metric = validation_metric(record["task"], config)
    except ConfigError as exc:
        raise ConfigError(f"{path}: 'task': {exc}") from None
    return RunCurves(
        path=path, task=record["task"], scheme=config["scheme"], store=config["store"], metric=metric,
        epoch=_field(path, epochs, "epoch").astype(np.int64) + 1,
        train_loss=_field(path, epochs, "train_loss"),
        valid=_field(path, epochs, f"valid.{metric}", allow_none=True),
        time_s=_field(path, epochs, "time_s"),
        stall_s=_field(path, epochs, "io.stall_s"),
        bytes_read=_field(path, epochs, "io.bytes_read"),
    )


def _labels(runs: Sequence[RunCurves]) -> list[str]:
    """Legend labels: the scheme, and the file name where two runs share a scheme."""
    shared = Counter(run.scheme for run in runs)
    return [run.scheme if shared[run.scheme] == 1 else f"{run.scheme} ({run.path.name})" for run in runs]


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("plotting needs matplotlib: pip install graphstore[plot]") from None
    return Figure


def plot_runs(paths: Sequence[str | os.PathLike], out: str | os.PathLike | None = None, *,
              dpi: int = 110) -> Figure:
    """Draw the runs of ``paths`` (trainer metrics files) and write a PNG to ``out``.

    Parameters
    ----------
    paths : sequence of path
        One or more metrics files of one task.
    out : path, optional
        The PNG to write (replaced whole, never left half-written); None draws only.
    dpi : int
        Resolution of the PNG.

    Returns
    -------
    matplotlib.figure.Figure
        Four axes labelled as `PANELS`: one line per run in each, two in ``"time"``
        (compute solid, stall dashed, in the run's colour).

    Raises
    ------
    ConfigError
        For a bad metrics file, runs of different validation metrics, or no matplotlib.
    """
    if not paths:
        raise ConfigError("no metrics files to plot")
    runs = [read_run(p) for p in paths]
    for run in runs[1:]:
        if run.metric != runs[0].metric:
            raise ConfigError(f"{run.path}: its validation metric is {run.metric!r}, {runs[0].path}'s is "
                              f"{runs[0].metric!r}; plot runs of one task and evaluation together")
    Figure = _figure_class()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.ticker import MaxNLocator

    # A bare Figure on the Agg canvas: no pyplot, so no global backend or figure registry
    # is touched (safe inside a notebook or a GUI session, and on a headless machine).
    fig = Figure(figsize=(10, 7), layout="constrained")
    FigureCanvasAgg(fig)
    axes = dict(zip(PANELS, fig.subplots(2, 2).ravel()))
    for name, ax in axes.items():
        ax.set_label(name)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
    metric = runs[0].metric
    axes["loss"].set_title("training loss")
    axes["valid"].set_title(f"validation {_METRIC_NAMES.get(metric, metric)}")
    # The line styles are named in the title: a key inside the axes would cover the lines.
    axes["time"].set_title("training time per epoch: compute (solid), stall (dashed)")
    axes["time"].set_ylabel("seconds (evaluation excluded)")
    axes["bytes"].set_title("bytes read by training per epoch")
    axes["bytes"].set_ylabel("MiB")

    labels = _labels(runs)
    colors = [f"C{i % 10}" for i in range(len(runs))]
    # Markers show where the epochs are, and make a one-epoch run (a lone point) visible.
    marker = "o" if max(run.epoch.size for run in runs) <= 40 else None
    handles = []
    for run, label, color in zip(runs, labels, colors):
        style = {"color": color, "marker": marker, "markersize": 3}
        (line,) = axes["loss"].plot(run.epoch, run.train_loss, label=label, **style)
        handles.append(line)
        # Evaluated epochs only, joined: link prediction evaluates every --eval-every epochs.
        evaluated = ~np.isnan(run.valid)
        axes["valid"].plot(run.epoch[evaluated], run.valid[evaluated], label=label, **style)
        axes["time"].plot(run.epoch, run.compute_s, label=f"{label}: compute", **style)
        axes["time"].plot(run.epoch, run.stall_s, label=f"{label}: stall", linestyle="--", **style)
        axes["bytes"].plot(run.epoch, run.bytes_read / 2**20, label=label, **style)
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(runs), 4), title="scheme")
    stores = sorted({Path(run.store).name for run in runs})
    fig.suptitle(f"{runs[0].task.replace('_', ' ')} on {', '.join(stores)}: {len(runs)} run(s)")
    if out is not None:
        save_png(fig, out, dpi=dpi)
    return fig


def save_png(fig: Figure, path: str | os.PathLike, *, dpi: int) -> Path:
    """Write ``fig`` to ``path`` as a 256-colour PNG, whole or not at all; returns the path.

    Plots hold a few flat colours and their anti-aliased edges, so a palette looks the same
    as full colour at about a third of the bytes (these PNGs get committed to docs).
    """
    import io

    from PIL import Image  # a dependency of matplotlib

    path = Path(path)
    rendered = io.BytesIO()
    fig.savefig(rendered, format="png", dpi=dpi)
    image = Image.open(rendered).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        image.save(tmp, format="png", optimize=True)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
