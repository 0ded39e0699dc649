"""Which targets a data-parallel rank trains when ranks divide one state by batches
(`Shard.local_shares`, `NodeLoader(seed_assignment=)`; issue 31, item 13): under the
macrobatch scheme each rank trains the targets of the block of rows it owns, balanced to
equal shares, so BatchGNN's fetch asks the other ranks for fewer rows than when every rank
takes every N-th batch of one shared order; the shares together are the split exactly once."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import graphstore
from graphstore.distributed import rank_partitions
from graphstore.errors import ConfigError
from graphstore.loaders import NodeLoader, Shard
from graphstore.loaders.macro import FeatureFetch
from graphstore.loaders.shard import block_bounds, partition_blocks
from tests.distributed.test_data_parallel import cora, targets_of  # noqa: F401 (cora: the fixture)


def test_local_shares_are_the_targets_once_balanced_and_as_local_as_balance_allows():
    rng = np.random.default_rng(0)
    for world in (1, 2, 3, 4, 7):
        for _ in range(40):
            num_nodes = int(rng.integers(world, 400))
            bounds = np.sort(np.concatenate([[0, num_nodes], rng.integers(0, num_nodes, world - 1)]))
            targets = rng.choice(num_nodes, int(rng.integers(0, num_nodes + 1)), replace=False)
            shares = Shard(0, world).local_shares(targets, bounds)
            assert np.array_equal(np.sort(np.concatenate(shares)), np.sort(targets))  # each target once
            sizes = [s.size for s in shares]
            assert max(sizes) - min(sizes) <= 1  # equal shares: batch counts differ by one at most
            own = np.diff(np.searchsorted(np.sort(targets), bounds))
            away = sum(int(((s < bounds[r]) | (s >= bounds[r + 1])).sum()) for r, s in enumerate(shares))
            # The rule: only a full rank's excess over its share leaves its block, the fewest possible.
            assert away == int(np.maximum(own - np.array(sizes), 0).sum())
    with pytest.raises(ConfigError, match="bounds must be"):
        Shard(0, 2).local_shares(np.array([5]), np.array([0, 3, 4]))


def test_the_loaders_blocks_are_the_full_batch_ranks():
    for p in range(1, 20):
        for n in range(1, p + 1):
            assert partition_blocks(p, n) == rank_partitions(p, n)


class OwnerCounting(FeatureFetch):
    """The store's rows, counting those outside rank ``rank``'s block (what the partitioned
    fetch would ask other ranks for), with the block bounds the loader divides targets by."""

    def __init__(self, store, rank: int, world: int) -> None:
        super().__init__(store)
        self.bounds = block_bounds(store.num_partitions, store.partition_size, store.num_nodes, world)
        self.lo, self.hi = int(self.bounds[rank]), int(self.bounds[rank + 1])
        self.remote = 0

    def __call__(self, ids, stats):
        self.remote += int(((ids < self.lo) | (ids >= self.hi)).sum())
        return super().__call__(ids, stats)


def _ranks(store, world: int, **kw) -> list[NodeLoader]:
    return [NodeLoader(store, split="train", fanouts=(5, 5), batch_size=16, seed=2, scheme="macrobatch",
                       rank=r, world_size=world, **kw) for r in range(world)]


@pytest.mark.parametrize("world", [2, 3])
def test_each_rank_trains_its_own_blocks_targets_and_all_targets_once(cora, world):  # noqa: F811
    with graphstore.open(cora) as store:
        split = store.read_node_split("train")
        bounds = block_bounds(store.num_partitions, store.partition_size, store.num_nodes, world)
        shares = _ranks(store, world, macro_batches=2)
        assert {s.settings.seed_assignment for s in shares} == {"local"}  # the macrobatch default
        for epoch in (0, 1):
            got = [[t for b in targets_of(s, epoch) for t in b] for s in shares]
            assert sum((Counter(g) for g in got), Counter()) == Counter(split.tolist())  # once each
            assert [len(targets_of(s, epoch)) for s in shares] == [s.num_batches(epoch) for s in shares]
            sizes = [len(g) for g in got]
            assert max(sizes) - min(sizes) <= 1
            own = np.diff(np.searchsorted(np.sort(split), bounds))
            away = sum(int(((np.array(g) < bounds[r]) | (np.array(g) >= bounds[r + 1])).sum())
                       for r, g in enumerate(got))
            assert away == int(np.maximum(own - np.array(sizes), 0).sum())
        # Shuffled per epoch within a rank's share, and the same shares.
        assert targets_of(shares[0], 0) != targets_of(shares[0], 1)
        interleaved = _ranks(store, world, macro_batches=2, seed_assignment="interleaved")
        assert interleaved[0].settings.seed_assignment == "interleaved"
        mixed = [[t for b in targets_of(s, 0) for t in b] for s in interleaved]
        assert sum((Counter(g) for g in mixed), Counter()) == Counter(split.tolist())
        with pytest.raises(ConfigError, match="seed_assignment must be one of"):
            _ranks(store, world, seed_assignment="metis")


@pytest.mark.parametrize("macro_batches", [1, "all"])
@pytest.mark.parametrize("world", [2, 4])
def test_the_ranks_ask_others_for_fewer_rows_than_with_interleaved_batches(cora, world, macro_batches):  # noqa: F811
    with graphstore.open(cora) as store:
        remote = {}
        for assignment in ("interleaved", "local"):
            remote[assignment] = 0
            for r in range(world):
                fetch = OwnerCounting(store, r, world)
                loader = NodeLoader(store, split="train", fanouts=(5, 5), batch_size=16, seed=2, scheme="macrobatch",
                                    rank=r, world_size=world, macro_batches=macro_batches,
                                    seed_assignment=assignment, feature_fetch=fetch)
                for _ in loader.epoch(0):
                    pass
                remote[assignment] += fetch.remote
        # Deterministic counts on Cora (8 METIS partitions, 140 targets).
        assert remote["local"] < remote["interleaved"], remote
        print(f"Cora, {world} ranks, B = {macro_batches}: remote rows {remote}")
