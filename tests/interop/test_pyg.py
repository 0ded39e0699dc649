"""PyG: `to_pyg` gives what PyG's sampled training reads, the store serves as PyG's remote
backend for its own NodeLoader and LinkLoader, and PyG GraphSAGE models reach Cora's
accuracy both ways (the examples in examples/, run as a user runs them)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from graphstore.errors import ConfigError, ReadOnlyStoreError
from graphstore.interop import pyg as interop_pyg
from graphstore.loaders import EdgeLoader
from tests.conftest import REPO

ACCURACY = 0.78


def _edge_list(store) -> list[tuple[int, int]]:
    """Every stored edge (src, dst), parallel edges repeated, sorted."""
    p = store.num_partitions
    buckets = [store.read_bucket(i, j) for i in range(p) for j in range(p)]
    return sorted(zip(np.concatenate([b[0] for b in buckets]).tolist(), np.concatenate([b[1] for b in buckets]).tolist()))


def _store_edges(store) -> set[tuple[int, int]]:
    return set(_edge_list(store))


def _check_sample(data, store, edges, features):
    """A sampled Data against the store: rows, labels and every edge, through n_id."""
    n_id = data.n_id
    assert torch.equal(data.x, features[n_id])
    labels = torch.from_numpy(np.asarray(store.labels[...]).astype(np.int64))
    assert torch.equal(data.y, labels[n_id])
    src, dst = n_id[data.edge_index[0]], n_id[data.edge_index[1]]
    assert set(zip(src.tolist(), dst.tolist())) <= edges
    assert sum(data.num_sampled_nodes) == data.num_nodes and sum(data.num_sampled_edges) == data.num_edges
    if "batch_size" in data:  # PyG's LinkLoader sets none: its seeds are the endpoints
        assert data.num_sampled_nodes[0] == data.batch_size
    # Edges run into nodes of the hop before theirs: layer 1 of trim_to_layer keeps only
    # the edges whose two ends survive the cut.
    cut_nodes = data.num_nodes - data.num_sampled_nodes[-1]
    cut_edges = data.num_edges - data.num_sampled_edges[-1]
    assert int(data.edge_index[:, :cut_edges].max()) < cut_nodes
    assert bool((data.edge_index[1].diff() >= 0).all())


@pytest.mark.parametrize("scheme", ["megabatch", "minibatch", "disk", "macrobatch"])
def test_node_batches_become_pyg_data(pyg, small, scheme):
    features = torch.from_numpy(np.asarray(small.features[...]))
    edges = _store_edges(small)
    loader = small.node_loader(split="train", fanouts=(4, 3), batch_size=32, scheme=scheme, seed=0)
    seen = 0
    for batch in loader.epoch(0):
        data = batch.to_pyg()
        assert isinstance(data, pyg.data.Data)
        _check_sample(data, small, edges, features)
        assert torch.equal(data.n_id[:data.batch_size], batch.store_ids[-batch.dense.num_targets:])
        assert torch.equal(data.y[:data.batch_size], batch.labels)
        assert data.batch_size == batch.dense.num_targets
        seen += data.batch_size
    assert seen >= len(small.read_node_split("train"))


def test_relation_types_follow_their_edges(pyg, small):
    p = small.num_partitions
    relations: dict[tuple[int, int], set[int]] = {}
    for i in range(p):
        for j in range(p):
            for s, d, r in zip(*(a.tolist() for a in small.read_bucket(i, j))):
                relations.setdefault((s, d), set()).add(r)
    batch = next(iter(small.node_loader(split="train", fanouts=(4, 3), batch_size=32, seed=0).epoch(0)))
    data = batch.to_pyg()
    assert data.edge_type.shape == (data.num_edges,)
    ends = zip(data.n_id[data.edge_index[0]].tolist(), data.n_id[data.edge_index[1]].tolist())
    assert all(r in relations[e] for e, r in zip(ends, data.edge_type.tolist()))
    assert len(set(data.edge_type.tolist())) == 2


def test_edge_batches_carry_positive_and_negative_pairs(pyg, small):
    features = torch.from_numpy(np.asarray(small.features[...]))
    edges = _store_edges(small)
    loader = EdgeLoader(small, batch_size=40, negatives=5, num_chunks=4, scheme="disk", fanouts=(3, 2), seed=0)
    for batch in loader.epoch(0):
        data = batch.to_pyg()
        _check_sample(data, small, edges, features)
        store_src, store_dst = batch.graph.node_ids[batch.src], batch.graph.node_ids[batch.dst]
        assert torch.equal(data.n_id[data.src_index], store_src) and torch.equal(data.n_id[data.dst_pos_index], store_dst)
        assert set(zip(store_src.tolist(), store_dst.tolist())) <= edges           # positives are edges
        assert torch.equal(data.edge_label_index, torch.stack([data.src_index, data.dst_pos_index]))
        want_neg = batch.graph.node_ids[batch.negatives.negatives_of_positives()]
        assert data.dst_neg_index.shape == (batch.src.numel(), 5)
        assert torch.equal(data.n_id[data.dst_neg_index], want_neg)
        assert bool((data.dst_neg_index < data.batch_size).all())                # targets are rows [0, B)
        assert torch.equal(data.rel, batch.rel)


def test_refusals(pyg, small):
    loader = EdgeLoader(small, batch_size=40, negatives=2, scheme="minibatch", seed=0)
    with pytest.raises(ConfigError, match="sampled with fanouts"):
        next(iter(loader.epoch(0))).to_pyg()
    with pytest.raises(ConfigError, match="got int"):
        interop_pyg.to_pyg(3)
    feature_store, graph_store = interop_pyg.remote_backend(small)
    with pytest.raises(ReadOnlyStoreError, match="read-only"):
        feature_store.put_tensor(torch.zeros(1, 3), group_name=None, attr_name="x", index=None)
    with pytest.raises(ReadOnlyStoreError, match="read-only"):
        graph_store.put_edge_index((torch.zeros(1), torch.zeros(1)), edge_type=None, layout="coo")
    with pytest.raises(ConfigError, match=r"store ids in \[0, 400\)"):
        feature_store.get_tensor(group_name=None, attr_name="x", index=torch.tensor([400]))
    with pytest.raises(ConfigError, match="fanouts"):
        interop_pyg.DenseSampler(graph_store, fanouts=(2, -3))


def test_without_torch_geometric_the_entry_points_say_which_extra(small, monkeypatch):
    monkeypatch.setattr(interop_pyg, "_MISSING", ImportError("No module named 'torch_geometric'"))
    batch = next(iter(small.node_loader(split="train", fanouts=(2,), batch_size=8, seed=0).epoch(0)))
    for call in (batch.to_pyg, lambda: interop_pyg.remote_backend(small)):
        with pytest.raises(ImportError, match=r"pip install 'graphstore\[pyg\]'") as info:
            call()
        assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- remote backend


def test_the_feature_and_graph_stores_serve_the_store(pyg, small):
    feature_store, graph_store = interop_pyg.remote_backend(small)
    features = torch.from_numpy(np.asarray(small.features[...]))
    ids = torch.tensor([399, 0, 17, 17, 250])                                 # any order, repeats
    assert torch.equal(feature_store.get_tensor(None, "x", ids), features[ids])
    assert torch.equal(feature_store.get_tensor(None, "x", None), features)
    labels = torch.from_numpy(np.asarray(small.labels[...]).astype(np.int64))
    assert torch.equal(feature_store.get_tensor(None, "y", ids), labels[ids])
    assert sorted(a.attr_name for a in feature_store.get_all_tensor_attrs()) == ["x", "y"]
    assert feature_store.get_tensor_size(None, "x") == (400, 3)
    edges = _edge_list(small)
    row, col, _ = graph_store.coo()
    assert sorted(zip(row.tolist(), col.tolist())) == edges and row.numel() == small.num_edges
    rowptr, col_csr, _ = graph_store.csr()
    src = torch.repeat_interleave(torch.arange(400), rowptr.diff())
    assert sorted(zip(src.tolist(), col_csr.tolist())) == edges


def test_pyg_node_loader_iterates_the_store(pyg, small):
    from torch_geometric.loader import NodeLoader

    data = interop_pyg.remote_backend(small)
    train = torch.from_numpy(small.read_node_split("train"))
    loader = NodeLoader(data, node_sampler=interop_pyg.DenseSampler(data[1], fanouts=(4, 3), seed=0),
                        input_nodes=train, batch_size=30, shuffle=True)
    features, edges = torch.from_numpy(np.asarray(small.features[...])), _store_edges(small)
    seeds = []
    for batch in loader:
        _check_sample(batch, small, edges, features)
        seeds.append(batch.n_id[:batch.batch_size])
    assert sorted(torch.cat(seeds).tolist()) == sorted(train.tolist())      # every seed once
    # The same seed gives the same sample.
    def first(seed):
        loader = NodeLoader(data, node_sampler=interop_pyg.DenseSampler(data[1], fanouts=(4, 3), seed=seed),
                            input_nodes=train, batch_size=30)
        return next(iter(loader)).n_id
    assert torch.equal(first(1), first(1)) and not torch.equal(first(1), first(2))


def _worker_epochs(data, seeds, *, seed, loader_seed, epochs=2):
    """Each epoch's batches of a two-worker NodeLoader over ``seeds``, 20 a batch (batch k
    from worker k % 2); a worker that hangs fails the test after 60 s instead of hanging it."""
    from torch_geometric.loader import NodeLoader

    loader = NodeLoader(data, node_sampler=interop_pyg.DenseSampler(data[1], fanouts=(4, 3), seed=seed),
                        input_nodes=seeds, batch_size=20, num_workers=2, timeout=60,
                        generator=torch.Generator().manual_seed(loader_seed))
    return [[batch for batch in loader] for _ in range(epochs)]


def _same_sample(a, b) -> bool:
    return torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # Python 3.12+
def test_pyg_workers_read_rows_after_the_parent_and_draw_their_own_samples(pyg, small):
    """Forked DataLoader workers over the remote backend, after the parent read rows (its
    row-set pool has threads, which a fork does not copy): each worker and each epoch draws
    its own stream, and the same seeds replay the run."""
    data = interop_pyg.remote_backend(small)
    data[0].get_tensor(None, "x", torch.arange(0, 400, 3))             # the parent reads first
    features, edges = torch.from_numpy(np.asarray(small.features[...])), _store_edges(small)
    train = torch.from_numpy(small.read_node_split("train"))[:20]
    seeds = train.repeat(4)          # the same 20 seeds in every batch: only the draws differ
    run = _worker_epochs(data, seeds, seed=5, loader_seed=0)
    for batch in run[0]:
        _check_sample(batch, small, edges, features)
        assert torch.equal(batch.n_id[:batch.batch_size], train)
    first, second = run
    assert not _same_sample(first[0], first[1]) and not _same_sample(first[2], first[3])   # worker 0 vs 1
    assert not any(_same_sample(a, b) for a, b in zip(first, second))                     # epoch 0 vs 1
    again = _worker_epochs(data, seeds, seed=5, loader_seed=0)
    assert all(_same_sample(a, b) for a, b in zip(run[0] + run[1], again[0] + again[1]))
    other = _worker_epochs(data, seeds, seed=6, loader_seed=0, epochs=1)
    assert not _same_sample(run[0][0], other[0][0])


@pytest.mark.parametrize("mode", ["binary", "triplet"])
def test_pyg_link_loader_iterates_the_store(pyg, small, mode):
    from torch_geometric.loader import LinkLoader
    from torch_geometric.sampler import NegativeSampling

    data = interop_pyg.remote_backend(small)
    row, col, _ = data[1].coo()
    pick = torch.arange(0, row.numel(), 7)
    label_index = torch.stack([row[pick], col[pick]])
    loader = LinkLoader(data, link_sampler=interop_pyg.DenseSampler(data[1], fanouts=(3, 2), seed=0),
                        edge_label_index=(None, label_index),  # remote backends name the edge type
                        neg_sampling=NegativeSampling(mode, amount=2),
                        batch_size=25)
    features, edges = torch.from_numpy(np.asarray(small.features[...])), _store_edges(small)
    batches = 0
    for batch in loader:
        _check_sample(batch, small, edges, features)
        positives = label_index[:, batch.input_id]
        b = positives.shape[1]
        if mode == "binary":
            assert batch.edge_label_index.shape == (2, 3 * b)
            assert torch.equal(batch.n_id[batch.edge_label_index[:, :b]], positives)
            assert batch.edge_label.tolist() == [1.0] * b + [0.0] * (2 * b)
            assert int(batch.edge_label_index.max()) < batch.num_sampled_nodes[0]   # endpoints are the seeds
        else:
            assert torch.equal(batch.n_id[batch.src_index], positives[0])
            assert torch.equal(batch.n_id[batch.dst_pos_index], positives[1])
            assert batch.dst_neg_index.shape == (b, 2)
            assert int(batch.dst_neg_index.max()) < batch.num_sampled_nodes[0]
        batches += 1
    assert batches == -(-pick.numel() // 25)


# --------------------------------------------------------------------------- Cora, as a user runs it


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pyg_graphsage", "pyg_remote_backend"])
def test_pyg_examples_reach_cora_accuracy(pyg, cora_path, name, capsys):
    torch.set_num_threads(1)
    accuracy = _example(name).main([str(cora_path)])
    assert f"test accuracy {accuracy:.3f}" in capsys.readouterr().out
    print(f"test accuracy {accuracy:.3f}")  # shown by pytest -rP
    assert accuracy >= ACCURACY, accuracy
