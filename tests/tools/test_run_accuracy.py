"""Tests of tools/run_accuracy.py's job bookkeeping (split-seed dataset names, when a run is
complete, the DGL reference variant) and of tools/reference_dgl.py's export of a real store.

The reference runs DGL in its own interpreter (``--dgl-python``, e.g. tools/bench_sampling.py's
``.venv-dgl``); that training is not run here (`tests/interop` trains DGL models through the
``dgl`` extra `make test` installs); the export it reads is, through the store, and the
refusal without a DGL interpreter is checked.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tools import reference_dgl as ref
from tools import run_accuracy as ra

REPO = Path(__file__).resolve().parents[2]


def test_split_seed_names():
    assert ra.base_dataset("amazon_photo_split3") == ("amazon_photo", 3)
    assert ra.base_dataset("amazon_photo") == ("amazon_photo", 0)
    assert ra.base_dataset("wn18rr_split2") == ("wn18rr_split2", 0)  # link prediction: no generated split


def _jobs(**kw) -> list[dict]:
    args = argparse.Namespace(datasets=["amazon_photo_split2"], variants=["minibatch", "dgl_fullbatch"],
                              seeds=[0, 1], lp_seeds=[0], quick=False, dgl_python=None)
    vars(args).update(kw)
    return ra.make_jobs(args)


def test_jobs_of_a_split_and_the_dgl_reference():
    jobs = _jobs(dgl_python="/opt/dgl/bin/python")
    assert [(j["dataset"], j["variant"], j["seed"]) for j in jobs] == [
        ("amazon_photo_split2", "minibatch", 0), ("amazon_photo_split2", "minibatch", 1),
        ("amazon_photo_split2", "dgl_fullbatch", 0), ("amazon_photo_split2", "dgl_fullbatch", 1)]
    mini, dgl = jobs[0], jobs[2]
    assert mini["script"] == "trainers/node_classification.py"
    assert dgl["script"] == "tools/reference_dgl.py"
    # Same hyper-parameters for both: the dataset's flags apply to the split-named dataset too.
    photo = ra.NC_DATASET_FLAGS["amazon_photo"]
    assert dgl["flags"][: len(ra.NC_BASE) + len(photo)] == ra.NC_BASE + photo
    assert mini["flags"][: len(ra.NC_BASE) + len(photo)] == ra.NC_BASE + photo
    assert dgl["flags"][-2:] == ["--dgl-python", "/opt/dgl/bin/python"]
    assert "--dgl-python" not in mini["flags"]
    with pytest.raises(SystemExit, match="unknown dataset"):
        _jobs(datasets=["cora_splitx"])


def test_complete_checks_the_epochs_asked_for(tmp_path):
    path = tmp_path / "seed0.json"
    epochs = [{"epoch": i} for i in range(20)]
    path.write_text(json.dumps({"config": {"epochs": 20}, "epochs": epochs,
                                "final": {"valid": {"acc": 0.5}, "test": {"acc": 0.5}}}))
    assert ra.complete(path)
    assert ra.complete(path, ["--seed", "0", "--epochs", "20"])
    assert not ra.complete(path, ["--epochs", "100"])  # a longer setting re-runs it
    assert ra.complete(path, ["--epochs", "100", "--epochs", "20"])  # the last flag wins, as argparse
    path.write_text(json.dumps({"config": {"epochs": 20}, "epochs": epochs[:7],
                                "final": {"valid": {"acc": 0.5}, "test": {"acc": 0.5}}}))
    assert not ra.complete(path)  # stopped early
    path.write_text("{")
    assert not ra.complete(path)


@pytest.fixture(scope="module")
def cora_store(tmp_path_factory) -> Path:
    import graphstore

    out = tmp_path_factory.mktemp("cora") / "cora.gs"
    graphstore.convert(REPO / "data" / "cora", out, num_partitions=4, partitioner="metis")
    return out


def test_export_is_the_store_graph_and_split(cora_store, tmp_path):
    import graphstore

    npz = tmp_path / "graph.npz"
    shape = ref.export(str(cora_store), npz)
    store = graphstore.open(cora_store)
    data = np.load(npz)
    assert shape == {"num_nodes": 2708, "num_edges": store.num_edges, "feature_dim": 1433}
    assert data["x"].shape == (2708, 1433) and data["x"].dtype == np.float32
    # Rows are in store order: partition k's rows sit at its id range.
    lo, hi = store.partition_range(2)
    np.testing.assert_array_equal(data["x"][lo:hi], store.read_rows("nodes/features", lo, hi))
    np.testing.assert_array_equal(data["y"], store.read_rows("nodes/labels", 0, 2708))
    assert len(data["src"]) == len(data["dst"]) == store.num_edges
    assert data["src"].max() < 2708 and data["dst"].max() < 2708
    sizes = {s: len(data[f"split_{s}"]) for s in ("train", "valid", "test")}
    assert sizes == {"train": 140, "valid": 500, "test": 1000}
    for s in sizes:
        np.testing.assert_array_equal(data[f"split_{s}"], np.asarray(store.read_node_split(s)))


def test_export_normalises_with_the_trainers_function(cora_store, tmp_path):
    from trainers.node_classification import normalize_rows

    npz = tmp_path / "graph.npz"
    ref.export(str(cora_store), npz, normalize=normalize_rows)
    x = np.load(npz)["x"]
    sums = x.sum(1)
    nonzero = sums > 0
    assert nonzero.mean() > 0.99  # Cora: every paper has words
    np.testing.assert_allclose(sums[nonzero], 1.0, rtol=1e-5)


def test_reference_refuses_without_dgl_or_with_another_model(cora_store, tmp_path):
    base = [sys.executable, str(REPO / "tools" / "reference_dgl.py"), "--store", str(cora_store),
            "--metrics-out", str(tmp_path / "m.json")]
    r = subprocess.run(base + ["--dgl-python", str(tmp_path / "no-python")], capture_output=True, text=True)
    assert r.returncode != 0
    assert "no interpreter with dgl" in r.stderr and "no-python" in r.stderr
    r = subprocess.run(base + ["--model", "gcn", "--dgl-python", sys.executable], capture_output=True, text=True)
    assert r.returncode == 2 and "GraphSAGE only" in r.stderr
    assert not (tmp_path / "m.json").exists()
