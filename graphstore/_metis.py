"""METIS k-way partitioning (through pymetis), wrapped once for every stage that cuts a graph:
the ``metis`` and ``stream`` partitioners (layout) and the micro-batch strategies (sample).

A top-level leaf module because layout and sample may not import each other; pymetis is
imported on the first call, so what does not use METIS works without it.
"""

from __future__ import annotations

import numpy as np

from graphstore.errors import ConfigError

__all__ = ["metis_index_dtype", "metis_parts"]


def _pymetis():
    try:
        import pymetis
    except ImportError as exc:
        raise ConfigError(f"METIS partitioning needs pymetis, which does not import ({exc}); "
                          "pip install pymetis, or pick a method that does not use METIS") from None
    return pymetis


def metis_index_dtype() -> np.dtype:
    """The integer dtype pymetis reads without a copy; build large CSR arrays in it.

    Raises
    ------
    ConfigError
        If pymetis is not installed.
    """
    return np.dtype(_pymetis().zero_copy_dtype())


def metis_parts(
    indptr: np.ndarray,
    indices: np.ndarray,
    num_parts: int,
    *,
    node_weights: np.ndarray | None = None,
    edge_weights: np.ndarray | None = None,
    seed: int = 0,
    ufactor: int | None = None,
) -> tuple[np.ndarray, int]:
    """METIS k-way minimum edge cut of a symmetric graph given as CSR.

    Parameters
    ----------
    indptr : int array [n + 1]
        Row offsets.
    indices : int array [nnz]
        Column ids; every edge listed in both directions, no self loops (METIS's input).
    num_parts : int
        k.
    node_weights : int array [n], optional
        Balance weight of each node (1 each by default).
    edge_weights : int array [nnz], optional
        Weight of each entry of ``indices``, the same both ways (1 each by default).
    seed : int
        Non-negative; the same seed gives the same parts on the same METIS build. Folded
        into ``[0, 2**31 - 1)`` because METIS keeps it in a C int.
    ufactor : int, optional
        Allowed imbalance in thousandths; METIS's own default (30 for k-way) when None.

    Returns
    -------
    parts : int64 array [n]
        Part of each node, in ``[0, num_parts)``; a part may be empty.
    edge_cuts : int
        METIS's objective: the total weight of the cut edges (each counted once).

    Raises
    ------
    ConfigError
        If pymetis is not installed.
    """
    pymetis = _pymetis()
    dtype = pymetis.zero_copy_dtype()

    def as_index(a: np.ndarray) -> np.ndarray:
        # No copy when already contiguous in ``dtype``, as callers build large arrays.
        return np.ascontiguousarray(a, dtype=dtype)

    options = {"seed": int(seed % (2**31 - 1))}
    if ufactor is not None:
        options["ufactor"] = ufactor
    weights = {}
    if node_weights is not None:
        weights["vweights"] = as_index(node_weights)
    if edge_weights is not None:
        weights["eweights"] = as_index(edge_weights)
    result = pymetis.part_graph(
        int(num_parts),
        adjacency=pymetis.CSRAdjacency(adj_starts=as_index(indptr), adjacent=as_index(indices)),
        options=pymetis.Options(**options),
        **weights,
    )
    return np.asarray(result.vertex_part, dtype=np.int64), int(result.edge_cuts)
