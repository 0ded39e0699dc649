"""Tests of tools/bench_outofcore.py's pieces, in process, without root and without DGL.

The benchmark itself needs a cgroup, a multi-GiB store and DGL's own interpreter; what is
checked here is what decides its numbers: the DGL workers' gather (sorted reads, rows
back in the block's order), the capacity rule of the paper configuration and a budget's
refusal, the epoch summary (warm median, cold epoch apart), the choice of DGL's best
``num_workers``, the settings every run records, the goals, and the --quick store cache.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch

from tools import bench_outofcore as bo

REPO = Path(__file__).resolve().parents[2]


TINY = {"num_nodes": 3000, "avg_degree": 6, "feature_dim": 8, "num_classes": 4, "communities": 8,
        "locality": 0.75, "homophily": 0.2, "num_partitions": 4, "seed": 0, "layout_code": "test"}


# ---------------------------------------------------------------------- DGL's worker gather

@pytest.fixture
def memmap_features(tmp_path):
    rows = np.arange(200, dtype=np.float32).reshape(50, 4)  # row i = [4i, 4i+1, 4i+2, 4i+3]
    path = tmp_path / "features.f32"
    rows.tofile(path)
    return np.memmap(path, dtype=np.float32, mode="r", shape=rows.shape), rows


def test_gather_rows_sorted_equals_a_plain_gather(memmap_features):
    feats, rows = memmap_features
    ids = np.array([49, 3, 17, 3, 0, 25, 48, 1])
    got = bo.gather_rows_sorted(feats, ids)
    assert got.dtype == np.float32 and got.shape == (8, 4)
    np.testing.assert_array_equal(got, rows[ids])


class _RecordingRows:
    """An array stand-in that records the index of each gather."""

    def __init__(self, rows):
        self.rows, self.shape, self.dtype, self.seen = rows, rows.shape, rows.dtype, []

    def __getitem__(self, index):
        self.seen.append(np.asarray(index).copy())
        return self.rows[index]


def test_gather_reads_rows_in_ascending_order(memmap_features):
    _, rows = memmap_features
    recorder = _RecordingRows(rows)
    ids = np.array([30, 2, 44, 9, 2, 13])
    got = bo.gather_rows_sorted(recorder, ids)
    assert len(recorder.seen) == 1
    assert np.all(np.diff(recorder.seen[0]) >= 0), recorder.seen[0]  # one forward pass over the file
    np.testing.assert_array_equal(got, rows[ids])


class _FakeBlock:
    def __init__(self, num_src: int):
        self.num_src = num_src

    def num_src_nodes(self) -> int:
        return self.num_src


class _FakeNeighborSampler:
    """Returns DGL's (input_nodes, output_nodes, blocks): the seeds first, then new nodes."""

    def sample(self, g, seeds):
        input_nodes = torch.cat([seeds, torch.tensor([40, 7, 22])])
        return input_nodes, seeds, [_FakeBlock(input_nodes.numel()), _FakeBlock(seeds.numel())]


def test_gathering_sampler_gives_each_batch_its_rows_and_labels(memmap_features):
    feats, rows = memmap_features
    labels = torch.arange(50, dtype=torch.int64) * 10
    sampler = bo.GatheringSampler(_FakeNeighborSampler(), feats, labels)
    seeds = torch.tensor([12, 5, 31])
    input_nodes, output_nodes, blocks, x, y = sampler.sample(None, seeds)
    assert input_nodes.tolist() == [12, 5, 31, 40, 7, 22] and torch.equal(output_nodes, seeds)
    assert torch.equal(x, torch.from_numpy(rows[input_nodes.numpy()]))  # the block's order, not sorted
    assert y.tolist() == [120, 50, 310]
    assert blocks[0].num_src_nodes() == x.shape[0]


# ---------------------------------------------------------------------- the paper's capacity rule

class _FakeLoader:
    """A NodeLoader stand-in: a budget of B MiB admits B // 100 partitions, none below 100."""

    calls: ClassVar[list[dict]] = []

    def __init__(self, store, *, buffer_bytes=None, capacity=None, **kw):
        type(self).calls.append({"buffer_bytes": buffer_bytes, "capacity": capacity, **kw})
        if buffer_bytes is not None:
            if buffer_bytes < 100 << 20:
                raise ValueError("budget refuses")
            capacity = (buffer_bytes >> 20) // 100
        self.capacity = capacity


