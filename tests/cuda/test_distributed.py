"""SAR and DDP under NCCL at world size 1 (one card), each in a process of its own
(``tests/cuda/sar_worker.py``, ``tests/cuda/dp_worker.py``: a process group of one, as
``python trainers/full_batch.py`` makes without torchrun), and the full-batch trainer with
``--device cuda`` beside the CPU. What one rank can check: the partial forms, the edge
chunks, node-keyed dropout, BatchNorm and the gradient all-reduce run on the device through
NCCL and give the CPU reference's numbers; several ranks need several cards (gloo covers
them on the CPU, tests/distributed)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import REPO
from tests.cuda.conftest import run_python

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda")
HERE = REPO / "tests" / "cuda"
BACKEND = {"cuda": "nccl", "cpu": "gloo"}
SAR_MODELS = ["sage", "sage-bn", "gcn", "gin", "gat", "gat-bn", "rgcn", "rgcn-nobases"]


def worker(script: str, store, out) -> dict:
    done = run_python(HERE / script, store, out, DEVICE.type, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 1 and result["backend"] == BACKEND[DEVICE.type]
    return result


@pytest.fixture(scope="module")
def sar(small_store, tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("sar") / "sar.json"
    return {r["model"]: r for r in worker("sar_worker.py", small_store, out)["results"]}


@pytest.fixture(scope="module")
def ddp(small_store, tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("ddp") / "ddp.json"
    return {r["case"]: r for r in worker("dp_worker.py", small_store, out)["results"]}


@pytest.mark.parametrize("model", SAR_MODELS)
def test_sar_under_nccl_equals_the_single_process_reference(sar, model):
    r = sar[model]
    assert r["device"].startswith(DEVICE.type) and all(d.startswith(DEVICE.type) for d in r["grad_devices"])
    assert r["out_max_abs_diff"] < 1e-10, r
    assert r["loss_abs_diff"] < 1e-10, r
    assert r["grad_max_abs_diff"] < 1e-10, r
    assert r["grad_max"] > 1e-3 and 0.5 < r["loss"] < 5, r  # a real gradient, a real loss


@pytest.mark.parametrize("case", ["minibatch", "microbatch"])
def test_ddp_under_nccl_trains_as_the_plain_model(ddp, case):
    r = ddp[case]
    assert all(d.startswith(DEVICE.type) for d in r["param_devices"])
    assert r["moved"] > 1e-3  # two epochs of Adam moved the parameters
    assert r["max_param_diff"] < 1e-9, r  # float64: DDP's average over one rank is the plain gradient
    assert r["losses"] == pytest.approx(r["plain_losses"], rel=1e-9)


def test_the_full_batch_trainer_on_cuda_has_the_cpus_losses(small_store, tmp_path):
    runs = {}
    for label, device in (("cpu", "cpu"), ("device", DEVICE.type)):
        out = tmp_path / f"{label}.json"
        done = run_python(REPO / "trainers" / "full_batch.py", "--store", small_store, "--model", "gat", "--heads", 2,
                          "--hidden", 16, "--epochs", 3, "--dtype", "float64", "--normalize-features", "row",
                          "--edge-chunk", 64, "--device", device, "--metrics-out", out, timeout=150)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[label] = json.loads(out.read_text())
    cpu, dev = ([e["loss"] for e in runs[k]["epochs"]] for k in ("cpu", "device"))
    assert len(dev) == 3 and dev == pytest.approx(cpu, rel=1e-9)
    assert dev[-1] != dev[0]  # it trained (dropout 0.5, keyed by node: the same masks on both)
    assert runs["device"]["final"]["test"]["acc"] == runs["cpu"]["final"]["test"]["acc"]
