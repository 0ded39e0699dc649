"""The trainers' typed options (trainers/options.py): defaults < TOML < flags, one-line
errors naming the file and the key, the dict round trip, the generated --help, and the
metrics JSON's ``config`` keeping the keys it had before options were dataclasses."""

from __future__ import annotations

import dataclasses
import json

import pytest

from graphstore.errors import ConfigError
from trainers import common
from trainers import link_prediction as lp
from trainers import node_classification as nc
from trainers.options import CommonOptions, UsageError

NC = nc.NodeClassificationOptions
LP = lp.LinkPredictionOptions

# The metrics JSON's "config" keys of a 1-epoch Cora run and a link prediction run with
# learnable embeddings, as written by the trainers before their options were dataclasses
# (argparse namespace + resolve_config's additions + the loaders' settings).
NC_CONFIG_KEYS = {
    "aggregation_cache", "batch_size", "buffer_bytes", "buffer_partitions", "checkpoint_dir", "config", "device", "dropout", "epochs",
    "eval_batch_size", "eval_fanouts", "eval_fanouts_rule", "eval_scheme", "fanouts", "heads", "hidden",
    "loader_scheme", "loaders", "lr", "lr_schedule", "macro_batch_bytes", "macro_batches", "metrics_out",
    "feature_cache_bytes", "feature_cache", "cache_lookahead", "micro_batch_budget", "micro_batches",
    "micro_batching", "micro_strategy", "model", "normalize_features", "num_layers", "policy", "prefetch", "resume", "loader_threads",
    "reuse", "scheme", "seed", "static_cache", "store", "weight_decay",
    # issue 30: early stopping, evaluation's rhythm, per-state label balance, the derived defaults' rules
    "patience", "eval_every", "balance_labels", "derived",
    # issue 30: time to accuracy on a bounded training subset
    "train_targets"}
LP_CONFIG_KEYS = {
    "batch_size", "buffer_bytes", "buffer_partitions", "checkpoint_dir", "config", "corrupt", "decoder_hidden",
    "decoder_layers", "degree_fraction", "device", "dropout", "embedding_dim", "embedding_lr",
    "embedding_optimizer", "embedding_scale", "embeddings", "encoder", "epochs", "eval", "eval_batch_size",
    "eval_corrupt", "eval_encoder", "eval_every", "eval_mode", "fanouts", "heads", "hidden", "learnable_embeddings",
    "loader",
    "loss", "lr", "margin", "metrics_out", "model", "negatives", "num_chunks", "num_logical_partitions",
    "optimizer", "policy", "prefetch", "loader_threads", "regularization", "relation_init", "resume", "scheme", "seed", "store",
    # issue 30: early stopping, the derived defaults' rules
    "patience", "derived"}


def toml(tmp_path, text: str) -> str:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return str(path)


def test_flags_over_toml_over_defaults(tmp_path):
    path = toml(tmp_path, 'store = "a.gs"\nscheme = "disk"\nfanouts = [5, 5]\nhidden = 8\n'
                          '[optim]\nweight_decay = 0.001\nlr = 0.05\nno-prefetch = true\nbuffer-bytes = "4MiB"\n')
    args = NC.parse(["--config", path, "--hidden", "12", "--store", "b.gs"])
    assert (args.scheme, args.fanouts, args.hidden, args.lr, args.store) == ("disk", (5, 5), 12, 0.05, "b.gs")
    assert args.weight_decay == 0.001 and args.buffer_bytes == 4 << 20 and args.prefetch is False
    assert (args.epochs, args.model, args.config) == (200, "sage", path)  # defaults; the file is recorded
    assert (args.patience, args.batch_size, args.normalize_features) == (20, None, "auto")  # decided by the data
    # A flag given at its default value still overrides the file.
    assert NC.parse(["--config", path, "--scheme", "minibatch"]).scheme == "minibatch"
    # `prefetch = false` says the same as `no-prefetch = true`.
    assert NC.parse(["--config", toml(tmp_path, 'store = "a"\nprefetch = false\n')]).prefetch is False
    assert NC.parse(["--store", "a", "--no-prefetch"]).prefetch is False


def test_link_prediction_defaults_and_renamed_flag(tmp_path):
    args = LP.parse(["--store", "s"])
    assert (args.lr, args.batch_size, args.eval_mode, args.fanouts) == (0.1, 1000, None, (10, 5))
    assert LP.parse(["--store", "s", "--eval", "ogb"]).eval_mode == "ogb"
    assert LP.parse(["--config", toml(tmp_path, 'store = "s"\neval = "filtered"\n')]).eval_mode == "filtered"
    assert CommonOptions().lr == 0.01  # the subclass's default is its own