def _paper_spec(buffer_mib: int) -> dict:
    return {"fanouts": [10, 5], "batch_size": 100, "scheme": "megabatch", "seed": 0, "reuse": 2,
            "static_cache": 0.01, "buffer_bytes": buffer_mib << 20, "min_capacity": 4}


def test_paper_capacity_is_the_budgets_when_it_admits_p_over_16():
    _FakeLoader.calls = []
    loader, choice = bo.build_train_loader(_FakeLoader, None, _paper_spec(600), nodes=None)
    assert loader.capacity == 6 and len(_FakeLoader.calls) == 1
    assert choice["capacity_rule"] == "buffer_bytes" and choice["budget_capacity"] == 6


def test_paper_capacity_is_raised_to_p_over_16_and_says_so():
    _FakeLoader.calls = []
    loader, choice = bo.build_train_loader(_FakeLoader, None, _paper_spec(250), nodes=None)
    assert loader.capacity == 4
    assert [c["capacity"] for c in _FakeLoader.calls] == [None, 4]
    assert _FakeLoader.calls[1]["buffer_bytes"] is None and _FakeLoader.calls[1]["static_cache"] == 0.01
    assert choice["budget_capacity"] == 2 and "admits 2" in choice["capacity_rule"]


def test_a_refusing_budget_is_not_worked_around():
    _FakeLoader.calls = []
    with pytest.raises(ValueError, match="refuses"):
        bo.build_train_loader(_FakeLoader, None, _paper_spec(50), nodes=None)
    assert len(_FakeLoader.calls) == 1  # no second try with an explicit capacity


# ---------------------------------------------------------------------- epochs, DGL's best, settings

def _epochs(times, **extra):
    return [{"epoch": i, "time_s": t, "cpu_s": t, "samples": 1000, "batches": 10, "input_nodes_per_target": 30.0,
             "samples_per_s": 1000 / t, "loader_wait_s": 0.0, "compute_s": t, "compute_share": 1.0,
             "device_read_bytes": 100 * (i + 1), "stopped_by_time_budget": False, **extra} for i, t in enumerate(times)]


def test_summary_reports_the_warm_median_and_the_cold_epoch_apart():
    s = bo.summarize_epochs(_epochs([50.0, 4.0, 6.0, 5.0]), targets=1000, batch_size=100)
    assert s["epoch_s_median"] == 5.0 and s["epoch0_s"] == 50.0
    assert s["warm_epochs_s"] == [4.0, 6.0, 5.0] and s["warm_epochs"] == 3
    assert s["bytes_read"] == 300 and not s["projected"]


def test_summary_projects_a_run_stopped_by_its_budget():
    eps = _epochs([20.0])
    eps[0].update(stopped_by_time_budget=True, batches=2)
    s = bo.summarize_epochs(eps, targets=1000, batch_size=100)
    assert s["projected"] and s["epoch_s_median"] == pytest.approx(100.0)  # 10 s a batch, 10 batches


def test_best_dgl_row_is_the_fastest_finished_setting_and_keeps_all():
    rows = {"0": {"system": "dgl-memmap", "epoch_s_median": 110.6},
            "4": {"system": "dgl-memmap", "epoch_s_median": 66.8},
            "8": {"system": "dgl-memmap", "epoch_s_median": None, "error": "killed"}}
    best = bo.best_dgl_row(rows)
    assert best["best_num_workers"] == 4 and best["epoch_s_median"] == 66.8
    assert best["num_workers_tried"] == [0, 4, 8]
    assert best["num_workers_results"] is rows and best["num_workers_epoch_s"]["8"] is None


def test_best_dgl_row_fails_when_no_setting_finished():
    best = bo.best_dgl_row({"0": {"epoch_s_median": None, "error": "segfault"},
                            "2": {"epoch_s_median": None, "error": "oom"}})
    assert best["epoch_s_median"] is None and best["best_num_workers"] is None
    assert "segfault" in best["error"] and "oom" in best["error"]


