"""One rank of the link-prediction data-parallel exactness check (started by torchrun from
test_link_data_parallel.py): for each case, train a float64 link predictor (learnable
float32 embeddings in the store) for two epochs through the trainer's own `Trainer` under
DistributedDataParallel, every rank on its share (minibatch: every N-th batch, the table
replicated; disk: the ``disjoint`` plan's rounds, each partition's rows owned by one rank
at a time); then, in one process and on a private copy of the store, replay the same
shares with gradient accumulation (every rank's batch of a step, each loss weighted by its
positives over the step's total, one optimizer step, the ranks' embedding gradients
applied together) and record the largest difference of the parameters and of the
embedding table. Case i is replayed on rank i % N. Two cases train a GraphSage encoder
over a graph's features instead (no embeddings): the disk scheme then divides COMET's
states in blocks, one per rank.

    torchrun --nproc-per-node 2 tests/distributed/lp_worker.py KG_STORE KG_REPLAY_STORE FEATURES_STORE OUT_DIR
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import torch

import graphstore
from graphstore.distributed import fail_fast, init_process_group, sync_ranks
from graphstore.distributed.data_parallel import dropout_salt
from graphstore.loaders import EdgeLoader
from graphstore.loaders.seeds import epoch_seed
from trainers import common
from trainers import link_prediction as lp

EPOCHS = 2
BASE = ["--embedding-dim", "8", "--negatives", "16", "--num-chunks", "2", "--degree-fraction", "0.5",
        "--regularization", "0", "--batch-size", "96", "--lr", "0.1", "--seed", "4"]
SAGE = ["--encoder", "sage", "--fanouts", "4,3", "--dropout", "0.5"]
# case -> (store: the knowledge graph with learnable embeddings, or a graph with features, which
# the disk scheme divides in blocks of COMET's states; flags)
CASES = {
    "minibatch": ("kg", ["--scheme", "minibatch"]),
    "disk": ("kg", ["--scheme", "disk", "--buffer-partitions", "2"]),
    "minibatch-sage": ("kg", ["--scheme", "minibatch", *SAGE]),
    "disk-sage": ("kg", ["--scheme", "disk", *SAGE, "--buffer-partitions", "2"]),
    "features-minibatch-sage": ("features", ["--scheme", "minibatch", *SAGE, "--eval", "ogb"]),
    "features-disk-sage": ("features", ["--scheme", "disk", "--policy", "comet", *SAGE, "--buffer-partitions", "4",
                                        "--eval", "ogb"]),
}


def options(store: Path, case: str) -> lp.LinkPredictionOptions:
    return lp.LinkPredictionOptions.parse(["--store", str(store), *BASE, *CASES[case][1], "--epochs", str(EPOCHS)])


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def ddp_run(store_path: Path, case: str) -> dict:
    """The trainer's path: open, prepare the table, DDP, `train_epoch`."""
    args = options(store_path, case)
    with graphstore.open(store_path) as probe:
        config = lp.resolve_config(args, probe)
    store = lp.open_for_run(args, config.learnable_embeddings)
    try:
        table = lp.prepare_embeddings(args, store, None) if config.learnable_embeddings else None
        trainer = lp.Trainer(args, config, store, torch.device("cpu"), table=table)
        trainer.model.double()
        trainer.optimizer = torch.optim.Adagrad(trainer.model.parameters(), lr=args.lr)  # float64 state
        initial = flat(trainer.model)
        trainer.wrap()
        losses = [trainer.train_epoch(epoch)[0] for epoch in range(EPOCHS)]
        sync_ranks()
        return {"params": flat(trainer.model), "table": None if table is None else torch.from_numpy(table.read_all()),
                "losses": losses,
                "initial": initial, "placement": trainer.loader.embedding_placement, "policy": trainer.loader.policy,
                "rounds": trainer.loader.num_rounds(0)}
    finally:
        store.close()


