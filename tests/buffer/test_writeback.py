"""Learnable embeddings through the buffer: after epochs of training steps that touch every
partition, the store holds exactly (bit for bit) what an in-memory run computes; writes
are atomic; updates survive an early stop, a loader error and a second epoch."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import zarr

import graphstore
from graphstore.buffer import BufferManager, BufferMemory, plan_epoch
from graphstore.errors import ConfigError, CorruptStoreError, StoreError
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout._verify import verify_store
from graphstore.layout.embeddings import EmbeddingTable
from tests.conftest import make_graph

P = 7
DIM = 4
LR = 0.1


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    graph, _ = make_graph(num_nodes=230, num_edges=2500, directed=True, num_relations=3)
    out = tmp_path_factory.mktemp("w") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=P, partitioner="random", seed=2))
    return out


@pytest.fixture
def store(copy):
    s = graphstore.open(copy, mode="r+")
    EmbeddingTable.create(s, DIM, scale=0.5, seed=3)
    return s


def step(params: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """One DistMult-like step with sparse Adagrad on rows of ``params`` [M, 2, d]
    (value, accumulator), indexed by ``src``/``dst``: the same code runs on the buffer's
    local ids and on the whole table's store ids."""
    value, acc = params[:, 0], params[:, 1]
    e_s, e_d = value[src], value[dst]
    coef = -torch.sigmoid(-(e_s * e_d).sum(1, keepdim=True))  # d softplus(-score) / d score
    grad = torch.zeros_like(value)
    grad.index_add_(0, src, coef * e_d)
    grad.index_add_(0, dst, coef * e_s)
    rows = torch.unique(torch.cat([src, dst]))
    g = grad[rows]
    acc[rows] += g * g
    value[rows] -= LR * g / (acc[rows].sqrt() + 1e-10)


def bucket_edges(store, i, j):
    s, d, _ = store.read_bucket(i, j)
    return torch.from_numpy(s.astype(np.int64)), torch.from_numpy(d.astype(np.int64))


def train_epochs(store, epochs, *, memory=None, prefetch=True):
    """Buffered: each state trains the buckets the BETA plan assigns to it."""
    table = EmbeddingTable.open(store)
    touched = set()
    for epoch in range(epochs):
        plan = plan_epoch("beta", num_partitions=P, capacity=3, epoch=epoch, seed=0)
        with BufferManager(store, plan.states, memory=memory, embeddings=table, prefetch=prefetch,
                           with_features=False) as buffer:
            for loaded in buffer:
                g = loaded.graph
                for i, j in zip(*np.nonzero(plan.bucket_states.T == loaded.index)):
                    src, dst = bucket_edges(store, int(j), int(i))
                    step(g.embeddings, g.to_local(src), g.to_local(dst))
                    touched |= {int(i), int(j)}
        assert buffer.stats.partitions_written > 0 and buffer.stats.bytes_written > 0
    return touched, buffer.stats


def reference_epochs(store, params, epochs):
    """In memory: the whole table, the same buckets in the same order."""
    params = torch.from_numpy(params)
    for epoch in range(epochs):
        plan = plan_epoch("beta", num_partitions=P, capacity=3, epoch=epoch, seed=0)
        for s in range(len(plan.states)):
            for i, j in zip(*np.nonzero(plan.bucket_states.T == s)):
                src, dst = bucket_edges(store, int(j), int(i))
                step(params, src, dst)
    return params.numpy()


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("keep_memory", [True, False])
def test_store_equals_in_memory_training_bit_for_bit(store, prefetch, keep_memory):
    table = EmbeddingTable.open(store)
    initial = table.read_all()
    memory = None
    if keep_memory:  # one allocation for both epochs; the second starts with partitions held
        memory = BufferMemory.allocate(store, 4, with_features=False, embedding_dim=DIM)
    touched, _ = train_epochs(store, 2, memory=memory, prefetch=prefetch)
    assert touched == set(range(P))
    want = reference_epochs(store, initial.copy(), 2)
    got = EmbeddingTable.open(store).read_all()
    assert not np.array_equal(got, initial)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # bit for bit
    # zarr reads the written chunks as its own, checksum included; verify agrees.
    np.testing.assert_array_equal(zarr.open_array(store.path / "embeddings/params")[...], got)
    assert verify_store(store.path)["ok"]  # it reads every embeddings chunk too
    if memory is not None:
        assert not memory.in_use and not any(memory.dirty)


def test_updates_of_an_early_stop_are_written_on_close(store):
    table = EmbeddingTable.open(store)
    before = table.read_all()
    plan = plan_epoch("beta", num_partitions=P, capacity=3, epoch=0, seed=0)
    buffer = BufferManager(store, plan.states, embeddings=table)
    for loaded in buffer:
        loaded.graph.embeddings[:, 0] += 1.0  # every resident row of the first state
        break
    buffer.close()
    after = table.read_all()
    changed = np.flatnonzero((after != before).any(axis=(1, 2)))
    first = np.concatenate([np.arange(*store.partition_range(k)) for k in plan.states[0]])
    np.testing.assert_array_equal(changed, np.sort(first))
    np.testing.assert_array_equal(after[first, 0], before[first, 0] + 1.0)
    buffer.close()  # idempotent: nothing written twice
    assert buffer.stats.partitions_written == len(plan.states[0])


