"""DENSE sampling: layout invariants, exactness against full k-hop neighbourhoods, sampling
statistics, and equivalence with the reference layer-wise sampler.

Every `sample_dense` test runs on both backends (the compiled kernel and torch); the
kernel's own tests (statistics, edge ids, errors, fallback) are in test_dense_native.py."""

from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphstore.errors import ConfigError
from graphstore.sample import (
    DENSE,
    Batch,
    CSCGraph,
    SampleGraph,
    dense_neighbours,
    native_available,
    new_workspace,
    sample_blocks,
    sample_dense,
    sample_neighbours,
)
from graphstore.sample import _native

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# Under CI the native cases are never skipped: a missing kernel makes them fail
# (backend="native" raises), so a broken build cannot pass as a torch-only run.
_NATIVE_SKIP = pytest.mark.skipif(not native_available() and not os.environ.get("CI"),
                                  reason=f"compiled DENSE kernel not built: {_native.load_error()}")
BACKENDS = ["torch", pytest.param("native", marks=_NATIVE_SKIP)]
DEVICE_BACKENDS = [("cpu", "torch"), pytest.param("cpu", "native", marks=_NATIVE_SKIP)] + (
    [("cuda", "torch")] if torch.cuda.is_available() else [])


def random_graph(num_nodes: int, num_edges: int, seed: int, *, device: str = "cpu") -> CSCGraph:
    """A seeded random simple directed graph (no parallel edges; self loops allowed)."""
    rng = np.random.default_rng(seed)
    pairs = np.unique(rng.integers(0, num_nodes, (num_edges, 2)), axis=0) if num_edges else np.zeros((0, 2))
    src = torch.as_tensor(pairs[:, 0], dtype=torch.int64, device=device)
    dst = torch.as_tensor(pairs[:, 1], dtype=torch.int64, device=device)
    return CSCGraph.from_edges(src, dst, num_nodes)


def in_neighbours(graph: CSCGraph, v: int, direction: str = "in") -> list[int]:
    """All candidate neighbours of v, as a sorted list (with repeats for 'both')."""
    nbrs = graph.indices[graph.indptr[v]:graph.indptr[v + 1]].tolist()
    if direction == "both":
        nbrs += graph.out_indices[graph.out_indptr[v]:graph.out_indptr[v + 1]].tolist()
    return sorted(nbrs)


def edge_endpoints(graph: CSCGraph, edge_id: int) -> tuple[int, int]:
    """(neighbour, sampled node) of a DENSE edge id: an in-edge's position in indices, or
    num_edges + an out-edge's position in out_indices."""
    num_in = graph.indices.numel()
    if edge_id < num_in:
        owner = int(torch.searchsorted(graph.indptr, edge_id, right=True)) - 1
        return int(graph.indices[edge_id]), owner
    edge_id -= num_in
    owner = int(torch.searchsorted(graph.out_indptr, edge_id, right=True)) - 1
    return int(graph.out_indices[edge_id]), owner


def hop_of_each_node(dense: DENSE) -> list[int]:
    """Hop at which each node_ids entry was first reached, from node_id_offsets."""
    off = dense.node_id_offsets.tolist() + [dense.num_nodes]
    hops = []
    for i in range(dense.num_layers + 1):
        hops += [dense.num_layers - i] * (off[i + 1] - off[i])
    return hops


