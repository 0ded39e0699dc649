"""The trainers with ``--device cuda``: every node-classification scheme and link prediction
(minibatch with a GNN encoder; disk with learnable embeddings written back to the store and
read again) for 2 epochs, each beside the same run on the CPU; link prediction's exact
encoder evaluation on the device beside its in-memory one.

Same seed, same batches (the loaders' batches depend on (seed, epoch) alone, whatever the
number of loader threads), no dropout: the two runs differ by float rounding only, so the
first epoch's loss agrees to 1e-3 and the final accuracy (MRR) to 0.05. Evaluation is the
trainers' default (exact, layer-wise over the store)."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda")

CHANCE = 1 / 7  # Cora's 7 classes
NOISE = 0.05     # accuracy (MRR) allowed between the CPU and the CUDA run
NODE = ["--epochs", 2, "--seed", 0, "--dropout", 0, "--fanouts", "5,5", "--hidden", 32, "--lr", 0.02,
        "--batch-size", 64, "--normalize-features", "none"]
SCHEMES = {
    "minibatch": [],
    "megabatch": ["--buffer-partitions", 2],
    "disk": ["--buffer-partitions", 4],
    "microbatch": ["--micro-batches", 3, "--micro-strategy", "reg"],
    "macrobatch": ["--macro-batches", 2],
}


def devices() -> tuple[tuple[str, str], ...]:
    """(label, --device) of the two runs of every test."""
    return ("cpu", "cpu"), ("device", DEVICE.type)


def run_nc(argv) -> int:
    from trainers import common
    from trainers import node_classification as nc

    return common.run(nc.PROG, nc.main, [str(a) for a in argv])


def run_lp(argv) -> int:
    from trainers import common
    from trainers import link_prediction as lp

    return common.run(lp.PROG, lp.main, [str(a) for a in argv])


def metrics(path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_node_classification_on_cuda_reaches_the_cpus_accuracy(cora_store, tmp_path, scheme):
    runs = {}
    for label, device in devices():
        out = tmp_path / f"{label}.json"
        assert run_nc(["--store", cora_store, "--scheme", scheme, *SCHEMES[scheme], *NODE, "--device", device,
                       "--metrics-out", out]) == 0, device
        runs[label] = metrics(out)
    cpu, dev = runs["cpu"], runs["device"]
    assert dev["config"]["device"] == DEVICE.type and dev["config"]["loaders"]["train"]["scheme"] == scheme
    first = [m["epochs"][0]["train_loss"] for m in (cpu, dev)]
    assert all(math.isfinite(x) for x in first)
    assert first[1] == pytest.approx(first[0], rel=1e-3)
    acc = [m["final"]["test"]["acc"] for m in (cpu, dev)]
    print(f"{scheme}: test accuracy cpu {acc[0]:.4f}, {DEVICE.type} {acc[1]:.4f}; "
          f"first loss {first[0]:.5f} / {first[1]:.5f}")
    assert abs(acc[1] - acc[0]) <= NOISE
    assert acc[1] > CHANCE + 0.2  # learned, not merely run
    if scheme == "microbatch":
        stats = dev["epochs"][-1]["micro_batching"]
        assert stats["micro_batches"] == 3 * stats["batches"]


LINK = ["--embedding-dim", 16, "--negatives", 32, "--num-chunks", 4, "--batch-size", 256, "--epochs", 2,
        "--seed", 0, "--eval-every", 1]


def random_mrr(num_nodes: int) -> float:
    return sum(1 / r for r in range(1, num_nodes + 1)) / num_nodes


def two_copies(kg_store, tmp_path) -> dict[str, object]:
    """label -> a private copy of the store (each run writes its embeddings into its own)."""
    stores = {}
    for label, _ in devices():
        stores[label] = tmp_path / f"{label}.gs"
        shutil.copytree(kg_store, stores[label])
    return stores


def test_link_prediction_minibatch_with_an_encoder_on_cuda(kg_store, tmp_path):
    import graphstore

    stores, runs = two_copies(kg_store, tmp_path), {}
    for label, device in devices():
        out = tmp_path / f"{label}.json"
        assert run_lp(["--store", stores[label], "--scheme", "minibatch", "--encoder", "sage", "--model",
                       "distmult", "--fanouts", "5,5", "--optimizer", "adam", "--lr", 0.01, *LINK, "--device", device,
                       "--metrics-out", out]) == 0, device
        runs[label] = metrics(out)
    cpu, dev = runs["cpu"], runs["device"]
    assert dev["config"]["device"] == DEVICE.type and dev["config"]["encoder"] == "sage"
    first = [m["epochs"][0]["train_loss"] for m in (cpu, dev)]
    assert first[1] == pytest.approx(first[0], rel=1e-3)
    mrr = [m["final"]["test"]["mrr"] for m in (cpu, dev)]
    print(f"minibatch+sage: test MRR cpu {mrr[0]:.4f}, {DEVICE.type} {mrr[1]:.4f}")
    assert abs(mrr[1] - mrr[0]) <= NOISE
    assert mrr[1] > 1.5 * random_mrr(graphstore.open(kg_store).num_nodes)


def test_link_prediction_exact_encoder_evaluation_on_cuda(kg_store, tmp_path):
    """``--eval-encoder exact`` with the encoder on the device (`infer_layerwise` runs it
    there, from the store, two partitions resident) ranks as the whole-graph encoder in
    device memory does: the same trained model, scored two ways."""
    stores, runs = two_copies(kg_store, tmp_path), {}
    for (label, _), mode in zip(devices(), ("exact", "memory")):
        out = tmp_path / f"{mode}.json"
        assert run_lp(["--store", stores[label], "--scheme", "disk", "--buffer-partitions", 2, "--encoder", "sage",
                       "--model", "distmult", "--fanouts", "5,5", "--optimizer", "adam", "--lr", 0.01, *LINK,
                       "--epochs", 1, "--device", DEVICE.type, "--eval-encoder", mode,
                       "--metrics-out", out]) == 0, mode
        runs[mode] = metrics(out)
    exact, memory = runs["exact"], runs["memory"]
    assert exact["config"]["device"] == DEVICE.type and exact["config"]["eval_encoder"] == "exact"
    for split in ("valid", "test"):
        for metric, value in memory["final"][split].items():
            assert exact["final"][split][metric] == pytest.approx(value, abs=2e-3), (split, metric)


def test_link_prediction_disk_embeddings_written_back_from_cuda_and_read_again(kg_store, tmp_path):
    """BETA with 2 of 4 partitions resident: partitions leave (their embeddings, updated by
    gradients computed on the device, written back) and come back (read again) within an
    epoch; the store's table after the CUDA run is the CPU run's, up to float rounding."""
    import graphstore
    from graphstore.layout.embeddings import EmbeddingTable

    stores, runs = two_copies(kg_store, tmp_path), {}
    for label, device in devices():
        out = tmp_path / f"{label}.json"
        assert run_lp(["--store", stores[label], "--scheme", "disk", "--policy", "beta", "--buffer-partitions", 2,
                       "--lr", 0.1, *LINK, "--device", device, "--metrics-out", out]) == 0, device
        runs[label] = metrics(out)
    cpu, dev = runs["cpu"], runs["device"]
    assert dev["config"]["device"] == DEVICE.type
    assert dev["config"]["learnable_embeddings"] and dev["config"]["loader"]["policy"] == "beta"
    for e in dev["epochs"]:
        assert e["io"]["bytes_written"] > 0 and e["io"]["bytes_read"] > 0  # out and back in, every epoch
    tables = {label: EmbeddingTable.open(graphstore.open(s)).read_all() for label, s in stores.items()}
    with graphstore.open(kg_store) as store:
        init = np.concatenate([np.random.default_rng([0, k]).standard_normal((stop - start, 16), dtype=np.float32)
                               * np.float32(1e-3) for k in range(store.num_partitions)
                               for start, stop in [store.partition_range(k)]])
        num_nodes = store.num_nodes
    got, want = tables["device"][:, 0], tables["cpu"][:, 0]
    assert np.abs(got - init).mean() > 10 * np.abs(init).mean()  # trained, and the training was stored
    assert np.linalg.norm(got - want) < 1e-3 * np.linalg.norm(want)
    mrr = [m["final"]["test"]["mrr"] for m in (cpu, dev)]
    print(f"disk+beta: test MRR cpu {mrr[0]:.4f}, {DEVICE.type} {mrr[1]:.4f}")
    assert abs(mrr[1] - mrr[0]) <= NOISE
    assert mrr[1] > 2 * random_mrr(num_nodes)
