"""One process of the CUDA suite's SAR check (tests/cuda/test_distributed.py): a process
group of one on ``DEVICE`` (NCCL on CUDA, gloo on the CPU), every layer type's SAR forward
and backward (edge chunks of 7, prefetch, node-keyed dropout, BatchNorm for two kinds) on the
device in float64 against the single-process reference on the CPU; the gradients
all-reduced through the group. Writes the largest differences to the JSON file given.

    python tests/cuda/sar_worker.py STORE OUT.json DEVICE
"""

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
    all_reduce_gradients,
    fail_fast,
    full_batch_loss,
    init_process_group,
    load_block_data,
    load_rank_graph,
    reference_forward,
)
from graphstore.layout.store import open_store
# The single-process reference's whole graph, as the CPU exactness check reads it (the
# repository is on the worker's PYTHONPATH).
from tests.distributed.exactness_worker import whole_graph

# (name, GNN kind, batch norm, extra GNN arguments)
MODELS = [
    ("sage", "sage", False, {}),
    ("sage-bn", "sage", True, {}),
    ("gcn", "gcn", False, {}),
    ("gin", "gin", False, {"learn_eps": True}),
    ("gat", "gat", False, {"heads": 2}),
    ("gat-bn", "gat", True, {"heads": 2}),
    ("rgcn", "rgcn", False, {"num_bases": 2}),
    ("rgcn-nobases", "rgcn", False, {"num_bases": None}),
]


@fail_fast
def main(argv) -> int:
    store_path, out_path, device = argv[0], argv[1], torch.device(argv[2])
    rank, world = init_process_group(device, timeout_s=60)
    backend = dist.get_backend()
    store = open_store(store_path)
    graph = load_rank_graph(store, rank, world, device=device)
    data = load_block_data(store, graph, dtype=torch.float64)
    view, rel, x_all, y_all, starts = whole_graph(store)
    scale = float(store.num_nodes)  # features are node ids (tests/conftest.py): keep the logits moderate
    x_all, x = x_all / scale, (data.features / scale).to(device)
    train_all = torch.from_numpy(store.read_node_split("train").astype(np.int64))
    train_all = train_all[y_all[train_all] >= 0]
    lo, hi = graph.node_range
    train = (train_all[(train_all >= lo) & (train_all < hi)] - lo).to(device)
    labels = data.labels.to(device)
    results = []
    for name, kind, bn, extra in MODELS:
        torch.manual_seed(0)
        model = FullBatchGNN(kind, batch_norm=bn, in_dim=store.feature_dim, hidden_dim=8, out_dim=store.num_classes,
                             num_layers=3, dropout=0.3, num_relations=max(store.num_relations, 1), **extra).double()
        ref = copy.deepcopy(model)
        out_ref = reference_forward(ref, x_all, view, partition_starts=starts, degrees=view.nbr_counts,
                                    edge_type=rel, seed=5, epoch=3)
        loss_ref = F.cross_entropy(out_ref[train_all], y_all[train_all])
        loss_ref.backward()
        model = model.to(device)
        out = model(x, graph, mode="sar", seed=5, epoch=3, edge_chunk=7, prefetch=True, stats=CommStats())
        loss = full_batch_loss(out, labels, train, int(train_all.numel()))
        loss.backward()
        all_reduce_gradients(list(model.parameters()))
        grads = [(n, p.grad, q.grad) for (n, p), q in zip(model.named_parameters(), ref.parameters())]
        results.append({
            "model": name, "device": str(out.device), "grad_devices": sorted({str(g.device) for _, g, _ in grads}),
            "out_max_abs_diff": float((out.detach().cpu() - out_ref[lo:hi].detach()).abs().max()),
            "loss_abs_diff": abs(float(loss) - float(loss_ref)),
            "grad_max_abs_diff": max(float((g.cpu() - r).abs().max()) for _, g, r in grads),
            "grad_max": max(float(r.abs().max()) for _, _, r in grads), "loss": float(loss_ref),
        })
    with open(out_path, "w") as f:
        json.dump({"world_size": world, "backend": backend, "results": results}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
