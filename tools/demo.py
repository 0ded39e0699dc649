"""`make demo`: the main job on the embedded dataset (Cora, data/cora), offline.

Converts Cora into a store with 8 METIS partitions, verifies it end to end, prints its
summary and reads one partition back through `graphstore.open`. Training joins in when the
trainers exist.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    import graphstore
    from graphstore.cli import main as cli

    out = REPO / "demo_out" / "cora.gs"
    steps = [
        ["convert", str(REPO / "data" / "cora"), str(out), "--partitions", "8",
         "--partitioner", "metis", "--overwrite"],
        ["verify", str(out)],
        ["info", str(out)],
    ]
    for argv in steps:
        print(f"$ graphstore {' '.join(argv)}", flush=True)
        start = time.perf_counter()
        code = cli(argv)
        if code:
            return code
        print(f"  ({time.perf_counter() - start:.2f} s)\n", flush=True)

    store = graphstore.open(out)
    print(store)
    feats = store.read_features(0)
    src, dst, _ = store.read_bucket(0, 0)
    train = store.read_node_split("train")
    print(f"partition 0: {feats.shape[0]} rows x {feats.shape[1]} features; "
          f"bucket (0, 0): {len(src):,} edges; train split: {len(train)} nodes; "
          f"source ids of the first 5 store rows: {store.to_source_ids(range(5)).tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