def test_the_paper_rows_run_under_dgls_wide_cap_with_the_budget_it_leaves():
    import argparse

    bench = bo.Bench.__new__(bo.Bench)  # the caps only, without stores or children
    bench.args = argparse.Namespace(process_mib=576)
    bench.cap, bench.wide_cap = 1 << 30, 2176 << 20
    bench.specs = bo.system_specs(buffer_bytes=448 << 20, num_partitions=64, dgl_epochs=2, readahead_budget_s=90.0)
    for name in (bo.PAPER, bo.PAPER_STREAM):
        assert bench.cap_for(name) == (2176 << 20, {"buffer_bytes": (2176 - 576) << 20})
    assert bench.cap_for("graphstore-megabatch") == (1 << 30, None)
    assert bench.cap_for("graphstore-disk") == (1 << 30, None)
    assert bench.cap_for(bo.MEMORY) == (None, None)


def test_dgl_settings_are_compared_under_one_cap():
    """4 workers are killed by the cap: they run under the wide cap, and so do 0 and 2 again,
    so the best setting is chosen among runs under one cap."""
    import argparse

    bench = bo.Bench.__new__(bo.Bench)  # the sweep only, without stores or children
    bench.args = argparse.Namespace(dgl_workers=[0, 2, 4], dgl_wide_cap_only=False)
    bench.iso, bench.cap, bench.wide_cap, bench.dgl_killed = ISO, 1 << 30, 2 << 30, []
    launched = []

    def fake_run_system(name, cap_bytes, overrides):
        w = overrides["num_workers"]
        launched.append((w, cap_bytes))
        if cap_bytes == bench.cap and w == 4:
            return {"system": name, "mem_cap_bytes": cap_bytes, "epoch_s_median": None, "oom": True, "error": "oom"}
        # more page cache under the wide cap: faster
        return {"system": name, "mem_cap_bytes": cap_bytes, "epoch_s_median": (10 - w) * cap_bytes / bench.cap}

    bench.run_system = fake_run_system
    results = bench.dgl_sweep()
    assert launched == [(0, 1 << 30), (2, 1 << 30), (4, 1 << 30), (4, 2 << 30), (0, 2 << 30), (2, 2 << 30)]
    assert {r["mem_cap_bytes"] for r in results.values()} == {2 << 30}
    assert results["0"]["under_cap_result"]["epoch_s_median"] == 10 and "killed_under_cap" in results["4"]
    best = bo.best_dgl_row(results)
    assert best["best_num_workers"] == 4 and best["system"] == "dgl-memmap-widecap"


STORE = {"path": "/s.gs", "role": "main", "num_partitions": 64, "partitioner": "metis", "edge_cut": 0.25}
ISO = {"cap_enforced": True, "page_cache_dropped": True, "why": None}


def test_every_run_records_the_same_settings_keys():
    specs = bo.system_specs(buffer_bytes=448 << 20, num_partitions=64, dgl_epochs=3, readahead_budget_s=90.0)
    assert specs[bo.PAPER]["min_capacity"] == 4 and specs[bo.PAPER]["static_cache"] == 0.01
    assert specs[bo.PAPER]["reuse"] == 2 and specs[bo.PAPER_STREAM]["store_role"] == "stream"
    common = {"fanouts": [10, 5], "batch_size": 1000, "epochs": 3}
    for name, extra in specs.items():
        spec = dict(common, **extra, system=name)
        settings = bo.run_settings(spec, None, store=STORE, cap_bytes=1 << 30, iso=ISO)
        assert set(bo.SETTINGS_KEYS) <= settings.keys(), name
        assert settings["partitioner"] == "metis" and settings["mem_cap_bytes"] == 1 << 30
    dgl = bo.run_settings({**common, **specs["dgl-memmap"], "num_workers": 8, "system": "dgl-memmap"},
                          {"num_workers": 8}, store=STORE, cap_bytes=1 << 30, iso=ISO)
    assert dgl["num_workers"] == 8 and dgl["num_partitions"] is None and dgl["static_cache_fraction"] == 0.0


