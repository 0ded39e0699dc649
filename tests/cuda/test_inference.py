"""Exact inference (`graphstore.inference.infer_layerwise`) and ``graphstore infer`` with the
model on CUDA, against the same model on the CPU (within 1e-4), reading and writing the
CPU's bytes; a model on one device and ``device`` another refused; and a checkpoint
trained on CUDA read back by ``graphstore infer``, which must score the test split as the
trainer's own exact evaluation (on the device) did. ``tests/inference/test_device.py``
runs the device's code path on the CPU, bit for bit against the host path."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import graphstore
from graphstore.errors import ConfigError
from graphstore.inference import InferenceStats, infer_layerwise, min_buffer_bytes, save_model
from graphstore.nn import GNN, LAYERS
from tests.cuda.conftest import run_python

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda")
STATS = ("bytes_read", "bytes_written", "planned_bytes", "spill_bytes", "max_resident_partitions",
         "capacities")
"""`InferenceStats` fields that count the store's and scratch files' bytes: the device's copies
are not among them, so they are the CPU's."""


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


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("kind", LAYERS)
def test_exact_inference_on_cuda_under_the_least_budget_reads_what_the_cpu_reads(small_store, kind, prefetch):
    """The least budget: two partitions resident, accumulators spilled from the device and
    restored to it, buckets cut into pieces; ``device`` given explicitly."""
    with graphstore.open(small_store) as store:
        model = model_for(store, kind)
        budget = min_buffer_bytes(model, store)
        on_cpu, on_device = InferenceStats(), InferenceStats()
        want = infer_layerwise(model, store, buffer_bytes=budget, input_transform=scaled, stats=on_cpu,
                               prefetch=prefetch)
        moved = copy.deepcopy(model).to(DEVICE)
        assert min_buffer_bytes(moved, store) == budget  # the same widths, wherever the layers are
        got = infer_layerwise(moved, store, buffer_bytes=budget, input_transform=scaled, stats=on_device,
                              prefetch=prefetch, device=DEVICE)
    assert got.dtype == np.float32 and got.shape == want.shape and np.abs(want).max() > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert {n: getattr(on_device, n) for n in STATS} == {n: getattr(on_cpu, n) for n in STATS}
    assert on_device.spill_bytes > 0


def test_a_model_on_another_device_than_the_one_asked_for_is_refused(small_store, tmp_path):
    if DEVICE.type == "cpu":
        pytest.skip("a dry run on the CPU has one device")
    with graphstore.open(small_store) as store:
        model = model_for(store, "gcn")
        with pytest.raises(ConfigError, match=r"^device is cuda:\d+ but the model is on cpu"):
            infer_layerwise(model, store, capacity=2, device=DEVICE, work_dir=tmp_path / "w")
        with pytest.raises(ConfigError, match=r"^device is cpu but the model is on cuda:\d+"):
            infer_layerwise(model.to(DEVICE), store, capacity=2, device="cpu", work_dir=tmp_path / "w")
    assert not (tmp_path / "w").exists()


def test_graphstore_infer_on_cuda_writes_the_cpus_outputs(small_store, tmp_path):
    """``graphstore infer --device cuda`` (and ``cuda:0``): the model on the card, the outputs
    the CPU's."""
    with graphstore.open(small_store) as store:
        model = model_for(store, "sage")
    save_model(model, tmp_path / "model.pt")
    outs = {}
    runs = [("cpu", []), ("device", ["--device", DEVICE.type])]  # the CPU: the default
    if DEVICE.type == "cuda":  # (a dry run on the CPU has no cpu:0)
        runs.append(("first", ["--device", "cuda:0"]))
    for label, device in runs:
        outs[label] = tmp_path / f"{label}.npy"
        done = run_python("-m", "graphstore", "infer", small_store, "--checkpoint", tmp_path / "model.pt",
                          "--split", "all", "--capacity", 2, "--out", outs[label], *device)
        assert done.returncode == 0, done.stderr[-2000:]
        where = "cpu" if DEVICE.type == "cpu" or not device else "cuda:0"
        assert done.stdout.rstrip().endswith(f"s on {where}"), done.stdout
    want = np.load(outs["cpu"])
    assert np.abs(want).max() > 0.1
    for label, _ in runs[1:]:
        got = np.load(outs[label])
        assert want.shape == got.shape
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
