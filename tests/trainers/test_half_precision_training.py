"""The trainers on float16, bfloat16 and float32 stores of one source (issue 34, 1): one epoch
of every node-classification scheme (row-normalised or not), link prediction with an
encoder, and `graphstore infer` from the checkpoint; losses finite, the model learns."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from tests.half_sources import DTYPES, convert, source_rows, write_source
from tests.trainers.conftest import REPO
from trainers import common
from trainers import link_prediction as lp
from trainers import node_classification as nc

SCHEMES = [["--scheme", "minibatch"], ["--scheme", "megabatch", "--buffer-partitions", 2],
           ["--scheme", "disk", "--buffer-partitions", 2], ["--scheme", "microbatch", "--micro-batches", 2],
           ["--scheme", "macrobatch", "--macro-batches", 2],
           ["--scheme", "macrobatch", "--feature-cache-bytes", "8KiB"]]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """dtype -> (node-classification store, link-prediction store), non-negative sparse rows
    so the trainers' default normalisation is ``row``."""
    root = tmp_path_factory.mktemp("half-trainers")
    features, labels = source_rows()
    features = np.abs(features)
    features[features < 1.0] = 0  # mostly zeros: the data's rule picks row normalisation
    node = write_source(root / "node", features, labels)
    link = write_source(root / "link", features, None)
    return {dt: (convert(node, root / f"n-{dt}.gs", dt), convert(link, root / f"l-{dt}.gs", dt)) for dt in DTYPES}


@pytest.mark.parametrize("extra", SCHEMES, ids=lambda extra: "-".join(str(a).lstrip("-") for a in extra))
@pytest.mark.parametrize("dtype, normalize", [(dt, "auto") for dt in DTYPES] + [("bfloat16", "none")])
def test_node_classification_trains_in_every_scheme(stores, tmp_path, dtype, normalize, extra):
    """float16 without normalisation is tests/trainers/test_node_classification.py's
    ``test_a_float16_store_trains_in_every_scheme``."""
    out = tmp_path / "m.json"
    assert common.run(nc.PROG, nc.main, [str(a) for a in [
        "--store", stores[dtype][0], "--epochs", 2, "--metrics-out", out, "--fanouts", "5,5", "--hidden", 16,
        "--lr", 0.05, "--normalize-features", normalize, "--seed", 0, *extra]]) == 0
    m = json.loads(out.read_text())
    assert all(math.isfinite(e["train_loss"]) for e in m["epochs"])
    if normalize == "auto":
        assert m["config"]["normalize_features"] == "row"  # decided from the stored rows, any dtype
    assert m["final"]["test"]["acc"] > 0.5  # 4 classes, the class column raised in every row


@pytest.mark.parametrize("dtype", DTYPES)
def test_link_prediction_with_an_encoder(stores, tmp_path, dtype):
    out = tmp_path / "m.json"
    for evaluation in ("memory", "exact"):
        assert common.run(lp.PROG, lp.main, [str(a) for a in [
            "--store", stores[dtype][1], "--encoder", "sage", "--fanouts", "5,5", "--epochs", 1,
            "--embedding-dim", 16, "--negatives", 32, "--num-chunks", 4, "--batch-size", 512, "--scheme", "disk",
            "--buffer-partitions", 2, "--eval-encoder", evaluation, "--metrics-out", out]]) == 0
        m = json.loads(out.read_text())
        assert math.isfinite(m["epochs"][0]["train_loss"]) and m["final"]["valid"]["hits@20"] >= 0


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_infer_from_a_checkpoint_of_a_half_store(stores, tmp_path, dtype):
    """`graphstore infer` reads the bfloat16 rows as numbers (decoded, not the uint16 bits
    converted): its test accuracy is the trainer's exact evaluation's."""
    out, ckpt = tmp_path / "m.json", tmp_path / "ckpt"
    store = stores[dtype][0]
    assert common.run(nc.PROG, nc.main, [str(a) for a in [
        "--store", store, "--epochs", 3, "--metrics-out", out, "--fanouts", "5,5", "--hidden", 16, "--lr", 0.05,
        "--checkpoint-dir", ckpt, "--seed", 0]]) == 0
    m = json.loads(out.read_text())
    proc = subprocess.run([sys.executable, "-m", "graphstore", "infer", str(store), "--checkpoint", str(ckpt),
                           "--out", str(tmp_path / "o.npz")], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    import graphstore

    o = np.load(tmp_path / "o.npz")
    with graphstore.open(store) as s:
        labels = np.asarray(s.labels[...])[o["ids"]]
    acc = float((o["logits"].argmax(1) == labels).mean())
    assert acc == pytest.approx(m["final"]["test"]["acc"], abs=1e-9) and acc > 0.5
