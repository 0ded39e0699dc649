"""Policies as pure plans: every registered policy through the conformance suite
(`graphstore.testing.policies`), then what each built-in policy promises beyond it.

The suite checks what holds for every policy (states ascending and within capacity,
every bucket trained once in a state holding both ends, every training node trained
equally often, determinism for a seed, refusals). Here: which capacities each policy
refuses, BETA/COMET/DISPERSED's one swap per state, COMET's logical groups, DISPERSED's
single read of each partition, HierBatching's ``reuse`` and static cache, the errors and
the command line.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from graphstore.buffer import (
    EpochPlan,
    get_policy,
    plan_epoch,
    policy_names,
    register_policy,
    static_cache_ids,
)
from graphstore.buffer.policies import _link, beta_order, default_logical_partitions
from graphstore.errors import ConfigError
from graphstore.testing.policies import check_plan, check_policy, check_policy_grid
from tests.conftest import REPO

LINK = [n for n in policy_names() if get_policy(n).task in ("link", "both")]
NODE = [n for n in policy_names() if get_policy(n).task in ("node", "both")]
RANDOMISED_LINK = ["beta", "comet", "disjoint"]
RANDOMISED_NODE = ["sequential", "dispersed", "hierbatching"]

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_the_registry_holds_the_seven_policies():
    assert policy_names() == ("beta", "comet", "disjoint", "dispersed", "hierbatching", "in_memory", "sequential")
    assert set(LINK) == {"beta", "comet", "disjoint", "in_memory"}
    assert set(NODE) == {"sequential", "dispersed", "hierbatching", "in_memory"}


def valid_capacity(name: str, p: int, c: int) -> bool:
    """Whether the policy can plan (p, c) with default options (others must raise)."""
    if name == "in_memory":
        return c >= p
    if name == "sequential":  # with the default train_partitions: all of them
        return c >= p
    if name in ("beta", "comet", "disjoint"):
        return p == 1 or c >= 2
    return True


# ---------------------------------------------------------------- the conformance suite


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_passes_the_conformance_grid(name):
    assert check_policy_grid(name) > 0


def membership(plan: EpochPlan) -> np.ndarray:
    """``[S, p] bool``: partition resident in state."""
    m = np.zeros((len(plan.states), plan.num_partitions), dtype=bool)
    for s, state in enumerate(plan.states):
        m[s, list(state)] = True
    return m


def check_one_swap(plan: EpochPlan) -> None:
    for a, b in zip(plan.states, plan.states[1:]):
        assert len(a) == len(b) and len(set(a) - set(b)) == 1, (a, b)


def check_comet(plan: EpochPlan) -> None:
    groups = plan.logical_groups
    assert sorted(x for g in groups for x in g) == list(range(plan.num_partitions)), "groups partition p"
    assert max(map(len, groups)) - min(map(len, groups)) <= 1
    assert len(plan.logical_states) == len(plan.states)
    for logical, physical in zip(plan.logical_states, plan.states):
        assert tuple(sorted(x for g in logical for x in groups[g])) == physical
    for a, b in zip(plan.logical_states, plan.logical_states[1:]):
        assert len(a) == len(b) and len(set(a) - set(b)) == 1, (a, b)


def visits(plan: EpochPlan, train: list[int]) -> set[int]:
    """How often a node of each training partition trains (passes counted)."""
    trained = np.zeros(len(train), dtype=np.int64)
    for nodes, passes in zip(plan.target_states(np.asarray(train)), plan.passes):
        trained[nodes] += passes
    return set(trained.tolist())


def plan_and_check(name: str, p: int, c: int, epoch: int, seed: int, **options) -> EpochPlan:
    """The conformance checks, then what this policy promises beyond them."""
    plan = check_policy(name, num_partitions=p, capacity=c, epoch=epoch, seed=seed, **options)
    assert plan is not None, f"{name} refused capacity {c} of {p} partitions"
    if name in ("beta", "comet"):
        assert plan.task == "link"
        check_comet(plan) if name == "comet" else check_one_swap(plan)
    if plan.train_partitions is not None:
        train = sorted(set(options.get("train_partitions", range(p))))
        assert visits(plan, train) == {options.get("reuse", 2) if name == "hierbatching" else 1}
    return plan


sizes = st.integers(1, 40).flatmap(lambda p: st.tuples(st.just(p), st.integers(1, p + 3)))


@FAST
@given(pc=sizes, epoch=st.integers(0, 5), seed=st.integers(0, 2**32), name=st.sampled_from(policy_names()))
def test_every_policy_keeps_its_invariants_at_random_sizes(pc, epoch, seed, name):
    p, c = pc
    if not valid_capacity(name, p, c):
        assert check_policy(name, num_partitions=p, capacity=c, epoch=epoch, seed=seed) is None
        return
    plan_and_check(name, p, c, epoch, seed)


@FAST
@given(pc=sizes, seed=st.integers(0, 1000), data=st.data())
def test_comet_with_any_logical_partitioning(pc, seed, data):
    p, c = pc
    assume(c >= 2 or p == 1)
    l = data.draw(st.integers(1, p), label="num_logical_partitions")
    group = math.ceil(p / l)
    if min(l, min(c, p) // group) < min(2, l):
        with pytest.raises(ConfigError, match="at least 2 logical partitions"):
            plan_epoch("comet", num_partitions=p, capacity=c, seed=seed, num_logical_partitions=l)
        return
    plan = plan_and_check("comet", p, c, 0, seed, num_logical_partitions=l)
    assert len(plan.logical_groups) == l


@FAST
@given(pc=sizes, seed=st.integers(0, 1000), reuse=st.integers(1, 4), data=st.data())
def test_node_policies_train_only_the_training_partitions(pc, seed, reuse, data):
    p, c = pc
    train = data.draw(st.lists(st.integers(0, p - 1), min_size=1, max_size=2 * p), label="train_partitions")
    name = data.draw(st.sampled_from(["sequential", "dispersed", "hierbatching"]), label="policy")
    options = {"train_partitions": train}
    if name == "hierbatching":
        options["reuse"] = reuse
    if name == "sequential" and len(set(train)) > c:
        with pytest.raises(ConfigError, match="dispersed"):
            plan_epoch(name, num_partitions=p, capacity=c, seed=seed, **options)
        return
    plan = plan_and_check(name, p, c, 0, seed, **options)
    if name == "hierbatching":
        assert set(plan.passes) == {reuse}
    if name == "sequential":
        assert len(plan.states) == 1 and len(plan.states[0]) == min(c, p), "fillers use the whole buffer"
    if name == "dispersed":
        assert all(len(s) == min(c, p) for s in plan.states)
        check_read_once(plan)


def check_read_once(plan: EpochPlan) -> None:
    """MariusGNN's DISPERSED: no partition is read twice in an epoch (admitted once)."""
    admitted = Counter(k for state in plan.buffer_states() for k in state.admitted)
    assert max(admitted.values()) == 1


