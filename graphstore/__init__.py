"""graphstore: train graph neural networks on graphs larger than memory, from an SSD.

>>> import graphstore
>>> graphstore.FORMAT_VERSION
1
"""

from graphstore.errors import (
    BufferClosedError,
    ConfigError,
    CorruptStoreError,
    GraphStoreError,
    SourceError,
    SourceNotFoundError,
    StoreError,
    StoreExistsError,
    StoreNotFoundError,
    StoreVersionError,
)
from graphstore._version import __version__
from graphstore.layout.base import FORMAT_VERSION, Manifest
from graphstore.layout.store import Store
from graphstore.dataset import Dataset
from graphstore.dataset import open_dataset as open


__all__ = [
    "FORMAT_VERSION",
    "BufferClosedError",
    "ConfigError",
    "CorruptStoreError",
    "Dataset",
    "GraphStoreError",
    "Manifest",
    "SourceError",
    "SourceNotFoundError",
    "Store",
    "StoreError",
    "StoreExistsError",
    "StoreNotFoundError",
    "StoreVersionError",
    "__version__",
    "convert",
    "open",
    "verify",
]


def convert(source, out, **options):
    """Convert ``source`` into a store at ``out``; keyword options as `ConvertOptions`.

    Returns the new store's `Manifest`. See ``graphstore convert --help``.
    """
    from graphstore.layout._convert import ConvertOptions
    from graphstore.layout._convert import convert as _convert

    return _convert(source, out, ConvertOptions(**options))


def verify(path):
    """Re-read the store at ``path``; raise `CorruptStoreError` at the first problem."""
    from graphstore.layout._verify import verify_store

    return verify_store(path)
