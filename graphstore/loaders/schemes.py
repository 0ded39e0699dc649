"""Training schemes: what a loader decides before the first epoch, by name.

A scheme is the defaults an experienced user of DGL/PyG, HierBatching, MariusGNN or Betty
expects for "train this way": the buffer policy, how many partitions are resident, how
often each state's targets train, whether HierBatching's static cache is on, and whether
each batch is split into micro-batches. The loaders compose the same stages for every
scheme (`graphstore.loaders.stages`); a scheme only picks their settings.

=========== ============== ================================================================
scheme      policy         resident
=========== ============== ================================================================
minibatch   in_memory      the whole graph (read once, kept across epochs): the reference
megabatch   hierbatching   a quarter of the partitions (at least 2) + the static cache: the
                           store's hub group (1 % highest-degree nodes' rows resident, their
                           edges re-read per state); each mega-batch trained once (``reuse=1``;
                           HierBatching trains it twice, ``--reuse 2``: see below)
disk        sequential /   half the partitions (MariusGNN); node classification uses
            dispersed /    ``sequential`` when every training partition fits, else
            comet / beta   ``dispersed`` (about one state per batch of a small training split,
                           `plan_dispersed`); link prediction ``comet`` (l = ceil(p / floor(c/2)),
                           MariusGNN's 2p/c, so two logical partitions are resident)
microbatch  in_memory      as minibatch, each batch split into micro-batches (Betty) whose
                           gradients accumulate into the batch's update
macrobatch  in_memory      the whole graph's structure and labels; feature rows read from
                           the store once per macro-batch of B mini-batches (BatchGNN)
=========== ============== ================================================================

The trainers evaluate megabatch and disk exactly by default (`Scheme.evaluation`): every
layer over the whole graph with all neighbours, out of core, instead of over the neighbours
resident with each target, which biases accuracy (docs/benchmarks.md, "Exact inference out
of core"); it costs about what the resident evaluation does on Cora and CiteSeer.

Megabatch departs from HierBatching in training each mega-batch once. The paper trains it
twice to halve the reads per step, which pays where the reads are the epoch; on the CPU,
where the step is, a second pass doubles the epoch for less than twice the progress: measured
to minibatch's best validation accuracy minus a point (5 seeds, 8 of 32 partitions), reuse 1
took 3.00x / 1.02x / 1.35x minibatch's training time on Cora / CiteSeer / Amazon Photo
against reuse 2's 3.12x / 0.73x (3 of 5 seeds reaching it; 4 of 5 at reuse 1) / 1.44x, and
0.87x against 2.05x on the out-of-core benchmark's 2.1M-node store under its 1 GiB cap
(docs/benchmarks.md, "Time to accuracy"). A GPU, where the loader is the epoch, may favour 2;
the device check measures both.

A new scheme is one `Scheme` registered in `SCHEMES` (here or in the user's own module)::

    SCHEMES.register("eighth", Scheme(name="eighth", tasks=("node",), summary="...",
                                       policy=lambda task, p, c, parts: "hierbatching",
                                       capacity=lambda p: max(2, p // 8), reuse=1))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from graphstore.registry import Registry

__all__ = ["SCHEMES", "Scheme", "TASK_LINK", "TASK_NODE"]

TASK_NODE = "node"
TASK_LINK = "link"

PolicyRule = Callable[[str, int, "int | None", Sequence[int]], str]
"""``(task, num_partitions, capacity given or None, training partitions) -> policy name``."""


@dataclass(frozen=True, slots=True)
class Scheme:
    """A registered scheme: the loader's defaults for it."""

    name: str
    """Registry key."""
    tasks: tuple[str, ...]
    """``"node"`` and/or ``"link"``: the loaders that accept it."""
    summary: str
    """One line for ``--help``."""
    policy: PolicyRule
    """The default buffer policy (a user's ``policy=`` overrides it)."""
    capacity: Callable[[int], int]
    """``num_partitions -> partitions resident`` when neither a capacity nor a byte budget
    is given."""
    reuse: int = 1
    """Default passes over each state's targets."""
    whole_graph: bool = False
    """Every partition resident whatever the capacity or budget asked (the in-memory
    reference): the buffer flags do not apply."""
    static_cache: bool = False
    """HierBatching's static cache on by default, when the default policy is used."""
    split_batches: bool = False
    """Every batch split into micro-batches (needs ``micro_batches`` or a budget)."""
    resident_features: bool = True
    """The buffer holds the resident partitions' feature rows; False: only the structure
    and labels, the rows are read per macro-batch (``macrobatch``)."""
    evaluation: str | None = None
    """The trainers' default evaluation of node classification: ``"exact"`` (every layer
    over the whole graph out of core, `graphstore.inference`) or None (the scheme itself)."""


SCHEMES: Registry[Scheme] = Registry("scheme")
"""Registered schemes by name (`Scheme`)."""


def _disk_policy(task: str, p: int, capacity: int | None, train_partitions: Sequence[int]) -> str:
    if task == TASK_LINK:
        return "comet"
    # MariusGNN's sequential keeps every training partition resident; it fits only when
    # they are at most the capacity. Otherwise spread them over states.
    c = capacity or max(2, math.ceil(p / 2))
    return "sequential" if len(train_partitions) <= c else "dispersed"


SCHEMES.register("minibatch", Scheme(
    name="minibatch", tasks=(TASK_NODE, TASK_LINK), summary="the whole graph in memory (the reference)",
    policy=lambda task, p, c, parts: "in_memory", capacity=lambda p: p, whole_graph=True))
SCHEMES.register("megabatch", Scheme(
    name="megabatch", tasks=(TASK_NODE,),
    summary="HierBatching: a quarter of the partitions + static cache of hubs, each mega-batch once",
    policy=lambda task, p, c, parts: "hierbatching", capacity=lambda p: max(2, math.ceil(p / 4)),
    static_cache=True, evaluation="exact"))
SCHEMES.register("disk", Scheme(
    name="disk", tasks=(TASK_NODE, TASK_LINK),
    summary="MariusGNN: half the partitions (sequential/dispersed; comet for links)",
    policy=_disk_policy, capacity=lambda p: max(2, math.ceil(p / 2)), evaluation="exact"))
SCHEMES.register("microbatch", Scheme(
    name="microbatch", tasks=(TASK_NODE,),
    summary="Betty: minibatch with every batch split into micro-batches",
    policy=lambda task, p, c, parts: "in_memory", capacity=lambda p: p, whole_graph=True, split_batches=True))
SCHEMES.register("macrobatch", Scheme(
    name="macrobatch", tasks=(TASK_NODE,),
    summary="BatchGNN: the whole structure in memory, features read once per macro-batch of B mini-batches",
    policy=lambda task, p, c, parts: "in_memory", capacity=lambda p: p, whole_graph=True,
    resident_features=False))
