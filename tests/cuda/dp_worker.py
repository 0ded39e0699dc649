"""One process of the CUDA suite's DDP check (tests/cuda/test_distributed.py): a process
group of one on ``DEVICE`` (NCCL on CUDA), a float64 GraphSAGE trained 2 epochs through the
trainer's own `train_epoch` under `DistributedDataParallel` (minibatch, and microbatch with
its ``no_sync`` micro-batches), beside the same model trained without DDP on the same
device; writes the largest parameter difference per case to the JSON file given.

    python tests/cuda/dp_worker.py STORE OUT.json DEVICE
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import graphstore
from graphstore.distributed import fail_fast, init_process_group, wrap_model
from graphstore.loaders import NodeLoader
from graphstore.nn import GNN
from trainers import node_classification as nc

SEED, EPOCHS = 5, 2
CASES = {"minibatch": ("minibatch", {}), "microbatch": ("microbatch", {"micro_batches": 3})}


def make_loader(store, case: str) -> NodeLoader:
    scheme, options = CASES[case]
    return NodeLoader(store, split="train", fanouts=(4, 3), batch_size=16, scheme=scheme, seed=SEED, loader_threads=2,
                      **options)


def make_model(store, device) -> tuple[GNN, torch.optim.Optimizer]:
    torch.manual_seed(SEED)
    model = GNN("sage", in_dim=store.feature_dim, hidden_dim=8, out_dim=store.num_classes, num_layers=2).double()
    model = model.to(device)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()


@fail_fast
def main(argv) -> int:
    store_path, out_path, device = argv[0], argv[1], torch.device(argv[2])
    rank, world = init_process_group(device, timeout_s=60)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    store = graphstore.open(store_path)
    results = []
    for case in CASES:
        model, opt = make_model(store, device)
        initial = flat(model)
        ddp = wrap_model(model, device)
        assert isinstance(ddp, DistributedDataParallel)
        losses = [nc.train_epoch(ddp, opt, make_loader(store, case), epoch, device, seed=SEED)[0]
                  for epoch in range(EPOCHS)]
        plain, plain_opt = make_model(store, device)
        plain_losses = [nc.train_epoch(plain, plain_opt, make_loader(store, case), epoch, device, seed=SEED)[0]
                        for epoch in range(EPOCHS)]
        results.append({"case": case, "losses": losses, "plain_losses": plain_losses,
                        "param_devices": sorted({str(p.device) for p in model.parameters()}),
                        "max_param_diff": float((flat(model) - flat(plain)).abs().max()),
                        "moved": float((flat(model) - initial).abs().max())})
    with open(out_path, "w") as f:
        json.dump({"world_size": world, "backend": dist.get_backend(), "results": results}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
