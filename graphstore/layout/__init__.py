"""The on-disk store: format (`base`), conversion, reading (`store`), verification."""

from graphstore.layout.base import FORMAT_VERSION, Manifest
from graphstore.layout.store import Store, open_store

__all__ = ["FORMAT_VERSION", "Manifest", "Store", "open_store"]
