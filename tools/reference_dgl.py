"""Full-graph GraphSAGE in DGL 1.1.3 on a store's graph and split: the outside reference of the
node-classification accuracy tables (tools/run_accuracy.py, variant ``dgl_fullbatch``).

    python tools/reference_dgl.py --store S.gs --metrics-out M.json [--config C.toml]
        [--hidden H --lr LR --weight-decay WD --dropout P --epochs E --seed S
         --normalize-features none|row --lr-schedule none|cosine] [--dgl-python PY]

Why it exists: published figures come from other splits and other preprocessing (Amazon
Photo's 90-92 % averages many random splits of the largest connected component, with tuned
hyper-parameters). DGL's ``SAGEConv`` trained on exactly the store's nodes, edges and split,
with the hyper-parameters graphstore's trainer was given, says how much of a gap to a
published figure is the trainer's and how much is the split's.

It takes the trainer's flags and config file (``trainers/node_classification.py``), so
``tools/run_accuracy.py`` passes it the same ones; flags about sampling and buffering
(``--fanouts``, ``--batch-size``, ``--scheme``, ...) are accepted and ignored: this is
full-graph training, one Adam step an epoch, every neighbour. The model mirrors the
trainer's: 2 mean-aggregator layers with a root weight, ReLU and dropout between them, no
input dropout. Row normalisation and the learning rate of each epoch come from the trainer's
own functions (``normalize_rows``, ``epoch_lr``), applied in the parent process.

The parent process (graphstore's interpreter) exports the store into a temporary ``.npz``;
a child process in an interpreter with dgl (``--dgl-python``, else ``.venv-dgl``, created
by `benchkit.ensure_dgl_python` as for the benchmarks) trains and writes the metrics JSON in the trainer's
layout (``final``, ``best``, ``epochs`` with ``time_s`` and zero ``io``), which
run_accuracy.py aggregates like any other run.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import ClassVar
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    from tools import benchkit
except ImportError:  # run as a script (also in DGL's interpreter): tools/ is on sys.path
    import benchkit

REPO = Path(__file__).resolve().parent.parent


def export(store_path: str, out: Path, *, normalize=None) -> dict:
    """The store's edges (store ids), features (passed through ``normalize``, a function of
    a float32 tensor, when given), labels and splits as one ``.npz``."""
    import numpy as np
    import torch

    import graphstore
    from graphstore.layout.dtypes import decode

    store = graphstore.open(store_path)
    n = store.num_nodes
    features = decode(np.concatenate([store.read_rows("nodes/features", *store.partition_range(k))
                                      for k in range(store.num_partitions)]), store.manifest.feature_dtype)
    if normalize is not None:
        features = normalize(torch.from_numpy(features)).numpy()
    np.savez(out, x=features, y=store.read_rows("nodes/labels", 0, n),
             src=store.read_rows("edges/src", 0, store.num_edges), dst=store.read_rows("edges/dst", 0, store.num_edges),
             **{f"split_{s}": np.asarray(store.read_node_split(s)) for s in ("train", "valid", "test")})
    return {"num_nodes": n, "num_edges": int(store.num_edges), "feature_dim": int(features.shape[1])}


def child(spec_path: str) -> None:
    """Train in DGL (runs in the dgl interpreter; imports nothing from graphstore)."""
    import numpy as np
    import torch
    from torch import nn
    from torch.nn import functional as F

    import dgl
    from dgl.nn import SAGEConv

    spec = json.loads(Path(spec_path).read_text())
    cfg = spec["config"]
    torch.set_num_threads(1)
    torch.manual_seed(cfg["seed"])
    data = np.load(spec["npz"])
    n = len(data["y"])
    graph = dgl.graph((torch.from_numpy(data["src"].astype(np.int64)),
                       torch.from_numpy(data["dst"].astype(np.int64))), num_nodes=n)
    x = torch.from_numpy(data["x"])  # normalised by the parent as the trainer does
    y = torch.from_numpy(data["y"].astype(np.int64))
    split = {s: torch.from_numpy(data[f"split_{s}"].astype(np.int64)) for s in ("train", "valid", "test")}
    classes = int(y.max()) + 1

    class Sage(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = SAGEConv(x.shape[1], cfg["hidden"], "mean")
            self.conv2 = SAGEConv(cfg["hidden"], classes, "mean")

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            h = F.dropout(F.relu(self.conv1(graph, h)), cfg["dropout"], self.training)
            return self.conv2(graph, h)

    model = Sage()
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    history, best = [], None
    t_start = time.perf_counter()
    for epoch in range(cfg["epochs"]):
        lr = spec["epoch_lr"][epoch]  # the trainer's epoch_lr, computed by the parent
        for group in optimizer.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        model.train()
        loss = F.cross_entropy(model(x)[split["train"]], y[split["train"]])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        t1 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            pred = model(x).argmax(1)
        acc = {s: {"acc": float((pred[split[s]] == y[split[s]]).float().mean())} for s in ("valid", "test")}
        t2 = time.perf_counter()
        record = {"epoch": epoch, "lr": lr, "train_loss": loss.item(), "train_targets": int(split["train"].numel()),
                  "valid": acc["valid"], "test": acc["test"], "time_s": t1 - t0, "eval_time_s": t2 - t1,
                  "io": {"bytes_read": 0, "bytes_written": 0, "stall_s": 0.0}}
        history.append(record)
        if best is None or acc["valid"]["acc"] > best["valid"]["acc"]:
            best = record
    last = history[-1]
    metrics = {"config": {**cfg, "system": "dgl-fullbatch", "dgl": dgl.__version__, "torch": torch.__version__,
                          "num_nodes": n, "num_edges": int(graph.num_edges())},
               "epochs": history, "wall_time_s": time.perf_counter() - t_start,
               "final": {"epoch": last["epoch"], "valid": last["valid"], "test": last["test"]},
               "best": {"epoch": best["epoch"], "valid": best["valid"], "test": best["test"]}}
    out = Path(spec["metrics_out"])
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(metrics, indent=1))
    tmp.replace(out)
    print(f"final: valid acc {last['valid']['acc']:.4f}  test acc {last['test']['acc']:.4f}  "
          f"(best valid at epoch {best['epoch'] + 1}: test acc {best['test']['acc']:.4f})", flush=True)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))
    from trainers import node_classification
    from trainers.options import UsageError, option

    @dataclasses.dataclass(frozen=True)
    class ReferenceOptions(node_classification.NodeClassificationOptions):
        prog: ClassVar[str] = "reference_dgl.py"
        dgl_python: str | None = option(
            None, help="an interpreter with dgl (default: .venv-dgl, created when missing)")
        dgl_venv: str = option(str(REPO / ".venv-dgl"), help=argparse.SUPPRESS)

        def validate(self) -> None:
            super().validate()
            if self.model != "sage":
                raise UsageError(f"--model {self.model}: the DGL reference is GraphSAGE only")
            if not self.metrics_out:
                raise UsageError("--metrics-out is required")

    args = ReferenceOptions.parse(argv)
    py, reason = benchkit.ensure_dgl_python(args, lambda msg: print(msg, flush=True))
    if py is None:
        raise SystemExit(f"reference_dgl.py: no interpreter with dgl: {reason}")
    config = {k: getattr(args, k) for k in ("hidden", "lr", "weight_decay", "dropout", "epochs", "seed",
                                            "normalize_features", "lr_schedule")}
    with tempfile.TemporaryDirectory(prefix="reference_dgl_") as tmp:
        npz = Path(tmp) / "graph.npz"
        rows = node_classification.normalize_rows if args.normalize_features == "row" else None
        shape = export(args.store, npz, normalize=rows)
        print(f"exported {args.store}: {shape['num_nodes']:,} nodes, {shape['num_edges']:,} edges, "
              f"{shape['feature_dim']} features", flush=True)
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"npz": str(npz), "metrics_out": str(Path(args.metrics_out).resolve()),
                                    "epoch_lr": [node_classification.epoch_lr(args, e) for e in range(args.epochs)],
                                    "config": {**config, "store": str(args.store)}}))
        return subprocess.run([py, str(Path(__file__).resolve()), "--child", str(spec)]).returncode


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
