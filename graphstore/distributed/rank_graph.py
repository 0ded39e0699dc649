"""What one rank holds of the graph in full-batch training: its block of partitions, the
in-edges of its nodes grouped by the rank that owns their source, and which of its rows
every other rank fetches.

Rank ``r`` of ``N`` owns a contiguous run of the store's partitions (`rank_partitions`),
hence a contiguous range of store ids: with METIS partitions, most in-edges come from
the rank's own block. Its in-edges are the buckets ``(i, j)`` with ``j`` its own: those from
rank ``s``'s block form the `Piece` of ``s``, whose ``src`` indexes the rows rank ``r``
fetches from ``s`` (each needed row once, in ascending order), so what crosses the wire is
exactly the rows the edges read.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np
import torch

from graphstore.buffer.slots import feature_tensor_dtype, host_array, rows_as_tensor
from graphstore.distributed.comm import exchange_index_lists
from graphstore.errors import ConfigError
from graphstore.nn import LayerView

__all__ = ["BlockData", "Piece", "RankGraph", "load_block_data", "load_rank_graph", "rank_partitions"]


@dataclass(frozen=True, slots=True)
class Piece:
    """In-edges of a rank's nodes whose sources lie in one rank's block."""

    source_rank: int
    """The rank owning the sources."""
    src: torch.Tensor
    """int64 [E_p]: the rank's own piece: local row of the source; another's: position in the
    rows fetched from it (`RankGraph.fetch_rows`)."""
    dst: torch.Tensor
    """int64 [E_p]: local row of the destination."""
    rel: torch.Tensor | None
    """int64 [E_p] relation of each edge, or None for an untyped store."""
    num_rows: int
    """Source rows the piece reads from: the block's size (own piece) or the rows fetched."""


@dataclass(frozen=True, slots=True)
class RankGraph:
    """One rank's share of the graph (structure only)."""

    rank: int
    world_size: int
    block_starts: tuple[int, ...]
    """[world_size + 1] first store id of each rank's block (the last: num_nodes)."""
    partition_starts: tuple[int, ...]
    """Store ids where the rank's partitions start, and its block's end (dropout masks are
    drawn per partition)."""
    first_partition: int
    """Store partition of ``partition_starts[0]``."""
    pieces: tuple[Piece, ...]
    """[world_size] in-edges by source rank; ``pieces[rank]`` is the block's own."""
    fetch_rows: tuple[torch.Tensor, ...]
    """[world_size] int64: rows of rank ``s``'s block this rank reads (``pieces[s].src``
    indexes them); empty for itself."""
    send_rows: tuple[torch.Tensor, ...]
    """[world_size] int64: rows of this block rank ``t`` reads (its ``fetch_rows[rank]``)."""
    in_degree: torch.Tensor
    """int64 [n]: in-degree of each node of the block in the whole graph."""
    num_relations: int
    """Relation types (0 for an untyped store)."""

    @property
    def node_range(self) -> tuple[int, int]:
        return self.block_starts[self.rank], self.block_starts[self.rank + 1]

    @property
    def num_nodes(self) -> int:
        """Nodes of this rank's block."""
        return self.block_starts[self.rank + 1] - self.block_starts[self.rank]

    @property
    def halo_rows(self) -> int:
        """Rows fetched from every other rank together."""
        return sum(int(f.numel()) for f in self.fetch_rows)

    def relation_counts(self) -> torch.Tensor:
        """int64 [n, R]: in-edges per (node, relation), RGCN's mean per relation."""
        r = max(self.num_relations, 1)
        counts = torch.zeros(self.num_nodes * r, dtype=torch.int64, device=self.in_degree.device)
        for p in self.pieces:
            rel = p.rel if p.rel is not None else torch.zeros_like(p.dst)
            counts += torch.bincount(p.dst * r + rel, minlength=counts.numel())
        return counts.view(self.num_nodes, r)

    def to(self, device: torch.device | str) -> RankGraph:
        """The same graph with its index tensors on ``device``."""
        pieces = tuple(dataclasses.replace(p, src=p.src.to(device), dst=p.dst.to(device),
                                           rel=None if p.rel is None else p.rel.to(device)) for p in self.pieces)
        return dataclasses.replace(self, pieces=pieces, fetch_rows=tuple(f.to(device) for f in self.fetch_rows),
                                   send_rows=tuple(s.to(device) for s in self.send_rows),
                                   in_degree=self.in_degree.to(device))

    def halo_view(self) -> tuple[LayerView, torch.Tensor | None]:
        """Domain parallelism's layer graph: the block's rows then every fetched row (by
        source rank) as inputs, the block's rows as outputs, edges grouped by destination;
        with each edge's relation (None when untyped)."""
        n = self.num_nodes
        offset, srcs, dsts, rels = n, [], [], []
        for p in self.pieces:
            if p.source_rank == self.rank:
                srcs.append(p.src)
            else:
                srcs.append(p.src + offset)
                offset += p.num_rows
            dsts.append(p.dst)
            rels.append(p.rel if p.rel is not None else torch.zeros_like(p.dst))
        src, dst, rel = torch.cat(srcs), torch.cat(dsts), torch.cat(rels)
        order = torch.argsort(dst, stable=True)
        view = LayerView(offset, n, slice(0, n), src[order], torch.bincount(dst, minlength=n), dst[order])
        return view, (rel[order] if self.num_relations else None)


