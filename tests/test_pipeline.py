"""The loaders' thread pool (`graphstore.loaders.pipeline`): the same batches for every
number of threads, the buffer never moved on under a batch in flight, errors reach the
consumer, and no thread outlives its epoch."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import graphstore
from graphstore.errors import ConfigError
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout.embeddings import EmbeddingTable
from graphstore.loaders import EdgeLoader, NodeLoader
from graphstore.loaders.pipeline import Pipelined, default_loader_threads
from tests.conftest import make_graph

THREADS = (0, 1, 2, 3)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    graph, _ = make_graph(num_nodes=600, num_edges=5000, directed=True, num_relations=2)
    out = tmp_path_factory.mktemp("pipeline") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=6, partitioner="random", seed=1))
    return out


@pytest.fixture(scope="module")
def store(store_path):
    return graphstore.open(store_path)


def digest(*tensors) -> str:
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def node_digests(loader, epoch=0) -> list[str]:
    out = []
    for b in loader.epoch(epoch):
        micro = [digest(m.dense.node_ids) for m in b.micro_batches or ()]
        out.append(digest(b.store_ids, b.dense.nbrs, b.dense.nbr_offsets, b.features, b.labels) + "".join(micro))
    return out


def loader_threads_alive() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("graphstore-loader")]


@pytest.mark.parametrize("scheme, kw", [
    ("minibatch", {}),
    ("megabatch", {"capacity": 2}),  # several states: the pool waits at each state's end
    ("disk", {"capacity": 3}),
    ("macrobatch", {"macro_batches": 3}),
    ("minibatch", {"micro_batches": 3}),  # a fixed K splits on the threads
], ids=["minibatch", "megabatch", "disk", "macrobatch", "micro"])
def test_every_thread_count_gives_the_same_batches(store, scheme, kw):
    runs = {n: node_digests(NodeLoader(store, split="train", fanouts=(4, 3), batch_size=23, scheme=scheme,
                                       seed=5, loader_threads=n, **kw), epoch=1) for n in THREADS}
    assert len(runs[0]) > 4
    for n in THREADS[1:]:
        assert runs[n] == runs[0], n
    assert not loader_threads_alive()


def test_batches_carry_the_rows_of_their_own_state(store):
    """With three threads racing ahead, every batch's rows are still its state's: had the
    walk moved on before a batch was gathered and consumed, its rows would be another
    partition's."""
    features, labels = store.features[...], store.labels[...]
    loader = NodeLoader(store, split="train", fanouts=(5, 5), batch_size=7, scheme="megabatch", capacity=2,
                        seed=3, loader_threads=3)
    states = 0
    graph = None
    for batch in loader.epoch(0):
        if batch.graph is not graph:
            graph, states = batch.graph, states + 1
        time.sleep(0.002)  # a training step, while the pool samples ahead
        ids = batch.store_ids.numpy()
        np.testing.assert_array_equal(batch.features.numpy(), features[ids])
        np.testing.assert_array_equal(batch.labels.numpy(), labels[ids[batch.dense.node_id_offsets[-1]:]])
    assert states > 2


@pytest.mark.parametrize("scheme, policy, fanouts", [("minibatch", None, None), ("disk", "beta", None),
                                                     ("disk", "comet", (3, 2))])
