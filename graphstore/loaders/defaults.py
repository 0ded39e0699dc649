"""Defaults derived from the data and the machine, each with the rule that chose it.

A user who gives nothing but a store should get a run that learns and a buffer that fits.
What a tuned recipe sets by hand is derived here from what the store and the process can
see, and every choice comes back as ``(value, rule)`` so that ``--help``, the printed
settings and the metrics JSON can say why:

- `feature_normalization`: PyG's ``NormalizeFeatures`` (each row divided by its L1 norm)
  for non-negative, mostly-zero rows (bag-of-words, the Planetoid and gnn-benchmark
  sources), none for signed or dense rows (embeddings, PCA'd features). Unnormalised
  bag-of-words rows have sums in the tens to hundreds; at the usual learning rates the first
  steps then saturate the model into one class (seen on Amazon Computers: megabatch
  predicting one class everywhere).
- `default_batch_size`: at most a fraction of the training split, so an epoch is several
  optimizer steps even on a 20-per-class split (with batch 1000 and 140 training nodes an
  epoch was one step, and 10 epochs ten steps).
- `memory_budget`: the bytes the buffer may take when no ``--buffer-bytes`` or
  ``--buffer-partitions`` is given: a share of what the process may still use (the cgroup's
  limit when one is set, else the kernel's MemAvailable), so a graph that fits is fully
  resident and an out-of-core scheme goes out of core only when memory says so.
- `macro_batch_bytes`: what one round of macro-batching may hold when no
  ``--macro-batch-bytes`` is given: a third of the memory budget (less a feature cache's
  bytes), since with the prefetch thread three rounds are alive at once. Without it, the
  16 mini-batches of a default macro-batch hold what their fanouts make them, gigabytes
  of rows on a large graph, whatever the memory.
- `link_prediction_defaults`: the embedding width and the negatives of a link predictor.
  A knowledge graph learnt as embeddings alone (several relation types, no encoder) gets
  what WN18RR's DistMult needs to reach its published MRR, close to 1-vs-all training
  (many uniform negatives shared by the batch, an N3 penalty, a wide table); other graphs,
  and any run with a GNN encoder (whose every negative is encoded), MariusGNN's setting
  (d=100, 256 x 8 negatives, half by degree).

The thresholds were chosen on validation accuracy across Cora, CiteSeer and Amazon Photo
(docs/benchmarks.md, "Defaults against the tuned recipes"), never on test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphstore._memory import available_memory, cgroup_headroom, mem_available
from graphstore.errors import ConfigError
from graphstore.layout.dtypes import decode
from graphstore.layout.store import Store

__all__ = [
    "BATCH_STEPS",
    "MAX_BATCH_SIZE",
    "MEMORY_SHARE",
    "STEP_SHARE",
    "MemoryBudget",
    "default_batch_size",
    "feature_normalization",
    "link_prediction_defaults",
    "macro_batch_bytes",
    "memory_budget",
    "step_share",
]

MAX_BATCH_SIZE = 1000
"""The default batch size for a large training split (DGL's and PyG's examples use 512-1024)."""
MIN_BATCH_SIZE = 64
"""No default batch is smaller (unless the split is): gradient noise grows as batches shrink.
64 against 32 (on 140/120/160-node training splits, 3 seeds, model selection on validation):
validation accuracy 0.801/0.717/0.928 against 0.788/0.710/0.926 on Cora/CiteSeer/Amazon
Photo (docs/benchmarks.md, "Defaults against the tuned recipes")."""
BATCH_STEPS = 8
"""A default epoch is at least this many optimizer steps: the batch is at most
``1 / BATCH_STEPS`` of the training split."""
SAMPLE_ROWS = 4096
"""Feature rows inspected to choose the normalisation (spread over the partitions)."""
SPARSE_FRACTION = 0.5
"""Rows are bag-of-words-like when at least this share of their entries is zero."""
KG_NEGATIVES = 2048
"""Uniform negatives shared by a knowledge-graph batch (one chunk): near 1-vs-all on WN18RR's
40,943 entities (LibKGE's and Lacroix et al.'s training), 0.43 filtered MRR against 0.38 with
MariusGNN's 256 x 8 half by degree (docs/benchmarks.md, "Link prediction")."""
KG_REGULARIZATION = 0.1
"""N3 weight (Lacroix et al.) with `KG_NEGATIVES`: without it the wide table over-fits."""
KG_WIDE_DIM, NARROW_DIM = 400, 100
"""Embedding widths: a knowledge graph's table is `KG_WIDE_DIM` wide when it fits in
`KG_TABLE_SHARE` of the memory budget, else `NARROW_DIM` (MariusGNN's width for Freebase86m
and for its other graphs)."""
KG_TABLE_SHARE = 0.25
"""The share of the memory budget a wide table (value and Adagrad state) may take: the
minibatch scheme holds it whole, and evaluation reads every row."""
MEMORY_SHARE = 0.5
"""The buffer's share of the memory the process may still use; the rest is the model, the
batches in flight, evaluation and the page cache the reads go through."""
STEP_SHARE = 8
"""An out-of-core scheme's byte budget keeps ``1/STEP_SHARE`` of itself for the batch being
trained (its input rows, activations, gradients and optimizer step), the buffer the rest."""
MACRO_ROUNDS_HELD = 3
"""Rounds of macro-batching alive at once with the prefetch thread: the one training, the
one handed over, and the one being read (`graphstore.loaders.macro`)."""


