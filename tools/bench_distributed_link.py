"""Data-parallel link prediction: per-rank memory, time, IO and exchange volume of the
minibatch scheme (embeddings replicated) and the disk scheme (embeddings owned by partition,
the ``disjoint`` rounds) for 1, 2 and 4 ranks, and the accuracy of 2 ranks against 1.

    .venv/bin/python tools/bench_distributed_link.py --json docs/benchmarks/distributed_link.json
    .venv/bin/python tools/bench_distributed_link.py --accuracy --json docs/benchmarks/distributed_link_accuracy.json
    .venv/bin/python tools/bench_distributed_link.py --steps --worlds 2,3,4 --json docs/benchmarks/distributed_link_steps.json

The graph is WN18RR (40,943 entities, 86,835 training triples; ``../shared/data``), converted
once into ``--work`` with 8 partitions (the config's recipe, default partitioner). The model is
the documented one (`trainers/configs/wn18rr_distmult.toml`: DistMult, learnable embeddings
d = 400, 2048 uniform negatives per batch of 1000 a rank, N3 0.1, Adagrad 0.1); the disk
scheme holds 4 of 8 partitions per rank (COMET's setting in one process, the ``disjoint``
rounds under N > 1: 2 groups of 2 partitions a state, one state per rank and round).

Every case is one ``torchrun --nproc-per-node N`` job on loopback (gloo, one thread per rank)
running the trainer's own `Trainer` for one epoch (``mode: ddp``, the schema of
``tools/bench_distributed.py``):

- ``grad_max_abs_diff``: step 0's gradient of the dense parameters (DistMult's relations)
  after DDP, against the ranks' own gradients of the same batches (each loss weighted by its
  share of the step's positives, outside DDP) summed: what one process accumulating the
  step's batches computes. (The whole-epoch exactness, embeddings included, is
  tests/distributed/test_link_data_parallel.py's: bit for bit at N = 2.)
- ``rss_bytes_per_rank``: each rank's peak RSS (``VmHWM``); ``peak_bytes_per_rank`` is not
  measured here (null);
- ``epoch_s``: the epoch's wall time on rank 0 (2 cores: with 4 ranks it only shows it runs);
- ``bytes_read_per_rank`` / ``bytes_written_per_rank``: the buffer's reads and embedding
  write-backs of each rank;
- ``rows_fetched_local``: embedding rows the ranks updated from their own batches;
  ``rows_fetched_remote``: rows received from other ranks (replicated: every other rank's
  gathered rows; owned: 0, nothing is exchanged); ``bytes_sent``: those rows' bytes (id and
  d floats, each sent to every other rank by the all-gather) plus DDP's gradient all-reduce
  (the dense parameters' bytes once per step, what each all-reduce carries in).

``--steps``: no training, only the ``disjoint`` plan of epoch 0 for each N > 1 as the trainer
counts it (`EdgeLoader.round_steps`: each round's busiest rank's batches), beside the batches
divided evenly, its rounds, states and partition reads, and the same plan told the batch size
(``plan_epoch(..., batch_size=)``, which the edge loader does not pass yet).

``--accuracy``: the documented WN18RR run (15 epochs, evaluation every 5, filtered MRR) with
2 ranks, minibatch and disk, seed 0; the one-process figures are docs/benchmarks.md's
(seeds 0 and 1). Selection rule: the last evaluation (the documented setting's rule).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from tools.bench_distributed import torchrun

DATA = REPO.parent / "shared" / "data" / "wn18rr" / "WN18RR.tar.gz"
CONFIG = REPO / "trainers" / "configs" / "wn18rr_distmult.toml"
SCHEME_FLAGS = {"minibatch": ["--scheme", "minibatch"], "disk": ["--scheme", "disk", "--buffer-partitions", "4"]}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--work", type=Path, default=Path("/tmp/bench_distributed_link"))
    p.add_argument("--worlds", default="1,2,4")
    p.add_argument("--schemes", default="minibatch,disk")
    p.add_argument("--accuracy", action="store_true", help="the 15-epoch accuracy runs instead of the cost cases")
    p.add_argument("--steps", action="store_true", help="the disjoint plan's steps per N, no training")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM")


def child(spec: dict) -> None:
    """One rank of a cost case: one epoch of the trainer's `Trainer` under DDP."""
    import torch
    import torch.distributed as dist

    import graphstore
    from graphstore.distributed import fail_fast, init_process_group
    from graphstore.distributed.data_parallel import step_targets
    from trainers import link_prediction as lp

    @fail_fast
    def run() -> int:
        torch.set_num_threads(1)
        rank, world = init_process_group("cpu", timeout_s=600)
        args = lp.LinkPredictionOptions.parse(["--config", str(CONFIG), "--store", spec["store"],
                                               *SCHEME_FLAGS[spec["scheme"]]])
        with graphstore.open(spec["store"]) as probe:
            config = lp.resolve_config(args, probe)
        store = lp.open_for_run(args, True)
        table = lp.prepare_embeddings(args, store, None)
        trainer = lp.Trainer(args, config, store, torch.device("cpu"), table=table)
        trainer.wrap()
        params = list(trainer.model.parameters())
        grads: dict[str, torch.Tensor] = {}
        rows = {"own": 0, "received": 0}
        step = trainer.step

        def measured_step(batch):
            if "reference" not in grads:  # step 0: the ranks' own weighted gradients, summed
                if batch is None:
                    local = [torch.zeros_like(p) for p in params]
                    step_targets(0)
                else:
                    loss, _, _ = lp.batch_loss(trainer.model, batch, use_embeddings=True, rgcn=False,
                                               device=torch.device("cpu"))
                    b = batch.src.numel()
                    local = torch.autograd.grad(loss * (b / step_targets(b)), params, allow_unused=True)
                    local = [torch.zeros_like(p) if g is None else g for p, g in zip(params, local)]
                flat = torch.cat([g.flatten() for g in local])  # summed in the parameters' dtype, as DDP does
                if world > 1:
                    dist.all_reduce(flat)
                grads["reference"] = flat.double()
            if batch is not None:
                rows["own"] += int(torch.unique(torch.cat([batch.src, batch.dst,
                                                           batch.negatives.nodes.flatten()])).numel())
            return step(batch)

        def capture(optimizer, *_):
            if "ddp" not in grads:
                grads["ddp"] = torch.cat([p.grad.flatten() for p in params]).double()

        trainer.optimizer.register_step_pre_hook(capture)
        trainer.step = measured_step
        t0 = time.perf_counter()
        steps = trainer.loader.num_steps(0)
        trainer.train_epoch(0)
        epoch_s = time.perf_counter() - t0
        stats = trainer.loader.epoch_stats
        diff = float((grads["ddp"] - grads["reference"]).abs().max())
        dim = args.embedding_dim
        own = rows["own"]
        every = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        if world > 1:
            dist.all_gather(every, torch.tensor([own]))
        own_all = [int(t.item()) for t in every] if world > 1 else [own]
        replicated = trainer.embedding_placement == "replicated"
        received = sum(own_all) - own if replicated else 0
        param_bytes = sum(p.numel() * p.element_size() for p in params)
        sent = (own * (8 + 4 * dim) * (world - 1) if replicated else 0) + (param_bytes * steps if world > 1 else 0)
        record = {"rank": rank, "rss": vm_hwm(), "epoch_s": epoch_s, "grad_max_abs_diff": diff,
                  "bytes_read": sum(s.bytes_read for s in stats), "bytes_written": sum(s.bytes_written for s in stats),
                  "rows_local": own, "rows_remote": received, "bytes_sent": sent, "steps": steps,
                  "placement": trainer.embedding_placement, "policy": trainer.loader.policy,
                  "rounds": trainer.loader.num_rounds(0)}
        Path(spec["out"]).mkdir(parents=True, exist_ok=True)
        (Path(spec["out"]) / f"rank{rank}.json").write_text(json.dumps(record))
        store.close()
        return 0

    run()


