"""One rank of the link-prediction failure checks, by MODE:

- ``raise``: both ranks train the disk scheme's disjoint rounds through the trainer's
  `Trainer`; rank 1 raises in its third step while rank 0 waits for it (DDP's all-reduce
  or the round's barrier). The job must end with rank 1's error, long before the timeout.
- ``copies``: rank r opens its own copy of the store (as if each machine had copied it)
  and prepares the learnable embeddings: the ranks must refuse to train, since the disk
  scheme hands partitions between ranks through the store.

    torchrun --nproc-per-node 2 tests/distributed/lp_failing_worker.py MODE STORE TIMEOUT_S
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import graphstore
from graphstore.distributed import fail_fast, init_process_group
from trainers import link_prediction as lp

ARGS = ["--scheme", "disk", "--embedding-dim", "8", "--negatives", "8", "--num-chunks", "8", "--degree-fraction", "0.5",
        "--regularization", "0", "--buffer-partitions", "2", "--batch-size", "64", "--seed", "1"]


@fail_fast
def main() -> int:
    torch.set_num_threads(1)
    mode, store_path = sys.argv[1], Path(sys.argv[2])
    rank = init_process_group("cpu", timeout_s=float(sys.argv[3]))[0]
    if mode == "copies":
        store_path = store_path.with_name(f"{store_path.stem}-{rank}.gs")
    args = lp.LinkPredictionOptions.parse(["--store", str(store_path), *ARGS])
    with graphstore.open(store_path) as probe:
        config = lp.resolve_config(args, probe)
    store = lp.open_for_run(args, config.learnable_embeddings) if mode == "raise" else \
        graphstore.open(store_path, mode="r+")
    table = lp.prepare_embeddings(args, store, None)
    trainer = lp.Trainer(args, config, store, torch.device("cpu"), table=table)
    trainer.wrap()
    step, calls = trainer.step, []

    def failing_step(batch):
        calls.append(batch)
        if rank == 1 and len(calls) == 3:
            raise ValueError("boom on rank 1 in step 3: the others must stop")
        return step(batch)

    trainer.step = failing_step
    trainer.train_epoch(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