def rank_partitions(num_partitions: int, world_size: int) -> list[tuple[int, int]]:
    """``[first, stop)`` partitions of every rank: contiguous runs whose lengths differ by
    at most one.

    Raises
    ------
    ConfigError
        With more ranks than partitions (a rank would hold no node).
    """
    if world_size > num_partitions:
        raise ConfigError(f"{world_size} ranks need at least {world_size} partitions (the store has "
                          f"{num_partitions}); convert with --partitions {world_size} or more")
    bounds = np.linspace(0, num_partitions, world_size + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(bounds)]


def load_rank_graph(store, rank: int, world_size: int, *, device: torch.device | str = "cpu") -> RankGraph:
    """Read rank ``rank``'s in-edges from ``store`` (buckets ``(i, j)`` for all ``i`` and its
    own ``j``) and agree with the other ranks on the rows each fetches; the graph's tensors
    on ``device``. Collective: every rank calls it."""
    runs = rank_partitions(store.num_partitions, world_size)
    block_starts = tuple(store.partition_range(a)[0] for a, _ in runs) + (store.num_nodes,)
    first, stop = runs[rank]
    lo, hi = block_starts[rank], block_starts[rank + 1]
    srcs, dsts, rels = [], [], []
    for j in range(first, stop):
        for i in range(store.num_partitions):
            src, dst, rel = store.read_bucket(i, j)
            srcs.append(src.astype(np.int64))
            dsts.append(dst.astype(np.int64) - lo)
            if rel is not None:
                rels.append(rel.astype(np.int64))
    src = torch.from_numpy(np.concatenate(srcs))
    dst = torch.from_numpy(np.concatenate(dsts))
    rel = torch.from_numpy(np.concatenate(rels)) if rels else None
    owner = torch.searchsorted(torch.tensor(block_starts), src, right=True) - 1
    pieces, fetch = [], []
    for s in range(world_size):
        mask = owner == s
        p_src, p_dst = src[mask] - block_starts[s], dst[mask]
        p_rel = rel[mask] if rel is not None else None
        if s == rank:
            pieces.append(Piece(s, p_src, p_dst, p_rel, hi - lo))
            fetch.append(torch.empty(0, dtype=torch.int64))
        else:
            rows, position = torch.unique(p_src, sorted=True, return_inverse=True)
            pieces.append(Piece(s, position, p_dst, p_rel, int(rows.numel())))
            fetch.append(rows)
    send = exchange_index_lists(fetch, device) if world_size > 1 else [torch.empty(0, dtype=torch.int64)]
    starts = tuple(store.partition_range(k)[0] for k in range(first, stop)) + (hi,)
    graph = RankGraph(rank, world_size, block_starts, starts, first, tuple(pieces), tuple(fetch), tuple(send),
                      torch.bincount(dst, minlength=hi - lo), store.num_relations)
    return graph.to(device)


@dataclass(frozen=True, slots=True)
class BlockData:
    """A block's node rows: features, labels and split membership."""

    features: torch.Tensor
    """float [n, D] in the dtype asked for (None asked: as stored, float16 or bfloat16 rows
    staying half, to be widened on the device after the copy)."""
    labels: torch.Tensor
    """int64 [n]; -1 = unlabeled."""
    splits: dict[str, torch.Tensor]
    """split name -> int64 local rows of the block in that split (ascending)."""


def load_block_data(store, graph: RankGraph, *, dtype: torch.dtype | None = torch.float32,
                    splits: tuple[str, ...] = ("train", "valid", "test")) -> BlockData:
    """Features, labels and node splits of ``graph``'s block (one verified read each).

    The features go into one tensor allocated once, a partition at a time: the peak is the
    block's features plus at most one partition's (when the store's dtype is not ``dtype``).
    ``dtype=None`` keeps the stored dtype."""
    k0, k1 = graph.first_partition, graph.first_partition + len(graph.partition_starts) - 1
    lo, hi = graph.node_range
    x = _read_block_features(store, range(k0, k1), lo, hi, dtype)
    y = torch.from_numpy(np.concatenate([store.read_labels(k) for k in range(k0, k1)]).astype(np.int64))
    rows = {}
    for name in splits:
        if name in store.split_names:
            ids = store.read_node_split(name).astype(np.int64)
            rows[name] = torch.from_numpy(ids[(ids >= lo) & (ids < hi)] - lo)
    return BlockData(x, y, rows)


def _read_block_features(store, partitions: range, lo: int, hi: int,
                         dtype: torch.dtype | None) -> torch.Tensor:
    """float [hi - lo, D] of ``dtype`` (None: the stored one): each partition read straight
    into its rows when the store holds ``dtype``, else read and converted into them (no
    concatenated copy)."""
    name = store.manifest.feature_dtype
    stored = feature_tensor_dtype(name)
    dtype = stored if dtype is None else dtype
    x = torch.empty((hi - lo, store.feature_dim), dtype=dtype)
    rows = host_array(x) if stored == dtype else None  # bfloat16: its uint16 bits, as the chunks hold them
    for k in partitions:
        a, b = store.partition_range(k)
        if rows is not None:
            store.read_rows("nodes/features", a, b, out=rows[a - lo:b - lo])
        else:
            x[a - lo:b - lo].copy_(rows_as_tensor(store.read_features(k), name))
    return x
