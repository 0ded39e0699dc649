"""Replacement policies as pure plans: which partitions are resident when, and what each
state trains. See `graphstore.buffer.policies.base` for the interface and the table of
policies. Importing ``_link``, ``_disjoint`` and ``_node`` (below) registers them all in `POLICIES`."""

from graphstore.buffer.policies import _disjoint, _node  # noqa: F401  (importing them registers their policies)
from graphstore.buffer.policies._link import beta_order, default_logical_partitions
from graphstore.buffer.policies.base import (
    POLICIES,
    BufferState,
    EpochPlan,
    Policy,
    get_policy,
    plan_epoch,
    policy_names,
    register_policy,
)

__all__ = [
    "POLICIES",
    "BufferState",
    "EpochPlan",
    "Policy",
    "beta_order",
    "default_logical_partitions",
    "get_policy",
    "plan_epoch",
    "policy_names",
    "register_policy",
]
