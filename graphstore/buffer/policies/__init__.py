"""Replacement policies as pure plans: which partitions are resident when, and what each
state trains. See `graphstore.buffer.policies.base` for the interface and the table of
policies. Importing ``_link`` and ``_node`` (below) registers them all."""

from graphstore.buffer.policies._link import beta_order, default_logical_partitions
from graphstore.buffer.policies._node import static_cache_ids
from graphstore.buffer.policies.base import (
    BufferState,
    EpochPlan,
    Policy,
    get_policy,
    plan_epoch,
    policy_names,
    register_policy,
)

__all__ = [
    "BufferState",
    "EpochPlan",
    "Policy",
    "beta_order",
    "default_logical_partitions",
    "get_policy",
    "plan_epoch",
    "policy_names",
    "register_policy",
    "static_cache_ids",
]
