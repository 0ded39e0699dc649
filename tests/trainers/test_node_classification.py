"""End to end: trainers/node_classification.py on the embedded Cora, every scheme; the
metrics JSON's contract; exact resume; config file under flags; one-line errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from tests.trainers.conftest import REPO
from trainers import node_classification as nc

CHANCE = 1 / 7  # Cora has 7 classes
FAST = ["--fanouts", "10,10", "--hidden", "32", "--lr", "0.02", "--batch-size", "1000", "--normalize-features", "none"]


def run(argv) -> int:
    from trainers import common

    return common.run(nc.PROG, nc.main, [str(a) for a in argv])


def read(path):
    return json.loads(path.read_text())


def check_contract(m: dict, epochs: int) -> None:
    """The fields issue 5 promises outside checks."""
    assert m["task"] == "node_classification"
    assert set(m["final"]) >= {"valid", "test"}
    assert "acc" in m["final"]["valid"] and "acc" in m["final"]["test"]
    assert m["final"]["valid"]["loss"] > 0 and m["final"]["test"]["loss"] > 0  # mean cross-entropy
    assert len(m["epochs"]) == epochs
    for e in m["epochs"]:
        assert {"train_loss", "time_s", "io", "valid"} <= set(e)
        assert "test" not in e  # the test split is scored once, on the selected model
        assert {"bytes_read", "bytes_written", "stall_s"} <= set(e["io"])
    assert m["best"] == m["final"] and m["final"]["selection"].startswith("best validation accuracy")
    evaluated = [e for e in m["epochs"] if e["valid"] is not None]
    assert m["epochs"][-1]["valid"] is not None and evaluated
    # The best accuracy, ties to the lower loss.
    assert m["final"]["epoch"] == min(evaluated, key=lambda e: (-e["valid"]["acc"], e["valid"]["loss"]))["epoch"]
    assert m["peak_memory_bytes"] > 0
    assert {"python", "torch", "graphstore"} <= set(m["versions"])
    cfg = m["config"]
    for key in ("store", "model", "scheme", "fanouts", "eval_fanouts", "batch_size", "epochs", "lr", "hidden",
                "dropout", "seed"):
        assert key in cfg, key
    loader = cfg["loaders"]["train"]
    for key in ("scheme", "policy", "capacity", "num_partitions", "static_cache_fraction", "reuse",
                "fanouts"):
        assert key in loader, key


@pytest.mark.parametrize("scheme, policy, capacity", [("minibatch", "in_memory", 8),
                                                       ("megabatch", "hierbatching", 2),
                                                       ("disk", "dispersed", 4)])
def test_each_scheme_learns_and_writes_the_metrics(cora_store, tmp_path, scheme, policy, capacity, capsys):
    out = tmp_path / "m.json"
    # Forced out of core: the scheme's own share of the partitions (by default the buffer
    # is sized from memory, and Cora fits).
    forced = ["--buffer-partitions", capacity] if scheme != "minibatch" else []
    assert run(["--store", cora_store, "--scheme", scheme, "--epochs", 3, "--metrics-out", out, *FAST,
                *forced]) == 0
    m = read(out)
    check_contract(m, 3)
    loader = m["config"]["loaders"]["train"]
    assert (loader["policy"], loader["capacity"]) == (policy, capacity)
    if scheme == "megabatch":  # HierBatching's quarter of p and 1 % cache; each mega-batch once (not twice)
        assert loader["reuse"] == 1 and loader["static_cache_nodes"] == 28
    # Every scheme evaluates exactly by default (every layer over the whole graph, out of
    # core, within a recorded budget: no evaluation loaders).
    evaluation = "exact"
    assert m["config"]["eval_scheme"] == evaluation and "valid" not in m["config"]["loaders"]
    assert "at least the walk's floor" in m["config"]["derived"]["eval_buffer_bytes"]
    losses = [e["train_loss"] for e in m["epochs"]]
    assert losses[-1] < losses[0]
    assert m["final"]["test"]["acc"] > CHANCE + 0.35
    assert m["final"]["test"]["loss"] < math.log(7)  # below the loss of a uniform guess
    assert m["epochs"][0]["io"]["bytes_read"] > 0
    printed = capsys.readouterr().out
    assert f"scheme {scheme}: policy {policy}" in printed and f"evaluation: scheme {evaluation}" in printed
    assert printed.count("\nepoch ") == 3  # one summary line per epoch


def test_resume_reaches_the_uninterrupted_result(cora_store, tmp_path, capsys):
    args = ["--store", cora_store, "--scheme", "megabatch", "--model", "sage", "--dropout", 0.5,
            "--eval-fanouts", "5,5",
            "--fanouts", "5,5", "--hidden", "16", "--batch-size", 64, "--seed", 3, "--buffer-partitions", 2,
            "--eval-every", 1]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run([*args, "--epochs", 4, "--checkpoint-dir", straight,
                "--metrics-out", straight / "m.json"]) == 0
    assert run([*args, "--epochs", 2, "--checkpoint-dir", split]) == 0
    assert (split / "latest").read_text().strip() == "epoch-0001"
    capsys.readouterr()
    assert run([*args, "--epochs", 4, "--checkpoint-dir", split, "--resume",
                "--metrics-out", split / "m.json"]) == 0
    printed = capsys.readouterr().out  # the resume names the epoch as the log does: 1-based
    assert "(epoch 2/4 done)" in printed and "\nepoch 3/4 " in printed and "\nepoch 2/4 " not in printed
    a, b = read(straight / "m.json"), read(split / "m.json")
    assert b["resumed_from"] == 1
    assert a["final"] == b["final"]
    assert [e["train_loss"] for e in a["epochs"]] == [e["train_loss"] for e in b["epochs"]]
    pa = torch.load(straight / "epoch-0003" / "state.pt", weights_only=False)
    pb = torch.load(split / "epoch-0003" / "state.pt", weights_only=False)
    for key, value in pa["model"].items():
        assert torch.equal(value, pb["model"][key]), key
    assert not list(split.glob("epoch-0001"))  # older checkpoints dropped


def test_resume_refuses_other_options(cora_store, tmp_path, capsys):
    args = ["--store", cora_store, "--epochs", 1, "--checkpoint-dir", tmp_path, *FAST]
    assert run(args) == 0
    capsys.readouterr()
    assert run([*args[:-len(FAST)], "--batch-size", 1000, "--normalize-features", "none", "--fanouts", "5,5",
                "--epochs", 2, "--resume"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--fanouts" in err


def test_config_file_is_overridden_by_flags(cora_store, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'store = "{cora_store}"\nscheme = "disk"\nfanouts = [5, 5]\nhidden = 8\nepochs = 1\n'
                      'eval-scheme = "minibatch"\n[optim]\nlr = 0.05\nno-prefetch = true\n')
    out = tmp_path / "m.json"
    assert run(["--config", config, "--hidden", 12, "--metrics-out", out]) == 0
    cfg = read(out)["config"]
    got = (cfg["scheme"], cfg["fanouts"], cfg["hidden"], cfg["epochs"], cfg["lr"])
    assert got == ("disk", [5, 5], 12, 1, 0.05)
    assert cfg["prefetch"] is False and cfg["loaders"]["train"]["prefetch"] is False
    assert cfg["loaders"]["train"]["policy"] == "dispersed"
    assert cfg["loaders"]["valid"]["policy"] == "in_memory"


@pytest.mark.parametrize("text, needle", [('hiden = 3\n', "unknown option 'hiden'"),
                                          ('scheme = "tape"\n', "scheme must be one of"),
                                          ('fanouts = "a,b"\n', "fanouts"),
                                          ('epochs = [\n', "not valid TOML")])
def test_bad_config_is_one_line(cora_store, tmp_path, capsys, text, needle):
    config = tmp_path / "c.toml"
    config.write_text(text)
    assert run(["--config", config, "--store", cora_store]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err and "c.toml" in err


def test_missing_store_is_one_line_and_exit_1(tmp_path):
    script = REPO / "trainers" / "node_classification.py"
    proc = subprocess.run([sys.executable, str(script), "--store", str(tmp_path / "missing.gs")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"node_classification.py: error: {tmp_path / 'missing.gs'}: no such store"


def test_bad_usage_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        nc.main(["--scheme", "minibatch"])  # no --store
    assert exc.value.code == 2
    assert "--store is required" in capsys.readouterr().err


def test_shipped_configs_parse():
    from trainers import link_prediction as lp

    for path, options in [("cora_sage.toml", nc.NodeClassificationOptions),
                          ("wn18rr_distmult.toml", lp.LinkPredictionOptions),
                          ("ddi_sage.toml", lp.LinkPredictionOptions)]:
        config = REPO / "trainers" / "configs" / path
        args = options.parse(["--config", str(config), "--store", "x"])
        assert args.epochs > 1


@pytest.mark.parametrize("model", ["sage", "gcn"])
def test_microbatch_training_equals_the_whole_batch(cora_store, tmp_path, model):
    """Betty's promise: split into K micro-batches, the accumulated update is the batch's, so
    (without dropout) the whole run's losses and accuracies are the minibatch run's."""
    base = ["--store", cora_store, "--model", model, "--epochs", 3, "--dropout", 0, "--seed", 2, *FAST]
    assert run([*base, "--scheme", "minibatch", "--metrics-out", tmp_path / "whole.json"]) == 0
    assert run([*base, "--scheme", "microbatch", "--micro-batches", 3, "--micro-strategy", "reg",
                "--metrics-out", tmp_path / "micro.json"]) == 0
    whole, micro = read(tmp_path / "whole.json"), read(tmp_path / "micro.json")
    assert [e["train_loss"] for e in micro["epochs"]] == pytest.approx([e["train_loss"] for e in whole["epochs"]],
                                                                     rel=1e-4)
    assert micro["final"]["test"]["acc"] == pytest.approx(whole["final"]["test"]["acc"], abs=0.002)
    stats = micro["epochs"][-1]["micro_batching"]
    assert stats["micro_batches"] == 3 * stats["batches"] and whole["epochs"][-1]["micro_batching"] is None
    # Micro-batches repeat shared inputs: their rows add up to more than the batch's.
    assert stats["input_rows"] > stats["batch_input_rows"]


def test_microbatch_budget_and_inside_a_megabatch(cora_store, tmp_path, capsys):
    out = tmp_path / "m.json"
    assert run(["--store", cora_store, "--epochs", 1, *FAST, "--scheme", "microbatch",
                "--micro-batch-budget", "4MiB", "--metrics-out", out]) == 0
    assert read(out)["epochs"][0]["micro_batching"]["max_k"] > 1  # the whole batch does not fit 4 MiB
    assert run(["--store", cora_store, "--epochs", 1, *FAST, "--scheme", "megabatch", "--micro-batches", 2,
                "--metrics-out", out]) == 0
    m = read(out)
    assert m["config"]["loaders"]["train"]["policy"] == "hierbatching"
    assert m["epochs"][0]["micro_batching"]["max_k"] == 2
    assert run(["--store", cora_store, "--epochs", 1, *FAST, "--scheme", "microbatch"]) == 1
    assert "needs --micro-batches K or --micro-batch-budget" in capsys.readouterr().err
    assert run(["--store", cora_store, "--epochs", 1, *FAST, "--scheme", "microbatch",
                "--micro-batch-budget", "64KiB"]) == 1
    assert "over the budget" in capsys.readouterr().err


@pytest.mark.parametrize("scheme", ["minibatch", "megabatch"])
def test_row_normalised_inputs_are_the_store_rows_over_their_sums(cora_store, scheme):
    """--normalize-features row, applied per batch (also out of core): each input row is the
    store's feature row divided by its sum (Cora's rows are binary, so the raw sums are > 1)."""
    import argparse

    import graphstore
    from graphstore.loaders import NodeLoader

    store = graphstore.open(cora_store)
    features = torch.as_tensor(store.features[...]).float()
    row = argparse.Namespace(normalize_features="row")
    loader = NodeLoader(store, split="train", fanouts=(5, 5), batch_size=64, scheme=scheme, seed=0)
    rows = 0
    for batch in loader.epoch(0):
        raw = features[batch.store_ids]
        assert torch.equal(batch.features.float(), raw)
        sums = raw.sum(1, keepdim=True)
        assert bool((sums > 1).any())  # not normalised in the store
        got = nc.prepare(batch, row).features
        nonzero = sums[:, 0] > 0
        assert torch.allclose(got[nonzero], raw[nonzero] / sums[nonzero], atol=1e-7)
        assert torch.allclose(got[nonzero].sum(1), torch.ones(int(nonzero.sum())), atol=1e-5)
        assert bool((got[~nonzero] == 0).all())
        assert nc.prepare(batch, argparse.Namespace(normalize_features="none")) is batch
        rows += len(raw)
    assert rows > 0


def test_normalize_features_and_cosine_schedule_are_used_and_recorded(cora_store, tmp_path, capsys):
    base = ["--store", cora_store, "--epochs", 4, "--dropout", 0, "--seed", 1, "--fanouts", "10,10",
            "--hidden", "32", "--lr", "0.05"]
    assert run([*base, "--normalize-features", "none", "--metrics-out", tmp_path / "plain.json"]) == 0
    assert run([*base, "--normalize-features", "row", "--lr-schedule", "cosine", "--checkpoint-dir", tmp_path / "ck",
                "--metrics-out", tmp_path / "row.json"]) == 0
    plain, row = read(tmp_path / "plain.json"), read(tmp_path / "row.json")
    assert (plain["config"]["normalize_features"], plain["config"]["lr_schedule"]) == ("none", "none")
    assert (row["config"]["normalize_features"], row["config"]["lr_schedule"]) == ("row", "cosine")
    assert [e["lr"] for e in plain["epochs"]] == [0.05] * 4
    assert [e["lr"] for e in row["epochs"]] == pytest.approx([0.05, 0.05 * (1 + 2 ** -0.5) / 2, 0.025,
                                                              0.05 * (1 - 2 ** -0.5) / 2])
    # The same initialisation and samples, other inputs: the first epoch's loss differs.
    assert row["epochs"][0]["train_loss"] != pytest.approx(plain["epochs"][0]["train_loss"], rel=1e-3)
    assert row["final"]["test"]["acc"] > CHANCE + 0.2
    capsys.readouterr()
    # The schedule depends on --epochs: resuming with another count is refused.
    assert run([*base, "--epochs", 6, "--normalize-features", "row", "--lr-schedule", "cosine",
                "--checkpoint-dir", tmp_path / "ck", "--resume"]) == 1
    assert "--lr-schedule cosine depends on --epochs" in capsys.readouterr().err


def test_eval_batch_size_is_its_own(cora_store, tmp_path):
    """A small training batch with a large evaluation batch: evaluation covers every target
    once in fewer batches, and the choice is recorded (default: the training batch size)."""
    out = tmp_path / "m.json"
    args = ["--store", cora_store, "--epochs", 1, "--fanouts", "5,5", "--hidden", 8, "--batch-size", 50,
            "--normalize-features", "none", "--eval-scheme", "minibatch"]
    assert run([*args, "--eval-batch-size", 400, "--metrics-out", out]) == 0
    m = read(out)
    assert m["config"]["eval_batch_size"] == 400
    assert m["config"]["loaders"]["test"]["batch_size"] == 400
    assert m["config"]["loaders"]["train"]["batch_size"] == 50
    assert m["final"]["test"]["acc"] > CHANCE
    assert run([*args, "--metrics-out", out]) == 0
    assert read(out)["config"]["eval_batch_size"] == 50


@pytest.mark.parametrize("model", ["sage", "gat", "gin"])
def test_exact_evaluation_equals_in_memory_evaluation_with_every_neighbour(cora_store, tmp_path, model):
    """--eval-scheme exact (layer-wise over the store, a mega-batch's few partitions resident)
    scores what in-memory evaluation with all neighbours scores, epoch by epoch. Not GCN: a
    DENSE gives the nodes of its outermost hop degree 0 (they have no sample), where exact
    inference uses every node's in-degree, the full-graph GCN."""
    base = ["--store", cora_store, "--epochs", 2, "--scheme", "megabatch", "--model", model, *FAST,
            "--normalize-features", "row", "--buffer-partitions", 2, "--eval-every", 1]
    exact, memory = tmp_path / "exact.json", tmp_path / "memory.json"
    assert run([*base, "--eval-scheme", "exact", "--metrics-out", exact]) == 0
    assert run([*base, "--eval-scheme", "minibatch", "--eval-fanouts=-1,-1", "--metrics-out", memory]) == 0
    a, b = read(exact), read(memory)
    assert a["config"]["eval_scheme"] == "exact" and a["config"]["eval_fanouts"] == [-1, -1]
    for x, y in zip(a["epochs"], b["epochs"]):
        assert x["train_loss"] == y["train_loss"]
        assert x["valid"]["acc"] == y["valid"]["acc"]
        assert abs(x["valid"]["loss"] - y["valid"]["loss"]) < 1e-5
        assert x["eval_io"]["bytes_read"] >= x["eval_io"]["planned_bytes"] > 0
    for split in ("valid", "test"):  # the selected model, scored once at the end
        assert a["final"][split]["acc"] == b["final"][split]["acc"]
        assert abs(a["final"][split]["loss"] - b["final"][split]["loss"]) < 1e-5


def test_the_default_evaluation_is_the_schemes(cora_store):
    import graphstore

    def evaluation(*argv):
        args = nc.NodeClassificationOptions.parse(["--store", str(cora_store), *argv])
        with graphstore.open(cora_store) as store:
            return nc.resolve_config(args, store).eval_scheme

    assert evaluation("--scheme", "megabatch") == "exact"
    assert evaluation("--scheme", "disk") == "exact"
    assert evaluation("--scheme", "minibatch") == "exact"
    assert evaluation("--scheme", "microbatch", "--micro-batches", "2") == "exact"
    assert evaluation("--scheme", "macrobatch") == "exact"
    # Evaluation fanouts ask for sampled evaluation: with the training scheme.
    assert evaluation("--scheme", "megabatch", "--eval-fanouts", "5,5") == "megabatch"
    assert evaluation("--scheme", "disk", "--eval-scheme", "minibatch") == "minibatch"


def test_the_macrobatch_scheme_trains_as_minibatch(cora_store, tmp_path):
    # Same sampler and streams over the whole graph: the same losses, whatever B.
    losses = {}
    for name, extra in (("minibatch", ["--scheme", "minibatch"]),
                        ("macro", ["--scheme", "macrobatch", "--macro-batches", "all"])):
        out = tmp_path / f"{name}.json"
        assert run(["--store", cora_store, "--epochs", 2, "--metrics-out", out, "--batch-size", "32",
                    "--fanouts", "5,5", "--hidden", "16", *extra]) == 0
        m = read(out)
        losses[name] = [e["train_loss"] for e in m["epochs"]]
    assert losses["macro"] == losses["minibatch"]
    fetched = m["epochs"][0]["macro_batching"]
    assert fetched["macro_batches"] == 1 and 0 < fetched["rows_fetched"] < fetched["rows_requested"]
    # Its exact evaluation holds a quarter of the features (2 of 8 partitions), not the
    # whole graph its structure covers: the rows stay in the store.
    assert m["config"]["derived"]["eval_buffer_bytes"].split(": ")[1].startswith("2 partitions")
    assert run(["--store", cora_store, "--epochs", 1, "--macro-batches", "4"]) != 0  # not for minibatch


def test_macro_batching_is_bounded_by_memory_by_default(cora_store, tmp_path, monkeypatch):
    """Without --macro-batch-bytes a round holds at most a third of the memory budget (three
    rounds are alive with the prefetch thread): under a small allowance every round is one
    mini-batch; the losses are minibatch's all the same (only the reads are grouped)."""
    argv = ["--store", cora_store, "--epochs", 1, "--batch-size", "32", "--fanouts", "5,5", "--hidden", "16"]
    plenty, small = tmp_path / "plenty.json", tmp_path / "small.json"
    assert run([*argv, "--scheme", "macrobatch", "--metrics-out", plenty]) == 0  # this machine's memory
    monkeypatch.setenv("GRAPHSTORE_MEMORY_BYTES", "6MiB")  # budget 3 MiB: 1 MiB a round, under one batch's rows
    assert run([*argv, "--scheme", "macrobatch", "--metrics-out", small]) == 0
    roomy, tight = read(plenty), read(small)
    assert tight["config"]["macro_batch_bytes"] == (3 << 20) // 3
    assert tight["config"]["loaders"]["train"]["macro_batch_bytes"] == (3 << 20) // 3
    assert "rounds held at once" in tight["config"]["derived"]["macro_batch_bytes"]
    assert roomy["config"]["macro_batch_bytes"] > 64 << 20  # half of free memory, a third of it
    fetched_roomy, fetched_tight = roomy["epochs"][0]["macro_batching"], tight["epochs"][0]["macro_batching"]
    assert fetched_tight["rounds"] == fetched_tight["mini_batches"] > 1
    # Cora's 1433-wide rows: a batch of 32 targets at fanouts 5,5 needs more than 1 MiB of them.
    assert fetched_tight["rows_union"] * 1433 * 4 > fetched_tight["rounds"] * (1 << 20)
    assert fetched_roomy["rounds"] < fetched_roomy["mini_batches"]  # 16 mini-batches a round
    assert fetched_roomy["rows_union"] < fetched_tight["rows_union"]  # their shared rows read once
    assert roomy["epochs"][0]["train_loss"] == tight["epochs"][0]["train_loss"]


def test_the_defaults_learn_from_the_store_alone(cora_store, tmp_path, capsys):
    """`--store` and nothing else: normalisation, batch size and buffer are derived from the
    data (each rule printed and recorded), training stops on validation, and the restored
    best-validation model reaches Cora's published range (about 0.81)."""
    out = tmp_path / "m.json"
    assert run(["--store", cora_store, "--metrics-out", out]) == 0
    m = read(out)
    check_contract(m, len(m["epochs"]))
    cfg = m["config"]
    assert cfg["normalize_features"] == "row" and "bag-of-words" in cfg["derived"]["normalize_features"]
    assert cfg["batch_size"] == 64 and "train split 140" in cfg["derived"]["batch_size"]
    assert cfg["loaders"]["train"]["batch_size"] == 64
    assert "buffer_bytes" not in cfg["derived"]  # minibatch holds the whole graph anyway
    assert m["stopped_early"] is not None and len(m["epochs"]) < cfg["epochs"]
    # Stopped at an evaluated epoch, when neither accuracy nor loss had improved for `patience`.
    assert m["stopped_early"] - max(m["final"]["epoch"], progress_epoch(m)) >= cfg["patience"]
    assert m["final"]["test"]["acc"] > 0.75
    printed = capsys.readouterr().out
    assert "test" not in "".join(line for line in printed.splitlines() if line.startswith("epoch "))


@pytest.mark.parametrize("memory, resident", [(400 << 20, 8), (20 << 20, 2)])
def test_the_buffer_is_sized_from_memory(cora_store, tmp_path, monkeypatch, memory, resident):
    """Without --buffer-bytes/--buffer-partitions an out-of-core scheme takes half the
    memory the process may still use: a graph that fits is fully resident (and megabatch
    trains one whole-graph state, as minibatch), a smaller allowance goes out of core; each
    mega-batch once either way. GRAPHSTORE_MEMORY_BYTES stands in for the cgroup limit here."""
    monkeypatch.setenv("GRAPHSTORE_MEMORY_BYTES", str(memory))
    out = tmp_path / "m.json"
    assert run(["--store", cora_store, "--scheme", "megabatch", "--epochs", 1, "--metrics-out", out]) == 0
    cfg = read(out)["config"]
    # Half the memory is the budget; an eighth of that is kept for the batch in training.
    assert cfg["buffer_bytes"] + cfg["micro_batch_budget"] == memory // 2
    assert cfg["micro_batch_budget"] == memory // 2 // 8
    assert "GRAPHSTORE_MEMORY_BYTES" in cfg["derived"]["buffer_bytes"]
    loader = cfg["loaders"]["train"]
    assert (loader["capacity"], loader["reuse"]) == (resident, 1)
    # A resumed run replays the checkpoint's buffer whatever memory is free now.


def test_the_batch_in_training_counts_in_the_budget(cora_store, tmp_path):
    """An out-of-core scheme's byte budget keeps an eighth for the batch being trained: a
    batch whose estimated step is larger is split into micro-batches (here Cora's batches
    of 64 at fanouts 15,10 against 2 MiB), one within it trains whole; a capacity in
    partitions, or micro-batching asked for by flag, leaves the batches alone."""
    def config_and_micro(*flags):
        out = tmp_path / "m.json"
        assert run(["--store", cora_store, "--scheme", "megabatch", "--epochs", 1, *flags, "--metrics-out", out]) == 0
        m = read(out)
        return m["config"], m["epochs"][-1]["micro_batching"]

    cfg, micro = config_and_micro("--buffer-bytes", "16MiB")
    assert (cfg["buffer_bytes"], cfg["micro_batch_budget"]) == (14 << 20, 2 << 20)
    assert "1/8 of the 16777216-byte budget" in cfg["derived"]["micro_batch_budget"]
    assert micro["max_k"] > 1 and micro["micro_batches"] > micro["batches"]
    cfg, micro = config_and_micro("--buffer-bytes", "256MiB")
    assert cfg["micro_batch_budget"] == 32 << 20 and micro["max_k"] == 1
    cfg, micro = config_and_micro("--buffer-partitions", "2")
    assert cfg["micro_batch_budget"] is None and micro is None
    cfg, micro = config_and_micro("--buffer-bytes", "16MiB", "--micro-batches", "2")
    assert cfg["buffer_bytes"] == 16 << 20 and "micro_batch_budget" not in cfg["derived"] and micro["max_k"] == 2


def test_a_resumed_run_keeps_the_checkpoints_buffer(cora_store, tmp_path, monkeypatch):
    args = ["--store", cora_store, "--scheme", "megabatch", "--checkpoint-dir", tmp_path / "ck", *FAST,
            "--eval-every", 1]
    monkeypatch.setenv("GRAPHSTORE_MEMORY_BYTES", str(20 << 20))
    assert run([*args, "--epochs", 1]) == 0
    monkeypatch.setenv("GRAPHSTORE_MEMORY_BYTES", str(400 << 20))
    assert run([*args, "--epochs", 2, "--resume", "--metrics-out", tmp_path / "m.json"]) == 0
    cfg = read(tmp_path / "m.json")["config"]
    assert cfg["loaders"]["train"]["capacity"] == 2 and cfg["derived"]["buffer_bytes"] == "the resumed checkpoint's"


def test_eval_every_and_patience(cora_store, tmp_path):
    out = tmp_path / "m.json"
    assert run(["--store", cora_store, "--epochs", 7, "--eval-every", 3, "--patience", 0, *FAST,
                "--metrics-out", out]) == 0
    m = read(out)
    assert [e["epoch"] for e in m["epochs"] if e["valid"] is not None] == [2, 5, 6]  # and the last
    assert m["stopped_early"] is None and len(m["epochs"]) == 7
    assert m["final"]["epoch"] in (2, 5, 6)
    assert run(["--store", cora_store, "--epochs", 50, "--eval-every", 1, "--patience", 2, *FAST,
                "--lr", "0.5", "--metrics-out", out]) == 0
    m = read(out)
    assert m["stopped_early"] == max(m["final"]["epoch"], progress_epoch(m)) + 2
    assert len(m["epochs"]) == m["stopped_early"] + 1


def progress_epoch(m: dict) -> int:
    """The last evaluated epoch whose validation loss was 1 % below every earlier one's."""
    lowest, at = None, None
    for e in m["epochs"]:
        if e["valid"] is not None and (lowest is None or e["valid"]["loss"] < (1 - nc.LOSS_PROGRESS) * lowest):
            lowest, at = e["valid"]["loss"], e["epoch"]
    return at


def test_the_default_evaluation_rhythm_keeps_evaluation_within_training():
    """Evaluate when evaluation so far plus one more like the last fits in the training
    time so far; the first and the last epoch always; --eval-every overrides."""
    args = nc.NodeClassificationOptions.parse(["--store", "s.gs", "--epochs", "10"])
    assert nc.should_evaluate(args, 0, train_s=0.1, eval_s=0.0, last_eval_s=0.0)
    assert not nc.should_evaluate(args, 1, train_s=3.0, eval_s=1.5, last_eval_s=1.5)   # 1.5 + 1.5 * 1.5 > 3.0
    assert nc.should_evaluate(args, 2, train_s=3.0, eval_s=1.5, last_eval_s=1.0)       # 1.5 + 1.5 * 1.0 <= 3.0
    assert nc.should_evaluate(args, 9, train_s=0.0, eval_s=9.0, last_eval_s=9.0)       # the last epoch
    every = nc.NodeClassificationOptions.parse(["--store", "s.gs", "--epochs", "10", "--eval-every", "4"])
    assert [e for e in range(10) if nc.should_evaluate(every, e, 0.0, 99.0, 99.0)] == [3, 7, 9]


def test_a_default_buffer_too_small_says_where_it_came_from(cora_store, monkeypatch, capsys):
    monkeypatch.setenv("GRAPHSTORE_MEMORY_BYTES", "8MiB")
    assert run(["--store", cora_store, "--scheme", "megabatch", "--epochs", 1]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "the default buffer" in err and "GRAPHSTORE_MEMORY_BYTES" in err and "--buffer-bytes" in err


def test_macro_batchings_reads_are_the_epochs_reads(cora_store, tmp_path, capsys):
    """The console, the metrics' ``io.bytes_read`` and `graphstore plot` count the rows
    macro-batching reads (they said "read 0.0 MiB"; issue 31, 4)."""
    import graphstore.plot

    out = tmp_path / "m.json"
    assert run(["--store", cora_store, "--scheme", "macrobatch", "--epochs", 2, "--metrics-out", out,
                *FAST]) == 0
    m = read(out)
    second = m["epochs"][1]  # the structure is read in epoch 0 only
    assert second["io"]["bytes_read"] == second["macro_batching"]["bytes_read"] > 0
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch 2/2")]
    assert len(shown) == 1 and f"read {second['io']['bytes_read'] / 2**20:.1f} MiB" in shown[0]
    assert "read 0.0 MiB" not in shown[0]
    assert graphstore.plot.read_run(out).bytes_read[1] == second["macro_batching"]["bytes_read"]


@pytest.mark.parametrize("extra", [["--scheme", "minibatch"], ["--scheme", "megabatch", "--buffer-partitions", 2],
                                   ["--scheme", "disk", "--buffer-partitions", 2],
                                   ["--scheme", "microbatch", "--micro-batches", 2],
                                   ["--scheme", "macrobatch", "--macro-batches", 2],
                                   ["--scheme", "macrobatch", "--feature-cache-bytes", "4KiB"],
                                   ["--scheme", "macrobatch", "--aggregation-cache"]],
                         ids=lambda extra: "-".join(str(a).lstrip("-") for a in extra))
def test_a_float16_store_trains_in_every_scheme(float16_store, tmp_path, extra):
    """float16 features without --normalize-features row: one epoch of every scheme, no
    dtype mismatch in the first layer (issue 31, 8)."""
    import shutil

    from graphstore.inference import aggregate_store

    store = float16_store
    if "--aggregation-cache" in extra:  # a private copy: the aggregate is written into the store
        store = tmp_path / "f16.gs"
        shutil.copytree(float16_store, store)
        aggregate_store(store, "mean")
    out = tmp_path / "m.json"
    assert run(["--store", store, "--epochs", 1, "--metrics-out", out, "--fanouts", "5,5", "--hidden", "16",
                "--normalize-features", "none", *extra]) == 0
    m = read(out)
    assert math.isfinite(m["epochs"][0]["train_loss"])
    assert m["final"]["test"]["acc"] > 0.5  # 4 classes, the class column raised in every row


@pytest.mark.parametrize("policy", ["lru", "belady"])
def test_a_feature_cache_without_bytes_is_sized_from_memory(cora_store, tmp_path, capsys, monkeypatch, policy):
    """``--feature-cache lru`` alone ran with no cache (issue 31, 5): it is sized from memory,
    the rule printed and recorded, the figure in the loader's settings, and a resumed run
    keeps it whatever memory says then."""
    monkeypatch.setenv("GRAPHSTORE_MEMORY_BYTES", "8MiB")  # half of it, 4 MiB: 731 of Cora's 2708 rows
    out, ckpt = tmp_path / "m.json", tmp_path / "ckpt"
    argv = ["--store", cora_store, "--scheme", "macrobatch", "--feature-cache", policy, "--metrics-out", out,
            "--checkpoint-dir", ckpt, *FAST]
    assert run(argv + ["--epochs", 2]) == 0
    m = read(out)
    assert m["epochs"][1]["macro_batching"]["cache_hits"] > 0  # epoch 0's rows, from memory
    loader = m["config"]["loaders"]["train"]
    assert (loader["feature_cache"], loader["feature_cache_bytes"]) == (policy, 4 << 20)
    assert m["config"]["feature_cache_bytes"] == 4 << 20
    assert "GRAPHSTORE_MEMORY_BYTES" in m["config"]["derived"]["feature_cache_bytes"]
    assert "default feature_cache_bytes:" in capsys.readouterr().out
    monkeypatch.setenv("GRAPHSTORE_MEMORY_BYTES", "1GiB")
    assert run(argv + ["--epochs", 3, "--resume"]) == 0
    m = read(out)
    assert m["config"]["loaders"]["train"]["feature_cache_bytes"] == 4 << 20 and len(m["epochs"]) == 3
    assert run(["--store", cora_store, "--scheme", "minibatch", "--feature-cache", policy, "--epochs", 1]) == 1
    assert "--feature-cache" in capsys.readouterr().err


def test_train_targets_is_one_seeded_subset_for_every_scheme(cora_store, tmp_path, capsys, monkeypatch):
    """``--train-targets N``: every scheme trains the same N nodes of the train split (a
    function of --seed alone), the derived batch follows N, and N past the split is refused."""
    import graphstore
    from graphstore.loaders import NodeLoader

    seen = {}
    real_init = NodeLoader.__init__

    def spy(self, store, **kw):
        real_init(self, store, **kw)
        if kw.get("shuffle"):  # the training loader
            seen.setdefault(kw["scheme"], []).append(self.targets.copy())

    monkeypatch.setattr(NodeLoader, "__init__", spy)
    for scheme in ("minibatch", "megabatch", "disk"):
        for seed in (0, 0, 1):
            out = tmp_path / f"{scheme}_{seed}.json"
            extra = [] if scheme == "minibatch" else ["--buffer-partitions", 2]
            assert run(["--store", cora_store, "--scheme", scheme, *extra, "--train-targets", 50, "--seed", seed,
                        "--epochs", 1, "--fanouts", "5,5", "--hidden", 16, "--metrics-out", out]) == 0
            m = read(out)
            assert m["epochs"][0]["train_targets"] == 50  # each target once an epoch (reuse 1), every scheme
            assert m["config"]["train_targets"] == 50 and "train split 50 " in m["config"]["derived"]["batch_size"]
    store = graphstore.open(cora_store)
    split = set(store.read_node_split("train").tolist())
    first = seen["minibatch"][0]
    assert first.size == 50 and set(first.tolist()) <= split
    for scheme, targets in seen.items():
        assert (targets[0] == first).all() and (targets[1] == first).all(), scheme  # seed 0, every scheme
        assert not (targets[2] == first).all(), scheme  # seed 1 draws others
    # HierBatching's two passes when asked: each of the same targets twice an epoch.
    out = tmp_path / "reuse2.json"
    assert run(["--store", cora_store, "--scheme", "megabatch", "--buffer-partitions", 2, "--reuse", 2,
                "--train-targets", 50, "--epochs", 1, "--fanouts", "5,5", "--hidden", 16, "--metrics-out", out]) == 0
    m = read(out)
    assert m["epochs"][0]["train_targets"] == 100 and m["config"]["loaders"]["train"]["reuse"] == 2
    assert (seen["megabatch"][-1] == first).all()
    capsys.readouterr()
    assert run(["--store", cora_store, "--train-targets", 141, "--epochs", 1]) == 1
    assert "--train-targets 141 is more than the train split's 140 nodes" in capsys.readouterr().err