def test_settings_report_what_the_loader_chose_and_the_missing_cap():
    spec = dict(fanouts=[10, 5], batch_size=1000, epochs=2, system=bo.PAPER,
                **bo.system_specs(buffer_bytes=1 << 28, num_partitions=64, dgl_epochs=2,
                                  readahead_budget_s=1.0)[bo.PAPER])
    reported = {"policy": "hierbatching", "capacity": 4, "static_cache_nodes": 20972, "store": "/elsewhere"}
    no_root = {"cap_enforced": False, "page_cache_dropped": False, "why": "not root"}
    s = bo.run_settings(spec, reported, store=dict(STORE, path="/q.gs"), cap_bytes=1 << 30, iso=no_root)
    assert (s["policy"], s["capacity"], s["static_cache_nodes"]) == ("hierbatching", 4, 20972)
    assert s["store"] == "/q.gs" and not s["cap_enforced"] and not s["page_cache_dropped"]


# ---------------------------------------------------------------------- goals

def _row(system, epoch_s, acc=0.96, samples=300_000, **extra):
    return {"system": system, "epoch_s_median": epoch_s, "test_acc": acc, "samples_per_epoch": samples, **extra}


def test_goals_are_computed_from_the_runs():
    # The paper's rows train each target twice an epoch (reuse 2): the goals compare the
    # time per training sample.
    runs = [_row(bo.PAPER, 10.0, 0.965, 600_000), _row(bo.MEMORY, 4.5, 0.972),
            _row(bo.PAPER_STREAM, 12.0, 0.945, 600_000), _row("dgl-memmap-widecap", 55.9, 0.967, best_num_workers=8)]
    goals = bo.compute_goals(runs, targets=300_000)
    assert set(goals) == {"paper_vs_dgl_best", "paper_vs_memory", "paper_accuracy_gap", "stream_accuracy_gap"}
    assert all({"value", "goal", "met"} <= g.keys() for g in goals.values())
    assert goals["paper_vs_dgl_best"]["value"] == pytest.approx(11.18) and goals["paper_vs_dgl_best"]["met"]
    assert goals["paper_vs_dgl_best"]["dgl_num_workers"] == 8
    assert goals["paper_vs_dgl_best"]["epoch_ratio"] == pytest.approx(5.59)
    assert goals["paper_vs_memory"]["value"] == pytest.approx(5 / 4.5) and goals["paper_vs_memory"]["met"]
    assert goals["paper_vs_memory"]["epoch_ratio"] == pytest.approx(10 / 4.5)
    assert goals["paper_accuracy_gap"]["value"] == pytest.approx(0.7) and goals["paper_accuracy_gap"]["met"]
    assert goals["stream_accuracy_gap"]["value"] == pytest.approx(2.7) and goals["stream_accuracy_gap"]["met"] is False


def test_goals_say_why_they_have_no_value():
    runs = [_row(bo.PAPER, None, None, refused="buffer budget 469,762,048 bytes is below ..."),
            _row(bo.MEMORY, 1.1, 0.972), _row("dgl-memmap", 60.0),
            {"system": bo.PAPER_STREAM, "skipped": "no --store-stream given", "epoch_s_median": None}]
    goals = bo.compute_goals(runs, targets=60_000)
    for key in goals:
        assert goals[key]["value"] is None and goals[key]["met"] is None, key
    assert "below" in goals["paper_vs_dgl_best"]["why_no_value"]
    assert "--store-stream" in goals["stream_accuracy_gap"]["why_no_value"]


def test_the_memory_goal_is_checked_at_300k_targets_only():
    runs = [_row(bo.PAPER, 3.3), _row(bo.MEMORY, 1.1)]
    goal = bo.compute_goals(runs, targets=60_000)["paper_vs_memory"]
    assert goal["value"] == pytest.approx(3.0) and goal["met"] is None and "300,000" in goal["why_not_checked"]
    assert bo.compute_goals(runs, targets=300_000)["paper_vs_memory"]["met"] is False


# ---------------------------------------------------------------------- --quick

def test_quick_cap_leaves_the_features_several_times_the_buffer():
    cap = bo.quick_cap_mib(2 << 30, 576)
    assert cap == 1024 and (2 << 30) / ((cap - 576) << 20) > 4
    assert bo.quick_cap_mib(1 << 20, 576) == 576 + 64  # never a budget below 64 MiB


