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
from graphstore.loaders.feature_cache import CacheStats, FeatureCache
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
               {"macro_batches": 4, "prefetch": False},
               {"macro_batches": 1, "feature_cache_bytes": 300 * 1433 * 4},  # Belady, 3 batches ahead
               {"macro_batches": 2, "feature_cache_bytes": 300 * 1433 * 4, "feature_cache": "lru"},
               {"macro_batches": "all", "macro_batch_bytes": 200 * 1433 * 4, "feature_cache_bytes": 10**9},
               {"macro_batches": "all", "macro_batch_bytes": 20_000}):  # samples cut it: several macro-batches
        losses, params, data = train(cora, scheme="macrobatch", **kw)
        assert losses == want_losses, kw
        assert all(torch.equal(a, b) for a, b in zip(params, want_params)), kw
        s = data.fetch_stats
        assert s.mini_batches == 9 and s.rows_fetched <= s.rows_union <= s.rows_requested and s.bytes_read > 0
        assert s.rows_fetched + s.cache_hits == s.rows_union
        assert (s.cache_hits > 0) == ("feature_cache_bytes" in kw and kw.get("macro_batches") != "all"
                                      or kw.get("feature_cache_bytes") == 10**9)
        if kw.get("macro_batch_bytes") == 20_000:
            assert 1 < s.macro_batches < 9  # B = all held what fit, not the epoch
        elif "macro_batch_bytes" in kw:
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
        assert data.memory is None and data.walk.graph.features is None  # structure and labels only
    assert fetched[1] > fetched[3] > fetched["all"]
    assert fetched[1] == data.fetch_stats.rows_requested  # B = 1 fetches every mini-batch alone


def test_feature_fetch_reads_only_the_rows_blocks(cora):
    from graphstore.loaders.macro import FetchStats

    ids = np.array([0, 5, 338, 339, 2000, cora.num_nodes - 1])
    stats = FetchStats()
    rows = FeatureFetch(cora)(ids, stats)
    np.testing.assert_array_equal(rows, np.asarray(cora.features[...])[ids])
    # Cora's 5.7 KB rows are one block each; 338 and 339 are one request; 0 and 5 are two
    # (the 4 rows between them, 23 KB, are more than MERGE_GAP_BYTES).
    assert stats.rows_fetched == 6 and stats.blocks_read == 6 and stats.requests == 5
    assert stats.bytes_read == rows.nbytes


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


# ---------------------------------------------------------------------- the feature cache


def _best_hits(rounds: list[np.ndarray], capacity: int) -> int:
    """The most cache hits any policy gets on ``rounds`` (every round's rows pass through;
    after each, any ``capacity`` of the held and used rows may be kept): a search over
    every choice, for a tiny universe."""
    from functools import cache
    from itertools import combinations

    @cache
    def best(t: int, held: frozenset) -> int:
        if t == len(rounds):
            return 0
        used = set(rounds[t].tolist())
        hits = len(used & held)
        pool = sorted(used | held)
        keep = [frozenset(c) for c in combinations(pool, min(capacity, len(pool)))]
        return hits + max(best(t + 1, k) for k in keep)

    return best(0, frozenset())


def _serve_all(rounds, capacity_rows, policy, dim=3):
    cache = FeatureCache(dim, capacity_rows * 4 * dim, policy)
    stats = CacheStats()
    table = np.arange(100 * dim, dtype=np.float32).reshape(100, dim)
    fetched = []
    for t, union in enumerate(rounds):
        rows = cache.serve(union, rounds[t + 1:], lambda ids: (fetched.append(ids.size), table[ids])[1], stats)
        np.testing.assert_array_equal(rows, table[union])  # hits and misses both give the right rows
        assert cache.ids.size <= capacity_rows and np.all(np.diff(cache.ids) > 0)
    assert sum(fetched) == stats.misses
    return stats


def test_belady_is_optimal_when_every_round_ahead_is_known():
    rng = np.random.default_rng(3)
    for trial in range(40):
        rounds = [np.unique(rng.integers(0, 7, rng.integers(1, 5))) for _ in range(6)]
        capacity = int(rng.integers(1, 4))
        belady = _serve_all(rounds, capacity, "belady")
        lru = _serve_all(rounds, capacity, "lru")
        assert belady.hits == _best_hits(rounds, capacity), (trial, rounds, capacity)
        assert lru.hits <= belady.hits
        assert belady.hits + belady.misses == sum(r.size for r in rounds)


def test_a_cache_of_nothing_hits_nothing_and_bad_settings_are_refused():
    rounds = [np.array([1, 2]), np.array([1, 2])]
    assert _serve_all(rounds, 0, "belady").hits == 0
    assert _serve_all(rounds, 2, "lru").hits == 2
    with pytest.raises(ConfigError, match="belady, lru"):
        FeatureCache(4, 100, "fifo")


