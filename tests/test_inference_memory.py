"""Layer-wise inference within its byte budget whatever the buckets: a bucket larger than a
piece is cut by destination range and the result stays exact for every layer kind (against
a dense float64 forward and the uncut walk); `min_buffer_bytes` does not grow with the
largest bucket; and a walk over one very large bucket of wide rows, measured in a fresh
process, holds no more than its budget over what the same process holds without it."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import graphstore
import graphstore.inference.layerwise as lw
from graphstore.errors import ConfigError
from graphstore.inference import InferenceStats, infer_layerwise, min_buffer_bytes
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout.sources.base import TASK_NODE, EdgeChunk, SourceGraph
from graphstore.nn import GNN, AggregationModel, LayerView


def edge_list_store(out: Path, src, dst, *, num_nodes: int, num_partitions: int, feature_dim: int,
                    rel=None, seed: int = 0) -> Path:
    """A store of exactly these directed edges (repeats kept, self loops dropped), random
    features, partitions of consecutive ids (``sequential``: store id = source id)."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    rel = None if rel is None else np.asarray(rel, dtype=np.int64)
    features = np.random.default_rng(seed).standard_normal((num_nodes, feature_dim)).astype(np.float32)
    step = 1 << 16
    graph = SourceGraph(
        name="edge-list", format="memory", path="memory", num_nodes=num_nodes, directed=True,
        edges=lambda: (EdgeChunk(src[a:a + step], dst[a:a + step], None if rel is None else rel[a:a + step])
                       for a in range(0, len(src), step)),
        num_relations=0 if rel is None else int(rel.max()) + 1, feature_dim=feature_dim,
        features=lambda: iter([features]), labels=np.zeros(num_nodes, dtype=np.int64), num_classes=2,
        node_splits={"train": np.arange(num_nodes)}, tasks=(TASK_NODE,), split_origin={"kind": "handmade"},
    )
    convert(graph, out, ConvertOptions(num_partitions=num_partitions, partitioner="sequential",
                                       keep_duplicates=True, keep_self_loops=False, hub_fraction=0.0))
    return out


# ---------------------------------------------------------------------- exact when cut


