"""BatchGNN's aggregation cache end to end: ``graphstore aggregate`` stores every node's
aggregate (equal to a dense reference, checksummed block by block, recorded in the
manifest, written atomically); the first SAGE, GCN or GIN layer taking it equals the layer
over every neighbour; the macrobatch loader reads it with the features and trains on it."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import graphstore
from graphstore.cli import main as cli
from graphstore.errors import ConfigError, CorruptStoreError
from graphstore.inference import aggregate_store
from graphstore.layout._aggregates import aggregate_array
from graphstore.loaders import NodeLoader
from graphstore.nn import AGGREGATE_FOR, GNN, normalize_rows
from graphstore.sample import sample_dense
from tests.nn.test_aggregate import dense_reference

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cora_path(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cora") / "cora.gs"
    graphstore.convert(REPO / "data" / "cora", out, num_partitions=7, partitioner="metis")
    for op in ("mean", "sum", "gcn"):
        aggregate_store(out, op, buffer_bytes=64 << 20)
    return out


def edges_and_features(store) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    p = store.num_partitions
    buckets = [store.read_bucket(i, j) for j in range(p) for i in range(p)]
    src = np.concatenate([b[0] for b in buckets]).astype(np.int64)
    dst = np.concatenate([b[1] for b in buckets]).astype(np.int64)
    return src, dst, np.asarray(store.features[...], dtype=np.float64)


@pytest.mark.parametrize("op", ["mean", "sum", "gcn"])
def test_the_stored_aggregate_is_every_nodes_aggregate(cora_path, op):
    with graphstore.open(cora_path) as store:
        src, dst, x = edges_and_features(store)
        want = dense_reference(op, x, src, dst)
        record = store.aggregates[op]
        assert record["array"] == aggregate_array(op) and record["input"] == "features"
        stored = store.array(record["array"])
        assert stored.shape == x.shape and str(stored.dtype) == "float32"
        assert float(np.abs(stored[...] - want).max()) < 1e-5
        # Scattered reads of it go block by block, verified, like the features'.
        ids = np.array([0, 5, 388, 1000, store.num_nodes - 1])
        np.testing.assert_array_equal(store.read_row_set(record["array"], ids), stored[...][ids])
        assert store.verifies_partial_reads


def test_verify_covers_it_and_names_a_damaged_block(cora_path, tmp_path):
    copy = tmp_path / "cora.gs"
    shutil.copytree(cora_path, copy)
    assert graphstore.verify(copy)["ok"]
    chunk = next(c for c in sorted((copy / "nodes" / "aggregated_mean" / "c").rglob("*")) if c.is_file())
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with graphstore.open(copy) as store, pytest.raises(CorruptStoreError, match="aggregated_mean"):
        store.read_row_set("nodes/aggregated_mean", np.array([0]))  # byte 100 is in row 0
    with pytest.raises(CorruptStoreError, match="aggregated_mean"):
        graphstore.verify(copy)


def test_normalized_input_is_recorded_and_replaces_the_array(cora_path, tmp_path):
    copy = tmp_path / "cora.gs"
    shutil.copytree(cora_path, copy)
    assert cli(["aggregate", str(copy), "--op", "mean", "--normalize-features", "row"]) == 0
    with graphstore.open(copy) as store:
        src, dst, x = edges_and_features(store)
        want = dense_reference("mean", normalize_rows(torch.from_numpy(x)).numpy(), src, dst)
        assert store.aggregates["mean"]["input"] == "row-normalized features"
        assert float(np.abs(store.array("nodes/aggregated_mean")[...] - want).max()) < 1e-6
        assert set(store.aggregates) == {"mean", "sum", "gcn"}  # the others kept
    assert not list(copy.glob(".aggregate-*"))


def test_a_failed_run_leaves_the_store_as_it_was(cora_path, tmp_path):
    copy = tmp_path / "cora.gs"
    shutil.copytree(cora_path, copy)
    manifest = (copy / "zarr.json").read_text()
    before = (copy / "nodes" / "aggregated_sum" / "zarr.json").read_text()
    (copy / ".aggregate-sum-building").mkdir()  # a killed earlier run's leftovers
    # Too small a budget fails inside the walk, after the new array was started.
    with pytest.raises(ConfigError, match="too small"):
        aggregate_store(copy, "sum", buffer_bytes=1 << 20)
    assert (copy / "zarr.json").read_text() == manifest
    assert (copy / "nodes" / "aggregated_sum" / "zarr.json").read_text() == before
    assert not list(copy.glob(".aggregate-*"))
    assert graphstore.verify(copy)["ok"]


def test_bad_requests_get_one_line_errors(cora_path, tmp_path, capsys):
    assert cli(["aggregate", str(tmp_path / "missing.gs"), "--op", "mean"]) == 1
    assert "no such store" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="mean, sum, gcn"):
        aggregate_store(cora_path, "max")
    copy = tmp_path / "bare.gs"
    graphstore.convert(REPO / "data" / "cora", copy, num_partitions=4)
    with graphstore.open(copy) as store, pytest.raises(ConfigError, match=r"graphstore aggregate .* --op mean"):
        NodeLoader(store, fanouts=(5,), batch_size=32, scheme="macrobatch", aggregated="mean")
    with graphstore.open(cora_path) as store, pytest.raises(ConfigError, match="macrobatch scheme"):
        NodeLoader(store, fanouts=(5,), batch_size=32, scheme="minibatch", aggregated="mean")


@pytest.mark.parametrize("kind", ["sage", "gcn", "gin"])
def test_the_first_layer_on_the_aggregate_is_the_layer_over_every_neighbour(cora_path, kind):
    """One hop sampled plus the stored aggregate equals two hops of every neighbour
    (global in-degrees for GCN): the same model, the same output."""
    torch.manual_seed(0)
    with graphstore.open(cora_path) as store, torch.no_grad():
        loader = NodeLoader(store, split="test", fanouts=(-1, -1), batch_size=64, shuffle=False)
        graph = next(iter(loader.epoch(0))).graph  # the whole graph, in memory
        model = GNN(kind, in_dim=store.feature_dim, hidden_dim=16, out_dim=7, num_layers=2).double().eval()
        x = torch.from_numpy(np.asarray(store.features[...], dtype=np.float64))
        agg = torch.from_numpy(np.asarray(store.array(aggregate_array(AGGREGATE_FOR[kind]))[...], dtype=np.float64))
        deg = torch.from_numpy(store.read_degree("in"))
        targets = torch.arange(0, store.num_nodes, 97)
        full = sample_dense(graph, targets, (-1, -1), generator=torch.Generator().manual_seed(0))
        one = sample_dense(graph, targets, (-1,), generator=torch.Generator().manual_seed(0))
        ids_full, ids_one = graph.node_ids[full.node_ids], graph.node_ids[one.node_ids]
        kw_full = {"degrees": deg[ids_full]} if kind == "gcn" else {}
        kw_one = {"degrees": deg[ids_one]} if kind == "gcn" else {}
        want = model(x[ids_full], full, **kw_full)
        got = model(x[ids_one], one, aggregated=agg[ids_one], **kw_one)
        # The aggregate is stored in float32: agreement to its precision.
        assert float((got - want).abs().max()) < 1e-4 * max(1.0, float(want.abs().max()))
        with pytest.raises(ConfigError, match="1 sampled hops"):
            model(x[ids_full], full, aggregated=agg[ids_full])


def test_gat_and_rgcn_cannot_take_it():
    model = GNN("gat", in_dim=4, hidden_dim=4, out_dim=2, num_layers=2)
    with pytest.raises(ConfigError, match="cannot take stored aggregates"):
        model(torch.zeros(3, 4), [], aggregated=torch.zeros(3, 4))


def test_the_macrobatch_loader_reads_it_with_the_features_and_trains(cora_path):
    with graphstore.open(cora_path) as store:
        stored = np.asarray(store.array("nodes/aggregated_mean")[...])
        features = np.asarray(store.features[...])
        kw = {"split": "train", "fanouts": (10,), "batch_size": 32, "scheme": "macrobatch", "seed": 3}
        loaders = [NodeLoader(store, aggregated="mean", macro_batches=2, **kw),
                   NodeLoader(store, aggregated="mean", macro_batches="all", feature_cache_bytes=1 << 20, **kw)]
        for loader in loaders:
            assert loader.settings.aggregated == "mean"
            for batch in loader.epoch(0):
                ids = batch.store_ids.numpy()
                assert batch.dense.num_layers == 1
                np.testing.assert_array_equal(batch.aggregated.numpy(), stored[ids])
                np.testing.assert_array_equal(batch.features.numpy(), features[ids])
        torch.manual_seed(0)
        model = GNN("sage", in_dim=store.feature_dim, hidden_dim=32, out_dim=store.num_classes, num_layers=2,
                    dropout=0.5)
        opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
        for epoch in range(30):
            model.train()
            for batch in loaders[0].epoch(epoch):
                loss = F.cross_entropy(model(batch.features, batch.dense, aggregated=batch.aggregated), batch.labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
        model.eval()
        test = NodeLoader(store, split="test", fanouts=(-1,), batch_size=500, scheme="macrobatch",
                          aggregated="mean", shuffle=False)
        correct = sum(int((model(b.features, b.dense, aggregated=b.aggregated).argmax(1) == b.labels).sum())
                      for b in test.epoch(0))
        assert correct / 1000 > 0.70  # Cora, GraphSage: ~0.8 (0.14 by chance)


def test_the_trainer_takes_it(cora_path, tmp_path):
    metrics = tmp_path / "m.json"
    args = ["--store", str(cora_path), "--scheme", "macrobatch", "--model", "gcn", "--epochs", "3",
            "--fanouts", "5,5", "--aggregation-cache", "--metrics-out", str(metrics)]
    sys.path.insert(0, str(REPO))
    from trainers.node_classification import main as train

    assert train(args) == 0
    record = json.loads(metrics.read_text())
    assert record["config"]["aggregation_cache"] is True
    assert record["config"]["loaders"]["train"]["aggregated"] == "gcn"
    assert record["config"]["loaders"]["train"]["fanouts"] == [5]
    assert record["epochs"][-1]["macro_batching"]["rows_fetched"] > 0
    with pytest.raises(ConfigError, match="macrobatch"):
        train(["--store", str(cora_path), "--scheme", "minibatch", "--aggregation-cache"])
    with pytest.raises(ConfigError, match="not linear"):
        train(["--store", str(cora_path), "--scheme", "macrobatch", "--model", "gat", "--aggregation-cache"])
    with pytest.raises(ConfigError, match="row-normalized|--normalize-features"):
        train(["--store", str(cora_path), "--scheme", "macrobatch", "--aggregation-cache",
               "--normalize-features", "row", "--epochs", "1"])


def test_a_batch_names_its_aggregate_and_the_model_refuses_another_op(cora_path):
    """A SAGE model given the stored sum ran without a word (issue 31, 5): the batch carries
    the aggregate's op and input, and the model refuses an op its first layer does not take."""
    with graphstore.open(cora_path) as store:
        kw = {"split": "train", "fanouts": (5,), "batch_size": 64, "scheme": "macrobatch", "seed": 3}
        model = GNN("sage", in_dim=store.feature_dim, hidden_dim=8, out_dim=store.num_classes, num_layers=2)
        batch = next(NodeLoader(store, aggregated="sum", **kw).epoch(0))
        assert (batch.aggregated_from.op, batch.aggregated_from.input) == ("sum", "features")
        assert batch.aggregated_from.array.endswith("nodes/aggregated_sum")
        with pytest.raises(ConfigError) as err:
            model(batch.features, batch.dense, aggregated=batch.aggregated, aggregated_from=batch.aggregated_from)
        message = str(err.value)
        assert "\n" not in message and "nodes/aggregated_sum" in message
        assert "'sum'" in message and "'mean'" in message
        right = next(NodeLoader(store, aggregated="mean", **kw).epoch(0))
        out = model(right.features, right.dense, aggregated=right.aggregated, aggregated_from=right.aggregated_from)
        assert out.shape == (right.dense.num_targets, store.num_classes)


def test_the_trainer_refuses_an_aggregate_of_other_inputs(cora_path):
    """The batch's aggregate was computed from unnormalised rows; a run that row-normalises
    its inputs must not add the two (issue 31, 5)."""
    sys.path.insert(0, str(REPO))
    from trainers import node_classification as nc

    with graphstore.open(cora_path) as store:
        batch = next(NodeLoader(store, split="train", fanouts=(5,), batch_size=64, scheme="macrobatch",
                                aggregated="mean").epoch(0))
    args = nc.NodeClassificationOptions.parse(["--store", str(cora_path), "--normalize-features", "row"])
    with pytest.raises(ConfigError, match="aggregated_mean.*features.*row-normalized features"):
        nc.prepare(batch, args)
    assert nc.prepare(batch, dataclasses.replace(args, normalize_features="none")) is batch