def test_belady_beats_lru_on_cora_with_the_same_samples(cora):
    stats = {}
    for policy in ("belady", "lru"):
        data = loader(cora, scheme="macrobatch", macro_batches=1, feature_cache_bytes=400 * 1433 * 4,
                      feature_cache=policy, cache_lookahead=8)
        for epoch in range(2):
            for _ in data.epoch(epoch):
                pass
        stats[policy] = data.fetch_stats
    assert stats["belady"].rows_union == stats["lru"].rows_union  # the same mini-batches
    assert stats["belady"].cache_hits > stats["lru"].cache_hits > 0
    assert stats["belady"].bytes_read < stats["lru"].bytes_read


@pytest.mark.parametrize("prefetch", [True, False])
def test_the_loaders_epoch_stats_count_the_rows_macro_batching_reads(cora, prefetch):
    """What the trainer's console, ``io.bytes_read`` and `graphstore plot` show comes from
    the loader's epoch stats: macro-batching's reads are the epoch's reads (issue 31, 4)."""
    data = loader(cora, scheme="macrobatch", macro_batches=2, prefetch=prefetch)
    for epoch in range(2):
        for _ in data.epoch(epoch):
            pass
        fetched, io = data.fetch_stats, data.last_stats
        assert fetched.bytes_read > 0
        # Epoch 0 also read the structure (once a run); epoch 1 read feature rows only.
        structure = data.epoch_stats[0].planned_bytes if epoch == 0 else 0
        assert io.bytes_read == structure + fetched.bytes_read
        assert io.read_seconds >= fetched.read_seconds > 0
    assert [s.bytes_read > 0 for s in data.epoch_stats] == [True, True]


F16_LOADERS = [
    {"scheme": "minibatch"},
    {"scheme": "megabatch", "capacity": 2},
    {"scheme": "disk", "capacity": 2},
    {"scheme": "microbatch", "micro_batches": 2},
    {"scheme": "macrobatch", "macro_batches": 2},
    {"scheme": "macrobatch", "macro_batches": 2, "feature_cache_bytes": 100 * 16 * 2},
    {"scheme": "macrobatch", "macro_batches": 2, "feature_cache_bytes": 100 * 16 * 2, "feature_cache": "lru",
     "prefetch": False},
]


@pytest.mark.parametrize("kw", F16_LOADERS, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_float16_rows_come_back_as_stored_in_every_scheme(float16_store, kw):
    """One dtype: every scheme gives the stored float16 rows (macro-batching with a feature
    cache gave float32; issue 31, 8), and the model takes them (upcast where it consumes them)."""
    with graphstore.open(float16_store) as store:
        stored = torch.from_numpy(np.asarray(store.features[...]))
        model = GNN("sage", in_dim=store.feature_dim, hidden_dim=8, out_dim=store.num_classes, num_layers=2)
        data = NodeLoader(store, split="test", fanouts=(5, 5), batch_size=128, seed=7, **kw)
        for epoch in range(2):  # the second epoch's rounds hit the cache
            for batch in data.epoch(epoch):
                assert batch.features.dtype == torch.float16
                assert torch.equal(batch.features, stored[batch.store_ids])
                out = model(batch.features, batch.dense)
                assert out.dtype == torch.float32
                assert torch.allclose(out, model(batch.features.float(), batch.dense))
        if "feature_cache_bytes" in kw:
            assert data.fetch_stats.cache_hits > 0


@pytest.mark.parametrize("policy", ["lru", "belady"])
def test_a_named_feature_cache_without_bytes_gets_a_default_size_from_memory(cora, monkeypatch, policy):
    """``feature_cache="lru"`` without ``feature_cache_bytes`` ran with no cache (issue 31, 5):
    it now holds every row when they fit the memory default, else that default, and the
    loader's settings record the figure."""
    row_bytes = 4 * cora.feature_dim
    for memory, want in ((1 << 34, cora.num_nodes * row_bytes), (2 << 20, 1 << 20)):
        monkeypatch.setenv("GRAPHSTORE_MEMORY_BYTES", str(memory))  # memory_budget: half of it
        data = loader(cora, scheme="macrobatch", macro_batches=2, feature_cache=policy)
        assert (data.settings.feature_cache, data.settings.feature_cache_bytes) == (policy, want)
        assert data.macro.cache.capacity == want // row_bytes
        for epoch in range(2):
            for _ in data.epoch(epoch):
                pass
        assert data.fetch_stats.cache_hits > 0  # the second epoch's rounds come from memory
    # No policy and no bytes: no cache, as before.
    assert loader(cora, scheme="macrobatch").settings.feature_cache_bytes is None