def store_for(work: Path) -> Path:
    import graphstore

    out = work / "wn18rr.gs"
    if not out.exists():
        work.mkdir(parents=True, exist_ok=True)
        graphstore.convert(DATA, out, num_partitions=8)
    return out


def run_case(store: Path, scheme: str, world: int, work: Path) -> dict:
    out = work / f"{scheme}_{world}"
    spec = {"store": str(store), "scheme": scheme, "out": str(out)}
    torchrun(world, [__file__, "--child", json.dumps(spec)], timeout=3600, what=f"{scheme} x{world}")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    return {"mode": "ddp", "task": "link", "model": "distmult", "scheme": scheme, "world_size": world,
            "embedding_placement": ranks[0]["placement"], "policy": ranks[0]["policy"], "rounds": ranks[0]["rounds"],
            "steps": ranks[0]["steps"],
            "grad_max_abs_diff": max(r["grad_max_abs_diff"] for r in ranks), "peak_bytes_per_rank": None,
            "rss_bytes_per_rank": [r["rss"] for r in ranks], "epoch_s": ranks[0]["epoch_s"],
            "bytes_read_per_rank": [r["bytes_read"] for r in ranks],
            "bytes_written_per_rank": [r["bytes_written"] for r in ranks],
            "rows_fetched_local": sum(r["rows_local"] for r in ranks),
            "rows_fetched_remote": sum(r["rows_remote"] for r in ranks),
            "bytes_sent": sum(r["bytes_sent"] for r in ranks)}


