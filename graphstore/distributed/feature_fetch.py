"""BatchGNN's distributed feature fetch (section 3): each rank holds in memory only the
feature rows of the partitions it owns, and a macro-batch round's union of input rows is
fetched from their owners in one collective round.

Ownership: rank ``r`` of ``N`` owns a contiguous block of the store's partitions
(`rank_partitions`, as the full-batch ranks do), so a contiguous range of store ids; it reads
those rows once, through the store's verified reads, and serves every other rank's
requests from memory.

Seeds: the loader gives each rank the targets of its own block (`NodeLoader`'s default
``seed_assignment="local"``, by this fetch's ``bounds``), so most rows of its rounds are
its own; every rank still holds the whole graph's structure and samples across it.

A round (`PartitionedFetch.__call__`, from `MacroBatchGather`, once per round of its
macro-batches): the sorted union is split by owner; ranks exchange request counts (with an
"active" flag), then the ids, and each owner returns its rows: three ``all_to_all_single``
calls on host tensors, over gloo (NCCL has the same call, for device tensors). The rows a
rank owns go through the same call (a copy to itself) and are counted local. So the
collective rounds of an epoch are its macro-batch rounds: B = all, one; B = 1, one per
mini-batch.

Padding: ranks can have different numbers of rounds (uneven batch shares, macro-batches
cut short by ``macro_batch_bytes``), and every collective needs every rank. After its last
round a rank keeps issuing empty rounds flagged inactive (`finish`), serving the others'
requests, until a round in which every rank is inactive: all ranks see that same round, so
all stop together, with no count known in advance.

Process group: the fetch runs in the macro-batch loader's prefetch thread while DDP
all-reduces gradients in the main thread. Two threads issuing collectives on one group can
interleave differently on different ranks and deadlock (or pair the wrong messages), so the
fetch has its own group (`dist.new_group`, created by every rank in the same order).
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from graphstore.distributed.rank_graph import rank_partitions
from graphstore.errors import ConfigError
from graphstore.layout.dtypes import decode
from graphstore.layout.store import Store

__all__ = ["PLACEMENTS", "PartitionedFetch"]

PLACEMENTS = ("store", "partitioned")
"""``--feature-placement``: every rank reads its rows from the store, or from their owners."""


class PartitionedFetch:
    """The `FeatureFetch` interface (``dim``, ``feature_dim``, ``__call__(ids, stats)``,
    ``stats`` a `FetchStats`) over the ranks' memories; give it to
    ``NodeLoader(..., feature_fetch=)``.

    Parameters
    ----------
    store : Store
        Read once, for this rank's block of partitions.
    aggregated : str, optional
        Also hold each owned row's stored neighbour aggregate (rows ``[x_v | agg_v]``).
    timeout_s : float
        The fetch group's collective timeout.

    Every rank must construct it (the group is created collectively), after
    `init_process_group`, and use it in the same order of epochs.
    """

    def __init__(self, store: Store, aggregated: str | None = None, *, timeout_s: float = 300.0) -> None:
        if not dist.is_initialized():
            raise ConfigError("the partitioned feature placement needs torch.distributed: run under torchrun")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        # The arrays `graphstore.loaders.macro.FeatureFetch` reads (the loader checks that
        # the widths agree).
        self.arrays = store.input_arrays(aggregated)
        self.feature_dim = store.feature_dim
        self.dim = store.feature_dim * len(self.arrays)
        size, n = store.partition_size, store.num_nodes
        # First store id of every rank's block, and the end: rank r owns [bounds[r], bounds[r + 1]).
        blocks = rank_partitions(store.num_partitions, self.world_size)
        self.bounds = np.array([min(a * size, n) for a, _ in blocks] + [n], dtype=np.int64)
        self.lo, self.hi = int(self.bounds[self.rank]), int(self.bounds[self.rank + 1])
        # float32 numbers (bfloat16's stored bits decoded, not converted as integers).
        dtypes = {"nodes/features": store.manifest.feature_dtype}  # the aggregates are float32
        parts = [decode(store.read_rows(name, self.lo, self.hi), dtypes.get(name, "float32")) for name in self.arrays]
        rows = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        self.rows = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32))
        """[hi - lo, dim]: the owned rows, the only feature rows this rank holds."""
        # Why a group of its own: see the module's docstring (threads and DDP). gloo even
        # when DDP runs on NCCL: the rows live in host memory and the loader yields host batches.
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))

    @property
    def rows_held(self) -> int:
        return int(self.rows.shape[0])

    def __call__(self, ids: np.ndarray, stats) -> np.ndarray:
        """[len(ids), dim]: the rows of ``ids`` (ascending, distinct), from their owners."""
        stats.exchanges += 1
        rows, _ = self._exchange(np.asarray(ids, dtype=np.int64), True, stats)
        stats.rows_fetched += int(ids.size)
        return rows

    def finish(self, stats) -> None:
        """Empty rounds until every rank has finished its epoch (see the module docstring)."""
        while True:
            stats.padding_exchanges += 1
            _, any_active = self._exchange(np.empty(0, dtype=np.int64), False, stats)
            if not any_active:
                return

    def _exchange(self, ids: np.ndarray, active: bool, stats) -> tuple[np.ndarray, bool]:
        n, me = self.world_size, self.rank
        if ids.size and (ids[0] < 0 or ids[-1] >= self.bounds[-1]):
            raise ConfigError(f"feature ids must be store ids in [0, {int(self.bounds[-1])})")
        # ids are sorted and each rank's block is contiguous: the requests to rank r are one slice.
        cuts = np.searchsorted(ids, self.bounds)
        send = np.diff(cuts)
        header = torch.from_numpy(np.stack([send, np.full(n, int(active))], axis=1).astype(np.int64))
        got = torch.empty_like(header)
        dist.all_to_all_single(got, header, group=self.group)
        recv, flags = got[:, 0].tolist(), got[:, 1]
        any_active = bool(flags.any())
        if not any_active:  # every rank padding: nobody asked for anything
            return np.empty((0, self.dim), dtype=np.float32), False
        requests = torch.empty(sum(recv), dtype=torch.int64)
        dist.all_to_all_single(requests, torch.from_numpy(ids), output_split_sizes=recv,
                               input_split_sizes=send.tolist(), group=self.group)
        served = self.rows.index_select(0, requests - self.lo)
        out = torch.empty((int(ids.size), self.dim), dtype=torch.float32)
        dist.all_to_all_single(out, served, output_split_sizes=send.tolist(), input_split_sizes=recv,
                               group=self.group)
        mine = int(send[me])
        stats.rows_local += mine
        stats.rows_remote += int(ids.size) - mine
        others_asked = sum(recv) - recv[me]
        stats.bytes_sent += 8 * 2 * (n - 1) + 8 * (int(ids.size) - mine) + 4 * self.dim * others_asked
        return out.numpy(), any_active
