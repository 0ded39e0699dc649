"""Conformance checks for what users register: buffer policies, partitioners, source readers,
loader schemes.

Each module holds the invariants every implementation of one interface must keep, as plain
functions that raise `AssertionError` naming the implementation, its input and the broken
invariant; they run under any test framework (graphstore's own tests run every registered
policy, partitioner and reader through them):

- `graphstore.testing.policies`: `check_policy`, `check_policy_grid` (and `check_plan` for
  one `EpochPlan`);
- `graphstore.testing.partitioners`: `check_partitioner`, `check_partitioner_grid`;
- `graphstore.testing.readers`: `check_reader` (read, check, convert, verify) and
  `check_source_graph`;
- `graphstore.testing.schemes`: `check_node_scheme`, `check_link_scheme` (a scheme's
  epochs on a small store: residency, rows, coverage, batch counts, replay).

A new policy, in one module plus its registration, with its test::

    from graphstore.buffer import EpochPlan, register_policy
    from graphstore.testing.policies import check_policy_grid

    @register_policy("round_robin", task="node", options=("train_partitions",))
    def plan_round_robin(*, num_partitions, capacity, epoch, seed, rng, train_partitions=None):
        ...  # return an EpochPlan

    def test_round_robin():
        assert check_policy_grid("round_robin") > 0

A partitioner (``@register_partitioner("mine")``) is tested with
``check_partitioner_grid("mine")``, a reader (``register_reader("myformat", read_mine)``)
with ``check_reader("myformat", a_sample_source, work_dir=tmp_path)``.
"""

from graphstore.testing.partitioners import check_partitioner, check_partitioner_grid
from graphstore.testing.policies import check_plan, check_policy, check_policy_grid
from graphstore.testing.readers import check_reader, check_source_graph
from graphstore.testing.schemes import check_link_scheme, check_node_scheme

__all__ = [
    "check_link_scheme",
    "check_node_scheme",
    "check_partitioner",
    "check_partitioner_grid",
    "check_plan",
    "check_policy",
    "check_policy_grid",
    "check_reader",
    "check_source_graph",
]
