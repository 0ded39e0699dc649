"""Distributed full-batch training: per-rank memory, exactness and exchange volume of SAR
against plain domain parallelism (and fused against unfused GAT), for 1, 2 and 4 ranks.

    .venv/bin/python tools/bench_distributed.py --json docs/benchmarks/distributed.json   # 1M-node graph
    .venv/bin/python tools/bench_distributed.py --quick --json out.json                    # 100k nodes
    .venv/bin/python tools/bench_distributed.py --batchgnn --world-sizes 2,4 --hidden 64 \
        --json docs/benchmarks/distributed_batchgnn.json                                   # 1M nodes
    .venv/bin/python tools/bench_distributed.py --modes ddp --hidden 64 --json docs/benchmarks/distributed_ddp.json
    .venv/bin/python tools/bench_distributed.py --accuracy --json docs/benchmarks/distributed_accuracy.json

Every case is one ``torchrun --nproc-per-node N`` job on loopback (gloo, one thread per
rank) training the same seeded 3-layer model on the same METIS-partitioned store:

1. step 0: forward, loss, backward, gradient all-reduce; rank 0 saves the gradients
   (``grad_max_abs_diff`` compares them with the reference case's: domain parallel on one
   rank, which is plain single-process full-batch training); then the Adam step;
2. step 1, timed (``epoch_s``), with the exchange counters (``rows_fetched_local``: rows
   of its own block a rank aggregated from, ``rows_fetched_remote``: rows it received,
   ``bytes_sent``: rows and gradients it sent); each rank's peak RSS after it
   (``rss_bytes_per_rank``, ``VmHWM``: load, two steps);
3. step 2 under the CPU allocator's profiler (`graphstore.nn.step_memory`'s measurement,
   the one the micro-batch estimator is checked against): ``peak_bytes_per_rank`` is the
   allocator's peak during the whole step (forward, backward, all-reduce, Adam) above what
   the rank held before it; ``held_bytes_per_rank`` counts what it held (its features,
   labels and splits, its structure, parameters and Adam state: tensor sizes, not measured).

Goal (SAR's, as the paper states it): a rank's memory (held + peak) is at most 3/N of the
whole graph's, the memory of training the whole graph in one process the plain way (domain
parallel on one rank: one-shot layers, no exchange), since a SAR worker holds its own share
and at most two other ranks' rows (2/N, 3/N with prefetch).

Modes: ``sar`` (fused: edges aggregated ``edge_chunk`` at a time; ``fused: false`` is the
same with each rank's edges whole, the unfused GAT), ``domain_parallel`` (the prepared rows
of the whole halo fetched at once, every edge aggregated in one pass under autograd). ``MODES`` maps a mode name to the trainer flags that select it: a
new mode is an entry there and, if the trainer path differs, a branch in `child`;
``--modes`` picks among them (default: every full-batch case of ``DEFAULT_CASES``). Times on
2 cores with 4 ranks only show that a case runs; memory and exactness are the measurements.

``--modes ddp``: data-parallel sampled training under `DistributedDataParallel`, as
trainers/node_classification.py runs it under torchrun (GraphSAGE, ``--schemes``
minibatch and disk, every rank reading the store itself), one torchrun job per (task,
scheme, N). The case schema is the full-batch one: ``grad_max_abs_diff`` (float64, step 0:
DDP's gradients against one process accumulating the ranks' first batches),
``peak_bytes_per_rank`` (one step of a gathered batch under the allocator's profiler),
``rss_bytes_per_rank``, ``epoch_s``, ``rows_fetched_local`` (input rows, all from the
store) and ``rows_fetched_remote`` (0), ``store_bytes_read_per_rank``, ``bytes_sent``
(DDP's gradient all-reduce: parameter bytes x steps, computed from the model); `DDP_FIELDS`
says each in the JSON. ``DDP_TASKS`` maps a task to its rank function (``--tasks``); link
prediction's cases (a knowledge graph with learnable embeddings, in the same schema) are
``tools/bench_distributed_link.py``'s.

``--accuracy``: full-batch GraphSage on Cora, CiteSeer and Amazon Photo with 1 and 2 ranks,
for each seed of ``--seeds`` (0-4): test accuracy at the best-validation epoch, its mean and
standard deviation over the seeds per dataset and N, and per seed |N = 2 - N = 1|.

``--batchgnn``: mode ``batchgnn``, data-parallel macro-batching (DDP, ``--scheme
macrobatch``) with BatchGNN's distributed feature fetch (``--feature-placement
partitioned``, `graphstore.distributed.feature_fetch`) against every rank reading the store
(``store``), for B = 1 and B = all (``-1``) on 2 and 4 ranks: one epoch of GraphSAGE, the
fetch counters summed over the ranks (``rows_fetched_local``/``_remote``: rows of the
rounds' unions a rank owned / got from their owners; ``bytes_sent``: ids and rows sent to
other ranks; ``rounds``: collective rounds with requests, and ``padding_rounds``), for each
of ``--seed-assignments``: ``local`` (each rank trains its own block's targets, the
default) and ``interleaved`` (every N-th batch of one shared order: the old division).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

try:
    from tools import benchkit
except ImportError:  # run as a script
    import benchkit

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")

MODES = {
    # case name -> (mode the model runs in, edge_chunk or None: the unfused form)
    "sar": ("sar", "chunk"),
    "sar_unfused": ("sar", None),
    "domain_parallel": ("domain_parallel", None),
    # data-parallel macro-batching; edge_chunk unused ("--batchgnn", `batchgnn_child`)
    "batchgnn": ("batchgnn", None),
    # data-parallel minibatch training under DDP ("--modes ddp", `ddp_child`, `run_ddp`)
    "ddp": ("ddp", None),
}
"""The cases a model can run; ``--modes`` picks among them."""
DEFAULT_CASES = {"sage": ("sar", "domain_parallel"), "gat": ("sar", "sar_unfused", "domain_parallel")}
REFERENCE = ("domain_parallel", 1)
"""The case whose gradients every other is compared with (single-process full batch)."""


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, help="write the results here (required)")
    p.add_argument("--quick", action="store_true", help="a generated 100k-node graph instead of 1M nodes")
    p.add_argument("--store", type=Path, help="use this store instead of the generated graph")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bench_distributed"))
    p.add_argument("--models", default="sage,gat")
    p.add_argument("--modes", help="comma-separated cases of MODES (default: every full-batch case of "
                                   "DEFAULT_CASES); 'ddp' runs the data-parallel cases (DDP_TASKS x --schemes)")
    p.add_argument("--schemes", default="minibatch,disk", help="--modes ddp: the loaders' schemes")
    p.add_argument("--tasks", default="node_classification", help="--modes ddp: keys of DDP_TASKS")
    p.add_argument("--world-sizes", default="1,2,4")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--edge-chunk", type=int, default=1 << 16)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per case")
    p.add_argument("--accuracy", action="store_true",
                   help="instead of memory: full-batch GraphSage on Cora, CiteSeer and Amazon Photo, 1 and 2 ranks")
    p.add_argument("--seeds", default="0,1,2,3,4", help="--accuracy: the seeds, each run with 1 and 2 ranks")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data", help="the real datasets")
    p.add_argument("--batchgnn", action="store_true",
                   help="instead of full batch: macrobatch under DDP, features partitioned or from the store, "
                        "B = 1 and all, on the --world-sizes above 1")
    p.add_argument("--placements", default="partitioned,store", help="--batchgnn: feature placements")
    p.add_argument("--seed-assignments", default="local,interleaved",
                   help="--batchgnn: which targets each rank trains (NodeLoader's seed_assignment)")
    p.add_argument("--batch-size", type=int, default=1024, help="--batchgnn, ddp: mini-batch targets per rank")
    p.add_argument("--fanouts", default="10,5", help="--batchgnn, ddp: fanouts (layers)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------------- one rank


def batchgnn_child(spec: dict) -> None:
    """One rank of a ``batchgnn`` case: one epoch of macrobatch under DDP, its fetch counters."""
    import torch
    import torch.distributed as dist

    from graphstore.distributed import PartitionedFetch, fail_fast, init_process_group, wrap_model
    from graphstore.layout.store import open_store
    from graphstore.loaders import NodeLoader
    from graphstore.nn import GNN
    from trainers import node_classification as nc

    @fail_fast
    def run() -> int:
        torch.set_num_threads(1)
        rank, world = init_process_group("cpu", timeout_s=spec["timeout"])
        store = open_store(spec["store"])
        t0 = time.perf_counter()
        fetch = PartitionedFetch(store, timeout_s=spec["timeout"]) if spec["placement"] == "partitioned" else None
        load_s = time.perf_counter() - t0
        loader = NodeLoader(store, split="train", fanouts=spec["fanouts"], batch_size=spec["batch_size"],
                            scheme="macrobatch", macro_batches=spec["macro_batches"], seed=0, rank=rank,
                            world_size=world, feature_fetch=fetch, seed_assignment=spec["seed_assignment"])
        torch.manual_seed(0)
        model = GNN(spec["model"], in_dim=store.feature_dim, hidden_dim=spec["hidden"], out_dim=store.num_classes,
                    num_layers=len(spec["fanouts"]), dropout=0.5)
        ddp = wrap_model(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        dist.barrier()
        start = time.perf_counter()
        nc.train_epoch(ddp, optimizer, loader, 0, torch.device("cpu"), seed=0)
        epoch_s = time.perf_counter() - start
        s = loader.fetch_stats
        row = torch.tensor([s.rows_local, s.rows_remote, s.bytes_sent, s.exchanges, s.padding_exchanges, s.rounds,
                            s.macro_batches, s.mini_batches, s.rows_requested, s.rows_union, s.bytes_read,
                            fetch.rows_held if fetch is not None else 0, benchkit.vm_hwm_bytes()], dtype=torch.int64)
        rows = [torch.zeros_like(row) for _ in range(world)]
        dist.all_gather(rows, row)
        times = torch.tensor([epoch_s, load_s], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        if rank == 0:
            c = list(zip(*[r.tolist() for r in rows]))
            Path(spec["out"]).write_text(json.dumps({
                "rows_fetched_local": sum(c[0]), "rows_fetched_remote": sum(c[1]), "bytes_sent": sum(c[2]),
                "rounds": sum(c[3]), "rounds_per_rank": list(c[3]), "padding_rounds": sum(c[4]),
                "macro_batch_rounds": sum(c[5]), "macro_batches_fetched": sum(c[6]), "mini_batches": sum(c[7]),
                "rows_requested": sum(c[8]), "rows_union": sum(c[9]), "store_bytes_read": sum(c[10]),
                "feature_rows_held_per_rank": list(c[11]), "rss_bytes_per_rank": list(c[12]),
                "epoch_s": float(times[0]), "load_s": float(times[1])}))
        dist.destroy_process_group()
        return 0

    run()


def run_batchgnn(store: Path, args) -> list[dict]:
    work = args.workdir / "cases"
    work.mkdir(parents=True, exist_ok=True)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    cases = []
    for world in [int(w) for w in args.world_sizes.split(",") if int(w) > 1]:
        for placement, assignment, b in itertools.product(args.placements.split(","),
                                                          args.seed_assignments.split(","), (1, -1)):
                name = f"batchgnn_{placement}_{assignment}_{world}_B{b}"
                spec = {"mode": "batchgnn", "store": str(store), "model": "sage", "hidden": args.hidden,
                        "fanouts": fanouts, "batch_size": args.batch_size, "macro_batches": b,
                        "placement": placement, "seed_assignment": assignment, "timeout": args.timeout,
                        "out": str(work / f"{name}.json")}
                torchrun(world, child_argv(spec), timeout=args.timeout, what=name)
                c = {"mode": "batchgnn", "model": "sage", "world_size": world, "feature_placement": placement,
                     "seed_assignment": assignment, "macro_batches": "all" if b == -1 else b,
                     **json.loads(Path(spec["out"]).read_text())}
                cases.append(c)
                print(f"batchgnn {placement} {assignment} x{world} B={c['macro_batches']}: remote rows "
                      f"{c['rows_fetched_remote']:,}, local {c['rows_fetched_local']:,}, sent "
                      f"{c['bytes_sent'] / 2**20:.1f} MiB, {c['rounds']} rounds, {c['epoch_s']:.1f} s", flush=True)
    return cases


def batchgnn_goals(cases: list[dict]) -> dict:
    """Remote rows of the partitioned fetch, per world size: B = 1 over B = all under each
    seed assignment, and each case against the local assignment's B = 1 (BatchGNN's
    baseline, DistDGL, trains METIS-local seeds one mini-batch at a time)."""
    out = {}
    for world in sorted({c["world_size"] for c in cases}):
        pick = {(c.get("seed_assignment", "interleaved"), c["macro_batches"]): c for c in cases
                if c["world_size"] == world and c["feature_placement"] == "partitioned"}
        for assignment in ("local", "interleaved"):
            one, every = pick.get((assignment, 1)), pick.get((assignment, "all"))
            if one is not None and every is not None:
                out[f"fetch_reduction_{assignment}_{world}"] = {
                    "remote_rows_B1_over_Ball": one["rows_fetched_remote"] / max(every["rows_fetched_remote"], 1),
                    "rows_B1_over_Ball": one["rows_union"] / max(every["rows_union"], 1),
                    "bytes_sent_B1_over_Ball": one["bytes_sent"] / max(every["bytes_sent"], 1),
                    "paper": "BatchGNN: 2.5-7.8x fewer fetches than DistDGL (METIS-local seeds, B = 1)"}
        base = pick.get(("local", 1))
        if base is not None:
            out[f"remote_rows_over_local_B1_{world}"] = {
                f"{a}_B{b}": c["rows_fetched_remote"] / max(base["rows_fetched_remote"], 1) for (a, b), c in pick.items()}
    return out


def ddp_node_classification(spec: dict, rank: int, world: int) -> dict:
    """One rank of a ``ddp`` node-classification case; returns this rank's counters (the
    ones `ddp_child` gathers). Under the process group `ddp_child` made."""
    import torch

    from graphstore.distributed import wrap_model
    from graphstore.distributed.data_parallel import dropout_salt, node_classification_backward
    from graphstore.layout.store import open_store
    from graphstore.loaders import NodeLoader
    from graphstore.loaders.seeds import epoch_seed
    from graphstore.nn import GNN
    from graphstore.nn.step_memory import _cpu_allocator_peak
    from trainers import node_classification as nc

    cpu = torch.device("cpu")
    store = open_store(spec["store"])

    def loader_of(r: int) -> NodeLoader:
        return NodeLoader(store, split="train", fanouts=spec["fanouts"], batch_size=spec["batch_size"],
                          scheme=spec["scheme"], seed=0, rank=r, world_size=world)

    def model_of(dtype) -> GNN:
        torch.manual_seed(0)
        return GNN(spec["model"], in_dim=store.feature_dim, hidden_dim=spec["hidden"], out_dim=store.num_classes,
                   num_layers=len(spec["fanouts"]), dropout=0.5).to(dtype)

    class Counted:
        """The loader, counting the input rows of the batches it yields (all read by this rank)."""

        def __init__(self, inner: NodeLoader) -> None:
            self.inner, self.rows = inner, 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def epoch(self, epoch: int):
            for batch in self.inner.epoch(epoch):
                self.rows += int(batch.store_ids.numel())
                yield batch

    # 1. One epoch, float32, through the trainer's own train_epoch; then the rank's peak RSS.
    t0 = time.perf_counter()
    loader = loader_of(rank)
    model = model_of(torch.float32)
    ddp = wrap_model(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    load_s = time.perf_counter() - t0
    counted = Counted(loader)
    torch.distributed.barrier()
    start = time.perf_counter()
    nc.train_epoch(ddp, optimizer, counted, 0, cpu, seed=0)
    epoch_s = time.perf_counter() - start
    steps = loader.num_steps(0)
    rss = benchkit.vm_hwm_bytes()
    store_bytes = int(loader.last_stats.bytes_read) if loader.last_stats is not None else 0

    # 2. One step (forward, loss, backward, DDP's all-reduce, Adam) of a batch already
    #    sampled and gathered, under the CPU allocator's profiler, as the full-batch modes.
    batches = loader.epoch(1)
    held = next(batches)

    def step(batch=held) -> None:
        optimizer.zero_grad(set_to_none=True)
        node_classification_backward(ddp, batch, weight=1.0, device=cpu)
        optimizer.step()

    torch.distributed.barrier()
    peak = _cpu_allocator_peak(step)
    del step, held
    batches.close()

    # 3. Gradients of step 0 of epoch 0 in float64: every rank its first batch under DDP;
    #    rank 0 then replays the ranks' first batches in this one process, each rank's loss
    #    sum over the step's labelled targets, accumulated (dp_worker.replay's step).
    model64 = model_of(torch.float64)
    ddp64 = wrap_model(model64)
    batches = loader.epoch(0)
    batch = next(batches)
    torch.manual_seed(epoch_seed(0, 0, salt=dropout_salt(rank)))
    node_classification_backward(ddp64, batch, weight=1.0, device=cpu)
    del batch
    batches.close()
    grad_diff = grad_max = None
    if rank == 0:
        got = [p.grad.detach().clone() for p in model64.parameters()]
        reference = model_of(torch.float64)
        firsts = []
        for r in range(world):
            inner = loader if r == rank else loader_of(r)
            it = inner.epoch(0)
            b = next(it)
            # Copies: a batch is valid until its loader's next one (the buffer's slots).
            firsts.append((b.features.clone(), b.dense, b.labels.clone()))
            it.close()
        total = sum(int((y >= 0).sum()) for _, _, y in firsts)
        for r, (x, dense, y) in enumerate(firsts):
            torch.manual_seed(epoch_seed(0, 0, salt=dropout_salt(r)))
            out = reference(x.double(), dense)
            (torch.nn.functional.cross_entropy(out, y.long(), ignore_index=-1, reduction="sum") / total).backward()
        want = [p.grad for p in reference.parameters()]
        grad_diff = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
        grad_max = max(float(b.abs().max()) for b in want)
    store.close()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"peak": peak, "rss": rss, "rows": counted.rows, "store_bytes": store_bytes, "steps": steps,
            "batches": loader.num_batches(0), "param_bytes": param_bytes, "epoch_s": epoch_s, "load_s": load_s,
            "grad_max_abs_diff": grad_diff, "grad_max_abs": grad_max}


DDP_TASKS = {
    # task -> one rank's work: fn(spec, rank, world) -> the counters `ddp_child` gathers
    # (peak, rss, rows, store_bytes, steps, batches, param_bytes, epoch_s, load_s, and on
    # rank 0 grad_max_abs_diff and grad_max_abs). Link prediction's data parallelism is
    # measured by tools/bench_distributed_link.py (the same case schema, mode "ddp"): it
    # needs a knowledge graph with learnable embeddings, not this bench's featured store.
    "node_classification": ddp_node_classification,
}
"""The tasks ``--modes ddp`` can run (``--tasks``)."""

DDP_FIELDS = {
    "grad_max_abs_diff": "float64, step 0 of epoch 0 (dropout 0.5): max |gradient under DDP - gradient of one process "
                         "accumulating the ranks' first batches (each rank's loss sum over the step's labelled "
                         "targets)|; grad_max_abs is the largest reference gradient",
    "peak_bytes_per_rank": "CPU allocator's peak during one training step (forward, loss, backward, DDP's all-reduce, "
                           "Adam) of a batch already sampled and gathered, above what the rank held before it",
    "rss_bytes_per_rank": "VmHWM after loading and one epoch",
    "epoch_s": "one epoch through trainers/node_classification.py's train_epoch, slowest rank",
    "rows_fetched_local": "input feature rows of the epoch's batches, summed over the ranks; every rank reads them "
                          "from the store itself",
    "rows_fetched_remote": "0: no rank fetches rows from another",
    "store_bytes_read_per_rank": "bytes the rank's loader read from the store during the epoch (BufferStats)",
    "bytes_sent": "DDP's gradient all-reduce per epoch, summed over the ranks: parameter bytes x steps per rank, "
                  "computed from the model, not measured (0 on one rank; the step's 8-byte target count is not "
                  "included)",
}
"""What a ``ddp`` case's fields mean (written into the JSON)."""


