"""One rank of the exactness check (started by tests/distributed/test_full_batch.py with
torchrun): for every configuration, the distributed loss, outputs and every parameter's
gradient against the single-process full-batch reference, in float64. Rank 0 writes the
largest differences (all-reduced over the ranks) to the JSON file given."""

from __future__ import annotations

import copy
import json
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn import functional as F

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
    reference_forward,
)
from graphstore.layout.store import open_store
from graphstore.nn import LayerView

# (name, GNN kind, extra GNN arguments)
MODELS = [
    ("sage", "sage", {}),
    ("gcn", "gcn", {}),
    ("gin", "gin", {"learn_eps": True}),
    ("gat", "gat", {"heads": 2}),
    ("rgcn", "rgcn", {"num_bases": 2}),
    ("rgcn-nobases", "rgcn", {"num_bases": None}),
]


def whole_graph(store):
    p, n = store.num_partitions, store.num_nodes
    parts = [store.read_bucket(i, j) for j in range(p) for i in range(p)]
    src = torch.from_numpy(np.concatenate([b[0] for b in parts]).astype(np.int64))
    dst = torch.from_numpy(np.concatenate([b[1] for b in parts]).astype(np.int64))
    rel = torch.from_numpy(np.concatenate([b[2] for b in parts]).astype(np.int64)) if parts[0][2] is not None else None
    view = LayerView(n, n, slice(0, n), src, torch.bincount(dst, minlength=n), dst)  # buckets are dst-sorted
    x = torch.from_numpy(np.concatenate([store.read_features(k) for k in range(p)])).double()
    y = torch.from_numpy(np.concatenate([store.read_labels(k) for k in range(p)]).astype(np.int64))
    starts = [store.partition_range(k)[0] for k in range(p)] + [n]
    return view, rel, x, y, starts


@fail_fast
def main(argv) -> int:
    store_path, out_path = argv[0], argv[1]
    only = set(argv[2].split(",")) if len(argv) > 2 else None  # model names, or all
    torch.set_num_threads(1)
    rank, world = init_process_group("cpu", timeout_s=60)
    store = open_store(store_path)
    graph = load_rank_graph(store, rank, world)
    data = load_block_data(store, graph, dtype=torch.float64)
    view, rel, x_all, y_all, starts = whole_graph(store)
    scale = float(store.num_nodes)  # features are node ids (tests/conftest.py): keep the logits moderate
    x_all, x = x_all / scale, data.features / scale
    lo, hi = graph.node_range
    train_all = torch.from_numpy(store.read_node_split("train").astype(np.int64))
    train_all = train_all[y_all[train_all] >= 0]
    train = train_all[(train_all >= lo) & (train_all < hi)] - lo
    halo = HaloGraph(graph)
    results = []
    configs = [(m, bn, mode, chunk, True) for m in MODELS for bn in (False, True)
               for mode, chunk in (("sar", 7), ("domain_parallel", None))]
    configs += [(MODELS[3], True, "sar", None, True), (MODELS[0], True, "sar", 7, False),
                (MODELS[3], False, "sar", 7, False)]
    if only is not None:
        configs = [c for c in configs if c[0][0] in only]
    for (name, kind, extra), bn, mode, chunk, prefetch in configs:
        torch.manual_seed(0)
        model = FullBatchGNN(kind, batch_norm=bn, in_dim=store.feature_dim, hidden_dim=8, out_dim=store.num_classes,
                             num_layers=3, dropout=0.3, num_relations=max(store.num_relations, 1), **extra).double()
        ref = copy.deepcopy(model)
        out_ref = reference_forward(ref, x_all, view, partition_starts=starts, degrees=view.nbr_counts,
                                    edge_type=rel, seed=5, epoch=3)
        loss_ref = F.cross_entropy(out_ref[train_all], y_all[train_all])
        loss_ref.backward()
        comm = CommStats()
        out = model(x, graph, mode=mode, halo=halo, seed=5, epoch=3, edge_chunk=chunk, prefetch=prefetch,
                    stats=comm)
        loss = full_batch_loss(out, data.labels, train, int(train_all.numel()))
        loss.backward()
        sent = torch.tensor([comm.bytes_sent, comm.rows_fetched_remote], dtype=torch.int64)
        dist.all_reduce(sent)  # forward and backward, all ranks
        all_reduce_gradients(list(model.parameters()))
        total = loss.detach().clone()
        dist.all_reduce(total)
        grad_diff = max(float((p.grad - q.grad).abs().max()) for p, q in zip(model.parameters(), ref.parameters()))
        grad_scale = max(float(q.grad.abs().max()) for q in ref.parameters())
        stats = torch.tensor([grad_diff, float((out - out_ref[lo:hi]).detach().abs().max()),
                              abs(total.item() - loss_ref.item())], dtype=torch.float64)
        if bn:
            running = [float((a - b).abs().max()) for a, b in zip(model.norms.buffers(), ref.norms.buffers())]
            stats = torch.cat([stats, torch.tensor([max(running)], dtype=torch.float64)])
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        results.append({"model": name, "batch_norm": bn, "mode": mode, "edge_chunk": chunk, "prefetch": prefetch,
                        "grad_max_abs_diff": float(stats[0]), "out_max_abs_diff": float(stats[1]),
                        "loss_abs_diff": float(stats[2]), "running_stats_diff": float(stats[3]) if bn else None,
                        "loss": float(loss_ref), "grad_max": grad_scale, "bytes_sent": int(sent[0]),
                        "rows_received": int(sent[1]),
                        "num_params": sum(1 for _ in model.parameters())})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"world_size": world, "halo_rows": graph.halo_rows, "results": results,
                       "empty_peers": sum(int(f.numel() == 0) for f in graph.fetch_rows) - 1}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
