"""Scratch files that let conversion stream: edges and feature rows parked on disk.

Source files are slow to parse (gzip + CSV), so the converter parses them once into
flat binary files in its temporary directory and makes every later pass (partitioning,
bucketing) over those. Nothing here holds more than one chunk in memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["StagedEdges", "EdgeStager"]


@dataclass(frozen=True)
class StagedEdges:
    """Directed edges (source ids) in two flat int64 files, in staging order.

    Undirected sources are already expanded to both directions and self loops already
    dropped (unless kept); duplicates may still be present.
    """

    src_path: str
    """File of [num_edges] int64 source endpoints."""
    dst_path: str
    """File of [num_edges] int64 destination endpoints."""
    rel_path: str | None
    """File of [num_edges] int64 relation ids, or None."""
    num_edges: int
    """Number of staged directed edges."""
    num_nodes: int
    """Every endpoint is in ``[0, num_nodes)``."""

    def _open(self, path: str) -> np.ndarray:
        if self.num_edges == 0:
            return np.zeros(0, dtype=np.int64)
        return np.memmap(path, dtype=np.int64, mode="r", shape=(self.num_edges,))

    def iter_chunks(
        self, chunk_edges: int
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray | None]]:
        """Yield ``(start, src, dst, rel)`` for consecutive runs of ``chunk_edges`` edges.

        The arrays are fresh int64 copies ([m] each), safe to modify; ``rel`` is None
        for an untyped graph.
        """
        src_all, dst_all = self._open(self.src_path), self._open(self.dst_path)
        rel_all = self._open(self.rel_path) if self.rel_path else None
        for start in range(0, self.num_edges, max(1, chunk_edges)):
            stop = min(start + chunk_edges, self.num_edges)
            rel = None if rel_all is None else np.array(rel_all[start:stop])
            yield start, np.array(src_all[start:stop]), np.array(dst_all[start:stop]), rel

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """All ``(src, dst)`` in memory, [num_edges] int64 each (for METIS, which needs it)."""
        return np.array(self._open(self.src_path)), np.array(self._open(self.dst_path))


class EdgeStager:
    """Appends edge chunks to the staging files; `finish` returns the `StagedEdges`.

    A context manager, so that an error while staging closes the files.
    """

    def __init__(self, directory: str, *, num_nodes: int, with_rel: bool) -> None:
        os.makedirs(directory, exist_ok=True)
        self._paths = {
            "src": os.path.join(directory, "edges_src.i64"),
            "dst": os.path.join(directory, "edges_dst.i64"),
        }
        if with_rel:
            self._paths["rel"] = os.path.join(directory, "edges_rel.i64")
        self._files = {k: open(p, "wb") for k, p in self._paths.items()}
        self._num_nodes = num_nodes
        self.num_edges = 0

    def append(self, src: np.ndarray, dst: np.ndarray, rel: np.ndarray | None) -> None:
        """Add [m] int64 edges (already validated) at the end."""
        self._files["src"].write(np.ascontiguousarray(src, dtype=np.int64).tobytes())
        self._files["dst"].write(np.ascontiguousarray(dst, dtype=np.int64).tobytes())
        if "rel" in self._files:
            assert rel is not None  # the caller checked the source's relation column
            self._files["rel"].write(np.ascontiguousarray(rel, dtype=np.int64).tobytes())
        self.num_edges += len(src)

    def close(self) -> None:
        """Close the files (idempotent); `finish` calls it, an error path must too."""
        for f in self._files.values():
            f.close()

    def __enter__(self) -> EdgeStager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def finish(self) -> StagedEdges:
        self.close()
        return StagedEdges(
            src_path=self._paths["src"],
            dst_path=self._paths["dst"],
            rel_path=self._paths.get("rel"),
            num_edges=self.num_edges,
            num_nodes=self._num_nodes,
        )
