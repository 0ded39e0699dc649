"""The command lines' manners (issue 35, 5; `graphstore._argparse`): no abbreviations, a
misspelled flag answered in at most three lines with the closest known one, every option's
default in ``--help`` (the trainers' and every ``graphstore`` subcommand's), and a closed
pipe on stdout (``graphstore info S | head -1``) ending the command quietly."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys

import pytest

from graphstore._argparse import DEFAULT_MARK, default_text
from graphstore.cli import _parser, main
from graphstore.layout._convert import ConvertOptions, convert
from tests.conftest import REPO, make_graph
from trainers import full_batch as fb
from trainers import link_prediction as lp
from trainers import node_classification as nc
from trainers.options import _spec

TRAINERS = [nc.NodeClassificationOptions, lp.LinkPredictionOptions, fb.FullBatchOptions]
PLAN = ["plan", "--policy", "comet", "--partitions", "4", "--capacity", "2"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    graph, _ = make_graph(num_nodes=120, num_edges=500)
    out = tmp_path_factory.mktemp("manners") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=2, partitioner="random"))
    return out


def buffered_env() -> dict[str, str]:
    """The environment a user has: stdout block-buffered into a pipe, so a closed pipe shows
    only at the last flush (the test runner may set PYTHONUNBUFFERED, which hides it)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def usage_error(capsys, call) -> list[str]:
    """The lines ``call`` writes to stderr, checked to exit with argparse's status 2."""
    with pytest.raises(SystemExit) as exited:
        call()
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()


# ---------------------------------------------------------------------- errors

@pytest.mark.parametrize("options", TRAINERS, ids=lambda o: o.prog)
def test_a_trainer_refuses_an_abbreviation_and_names_the_flag(capsys, options):
    lines = usage_error(capsys, lambda: options.parse(["--store", "s", "--epoch", "3"]))
    assert lines == [f"{options.prog}: error: unrecognized arguments: --epoch 3", "did you mean --epochs?",
                     f"({options.prog} --help lists the options)"]


