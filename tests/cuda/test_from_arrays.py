"""`graphstore.from_arrays` / `from_pyg` with the graph on the GPU: CUDA tensors are copied
to the host a chunk at a time and give the store the same tensors on the CPU give, file for
file (the manifest aside, which names the inputs' types)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graphstore
from tests.layout.test_from_arrays import _files, _manifest_without_source, random_graph

pytestmark = pytest.mark.cuda


def test_cuda_tensors_give_the_store_cpu_tensors_give(tmp_path):
    edge_index, features, labels, splits = random_graph(num_nodes=3000, num_edges=20000, seed=2)
    masks = {name: torch.from_numpy(np.isin(np.arange(3000), ids)) for name, ids in splits.items()}
    options = dict(num_partitions=4, partitioner="metis", seed=1)
    for device in ("cpu", "cuda"):
        graphstore.from_arrays(tmp_path / f"{device}.gs", edge_index=torch.from_numpy(edge_index).to(device),
                               features=torch.from_numpy(features).to(device, torch.bfloat16),
                               labels=torch.from_numpy(labels).to(device),
                               splits={k: v.to(device) for k, v in masks.items()}, **options)
    assert _manifest_without_source(tmp_path / "cuda.gs") == _manifest_without_source(tmp_path / "cpu.gs")
    ours, theirs = _files(tmp_path / "cuda.gs"), _files(tmp_path / "cpu.gs")
    assert ours.keys() == theirs.keys() and [k for k in ours if ours[k] != theirs[k]] == []
    with graphstore.open(tmp_path / "cuda.gs") as store:
        assert store.manifest.feature_dtype == "bfloat16"
        assert store.manifest.source["extra"]["inputs"]["features"].startswith("torch bfloat16")


def test_from_pyg_takes_a_data_on_the_gpu(tmp_path):
    pyg = pytest.importorskip("torch_geometric", reason="the pyg extra is not on this machine")
    edge_index, features, labels, splits = random_graph(num_nodes=500, num_edges=3000, seed=4)
    data = pyg.data.Data(x=torch.from_numpy(features), edge_index=torch.from_numpy(edge_index),
                         y=torch.from_numpy(labels), train_idx=torch.from_numpy(splits["train"]),
                         test_idx=torch.from_numpy(splits["test"])).to("cuda")
    manifest = graphstore.from_pyg(data, tmp_path / "g.gs", directed=False)
    assert manifest.num_nodes == 500 and manifest.splits == {"train": len(splits["train"]), "test": len(splits["test"])}
