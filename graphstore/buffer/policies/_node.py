"""Node-classification policies (sequential, dispersed, hierbatching) and ``in_memory``.

A node-classification state trains the training nodes of some resident partitions; the
other resident partitions are there as neighbourhood for sampling. Without a store, the
partitions that hold training nodes come as the option ``train_partitions`` (default all).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from graphstore.buffer.cache import StaticCache
from graphstore.buffer.policies.base import (
    TASK_BOTH,
    TASK_LINK,
    TASK_NODE,
    EpochPlan,
    frozen_array,
    register_policy,
)
from graphstore.errors import ConfigError

__all__ = ["plan_dispersed", "plan_hierbatching", "plan_in_memory", "plan_sequential"]


def _train_set(train_partitions: Iterable[int] | None, p: int) -> list[int]:
    """Validated, ascending, de-duplicated training partitions (all when None)."""
    if train_partitions is None:
        return list(range(p))
    try:
        ids = np.asarray(list(train_partitions))
    except TypeError:
        raise ConfigError(f"train_partitions must be a list of partition ids "
                          f"(got {train_partitions!r})") from None
    if ids.size == 0:
        raise ConfigError("train_partitions is empty: a node-classification epoch needs training nodes")
    if ids.dtype.kind not in "iu" or ids.ndim != 1:
        raise ConfigError(f"train_partitions must be a list of integer partition ids "
                          f"(got {train_partitions!r})")
    bad = ids[(ids < 0) | (ids >= p)]
    if bad.size:
        raise ConfigError(f"train_partitions must be in [0, {p}) (got {int(bad[0])})")
    return sorted(set(ids.tolist()))


def _fill(rng: np.random.Generator, chosen: list[int], p: int, capacity: int) -> tuple[int, ...]:
    """``chosen`` plus random other partitions up to ``capacity``, ascending."""
    others = np.setdiff1d(np.arange(p), chosen)
    extra = rng.choice(others, size=min(capacity - len(chosen), len(others)), replace=False)
    return tuple(sorted(chosen + extra.tolist()))


def _check_positive(name: str, value, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be a positive integer (got {value!r})")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be <= {maximum} (got {value})")
    return int(value)


def _node_plan(policy: str, p: int, c: int, epoch: int, seed: int, states, train, passes,
               **extra) -> EpochPlan:
    return EpochPlan(policy=policy, task=TASK_NODE, num_partitions=p, capacity=c, epoch=epoch, seed=seed,
                     states=list(states), train_partitions=list(train), passes=list(passes), **extra)


@register_policy("sequential", task=TASK_NODE, options=("train_partitions",),
                 summary="node classification: all training partitions resident plus random fillers")
def plan_sequential(*, num_partitions: int, capacity: int, epoch: int, seed: int, rng: np.random.Generator,
                    train_partitions: Iterable[int] | None = None) -> EpochPlan:
    """SEQUENTIAL (MariusGNN): one state holding every training partition, the rest of the
    buffer filled with other partitions drawn from ``(seed, epoch)``; each training
    partition trained once."""
    p, c = num_partitions, capacity
    train = _train_set(train_partitions, p)
    if len(train) > c:
        raise ConfigError(f"sequential keeps all {len(train)} training partitions resident "
                          f"but capacity is {c}; use capacity >= {len(train)}, or the 'dispersed' or 'hierbatching' policy")
    return _node_plan("sequential", p, c, epoch, seed, [_fill(rng, train, p, c)], [tuple(train)], [1],
                      options={"train_partitions": train})


@register_policy("dispersed", task=TASK_NODE,
                 options=("train_partitions", "training_states", "assembly_passes"),
                 summary="node classification: c random partitions, one swap per state, each read once")
def plan_dispersed(*, num_partitions: int, capacity: int, epoch: int, seed: int, rng: np.random.Generator,
                   train_partitions: Iterable[int] | None = None, training_states: int | None = None,
                   assembly_passes: float | None = None) -> EpochPlan:
    """DISPERSED (MariusGNN's ``getDispersedOrderingHelper`` and
    ``randomlyAssignTrainNodesToBuffers``): c random partitions to start, then one swap
    per state, a random resident out and the next partition of a random order in, until
    every partition has been resident once: ``p - c + 1`` states, each partition read
    once an epoch. Each training node trains once, in a state drawn uniformly among those
    holding its partition (``split_targets``; `EpochPlan.target_states` draws it).

    ``training_states`` (None: MariusGNN's one swap per state) asks for about that many
    states: each state then swaps ``k = ceil((p - c) / (training_states - 1))`` partitions
    (at most c), ``ceil((p - c) / k) + 1`` states. The node loader passes the batches one
    pass over the training split makes, so ``k`` is 1 whenever the split fills every
    state's batches (MariusGNN's setting, and any large graph's). A departure from
    MariusGNN for small splits over many partitions: one swap per state then leaves each
    state a part-filled batch, its own optimizer step and its own assembly (Cora at 8 of 32
    partitions: 25 states of about 5 targets against minibatch's 3 batches of 47), which
    costs time and buys no accuracy. The reads stay the same: each partition once an epoch.

    A state holding no training partition trains nothing and is dropped (its successor
    then admits its partitions too): the reads are the same, one assembly fewer.

    ``assembly_passes`` (None: no bound) bounds the states at ``max(2, ceil(assembly_passes
    * p / c))``: each state assembles its c partitions' edges, so together they assemble
    about that many passes over the graph. A departure from MariusGNN where c is a large
    share of p (4M nodes at 318 of 480 partitions resident: a state per batch of 60,000
    targets assembled two thirds of the graph 55 times, 111 s of a 113 s epoch).
    """
    p, c = num_partitions, capacity
    train = _train_set(train_partitions, p)
    swap = 1
    if assembly_passes is not None:
        most = max(2, math.ceil(assembly_passes * p / max(1, c)))
        training_states = most if training_states is None else min(training_states, most)
    if training_states is not None:
        wanted = _check_positive("training_states", training_states)
        swap = 1 if p <= c else min(c, max(1, math.ceil((p - c) / max(1, wanted - 1))))
    order = rng.permutation(p)
    resident = order[:c].copy()
    walk = [tuple(sorted(resident.tolist()))]
    # The evicted slot of each swap: MariusGNN shuffles the buffer and replaces its last
    # entry, a uniform choice among the residents (k swaps at once: k distinct slots).
    incoming = order[c:]
    evict = rng.integers(0, c, size=incoming.size) if swap == 1 else None
    for step, start in enumerate(range(0, incoming.size, swap)):
        new = incoming[start:start + swap]
        resident[evict[step:step + 1] if swap == 1 else rng.choice(c, size=new.size, replace=False)] = new
        walk.append(tuple(sorted(resident.tolist())))
    is_train = np.zeros(p, dtype=bool)
    is_train[train] = True
    states, trained = [], []
    for state in walk:
        mine = tuple(k for k in state if is_train[k])
        if mine:
            states.append(state)
            trained.append(mine)
    return _node_plan("dispersed", p, c, epoch, seed, states, trained, [1] * len(states),
                      split_targets=True,
                      options={"train_partitions": train, "training_states": training_states,
                               "assembly_passes": assembly_passes, "swap": swap})


def _cache_ids(static_cache: StaticCache | Iterable[int]) -> np.ndarray:
    """The chosen cache's ids as a read-only [k] int64 array; checked, never re-chosen."""
    ids = static_cache.ids if isinstance(static_cache, StaticCache) else np.asarray(static_cache)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise ConfigError(f"static_cache must be a StaticCache or [k] integer store ids "
                          f"(got shape {ids.shape}, dtype {ids.dtype})")
    if ids.size and (ids[0] < 0 or (np.diff(ids) <= 0).any()):
        raise ConfigError("static_cache ids must be distinct, ascending store ids "
                          "(as `graphstore.buffer.static_cache_ids` returns them)")
    return frozen_array(ids.astype(np.int64, copy=True))


@register_policy("hierbatching", task=TASK_NODE, options=("train_partitions", "reuse", "static_cache"),
                 summary="node classification: shuffled mega-batches of c partitions, each reused")
def plan_hierbatching(*, num_partitions: int, capacity: int, epoch: int, seed: int, rng: np.random.Generator,
                      train_partitions: Iterable[int] | None = None, reuse: int = 2,
                      static_cache: StaticCache | Iterable[int] | None = None) -> EpochPlan:
    """HierBatching: the partitions shuffled from ``(seed, epoch)`` and cut into mega-batches
    of c (the last may be smaller); each mega-batch trains its training partitions for
    ``reuse`` passes. A mega-batch without training partitions is skipped (nothing to train).

    With ``static_cache`` (a `StaticCache`, or its ``[k]`` store ids ascending, as chosen
    by `graphstore.buffer.cache`) the plan carries the cache's ids (`EpochPlan.static_cache`).
    """
    p, c = num_partitions, capacity
    train = _train_set(train_partitions, p)
    reuse = _check_positive("reuse", reuse)
    cache = None if static_cache is None else _cache_ids(static_cache)

    is_train = np.zeros(p, dtype=bool)
    is_train[train] = True
    order = rng.permutation(p)
    states, trained = [], []
    for start in range(0, p, c):
        batch = np.sort(order[start:start + c])
        mine = batch[is_train[batch]]
        if mine.size:
            states.append(tuple(batch.tolist()))
            trained.append(tuple(mine.tolist()))
    return _node_plan("hierbatching", p, c, epoch, seed, states, trained, [reuse] * len(states),
                      static_cache=cache, options={"train_partitions": train, "reuse": reuse})


@register_policy("in_memory", task=TASK_BOTH, options=("task", "train_partitions"),
                 summary="the reference: every partition resident, everything trained once")
def plan_in_memory(*, num_partitions: int, capacity: int, epoch: int, seed: int, rng: np.random.Generator,
                   task: str | None = None, train_partitions: Iterable[int] | None = None) -> EpochPlan:
    """IN_MEMORY: one state with all partitions (so capacity must be p). Without ``task``
    the plan fills both the link fields (every bucket in state 0) and the node fields
    (every training partition once)."""
    p, c = num_partitions, capacity
    if c < p:
        raise ConfigError(f"in_memory keeps all {p} partitions resident but capacity is {c}; "
                          f"use capacity >= {p}, or an out-of-core policy")
    link = task in (None, TASK_LINK)
    node = task in (None, TASK_NODE)
    if train_partitions is not None and not node:
        raise ConfigError("train_partitions is for node classification, not task='link'")
    train = _train_set(train_partitions, p) if node else None
    return EpochPlan(
        policy="in_memory", task=task or TASK_BOTH, num_partitions=p, capacity=c, epoch=epoch, seed=seed,
        states=[tuple(range(p))],
        bucket_states=frozen_array(np.zeros((p, p), dtype=np.int32)) if link else None,
        train_partitions=[tuple(train)] if node else None,
        passes=[1] if node else None,
        options={"train_partitions": train} if node else {},
    )
