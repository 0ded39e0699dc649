"""SAR over half-precision stores (issue 34, 1): two ranks train a float16 or bfloat16 store
exactly as they train the float32 store of the same rounded rows (each rank reads its block
as stored and widens it on its device)."""

from __future__ import annotations

import json

import pytest

from tests.distributed.launch import torchrun
from tests.half_sources import convert, source_rows, upcast_source, write_source
from tests.trainers.conftest import REPO


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_two_ranks_train_a_half_store_as_its_float32_reference(tmp_path, dtype):
    features, labels = source_rows(num_nodes=600)
    half = convert(write_source(tmp_path / "src", features, labels), tmp_path / "h.gs", dtype)
    ref = convert(upcast_source(tmp_path / "ref", features, labels, dtype), tmp_path / "r.gs", "float32")
    runs = {}
    for name, store in (("half", half), ("ref", ref)):
        out = tmp_path / f"{name}.json"
        done = torchrun(2, REPO / "trainers" / "full_batch.py", "--store", store, "--model", "sage", "--hidden", 8,
                        "--epochs", 3, "--normalize-features", "row", "--metrics-out", out, timeout=110)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = json.loads(out.read_text())
    losses = [[e["loss"] for e in runs[name]["epochs"]] for name in ("half", "ref")]
    assert losses[0] == losses[1] and losses[0][-1] < losses[0][0]


def test_partitioned_fetch_of_a_bfloat16_store_serves_its_numbers(tmp_path):
    """Data-parallel macro-batching with the rows partitioned over two ranks (BatchGNN's
    fetch): a bfloat16 store trains as the float32 store of the same values (its uint16
    bits decoded, not converted as integers)."""
    features, labels = source_rows(num_nodes=600)
    half = convert(write_source(tmp_path / "src", features, labels), tmp_path / "h.gs", "bfloat16")
    ref = convert(upcast_source(tmp_path / "ref", features, labels, "bfloat16"), tmp_path / "r.gs", "float32")
    runs = {}
    for name, store in (("half", half), ("ref", ref)):
        out = tmp_path / f"{name}.json"
        done = torchrun(2, REPO / "trainers" / "node_classification.py", "--store", store, "--scheme", "macrobatch",
                        "--feature-placement", "partitioned", "--epochs", 2, "--fanouts", "5,5", "--hidden", 8,
                        "--normalize-features", "none", "--seed", 0, "--metrics-out", out, timeout=110)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = json.loads(out.read_text())
    losses = [[e["train_loss"] for e in runs[name]["epochs"]] for name in ("half", "ref")]
    assert losses[0] == losses[1]
    assert runs["half"]["final"]["test"] == runs["ref"]["final"]["test"]