@FAST
@given(pc=sizes, seed=st.integers(0, 2**32), epoch=st.integers(0, 3))
def test_dispersed_reads_each_partition_once_with_one_swap_per_state(pc, seed, epoch):
    p, c = pc
    plan = plan_and_check("dispersed", p, c, epoch, seed)
    c = min(c, p)
    # Every partition holds training nodes, so no state is dropped: p - c + 1 states, the
    # first reads c partitions and every later one exactly one, so p reads in all.
    assert len(plan.states) == p - c + 1
    check_one_swap(plan)
    check_read_once(plan)
    assert plan.num_swaps + len(plan.states[0]) == p
    # Each node trains in a state holding its partition, drawn at random among them: over
    # many nodes of one partition every such state gets some.
    parts = np.full(4000, plan.states[-1][0])
    holding = [s for s, state in enumerate(plan.states) if parts[0] in state]
    got = [s for s, nodes in enumerate(plan.target_states(parts)) if nodes.size]
    assert got == holding


@FAST
@given(pc=sizes, seed=st.integers(0, 2**32), wanted=st.integers(1, 50), data=st.data())
def test_dispersed_with_few_training_states_still_reads_each_partition_once(pc, seed, wanted, data):
    p, c = pc
    train = data.draw(st.lists(st.integers(0, p - 1), min_size=1, max_size=p), label="train")
    plan = plan_and_check("dispersed", p, c, 1, seed, train_partitions=train, training_states=wanted)
    c = min(c, p)
    check_read_once(plan)
    every = plan_and_check("dispersed", p, c, 1, seed, train_partitions=train)
    # k swaps a state: about `wanted` states, never more than one swap a state makes.
    k = plan.options["swap"]
    assert 1 <= k <= max(1, c)
    assert len(plan.states) <= (math.ceil((p - c) / k) + 1 if p > c else 1)
    if wanted >= p - c + 1:
        assert plan.states == every.states, "a split that fills every state keeps MariusGNN's walk"
    if set(train) == set(range(p)):  # no state dropped: each later state admits k at most
        assert len(plan.states) <= len(every.states)
        assert len(plan.states) == (math.ceil((p - c) / k) + 1 if p > c else 1)
        assert all(len(set(state) - set(before)) <= k for before, state in zip(plan.states, plan.states[1:]))


