"""The compiled DENSE kernel: it is built, draws the right distribution, reports edge ids,
handles dtypes, bad graphs, dirty workspaces, threads and its output pool, and the torch
fallback takes over when it is missing.

The layout, exactness and determinism tests of test_dense.py also run on this backend.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import scipy.stats
import torch

from graphstore.errors import ConfigError
from graphstore.sample import CSCGraph, native_available, new_workspace, sample_dense
from graphstore.sample import _native

from .test_dense import check_invariants, random_graph

needs_native = pytest.mark.skipif(not native_available() and not os.environ.get("CI"),
                                  reason=f"compiled DENSE kernel not built: {_native.load_error()}")


def test_native_kernel_is_loaded_under_ci():
    # CI builds the package with a compiler, so a missing kernel there is a broken build,
    # never a reason to run only the torch path.
    if not os.environ.get("CI") and not native_available():
        pytest.skip(f"not under CI and the kernel is not built: {_native.load_error()}")
    assert native_available(), _native.load_error()
    assert _native.load_error() is None
    graph = random_graph(100, 600, seed=0)
    gen = torch.Generator().manual_seed(3)
    auto = sample_dense(graph, torch.tensor([1, 2]), (3, 2), generator=gen)
    native = sample_dense(graph, torch.tensor([1, 2]), (3, 2), generator=gen.manual_seed(3), backend="native")
    assert torch.equal(auto.nbrs, native.nbrs) and torch.equal(auto.node_ids, native.node_ids)


def stars(num_stars: int, num_in: int, num_out: int = 0) -> CSCGraph:
    """``num_stars`` disjoint stars: centre ``s`` has in-leaves ``s*w + 1 ..`` then out-leaves,
    ``w = 1 + num_in + num_out`` nodes per star (centre first)."""
    width = 1 + num_in + num_out
    centres = torch.arange(num_stars) * width
    in_leaves = centres[:, None] + 1 + torch.arange(num_in)
    out_leaves = centres[:, None] + 1 + num_in + torch.arange(num_out)
    src = torch.cat([in_leaves.reshape(-1), centres.repeat_interleave(num_out)])
    dst = torch.cat([centres.repeat_interleave(num_in), out_leaves.reshape(-1)])
    return CSCGraph.from_edges(src, dst, num_stars * width)


@needs_native
@pytest.mark.parametrize("num_in,num_out,fanout,direction", [
    (20, 0, 5, "in"),       # degree <= 4096: Floyd keeps its slots in a bitmap
    (7, 0, 6, "in"),
    (1000, 0, 3, "in"),
    (100, 0, 40, "in"),
    (10, 10, 5, "both"),    # slots span in- then out-edges
    (5000, 0, 10, "in"),    # a hub, fanout <= 32: a scan of the slots drawn so far
    (5000, 0, 40, "in"),    # a hub, fanout > 32: a hash set of them
])
def test_each_neighbour_chosen_with_probability_fanout_over_degree(num_in, num_out, fanout, direction):
    # Many disjoint stars sampled as the targets of one-hop DENSEs: each call draws one
    # sample per centre, independently, through the real hop loop.
    degree = num_in + num_out
    num_stars, calls = 200, 100
    graph = stars(num_stars, num_in, num_out)
    width = degree + 1
    centres = torch.arange(num_stars) * width
    gen = torch.Generator().manual_seed(1234)
    hits = np.zeros(degree)
    for _ in range(calls):
        dense = sample_dense(graph, centres, (fanout,), generator=gen, direction=direction,
                             backend="native", return_edge_ids=True)
        assert dense.nbr_offsets.diff().tolist() == [fanout] * num_stars
        picked = dense.node_ids[dense.nbrs].reshape(num_stars, fanout)
        leaf = picked - centres[:, None] - 1                          # 0 .. degree-1 within its star
        assert bool(((leaf >= 0) & (leaf < degree)).all())
        assert bool((leaf.sort(1).values.diff(1) > 0).all())          # no repeats within a sample
        assert bool((dense.edge_ids.reshape(num_stars, fanout).sort(1).values.diff(1) > 0).all())
        hits += np.bincount(leaf.reshape(-1).numpy(), minlength=degree)
    draws = num_stars * calls
    p = fanout / degree
    expected = draws * p
    # Tolerance: each leaf's count is Binomial(draws, p) (one inclusion per draw at most, draws
    # independent); 5 standard deviations per leaf with a union bound over <= 1000 leaves
    # gives a false alarm chance below 1e-3, and the seed is fixed anyway.
    sd = np.sqrt(draws * p * (1 - p))
    assert np.abs(hits - expected).max() < 5 * sd
    # Whole vector: Pearson's statistic against chi2(degree - 1) at p = 0.001; sampling without
    # replacement correlates the cells negatively, which only lowers the statistic.
    stat = ((hits - expected) ** 2 / expected).sum()
    assert stat < scipy.stats.chi2.ppf(0.999, degree - 1)


@needs_native
def test_take_all_and_large_draws_on_a_hub_exceed_one_chunk():
    # 5000 in-leaves: fanout -1 and a fanout above the degree take all of them (more than the
    # kernel's 2048-edge chunk); fanout 3000 draws through the hash set, 20 through the scan.
    graph = stars(1, 5000)
    for fanout, expected in ((-1, 5000), (6000, 5000), (3000, 3000), (20, 20), (0, 0)):
        dense = sample_dense(graph, torch.tensor([0]), (fanout,), generator=torch.Generator().manual_seed(0),
                             backend="native", return_edge_ids=True)
        leaves = dense.node_ids[dense.nbrs]
        assert leaves.numel() == expected and leaves.unique().numel() == expected
        assert bool((leaves >= 1).all() & (leaves <= 5000).all())
        assert torch.equal(graph.indices[dense.edge_ids], leaves)
        if fanout in (-1, 6000):
            assert torch.equal(dense.edge_ids, torch.arange(5000))   # in slot order


@needs_native
@pytest.mark.parametrize("indptr_dtype,indices_dtype", [(torch.int64, torch.int32),
                                                        (torch.int32, torch.int32),
                                                        (torch.int32, torch.int64)])
@pytest.mark.parametrize("direction", ["in", "both"])
def test_int32_graphs_give_the_int64_result(indptr_dtype, indices_dtype, direction):
    wide = random_graph(300, 3000, seed=11)
    narrow = CSCGraph(wide.num_nodes, wide.indptr.to(indptr_dtype), wide.indices.to(indices_dtype),
                      wide.out_indptr.to(indptr_dtype), wide.out_indices.to(indices_dtype))
    targets = torch.arange(0, 300, 7)
    for backend in ("native", "torch"):
        a, b = (sample_dense(g, targets, (4, 3, 2), generator=torch.Generator().manual_seed(5),
                             direction=direction, backend=backend, return_edge_ids=True)
                for g in (wide, narrow))
        check_invariants(wide, targets, (4, 3, 2), b, direction)
        for field in ("node_ids", "node_id_offsets", "nbrs", "nbr_offsets", "edge_ids"):
            assert torch.equal(getattr(a, field), getattr(b, field)), (backend, field)
            assert getattr(b, field).dtype == torch.int64


@pytest.mark.parametrize("backend", ["torch", pytest.param("native", marks=needs_native)])
@pytest.mark.parametrize("direction", ["in", "both"])
def test_edge_ids_name_the_sampled_edges(backend, direction):
    graph = random_graph(400, 5000, seed=8)
    targets = torch.randperm(400, generator=torch.Generator().manual_seed(2))[:30]
    dense = sample_dense(graph, targets, (5, 4, 3), generator=torch.Generator().manual_seed(2),
                         direction=direction, backend=backend, return_edge_ids=True)
    nbr_global = dense.node_ids[dense.nbrs]
    owner = dense.node_ids[dense.node_id_offsets[1]:].repeat_interleave(dense.nbr_offsets.diff())
    num_in = graph.indices.numel()
    is_in = dense.edge_ids < num_in
    if direction == "in":
        assert bool(is_in.all())
        assert torch.equal(graph.indices[dense.edge_ids], nbr_global)
    else:
        assert bool(is_in.any()) and bool((~is_in).any())
        ids_out = dense.edge_ids[~is_in] - num_in
        assert torch.equal(graph.indices[dense.edge_ids[is_in]], nbr_global[is_in])
        assert torch.equal(graph.out_indices[ids_out], nbr_global[~is_in])
    # and each edge belongs to the node whose sample it is in
    in_owner = torch.searchsorted(graph.indptr, dense.edge_ids[is_in], right=True) - 1
    assert torch.equal(in_owner, owner[is_in])
    if direction == "both":
        out_owner = torch.searchsorted(graph.out_indptr, dense.edge_ids[~is_in] - num_in, right=True) - 1
        assert torch.equal(out_owner, owner[~is_in])
    for k in range(dense.num_layers):
        layer = dense.layer(k)
        assert layer.edge_ids.shape == layer.nbr_index.shape
        assert torch.equal(layer.edge_ids, dense.edge_ids[dense.num_edges - layer.nbr_index.numel():])
    plain = sample_dense(graph, targets, (5, 4, 3), generator=torch.Generator().manual_seed(2),
                         direction=direction, backend=backend)
    assert plain.edge_ids is None and plain.layer(0).edge_ids is None
    assert torch.equal(plain.nbrs, dense.nbrs)                         # ids do not change the draw


@needs_native
def test_bad_graph_raises_and_leaves_the_workspace_clean():
    graph = random_graph(50, 400, seed=1)
    broken = CSCGraph(50, graph.indptr, torch.where(graph.indices == 3, 77, graph.indices))
    workspace = new_workspace(broken)
    assert workspace.dtype == torch.int32
    with pytest.raises(ConfigError, match="corrupted"):
        sample_dense(broken, torch.arange(50), (-1, -1), backend="native", workspace=workspace)
    assert bool((workspace == -1).all())
    short = CSCGraph(50, graph.indptr, graph.indices[:-5])              # indptr runs past indices
    with pytest.raises(ConfigError, match="corrupted"):
        sample_dense(short, torch.arange(50), (-1,), backend="native", workspace=workspace)
    assert bool((workspace == -1).all())


@needs_native
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_dirty_workspace_is_refused_and_reset(dtype):
    graph = random_graph(50, 400, seed=1)
    workspace = torch.full((50,), -1, dtype=dtype)
    workspace[7] = 3
    with pytest.raises(ConfigError, match="workspace was not all -1"):
        sample_dense(graph, torch.tensor([7, 8]), (2,), backend="native", workspace=workspace)
    assert bool((workspace == -1).all())
    dense = sample_dense(graph, torch.tensor([7, 8]), (2,), backend="native", workspace=workspace)
    check_invariants(graph, torch.tensor([7, 8]), (2,), dense)


@needs_native
def test_pooled_outputs_are_not_reused_while_referenced():
    # Output memory is recycled from DENSEs that are gone; one still held must not change.
    graph = random_graph(20_000, 400_000, seed=3)
    gen = torch.Generator().manual_seed(0)
    kept = sample_dense(graph, torch.arange(1000), (10, 10), generator=gen, backend="native")
    assert kept.num_edges > _native._OutputPool.MIN_ELEMENTS            # large enough to be pooled
    snapshot = [t.clone() for t in (kept.node_ids, kept.nbrs, kept.nbr_offsets, *kept.repr_map)]
    for i in range(12):
        other = sample_dense(graph, torch.arange(i, 20_000, 17)[:1000], (10, 10), generator=gen,
                             backend="native")
        del other
    assert all(torch.equal(a, b) for a, b in zip(snapshot, (kept.node_ids, kept.nbrs, kept.nbr_offsets,
                                                            *kept.repr_map)))


@needs_native
def test_threads_sample_concurrently_with_their_own_workspaces():
    graph = random_graph(5000, 80_000, seed=4)
    batches = [torch.randperm(5000, generator=torch.Generator().manual_seed(s))[:200] for s in range(8)]

    def run(batch, seed, workspace):
        return sample_dense(graph, batch, (8, 4), generator=torch.Generator().manual_seed(seed),
                            workspace=workspace, backend="native")

    expected = [run(b, s, None) for s, b in enumerate(batches)]
    results: dict[int, object] = {}
    errors: list[BaseException] = []

    def worker(indices):
        workspace = new_workspace(graph)
        try:
            for s in indices:
                for _ in range(5):
                    results[s] = run(batches[s], s, workspace)
        except BaseException as e:   # re-raised in the test thread below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(range(i, 8, 2),)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    for s, want in enumerate(expected):
        assert torch.equal(results[s].node_ids, want.node_ids) and torch.equal(results[s].nbrs, want.nbrs)


def test_auto_falls_back_to_torch_without_the_kernel(monkeypatch):
    graph = random_graph(200, 2000, seed=9)
    targets = torch.arange(0, 200, 9)
    want = sample_dense(graph, targets, (3, 3), generator=torch.Generator().manual_seed(1), backend="torch")
    monkeypatch.setitem(_native._state, "lib", None)
    monkeypatch.setitem(_native._state, "error", "simulated: not built")
    assert not native_available()
    got = sample_dense(graph, targets, (3, 3), generator=torch.Generator().manual_seed(1))
    assert torch.equal(got.node_ids, want.node_ids) and torch.equal(got.nbrs, want.nbrs)
    with pytest.raises(ConfigError, match="simulated: not built"):
        sample_dense(graph, targets, (3, 3), backend="native")


def test_unknown_backend_is_refused():
    graph = random_graph(20, 50, seed=0)
    with pytest.raises(ConfigError, match="backend must be one of"):
        sample_dense(graph, torch.tensor([1]), (2,), backend="numba")


@pytest.mark.cuda
def test_native_refuses_a_cuda_graph_and_auto_uses_torch():
    graph = random_graph(100, 600, seed=0)
    graph = CSCGraph(graph.num_nodes, graph.indptr.cuda(), graph.indices.cuda())
    with pytest.raises(ConfigError, match="CPU-only"):
        sample_dense(graph, torch.tensor([1]), (2,), backend="native")
    assert sample_dense(graph, torch.tensor([1]), (2,)).nbrs.device.type == "cuda"


@pytest.mark.parametrize("module", ["graphstore.sample._native", "graphstore.buffer._native"])
def test_a_missing_kernel_warns_once_at_the_default_level(module, monkeypatch, caplog):
    import importlib
    import logging

    import importlib.machinery

    mod = importlib.import_module(module)
    monkeypatch.setattr(mod, "_state", {})  # not loaded yet in this process
    monkeypatch.setattr(importlib.machinery, "EXTENSION_SUFFIXES", [".not-built.so"])
    with caplog.at_level(logging.WARNING, logger=mod.__name__):
        assert mod.library() is None and mod.library() is None
    warnings = [r for r in caplog.records if r.name == mod.__name__ and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not built" in warnings[0].getMessage()
    assert "not built" in mod.load_error()
