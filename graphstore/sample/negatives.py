"""Negative sampling for link prediction, shared across chunks of a batch (as MariusGNN).

The ``P`` positive edges of a batch are split into ``num_chunks`` contiguous, near-equal
chunks; every positive of chunk ``c`` is scored against the same ``K =
negatives_per_positive`` negative nodes ``nodes[c]``, so a chunk's negative representations
are computed once and shared (a ``[P_c, D] x [D, K]`` product instead of ``P_c * K`` dots).

Of each chunk's ``K`` negatives, ``K_deg = floor(degree_fraction * K + 0.5)`` (rounded half
up, so ``0.25 * 2 -> 1`` and ``0.5 * 3 -> 2``) are drawn proportionally to degree and the
other ``K - K_deg`` uniformly, both with replacement (as MariusGNN) from the candidate nodes
(by default every resident node). The degree-based ones come first in each row.

Every id is a *local* id of the resident graph, ``0 <= id < num_nodes``. Degrees can come
from the CSC pointers: ``degrees = graph.indptr.diff()`` (in-degree).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from graphstore.errors import ConfigError

__all__ = ["NegativeSample", "num_degree_negatives", "sample_negatives"]


@dataclass(frozen=True, slots=True)
class NegativeSample:
    """Negatives shared by the positives of each chunk.

    Examples
    --------
    >>> g = torch.Generator().manual_seed(0)
    >>> s = sample_negatives(5, num_chunks=2, negatives_per_positive=4, num_nodes=10, generator=g)
    >>> s.nodes.shape, s.chunk_of.tolist(), s.chunk_offsets.tolist()
    (torch.Size([2, 4]), [0, 0, 0, 1, 1], [0, 3, 5])
    >>> s.negatives_of_positives().shape
    torch.Size([5, 4])
    """

    nodes: torch.Tensor
    """int64 [num_chunks, negatives_per_positive]: row ``c`` holds the negatives (local ids)
    shared by every positive of chunk ``c``; columns ``[:num_degree]`` are the degree-based
    draws, the rest uniform. Repeats are possible (drawn with replacement)."""
    chunk_of: torch.Tensor
    """int64 [num_positives]: chunk index of each positive, non-decreasing (chunks are
    contiguous)."""
    chunk_offsets: torch.Tensor
    """int64 [num_chunks + 1]: chunk ``c`` is the positives ``chunk_offsets[c]:chunk_offsets[c+1]``.
    Sizes are ``ceil(P / num_chunks)`` for the first ``P % num_chunks`` chunks and
    ``floor(P / num_chunks)`` after (the `torch.tensor_split` convention)."""
    num_degree: int
    """How many leading columns of ``nodes`` were drawn proportionally to degree."""

    @property
    def num_chunks(self) -> int:
        """Number of chunks (rows of ``nodes``)."""
        return int(self.nodes.shape[0])

    @property
    def negatives_per_positive(self) -> int:
        """Negatives per positive (columns of ``nodes``)."""
        return int(self.nodes.shape[1])

    def negatives_of_positives(self) -> torch.Tensor:
        """int64 [num_positives, negatives_per_positive]: each positive's negatives (a gather)."""
        return self.nodes.index_select(0, self.chunk_of)

    def to(self, device: torch.device | str) -> NegativeSample:
        """The same sample with every tensor on ``device``."""
        return NegativeSample(self.nodes.to(device), self.chunk_of.to(device),
                              self.chunk_offsets.to(device), self.num_degree)


def num_degree_negatives(negatives_per_positive: int, degree_fraction: float) -> int:
    """``floor(degree_fraction * negatives_per_positive + 0.5)``: the degree-based draws per chunk.

    >>> num_degree_negatives(10, 0.25), num_degree_negatives(2, 0.25), num_degree_negatives(3, 0.5)
    (3, 1, 2)
    """
    return min(negatives_per_positive, int(math.floor(degree_fraction * negatives_per_positive + 0.5)))


def _int_arg(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int (got {value!r})")
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum} (got {value})")
    return value


