"""tools/bench_macrobatch.py: the rows it runs, how a child's epochs become the row the issue
asks for (warm epochs only; fetch counters by median), and `--quick` end to end on a tiny
cached store, twice (the second run reuses the store and its aggregate). The full run needs
root, a 4.5 GB store and DGL; here the runs are uncapped and leave the page cache alone."""

from __future__ import annotations

import argparse
import json

import pytest

from tools import bench_macrobatch as bm
from tools import bench_outofcore as ooc

TINY = {"num_nodes": 3000, "avg_degree": 6, "feature_dim": 8, "num_classes": 4, "communities": 8,
        "locality": 0.75, "homophily": 0.2, "num_partitions": 4, "seed": 0}
"""bench_outofcore's quick store at a size a test builds in seconds."""


def _args(**kw):
    base = dict(macro_batch_bytes=32 << 20, macro_batches=[8, 64, -1], cache_at=8, cache_bytes=1 << 25,
                cache_lookahead=8, dgl_workers=4, systems=None)
    return argparse.Namespace(**{**base, **kw})


def test_every_row_of_the_issue_is_run_and_can_be_chosen():
    names = [r["system"] for r in bm.systems(_args())]
    assert names == ["graphstore-minibatch-disk", "graphstore-macrobatch-B8", "graphstore-macrobatch-B64",
                     "graphstore-macrobatch-Ball", "graphstore-macrobatch-B8-belady", "graphstore-macrobatch-B8-lru",
                     "graphstore-macrobatch-B1-aggregated", "graphstore-macrobatch-B8-aggregated",
                     "graphstore-macrobatch-Ball-uncapped", "graphstore-memory", "dgl-memmap"]
    rows = {r["system"]: r for r in bm.systems(_args())}
    assert rows["graphstore-minibatch-disk"]["macro_batches"] == 1 and rows["graphstore-memory"]["capped"] is False
    assert rows["graphstore-macrobatch-Ball-uncapped"]["macro_batch_bytes"] is None
    assert rows["graphstore-macrobatch-B8-lru"]["cache"] == "lru"
    assert rows["graphstore-macrobatch-B1-aggregated"]["aggregated"] == "mean"
    assert "aggregated" not in rows["graphstore-macrobatch-B8"]
    chosen = bm.systems(_args(systems="dgl-memmap,graphstore-memory"))
    assert [r["system"] for r in chosen] == ["graphstore-memory", "dgl-memmap"]


def test_a_row_summarizes_the_warm_epochs_only():
    def epoch(e, seconds, fetched):
        return {"epoch": e, "time_s": seconds, "loader_wait_s": 1.0, "device_read_bytes": 10 * e,
                "input_nodes_per_target": 30.0,
                "fetch": {"rows_requested": 100, "rows_union": 90, "rows_fetched": fetched, "cache_hits": 90 - fetched,
                          "requests": 7, "bytes_read": fetched * 4096}}

    row = bm.summarize({"epochs": [epoch(0, 99.0, 90), epoch(1, 5.0, 60), epoch(2, 7.0, 80)]})
    assert row["epoch0_s"] == 99.0 and row["epoch_s_median"] == 6.0  # epoch 0 (cold, structure) apart
    assert row["rows_fetched"] == 70 and row["cache_hits"] == 20 and row["bytes_read"] == 70 * 4096
    # A row without fetch counters (DGL, in memory) reports the device's bytes.
    dgl = bm.summarize({"epochs": [{k: v for k, v in epoch(e, 3.0, 0).items() if k != "fetch"} for e in (0, 1)]})
    assert dgl["rows_fetched"] is None and dgl["bytes_read"] == 10


