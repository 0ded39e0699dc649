"""The on-disk store: format (`base`), conversion, reading (`store`), verification.

Besides the store, the few layout helpers the buffer builds on are public here: the
4096-aligned allocation its slots are read into (`aligned_empty`, what ``O_DIRECT`` reads
need), the read counters it reports (`ReadStats`), and the rule that picks HierBatching's
static-cache nodes (`hub_ids`, the one the store's ``hubs/`` group is written with).
"""

from graphstore.layout._chunkio import ReadStats, aligned_empty
from graphstore.layout._hubs import hub_ids
from graphstore.layout.base import FORMAT_VERSION, Manifest
from graphstore.layout.store import Store, open_store

__all__ = ["FORMAT_VERSION", "Manifest", "ReadStats", "Store", "aligned_empty", "hub_ids", "open_store"]
