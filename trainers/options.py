"""Trainer options as frozen dataclasses: one field per option, the command line generated
from the fields, a TOML file and flags merged and validated in one place.

Each field is declared with `option` (default, help, converter, choices, flag name); the
class is the single source of truth for names, defaults, types and help, and argparse is
only the flag syntax (its parser is built from the fields and reports the flags given, never
defaults). Precedence: field defaults < the ``--config`` TOML file < flags.

``--help`` shows every field's default after its help, ``(default: 15,10)``, ``(default: off)``
for a switch, from the field itself (an `override` shows its own). A default of None is
explained by hand in the help, ``(default: none)`` where None means off, or ``(default:
derived from the data: <the rule>)``; tests/test_cli_manners.py fails on a field whose help
shows no default. The parser is `graphstore._argparse.ArgumentParser`: no abbreviations
(``--epoch`` is refused), and a misspelled flag answered with the closest known one.

`Options.from_dict` reads a mapping (a TOML file's tables, or `Options.to_dict`'s output):
unknown keys, values the field's converter refuses, values outside ``choices`` and
non-booleans for switches are one-line `ConfigError`\\ s naming the source and the key.
`Options.validate` holds the checks across fields; a subclass extends it. A `UsageError`
(a missing or contradictory flag) exits through ``parser.error`` with argparse's status 2;
any other `ConfigError` propagates (the scripts print it on one line and exit 1).

A tool that takes a trainer's options plus its own subclasses the trainer's class::

    @dataclasses.dataclass(frozen=True)
    class ReferenceOptions(NodeClassificationOptions):
        prog: ClassVar[str] = "reference_dgl.py"
        dgl_python: str | None = option(None, help="an interpreter with dgl")

Not part of the wheel: imported by path, as ``common`` is.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Self

from graphstore._argparse import DEFAULT_MARK, ArgumentParser, default_text
from graphstore.cli import (  # the argparse types the command line uses too
    byte_size,
    fanout_list,
    non_negative_int,
    positive_int,
)
from graphstore.errors import ConfigError

__all__ = [
    "CommonOptions", "OptionSpec", "Options", "UsageError", "byte_size", "fanout_list", "non_negative_int",
    "option", "override", "positive_int", "unit_float",
]

class UsageError(ConfigError):
    """Flags missing or contradicting each other: the command line exits with status 2."""


# ---------------------------------------------------------------------- value types
# Converters take the text of a flag (TOML values are passed as ``str(value)``, so a flag
# and a file entry read alike) and raise argparse.ArgumentTypeError with the message shown.

def unit_float(text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a number (got {text!r})") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1) (got {value})")
    return value


# ---------------------------------------------------------------------- fields

@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """How a field reads from flags and files (kept in the field's metadata)."""

    help: str | None
    """The ``--help`` text (``argparse.SUPPRESS`` hides the flag)."""
    type: Callable[[str], Any] | None
    """Converter from text; None for a string or a switch (a bool field)."""
    choices: tuple[Any, ...] | None
    """The allowed values, checked after conversion."""
    flag: str | None
    """The long flag; None for ``--`` + the field name with dashes. A switch whose default
    is True is given as ``--no-...`` (flag and file entry set it to False)."""
    short: str | None
    """A one-letter alias (``-v``)."""
    metavar: str | None
    in_file: bool
    """Whether a config file may set it (``config`` itself may not)."""
    run_only: bool
    """Where things go or how to start, not what is trained: a resumed run may change it."""


def option(default: Any, *, help: str | None = None, type: Callable[[str], Any] | None = None,
           choices: Sequence[Any] | None = None, flag: str | None = None, short: str | None = None,
           metavar: str | None = None, in_file: bool = True, run_only: bool = False) -> Any:
    """A dataclass field that is also a command-line option and a config file entry."""
    spec = OptionSpec(help=help, type=type, choices=tuple(choices) if choices is not None else None, flag=flag,
                      short=short, metavar=metavar, in_file=in_file, run_only=run_only)
    return dataclasses.field(default=default, metadata={"option": spec})


def override(base: type[Options], name: str, *, default: Any) -> Any:
    """``base``'s field ``name`` with another default (a subclass's ``--lr 0.1``); it keeps
    its place in ``--help``."""
    f = next(f for f in dataclasses.fields(base) if f.name == name)
    return dataclasses.field(default=default, metadata=f.metadata)


def _spec(f: dataclasses.Field) -> OptionSpec:
    try:
        return f.metadata["option"]
    except KeyError:
        raise TypeError(f"field {f.name!r}: an Options field is declared with option(...)") from None


def _long_flag(f: dataclasses.Field) -> str:
    return _spec(f).flag or "--" + f.name.replace("_", "-")


def _is_switch(f: dataclasses.Field) -> bool:
    return isinstance(f.default, bool) and _spec(f).type is None


def _is_negative(f: dataclasses.Field) -> bool:
    return _is_switch(f) and _long_flag(f).startswith("--no-")


def _help(f: dataclasses.Field) -> str | None:
    """The field's ``--help`` text with its default: appended from the field's value unless
    the text says it (``(default: ...``, ``(required``); a None default has no text of its
    own (its help says what None means)."""
    text = _spec(f).help
    if text == argparse.SUPPRESS or text and (DEFAULT_MARK in text or "(required" in text):
        return text
    shown = default_text(f.default, switch=_is_switch(f))
    if shown is None:
        return text
    shown = f"{DEFAULT_MARK}{shown.replace('%', '%%')})"  # argparse %-formats help
    return f"{text} {shown}" if text else shown


# ---------------------------------------------------------------------- the base class

@dataclasses.dataclass(frozen=True)
class Options:
    """Base of a script's options: subclasses declare fields with `option`."""

    prog: ClassVar[str | None] = None
    description: ClassVar[str | None] = None

    # ---- mapping in and out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, source: str = "<dict>") -> Self:
        """Options from ``values`` (flag names or field names, dashes or underscores), the
        rest at their defaults, validated.

        Raises
        ------
        ConfigError
            Naming ``source`` and the key, on an unknown key or a value its field refuses;
            or from `validate`.
        """
        options = cls(**cls._convert(values, source=source))
        options.validate()
        return options

    def to_dict(self) -> dict[str, Any]:
        """Field name -> value, JSON-able (tuples as lists), in declaration order."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def read_toml(cls, path: str) -> dict[str, Any]:
        """The entries of the TOML file ``path``, converted and checked (not merged with
        defaults: the caller lays them over its own). Flat tables are allowed for readability
        (``[loader] batch-size = ...``) and merged in."""
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML ({e})") from None
        flat: dict[str, Any] = {}
        for key, value in raw.items():
            if isinstance(value, dict):
                flat.update(value)
            else:
                flat[key] = value
        return cls._convert(flat, source=path, in_file=True)

    @classmethod
    def _convert(cls, values: Mapping[str, Any], *, source: str, in_file: bool = False) -> dict[str, Any]:
        """The one place a value meets its field: ``values`` by field name, converted."""
        fields = [f for f in dataclasses.fields(cls) if not in_file or _spec(f).in_file]
        by_name = {f.name: f for f in fields}
        by_flag = {_long_flag(f).lstrip("-").replace("-", "_"): f for f in fields}
        out: dict[str, Any] = {}
        for key, value in values.items():
            name = str(key).replace("-", "_")
            f = by_flag.get(name) or by_name.get(name)
            if f is None:
                known = ", ".join(sorted(k.replace("_", "-") for k in by_flag))
                raise ConfigError(f"{source}: unknown option {key!r} (known: {known})")
            out[f.name] = _convert_value(f, key, value, source=source, negated=_is_negative(f) and name != f.name)
        return out

    # ---- the command line

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field. Defaults are ``SUPPRESS``: the namespace holds the flags given
        and nothing else, so a flag's default never hides a config file's value."""
        for f in dataclasses.fields(cls):
            spec = _spec(f)
            names = [n for n in (spec.short, _long_flag(f)) if n]
            kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": _help(f)}
            if _is_switch(f):
                kw["action"] = "store_false" if _is_negative(f) else "store_true"
            else:
                kw.update(type=spec.type, choices=spec.choices, metavar=spec.metavar)
            parser.add_argument(*names, **kw)

    @classmethod
    def build_parser(cls) -> argparse.ArgumentParser:
        """The parser of `graphstore._argparse` (no abbreviations, a short error naming the
        closest flag) with every field's flag and default."""
        parser = ArgumentParser(prog=cls.prog, description=cls.description)
        cls.add_arguments(parser)
        return parser

    @classmethod
    def parse(cls, argv: Sequence[str] | None = None) -> Self:
        """Flags over the ``--config`` file over the defaults, validated.

        Raises
        ------
        SystemExit
            Status 2 on bad flags or a `UsageError` (argparse's message).
        ConfigError
            On an unreadable config file, an unknown or invalid entry in it, or a `validate`
            failure other than a `UsageError`.
        """
        parser = cls.build_parser()
        given = vars(parser.parse_args(argv))
        values = cls.read_toml(given["config"]) if given.get("config") else {}
        values.update(given)
        options = cls(**values)
        try:
            options.validate()
        except UsageError as e:
            parser.error(str(e))
        return options

    def validate(self) -> None:
        """Checks across fields; subclasses call ``super().validate()`` first.

        Raises
        ------
        ConfigError
            One line naming the options and the problem (`UsageError` for the command line's
            own mistakes).
        """

    @classmethod
    def run_only_names(cls) -> frozenset[str]:
        """The fields a resumed run may change (`OptionSpec.run_only`)."""
        return frozenset(f.name for f in dataclasses.fields(cls) if _spec(f).run_only)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _convert_value(f: dataclasses.Field, key: str, value: Any, *, source: str, negated: bool) -> Any:
    spec = _spec(f)
    if value is None:
        # Not from TOML (it has no null): to_dict's output for an unset optional field.
        if f.default is not None:
            raise ConfigError(f"{source}: {key} needs a value (got None)")
        return None
    if _is_switch(f):
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {key} must be true or false (got {value!r})")
        # `no-prefetch = true` means prefetch = False.
        return not value if negated else value
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    if spec.type is not None:
        try:
            value = spec.type(value if isinstance(value, str) else str(value))
        except argparse.ArgumentTypeError as e:
            raise ConfigError(f"{source}: {key}: {e}") from None
        except ValueError:
            raise ConfigError(f"{source}: {key}: cannot read {value!r} as {spec.type.__name__}") from None
    elif spec.choices is None and not isinstance(value, str):
        raise ConfigError(f"{source}: {key} must be a string (got {value!r})")
    if spec.choices is not None and value not in spec.choices:
        choices = ", ".join(map(str, spec.choices))
        raise ConfigError(f"{source}: {key} must be one of {choices} (got {value!r})")
    return value


# ---------------------------------------------------------------------- both trainers

@dataclasses.dataclass(frozen=True)
class CommonOptions(Options):
    """The options both trainers take (run control, output, buffer)."""

    config: str | None = option(
        None, metavar="C.toml", in_file=False, run_only=True,
        help="TOML file giving any option below by its long name (flags override it) (default: none)")
    store: str | None = option(None, metavar="S.gs", run_only=True, help="the store to train on (required)")
    buffer_partitions: int | None = option(
        None, type=positive_int, metavar="C",
        help="partitions the buffer holds (default: none: the buffer is sized in bytes, --buffer-bytes)")
    buffer_bytes: int | None = option(
        None, type=byte_size, metavar="B",
        help="buffer budget in bytes instead of partitions, e.g. 512MiB (default: derived from the machine: half "
             "of the memory this process may still use, the cgroup limit when one is set, else MemAvailable; "
             "none for a scheme holding the whole graph)")
    batch_size: int = option(1000, type=positive_int, metavar="B", help="targets per training batch")
    epochs: int = option(200, type=positive_int, run_only=True, help="most epochs; --patience usually stops sooner")
    eval_every: int | None = option(
        None, type=positive_int, run_only=True, metavar="N",
        help="evaluate on validation every N epochs and after the last (default: derived from the run's timing: "
             "after an epoch when evaluation so far plus one more fits within the training time so far, so it "
             "stays within half of the run; common.should_evaluate)")
    lr: float = option(0.01, type=float, help="learning rate")
    seed: int = option(0, type=int, help="with the epoch number, every random choice (init, sampling, dropout)")
    device: str = option("cpu", choices=("cpu", "cuda"), run_only=True)
    prefetch: bool = option(True, flag="--no-prefetch",
                            help="load buffer states in the foreground (for measuring stalls)")
    loader_threads: int | None = option(
        None, type=non_negative_int, metavar="N", run_only=True,
        help="threads that sample and gather batches ahead of training (0: in the training thread; the batches "
             "are the same for every N) (default: derived from the machine: on the CPU the cores torch's threads "
             "leave free, 0 when it uses them all; with --device cuda all cores but one)")
    metrics_out: str | None = option(None, metavar="M.json", run_only=True,
                                     help="write the metrics JSON here (default: none)")
    checkpoint_dir: str | None = option(None, metavar="D", run_only=True,
                                        help="save a checkpoint here after every epoch (default: none)")
    resume: bool = option(False, run_only=True, help="continue from the last checkpoint in --checkpoint-dir")
    verbose: bool = option(False, short="-v", help="log debug messages")

    def validate(self) -> None:
        super().validate()
        if not self.store:
            raise UsageError("--store is required (as a flag or in the config file)")
        if self.buffer_partitions is not None and self.buffer_bytes is not None:
            raise UsageError("give --buffer-partitions or --buffer-bytes, not both")
        if self.resume and not self.checkpoint_dir:
            raise UsageError("--resume needs --checkpoint-dir")