def replay(store_path: Path, case: str, world: int) -> dict:
    """One process: the ranks' batches of each step, gradients accumulated, one step."""
    args = options(store_path, case)
    store = graphstore.open(store_path, mode="r+")
    try:
        config = lp.resolve_config(args, store)
        learnable = config.learnable_embeddings
        table = initial = None
        if learnable:
            table = lp.init_embeddings(store, args.embedding_dim, scale=args.embedding_scale, seed=args.seed)
            initial = torch.from_numpy(table.read_all())
        common.seed_everything(args.seed)
        model = lp.LinkModel(args, in_dim=args.embedding_dim if learnable else store.feature_dim,
                             num_relations=max(1, store.num_relations)).double()
        optimizer = torch.optim.Adagrad(model.parameters(), lr=args.lr)
        loaders = [EdgeLoader(store, batch_size=args.batch_size, negatives=args.negatives, num_chunks=args.num_chunks,
                              degree_fraction=args.degree_fraction, scheme=args.scheme, policy=args.policy,
                              capacity=args.buffer_partitions, embeddings=table,
                              fanouts=None if args.encoder == "none" else args.fanouts, seed=args.seed,
                              rank=r, world_size=world) for r in range(world)]
        placement = loaders[0].embedding_placement
        assert placement == (None if not learnable else "replicated" if args.scheme == "minibatch" else "owned")
        graphs: list = [None] * world
        counts = []
        for epoch in range(EPOCHS):
            model.train()
            streams = []
            for r in range(world):  # each rank's dropout stream, as the trainer seeds it
                torch.manual_seed(epoch_seed(args.seed, epoch, salt=dropout_salt(r)))
                streams.append(torch.get_rng_state())
            rounds = [loader.round_steps(epoch) for loader in loaders]
            counts.append([[own for own, _ in r] for r in rounds])
            for t in range(len(rounds[0])):
                steps = rounds[0][t][1]
                assert all(r[t][1] == steps for r in rounds) and steps == max(r[t][0] for r in rounds)
                its = [iter(loader.epoch(epoch, round=t)) for loader in loaders]
                for step in range(steps):
                    batches = [next(its[r]) if step < rounds[r][t][0] else None for r in range(world)]
                    total = sum(b.src.numel() for b in batches if b is not None)
                    optimizer.zero_grad(set_to_none=True)
                    grads = []
                    for r, b in enumerate(batches):
                        if b is None:
                            continue
                        graphs[r] = b.graph
                        torch.set_rng_state(streams[r])
                        loss, x, rows = lp.batch_loss(model, b, use_embeddings=learnable, rgcn=False,
                                                      device=torch.device("cpu"))
                        (loss * (b.src.numel() / total)).backward()
                        streams[r] = torch.get_rng_state()
                        if learnable:
                            grads.append((r, b.graph.node_ids[rows].long(), x.grad.float()))
                    optimizer.step()
                    with torch.no_grad():
                        if not learnable:
                            pass
                        elif placement == "owned":  # disjoint rows: each rank's own
                            for r, ids, g in grads:
                                lp.sparse_adagrad_(graphs[r].embeddings, graphs[r].to_local(ids.numpy()), g, args.lr)
                        else:  # every rank's gradients summed (rank order), on every copy
                            ids = torch.cat([i for _, i, _ in grads])
                            unique, inverse = torch.unique(ids, return_inverse=True)
                            summed = torch.zeros((unique.numel(), args.embedding_dim))
                            summed.index_add_(0, inverse, torch.cat([g for _, _, g in grads]))
                            for g in graphs:
                                lp.sparse_adagrad_(g.embeddings, g.to_local(unique.numpy()), summed, args.lr)
                for it in its:  # the round ends: write-back (rank 0's copy, when replicated)
                    assert next(it, None) is None
        final = None if table is None else torch.from_numpy(table.read_all())
        return {"params": flat(model), "table": final, "counts": counts,
                "table_moved": None if table is None else float((final - initial).abs().max())}
    finally:
        store.close()


@fail_fast
def main() -> int:
    torch.set_num_threads(1)
    ddp_store, replay_store, features_store = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    out_dir = Path(sys.argv[4])
    rank, world = init_process_group("cpu", timeout_s=60)
    done, seconds = {}, {}
    for case in CASES:
        t0 = time.perf_counter()
        done[case] = ddp_run(ddp_store if CASES[case][0] == "kg" else features_store, case)
        seconds[case] = time.perf_counter() - t0
    results = {}
    for i, case in enumerate(CASES):
        if i % world != rank:
            continue
        source = replay_store if CASES[case][0] == "kg" else features_store
        private = source.with_name(f"{source.stem}-{rank}.gs")
        if private.exists():
            shutil.rmtree(private)
        shutil.copytree(source, private)
        want = replay(private, case, world)
        got = done[case]
        results[case] = {
            "param_diff": float((got["params"] - want["params"]).abs().max()),
            "param_moved": float((want["params"] - got["initial"]).abs().max()),
            "table_diff": None if want["table"] is None else float((got["table"] - want["table"]).abs().max()),
            "table_moved": want["table_moved"],
            "batches_per_round": want["counts"], "losses": got["losses"], "placement": got["placement"],
            "policy": got["policy"], "rounds": got["rounds"], "ddp_seconds": seconds[case],
        }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.json").write_text(json.dumps({"world_size": world, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
