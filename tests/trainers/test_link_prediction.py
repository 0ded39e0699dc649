"""End to end: trainers/link_prediction.py on a small clustered knowledge graph (4
partitions): learnable embeddings through the disk scheme's COMET buffer, filtered MRR
above the random baseline, exact resume with the embeddings restored, encoders."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import graphstore
from graphstore.layout.embeddings import EmbeddingTable
from trainers import common
from trainers import link_prediction as lp

FAST = ["--embedding-dim", 16, "--negatives", 32, "--num-chunks", 4, "--batch-size", 256, "--lr", 0.1]


def run(argv) -> int:
    return common.run(lp.PROG, lp.main, [str(a) for a in argv])


def random_mrr(num_nodes: int) -> float:
    """Expected MRR of a uniformly random ranking among ``num_nodes`` candidates."""
    return sum(1 / r for r in range(1, num_nodes + 1)) / num_nodes


def test_disk_comet_learns_embeddings_in_the_store(fresh_kg, tmp_path, capsys):
    out = tmp_path / "m.json"
    assert run(["--store", fresh_kg, "--scheme", "disk", "--policy", "comet", "--epochs", 5,
                "--metrics-out", out, *FAST]) == 0
    m = json.loads(out.read_text())
    loader = m["config"]["loader"]
    assert (loader["policy"], loader["capacity"], loader["num_logical_partitions"]) == ("comet", 2, 4)
    assert m["config"]["learnable_embeddings"] and m["config"]["eval"] == "filtered"
    assert {"mrr", "hits@1", "hits@3", "hits@10"} <= set(m["final"]["test"])
    for e in m["epochs"]:  # every epoch writes its updated embeddings back
        assert e["io"]["bytes_written"] > 0 and "stall_s" in e["io"]
    # Double buffering gives COMET (2 logical partitions of 2, swapped one at a time) 4 slots:
    # here the whole graph, so once read it stays; the first epoch must read it.
    assert m["epochs"][0]["io"]["bytes_read"] > 0
    losses = [e["train_loss"] for e in m["epochs"]]
    assert losses[-1] < losses[0]
    store = graphstore.open(fresh_kg)
    trained = EmbeddingTable.open(store).read_all()
    # What the run started from: the seeded initialisation, reproduced on a copy.
    init = np.concatenate([np.random.default_rng([0, k]).standard_normal(
        (stop - start, 16), dtype=np.float32) * np.float32(1e-3)
        for k in range(store.num_partitions) for start, stop in [store.partition_range(k)]])
    assert np.abs(trained[:, 0] - init).mean() > 10 * np.abs(init).mean()
    assert (trained[:, 1] > 0).all(axis=1).mean() > 0.9  # Adagrad state of (almost) every row
    assert m["final"]["test"]["mrr"] > 3 * random_mrr(store.num_nodes)
    assert "logical partitions 4" in capsys.readouterr().out


def test_resume_restores_the_embeddings_exactly(kg_store, tmp_path):
    import shutil

    stores = {}
    for name in ("straight", "split"):
        stores[name] = tmp_path / f"{name}.gs"
        shutil.copytree(kg_store, stores[name])
    args = ["--scheme", "disk", "--policy", "beta", *FAST]
    a, b = tmp_path / "a", tmp_path / "b"
    assert run(["--store", stores["straight"], *args, "--epochs", 3, "--checkpoint-dir", a,
                "--metrics-out", a / "m.json"]) == 0
    assert run(["--store", stores["split"], *args, "--epochs", 1, "--checkpoint-dir", b]) == 0
    # Another run's embeddings in the store (as after training past the checkpoint and
    # crashing) must not leak into the resumed run: the checkpoint's copy is restored.
    assert run(["--store", stores["split"], *args, "--epochs", 1, "--seed", 9]) == 0
    assert run(["--store", stores["split"], *args, "--epochs", 3, "--checkpoint-dir", b, "--resume",
                "--metrics-out", b / "m.json"]) == 0
    ma, mb = json.loads((a / "m.json").read_text()), json.loads((b / "m.json").read_text())
    assert ma["final"] == mb["final"]
    assert [e["train_loss"] for e in ma["epochs"]] == [e["train_loss"] for e in mb["epochs"]]
    ea = EmbeddingTable.open(graphstore.open(stores["straight"])).read_all()
    eb = EmbeddingTable.open(graphstore.open(stores["split"])).read_all()
    assert np.array_equal(ea, eb)
    sa = torch.load(a / "epoch-0002" / "state.pt", weights_only=False)["model"]
    sb = torch.load(b / "epoch-0002" / "state.pt", weights_only=False)["model"]
    assert all(torch.equal(v, sb[k]) for k, v in sa.items())


@pytest.mark.parametrize("encoder, model", [("sage", "distmult"), ("rgcn", "complex"), ("gat", "transe")])
def test_encoders_train_and_evaluate(fresh_kg, tmp_path, encoder, model):
    out = tmp_path / "m.json"
    assert run(["--store", fresh_kg, "--encoder", encoder, "--model", model, "--fanouts", "5,5",
                "--epochs", 1, "--optimizer", "adam", "--metrics-out", out, *FAST[:-2], "--lr", 0.01]) == 0
    m = json.loads(out.read_text())
    assert m["config"]["encoder"] == encoder and m["config"]["loader"]["fanouts"] == [5, 5]
    assert all(math.isfinite(e["train_loss"]) for e in m["epochs"])
    assert 0 < m["final"]["valid"]["mrr"] <= 1


def test_unfiltered_is_not_above_filtered(fresh_kg, tmp_path):
    outs = {}
    for mode in ("filtered", "unfiltered"):
        outs[mode] = tmp_path / f"{mode}.json"
        argv = ["--store", fresh_kg, "--epochs", 1, "--eval", mode, "--metrics-out", outs[mode], *FAST]
        assert run(argv) == 0
    f, u = (json.loads(outs[k].read_text())["final"]["test"]["mrr"] for k in ("filtered", "unfiltered"))
    assert u <= f


def test_store_without_edge_splits_is_one_line(cora_store, capsys):
    assert run(["--store", cora_store, "--epochs", 1]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a 'valid' edge split" in err


def test_ogb_eval_needs_shipped_negatives(fresh_kg, capsys):
    assert run(["--store", fresh_kg, "--epochs", 1, "--eval", "ogb", *FAST]) == 1
    assert "ships no negative edge pairs" in capsys.readouterr().err
