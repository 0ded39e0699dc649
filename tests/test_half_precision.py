"""Half-precision features end to end (issue 34, 1), for float16, bfloat16 and float32 stores of
one source: every scheme's batches carry the rows as stored (the dtype, the bytes), the model
widens them where it computes; exact inference, ``graphstore aggregate``, SAR's blocks and
the row normalisation give what the float32 store of the same rounded values gives."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import graphstore
from graphstore.buffer.slots import host_array
from graphstore.distributed.rank_graph import load_block_data, load_rank_graph
from graphstore.inference import InferenceStats, aggregate_store, infer_layerwise
from graphstore.loaders import NodeLoader
from graphstore.nn import GNN, normalize_rows
from tests.half_sources import DTYPES, TORCH, convert, source_rows, stored_rows, upcast_source, write_source

LOADERS = [
    {"scheme": "minibatch"},
    {"scheme": "megabatch", "capacity": 2},  # with the static cache (hub rows)
    {"scheme": "disk", "capacity": 2},
    {"scheme": "microbatch", "micro_batches": 2},
    {"scheme": "macrobatch", "macro_batches": 2},
    {"scheme": "macrobatch", "macro_batches": 2, "feature_cache_bytes": 200 * 24 * 2},
    {"scheme": "macrobatch", "macro_batches": 2, "feature_cache_bytes": 200 * 24 * 2, "feature_cache": "lru",
     "prefetch": False},
]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """dtype -> (the store at that dtype, the float32 store of the same rounded rows)."""
    root = tmp_path_factory.mktemp("half")
    features, labels = source_rows()
    src = write_source(root / "src", features, labels)
    out = {}
    for dt in DTYPES:
        ref = convert(upcast_source(root / f"ref-{dt}", features, labels, dt), root / f"ref-{dt}.gs", "float32")
        out[dt] = (convert(src, root / f"{dt}.gs", dt), ref)
    return out


@pytest.mark.parametrize("kw", LOADERS, ids=lambda kw: "-".join(str(v) for v in kw.values()))
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_scheme_gives_the_stored_rows_and_trains(stores, dtype, kw):
    """Batches carry ``dtype`` rows equal to the store's bytes (the static cache, the feature
    cache and macro rounds included); the model's output is float32 and equals its output
    on the rows widened first; a step's loss is finite and its gradient reaches the weights."""
    with graphstore.open(stores[dtype][0]) as store:
        stored = host_array(torch.from_numpy(np.asarray(store.features[...])))  # raw bits/values
        torch.manual_seed(0)
        model = GNN("sage", in_dim=store.feature_dim, hidden_dim=8, out_dim=store.num_classes, num_layers=2)
        loader = NodeLoader(store, split="train", fanouts=(5, 5), batch_size=32, seed=7, **kw)
        batches = 0
        for epoch in range(2):  # the second epoch's macro rounds hit the feature cache
            for batch in loader.epoch(epoch):
                assert batch.features.dtype == TORCH[dtype]
                assert np.array_equal(host_array(batch.features), stored[batch.store_ids.numpy()])
                if batch.micro_batches is not None:
                    assert all(m.batch(batch).features.dtype == TORCH[dtype] for m in batch.micro_batches)
                out = model(batch.features, batch.dense)
                assert out.dtype == torch.float32
                assert torch.equal(out, model(batch.features.float(), batch.dense))
                model.zero_grad()
                loss = torch.nn.functional.cross_entropy(out, batch.labels)
                loss.backward()
                assert torch.isfinite(loss) and model.layers[0].parameters().__next__().grad.abs().sum() > 0
                batches += 1
        assert batches >= 4


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_stores_read_half_the_feature_bytes(stores, dtype):
    """The same disk epoch reads the float32 store's bytes less half of its feature bytes."""
    read = {}
    for dt in (dtype, "float32"):
        with graphstore.open(stores[dt][0]) as store:
            loader = NodeLoader(store, split="train", fanouts=(5, 5), batch_size=128, seed=7, scheme="disk",
                                capacity=2)
            for _ in loader.epoch(0):
                pass
            read[dt] = loader.last_stats.bytes_read
            features = store.num_nodes * store.feature_dim * 4
    assert read["float32"] - read[dtype] == features // 2


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_inference_equals_the_float32_upcast_reference(stores, dtype, kind):
    """infer_layerwise over a half store equals it over the float32 store of the same values,
    with and without row normalisation; it counts the stored bytes, not their float32 copy."""
    torch.manual_seed(1)
    half, ref = stores[dtype]
    with graphstore.open(half) as h, graphstore.open(ref) as r:
        model = GNN(kind, in_dim=h.feature_dim, hidden_dim=16, out_dim=h.num_classes, num_layers=2, heads=2).eval()
        for transform in (None, normalize_rows):
            sh, sr = InferenceStats(), InferenceStats()
            got = infer_layerwise(model, h, capacity=2, stats=sh, input_transform=transform)
            want = infer_layerwise(model, r, capacity=2, stats=sr, input_transform=transform)
            assert got.dtype == np.float32 and np.array_equal(got, want)
        saved = h.num_nodes * h.feature_dim * (4 - np.dtype(h.array("nodes/features").dtype).itemsize)
        assert sr.bytes_read - sh.bytes_read == saved  # the first layer reads the store; later ones scratch rows


