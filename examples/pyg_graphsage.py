"""A PyG GraphSAGE trained out of core from a graphstore store (mega-batch scheme).

The model is PyG's own (`torch_geometric.nn.GraphSAGE`); graphstore only feeds it. Each
batch of the mega-batch loader (HierBatching: a quarter of the partitions resident plus
the static cache) becomes the ``Data`` PyG's NeighborLoader would give, via
``batch.to_pyg()``; the test split is evaluated with every neighbour, the structure in
memory and the feature rows read from the store (the ``macrobatch`` scheme).

    make demo                                   # writes demo_out/cora.gs
    .venv/bin/python examples/pyg_graphsage.py demo_out/cora.gs

Needs the pyg extra: ``pip install 'graphstore[pyg]'`` (``make`` installs it).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch_geometric.nn import GraphSAGE
from torch_geometric.transforms import NormalizeFeatures

import graphstore


def run(model, data):
    """The model's output for the batch's targets (the first ``batch_size`` rows)."""
    out = model(data.x, data.edge_index, num_sampled_nodes_per_hop=data.num_sampled_nodes,
                num_sampled_edges_per_hop=data.num_sampled_edges)  # trims each layer's unused hops
    return out[:data.batch_size]


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    normalize = NormalizeFeatures()  # Cora's usual preprocessing: each row divided by its sum

    store = graphstore.open(args.store)
    train = store.node_loader(split="train", fanouts=(15, 10), batch_size=1000, scheme="megabatch", seed=args.seed)
    test = store.node_loader(split="test", fanouts=(-1, -1), batch_size=1000, scheme="macrobatch", shuffle=False)
    model = GraphSAGE(store.feature_dim, 64, num_layers=2, out_channels=store.num_classes, dropout=0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)  # steadier end

    for epoch in range(args.epochs):
        model.train()
        for batch in train.epoch(epoch):
            data = normalize(batch.to_pyg())
            loss = F.cross_entropy(run(model, data), data.y[:data.batch_size])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        schedule.step()

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in test.epoch(0):
            data = normalize(batch.to_pyg())
            correct += int((run(model, data).argmax(1) == data.y[:data.batch_size]).sum())
            total += data.batch_size
    print(f"PyG GraphSAGE, mega-batch scheme, {args.epochs} epochs: test accuracy {correct / total:.3f}")
    store.close()
    return correct / total


if __name__ == "__main__":
    main()
