"""The invariants every registered buffer policy keeps, as plain checks.

`check_policy` plans one epoch through `plan_epoch` and checks the plan; `check_policy_grid`
runs it over small (num_partitions, capacity) pairs, including the corners that break
policies (p = 1, c = 1 and 2, odd capacities, c >= p). What is checked, for any policy:

- the plan is a value: the same ``(seed, epoch)`` gives the same plan (without looking at
  numpy's or Python's global random state), its arrays are read-only and `EpochPlan.to_dict`
  is JSON-ready;
- the plan describes what was asked: policy name, p, the clamped capacity ``min(c, p)``,
  epoch, seed, and the task of the policy (or the one requested of an ``in_memory``-like
  policy that serves both);
- every state is a non-empty tuple of partition ids, ascending, without repeats, in
  ``[0, p)``, no longer than the capacity; `EpochPlan.buffer_states` admits and evicts
  exactly the difference of consecutive states;
- link prediction: ``bucket_states`` is ``[p, p]`` integer, and bucket ``(i, j)`` trains in
  one state that holds both ``i`` and ``j``;
- node classification: each state's ``train_partitions`` are resident there and are
  training partitions; over the epoch every training node trains the same number of
  times, at least once (``reuse`` times when that option is given) and only in states
  holding its partition (`EpochPlan.target_states`, passes counted);
- an option the policy did not declare is refused with `ConfigError`; a capacity the policy
  cannot work with is refused with a `ConfigError` that names the capacity (and, when it
  says ``capacity >= k``, ``k`` works), never for ``c >= p``.

A failure raises `AssertionError` naming the policy, its arguments and the invariant.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any, NoReturn

import numpy as np

from graphstore.buffer.policies import EpochPlan, get_policy, plan_epoch
from graphstore.errors import ConfigError

__all__ = ["GRID", "check_plan", "check_policy", "check_policy_grid"]

GRID: tuple[tuple[int, int], ...] = tuple(sorted({
    (p, c)
    for p in (1, 2, 3, 4, 7, 12, 16)
    for c in (1, 2, 3, (p + 1) // 2, p - 1, p, p + 3)
    if c >= 1
}))
"""(num_partitions, capacity) pairs `check_policy_grid` plans: p = 1, c = 1 and 2, odd
capacities, c = p - 1, c = p and c > p (clamped)."""

_NODES_PER_PARTITION = 3
"""Training nodes per training partition fed to `EpochPlan.target_states`."""

_PROBE_OPTION = "conformance_probe"
"""An option name no policy declares: planning with it must be refused."""

_NEEDS = re.compile(r"capacity >= (\d+)")


class _Case:
    """The arguments of one check, for messages that say where an invariant broke."""

    def __init__(self, name: str, p: int, c: int, epoch: int, seed: int, options: dict[str, Any]) -> None:
        self.name = name
        shown = "".join(f", {k}={_short(v)}" for k, v in sorted(options.items()))
        self.where = f"policy {name!r} (num_partitions={p}, capacity={c}, epoch={epoch}, seed={seed}{shown})"

    def fail(self, problem: str) -> NoReturn:
        raise AssertionError(f"{self.where}: {problem}")


def _short(value: Any) -> str:
    if isinstance(value, np.ndarray) and value.size > 8:
        return f"<array {value.shape} {value.dtype}>"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_plan(plan: EpochPlan, *, name: str, num_partitions: int, capacity: int, epoch: int = 0,
               seed: int = 0, **options: Any) -> None:
    """Check the invariants of one plan (everything but determinism and refusals).

    Parameters
    ----------
    plan : EpochPlan
        What ``plan_epoch(name, num_partitions=..., capacity=..., epoch=..., seed=...,
        **options)`` returned.
    name, num_partitions, capacity, epoch, seed, **options
        The arguments the plan was made with.

    Raises
    ------
    AssertionError
        The first broken invariant, with the policy and its arguments.
    """
    case = _Case(name, num_partitions, capacity, epoch, seed, options)
    _check_plan(case, plan, num_partitions, capacity, epoch, seed, options)


def check_policy(name: str, *, num_partitions: int, capacity: int, epoch: int = 0, seed: int = 0,
                 **options: Any) -> EpochPlan | None:
    """Plan one epoch with the registered policy ``name`` and check every invariant.

    Parameters
    ----------
    name : str
        A registered policy (`policy_names`).
    num_partitions, capacity, epoch, seed : int
        As for `plan_epoch`.
    **options
        Policy options (``train_partitions``, ``reuse``, ``task``...).

    Returns
    -------
    EpochPlan or None
        The plan; None when the policy refused the capacity in the documented way (a
        `ConfigError` naming the capacity it needs, for a capacity below p).

    Raises
    ------
    AssertionError
        The first broken invariant, naming the policy, its arguments and the invariant.
    ConfigError
        Any other refusal (a bad option value is the caller's mistake, not the policy's).
    """
    case = _Case(name, num_partitions, capacity, epoch, seed, options)
    spec = get_policy(name)

    def plan() -> EpochPlan:
        return plan_epoch(name, num_partitions=num_partitions, capacity=capacity, epoch=epoch, seed=seed,
                          **options)

    try:
        first = plan()
    except ConfigError as exc:
        if "capacity" not in str(exc):
            raise
        _check_refusal(case, exc, name, num_partitions, capacity, epoch, seed, options)
        return None
    if not isinstance(first, EpochPlan):
        case.fail(f"returned {type(first).__name__}, not an EpochPlan")
    _check_plan(case, first, num_partitions, capacity, epoch, seed, options)

    # Same (seed, epoch), global random state moved on: the same plan.
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        np.random.seed((seed + 1) % 2**32)
        random.seed(seed + 1)
        again = plan()
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    if _dump(case, first) != _dump(case, again):
        case.fail("two plans with the same (seed, epoch) differ: a plan must depend on its arguments only")

    if _PROBE_OPTION in spec.options:
        return first
    try:
        plan_epoch(name, num_partitions=num_partitions, capacity=capacity, epoch=epoch, seed=seed,
                   **options, **{_PROBE_OPTION: 1})
    except ConfigError:
        pass
    else:
        case.fail(f"accepted the undeclared option {_PROBE_OPTION!r}; declared: {', '.join(spec.options) or 'none'}")
    return first


def check_policy_grid(name: str, *, grid: Iterable[tuple[int, int]] = GRID, epochs: Sequence[int] = (0, 1),
                      seeds: Sequence[int] = (0, 2**31 + 5), **options: Any) -> int:
    """`check_policy` over every ``(num_partitions, capacity)`` of ``grid``, epoch and seed.

    A node policy that takes ``train_partitions`` is also planned with a subset given out
    of order and with a repeat (``[p - 1, 0, p - 1]``); a policy serving both tasks is
    planned for each task as well as for both. ``options`` go to every plan.

    Returns
    -------
    int
        The number of plans checked (refused capacities excluded), so a caller can assert
        the grid did not check nothing.

    Raises
    ------
    AssertionError
        The first broken invariant, or a policy that refuses even ``capacity >= p``.
    """
    spec = get_policy(name)
    checked = 0
    for p, c in grid:
        variants: list[dict[str, Any]] = [{}]
        if spec.task == "both":
            variants += [{"task": "link"}, {"task": "node"}]
        if spec.task in ("node", "both") and "train_partitions" in spec.options and "train_partitions" not in options:
            variants += [dict(v, train_partitions=[p - 1, 0, p - 1]) for v in variants if v.get("task") != "link"]
        for variant in variants:
            for epoch in epochs:
                for seed in seeds:
                    plan = check_policy(name, num_partitions=p, capacity=c, epoch=epoch, seed=seed,
                                        **options, **variant)
                    checked += plan is not None
    return checked


# ----------------------------------------------------------------------------- the checks


def _dump(case: _Case, plan: EpochPlan) -> str:
    try:
        return json.dumps(plan.to_dict(), sort_keys=True)
    except (TypeError, ValueError) as exc:
        case.fail(f"plan.to_dict() is not JSON-ready ({exc}); `graphstore plan --json` prints it")


def _check_refusal(case: _Case, exc: ConfigError, name: str, p: int, c: int, epoch: int, seed: int,
                   options: dict[str, Any]) -> None:
    if c >= p:
        case.fail(f"refused a capacity that holds every partition ({exc})")
    needs = _NEEDS.search(str(exc))
    if needs is None:
        return
    k = int(needs.group(1))
    if k <= c:
        case.fail(f"refused capacity {c} saying it needs capacity >= {k}")
    try:
        plan_epoch(name, num_partitions=p, capacity=k, epoch=epoch, seed=seed, **options)
    except ConfigError as again:
        case.fail(f"said it needs capacity >= {k}, but refused capacity {k} too ({again})")


def _check_plan(case: _Case, plan: EpochPlan, p: int, c: int, epoch: int, seed: int,
                options: dict[str, Any]) -> None:
    spec = get_policy(case.name)
    asked_task = options.get("task")
    want = {"policy": case.name, "num_partitions": p, "capacity": min(c, p), "epoch": epoch, "seed": seed,
            "task": spec.task if spec.task != "both" else (asked_task or "both")}
    for field, value in want.items():
        if getattr(plan, field) != value:
            case.fail(f"plan.{field} is {getattr(plan, field)!r}, expected {value!r}")
    resident = _check_states(case, plan)
    _check_buffer_states(case, plan, resident)
    for field in ("bucket_states", "static_cache"):
        array = getattr(plan, field)
        if isinstance(array, np.ndarray) and array.flags.writeable:
            case.fail(f"plan.{field} is writeable: a plan is a value the buffer must not edit")
    if plan.task in ("link", "both"):
        _check_link(case, plan, resident)
    elif plan.bucket_states is not None:
        case.fail(f"a {plan.task} plan has bucket_states")
    if plan.task in ("node", "both"):
        train = options.get("train_partitions")
        train = list(range(p)) if train is None else sorted({int(k) for k in train})
        _check_node(case, plan, train, options.get("reuse"))
    elif plan.train_partitions is not None or plan.passes is not None:
        case.fail(f"a {plan.task} plan has train_partitions or passes")


def _check_states(case: _Case, plan: EpochPlan) -> np.ndarray:
    """Check the states; return ``[S, p] bool``, partition resident in state."""
    states, p = plan.states, plan.num_partitions
    if not isinstance(states, list) or not states:
        case.fail(f"plan.states must be a non-empty list (got {_short(states)})")
    # One pass in numpy over all states (an epoch can have thousands); the loop below only
    # runs to name the first bad state.
    if all(type(state) is tuple and state for state in states):
        flat = list(chain.from_iterable(states))
        if set(map(type, flat)) == {int}:
            ids = np.asarray(flat, dtype=np.int64)
            lengths = np.fromiter(map(len, states), dtype=np.int64, count=len(states))
            starts = np.cumsum(lengths) - lengths
            rising = np.diff(ids) > 0
            rising[starts[1:] - 1] = True  # a new state may start lower
            if rising.all() and ids.min() >= 0 and ids.max() < p and lengths.max() <= plan.capacity:
                resident = np.zeros((len(states), p), dtype=bool)
                resident[np.repeat(np.arange(len(states)), lengths), ids] = True
                return resident
    for s, state in enumerate(states):
        if not isinstance(state, tuple) or not state or not all(type(k) is int for k in state):
            case.fail(f"state {s} is {_short(state)}, not a non-empty tuple of Python ints")
        if list(state) != sorted(set(state)):
            case.fail(f"state {s} {state} is not ascending without repeats")
        if state[0] < 0 or state[-1] >= p:
            case.fail(f"state {s} {state} holds a partition outside [0, {p})")
        if len(state) > plan.capacity:
            case.fail(f"state {s} holds {len(state)} partitions, more than capacity {plan.capacity}")
    raise AssertionError("unreachable: the loop names the bad state")


def _check_buffer_states(case: _Case, plan: EpochPlan, resident: np.ndarray) -> None:
    views = list(plan.buffer_states())
    if len(views) != len(plan.states):
        case.fail(f"buffer_states() gave {len(views)} states for {len(plan.states)} in plan.states")
    before = np.zeros_like(resident)
    before[1:] = resident[:-1]
    admits, evicts = resident & ~before, before & ~resident
    for name, want in (("admitted", admits), ("evicted", evicts)):
        got = np.zeros_like(resident)
        lists = [getattr(view, name) for view in views]
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        got[np.repeat(np.arange(len(lists)), lengths), np.fromiter(chain.from_iterable(lists), dtype=np.int64,
                                                                   count=int(lengths.sum()))] = True
        sorted_ok = all(list(ids) == sorted(ids) for ids in lists)
        if not sorted_ok or not np.array_equal(got, want) or int(lengths.sum()) != int(want.sum()):
            s = next(s for s in range(len(lists))
                     if list(lists[s]) != np.flatnonzero(want[s]).tolist())
            case.fail(f"buffer state {s} has {name} {lists[s]}; the states "
                      f"{plan.states[s - 1] if s else ()} -> {plan.states[s]} make it "
                      f"{tuple(np.flatnonzero(want[s]).tolist())}")
    if any(view.index != s or tuple(view.partitions) != state
           for s, (view, state) in enumerate(zip(views, plan.states))):
        case.fail("buffer_states() does not list plan.states in order")
    if plan.num_swaps != int(admits[1:].sum()):
        case.fail(f"num_swaps is {plan.num_swaps} but the states after the first admit {int(admits[1:].sum())} "
                  f"partitions")


def _check_link(case: _Case, plan: EpochPlan, resident: np.ndarray) -> None:
    p, num = plan.num_partitions, len(plan.states)
    bs = plan.bucket_states
    if not isinstance(bs, np.ndarray) or bs.shape != (p, p) or bs.dtype.kind not in "iu":
        got = f"{bs.shape} {bs.dtype}" if isinstance(bs, np.ndarray) else type(bs).__name__
        case.fail(f"bucket_states must be a [{p}, {p}] integer array (got {got})")
    bad = np.argwhere((bs < 0) | (bs >= num))
    if bad.size:
        i, j = bad[0]
        case.fail(f"bucket ({i}, {j}) trains in state {bs[i, j]}, outside [0, {num})")
    ids = np.arange(p)
    holds_src, holds_dst = resident[bs, ids[:, None]], resident[bs, ids[None, :]]
    if not (holds_src & holds_dst).all():
        i, j = np.argwhere(~(holds_src & holds_dst))[0]
        end, k = ("source", i) if not holds_src[i, j] else ("destination", j)
        case.fail(f"bucket ({i}, {j}) trains in state {bs[i, j]} {plan.states[bs[i, j]]}, "
                  f"which does not hold its {end} partition {k}")


def _check_node(case: _Case, plan: EpochPlan, train: list[int], reuse: Any) -> None:
    num = len(plan.states)
    if plan.train_partitions is None or plan.passes is None:
        case.fail("a node plan needs train_partitions and passes")
    if len(plan.train_partitions) != num or len(plan.passes) != num:
        case.fail(f"train_partitions ({len(plan.train_partitions)}) and passes ({len(plan.passes)}) "
                  f"must have one entry per state ({num})")
    for s, (state, mine, passes) in enumerate(zip(plan.states, plan.train_partitions, plan.passes)):
        if not isinstance(mine, tuple) or list(mine) != sorted(set(mine)):
            case.fail(f"state {s} trains partitions {_short(mine)}, not an ascending tuple without repeats")
        if not set(mine) <= set(state):
            case.fail(f"state {s} trains partitions {sorted(set(mine) - set(state))} it does not hold {state}")
        if not set(mine) <= set(train):
            case.fail(f"state {s} trains partitions {sorted(set(mine) - set(train))}, "
                      f"which are not training partitions {train}")
        if isinstance(passes, bool) or not isinstance(passes, (int, np.integer)) or passes < 1:
            case.fail(f"state {s} makes {passes!r} passes; passes must be a positive int")
    listed = {k for mine in plan.train_partitions for k in mine}
    if listed != set(train):
        case.fail(f"training partitions {sorted(set(train) - listed)} are trained in no state")

    parts = np.repeat(np.asarray(train, dtype=np.int64), _NODES_PER_PARTITION)
    try:
        targets = plan.target_states(parts)
    except ConfigError as exc:
        case.fail(f"target_states refused the training nodes ({exc})")
    if len(targets) != num:
        case.fail(f"target_states gave {len(targets)} lists for {num} states")
    trained = np.zeros(parts.size, dtype=np.int64)
    for s, (nodes, passes) in enumerate(zip(targets, plan.passes)):
        nodes = np.asarray(nodes)
        if nodes.size and (np.any(np.diff(nodes) <= 0) or nodes[0] < 0 or nodes[-1] >= parts.size):
            case.fail(f"state {s}'s target positions {_short(nodes.tolist())} are not ascending positions in [0, {parts.size})")
        outside = set(parts[nodes].tolist()) - set(plan.train_partitions[s])
        if outside:
            case.fail(f"state {s} targets nodes of partitions {sorted(outside)}, which it does not train")
        trained[nodes] += passes
    visits = sorted(set(trained.tolist()))
    if len(visits) != 1 or visits[0] < 1:
        lo, hi = int(np.argmin(trained)), int(np.argmax(trained))
        case.fail(f"a node of partition {parts[lo]} trains {trained[lo]} times, one of partition {parts[hi]} "
                  f"{trained[hi]} times (passes counted); every training node must train equally often, "
                  f"at least once")
    if reuse is not None and visits[0] != reuse:
        case.fail(f"every training node trains {visits[0]} times, but reuse={reuse}")