@pytest.mark.parametrize("dtype", DTYPES)
def test_aggregate_stays_float32_and_equals_the_reference(stores, dtype, tmp_path):
    """``graphstore aggregate`` of a half store: float32 aggregates equal to those of the
    float32 store of the same values (row-normalised too), and the macro-batch loader serves
    them beside the rows as stored."""
    half, ref = (shutil.copytree(p, tmp_path / p.name) for p in stores[dtype])
    for normalize in (False, True):
        a = aggregate_store(half, "mean", normalize=normalize)
        b = aggregate_store(ref, "mean", normalize=normalize)
        assert a["dtype"] == "float32" == b["dtype"]
        with graphstore.open(half) as h, graphstore.open(ref) as r:
            got, want = np.asarray(h.array(a["array"])[...]), np.asarray(r.array(b["array"])[...])
        assert got.dtype == np.float32 and np.array_equal(got, want), normalize
    with graphstore.open(half) as h:
        stored = host_array(torch.from_numpy(np.asarray(h.features[...])))
        loader = NodeLoader(h, split="train", fanouts=(5,), batch_size=128, scheme="macrobatch", aggregated="mean",
                            feature_cache_bytes=200 * 48 * 4)
        for batch in loader.epoch(0):
            assert batch.features.dtype == TORCH[dtype] and batch.aggregated.dtype == torch.float32
            assert np.array_equal(host_array(batch.features), stored[batch.store_ids.numpy()])
            assert torch.equal(batch.aggregated, torch.from_numpy(want[batch.store_ids.numpy()]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sar_blocks_are_read_as_stored_or_widened_exactly(stores, dtype):
    """A full-batch rank's block: as stored with ``dtype=None`` (copied to the device half),
    float32 on request; both the reference's numbers."""
    with graphstore.open(stores[dtype][0]) as store:
        graph = load_rank_graph(store, 0, 1)  # one rank: its block is the whole graph
        as_stored = load_block_data(store, graph, dtype=None)
        widened = load_block_data(store, graph)
        lo, hi = graph.node_range
        want = torch.from_numpy(stored_rows(store)[lo:hi])
    assert as_stored.features.dtype == TORCH[dtype] and widened.features.dtype == torch.float32
    assert torch.equal(as_stored.features.float(), want) and torch.equal(widened.features, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_row_normalisation_of_half_rows_is_computed_in_float32(dtype):
    """A wide non-negative row whose sum is past float16's range (65504): normalised in
    float32, not divided by inf into zeros."""
    x = torch.full((2, 4000), 30.0).to(dtype)
    x[1] = 0
    got = normalize_rows(x)
    assert got.dtype == torch.float32
    assert torch.allclose(got, normalize_rows(x.float())) and float(got[0].sum()) == pytest.approx(1.0)
    assert bool((got[1] == 0).all())


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_cross_to_the_device_as_stored(stores, dtype):
    """The DeviceFeeder copies the stored dtype (half the bytes for half rows); the model
    widens them on the device."""
    from graphstore.loaders import DeviceFeeder

    with graphstore.open(stores[dtype][0]) as store:
        loader = NodeLoader(store, split="train", fanouts=(5, 5), batch_size=128, seed=7, scheme="minibatch")
        model = GNN("sage", in_dim=store.feature_dim, hidden_dim=8, out_dim=store.num_classes, num_layers=2).cuda()
        for batch in DeviceFeeder("cuda")(loader.epoch(0)):
            assert batch.features.is_cuda and batch.features.dtype == TORCH[dtype]
            assert model(batch.features, batch.dense).dtype == torch.float32