def plan_steps(store_path: Path, worlds: list[int]) -> list[dict]:
    """The ``disjoint`` plan of epoch 0 for each N in ``worlds`` with the documented setting's
    batches (1000 positives a rank) and buffer (4 partitions), as the edge loader counts its
    steps, and told the batch size."""
    import numpy as np

    import graphstore
    from graphstore.buffer.policies import plan_epoch
    from graphstore.loaders import EdgeLoader

    batch_size, capacity, seed = 1000, 4, 0
    out = []
    with graphstore.open(store_path) as store:
        p = store.num_partitions
        sizes = np.diff(store.bucket_offsets).reshape(p, p).T
        for world in worlds:
            shares = [EdgeLoader(store, batch_size=batch_size, negatives=1, scheme="disk", policy="disjoint",
                                 capacity=capacity, seed=seed, rank=r, world_size=world, prefetch=False)
                      for r in range(world)]
            table = np.array([[own for own, _ in s.round_steps(0)] for s in shares]).T  # [round, rank]
            plan = shares[0].plan(0)
            told = plan_epoch("disjoint", num_partitions=p, capacity=capacity, epoch=0, seed=seed,
                              world_size=world, bucket_edges=sizes, batch_size=batch_size)
            edges = np.bincount(np.asarray(told.bucket_states).ravel(), weights=sizes.ravel(), minlength=len(told.states))
            told_table = np.zeros((told.options["num_rounds"], world), dtype=np.int64)
            np.add.at(told_table, (np.asarray(told.state_rounds), np.asarray(told.state_ranks)),
                      np.ceil(edges / batch_size).astype(np.int64))
            for name, t, pl in (("loader", table, plan), ("told_batch_size", told_table, told)):
                out.append({"world_size": world, "plan": name, "steps": int(t.max(axis=1).sum()),
                            "batches": int(t.sum()), "even_split": float(t.sum() / world), "rounds": len(t),
                            "states": len(pl.states), "groups": pl.options["num_groups"],
                            "partition_reads": sum(len(st) for st in pl.states), "round_batches": t.tolist()})
                r = out[-1]
                print(f"N={world} {name}: {r['steps']} steps, even split {r['even_split']:.1f}, {r['rounds']} rounds, "
                      f"{r['states']} states", flush=True)
    return out


def run_accuracy(store: Path, work: Path, schemes: list[str]) -> list[dict]:
    out = []
    for scheme in schemes:
        metrics = work / f"accuracy_{scheme}_2.json"
        t0 = time.perf_counter()
        torchrun(2, [REPO / "trainers" / "link_prediction.py", "--config", CONFIG, "--store", store,
                     *SCHEME_FLAGS[scheme], "--seed", 0, "--metrics-out", metrics], timeout=7200,
                 what=f"accuracy {scheme} x2")
        m = json.loads(metrics.read_text())
        out.append({"scheme": scheme, "world_size": 2, "seed": 0, "epochs": len(m["epochs"]),
                    "selection": "last evaluation (epoch 15)", "test": m["final"]["test"], "valid": m["final"]["valid"],
                    "train_s_per_epoch": sum(e["time_s"] for e in m["epochs"]) / len(m["epochs"]),
                    "wall_s": time.perf_counter() - t0, "loader": m["config"]["loader"]})
        print(f"{scheme} x2: test {m['final']['test']}", flush=True)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    if args.json is None:
        raise SystemExit("--json OUT is required")
    store = store_for(args.work)
    schemes = args.schemes.split(",")
    result = {"tool": "tools/bench_distributed_link.py", "graph": {"name": "WN18RR", "store": str(store),
                                                                    "partitions": 8},
              "config": str(CONFIG.relative_to(REPO)), "cpus": os.cpu_count()}
    if args.steps:
        result["steps"] = plan_steps(store, [int(w) for w in args.worlds.split(",") if int(w) > 1])
    elif args.accuracy:
        result["one_process_reference"] = ("docs/benchmarks.md, Link prediction: minibatch mrr 0.4321 +- 0.0009, "
                                           "disk (COMET) 0.4319 +- 0.0019, seeds 0 and 1, last evaluation")
        result["runs"] = run_accuracy(store, args.work, schemes)
    else:
        cases = []
        for scheme in schemes:
            for world in (int(w) for w in args.worlds.split(",")):
                c = run_case(store, scheme, world, args.work)
                cases.append(c)
                print(f"{scheme} x{world}: {c['epoch_s']:.1f} s, rss {max(c['rss_bytes_per_rank']) / 2**20:.0f} MiB/rank, "
                      f"grad diff {c['grad_max_abs_diff']:.1e}, sent {c['bytes_sent'] / 2**20:.1f} MiB", flush=True)
        result["cases"] = cases
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
