"""tools/defaults_vs_recipes.py: one real quick run on Cora, its JSON read back against the
run's own metrics file."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_quick_run_reports_the_restored_models_figures(tmp_path):
    data = REPO.parent / "shared" / "data"
    if not (data / "cora_planetoid").is_dir():
        pytest.skip("../shared/data not present")
    out = tmp_path / "d.json"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "defaults_vs_recipes.py"), "--quick", "--datasets",
                           "cora", "--work", str(tmp_path / "w"), "--data", str(data), "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    (run,) = result["runs"]["cora/defaults"]
    metrics = json.loads((tmp_path / "w" / "quick" / "cora" / "defaults" / "seed0.json").read_text())
    assert run["valid"] == metrics["final"]["valid"]["acc"] and run["test"] == metrics["final"]["test"]["acc"]
    assert run["epochs"] == len(metrics["epochs"]) <= 5
    assert run["batch_size"] == 64 and run["normalize_features"] == "row"  # derived from Cora's data
    assert metrics["config"]["derived"]["batch_size"].startswith("min(1000, max(64")
    assert result["summary"]["cora/defaults"]["test"] == run["test"]