def test_the_full_run_refuses_to_run_without_a_cap(monkeypatch, tmp_path):
    monkeypatch.setattr(bo, "isolation", lambda: {"cap_enforced": False, "page_cache_dropped": False,
                                                  "why": "not root"})
    with pytest.raises(SystemExit):
        bo.parse_args(["--json", str(tmp_path / "o.json")])
    _, args = bo.parse_args(["--json", str(tmp_path / "o.json"), "--quick", "--cache-dir", str(tmp_path)])
    assert args.epochs >= 2 and args.dgl_epochs >= 2 and args.workdir == tmp_path / "work"
    assert "dgl-memmap-readahead" not in args.systems and bo.PAPER_STREAM in args.systems


def test_quick_without_a_dgl_interpreter_says_why(tmp_path):
    import argparse

    args = argparse.Namespace(quick=True, dgl_python=None, dgl_venv=str(tmp_path / "no-venv"))
    py, why = bo.find_dgl_python(args, print)
    assert py is None and why.startswith("not available:") and "no-venv" in why


@pytest.fixture(scope="module")
def quick_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("quick_cache")
    built = bo.ensure_quick_stores(cache, TINY, lambda msg: None)
    return cache, built


def test_quick_stores_are_built_once_then_reused(quick_cache):
    cache, built = quick_cache
    assert not built["reused"] and not (cache / "synthetic").exists()  # the dataset is not kept
    again = bo.ensure_quick_stores(cache, TINY, lambda msg: None)
    assert again["reused"] and again["metis"] == built["metis"]
    assert json.loads((cache / "quick_stores.json").read_text())["params"] == TINY


def test_quick_stores_are_invalid_with_other_parameters_or_damage(quick_cache, tmp_path):
    cache, _ = quick_cache
    assert bo.quick_stores_invalid(cache, TINY) is None
    assert "layout_code" in bo.quick_stores_invalid(cache, dict(TINY, layout_code="other"))
    assert "num_nodes" in bo.quick_stores_invalid(cache, dict(TINY, num_nodes=4000))
    copy = tmp_path / "copy"
    shutil.copytree(cache, copy)
    shutil.rmtree(copy / "quick_metis.gs")
    shutil.copytree(copy / "quick_stream.gs", copy / "quick_metis.gs")  # the wrong partitioner
    assert "expected" in bo.quick_stores_invalid(copy, TINY)
    (copy / "quick_stores.json").unlink()
    assert "no quick_stores.json" in bo.quick_stores_invalid(copy, TINY)


def test_paper_child_on_a_small_store_trains_or_reports_a_refusal(quick_cache, tmp_path):
    """The graphstore child in process: the paper configuration trains 2 epochs with at least
    p/16 partitions; a budget too small for the 1 % cache comes back as a refusal."""
    import graphstore

    _, built = quick_cache
    store = graphstore.open(built["metis"])
    train, test = bo.choose_targets(store, seed=0, targets=300, eval_targets=100)
    files = bo.write_targets(tmp_path, "tiny", train, test)
    spec = dict(bo.system_specs(buffer_bytes=64 << 20, num_partitions=store.num_partitions, dgl_epochs=2,
                                readahead_budget_s=1.0)[bo.PAPER],
                store=str(built["metis"]), targets=str(files["targets"]), eval_targets=str(files["eval_targets"]),
                fanouts=[5, 5], batch_size=100, hidden=16, lr=0.01, threads=1, epochs=2, seed=0, system=bo.PAPER)
    out = bo.child_graphstore(spec)
    assert len(out["epochs"]) == 2 and out["settings"]["capacity"] >= spec["min_capacity"] == 1
    assert out["settings"]["static_cache_fraction"] == 0.01 and out["settings"]["reuse"] == 2
    assert out["epochs"][1]["samples"] == 2 * train.size  # reuse 2: each target twice an epoch
    assert 0.0 <= out["test_acc"] <= 1.0
    refused = bo.child_graphstore(dict(spec, buffer_bytes=4096))
    assert "epochs" not in refused and "4,096" in refused["refused"]
