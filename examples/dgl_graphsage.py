"""A DGL GraphSAGE trained out of core from a graphstore store (mega-batch scheme).

The model is a stack of DGL's own `dgl.nn.SAGEConv` layers, written as for DGL's
DataLoader; graphstore only feeds it. Each batch of the mega-batch loader (HierBatching: a
quarter of the partitions resident plus the static cache) becomes DGL's list of
message-flow-graph blocks via ``batch.to_dgl()``; the test split is evaluated with every
neighbour, the structure in memory and the feature rows read from the store (the
``macrobatch`` scheme).

    make demo                                   # writes demo_out/cora.gs
    .venv/bin/python examples/dgl_graphsage.py demo_out/cora.gs

Needs the dgl extra: ``pip install 'graphstore[dgl]'`` (``make`` installs it, with the
``setuptools<70`` dgl 1.1.3 needs on torch 2.13).
"""

from __future__ import annotations

import argparse

import dgl.nn as dglnn
import torch
import torch.nn.functional as F
from torch import nn

import graphstore


class SAGE(nn.Module):
    """DGL's minibatch GraphSAGE: one SAGEConv per block."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.layers = nn.ModuleList([dglnn.SAGEConv(in_dim, hidden, "mean"), dglnn.SAGEConv(hidden, out_dim, "mean")])
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i < len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h


def normalize(x: torch.Tensor) -> torch.Tensor:
    """Cora's usual preprocessing: each row divided by its sum."""
    return x / x.sum(1, keepdim=True).clamp(min=1)


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)

    store = graphstore.open(args.store)
    train = store.node_loader(split="train", fanouts=(15, 10), batch_size=1000, scheme="megabatch", seed=args.seed)
    test = store.node_loader(split="test", fanouts=(-1, -1), batch_size=1000, scheme="macrobatch", shuffle=False)
    model = SAGE(store.feature_dim, 64, store.num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)  # steadier end

    for epoch in range(args.epochs):
        model.train()
        for batch in train.epoch(epoch):
            blocks = batch.to_dgl()
            out = model(blocks, normalize(blocks[0].srcdata["feat"]))
            loss = F.cross_entropy(out, blocks[-1].dstdata["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        schedule.step()

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in test.epoch(0):
            blocks = batch.to_dgl()
            out = model(blocks, normalize(blocks[0].srcdata["feat"]))
            correct += int((out.argmax(1) == blocks[-1].dstdata["label"]).sum())
            total += blocks[-1].num_dst_nodes()
    print(f"DGL GraphSAGE, mega-batch scheme, {args.epochs} epochs: test accuracy {correct / total:.3f}")
    store.close()
    return correct / total


if __name__ == "__main__":
    main()
