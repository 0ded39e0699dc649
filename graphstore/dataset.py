"""`graphstore.open`: a store as a dataset in user code, with its loaders.

`Dataset` is a `Store` (every read of `graphstore.layout.store`) that also hands out the
training machinery without the trainer scripts: node and edge loaders that run an epoch
through the buffer and the samplers (`graphstore.loaders`), and the store's learnable
embeddings. The loaders are imported when first asked for, so opening a store to inspect
it does not import torch.

Where a new read goes: `Store` is the format, and every read of a stored array lives there
(verified, numpy, store ids). `Dataset` is the user-facing view: its methods compose
`Store` reads (and the buffer and samplers) into loaders, tensors and splits for user code,
and never touch Zarr or a chunk file themselves. A method that needs bytes the store does
not yet expose gets a `Store` read first, then a `Dataset` method on top if users want it
shaped differently.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from graphstore.layout.store import Store

if TYPE_CHECKING:
    from graphstore.layout.embeddings import EmbeddingTable
    from graphstore.loaders import EdgeLoader, NodeLoader

__all__ = ["Dataset", "open_dataset"]


class Dataset(Store):
    """A store plus its loaders; see `graphstore.loaders` for the schemes."""

    def node_loader(self, *, split: str = "train", fanouts, batch_size: int, scheme: str = "minibatch",
                    **options: Any) -> NodeLoader:
        """A `NodeLoader` over node split ``split`` (options as its parameters)."""
        from graphstore.loaders import NodeLoader

        return NodeLoader(self, split=split, fanouts=fanouts, batch_size=batch_size, scheme=scheme, **options)

    def edge_loader(self, *, batch_size: int, negatives: int, scheme: str = "minibatch",
                    **options: Any) -> EdgeLoader:
        """An `EdgeLoader` over the store's (training) edges with shared negatives."""
        from graphstore.loaders import EdgeLoader

        return EdgeLoader(self, batch_size=batch_size, negatives=negatives, scheme=scheme, **options)

    def embeddings(self, dim: int | None = None, **create: Any) -> EmbeddingTable:
        """The store's learnable embeddings; with ``dim``, created first if missing
        (needs ``mode="r+"``; ``create`` options as `EmbeddingTable.create`)."""
        from graphstore.layout.embeddings import EmbeddingTable

        if dim is not None:
            return EmbeddingTable.create(self, dim, exist_ok=True, **create)
        return EmbeddingTable.open(self)


def open_dataset(path: str | os.PathLike, mode: str = "r", *, writer_lock: bool = True) -> Dataset:
    """Open the store at ``path`` as a `Dataset`.

    Parameters
    ----------
    path : str or PathLike
        A directory written by `graphstore convert`.
    mode : {"r", "r+"}
        ``"r"`` takes a shared lock and never writes. ``"r+"`` also takes the store's
        writer lock (one writer at a time) and lets learnable embeddings be created and
        written back. Readers never wait; `Store.close` or the process's end releases both.
    writer_lock : bool
        ``"r+"`` without the writer lock: only for the ranks of one data-parallel job whose
        rank 0 holds it (`graphstore.layout.store.open_store`).

    Raises
    ------
    StoreNotFoundError
        Nothing at ``path``, or a directory that is not a complete store.
    StoreLockedError
        ``"r+"`` while another process writes to the store, or the store is being replaced.
    StoreVersionError
        A format version this graphstore does not read.
    StoreError
        A missing or mis-shaped array; the message names it.

    Examples
    --------
    >>> import graphstore
    >>> graphstore.open("missing.gs")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    graphstore.errors.StoreNotFoundError: missing.gs: no such store
    """
    return Dataset(path, mode=mode, writer_lock=writer_lock)
