"""Smoke test of tools/bench_partition.py through its Python entry on a tiny graph: the JSON
has the fixed keys, the ratios are computed against METIS in the same run, and the
measured figures are the ones a reader would check (random cuts almost everything)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphstore.layout._native import partition as compiled
from tools import bench_partition

REPO = Path(__file__).resolve().parents[2]
KEYS = {"partitioner", "num_nodes", "num_edges", "edge_cut", "seconds", "peak_rss_bytes",
        "cut_ratio_vs_metis", "speed_ratio_vs_metis", "cap_bytes"}


@pytest.fixture(scope="module")
def tool():
    return bench_partition


@pytest.fixture(scope="module")
def result(tool, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("bench_partition")
    out = tmp / "out.json"
    code = tool.main(["--json", str(out), "--sizes", "20000", "--partitions", "16", "--no-cap", "--warm",
                      "--cache-dir", str(tmp / "cache")])
    assert code == 0
    return json.loads(out.read_text())


def test_every_case_has_the_fixed_keys(result):
    cases = result["cases"]
    assert [c["case"] for c in cases] == ["metis", "stream", "random", "stream-numpy"]
    assert [c["partitioner"] for c in cases] == ["metis", "stream", "random", "stream"]
    for c in cases:
        assert KEYS <= c.keys(), KEYS - c.keys()
        assert c["num_nodes"] == 20_000 and c["num_edges"] > 150_000
        assert 0 < c["edge_cut"] < 1 and c["seconds"] > 0 and c["peak_rss_bytes"] > 20 << 20
        assert c["cap_bytes"] is None and "error" not in c


def test_ratios_are_against_metis_in_the_same_run(result):
    by = {c["case"]: c for c in result["cases"]}
    assert by["metis"]["cut_ratio_vs_metis"] == 1.0 and by["metis"]["speed_ratio_vs_metis"] == 1.0
    assert by["stream"]["cut_ratio_vs_metis"] == pytest.approx(
        by["stream"]["edge_cut"] / by["metis"]["edge_cut"], rel=1e-3)
    # A graph with communities: METIS and stream keep most edges inside, random does not.
    assert by["random"]["edge_cut"] > 0.9
    assert by["stream"]["edge_cut"] < 0.5
    assert by["stream"]["cut_ratio_vs_metis"] < 1.3
    summary = result["summary"][0]
    assert summary["num_nodes"] == 20_000 and set(summary["cases"]) == {"metis", "stream", "random", "stream-numpy"}
    # The compiled kernels beside the numpy path: the same labels, a measured ratio.
    kernels = summary["stream_kernels"]
    assert kernels["same_labels"] and kernels["speedup"] > 0
    # "c" wherever the library was built (setup.py's optional extension: not without a compiler).
    assert by["stream"]["info"]["kernels"] == ("c" if compiled.library() is not None else "numpy")
    assert by["stream-numpy"]["info"]["kernels"] == "numpy"
    assert result["goals"]["checked"] and result["goals"]["within_memory_cap"] is None


def test_settings_name_the_graph(result, tool):
    settings = result["settings"]
    assert settings["sizes"] == [20_000] and settings["num_partitions"] == 16
    assert settings["generator"] == {"20000": tool.communities_for(20_000)} == {"20000": 10}
    assert tool.communities_for(7_340_032) == 1280 and tool.communities_for(1 << 20) == 180


def test_unknown_partitioner_is_refused(tool, tmp_path, capsys):
    assert tool.main(["--json", str(tmp_path / "x.json"), "--partitioners", "metis,kahip",
                      "--cache-dir", str(tmp_path)]) == 2
    assert "kahip" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
