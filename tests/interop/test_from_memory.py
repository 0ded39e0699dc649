"""`graphstore.from_pyg` and `graphstore.from_dgl`: a graph a PyG or DGL user holds becomes a
store. The independent check is Cora: PyG's own Planetoid loader reads the embedded raw
files (data/cora), and the store from its ``Data`` (and from the same graph as a DGL graph)
holds what graphstore's own planetoid reader made of those files: the same features,
labels, public split and edge set. Then a PyG model trains on batches of it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import graphstore
from graphstore.errors import SourceError
from graphstore.layout.dtypes import decode
from tests.conftest import REPO
from tests.interop.conftest import need


@pytest.fixture(scope="module")
def cora_data(tmp_path_factory):
    """Cora as PyG's Planetoid dataset processes it, from the embedded raw files (no download)."""
    pyg = need("torch_geometric", "pyg")
    root = tmp_path_factory.mktemp("pyg_cora")
    shutil.copytree(REPO / "data" / "cora" / "raw", root / "Cora" / "raw")
    return pyg.datasets.Planetoid(str(root), "Cora")[0]


def by_source_id(path) -> dict:
    """Features, labels, node splits (sets) and the edge set of a store, in source ids."""
    with graphstore.open(path) as store:
        n = store.num_nodes
        orig = store.to_source_ids(np.arange(n))
        feats = np.empty((n, store.feature_dim), np.float32)
        feats[orig] = decode(store.read_rows("nodes/features", 0, n), store.manifest.feature_dtype)
        labels = np.empty(n, np.int64)
        labels[orig] = store.labels[...]
        splits = {name: set(orig[store.read_node_split(name)].tolist()) for name in store.split_names}
        edges = set(zip(orig[store.array("edges/src")[...]].tolist(), orig[store.array("edges/dst")[...]].tolist(),
                        strict=True))
        return {"features": feats, "labels": labels, "splits": splits, "edges": edges, "manifest": store.manifest}


def assert_same_graph(ours: dict, reference: dict) -> None:
    np.testing.assert_array_equal(ours["features"], reference["features"])
    np.testing.assert_array_equal(ours["labels"], reference["labels"])
    assert ours["splits"] == reference["splits"]
    assert ours["edges"] == reference["edges"]
    assert ours["manifest"].num_classes == reference["manifest"].num_classes


def test_pyg_cora_is_the_store_graphstore_makes_of_the_files(pyg, cora_data, cora_path, tmp_path):
    manifest = graphstore.from_pyg(cora_data, tmp_path / "cora.gs", num_partitions=8, partitioner="metis")
    # PyG's Cora is symmetric: storing it undirected adds nothing (and warns of nothing).
    assert manifest.conversion["reverse_edges_added"] == 0 and manifest.num_edges == cora_data.num_edges
    assert manifest.splits == {"train": 140, "valid": 500, "test": 1000}
    assert manifest.source["files"]["split:valid"] == "from_pyg: data.val_mask"
    assert_same_graph(by_source_id(tmp_path / "cora.gs"), by_source_id(cora_path))


def test_a_pyg_model_trains_on_the_store(pyg, cora_data, tmp_path):
    graphstore.from_pyg(cora_data, tmp_path / "cora.gs", num_partitions=4)
    torch.manual_seed(0)
    model = pyg.nn.GraphSAGE(cora_data.num_features, 16, num_layers=2, out_channels=7)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    with graphstore.open(tmp_path / "cora.gs") as store:
        loader = store.node_loader(split="train", fanouts=(10, 5), batch_size=140, seed=0)
        for epoch in range(6):
            for batch in loader.epoch(epoch):
                data = batch.to_pyg()
                # The batch's targets carry the labels PyG's Data has for those nodes.
                ids = store.to_source_ids(data.n_id[: data.batch_size].numpy())
                assert torch.equal(data.y[: data.batch_size], cora_data.y[ids])
                assert cora_data.train_mask[ids].all()
                loss = torch.nn.functional.cross_entropy(model(data.x, data.edge_index)[: data.batch_size],
                                                         data.y[: data.batch_size])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.detach().item())
    assert len(losses) == 6 and np.isfinite(losses).all()
    assert losses[-1] < losses[0]  # the 140 training nodes are being fitted