def test_dispersed_at_cora_shape_trains_in_four_full_states():
    """140 training nodes over 32 partitions, 8 resident, batches of 47: about three batches
    a pass, so four states of c partitions (every partition read once) instead of 25."""
    parts = np.repeat(np.arange(32), 5)[:140]
    few = plan_epoch("dispersed", num_partitions=32, capacity=8, seed=0, training_states=3)
    many = plan_epoch("dispersed", num_partitions=32, capacity=8, seed=0)
    assert (len(few.states), len(many.states)) == (4, 25)
    assert few.num_swaps == many.num_swaps == 24
    sizes = [nodes.size for nodes in few.target_states(parts)]
    assert sum(sizes) == 140 and min(sizes) >= 20


def test_in_memory_is_one_state_with_everything():
    plan = plan_and_check("in_memory", 5, 5, 0, 0)
    assert plan.states == [(0, 1, 2, 3, 4)] and plan.task == "both"
    assert (plan.bucket_states == 0).all()
    assert plan.train_partitions == [(0, 1, 2, 3, 4)] and plan.passes == [1]
    link = plan_epoch("in_memory", num_partitions=5, capacity=9, task="link")
    assert link.task == "link" and link.train_partitions is None and link.capacity == 5
    node = plan_epoch("in_memory", num_partitions=5, capacity=5, task="node", train_partitions=[3, 1])
    assert node.bucket_states is None and node.train_partitions == [(1, 3)]


# ---------------------------------------------------------------- BETA and COMET specifics


def test_beta_and_comet_at_mariusgnn_settings():
    beta = plan_and_check("beta", 16, 4, 0, 0)
    comet = plan_and_check("comet", 16, 4, 0, 0)
    # covering bound: 1 + (pairs - pairs of the first state) / (new pairs per swap)
    assert math.ceil(1 + (120 - 6) / 3) <= len(beta.states) <= 43
    assert comet.options == {"num_logical_partitions": 8, "logical_capacity": 2}
    assert len(comet.states) == 28  # C(8, 2): every pair of logical partitions once
    assert all(len(s) == 4 for s in comet.states)


@pytest.mark.parametrize("n, k", [(2, 2), (5, 2), (7, 3), (16, 4), (30, 7), (100, 25), (64, 63)])
def test_beta_order_meets_every_pair_close_to_the_bound(n, k):
    slots, swap_slot = beta_order(n, k)
    assert slots.shape[1] == k and swap_slot[0] == -1
    met = np.zeros((n, n), dtype=bool)
    for row in slots:
        met[np.ix_(row, row)] = True
    assert met.all()
    changed = (slots[1:] != slots[:-1]).sum(axis=1)
    assert (changed == 1).all() and (np.flatnonzero(slots[1:] != slots[:-1]) % k == swap_slot[1:]).all()
    bound = math.ceil(1 + (n * (n - 1) / 2 - k * (k - 1) / 2) / (k - 1))
    assert bound <= len(slots) <= 1.25 * bound + k


def test_beta_trains_a_bucket_in_the_first_state_holding_both():
    plan = plan_epoch("beta", num_partitions=12, capacity=3, seed=4)
    m = membership(plan)
    both = m[:, :, None] & m[:, None, :]
    assert (plan.bucket_states == both.argmax(axis=0)).all()


def test_comet_draws_bucket_states_at_random():
    plan = plan_epoch("comet", num_partitions=16, capacity=4, seed=0)
    # Inside one logical partition a bucket could go to any of the 7 states holding it.
    g = list(plan.logical_groups[0])
    holding = [s for s, logical in enumerate(plan.logical_states) if 0 in logical]
    assert len(holding) == 7
    counts = Counter()
    for seed in range(30):
        p2 = plan_epoch("comet", num_partitions=16, capacity=4, seed=seed)
        grp = p2.logical_groups[0]
        counts.update(p2.bucket_states[np.ix_(grp, grp)].ravel().tolist())
        states = {s for s, logical in enumerate(p2.logical_states) if 0 in logical}
        assert set(p2.bucket_states[np.ix_(grp, grp)].ravel().tolist()) <= states
    assert set(counts) == set(holding), "diagonal-block buckets spread over all 7 states"
    assert plan.bucket_states[g[0], g[1]] in holding


