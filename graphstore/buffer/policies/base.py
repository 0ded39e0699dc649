"""The policy interface: an `EpochPlan`, its `BufferState` view, and the registry by name.

A policy is a pure function ``(num_partitions, capacity, epoch, seed, options) -> EpochPlan``:
no store, no clock, no global random state. The same arguments give the same plan on every
machine, so a plan can be printed before training (``graphstore plan``) and the buffer can
prefetch state ``s + 1`` while the trainer works on state ``s``.

Policies are registered by name in `POLICIES` (a `graphstore.registry.Registry` of `Policy`
values; `register_policy` adds one, `get_policy` and `policy_names` read it)::

    name           task   what is resident                          what each state trains
    beta           link   c partitions, one swap per state          buckets first met there
    comet          link   c/(p/l) random logical groups, one swap   buckets, random co-resident state
    sequential     node   every training partition + random fill    all training partitions, once
    dispersed      node   c random partitions, one swap per state   each training node once, in a random
                                                                     state holding its partition
    hierbatching   node   a shuffled mega-batch of c partitions     its partitions, ``reuse`` passes
    disjoint       link   two random groups of <= c/2 partitions    buckets between its groups, some inside
                          (rounds of disjoint states, one share     them: each state is a data-parallel
                          per data-parallel rank)                   rank's while the others train theirs
    in_memory      both   all p partitions (needs c >= p)           everything, once

``capacity`` larger than ``num_partitions`` is clamped to ``num_partitions`` (a buffer cannot
hold a partition twice); `EpochPlan.capacity` is the clamped value.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphstore.errors import ConfigError
from graphstore.registry import Registry

__all__ = [
    "POLICIES",
    "TASK_LINK",
    "TASK_NODE",
    "TASK_BOTH",
    "BufferState",
    "EpochPlan",
    "Policy",
    "get_policy",
    "plan_epoch",
    "policy_names",
    "register_policy",
]

TASK_LINK = "link"
"""Link prediction: a state trains edge buckets (`EpochPlan.bucket_states`)."""
TASK_NODE = "node"
"""Node classification: a state trains the training nodes of some of its partitions."""
TASK_BOTH = "both"
"""A plan that serves either task (``in_memory`` without ``task=``)."""


@dataclass(frozen=True, slots=True)
class BufferState:
    """One state of an epoch as the buffer sees it: what to hold and what changes.

    Built by `EpochPlan.buffer_states`; every field is derived from the plan.
    """

    index: int
    """Position of the state in the epoch, ``0 <= index < len(plan.states)``."""
    partitions: tuple[int, ...]
    """Resident partition ids, ascending; ``len(partitions) <= plan.capacity``."""
    admitted: tuple[int, ...]
    """Partitions resident here but not in the previous state (all of them for state 0):
    what the loader must read, ascending."""
    evicted: tuple[int, ...]
    """Partitions of the previous state no longer resident (written back if dirty),
    ascending; empty for state 0."""
    train_partitions: tuple[int, ...] | None
    """Node classification: partitions whose training nodes this state trains; else None."""
    passes: int | None
    """Node classification: passes over those training nodes; else None."""


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """The buffer states of one epoch and the training examples of each.

    Fields irrelevant to the plan's task are None. Arrays are read-only.

    Examples
    --------
    >>> from graphstore.buffer import plan_epoch
    >>> plan = plan_epoch("beta", num_partitions=4, capacity=2, epoch=0, seed=0)
    >>> plan.task, len(plan.states), plan.bucket_states.shape
    ('link', 6, (4, 4))
    >>> all(len(set(a) ^ set(b)) == 2 for a, b in zip(plan.states, plan.states[1:]))
    True
    """

    policy: str
    """Registered name of the policy that made the plan."""
    task: str
    """``"link"``, ``"node"`` or ``"both"`` (which of the fields below are set)."""
    num_partitions: int
    """p, the number of physical partitions of the store."""
    capacity: int
    """c, partitions the buffer holds (after clamping to ``num_partitions``)."""
    epoch: int
    """Epoch the plan is for; randomised policies reseed from ``(seed, epoch)``."""
    seed: int
    """Seed the plan was drawn with."""
    states: list[tuple[int, ...]]
    """Resident partition ids of each state, in training order; each tuple ascending,
    ``len <= capacity``."""
    bucket_states: np.ndarray | None = None
    """Link prediction: ``[p, p] int32``; ``bucket_states[i, j]`` is the index of the one
    state that trains the edges from partition i to partition j (both resident there)."""
    train_partitions: list[tuple[int, ...]] | None = None
    """Node classification: per state, the partitions (ascending) whose training nodes it
    trains; a training partition appears in the states whose passes sum to its visits."""
    passes: list[int] | None = None
    """Node classification: per state, passes over that state's training nodes (``reuse``)."""
    split_targets: bool = False
    """Node classification: a training partition listed in several states has its nodes
    shared out among them, each node training in one state drawn uniformly among those
    (`target_states`; DISPERSED); False: every state listing a partition trains all its
    nodes."""
    logical_groups: tuple[tuple[int, ...], ...] | None = None
    """COMET: the physical partitions (ascending) of each logical partition this epoch."""
    logical_states: list[tuple[int, ...]] | None = None
    """COMET: the resident logical partition ids of each state (ascending)."""
    static_cache: np.ndarray | None = None
    """hierbatching given a ``static_cache``: ``[k] int64`` store ids of the cache's nodes
    (chosen by `graphstore.buffer.cache`), ascending; kept resident all epoch. None when
    not requested."""
    state_rounds: list[int] | None = None
    """DISJOINT (data parallelism): the round of each state. The states of one round are
    pairwise disjoint and trained by different ranks at once; rounds run in order, with a
    write-back and a barrier between them. None: the states run one after another."""
    state_ranks: list[int] | None = None
    """DISJOINT: the data-parallel rank that trains each state."""
    options: dict[str, Any] = field(default_factory=dict)
    """The policy options in effect (defaults filled in), for reports and reproduction."""

    def target_states(self, partitions: np.ndarray) -> list[np.ndarray]:
        """Per state, the positions in ``partitions`` (the partition of each training
        node, ``[n]`` int) of the nodes that state trains (each position ascending).

        Without `split_targets` a node trains in every state listing its partition; with
        it, in one of them drawn uniformly from ``(seed, epoch)``, as MariusGNN's
        DISPERSED assigns training nodes to buffer states.
        """
        parts = np.asarray(partitions, dtype=np.int64)
        p, num = self.num_partitions, len(self.states)
        listed = np.zeros((p, num), dtype=bool)  # [k, s]: state s trains partition k's nodes
        for s, mine in enumerate(self.train_partitions or ()):
            listed[list(mine), s] = True
        count = listed.sum(axis=1)
        _, states_of = np.nonzero(listed)  # grouped by partition, states ascending
        first = np.concatenate([[0], np.cumsum(count)[:-1]])
        if not self.split_targets:
            # Every (node, state listing its partition) pair, nodes ascending.
            node = np.repeat(np.arange(parts.size), count[parts])
            start = np.repeat(np.cumsum(count[parts]) - count[parts], count[parts])
            state = states_of[first[parts][node] + np.arange(node.size) - start]
        else:
            if parts.size and (count[parts] == 0).any():
                raise ConfigError("a training node's partition is not trained in any state of the plan")
            # One uniform draw per node among the states listing its partition.
            draw = np.random.default_rng([self.seed, self.epoch, zlib.crc32(b"target_states")])
            pick = (draw.random(parts.size) * count[parts]).astype(np.int64)
            np.minimum(pick, count[parts] - 1, out=pick)  # float rounding must never pick `count`
            node = np.arange(parts.size)
            state = states_of[first[parts] + pick]
        order = np.argsort(state, kind="stable")
        bounds = np.searchsorted(state[order], np.arange(num + 1))
        node = node[order]
        return [node[bounds[s]:bounds[s + 1]] for s in range(num)]

    @property
    def num_states(self) -> int:
        """Number of buffer states in the epoch."""
        return len(self.states)

    @property
    def num_swaps(self) -> int:
        """Partitions loaded after the first state: the sum over consecutive states of the
        partitions admitted. A full epoch from a cold buffer reads
        ``len(states[0]) + num_swaps`` partitions."""
        return sum(len(set(b) - set(a)) for a, b in zip(self.states, self.states[1:]))

    def buffer_states(self) -> Iterator[BufferState]:
        """Yield each state with its admitted/evicted partitions (what the loader does)."""
        previous: set[int] = set()
        for index, partitions in enumerate(self.states):
            current = set(partitions)
            yield BufferState(
                index=index,
                partitions=partitions,
                admitted=tuple(sorted(current - previous)),
                evicted=tuple(sorted(previous - current)),
                train_partitions=None if self.train_partitions is None else self.train_partitions[index],
                passes=None if self.passes is None else self.passes[index],
            )
            previous = current

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready builtins (arrays become nested lists)."""
        out: dict[str, Any] = {
            "policy": self.policy,
            "task": self.task,
            "num_partitions": self.num_partitions,
            "capacity": self.capacity,
            "epoch": self.epoch,
            "seed": self.seed,
            "options": {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in self.options.items()},
            "num_states": self.num_states,
            "num_swaps": self.num_swaps,
            "states": [list(s) for s in self.states],
        }
        out["state_rounds"], out["state_ranks"] = self.state_rounds, self.state_ranks
        for name in ("train_partitions", "logical_states"):
            value = getattr(self, name)
            out[name] = None if value is None else [list(s) for s in value]
        out["passes"] = self.passes
        out["split_targets"] = self.split_targets
        groups = self.logical_groups
        out["logical_groups"] = None if groups is None else [list(g) for g in groups]
        for name in ("bucket_states", "static_cache"):
            value = getattr(self, name)
            out[name] = None if value is None else value.tolist()
        return out


PlanFunction = Callable[..., EpochPlan]


@dataclass(frozen=True, slots=True)
class Policy:
    """A registered policy: its name, task and planning function."""

    name: str
    """Registry key, e.g. ``"comet"``."""
    task: str
    """``"link"``, ``"node"`` or ``"both"``."""
    plan: PlanFunction
    """``plan(*, num_partitions, capacity, epoch, seed, rng, **options) -> EpochPlan``;
    arguments already validated, ``capacity <= num_partitions``; ``rng`` is a
    `numpy.random.Generator` seeded from ``(seed, epoch, name)``."""
    options: tuple[str, ...]
    """Option names the policy accepts; anything else is a `ConfigError`."""
    summary: str
    """One line for ``--help`` and error messages."""


POLICIES: Registry[Policy] = Registry("policy")
"""Every policy by name; `register_policy` adds to it."""
_TASK_WORDS = {TASK_LINK: "link prediction", TASK_NODE: "node classification", TASK_BOTH: "either task"}


def register_policy(
    name: str, *, task: str, options: tuple[str, ...] = (), summary: str = ""
) -> Callable[[PlanFunction], PlanFunction]:
    """Decorator registering ``plan`` in `POLICIES` as the `Policy` ``name``.

    Raises
    ------
    ConfigError
        If ``task`` is not a task, or ``name`` is malformed or already registered (a
        second policy would silently shadow it).
    """
    if task not in (TASK_LINK, TASK_NODE, TASK_BOTH):
        raise ConfigError(f"task must be 'link', 'node' or 'both' (got {task!r})")

    def decorate(plan: PlanFunction) -> PlanFunction:
        if name in POLICIES:  # name the module holding the first one, not Policy's own
            raise ConfigError(f"a policy named {name!r} is already registered "
                              f"({POLICIES.get(name).plan.__module__}); pick another name")
        POLICIES.register(name, Policy(name=name, task=task, plan=plan, options=tuple(options), summary=summary),
                          summary=summary, stacklevel=2)  # the decorated function's module
        return plan

    return decorate


def policy_names() -> tuple[str, ...]:
    """Registered policy names, sorted.

    >>> from graphstore.buffer import policy_names
    >>> policy_names()
    ('beta', 'comet', 'disjoint', 'dispersed', 'hierbatching', 'in_memory', 'sequential')
    """
    return POLICIES.names()


def get_policy(name: str) -> Policy:
    """The registered `Policy` called ``name``.

    Raises
    ------
    ConfigError
        For an unknown name; the message lists the known ones.
    """
    try:
        return POLICIES.get(name)
    except ConfigError:  # worded as `graphstore plan` has always reported it
        raise ConfigError(f"unknown policy {name!r}; known policies: {', '.join(policy_names())}") from None


def _check_int(name: str, value: Any, minimum: int) -> int:
    # bool is an int subclass; True partitions is a bug, not a count
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{name} must be an integer (got {value!r})")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum} (got {value})")
    return int(value)


def policy_rng(name: str, seed: int, epoch: int) -> np.random.Generator:
    """The generator a policy draws from: a function of ``(seed, epoch, name)`` only, so two
    policies with one seed do not share their random stream."""
    return np.random.default_rng(np.random.SeedSequence([seed, epoch, zlib.crc32(name.encode())]))


def plan_epoch(
    policy: str, *, num_partitions: int, capacity: int, epoch: int = 0, seed: int = 0, **options: Any
) -> EpochPlan:
    """Plan one epoch with the policy registered as ``policy``.

    Parameters
    ----------
    policy : str
        A name from `policy_names`.
    num_partitions : int
        p >= 1, the store's partitions.
    capacity : int
        c >= 1, partitions the buffer holds; values above p are clamped to p.
    epoch : int
        >= 0; randomised policies (all but ``in_memory``) reseed from ``(seed, epoch)``.
    seed : int
        >= 0.
    **options
        Policy options, e.g. ``num_logical_partitions`` (comet), ``train_partitions``
        (node policies), ``reuse``, ``static_cache`` (hierbatching),
        ``task`` (any policy; checked against the policy's task).

    Returns
    -------
    EpochPlan

    Raises
    ------
    ConfigError
        Unknown policy or option, a non-integer or negative argument, or a capacity too
        small for the policy (the message gives the smallest that works).

    Examples
    --------
    >>> plan = plan_epoch("hierbatching", num_partitions=5, capacity=2, epoch=1, seed=3, reuse=3)
    >>> sorted(p for t in plan.train_partitions for p in t), set(plan.passes)
    ([0, 1, 2, 3, 4], {3})
    """
    spec = get_policy(policy)
    p = _check_int("num_partitions", num_partitions, 1)
    c = min(_check_int("capacity", capacity, 1), p)
    epoch = _check_int("epoch", epoch, 0)
    seed = _check_int("seed", seed, 0)
    task = options.pop("task", None)
    if task is not None and task not in (TASK_LINK, TASK_NODE):
        raise ConfigError(f"task must be 'link' or 'node' (got {task!r})")
    if task is not None and spec.task != TASK_BOTH and task != spec.task:
        others = POLICIES.names(where=lambda other: other.task in (task, TASK_BOTH))
        raise ConfigError(f"policy {policy!r} plans {_TASK_WORDS[spec.task]}, not {_TASK_WORDS[task]}; "
                          f"policies for {task!r}: {', '.join(others)}")
    if task is not None and spec.task == TASK_BOTH:
        options["task"] = task
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        accepted = ", ".join(spec.options) or "none"
        raise ConfigError(f"policy {policy!r} does not take option(s) {', '.join(unknown)}; "
                          f"it accepts: {accepted}")
    return spec.plan(num_partitions=p, capacity=c, epoch=epoch, seed=seed,
                     rng=policy_rng(policy, seed, epoch), **options)


def frozen_array(a: np.ndarray) -> np.ndarray:
    """``a`` marked read-only: a plan is a value, the buffer must not edit it in place."""
    a.flags.writeable = False
    return a