def test_pyg_directed_graph_warns_or_keeps_its_edges(pyg, tmp_path):
    edge_index = torch.tensor([[0, 1, 2, 3, 1], [1, 2, 3, 0, 0]])  # 1->0 is the only reverse present
    data = pyg.data.Data(edge_index=edge_index, num_nodes=5)
    with pytest.warns(UserWarning, match=r"^from_pyg: data.edge_index was not symmetric: 3 reverse edges were "
                      r"added .*pass directed=True"):
        undirected = graphstore.from_pyg(data, tmp_path / "u.gs", splits={"valid": edge_index[:, :1],
                                                                          "test": edge_index[:, 1:2]})
    assert undirected.num_edges == 8 and not undirected.directed and undirected.num_nodes == 5
    kept = graphstore.from_pyg(data, tmp_path / "d.gs", directed=True, splits={"valid": edge_index[:, :1],
                                                                                "test": edge_index[:, 1:2]})
    assert kept.num_edges == 5 and kept.directed
    silent = graphstore.from_pyg(data, tmp_path / "s.gs", directed=False)  # asked for: no warning
    assert silent.tasks == ["link_prediction"] and set(silent.splits) == {"train", "valid", "test"}


def test_pyg_edge_types_become_relations_and_weights_are_named(pyg, tmp_path):
    rng = np.random.default_rng(0)
    edge_index = torch.from_numpy(rng.integers(0, 50, (2, 300)))
    data = pyg.data.Data(x=torch.randn(50, 4, requires_grad=True), edge_index=edge_index,
                         y=torch.from_numpy(rng.integers(0, 3, 50)), edge_type=torch.from_numpy(rng.integers(0, 5, 300)),
                         edge_weight=torch.rand(300), train_idx=torch.arange(20), test_idx=torch.arange(20, 50))
    with pytest.warns(UserWarning, match=r"^from_pyg: data.edge_weight not stored"):
        manifest = graphstore.from_pyg(data, tmp_path / "g.gs", directed=True)
    assert manifest.num_relations == 5 and manifest.splits == {"train": 20, "test": 30}
    back = by_source_id(tmp_path / "g.gs")
    np.testing.assert_array_equal(back["features"], data.x.detach().numpy())


def test_pyg_refusals_name_the_attribute(pyg, tmp_path):
    x = torch.ones(4, 2)
    edge_index = torch.tensor([[0, 1], [1, 2]])
    cases = [
        (pyg.data.Data(x=torch.ones(3, 2), edge_index=edge_index, num_nodes=4),
         r"^from_pyg: data.x: 3 rows, expected 4 \(one per node: data.num_nodes = 4\)$"),
        (pyg.data.Data(x=x, edge_index=edge_index, y=torch.zeros(4, 3)),
         r"^from_pyg: data.y: expected shape \[N\] .*multi-label"),
        (pyg.data.Data(x=x, edge_index=edge_index, y=torch.zeros(4, dtype=torch.long),
                       train_mask=torch.ones(4, 10, dtype=torch.bool)),
         r"^from_pyg: data.train_mask: expected node ids \[n\] or a boolean mask \[N\], got shape \(4, 10\) "
         r"\(10 splits side by side: pick one column\)$"),
        (pyg.data.Data(x=x, edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]).T.contiguous()),
         r"^from_pyg: data.edge_index: expected shape \[2, E\] \(or a pair \(src, dst\)\), got \(3, 2\) "
         r"\(transpose it: edge_index.T\)$"),
        (pyg.data.Data(x=x, edge_index=torch.tensor([[0, 1], [1, 9]])),
         r"^from_pyg: data.edge_index\[1, 1\]: node id 9 is out of range \[0, 4\)$"),
        (pyg.data.Data(x=x), r"^from_pyg: data has no edge_index"),
    ]
    for data, pattern in cases:
        with pytest.raises(SourceError, match=pattern):
            graphstore.from_pyg(data, tmp_path / "g.gs")
        assert list(tmp_path.iterdir()) == []
    hetero = pyg.data.HeteroData()
    hetero["paper"].x = torch.ones(3, 2)
    hetero["author"].x = torch.ones(2, 2)
    hetero["author", "writes", "paper"].edge_index = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(SourceError, match=r"^from_pyg: data is a HeteroData \(2 node types, 1 edge types\); .*"
                       r"data.to_homogeneous\(\)"):
        graphstore.from_pyg(hetero, tmp_path / "g.gs")


