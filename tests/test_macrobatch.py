"""Macro-batching (BatchGNN): the macrobatch scheme draws exactly the minibatch scheme's
mini-batches and trains them to the same parameters, whatever B, rounds or prefetch; it
fetches each macro-batch's rows once; errors of its thread reach the caller."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import graphstore
from graphstore.errors import ConfigError
from graphstore.loaders import NodeLoader
from graphstore.loaders.macro import FeatureFetch
from graphstore.nn import GNN

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    out = tmp_path_factory.mktemp("cora") / "cora.gs"
    graphstore.convert(REPO / "data" / "cora", out, num_partitions=8, partitioner="metis")
    with graphstore.open(out) as store:
        yield store


def loader(store, **kw):
    return NodeLoader(store, split="train", fanouts=(5, 5), batch_size=16, seed=7, **kw)


def train(store, epochs: int = 2, **kw):
    torch.manual_seed(0)
    model = GNN("sage", in_dim=store.feature_dim, hidden_dim=16, out_dim=store.num_classes, num_layers=2).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data, losses = loader(store, **kw), []
    for epoch in range(epochs):
        for batch in data.epoch(epoch):
            loss = F.cross_entropy(model(batch.features.double(), batch.dense), batch.labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()], data


def test_macro_batches_train_as_the_minibatch_scheme(cora):
    want_losses, want_params, _ = train(cora, scheme="minibatch")
    assert len(want_losses) == 2 * 9  # 140 targets in batches of 16
    for kw in ({"macro_batches": 1}, {"macro_batches": 4}, {"macro_batches": "all"},
               {"macro_batches": "all", "macro_batch_bytes": 200 * 1433 * 4},  # rounds of ~200 rows
               {"macro_batches": 4, "prefetch": False}):
        losses, params, data = train(cora, scheme="macrobatch", **kw)
        assert losses == want_losses, kw
        assert all(torch.equal(a, b) for a, b in zip(params, want_params)), kw
        s = data.fetch_stats
        assert s.mini_batches == 9 and s.rows_fetched <= s.rows_requested and s.bytes_read > 0
        if "macro_batch_bytes" in kw:
            assert s.rounds > s.macro_batches == 1


def test_a_larger_macro_batch_fetches_fewer_rows(cora):
    fetched = {}
    for b in (1, 3, "all"):
        data = loader(cora, scheme="macrobatch", macro_batches=b)
        for _ in data.epoch(0):
            pass
        s = data.fetch_stats
        fetched[b] = s.rows_fetched
        assert s.macro_batches == {1: 9, 3: 3, "all": 1}[b]
        assert data.memory.features is None  # the buffer holds structure and labels only
    assert fetched[1] > fetched[3] > fetched["all"]
    assert fetched[1] == data.fetch_stats.rows_requested  # B = 1 fetches every mini-batch alone


def test_feature_fetch_reads_whole_chunks_and_returns_the_rows(cora):
    from graphstore.loaders.macro import FetchStats

    ids = np.array([0, 5, 338, 339, 2000, cora.num_nodes - 1])
    stats = FetchStats()
    rows = FeatureFetch(cora)(ids, stats)
    np.testing.assert_array_equal(rows, np.asarray(cora.features[...])[ids])
    assert stats.rows_fetched == 6 and stats.chunks_read >= 1 and stats.bytes_read >= rows.nbytes


def test_an_error_while_fetching_reaches_the_caller_and_no_thread_is_left(cora, monkeypatch):
    def broken(self, ids, stats):
        raise OSError("the store went away")

    monkeypatch.setattr(FeatureFetch, "__call__", broken)
    with pytest.raises(OSError, match="the store went away"):
        for _ in loader(cora, scheme="macrobatch", macro_batches=2).epoch(0):
            pass
    assert not [t for t in threading.enumerate() if t.name == "graphstore-macrobatch"]


def test_stopping_early_joins_the_thread(cora):
    epoch = loader(cora, scheme="macrobatch", macro_batches=2).epoch(0)
    next(epoch)
    epoch.close()
    assert not [t for t in threading.enumerate() if t.name == "graphstore-macrobatch"]


def test_bad_macro_settings_are_refused(cora):
    with pytest.raises(ConfigError, match="for the macrobatch scheme"):
        loader(cora, scheme="megabatch", macro_batches=4)
    with pytest.raises(ConfigError, match="macro_batches must be"):
        loader(cora, scheme="macrobatch", macro_batches=0)
    with pytest.raises(ConfigError, match="positive integer or 'all'"):
        loader(cora, scheme="macrobatch", macro_batches="some")
    settings = loader(cora, scheme="macrobatch", macro_batches="all").settings.to_dict()
    assert settings["macro_batches"] == -1 and "macro_batches" not in loader(cora).settings.to_dict()
