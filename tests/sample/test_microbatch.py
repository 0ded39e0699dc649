"""Micro-batch splitting: every target in exactly one micro-batch, each micro-batch the exact
dependency closure of its targets (checked against a plain BFS) and a valid DENSE, the
parent's rows/edges/labels slices, the strategies, choosing K, and the loss weights.
(Training equivalence with the whole batch is in tests/nn/test_accumulate.py.)"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from graphstore.errors import ConfigError
from graphstore.sample import (
    DENSE,
    STRATEGIES,
    Batch,
    CSCGraph,
    choose_micro_batches,
    dense_sizes,
    loss_weights,
    micro_batch_sizes,
    micro_batches,
    partition_targets,
    sample_dense,
    split_dense,
    total_inputs,
)
from graphstore.sample.microbatch import _reg_edges

KS = [2, 3, 8]


def random_graph(num_nodes: int, num_edges: int, seed: int) -> CSCGraph:
    rng = np.random.default_rng(seed)
    pairs = np.unique(rng.integers(0, num_nodes, (num_edges, 2)), axis=0)
    return CSCGraph.from_edges(torch.as_tensor(pairs[:, 0]), torch.as_tensor(pairs[:, 1]), num_nodes)


def clustered_graph(num_clusters: int, size: int, seed: int) -> CSCGraph:
    """Dense clusters with a few edges between them: REG should find the clusters."""
    rng = np.random.default_rng(seed)
    src, dst = [], []
    for c in range(num_clusters):
        nodes = np.arange(c * size, (c + 1) * size)
        src.append(rng.choice(nodes, size * 6))
        dst.append(rng.choice(nodes, size * 6))
    src.append(rng.integers(0, num_clusters * size, size))
    dst.append(rng.integers(0, num_clusters * size, size))
    pairs = np.unique(np.stack([np.concatenate(src), np.concatenate(dst)], 1), axis=0)
    return CSCGraph.from_edges(torch.as_tensor(pairs[:, 0]), torch.as_tensor(pairs[:, 1]),
                               num_clusters * size)


@pytest.fixture(scope="module")
def graph() -> CSCGraph:
    return random_graph(400, 2400, seed=1)


@pytest.fixture(scope="module", params=["torch", "auto"])
def dense(request, graph) -> DENSE:
    targets = torch.randperm(400, generator=torch.Generator().manual_seed(2))[:40]
    return sample_dense(graph, targets, (4, 3, 2), generator=torch.Generator().manual_seed(3),
                        return_edge_ids=True, backend=request.param)


def sampled_adjacency(dense: DENSE) -> dict[int, list[int]]:
    """Parent position -> the parent positions of its sample (plain Python)."""
    off1 = int(dense.node_id_offsets[1])
    ptr, nbrs = dense.nbr_offsets.tolist(), dense.nbrs.tolist()
    return {off1 + j: nbrs[ptr[j]:ptr[j + 1]] for j in range(len(ptr) - 1)}


def bfs_hops(dense: DENSE, targets: list[int]) -> dict[int, int]:
    """Parent position -> hop in the closure of the target positions ``targets``."""
    adj = sampled_adjacency(dense)
    hop = {t: 0 for t in targets}
    frontier = list(targets)
    for d in range(1, dense.num_layers + 1):
        nxt = []
        for v in frontier:
            for u in adj[v]:
                if u not in hop:
                    hop[u] = d
                    nxt.append(u)
        frontier = nxt
    return hop


def check_layout(d: DENSE) -> None:
    """The DENSE contract of graphstore.sample.base, checked directly."""
    n, num_layers = d.num_nodes, d.num_layers
    off = d.node_id_offsets.tolist() + [n]
    assert len(off) == num_layers + 2 and off[0] == 0 and off == sorted(off)
    assert torch.unique(d.node_ids).numel() == n
    assert d.nbr_offsets.numel() == n - off[1] + 1 and int(d.nbr_offsets[-1]) == d.num_edges
    assert d.repr_map[0] is d.nbrs
    for k in range(num_layers):
        start = int(d.nbr_offsets[off[k + 1] - off[1]])
        assert torch.equal(d.repr_map[k], d.nbrs[start:] - off[k])
        assert bool((d.repr_map[k] >= 0).all())
    # A node of hop h (block L - h) samples only nodes of hop <= h + 1.
    hop_of = torch.repeat_interleave(torch.arange(num_layers, -1, -1), torch.tensor(off).diff())
    owner = torch.repeat_interleave(torch.arange(off[1], n), d.nbr_offsets.diff())
    assert bool((hop_of[d.nbrs] <= hop_of[owner] + 1).all())


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("k", KS)
def test_each_micro_batch_is_the_closure_of_its_targets(dense, strategy, k):
    parts = split_dense(dense, k, strategy=strategy)
    assert len(parts) == k
    off_t = int(dense.node_id_offsets[-1])
    # Every target in exactly one micro-batch, none empty, parent order kept inside.
    index = torch.cat([p.target_index for p in parts])
    assert torch.equal(torch.sort(index).values, torch.arange(dense.num_targets))
    adj = sampled_adjacency(dense)
    for p in parts:
        d = p.dense
        check_layout(d)
        assert d.fanouts == dense.fanouts and p.target_index.numel() > 0
        assert bool((p.target_index.diff() > 0).all())
        assert torch.equal(d.targets, dense.targets[p.target_index])
        assert torch.equal(d.node_ids, dense.node_ids[p.rows])
        # The nodes and their hops are exactly the BFS closure's.
        hop = bfs_hops(dense, (p.target_index + off_t).tolist())
        assert sorted(p.rows.tolist()) == sorted(hop)
        off = d.node_id_offsets.tolist() + [d.num_nodes]
        for block in range(d.num_layers + 1):
            rows = p.rows[off[block]:off[block + 1]].tolist()
            assert all(hop[r] == d.num_layers - block for r in rows)
        # Each sampled node keeps its parent sample, edge for edge.
        sub_off1 = off[1]
        ptr = d.nbr_offsets.tolist()
        for j in range(len(ptr) - 1):
            parent = int(p.rows[sub_off1 + j])
            assert p.rows[d.nbrs[ptr[j]:ptr[j + 1]]].tolist() == adj[parent]
        assert torch.equal(dense.nbrs[p.edges], p.rows[d.nbrs])
        assert torch.equal(d.edge_ids, dense.edge_ids[p.edges])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_with_every_neighbour_a_micro_batch_is_what_sample_dense_draws(graph, strategy):
    dense = sample_dense(graph, torch.arange(0, 400, 13), (-1, -1), return_edge_ids=True, backend="torch")
    for p in split_dense(dense, 3, strategy=strategy):
        ref = sample_dense(graph, p.dense.targets, (-1, -1), return_edge_ids=True, backend="torch")
        for name in ("node_ids", "node_id_offsets", "nbrs", "nbr_offsets", "edge_ids"):
            assert torch.equal(getattr(p.dense, name), getattr(ref, name)), name
        assert all(torch.equal(a, b) for a, b in zip(p.dense.repr_map, ref.repr_map))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_sizes_without_building_match_the_built_micro_batches(dense, strategy):
    parts = partition_targets(dense, 5, strategy=strategy)
    built = micro_batches(dense, parts)
    assert micro_batch_sizes(dense, parts) == [dense_sizes(p.dense) for p in built]
    assert total_inputs(built) == total_inputs(micro_batch_sizes(dense, parts)) >= dense.num_nodes


def test_one_micro_batch_is_the_batch_itself(dense):
    (only,) = split_dense(dense, 1)
    assert only.dense is dense
    assert torch.equal(only.rows, torch.arange(dense.num_nodes))
    assert torch.equal(only.edges, torch.arange(dense.num_edges))


def test_one_target_per_micro_batch(dense):
    parts = split_dense(dense, dense.num_targets, strategy="reg")
    assert [p.target_index.tolist() for p in parts] == [[t] for t in range(dense.num_targets)]


def test_errors(dense):
    with pytest.raises(ConfigError, match=r"in \[1, 40\] \(the batch has 40 targets; got 41\)"):
        split_dense(dense, 41)
    with pytest.raises(ConfigError, match="in \\[1, 40\\]"):
        split_dense(dense, 0)
    with pytest.raises(ConfigError, match="unknown micro-batch strategy 'bogus'; known: metis, random, range"):
        split_dense(dense, 2, strategy="bogus")
    with pytest.raises(ConfigError, match="none empty"):
        micro_batches(dense, torch.tensor([0, 2] * 20))
    with pytest.raises(ConfigError, match="shape \\[40\\]"):
        micro_batches(dense, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ConfigError, match="reg_hops"):
        split_dense(dense, 2, reg_hops=4)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategies_are_balanced_and_seeded(dense, strategy):
    a = partition_targets(dense, 4, strategy=strategy, seed=5)
    assert torch.equal(a, partition_targets(dense, 4, strategy=strategy, seed=5))
    sizes = torch.bincount(a, minlength=4)
    assert int(sizes.min()) >= 1 and int(sizes.max()) <= 13  # 10 each, METIS's slack aside


def test_a_registered_strategy_is_used_and_keeps_its_memo_across_the_ks(dense):
    calls = []

    @STRATEGIES.register("toy-modulo", summary="target i goes to group i mod K")
    def modulo(dense, k, *, memo, **_):
        memo["built"] = memo.get("built", 0) + 1
        calls.append((k, memo["built"]))
        return torch.arange(dense.num_targets) % k

    try:
        assert partition_targets(dense, 3, strategy="toy-modulo").tolist() == [i % 3 for i in range(40)]
        parts = choose_micro_batches(dense, 0, estimator=lambda s: int(s.num_targets > 5),
                                     strategy="toy-modulo")
        assert len(parts) == 8  # the fewest K with at most 5 targets each
        assert [k for k, _ in calls[1:]] == [2, 3, 4, 5, 6, 7, 8]
        assert [n for _, n in calls[1:]] == list(range(1, 8))  # one memo for the whole search
    finally:
        STRATEGIES.unregister("toy-modulo")


def test_metis_strategies_without_pymetis_say_so_and_the_others_still_work(dense, monkeypatch):
    monkeypatch.setitem(sys.modules, "pymetis", None)  # what a failed import leaves
    for strategy in ("reg", "metis"):
        with pytest.raises(ConfigError, match="METIS partitioning needs pymetis"):
            partition_targets(dense, 2, strategy=strategy)
    assert partition_targets(dense, 2, strategy="random").numel() == dense.num_targets


def test_range_slices_targets_in_order(dense):
    assert partition_targets(dense, 3, strategy="range").tolist() == [0] * 14 + [1] * 13 + [2] * 13


def test_reg_weights_count_shared_first_hop_nodes(graph):
    dense = sample_dense(graph, torch.arange(150), (-1, 2), generator=torch.Generator().manual_seed(0))
    src, dst, weight = _reg_edges(dense, 1, hub_threshold=1000)
    off_t = int(dense.node_id_offsets[-1])
    adj = sampled_adjacency(dense)
    inputs = {t: {t + off_t} | set(adj[t + off_t]) for t in range(150)}
    expected = {(a, b): len(inputs[a] & inputs[b]) for a in range(150) for b in range(150)
                if a != b and inputs[a] & inputs[b]}
    assert dict(zip(zip(src.tolist(), dst.tolist()), weight.tolist())) == expected
    # The hub guard drops nodes shared by more targets than the threshold.
    shares = _shares(inputs).values()
    assert int(weight.sum()) == sum(g * (g - 1) for g in shares)
    _, _, guarded = _reg_edges(dense, 1, hub_threshold=2)
    assert any(g > 2 for g in shares)
    assert int(guarded.sum()) == sum(g * (g - 1) for g in shares if g <= 2)


def _shares(inputs: dict[int, set[int]]) -> dict[int, int]:
    count: dict[int, int] = {}
    for nodes in inputs.values():
        for u in nodes:
            count[u] = count.get(u, 0) + 1
    return count


def test_reg_cuts_redundancy_on_a_clustered_graph():
    g = clustered_graph(8, 40, seed=0)
    targets = torch.randperm(320, generator=torch.Generator().manual_seed(1))[:160]
    dense = sample_dense(g, targets, (5, 5), generator=torch.Generator().manual_seed(2))
    totals = {s: total_inputs(split_dense(dense, 8, strategy=s)) for s in STRATEGIES}
    assert totals["reg"] < totals["random"] and totals["reg"] < totals["range"]
    whole = total_inputs(split_dense(dense, 8, strategy="reg", reg_hops=2))
    assert whole < totals["random"]


def test_choose_takes_the_fewest_micro_batches_that_fit(dense):
    def estimator(sizes):
        return sizes.num_nodes  # any monotone-enough cost will do here

    for budget in (dense.num_nodes, 200, 120, 60):
        parts = choose_micro_batches(dense, budget, estimator=estimator, strategy="random")
        k = len(parts)
        assert max(p.dense.num_nodes for p in parts) <= budget
        if k > 1:
            fewer = partition_targets(dense, k - 1, strategy="random")
            assert max(s.num_nodes for s in micro_batch_sizes(dense, fewer)) > budget
    assert len(choose_micro_batches(dense, dense.num_nodes, estimator=estimator)) == 1
    with pytest.raises(ConfigError, match="even 40 micro-batches of one target each"):
        choose_micro_batches(dense, 3, estimator=estimator)


@pytest.mark.parametrize("strategy", ["random", "reg"])
def test_choose_from_the_previous_k_costs_fewer_tries_and_still_fits(dense, strategy):
    calls = []

    def estimator(sizes):
        calls.append(1)
        return sizes.num_nodes

    budget = 120
    fewest = len(choose_micro_batches(dense, budget, estimator=estimator, strategy=strategy))
    from_one = len(calls)
    assert fewest > 2
    for start in (fewest, fewest + 3, 1, fewest - 1, 10_000):
        calls.clear()
        parts = choose_micro_batches(dense, budget, estimator=estimator, strategy=strategy, start_k=start)
        k = len(parts)
        assert max(p.dense.num_nodes for p in parts) <= budget
        if start <= fewest:  # searching up from below finds the fewest
            assert k == fewest
        else:  # searching down stops at the first K that does not fit below a fitting one
            assert k <= min(start, dense.num_targets)
            fewer = partition_targets(dense, k - 1, strategy=strategy)
            assert max(s.num_nodes for s in micro_batch_sizes(dense, fewer)) > budget
        if start == fewest:
            # Two partitions (K fits, K - 1 does not) and no closure per target.
            assert len(calls) == fewest + (fewest - 1) < from_one
    with pytest.raises(ConfigError, match="even 40 micro-batches of one target each"):
        choose_micro_batches(dense, 3, estimator=estimator, start_k=5)


def test_micro_batch_slices_the_parent_batch_and_weights_its_labels(dense):
    features = torch.arange(400.0)[:, None].repeat(1, 2)
    labels = torch.arange(400) % 5 - 1                     # every fifth node unlabelled
    batch = Batch.gather(dense, features, labels)
    parts = split_dense(dense, 3, strategy="random")
    for p in parts:
        sub = p.batch(batch)
        assert torch.equal(sub.features[:, 0], p.dense.node_ids.double().float())
        assert torch.equal(sub.labels, labels[p.dense.targets])
    weights = loss_weights(parts, batch.labels)
    labelled = [(labels[p.dense.targets] >= 0).sum().item() for p in parts]
    assert weights.tolist() == pytest.approx([c / sum(labelled) for c in labelled])
    assert float(loss_weights(parts).sum()) == pytest.approx(1.0)
