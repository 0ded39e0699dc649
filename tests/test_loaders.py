"""Loaders: every training example is seen as often as the scheme says, batches carry the
right rows and labels, epochs replay from (seed, epoch), and a byte budget is honoured."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

import graphstore
from graphstore.buffer import plan_epoch
from graphstore.buffer.budget import footprint
from graphstore.buffer.policies import default_logical_partitions
from graphstore.errors import ConfigError, OutOfCoreWarning
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout.embeddings import EmbeddingTable
from graphstore.loaders import EdgeLoader, NodeLoader
from tests.conftest import make_graph

P = 8


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    graph, _ = make_graph(num_nodes=400, num_edges=3000, directed=True, num_relations=2)
    out = tmp_path_factory.mktemp("loaders") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=P, partitioner="random", seed=3))
    return out


@pytest.fixture(scope="module")
def store(store_path):
    return graphstore.open(store_path)


@pytest.mark.parametrize("scheme,reuse,times", [("minibatch", None, 1), ("megabatch", None, 1), ("megabatch", 2, 2),
                                                ("disk", None, 1)])
def test_each_target_is_trained_as_often_as_the_scheme_says(store, scheme, reuse, times):
    loader = NodeLoader(store, split="train", fanouts=(3, 2), batch_size=17, scheme=scheme, seed=1, reuse=reuse)
    features = store.features[...]
    labels = store.labels[...]
    seen = Counter()
    batches = 0
    for batch in loader.epoch(0):
        batches += 1
        ids = batch.store_ids
        assert bool((ids >= 0).all())  # every sampled node is resident (or cached)
        targets = ids[batch.dense.node_id_offsets[-1]:].numpy()
        seen.update(targets.tolist())
        np.testing.assert_array_equal(batch.features.numpy(), features[ids.numpy()])
        np.testing.assert_array_equal(batch.labels.numpy(), labels[targets])
        assert batch.labels.dtype == torch.int64 and len(targets) <= 17
    train = store.read_node_split("train")
    assert seen == Counter({int(v): times for v in train})
    assert batches == len(loader)
    stats = loader.last_stats
    assert stats.bytes_read == stats.planned_bytes > 0
    if scheme == "megabatch":
        assert loader.settings.capacity == 2 and loader.settings.static_cache_nodes == 4
    if scheme == "disk":
        assert loader.settings.capacity == 4 and loader.settings.policy == "dispersed"


@pytest.mark.parametrize("scheme", ["megabatch", "disk"])
def test_balanced_labels_give_every_state_the_splits_label_mix(store, scheme):
    """balance_labels: each state's class weights times its class counts are the training
    split's class shares times the state's target count (for the classes the state has), so
    the state's weighted targets have the split's label mix; unbalanced batches carry none."""
    loader = NodeLoader(store, split="train", fanouts=(3, 2), batch_size=7, scheme=scheme, seed=1,
                        balance_labels=True)
    assert loader.settings.balance_labels is True
    labels = np.asarray(store.labels[loader.targets], dtype=np.int64)
    share = np.bincount(labels[labels >= 0], minlength=store.num_classes) / (labels >= 0).sum()
    seen, graph = [], None  # per state, in order (a state's graph held while it trains: ids may be reused after)
    for batch in loader.epoch(0):
        w = batch.class_weights.numpy().astype(np.float64)
        y = batch.labels[batch.labels >= 0].numpy()
        if batch.graph is not graph:
            graph = batch.graph
            seen.append((np.zeros(store.num_classes), w))
        counts, weights = seen[-1]
        assert np.array_equal(weights, w)  # one set of weights per state
        counts += np.bincount(y, minlength=store.num_classes)
    assert len(seen) > 1
    for counts, w in seen:
        present = counts > 0
        mix = counts * w / counts.sum()
        assert np.allclose(mix[present], share[present] / share[present].sum() * mix.sum(), atol=1e-6)
        assert np.all(w[~present] == 0)
    plain = NodeLoader(store, split="train", fanouts=(3, 2), batch_size=7, scheme=scheme, seed=1)
    assert plain.settings.balance_labels is None and next(iter(plain.epoch(0))).class_weights is None


def test_auto_balancing_is_on_only_where_states_cluster_labels(store, tmp_path):
    """balance_labels=None decides from the data: random labels over partitions (the
    module's store) give states no more skewed than chance; labels laid out by partition
    (a class per block of ids, sequential partitions) give states of one or two classes."""
    import dataclasses

    loose = NodeLoader(store, split="train", fanouts=(3,), batch_size=7, scheme="megabatch", capacity=2,
                       balance_labels=None)
    assert loose.settings.balance_labels is None and abs(loose.settings.label_skew) < 0.1
    graph, _ = make_graph(num_nodes=800, num_edges=4000, num_classes=4)
    clustered = dataclasses.replace(graph, labels=np.arange(800) * 4 // 800)
    convert(clustered, tmp_path / "c.gs", ConvertOptions(num_partitions=8, partitioner="sequential"))
    with graphstore.open(tmp_path / "c.gs") as tight:
        loader = NodeLoader(tight, split="train", fanouts=(3,), batch_size=7, scheme="megabatch", capacity=2,
                            balance_labels=None)
        assert loader.settings.balance_labels is True and loader.settings.label_skew > 0.3
        assert next(iter(loader.epoch(0))).class_weights is not None
        memory = NodeLoader(tight, split="train", fanouts=(3,), batch_size=7, scheme="minibatch",
                            balance_labels=None)  # one state: the split itself
        assert memory.settings.balance_labels is None and abs(memory.settings.label_skew) < 0.1


def test_evaluation_sees_every_node_once_in_order_of_states(store):
    loader = NodeLoader(store, split="valid", fanouts=(-1,), batch_size=1000, scheme="disk", shuffle=False)
    seen = [t for b in loader.epoch(0) for t in b.store_ids[b.dense.node_id_offsets[-1]:].tolist()]
    assert sorted(seen) == store.read_node_split("valid").tolist()


def test_epochs_replay_from_seed_and_epoch(store):
    def run(epoch, seed=0):
        loader = NodeLoader(store, split="train", fanouts=(4, 2), batch_size=50, scheme="megabatch", seed=seed)
        return [(b.store_ids.tolist(), b.dense.nbrs.tolist()) for b in loader.epoch(epoch)]

    assert run(1) == run(1)
    assert run(1) != run(2)
    assert run(1) != run(1, seed=5)


def test_a_byte_budget_picks_the_capacity(store):
    big = NodeLoader(store, split="train", fanouts=(2,), batch_size=64, scheme="disk", policy="dispersed",
                     capacity=5)
    plan = big.plan(0)
    need = footprint(store, plan.states).total
    loader = NodeLoader(store, split="train", fanouts=(2,), batch_size=64, scheme="disk", policy="dispersed",
                        buffer_bytes=need)
    assert loader.settings.capacity >= 5 and loader.footprint.total <= need
    with pytest.raises(ConfigError, match="below the"):
        NodeLoader(store, split="train", fanouts=(2,), batch_size=64, scheme="disk", policy="dispersed",
                   buffer_bytes=1000)
    with pytest.raises(ConfigError, match="not both"):
        NodeLoader(store, split="train", fanouts=(2,), batch_size=64, scheme="disk", capacity=2, buffer_bytes=10**9)


@pytest.fixture(scope="module")
def store32(tmp_path_factory):
    # Rows of 1 KiB, so a slot (30 rows) outweighs the tensors' alignment padding.
    graph, _ = make_graph(num_nodes=960, num_edges=6000, directed=True, feature_dim=256)
    out = tmp_path_factory.mktemp("loaders32") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=32, partitioner="random", seed=3))
    return graphstore.open(out)


@pytest.mark.parametrize("capacity, batch_size", [(24, 4), (24, 1000), (4, 4), (31, 1)])
def test_disk_assembles_at_most_a_few_passes_over_the_edges(store32, capacity, batch_size):
    """DISPERSED's states: about one per batch, but at most ASSEMBLY_PASSES * p / c (each
    state assembles its c partitions' edges); every partition still read once an epoch and
    every target trained once."""
    from graphstore.loaders.node import ASSEMBLY_PASSES

    loader = NodeLoader(store32, split="train", fanouts=(2,), batch_size=batch_size, scheme="disk",
                        policy="dispersed", capacity=capacity, seed=2)
    plan = loader.plan(0)
    p, targets = store32.num_partitions, loader.targets.size
    batches = -(-targets // batch_size)
    most = max(2, math.ceil(ASSEMBLY_PASSES * p / capacity))
    # States holding no training partition are dropped: at most the states asked for (+1: the first).
    assert len(plan.states) <= max(2, min(batches, most)) + 1
    if batches > most:  # the cap is what bound it
        assert len(plan.states) * capacity <= (ASSEMBLY_PASSES + 1) * p + capacity
    first_resident = {k for state in plan.states for k in state}
    assert first_resident == set(range(p))  # every partition resident once an epoch
    assert plan.num_swaps == p - capacity
    trained = np.concatenate([b.store_ids[b.dense.node_id_offsets[-1]:].numpy() for b in loader.epoch(0)])
    assert np.array_equal(np.sort(trained), np.sort(loader.targets))


@pytest.mark.parametrize("scheme,policy", [("disk", "dispersed"), ("megabatch", None)])
def test_a_byte_budget_bounds_the_slots_allocated_over_epochs(store32, scheme, policy):
    # Reading the next epoch's first state during the last one must not take slots the
    # budget did not count: DISPERSED's next epoch starts from c random partitions, which
    # beside the last state's c would need about twice its c + 1 slots.
    store = store32
    smallest = NodeLoader(store, split="train", fanouts=(2,), batch_size=64, scheme=scheme, policy=policy,
                          capacity=6)
    budget = footprint(store, smallest.plan(0).states).total
    loader = NodeLoader(store, split="train", fanouts=(2,), batch_size=64, scheme=scheme, policy=policy,
                        buffer_bytes=budget)
    assert loader.footprint.total <= budget
    read_ahead = 0
    for epoch in range(3):
        for _ in loader.epoch(epoch):
            pass
        read_ahead += loader.last_stats.partitions_loaded
        # The bytes the slot tensors' storages hold (cache rows included, plus at most a
        # page of alignment each), not the estimate's formula.
        tensors = [t for t in (loader.memory.features, loader.memory.labels) if t is not None]
        allocated = sum(t.untyped_storage().nbytes() for t in tensors)
        assert allocated <= loader.footprint.slot_bytes + loader.footprint.cache_bytes + 4096 * len(tensors)
    assert read_ahead > 0


@pytest.mark.parametrize("scheme,policy", [("minibatch", None), ("disk", "comet"), ("disk", "beta")])
def test_edge_loader_trains_every_edge_once_with_resident_negatives(copy, scheme, policy):
    store = graphstore.open(copy, mode="r+")
    table = EmbeddingTable.create(store, 6, seed=0)
    before = table.read_all()
    loader = EdgeLoader(store, batch_size=64, negatives=5, num_chunks=2, degree_fraction=0.4, scheme=scheme,
                        policy=policy, capacity=4, embeddings=table, seed=2)
    seen = Counter()
    for batch in loader.epoch(0):
        ids = batch.graph.node_ids
        seen.update(zip(ids[batch.src].tolist(), ids[batch.dst].tolist(), batch.rel.tolist()))
        assert batch.negatives.nodes.shape == (min(2, batch.src.numel()), 5)
        assert bool((ids[batch.negatives.nodes] >= 0).all())
        rows = torch.unique(torch.cat([batch.src, batch.dst]))
        batch.graph.embeddings[rows, 0] += 1.0  # a "training step" the buffer must write back
    src, dst = store.array("edges/src")[...], store.array("edges/dst")[...]
    rel = store.array("edges/rel")[...]
    assert seen == Counter(zip(src.tolist(), dst.tolist(), rel.tolist()))
    after = EmbeddingTable.open(store).read_all()
    touched = np.unique(np.concatenate([src, dst]))
    assert (after[touched, 0] > before[touched, 0]).all()
    if scheme == "disk" and policy == "comet":
        assert loader.settings.num_logical_partitions == 4  # MariusGNN: l = 2p/c = ceil(p / (c/2))


def test_edge_loader_with_an_encoder_gives_a_dense_over_the_batch_nodes(store):
    loader = EdgeLoader(store, batch_size=32, negatives=3, scheme="minibatch", fanouts=(2, 2), seed=0)
    batch = next(iter(loader.epoch(0)))
    assert torch.equal(batch.dense.targets, batch.nodes)
    assert torch.equal(batch.nodes[batch.index.src], batch.src)
    assert torch.equal(batch.nodes[batch.index.neg], batch.negatives.nodes)


def test_bad_arguments(store):
    with pytest.raises(ConfigError, match="scheme must be one of"):
        NodeLoader(store, fanouts=(2,), batch_size=8, scheme="cloud")
    with pytest.raises(ConfigError, match="batch_size must be >= 1"):
        NodeLoader(store, fanouts=(2,), batch_size=0)
    with pytest.raises(ConfigError, match="megabatch is for node classification"):
        EdgeLoader(store, batch_size=8, negatives=2, scheme="megabatch")


def test_explicit_target_nodes(store):
    nodes = np.array([5, 17, 250, 399, 17])
    loader = NodeLoader(store, nodes=nodes, fanouts=(2,), batch_size=2, scheme="disk", shuffle=False)
    seen = sorted(t for b in loader.epoch(0) for t in b.store_ids[b.dense.node_id_offsets[-1]:].tolist())
    assert seen == [5, 17, 250, 399] and loader.settings.split == "custom"
    with pytest.raises(ConfigError, match="nodes must be store ids"):
        NodeLoader(store, nodes=[400], fanouts=(2,), batch_size=2)


@pytest.mark.parametrize("scheme", ["megabatch", "disk"])
def test_an_epoch_is_the_same_whatever_the_memory_holds(store, scheme):
    """Slots carried over from earlier epochs change local ids, not what is drawn: a fresh
    loader replays epoch 2 exactly (what --resume relies on)."""
    def batches(loader, epoch):
        return [(b.store_ids.tolist(), b.dense.nbrs.tolist(), b.features.numpy().tobytes())
                for b in loader.epoch(epoch)]

    carried = NodeLoader(store, split="train", fanouts=(3, 2), batch_size=40, scheme=scheme, seed=4)
    batches(carried, 0)
    batches(carried, 1)
    fresh = NodeLoader(store, split="train", fanouts=(3, 2), batch_size=40, scheme=scheme, seed=4)
    assert batches(carried, 2) == batches(fresh, 2)


@pytest.mark.parametrize("scheme", ["megabatch", "disk"])
def test_released_memory_is_freed_and_the_next_epoch_is_unchanged(store, scheme):
    """Exact evaluation frees the training buffer's slots when both would not fit the
    budget: the slots go (held_bytes 0), and the next epoch reads its first state again
    and draws exactly what it would have."""
    def batches(loader, epoch):
        return [(b.store_ids.tolist(), b.dense.nbrs.tolist(), b.features.numpy().tobytes())
                for b in loader.epoch(epoch)]

    kept = NodeLoader(store, split="train", fanouts=(3, 2), batch_size=40, scheme=scheme, seed=4)
    released = NodeLoader(store, split="train", fanouts=(3, 2), batch_size=40, scheme=scheme, seed=4)
    batches(kept, 0)
    batches(released, 0)
    held = released.held_bytes
    assert held > 0 and released.release_memory() == held and released.held_bytes == 0
    assert released.release_memory() == 0  # nothing left to free
    assert batches(released, 1) == batches(kept, 1)
    # The released loader read its first state again; the other found it resident.
    assert released.last_stats.bytes_read > kept.last_stats.bytes_read


def test_edge_epochs_are_the_same_whatever_the_memory_holds(store):
    def batches(loader, epoch):
        out = []
        for b in loader.epoch(epoch):
            ids = b.graph.node_ids
            out.append((ids[b.src].tolist(), ids[b.dst].tolist(), ids[b.negatives.nodes].tolist(),
                        ids[b.nodes].tolist(), ids[b.dense.node_ids][b.dense.nbrs].tolist()))
        return out

    def loader():
        return EdgeLoader(store, batch_size=100, negatives=4, num_chunks=2, scheme="disk", policy="comet",
                          capacity=4, fanouts=(2,), seed=1)

    carried = loader()
    batches(carried, 0)
    fresh = loader()
    got = batches(carried, 1)
    assert got == batches(fresh, 1)
    assert len(got) == carried.num_batches(1)


def test_edge_batches_carry_relation_types_for_an_encoder(store):
    loader = EdgeLoader(store, batch_size=50, negatives=2, scheme="minibatch", fanouts=(3,), seed=0)
    batch = next(iter(loader.epoch(0)))
    g, d = batch.graph, batch.dense
    assert d.edge_ids is not None
    # The sampled edge (nbr -> node) is the CSC entry it names, with its relation.
    owner = torch.repeat_interleave(torch.arange(d.nbr_offsets.numel() - 1), d.nbr_offsets.diff())
    dst_local = d.node_ids[d.node_id_offsets[1]:][owner]
    assert torch.equal(g.indices[d.edge_ids], d.node_ids[d.nbrs])
    assert bool(((g.indptr[dst_local] <= d.edge_ids) & (d.edge_ids < g.indptr[dst_local + 1])).all())
    assert g.rel[d.edge_ids].numel() == d.nbrs.numel()


def _edges_seen(loader, epoch=0) -> Counter:
    seen = Counter()
    for batch in loader.epoch(epoch):
        ids = batch.graph.node_ids
        seen.update(zip(ids[batch.src].tolist(), ids[batch.dst].tolist()))
    return seen


@pytest.mark.parametrize("p,capacity", [(6, None), (10, None), (14, None), (33, None), (16, 5), (7, 3), (9, 7)])
def test_disk_link_prediction_runs_with_default_settings_for_any_p(tmp_path, p, capacity):
    # The review's crashes: COMET's l fixed at round(2p/c) left fewer than 2 logical
    # partitions resident for these p and capacities.
    graph, _ = make_graph(num_nodes=20 * p, num_edges=60 * p, directed=True, seed=p)
    convert(graph, tmp_path / "g.gs", ConvertOptions(num_partitions=p, partitioner="random", seed=1))
    with graphstore.open(tmp_path / "g.gs") as store:
        loader = EdgeLoader(store, batch_size=97, negatives=3, scheme="disk", capacity=capacity, seed=0)
        assert loader.policy == "comet"
        c = loader.capacity
        assert loader.settings.num_logical_partitions == default_logical_partitions(p, c)
        seen = _edges_seen(loader)
        src, dst = store.array("edges/src")[...], store.array("edges/dst")[...]
        assert seen == Counter(zip(src.tolist(), dst.tolist()))  # every edge once
        assert len(loader.epoch_stats) == 1 and loader.last_stats.bytes_read == loader.last_stats.planned_bytes


def test_a_link_budget_down_to_two_logical_pairs_is_accepted(tmp_path):
    p = 16
    graph, _ = make_graph(num_nodes=800, num_edges=6000, directed=True, seed=3)
    convert(graph, tmp_path / "g.gs", ConvertOptions(num_partitions=p, partitioner="random", seed=1))
    with graphstore.open(tmp_path / "g.gs") as store:
        # The smallest plan COMET accepts: capacity 2, l = p (two single-partition groups).
        smallest = footprint(store, plan_epoch("comet", num_partitions=p, capacity=2).states).total
        loader = EdgeLoader(store, batch_size=64, negatives=2, scheme="disk", buffer_bytes=smallest)
        assert loader.capacity == 2 and loader.settings.num_logical_partitions == p
        assert loader.footprint.total <= smallest
        assert sum(_edges_seen(loader).values()) == store.num_edges
        # A larger budget: the search varies l with c (l = ceil(p / floor(c/2))).
        whole = footprint(store, [tuple(range(p))]).total
        bigger = EdgeLoader(store, batch_size=64, negatives=2, scheme="disk", buffer_bytes=whole // 2)
        c = bigger.capacity
        assert 2 < c < p and bigger.settings.num_logical_partitions == default_logical_partitions(p, c)
        with pytest.raises(ConfigError, match="below the"):
            EdgeLoader(store, batch_size=64, negatives=2, scheme="disk", buffer_bytes=smallest // 4)


def test_scattering_partitions_and_a_missing_hub_group_are_warned_about(tmp_path):
    graph, _ = make_graph(num_nodes=400, num_edges=3000, directed=True, seed=9)
    convert(graph, tmp_path / "g.gs", ConvertOptions(num_partitions=8, partitioner="random", seed=1,
                                                      hub_fraction=0.0))
    with graphstore.open(tmp_path / "g.gs") as store:
        cut = store.manifest.partitioner["edge_cut"]
        with pytest.warns(OutOfCoreWarning) as record:
            loader = NodeLoader(store, fanouts=(2,), batch_size=50, scheme="megabatch", capacity=2)
        text = " ".join(str(w.message) for w in record)
        assert f"cut {cut:.1%} of the edges" in text and "--partitioner metis" in text
        assert "no hubs/ group" in text and f"graphstore hubs {store.path}" in text
        assert loader.cache is None and loader.settings.static_cache_nodes == 0
        # The in-memory scheme loses nothing: no warning about the partitions.
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error", OutOfCoreWarning)
            NodeLoader(store, fanouts=(2,), batch_size=50, scheme="minibatch")
            # Link prediction without an encoder samples no neighbours: random partitions
            # are its better choice (MariusGNN's), nothing to warn about.
            EdgeLoader(store, batch_size=50, scheme="disk", negatives=4, num_chunks=1, capacity=2)
        with pytest.raises(ConfigError, match="graphstore hubs"):
            NodeLoader(store, fanouts=(2,), batch_size=50, scheme="megabatch", static_cache=0.01)
        with pytest.raises(ConfigError, match="static_cache must be a fraction"):
            NodeLoader(store, fanouts=(2,), batch_size=50, scheme="megabatch", static_cache=1.5)


# ---------------------------------------------------------------- link prediction: bucket spread


@pytest.fixture(scope="module")
def metis_link_store(tmp_path_factory):
    graph, _ = make_graph(num_nodes=480, num_edges=4000, directed=True, num_relations=3, seed=11)
    out = tmp_path_factory.mktemp("spread") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=8, partitioner="metis", seed=2, keep_duplicates=True))
    return out


def _bucket_states_trained(loader, epoch):
    """{(i, j): set of states that trained an edge of bucket (i, j)} and the edges seen."""
    P, trained, seen = loader.store.partition_size, {}, Counter()
    plan = loader.plan(epoch)
    for batch in loader.epoch(epoch):
        ids = batch.graph.node_ids
        s, d = ids[batch.src], ids[batch.dst]
        seen.update(zip(s.tolist(), d.tolist(), batch.rel.tolist()))
        resident = set(batch.graph.node_ids[batch.graph.node_ids >= 0].div(P, rounding_mode="floor").tolist())
        state = next(k for k, parts in enumerate(plan.states) if set(parts) == resident)
        for i, j in set(zip((s // P).tolist(), (d // P).tolist())):
            trained.setdefault((i, j), set()).add(state)
    return trained, seen


@pytest.mark.parametrize("policy", [None, "comet", "beta"])
def test_disk_link_spreads_each_bucket_over_the_states_holding_it(metis_link_store, policy):
    """The disk scheme's default for links: a bucket's edges train in every state that holds
    both its partitions (in near-equal shares), not all in one; still every edge once."""
    with graphstore.open(metis_link_store) as store:
        loader = EdgeLoader(store, batch_size=50, negatives=3, scheme="disk", policy=policy, capacity=4, seed=5)
        assert loader.spread_buckets
        src, dst = store.array("edges/src")[...], store.array("edges/dst")[...]
        rel = store.array("edges/rel")[...]
        p = store.num_partitions
        sizes = np.diff(store.bucket_offsets).reshape(p, p).T  # sizes[i, j]: bucket (i, j)
        for epoch in range(3):
            plan = loader.plan(epoch)
            trained, seen = _bucket_states_trained(loader, epoch)
            assert seen == Counter(zip(src.tolist(), dst.tolist(), rel.tolist()))  # kept duplicates too
            holders = {(i, j): {k for k, parts in enumerate(plan.states) if i in parts and j in parts}
                       for (i, j) in trained}
            spread = 0
            for (i, j), states in trained.items():
                assert states <= holders[(i, j)]
                if sizes[i, j] >= len(holders[(i, j)]):
                    assert states == holders[(i, j)], (i, j)
                    spread += len(states) > 1
            assert spread > 0  # some bucket really is split
            assert loader.num_batches(epoch) == sum(1 for _ in loader.epoch(epoch))


def test_bucket_spread_can_be_turned_off_and_is_refused_where_it_cannot_apply(metis_link_store, tmp_path):
    with graphstore.open(metis_link_store) as store:
        whole = EdgeLoader(store, batch_size=50, negatives=3, scheme="disk", capacity=4, seed=5, spread_buckets=False)
        trained, _ = _bucket_states_trained(whole, 0)
        assert all(len(states) == 1 for states in trained.values())  # MariusGNN: one state per bucket
        assert not EdgeLoader(store, batch_size=50, negatives=3, scheme="minibatch").spread_buckets
        with pytest.raises(ConfigError, match="spread_buckets needs a plan with edge buckets"):
            EdgeLoader(store, batch_size=50, negatives=3, scheme="minibatch", spread_buckets=True)


def test_spread_epochs_replay_and_write_embeddings_back(metis_link_store, tmp_path):
    import shutil
    path = tmp_path / "copy.gs"
    shutil.copytree(metis_link_store, path)
    with graphstore.open(path, mode="r+") as store:
        table = EmbeddingTable.create(store, 4, seed=0)
        before = table.read_all()
        loader = EdgeLoader(store, batch_size=40, negatives=3, scheme="disk", capacity=4, embeddings=table, seed=3)
        first = []
        held = np.zeros(store.num_nodes)
        for batch in loader.epoch(1):
            ids = batch.graph.node_ids
            first.append((ids[batch.src].tolist(), ids[batch.dst].tolist(), ids[batch.negatives.nodes].tolist()))
            rows = torch.unique(torch.cat([batch.src, batch.dst]))
            batch.graph.embeddings[rows, 0] += 1.0
            held[ids[rows].numpy()] += 1
        after = EmbeddingTable.open(store).read_all()
        # every update written back: each row moved by the number of batches that held it
        np.testing.assert_allclose(after[:, 0] - before[:, 0], np.broadcast_to(held[:, None], before[:, 0].shape),
                                   atol=1e-5)
        np.testing.assert_array_equal(after[:, 1], before[:, 1])
        fresh = EdgeLoader(store, batch_size=40, negatives=3, scheme="disk", capacity=4, embeddings=table, seed=3)
        again = [(b.graph.node_ids[b.src].tolist(), b.graph.node_ids[b.dst].tolist(),
                  b.graph.node_ids[b.negatives.nodes].tolist()) for b in fresh.epoch(1)]
        assert again == first


@pytest.mark.parametrize("spread", [True, False])
def test_disk_embeddings_and_adagrad_state_come_back_bit_for_bit(metis_link_store, tmp_path, spread):
    """Every resident row a state sees is exactly what the last state that held it left
    (value and optimizer state, float32 bit for bit), across evictions, re-reads and epochs."""
    import shutil
    path = tmp_path / "copy.gs"
    shutil.copytree(metis_link_store, path)
    with graphstore.open(path, mode="r+") as store:
        table = EmbeddingTable.create(store, 3, seed=1)
        expected = table.read_all()
        loader = EdgeLoader(store, batch_size=30, negatives=3, scheme="disk", capacity=4, embeddings=table,
                            seed=7, spread_buckets=spread)
        step = np.float32(0.37)
        for epoch in range(2):
            graph = None
            for batch in loader.epoch(epoch):
                g = batch.graph
                if g is not graph:  # a new state: what was read (or kept) must be what was left
                    graph = g
                    local = torch.nonzero(g.node_ids >= 0).flatten()
                    got = g.embeddings[local].numpy()
                    want = expected[g.node_ids[local].numpy()]
                    assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()
                rows = torch.unique(torch.cat([batch.src, batch.dst, batch.negatives.nodes.flatten()]))
                # an Adagrad-like step on value and state, mirrored in float32
                grad = torch.sin(g.node_ids[rows].to(torch.float32))[:, None] * step
                acc = g.embeddings[rows, 1] + grad * grad
                g.embeddings[rows, 1] = acc
                g.embeddings[rows, 0] = g.embeddings[rows, 0] - 0.1 * grad / (acc.sqrt() + 1e-10)
                ids = g.node_ids[rows].numpy()
                expected[ids] = g.embeddings[rows].numpy()
        after = EmbeddingTable.open(store).read_all()
        assert after.view(np.uint32).tobytes() == expected.view(np.uint32).tobytes()