@pytest.mark.parametrize("limits", [dict(_SAMPLE_BLOCK=50), dict(_MAX_RANDOM_BLOCKS=0),
                                    dict(_TABLE_LIMIT=0, _SAMPLE_BLOCK=64)])
def test_comet_sampling_paths_agree_on_the_invariants(monkeypatch, limits):
    for name, value in limits.items():
        monkeypatch.setattr(_link, name, value)
    for p, c, l in [(16, 4, None), (23, 6, 23), (40, 10, 9)]:
        plan = plan_and_check("comet", p, c, 1, 7, **({} if l is None else {"num_logical_partitions": l}))
        per_pair = Counter(plan.bucket_states[np.triu_indices(p)].tolist())
        assert len(per_pair) > 1


def test_default_logical_partitions():
    assert default_logical_partitions(16, 4) == 8  # MariusGNN's 2p / c
    assert default_logical_partitions(16, 6) == 6  # 2p / c = 5.3 would leave room for one group only
    assert default_logical_partitions(7, 2) == 7  # c = 2: COMET over single partitions
    assert default_logical_partitions(5, 5) == 1  # everything fits: one state
    assert plan_epoch("comet", num_partitions=5, capacity=9).states == [(0, 1, 2, 3, 4)]


@pytest.mark.parametrize("p", [1000])
def test_large_plans_stay_valid(p):
    for name in ("beta", "comet"):
        plan = plan_epoch(name, num_partitions=p, capacity=p // 4, seed=1)
        check_plan(plan, name=name, num_partitions=p, capacity=p // 4, seed=1)


# ---------------------------------------------------------------- randomness and determinism


@pytest.mark.parametrize("name", RANDOMISED_LINK + RANDOMISED_NODE)
def test_plans_differ_across_seeds(name):
    options = {"train_partitions": [0, 3, 5]} if name == "sequential" else {}
    plans = {str(plan_epoch(name, num_partitions=16, capacity=4, seed=s, **options).states) for s in range(4)}
    assert len(plans) == 4


@pytest.mark.parametrize("name", ["comet", "hierbatching"])
def test_plans_differ_across_epochs(name):
    plans = [plan_epoch(name, num_partitions=16, capacity=4, epoch=e, seed=3) for e in range(4)]
    assert len({json.dumps(p.to_dict()["states"]) for p in plans}) == 4
    if name == "comet":
        assert len({p.logical_groups for p in plans}) == 4, "regrouped every epoch"


def test_plans_are_values():
    plan = plan_epoch("beta", num_partitions=6, capacity=3)
    with pytest.raises(AttributeError):
        plan.states = []
    with pytest.raises(ValueError):
        plan.bucket_states[0, 0] = 5
    states = list(plan.buffer_states())
    assert all(len(s.admitted) == len(s.evicted) == 1 for s in states[1:])
    assert plan.num_swaps == len(plan.states) - 1


# ---------------------------------------------------------------- static cache


@FAST
@given(degrees=st.lists(st.integers(0, 6), min_size=1, max_size=200), fraction=st.floats(0, 1))
def test_static_cache_is_exactly_the_top_k_by_degree(degrees, fraction):
    k = math.ceil(fraction * len(degrees))
    expected = sorted(sorted(range(len(degrees)), key=lambda i: (-degrees[i], i))[:k])
    ids = static_cache_ids(np.array(degrees, dtype=np.uint32), fraction)
    assert ids.tolist() == expected
    # The policy carries the ids it is handed (chosen once, in graphstore.buffer.cache).
    plan = plan_epoch("hierbatching", num_partitions=4, capacity=2, static_cache=ids)
    assert plan.static_cache.dtype == np.int64 and plan.static_cache.tolist() == expected


# ---------------------------------------------------------------- errors and the registry


def test_unknown_policy_lists_the_known_ones():
    with pytest.raises(ConfigError) as info:
        plan_epoch("lru", num_partitions=4, capacity=2)
    assert "'lru'" in str(info.value)
    for name in policy_names():
        assert name in str(info.value)
    assert isinstance(info.value, ValueError)


def test_registry_refuses_duplicates():
    with pytest.raises(ConfigError, match="already registered"):
        register_policy("beta", task="link")(lambda **kw: None)
    assert get_policy("beta").plan is _link.plan_beta


@pytest.mark.parametrize("call, message", [
    (dict(policy="beta", num_partitions=4, capacity=1), "capacity >= 2"),
    (dict(policy="comet", num_partitions=4, capacity=1), "capacity >= 2"),
    (dict(policy="comet", num_partitions=16, capacity=4, num_logical_partitions=4), "at least 2 logical"),
    (dict(policy="comet", num_partitions=16, capacity=4, num_logical_partitions=17), r"\[1, 16\]"),
    (dict(policy="sequential", num_partitions=8, capacity=2, train_partitions=[1, 2, 3]), "capacity >= 3"),
    (dict(policy="in_memory", num_partitions=8, capacity=7), "capacity >= 8"),
    (dict(policy="beta", num_partitions=0, capacity=1), "num_partitions must be >= 1"),
    (dict(policy="beta", num_partitions=4, capacity=2, seed=-1), "seed must be >= 0"),
    (dict(policy="beta", num_partitions=4, capacity=2.0), "capacity must be an integer"),
    (dict(policy="beta", num_partitions=4, capacity=2, reuse=2), "does not take option"),
    (dict(policy="beta", num_partitions=4, capacity=2, task="node"), "link prediction, not node"),
    (dict(policy="hierbatching", num_partitions=4, capacity=2, reuse=0), "reuse must be a positive"),
    (dict(policy="dispersed", num_partitions=4, capacity=2, train_partitions=[4]), r"\[0, 4\)"),
    (dict(policy="dispersed", num_partitions=4, capacity=2, train_partitions=[]), "empty"),
])
def test_errors_say_what_and_how(call, message):
    policy = call.pop("policy")
    with pytest.raises(ConfigError, match=message):
        plan_epoch(policy, **call)


def test_capacity_above_p_is_clamped():
    plan = plan_epoch("beta", num_partitions=3, capacity=10)
    assert plan.capacity == 3 and plan.states == [(0, 1, 2)]
    assert plan_epoch("hierbatching", num_partitions=3, capacity=10).states == [(0, 1, 2)]


# ---------------------------------------------------------------- command line


def run(*args, code=0):
    proc = subprocess.run([sys.executable, "-m", "graphstore", "plan", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == code, proc.stderr
    return proc


def test_cli_prints_the_plan_as_json():
    out = json.loads(run("--policy", "beta", "--partitions", 8, "--capacity", 4, "--json").stdout)
    direct = plan_epoch("beta", num_partitions=8, capacity=4)
    assert out["states"] == [list(s) for s in direct.states]
    assert out["bucket_states"] == direct.bucket_states.tolist()
    out = json.loads(run("--policy", "hierbatching", "--partitions", 6, "--capacity", 2, "--seed", 3,
                         "--epoch", 2, "--reuse", 3, "--train-partitions", "0,2,4", "--json").stdout)
    direct = plan_epoch("hierbatching", num_partitions=6, capacity=2, seed=3, epoch=2, reuse=3,
                        train_partitions=[0, 2, 4])
    assert out["train_partitions"] == [list(t) for t in direct.train_partitions] and set(out["passes"]) == {3}
    out = json.loads(run("--policy", "comet", "--partitions", 16, "--capacity", 4,
                         "--num-logical-partitions", 4, "--capacity", 8, "--json").stdout)
    assert len(out["logical_groups"]) == 4
    out = json.loads(run("--policy", "disjoint", "--partitions", 8, "--capacity", 4, "--world-size", 2,
                         "--json").stdout)
    direct = plan_epoch("disjoint", num_partitions=8, capacity=4, world_size=2)
    assert (out["state_rounds"], out["state_ranks"]) == (direct.state_rounds, direct.state_ranks) == (
        [0, 0, 1, 1, 2, 2], [0, 1, 0, 1, 0, 1])
    text = run("--policy", "disjoint", "--partitions", 8, "--capacity", 4, "--world-size", 2).stdout
    assert "state 1: " in text and "round 0, rank 1" in text


def test_cli_summary_and_errors():
    text = run("--policy", "comet", "--partitions", 16, "--capacity", 4).stdout
    assert "28 states" in text and "num_logical_partitions=8" in text
    proc = run("--policy", "lru", "--partitions", 4, "--capacity", 2, code=1)
    assert proc.stderr.count("\n") == 1 and "known policies: beta, comet" in proc.stderr
    proc = run("--policy", "beta", "--partitions", 4, "--capacity", 1, code=1)
    assert "capacity >= 2" in proc.stderr and "Traceback" not in proc.stderr
    run("--policy", "beta", "--partitions", 0, "--capacity", 1, code=2)


def test_comet_and_beta_plan_every_p_and_capacity_with_default_settings():
    # The review's crashes: p = 6, 10, 14, 33 at the loader's default capacity, and p = 16
    # at capacity 5, had l fixed at round(2p/c). Now l follows the capacity, for every pair.
    for p in range(2, 65):
        capacities = range(2, p + 1) if p <= 24 else sorted({2, 3, 5, 7, p // 4, p // 2 + 1, p - 1, p})
        for c in capacities:
            for name in ("comet", "beta"):
                plan = plan_epoch(name, num_partitions=p, capacity=c, seed=p * 100 + c)
                check_plan(plan, name=name, num_partitions=p, capacity=c, seed=p * 100 + c)
            l = plan_epoch("comet", num_partitions=p, capacity=c).options["num_logical_partitions"]
            assert l == default_logical_partitions(p, c)


def test_dispersed_at_the_benchmark_setting_reads_each_partition_once():
    # p = 64, c = 2: the old DISPERSED read 119-125 partitions an epoch; MariusGNN's reads 64.
    plan = plan_epoch("dispersed", num_partitions=64, capacity=2, seed=0)
    assert len(plan.states) == 63 and plan.num_swaps + 2 == 64


# ---------------------------------------------------------------- disjoint (data-parallel rounds)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_disjoint_rounds_hold_each_partition_once_and_train_every_bucket_once(world):
    for p in range(1, 19):
        for c in sorted({2, 3, 4, max(2, p // 2), p}):
            plan = plan_epoch("disjoint", num_partitions=p, capacity=c, epoch=2, seed=7, world_size=world)
            b = np.asarray(plan.bucket_states)
            i, j = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
            held = membership(plan)  # [states, p]
            assert held[b, i].all() and held[b, j].all(), (p, c, world)  # both ends resident
            assert all(len(s) <= c for s in plan.states)
            rounds, ranks = np.asarray(plan.state_rounds), np.asarray(plan.state_ranks)
            assert (np.diff(rounds) >= 0).all() and set(ranks.tolist()) <= set(range(world))
            for t in np.unique(rounds):  # a round's states are disjoint: ranks never share a row
                assert held[rounds == t].sum(axis=0).max() == 1, (p, c, world, t)
            # Rounds are listed rank by rank, and p >= 2N gives every rank a state each round.
            if p >= 2 * world and c >= 2:
                assert all(set(ranks[rounds == t].tolist()) == set(range(world)) for t in np.unique(rounds))


def test_disjoint_balances_the_ranks_and_regroups_every_epoch():
    plans = [plan_epoch("disjoint", num_partitions=16, capacity=4, epoch=e, seed=1, world_size=2) for e in range(3)]
    options = plans[0].options
    assert {k: options[k] for k in ("world_size", "group_size", "num_groups", "num_rounds")} == {
        "world_size": 2, "group_size": 2, "num_groups": 8, "num_rounds": 7}
    assert len(plans[0].states) == 28 and np.bincount(plans[0].state_ranks).tolist() == [14, 14]
    # Without edge counts every bucket counts one: the rounds' busiest ranks add up to within
    # 10 % of an even split of the 256 buckets (each round's inner buckets go where they
    # even it out), and round_edges reports what each rank trains.
    buckets = np.bincount(np.asarray(plans[0].bucket_states).ravel(), minlength=28)
    table = np.zeros((7, 2))
    np.add.at(table, (np.asarray(plans[0].state_rounds), np.asarray(plans[0].state_ranks)), buckets)
    assert table.tolist() == options["round_edges"] and table.sum() == 256
    assert table.max(axis=1).sum() <= 1.1 * 256 / 2
    assert plans[0].logical_groups != plans[1].logical_groups
    # With many more ranks than groups, the groups shrink to one partition and rounds still cover.
    # The group resting in a round trains its own bucket there, on a rank of its own.
    tiny = plan_epoch("disjoint", num_partitions=3, capacity=2, epoch=0, seed=0, world_size=4)
    assert tiny.options["group_size"] == 1 and len(tiny.states) == 6
    assert tiny.options["round_edges"] == [[2, 1, 0, 0]] * 3


@pytest.fixture(scope="module")
def kg_bucket_sizes(tmp_path_factory) -> dict[int, np.ndarray]:
    """``{p: [p, p]}`` edges of bucket (i, j) of the trainers' test knowledge graph (2,640
    training triples) under random partitions: the graph of the data-parallel figures."""
    import graphstore
    from tests.trainers.conftest import write_clustered_kg

    root = tmp_path_factory.mktemp("kg_buckets")
    write_clustered_kg(root / "src")
    sizes = {}
    for p in (5, 8, 16):
        graphstore.convert(root / "src", root / f"kg{p}.gs", num_partitions=p, partitioner="random")
        with graphstore.open(root / f"kg{p}.gs") as store:
            sizes[p] = np.diff(store.bucket_offsets).reshape(p, p).T
    return sizes


def round_batches(plan: EpochPlan, sizes: np.ndarray, batch_size: int) -> np.ndarray:
    """``[round, rank]`` batches of positives each rank trains in each round (a state's last
    batch part-filled, as the edge loader cuts them)."""
    edges = np.bincount(np.asarray(plan.bucket_states).ravel(), weights=sizes.ravel(), minlength=len(plan.states))
    table = np.zeros((plan.options["num_rounds"], plan.options["world_size"]))
    np.add.at(table, (np.asarray(plan.state_rounds), np.asarray(plan.state_ranks)), np.ceil(edges / batch_size))
    return table


@pytest.mark.parametrize("p, world, bound", [(8, 3, 1.12), (16, 3, 1.12), (8, 2, 1.12), (8, 4, 1.12), (5, 3, 1.25)])
def test_disjoint_steps_are_close_to_the_batches_divided_evenly(kg_bucket_sizes, p, world, bound):
    """The steps (each round's busiest rank's batches, summed) within ``bound`` of the
    batches divided evenly, batches of 64 as in tests/distributed. Each round of the
    round-robin tournament alone held 4 pairs of 8 groups for 3 ranks, so one rank trained
    two states while the others waited: 28 steps where dividing gives 20 (1.4x) at (epoch 0,
    seed 0) and (1, 3), 1.26x at 16 partitions. 5 partitions fit at most 2 of their 10 pairs
    a round: 5 rounds of at least a pair's 4 batches, 1.25x the even split, and no rank
    idles. Told the batch size, the plan never takes more steps."""
    sizes = kg_bucket_sizes[p]
    for epoch, seed in [(0, 0), (1, 3), (2, 1), (1, 4)]:
        kw = dict(num_partitions=p, capacity=4, epoch=epoch, seed=seed, world_size=world, bucket_edges=sizes)
        plan = plan_epoch("disjoint", **kw)  # as the edge loader asks for it: weighed by edges
        held, buckets = membership(plan), np.asarray(plan.bucket_states)
        i, j = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
        assert held[buckets, i].all() and held[buckets, j].all()  # every bucket once, both ends resident
        rounds = np.asarray(plan.state_rounds)
        assert all(held[rounds == t].sum(axis=0).max() == 1 for t in np.unique(rounds))
        table = round_batches(plan, sizes, 64)
        assert table.sum() == np.ceil(np.bincount(buckets.ravel(), weights=sizes.ravel()) / 64).sum()
        steps = table.max(axis=1).sum()
        assert steps <= bound * table.sum() / world, (epoch, seed, table.tolist())
        assert (table > 0).all(), table.tolist()  # no rank idles a round
        # Told the batch size, the plan counts a state's part-filled last batch as a step.
        told = round_batches(plan_epoch("disjoint", **kw, batch_size=64), sizes, 64)
        assert told.max(axis=1).sum() <= steps, (epoch, seed, told.tolist())


def test_disjoint_refuses_a_batch_size_that_is_not_a_positive_integer():
    for bad in (0, -1, 2.5, True, "64"):
        with pytest.raises(ConfigError, match=r"batch_size must be an integer >= 1 or None \(got"):
            plan_epoch("disjoint", num_partitions=4, capacity=2, world_size=2, batch_size=bad)