def check_invariants(graph: CSCGraph, targets: torch.Tensor, fanouts, dense: DENSE, direction="in"):
    """Every layout promise of graphstore.sample.base, checked node by node (slowly, plainly)."""
    num_layers = len(fanouts)
    node_ids = dense.node_ids.tolist()
    off = dense.node_id_offsets.tolist()
    n = len(node_ids)
    assert dense.node_ids.dtype == dense.nbrs.dtype == dense.nbr_offsets.dtype == torch.int64
    assert len(off) == num_layers + 1 and off[0] == 0 and off == sorted(off) and off[-1] <= n
    assert dense.targets.tolist() == targets.tolist()              # targets last, in order
    assert len(set(node_ids)) == n                                  # unique
    hops = hop_of_each_node(dense)
    where = {v: i for i, v in enumerate(node_ids)}
    nbr_offsets = dense.nbr_offsets.tolist()
    nbrs = dense.nbrs.tolist()
    assert len(nbr_offsets) == n - off[1] + 1
    assert nbr_offsets[0] == 0 and nbr_offsets[-1] == len(nbrs)
    assert len(dense.repr_map) == num_layers and dense.repr_map[0] is dense.nbrs
    assert all(0 <= x < n for x in nbrs)                            # valid indices into node_ids
    # BFS over the drawn samples reproduces each node's hop: a node is sampled exactly once,
    # where first reached, and every node reached is in node_ids.
    bfs_hop = {v: 0 for v in targets.tolist()}
    frontier = targets.tolist()
    for hop in range(num_layers):
        nxt = []
        for v in frontier:
            j = where[v] - off[1]
            sample = [node_ids[x] for x in nbrs[nbr_offsets[j]:nbr_offsets[j + 1]]]
            cands = in_neighbours(graph, v, direction)
            fanout = fanouts[hop]
            assert len(sample) == (len(cands) if fanout < 0 else min(len(cands), fanout))
            if direction == "in":
                assert len(set(sample)) == len(sample)              # no duplicates (simple graph)
            assert all(sample.count(u) <= cands.count(u) for u in sample)   # true neighbours
            for u in sample:
                if u not in bfs_hop:
                    bfs_hop[u] = hop + 1
                    nxt.append(u)
        frontier = nxt
    assert bfs_hop == {v: h for v, h in zip(node_ids, hops)}
    # inside a hop block, order of first appearance (BFS order); the target block as given
    assert node_ids == sorted(node_ids, key=lambda v: (-bfs_hop[v], list(bfs_hop).index(v)))
    # Layer k: slicing gives exactly the nodes it needs.
    for k in range(num_layers):
        layer = dense.layer(k)
        inputs = node_ids[off[k]:]
        outputs = node_ids[off[k + 1]:]
        assert layer.num_inputs == len(inputs) and layer.num_outputs == len(outputs)
        assert inputs[layer.self_start:] == outputs
        assert {hops[where[v]] for v in outputs} <= set(range(num_layers - k))
        assert all(hops[where[v]] <= num_layers - k for v in inputs)
        assert layer.nbr_counts.numel() == len(outputs)
        got = [inputs[x] for x in layer.nbr_index.tolist()]
        expected = []
        for v in outputs:
            j = where[v] - off[1]
            expected += [node_ids[x] for x in nbrs[nbr_offsets[j]:nbr_offsets[j + 1]]]
        assert got == expected
        rows = [where[v] - off[1] for v in outputs]
        assert layer.nbr_counts.tolist() == [nbr_offsets[j + 1] - nbr_offsets[j] for j in rows]
        if dense.edge_ids is None:
            assert layer.edge_ids is None
        else:
            assert [edge_endpoints(graph, e)[0] for e in layer.edge_ids.tolist()] == got
    if dense.edge_ids is not None:
        # Each edge id names an edge of the graph from the sampled node to its neighbour,
        # and no edge is drawn twice for one node.
        assert dense.edge_ids.dtype == torch.int64 and dense.edge_ids.shape == dense.nbrs.shape
        edge_ids = dense.edge_ids.tolist()
        for j, v in enumerate(node_ids[off[1]:]):
            ids = edge_ids[nbr_offsets[j]:nbr_offsets[j + 1]]
            assert len(set(ids)) == len(ids)
            for e, x in zip(ids, nbrs[nbr_offsets[j]:nbr_offsets[j + 1]]):
                assert edge_endpoints(graph, e) == (node_ids[x], v)