@pytest.fixture(scope="module")
def uneven(tmp_path_factory) -> Path:
    """40 nodes in 4 partitions of 10: bucket (0, 0) of about 150 edges, 60 of them into one node
    (its in-edges straddle several pieces); bucket (1, 2) of one edge, (2, 1) of none;
    partition 3 has out-edges and no in-edge."""
    rng = np.random.default_rng(5)
    src = [rng.integers(0, 10, 160), [12], rng.integers(0, 30, 60), [31, 35, 38]]
    hub = np.full(60, 3)
    dst = [np.concatenate([hub, rng.integers(0, 10, 100)]), [25], rng.integers(0, 30, 60), [5, 22, 14]]
    src, dst = np.concatenate(src), np.concatenate(dst)
    keep = ~((src // 10 == 2) & (dst // 10 == 1)) & ~((src // 10 == 1) & (dst // 10 == 2)) & (src != dst)
    src = np.concatenate([src[keep], [12]])  # bucket (1, 2): exactly the one edge
    dst = np.concatenate([dst[keep], [25]])
    rel = rng.integers(0, 3, len(src))
    return edge_list_store(tmp_path_factory.mktemp("uneven") / "uneven.gs", src, dst, num_nodes=40,
                           num_partitions=4, feature_dim=6, rel=rel)


def dense_float64(model: GNN, store) -> np.ndarray:
    """The model in float64 over the whole graph in memory, every node with all in-edges."""
    p, n = store.num_partitions, store.num_nodes
    parts = [store.read_bucket(i, j) for j in range(p) for i in range(p)]
    src, dst, rel = (torch.from_numpy(np.concatenate([b[k] for b in parts]).astype(np.int64))
                     for k in range(3))
    order = torch.argsort(dst, stable=True)
    src, dst, rel = src[order], dst[order], rel[order]
    view = LayerView(n, n, slice(0, n), src, torch.bincount(dst, minlength=n), dst)
    x = torch.from_numpy(np.asarray(store.features[...], dtype=np.float64))
    reference = copy.deepcopy(model).double().eval()
    kw = {"edge_type": [rel] * model.num_layers} if model.kind == "rgcn" else {}
    if model.kind == "gcn":
        kw["degrees"] = torch.from_numpy(store.read_degree("in").astype(np.int64))
    with torch.no_grad():
        return reference(x, [view] * model.num_layers, **kw).numpy()


def test_the_store_is_what_the_cut_relies_on(uneven):
    """Every bucket sorted by destination (then source), so consecutive edges are a range of
    destinations; and the buckets the exactness test needs are there."""
    with graphstore.open(uneven) as store:
        p = store.num_partitions
        sizes = np.diff(store.bucket_offsets).reshape(p, p).T
        for i in range(p):
            for j in range(p):
                src, dst, _ = store.read_bucket(i, j)
                assert np.all(np.diff(dst.astype(np.int64) * store.num_nodes + src) >= 0), (i, j)
        assert sizes[0, 0] >= 140 and sizes[1, 2] == 1 and sizes[2, 1] == 0 and sizes[:, 3].sum() == 0
        assert sizes[3].sum() > 0


def model_of(kind: str, store) -> GNN:
    torch.manual_seed(7)
    return GNN(kind, in_dim=store.feature_dim, hidden_dim=8, out_dim=5, num_layers=2, heads=2,
               num_relations=max(store.num_relations, 1), num_bases=2)


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat", "gin", "rgcn"])
def test_cut_buckets_give_the_exact_result(uneven, kind, monkeypatch):
    with graphstore.open(uneven) as store:
        model = model_of(kind, store)
        want = dense_float64(model, store)
        whole = {c: infer_layerwise(model, store, capacity=c) for c in (2, 4)}
        capacity = lw._Walk._capacity
        finished = []
        finish = lw._Walk._finish
        monkeypatch.setattr(lw._Walk, "_finish",
                            lambda self, k, acc: finished.append((self.l, k)) or finish(self, k, acc))
        # Windows of 5 edges: the ranges of a cut bucket come from several windows.
        monkeypatch.setattr(lw, "WINDOW_EDGES", 5)
        # Pieces of 1, 3 and 7 edges; 2 partitions resident (accumulators written back and
        # read again) and all 4; every edge its own update (GAT: a partition's worth); and
        # without the loader thread (accumulators written back at another point).
        cases = [(piece, c, update, True)
                 for piece in (1, 3, 7) for c in (2, 4) for update in (lw.UPDATE_BYTES, 1)]
        for piece, c, update_bytes, prefetch in [*cases, (3, 2, lw.UPDATE_BYTES, False), (1, 2, 1, False)]:
            monkeypatch.setattr(lw._Walk, "_capacity", lambda self, *a, n=piece: (*capacity(self, *a)[:2], n))
            monkeypatch.setattr(lw, "UPDATE_BYTES", update_bytes)
            finished.clear()
            stats = InferenceStats()
            got = infer_layerwise(model, store, capacity=c, stats=stats, prefetch=prefetch)
            case = f"{kind}: pieces of {piece}, capacity {c}, UPDATE_BYTES {update_bytes}, prefetch={prefetch}"
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=case)
            np.testing.assert_allclose(got, whole[c], rtol=1e-5, atol=1e-5, err_msg=case)
            # Each partition finished once per layer, however many pieces it took.
            assert Counter(finished) == {(l, k): 1 for l in range(2) for k in range(4)}, case
            assert stats.bytes_read >= stats.planned_bytes > 0


def test_pieces_cut_only_what_does_not_fit(uneven):
    with graphstore.open(uneven) as store:
        walk = lw._Walk(model_of("sage", store), store, Path("."), InferenceStats(), seed=0, prefetch=True)
        p, offsets = store.num_partitions, store.bucket_offsets
        states = [tuple(range(p))]
        steps = walk._pieces(states, np.zeros((p, p), dtype=np.int64), 7)
        ranges = [r for _, piece in steps for r in piece]
        assert all(sum(hi - lo for _, lo, hi in piece) <= 7 for _, piece in steps)
        # Every edge once, in storage order; only buckets of more than 7 edges are cut.
        assert [(lo, hi) for _, lo, hi in ranges] == sorted((lo, hi) for _, lo, hi in ranges)
        covered = np.zeros(int(offsets[-1]), dtype=np.int64)
        for b, lo, hi in ranges:
            assert offsets[b] <= lo < hi <= offsets[b + 1]
            covered[lo:hi] += 1
            if offsets[b + 1] - offsets[b] <= 7:
                assert (lo, hi) == (offsets[b], offsets[b + 1])
        assert np.all(covered == 1)


# ---------------------------------------------------------------------- the budget's floor


def wide_store(out: Path, *, big_bucket: int, seed: int = 0) -> Path:
    """6000 nodes with 512 features in 3 partitions of 2000, 20k edges spread over every
    bucket, and ``big_bucket`` more inside partition 0 (bucket (0, 0))."""
    rng = np.random.default_rng(seed)
    src = np.concatenate([rng.integers(0, 6000, 20_000), rng.integers(0, 2000, big_bucket)])
    dst = np.concatenate([rng.integers(0, 6000, 20_000), rng.integers(0, 2000, big_bucket)])
    return edge_list_store(out, src, dst, num_nodes=6000, num_partitions=3, feature_dim=512, seed=seed)


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("wide")
    tiny = root / "tiny.gs"
    edge_list_store(tiny, [0, 1, 2, 3], [1, 2, 3, 0], num_nodes=4, num_partitions=2, feature_dim=512)
    return {"small": wide_store(root / "small.gs", big_bucket=0),
            "big": wide_store(root / "big.gs", big_bucket=300_000), "tiny": tiny}


def test_min_buffer_bytes_does_not_grow_with_the_largest_bucket(wide):
    with graphstore.open(wide["small"]) as small, graphstore.open(wide["big"]) as big:
        assert int(np.diff(big.bucket_offsets).max()) > 40 * int(np.diff(small.bucket_offsets).max())
        torch.manual_seed(0)
        gin = GNN("gin", in_dim=512, hidden_dim=64, out_dim=4, num_layers=2)
        for model in (gin, AggregationModel("sum", 512)):
            least = min_buffer_bytes(model, big)
            assert least == min_buffer_bytes(model, small)
            # Three partitions of 512-wide rows and accumulators and the rest: a fraction of
            # the 586 MiB that gathering the big bucket's source rows at once would take.
            assert least < 64 << 20 < 300_000 * 512 * 4 // 8
            with pytest.raises(ConfigError) as error:
                infer_layerwise(model, big, buffer_bytes=least - 1)
            message = str(error.value)
            assert f"needs {least} bytes" in message and f"a piece of {lw.MIN_PIECE_EDGES} edges" in message
            assert "3 partitions of prepared rows and accumulators" in message  # 2 resident, 1 read ahead


def test_a_budget_cuts_the_big_bucket_and_changes_nothing(wide, monkeypatch):
    steps = []
    pieces = lw._Walk._pieces
    monkeypatch.setattr(lw._Walk, "_pieces", lambda self, *a: steps.append(pieces(self, *a)) or steps[-1])
    with graphstore.open(wide["big"]) as store:
        model = AggregationModel("mean", 512)
        stats = InferenceStats()
        got = infer_layerwise(model, store, buffer_bytes=min_buffer_bytes(model, store), stats=stats)
        offsets = store.bucket_offsets
        cut = [(lo, hi) for _, piece in steps[0] for b, lo, hi in piece
               if (lo, hi) != (offsets[b], offsets[b + 1])]
        assert len(cut) > 100  # the 300k-edge bucket, in pieces of about a thousand edges
        assert stats.capacities == [2]
        np.testing.assert_allclose(got, infer_layerwise(model, store, capacity=3), rtol=1e-5, atol=1e-5)


def test_a_budget_is_refused_before_anything_is_read(wide, tmp_path, monkeypatch):
    reads = []
    monkeypatch.setattr(lw._Walk, "layer", lambda *a, **k: reads.append(a))
    with graphstore.open(wide["big"]) as store:
        with pytest.raises(ConfigError, match="too small for layer 0"):
            infer_layerwise(GNN("gin", in_dim=512, hidden_dim=64, out_dim=4, num_layers=2), store,
                            buffer_bytes=1 << 20, work_dir=tmp_path)
    assert reads == [] and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- measured


CHILD = textwrap.dedent("""
    import json, sys
    import torch
    import graphstore
    from graphstore.inference import infer_layerwise, min_buffer_bytes
    from graphstore.nn import GNN, AggregationModel

    spec = json.loads(sys.argv[1])

    def model_for(store):
        torch.manual_seed(0)
        if spec["kind"] == "aggregate":
            return AggregationModel("sum", store.feature_dim)
        return GNN(spec["kind"], in_dim=store.feature_dim, hidden_dim=64, out_dim=4, num_layers=2,
                   num_relations=max(1, store.num_relations))

    # Everything but the walk: the interpreter, torch, the store, the model, and a walk over
    # a 4-node store (the code, the reader's and the loader's threads, first used).
    with graphstore.open(spec["tiny"]) as tiny:
        infer_layerwise(model_for(tiny), tiny)
    with graphstore.open(spec["store"]) as store:
        model = model_for(store)
        least = min_buffer_bytes(model, store)
        if spec["walk"]:
            infer_layerwise(model, store, buffer_bytes=spec["budget"])
    # VmHWM, not ru_maxrss: the latter keeps the forked parent's size across the exec.
    hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"peak_bytes": hwm * 1024, "min_buffer_bytes": least}))
""")


def peak(spec: dict) -> dict:
    """Run `CHILD` in a fresh interpreter; its peak resident set (VmHWM) is its own."""
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc (Linux)")
@pytest.mark.parametrize("kind", ["gin", "aggregate"])
def test_a_walk_over_one_huge_bucket_holds_its_budget(wide, kind):
    """GIN's prepared sources are its 512-wide input rows; the aggregation model's too. The
    big bucket's 300k edges gathered whole would be 600 MiB of rows (the old floor)."""
    budget = 64 << 20
    spec = {"store": str(wide["big"]), "tiny": str(wide["tiny"]), "kind": kind, "budget": budget}
    fixed = peak({**spec, "walk": False})
    walked = peak({**spec, "walk": True})
    assert walked["min_buffer_bytes"] <= budget
    assert walked["peak_bytes"] - fixed["peak_bytes"] <= budget, (
        f"{kind}: the walk held {(walked['peak_bytes'] - fixed['peak_bytes']) / 2**20:.1f} MiB over the "
        f"{fixed['peak_bytes'] / 2**20:.1f} MiB the process holds without it; "
        f"budget {budget / 2**20:.0f} MiB")


@pytest.fixture(scope="module")
def relational(tmp_path_factory) -> dict[str, Path]:
    """6,000 nodes in 2 partitions, 60,000 edges of 120 relations, 64 features (a knowledge
    graph's many relations: an issue 31 review's 237-relation graph had its 2 GiB refused),
    and a 4-node store of 2 relations for the warm-up."""
    root = tmp_path_factory.mktemp("relational")
    rng = np.random.default_rng(9)
    n, e = 6000, 60000
    big = edge_list_store(root / "kg.gs", rng.integers(0, n, e), rng.integers(0, n, e), num_nodes=n,
                          num_partitions=2, feature_dim=64, rel=rng.integers(0, 120, e))
    tiny = edge_list_store(root / "tiny.gs", [0, 1, 2], [1, 2, 3], num_nodes=4, num_partitions=2, feature_dim=64,
                           rel=[0, 1, 1])
    return {"big": big, "tiny": tiny}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc (Linux)")
def test_an_rgcn_over_many_relations_holds_a_budget_that_does_not_grow_with_them(relational):
    """RGCN's walk keeps one sum per destination (every relation's count is read before the
    block opens) and, one weight per relation, the input rows as sources: per-relation sums
    and projections were [P, R, width], here 3000 x 120 x 64 floats (88 MiB) each, so the
    floor was several hundred MiB. Measured against the process without the walk."""
    budget = 32 << 20
    with graphstore.open(relational["big"]) as store:
        torch.manual_seed(0)
        model = GNN("rgcn", in_dim=64, hidden_dim=64, out_dim=4, num_layers=2, num_relations=store.num_relations)
        per_relation = store.partition_size * store.num_relations * 64 * 4
        assert min_buffer_bytes(model, store) < per_relation // 4 < budget * 4
        got = infer_layerwise(model, store, buffer_bytes=min_buffer_bytes(model, store))
        assert float(np.abs(got - dense_float64(model, store)).max()) < 1e-4
    spec = {"store": str(relational["big"]), "tiny": str(relational["tiny"]), "kind": "rgcn", "budget": budget}
    fixed = peak({**spec, "walk": False})
    walked = peak({**spec, "walk": True})
    assert walked["peak_bytes"] - fixed["peak_bytes"] <= budget, (
        f"the walk held {(walked['peak_bytes'] - fixed['peak_bytes']) / 2**20:.1f} MiB over the "
        f"{fixed['peak_bytes'] / 2**20:.1f} MiB the process holds without it; budget {budget / 2**20:.0f} MiB")
