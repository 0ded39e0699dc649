"""Smoke test of tools/bench_microbatch.py: ``--quick`` on its small generated graph writes
the JSON the issue fixes, and reg's split needs no more inputs than a random one.

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
KS = (2, 4, 8, 16, 32)


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("bench_microbatch")
    out = tmp / "out.json"
    proc = subprocess.run([sys.executable, str(TOOL), "--quick", "--threads", "1", "--json", str(out),
                           "--work-dir", str(tmp)], capture_output=True, text=True, cwd=REPO, timeout=240)
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


def test_unknown_dataset_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, str(TOOL), "--json", str(tmp_path / "x.json"), "--datasets",
                           "nope", "--work-dir", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2
    assert "unknown dataset" in proc.stderr and "Traceback" not in proc.stderr
