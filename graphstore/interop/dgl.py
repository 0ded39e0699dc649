"""DGL: graphstore batches as the message-flow-graph blocks DGL models consume.

`to_dgl` (``batch.to_dgl()``) turns a batch of any graphstore loader into the list of
``dgl.create_block`` blocks DGL's ``DataLoader`` yields, ``blocks[0]`` the input layer: block
``k``'s destination nodes are the first of its source nodes (DGL's convention), its edges
the samples of those destinations, ``blocks[0].srcdata["feat"]`` the input rows,
``blocks[-1].dstdata["label"]`` the targets' labels and every block's ``srcdata`` /
``dstdata[dgl.NID]`` the nodes' store ids. A stack of ``dgl.nn.SAGEConv`` (or ``GATConv``)
layers runs on them unchanged (the ``graphstore[dgl]`` extra: dgl 1.1.3 on torch 2.13, which
needs int64 ids, which these blocks have).

The blocks hold the DENSE's sample in DGL's order (`graphstore.interop.hops`), so DGL's
``SAGEConv(aggregator_type="mean")`` gives, weight for weight, what graphstore's `SAGEConv`
gives. DGL's ``GATConv`` attends over a node's in-edges only, while graphstore's also
attends over the node itself; ``to_dgl(self_loops=True)`` adds that edge to every
destination, and then the two agree (``tests/interop`` checks both to 1e-5).

This module imports without dgl; `to_dgl` then raises `ImportError` naming the extra.
"""

from __future__ import annotations

from typing import Any

import torch

from graphstore.errors import ConfigError
from graphstore.interop.hops import HopOrder, check_hops, targets_first
from graphstore.sample.base import Batch, lookup

try:
    import dgl
except ImportError as exc:  # the optional extra: the module still imports (doctests, docs)
    _MISSING: ImportError | None = exc
else:
    _MISSING = None

__all__ = ["to_dgl"]


def _require() -> None:
    if _MISSING is not None:
        raise ImportError(f"graphstore.interop.dgl needs dgl ({_MISSING}); install it with "
                          f"pip install 'graphstore[dgl]'")


def to_dgl(batch: Any, *, self_loops: bool = False) -> list[Any] | tuple[Any, Any, list[Any]]:
    """``batch`` as DGL blocks (a node batch) or as DGL's link-prediction triple (an `EdgeBatch`).

    Parameters
    ----------
    batch : Batch, NodeBatch or EdgeBatch
        A node batch, or a link-prediction `EdgeBatch` sampled with ``fanouts``.
    self_loops : bool
        Add an edge from every destination node to itself in every block (what DGL's
        ``GATConv`` needs to attend over a node itself, as graphstore's `GATConv` does; not
        for ``SAGEConv``, whose mean it would change). Refused with relation types (a self
        loop has none).

    Returns
    -------
    blocks : list of DGLBlock
        For a node batch: one block per layer, ``blocks[0]`` the input layer; int64 ids.
        ``srcdata["feat"]`` of ``blocks[0]``: float [N, D]; ``dstdata["label"]`` of
        ``blocks[-1]``: int64 [T] (when the batch has labels); ``edata["etype"]`` int64 when
        the batch has relation types; ``srcdata`` / ``dstdata[dgl.NID]``: store ids when the
        batch knows its graph.
    (pos_graph, neg_graph, blocks) : for an `EdgeBatch`
        DGL's link-prediction triple: ``pos_graph`` has the B positive edges and
        ``neg_graph`` B * K edges (each positive's source to each of its chunk's shared
        negatives), both over the U nodes of ``blocks[-1]``'s destinations (``batch.nodes``).

    Raises
    ------
    ConfigError
        An `EdgeBatch` without ``fanouts`` or without features, ``self_loops`` with relation
        types, or something that is not a batch.
    ImportError
        dgl is not installed.
    """
    _require()
    if isinstance(batch, Batch):
        check_hops(batch, "to_dgl")
        graph = getattr(batch, "graph", None)
        edge_types = getattr(batch, "edge_types", None) if graph is not None else None
        order = targets_first(batch.dense)
        blocks = _blocks(order, batch.dense.node_ids, graph, edge_types, self_loops)
        blocks[0].srcdata["feat"] = batch.features.index_select(0, order.node_order)
        if batch.labels is not None:
            blocks[-1].dstdata["label"] = batch.labels
        return blocks
    if hasattr(batch, "negatives") and hasattr(batch, "index"):
        return _edge_triple(batch, self_loops)
    raise ConfigError(f"to_dgl needs a graphstore Batch, NodeBatch or EdgeBatch (got {type(batch).__name__})")


