"""Full-batch node classification across processes: SAR (sequential aggregation and
rematerialization) or plain domain parallelism, on torch.distributed.

    torchrun --nproc-per-node N trainers/full_batch.py --store S.gs --model sage|gcn|gin|gat|rgcn
        [--mode sar|domain_parallel] [--layers 2] [--hidden 64] [--dropout 0.5] [--batch-norm]
        [--heads 4] [--lr 0.01] [--weight-decay 5e-4] [--epochs 100] [--lr-schedule none|cosine]
        [--normalize-features row]
        [--edge-chunk 131072 | --unfused] [--no-prefetch] [--dtype float32|float64]
        [--seed 0] [--device cpu|cuda] [--timeout 120] [--metrics-out M.json] [--config C.toml]
        [--checkpoint-dir D [--resume]]

Rank ``r`` of ``N`` owns a contiguous block of the store's partitions (METIS: few cut edges)
and every epoch is one full-graph step: each layer aggregates the rank's own block, then
every other rank's needed rows one rank at a time (`graphstore.distributed.sar`), BatchNorm
from all-reduced sums, dropout keyed by node, the gradient all-reduced, one Adam step. The
result does not depend on N: 1, 2 or 4 ranks train the same model (in float64 to 1e-10; in
float32 up to the round-off of summing in another order, which training slowly amplifies). A
layer followed by BatchNorm has no bias (`FullBatchGNN`). ``python trainers/full_batch.py
...`` without torchrun runs one rank.

Evaluation (every epoch) is the full-graph forward in eval mode over the valid and test
splits; ``best`` in the metrics JSON is the epoch of best validation accuracy, ``final`` the
last. Rank 0 writes the metrics (per-rank peak RSS and rows and bytes exchanged included)
and prints one line per epoch. A rank that fails prints ``rank R: error`` and ends the job.
``--checkpoint-dir D`` saves the model, the optimizer and the history after every epoch (rank
0); ``--resume`` continues from it with any number of ranks (dropout is keyed by epoch, so
the run is the one an uninterrupted job would have made).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.distributed as dist
from torch.nn import functional as F

from graphstore.distributed import (
    MODES,
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
from graphstore.distributed.agreement import check_ranks_agree
from graphstore.distributed.comm import DEFAULT_TIMEOUT_S
from graphstore.distributed.sar import DEFAULT_EDGE_CHUNK
from graphstore.errors import ConfigError
from graphstore.layout.store import open_store
from graphstore.nn import LAYERS, normalize_rows

try:
    from trainers import common
    from trainers.options import Options, UsageError, option, positive_int, unit_float
except ImportError:  # run as a script
    import common
    from options import Options, UsageError, option, positive_int, unit_float

PROG = "full_batch.py"


@dataclasses.dataclass(frozen=True)
class FullBatchOptions(Options):
    """The options of full-batch training across ranks."""

    prog: ClassVar[str] = PROG
    description: ClassVar[str] = "Full-batch GNN node classification across processes (SAR), launched by torchrun."

    config: str | None = option(None, metavar="C.toml", in_file=False, run_only=True,
                                help="TOML file giving any option below by its long name (flags override it) "
                                     "(default: none)")
    store: str | None = option(None, metavar="S.gs", run_only=True, help="the store to train on (required)")
    model: str = option("sage", choices=LAYERS, help="GNN layer kind")
    mode: str = option("sar", choices=MODES, help="sar: other ranks' rows one rank at a time, rematerialized in "
                                                  "backward; domain_parallel: the whole halo, kept for backward")
    layers: int = option(2, type=positive_int, help="GNN layers")
    hidden: int = option(64, type=positive_int, help="hidden width")
    dropout: float = option(0.5, type=unit_float)
    batch_norm: bool = option(False, help="BatchNorm after every hidden layer, over all ranks' rows")
    heads: int = option(4, type=positive_int, help="GAT attention heads")
    num_bases: int | None = option(None, type=positive_int, help="RGCN bases (default: one weight per relation)")
    lr: float = option(0.01, type=float, help="learning rate")
    weight_decay: float = option(5e-4, type=float)
    epochs: int = option(100, type=positive_int, run_only=True)
    lr_schedule: str = option("none", choices=("none", "cosine"),
                              help="cosine: anneal the learning rate per epoch from --lr towards 0")
    normalize_features: str = option("none", choices=("none", "row"),
                                     help="row: divide each input feature row by its L1 norm (PyG's NormalizeFeatures)")
    edge_chunk: int = option(DEFAULT_EDGE_CHUNK, type=positive_int,
                             help="SAR: edges aggregated at a time, at most (bounds every per-edge tensor; also at most an "
                                  "eighth of the rank's own in-edges, so the buffers shrink as ranks are added)")
    unfused: bool = option(False, help="SAR: aggregate each rank's edges whole (per-edge tensors of a whole piece)")
    prefetch: bool = option(True, flag="--no-prefetch", help="SAR: fetch each rank's rows only when aggregating them, not during the previous rank's aggregation")
    dtype: str = option("float32", choices=("float32", "float64"))
    seed: int = option(0, type=int, help="model initialisation, and with the epoch, dropout")
    device: str = option("cpu", choices=("cpu", "cuda"), run_only=True)
    timeout: float = option(DEFAULT_TIMEOUT_S, type=float, run_only=True,
                            help="seconds a collective waits for the other ranks before failing")
    metrics_out: str | None = option(None, metavar="M.json", run_only=True,
                                     help="write the metrics JSON here (default: none)")
    checkpoint_dir: str | None = option(None, metavar="D", run_only=True,
                                        help="save a checkpoint here after every epoch (rank 0) (default: none)")
    resume: bool = option(False, run_only=True, help="continue from the last checkpoint in --checkpoint-dir "
                                                     "(with any number of ranks: the model does not depend on it)")
    verbose: bool = option(False, short="-v", help="log debug messages")

    def validate(self) -> None:
        super().validate()
        if not self.store:
            raise UsageError("--store is required (as a flag or in the config file)")
        if self.mode != "sar" and (self.unfused or not self.prefetch):
            raise UsageError("--unfused and --no-prefetch are for --mode sar")
        if self.resume and not self.checkpoint_dir:
            raise UsageError("--resume needs --checkpoint-dir")


def evaluate(model, x, graph, data, *, mode, halo, splits=("valid", "test")) -> dict[str, dict[str, float]]:
    """Accuracy and mean cross-entropy per split over every rank's labelled nodes (collective)."""
    model.eval()
    with torch.no_grad():
        out = model(x, graph, mode=mode, halo=halo).cpu()
    sums = []
    for split in splits:
        rows = data.splits.get(split, torch.empty(0, dtype=torch.int64))
        rows = rows[data.labels[rows] >= 0]
        logits, labels = out[rows], data.labels[rows]
        sums += [float((logits.argmax(1) == labels).sum()), float(rows.numel()),
                 float(F.cross_entropy(logits, labels, reduction="sum")) if rows.numel() else 0.0]
    totals = torch.tensor(sums, dtype=torch.float64, device=x.device)
    dist.all_reduce(totals)
    result = {}
    for i, split in enumerate(splits):
        correct, count, loss = totals[3 * i:3 * i + 3].tolist()
        result[split] = {"acc": correct / count if count else float("nan"),
                         "loss": loss / count if count else float("nan")}
    return result


