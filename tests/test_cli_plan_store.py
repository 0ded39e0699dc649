"""``graphstore plan STORE`` (issue 35, 4): what the node-classification trainer will do with
the same flags, said before it runs, and checked here against what a real run then does:
the partitions it holds, the bytes its first epoch reads (the buffer's own counters of real
reads), exact evaluation's budget, and where exact inference starts to refuse a budget."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

import graphstore
from graphstore.buffer import plan_epoch
from graphstore.cli import PLAN_DEFAULTS, main
from graphstore.errors import ConfigError
from graphstore.inference import infer_layerwise
from graphstore.inference.layerwise import MIN_PIECE_EDGES
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.nn import GNN
from tests.conftest import REPO, make_graph
from trainers import common
from trainers import node_classification as nc

SMALL = ["--fanouts", "10,10", "--hidden", "32"]
"""Model flags both the plan and the trainer get (a smaller model: faster runs)."""


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "cora.gs"
    graphstore.convert(REPO / "data" / "cora", out, num_partitions=8, partitioner="metis")
    return out


@pytest.fixture(scope="module")
def narrow(tmp_path_factory):
    """Three features a node, 900 nodes in 6 partitions: evaluation's floor is then its walk
    over the edges, not its prepare pass over wide rows."""
    graph, _ = make_graph(num_nodes=900, num_edges=12000, feature_dim=3)
    out = tmp_path_factory.mktemp("plan") / "narrow.gs"
    convert(graph, out, ConvertOptions(num_partitions=6, partitioner="random"))
    return out


def plan(capsys, *argv) -> dict:
    assert main(["plan", *map(str, argv), "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one JSON object, one line
    return json.loads(out)


def train(tmp_path, capsys, *argv) -> dict:
    """One epoch of the node trainer with ``argv``; its metrics JSON."""
    out = tmp_path / "m.json"
    argv = [*map(str, argv), "--epochs", "1", "--metrics-out", str(out)]
    assert common.run(nc.PROG, nc.main, argv) == 0
    capsys.readouterr()
    return json.loads(out.read_text())


def test_the_plans_defaults_are_the_trainers():
    fields = {f.name: f.default for f in dataclasses.fields(nc.NodeClassificationOptions)}
    for name, value in PLAN_DEFAULTS.items():
        assert fields[name] == value, name


@pytest.mark.parametrize("flags, memory", [
    (["--scheme", "minibatch"], None),
    (["--scheme", "disk", "--buffer-bytes", "12MiB"], None),
    (["--scheme", "megabatch", "--buffer-bytes", "16MiB"], None),
    (["--scheme", "disk", "--buffer-partitions", "3"], None),
    # The default budget, half of what the process may use: out of core, then all resident.
    (["--scheme", "megabatch"], "30MiB"),
    (["--scheme", "megabatch"], "40MiB"),
    (["--scheme", "disk", "--seed", "3"], "30MiB"),
    (["--scheme", "macrobatch"], None),
    (["--scheme", "macrobatch"], "30MiB"),  # a round of rows from memory: 15 MiB / 3
], ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_the_plan_is_what_the_trainer_then_does(cora, tmp_path, capsys, monkeypatch, flags, memory):
    if memory is not None:
        monkeypatch.setenv("GRAPHSTORE_MEMORY_BYTES", memory)
    p = plan(capsys, cora, *flags, *SMALL)
    m = train(tmp_path, capsys, "--store", cora, *flags, *SMALL)
    settings, config, io = m["config"]["loaders"]["train"], m["config"], m["epochs"][0]["io"]
    assert p["capacity"] == settings["capacity"] and p["policy"] == settings["policy"]
    assert p["buffer_bytes"] == settings["buffer_bytes"] == config["buffer_bytes"]
    assert p["batch_size"] == config["batch_size"]
    # The budget's rule and the step's share are the trainer's, word for word.
    derived = config["derived"]
    if p["budget_bytes"] is not None and memory is not None:
        assert p["rules"]["budget_bytes"] == derived["buffer_bytes"]
    assert p["rules"].get("step_bytes") == derived.get("micro_batch_budget")
    if p["step_bytes"] is not None:
        assert p["step_bytes"] == config["micro_batch_budget"]
        assert p["budget_bytes"] == p["buffer_bytes"] + p["step_bytes"]
    assert p["eval_budget_bytes"] == int(derived["eval_buffer_bytes"].split()[0])
    # The bytes: the real epoch's, counted by the buffer from the reads it made.
    if p["epoch_bytes_exact"]:
        assert io["bytes_read"] == p["epoch_bytes"] > 0
        assert io["states"] == p["num_states"]
    else:  # macrobatch: the structure, then the rows each macro-batch samples
        assert io["bytes_read"] - m["epochs"][0]["macro_batching"]["bytes_read"] == p["epoch_bytes"] > 0
    if flags[1] in ("minibatch", "macrobatch"):
        assert p["capacity"] == p["num_partitions"]
        assert p["later_epoch_bytes"] == (0 if flags[1] == "minibatch" else None)
    if flags[1] == "minibatch":
        assert p["epoch_bytes"] == p["store_bytes"]
    if flags[1] == "macrobatch":
        assert p["macro_batch_bytes"] > 0 and settings["macro_batch_bytes"] > 0  # free memory read apart
        if memory is not None:
            assert p["macro_batch_bytes"] == settings["macro_batch_bytes"]
            assert p["macro_batch_bytes"] == config["macro_batch_bytes"] == (15 << 20) // 3
            assert p["rules"]["macro_batch_bytes"] == derived["macro_batch_bytes"]
    else:
        assert p["macro_batch_bytes"] is None


def test_later_epochs_of_a_resident_graph_read_nothing(cora, tmp_path, capsys):
    p = plan(capsys, cora, *SMALL)
    out = tmp_path / "m.json"
    argv = ["--store", str(cora), *SMALL, "--epochs", "2", "--patience", "0", "--metrics-out", str(out)]
    assert common.run(nc.PROG, nc.main, argv) == 0
    epochs = json.loads(out.read_text())["epochs"]
    assert [e["io"]["bytes_read"] for e in epochs] == [p["epoch_bytes"], p["later_epoch_bytes"]] == [
        p["store_bytes"], 0]


def test_the_epoch_planned_is_the_one_run(cora, capsys):
    """``--epoch E`` plans epoch E (from an empty buffer): a loader made as the plan's
    reads as much in that epoch after `release_memory`."""
    from graphstore.loaders import NodeLoader

    p = plan(capsys, cora, "--scheme", "disk", "--buffer-partitions", "3", "--epoch", "2", "--seed", "5",
             "--batch-size", "32", "--loader-threads", "0", *SMALL)
    with graphstore.open(cora) as store:
        loader = NodeLoader(store, split="train", fanouts=(10, 10), batch_size=32, scheme="disk", capacity=3,
                            seed=5, loader_threads=0)
        for _ in loader.epoch(2):
            pass
        assert loader.last_stats.bytes_read == p["epoch_bytes"]
        assert p["num_states"] == loader.plan(2).num_states
        assert p["num_batches"] == loader.num_batches(2)


@pytest.mark.parametrize("model", ["sage", "gcn", "gin", "gat"])
@pytest.mark.parametrize("which", ["cora", "narrow"])
def test_the_floor_is_where_exact_inference_starts_to_run(request, capsys, which, model):
    path = request.getfixturevalue(which)
    p = plan(capsys, path, "--model", model, *SMALL)
    with graphstore.open(path) as store:
        torch.manual_seed(0)
        gnn = GNN(model, in_dim=store.feature_dim, hidden_dim=32, out_dim=store.num_classes, num_layers=2,
                  heads=PLAN_DEFAULTS["heads"])
        floor = p["eval_floor_bytes"]
        with pytest.raises(ConfigError) as refused:
            infer_layerwise(gnn, store, buffer_bytes=floor - 1, nodes=np.arange(5))
        assert str(refused.value) == p["eval_floor_reason"]
        # Three features, or GIN (whose prepared rows are its 1433-wide inputs, gathered per
        # edge): the walk with its piece of edges is the floor; else the prepare pass.
        if which == "narrow" or model == "gin":
            assert f"a piece of {MIN_PIECE_EDGES} edges" in p["eval_floor_reason"]
            assert "prepare pass" not in p["eval_floor_reason"]
        else:
            assert "prepare pass" in p["eval_floor_reason"] and "edges" not in p["eval_floor_reason"]
        out = infer_layerwise(gnn, store, buffer_bytes=floor, nodes=np.arange(store.num_nodes))
        assert out.shape == (store.num_nodes, store.num_classes) and np.isfinite(out).all()


def test_the_human_summary_says_each_figure(cora, capsys):
    assert main(["plan", str(cora), "--scheme", "disk", "--buffer-bytes", "12MiB", *SMALL]) == 0
    text = capsys.readouterr().out
    p = plan(capsys, cora, "--scheme", "disk", "--buffer-bytes", "12MiB", *SMALL)
    lines = text.splitlines()
    assert 5 <= len(lines) <= 8
    assert f"resident: {p['capacity']} of 8 partitions" in text
    assert "budget 12.0 MiB: given (--buffer-bytes); 1.5 MiB of it for the batch in training" in text
    assert f"{p['num_states']} states" in text and f"{p['epoch_bytes'] / 2**20:,.1f} MiB" in text
    assert f"{p['epoch_bytes'] / p['store_bytes']:.2f}x the store" in text
    assert f"floor {p['eval_floor_bytes'] / 2**20:,.1f} MiB ({p['eval_floor_bytes']:,} bytes)" in text
    assert lines[-1].startswith(f"expected peak about {p['peak_bytes'] / 2**20:,.1f} MiB = budget 12.0 MiB + "
                                f"model state {p['model_state_bytes'] / 2**20:,.1f} MiB + runtime")
    assert p["peak_bytes"] == sum(p["peak_parts"].values())
    assert p["peak_parts"]["budget"] == 12 << 20 and p["peak_parts"]["runtime"] > 50 << 20


def test_a_resident_graphs_peak_is_what_it_holds_and_evaluation(cora, capsys):
    p = plan(capsys, cora, *SMALL)
    assert p["budget_bytes"] is None and set(p["peak_parts"]) == {"resident", "evaluation", "model_state", "runtime"}
    # The whole graph held: every row and every edge, assembled.
    assert p["peak_parts"]["resident"] == p["resident_bytes"] >= p["store_bytes"]


def one_line_error(capsys, argv, code) -> str:
    with pytest.raises(SystemExit) if code == 2 else _nothing():
        status = main(argv)
        assert status == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_bad_input_is_one_line(cora, tmp_path, capsys, monkeypatch):
    err = one_line_error(capsys, ["plan", str(tmp_path / "none.gs")], 1)
    assert err.count("\n") == 1 and "none.gs" in err and "no such store" in err
    (tmp_path / "empty").mkdir()
    err = one_line_error(capsys, ["plan", str(tmp_path / "empty")], 1)
    assert err.count("\n") == 1 and "empty" in err
    monkeypatch.setenv("GRAPHSTORE_MEMORY_BYTES", "8MiB")  # a default budget megabatch cannot use
    err = one_line_error(capsys, ["plan", str(cora), "--scheme", "megabatch"], 1)
    assert err.count("\n") == 1 and "the default buffer" in err and "GRAPHSTORE_MEMORY_BYTES" in err
    assert "--buffer-bytes" in err


def test_a_store_without_labels_is_refused(tmp_path, capsys):
    graph, _ = make_graph(num_nodes=100, num_edges=400, feature_dim=0)
    out = tmp_path / "bare.gs"
    convert(graph, out, ConvertOptions(num_partitions=2, partitioner="random"))
    err = one_line_error(capsys, ["plan", str(out)], 1)
    assert err.count("\n") == 1 and "needs features and labels" in err


@pytest.mark.parametrize("argv, first, hint", [
    (["--scheme", "dsik"], "argument --scheme: invalid choice: 'dsik'", "did you mean disk?"),
    (["--capacity", "3"], "--capacity plans a policy from numbers, without a STORE", None),
    (["--partitions", "3"], "--partitions plans a policy from numbers", None),
    (["--task", "link"], "with a STORE, plan plans node classification", None),
    (["--buffer-bytes", "1MiB", "--buffer-partitions", "2"], "argument --buffer-partitions: not allowed with "
                                                             "argument --buffer-bytes", None),
    (["--fanouts", "10,0"], "argument --fanouts: fanouts must be positive or -1", None),
])
def test_usage_errors_with_a_store(cora, capsys, argv, first, hint):
    lines = one_line_error(capsys, ["plan", str(cora), *argv], 2).splitlines()
    assert len(lines) <= 3 and first in lines[0] and lines[-1] == "(graphstore plan --help lists the options)"
    if hint:
        assert lines[1] == hint


@pytest.mark.parametrize("argv, first", [
    (["--policy", "beta", "--partitions", "4", "--capacity", "2", "--scheme", "disk"], "--scheme needs a STORE"),
    (["--policy", "beta", "--partitions", "4", "--capacity", "2", "--buffer-bytes", "1G"],
     "--buffer-bytes needs a STORE"),
    (["--policy", "beta", "--partitions", "4"], "without a STORE, the following arguments are required: --capacity"),
    ([], "without a STORE, the following arguments are required: --policy, --partitions, --capacity"),
])
def test_usage_errors_without_a_store(capsys, argv, first):
    lines = one_line_error(capsys, ["plan", *argv], 2).splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"graphstore plan: error: {first}")


def test_the_flags_only_mode_still_plans_a_policy(capsys):
    assert main(["plan", "--policy", "beta", "--partitions", "8", "--capacity", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["states"] == [list(s) for s in plan_epoch("beta", num_partitions=8, capacity=4).states]
    assert main(["plan", "--policy", "comet", "--partitions", "16", "--capacity", "4"]) == 0
    assert "28 states" in capsys.readouterr().out
