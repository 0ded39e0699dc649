"""One shape for every "pick an implementation by name" choice in graphstore.

Readers (source formats), partitioners, buffer policies, micro-batch strategies and loader
schemes are each a `Registry`: a name maps to an object (a function, a `Policy`, a scheme)
with a one-line summary. Registering a new one is a decorator (or a call) in the module
that implements it; the command line and the trainers ask the registry for the choices and
print its `help_text` in ``--help``, so a new entry shows up everywhere without an edit
elsewhere::

    from graphstore.buffer.policies import POLICIES

    @POLICIES.register("round_robin", summary="...")      # or POLICIES.register(name, obj)
    def plan_round_robin(...): ...

    POLICIES.get("round_robin")       # the object; an unknown name raises with the known ones
    POLICIES.names()                  # sorted names, e.g. for argparse ``choices``

(zarr-python keeps its codecs and stores the same way, and fsspec its caches.)
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from graphstore.errors import ConfigError

__all__ = ["Entry", "Registry"]

T = TypeVar("T")

_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


@dataclass(frozen=True, slots=True)
class Entry(Generic[T]):
    """One registered implementation."""

    name: str
    """The key users type (lower case, ``[a-z][a-z0-9_-]*``)."""
    value: T
    """What the name stands for (a function, a `Policy`, a scheme object...)."""
    summary: str
    """One line for ``--help`` and error messages."""
    origin: str = ""
    """The module that registered it (named when a second registration is refused)."""


class Registry(Generic[T]):
    """Named implementations of one kind.

    Parameters
    ----------
    kind : str
        What the entries are, for messages (``"policy"``, ``"source format"``...).
    error : type of Exception
        Raised for an unknown or a duplicate name (`ConfigError` by default; the readers'
        registry raises `SourceError`, what ``graphstore convert`` reports for bad input).
    """

    def __init__(self, kind: str, *, error: type[Exception] = ConfigError) -> None:
        self.kind = kind
        self.error = error
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, value: T | None = None, *, summary: str | None = None, stacklevel: int = 1):
        """Register ``value`` under ``name``; without ``value``, a decorator that registers
        what it decorates (and returns it unchanged).

        ``summary`` defaults to the value's own ``summary`` string where it has one, else the
        first line of its docstring. ``stacklevel``, as
        for `warnings.warn`: a helper that registers on its caller's behalf passes 2, so the
        caller's module is the one recorded.

        Raises
        ------
        error
            If ``name`` is malformed or already registered (a second entry would silently
            shadow the first).
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise self.error(f"a {self.kind} name must match {_NAME.pattern} (got {name!r})")

        def add(obj: T, origin: str) -> T:
            if name in self._entries:
                where = self._entries[name].origin
                raise self.error(f"a {self.kind} named {name!r} is already registered"
                                 + (f" (by {where})" if where else "") + "; pick another name")
            text = summary if summary is not None else _first_line(obj)
            self._entries[name] = Entry(name, obj, text, origin)
            return obj

        if value is None:
            def decorate(obj: T) -> T:
                return add(obj, _module_of(sys._getframe(1)))  # the module the decorator is in
            return decorate
        return add(value, _module_of(sys._getframe(stacklevel)))

    def unregister(self, name: str) -> None:
        """Remove ``name`` (for tests that register a toy implementation and clean up)."""
        self.entry(name)
        del self._entries[name]

    def entry(self, name: str) -> Entry[T]:
        """The `Entry` of ``name``; an unknown name raises ``error`` listing the known ones."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise self.error(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}") from None

    def get(self, name: str) -> T:
        """The object registered as ``name`` (see `entry`)."""
        return self.entry(name).value

    def names(self, where: Callable[[T], bool] | None = None) -> tuple[str, ...]:
        """Registered names, sorted; ``where`` keeps those whose value it accepts."""
        return tuple(sorted(n for n, e in self._entries.items() if where is None or where(e.value)))

    def help_text(self, where: Callable[[T], bool] | None = None) -> str:
        """``"name: summary; ..."`` for ``--help``."""
        return "; ".join(f"{n}: {self._entries[n].summary}" if self._entries[n].summary else n
                         for n in self.names(where))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"<Registry of {self.kind}: {', '.join(self.names())}>"


def _module_of(frame) -> str:
    return frame.f_globals.get("__name__", "") if frame is not None else ""


def _first_line(obj: object) -> str:
    own = getattr(obj, "summary", None)
    if isinstance(own, str) and own:  # a value that carries its summary (a `Scheme`) says it itself
        return own
    doc = getattr(obj, "__doc__", None) or ""
    if type(obj).__doc__ == doc and not callable(obj):  # an instance's class docstring says nothing
        doc = ""
    return doc.strip().splitlines()[0].rstrip(".") if doc.strip() else ""