SAME_MODEL = ["graphstore-minibatch-disk", "graphstore-macrobatch-B2", "graphstore-macrobatch-Ball",
              "graphstore-macrobatch-B2-belady", "graphstore-memory"]


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory):
    """Two `--quick` runs sharing a cache directory: every kind of row, then two rows again."""
    cache = tmp_path_factory.mktemp("macro_quick")
    # Trained enough (lr 0.05, 3 epochs) that equal test accuracies say the models are equal.
    common = ["--quick", "--cache-dir", str(cache), "--targets", "400", "--eval-targets", "200",
              "--batch-size", "100", "--fanouts", "5,5", "--hidden", "16", "--lr", "0.05", "--epochs", "3",
              "--threads", "1", "--macro-batches", "2,all", "--cache-at", "2", "--cache-bytes", "16KiB",
              "--cache-lookahead", "2", "--dgl-venv", str(cache / "no-dgl-venv")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ooc, "QUICK_STORE", TINY)
        # A test must not drop the machine's page cache nor need a cgroup: run as a non-root user would.
        mp.setattr(ooc, "isolation", lambda: {"cap_enforced": False, "page_cache_dropped": False,
                                              "why": "a test: no cap, no drop_caches"})
        first, second = cache / "first.json", cache / "second.json"
        systems = SAME_MODEL + ["graphstore-macrobatch-B1-aggregated", "dgl-memmap"]
        assert bm.main([*common, "--json", str(first), "--systems", ",".join(systems)]) == 0
        assert bm.main([*common, "--json", str(second), "--systems",
                        "graphstore-macrobatch-B1-aggregated,graphstore-memory"]) == 0
    return cache, json.loads(first.read_text()), json.loads(second.read_text())


def test_quick_runs_every_row_and_the_rows_mean_what_they_say(quick_runs):
    cache, result, _ = quick_runs
    by = {r["system"]: r for r in result["runs"]}
    assert list(by) == [*SAME_MODEL[:4], "graphstore-macrobatch-B1-aggregated", "graphstore-memory",
                        "dgl-memmap"]
    assert result["quick"] is True and result["store"]["num_nodes"] == TINY["num_nodes"]
    assert result["store"]["path"] == str(cache / "quick_metis.gs")
    assert result["quick_store"]["reused"] is False and result["quick_store"]["params"]["num_nodes"] == 3000
    assert result["mem_cap_bytes"] == 1 << 30 and len(result["dd_runs"]) == 2  # --quick's floor of a cap
    skipped = by["dgl-memmap"]["skipped"]
    assert skipped.startswith("DGL not available") and "no-dgl-venv" in skipped
    for name in SAME_MODEL + ["graphstore-macrobatch-B1-aggregated"]:
        row = by[name]
        assert row["returncode"] == 0 and "error" not in row, row.get("error")
        assert [e["epoch"] for e in row["epochs"]] == [0, 1, 2] and row["epoch_s_median"] > 0
        assert row["epochs"][1]["samples"] == 400
    # Exact sampling: whatever is fetched and however, every row trains the same model.
    assert len({by[name]["test_acc"] for name in SAME_MODEL}) == 1
    assert 0.5 < by["graphstore-memory"]["test_acc"] <= 1  # trained: 4 classes
    b1, b2, ball, belady = (by[n] for n in SAME_MODEL[:4])
    assert b1["rows_requested"] == b2["rows_requested"] == ball["rows_requested"] == b1["rows_fetched"]
    # A larger B fetches each row its mini-batches share once.
    assert ball["rows_union"] < b2["rows_union"] < b1["rows_union"] and ball["rows_fetched_vs_B1"] < 1
    assert belady["rows_union"] == b2["rows_union"]  # the same macro-batches; the cache serves some rows
    assert belady["cache_hits"] > 0 and belady["rows_fetched"] == belady["rows_union"] - belady["cache_hits"]
    # The aggregation cache samples one hop fewer: fewer input rows a target.
    agg = by["graphstore-macrobatch-B1-aggregated"]
    assert agg["input_rows_per_target"] < b1["input_rows_per_target"]
    assert result["aggregate"]["reused"] is False and agg["settings"]["aggregated"] == "mean"


def test_quick_reuses_its_cached_store_and_aggregate(quick_runs):
    cache, first, second = quick_runs
    assert second["quick_store"]["reused"] is True and second["quick_store"]["build_s"] == 0.0
    assert second["store"]["path"] == first["store"]["path"] == str(cache / "quick_metis.gs")
    assert second["aggregate"]["reused"] is True
    assert second["aggregate"]["array"] == first["aggregate"]["array"]
    again = {r["system"]: r["test_acc"] for r in second["runs"]}
    assert again == {r["system"]: r["test_acc"] for r in first["runs"] if r["system"] in again}  # seeded
