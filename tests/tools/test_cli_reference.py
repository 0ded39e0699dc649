"""docs/guide.md's command reference is the parsers' own: a parser changed without
regenerating it (`python tools/cli_reference.py`) fails here."""

from __future__ import annotations

import argparse

from tests.conftest import REPO
from tools import cli_reference


def test_the_guides_command_reference_is_current():
    guide = (REPO / "docs" / "guide.md").read_text()
    assert cli_reference.rendered(guide) == guide, "run: python tools/cli_reference.py"


def test_the_reference_names_every_command_and_option():
    text = cli_reference.reference()
    for command, parser in cli_reference._parsers():
        assert f"### `{command}`" in text
        for action in parser._actions:
            if (action.option_strings and action.help != argparse.SUPPRESS
                    and not isinstance(action, argparse._HelpAction)):
                assert f"`{action.option_strings[0]}" in text or f", {action.option_strings[0]}" in text, \
                    (command, action.option_strings)


def test_the_reference_shows_a_default_the_parser_applies():
    # convert's --seed default is 0 in the parser; the table's row says so.
    from graphstore.cli import _parser

    convert = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["convert"]
    seed = next(a for a in convert._actions if "--seed" in a.option_strings)
    row = next(line for line in cli_reference.reference().splitlines() if line.startswith("| `--seed SEED` |"))
    assert f"(default: {seed.default})" in row


def test_a_stale_reference_is_reported(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "guide.md"
    stale.write_text(f"intro\n{cli_reference.START}\nold text\n{cli_reference.END}\nafter\n")
    monkeypatch.setattr(cli_reference, "GUIDE", stale)
    monkeypatch.setattr(cli_reference, "REPO", tmp_path)
    assert cli_reference.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert cli_reference.main([]) == 0
    assert cli_reference.main(["--check"]) == 0
    text = stale.read_text()
    assert text.startswith("intro\n") and text.endswith("after\n") and "old text" not in text