@st.composite
def cases(draw):
    num_nodes = draw(st.integers(1, 25))
    num_edges = draw(st.integers(0, 80))
    graph_seed = draw(st.integers(0, 2**16))
    fanouts = tuple(draw(st.lists(st.integers(-1, 4), min_size=1, max_size=3)))
    targets = draw(st.lists(st.integers(0, num_nodes - 1), min_size=0, max_size=num_nodes, unique=True))
    seed = draw(st.integers(0, 2**16))
    return num_nodes, num_edges, graph_seed, fanouts, targets, seed


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=150, deadline=None)
@given(cases(), st.sampled_from(["in", "both"]), st.booleans(), st.booleans())
def test_layout_invariants_on_random_graphs(backend, case, direction, reuse_workspace, with_ids):
    num_nodes, num_edges, graph_seed, fanouts, targets, seed = case
    graph = random_graph(num_nodes, num_edges, graph_seed)
    targets = torch.tensor(targets, dtype=torch.int64)
    workspace = new_workspace(graph) if reuse_workspace else None
    for _ in range(2 if reuse_workspace else 1):      # the second call sees the handed-back workspace
        dense = sample_dense(graph, targets, fanouts, generator=torch.Generator().manual_seed(seed),
                             direction=direction, workspace=workspace, backend=backend,
                             return_edge_ids=with_ids)
        check_invariants(graph, targets, fanouts, dense, direction)
        assert (dense.edge_ids is not None) == with_ids
    if reuse_workspace:
        assert bool((workspace == -1).all())


@pytest.mark.parametrize("device,backend", DEVICE_BACKENDS)
def test_isolated_nodes_and_zero_fanout(device, backend):
    # node 3 is isolated, node 0 has in-neighbours 1 and 2
    graph = CSCGraph.from_edges(torch.tensor([1, 2, 0], device=device),
                                torch.tensor([0, 0, 1], device=device), 4)
    gen = torch.Generator(device).manual_seed(0)
    dense = sample_dense(graph, torch.tensor([3], device=device), (5, 5), generator=gen, backend=backend)
    assert dense.node_ids.tolist() == [3] and dense.node_id_offsets.tolist() == [0, 0, 0]
    assert dense.nbrs.numel() == 0 and dense.nbr_offsets.tolist() == [0, 0]
    assert [layer.num_outputs for layer in map(dense.layer, range(2))] == [1, 1]
    dense = sample_dense(graph, torch.tensor([0, 3], device=device), (0, 3), generator=gen, backend=backend)
    assert dense.node_ids.tolist() == [0, 3] and dense.nbr_offsets.tolist() == [0, 0, 0]
    dense = sample_dense(graph, torch.tensor([0], device=device), (2, 0), generator=gen, backend=backend)
    assert dense.node_ids.tolist() == [1, 2, 0] and dense.nbr_offsets.tolist() == [0, 0, 0, 2]
    assert dense.node_ids.device.type == device
    empty = sample_dense(graph, torch.tensor([], dtype=torch.int64, device=device), (3, 3), generator=gen,
                         backend=backend)
    assert empty.num_nodes == 0 and empty.num_targets == 0 and empty.nbr_offsets.tolist() == [0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_full_fanout_equals_k_hop_in_neighbourhood(seed, backend):
    num_nodes, num_layers = 300, 3
    graph = random_graph(num_nodes, 700, seed)
    max_deg = int((graph.indptr[1:] - graph.indptr[:-1]).max())
    targets = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(seed))[:7]
    for fanouts in [(-1,) * num_layers, (max_deg,) * num_layers, (max_deg + 3, -1, max_deg)]:
        dense = sample_dense(graph, targets, fanouts, generator=torch.Generator().manual_seed(seed),
                             backend=backend)
        # adj_t[u, v] = 1 for an edge u -> v, so (adj_t @ reach)[u] > 0 iff u has an edge into
        # a reached node: after j products, reach = nodes with a path of length <= j to a target.
        src = graph.indices.numpy()
        dst = np.repeat(np.arange(num_nodes), np.diff(graph.indptr.numpy()))
        adj_t = sp.csr_matrix((np.ones(len(src)), (src, dst)), shape=(num_nodes, num_nodes))
        reach = np.zeros(num_nodes)
        reach[targets.numpy()] = 1
        off = dense.node_id_offsets.tolist()
        for j in range(num_layers + 1):
            expected = set(np.flatnonzero(reach).tolist())
            assert set(dense.node_ids[off[num_layers - j]:].tolist()) == expected
            reach = reach + adj_t @ reach
        # and every sampled node's sample is its whole in-neighbourhood
        lookup = dense_neighbours(dense)
        sampled = dense.node_ids[off[1]:]
        counts, nbrs = lookup(sampled)
        start = 0
        for v, c in zip(sampled.tolist(), counts.tolist()):
            assert sorted(nbrs[start:start + c].tolist()) == in_neighbours(graph, v)
            start += c