def test_updates_survive_a_loader_error(store, monkeypatch):
    table = EmbeddingTable.open(store)
    before = table.read_all()
    states = [(0, 1), (1, 2), (2, 3)]
    real = type(table).read_partition

    def failing(self, k, out=None):
        if k == 3:
            raise OSError(5, "injected: the disk went away")
        return real(self, k, out)

    monkeypatch.setattr(type(table), "read_partition", failing)
    trained = []
    with pytest.raises(OSError, match="injected"):
        with BufferManager(store, states, embeddings=table) as buffer:
            for loaded in buffer:
                g = loaded.graph
                for k in g.partitions:  # only the state's rows (other slots hold stale partitions)
                    g.embeddings[slice(*g.local_range(k)), 0] = loaded.index + 1.0
                trained.append(loaded.index)
    monkeypatch.undo()
    assert trained == [0, 1]
    after = table.read_all()
    for k, last in ((0, 1.0), (1, 2.0), (2, 2.0)):  # the last state that trained k wrote it
        rows = np.arange(*store.partition_range(k))
        assert (after[rows, 0] == last).all()
        np.testing.assert_array_equal(after[rows, 1], before[rows, 1])
    rows = np.arange(*store.partition_range(3))
    np.testing.assert_array_equal(after[rows], before[rows])


def test_partition_writes_are_atomic_for_a_concurrent_reader(store):
    """A reader in another thread sees partition 2 entirely old or entirely new, never a
    mix and never a checksum failure, while a writer alternates two versions."""
    table = EmbeddingTable.open(store)
    start, stop = store.partition_range(2)
    versions = [np.full((stop - start, 2, DIM), v, np.float32) for v in (1.0, 2.0)]
    table.write_partition(2, versions[1])
    stop_flag = threading.Event()
    seen, errors = set(), []

    def reader():
        other = EmbeddingTable.open(graphstore.open(store.path))
        while not stop_flag.is_set():
            try:
                rows = other.read_partition(2)
            except CorruptStoreError as exc:  # a torn write would show up here
                errors.append(exc)
                return
            seen.add(tuple(np.unique(rows).tolist()))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for n in range(300):
            table.write_partition(2, versions[n % 2])
    finally:
        stop_flag.set()
        thread.join()
    assert errors == []
    assert seen and seen <= {(1.0,), (2.0,)}
    assert not list((store.path / "embeddings/params").rglob("*.tmp"))


def test_damage_and_misuse_are_reported(store):
    table = EmbeddingTable.open(store)
    path = table.chunk_path(4)
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match=r"embeddings/params: partition 4, chunk file c/4/0/0: checksum mismatch"):
        table.read_partition(4)
    with pytest.raises(CorruptStoreError, match=r"embeddings/params chunk 4"):
        verify_store(store.path)
    path.unlink()
    with pytest.raises(CorruptStoreError, match="partition 4, chunk file c/4/0/0: chunk file is missing"):
        table.read_partition(4)
    with pytest.raises(StoreError, match="exists already"):
        EmbeddingTable.create(store, DIM)
    with pytest.raises(StoreError, match="exists with dim 4, asked for 8"):
        EmbeddingTable.create(store, 8, exist_ok=True)
    with pytest.raises(ConfigError, match="rows must have shape"):
        table.write_partition(0, np.zeros((1, 2, DIM), np.float32))
    memory = BufferMemory.allocate(store, 4, with_features=False, embedding_dim=8)
    with pytest.raises(ConfigError, match="no embeddings of dim 4"):
        BufferManager(store, [(0, 1)], memory=memory, embeddings=table, with_features=False)
    memory = BufferMemory.allocate(store, 1, with_features=False, embedding_dim=DIM)
    with pytest.raises(ConfigError, match="need 3 buffer slots"):
        BufferManager(store, [(0, 1), (1, 2)], memory=memory, embeddings=table, with_features=False)


def test_no_embeddings_table_is_a_clear_error(copy):
    with pytest.raises(StoreError, match="no embeddings/params"):
        EmbeddingTable.open(graphstore.open(copy))


def test_read_values_is_the_value_half_of_every_row(store):
    table = EmbeddingTable.open(store)
    rows = table.read_all()
    values = table.read_values()
    assert values.shape == (rows.shape[0], DIM) and values.flags.c_contiguous
    np.testing.assert_array_equal(values, rows[:, 0])
    # A fresh table's state is zero and its values are not: the halves are not confused.
    assert np.abs(values).sum() > 0 and not np.array_equal(values, rows[:, 1])
