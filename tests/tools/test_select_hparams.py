"""tools/select_hparams.py: the grid it runs, and a choice that reads validation only."""

from __future__ import annotations

import json

from tools import select_hparams as sh


def test_the_grid_is_every_combination_of_the_axes():
    points = sh.grid_points({"--lr": ["0.1", "0.2"], "--hidden": ["8", "16", "32"]})
    assert len(points) == 6 and len({tuple(p) for p in points}) == 6
    assert points[0] == ["--lr", "0.1", "--hidden", "8"] and points[-1] == ["--lr", "0.2", "--hidden", "32"]


def test_the_choice_is_the_best_validation_and_ties_go_to_the_last_epoch():
    rows = [{"flags": ["a"], "valid_best_mean": 0.93, "valid_final_mean": 0.90},
            {"flags": ["b"], "valid_best_mean": 0.95, "valid_final_mean": 0.88},
            {"flags": ["c"], "valid_best_mean": 0.95, "valid_final_mean": 0.91}]
    assert sh.choose(rows)["flags"] == ["c"]
    assert sh.choose(rows[:2])["flags"] == ["b"]


def test_a_run_is_read_for_its_validation_figures_only(tmp_path):
    path = tmp_path / "m.json"
    # No test figure in the file: reading it must not need one.
    path.write_text(json.dumps({"best": {"valid": {"acc": 0.9}, "epoch": 7}, "final": {"valid": {"acc": 0.8}}}))
    assert sh.validation_figures(path) == {"valid_best": 0.9, "valid_final": 0.8, "best_epoch": 7}