@pytest.mark.parametrize("degree,fanout", [(20, 5), (7, 6), (1000, 3)])
def test_each_neighbour_chosen_with_probability_fanout_over_degree(degree, fanout):
    # a star: nodes 1..degree all point at node 0; sample node 0 `draws` times in one call
    graph = CSCGraph.from_edges(torch.arange(1, degree + 1), torch.zeros(degree, dtype=torch.int64),
                                degree + 1)
    draws = 20_000
    counts, nbrs = sample_neighbours(graph, torch.zeros(draws, dtype=torch.int64), fanout,
                                     generator=torch.Generator().manual_seed(1234))
    assert counts.tolist() == [fanout] * draws
    per_draw = nbrs.reshape(draws, fanout)
    assert bool((per_draw.sort(1).values.diff(1) > 0).all())         # no repeats within a sample
    hits = torch.bincount(nbrs, minlength=degree + 1)[1:].double().numpy()
    p = fanout / degree
    expected = draws * p
    # Tolerance: each count is Binomial(draws, p) (exactly: one inclusion per draw, the draws
    # independent); 5 standard deviations per neighbour, a union bound over <= 1000 neighbours
    # leaves a false alarm chance below 1e-3, and the seed is fixed anyway.
    sd = np.sqrt(draws * p * (1 - p))
    assert np.abs(hits - expected).max() < 5 * sd
    # Whole-vector check: Pearson's statistic against chi2(degree - 1) at p = 0.001. Sampling
    # without replacement makes the cells negatively correlated, which only lowers the statistic.
    stat = ((hits - expected) ** 2 / expected).sum()
    assert stat < scipy.stats.chi2.ppf(0.999, degree - 1)


def test_inclusion_probability_across_a_random_graph():
    graph = random_graph(200, 3000, seed=5)
    fanout, draws = 4, 2000
    nodes = torch.arange(200).repeat(draws)
    counts, nbrs = sample_neighbours(graph, nodes, fanout, generator=torch.Generator().manual_seed(9))
    owner = torch.repeat_interleave(nodes, counts)
    hits = torch.bincount(owner * 200 + nbrs, minlength=200 * 200).double().reshape(200, 200).numpy()
    deg = np.diff(graph.indptr.numpy())
    for v in range(200):
        cands = in_neighbours(graph, v)
        p = min(1.0, fanout / deg[v]) if deg[v] else 0.0
        if p == 1.0:
            assert (hits[v, cands] == draws).all()
        elif cands:
            sd = np.sqrt(draws * p * (1 - p))
            assert np.abs(hits[v, cands] - draws * p).max() < 5.5 * sd   # Binomial, see above
        assert hits[v].sum() == draws * min(deg[v], fanout)


def mean_layer(h_self, h_agg, counts, weight):
    """A tiny GraphSage-mean update, float64."""
    mean = h_agg / counts.clamp(min=1)[:, None].to(h_agg.dtype)
    return torch.tanh(torch.cat([h_self, mean], 1) @ weight)


def run_dense(dense: DENSE, features: torch.Tensor, weights) -> torch.Tensor:
    h = features.index_select(0, dense.node_ids)
    for k, weight in enumerate(weights):
        layer = dense.layer(k)
        assert h.shape[0] == layer.num_inputs
        owner = torch.repeat_interleave(torch.arange(layer.num_outputs), layer.nbr_counts)
        h_agg = torch.zeros(layer.num_outputs, h.shape[1], dtype=h.dtype).index_add_(
            0, owner, h.index_select(0, layer.nbr_index))
        h = mean_layer(h[layer.self_start:], h_agg, layer.nbr_counts, weight)
    return h


