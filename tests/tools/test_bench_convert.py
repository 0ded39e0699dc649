"""tools/bench_convert.py's edge-phase figures, from a real store's `graphstore info --json`
(the benchmark itself needs root and gigabytes; this checks the arithmetic on a tiny store)."""

from __future__ import annotations

import pytest

from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout._verify import store_summary
from tests.conftest import make_graph
from tools import bench_convert


def test_edge_phase_counts_what_the_phase_writes(tmp_path):
    graph, _ = make_graph(num_nodes=400, num_edges=3000, num_relations=3, feature_dim=0)
    convert(graph, tmp_path / "g.gs", ConvertOptions(num_partitions=4, partitioner="random"))
    info = store_summary(tmp_path / "g.gs")
    info["conversion"]["seconds"]["write edges"] = 0.5  # a fixed time, for exact figures
    phase = bench_convert.edge_phase(info, {"write_bytes_per_s": 1e9})
    arrays = info["arrays"]
    written = sum(arrays[name]["bytes_on_disk"] for name in
                  ("edges/src", "edges/dst", "edges/rel", "edges/bucket_offsets", "nodes/in_degree",
                   "nodes/out_degree"))
    assert written > 0
    assert phase["store_bytes"] == written
    assert phase["staged_edges_per_s"] == pytest.approx(info["conversion"]["staged_edges"] / 0.5)
    assert phase["stored_edges_per_s"] == pytest.approx(info["num_edges"] / 0.5)
    assert phase["store_bytes_vs_disk_write"] == pytest.approx(written / 0.5 / 1e9)
