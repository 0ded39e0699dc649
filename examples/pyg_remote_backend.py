"""PyG's own NodeLoader over a graphstore store: the store as a PyG remote backend.

For PyG code built around ``NodeLoader``: `graphstore.interop.remote_backend` gives PyG's
``(FeatureStore, GraphStore)`` pair over the store (the structure and labels in memory, the
feature rows read from the store per batch, every block checksummed) and ``DenseSampler``
samples it with graphstore's DENSE sampler, so no pyg-lib or torch-sparse is needed.

    make demo                                   # writes demo_out/cora.gs
    .venv/bin/python examples/pyg_remote_backend.py demo_out/cora.gs

Needs the pyg extra: ``pip install 'graphstore[pyg]'`` (``make`` installs it).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch_geometric.loader import NodeLoader
from torch_geometric.nn import GraphSAGE
from torch_geometric.transforms import NormalizeFeatures

import graphstore
from graphstore.interop import DenseSampler, remote_backend


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)

    store = graphstore.open(args.store)
    data = remote_backend(store)                       # (feature store, graph store)
    split = {name: torch.from_numpy(store.read_node_split(name)) for name in ("train", "test")}
    train = NodeLoader(data, node_sampler=DenseSampler(data[1], fanouts=(15, 10), seed=args.seed),
                       input_nodes=split["train"], batch_size=64, shuffle=True, transform=NormalizeFeatures())
    test = NodeLoader(data, node_sampler=DenseSampler(data[1], fanouts=(-1, -1)), input_nodes=split["test"],
                      batch_size=1000, transform=NormalizeFeatures())
    model = GraphSAGE(store.feature_dim, 64, num_layers=2, out_channels=store.num_classes, dropout=0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)

    for _ in range(args.epochs):
        model.train()
        for batch in train:
            out = model(batch.x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                        num_sampled_edges_per_hop=batch.num_sampled_edges)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        schedule.step()

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in test:
            out = model(batch.x, batch.edge_index)[:batch.batch_size]
            correct += int((out.argmax(1) == batch.y[:batch.batch_size]).sum())
            total += batch.batch_size
    print(f"PyG GraphSAGE, PyG NodeLoader over the store, {args.epochs} epochs: test accuracy {correct / total:.3f}")
    store.close()
    return correct / total


if __name__ == "__main__":
    main()