def ddp_child(spec: dict) -> None:
    """One rank of a ``ddp`` case: the task's work (`DDP_TASKS`), its counters gathered to rank 0."""
    import torch
    import torch.distributed as dist

    from graphstore.distributed import fail_fast, init_process_group

    @fail_fast
    def run() -> int:
        torch.set_num_threads(1)
        rank, world = init_process_group("cpu", timeout_s=spec["timeout"])
        mine = DDP_TASKS[spec["task"]](spec, rank, world)
        keys = ("peak", "rss", "rows", "store_bytes", "steps", "batches", "param_bytes")
        row = torch.tensor([int(mine[k]) for k in keys], dtype=torch.int64)
        rows = [torch.zeros_like(row) for _ in range(world)]
        dist.all_gather(rows, row)
        times = torch.tensor([mine["epoch_s"], mine["load_s"]], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        if rank == 0:
            c = dict(zip(keys, zip(*[r.tolist() for r in rows], strict=True), strict=True))
            steps, param_bytes = c["steps"][0], c["param_bytes"][0]
            # DDP all-reduces every parameter's gradient once a step: the bytes each rank hands
            # to the all-reduce, computed from the model, not measured (gloo's ring moves
            # 2 (N - 1) / N of it per rank); nothing leaves a lone rank.
            sent = steps * param_bytes if world > 1 else 0
            Path(spec["out"]).write_text(json.dumps({
                "grad_max_abs_diff": mine["grad_max_abs_diff"], "grad_max_abs": mine["grad_max_abs"],
                "peak_bytes_per_rank": list(c["peak"]), "rss_bytes_per_rank": list(c["rss"]),
                "epoch_s": float(times[0]), "load_s": float(times[1]),
                "rows_fetched_local": sum(c["rows"]), "rows_fetched_remote": 0,
                "rows_fetched_per_rank": list(c["rows"]), "store_bytes_read_per_rank": list(c["store_bytes"]),
                "bytes_sent": sent * world, "bytes_sent_per_rank": sent, "parameter_bytes": param_bytes,
                "steps": steps, "batches_per_rank": list(c["batches"])}))
        dist.destroy_process_group()
        return 0

    run()


def run_ddp(store: Path, args) -> list[dict]:
    """One torchrun job per (task, scheme, world size): see `ddp_child`."""
    work = args.workdir / "cases"
    work.mkdir(parents=True, exist_ok=True)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    cases = []
    for task in args.tasks.split(","):
        for scheme in args.schemes.split(","):
            for world in [int(w) for w in args.world_sizes.split(",")]:
                name = f"ddp_{task}_{scheme}_{world}"
                spec = {"mode": "ddp", "task": task, "store": str(store), "model": "sage", "hidden": args.hidden,
                        "fanouts": fanouts, "batch_size": args.batch_size, "scheme": scheme,
                        "timeout": args.timeout, "out": str(work / f"{name}.json")}
                begin = time.perf_counter()
                torchrun(world, child_argv(spec), timeout=args.timeout, what=name)
                c = {"mode": "ddp", "task": task, "model": "sage", "scheme": scheme, "world_size": world,
                     **json.loads(Path(spec["out"]).read_text()), "process_s": time.perf_counter() - begin}
                cases.append(c)
                print(f"ddp {task} {scheme} x{world}: grad diff {c['grad_max_abs_diff']:.1e}, peak "
                      f"{max(c['peak_bytes_per_rank']) / 2**20:.0f} MiB/rank, rss "
                      f"{max(c['rss_bytes_per_rank']) / 2**20:.0f} MiB/rank, {c['epoch_s']:.1f} s/epoch, "
                      f"store read {max(c['store_bytes_read_per_rank']) / 2**20:.0f} MiB/rank", flush=True)
    return cases


def ddp_goals(cases: list[dict]) -> dict:
    diffs = [c["grad_max_abs_diff"] for c in cases if c["grad_max_abs_diff"] is not None]
    return {"gradients_match_one_process": {
        "value": max(diffs, default=None), "met": bool(diffs) and max(diffs) < 1e-10,
        "goal": "< 1e-10 in float64: DDP's step-0 gradients against one process accumulating the ranks' "
                "first batches"}}


def held_bytes(graph, data, optimizer) -> int:
    """Bytes of what a full-batch rank holds between steps: its block's features, labels and
    splits, its structure (`RankGraph`'s index tensors), parameters and the optimizer's state."""
    import torch

    tensors = [data.features, data.labels, *data.splits.values(), graph.in_degree, *graph.fetch_rows,
               *graph.send_rows, *(t for p in graph.pieces for t in (p.src, p.dst, p.rel) if t is not None)]
    tensors += [p for group in optimizer.param_groups for p in group["params"]]
    tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def child(spec: dict) -> None:
    """One rank of a case (under torchrun): three training steps as the module docstring says."""
    if spec["mode"] == "batchgnn":
        batchgnn_child(spec)
        return
    if spec["mode"] == "ddp":
        ddp_child(spec)
        return
    import torch
    import torch.distributed as dist

    from graphstore.distributed import (
        CommStats,
        FullBatchGNN,
        HaloGraph,
        all_reduce_gradients,
        fail_fast,
        full_batch_loss,
        init_process_group,
        load_block_data,
        load_rank_graph,
    )
    from graphstore.layout.store import open_store
    from graphstore.nn.step_memory import _cpu_allocator_peak

    @fail_fast
    def run() -> int:
        torch.set_num_threads(1)
        rank, world = init_process_group("cpu", timeout_s=spec["timeout"])
        store = open_store(spec["store"])
        t0 = time.perf_counter()
        graph = load_rank_graph(store, rank, world)
        data = load_block_data(store, graph)
        load_s = time.perf_counter() - t0
        train = data.splits["train"]
        train = train[data.labels[train] >= 0]
        count = torch.tensor([train.numel()])
        dist.all_reduce(count)
        mode = spec["mode"]
        halo = HaloGraph(graph) if mode == "domain_parallel" else None
        torch.manual_seed(0)
        model = FullBatchGNN(spec["model"], in_dim=store.feature_dim, hidden_dim=spec["hidden"],
                             out_dim=store.num_classes, num_layers=spec["layers"], heads=spec["heads"])
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        params = list(model.parameters())

        def step(epoch: int, stats: CommStats | None) -> None:
            for p in params:
                p.grad = None
            out = model(data.features, graph, mode=mode, halo=halo, epoch=epoch, edge_chunk=spec["edge_chunk"],
                        stats=stats)
            loss = full_batch_loss(out, data.labels, train, int(count))
            del out
            loss.backward()
            all_reduce_gradients(params)
            if epoch == 0 and rank == 0:
                torch.save([p.grad for p in params], spec["grads"])
            optimizer.step()

        step(0, None)
        held = held_bytes(graph, data, optimizer)
        stats = CommStats()
        dist.barrier()
        start = time.perf_counter()
        step(1, stats)
        epoch_s = time.perf_counter() - start
        rss = benchkit.vm_hwm_bytes()
        dist.barrier()
        peak = _cpu_allocator_peak(lambda: step(2, None))
        row = torch.tensor([peak, rss, stats.rows_fetched_local, stats.rows_fetched_remote, stats.bytes_sent,
                            graph.halo_rows, graph.num_nodes, held], dtype=torch.int64)
        rows = [torch.zeros_like(row) for _ in range(world)]
        dist.all_gather(rows, row)
        times = torch.tensor([epoch_s, load_s], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        if rank == 0:
            cols = list(zip(*[r.tolist() for r in rows]))
            Path(spec["out"]).write_text(json.dumps({
                "peak_bytes_per_rank": list(cols[0]), "rss_bytes_per_rank": list(cols[1]),
                "rows_fetched_local": sum(cols[2]), "rows_fetched_remote": sum(cols[3]), "bytes_sent": sum(cols[4]),
                "halo_rows_per_rank": list(cols[5]), "nodes_per_rank": list(cols[6]),
                "held_bytes_per_rank": list(cols[7]),
                "epoch_s": float(times[0]), "load_s": float(times[1])}))
        dist.destroy_process_group()
        return 0

    run()


# ---------------------------------------------------------------------- datasets


def synthetic(workdir: Path, num_nodes: int) -> Path:
    import graphstore

    out = workdir / f"synthetic_{num_nodes}.gs"
    if not out.exists():
        raw = workdir / f"synthetic_{num_nodes}"
        subprocess.run([sys.executable, str(REPO / "tools" / "make_synthetic.py"), "--out", str(raw),
                        "--num-nodes", str(num_nodes), "--feature-dim", "64", "--layout", "npz", "--locality",
                        "0.75", "--communities", "100", "--no-progress", "--overwrite"], check=True)
        graphstore.convert(raw, out, num_partitions=16, partitioner="metis")
    return out


# ---------------------------------------------------------------------- accuracy

ACCURACY_DATASETS = {
    # name -> (source under --data, published test accuracy, about: shared/data/README.md,
    #          flags on top of ACCURACY_FLAGS: tools/run_accuracy.py's NC_DATASET_FLAGS)
    "cora": ("cora_planetoid", 0.81, []),
    "citeseer": ("citeseer_planetoid", 0.70, []),
    "amazon_photo": ("amazon_photo/amazon-photo.zip", 0.91,
                     ["--lr", "0.02", "--weight-decay", "5e-5", "--hidden", "128", "--epochs", "200"]),
}
PUBLISHED_TOLERANCE = 0.02
"""How far from the published figure a run may be and count as in its range."""
ACCURACY_FLAGS = ["--model", "sage", "--layers", "2", "--hidden", "64", "--dropout", "0.5", "--lr", "0.01",
                  "--weight-decay", "5e-4", "--epochs", "100", "--lr-schedule", "cosine", "--normalize-features",
                  "row", "--dtype", "float64"]
"""trainers/configs/cora_sage.toml's recipe (the one tools/run_accuracy.py uses), full batch, in
float64 so that 1 and 2 ranks can be compared epoch by epoch; Amazon Photo with the setting
run_accuracy chose for it on validation. ``--seed`` is added per run (``--seeds``)."""
ACCURACY_SELECTION = ("per run, test accuracy at the epoch of best validation accuracy (the first such epoch, "
                      "trainers/full_batch.py's `best`); mean and sample standard deviation (ddof 1) over the seeds")


def _accuracy_run(name: str, store: Path, world: int, seed: int, extra: list[str], args) -> dict:
    out = args.workdir / f"accuracy_{name}_{world}_s{seed}.json"
    torchrun(world, [REPO / "trainers" / "full_batch.py", "--store", store, "--metrics-out", out, *ACCURACY_FLAGS,
                     *extra, "--seed", seed], timeout=args.timeout, what=f"accuracy {name} x{world} seed {seed}")
    return json.loads(out.read_text())


def _mean_std(values: list[float]) -> dict:
    import statistics

    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "n": len(values)}


def run_accuracy(args) -> list[dict]:
    """Each dataset trained with 1 and 2 ranks for every seed of ``--seeds``; per run the
    test accuracy at the best-validation epoch (the first of the best), per dataset and N
    their mean and standard deviation over the seeds, and per seed how far the 2-rank run
    is from the 1-rank one."""
    import graphstore

    seeds = [int(x) for x in args.seeds.split(",")]
    rows = []
    for name, (source, published, extra) in ACCURACY_DATASETS.items():
        store = args.workdir / f"{name}.gs"
        if not store.exists():
            graphstore.convert(args.data / source, store, num_partitions=8, partitioner="metis")
        per_seed = []
        for seed in seeds:
            one, two = (_accuracy_run(name, store, world, seed, extra, args) for world in (1, 2))
            per_seed.append({
                "seed": seed,
                "test_acc_at_best_valid": {"1": one["best"]["test"]["acc"], "2": two["best"]["test"]["acc"]},
                "best_epoch": {"1": one["best"]["epoch"], "2": two["best"]["epoch"]},
                "valid_acc_best": {"1": one["best"]["valid"]["acc"], "2": two["best"]["valid"]["acc"]},
                "test_acc_final": {"1": one["final"]["test"]["acc"], "2": two["final"]["test"]["acc"]},
                "abs_diff_2_vs_1": abs(two["best"]["test"]["acc"] - one["best"]["test"]["acc"]),
                "max_loss_diff_2_vs_1": max(abs(a["loss"] - b["loss"]) for a, b in zip(one["epochs"], two["epochs"])),
                "same_accuracies_every_epoch": all(a[s]["acc"] == b[s]["acc"]
                                                   for a, b in zip(one["epochs"], two["epochs"])
                                                   for s in ("valid", "test")),
                "epochs": len(one["epochs"])})
            r = per_seed[-1]
            print(f"{name} seed {seed}: test {r['test_acc_at_best_valid']['1']:.4f} at best valid (epoch "
                  f"{r['best_epoch']['1']}), 2 ranks {r['test_acc_at_best_valid']['2']:.4f}, loss diff "
                  f"{r['max_loss_diff_2_vs_1']:.1e}", flush=True)
        summary = {w: _mean_std([r["test_acc_at_best_valid"][w] for r in per_seed]) for w in ("1", "2")}
        final = {w: _mean_std([r["test_acc_final"][w] for r in per_seed]) for w in ("1", "2")}
        rows.append({
            "dataset": name, "published_test_acc": published, "seeds": seeds,
            "test_acc_at_best_valid": summary, "test_acc_final": final,
            "in_published_range": abs(summary["1"]["mean"] - published) <= PUBLISHED_TOLERANCE,
            "max_abs_diff_2_vs_1": max(r["abs_diff_2_vs_1"] for r in per_seed),
            "max_loss_diff_2_vs_1": max(r["max_loss_diff_2_vs_1"] for r in per_seed),
            "same_accuracies_every_epoch": all(r["same_accuracies_every_epoch"] for r in per_seed),
            "per_seed": per_seed, "flags": ACCURACY_FLAGS + extra + ["--seed", "S"]})
        r = rows[-1]
        print(f"{name}: test at best valid {summary['1']['mean']:.4f} ± {summary['1']['std']:.4f} (1 rank), "
              f"{summary['2']['mean']:.4f} ± {summary['2']['std']:.4f} (2 ranks), max |2 - 1| "
              f"{r['max_abs_diff_2_vs_1']:.4f}", flush=True)
    return rows


# ---------------------------------------------------------------------- one case


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(world: int, argv: list[str], *, timeout: float, what: str) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node world argv...`` on loopback (gloo, one thread per rank);
    raises naming ``what`` with the end of its stderr when the job fails."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [str(TORCHRUN), "--nproc-per-node", str(world), "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), *map(str, argv)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed: {done.stderr[-1500:]}")
    return done


