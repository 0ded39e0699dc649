"""`graphstore plot` on real trainer metrics files (Cora, two schemes), read back from the
figure and the PNG; its one-line errors; and tools/plot_benchmarks.py on the committed JSON."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from tests.conftest import REPO

try:  # the `test` extra installs it: missing under CI is a broken install; a user's bare one may lack it
    import matplotlib
except ImportError as exc:
    if os.environ.get("CI"):
        raise
    pytest.skip(f"matplotlib missing ({exc}): pip install 'graphstore[plot]'", allow_module_level=True)

import matplotlib.image

import graphstore.plot
from graphstore import cli

if str(REPO) not in sys.path:  # trainers/ and tools/ are scripts of the checkout, not the wheel
    sys.path.insert(0, str(REPO))

EPOCHS = 3
SCHEMES = ("megabatch", "disk")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Metrics files of two short real runs on the embedded Cora: scheme -> path."""
    import graphstore
    from trainers import common
    from trainers import node_classification as nc

    root = tmp_path_factory.mktemp("plot")
    store = root / "cora.gs"
    graphstore.convert(REPO / "data" / "cora", store, num_partitions=8, partitioner="metis")
    out = {}
    for scheme in SCHEMES:
        out[scheme] = root / f"{scheme}.json"
        argv = ["--store", store, "--scheme", scheme, "--epochs", EPOCHS, "--fanouts", "10,10", "--hidden", "16",
                "--batch-size", "1000", "--buffer-partitions", 2, "--eval-every", 1, "--metrics-out", out[scheme]]
        assert common.run(nc.PROG, nc.main, [str(a) for a in argv]) == 0
    return out


def plot_through_cli(monkeypatch, argv):
    """Run ``graphstore plot`` in process; returns (exit code, the Figures it drew)."""
    drawn = []
    real = graphstore.plot.plot_runs

    def keep(*args, **kwargs):
        drawn.append(real(*args, **kwargs))
        return drawn[-1]

    monkeypatch.setattr(graphstore.plot, "plot_runs", keep)
    return cli.main(["plot", *map(str, argv)]), drawn


def test_plot_draws_each_run_in_every_panel(runs, tmp_path, monkeypatch, capsys):
    png = tmp_path / "runs.png"
    code, drawn = plot_through_cli(monkeypatch, [runs["megabatch"], runs["disk"], "-o", png])
    assert code == 0 and len(drawn) == 1
    assert f"wrote {png}: 2 run(s) (megabatch, disk)" in capsys.readouterr().out
    fig = drawn[0]
    axes = {ax.get_label(): ax for ax in fig.axes}
    assert list(axes) == list(graphstore.plot.PANELS)
    # One line per run, two in the time panel (compute, stall), nothing else drawn as a line.
    assert {name: len(ax.get_lines()) for name, ax in axes.items()} == {"loss": 2, "valid": 2, "time": 4,
                                                                       "bytes": 2}
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(SCHEMES)
    assert axes["valid"].get_title() == "validation accuracy"

    # Each line is the file's numbers, not just a line.
    for i, scheme in enumerate(SCHEMES):
        epochs = json.loads(runs[scheme].read_text())["epochs"]
        assert len(epochs) == EPOCHS
        loss = axes["loss"].get_lines()[i]
        assert loss.get_label() == scheme
        np.testing.assert_array_equal(loss.get_xdata(), np.arange(1, EPOCHS + 1))
        np.testing.assert_allclose(loss.get_ydata(), [e["train_loss"] for e in epochs])
        np.testing.assert_allclose(axes["valid"].get_lines()[i].get_ydata(), [e["valid"]["acc"] for e in epochs])
        compute, stall = axes["time"].get_lines()[2 * i:2 * i + 2]
        assert (compute.get_linestyle(), stall.get_linestyle()) == ("-", "--")
        assert compute.get_color() == stall.get_color() == loss.get_color()
        np.testing.assert_allclose(stall.get_ydata(), [e["io"]["stall_s"] for e in epochs])
        np.testing.assert_allclose(np.asarray(compute.get_ydata()) + stall.get_ydata(),
                                   [max(e["time_s"], e["io"]["stall_s"]) for e in epochs])
        mib = np.asarray(axes["bytes"].get_lines()[i].get_ydata())
        np.testing.assert_allclose(mib, [e["io"]["bytes_read"] / 2**20 for e in epochs])
        assert mib[0] > 0  # both schemes read partitions from the store

    # The PNG decodes at the figure's size (10 x 7 inches at the default 110 dpi) and shows
    # both runs' colours (matplotlib's C0 blue and C1 orange, at the lines' centres).
    pixels = matplotlib.image.imread(png)
    assert pixels.shape == (770, 1100, 4)
    rgb = np.round(pixels[..., :3] * 255).astype(np.int64).reshape(-1, 3)
    for colour in ((31, 119, 180), (255, 127, 14)):
        assert (np.abs(rgb - colour).sum(1) <= 6).sum() > 500, colour


