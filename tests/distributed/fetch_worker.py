"""One rank of the distributed feature fetch check (started by torchrun from
test_feature_fetch.py): macrobatch with B = 1 and B = all, the rows of a round fetched from
the ranks owning them (`PartitionedFetch`). Per case: (a) every batch's features are the
store's rows of its input nodes; (b) a float64 GraphSAGE with dropout trained two epochs
under DDP through the trainer's `train_epoch` ends where the same run reading the store
ends, and where one process replaying the ranks' batches with gradient accumulation ends
(`dp_worker.replay`); (c) the fetch counters per epoch. Ranks split the replays.

    torchrun --nproc-per-node 2 tests/distributed/fetch_worker.py STORE OUT_DIR [CASE ...]

CASEs default to B = 1 (every N-th batch) and B = all (each rank its own block's targets). ``fetch-split`` is B = all under a ``macro_batch_bytes``
that holds about two mini-batches' rows, so each rank's one macro-batch is fetched in
several collective rounds; run with ``fetch-Ball`` too, it also records how far it ends
from the unsplit run (``vs_unsplit_max_abs_diff``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import graphstore
from graphstore.distributed import PartitionedFetch, fail_fast, init_process_group, wrap_model
from graphstore.loaders import NodeLoader
from tests.distributed import dp_worker
from trainers import node_classification as nc

SEED, EPOCHS = dp_worker.SEED, dp_worker.EPOCHS
# Cora: 1433 float32 features, 5,732 bytes a row; a 16-target batch with fanouts (4, 3) has
# 105-145 input rows (0.6-0.8 MB), so 1.6 MB holds the union of about two: 2-3 rounds a rank
# in place of 1, while the samples (kilobytes) never cut the macro-batch short.
SPLIT_BYTES = 1_600_000
# B = 1 with every N-th batch (9 batches: 5 and 4, so the shorter rank pads), B = all with
# the default assignment (each rank its own block's targets, equal shares).
CASES = {"fetch-B1": ("macrobatch", {"macro_batches": 1, "seed_assignment": "interleaved"}, None),
         "fetch-Ball": ("macrobatch", {"macro_batches": -1}, None),
         "fetch-split": ("macrobatch", {"macro_batches": -1, "macro_batch_bytes": SPLIT_BYTES}, None)}
DEFAULT_CASES = ("fetch-B1", "fetch-Ball")
dp_worker.CASES.update(CASES)  # the replay builds its (store-reading) loaders from these


def loader(store, case: str, rank: int, world: int, fetch) -> NodeLoader:
    scheme, options, _ = CASES[case]
    return NodeLoader(store, split="train", fanouts=(4, 3), batch_size=16, scheme=scheme, seed=SEED, rank=rank,
                      world_size=world, feature_fetch=fetch, **options)


def train(store, case: str, rank: int, world: int, fetch) -> tuple[torch.Tensor, torch.Tensor, list]:
    model, opt = dp_worker.make_model(store, case)
    initial = dp_worker.flat(model)
    ddp = wrap_model(model)
    data = loader(store, case, rank, world, fetch)
    epochs = []
    for epoch in range(EPOCHS):
        loss, _ = nc.train_epoch(ddp, opt, data, epoch, torch.device("cpu"), seed=SEED)
        epochs.append({"loss": loss, "batches": data.num_batches(epoch), "stats": data.fetch_stats.to_dict()})
    return dp_worker.flat(model), initial, epochs


@fail_fast
def main() -> int:
    torch.set_num_threads(1)
    store_path, out_dir = sys.argv[1], Path(sys.argv[2])
    cases = sys.argv[3:] or DEFAULT_CASES
    rank, world = init_process_group("cpu", timeout_s=60)
    store = graphstore.open(store_path)
    fetch = PartitionedFetch(store, timeout_s=60)
    everything = torch.from_numpy(store.read_rows("nodes/features", 0, store.num_nodes))
    results, params = {}, {}
    for i, case in enumerate(cases):
        # (a) an epoch's batches, their features against the store's rows.
        worst, batches = 0.0, 0
        for batch in loader(store, case, rank, world, fetch).epoch(0):
            want = everything.index_select(0, batch.store_ids)
            worst = max(worst, float((batch.features - want).abs().max()))
            batches += 1
        # (b) training, rows from their owners and from the store.
        trained, initial, epochs = train(store, case, rank, world, fetch)
        from_store, _, _ = train(store, case, rank, world, None)
        r = {"features_max_abs_diff": worst, "batches_checked": batches, "epochs": epochs,
             "rows_held": fetch.rows_held, "vs_store_max_abs_diff": float((trained - from_store).abs().max()),
             "moved": float((trained - initial).abs().max())}
        if i % world == rank:
            want, counts = dp_worker.replay(store, case, world)
            r.update(replay_max_abs_diff=float((trained - want).abs().max()), batches_per_rank=counts)
        results[case] = r
        params[case] = trained
    if "fetch-split" in params and "fetch-Ball" in params:
        results["fetch-split"]["vs_unsplit_max_abs_diff"] = float((params["fetch-split"] - params["fetch-Ball"])
                                                                  .abs().max())
    store.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.json").write_text(json.dumps({"world_size": world, "rank": rank,
                                                          "num_nodes": int(everything.shape[0]),
                                                          "feature_dim": int(everything.shape[1]),
                                                          "split_bytes": SPLIT_BYTES,
                                                          "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
