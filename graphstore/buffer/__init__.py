"""The partition buffer: which partitions are in memory when (`policies`, by name in
`POLICIES`), the loader that reads them ahead of training (`manager`) into slots allocated
once (`slots`) and sized from a byte budget (`budget`), HierBatching's static cache and the
choice of its nodes (`cache`), and what samplers see of them (`resident`).
See docs/architecture.md for how the buffer sits between the store and the samplers.

>>> from graphstore.buffer import plan_epoch
>>> plan = plan_epoch("comet", num_partitions=16, capacity=4, epoch=0, seed=0)
>>> plan.options["num_logical_partitions"], all(len(s) <= 4 for s in plan.states)
(8, True)
"""

from graphstore.buffer.cache import StaticCache, static_cache_ids
from graphstore.buffer.manager import BufferManager, BufferStats, LoadedState, planned_read_bytes
from graphstore.buffer.policies import (
    POLICIES,
    BufferState,
    EpochPlan,
    Policy,
    get_policy,
    plan_epoch,
    policy_names,
    register_policy,
)
from graphstore.buffer.resident import ResidentGraph, build_resident_graph
from graphstore.buffer.slots import BufferMemory, assign_slots, slots_needed

__all__ = [
    "POLICIES",
    "BufferManager",
    "BufferMemory",
    "StaticCache",
    "assign_slots",
    "slots_needed",
    "BufferState",
    "BufferStats",
    "EpochPlan",
    "LoadedState",
    "Policy",
    "ResidentGraph",
    "build_resident_graph",
    "get_policy",
    "plan_epoch",
    "planned_read_bytes",
    "policy_names",
    "register_policy",
    "static_cache_ids",
]