def test_same_scheme_twice_is_told_apart_and_dpi_sets_the_size(runs, tmp_path, monkeypatch):
    other = tmp_path / "again.json"
    other.write_text(runs["disk"].read_text())
    png = tmp_path / "small.png"
    code, drawn = plot_through_cli(monkeypatch, [runs["disk"], other, "-o", png, "--dpi", "55"])
    assert code == 0
    assert [t.get_text() for t in drawn[0].legends[0].get_texts()] == ["disk (disk.json)", "disk (again.json)"]
    assert matplotlib.image.imread(png).shape == (385, 550, 4)


def link_record(valid):
    """A link-prediction metrics record with the trainer's fields, one epoch per ``valid``."""
    return {"task": "link_prediction", "config": {"scheme": "disk", "store": "kg.gs", "eval": "filtered"},
            "epochs": [{"epoch": i, "train_loss": 5.0 - i, "valid": v, "time_s": 1.0,
                        "io": {"stall_s": 0.25, "bytes_read": 2**20}} for i, v in enumerate(valid)]}


def test_link_prediction_draws_the_evaluated_epochs_of_its_metric(tmp_path):
    path = tmp_path / "lp.json"
    path.write_text(json.dumps(link_record([None, {"mrr": 0.2}, None, {"mrr": 0.3}])))
    fig = graphstore.plot.plot_runs([path])
    valid = {ax.get_label(): ax for ax in fig.axes}["valid"]
    assert valid.get_title() == "validation MRR"
    (line,) = valid.get_lines()
    np.testing.assert_array_equal(line.get_xdata(), [2, 4])
    np.testing.assert_allclose(line.get_ydata(), [0.2, 0.3])
    time = {ax.get_label(): ax for ax in fig.axes}["time"]
    np.testing.assert_allclose(time.get_lines()[0].get_ydata(), [0.75] * 4)  # compute = time - stall


def bad_files():
    """(file contents, what the one-line error must say)"""
    good = link_record([{"mrr": 0.2}])
    no_stall = json.loads(json.dumps(good))
    del no_stall["epochs"][0]["io"]["stall_s"]
    text_loss = json.loads(json.dumps(good))
    text_loss["epochs"][0]["train_loss"] = "high"
    no_metric = link_record([{"hits@10": 0.5}])
    return [
        ({k: v for k, v in good.items() if k != "epochs"}, "no 'epochs' list"),
        ({**good, "epochs": []}, "'epochs' is empty"),
        (no_stall, "epochs[0] has no 'io.stall_s' field"),
        (text_loss, "epochs[0].train_loss is 'high', expected a number"),
        (no_metric, "epochs[0] has no 'valid.mrr' field"),
        ({**good, "config": {"store": "kg.gs"}}, "no 'config.scheme' field"),
        ({**good, "task": "ranking"}, "unknown task 'ranking'"),
        ([1, 2], "got a JSON list"),
    ]


def test_bad_metrics_files_are_one_line_naming_file_and_field(tmp_path, capsys):
    for i, (content, needle) in enumerate(bad_files()):
        path = tmp_path / f"bad{i}.json"
        path.write_text(json.dumps(content))
        assert cli.main(["plot", str(path), "-o", str(tmp_path / "x.png")]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"graphstore plot: error: {path}: ") and needle in err, (needle, err)
        assert err.count("\n") == 1
    (tmp_path / "torn.json").write_text('{"task": "link_prediction", "epochs": [')
    assert cli.main(["plot", str(tmp_path / "torn.json"), "-o", str(tmp_path / "x.png")]) == 1
    assert "torn.json: not JSON" in capsys.readouterr().err
    assert cli.main(["plot", str(tmp_path / "absent.json"), "-o", str(tmp_path / "x.png")]) == 1
    assert "absent.json: no such metrics file" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists() and not list(tmp_path.glob(".x.png*"))


