"""Link prediction decoders (DistMult, ComplEx, TransE) and their loss.

A decoder scores an edge ``(s, r, o)`` from the node embeddings of its source ``s`` and
destination ``o`` and a learnable embedding of its relation ``r`` (``num_relations``
of them; a graph without relations uses 1):

* `DistMult`: ``sum(s * r * o)``.
* `ComplEx`: ``Re(sum(s * r * conj(o)))``, the first half of each embedding being the real
  part and the second half the imaginary part (so ``dim`` is even).
* `TransE`: ``-||s + r - o||_p``, ``p`` = 1 or 2.
* `HadamardMLP`: ``MLP(s * r * o)``, OGB's link predictor for ogbl-ddi/collab (an MLP
  on the element-wise product of the ends, ``r`` all ones for a graph without relations).

Negatives are shared per chunk of the batch, as `NegativeSample` draws them (MariusGNN):
positive ``i`` of chunk ``c = chunk_of[i]`` is scored against the ``K`` candidates
``negatives[c]``. Corrupting the destination, each positive becomes a query ``q`` (DistMult:
``s * r``; TransE: ``s + r``) and a chunk's queries meet its candidates in one batched
product ``[C, P_c, d] x [C, d, K]``; nothing of size ``[B, K, d]`` is formed. TransE uses
``torch.cdist`` in its direct mode rather than the ``|a|^2 - 2ab + |b|^2`` expansion: both
avoid ``[B, K, d]``, and the direct mode has no cancellation when distances are small next
to the norms (the case of a well-trained model). Corrupting the source works the same with
the query built from ``r`` and ``o``.

Examples
--------
>>> dec = DistMult(dim=2)                          # relation embedding starts at all ones
>>> s, o = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]])
>>> dec.score(s, None, o).tolist()                 # 1*3 + 2*4
[11.0]
>>> negs = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])   # one chunk of K = 2 candidates
>>> dec.score_negatives(s, None, o, negs, torch.tensor([0])).tolist()
[[1.0, 2.0]]
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from graphstore.errors import ConfigError

__all__ = ["CORRUPT", "DECODERS", "LOSSES", "ComplEx", "Decoder", "DistMult", "HadamardMLP", "TransE",
           "link_loss"]

CORRUPT = ("dst", "src")
"""Which end of a positive edge the negatives replace."""
LOSSES = ("softmax", "logistic", "margin")
"""The losses `link_loss` knows."""


class Decoder(nn.Module):
    """Base class: relation embeddings, chunked negative scoring and the loss.

    Subclasses define ``_query`` (the embedding that meets the candidates), ``_pair``
    (query against one candidate each, [B]) and ``_against`` (queries against shared
    candidates, [C, P, K]).

    Parameters
    ----------
    dim : int
        Node embedding width.
    num_relations : int
        Relation types (1 for a graph without relations).
    """

    def __init__(self, dim: int, num_relations: int = 1) -> None:
        super().__init__()
        if dim < 1:
            raise ConfigError(f"dim must be at least 1 (got {dim})")
        if num_relations < 1:
            raise ConfigError(f"num_relations must be at least 1 (got {num_relations}); "
                              "a graph without relations uses 1")
        self.dim, self.num_relations = dim, num_relations
        self.relations = nn.Parameter(torch.empty(num_relations, dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Relation embeddings that make the decoder a plain similarity at first."""
        nn.init.ones_(self.relations)

    def _relation(self, rel: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """[B, dim]: the embedding of each edge's relation; ``None`` means relation 0."""
        if rel is None:
            if self.num_relations != 1:
                raise ConfigError(f"rel is needed with num_relations = {self.num_relations}")
            return self.relations.expand(like.shape[0], -1)
        return self.relations.index_select(0, rel)

    def _query(self, anchor: torch.Tensor, r: torch.Tensor, corrupt: str) -> torch.Tensor:
        raise NotImplementedError

    def _pair(self, q: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _against(self, q: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def score(self, src: torch.Tensor, rel: torch.Tensor | None, dst: torch.Tensor) -> torch.Tensor:
        """Scores of the edges ``(src[i], rel[i], dst[i])``.

        Parameters
        ----------
        src, dst : float tensor [B, dim]
            Embeddings of the edges' ends.
        rel : int64 tensor [B] or None
            Relation ids; None when ``num_relations == 1``.

        Returns
        -------
        float tensor [B]
        """
        return self._pair(self._query(src, self._relation(rel, src), "dst"), dst)

    def score_negatives(self, src: torch.Tensor, rel: torch.Tensor | None, dst: torch.Tensor,
                        negatives: torch.Tensor, chunk_of: torch.Tensor, *,
                        corrupt: str = "dst") -> torch.Tensor:
        """Score each positive with one end replaced by each of its chunk's negatives.

        Parameters
        ----------
        src, dst : float tensor [B, dim]
            The positives' ends (the corrupted end is not read).
        rel : int64 tensor [B] or None
            Relation ids.
        negatives : float tensor [C, K, dim]
            Embeddings of each chunk's negatives (``NegativeSample.nodes`` gathered).
        chunk_of : int64 tensor [B]
            Chunk of each positive, non-decreasing (``NegativeSample.chunk_of``).
        corrupt : {"dst", "src"}
            The end the negatives replace.

        Returns
        -------
        float tensor [B, K]
            ``out[i, j]`` scores ``(src[i], rel[i], negatives[chunk_of[i], j])`` (dst) or
            ``(negatives[chunk_of[i], j], rel[i], dst[i])`` (src).
        """
        if corrupt not in CORRUPT:
            raise ConfigError(f"corrupt must be one of {CORRUPT} (got {corrupt!r})")
        if negatives.dim() != 3 or negatives.shape[2] != src.shape[1]:
            raise ConfigError(f"negatives must have shape [num_chunks, K, {src.shape[1]}] "
                              f"(got {list(negatives.shape)})")
        anchor = src if corrupt == "dst" else dst
        q = self._query(anchor, self._relation(rel, anchor), corrupt)
        num = q.shape[0]
        if num == 0:
            return q.new_zeros(0, negatives.shape[1])
        # Chunks are contiguous, so a positive's place in its chunk is its distance to the
        # chunk's first positive; padding every chunk to the largest makes one bmm of them.
        first = torch.searchsorted(chunk_of, chunk_of)
        row = torch.arange(num, device=q.device) - first
        padded = q.new_zeros(negatives.shape[0], int(row.max()) + 1, q.shape[1])
        padded[chunk_of, row] = q
        return self._against(padded, negatives)[chunk_of, row]

    def loss(self, src: torch.Tensor, rel: torch.Tensor | None, dst: torch.Tensor, *,
             chunk_of: torch.Tensor, neg_dst: torch.Tensor | None = None,
             neg_src: torch.Tensor | None = None, kind: str = "softmax",
             margin: float = 1.0) -> torch.Tensor:
        """`link_loss` with destinations corrupted by ``neg_dst`` [C, K, dim] and/or sources
        by ``neg_src`` [C, K', dim], summed over the two sides (as MariusGNN does).

        Raises
        ------
        ConfigError
            If neither side has negatives.
        """
        if neg_dst is None and neg_src is None:
            raise ConfigError("loss needs negatives: pass neg_dst, neg_src or both")
        pos = self.score(src, rel, dst)
        total = pos.new_zeros(())
        for corrupt, negatives in (("dst", neg_dst), ("src", neg_src)):
            if negatives is not None:
                neg = self.score_negatives(src, rel, dst, negatives, chunk_of, corrupt=corrupt)
                total = total + link_loss(pos, neg, kind=kind, margin=margin)
        return total


class DistMult(Decoder):
    """``score(s, r, o) = sum(s * r * o)``; relations start at all ones (a dot product)."""

    def _query(self, anchor: torch.Tensor, r: torch.Tensor, corrupt: str) -> torch.Tensor:
        return anchor * r                     # symmetric: the same for either corrupted end

    def _pair(self, q: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        return (q * cand).sum(-1)

    def _against(self, q: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        return torch.bmm(q, cand.transpose(1, 2))


class ComplEx(DistMult):
    """``score(s, r, o) = Re(sum(s * r * conj(o)))``, embeddings ``[real | imaginary]``.

    Relations start at ``1 + 0i`` (then the score is ``Re(<s, o>)``). ``dim`` counts both
    halves and must be even.
    """

    def __init__(self, dim: int, num_relations: int = 1) -> None:
        if dim % 2:
            raise ConfigError(f"ComplEx needs an even dim, half real and half imaginary (got {dim})")
        super().__init__(dim, num_relations)

    def reset_parameters(self) -> None:
        with torch.no_grad():
            half = self.dim // 2
            self.relations[:, :half] = 1.0
            self.relations[:, half:] = 0.0

    def _query(self, anchor: torch.Tensor, r: torch.Tensor, corrupt: str) -> torch.Tensor:
        half = self.dim // 2
        a_re, a_im = anchor[:, :half], anchor[:, half:]
        r_re, r_im = r[:, :half], r[:, half:]
        if corrupt == "dst":
            # Re(x conj(o)) = x_re o_re + x_im o_im with x = s r.
            return torch.cat([a_re * r_re - a_im * r_im, a_re * r_im + a_im * r_re], 1)
        # Re(s y) = s_re y_re - s_im y_im with y = r conj(o).
        return torch.cat([r_re * a_re + r_im * a_im, r_re * a_im - r_im * a_re], 1)


class TransE(Decoder):
    """``score(s, r, o) = -||s + r - o||_p``; relations start at zero.

    Parameters
    ----------
    dim, num_relations : int
        As `Decoder`.
    p : {1, 2}
        The norm.
    """

    def __init__(self, dim: int, num_relations: int = 1, *, p: int = 2) -> None:
        if p not in (1, 2):
            raise ConfigError(f"TransE's norm p must be 1 or 2 (got {p})")
        super().__init__(dim, num_relations)
        self.p = p

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.relations)

    def _query(self, anchor: torch.Tensor, r: torch.Tensor, corrupt: str) -> torch.Tensor:
        # dst: -||(s + r) - o||; src: -||n + r - o|| = -||n - (o - r)||.
        return anchor + r if corrupt == "dst" else anchor - r

    def _pair(self, q: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        return -torch.linalg.vector_norm(q - cand, ord=self.p, dim=-1)

    def _against(self, q: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        return -torch.cdist(q, cand, p=float(self.p), compute_mode="donot_use_mm_for_euclid_dist")


class HadamardMLP(DistMult):
    """``score(s, r, o) = MLP(s * r * o)``: OGB's ``LinkPredictor`` (ogbl-ddi, ogbl-collab)
    on the element-wise product of the two ends, with relation embeddings (all ones at
    first; a graph without relations keeps one) in the product.

    The MLP has ``num_layers`` linear layers, ``dim -> hidden -> ... -> 1``, ReLU and
    ``dropout`` between them, and outputs a logit (OGB applies the sigmoid in its loss;
    `link_loss`'s ``logistic`` is the same binary cross-entropy on logits).

    Scoring against shared negatives forms the products ``[C, P, K, dim]`` (the MLP is not
    bilinear), so memory grows with ``K``: meant for a few negatives per positive (OGB uses
    one) and for scoring given pairs, not for ranking against every node.

    Parameters
    ----------
    dim, num_relations : int
        As `Decoder`.
    hidden : int, optional
        Hidden width (default ``dim``).
    num_layers : int
        Linear layers (OGB: 3).
    dropout : float
        Dropout after each hidden activation (active in training mode only).
    """

    def __init__(self, dim: int, num_relations: int = 1, *, hidden: int | None = None,
                 num_layers: int = 3, dropout: float = 0.0) -> None:
        if num_layers < 1:
            raise ConfigError(f"num_layers must be at least 1 (got {num_layers})")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1) (got {dropout})")
        super().__init__(dim, num_relations)
        hidden = hidden or dim
        widths = [dim] + [hidden] * (num_layers - 1) + [1]
        self.mlp = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.dropout = dropout

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        for k, lin in enumerate(self.mlp):
            x = lin(x)
            if k < len(self.mlp) - 1:
                x = F.dropout(F.relu(x), p=self.dropout, training=self.training)
        return x.squeeze(-1)

    def _pair(self, q: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        return self._mlp(q * cand)

    def _against(self, q: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        return self._mlp(q[:, :, None, :] * cand[:, None, :, :])


DECODERS = {"complex": ComplEx, "distmult": DistMult, "mlp": HadamardMLP, "transe": TransE}
"""Decoder classes by name."""


def link_loss(pos: torch.Tensor, neg: torch.Tensor, *, kind: str = "softmax", margin: float = 1.0
              ) -> torch.Tensor:
    """Mean loss of positive scores ``pos`` [B] against their negatives' scores ``neg`` [B, K].

    * ``"softmax"``: cross-entropy of the positive among ``[pos_i, neg_i1, ..., neg_iK]``,
      ``logsumexp(pos_i, neg_i) - pos_i`` (MariusGNN's default).
    * ``"logistic"``: ``mean(softplus(-pos)) + mean(softplus(neg))`` (binary cross-entropy,
      positives and negatives averaged separately).
    * ``"margin"``: ``mean(relu(margin - pos_i + neg_ij))`` over all ``(i, j)``.

    Examples
    --------
    >>> pos, neg = torch.tensor([0.0]), torch.tensor([[0.0, 0.0, 0.0]])
    >>> round(link_loss(pos, neg).item(), 6) == round(float(torch.log(torch.tensor(4.0))), 6)
    True
    >>> link_loss(torch.tensor([2.0]), torch.tensor([[1.5, 0.0]]), kind="margin").item()
    0.25
    """
    if neg.dim() != 2 or neg.shape[0] != pos.shape[0]:
        raise ConfigError(f"neg must have shape [{pos.shape[0]}, K] (got {list(neg.shape)})")
    if kind == "softmax":
        return (torch.logsumexp(torch.cat([pos[:, None], neg], 1), 1) - pos).mean()
    if kind == "logistic":
        return F.softplus(-pos).mean() + F.softplus(neg).mean()
    if kind == "margin":
        return F.relu(margin - pos[:, None] + neg).mean()
    raise ConfigError(f"unknown loss {kind!r}; known losses: {', '.join(LOSSES)}")
