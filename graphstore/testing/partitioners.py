"""The invariants every registered node partitioner keeps, as plain checks.

`check_partitioner` stages a small edge list, partitions it through `partition_nodes` (as
``graphstore convert`` does) and checks the result; `check_partitioner_grid` runs it over a
few small graphs that break partitioners (one node, no edges, isolated nodes, self loops
and duplicate edges, ``p = N``, an empty last block). What is checked, for any partitioner:

- one label per node, int64 in ``[0, p)`` (a partitioner returning anything else is
  stopped by `partition_nodes`; the check reports it as a broken invariant);
- the same seed gives the same labels, and a second run leaves the first run's labels as
  they were (a result is a value, even when it is a file-backed array);
- ``info`` is a JSON-safe dict with ``seconds`` (it goes into the store's metadata);
- with ``exact_blocks`` (the promise of every built-in partitioner) label ``k`` holds
  exactly as many nodes as store block ``k``: ``ceil(N / p)``, fewer in the last blocks,
  so `store_order` keeps the labels as the store's partitions. A partitioner that leaves
  balancing to `equal_blocks` passes ``exact_blocks=False``.

A failure raises `AssertionError` naming the partitioner, the input and the invariant.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np

from graphstore.layout._staging import EdgeStager, StagedEdges
from graphstore.layout.partition import PartitionResult, partition_nodes

__all__ = ["GRAPHS", "check_partitioner", "check_partitioner_grid", "stage_edges"]


def _random_edges(num_nodes: int, num_edges: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, num_nodes, num_edges), rng.integers(0, num_nodes, num_edges)
    dst[:3] = src[:3]  # self loops
    src[-4:], dst[-4:] = src[3:7], dst[3:7]  # duplicates
    return src, dst


_RANDOM = _random_edges(40, 120, 0)

GRAPHS: tuple[tuple[str, int, np.ndarray, np.ndarray, tuple[int, ...]], ...] = (
    ("one node", 1, np.zeros(0, np.int64), np.zeros(0, np.int64), (1,)),
    ("no edges", 6, np.zeros(0, np.int64), np.zeros(0, np.int64), (1, 3, 6)),
    ("two triangles, a bridge and two isolated nodes", 8,
     np.array([0, 1, 2, 3, 4, 5, 2]), np.array([1, 2, 0, 4, 5, 3, 3]), (2, 3)),
    ("a ring of 10 (the last of 6 blocks is empty)", 10, np.arange(10), (np.arange(10) + 1) % 10, (6,)),
    ("40 nodes, 120 random edges with self loops and duplicates", 40, *_RANDOM, (1, 3, 7, 40)),
)
"""(description, num_nodes, src, dst, partition counts) of the graphs `check_partitioner_grid`
partitions."""


def _block_sizes(num_nodes: int, num_partitions: int) -> np.ndarray:
    size = -(-num_nodes // num_partitions)
    return np.clip(num_nodes - np.arange(num_partitions, dtype=np.int64) * size, 0, size)


def stage_edges(directory: str | Path, num_nodes: int, src, dst) -> StagedEdges:
    """``src -> dst`` staged in ``directory`` as the converter stages a source's edges."""
    stager = EdgeStager(str(directory), num_nodes=num_nodes, with_rel=False)
    stager.append(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64), None)
    return stager.finish()