def sample_negatives(num_positives: int, *, num_chunks: int, negatives_per_positive: int,
                     num_nodes: int, generator: torch.Generator, degree_fraction: float = 0.0,
                     candidates: torch.Tensor | None = None, degrees: torch.Tensor | None = None,
                     device: torch.device | str | None = None) -> NegativeSample:
    """Draw ``num_chunks`` rows of negatives, each shared by a contiguous chunk of positives.

    Parameters
    ----------
    num_positives : int
        ``P``, the number of positive edges in the batch (``>= 0``).
    num_chunks : int
        ``C``, between 1 and ``P`` (any ``C >= 1`` when ``P == 0``).
    negatives_per_positive : int
        ``K >= 0``, negatives per chunk (shared by the chunk's positives).
    num_nodes : int
        Resident nodes; local ids are ``0 .. num_nodes - 1``.
    generator : torch.Generator
        Source of randomness, on ``device``; the same seed gives the same sample.
    degree_fraction : float
        In ``[0, 1]``; ``floor(degree_fraction * K + 0.5)`` negatives per chunk are drawn
        proportionally to ``degrees`` (`num_degree_negatives`), the rest uniformly.
    candidates : int tensor [M], optional
        Local ids to draw from (repeats weigh a node more); default all ``num_nodes`` nodes.
    degrees : int or float tensor [num_nodes], optional
        Non-negative weight of each node (e.g. ``graph.indptr.diff()``); needed when
        ``degree_fraction > 0``.
    device : torch.device or str, optional
        Where the result is made; default the device of ``candidates``, else of
        ``degrees``, else the generator's.

    Returns
    -------
    NegativeSample
        ``nodes`` int64 [C, K], ``chunk_of`` int64 [P], ``chunk_offsets`` int64 [C + 1].

    Raises
    ------
    ConfigError
        On a bad count, a fraction outside ``[0, 1]``, degree-based draws without degrees
        (or with negative, non-finite or all-zero candidate degrees), no candidates while
        negatives are requested, out-of-range candidates, or a generator on another device.
    """
    num_positives = _int_arg("num_positives", num_positives, 0)
    num_chunks = _int_arg("num_chunks", num_chunks, 1)
    if num_positives > 0 and num_chunks > num_positives:
        raise ConfigError(f"num_chunks ({num_chunks}) cannot exceed num_positives ({num_positives})")
    k = _int_arg("negatives_per_positive", negatives_per_positive, 0)
    num_nodes = _int_arg("num_nodes", num_nodes, 0)
    if isinstance(degree_fraction, bool) or not isinstance(degree_fraction, (int, float)):
        raise ConfigError(f"degree_fraction must be a number (got {degree_fraction!r})")
    if not 0.0 <= degree_fraction <= 1.0:
        raise ConfigError(f"degree_fraction must be in [0, 1] (got {degree_fraction})")
    if not isinstance(generator, torch.Generator):
        raise ConfigError(f"generator must be a torch.Generator (got {type(generator).__name__})")

    if device is not None:
        device = torch.device(device)
    elif candidates is not None:
        device = candidates.device
    elif degrees is not None:
        device = degrees.device
    else:
        device = generator.device
    if generator.device.type != device.type:
        raise ConfigError(f"generator is on {generator.device} but the sample is made on {device}")

    if candidates is None:
        candidates = torch.arange(num_nodes, dtype=torch.int64, device=device)
    else:
        if (not isinstance(candidates, torch.Tensor) or candidates.dim() != 1
                or candidates.dtype.is_floating_point or candidates.dtype.is_complex
                or candidates.dtype == torch.bool):
            raise ConfigError("candidates must be a 1-D integer tensor of local node ids")
        candidates = candidates.to(device=device, dtype=torch.int64)
        if candidates.numel() and (int(candidates.min()) < 0 or int(candidates.max()) >= num_nodes):
            raise ConfigError(f"candidates must be local ids in [0, {num_nodes})")
    m = int(candidates.numel())
    if k > 0 and m == 0:
        raise ConfigError(f"no candidate nodes to draw {k} negatives per positive from")

    k_deg = num_degree_negatives(k, float(degree_fraction))
    weights = None
    if degree_fraction > 0:
        if degrees is None:
            raise ConfigError("degree_fraction > 0 needs degrees (e.g. graph.indptr.diff())")
        if not isinstance(degrees, torch.Tensor) or tuple(degrees.shape) != (num_nodes,):
            raise ConfigError(f"degrees must be a tensor of shape [{num_nodes}] "
                              f"(got {tuple(getattr(degrees, 'shape', ()))})")
        if degrees.dtype.is_complex or degrees.dtype == torch.bool:
            raise ConfigError(f"degrees must be an int or float tensor (got {degrees.dtype})")
        if m > 0:
            weights = degrees.to(device=device, dtype=torch.float64).index_select(0, candidates)
            if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
                raise ConfigError("degrees of the candidates must be finite and non-negative")
            if k_deg > 0 and not bool((weights > 0).any()):
                raise ConfigError("every candidate has degree 0: no degree-based negative can be drawn")

    parts = []
    if k_deg > 0 and num_chunks > 0:
        assert weights is not None
        # Inverse-CDF draws (what torch.multinomial with replacement does, but without its
        # 2**24-category limit): the first candidate whose cumulative weight exceeds u.
        cdf = torch.cumsum(weights, 0)
        u = torch.rand(num_chunks * k_deg, dtype=torch.float64, device=device, generator=generator)
        total = cdf[-1:]
        below = torch.nextafter(total, torch.zeros_like(total))  # keeps u * total < total
        drawn = torch.searchsorted(cdf, torch.minimum(u * total, below), right=True)
        parts.append(candidates.index_select(0, drawn).view(num_chunks, k_deg))
    k_uni = k - k_deg
    if k_uni > 0:
        drawn = torch.randint(0, m, (num_chunks * k_uni,), generator=generator, device=device)
        parts.append(candidates.index_select(0, drawn).view(num_chunks, k_uni))
    if parts:
        nodes = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
    else:
        nodes = torch.empty(num_chunks, 0, dtype=torch.int64, device=device)

    base, extra = divmod(num_positives, num_chunks)
    sizes = torch.full((num_chunks,), base, dtype=torch.int64, device=device)
    sizes[:extra] += 1
    chunk_offsets = torch.zeros(num_chunks + 1, dtype=torch.int64, device=device)
    torch.cumsum(sizes, 0, out=chunk_offsets[1:])
    chunk_of = torch.repeat_interleave(torch.arange(num_chunks, device=device), sizes,
                                       output_size=num_positives)
    return NegativeSample(nodes.contiguous(), chunk_of, chunk_offsets, k_deg)
