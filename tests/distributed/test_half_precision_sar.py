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
