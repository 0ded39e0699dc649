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

# The store and dataset classes resolve on first use (PEP 562): `import graphstore.errors`
# or a light submodule (the generator's `graphstore.layout.hashing`) stays as cheap as numpy,
# without zarr, pandas and the source readers.
_LAZY = {"FORMAT_VERSION": ("graphstore.layout.base", "FORMAT_VERSION"),
         "Manifest": ("graphstore.layout.base", "Manifest"), "Store": ("graphstore.layout.store", "Store"),
         "Dataset": ("graphstore.dataset", "Dataset"), "open": ("graphstore.dataset", "open_dataset"),
         # Stores from graphs in memory: numpy/torch arrays, PyG's Data, DGL's DGLGraph.
         "from_arrays": ("graphstore.layout.sources.arrays", "from_arrays"),
         "from_dgl": ("graphstore.interop.from_memory", "from_dgl"),
         "from_pyg": ("graphstore.interop.from_memory", "from_pyg")}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'graphstore' has no attribute {name!r}")


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
    "from_arrays",
    "from_dgl",
    "from_pyg",
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


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
