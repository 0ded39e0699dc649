"""Tests of tools/bench_inference.py: the full-graph forward baseline (the model's own forward
over the whole graph in memory, no layer-wise walk) against the layer-wise outputs, its load
timed apart, the least-bytes limit, and (as root, where the benchmark's cgroup cap runs) the
``--quick`` benchmark end to end with every field the docs' table reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import graphstore
from graphstore.inference import infer_layerwise, save_model
from graphstore.nn import GNN
from tools import bench_inference as bi



@pytest.fixture(scope="module")
def cora(tmp_path_factory) -> Path:
    return bi.cora(tmp_path_factory.mktemp("bench_inference"))


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_full_graph_forward_equals_the_layerwise_outputs_and_times_its_load_apart(cora, tmp_path, kind):
    with graphstore.open(cora) as store:
        torch.manual_seed(0)
        model = GNN(kind, in_dim=store.feature_dim, hidden_dim=8, out_dim=store.num_classes, num_layers=2, heads=2)
        save_model(model, tmp_path / "model.pt")
        layerwise = infer_layerwise(model, store, capacity=2, work_dir=tmp_path / "scratch")
        n, f, e, store_classes = store.num_nodes, store.feature_dim, store.num_edges, store.num_classes
    spec = {"store": str(cora), "model": str(tmp_path / "model.pt"), "mode": "full_graph",
            "out": str(tmp_path / "full.npy"), "stats": str(tmp_path / "full.json")}
    bi.child(spec)
    out, stats = np.load(tmp_path / "full.npy"), json.loads((tmp_path / "full.json").read_text())
    assert out.shape == layerwise.shape == (n, store_classes)
    assert np.abs(out - layerwise).max() < 1e-4
    assert stats["load_seconds"] > 0 and stats["forward_seconds"] > 0 and stats["vm_hwm_bytes"] > 0
    assert stats["load_cpu_seconds"] > 0 and stats["forward_cpu_seconds"] > 0
    # Features float32, the edge index and its segments int64, the in-degree counts int64.
    assert stats["input_bytes"] == n * f * 4 + 2 * e * 8 + n * 8


def test_least_bytes_is_the_features_once_the_edges_each_layer_and_hidden_rows_twice(cora):
    with graphstore.open(cora) as store:
        n, f, e = store.num_nodes, store.feature_dim, store.num_edges
        assert bi.least_bytes(store, 1, 32) == n * f * 4 + e * 8
        assert bi.least_bytes(store, 3, 32) == n * f * 4 + 3 * e * 8 + 2 * (2 * n * 32 * 4)


capped = os.geteuid() == 0 and bi.benchkit.CGROUP_ROOT.is_dir()


@pytest.mark.slow
@pytest.mark.skipif(not capped, reason="the benchmark caps its out-of-core runs with a cgroup v1 group (root)")
def test_quick_run_reports_the_full_graph_baseline_beside_the_layerwise_runs(tmp_path):
    out = tmp_path / "inference.json"
    argv = ["--quick", "--quick-nodes", "20000", "--models", "sage,gcn", "--layers", "2", "--dd-mib", "16",
            "--no-drop-caches", "--workdir", str(tmp_path / "work"), "--json", str(out)]
    assert bi.main(argv) == 0
    result = json.loads(out.read_text())
    cases = result["cases"]
    assert [(c["dataset"], c["model"]) for c in cases] == [("cora", "sage"), ("cora", "gcn"),
                                                           ("synthetic_20000", "sage"), ("synthetic_20000", "gcn")]
    for c in cases:
        where = f"{c['dataset']} {c['model']}"
        # The layer-wise runs, out of core and in memory, equal the model's own forward.
        assert c["max_abs_diff"] < 1e-4 and c["max_abs_diff_in_memory"] < 1e-4, where
        assert c["full_graph_load_seconds"] > 0 and c["full_graph_forward_seconds"] > 0, where
        assert c["full_graph_process_seconds"] > c["full_graph_load_seconds"] + c["full_graph_forward_seconds"], where
        assert c["full_graph_peak_rss_bytes"] > c["full_graph_input_bytes"] > 0, where
        assert c["vs_full_graph_forward"] == pytest.approx(c["seconds"] / c["full_graph_forward_seconds"]), where
        assert c["vs_full_graph_load_and_forward"] < c["vs_full_graph_forward"], where
        # The least bytes are below what the walk read (it re-reads prepared rows and
        # accumulators); so the least-bytes limit is the stricter one.
        assert 0 < c["least_bytes"] <= c["bytes_read"], where
        assert c["vs_least_bytes_limit"] >= c["vs_physical_limit"], where
        assert c["least_bytes_limit_s"] == pytest.approx(c["least_bytes"] / result["dd_bytes_per_s"]), where
        assert min(c["cpu_seconds"], c["cpu_seconds_in_memory"], c["full_graph_load_cpu_seconds"],
                   c["full_graph_forward_cpu_seconds"]) > 0, where
        assert len(c["load_average"]) == len(c["load_average_end"]) == 3, where
        for key in ("seconds", "seconds_in_memory", "bytes_read", "vs_in_memory", "in_memory_vs_physical_limit"):
            assert key in c, (where, key)  # the fields the table read before are still there
    assert result["goals"]["exact"]["met"] is True
