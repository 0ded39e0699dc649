"""Ranks refuse to train unless they agree (`graphstore.distributed.agreement`): under
torchrun, a rank with another --lr, --seed or --batch-size, or on another partitioning of
the data, ends the job at once with one line naming the rank and the field, in every
trainer; a default derived from each rank's memory is made the same on all of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import graphstore
from tests.distributed.launch import torchrun

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "rank_flags_worker.py"
NC = ["--fanouts", "3,3", "--epochs", "1", "--batch-size", "64", "--hidden", "8", "--eval-fanouts", "3,3"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("agree")
    out = {}
    for name, parts in (("eight", 8), ("four", 4)):
        out[name] = root / f"cora{parts}.gs"
        graphstore.convert(REPO / "data" / "cora", out[name], num_partitions=parts, partitioner="metis")
    return out


def launch(trainer: str, per_rank: dict[str, list[str]], *flags) -> tuple[int, str]:
    done = torchrun(2, WORKER, trainer, json.dumps(per_rank), *flags, timeout=120)
    return done.returncode, done.stderr


@pytest.mark.parametrize("flag, theirs, ours", [("--lr", "0.02", "0.01"), ("--seed", "3", "0"),
                                                ("--batch-size", "32", "64")])
def test_node_classification_ranks_with_other_settings_are_refused(stores, flag, theirs, ours):
    code, err = launch("node_classification", {"1": [flag, theirs]}, "--store", stores["eight"], "--scheme",
                       "megabatch", "--buffer-partitions", "2", *NC)
    assert code != 0
    assert f"rank 1 disagrees with rank 0 on {flag}: {theirs} against {ours}" in err, err[-2000:]


def test_a_rank_on_another_partitioning_is_refused(stores):
    code, err = launch("node_classification", {"1": ["--store", str(stores["four"])]}, "--store", stores["eight"],
                       "--scheme", "macrobatch", *NC)
    assert code != 0
    assert "rank 1 disagrees with rank 0 on store.num_partitions: 4 against 8" in err, err[-2000:]


def test_link_prediction_and_full_batch_ranks_are_checked_too(stores, tmp_path):
    write = tmp_path / "kg"
    from tests.trainers.conftest import write_clustered_kg

    write_clustered_kg(write, num_nodes=60, num_triples=400)
    kg = tmp_path / "kg.gs"
    graphstore.convert(write, kg, num_partitions=2, partitioner="random")
    code, err = launch("link_prediction", {"1": ["--negatives", "16"]}, "--store", kg, "--epochs", "1",
                       "--embedding-dim", "8", "--negatives", "8")
    assert code != 0 and "rank 1 disagrees with rank 0 on --negatives: 16 against 8" in err, err[-2000:]
    code, err = launch("full_batch", {"1": ["--hidden", "16"]}, "--store", stores["eight"], "--epochs", "1",
                       "--hidden", "8")
    assert code != 0 and "rank 1 disagrees with rank 0 on --hidden: 16 against 8" in err, err[-2000:]


def test_a_buffer_derived_from_each_ranks_memory_is_the_least_of_them(stores, tmp_path):
    out = tmp_path / "m.json"
    code, err = launch("node_classification", {"0": ["env:GRAPHSTORE_MEMORY_BYTES=2GiB"],
                                               "1": ["env:GRAPHSTORE_MEMORY_BYTES=1GiB"]},
                       "--store", stores["eight"], "--scheme", "megabatch", *NC, "--metrics-out", out)
    assert code == 0, err[-3000:]
    config = json.loads(out.read_text())["config"]
    # Half of the smaller rank's 1 GiB is the budget; an eighth of it is for the batch in training.
    assert config["buffer_bytes"] + config["micro_batch_budget"] == 512 << 20
    assert config["micro_batch_budget"] == 64 << 20
    assert "least of 2 ranks" in config["derived"]["buffer_bytes"]
