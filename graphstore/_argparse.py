"""The parser of every command line here (``graphstore`` and the trainers'): argparse with
manners.

- No abbreviations (``allow_abbrev=False``): ``--epoch 3`` is an error, not ``--epochs 3``.
- Every option's default in ``--help``: `DefaultsHelpFormatter` appends ``(default: X)``
  (``off`` for a switch, ``15,10`` for a sequence) unless the help text already says
  ``(default: ...)``; a required option says ``(required)``. A default of None is written
  by hand, because only its author knows what it means (off, or derived from the data).
- A usage error in at most three lines, then status 2 as argparse's::

      graphstore info: error: unrecognized arguments: --jsn
      did you mean --json?
      (graphstore info --help lists the options)

  The suggestion is the closest of the parser's own flags (`difflib.get_close_matches`,
  as git and cargo answer), a subcommand's for a subcommand: an unknown flag after
  ``graphstore info`` is refused by the ``info`` parser, not by ``graphstore``'s.
- ``--help`` into a closed pipe (``| head -1``) ends quietly (`stdout_closed`).

The trainers (``trainers/options.py``) build their parsers from this class; tools/ keep
their own.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import select
import signal
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["ArgumentParser", "DefaultsHelpFormatter", "default_text", "stdout_closed"]

DEFAULT_MARK = "(default: "
"""What a help text shows its default with; a hand-written one starts the same way."""


def default_text(value: Any, *, switch: bool = False) -> str | None:
    """How ``--help`` writes a default: a switch ``off`` (it is on only when given), a
    sequence as typed (``15,10``), a float in its shortest form (``0.0005``); None for None,
    which has no text of its own.

    Examples
    --------
    >>> default_text((15, 10)), default_text(5e-4), default_text(False, switch=True), default_text("cpu")
    ('15,10', '0.0005', 'off', 'cpu')
    """
    if switch:
        return "off"
    if value is None:
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def stdout_closed() -> int:
    """After a BrokenPipeError on stdout (``graphstore info S | head -1``: the reader has
    gone, as it may): point stdout at /dev/null, so that the interpreter's last flush
    cannot fail again and print "Exception ignored", and return SIGPIPE's status (141), the
    one a shell reports for a command the signal ended."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return 128 + signal.SIGPIPE


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has gone: a `BrokenPipeError` is then stdout's
    (``train.py | head``), not another pipe's (a worker process's, a socket's). Linux and
    macOS report a pipe without readers as POLLERR to its writer."""
    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
    except (AttributeError, ValueError, OSError):
        return False
    poll.register(fd, 0)  # POLLERR and POLLHUP are reported whatever the mask
    return any(events & select.POLLERR for _, events in poll.poll(0))


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``(default: X)`` after every option's help, unless it says one already; ``(required)``
    after a required option's. Positionals and defaults of None or ``SUPPRESS`` get nothing
    (a test per command line checks that every option shows one)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        if (not action.option_strings or help == argparse.SUPPRESS or DEFAULT_MARK in help
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            return help
        if action.required:
            return f"{help} (required)"
        if action.default is argparse.SUPPRESS:
            return help
        text = default_text(action.default, switch=action.nargs == 0)
        return help if text is None else f"{help} {DEFAULT_MARK}{text.replace('%', '%%')})"


class _Subcommands(argparse._SubParsersAction):
    """``add_subparsers``'s action: marks each subcommand's parser, so that it refuses
    unknown arguments itself (with its own flags to suggest from)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser = super().add_parser(name, **kwargs)
        if isinstance(parser, ArgumentParser):
            parser.subcommand = True
        return parser


class ArgumentParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` without abbreviations, with `DefaultsHelpFormatter` and a
    short error (see the module docstring). Subparsers are of this class too."""

    subcommand: bool = False
    """Whether this parser is a subcommand's (it then refuses unknown arguments itself)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)
        # A value such as `--fanouts -1,-1` (every neighbour, DGL's -1) is a value, not an
        # option: Python 3.11's argparse knows only a single negative number.
        self._negative_number_matcher = re.compile(r"^-\d+(,-?\d+)*$|^-\d*\.\d+$")
        self.register("action", "parsers", _Subcommands)

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        namespace, extras = super().parse_known_args(args, namespace)
        if self.subcommand and extras:
            # The top parser would refuse them anyway, but knowing only its own flags.
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def error(self, message: str) -> NoReturn:
        """``PROG: error: MESSAGE``, the closest known flag or choice, where to look; exit 2."""
        lines = [f"{self.prog}: error: {' '.join(message.split())}"]
        hint = self._suggestion(message)
        if hint:
            lines.append(f"did you mean {hint}?")
        lines.append(f"({self.prog} --help lists the options)")
        self.exit(2, "\n".join(lines) + "\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        try:
            sys.stdout.flush()  # --help's text: a closed pipe shows here, not at the interpreter's exit
        except BrokenPipeError:
            closed = stdout_closed()
            status = status or closed
        super().exit(status, message)

    def _suggestion(self, message: str) -> str | None:
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown:
            flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
            for arg in unknown.group(1).split():
                if arg.startswith("--"):
                    close = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1)
                    if close:
                        return close[0]
            return None
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            close = difflib.get_close_matches(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)), n=1)
            return close[0] if close else None
        return None
