"""The conformance suite (`graphstore.testing`) on toy implementations a newcomer might
register: correct ones pass, and each broken one fails with an `AssertionError` that names
it and the invariant it breaks. Every toy is unregistered afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from graphstore.buffer.policies import EpochPlan, base, policy_names, register_policy
from graphstore.errors import ConfigError, SourceError
from graphstore.layout import partition, sources
from graphstore.layout.partition import available_partitioners, register_partitioner
from graphstore.layout.sources import TASK_NODE, EdgeChunk, SourceGraph, available_formats, register_reader
from graphstore.testing.partitioners import check_partitioner, check_partitioner_grid
from graphstore.testing.policies import check_policy, check_policy_grid
from graphstore.testing.readers import check_reader


def unregister(module, registry: str, name: str) -> None:
    """Remove ``name`` from ``module``'s registry (a `Registry`, or the dict it replaced)."""
    found = getattr(module, registry, None)
    if hasattr(found, "unregister"):
        found.unregister(name)
    else:
        del module._REGISTRY[name]


@contextmanager
def toy_policy(name: str, plan, **spec) -> Iterator[str]:
    register_policy(name, **spec)(plan)
    try:
        yield name
    finally:
        unregister(base, "POLICIES", name)
    assert name not in policy_names()


@contextmanager
def toy_partitioner(name: str, fn) -> Iterator[str]:
    register_partitioner(name)(fn)
    try:
        yield name
    finally:
        unregister(partition, "PARTITIONERS", name)
    assert name not in available_partitioners()


@contextmanager
def toy_reader(name: str, fn) -> Iterator[str]:
    register_reader(name, fn)
    try:
        yield name
    finally:
        unregister(sources, "READERS", name)
    assert name not in available_formats()


# ------------------------------------------------------------------------------ policies


def round_robin(name: str, *, repeat_first: bool = False):
    """Node policy: windows of c consecutive partitions, each training its training
    partitions once; ``repeat_first`` (a bug) trains the first window again at the end."""

    def plan(*, num_partitions, capacity, epoch, seed, rng, train_partitions=None) -> EpochPlan:
        p, c = num_partitions, capacity
        train = set(range(p) if train_partitions is None else train_partitions)
        states = [tuple(range(start, min(start + c, p))) for start in range(0, p, c)]
        if repeat_first:
            states.append(states[0])
        return EpochPlan(policy=name, task="node", num_partitions=p, capacity=c, epoch=epoch, seed=seed,
                         states=states, train_partitions=[tuple(k for k in s if k in train) for s in states],
                         passes=[1] * len(states))

    return plan


def all_pairs(name: str, *, misplace: bool = False):
    """Link policy: one state per pair of partitions; ``misplace`` (a bug) trains every
    bucket in state 0."""

    def plan(*, num_partitions, capacity, epoch, seed, rng) -> EpochPlan:
        p = num_partitions
        if p > 1 and capacity < 2:
            raise ConfigError(f"{name} needs capacity >= 2 (got capacity {capacity})")
        states = [(i, j) for i in range(p) for j in range(i + 1, p)] or [(0,)]
        index = {pair: s for s, pair in enumerate(states)}
        buckets = np.zeros((p, p), dtype=np.int32)
        if not misplace:
            for i in range(p):
                for j in range(p):
                    pair = (min(i, j), max(i, j)) if i != j else min(s for s in states if i in s)
                    buckets[i, j] = index[pair]
        buckets.flags.writeable = False
        return EpochPlan(policy=name, task="link", num_partitions=p, capacity=capacity, epoch=epoch, seed=seed,
                         states=states, bucket_states=buckets)

    return plan


def test_correct_toy_policies_pass():
    with toy_policy("toy_round_robin", round_robin("toy_round_robin"), task="node",
                    options=("train_partitions",)) as name:
        assert check_policy_grid(name) > 0
    with toy_policy("toy_pairs", all_pairs("toy_pairs"), task="link") as name:
        assert check_policy_grid(name) > 0
        assert check_policy(name, num_partitions=4, capacity=1) is None  # refused as documented


def test_a_link_policy_training_a_bucket_where_its_ends_are_not_fails():
    message = (r"policy 'toy_misplaced' \(num_partitions=4, capacity=2, epoch=0, seed=0\): bucket \(0, 2\) "
               r"trains in state 0 \(0, 1\), which does not hold its destination partition 2")
    with toy_policy("toy_misplaced", all_pairs("toy_misplaced", misplace=True), task="link") as name:
        with pytest.raises(AssertionError, match=message):
            check_policy(name, num_partitions=4, capacity=2)
        with pytest.raises(AssertionError, match="toy_misplaced"):
            check_policy_grid(name)


def test_a_node_policy_training_nodes_twice_fails():
    twice = round_robin("toy_twice", repeat_first=True)
    with (toy_policy("toy_twice", twice, task="node", options=("train_partitions",)) as name,
          pytest.raises(AssertionError, match=r"policy 'toy_twice' .*must train equally often")):
        check_policy(name, num_partitions=5, capacity=2)


