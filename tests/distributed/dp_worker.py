"""One rank of the data-parallel exactness check (started by torchrun from
test_data_parallel.py): for every scheme, train a float64 GraphSAGE with dropout for two
epochs through the trainer's own `train_epoch` under DistributedDataParallel, each rank on
its share of the epochs (``NodeLoader(..., rank, world_size)``); then, in this one
process, replay the same shares with gradient accumulation (every rank's batches of a
step, the loss summed over their targets over the step's total, one optimizer step) and
record the largest parameter difference; also a GCN whose micro-batches take their
parent's degrees, on row-normalised features. Ranks split the replays (case i on rank
i % N): after DDP every rank holds the same parameters.

    torchrun --nproc-per-node 2 tests/distributed/dp_worker.py STORE OUT_DIR
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import graphstore
from graphstore.distributed import fail_fast, init_process_group, wrap_model
from graphstore.distributed.data_parallel import dropout_salt
from graphstore.loaders import NodeLoader
from graphstore.loaders.seeds import epoch_seed
from graphstore.nn import GNN, layer_degrees, micro_batch_backward, normalize_rows
from trainers import node_classification as nc

SEED, EPOCHS = 5, 2
# case -> (scheme, loader options, trainer options: the layer, the feature normalisation)
CASES = {
    "minibatch": ("minibatch", {}, None),
    "megabatch": ("megabatch", {}, None),  # 4 mega-batches of 2 partitions: divided by states
    "disk": ("disk", {}, None),  # DISPERSED, 4 of 8 partitions: divided by states
    "microbatch": ("microbatch", {"micro_batches": 3}, None),
    "macrobatch": ("macrobatch", {"macro_batches": 2}, None),
    # GCN's micro-batches take their parent's degrees; rows normalised per batch.
    "microbatch-gcn": ("microbatch", {"micro_batches": 2}, SimpleNamespace(model="gcn", normalize_features="row")),
}


def make_loader(store, case: str, rank: int, world: int) -> NodeLoader:
    scheme, options, _ = CASES[case]
    return NodeLoader(store, split="train", fanouts=(4, 3), batch_size=16, scheme=scheme, seed=SEED, rank=rank,
                      world_size=world, **options)


def make_model(store, case: str) -> tuple[GNN, torch.optim.Optimizer]:
    torch.manual_seed(SEED)
    args = CASES[case][2]
    model = GNN("sage" if args is None else args.model, in_dim=store.feature_dim, hidden_dim=8,
                out_dim=store.num_classes, num_layers=2, dropout=0.5).double()
    return model, torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def replay(store, case: str, world: int) -> tuple[torch.Tensor, list[list[int]]]:
    """One process: the ranks' batches of each step, gradients accumulated, one step."""
    model, opt = make_model(store, case)
    args = CASES[case][2]
    loaders = [make_loader(store, case, r, world) for r in range(world)]
    counts = []
    for epoch in range(EPOCHS):
        # Each rank's dropout stream, as the trainer seeds it, switched in around its forwards.
        streams = []
        for r in range(world):
            torch.manual_seed(epoch_seed(SEED, epoch, salt=dropout_salt(r)))
            streams.append(torch.get_rng_state())
        counts.append([loader.num_batches(epoch) for loader in loaders])
        steps = loaders[0].num_steps(epoch)
        assert steps == max(counts[-1]) and all(loader.num_steps(epoch) == steps for loader in loaders)
        epochs = [iter(loader.epoch(epoch)) for loader in loaders]
        for _ in range(steps):
            batches = [next(it, None) for it in epochs]
            total = sum(int((b.labels >= 0).sum()) for b in batches if b is not None)
            opt.zero_grad(set_to_none=True)
            for r, b in enumerate(batches):
                if b is None:
                    continue  # this rank pads: a zero gradient
                torch.set_rng_state(streams[r])
                x = b.features if args is None else normalize_rows(b.features.float())
                b = dataclasses.replace(b, features=x.double())
                n = int((b.labels >= 0).sum())
                if b.micro_batches is not None:
                    degrees = layer_degrees(b.dense)[0] if args is not None else None
                    micro_batch_backward(model, b, list(b.micro_batches), degrees=degrees,
                                         loss_fn=lambda out, y, w=n / total: F.cross_entropy(out, y, ignore_index=-1) * w)
                else:
                    loss = F.cross_entropy(model(b.features, b.dense), b.labels, ignore_index=-1, reduction="sum")
                    (loss / total).backward()
                streams[r] = torch.get_rng_state()
            opt.step()
        for it in epochs:
            assert next(it, None) is None  # every rank's batches were replayed
    return flat(model), counts


@fail_fast
def main() -> int:
    torch.set_num_threads(1)
    store_path, out_dir = sys.argv[1], Path(sys.argv[2])
    rank, world = init_process_group("cpu", timeout_s=60)
    store = graphstore.open(store_path)
    trained, initial, losses, seconds = {}, {}, {}, {}
    for case in CASES:
        t0 = time.perf_counter()
        model, opt = make_model(store, case)
        initial[case] = flat(model)
        ddp = wrap_model(model)
        loader = make_loader(store, case, rank, world)
        cpu, args = torch.device("cpu"), CASES[case][2]
        losses[case] = [nc.train_epoch(ddp, opt, loader, epoch, cpu, seed=SEED, args=args)[0] for epoch in range(EPOCHS)]
        trained[case] = flat(model)
        seconds[case] = time.perf_counter() - t0
    results = {}
    for i, case in enumerate(CASES):
        if i % world != rank:
            continue
        want, counts = replay(store, case, world)
        results[case] = {
            "max_abs_diff": float((trained[case] - want).abs().max()),
            "moved": float((want - initial[case]).abs().max()),
            "batches_per_rank": counts, "losses": losses[case], "ddp_seconds": seconds[case],
        }
    store.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.json").write_text(json.dumps({"world_size": world, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
