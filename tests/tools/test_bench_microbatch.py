"""Smoke test of tools/bench_microbatch.py: ``--quick`` on its small generated graph writes
the JSON the issues fix: reg's split needs no more inputs than a random one (issue 9), and
every memory figure is the allocator's peak, estimated within 5 % for every layer type
and K, with the saved-tensor sum kept as a second figure (issue 14), and reg's settings
(``reg_hops``, ``hub_threshold``) are recorded with cases measuring the hub threshold
against exact A^T A (issue 14).

Run as a subprocess: the command line and the JSON file are the interface outside checks use.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "bench_microbatch.py"
KEYS = {"dataset", "strategy", "k", "total_inputs", "split_s", "est_peak_bytes", "measured_peak_bytes"}
MEMORY_KEYS = {"peak_source", "est_peak_bytes", "measured_peak_bytes", "est_error", "held_bytes",
               "est_total_bytes", "measured_total_bytes", "est_total_error", "saved_tensor_bytes",
               "est_saved_tensor_bytes", "total_over_saved"}
KS = (2, 4, 8, 16, 32)
LAYERS = ("gat", "gcn", "gin", "rgcn", "sage")


HUB_KEYS = {"dataset", "strategy", "k", "hub_threshold", "total_inputs", "total_inputs_per_batch", "split_s",
            "target_graph_s", "metis_entries", "metis_entries_per_batch", "hub_nodes_per_batch",
            "max_shared_per_batch", "hub_threshold_value_per_batch"}


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("bench_microbatch")
    out = tmp / "out.json"
    proc = subprocess.run([sys.executable, str(TOOL), "--quick", "--threads", "1", "--json", str(out),
                           "--work-dir", str(tmp)], capture_output=True, text=True, cwd=REPO, timeout=240,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def test_cases_have_the_stable_keys(result):
    cases = result["cases"]
    assert {(c["strategy"], c["k"]) for c in cases} == {(s, k) for s in ("reg", "metis", "random", "range")
                                                         for k in KS}
    for c in cases:
        assert KEYS <= c.keys()
        assert c["dataset"] == "synthetic"
        assert isinstance(c["total_inputs"], int) and c["total_inputs"] > 0
        assert isinstance(c["est_peak_bytes"], int) and isinstance(c["measured_peak_bytes"], int)
        assert c["split_s"] >= 0 and c["measured_peak_bytes"] > 0


def test_reg_needs_no_more_inputs_than_random(result):
    by = {(c["strategy"], c["k"]): c["total_inputs"] for c in result["cases"]}
    for k in KS:
        assert by["reg", k] <= by["random", k], k


def test_split_adds_inputs_and_shrinks_the_peak(result):
    # K micro-batches together need at least the whole batch's inputs, each needing fewer.
    whole = result["baselines"][0]
    for c in result["cases"]:
        assert c["total_inputs"] >= whole["total_inputs"]
        assert c["est_peak_bytes"] <= whole["est_peak_bytes"]
        assert c["measured_peak_bytes"] <= whole["measured_peak_bytes"]


def test_every_peak_is_the_allocators(result):
    for c in result["cases"] + result["baselines"] + result["memory_cases"]:
        assert MEMORY_KEYS <= c.keys()
        assert c["peak_source"] == "cpu_allocator"
        assert c["measured_total_bytes"] == c["held_bytes"] + c["measured_peak_bytes"]
        # The saved-tensor figure is kept, reproduced exactly, and is below the real peak.
        assert c["est_saved_tensor_bytes"] == c["saved_tensor_bytes"] < c["measured_total_bytes"]
        assert abs(c["est_error"]) < 0.05 and abs(c["est_total_error"]) < 0.05


def test_memory_cases_cover_every_layer_type_and_k(result):
    assert {(c["kind"], c["k"]) for c in result["memory_cases"]} == {(kind, k) for kind in LAYERS
                                                                      for k in (1, *KS)}
    summary = result["goals"]["memory"]
    assert set(summary) == set(LAYERS)
    for kind, row in summary.items():
        worst = max(abs(c["est_error"]) for c in result["memory_cases"] if c["kind"] == kind)
        assert row["max_abs_est_error"] >= worst and row["under_5pct"], kind
    assert result["goals"]["est_error_under_5pct"] and result["goals"]["not_under_5pct"] == []
    assert result["goals"]["peak_sources"] == ["cpu_allocator"]


def test_settings_record_the_reg_parameters(result):
    from graphstore.sample.microbatch import DEFAULT_HUB_THRESHOLD

    settings = result["settings"]
    assert settings["reg_hops"] == 1
    assert settings["hub_threshold"] == DEFAULT_HUB_THRESHOLD == 64
    assert settings["hub_threshold_ks"] == [8] and settings["hub_thresholds"] == [64, "none"]


def test_hub_threshold_cases_against_exact_ata(result):
    rows = result["hub_threshold_cases"]
    assert {(c["k"], c["hub_threshold"]) for c in rows} == {(8, 64), (8, "none")}
    by = {c["hub_threshold"]: c for c in rows}
    default, exact = by[64], by["none"]
    targets = result["baselines"][0]["targets_per_batch"]
    for c in rows:
        assert HUB_KEYS <= c.keys()
        assert c["dataset"] == "synthetic" and c["strategy"] == "reg"
        assert isinstance(c["total_inputs"], int) and c["total_inputs"] >= result["baselines"][0]["total_inputs"]
        assert c["split_s"] > 0 and 0 < c["target_graph_s"] <= 10 * c["split_s"]
        assert all(e > 0 and e % 2 == 0 for e in c["metis_entries_per_batch"])  # both directions listed
    # The default row is the reg case itself: same batches, seeds and threshold.
    reg8 = next(c for c in result["cases"] if c["strategy"] == "reg" and c["k"] == 8)
    assert default["total_inputs_per_batch"] == reg8["total_inputs_per_batch"]
    # "none" is above the target count: nothing left out, exact A^T A.
    assert exact["hub_threshold_value_per_batch"] == [targets + 1]
    assert exact["hub_nodes_per_batch"] == [0]
    assert max(exact["max_shared_per_batch"]) <= targets
    # More nodes kept can only add entries; strictly more exactly when the default left hubs out.
    for d, e, hubs in zip(default["metis_entries_per_batch"], exact["metis_entries_per_batch"],
                          default["hub_nodes_per_batch"]):
        assert e >= d and (e > d) == (hubs > 0)
    for m, hubs in zip(default["max_shared_per_batch"], default["hub_nodes_per_batch"]):
        assert (hubs > 0) == (m > 64)
    summary = result["hub_threshold_summary"]["synthetic/k=8"]
    assert summary["inputs_default"] == default["total_inputs"] and summary["inputs_exact"] == exact["total_inputs"]
    assert summary["inputs_default_over_exact"] == pytest.approx(
        default["total_inputs"] / exact["total_inputs"] - 1, abs=1e-5)
    assert summary["metis_entries_exact"] >= summary["metis_entries_default"]


def test_a_low_threshold_leaves_hubs_out():
    # The quick graph has no node shared by more than 64 of 128 targets, so the run above
    # cannot show a threshold biting: here one of 4 does, on a small graph in-process.
    from tools import bench_microbatch as bench
    graph, features, labels, _ = bench.load_synthetic(2_000, 20_000, feature_dim=8, num_classes=4, seed=0)
    batches = bench.make_batches(graph, features, labels, num_batches=2, batch_size=128, seed=0)
    rows = bench.run_hub_thresholds("tiny", batches, [4], [4, None], seed=0, repeats=1)
    low, exact = rows
    assert low["hub_threshold"] == 4 and exact["hub_threshold"] == "none"
    assert all(h > 0 for h in low["hub_nodes_per_batch"]) and exact["hub_nodes_per_batch"] == [0, 0]
    pairs = [int(bench._shared_counts(b).sum()) for b in batches]  # non-zeros of A
    for d, e, p in zip(low["metis_entries_per_batch"], exact["metis_entries_per_batch"], pairs):
        assert d < e and d <= p * 4  # the guard's bound: pairs * hub_threshold
    summary = bench.hub_threshold_summary([dict(low, hub_threshold=bench.HUB_THRESHOLD), exact])
    assert summary["tiny/k=4"]["batches_with_hubs_left_out"] == 2


def test_unknown_dataset_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, str(TOOL), "--json", str(tmp_path / "x.json"), "--datasets",
                           "nope", "--work-dir", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert proc.returncode == 2
    assert "unknown dataset" in proc.stderr and "Traceback" not in proc.stderr
