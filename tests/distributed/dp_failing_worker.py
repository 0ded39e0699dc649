"""One rank of the data-parallel failure check: both ranks train Cora's minibatch scheme
under DDP; rank 1 raises in its third step while rank 0 waits for it in DDP's gradient
all-reduce. The job must end with rank 1's error, long before the group's timeout.

    torchrun --nproc-per-node 2 tests/distributed/dp_failing_worker.py STORE TIMEOUT_S
"""

from __future__ import annotations

import sys

import torch

import graphstore
from graphstore.distributed import (
    equal_steps,
    fail_fast,
    init_process_group,
    node_classification_backward,
    wrap_model,
)
from graphstore.loaders import NodeLoader
from graphstore.nn import GNN


@fail_fast
def main() -> int:
    torch.set_num_threads(1)
    rank, world = init_process_group("cpu", timeout_s=float(sys.argv[2]))
    store = graphstore.open(sys.argv[1])
    loader = NodeLoader(store, split="train", fanouts=(4, 3), batch_size=16, seed=0, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = wrap_model(GNN("sage", in_dim=store.feature_dim, hidden_dim=8, out_dim=store.num_classes, num_layers=2))
    for step, (batch, weight) in enumerate(equal_steps(loader.epoch(0), loader.num_batches(0), loader.num_steps(0))):
        if rank == 1 and step == 2:
            raise ValueError("boom on rank 1 in step 2: the others must stop")
        node_classification_backward(model, batch, weight=weight, device=torch.device("cpu"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
