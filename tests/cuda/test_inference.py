"""Exact inference (`graphstore.inference.infer_layerwise`) and ``graphstore infer`` with the
model on CUDA, against the same model on the CPU; and a checkpoint trained on CUDA read back
by ``graphstore infer``, which must score the test split as the trainer's own exact
evaluation did."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import graphstore
from graphstore.inference import infer_layerwise, save_model
from graphstore.nn import GNN, LAYERS
from tests.cuda.conftest import run_python

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda")


def model_for(store, kind: str) -> GNN:
    torch.manual_seed(0)
    model = GNN(kind, in_dim=store.feature_dim, hidden_dim=16, out_dim=store.num_classes, num_layers=2, heads=2,
                num_relations=max(store.num_relations, 1), num_bases=2)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def scaled(rows: torch.Tensor) -> torch.Tensor:
    return rows / 600.0  # features are node ids (tests/conftest.py): keep the logits moderate


@pytest.mark.parametrize("kind", LAYERS)
def test_exact_inference_with_the_model_on_cuda_equals_the_cpu(small_store, kind):
    with graphstore.open(small_store) as store:
        model = model_for(store, kind)
        want = infer_layerwise(model, store, capacity=2, input_transform=scaled)
        on_device = copy.deepcopy(model).to(DEVICE)
        got = infer_layerwise(on_device, store, capacity=2, input_transform=scaled)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == want.shape
    assert all(p.device.type == DEVICE.type for p in on_device.parameters())  # the model is left where it was
    assert np.abs(want).max() > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_graphstore_infer_on_cuda_writes_the_cpus_outputs(small_store, tmp_path):
    """``graphstore infer --device cuda``: the model on the card, the outputs the CPU's."""
    with graphstore.open(small_store) as store:
        model = model_for(store, "sage")
    save_model(model, tmp_path / "model.pt")
    outs = {}
    for label, device in (("cpu", []), ("device", ["--device", DEVICE.type])):  # the CPU: the default
        outs[label] = tmp_path / f"{label}.npy"
        done = run_python("-m", "graphstore", "infer", small_store, "--checkpoint", tmp_path / "model.pt",
                          "--split", "all", "--capacity", 2, "--out", outs[label], *device)
        assert done.returncode == 0, done.stderr[-2000:]
    want, got = np.load(outs["cpu"]), np.load(outs["device"])
    assert want.shape == got.shape and np.abs(want).max() > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_a_checkpoint_trained_on_cuda_infers_the_trainers_test_accuracy(cora_store, tmp_path):
    from tests.cuda.test_trainers import NODE, metrics, run_nc

    out, ckpt = tmp_path / "m.json", tmp_path / "ckpt"
    argv = ["--store", cora_store, *NODE, "--epochs", 1, "--device", DEVICE.type, "--checkpoint-dir", ckpt,
            "--metrics-out", out]
    assert run_nc(argv) == 0
    m = metrics(out)
    assert m["config"]["device"] == DEVICE.type and m["config"]["eval_scheme"] == "exact"
    done = run_python("-m", "graphstore", "infer", cora_store, "--checkpoint", ckpt, "--split", "test",
                      "--out", tmp_path / "test.npz")
    assert done.returncode == 0, done.stderr[-2000:]
    saved = np.load(tmp_path / "test.npz")
    with graphstore.open(cora_store) as store:
        labels = np.asarray(store.labels[...])[saved["ids"]]
    labelled = labels >= 0
    acc = float((saved["predictions"][labelled] == labels[labelled]).mean())
    # The same exact inference on the CPU, another walk: at most a near-tie flips (2 of 1000).
    assert acc == pytest.approx(m["final"]["test"]["acc"], abs=2e-3)
    assert acc > 1 / 7 + 0.2