@fail_fast
def main(argv: Sequence[str] | None = None) -> int:
    args = FullBatchOptions.parse(argv)
    common.configure_logging(args.verbose)
    device = common.resolve_device(args.device)
    # Ranks on one machine share its cores: without this each would start one thread per core.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    rank, world = init_process_group(device, timeout_s=args.timeout)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    store = open_store(args.store)
    if not store.manifest.has_features or not store.manifest.has_labels:
        raise ConfigError(f"{args.store}: node classification needs features and labels")
    check_ranks_agree(args.to_dict(), store)  # before any rank loads its block
    t0 = time.perf_counter()
    graph = load_rank_graph(store, rank, world, device=device)
    data = load_block_data(store, graph, dtype=None)  # as stored: half rows copy half the bytes
    x = data.features.to(device).to(dtype)  # widened on the device, after the copy
    x = normalize_rows(x) if args.normalize_features == "row" else x
    train = data.splits["train"]
    train = train[data.labels[train] >= 0].to(device)
    labels = data.labels.to(device)
    count = torch.tensor([train.numel()], dtype=torch.int64, device=device)
    dist.all_reduce(count)
    load_s = time.perf_counter() - t0
    halo = HaloGraph(graph) if args.mode == "domain_parallel" else None

    common.seed_everything(args.seed)  # the same initial model on every rank
    model = FullBatchGNN(args.model, batch_norm=args.batch_norm, in_dim=store.feature_dim, hidden_dim=args.hidden,
                         out_dim=store.num_classes, num_layers=args.layers, dropout=args.dropout, heads=args.heads,
                         num_relations=max(store.num_relations, 1), num_bases=args.num_bases).to(device, dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    config = {**args.to_dict(), "world_size": world, "num_nodes": store.num_nodes, "num_edges": store.num_edges,
              "num_partitions": store.num_partitions, "halo_rows_per_rank": None}
    metrics = common.MetricsWriter(args.metrics_out if rank == 0 else None, task="full_batch", config=config)
    stats = CommStats()
    halos = torch.zeros(world, dtype=torch.int64, device=device)
    halos[rank] = graph.halo_rows
    dist.all_reduce(halos)
    config["halo_rows_per_rank"] = halos.tolist()
    if rank == 0:
        print(f"{PROG}: {store}; {world} ranks, mode {args.mode}, halo rows per rank {halos.tolist()}, "
              f"loaded in {load_s:.1f} s", flush=True)

    ckpt = common.Checkpointer(args.checkpoint_dir) if args.checkpoint_dir else None
    trained = {k: v for k, v in args.to_dict().items() if k not in FullBatchOptions.run_only_names()}
    history, best, start_epoch = [], None, 0
    if args.resume:
        # Every rank reads the same file: the state is the same on all of them.
        path = ckpt.latest()
        state = ckpt.load(path)
        common.check_resume_config(state["trained"], trained, path)
        if args.lr_schedule != "none" and state["epochs"] != args.epochs:
            raise ConfigError(f"{path}: --lr-schedule {args.lr_schedule} depends on --epochs; the checkpoint has "
                              f"{state['epochs']}, resume with the same --epochs")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        history, start_epoch = state["history"], state["epoch"] + 1
        best = max(history, key=lambda h: h["valid"]["acc"], default=None)
        if rank == 0:
            print(f"resumed from {path} (epoch {state['epoch']} done)", flush=True)
    chunk = None if args.unfused else args.edge_chunk
    for epoch in range(start_epoch, args.epochs):
        start = time.perf_counter()
        if args.lr_schedule == "cosine":
            for group in optimizer.param_groups:
                group["lr"] = args.lr * (1 + math.cos(math.pi * epoch / args.epochs)) / 2
        model.train()
        out = model(x, graph, mode=args.mode, halo=halo, seed=args.seed, epoch=epoch, edge_chunk=chunk,
                    prefetch=args.prefetch, stats=stats)
        loss = full_batch_loss(out, labels, train, int(count))
        optimizer.zero_grad()
        loss.backward()
        del out
        all_reduce_gradients(list(model.parameters()))
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        common.finite_or_raise(float(total), epoch)
        train_s = time.perf_counter() - start
        scores = evaluate(model, x, graph, data, mode=args.mode, halo=halo)
        row = {"epoch": epoch, "loss": float(total), "train_s": train_s, **scores}
        history.append(row)
        if best is None or scores["valid"]["acc"] > best["valid"]["acc"]:
            best = row
        if ckpt is not None and rank == 0:
            # Dropout is keyed by (seed, epoch): model, optimizer and epoch are the whole state.
            ckpt.save(epoch, {"epoch": epoch, "epochs": args.epochs, "model": model.state_dict(),
                              "optimizer": optimizer.state_dict(), "history": history, "trained": trained})
        if rank == 0:
            print(f"epoch {epoch}: loss {row['loss']:.4f}, valid {scores['valid']['acc']:.4f}, "
                  f"test {scores['test']['acc']:.4f}, {train_s:.2f} s", flush=True)
    peaks = torch.zeros(world, dtype=torch.int64, device=device)
    peaks[rank] = common.peak_memory_bytes()
    dist.all_reduce(peaks)
    comm = torch.tensor(list(stats.as_dict().values()), dtype=torch.int64, device=device)
    comm_all = [torch.zeros_like(comm) for _ in range(world)]
    dist.all_gather(comm_all, comm)
    metrics.write(epochs=history, final=history[-1], best=best, rss_bytes_per_rank=peaks.tolist(),
                  comm_per_rank=[dict(zip(stats.as_dict(), c.tolist())) for c in comm_all])
    if rank == 0:
        print(f"final test {history[-1]['test']['acc']:.4f}; best valid {best['valid']['acc']:.4f} at epoch "
              f"{best['epoch']} (test {best['test']['acc']:.4f})", flush=True)
    store.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