def check_partitioner(name: str, *, num_nodes: int, src, dst, num_partitions: int, seed: int = 0,
                      chunk_edges: int = 1 << 22, exact_blocks: bool = True,
                      graph: str = "") -> PartitionResult:
    """Partition the graph ``src -> dst`` with the registered partitioner ``name``; check it.

    Parameters
    ----------
    name : str
        A registered partitioner (`available_partitioners`).
    num_nodes : int
        N; every endpoint is in ``[0, N)``.
    src, dst : array-like of int, shape (E,)
        Directed edges (self loops and duplicates allowed).
    num_partitions, seed, chunk_edges
        As for `partition_nodes`.
    exact_blocks : bool, default True
        Require each label's size to be its store block's (``ceil(N / p)``, the last
        blocks shorter), as the built-in partitioners promise.
    graph : str
        A description of the graph for messages.

    Returns
    -------
    PartitionResult
        The first run's result, labels copied to memory (the staging directory is gone).

    Raises
    ------
    AssertionError
        The first broken invariant, naming the partitioner, the input and the invariant.
    """
    where = (f"partitioner {name!r} ({graph or 'graph'}: num_nodes={num_nodes}, num_edges={len(src)}, "
             f"num_partitions={num_partitions}, seed={seed}, chunk_edges={chunk_edges})")

    def fail(problem: str) -> NoReturn:
        raise AssertionError(f"{where}: {problem}")

    with tempfile.TemporaryDirectory(prefix="graphstore-check-") as tmp:
        edges = stage_edges(tmp, num_nodes, src, dst)

        def run() -> PartitionResult:
            try:
                return partition_nodes(name, edges=edges, num_partitions=num_partitions, seed=seed,
                                       chunk_edges=chunk_edges)
            except RuntimeError as exc:  # partition_nodes' guard against a partitioner's bad labels
                fail(f"partition_nodes refused the labels ({exc})")

        first = run()
        if not isinstance(first, PartitionResult) or first.method != name:
            fail(f"partition_nodes returned {first!r}, expected a PartitionResult with method {name!r}")
        labels = np.array(first.labels)
        if labels.dtype != np.int64 or labels.shape != (num_nodes,):
            fail(f"labels are {labels.shape} {labels.dtype}, expected ({num_nodes},) int64")
        if num_nodes and (labels.min() < 0 or labels.max() >= num_partitions):
            fail(f"labels in [{labels.min()}, {labels.max()}], outside [0, {num_partitions})")
        if not isinstance(first.info, dict) or "seconds" not in first.info:
            fail(f"info must be a dict with 'seconds' (got {first.info!r})")
        try:
            json.dumps(first.info)
        except (TypeError, ValueError) as exc:
            fail(f"info is not JSON-safe ({exc}); it is written into the store's metadata")

        second = run()
        if not np.array_equal(np.asarray(second.labels), labels):
            moved = int(np.flatnonzero(np.asarray(second.labels) != labels)[0])
            fail(f"two runs with seed {seed} disagree (node {moved}: {labels[moved]} then "
                 f"{second.labels[moved]}); the same seed must give the same labels")
        if not np.array_equal(np.asarray(first.labels), labels):
            fail("a second run changed the first run's labels (a result must keep its own labels)")

        info = dict(first.info)
        del first, second  # release the memmaps before the directory goes
    sizes = np.bincount(labels, minlength=num_partitions)
    blocks = _block_sizes(num_nodes, num_partitions)
    if exact_blocks and not np.array_equal(sizes, blocks):
        fail(f"label sizes {sizes.tolist()} are not the store's block sizes {blocks.tolist()}")
    return PartitionResult(labels=labels, method=name, info=info)


def check_partitioner_grid(name: str, *, graphs: Iterable[tuple] = GRAPHS, seeds: Sequence[int] = (0, 2**40),
                           chunk_edges: Sequence[int] = (1 << 22, 7), exact_blocks: bool = True) -> int:
    """`check_partitioner` over every graph of ``graphs``, partition count, seed and
    ``chunk_edges``; returns the number of runs checked."""
    checked = 0
    for description, num_nodes, src, dst, counts in graphs:
        for num_partitions in counts:
            for seed in seeds:
                for chunk in chunk_edges:
                    check_partitioner(name, num_nodes=num_nodes, src=src, dst=dst, num_partitions=num_partitions,
                                      seed=seed, chunk_edges=chunk, exact_blocks=exact_blocks,
                                      graph=description)
                    checked += 1
    return checked
