"""Peak memory of `load_block_data` in a fresh process (started by
tests/distributed/test_full_batch.py): the kernel's resident-set high-water mark, reset
just before the call (``/proc/self/clear_refs``), minus the resident set at that moment.
Prints one JSON line."""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from graphstore.distributed import load_block_data, load_rank_graph
from graphstore.layout.store import open_store


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1])


def main(argv) -> int:
    store = open_store(argv[0])
    dtype = getattr(torch, argv[1])
    graph = load_rank_graph(store, 0, 1)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set
    before = status_kib("VmRSS")
    data = load_block_data(store, graph, dtype=dtype)
    peak = status_kib("VmHWM")
    print(json.dumps({"extra_bytes": (peak - before) * 1024, "rss_before_bytes": before * 1024,
                      "features_bytes": data.features.numel() * data.features.element_size(),
                      "stored_bytes": data.features.numel() * np.dtype(store.manifest.feature_dtype).itemsize,
                      "num_partitions": store.num_partitions}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