def run_blocks(blocks, features: torch.Tensor, weights) -> torch.Tensor:
    h = features.index_select(0, blocks[0].src_nodes)
    for block, weight in zip(blocks, weights):
        assert h.shape[0] == block.src_nodes.numel()
        h_agg = torch.zeros(block.num_dst, h.shape[1], dtype=h.dtype).index_add_(
            0, block.edge_dst, h[block.edge_src])
        counts = torch.bincount(block.edge_dst, minlength=block.num_dst)
        h = mean_layer(h[:block.num_dst], h_agg, counts, weight)
    return h


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("direction", ["in", "both"])
@pytest.mark.parametrize("fanouts", [(3,), (3, 2), (2, 4, 3), (-1, 0, 2), (5, 5, 5, 5)])
def test_mean_aggregation_equals_reference_blocks_on_the_same_samples(fanouts, direction, backend):
    graph = random_graph(400, 2500, seed=len(fanouts))
    gen = torch.Generator().manual_seed(3)
    targets = torch.randperm(400, generator=gen)[:25]
    dense = sample_dense(graph, targets, fanouts, generator=gen, direction=direction, backend=backend)
    blocks = sample_blocks(graph, targets, fanouts, neighbours=dense_neighbours(dense))
    assert blocks[-1].dst_nodes.tolist() == targets.tolist()
    assert set(blocks[0].src_nodes.tolist()) == set(dense.node_ids.tolist())
    dim = 6
    features = torch.randn(400, dim, dtype=torch.float64, generator=gen)
    weights = [torch.randn(2 * dim, dim, dtype=torch.float64, generator=gen) for _ in fanouts]
    torch.testing.assert_close(run_dense(dense, features, weights), run_blocks(blocks, features, weights),
                               rtol=0, atol=1e-6)