def test_edge_batches_are_the_same_for_every_thread_count(store_path, tmp_path, scheme, policy, fanouts):
    import shutil

    runs = {}
    for n in (0, 2):
        path = tmp_path / f"s{n}.gs"
        shutil.copytree(store_path, path)
        s = graphstore.open(path, mode="r+")
        table = EmbeddingTable.create(s, 4, seed=0)
        loader = EdgeLoader(s, batch_size=64, negatives=5, num_chunks=2, degree_fraction=0.5, scheme=scheme,
                            policy=policy, capacity=4 if scheme == "disk" else None, embeddings=table,
                            fanouts=fanouts, seed=2, loader_threads=n)
        out = []
        for batch in loader.epoch(0):
            ids = batch.graph.node_ids
            parts = [ids[batch.src], ids[batch.dst], ids[batch.negatives.nodes]]
            if fanouts is not None:
                parts += [ids[batch.dense.node_ids], batch.dense.nbrs]
            out.append(digest(*parts))
            rows = torch.unique(torch.cat([batch.src, batch.dst]))
            batch.graph.embeddings[rows] += 0.5  # the step the consumer takes between batches
        runs[n] = (out, EmbeddingTable.open(s).read_all())
    assert runs[2][0] == runs[0][0] and len(runs[0][0]) > 10
    np.testing.assert_array_equal(runs[2][1], runs[0][1])  # the same updates, written back


@dataclass(frozen=True)
class Item:
    index: int
    ends_state: bool
    state: int


