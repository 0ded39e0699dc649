"""PyG: graphstore batches as PyG's sampled ``Data``, and a store as a PyG remote backend.

Two ways in, for a model written for PyG (``torch_geometric``, the ``graphstore[pyg]`` extra):

* `to_pyg` (``batch.to_pyg()``): a batch of any graphstore loader, any scheme (mega-batch,
  disk, macro-batch...), as the ``Data`` PyG's ``NodeLoader`` yields: ``x``, ``edge_index``
  (row 0 the sources, row 1 the destinations, local ids, the targets first), ``y``,
  ``batch_size``, ``n_id`` (store ids) and ``num_sampled_nodes`` / ``num_sampled_edges``
  per hop, so ``torch_geometric.utils.trim_to_layer`` (and ``BasicGNN``'s
  ``num_sampled_nodes_per_hop``) work. Link-prediction batches (an `EdgeBatch` sampled with
  ``fanouts``) carry their positives and shared negatives in PyG's triplet names.
* The remote backend: `StoreFeatureStore` and `StoreGraphStore` are PyG's documented
  ``FeatureStore`` / ``GraphStore`` interfaces over a store, and `DenseSampler` is a PyG
  ``BaseSampler`` built on graphstore's DENSE sampler, so PyG's own ``NodeLoader`` and
  ``LinkLoader`` iterate a store without pyg-lib or torch-sparse::

      data = remote_backend(store)                         # (feature store, graph store)
      loader = NodeLoader(data, node_sampler=DenseSampler(data[1], fanouts=(10, 5)),
                          input_nodes=torch.from_numpy(store.read_node_split("train")),
                          batch_size=256, shuffle=True)
      # pairs: int64 [2, M] store ids; a remote backend's edge_label_index names the edge
      # type first (None: a store has one).
      links = LinkLoader(data, link_sampler=DenseSampler(data[1], fanouts=(10, 5)),
                         edge_label_index=(None, pairs), neg_sampling=NegativeSampling("binary"),
                         batch_size=256)

  The graph store holds the whole graph's structure in memory (a CSC over store ids, int32
  sources, as the macro-batch scheme's) and the labels; the feature store reads each
  batch's feature rows from the store by their ~4 KiB verified blocks (`Store.read_row_set`).
  ``num_workers > 0`` works: each forked worker reads with new threads (the store's
  readers reset their pools in a fork), and `DenseSampler` draws a stream per worker and epoch.

PyG's sampled ``Data`` and a DENSE hold the same sample in mirrored orders
(`graphstore.interop.hops`), so a PyG model gives, weight for weight, what the matching
`graphstore.nn` layer gives (``tests/interop`` checks SAGE and GAT to 1e-5). PyG's
``GATConv`` removes a node's own edge before adding its self loop; graphstore's keeps both,
so the two differ only on a sample that contains a self loop (a store converted with
``--keep-self-loops``).

This module imports without torch_geometric; its entry points then raise `ImportError`
naming the extra.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from graphstore.buffer.resident import ResidentGraph, build_structure_graph
from graphstore.buffer.slots import rows_as_tensor
from graphstore.errors import ConfigError, ReadOnlyStoreError
from graphstore.interop.hops import HopOrder, check_hops, targets_first
from graphstore.layout.store import Store
from graphstore.sample.base import Batch, CSCGraph, SampleGraph, lookup
from graphstore.sample.dense import sample_dense

try:
    from torch_geometric.data import Data, EdgeAttr, FeatureStore, GraphStore, TensorAttr
    from torch_geometric.data.graph_store import EdgeLayout
    from torch_geometric.sampler import (
        BaseSampler,
        EdgeSamplerInput,
        NegativeSampling,
        NodeSamplerInput,
        SamplerOutput,
    )
except ImportError as exc:  # the optional extra: the module still imports (doctests, docs)
    _MISSING: ImportError | None = exc
    # Placeholders so the classes below can be defined; their constructors refuse to run.
    FeatureStore = GraphStore = BaseSampler = object
else:
    _MISSING = None

__all__ = ["DenseSampler", "StoreFeatureStore", "StoreGraphStore", "remote_backend", "to_pyg"]


def _require() -> None:
    if _MISSING is not None:
        raise ImportError(f"graphstore.interop.pyg needs torch_geometric ({_MISSING}); "
                          f"install it with pip install 'graphstore[pyg]'")


# --------------------------------------------------------------------------- batches


def to_pyg(batch: Any) -> Data:
    """``batch`` as the ``torch_geometric.data.Data`` of PyG's sampled training.

    Parameters
    ----------
    batch : Batch, NodeBatch or EdgeBatch
        A node batch (any `graphstore.sample.Batch`), or a link-prediction `EdgeBatch`
        sampled with ``fanouts``.

    Returns
    -------
    Data
        ``x`` float [N, D]: input rows, targets first, then hop 1, hop 2, ...;
        ``edge_index`` int64 [2, E]: ``(source, destination)`` local rows, the edges into
        the targets first, then those into hop 1, ... (each sampled node's in-edges
        together); ``num_sampled_nodes`` (L + 1 ints) and ``num_sampled_edges`` (L ints);
        ``batch_size``: T, the targets being rows ``[0, T)``; ``n_id`` int64 [N]: store ids
        when the batch knows its graph; ``y``: a node batch's labels, int64 [N] when the
        batch knows its graph's labels (so ``y[:batch_size]`` are the targets', as PyG's
        loaders give), else the targets' [T]; ``edge_type`` int64 [E] when the batch has
        relations. An `EdgeBatch`'s targets are its distinct endpoints and negatives
        (``batch.nodes``), and it adds ``src_index``, ``dst_pos_index`` [B] (the positive
        pairs, rows of ``x``), ``dst_neg_index`` [B, K] (each positive's chunk of shared
        negatives), ``edge_label_index`` [2, B] (the positives again, PyG's binary name) and
        ``rel`` [B] (the positives' relations); ``y`` when the store has node labels.

    Raises
    ------
    ConfigError
        An `EdgeBatch` sampled without ``fanouts``, one whose graph has no features, or
        something that is not a batch.
    ImportError
        torch_geometric is not installed.
    """
    _require()
    if isinstance(batch, Batch):
        return _node_data(batch)
    if hasattr(batch, "negatives") and hasattr(batch, "index"):
        return _edge_data(batch)
    raise ConfigError(f"to_pyg needs a graphstore Batch, NodeBatch or EdgeBatch (got {type(batch).__name__})")


def _sampled_data(x: torch.Tensor, order: HopOrder, local_ids: torch.Tensor, graph: Any,
                  edge_types: torch.Tensor | None) -> Data:
    """The fields every sampled batch has: rows, edges, hop counts, store ids, relations."""
    data = Data(x=x, edge_index=torch.stack([order.src, order.dst]))
    data.num_sampled_nodes = list(order.num_sampled_nodes)
    data.num_sampled_edges = list(order.num_sampled_edges)
    data.batch_size = order.num_sampled_nodes[0]
    if graph is not None:
        data.n_id = lookup(graph.node_ids, local_ids)
    if edge_types is not None:
        data.edge_type = edge_types.index_select(0, order.edge_order)
    return data


def _node_data(batch: Batch) -> Data:
    check_hops(batch, "to_pyg")
    order = targets_first(batch.dense)
    local_ids = batch.dense.node_ids.index_select(0, order.node_order)
    graph = getattr(batch, "graph", None)
    edge_types = getattr(batch, "edge_types", None) if graph is not None else None
    data = _sampled_data(batch.features.index_select(0, order.node_order), order, local_ids, graph, edge_types)
    if graph is not None and graph.labels is not None:
        # Every sampled node's label, as PyG's loaders give; the batch's own are the first T.
        data.y = lookup(graph.labels, local_ids).long()
    elif batch.labels is not None:
        data.y = batch.labels
    return data


def _edge_data(batch: Any) -> Data:
    if batch.dense is None:
        raise ConfigError("to_pyg needs an EdgeBatch sampled with fanouts (EdgeLoader(..., fanouts=...)): "
                          "without them the batch has no neighbourhood to hand over")
    graph = batch.graph
    if graph.features is None:
        raise ConfigError("to_pyg needs feature rows; this EdgeBatch's graph has none (a store without "
                          "features trains learnable embeddings: use batch.graph.embeddings)")
    order = targets_first(batch.dense)
    local_ids = batch.dense.node_ids.index_select(0, order.node_order)
    edge_types = None
    if graph.rel is not None and batch.dense.edge_ids is not None:
        edge_types = graph.rel.index_select(0, batch.dense.edge_ids)
    data = _sampled_data(graph.features.index_select(0, local_ids), order, local_ids, graph, edge_types)
    if graph.labels is not None:  # as PyG's LinkLoader gives every node attribute
        data.y = lookup(graph.labels, local_ids).long()
    # The DENSE's targets are batch.nodes in order, and targets come first: a position in
    # batch.nodes (what batch.index holds) is already a row of x.
    index = batch.index
    data.src_index = index.src
    data.dst_pos_index = index.dst
    data.dst_neg_index = index.neg.index_select(0, batch.negatives.chunk_of)
    data.edge_label_index = torch.stack([index.src, index.dst])
    data.rel = batch.rel
    return data


# --------------------------------------------------------------------------- remote backend


class StoreFeatureStore(FeatureStore):
    """PyG's ``FeatureStore`` over a store, read-only: ``x`` (features, float [N, D]) and
    ``y`` (labels, int64 [N], -1 unlabeled), group name None (a homogeneous graph).

    ``x`` rows are read from the store at each request, by the ~4 KiB blocks that hold them,
    each block checked against its checksum (`Store.read_row_set`); ``y`` is read once
    (4 bytes a node) and served from memory.

    Parameters
    ----------
    store : Store
        An open store with features.
    labels : int64 tensor [N], optional
        Labels already in memory (`StoreGraphStore.labels` shares its copy); default: read.

    Raises
    ------
    ConfigError
        The store has no features.
    """

    def __init__(self, store: Store, *, labels: torch.Tensor | None = None) -> None:
        _require()
        if not store.manifest.has_features:
            raise ConfigError(f"{store.path}: a FeatureStore needs features; the store has none")
        super().__init__()
        self.store = store
        if labels is None and store.manifest.has_labels:
            labels = torch.from_numpy(store.read_rows("nodes/labels", 0, store.num_nodes).astype(np.int64))
        self.labels = labels
        """int64 [N] or None: the store's labels."""

    def _attrs(self) -> dict[str, tuple[int, ...]]:
        shapes = {"x": (self.store.num_nodes, self.store.feature_dim)}
        if self.labels is not None:
            shapes["y"] = (self.store.num_nodes,)
        return shapes

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        return [TensorAttr(group_name=None, attr_name=name) for name in self._attrs()]

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        return self._attrs().get(attr.attr_name)

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor | None:
        if attr.group_name is not None or attr.attr_name not in self._attrs():
            return None  # PyG's convention for "no such tensor": get_tensor raises KeyError
        ids = self._ids(attr.index)
        if attr.attr_name == "y":
            return self.labels if ids is None else self.labels.index_select(0, ids)
        # Rows in the stored dtype (float16, bfloat16, float32), as the loaders' batches give them.
        dtype = self.store.manifest.feature_dtype
        if ids is None:
            return rows_as_tensor(self.store.read_rows("nodes/features", 0, self.store.num_nodes), dtype)
        # read_row_set takes ascending distinct ids; a batch's n_id is neither.
        unique, inverse = torch.unique(ids, return_inverse=True)
        rows = rows_as_tensor(self.store.read_row_set("nodes/features", unique.numpy()), dtype)
        return rows.index_select(0, inverse)

    def _ids(self, index: Any) -> torch.Tensor | None:
        """The requested rows as int64 store ids, or None for all of them."""
        if index is None or (isinstance(index, slice) and index == slice(None)):
            return None
        if isinstance(index, slice):
            return torch.arange(self.store.num_nodes)[index]
        ids = torch.as_tensor(index).reshape(-1)
        if ids.dtype == torch.bool:
            return ids.nonzero().view(-1)
        ids = ids.to(torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.store.num_nodes):
            raise ConfigError(f"feature rows must be store ids in [0, {self.store.num_nodes}) "
                              f"(got [{int(ids.min())}, {int(ids.max())}])")
        return ids

    def _put_tensor(self, tensor: Any, attr: TensorAttr) -> bool:
        raise ReadOnlyStoreError(f"{self.store.path}: StoreFeatureStore is read-only; features change by "
                                 f"converting the store again")

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise ReadOnlyStoreError(f"{self.store.path}: StoreFeatureStore is read-only; nothing to remove")

    def __repr__(self) -> str:
        return f"StoreFeatureStore({self.store.path}, attrs={sorted(self._attrs())})"


class StoreGraphStore(GraphStore):
    """PyG's ``GraphStore`` over a store: the whole graph's edges, in memory, read-only.

    Holds the structure the macro-batch scheme holds (`build_structure_graph`: a CSC over
    store ids built one destination partition at a time, every read verified) and the
    labels; one edge type (``None``), served as CSC, COO or CSR (PyG's layouts; CSC needs
    no conversion).

    Attributes
    ----------
    graph : ResidentGraph
        The structure (a `SampleGraph`: `DenseSampler` samples it directly).
    """

    def __init__(self, store: Store) -> None:
        _require()
        super().__init__()
        self.store = store
        self.graph: ResidentGraph = build_structure_graph(store)[0]
        n = store.num_nodes
        self._attr = EdgeAttr(edge_type=None, layout=EdgeLayout.CSC, size=(n, n))

    @property
    def labels(self) -> torch.Tensor | None:
        """int64 [N] labels by store id (-1 unlabeled), or None."""
        return None if self.graph.labels is None else self.graph.labels.long()

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        return [self._attr]

    def _get_edge_index(self, edge_attr: EdgeAttr) -> tuple[torch.Tensor, torch.Tensor] | None:
        if edge_attr.edge_type is not None:
            return None
        # PyG's CSC is (row = source of each edge, colptr = destination pointers).
        indices, indptr = self.graph.indices.long(), self.graph.indptr.long()
        if edge_attr.layout == EdgeLayout.CSC:
            return indices, indptr
        dst = torch.repeat_interleave(torch.arange(self.store.num_nodes), indptr.diff())
        if edge_attr.layout == EdgeLayout.COO:
            return indices, dst
        order = torch.sort(indices, stable=True).indices  # CSR: grouped by source
        rowptr = torch.zeros(self.store.num_nodes + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(indices, minlength=self.store.num_nodes), 0, out=rowptr[1:])
        return rowptr, dst.index_select(0, order)

    def _put_edge_index(self, edge_index: Any, edge_attr: EdgeAttr) -> bool:
        raise ReadOnlyStoreError(f"{self.store.path}: StoreGraphStore is read-only; edges change by "
                                 f"converting the store again")

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        raise ReadOnlyStoreError(f"{self.store.path}: StoreGraphStore is read-only; nothing to remove")

    def __repr__(self) -> str:
        return f"StoreGraphStore({self.store.path}, {self.store.num_nodes} nodes, {self.graph.num_edges} edges)"


def remote_backend(store: Store) -> tuple[StoreFeatureStore, StoreGraphStore]:
    """``(feature_store, graph_store)`` over ``store``, the ``data`` PyG's loaders take; the
    labels are read once and shared."""
    graph_store = StoreGraphStore(store)
    return StoreFeatureStore(store, labels=graph_store.labels), graph_store


class DenseSampler(BaseSampler):
    """A PyG ``BaseSampler`` that draws with graphstore's DENSE sampler.

    ``fanouts[0]`` is the hop nearest the seeds (PyG's ``num_neighbors`` order too); -1 takes
    every neighbour. Each node is sampled once, uniformly without replacement, where it is
    first reached (PyG's ``NeighborSampler`` with ``disjoint=False``, ``replace=False``).
    The output is in PyG's order (seeds first; `graphstore.interop.hops`).

    Parameters
    ----------
    graph_store : GraphStore
        A `StoreGraphStore` (sampled in place), or any PyG graph store with one edge type
        (its CSC is taken once).
    fanouts : sequence of int
        Neighbours per hop, nearest first.
    seed : int
        Seeds the sampler's generator. In the loading process, one stream over the epochs.
        In a DataLoader worker (``num_workers > 0``), a stream per worker and epoch: the seed
        mixed with the worker's torch seed, which the DataLoader draws at each epoch from
        its ``generator`` (or torch's global one) and offsets by the worker id, as it seeds
        PyG's own samplers. The same seed, loader generator (or ``torch.manual_seed``) and
        number of workers give the same run.

    Raises
    ------
    ConfigError
        A bad fanout; seeds that are repeated or out of range (when sampling).
    """

    def __init__(self, graph_store: Any, fanouts: tuple[int, ...] | list[int], *, seed: int = 0) -> None:
        _require()
        if isinstance(graph_store, StoreGraphStore):
            self.graph: SampleGraph = graph_store.graph
        else:
            row, colptr, _ = graph_store.csc()
            if isinstance(row, dict):
                raise ConfigError(f"DenseSampler samples one edge type; the graph store has {len(row)}")
            self.graph = CSCGraph(int(colptr.numel()) - 1, colptr.long(), row.long())
        self.fanouts = tuple(fanouts)
        if not self.fanouts or any(isinstance(f, bool) or not isinstance(f, int) or f < -1 for f in self.fanouts):
            raise ConfigError(f"fanouts must be ints >= -1, nearest hop first (got {fanouts!r})")
        self.seed = int(seed)
        self._generator = torch.Generator().manual_seed(self.seed)
        self._worker: tuple[int, int] | None = None
        """(pid, torch seed) of the DataLoader worker the generator was seeded in, if any."""

    @property
    def generator(self) -> torch.Generator:
        """This process's stream: a worker's copy of the sampler starts with the loader
        process's generator state, which every worker and every epoch's new workers would
        replay, so a worker seeds its own the first time it draws."""
        info = get_worker_info()
        if info is not None and self._worker != (os.getpid(), info.seed):
            self._worker = (os.getpid(), info.seed)
            mixed = np.random.SeedSequence([self.seed & 0xFFFFFFFFFFFFFFFF, info.seed]).generate_state(1, np.uint64)
            self._generator = torch.Generator().manual_seed(int(mixed[0]) & ((1 << 63) - 1))
        return self._generator

    def _sample(self, seeds: torch.Tensor) -> SamplerOutput:
        dense = sample_dense(self.graph, seeds, self.fanouts, generator=self.generator)
        order = targets_first(dense)
        # The graph's local ids are the graph store's node ids (store ids for a StoreGraphStore).
        return SamplerOutput(node=dense.node_ids.index_select(0, order.node_order), row=order.src, col=order.dst,
                             edge=None, num_sampled_nodes=list(order.num_sampled_nodes),
                             num_sampled_edges=list(order.num_sampled_edges))

    def sample_from_nodes(self, index: NodeSamplerInput, **kwargs: Any) -> SamplerOutput:
        if index.time is not None:
            raise ConfigError("DenseSampler does not sample in time (got seed times)")
        out = self._sample(index.node.long())
        out.metadata = (index.input_id, None)
        return out

    def sample_from_edges(self, index: EdgeSamplerInput,
                          neg_sampling: NegativeSampling | None = None) -> SamplerOutput:
        """The neighbourhood of the seed edges' endpoints and of their negatives.

        ``neg_sampling`` as PyG's: ``"binary"`` draws ``amount`` times as many random
        (source, destination) pairs, labelled 0 (``edge_label_index``, ``edge_label``);
        ``"triplet"`` draws ``amount`` random destinations per positive (``src_index``,
        ``dst_pos_index``, ``dst_neg_index``). Negatives are drawn uniformly (or by the
        configuration's weights) from the sampler's generator; false negatives are kept.
        """
        if index.time is not None:
            raise ConfigError("DenseSampler does not sample in time (got seed times)")
        src, dst = index.row.long(), index.col.long()
        num_pos, num_nodes = src.numel(), self.graph.num_nodes
        label = index.label
        if neg_sampling is not None and neg_sampling.is_binary():
            num_neg = math.ceil(num_pos * neg_sampling.amount)
            src = torch.cat([src, self._negatives(neg_sampling, num_neg, "src", num_nodes)])
            dst = torch.cat([dst, self._negatives(neg_sampling, num_neg, "dst", num_nodes)])
            positive = torch.ones(num_pos) if label is None else label
            label = torch.cat([positive, positive.new_zeros((num_neg,) + tuple(positive.shape[1:]))])
        triplet = neg_sampling is not None and neg_sampling.is_triplet()
        ends = [src, dst]
        if triplet:
            ends.append(self._negatives(neg_sampling, num_pos * int(neg_sampling.amount), "dst", num_nodes))
        # Every distinct endpoint once: they are the DENSE's targets, so rows [0, U) of the
        # output, and inverse maps each endpoint to its row.
        seeds, inverse = torch.unique(torch.cat(ends), return_inverse=True)
        out = self._sample(seeds)
        if triplet:
            neg = inverse[2 * num_pos:].view(num_pos, -1)
            out.metadata = (index.input_id, inverse[:num_pos], inverse[num_pos:2 * num_pos],
                            neg.squeeze(-1) if neg.shape[1] == 1 else neg, None)
        else:
            out.metadata = (index.input_id, inverse.view(2, -1), label, None)
        return out

    def _negatives(self, neg_sampling: NegativeSampling, count: int, end: str, num_nodes: int) -> torch.Tensor:
        weight = neg_sampling.src_weight if end == "src" else neg_sampling.dst_weight
        if weight is None:
            return torch.randint(num_nodes, (count,), generator=self.generator)
        return torch.multinomial(weight, count, replacement=True, generator=self.generator)
