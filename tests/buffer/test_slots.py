"""Slots: the plan of which slot each partition takes is sound for any states; the static
cache rides along every state; a byte budget picks the largest capacity that fits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphstore
from graphstore.buffer import BufferManager, BufferMemory, StaticCache, plan_epoch, static_cache_ids
from graphstore.buffer.budget import capacity_for_budget, footprint
from graphstore.buffer.resident import build_resident_graph
from graphstore.buffer.slots import assign_slots, lookahead_within, slots_needed
from graphstore.errors import ConfigError
from graphstore.layout._convert import ConvertOptions, convert
from tests.buffer.helpers import assert_same_graph
from tests.conftest import make_graph

P = 8
STATE = st.lists(st.integers(0, P - 1), min_size=0, max_size=4, unique=True).map(tuple)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    graph, _ = make_graph(num_nodes=300, num_edges=3000, directed=True)
    out = tmp_path_factory.mktemp("mem") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=P, partitioner="random", seed=1, hub_fraction=0.05))
    return graphstore.open(out)


@settings(max_examples=200, deadline=None)
@given(st.lists(STATE, max_size=8), st.booleans(), st.integers(0, 2))
def test_slot_plans_are_sound(states, prefetch, extra):
    need = slots_needed(states, prefetch=prefetch)
    plan = assign_slots(states, need + extra, prefetch=prefetch)
    holder, previous = [-1] * (need + extra), ()
    for state, slots, admitted, evicted in zip(states, plan.slots, plan.admitted, plan.evicted):
        assert len(set(slots)) == len(slots)  # one partition per slot
        assert admitted == tuple(sorted(k for k in state if k not in holder))  # read only what is missing
        for z, k in evicted:
            assert holder[z] == k and k not in state
            holder[z] = -1
        for k, z in zip(state, slots):
            if k in admitted:
                assert holder[z] == -1
                if prefetch:  # never overwrite what the consumer still trains
                    assert z not in previous
                holder[z] = k
            else:
                assert holder[z] == k  # a held partition does not move
        previous = slots
    assert plan.final_holder == tuple(holder)
    if need:
        with pytest.raises(ConfigError, match=f"need {need} buffer slots"):
            assign_slots(states, need - 1, prefetch=prefetch)


def test_hierbatching_with_its_static_cache(store):
    degree = store.read_degree("in") + store.read_degree("out")
    plan = plan_epoch("hierbatching", num_partitions=P, capacity=2, epoch=0, seed=4, reuse=1)
    cache = StaticCache.open(store, 0.05)
    np.testing.assert_array_equal(cache.ids, static_cache_ids(degree, 0.05))
    memory = BufferMemory.allocate(store, 4, cache_rows=cache.num_nodes)
    for epoch in range(2):  # the second epoch finds the cache rows filled, and re-reads no row
        with BufferManager(store, plan.states, static_cache=cache, memory=memory) as buffer:
            for loaded in buffer:
                want = build_resident_graph(store, plan.states[loaded.index], static_cache=cache)
                assert_same_graph(loaded.graph, want)
                assert loaded.graph.num_nodes == buffer.memory.num_slots * store.partition_size + cache.num_nodes
        stats = buffer.stats
        # Each state read its partitions' hub segments (and the hub-hub one, once): exactly the plan.
        assert stats.bytes_read == stats.planned_bytes and stats.hub_segments_read > 0
        # Small segments are read together; each held one is exactly its own edges.
        off = cache.segment_offsets
        for g, (src, dst, _) in buffer.memory.hub_edges.items():
            np.testing.assert_array_equal(src, store.read_rows("hubs/edges/src", off[g], off[g + 1]))
            np.testing.assert_array_equal(dst, store.read_rows("hubs/edges/dst", off[g], off[g + 1]))
    assert buffer.memory.num_slots == 4  # two disjoint mega-batches of 2 at once
    with pytest.raises(ConfigError, match="graphstore hubs"):
        StaticCache.open(store, 0.1)


@settings(max_examples=200, deadline=None)
@given(st.lists(STATE, min_size=1, max_size=6), STATE)
def test_the_lookahead_reads_what_fits_the_epochs_own_slots(states, ahead):
    chosen = lookahead_within(states, ahead, prefetch=True)
    need = slots_needed(states, prefetch=True)
    if chosen is None:
        return
    assert set(chosen) <= set(ahead) and len(set(chosen)) == len(chosen)
    assert slots_needed(list(states) + [chosen], prefetch=True) == need  # no slot beyond the epoch's
    new = set(ahead) - set(states[-1])
    if len(new) <= need - len(set(states[-1])):
        assert set(chosen) == set(ahead)  # room for all of it: all of it
    assert lookahead_within(states, ahead, prefetch=False) is None


def test_footprint_counts_the_static_cache_rows_once_and_each_states_hub_edges(store):
    cache = StaticCache.open(store)
    states = [(0, 1), (2, 3)]
    bare = footprint(store, states)
    with_cache = footprint(store, states, static_cache=cache)
    memory = BufferMemory.allocate(store, bare.slots, cache_rows=cache.num_nodes)
    bytes_per_row = sum(t[0].nbytes for t in (memory.features, memory.labels) if t is not None)
    # The cache's rows, once (in the buffer), and its ids and segment offsets.
    assert with_cache.cache_bytes == cache.num_nodes * bytes_per_row + cache.ids.nbytes + cache.segment_offsets.nbytes
    assert with_cache.slot_bytes == bare.slot_bytes
    # Hub edges are per state: those of the resident partitions' segments and the hub-hub one.
    sizes = cache.segment_sizes
    assert with_cache.edge_bytes > bare.edge_bytes
    hub_edges_held = int(sizes[[0, 1, 2, 3]].sum() + sizes[P])
    assert with_cache.edge_bytes - bare.edge_bytes >= hub_edges_held * 8  # int32 src + dst, at least


def test_memory_is_reused_across_epochs_and_guarded(store):
    states = [(0, 1), (2, 3)]
    memory = BufferMemory.allocate(store, 4)
    with BufferManager(store, states, memory=memory) as first:
        list(first)
    with BufferManager(store, [(2, 3), (0, 1)], memory=memory) as second:
        assert second.planned_bytes == 0  # every partition and bucket is still held
        for loaded in second:
            assert loaded.admitted == ()
            assert_same_graph(loaded.graph, build_resident_graph(store, loaded.graph.partitions))
    assert second.stats.bytes_read == 0 and first.stats.bytes_read > 0
    busy = BufferManager(store, states, memory=memory)
    with pytest.raises(ConfigError, match="in use by another BufferManager"):
        BufferManager(store, states, memory=memory)
    busy.close()
    with pytest.raises(ConfigError, match="it has feature rows but with_features is false"):
        BufferManager(store, states, memory=memory, with_features=False)


def test_footprint_counts_the_slots_the_manager_allocates(store):
    plan = plan_epoch("beta", num_partitions=P, capacity=3, epoch=0, seed=0)
    f = footprint(store, plan.states)
    with BufferManager(store, plan.states) as buffer:
        assert buffer.memory.num_slots == f.slots == 4  # BETA swaps one: c + 1 with prefetch
        assert buffer.memory.nbytes == f.slot_bytes
    assert footprint(store, plan.states, prefetch=False).slots == 3


def test_capacity_for_budget(store):
    totals = {}
    for c in range(2, P + 1):
        plan = plan_epoch("beta", num_partitions=P, capacity=c, epoch=0, seed=0)
        totals[c] = footprint(store, plan.states).total
    # Grows with c; c = p is one state, so nothing is double-buffered and it is smaller.
    assert all(totals[c] < totals[c + 1] for c in range(2, P - 1)) and totals[P] < totals[P - 1]
    for c in (3, 5):
        got, f = capacity_for_budget(store, totals[c] + 1, "beta")
        assert got == c and f.total == totals[c]
        assert capacity_for_budget(store, totals[c] - 1, "beta")[0] == c - 1
    assert capacity_for_budget(store, 1 << 40, "beta")[0] == P
    with pytest.raises(ConfigError, match=r"below the [\d,]+ bytes that policy 'beta' needs at its smallest capacity 2"):
        capacity_for_budget(store, totals[2] - 1, "beta")
    with pytest.raises(ConfigError, match="must be positive"):
        capacity_for_budget(store, 0, "beta")


def test_lookahead_reads_the_next_epochs_first_state_during_the_last(store):
    epoch0 = [(0, 1), (2, 3)]
    epoch1 = [(4, 5), (0, 1)]
    memory = BufferMemory.allocate(store, 4)
    with BufferManager(store, epoch0, memory=memory, lookahead=epoch1[0]) as first:
        graphs = [loaded.admitted for loaded in first]
    assert graphs == [(0, 1), (2, 3)]
    assert first.stats.partitions_loaded == 6 and first.stats.bytes_read == first.planned_bytes
    # (4, 5) went to the slots of (0, 1): those of (2, 3) were still being trained.
    assert sorted(k for k in memory.holder if k >= 0) == [2, 3, 4, 5]
    with BufferManager(store, epoch1, memory=memory) as second:
        for loaded in second:
            assert_same_graph(loaded.graph, build_resident_graph(store, epoch1[loaded.index]))
            admitted = loaded.admitted
            if loaded.index == 0:
                assert admitted == ()  # read during the previous epoch
    assert second.stats.partitions_loaded == 2


def test_an_unchanged_state_reuses_its_assembled_graph(store):
    """The in-memory scheme's one state, epoch after epoch: no reads and no CSC rebuild."""
    memory = BufferMemory.allocate(store, P)
    state = [tuple(range(P))]
    with BufferManager(store, state, memory=memory) as first:
        g1 = next(iter(first)).graph
    with BufferManager(store, state, memory=memory) as second:
        g2 = next(iter(second)).graph
    assert g2 is g1 and second.stats.bytes_read == 0
    with BufferManager(store, [tuple(range(P - 1))], memory=memory) as third:  # another state: rebuilt
        g3 = next(iter(third)).graph
    assert g3 is not g1
    assert_same_graph(g3, build_resident_graph(store, range(P - 1)))