def test_reference_sampler_draws_per_block():
    graph = random_graph(300, 3000, seed=2)
    targets = torch.arange(10)
    blocks = sample_blocks(graph, targets, (3, 2), generator=torch.Generator().manual_seed(0))
    assert blocks[1].dst_nodes.tolist() == targets.tolist()
    assert blocks[0].dst_nodes.tolist() == blocks[1].src_nodes.tolist()
    for block, fanout in zip(blocks, (2, 3)):
        counts = torch.bincount(block.edge_dst, minlength=block.num_dst)
        for v, c in zip(block.dst_nodes.tolist(), counts.tolist()):
            assert c == min(fanout, len(in_neighbours(graph, v)))
        for s, d in zip(block.edge_src.tolist(), block.edge_dst.tolist()):
            assert block.src_nodes[s].item() in in_neighbours(graph, block.dst_nodes[d].item())
        assert len(set(block.src_nodes.tolist())) == block.src_nodes.numel()


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_same_sample_different_seed_different_sample(backend):
    graph = random_graph(500, 8000, seed=4)
    targets = torch.arange(50)

    def draw(seed):
        return sample_dense(graph, targets, (4, 3), generator=torch.Generator().manual_seed(seed),
                            backend=backend)

    a, b, c = draw(7), draw(7), draw(8)
    for field in ("node_ids", "node_id_offsets", "nbrs", "nbr_offsets"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not (torch.equal(a.node_ids, c.node_ids) and torch.equal(a.nbrs, c.nbrs))


@pytest.mark.parametrize("backend", BACKENDS)
def test_workspace_gives_the_same_sample_and_is_checked(backend):
    graph = random_graph(500, 8000, seed=6)
    workspace = new_workspace(graph)
    assert workspace.dtype == torch.int32                   # half the bytes below 2**31 nodes
    wide = torch.full((500,), -1, dtype=torch.int64)        # int64 is accepted too
    for seed in range(3):
        targets = torch.randperm(500, generator=torch.Generator().manual_seed(seed))[:40]
        a = sample_dense(graph, targets, (5, 3, 2), generator=torch.Generator().manual_seed(seed),
                         backend=backend)
        for ws in (workspace, wide):
            b = sample_dense(graph, targets, (5, 3, 2), generator=torch.Generator().manual_seed(seed),
                             workspace=ws, backend=backend)
            assert torch.equal(a.node_ids, b.node_ids) and torch.equal(a.nbrs, b.nbrs)
            assert b.nbrs.dtype == torch.int64
            assert bool((ws == -1).all())
    with pytest.raises(ConfigError, match="new_workspace"):
        sample_dense(graph, torch.tensor([1]), (2,), workspace=torch.full((499,), -1), backend=backend)
    with pytest.raises(ConfigError, match="int32 or torch.int64"):
        sample_dense(graph, torch.tensor([1]), (2,), workspace=torch.full((500,), -1.0), backend=backend)
    with pytest.raises(ConfigError, match="contiguous"):
        sample_dense(graph, torch.tensor([1]), (2,), workspace=torch.full((1000,), -1)[::2], backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_gathers_features_and_labels_and_moves(backend):
    graph = random_graph(100, 600, seed=1)
    features = torch.arange(100, dtype=torch.float32)[:, None] + torch.tensor([0.0, 0.5])
    labels = torch.arange(100) * 3
    dense = sample_dense(graph, torch.tensor([5, 9, 2]), (3, 3), generator=torch.Generator().manual_seed(0),
                         return_edge_ids=True, backend=backend)
    batch = Batch.gather(dense, features, labels)
    assert batch.features[:, 0].tolist() == dense.node_ids.float().tolist()   # features = ids
    assert batch.labels.tolist() == [15, 27, 6]
    for device in DEVICES:
        moved = batch.to(device)
        assert moved.features.device.type == moved.dense.nbrs.device.type == device
        assert all(t.device.type == device for t in moved.dense.repr_map)
        assert moved.dense.repr_map[0] is moved.dense.nbrs
        assert torch.equal(moved.dense.node_ids.cpu(), dense.node_ids)
        assert moved.dense.edge_ids.device.type == device
        assert torch.equal(moved.dense.edge_ids.cpu(), dense.edge_ids)


def test_csc_graph_satisfies_the_protocol_and_builds_both_directions():
    graph = random_graph(50, 300, seed=3)
    assert isinstance(graph, SampleGraph)
    src = graph.indices
    dst = torch.repeat_interleave(torch.arange(50), graph.indptr.diff())
    out_src = torch.repeat_interleave(torch.arange(50), graph.out_indptr.diff())
    as_pairs = sorted(zip(src.tolist(), dst.tolist()))
    assert as_pairs == sorted(zip(out_src.tolist(), graph.out_indices.tolist()))
    with pytest.raises(ConfigError, match=r"in \[0, 50\)"):
        CSCGraph.from_edges(torch.tensor([0]), torch.tensor([50]), 50)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("targets,fanouts,direction,message", [
    ([0, 0], (2,), "in", "distinct"),
    ([60], (2,), "in", r"\[0, 50\)"),
    ([1], (), "in", "at least one hop"),
    ([1], (-2,), "in", ">= -1"),
    ([1], (2.5,), "in", ">= -1"),
    ([1], (2,), "out", "direction"),
])
def test_bad_arguments_raise_config_error(targets, fanouts, direction, message, backend):
    graph = random_graph(50, 300, seed=3)
    with pytest.raises(ConfigError, match=message):
        sample_dense(graph, torch.tensor(targets), fanouts, direction=direction, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_numpy_fanouts_and_list_targets_are_accepted(backend):
    graph = random_graph(50, 300, seed=3)
    dense = sample_dense(graph, [4, 2], np.array([3, 2]), generator=torch.Generator().manual_seed(0),
                         backend=backend)
    assert dense.targets.tolist() == [4, 2] and dense.fanouts == (3, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_both_directions_needs_out_edges(backend):
    graph = CSCGraph.from_edges(torch.tensor([0]), torch.tensor([1]), 2, out_edges=False)
    with pytest.raises(ConfigError, match="out_indptr"):
        sample_dense(graph, torch.tensor([1]), (1,), direction="both", backend=backend)
    both = CSCGraph.from_edges(torch.tensor([0]), torch.tensor([1]), 2)
    dense = sample_dense(both, torch.tensor([0]), (1,), direction="both", backend=backend)
    assert dense.node_ids.tolist() == [1, 0]                          # reached along the out-edge