def test_runs_of_different_metrics_are_refused(runs, tmp_path, capsys):
    lp = tmp_path / "lp.json"
    lp.write_text(json.dumps(link_record([{"mrr": 0.2}])))
    assert cli.main(["plot", str(runs["disk"]), str(lp), "-o", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert "its validation metric is 'mrr'" in err and "'acc'" in err and err.count("\n") == 1


def test_without_matplotlib_the_error_names_the_extra(tmp_path, monkeypatch, capsys):
    path = tmp_path / "lp.json"
    path.write_text(json.dumps(link_record([{"mrr": 0.2}])))
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import fail
    assert cli.main(["plot", str(path), "-o", str(tmp_path / "x.png")]) == 1
    assert capsys.readouterr().err == ("graphstore plot: error: plotting needs matplotlib: "
                                       "pip install graphstore[plot]\n")


# ---------------------------------------------------------------------- tools/plot_benchmarks.py

def test_benchmark_figures_from_the_committed_json(tmp_path):
    from tools import plot_benchmarks as pb

    bench = REPO / "docs" / "benchmarks"
    figures = pb.make_figures(bench)
    assert set(figures) == set(pb.FIGURES) >= {"outofcore", "outofcore_300k", "macrobatch", "inference",
                                              "microbatch", "sampling", "buffer", "convert"}
    for name, fig in figures.items():
        assert fig.get_suptitle(), name  # the configuration is in the title
        for ax in fig.axes:
            drawn = [*ax.patches, *ax.get_lines(), *ax.collections]
            assert drawn, f"{name}: empty axes"
            assert ax.get_xlabel() or ax.get_ylabel(), f"{name}: an axes without a label"

    # The bars are the JSON's numbers: the out-of-core run's epoch times, one bar per row
    # (DGL's worker settings expanded, the OOM-killed one drawn as text, not as a bar).
    runs = json.loads((bench / "outofcore_300k.json").read_text())["runs"]
    epoch_axes = figures["outofcore_300k"].axes[0]
    widths = [bar.get_width() for bar in epoch_axes.patches]
    (dgl,) = [r for r in runs if r["system"] == "dgl-memmap-widecap"]
    expected = [r["epoch_s_median"] for r in runs if r is not dgl] + list(dgl["num_workers_epoch_s"].values())
    assert len(widths) == len(expected) == len(runs) - 1 + 4  # DGL at 0, 2, 4 and 8 workers
    np.testing.assert_allclose(sorted(w for w in widths if w > 0), sorted(v for v in expected if v is not None))
    assert any("OOM" in t.get_text() for t in epoch_axes.texts)
    # Micro-batching: per dataset, one line per strategy and the whole-batch reference.
    micro = figures["microbatch"].axes
    assert [len(ax.get_lines()) for ax in micro] == [5, 5, 5, 5]

    written = pb.write_figures(figures, tmp_path, dpi=110)
    assert sorted(p.name for p in written) == sorted(f"{n}.png" for n in pb.FIGURES)
    for path in written:
        pixels = matplotlib.image.imread(path)
        fig = figures[path.stem]
        expected = np.array([fig.get_figheight(), fig.get_figwidth()]) * 110
        assert np.all(np.abs(np.array(pixels.shape[:2]) - expected) < 1), (path, pixels.shape)  # Agg truncates
        assert path.stat().st_size < 150_000, path
        assert pixels[..., :3].std() > 0.1, path  # not a blank page


def test_benchmark_figures_bad_json_is_one_line(tmp_path, capsys):
    from tools import plot_benchmarks as pb

    record = json.loads((REPO / "docs" / "benchmarks" / "macrobatch.json").read_text())
    del record["runs"][2]["epoch_s_median"]
    (tmp_path / "macrobatch.json").write_text(json.dumps(record))
    assert pb.main(["--bench-dir", str(tmp_path), "--out", str(tmp_path / "out"), "--only", "macrobatch"]) == 1
    err = capsys.readouterr().err
    assert err == f"plot_benchmarks.py: error: {tmp_path / 'macrobatch.json'}: no field runs[2].epoch_s_median\n"
    assert pb.main(["--bench-dir", str(tmp_path), "--only", "nonesuch"]) == 1
    assert "unknown figure(s) ['nonesuch']" in capsys.readouterr().err
