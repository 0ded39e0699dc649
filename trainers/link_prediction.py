"""Train a link predictor (knowledge-graph embeddings, optionally with a GNN encoder) on a
graphstore store, in memory or out of core.

    [torchrun --nproc-per-node N] trainers/link_prediction.py --store S.gs --model distmult|complex|transe|mlp
        [--encoder none|sage|gat|rgcn] --scheme minibatch|disk --policy comet|beta|disjoint
        [--embedding-dim d] [--negatives N --num-chunks K --degree-fraction f]
        [--loss softmax|logistic|margin] [--corrupt both|dst|pair] [--regularization W]
        [--embedding-optimizer adagrad|adam] [--decoder-layers L --decoder-hidden H]
        --eval filtered|unfiltered|ogb [--embeddings] [--fanouts 10,5]
        --batch-size B [--epochs 200] [--patience 5] [--eval-every N] --lr 0.1 --seed S
        --metrics-out M.json --checkpoint-dir D [--resume] [--config C.toml]

Defaults from the data (printed, and recorded with their rules in the metrics'
``config.derived``; `graphstore.loaders.defaults.link_prediction_defaults`). A knowledge
graph learnt as embeddings alone (two or more relation types, ``--encoder none``) trains
close to 1-vs-all: 2048 uniform negatives in one chunk shared by the batch, an N3 penalty of
0.1, d=400 when the table (values and Adagrad state) fits in a quarter of the memory budget
(else 100). Other graphs, and every run with an encoder, get MariusGNN's setting: d=100,
256 negatives in each of 8 chunks, half drawn by degree, no penalty. The disk scheme's
buffer comes from memory, as node classification's does (``--buffer-partitions`` or
``--buffer-bytes`` to force it out of core).

Representations. A store without features (or with ``--embeddings``, or ``--encoder
none``, which has nothing else to learn) gets learnable node embeddings in the store
(``embeddings/params``: value and Adagrad state per row, `EmbeddingTable`). A fresh run
(re)initialises them from ``--seed``; they travel through the buffer (`EdgeLoader`), the
trainer updates the resident rows in place with sparse Adagrad (MariusGNN's optimizer for
embeddings: ``acc += g*g; value -= lr * g / (sqrt(acc) + eps)``, only rows a batch
touched), and the buffer writes them back when it evicts a partition and at the end of
each epoch. Relation embeddings and encoder weights are ordinary parameters
(``--optimizer adagrad|adam``, dense). With an encoder, each batch's DENSE over its
endpoints and negatives is encoded from the embedding rows (their gradients go to the
sparse update) or from the store's features. ``--embedding-optimizer adam`` (minibatch
scheme only) updates the touched rows with Adam instead, as OGB's baselines train their
``nn.Embedding``; the table's state slot then holds Adam's second moment and the first
moment stays in memory (saved with checkpoints).

Data parallel: ``torchrun --nproc-per-node N trainers/link_prediction.py ...`` (gloo on CPU,
NCCL with ``--device cuda``) trains with `DistributedDataParallel`, ``--batch-size`` per
rank; a step trains one batch of every rank with the mean loss over their union
(`graphstore.distributed.data_parallel`). The minibatch scheme gives each rank every N-th
batch and, with learnable embeddings, a copy of the whole table on every rank: each step's
rows and gradients are all-gathered and applied on every copy, rank 0 writes back. The disk
scheme with learnable embeddings runs the ``disjoint`` plan (rounds of partition-disjoint
states, one per rank; `graphstore.buffer.policies._disjoint`) so that each partition's
rows are held, updated and written back by one rank at a time, the ranks meeting at a
barrier between rounds; the store must be on a filesystem every rank shares (checked).
With the store's features it divides COMET's/BETA's states in blocks. Evaluation ranks a
share of the positives per rank and gathers the ranks; rank 0 alone prints and writes the
metrics and checkpoints; ``--resume`` continues exactly (the world size is recorded).

Loss: MariusGNN's — each positive against its chunk's shared negatives at both ends
(``--loss softmax``, or ``logistic``/``margin``), plus an optional N3 penalty
(``--regularization``). ``--corrupt dst`` replaces only the destination; ``--corrupt pair``
scores negative edges whose both ends are random (OGB's ogbl-ddi recipe, with
``--negatives 2 --num-chunks B``: each positive its own random edge). Many uniform
negatives in one chunk (``--negatives 2048 --num-chunks 1 --degree-fraction 0``) approach
1-vs-all training (LibKGE, Lacroix et al.), which is what WN18RR's DistMult needs.
``--model mlp`` is OGB's link predictor, an MLP on ``s * r * o`` (``--decoder-layers``,
``--decoder-hidden``, dropout ``--dropout``); it scores given pairs
and few negatives (its ranking against every node is N times an MLP, so use it with
``--eval ogb``). Relation embeddings start ~ N(0, 1) (``--relation-init normal``)
rather than at the decoders' all-ones identity: with all-ones relations DistMult scores
``(h, r, h)`` as ``|h|^2``, sampled negatives almost never contain ``h`` itself, and full
ranking then puts ``h`` above the true tail (on WN18RR: 98 % of test queries, MRR 0.14
instead of 0.38 after 10 epochs).

Model selection. Training logs and records validation only: evaluated every
``--eval-every`` epochs, by default whenever evaluation so far plus one more pass fits
within the training time so far, and after the last epoch. Training stops once validation
(MRR, or Hits@20 under ``ogb``) has not improved for ``--patience`` epochs; the
best-validation model is then restored, its embeddings written back into the store (each
row keeps the Adagrad state of the last epoch), and scored once on valid and test
(``final``/``best`` in the metrics, with ``selection``).

Evaluation: the representations of all nodes
are formed in memory — the embedding table read whole, or, with an encoder, one full-graph
layer-wise pass (every in-neighbour, all store edges, as reference blocks) — which suits
graphs whose N x d floats fit in memory (WN18RR, ogbl-ddi). Then:

* ``filtered`` / ``unfiltered``: each valid/test edge ranked against every node
  (`full_ranks`, pessimistic ties); filtered leaves out the other known true edges
  (train + valid + test). Knowledge graphs (stores with relations) corrupt heads and
  tails, as is standard for WN18RR/FB15k-237; other graphs the destination only (with
  known edges symmetrised for undirected graphs). Metrics: ``mrr``, ``hits@1/3/10``.
* ``ogb``: the split's shipped negatives and OGB's Hits@K rule (`ogb_hits_at_k`;
  ogbl-ddi reports Hits@20). The default when the valid split ships negatives.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

import graphstore
from graphstore.buffer import POLICIES as POLICY_REGISTRY
from graphstore.distributed import (
    all_gather_varlen,
    all_reduce_values,
    check_shared_embeddings,
    gather_rows,
    padding_loss,
    rank_and_world,
    sync_ranks,
    wrap_model,
)
from graphstore.distributed.agreement import check_ranks_agree
from graphstore.distributed.data_parallel import dropout_salt, step_targets
from graphstore.errors import ConfigError
from graphstore.inference import infer_layerwise, min_buffer_bytes
from graphstore.layout.dtypes import decode
from graphstore.layout.embeddings import EMBEDDINGS_ARRAY, EmbeddingTable
from graphstore.loaders import SCHEMES as SCHEME_REGISTRY
from graphstore.loaders import EdgeBatch, EdgeLoader, EdgeLoaderSettings
from graphstore.loaders.defaults import link_prediction_defaults, memory_budget, step_share
from graphstore.nn import DECODERS, GNN, full_ranks, link_loss, link_micro_batches, ogb_hits_at_k, ranking_metrics
from graphstore.nn.metrics import FULL_RANKS_CANDIDATE_CHUNK
from graphstore.sample.reference import Block

try:
    from trainers import common
    from trainers.options import (CommonOptions, fanout_list, non_negative_int, option, override, positive_int,
                                  unit_float)
except ImportError:  # run as a script
    import common
    from options import (CommonOptions, fanout_list, non_negative_int, option, override, positive_int,
                         unit_float)

PROG = "link_prediction.py"
# The choices of --model, --encoder, --scheme and --policy.
MODELS = tuple(sorted(DECODERS))
ENCODERS = ("none", "sage", "gat", "rgcn")
SCHEMES = SCHEME_REGISTRY.names(lambda s: "link" in s.tasks)  # the registries' choices
POLICIES = POLICY_REGISTRY.names(lambda p: p.task in ("link", "both"))
RANK_KS = (1, 3, 10)
OGB_KS = (10, 20, 50)
ADAGRAD_EPS = 1e-10


@dataclasses.dataclass(frozen=True)
class LinkPredictionOptions(CommonOptions):
    """This script's options: the common ones (a larger default --lr), then the model's,
    the negatives' and evaluation's."""

    prog: ClassVar[str] = PROG
    description: ClassVar[str] = "Train a link predictor on a graphstore store."

    lr: float = override(CommonOptions, "lr", default=0.1)
    model: str = option("distmult", choices=MODELS, help="decoder (edge scorer)")
    encoder: str = option("none", choices=ENCODERS, help="GNN encoder before the decoder")
    scheme: str = option("minibatch", choices=SCHEMES, help=SCHEME_REGISTRY.help_text(lambda s: "link" in s.tasks))
    policy: str | None = option(
        None, choices=POLICIES,
        help="buffer policy: " + POLICY_REGISTRY.help_text(lambda p: p.task in ("link", "both"))
             + " (default: the scheme's: comet for disk, in_memory for minibatch)")
    num_logical_partitions: int | None = option(
        None, type=positive_int, metavar="L", help="COMET's logical partitions (default: MariusGNN's l = 2p/c)")
    embedding_dim: int | None = option(
        None, type=positive_int, metavar="D",
        help="node representation width d (default: derived from the data: a knowledge graph learnt as embeddings, "
             "400 when its table fits "
             "a quarter of the memory budget (--buffer-bytes, else the memory this process may use), else 100; "
             "other graphs 100)")
    embeddings: bool = option(False, help="learn node embeddings even when the store has features")
    embedding_scale: float = option(1e-3, type=float,
                                    help="initial embeddings ~ scale * N(0, 1) (MariusGNN: 0.001)")
    embedding_lr: float | None = option(None, type=float, help="learning rate of the embeddings (default: as --lr)")
    embedding_optimizer: str = option(
        "adagrad", choices=("adagrad", "adam"),
        help="sparse optimizer of the embeddings: adagrad (MariusGNN; state in the store) or adam (as OGB's "
             "baselines; its first moment is kept in memory, so minibatch scheme only)")
    negatives: int | None = option(
        None, type=positive_int, metavar="K",
        help="negatives per chunk (default: derived from the data: a knowledge graph learnt as embeddings 2048, "
             "close to 1-vs-all; "
             "else 256, MariusGNN's)")
    num_chunks: int | None = option(None, type=positive_int, metavar="C",
                                    help="chunks of a batch sharing negatives (default: derived from the data: 1 "
                                         "for a knowledge graph "
                                         "learnt as embeddings, else 8)")
    degree_fraction: float | None = option(
        None, type=unit_float, metavar="F",
        help="fraction of negatives drawn by degree, the rest uniformly (default: derived from the data: 0 for a "
             "knowledge graph "
             "learnt as embeddings, else 0.5)")
    relation_init: str = option(
        "normal", choices=("ones", "normal"),
        help="relation embeddings start at the decoder's identity (ones) or ~ N(0, 1) (normal): signed "
             "relations keep DistMult/ComplEx from scoring (h, r, h) above true tails")
    loss: str = option("softmax", choices=("softmax", "logistic", "margin"))
    corrupt: str = option(
        "both", choices=("both", "dst", "pair"),
        help="ends the negatives replace: both (MariusGNN, summed), the destination only, or pair: negative "
             "edges between two random nodes, columns (2k, 2k+1) of each chunk's negatives (OGB's "
             "ogbl-ddi/collab baselines: --negatives 2 --num-chunks B, one random edge each)")
    decoder_layers: int = option(3, type=positive_int,
                                 help="--model mlp: linear layers of the MLP on s * r * o (OGB: 3)")
    decoder_hidden: int | None = option(
        None, type=positive_int,
        help="--model mlp: hidden width; its dropout is --dropout (default: the embedding dim)")
    margin: float = option(1.0, type=float, help="margin loss only")
    regularization: float | None = option(
        None, type=float, metavar="W",
        help="N3 penalty W * mean(|s|^3 + |r|^3 + |o|^3) on each batch's positives (Lacroix et al.) (default: "
             "derived from the data: 0.1 for a knowledge graph learnt as embeddings, else 0)")
    optimizer: str = option("adagrad", choices=("adagrad", "adam"),
                            help="optimizer of relation embeddings and encoder weights")
    fanouts: tuple[int, ...] = option((10, 5), type=fanout_list,
                                      help="encoder only: neighbours per hop, nearest first, one per layer")
    hidden: int | None = option(None, type=positive_int, help="encoder hidden width (default: the embedding dim)")
    dropout: float = option(0.0, type=unit_float, help="encoder (and --model mlp) dropout")
    heads: int = option(2, type=positive_int, help="GAT heads")
    eval_mode: str | None = option(
        None, flag="--eval", choices=("filtered", "unfiltered", "ogb"),
        help="ranking protocol (default: derived from the data: ogb when the valid split ships negatives, "
             "else filtered)")
    patience: int = option(
        5, type=non_negative_int, run_only=True, metavar="P",
        help="stop once validation has not improved for P epochs (0: run every epoch); the "
             "best-validation model (embeddings included) is restored and tested once at the end")
    eval_encoder: str = option(
        "memory", choices=("memory", "exact"), run_only=True,
        help="how the encoder's representation of every node is computed for ranking: memory (the whole "
             "graph at once) or exact (layer-wise out of core, within the training scheme's resident "
             "partitions: graphstore.inference); both use every neighbour")
    eval_batch_size: int = option(256, type=positive_int,
                                  help="positives ranked at once (memory: this x num_nodes scores)")

    def validate(self) -> None:
        super().validate()
        if self.corrupt == "pair" and self.negatives is not None and self.negatives % 2:
            raise ConfigError(f"--corrupt pair draws negative edges from pairs of negatives: --negatives must be "
                              f"even (got {self.negatives})")
        if self.model == "complex" and self.embedding_dim is not None and self.embedding_dim % 2:
            raise ConfigError(f"--model complex needs an even --embedding-dim (got {self.embedding_dim})")
        if (self.encoder == "gat" and (self.hidden or self.embedding_dim or 0) % self.heads
                and len(self.fanouts) > 1):
            raise ConfigError(f"--encoder gat: the hidden width must be divisible by --heads {self.heads}")


@dataclasses.dataclass(frozen=True)
class LinkPredictionConfig:
    """The run as recorded in the metrics JSON and the checkpoint, and compared on resume:
    the options with every default the store decides made explicit."""

    options: LinkPredictionOptions
    learnable_embeddings: bool
    """Whether node inputs are learnable embeddings in the store (else the store's features)."""
    learnable_embeddings_rule: str | None
    """Why, when it is not what the flags alone say (None: recorded only when set)."""
    eval: str
    """The ranking protocol (``--eval``, or the split's default)."""
    eval_corrupt: str
    """Ends replaced in ranking: both for knowledge graphs, else dst."""
    loader: EdgeLoaderSettings | None = None
    """The loader's settings, once it exists; not compared on resume."""
    world_size: int = 1
    """Data-parallel ranks (torchrun's ``WORLD_SIZE``); a resumed run needs the same."""
    derived: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The rule that chose each default the data decides (`resolve_defaults`); run-only."""

    def to_dict(self) -> dict[str, Any]:
        """The keys and values the metrics JSON's ``config`` has always had (old checkpoints
        compare equal), in the same order."""
        out = self.options.to_dict()
        del out["verbose"]
        out["store"] = str(self.options.store)
        out["learnable_embeddings"] = self.learnable_embeddings
        if self.learnable_embeddings_rule is not None:
            out["learnable_embeddings_rule"] = self.learnable_embeddings_rule
        out.update(eval=self.eval, eval_corrupt=self.eval_corrupt)
        if self.world_size != 1:  # absent from one-process records, old ones included
            out["world_size"] = self.world_size
        if self.loader is not None:
            out["loader"] = self.loader.to_dict()
        if self.derived:
            out["derived"] = dict(self.derived)
        return out


def build_parser() -> argparse.ArgumentParser:
    return LinkPredictionOptions.build_parser()


# ---------------------------------------------------------------------- embeddings

def init_embeddings(store, dim: int, *, scale: float, seed: int) -> EmbeddingTable:
    """A freshly initialised table: a new run never starts from an earlier run's embeddings.

    Values are ``scale * N(0, 1)`` from a generator seeded with (seed, partition), state 0,
    as `EmbeddingTable.create` does; an existing table of another width is replaced.
    """
    if EmbeddingTable.exists(store):
        table = EmbeddingTable.open(store)
        if table.dim != dim:
            shutil.rmtree(Path(store.path) / EMBEDDINGS_ARRAY)
        else:
            for k in range(store.num_partitions):
                start, stop = store.partition_range(k)
                rows = np.zeros((stop - start, 2, dim), np.float32)
                rng = np.random.default_rng([int(seed), k])
                rows[:, 0] = rng.standard_normal((stop - start, dim), dtype=np.float32) * np.float32(scale)
                table.write_partition(k, rows)
            return table
    return EmbeddingTable.create(store, dim, scale=scale, seed=seed)


def sparse_adagrad_(table: torch.Tensor, rows: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
    """Adagrad on ``table[rows]`` in place: ``table`` [R, 2, d] holds (value, sum of squared
    gradients) per row; ``rows`` int64 [n] distinct; ``grad`` float [n, d]. Rows not in the
    batch keep their state, which is what makes it cheap and what the store expects."""
    acc = table[rows, 1] + grad * grad
    table[rows, 1] = acc
    table[rows, 0] = table[rows, 0] - lr * grad / (acc.sqrt() + ADAGRAD_EPS)


def sparse_adam_(table: torch.Tensor, rows: torch.Tensor, grad: torch.Tensor, lr: float,
                 exp_avg: torch.Tensor, ids: torch.Tensor, step: int,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
    """Adam on ``table[rows]`` in place (PyTorch's SparseAdam: only the rows a batch
    touched, bias correction by the global ``step``, 1-based). The table's state slot holds
    the second moment (an average of ``g*g``, not Adagrad's sum); the first moment lives in
    ``exp_avg`` [num_store_nodes, d], indexed by the rows' store ids ``ids``."""
    b1, b2 = betas
    m = exp_avg[ids] * b1 + (1 - b1) * grad
    exp_avg[ids] = m
    v = table[rows, 1] * b2 + (1 - b2) * grad * grad
    table[rows, 1] = v
    denom = (v / (1 - b2 ** step)).sqrt() + eps
    table[rows, 0] = table[rows, 0] - lr * (m / (1 - b1 ** step)) / denom


# ---------------------------------------------------------------------- the model

def link_prediction_loss(decoder, s: torch.Tensor, rel: torch.Tensor, o: torch.Tensor, n: torch.Tensor,
                         chunk_of: torch.Tensor, *, corrupt: str = "both", kind: str = "softmax",
                         margin: float = 1.0) -> torch.Tensor:
    """``decoder.loss`` of positives ``(s, rel, o)`` [B, d] against the chunks' negatives
    ``n`` [C, K, d], replacing the destination (``corrupt="dst"``) or both ends; or, with
    ``corrupt="pair"``, against K/2 negative edges ``(n[c, 2k], rel, n[c, 2k+1])`` whose two
    ends are both random (OGB's negatives: a node's degree then raises its positives'
    scores without the negatives taking it back, as Hits@K on random pairs rewards).

    With one chunk per positive (``C == B``, OGB's one negative edge per positive), the
    negatives are scored as K pairs per positive: the same numbers as the chunked product,
    without padding and B batched 1 x d products.
    """
    if corrupt == "pair":
        # Negative edge k of positive i: (n[c, 2k], rel_i, n[c, 2k + 1]), c = chunk_of[i].
        if n.shape[1] % 2:
            raise ConfigError(f"corrupt pair needs an even number of negatives (got {n.shape[1]})")
        pos = decoder.score(s, rel, o)
        per = n if n.shape[0] == s.shape[0] else n.index_select(0, chunk_of)
        neg = torch.stack([decoder.score(per[:, 2 * k], rel, per[:, 2 * k + 1]) for k in range(n.shape[1] // 2)], 1)
        return link_loss(pos, neg, kind=kind, margin=margin)
    sides = ("dst", "src") if corrupt == "both" else ("dst",)
    b = s.shape[0]
    if n.shape[0] != b or b == 0:
        return decoder.loss(s, rel, o, chunk_of=chunk_of, neg_dst=n, neg_src=n if corrupt == "both" else None,
                            kind=kind, margin=margin)
    pos = decoder.score(s, rel, o)
    total = pos.new_zeros(())
    for side in sides:
        neg = torch.stack([decoder.score(s, rel, n[:, k]) if side == "dst" else decoder.score(n[:, k], rel, o)
                           for k in range(n.shape[1])], 1)
        total = total + link_loss(pos, neg, kind=kind, margin=margin)
    return total


class LinkModel(torch.nn.Module):
    """Optional GNN encoder + decoder; node inputs come from outside (embeddings or features)."""

    def __init__(self, args: LinkPredictionOptions, *, in_dim: int, num_relations: int) -> None:
        super().__init__()
        dim = args.embedding_dim
        if args.model == "mlp":  # OGB's LinkPredictor on the Hadamard product
            self.decoder = DECODERS["mlp"](dim, num_relations, hidden=args.decoder_hidden or dim,
                                           num_layers=args.decoder_layers, dropout=args.dropout)
        else:
            self.decoder = DECODERS[args.model](dim, num_relations)
        if args.relation_init == "normal" and args.model in ("distmult", "complex"):
            # With relations at all ones, score(h, r, h) = sum(h * h) is large for every h and
            # sampled negatives almost never contain h itself, so nothing pushes it down; in
            # full ranking h then outranks the true tail (on WN18RR, 98 % of test queries).
            with torch.no_grad():
                self.decoder.relations.normal_()
        self.encoder = None
        if args.encoder != "none":
            self.encoder = GNN(args.encoder, in_dim=in_dim, hidden_dim=args.hidden or dim, out_dim=dim,
                               num_layers=len(args.fanouts), dropout=args.dropout, heads=args.heads,
                               num_relations=num_relations)
        self.corrupt, self.loss_kind, self.margin = args.corrupt, args.loss, args.margin
        self.regularization = args.regularization

    def forward(self, x: torch.Tensor | None, rel: torch.Tensor, chunk_of: torch.Tensor, *,
                inverse: torch.Tensor | None = None, negatives_shape: tuple[int, ...] = (),
                dense=None, edge_type: torch.Tensor | None = None, index=None) -> torch.Tensor:
        """A batch's mean loss (plus the N3 penalty) from its input rows ``x``: without an
        encoder, ``inverse`` places each positive end and negative among them (``b`` sources,
        ``b`` destinations, then the negatives of shape ``negatives_shape``); with one, the
        encoder runs over ``dense`` and ``index`` places them. ``x=None``: a padding step's
        zero (`padding_loss`), for a data-parallel rank with no batch left."""
        if x is None:
            return padding_loss(self)
        if self.encoder is None:
            b = rel.numel()
            s, o = x[inverse[:b]], x[inverse[b:2 * b]]
            n = x[inverse[2 * b:]].view(*negatives_shape, -1)
        else:
            h = self.encoder(x, dense, edge_type=edge_type)
            s, o, n = h[index.src], h[index.dst], h[index.neg]
        loss = link_prediction_loss(self.decoder, s, rel, o, n, chunk_of, corrupt=self.corrupt,
                                    kind=self.loss_kind, margin=self.margin)
        if self.regularization:
            r = self.decoder.relations.index_select(0, rel)
            n3 = (s.abs() ** 3 + r.abs() ** 3 + o.abs() ** 3).sum(1).mean()
            loss = loss + self.regularization * n3
        return loss


def batch_loss(model: torch.nn.Module, batch: EdgeBatch, *, use_embeddings: bool, rgcn: bool,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``model``'s loss on ``batch`` (`LinkModel.forward`, or DDP around it), with the input
    rows it read: ``(loss, x, rows)``, ``rows`` local ids and ``x`` their embedding values
    (a leaf that collects their gradients) or features, in the model's dtype."""
    g, negs = batch.graph, batch.negatives
    dtype = next(model.parameters()).dtype

    def inputs(ids: torch.Tensor) -> torch.Tensor:
        if use_embeddings:
            return g.embeddings[ids, 0].to(device=device, dtype=dtype).requires_grad_(True)
        return g.features[ids].to(device).to(dtype)  # half rows cross as stored, widened on the device

    rel = batch.rel.to(device)
    chunk_of = negs.chunk_of.to(device)
    if batch.dense is None:
        rows, inverse = torch.unique(torch.cat([batch.src, batch.dst, negs.nodes.flatten()]), return_inverse=True)
        x = inputs(rows)
        loss = model(x, rel, chunk_of, inverse=inverse.to(device), negatives_shape=tuple(negs.nodes.shape))
    else:
        dense = batch.dense
        rows = dense.node_ids
        x = inputs(rows)
        edge_type = g.rel[dense.edge_ids].to(device) if rgcn else None
        loss = model(x, rel, chunk_of, dense=dense.to(device), edge_type=edge_type, index=batch.index.to(device))
    return loss, x, rows


def _mlp_width(model: torch.nn.Module) -> int:
    """`HadamardMLP`'s input and hidden widths summed (0 for the other decoders): the
    ``[C, P, K, w]`` activations its step forms (`estimate_link_step_bytes`)."""
    mlp = getattr(getattr(model, "module", model).decoder, "mlp", None)
    return 0 if mlp is None else sum(layer.in_features for layer in mlp)


def batch_backward(model: torch.nn.Module, batch: EdgeBatch, *, use_embeddings: bool, rgcn: bool,
                   device: torch.device, scale: float = 1.0, step_bytes: int | None = None,
                   corrupt: str = "both", no_sync=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Backpropagate ``scale`` times ``batch``'s mean loss: ``(loss, x, rows, micro-batches)``
    as `batch_loss` (the loss detached), with ``x.grad`` and the parameters' gradients filled in.

    Under a step budget (``step_bytes``, the budget's share for the batch in training) a
    batch of learnable embeddings whose step is estimated above it runs as contiguous runs
    of its positives (`graphstore.nn.link_micro_batches`), each with the chunks of negatives
    its positives use, each loss weighted by its share of positives: the gradients add up to
    the batch's (every loss is a mean over positives), and each run's rows, a leaf of their
    own, add their gradient into ``x.grad``, so the embedding update is the unsplit batch's. A batch
    through an encoder is not split (the encoder's activations are the step's memory, and
    its sampled neighbourhoods are shared by the positives). ``no_sync``: a context that
    holds back data parallelism's gradient reduction, for every run but the last."""
    negs = batch.negatives
    if step_bytes is None or batch.dense is not None or not use_embeddings:
        loss, x, rows = batch_loss(model, batch, use_embeddings=use_embeddings, rgcn=rgcn, device=device)
        (loss if scale == 1.0 else loss * scale).backward()
        return loss.detach(), x, rows, 1
    b = batch.src.numel()
    num_chunks, k = negs.nodes.shape
    g = batch.graph
    rows, inverse = torch.unique(torch.cat([batch.src, batch.dst, negs.nodes.flatten()]), return_inverse=True)
    dim = g.embeddings.shape[-1]
    runs = link_micro_batches(negs.chunk_of, budget_bytes=step_bytes, negatives=k, dim=dim,
                              sides=1 if corrupt in ("dst", "pair") else 2, rows=rows.numel(),
                              mlp_width=_mlp_width(model))
    dtype = next(model.parameters()).dtype
    x = g.embeddings[rows, 0].to(device=device, dtype=dtype).requires_grad_(True)
    if len(runs) == 1:
        loss = model(x, batch.rel.to(device), negs.chunk_of.to(device), inverse=inverse.to(device),
                     negatives_shape=(num_chunks, k))
        (loss if scale == 1.0 else loss * scale).backward()
        return loss.detach(), x, rows, 1
    rel, chunk_of, inverse = batch.rel.to(device), negs.chunk_of.to(device), inverse.to(device)
    src_at, dst_at, neg_at = inverse[:b], inverse[b:2 * b], inverse[2 * b:].view(num_chunks, k)
    x.grad = torch.zeros_like(x)
    total = torch.zeros((), dtype=dtype, device=device)
    for i, run in enumerate(runs):
        # Chunks are contiguous and only the last ones can be empty (`NegativeSample`), so a
        # run's chunks are [lo, hi], renumbered from 0; a run with as many chunks as positives
        # then has one positive per chunk, the shape `link_prediction_loss` reads as such.
        lo, hi = int(chunk_of[run.start]), int(chunk_of[run.stop - 1])
        share = (run.stop - run.start) / b
        # The run's own rows as a leaf, its gradient added into the batch's: backward through
        # a gather of the batch's x would zero a copy of all of x per run.
        own, at = torch.unique(torch.cat([src_at[run], dst_at[run], neg_at[lo:hi + 1].flatten()]),
                               return_inverse=True)
        x_run = x.detach().index_select(0, own).requires_grad_(True)
        with (no_sync() if no_sync is not None and i < len(runs) - 1 else contextlib.nullcontext()):
            part = model(x_run, rel[run], chunk_of[run] - lo, inverse=at, negatives_shape=(hi - lo + 1, k))
            (part * (share * scale)).backward()
        x.grad.index_add_(0, own, x_run.grad)
        total += part.detach() * share
    return total, x, rows, len(runs)


class Trainer:
    """One run's state: store, table, loader, model, optimizer; trains and evaluates epochs."""

    def __init__(self, args: LinkPredictionOptions, config: LinkPredictionConfig, store,
                 device: torch.device, *, table: EmbeddingTable | None = None) -> None:
        """``table``: the learnable embeddings, as `prepare_embeddings` left them (None
        without learnable embeddings). Under torchrun (a process group), this rank's share."""
        unset = [name for name in DATA_DEFAULTS if getattr(args, name) is None]
        if unset:  # a programmatic caller skipped `resolve_defaults`
            raise ConfigError(f"unresolved defaults {', '.join(unset)}: pass the options through resolve_defaults")
        self.args, self.config, self.store, self.device = args, config, store, device
        self.rank, self.world = rank_and_world()
        m = store.manifest
        self.num_relations = max(1, store.num_relations)
        self.use_embeddings = config.learnable_embeddings
        if self.use_embeddings and table is None:
            raise ConfigError("learnable embeddings need their table (prepare_embeddings)")
        self.table = table if self.use_embeddings else None
        in_dim = args.embedding_dim if self.use_embeddings else m.feature_dim
        # Under a byte budget an out-of-core buffer leaves the batch in training its share
        # (`step_share`, as the node trainer does): a step estimated above it is split into
        # micro-batches (`batch_backward`), so the buffer and the step together stay within it.
        buffer_bytes, self.step_bytes = args.buffer_bytes, None
        if buffer_bytes is not None and not SCHEME_REGISTRY.get(args.scheme).whole_graph:
            buffer_bytes, self.step_bytes, _ = step_share(buffer_bytes)
        # With relations (which --encoder rgcn requires) the loader's DENSE carries edge ids,
        # so the RGCN looks up each sampled edge's relation as `graph.rel[dense.edge_ids]`.
        self.loader = EdgeLoader(
            store, batch_size=args.batch_size, negatives=args.negatives, num_chunks=args.num_chunks,
            degree_fraction=args.degree_fraction, scheme=args.scheme, policy=args.policy,
            capacity=args.buffer_partitions, buffer_bytes=buffer_bytes, embeddings=self.table,
            fanouts=None if args.encoder == "none" else args.fanouts,
            num_logical_partitions=args.num_logical_partitions, seed=args.seed, prefetch=args.prefetch,
            rank=self.rank, world_size=self.world, loader_threads=common.loader_threads(args))
        self.embedding_placement = self.loader.embedding_placement  # None in one process
        self._last_graph = None
        common.seed_everything(args.seed)  # model initialisation (the same on every rank)
        self.model = LinkModel(args, in_dim=in_dim, num_relations=self.num_relations).to(device)
        # DDP broadcasts rank 0's parameters (a resumed run loads them into self.model first:
        # `wrap`); one process calls the model itself.
        self.trained: torch.nn.Module = self.model
        opt = torch.optim.Adagrad if args.optimizer == "adagrad" else torch.optim.Adam
        self.optimizer = opt(self.model.parameters(), lr=args.lr)
        self.embedding_lr = args.embedding_lr if args.embedding_lr is not None else args.lr
        self.embedding_adam = None  # {"exp_avg": [N, d], "step": int} with --embedding-optimizer adam
        if self.use_embeddings and args.embedding_optimizer == "adam":
            self.embedding_adam = {"exp_avg": torch.zeros(store.num_nodes, args.embedding_dim), "step": 0}
        self._full_graph = None
        self.micro_batches = 0  # forward-backward passes of the run's steps, 1 per unsplit step (`batch_backward`)

    def wrap(self) -> None:
        """Under torchrun, train through `DistributedDataParallel` (after loading a checkpoint)."""
        if self.world > 1:  # summed: each rank's loss is already weighted by its share (`step`)
            self.trained = wrap_model(self.model, self.device, sum_gradients=True)

    # -------------------------------------------------------------- training

    def step(self, batch: EdgeBatch | None) -> float:
        """One optimizer step on ``batch``; returns its mean loss. Under data parallelism
        ``batch`` is this rank's share of the step (None: a padding step) and the update is
        the one of the mean loss over every rank's positives (module docstring)."""
        world = self.world
        b = 0 if batch is None else batch.src.numel()
        # DDP sums the ranks' gradients (`wrap`): b / total makes that the union's mean loss.
        scale = b / step_targets(b) if world > 1 else 1.0
        self.optimizer.zero_grad(set_to_none=True)
        if batch is None:
            self.trained(None, None, None).backward()
            self.optimizer.step()
            if self.embedding_placement == "replicated":
                self._replicated_update(None, None, None)
            return 0.0
        g = batch.graph
        loss, x, rows, parts = batch_backward(
            self.trained, batch, use_embeddings=self.use_embeddings, rgcn=self.args.encoder == "rgcn",
            device=self.device, scale=scale, step_bytes=self.step_bytes, corrupt=self.args.corrupt,
            no_sync=getattr(self.trained, "no_sync", None))
        self.micro_batches += parts
        self.optimizer.step()
        if self.use_embeddings:
            with torch.no_grad():
                grad = x.grad.to(device=g.embeddings.device, dtype=g.embeddings.dtype)
                if self.embedding_placement == "replicated":
                    self._replicated_update(g, g.node_ids[rows].long(), grad)
                else:  # owned: no other rank holds these rows this round
                    self._sparse_update(g, rows, grad)
        return float(loss.detach())

    def _sparse_update(self, g, rows: torch.Tensor, grad: torch.Tensor) -> None:
        """The embedding optimizer's step on resident rows ``rows`` (local ids)."""
        if self.embedding_adam is None:
            sparse_adagrad_(g.embeddings, rows, grad, self.embedding_lr)
        else:
            self.embedding_adam["step"] += 1
            sparse_adam_(g.embeddings, rows, grad, self.embedding_lr, self.embedding_adam["exp_avg"],
                         g.node_ids[rows].long(), self.embedding_adam["step"])

    def _replicated_update(self, g, ids: torch.Tensor | None, grad: torch.Tensor | None) -> None:
        """Every rank's rows and gradients of the step, summed, applied to this rank's copy
        of the whole table (a padding rank contributes none but applies the others')."""
        if ids is None:
            ids = torch.zeros(0, dtype=torch.int64)
            grad = torch.zeros((0, self.args.embedding_dim), dtype=torch.float32)
        ids, grad = gather_rows(ids, grad)
        if g is None:
            g = self._last_graph
        with torch.no_grad():
            self._sparse_update(g, g.to_local(ids.numpy()), grad)

    def train_epoch(self, epoch: int) -> tuple[float, int]:
        """One epoch: every round's batches, then this rank's padding steps up to the round's
        step count, then (data parallel) a barrier once every rank wrote its round back.
        Returns the mean loss per positive and the positives, over all ranks."""
        self.model.train()
        rank, world = self.rank, self.world
        # dropout replays on resume; rank 0 draws a single process's masks
        common.seed_everything(common.epoch_seed(self.args.seed, epoch, salt=dropout_salt(rank)))
        total, count = 0.0, 0
        loader = self.loader
        rounds = loader.round_steps(epoch)
        progress = common.progress(range(sum(steps for _, steps in rounds)), desc=f"epoch {epoch}",
                                   total=sum(steps for _, steps in rounds))
        ticks = iter(progress)
        for t, (own, steps) in enumerate(rounds):
            if own == 0 and self.embedding_placement == "replicated":
                raise ConfigError(f"rank {rank} has no batch in epoch {epoch} ({world} ranks share {steps} "
                                  f"step(s)); use fewer ranks or a smaller --batch-size")
            # closing(): a failed step closes the round at once, so the buffer writes back every
            # dirty partition before the error leaves the trainer (and the store is closed).
            with contextlib.closing(loader.epoch(epoch, round=t)) as batches:
                done = 0
                for batch in itertools.islice(batches, own):
                    self._last_graph = batch.graph
                    n = batch.src.numel()
                    total += self.step(batch) * n
                    count += n
                    done += 1
                    next(ticks, None)
                # Padding while the round's buffer is still open: a replicated table applies
                # the other ranks' updates of these steps before it is written back.
                for _ in range(steps - own):
                    self.step(None)
                    next(ticks, None)
                extra = next(batches, None)  # the round ends here: its partitions are written back
            if done != own or extra is not None:
                raise ConfigError(f"rank {rank}, epoch {epoch}, round {t}: the loader yielded "
                                  f"{done + (extra is not None)}+ batches, its plan promised {own}")
            sync_ranks()  # every rank's round is written back before anyone reads its partitions
        if world > 1:
            total, count = all_reduce_values([total, count])
        if count == 0:
            raise ConfigError(f"{self.store.path}: the store has no training edges")
        return total / count, int(count)

    # -------------------------------------------------------------- model selection

    def snapshot(self, reps: torch.Tensor) -> dict[str, Any]:
        """What restores this point of training for scoring: the model's parameters (every
        rank) and, with learnable embeddings, their values as the store holds them now
        (rank 0, the writer; [N, d] float32). ``reps``: the evaluation's representations,
        which without an encoder (and not on a device) are those values, read already."""
        state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        values = None
        if self.use_embeddings and self.rank == 0:
            # Without an encoder, on the CPU, reps are those values (`read_values`), which
            # nothing writes to: the snapshot keeps them rather than a second copy.
            reused = self.model.encoder is None and reps.device.type == "cpu"
            values = reps if reused else torch.from_numpy(self.table.read_values())
        return {"model": state, "embeddings": values}

    def restore(self, snapshot: dict[str, Any] | None, *, best_epoch: int, last_epoch: int) -> None:
        """Put the best-validation model back for the final scores, its embeddings into the
        store too (so the store holds the model the metrics report; each row keeps the
        Adagrad state of the last epoch). Nothing to do when the last epoch was the best."""
        if snapshot is None or best_epoch == last_epoch:
            return
        self.model.load_state_dict(snapshot["model"])
        if self.use_embeddings:
            if self.rank == 0:
                values = snapshot["embeddings"].numpy()
                for k in range(self.store.num_partitions):
                    start, stop = self.store.partition_range(k)
                    rows = self.table.read_partition(k)
                    rows[:, 0] = values[start:stop]
                    self.table.write_partition(k, rows)
            sync_ranks()  # every rank's representations read the restored table

    # -------------------------------------------------------------- evaluation

    def _full_blocks(self) -> tuple[list[Block], torch.Tensor | None]:
        """Every store edge as one full-graph block per layer (in-edges, sorted by destination)."""
        if self._full_graph is None:
            src = torch.from_numpy(self.store.read_rows("edges/src", 0, self.store.num_edges).astype(np.int64))
            dst = torch.from_numpy(self.store.read_rows("edges/dst", 0, self.store.num_edges).astype(np.int64))
            rel = (torch.from_numpy(self.store.read_rows("edges/rel", 0, self.store.num_edges).astype(np.int64))
                   if self.store.manifest.has_relations else None)
            order = torch.argsort(dst, stable=True)
            n = self.store.num_nodes
            block = Block(torch.arange(n), n, src[order], dst[order])
            self._full_graph = ([block] * len(self.args.fanouts), None if rel is None else rel[order])
        return self._full_graph

    def make_room_for_evaluation(self) -> int:
        """Ranking holds every node's representation [N, d] and score blocks of the step's
        share (`eval_candidate_chunk`); when they and the buffer's slots would not fit the
        run's budget together, free the slots (the next epoch reads its first state again),
        as the node trainer does before exact evaluation. Returns the bytes freed."""
        if self.step_bytes is None:  # no byte budget, or the whole graph resident
            return 0
        need = self.store.num_nodes * self.args.embedding_dim * 4 + self.step_bytes
        if self.loader.held_bytes + need > self.args.buffer_bytes:
            return self.loader.release_memory()
        return 0

    @torch.no_grad()
    def representations(self) -> torch.Tensor:
        """[N, d] the final representation of every node, in store ids."""
        self.model.eval()
        if self.model.encoder is not None and self.args.eval_encoder == "exact":
            return self._exact_representations().to(self.device)  # never the whole input at once
        if self.use_embeddings:
            x = torch.from_numpy(self.table.read_values())  # not the [N, 2, d] table with its state
        else:
            x = torch.from_numpy(decode(self.store.features[...], self.store.manifest.feature_dtype))  # bfloat16: its bits
        if self.model.encoder is None:
            return x.to(self.device)
        blocks, rel = self._full_blocks()
        blocks = [Block(b.src_nodes.to(self.device), b.num_dst, b.edge_src.to(self.device),
                        b.edge_dst.to(self.device)) for b in blocks]
        edge_type = None if self.args.encoder != "rgcn" else [rel.to(self.device)] * len(blocks)
        return self.model.encoder(x.to(self.device), blocks, edge_type=edge_type)

    def _exact_representations(self) -> torch.Tensor:
        """The encoder over every node, layer by layer from the store (`infer_layerwise`):
        inputs are the embeddings the table holds, or the store's features."""
        encoder = self.model.encoder  # on the training device: the layers run where it is
        rows = (lambda k: self.table.read_partition(k)[:, 0]) if self.use_embeddings else None
        # The memory the training buffer's input rows take (or the least the inference needs).
        width = encoder.layers[0].in_dim
        budget = max(max(2, self.loader.capacity) * self.store.partition_size * width * 4,
                     min_buffer_bytes(encoder, self.store))
        return torch.from_numpy(infer_layerwise(encoder, self.store, buffer_bytes=budget, input_rows=rows))

    def _known(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        srcs, dsts, rels = [], [], []
        for name in self.store.split_names:
            if self.store.manifest.split_kinds.get(name) != "edges":
                continue
            split = self.store.read_edge_split(name)
            srcs.append(split.src)
            dsts.append(split.dst)
            rels.append(split.rel if split.rel is not None else np.zeros(len(split.src), np.int64))
        if "train" not in self.store.split_names:  # training edges are the store's edges
            srcs.append(self.store.read_rows("edges/src", 0, self.store.num_edges))
            dsts.append(self.store.read_rows("edges/dst", 0, self.store.num_edges))
            rels.append(self.store.read_rows("edges/rel", 0, self.store.num_edges) if self.store.manifest.has_relations
                        else np.zeros(self.store.num_edges, np.int64))
        s, d, r = (torch.from_numpy(np.concatenate(a).astype(np.int64)) for a in (srcs, dsts, rels))
        if not self.store.directed:
            s, d, r = torch.cat([s, d]), torch.cat([d, s]), torch.cat([r, r])
        return s, d, r

    @torch.no_grad()
    def evaluate(self, reps: torch.Tensor, split_name: str) -> dict[str, float]:
        split = self.store.read_edge_split(split_name)
        dec = self.model.decoder
        src = torch.from_numpy(split.src.astype(np.int64)).to(self.device)
        dst = torch.from_numpy(split.dst.astype(np.int64)).to(self.device)
        rel = (torch.from_numpy(split.rel.astype(np.int64)) if split.rel is not None
               else torch.zeros(src.numel(), dtype=torch.int64)).to(self.device)
        mode = self.config.eval
        # Data parallel: each rank scores a contiguous share of the positives (and of OGB's
        # negatives); the shares are gathered in rank order, so every rank computes the
        # metrics one process would.
        src, dst, rel = (self._share(t) for t in (src, dst, rel))
        if mode == "ogb":
            if split.neg_src is None or split.neg_dst is None or split.neg_dst.ndim != 1:
                raise ConfigError(f"{self.store.path}: split {split_name!r} ships no negative edge pairs; "
                                  "use --eval filtered or unfiltered")
            pos = all_gather_varlen(self._pair_scores(reps, src, rel, dst))
            ns = self._share(torch.from_numpy(split.neg_src.astype(np.int64)).to(self.device))
            nd = self._share(torch.from_numpy(split.neg_dst.astype(np.int64)).to(self.device))
            neg = all_gather_varlen(self._pair_scores(reps, ns, torch.zeros_like(ns), nd))
            return {f"hits@{k}": ogb_hits_at_k(pos, neg, k) for k in OGB_KS}
        known = self._known() if mode == "filtered" else (None, None, None)
        known = tuple(None if k is None else k.to(self.device) for k in known)
        zeros = torch.zeros(self.args.eval_batch_size, dtype=torch.int64, device=self.device)

        def tails(index, cand):  # (src, rel, candidate)
            s = reps[src[index]]
            return dec.score_negatives(s, rel[index], s, reps[cand][None], zeros[:index.numel()],
                                       corrupt="dst")

        def heads(index, cand):  # (candidate, rel, dst)
            o = reps[dst[index]]
            return dec.score_negatives(o, rel[index], o, reps[cand][None], zeros[:index.numel()],
                                       corrupt="src")

        n = self.store.num_nodes
        chunk = eval_candidate_chunk(self.args.buffer_bytes, self.args.eval_batch_size)
        ranks = [full_ranks(tails, src, dst, n, rel=rel, known_src=known[0], known_dst=known[1],
                            known_rel=known[2], batch_size=self.args.eval_batch_size, candidate_chunk=chunk)]
        if self.config.eval_corrupt == "both":
            ranks.append(full_ranks(heads, dst, src, n, rel=rel, known_src=known[1], known_dst=known[0],
                                    known_rel=known[2], batch_size=self.args.eval_batch_size,
                                    candidate_chunk=chunk))
        ranks = [all_gather_varlen(r.cpu()) for r in ranks]
        return ranking_metrics(torch.cat(ranks), ks=RANK_KS)

    def _share(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous share of ``t`` (all of it in one process)."""
        n = t.shape[0]
        return t[self.rank * n // self.world:(self.rank + 1) * n // self.world]

    def _pair_scores(self, reps, src, rel, dst) -> torch.Tensor:
        out = []
        for start in range(0, src.numel(), 1 << 16):
            sl = slice(start, start + (1 << 16))
            out.append(self.model.decoder.score(reps[src[sl]], rel[sl], reps[dst[sl]]))
        return torch.cat(out).cpu() if out else torch.zeros(0, dtype=reps.dtype)


MAX_CANDIDATE_CHUNK = FULL_RANKS_CANDIDATE_CHUNK
"""`full_ranks`' own default: candidates a score block holds without a byte budget."""
MIN_CANDIDATE_CHUNK = 1024
"""The fewest candidates a block holds under any budget (smaller blocks cost calls, not memory)."""
SCORE_BLOCK_COPIES = 3
"""[eval batch, chunk] 4-byte values that ranking holds at once: the scores, the comparisons
and the filter's mask. Measured on WN18RR (40,943 entities, eval batch 256, one 42 MB block):
the run's peak fell 124 MiB from eval batch 256 to 16."""


def eval_candidate_chunk(buffer_bytes: int | None, eval_batch_size: int) -> int:
    """Candidates scored at a time in full ranking. Under a byte budget, the most whose score
    block and its temporaries (SCORE_BLOCK_COPIES of [eval batch, chunk] 4-byte values) fit
    the step's share of the budget (`step_share`: 1/8), within [MIN_CANDIDATE_CHUNK,
    MAX_CANDIDATE_CHUNK]; without one, MAX_CANDIDATE_CHUNK. The ranks do not depend on it
    (`full_ranks` compares scores of one call), only the time: with more than one chunk each
    block is scored twice.

    >>> eval_candidate_chunk(None, 256), eval_candidate_chunk(48 << 20, 256), eval_candidate_chunk(64 << 30, 256)
    (65536, 2048, 65536)
    """
    if buffer_bytes is None:
        return MAX_CANDIDATE_CHUNK
    _, step, _ = step_share(buffer_bytes)
    fit = step // (eval_batch_size * 4 * SCORE_BLOCK_COPIES)
    return int(min(MAX_CANDIDATE_CHUNK, max(MIN_CANDIDATE_CHUNK, fit)))


DATA_DEFAULTS = ("embedding_dim", "negatives", "num_chunks", "degree_fraction", "regularization")
"""The options whose default the store decides (`link_prediction_defaults`)."""


def resolve_defaults(args: LinkPredictionOptions, store,
                     saved: Mapping[str, Any] | None = None) -> tuple[LinkPredictionOptions, dict[str, str]]:
    """``args`` with every default the data decides filled in, and the rule that chose each:
    the width and the negatives from the kind of graph (`link_prediction_defaults`), the
    buffer from memory; a resumed run replays its checkpoint's choices."""
    changes: dict[str, Any] = {}
    derived: dict[str, str] = {}
    unset = [name for name in DATA_DEFAULTS if getattr(args, name) is None]
    if unset and saved is not None:
        changes.update({name: saved[name] for name in unset if saved.get(name) is not None})
        derived.update({name: "the resumed checkpoint's" for name in changes})
        unset = [name for name in unset if name not in changes]
    if unset:
        # The run's budget when one is given (--buffer-bytes), else what the process may use:
        # a d=400 table chosen against the machine's memory did not fit a budget of 48 MiB.
        budget = args.buffer_bytes if args.buffer_bytes is not None else memory_budget().bytes
        rules = link_prediction_defaults(store, encoder=args.encoder, budget_bytes=budget)
        for name in unset:
            changes[name], derived[name] = rules[name]
    buffer, rule = common.default_buffer(args, whole_graph=SCHEME_REGISTRY.get(args.scheme).whole_graph, saved=saved)
    if rule is not None:
        changes.update(buffer)
        derived["buffer_bytes"] = rule
    resolved = dataclasses.replace(args, **changes)
    resolved.validate()  # the derived values meet the same checks as given ones
    return resolved, derived


def resolve_config(args: LinkPredictionOptions, store) -> LinkPredictionConfig:
    """The options as recorded and compared on resume (every choice made explicit)."""
    m = store.manifest
    names = [n for n in store.split_names if m.split_kinds.get(n) == "edges"]
    for need in ("valid", "test"):
        if need not in names:
            raise ConfigError(f"{store.path}: link prediction needs a {need!r} edge split (edge splits: "
                              f"{', '.join(names) or 'none'})")
    learnable = bool(args.embeddings or not m.has_features or args.encoder == "none")
    rule = None
    if args.encoder == "none" and m.has_features and not args.embeddings:
        rule = "encoder none: nothing but embeddings to learn"
    if args.eval_mode is None:
        shipped = store.read_edge_split("valid").neg_src is not None
        eval_mode = "ogb" if shipped else "filtered"
    else:
        eval_mode = args.eval_mode
    if args.encoder == "rgcn" and not m.has_relations:
        raise ConfigError(f"{store.path}: --encoder rgcn needs relation types; the store has none "
                          "(use sage or gat)")
    if args.embedding_optimizer == "adam" and learnable and args.scheme != "minibatch":
        raise ConfigError("--embedding-optimizer adam keeps its first moment in memory: minibatch scheme only "
                          "(the disk scheme's embeddings keep Adagrad state in the store)")
    return LinkPredictionConfig(options=args, learnable_embeddings=learnable, learnable_embeddings_rule=rule,
                                eval=eval_mode, eval_corrupt="both" if store.num_relations > 0 else "dst")


def _summary(metrics: dict[str, float] | None) -> str:
    if not metrics:
        return "-"
    return "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())


def prepare_embeddings(args: LinkPredictionOptions, store, resume_from: Path | None) -> EmbeddingTable:
    """The learnable embeddings at the run's start: freshly initialised, or (``resume_from``)
    the checkpoint's copy restored into the store. Under torchrun rank 0 (the writer-lock
    holder) writes them and the others open them afterwards, from the same store
    (`check_shared_embeddings`)."""
    rank, _ = rank_and_world()
    table = None
    if rank == 0:
        if resume_from is not None:
            common.restore_directory(resume_from / "embeddings", Path(store.path) / EMBEDDINGS_ARRAY)
            table = EmbeddingTable.open(store)
        else:
            table = init_embeddings(store, args.embedding_dim, scale=args.embedding_scale, seed=args.seed)
    sync_ranks()
    if table is None:
        if not EmbeddingTable.exists(store):
            raise ConfigError(f"{store.path}: no {EMBEDDINGS_ARRAY} after rank 0 wrote it: every rank must open the "
                              f"same store, on a shared filesystem, when it learns embeddings")
        table = EmbeddingTable.open(store)
    check_shared_embeddings(table)
    return table


def open_for_run(args: LinkPredictionOptions, learnable: bool):
    """The store, opened for this rank: learnable embeddings are written back, so one
    process takes the writer lock (a second trainer on the same store is refused at once);
    under torchrun that is rank 0, on the job's behalf. Ranks that write back their own
    partitions (the disk scheme) open it writable under rank 0's lock; the minibatch
    scheme's replicas (ranks > 0) only read."""
    rank = rank_and_world()[0]
    if not learnable:
        return graphstore.open(args.store)
    if rank == 0:
        store = graphstore.open(args.store, mode="r+")
        sync_ranks()  # rank 0 holds the writer lock before any other rank opens
        return store
    sync_ranks()
    if args.scheme == "minibatch":
        return graphstore.open(args.store)
    return graphstore.open(args.store, mode="r+", writer_lock=False)


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_ranks(_train, LinkPredictionOptions.parse(argv))


def _train(args: LinkPredictionOptions) -> int:
    common.configure_logging(args.verbose)
    rank, world, device = common.join_ranks(common.resolve_device(args.device))
    say = print if rank == 0 else (lambda *a, **k: None)
    store = graphstore.open(args.store)
    try:  # the store's locks are released when the run ends, however it ends
        ckpt = common.Checkpointer(args.checkpoint_dir) if args.checkpoint_dir else None
        # Read once: its configuration decides the defaults a resumed run replays.
        path = ckpt.latest() if args.resume else None
        state = ckpt.load(path) if args.resume else None
        args, derived = resolve_defaults(args, store, None if state is None else state["config"])
        config = dataclasses.replace(resolve_config(args, store), world_size=world, derived=derived)
        check_ranks_agree(config.to_dict(), store)  # before any rank opens the store to train
        store.close()
        store = open_for_run(args, config.learnable_embeddings)
        if state is not None:
            common.check_resume_config(state["config"], config.to_dict(), path,
                                       run_only=common.RUN_ONLY | LinkPredictionOptions.run_only_names())
        table = prepare_embeddings(args, store, path) if config.learnable_embeddings else None
        trainer = Trainer(args, config, store, device, table=table)
        # The checkpoint's copy leaves the loader's settings out: they are not compared on resume.
        saved_config = config.to_dict()
        config = dataclasses.replace(config, loader=trainer.loader.settings)
        s = trainer.loader.settings
        say(f"{PROG}: {store}" + (f" ({world} ranks, DistributedDataParallel)" if world > 1 else ""))
        logical = f", logical partitions {s.num_logical_partitions}" if s.num_logical_partitions is not None else ""
        inputs = "learnable embeddings" if trainer.use_embeddings else "features"
        placement = f" ({s.embedding_placement})" if s.embedding_placement else ""
        step_share_note = (f", {common.mib(trainer.step_bytes)} of the budget for the step (split into micro-batches "
                           f"above it)" if trainer.step_bytes is not None else "")
        say(f"scheme {s.scheme}: policy {s.policy}, {s.capacity} of {s.num_partitions} partitions "
            f"resident{logical}{step_share_note}; {inputs}{placement} d={args.embedding_dim}, encoder {args.encoder}, "
            f"decoder {args.model}; negatives {args.negatives} x {args.num_chunks} chunks "
            f"(degree fraction {args.degree_fraction:g}); "
            f"eval {config.eval} ({config.eval_corrupt})", flush=True)
        for name, rule in derived.items():
            say(f"default {name}: {rule}", flush=True)

        # Rank 0 alone writes the metrics and the checkpoints; every rank reads one to resume.
        metrics = common.MetricsWriter(args.metrics_out if rank == 0 else None, task="link_prediction",
                                       config=config.to_dict())
        start_epoch, history, resumed_from, snapshot = 0, [], None, None
        if state is not None:
            trainer.model.load_state_dict(state["model"])
            trainer.optimizer.load_state_dict(state["optimizer"])
            if trainer.embedding_adam is not None:
                trainer.embedding_adam = state["embedding_adam"]
            common.set_rng_state(state["rng"])
            start_epoch, history, resumed_from = state["epoch"] + 1, state["history"], state["epoch"]
            snapshot = state.get("best")
            say(f"resumed from {path} (epoch {state['epoch'] + 1} done)", flush=True)
        trainer.wrap()

        key = "hits@20" if config.eval == "ogb" else "mrr"
        best = max((h for h in history if h["valid"]), key=lambda h: h["valid"][key], default=None)
        train_s = sum(h["time_s"] for h in history)
        eval_s = sum(h["eval_time_s"] for h in history)
        last_eval_s = next((h["eval_time_s"] for h in reversed(history) if h["valid"]), 0.0)
        stopped = None
        for epoch in range(start_epoch, args.epochs):
            t0 = time.perf_counter()
            rounds_before, micro_before = len(trainer.loader.epoch_stats), trainer.micro_batches
            loss, n = trainer.train_epoch(epoch)
            common.finite_or_raise(loss, epoch)
            t1 = time.perf_counter()
            train_s += t1 - t0
            valid = None
            # Validation only: the test split is scored once, at the end, on the selected model.
            if common.should_evaluate(args, epoch, train_s, eval_s, last_eval_s):
                trainer.make_room_for_evaluation()
                reps = trainer.representations()
                valid = trainer.evaluate(reps, "valid")
            t2 = time.perf_counter()
            eval_s += t2 - t1
            if valid is not None:
                last_eval_s = t2 - t1
            io = common.io_stats(trainer.loader.epoch_stats[rounds_before:])  # this rank's, every round
            record = {"epoch": epoch, "train_loss": loss, "train_edges": n, "valid": valid,
                      "time_s": t1 - t0, "eval_time_s": t2 - t1, "io": io,
                      "micro_batches": trainer.micro_batches - micro_before,
                      "loader": trainer.loader.pipeline_stats.to_dict()}
            history.append(record)
            if valid is not None and (best is None or valid[key] > best["valid"][key]):
                best, snapshot = record, trainer.snapshot(reps)
            reps = None  # [N, d]: not held through the next epoch
            shown = f"valid {_summary(valid)}  (+{t2 - t1:.2f} s eval)" if valid is not None else "(not evaluated)"
            say(f"epoch {epoch + 1}/{args.epochs}  loss {loss:.4f}  {shown}  {t1 - t0:.2f} s  "
                f"read {common.mib(io['bytes_read'])}  "
                f"written {common.mib(io['bytes_written'])}  stall {io['stall_s']:.2f} s", flush=True)
            if ckpt is not None and rank == 0:
                # The embeddings live in the store: a copy goes with the checkpoint (written back
                # by every rank by the epoch's last barrier, so the copy is the epoch's final state).
                snapshots = ({"embeddings": Path(store.path) / EMBEDDINGS_ARRAY} if trainer.use_embeddings
                             else None)
                ckpt.save(epoch, {"epoch": epoch, "model": trainer.model.state_dict(),
                                  "optimizer": trainer.optimizer.state_dict(),
                                  "embedding_adam": trainer.embedding_adam, "rng": common.rng_state(),
                                  "history": history, "config": saved_config, "best": snapshot},
                          snapshots=snapshots)
            sync_ranks()  # nobody writes the store (next epoch) while rank 0 copies it
            metrics.write(epochs=history, resumed_from=resumed_from,
                          best=None if best is None else {"epoch": best["epoch"], "valid": best["valid"]})
            # Stop only at an evaluated epoch: one that was not evaluated might have improved.
            if args.patience and valid is not None and epoch - best["epoch"] >= args.patience:
                stopped = epoch
                say(f"stopping early: validation {key} has not improved for {args.patience} epochs "
                    f"(best at epoch {best['epoch'] + 1})", flush=True)
                break
        if not history:
            raise ConfigError(f"nothing to train: --epochs {args.epochs} and the checkpoint is at epoch "
                              f"{start_epoch}")
        # The run's model is the best-validation one: restored (the embeddings in the store
        # too), then scored once on valid and test.
        t3 = time.perf_counter()
        trainer.restore(snapshot, best_epoch=best["epoch"], last_epoch=history[-1]["epoch"])
        trainer.make_room_for_evaluation()
        reps = trainer.representations()
        scores = {split: trainer.evaluate(reps, split) for split in ("valid", "test")}
        selection = (f"best validation {key}: epoch {best['epoch'] + 1} of {len(history)} trained"
                     + (f" (stopped early, patience {args.patience})" if stopped is not None else ""))
        final = {"epoch": best["epoch"], "valid": scores["valid"], "test": scores["test"], "selection": selection}
        metrics.write(epochs=history, resumed_from=resumed_from, final=final, best=final, stopped_early=stopped,
                      train_time_s=train_s, eval_time_s=eval_s, test_time_s=time.perf_counter() - t3)
        say(f"final: valid {_summary(scores['valid'])}  test {_summary(scores['test'])}  ({selection}; "
            f"train {train_s:.1f} s, evaluation {eval_s:.1f} s, peak memory "
            f"{common.mib(common.peak_memory_bytes())})", flush=True)
        return 0
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(common.run(PROG, main))