@pytest.mark.parametrize("text, needle", [
    ('hiden = 3\n', "unknown option 'hiden' (known: aggregation-cache, balance-labels, batch-size, buffer-bytes"),
    ('config = "other.toml"\n', "unknown option 'config'"),  # a file does not name another
    ('epochs = "many"\n', "epochs: expected an integer (got 'many')"),
    ('lr = "fast"\n', "lr: cannot read 'fast' as float"),
    ('fanouts = [0, 5]\n', "fanouts: fanouts must be positive or -1"),
    ('buffer-bytes = "lots"\n', "buffer-bytes: expected a size like 512MiB"),
    ('scheme = "tape"\n', "scheme must be one of disk, macrobatch, megabatch, microbatch, minibatch (got 'tape')"),
    ('resume = 1\n', "resume must be true or false (got 1)"),
    ('no-prefetch = "yes"\n', "no-prefetch must be true or false (got 'yes')"),
    ('store = 5\n', "store must be a string (got 5)"),
    ('epochs = [\n', "not valid TOML"),
])
def test_bad_entries_are_one_line_naming_file_and_key(tmp_path, text, needle):
    path = toml(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        NC.parse(["--config", path, "--store", "s"])
    message = str(e.value)
    assert message.startswith(f"{path}: ") and needle in message and "\n" not in message


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        NC.parse(["--config", str(tmp_path / "no.toml"), "--store", "s"])


@pytest.mark.parametrize("argv, needle", [
    ([], "--store is required"),
    (["--store", "s", "--buffer-partitions", "2", "--buffer-bytes", "1MiB"], "not both"),
    (["--store", "s", "--resume"], "--resume needs --checkpoint-dir"),
    (["--store", "s", "--epochs", "0"], "argument --epochs: must be positive"),
    (["--store", "s", "--buffer-bytes", "x"], "argument --buffer-bytes: expected a size"),
    (["--store", "s", "--model", "mlp"], "argument --model: invalid choice"),
])
def test_usage_errors_exit_2(capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        NC.parse(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("options, values, needle", [
    (NC, {"scheme": "microbatch"}, "--scheme microbatch needs --micro-batches K"),
    (NC, {"micro_batches": 2, "micro_batch_budget": "1MiB"}, "not both"),
    (NC, {"fanouts": [5, 5], "eval_fanouts": [-1]}, "--eval-fanouts needs one fanout per layer (2; got 1)"),
    (LP, {"corrupt": "pair", "negatives": 3}, "--negatives must be even (got 3)"),
    (LP, {"model": "complex", "embedding_dim": 5}, "--model complex needs an even --embedding-dim"),
    (LP, {"encoder": "gat", "hidden": 10, "heads": 3}, "divisible by --heads 3"),
])
def test_cross_field_checks_are_config_errors(options, values, needle):
    """The trainers' own checks raise ConfigError (the scripts exit 1), from flags and dicts."""
    with pytest.raises(ConfigError) as e:
        options.from_dict({"store": "s", **values}, source="run.json")
    assert needle in str(e.value) and not isinstance(e.value, UsageError)
    argv = ["--store", "s"]
    for key, value in values.items():
        argv += ["--" + key.replace("_", "-"), ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    with pytest.raises(ConfigError) as e:
        options.parse(argv)
    assert needle in str(e.value)


def test_from_dict_of_to_dict_is_the_same():
    for options in (NC(store="s"), NC.parse(["--store", "s", "--fanouts=-1,7,3", "--micro-batch-budget", "1GiB",
                                             "--no-prefetch", "--static-cache", "0.25", "-v", "--lr", "0.1234"]),
                    LP(store="s"), LP.parse(["--store", "s", "--eval", "ogb", "--embeddings", "--hidden", "32"])):
        values = options.to_dict()
        assert json.loads(json.dumps(values)) == values  # JSON-able as it is
        assert type(options).from_dict(values) == options
    assert NC.from_dict({"store": "s", "batch-size": 7}).batch_size == 7
    with pytest.raises(ConfigError, match=r"^run.json: epochs needs a value \(got None\)$"):
        NC.from_dict({"store": "s", "epochs": None}, source="run.json")


def test_options_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        NC(store="s").lr = 1.0


@pytest.mark.parametrize("options", [NC, LP])
def test_help_lists_every_field(options):
    text = options.build_parser().format_help()
    for f in dataclasses.fields(options):
        flag = f.metadata["option"].flag or "--" + f.name.replace("_", "-")
        assert flag in text, flag
        help_text = f.metadata["option"].help
        if help_text:
            assert " ".join(help_text.split()[:3]) in " ".join(text.split()), f.name


def test_run_only_options_are_the_ones_resume_may_change():
    assert common.RUN_ONLY == {"config", "resume", "epochs", "eval_every", "metrics_out", "checkpoint_dir", "device",
                               "store", "derived", "loader_threads"}
    assert nc.NodeClassificationOptions.run_only_names() - common.RUN_ONLY == {"patience"}
    assert lp.LinkPredictionOptions.run_only_names() - common.RUN_ONLY == {"patience", "eval_encoder"}


def test_metrics_config_keys_are_unchanged(cora_store, fresh_kg, tmp_path):
    out = tmp_path / "nc.json"
    assert common.run(nc.PROG, nc.main, ["--store", str(cora_store), "--epochs", "1", "--fanouts", "5,5",
                                         "--hidden", "8", "--metrics-out", str(out)]) == 0
    config = json.loads(out.read_text())["config"]
    assert set(config) == NC_CONFIG_KEYS
    assert config["fanouts"] == [5, 5] and config["eval_fanouts"] == [-1, -1] and config["num_layers"] == 2
    assert config["store"] == str(cora_store) and config["micro_batching"] is False
    out = tmp_path / "lp.json"
    assert common.run(lp.PROG, lp.main, ["--store", str(fresh_kg), "--epochs", "1", "--embedding-dim", "8",
                                         "--metrics-out", str(out)]) == 0
    config = json.loads(out.read_text())["config"]
    assert set(config) == LP_CONFIG_KEYS
    assert (config["eval"], config["eval_mode"], config["lr"], config["fanouts"]) == ("filtered", None, 0.1, [10, 5])