def _blocks(order: HopOrder, node_ids: torch.Tensor, graph: Any, edge_types: torch.Tensor | None,
            self_loops: bool) -> list[Any]:
    """One block per layer, cut from the targets-first order by prefixes."""
    if self_loops and edge_types is not None:
        raise ConfigError("self_loops=True with relation types: a self loop has no relation; "
                          "add the self term in the model instead")
    store_ids = None
    if graph is not None:
        store_ids = lookup(graph.node_ids, node_ids.index_select(0, order.node_order))
    if edge_types is not None:
        edge_types = edge_types.index_select(0, order.edge_order)
    blocks = []
    for k in range(len(order.num_sampled_edges)):
        num_src, num_dst, num_edges = order.layer_sizes(k)
        src, dst = order.src[:num_edges], order.dst[:num_edges]
        if self_loops:
            loop = torch.arange(num_dst, dtype=torch.int64, device=src.device)
            src, dst = torch.cat([src, loop]), torch.cat([dst, loop])
        # int64 always: dgl 1.1.3 on torch 2.13 fails with int32 ids (COOToCSR, gspmm).
        block = dgl.create_block((src, dst), num_src_nodes=num_src, num_dst_nodes=num_dst, idtype=torch.int64,
                                 device=src.device)
        if store_ids is not None:
            block.srcdata[dgl.NID] = store_ids[:num_src]
            block.dstdata[dgl.NID] = store_ids[:num_dst]
        if edge_types is not None:
            block.edata["etype"] = edge_types[:num_edges]
        blocks.append(block)
    return blocks


def _edge_triple(batch: Any, self_loops: bool) -> tuple[Any, Any, list[Any]]:
    if batch.dense is None:
        raise ConfigError("to_dgl needs an EdgeBatch sampled with fanouts (EdgeLoader(..., fanouts=...)): "
                          "without them the batch has no neighbourhood to hand over")
    graph = batch.graph
    if graph.features is None:
        raise ConfigError("to_dgl needs feature rows; this EdgeBatch's graph has none (a store without "
                          "features trains learnable embeddings: use batch.graph.embeddings)")
    order = targets_first(batch.dense)
    edge_types = None
    if graph.rel is not None and batch.dense.edge_ids is not None:
        edge_types = graph.rel.index_select(0, batch.dense.edge_ids)
    blocks = _blocks(order, batch.dense.node_ids, graph, edge_types, self_loops)
    blocks[0].srcdata["feat"] = graph.features.index_select(0, batch.dense.node_ids.index_select(0, order.node_order))
    # batch.nodes are the DENSE's targets in order, the first destinations of blocks[-1]:
    # batch.index's positions are already its node ids.
    index, num_nodes = batch.index, order.num_sampled_nodes[0]
    pos_graph = dgl.graph((index.src, index.dst), num_nodes=num_nodes, idtype=torch.int64)
    pos_graph.edata["rel"] = batch.rel
    neg = index.neg.index_select(0, batch.negatives.chunk_of)                      # [B, K]
    neg_src = index.src.repeat_interleave(neg.shape[1])
    neg_graph = dgl.graph((neg_src, neg.reshape(-1)), num_nodes=num_nodes, idtype=torch.int64)
    return pos_graph, neg_graph, blocks