def test_a_node_policy_over_capacity_fails():
    def everything(*, num_partitions, capacity, epoch, seed, rng) -> EpochPlan:
        p = num_partitions
        return EpochPlan(policy="toy_greedy", task="node", num_partitions=p, capacity=capacity, epoch=epoch,
                         seed=seed, states=[tuple(range(p))], train_partitions=[tuple(range(p))], passes=[1])

    with (toy_policy("toy_greedy", everything, task="node") as name,
          pytest.raises(AssertionError, match=r"policy 'toy_greedy' \(num_partitions=4, capacity=2.*\): "
                                              r"state 0 holds 4 partitions, more than capacity 2")):
        check_policy(name, num_partitions=4, capacity=2)


def test_a_policy_drawing_from_the_global_random_state_fails():
    def shuffled(*, num_partitions, capacity, epoch, seed, rng) -> EpochPlan:
        p, c = num_partitions, capacity
        order = np.random.permutation(p).tolist()  # the bug: not `rng`
        states = [tuple(sorted(order[start:start + c])) for start in range(0, p, c)]
        return EpochPlan(policy="toy_global", task="node", num_partitions=p, capacity=c, epoch=epoch, seed=seed,
                         states=states, train_partitions=states, passes=[1] * len(states))

    with (toy_policy("toy_global", shuffled, task="node") as name,
          pytest.raises(AssertionError, match=r"toy_global.*same \(seed, epoch\) differ")):
        check_policy(name, num_partitions=12, capacity=3)


# --------------------------------------------------------------------------- partitioners


def contiguous(edges, num_partitions, seed, chunk_edges, memory_bytes):
    """Toy: contiguous id ranges of ceil(N / p) nodes."""
    size = -(-edges.num_nodes // num_partitions)
    return np.arange(edges.num_nodes, dtype=np.int64) // size, {"toy": True}


def test_a_correct_toy_partitioner_passes():
    with toy_partitioner("toy_contiguous", contiguous) as name:
        assert check_partitioner_grid(name) > 0


def test_a_partitioner_with_a_label_out_of_range_fails():
    def off_by_one(edges, num_partitions, seed, chunk_edges, memory_bytes):
        return np.arange(edges.num_nodes, dtype=np.int64) % (num_partitions + 1), {}

    with (toy_partitioner("toy_off_by_one", off_by_one) as name,
          pytest.raises(AssertionError, match=r"partitioner 'toy_off_by_one' \(graph: num_nodes=10, "
                                              r".*num_partitions=3.*\): .*labels outside \[0, 3\)")):
        check_partitioner(name, num_nodes=10, src=[0, 1], dst=[1, 2], num_partitions=3)


def test_unbalanced_and_unseeded_partitioners_fail():
    def lopsided(edges, num_partitions, seed, chunk_edges, memory_bytes):
        labels = np.zeros(edges.num_nodes, dtype=np.int64)
        labels[-1] = num_partitions - 1
        return labels, {}

    def unseeded(edges, num_partitions, seed, chunk_edges, memory_bytes):
        return np.random.permutation(edges.num_nodes) % num_partitions, {}

    graph = {"num_nodes": 10, "src": [0], "dst": [1], "num_partitions": 2}
    with toy_partitioner("toy_lopsided", lopsided) as name:
        with pytest.raises(AssertionError, match=r"toy_lopsided.*label sizes \[9, 1\] are not the store's "
                                                 r"block sizes \[5, 5\]"):
            check_partitioner(name, **graph)
        # Leaving the balance to equal_blocks is allowed when the partitioner says so.
        check_partitioner(name, **graph, exact_blocks=False)
    with (toy_partitioner("toy_unseeded", unseeded) as name,
          pytest.raises(AssertionError, match="toy_unseeded.*the same seed must give the same labels")):
        check_partitioner(name, num_nodes=200, src=[0], dst=[1], num_partitions=4)


# -------------------------------------------------------------------------------- readers


def read_pairs(path: Path, context, *, fmt: str = "toy-pairs", num_labels: int = 2) -> SourceGraph:
    """Toy format: ``pairs.txt``, one ``src dst`` per line; node i labelled ``i % num_labels``
    of 2 classes (``num_labels=3`` is the bug)."""
    pairs = np.loadtxt(path / "pairs.txt", dtype=np.int64, ndmin=2)
    num_nodes = int(pairs.max()) + 1

    def edges():
        yield EdgeChunk(pairs[:, 0].copy(), pairs[:, 1].copy())

    return SourceGraph(name=path.name, format=fmt, path=context.origin, num_nodes=num_nodes, directed=True,
                       edges=edges, labels=np.arange(num_nodes, dtype=np.int64) % num_labels, num_classes=2,
                       tasks=(TASK_NODE,), node_splits={"train": np.arange(num_nodes, dtype=np.int64)})


def test_toy_readers(tmp_path):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "pairs.txt").write_text("0 1\n1 2\n2 3\n3 0\n")
    with toy_reader("toy-pairs", read_pairs) as name:
        graph = check_reader(name, tmp_path / "g", work_dir=tmp_path / "work")
        assert graph.num_nodes == 4
    three_labels = lambda path, ctx: read_pairs(path, ctx, fmt="toy-bad", num_labels=3)
    with (toy_reader("toy-bad", three_labels) as name,
          pytest.raises(AssertionError, match=r"reader 'toy-bad' on .*/g: labels in \[0, 2\], "
                                              r"outside \[-1, num_classes=2\)")):
        check_reader(name, tmp_path / "g", work_dir=tmp_path / "work")
    with pytest.raises(SourceError, match="unknown source format 'toy-pairs'"):
        sources.get_reader("toy-pairs")
