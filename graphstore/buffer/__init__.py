"""The partition buffer: which partitions are in memory when (policies), and later the
buffer that holds them. See ARCHITECTURE.md, "The buffer manager".

>>> from graphstore.buffer import plan_epoch
>>> plan = plan_epoch("comet", num_partitions=16, capacity=4, epoch=0, seed=0)
>>> plan.options["num_logical_partitions"], all(len(s) <= 4 for s in plan.states)
(8, True)
"""

from graphstore.buffer.policies import (
    BufferState,
    EpochPlan,
    Policy,
    get_policy,
    plan_epoch,
    policy_names,
    register_policy,
    static_cache_ids,
)

__all__ = [
    "BufferState",
    "EpochPlan",
    "Policy",
    "get_policy",
    "plan_epoch",
    "policy_names",
    "register_policy",
    "static_cache_ids",
]
