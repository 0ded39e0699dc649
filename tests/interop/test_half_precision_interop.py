"""Interop with half-precision stores (issue 34, 1): PyG's sampled ``Data``, the store as
PyG's remote backend and DGL's blocks carry the rows as stored (float16, bfloat16, float32),
and a PyG model fed them after a widening cast gives what it gives on the float32 rows of the
same values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graphstore
from graphstore.buffer.slots import rows_as_tensor
from graphstore.interop import pyg as interop_pyg
from tests.half_sources import DTYPES, TORCH, convert, source_rows, write_source


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("half-interop")
    features, labels = source_rows(num_nodes=400)
    src = write_source(root / "src", features, labels)
    return {dt: convert(src, root / f"{dt}.gs", dt) for dt in DTYPES}


def _rows(store) -> torch.Tensor:
    """Every stored row as a tensor of the stored dtype (bfloat16 viewed from its bits)."""
    return rows_as_tensor(np.asarray(store.features[...]), store.manifest.feature_dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pyg_data_and_remote_backend_keep_the_stored_dtype(pyg, stores, dtype):
    with graphstore.open(stores[dtype]) as store:
        rows = _rows(store)
        assert rows.dtype == TORCH[dtype]
        loader = store.node_loader(split="train", fanouts=(4, 3), batch_size=32, scheme="megabatch", seed=0)
        conv = pyg.nn.SAGEConv(store.feature_dim, 4)
        for batch in loader.epoch(0):
            data = batch.to_pyg()
            assert data.x.dtype == TORCH[dtype] and torch.equal(data.x, rows[data.n_id])
            out = conv(data.x.float(), data.edge_index)  # PyG's layers compute in float32
            assert torch.isfinite(out).all()
        feature_store, _ = interop_pyg.remote_backend(store)
        ids = torch.tensor([399, 0, 17, 17, 250])
        got = feature_store.get_tensor(None, "x", ids)
        assert got.dtype == TORCH[dtype] and torch.equal(got, rows[ids])
        assert torch.equal(feature_store.get_tensor(None, "x", None), rows)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dgl_blocks_keep_the_stored_dtype(dgl, stores, dtype):
    with graphstore.open(stores[dtype]) as store:
        rows = _rows(store)
        loader = store.node_loader(split="train", fanouts=(4, 3), batch_size=32, scheme="megabatch", seed=0)
        for batch in loader.epoch(0):
            blocks = batch.to_dgl()
            feat = blocks[0].srcdata["feat"]
            assert feat.dtype == TORCH[dtype] and torch.equal(feat, rows[blocks[0].srcdata[dgl.NID]])