# ---------------------------------------------------------------------------- DGL


def cora_as_dgl(dgl, data):
    graph = dgl.graph((data.edge_index[0], data.edge_index[1]), num_nodes=data.num_nodes)
    graph.ndata["feat"] = data.x
    graph.ndata["label"] = data.y
    for name in ("train", "val", "test"):
        graph.ndata[f"{name}_mask"] = data[f"{name}_mask"]
    return graph


def test_dgl_cora_is_the_store_graphstore_makes_of_the_files(dgl, pyg, cora_data, cora_path, tmp_path):
    graph = cora_as_dgl(dgl, cora_data)
    manifest = graphstore.from_dgl(graph, tmp_path / "cora.gs", num_partitions=8)
    assert manifest.conversion["reverse_edges_added"] == 0 and manifest.splits == {"train": 140, "valid": 500,
                                                                                     "test": 1000}
    assert manifest.source["files"]["features"] == "from_dgl: graph.ndata['feat']"
    assert_same_graph(by_source_id(tmp_path / "cora.gs"), by_source_id(cora_path))


def test_dgl_relations_direction_and_refusals(dgl, tmp_path):
    rng = np.random.default_rng(1)
    src, dst = torch.from_numpy(rng.integers(0, 40, 200)), torch.from_numpy(rng.integers(0, 40, 200))
    graph = dgl.graph((src, dst), num_nodes=40)
    graph.ndata["feat"] = torch.randn(40, 3)
    graph.ndata["label"] = torch.from_numpy(rng.integers(0, 2, 40))
    graph.ndata["train_mask"] = torch.arange(40) < 30
    graph.edata[dgl.ETYPE] = torch.from_numpy(rng.integers(0, 3, 200))
    with pytest.warns(UserWarning, match=r"^from_dgl: graph.edges\(\) was not symmetric"):
        manifest = graphstore.from_dgl(graph, tmp_path / "u.gs")
    assert manifest.num_relations == 3 and manifest.splits == {"train": 30} and not manifest.directed
    kept = graphstore.from_dgl(graph, tmp_path / "d.gs", directed=True)
    triples = {(int(s), int(d), int(r)) for s, d, r in zip(src, dst, graph.edata[dgl.ETYPE], strict=True)}
    assert kept.num_edges == len(triples)

    graph.ndata["label"] = torch.zeros(40, 2)
    with pytest.raises(SourceError, match=r"^from_dgl: graph.ndata\['label'\]: expected shape \[N\]"):
        graphstore.from_dgl(graph, tmp_path / "bad.gs")
    hetero = dgl.heterograph({("user", "follows", "user"): ([0, 1], [1, 2]),
                              ("user", "buys", "item"): ([0], [0])})
    with pytest.raises(SourceError, match=r"^from_dgl: a heterograph \(2 node types, 2 edge types\); .*"
                       r"dgl.to_homogeneous"):
        graphstore.from_dgl(hetero, tmp_path / "h.gs")
    assert not (tmp_path / "bad.gs").exists() and not (tmp_path / "h.gs").exists()