def child_argv(spec: dict) -> list[str]:
    """This script run as one rank of a case described by ``spec``."""
    return [str(Path(__file__).resolve()), "--child", json.dumps(spec)]


def run_case(store: Path, model: str, case: str, world: int, args) -> dict:
    mode, chunk = MODES[case]
    work = args.workdir / "cases"
    work.mkdir(parents=True, exist_ok=True)
    name = f"{model}_{case}_{world}"
    spec = {"store": str(store), "model": model, "mode": mode, "layers": args.layers, "hidden": args.hidden,
            "heads": args.heads, "edge_chunk": args.edge_chunk if chunk == "chunk" else None,
            "timeout": args.timeout, "out": str(work / f"{name}.json"), "grads": str(work / f"{name}.pt")}
    start = time.perf_counter()
    torchrun(world, child_argv(spec), timeout=args.timeout, what=name)
    result = json.loads(Path(spec["out"]).read_text())
    return {"mode": mode, "model": model, "world_size": world, "fused": chunk == "chunk",
            "edge_chunk": spec["edge_chunk"], "grad_max_abs_diff": None, "process_s": time.perf_counter() - start,
            "grads": spec["grads"], **result}


def compare_gradients(cases: list[dict]) -> None:
    """``grad_max_abs_diff`` of every case against its model's reference case."""
    import torch

    for c in cases:
        ref = next((r for r in cases if r["model"] == c["model"] and r["mode"] == REFERENCE[0]
                    and r["world_size"] == REFERENCE[1]), None)
        if ref is None:
            continue
        got, want = torch.load(c["grads"]), torch.load(ref["grads"])
        c["grad_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(got, want))
        c["grad_max_abs"] = max(float(b.abs().max()) for b in want)


def goals(cases: list[dict]) -> dict:
    """SAR's goal as the paper states it: a rank's memory (held + step peak, the largest
    over the ranks) at most 3/N of the whole graph's (plain one-process training, the
    reference case); and below domain parallelism's at 4 ranks."""
    def memory(model, case_mode, world, fused=True):
        for c in cases:
            if (c["model"], c["mode"], c["world_size"]) == (model, case_mode, world) and \
                    (c["mode"] != "sar" or c["fused"] == fused):
                return max(h + p for h, p in zip(c["held_bytes_per_rank"], c["peak_bytes_per_rank"], strict=True))
        return None

    out = {}
    for model in sorted({c["model"] for c in cases}):
        whole = memory(model, *REFERENCE)
        for world in sorted({c["world_size"] for c in cases if c["model"] == model}):
            mine = memory(model, "sar", world)
            if whole and mine:
                out[f"{model}_sar_{world}_share_of_whole_graph"] = {
                    "value": mine / whole, "goal": f"<= 3/N = {3 / world:.3f}", "met": mine <= 3 / world * whole,
                    "paper": "SAR: a worker materializes at most 2 partitions (3 with prefetch): 2/N, 3/N"}
        s4, d4 = memory(model, "sar", 4), memory(model, "domain_parallel", 4)
        out[f"{model}_sar_vs_domain_parallel_4"] = {"value": s4 / d4 if s4 and d4 else None, "goal": "< 1",
                                                    "met": bool(s4 and d4 and s4 < d4)}
    diffs = [c["grad_max_abs_diff"] for c in cases if c["grad_max_abs_diff"] is not None]
    out["gradients_match_single_process"] = {"value": max(diffs, default=None),
                                             "goal": "float32 round-off (exactness to 1e-10 in float64 is "
                                                     "tests/distributed/test_full_batch.py)",
                                             "met": bool(diffs) and max(diffs) < 1e-4}
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    if args.json is None:
        raise SystemExit("bench_distributed.py: --json OUT is required")
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.accuracy:
        benchkit.write_json(args.json, {"accuracy": run_accuracy(args), "selection": ACCURACY_SELECTION,
                                        "published_tolerance": PUBLISHED_TOLERANCE,
                                        "command": benchkit.command_line(__file__, argv),
                                        "machine": benchkit.machine_record("cpu", "cores", "python", "torch")})
        return 0
    store = args.store or synthetic(args.workdir, 100_000 if args.quick else 1_000_000)
    if args.batchgnn:
        import graphstore

        with graphstore.open(store) as s:
            graph = {"store": str(store), "num_nodes": s.num_nodes, "num_edges": s.num_edges,
                     "num_partitions": s.num_partitions, "feature_dim": s.feature_dim,
                     "train_nodes": int(s.read_node_split("train").size)}
        cases = run_batchgnn(store, args)
        benchkit.write_json(args.json, {
            "graph": graph, "settings": {"model": "sage", "hidden": args.hidden, "fanouts": args.fanouts,
                                         "batch_size_per_rank": args.batch_size, "epochs": 1, "dtype": "float32"},
            "cases": cases, "goals": batchgnn_goals(cases), "command": benchkit.command_line(__file__, argv),
            "machine": benchkit.machine_record("cpu", "cores", "mem_total_bytes", "python", "torch")})
        return 0
    import graphstore

    with graphstore.open(store) as s:
        graph_record = {"store": str(store), "num_nodes": s.num_nodes, "num_edges": s.num_edges,
                        "num_partitions": s.num_partitions, "feature_dim": s.feature_dim,
                        "partitioner": s.manifest.partitioner if hasattr(s.manifest, "partitioner") else None,
                        "train_nodes": int(s.read_node_split("train").size)}
    modes = None if args.modes is None else args.modes.split(",")
    unknown = [m for m in modes or () if m not in MODES or m == "batchgnn"]
    if unknown:
        raise SystemExit(f"bench_distributed.py: unknown --modes {unknown} (known: {sorted(MODES)}; batchgnn is "
                         "--batchgnn)")
    if modes == ["ddp"]:
        cases = run_ddp(store, args)
        benchkit.write_json(args.json, {
            "graph": graph_record,
            "settings": {"model": "sage", "hidden": args.hidden, "fanouts": args.fanouts, "dropout": 0.5,
                         "batch_size_per_rank": args.batch_size, "epochs": 1, "dtype": "float32",
                         "gradient_check_dtype": "float64", "optimizer": "Adam lr 0.01"},
            "fields": DDP_FIELDS, "cases": cases, "goals": ddp_goals(cases),
            "command": benchkit.command_line(__file__, argv),
            "machine": benchkit.machine_record("cpu", "cores", "mem_total_bytes", "python", "torch")})
        return 0
    if modes is not None and "ddp" in modes:
        raise SystemExit("bench_distributed.py: --modes ddp writes its own JSON; run it alone")
    worlds = [int(w) for w in args.world_sizes.split(",")]
    cases = []
    for model in args.models.split(","):
        for case in DEFAULT_CASES[model]:
            if modes is not None and case not in modes:
                continue
            for world in worlds:
                c = run_case(store, model, case, world, args)
                cases.append(c)
                print(f"{model} {case} x{world}: peak {max(c['peak_bytes_per_rank']) / 2**20:.0f} MiB/rank, held "
                      f"{max(c['held_bytes_per_rank']) / 2**20:.0f} MiB/rank, "
                      f"rss {max(c['rss_bytes_per_rank']) / 2**20:.0f} MiB/rank, {c['epoch_s']:.1f} s/epoch, "
                      f"remote rows {c['rows_fetched_remote']:,}", flush=True)
    compare_gradients(cases)
    for c in cases:
        c.pop("grads")
    result = {"graph": graph_record, "settings": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                                                  "edge_chunk": args.edge_chunk, "dtype": "float32"},
              "cases": cases, "goals": goals(cases), "command": benchkit.command_line(__file__, argv),
              "machine": benchkit.machine_record("cpu", "cores", "mem_total_bytes", "python", "torch")}
    benchkit.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
