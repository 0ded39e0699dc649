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
    ReadOnlyStoreError,
    SourceError,
    SourceNotFoundError,
    StoreError,
    StoreExistsError,
    StoreLockedError,
    StoreNotFoundError,
    StoreVersionError,
    StoreWriteError,
    UnverifiedReadsWarning,
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
    "ReadOnlyStoreError",
    "SourceError",
    "SourceNotFoundError",
    "Store",
    "StoreError",
    "StoreExistsError",
    "StoreLockedError",
    "StoreNotFoundError",
    "StoreVersionError",
    "StoreWriteError",
    "UnverifiedReadsWarning",
    "__version__",
    "convert",
    "open",
    "upgrade",
    "verify",
]


def convert(source, out, **options):
    """Convert ``source`` into a store at ``out``; keyword options as `ConvertOptions`.

    Returns the new store's `Manifest`. See ``graphstore convert --help``.
    """
    from graphstore.layout._convert import ConvertOptions
    from graphstore.layout._convert import convert as _convert

    return _convert(source, out, ConvertOptions(**options))


def upgrade(path):
    """Add segment checksums to a store written before them (see ``graphstore upgrade``).

    Returns the array name -> segment kind mapping written. Takes the store's writer lock.
    """
    from graphstore.layout._upgrade import upgrade_store

    return upgrade_store(path)


def verify(path):
    """Re-read the store at ``path``; raise `CorruptStoreError` at the first problem."""
    from graphstore.layout._verify import verify_store

    return verify_store(path)
