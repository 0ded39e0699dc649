"""`make demo`: the main job on the embedded dataset (Cora, data/cora), offline.

Converts Cora into a store with 8 METIS partitions, verifies it end to end, prints its
summary and reads one partition back through `graphstore.open`; then trains a 2-layer
GraphSage with the mega-batch scheme forced out of core (HierBatching: 2 of the 8
partitions resident plus a static cache, reuse 2; by default the buffer is sized from
memory, and Cora would fit whole) and with the in-memory minibatch scheme (the reference),
and prints their accuracies side by side: the test accuracy of the best-validation model,
restored at the end. About a minute here.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EPOCHS = 40


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
    return train_both(out)


def train_both(store_path: Path) -> int:
    """Both schemes, the same model and seed; a summary row each from their metrics JSON."""
    import json

    sys.path.insert(0, str(REPO))  # trainers/ is a folder of scripts, not part of the package
    from trainers import node_classification

    rows = []
    for scheme in ("megabatch", "minibatch"):
        metrics = REPO / "demo_out" / f"cora_{scheme}.json"
        argv = ["--config", str(REPO / "trainers" / "configs" / "cora_sage.toml"), "--store", str(store_path),
                "--scheme", scheme, "--epochs", str(EPOCHS), "--metrics-out", str(metrics)]
        if scheme == "megabatch":
            argv += ["--buffer-partitions", "2"]
        print(f"\n$ python trainers/node_classification.py {' '.join(argv)}", flush=True)
        start = time.perf_counter()
        code = node_classification.main(argv)
        if code:
            return code
        m = json.loads(metrics.read_text())
        epochs = m["epochs"]
        rows.append((scheme, m["config"]["loaders"]["train"], m["final"]["test"]["acc"], m["final"]["epoch"] + 1,
                     len(epochs), sum(e["time_s"] for e in epochs) / len(epochs),
                     sum(e["io"]["bytes_read"] for e in epochs) / len(epochs)))
    print(f"\nCora, 2-layer GraphSage, at most {EPOCHS} epochs (early stopping on validation), seed 0:")
    print(f"{'scheme':10} {'resident':>12} {'test acc':>9} {'best epoch':>11} {'trained':>8} {'s/epoch':>8} "
          f"{'read/epoch':>11}")
    for scheme, s, acc, best, trained, epoch_s, read in rows:
        resident = f"{s['capacity']}/{s['num_partitions']} + {s['static_cache_nodes']}"
        print(f"{scheme:10} {resident:>12} {acc:9.3f} {best:11d} {trained:8d} {epoch_s:8.2f} {read / 2**20:8.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
