"""Tests of tools/fault_matrix.py: a fast subset of its rows run for real (flipped bits in
an edge bucket and a node partition, a truncated chunk file, a second ``r+`` opener,
ENOSPC during convert when root), and its helpers on a real store.

The helpers are imported (``tools.fault_matrix``); the rows run with the tool as a
subprocess (its exit, its cleanup of mounts and processes, and a hard timeout are then
the test's, not pytest's, problem).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tools import fault_matrix as fm

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "fault_matrix.py"

FAST_ROWS = ["flip_src", "flip_labels", "truncated_chunk", "second_writer_open", "enospc_convert"]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> tuple[list[dict], str]:
    """The fast rows, run once by the tool's command line; (rows, stdout)."""
    root = tmp_path_factory.mktemp("faults")
    out = root / "faults.json"
    res = subprocess.run([sys.executable, str(TOOL), "--json", str(out), "--workdir", str(root / "work"),
                          "--only", ",".join(FAST_ROWS)],
                         capture_output=True, text=True, timeout=180, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    # The tool removes its work directory: nothing of the run is left but the JSON.
    assert list((root / "work").iterdir()) == []
    return json.loads(out.read_text()), res.stdout


def test_each_fast_row_is_detected_with_one_line_and_nothing_lost(matrix):
    rows, _ = matrix
    assert [r["name"] for r in rows] == [s.name for s in fm.select_rows(",".join(FAST_ROWS))]  # table order
    for r in rows:
        if r["name"] == "enospc_convert" and os.geteuid() != 0:
            assert r["detected"] == "not run" and "root" in r["how"]
            continue
        assert r["detected"] == "yes", (r["name"], r["problems"])
        assert r["ok"] and not r["problems"], (r["name"], r["problems"])
        assert r["data_lost"] == "none", r
        assert r["exit_code"] == 1 and r["one_line"] is True, r
        assert "\n" not in r["how"] and ": error: " in r["how"], r
        assert r["seconds"] > 0 and r["commands"], r


def test_the_errors_name_what_was_damaged(matrix):
    rows = {r["name"]: r for r in matrix[0]}
    # The partial read path (one bucket, one partition of a chunk) is what caught the bits.
    src = rows["flip_src"]
    assert "edges/src bucket (src partition" in src["how"] and "chunk file c/0" in src["how"]
    assert "edges/src bucket (src partition" in src["details"]["direct_read"]["message"]
    assert "edges/src" in src["details"]["verify"]
    labels = rows["flip_labels"]
    assert "nodes/labels partition 3 " in labels["how"]
    assert "chunk file is" in rows["truncated_chunk"]["how"]
    writer = rows["second_writer_open"]
    assert "StoreLockedError" in writer["how"] and "(pid " in writer["how"]
    if rows["enospc_convert"]["detected"] == "yes":
        assert "no space left on device" in rows["enospc_convert"]["how"]
        assert rows["enospc_convert"]["details"]["left_on_tmpfs"] == []


def test_the_markdown_table_has_a_line_per_row(matrix):
    rows, stdout = matrix
    table = [line for line in stdout.splitlines() if line.startswith("|")]
    assert table[0].startswith("| fault | detected | how | data_lost | exit_code | one_line | seconds |")
    assert len(table) == 2 + len(rows)
    assert f"{len(rows)} rows in" in stdout


def test_chunk_location_and_flip_bit_hit_the_row_asked_for(tmp_path):
    import graphstore

    lab = fm.Lab(tmp_path, seed=0)
    store = lab.copy(lab.cora(), tmp_path / "c.gs")
    with graphstore.open(store) as s:
        lo, hi = s.bucket_range(2, 2)
        before = s.read_rows("edges/dst", 0, s.num_edges)
    row = (lo + hi) // 2
    path, offset, row_bytes = fm.chunk_location(store, "edges/dst", row)
    assert (path.relative_to(store).as_posix(), row_bytes) == ("edges/dst/c/0", 4)
    fm.flip_bit(path, offset + 1, bit=3)  # 8 << 3 = 2048 added to (or taken from) that id
    raw = np.frombuffer(path.read_bytes()[:-4], dtype="<i4")
    assert abs(int(raw[row]) - int(before[row])) == 2048
    assert np.array_equal(np.delete(raw[: len(before)], row), np.delete(before, row))
    with pytest.raises(ValueError, match="not inside the data"):
        fm.flip_bit(path, path.stat().st_size - 2)  # the crc32c trailer is not data


def test_rows_are_selected_by_name_or_group():
    assert [s.name for s in fm.select_rows("missing")] == ["missing_chunk", "missing_chunk_compressed",
                                                            "missing_chunk_offsets",
                                                            "missing_chunk_split"]
    assert [s.name for s in fm.select_rows("flip_rel,second_writer")] == [
        "flip_rel", "second_writer_open", "second_writer_trainer"]
    with pytest.raises(SystemExit, match="unknown rows or groups"):
        fm.select_rows("flip,nonsense")


def test_markdown_cells_stay_on_one_line():
    r = fm.Row(name="x", fault="a | b", how="line one\nline two", exit_code=1, one_line=True)
    r.check("caught", True)
    r.finish()
    assert r.detected == "yes" and r.ok
    last = fm.markdown_table([r]).splitlines()[-1]
    assert last == "| a \\| b | yes | line one line two | none | 1 | True | 0.0 |"