def test_a_trainer_script_answers_a_misspelled_flag_in_three_lines():
    proc = subprocess.run([sys.executable, "trainers/node_classification.py", "--store", "s", "--hiden", "8"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["node_classification.py: error: unrecognized arguments: --hiden 8",
                                        "did you mean --hidden?",
                                        "(node_classification.py --help lists the options)"]


@pytest.mark.parametrize("argv, lines", [
    # a subcommand's own flags: --json is info's, not graphstore's
    (["info", "--jsn", "S"], ["graphstore info: error: unrecognized arguments: --jsn", "did you mean --json?",
                              "(graphstore info --help lists the options)"]),
    # no abbreviations: --train-part is not --train-partitions (joined by "=": plan's optional
    # STORE would take a separate 0,1)
    ([*PLAN, "--train-part=0,1"], ["graphstore plan: error: unrecognized arguments: --train-part=0,1",
                                      "did you mean --train-partitions?", "(graphstore plan --help lists the options)"]),
    (["--verbos", "info", "S"], ["graphstore: error: unrecognized arguments: --verbos", "did you mean --verbose?",
                                 "(graphstore --help lists the options)"]),
    (["infoo", "S"], [None, "did you mean info?", "(graphstore --help lists the options)"]),
    (["convert", "src", "out", "--partitioner", "metiss"], [None, "did you mean metis?", None]),
    # nothing close: no guess, two lines
    (["info", "--zzz", "S"], ["graphstore info: error: unrecognized arguments: --zzz",
                              "(graphstore info --help lists the options)"]),
    (["infer", "S"], ["graphstore infer: error: the following arguments are required: --checkpoint, --out",
                      "(graphstore infer --help lists the options)"]),
])
def test_graphstore_answers_a_usage_error_in_at_most_three_lines(capsys, argv, lines):
    got = usage_error(capsys, lambda: main(argv))
    assert len(got) == len(lines) <= 3, got
    for line, expected in zip(got, lines):
        assert expected is None or line == expected, got
    assert "usage:" not in "\n".join(got)


def test_graphstore_refuses_a_misspelled_flag_as_a_command(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "graphstore", "info", "--jsn", str(tmp_path / "x.gs")],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[1:] == ["did you mean --json?", "(graphstore info --help lists the options)"]


# ---------------------------------------------------------------------- --help

def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    """``graphstore`` itself and each of its subcommands' parsers, by name."""
    parser = _parser()
    parsers = {"graphstore": parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers.update(action.choices)
    return parsers


def options_without_a_default(parser: argparse.ArgumentParser) -> list[str]:
    """Each option whose ``--help`` entry shows neither a default nor that it is required."""
    formatter = parser._get_formatter()
    missing = []
    for action in parser._actions:
        if (not action.option_strings or action.help == argparse.SUPPRESS
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            continue
        text = formatter._get_help_string(action) if action.help else ""
        if DEFAULT_MARK not in text and "(required" not in text:
            missing.append(action.option_strings[-1])
    return missing


@pytest.mark.parametrize("options", TRAINERS, ids=lambda o: o.prog)
def test_every_trainer_option_shows_its_default(options):
    """A new field whose default is None fails here until its help says what None means:
    ``(default: none)`` when it means off, else the rule that derives it."""
    assert options_without_a_default(options.build_parser()) == []
    # A default written by hand in the help is the field's own (an override shows its own).
    for f in dataclasses.fields(options):
        written = re.search(r"\(default: ([^)]*)", _spec(f).help or "")
        if written and f.default is not None:
            assert written.group(1).startswith(default_text(f.default)), (f.name, written.group(1), f.default)


def test_trainer_help_entries_show_the_fields_defaults():
    text = " ".join(nc.NodeClassificationOptions.build_parser().format_help().split())
    for entry in ["--epochs EPOCHS most epochs; --patience usually stops sooner (default: 200)",
                  "--lr LR learning rate (default: 0.01)", "--hidden HIDDEN hidden width (default: 64)",
                  "one per layer (default: 15,10)", "--no-prefetch load buffer states in the foreground "
                  "(for measuring stalls) (default: off)", "--batch-size B targets per training batch (default: "
                  "derived from the data: min(1000, max(64, train split / 8))"]:
        assert entry in text, entry
    text = " ".join(lp.LinkPredictionOptions.build_parser().format_help().split())
    assert "--lr LR learning rate (default: 0.1)" in text and "(default: 1000)" in text  # lr is overridden


@pytest.mark.parametrize("name", sorted(subcommand_parsers()))
def test_every_graphstore_option_shows_its_default(name):
    parser = subcommand_parsers()[name]
    assert options_without_a_default(parser) == []
    formatter = parser._get_formatter()
    for action in parser._actions:  # a default written by hand is the one argparse applies
        written = re.search(r"\(default: ([^)]*)", action.help or "")
        if written and action.option_strings and action.default is not None and action.nargs != 0:
            assert written.group(1).startswith(default_text(action.default)), (action.dest, written.group(1))
        assert formatter._get_help_string(action).count(DEFAULT_MARK) <= 1, action.dest


def test_graphstore_help_entries():
    text = " ".join(subcommand_parsers()["convert"].format_help().split())
    assert "--chunk-edges CHUNK_EDGES edges per streaming step (bounds memory) (default: 1048576)" in text
    assert "--compress zstd-compress every array (default: off)" in text
    text = " ".join(subcommand_parsers()["infer"].format_help().split())
    assert "(required)" in text and "--split SPLIT node split whose outputs to write, or 'all' (default: test)" in text


# ---------------------------------------------------------------------- a closed pipe

def test_info_into_head_is_quiet(store):
    """``graphstore info S | head -1`` as a shell runs it: one line, nothing on stderr, status 0."""
    proc = subprocess.run(f"{sys.executable} -m graphstore info {store} 2>{store.parent / 'err'} | head -1",
                          shell=True, capture_output=True, text=True, cwd=REPO, timeout=300, env=buffered_env())
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith(f"{store}: graphstore format") and proc.stdout.count("\n") == 1
    assert (store.parent / "err").read_text() == ""


@pytest.mark.parametrize("argv", [["info", "STORE"], ["info", "STORE", "--json"], PLAN, ["--help"], ["info", "--help"]],
                         ids=" ".join)
def test_a_reader_gone_before_the_first_line_ends_the_command_quietly(store, argv):
    """The reader closes the pipe before the command writes: with stdout buffered as it is
    for a user, the error shows at the last flush, which must not print "Exception ignored"."""
    argv = [str(store) if a == "STORE" else a for a in argv]
    with subprocess.Popen([sys.executable, "-m", "graphstore", *argv], cwd=REPO, env=buffered_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert (proc.wait(timeout=300), err) == (141, "")


def test_a_trainer_whose_reader_has_gone_stops_quietly(store):
    """``node_classification.py ... | head``: the reader closes the pipe before the trainer
    writes; the trainer stops with SIGPIPE's status and nothing on stderr (it printed
    "error: Broken pipe" and exited 1)."""
    env = {**buffered_env(), "PYTHONUNBUFFERED": "1"}  # every line reaches the closed pipe at once
    with subprocess.Popen([sys.executable, "trainers/node_classification.py", "--store", str(store), "--epochs", "2",
                           "--hidden", "8"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert (proc.wait(timeout=300), err) == (141, "")


def test_a_broken_pipe_that_is_not_stdout_is_still_an_error(capsys):
    """A `BrokenPipeError` from another pipe (a worker's, a socket's) is the run's error, not
    a reader that went away: stdout is still open here."""
    from trainers.common import run

    def broken(argv):
        raise BrokenPipeError(32, "Broken pipe")

    assert run("train.py", broken, []) == 1
    assert capsys.readouterr().err == "train.py: error: Broken pipe\n"


@pytest.mark.parametrize("value", ["-1,-1", "-1", "10,-1", "-1,5"])
def test_a_fanout_list_starting_with_minus_one_is_a_value(value):
    """``--eval-fanouts -1,-1`` (every neighbour) as the trainers' docstring writes it: on
    Python 3.11 argparse took ``-1,-1`` for an option ("expected one argument")."""
    args = nc.NodeClassificationOptions.build_parser().parse_args(["--store", "S", "--eval-fanouts", value])
    assert args.eval_fanouts == tuple(int(v) for v in value.split(","))


def test_a_flag_after_a_value_option_is_still_refused_as_a_value(capsys):
    """Only comma lists of integers count as negative values; ``--fanouts --epochs`` still
    says the value is missing."""
    lines = usage_error(capsys, lambda: nc.NodeClassificationOptions.build_parser().parse_args(
        ["--store", "S", "--fanouts", "--epochs", "3"]))
    assert "expected one argument" in lines[0]
