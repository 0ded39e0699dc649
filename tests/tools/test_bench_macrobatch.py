"""tools/bench_macrobatch.py's pieces: the rows it runs and how a child's epochs become the
row the issue asks for (warm epochs only; fetch counters by median). The whole run needs
root, a 4.5 GB store and DGL, so it is not run here; `--quick` is its harness check."""

from __future__ import annotations

import argparse

from tools import bench_macrobatch as bm


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
