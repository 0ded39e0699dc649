"""`EdgeLoader`: batches of training edges with negatives, for link prediction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphstore.errors import ConfigError
from graphstore.layout.embeddings import EmbeddingTable
from graphstore.layout.store import Store
from graphstore.loaders.base import BufferedLoader
from graphstore.loaders.settings import EdgeLoaderSettings
from graphstore.loaders.stages import (
    EdgeNeighbourSampling,
    EdgeTargets,
    Negatives,
    Stage,
    batches_of,
    bucket_edge_counts,
)

__all__ = ["EdgeLoader"]


class EdgeLoader(BufferedLoader):
    """Batches of training edges (the store's edges) with negatives, for link prediction.

    The training edges are the store's edges; each state trains the buckets the plan
    assigns to it (COMET/BETA: every bucket exactly once an epoch), shuffled, in batches of
    ``batch_size`` positives with ``negatives`` shared per chunk (MariusGNN's
    ``num_chunks``, ``degree_fraction``), drawn from the state's resident nodes. An epoch
    is the stages ``BufferWalk -> EdgeTargets -> Negatives [-> EdgeNeighbourSampling]``.

    With ``embeddings`` (an `EmbeddingTable`), the resident rows are
    ``batch.graph.embeddings`` and every update to them is written back to the store.
    With ``fanouts``, each batch also carries a DENSE over its distinct endpoints and
    negatives, for a GNN encoder.
    """

    task = "link"

    def __init__(self, store: Store, *, batch_size: int, negatives: int, num_chunks: int = 1,
                 degree_fraction: float = 0.0, scheme: str = "minibatch", policy: str | None = None,
                 capacity: int | None = None, buffer_bytes: int | None = None,
                 embeddings: EmbeddingTable | None = None, fanouts: Sequence[int] | None = None,
                 num_logical_partitions: int | None = None, seed: int = 0, prefetch: bool = True) -> None:
        if int(batch_size) < 1 or int(negatives) < 0 or int(num_chunks) < 1:
            raise ConfigError("batch_size and num_chunks must be >= 1 and negatives >= 0")
        self.batch_size, self.negatives, self.num_chunks = int(batch_size), int(negatives), int(num_chunks)
        self.degree_fraction = float(degree_fraction)
        self.table = embeddings
        self.fanouts = None if fanouts is None else tuple(fanouts)
        options = {}
        if num_logical_partitions is not None:
            if (policy or "comet") != "comet" or scheme != "disk":
                raise ConfigError("num_logical_partitions is COMET's setting (scheme 'disk', policy 'comet')")
            options["num_logical_partitions"] = num_logical_partitions
        # Without it, COMET picks l from the capacity the budget settles on
        # (`default_logical_partitions`: two logical partitions always fit), so every
        # capacity the budget search tries is a valid plan.
        super().__init__(store, scheme=scheme, policy=policy, capacity=capacity, buffer_bytes=buffer_bytes,
                         seed=seed, prefetch=prefetch, embedding_dim=0 if embeddings is None else embeddings.dim,
                         policy_options=options, embeddings=embeddings)
        # COMET's l, chosen or derived (the same every epoch), is part of what was decided.
        comet = self.plan(0).options if self.policy == "comet" else {}
        self.settings = EdgeLoaderSettings(
            **self._common_settings(), batch_size=self.batch_size, negatives=self.negatives,
            num_chunks=self.num_chunks, degree_fraction=self.degree_fraction, fanouts=self.fanouts,
            embedding_dim=self.embedding_dim, **comet)

    def _plan_options(self) -> dict[str, Any]:
        return dict(self.options, task="link") if self.policy == "in_memory" else dict(self.options)

    def stages(self) -> list[Stage]:
        """The stages after the buffer walk, in order."""
        stages: list[Stage] = [
            EdgeTargets(self.batch_size),
            Negatives(negatives=self.negatives, num_chunks=self.num_chunks, degree_fraction=self.degree_fraction),
        ]
        return stages + ([EdgeNeighbourSampling(self.fanouts)] if self.fanouts is not None else [])

    def num_batches(self, epoch: int) -> int:
        """Batches of ``epoch``: each state's assigned buckets' edges, cut into batches
        (COMET regroups every epoch, so the count varies a little)."""
        p = self.store.num_partitions
        sizes = np.diff(self.store.bucket_offsets).reshape(p, p).T  # sizes[i, j]: bucket (i, j)
        return batches_of(bucket_edge_counts(self.plan(epoch), sizes), self.batch_size)