def default_batch_size(num_train: int) -> tuple[int, str]:
    """Targets per training batch for a split of ``num_train`` nodes, and the rule."""
    batch = min(MAX_BATCH_SIZE, max(MIN_BATCH_SIZE, math.ceil(num_train / BATCH_STEPS)))
    batch = max(1, min(batch, num_train)) if num_train else MIN_BATCH_SIZE
    return batch, (f"min({MAX_BATCH_SIZE}, max({MIN_BATCH_SIZE}, train split {num_train} / {BATCH_STEPS})): "
                   f"several steps an epoch even on a small split")


def _size(n: int) -> str:
    """Bytes as a rule states them: GiB from 1 GiB up, else MiB."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def link_prediction_defaults(store: Store, *, encoder: str, budget_bytes: int) -> dict[str, tuple[object, str]]:
    """``{option: (value, rule)}`` for ``embedding_dim``, ``negatives``, ``num_chunks``,
    ``degree_fraction`` and ``regularization`` of a link predictor on ``store``.

    ``encoder``: the trainer's ``--encoder`` (``"none"``: embeddings alone);
    ``budget_bytes``: the memory the run may use (its ``--buffer-bytes``, else `memory_budget`).
    """
    n = store.num_nodes
    if store.num_relations > 1 and encoder == "none":
        wide = n * KG_WIDE_DIM * 2 * 4 <= KG_TABLE_SHARE * budget_bytes
        dim = KG_WIDE_DIM if wide else NARROW_DIM
        why = (f"a knowledge graph ({store.num_relations} relation types) learnt as embeddings: close to "
               "1-vs-all training (WN18RR's recipe)")
        negatives = min(KG_NEGATIVES, max(2, n))
        return {
            "embedding_dim": (dim, f"{dim}: {n:,} x {KG_WIDE_DIM} values and Adagrad state "
                                   f"{'fit' if wide else 'do not fit'} in {KG_TABLE_SHARE:g} of the memory budget "
                                   f"({_size(budget_bytes)})"),
            "negatives": (negatives, f"{negatives} uniform negatives in one chunk: {why}"),
            "num_chunks": (1, f"1: {why}"),
            "degree_fraction": (0.0, f"0: {why}"),
            "regularization": (KG_REGULARIZATION, f"N3 {KG_REGULARIZATION:g}: {why}"),
        }
    why = "MariusGNN's setting" + (" (an encoder encodes every negative)" if encoder != "none" else
                                   " (fewer than two relation types)")
    return {
        "embedding_dim": (NARROW_DIM, f"{NARROW_DIM}: {why}"),
        "negatives": (256, f"256 per chunk: {why}"),
        "num_chunks": (8, f"8: {why}"),
        "degree_fraction": (0.5, f"half by degree: {why}"),
        "regularization": (0.0, f"none: {why}"),
    }


def feature_normalization(store: Store) -> tuple[str, str]:
    """``("row", rule)`` for non-negative, mostly-zero feature rows, else ``("none", rule)``,
    from up to `SAMPLE_ROWS` rows read from the store (evenly spaced partitions, verified
    reads)."""
    if not store.manifest.has_features:
        return "none", "the store has no features"
    p = store.num_partitions
    per = max(1, SAMPLE_ROWS // p)
    picks = np.unique(np.linspace(0, p - 1, num=min(p, SAMPLE_ROWS)).round().astype(np.int64))
    blocks = []
    for k in picks.tolist():
        start, stop = store.partition_range(int(k))
        rows = store.read_rows("nodes/features", start, min(stop, start + per))
        blocks.append(decode(rows, store.manifest.feature_dtype))  # bfloat16: its stored bits as numbers
        if sum(b.shape[0] for b in blocks) >= SAMPLE_ROWS:
            break
    rows = np.concatenate(blocks) if blocks else np.zeros((0, store.feature_dim), np.float32)
    if rows.size == 0:
        return "none", "no feature rows to inspect"
    negative = bool((rows < 0).any())
    zeros = float((rows == 0).mean())
    seen = f"{rows.shape[0]} sampled rows: {'some' if negative else 'no'} negative entries, {zeros:.0%} zeros"
    if not negative and zeros >= SPARSE_FRACTION:
        return "row", f"row: non-negative and at least {SPARSE_FRACTION:.0%} zeros, like bag-of-words ({seen})"
    return "none", f"none: rows are signed or dense ({seen})"


# ---------------------------------------------------------------------- memory

@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """The bytes a buffer may take by default, and where they came from."""

    bytes: int
    """The budget: `MEMORY_SHARE` of ``available``."""
    available: int
    """What the process may still allocate: the cgroup limit less what the group uses
    (page cache aside), or MemAvailable, whichever is less."""
    source: str
    """``"cgroup"`` or ``"MemAvailable"``."""

    @property
    def rule(self) -> str:
        return (f"{MEMORY_SHARE:g} of the memory this process may still use ({self.available / 2**20:.0f} MiB, "
                f"{self.source})")


def step_share(budget_bytes: int) -> tuple[int, int, str]:
    """An out-of-core scheme's byte budget ``B`` split between the buffer and the batch in
    training: ``(B - S, S, rule)`` with ``S = B // STEP_SHARE``, so that the buffer, the
    batches made ahead and the batch being trained together stay within ``B``. A batch
    whose estimated step exceeds ``S`` is split into micro-batches; the model's own state
    (`graphstore.nn.model_state_bytes`) comes on top.

    Examples
    --------
    >>> step_share(800)[:2]
    (700, 100)
    """
    step = int(budget_bytes) // STEP_SHARE
    rule = (f"{step} bytes, 1/{STEP_SHARE} of the {int(budget_bytes)}-byte budget, for the batch in training "
            "(its input rows and activations; the model's parameters, gradients and optimizer state, a fixed "
            "cost, come on top); a batch estimated above it is split into micro-batches")
    return int(budget_bytes) - step, step, rule


def macro_batch_bytes(budget: MemoryBudget, cache_bytes: int = 0) -> tuple[int, str]:
    """The default bound on a macro-batch's samples and a round's rows, and its rule: what
    the memory budget leaves after a feature cache of ``cache_bytes``, shared by the
    `MACRO_ROUNDS_HELD` rounds alive at once (at least 1 byte: a round then holds one
    mini-batch, the least it can).

    Examples
    --------
    >>> macro_batch_bytes(MemoryBudget(bytes=600, available=1200, source="cgroup"))[0]
    200
    >>> macro_batch_bytes(MemoryBudget(bytes=600, available=1200, source="cgroup"), cache_bytes=600)[0]
    1
    """
    rest = max(0, budget.bytes - int(cache_bytes))
    figure = max(1, rest // MACRO_ROUNDS_HELD)
    after = f" less the feature cache's {int(cache_bytes)}" if cache_bytes else ""
    return figure, (f"{figure} bytes: {budget.rule}{after}, over the {MACRO_ROUNDS_HELD} rounds held at once "
                    f"(the one training, the next handed over, the one being read)")


def memory_budget() -> MemoryBudget:
    """The default buffer budget (`MEMORY_SHARE` of what the process may still use).

    ``GRAPHSTORE_MEMORY_BYTES`` (``4294967296``, ``4GiB``) overrides what is read, for a
    machine whose limit the process cannot see; a value that is not a size is a one-line
    `ConfigError`."""
    available, source = available_memory()
    return MemoryBudget(int(available * MEMORY_SHARE), int(available), source)