class Recorder:
    """A per-batch step that records which thread ran it, and may fail on one index."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at, self.threads = fail_at, set()

    def bind(self, ctx):
        def step(item, index):
            self.threads.add(threading.get_ident())
            time.sleep(0.001 * (index % 3))  # finish out of order
            if index == self.fail_at:
                raise ValueError(f"batch {index} is bad")
            return item

        return step


def test_the_pool_waits_at_a_state_end_until_the_consumer_took_the_state():
    states, per_state = 4, 5
    log: list[tuple[str, int]] = []

    def source():
        for s in range(states):
            log.append(("state", s))  # the buffer moving on
            for k in range(per_state):
                yield Item(s * per_state + k, k == per_state - 1, s)

    recorder = Recorder()
    out = []
    for item in Pipelined([recorder], threads=3)(source(), ctx=None):
        log.append(("consumed", item.state))
        out.append(item.index)
    assert out == list(range(states * per_state))  # in order
    assert len(recorder.threads) > 1
    for s in range(1, states):
        moved_on = log.index(("state", s))
        consumed_before = [x for kind, x in log[:moved_on] if kind == "consumed"]
        assert consumed_before.count(s - 1) == per_state  # the whole previous state, before moving on


def test_an_error_in_a_thread_reaches_the_consumer_and_the_threads_end():
    items = (Item(i, False, 0) for i in range(50))
    got = []
    with pytest.raises(ValueError, match="batch 7 is bad"):
        for item in Pipelined([Recorder(fail_at=7)], threads=3)(items, ctx=None):
            got.append(item.index)
    assert got == list(range(7))  # every batch before the bad one, none after
    assert not loader_threads_alive()


def test_a_consumer_that_stops_early_leaves_no_thread(store):
    loader = NodeLoader(store, split="train", fanouts=(4, 3), batch_size=9, scheme="megabatch", capacity=2,
                        seed=0, loader_threads=3)
    epoch = loader.epoch(0)
    for _, _batch in zip(range(3), epoch):
        pass
    epoch.close()
    assert not loader_threads_alive()


def test_a_transform_runs_on_the_threads_and_its_errors_name_the_batch(store):
    seen = set()

    def to_sizes(batch):
        seen.add(threading.current_thread().name)
        return int(batch.dense.num_targets)

    loader = NodeLoader(store, split="train", fanouts=(3,), batch_size=10, seed=0, loader_threads=2,
                        transform=to_sizes)
    sizes = list(loader.epoch(0))
    assert sum(sizes) == store.read_node_split("train").size
    assert seen and all(name.startswith("graphstore-loader") for name in seen)

    def broken(batch):
        raise RuntimeError("cannot convert")

    with pytest.raises(RuntimeError, match="cannot convert"):
        list(NodeLoader(store, split="train", fanouts=(3,), batch_size=10, loader_threads=2,
                        transform=broken).epoch(0))
    with pytest.raises(ConfigError, match="transform must be a callable"):
        NodeLoader(store, split="train", fanouts=(3,), batch_size=10, transform="to_pyg")


def test_threads_are_recorded_and_checked(store):
    loader = NodeLoader(store, split="train", fanouts=(3,), batch_size=10)
    assert loader.settings.to_dict()["loader_threads"] == default_loader_threads() >= 0
    assert NodeLoader(store, split="train", fanouts=(3,), batch_size=10, loader_threads=0).settings.loader_threads == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="loader_threads must be an integer >= 0"):
            NodeLoader(store, split="train", fanouts=(3,), batch_size=10, loader_threads=bad)


def test_the_default_leaves_torch_its_cores_and_gives_a_gpu_run_the_host(monkeypatch):
    from graphstore.loaders import pipeline

    monkeypatch.setattr(pipeline, "available_cores", lambda: 16)
    monkeypatch.setattr(pipeline, "physical_cores", lambda: 16)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 12)
    assert default_loader_threads() == 4 and default_loader_threads("cuda") == 15
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    assert default_loader_threads() == 0  # inline: a thread would compete with torch's
    monkeypatch.setattr(pipeline, "physical_cores", lambda: 8)  # 16 hyperthreads of 8 cores: none free
    assert default_loader_threads() == 0 and default_loader_threads("cuda") == 15
    monkeypatch.setattr(pipeline, "available_cores", lambda: 1)
    assert default_loader_threads("cuda") == 1


def test_physical_cores_are_counted_from_the_processor_table():
    from graphstore.loaders.pipeline import available_cores, physical_cores

    assert 1 <= physical_cores() <= available_cores()


class Rows:
    """A per-batch step whose batch holds ``size`` bytes of rows."""

    def __init__(self, size: int) -> None:
        self.size = size

    def bind(self, ctx):
        def make(item, index):
            time.sleep(0.002)
            return torch.zeros(self.size, dtype=torch.uint8)

        return make


def test_the_batches_held_ahead_stay_within_their_bytes():
    items = [Item(i, False, 0) for i in range(40)]
    bounded = Pipelined([Rows(1000)], threads=3, depth=6, max_bytes=2500)
    for _ in bounded(iter(items), ctx=None):
        time.sleep(0.004)  # a slow consumer: the pool fills up to its bound
    assert bounded.stats.batches == 40 and bounded.stats.largest_batch_bytes == 1000
    assert bounded.stats.peak_held_batches == 2 and bounded.stats.peak_held_bytes <= 2500
    free = Pipelined([Rows(1000)], threads=3, depth=6)
    for _ in free(iter(items), ctx=None):
        time.sleep(0.004)
    assert free.stats.peak_held_batches == 6  # only the depth bounds it
    lone = Pipelined([Rows(1000)], threads=3, max_bytes=10)  # a batch larger than the bound still runs, alone
    assert len(list(lone(iter(items), ctx=None))) == 40 and lone.stats.peak_held_batches == 1


def test_with_threads_a_byte_budget_counts_the_batches_made_ahead(store):
    budget = 200_000  # a few partitions of the 6
    inline = NodeLoader(store, split="train", fanouts=(3,), batch_size=10, scheme="megabatch", buffer_bytes=budget,
                        loader_threads=0)
    pooled = NodeLoader(store, split="train", fanouts=(3,), batch_size=10, scheme="megabatch", buffer_bytes=budget,
                        loader_threads=2)
    assert inline.settings.loader_queue_bytes is None and "loader_queue_bytes" not in inline.settings.to_dict()
    assert pooled.settings.loader_queue_bytes == budget // 8
    assert pooled.footprint.total <= budget - budget // 8 < inline.footprint.total + budget // 8
    list(pooled.epoch(0))
    stats = pooled.pipeline_stats
    assert stats.batches == pooled.num_batches(0) and stats.max_bytes == budget // 8
    assert stats.peak_held_bytes <= max(budget // 8, stats.largest_batch_bytes)
