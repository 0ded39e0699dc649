"""ctypes binding of the compiled DENSE kernel (``dense.c`` beside this file).

The kernel is a plain C shared library with no Python or torch headers, built by
``setup.py`` at install time as ``graphstore.sample._native._dense`` (an "extension module"
only in name: it is loaded here with ctypes, never imported). When it is missing (no C
compiler at install time, an unusual platform) `library` returns None, `load_error` says
why, and `graphstore.sample.dense` falls back to its torch code.

The caller (`graphstore.sample.dense`) validates the arguments; this module only turns
tensors into pointers, and the kernel's error codes into exceptions.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import threading
import weakref
from pathlib import Path

import numpy as np
import torch

from graphstore._native_lib import load_library
from graphstore.errors import ConfigError

__all__ = ["ABI_VERSION", "empty_int64", "library", "load_error", "sample_dense_native", "supports"]

logger = logging.getLogger(__name__)

ABI_VERSION = 3
"""What ``gs_abi_version()`` must return: a stale build from an older source is refused."""

_OK, _NO_MEMORY, _BAD_GRAPH, _BAD_WORKSPACE, _BAD_ARGUMENT = range(5)


class _Graph(ctypes.Structure):
    """Mirror of ``gs_graph`` in dense.c (field order and types must match)."""

    _fields_ = [
        ("num_nodes", ctypes.c_int64),
        ("indptr", ctypes.c_void_p),
        ("indices", ctypes.c_void_p),
        ("out_indptr", ctypes.c_void_p),
        ("out_indices", ctypes.c_void_p),
        ("num_in_edges", ctypes.c_int64),
        ("num_out_edges", ctypes.c_int64),
        ("indptr_is64", ctypes.c_int32),
        ("indices_is64", ctypes.c_int32),
        ("out_indptr_is64", ctypes.c_int32),
        ("out_indices_is64", ctypes.c_int32),
    ]


_state: dict = {}


def _load() -> tuple[ctypes.CDLL | None, str | None]:
    lib, error = load_library(Path(__file__).resolve().parent, "_dense", "gs_abi_version", ABI_VERSION)
    if lib is None:
        return None, error
    p64 = ctypes.POINTER(ctypes.c_int64)
    lib.gs_ctx_new.restype = ctypes.c_void_p
    lib.gs_ctx_new.argtypes = []
    lib.gs_ctx_free.restype = None
    lib.gs_ctx_free.argtypes = [ctypes.c_void_p]
    lib.gs_dense_sample.restype = ctypes.c_int
    lib.gs_dense_sample.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Graph), ctypes.c_void_p, ctypes.c_int64,
                                    p64, ctypes.c_int32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_int32,
                                    ctypes.c_void_p, ctypes.c_int32, p64, p64]
    lib.gs_dense_export.restype = ctypes.c_int
    lib.gs_dense_export.argtypes = [ctypes.c_void_p] * 5
    lib.gs_dense_discard.restype = None
    lib.gs_dense_discard.argtypes = [ctypes.c_void_p]
    return lib, None


class _Context:
    """One kernel context (its buffers survive from batch to batch), freed with this object."""

    def __init__(self, lib: ctypes.CDLL):
        self._free = lib.gs_ctx_free
        self.ptr = lib.gs_ctx_new()
        if not self.ptr:
            raise MemoryError("the compiled DENSE kernel could not allocate a context")

    def __del__(self):
        if getattr(self, "ptr", None):
            self._free(self.ptr)
            self.ptr = None


# One context per thread: reusing its buffers saves the page faults of fresh memory (about
# a quarter of the kernel's time at four hops of 20), and per-thread keeps concurrent
# samplers (each with its own workspace) apart. A thread's context goes with the thread.
_contexts = threading.local()


def _context(lib: ctypes.CDLL) -> _Context:
    ctx = getattr(_contexts, "ctx", None)
    if ctx is None:
        ctx = _contexts.ctx = _Context(lib)
    return ctx


def library() -> ctypes.CDLL | None:
    """The loaded kernel, or None when it is unavailable (see `load_error`); loads once."""
    if "lib" not in _state:
        lib, error = _load()
        _state["lib"], _state["error"] = lib, error
        if error is not None:
            # A warning, once (this runs once per process): the torch path is right but
            # several times slower, and a user who lost the build should hear why.
            logger.warning("compiled DENSE kernel unavailable, sampling with torch (slower): %s", error)
    return _state["lib"]


def load_error() -> str | None:
    """Why `library` returned None, or None when the kernel is loaded."""
    library()
    return _state["error"]


class _OutputPool:
    """Recycles the memory of the int64 arrays of DENSEs that are no longer referenced.

    Why: a fresh array of many MB costs a page fault and a page clear per 4 KiB when first
    written, which at four hops of 20 was about 50 ms per batch, a sixth of the whole
    sample. A pooled array is a numpy array handed to torch without a copy
    (`torch.from_numpy`); when the last tensor on it goes, a finalizer puts it back here for
    the next batch. At most `MAX_FREE` arrays wait in the pool (the largest are kept), and
    that memory stays with the process (one pool for all threads).
    """

    MAX_FREE = 8
    MIN_ELEMENTS = 1 << 16
    """Below 512 KiB malloc recycles memory by itself; those are plain torch.empty."""

    def __init__(self) -> None:
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()
        # Arrays come back through a deque, not under the lock: the finalizer can run in any
        # thread, or in this one in the middle of `empty` when an allocation there triggers
        # the cyclic garbage collector; deque.append is atomic and takes no lock. maxlen
        # bounds what waits there when no batch comes to collect it.
        self._returned: collections.deque[np.ndarray] = collections.deque(maxlen=2 * self.MAX_FREE)

    def empty(self, n: int) -> torch.Tensor:
        """An uninitialised int64 tensor [n]."""
        if n < self.MIN_ELEMENTS:
            return torch.empty(n, dtype=torch.int64)
        base = None
        with self._lock:
            while self._returned:
                self._free.append(self._returned.popleft())
            if len(self._free) > self.MAX_FREE:
                self._free.sort(key=lambda a: a.size, reverse=True)
                del self._free[self.MAX_FREE:]
            best = -1
            for i, a in enumerate(self._free):
                if a.size >= n and (best < 0 or a.size < self._free[best].size):
                    best = i
            if best >= 0:
                base = self._free.pop(best)
        if base is None:
            # Rounded up (under 1/8 extra) so that the next batch, a little larger, still fits.
            step = 1 << max(n.bit_length() - 4, 0)
            base = np.empty(-(-n // step) * step, dtype=np.int64)
        view = base[:n]
        finalizer = weakref.finalize(view, self._returned.append, base)
        finalizer.atexit = False
        return torch.from_numpy(view)


_pool = _OutputPool()


def _after_fork_in_child() -> None:
    # A lock some parent thread held at the fork stays held in the child, whose copy of
    # that thread never runs (DataLoader workers are forks).
    _pool._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def empty_int64(n: int) -> torch.Tensor:
    """An uninitialised int64 CPU tensor [n], its memory recycled from finished batches."""
    return _pool.empty(n)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _index_dtype_ok(t: torch.Tensor) -> bool:
    return t.dtype in (torch.int32, torch.int64)


def supports(graph) -> str | None:
    """None when the kernel can sample ``graph`` as it is, else the reason it cannot."""
    tensors = [graph.indptr, graph.indices]
    if graph.out_indptr is not None and graph.out_indices is not None:
        tensors += [graph.out_indptr, graph.out_indices]
    for t in tensors:
        if t.device.type != "cpu":
            return f"the graph is on {t.device}; the compiled kernel is CPU-only"
        if not _index_dtype_ok(t):
            return f"graph index arrays must be int32 or int64 (got {t.dtype})"
    return None


def sample_dense_native(graph, targets: torch.Tensor, fanouts: tuple[int, ...], *, seed: int, both: bool,
                        return_edge_ids: bool, workspace: torch.Tensor
                        ) -> tuple[torch.Tensor, list[int], torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Run the kernel; see `graphstore.sample.dense.sample_dense` for the meaning of it all.

    Parameters
    ----------
    graph : SampleGraph
        On the CPU, index arrays int32 or int64 (`supports` said yes).
    targets : int64 tensor [T]
        Distinct, in range (checked by the caller).
    fanouts : tuple of int
        Validated, ``>= -1``.
    seed : int
        In ``[0, 2**64)``; the kernel's random stream.
    both : bool
        In- and out-neighbours.
    return_edge_ids : bool
        Also return each sampled edge's position.
    workspace : int32 or int64 tensor [num_nodes]
        All -1 (int32 only below 2**31 nodes); handed back all -1.

    Returns
    -------
    node_ids : int64 tensor [N]
    block_sizes : list of int, length L + 1
        Nodes first reached at hop ``h`` (``h = 0`` the targets).
    nbrs : int64 tensor [E]
    nbr_offsets : int64 tensor [S + 1]
    edge_ids : int64 tensor [E] or None

    Raises
    ------
    ConfigError
        The graph's pointers or indices are out of range, or the workspace was not all -1
        (it is then reset to all -1).
    MemoryError
        The kernel could not allocate its buffers.
    """
    lib = library()
    if lib is None:
        raise ConfigError(f"the compiled DENSE kernel is unavailable: {load_error()}")

    def contig(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.contiguous()

    indptr, indices = contig(graph.indptr), contig(graph.indices)
    out_indptr = contig(graph.out_indptr) if both else None
    out_indices = contig(graph.out_indices) if both else None
    targets = targets.contiguous()
    g = _Graph(int(graph.num_nodes), _ptr(indptr), _ptr(indices), _ptr(out_indptr), _ptr(out_indices),
               int(indices.numel()), int(out_indices.numel()) if both else 0,
               int(indptr.dtype == torch.int64), int(indices.dtype == torch.int64),
               int(out_indptr is not None and out_indptr.dtype == torch.int64),
               int(out_indices is not None and out_indices.dtype == torch.int64))
    num_hops = len(fanouts)
    c_fanouts = (ctypes.c_int64 * num_hops)(*fanouts)
    sizes = (ctypes.c_int64 * (num_hops + 1))()
    num_edges = ctypes.c_int64()
    ctx = _context(lib).ptr
    rc = lib.gs_dense_sample(ctx, ctypes.byref(g), targets.data_ptr(), targets.numel(), c_fanouts, num_hops,
                             int(both), seed, int(return_edge_ids), workspace.data_ptr(),
                             int(workspace.dtype == torch.int64), sizes, ctypes.byref(num_edges))
    if rc != _OK:
        _raise(rc, workspace)
    try:
        block_sizes = list(sizes)
        n = sum(block_sizes)
        sampled = n - block_sizes[-1]
        node_ids = empty_int64(n)
        nbrs = empty_int64(num_edges.value)
        nbr_offsets = empty_int64(sampled + 1)
        edge_ids = empty_int64(num_edges.value) if return_edge_ids else None
    except BaseException:
        lib.gs_dense_discard(ctx)   # resets the workspace
        raise
    # export resets the workspace whatever it returns.
    rc = lib.gs_dense_export(ctx, node_ids.data_ptr(), nbrs.data_ptr(), nbr_offsets.data_ptr(),
                             _ptr(edge_ids))
    if rc != _OK:
        _raise(rc, workspace)
    return node_ids, block_sizes, nbrs, nbr_offsets, edge_ids


def _raise(rc: int, workspace: torch.Tensor) -> None:
    if rc == _NO_MEMORY:
        raise MemoryError("the compiled DENSE kernel could not allocate its sample buffers")
    if rc == _BAD_GRAPH:
        raise ConfigError("graph indptr/indices point outside their arrays (a corrupted CSC); "
                          "rebuild the graph")
    if rc == _BAD_WORKSPACE:
        # Entries the kernel did not set may be stale; the only safe state is all -1.
        workspace.fill_(-1)
        raise ConfigError("workspace was not all -1; pass one from new_workspace(graph) and do not "
                          "share it between concurrent calls (it has been reset)")
    raise ConfigError(f"the compiled DENSE kernel rejected its arguments (code {rc})")
