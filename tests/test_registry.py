"""The one registry shape (`graphstore.registry.Registry`) and the registries built on it:
source formats, partitioners and micro-batch strategies."""

from __future__ import annotations

import pytest

from graphstore.errors import ConfigError, SourceError
from graphstore.layout.partition import PARTITIONERS, available_partitioners, register_partitioner
from graphstore.layout.sources import READERS, SourceFormat, available_formats, get_reader, register_reader
from graphstore.registry import Entry, Registry
from graphstore.sample.microbatch import STRATEGIES


def plan_a():
    """First toy.

    More text that is not the summary.
    """


def plan_b():
    pass


@pytest.fixture
def toys() -> Registry:
    return Registry("toy")


# --------------------------------------------------------------------------- the shape


def test_decorator_and_call_forms_register_and_return_the_value(toys):
    decorated = toys.register("a")(plan_a)
    assert decorated is plan_a
    assert toys.register("b", plan_b, summary="second toy") is plan_b
    assert toys.get("a") is plan_a and toys.get("b") is plan_b
    assert toys.entry("a") == Entry("a", plan_a, "First toy", __name__)  # registered here
    assert toys.entry("b").summary == "second toy"


def test_membership_iteration_and_len_follow_the_sorted_names(toys):
    toys.register("zeta", plan_b)
    toys.register("alpha", plan_a)
    assert "zeta" in toys and "beta" not in toys and 3 not in toys
    assert list(toys) == ["alpha", "zeta"] == list(toys.names())
    assert len(toys) == 2
    assert repr(toys) == "<Registry of toy: alpha, zeta>"


def test_a_duplicate_is_refused_naming_the_first_module(toys):
    toys.register("a", plan_a)
    with pytest.raises(ConfigError, match=rf"a toy named 'a' is already registered \(by {__name__}\)"):
        toys.register("a", plan_b)
    assert toys.get("a") is plan_a


@pytest.mark.parametrize("name", ["", "A", "1st", "with space", "dot.ted", None])
def test_a_malformed_name_is_refused(toys, name):
    with pytest.raises(ConfigError, match="toy name must match"):
        toys.register(name, plan_a)
    assert len(toys) == 0


def test_an_unknown_name_lists_the_known_ones(toys):
    toys.register("b", plan_b)
    toys.register("a", plan_a)
    with pytest.raises(ConfigError, match="^unknown toy 'c'; known: a, b$"):
        toys.get("c")
    with pytest.raises(ConfigError, match="unknown toy"):
        toys.entry(["not", "hashable"])  # type: ignore[arg-type]


def test_the_error_class_is_chosen_by_the_registry():
    sources = Registry("format", error=SourceError)
    sources.register("x", plan_a)
    with pytest.raises(SourceError):
        sources.get("y")
    with pytest.raises(SourceError):
        sources.register("x", plan_b)


def test_names_where_and_help_text(toys):
    toys.register("a", plan_a)
    toys.register("b", plan_b)  # no docstring: no summary
    toys.register("c", 3, summary="a number")
    assert toys.names(where=callable) == ("a", "b")
    assert toys.help_text() == "a: First toy; b; c: a number"
    assert toys.help_text(where=lambda v: not callable(v)) == "c: a number"


def test_an_instance_does_not_take_its_class_docstring_as_summary(toys):
    class Policy:
        """Class docs."""

    toys.register("p", Policy())
    assert toys.entry("p").summary == ""


def test_a_value_with_its_own_summary_shows_it_in_help():
    """The trainers' ``--scheme`` help listed bare names: a `Scheme` carries its summary
    as a field, not as a docstring."""
    from graphstore.loaders.schemes import SCHEMES

    assert SCHEMES.entry("megabatch").summary.startswith("HierBatching")
    assert "minibatch: the whole graph in memory" in SCHEMES.help_text()


def test_unregister_removes_and_refuses_unknown(toys):
    toys.register("a", plan_a)
    toys.unregister("a")
    assert "a" not in toys and len(toys) == 0
    toys.register("a", plan_b)  # the name is free again
    with pytest.raises(ConfigError, match="unknown toy 'zz'"):
        toys.unregister("zz")


# ------------------------------------------------------------------- the registries


def test_readers_registry():
    assert isinstance(READERS, Registry)
    assert READERS.names() == available_formats() == ("edgelist", "kg", "npz", "ogb", "planetoid")
    fmt = READERS.get("ogb")
    assert isinstance(fmt, SourceFormat) and fmt.reader is get_reader("ogb")
    assert fmt.options == frozenset({"split"})
    assert READERS.names(where=lambda f: "features" in f.options) == ("edgelist",)
    assert all(READERS.entry(name).summary for name in READERS)  # every format shows in --help
    with pytest.raises(SourceError, match="unknown source format 'nope'; known: edgelist"):
        get_reader("nope")


def test_register_reader_validates_then_registers_and_refuses_duplicates():
    def read_toy(path, ctx):
        """Toy reader."""

    with pytest.raises(SourceError, match="unknown reader options"):
        register_reader("toy", read_toy, options=("colour",))
    assert "toy" not in READERS
    register_reader("toy", read_toy, options=("labels",))
    try:
        assert get_reader("toy") is read_toy
        assert READERS.entry("toy").summary == "Toy reader"
        # SourceError is a ValueError; the message names this module, which registered it
        # through the register_reader helper (not the helper's own module).
        with pytest.raises(ValueError, match=rf"already registered \(by {__name__}\)"):
            register_reader("toy", read_toy)
    finally:
        READERS.unregister("toy")
    assert "toy" not in READERS


def test_partitioners_registry():
    assert isinstance(PARTITIONERS, Registry)
    assert PARTITIONERS.names() == available_partitioners() == ("metis", "random", "sequential", "stream")
    assert all(PARTITIONERS.entry(name).summary for name in PARTITIONERS)

    @register_partitioner("toy-order", summary="toy")
    def toy(edges, num_partitions, seed, chunk_edges, memory_bytes):
        raise AssertionError("not called")

    try:
        assert PARTITIONERS.get("toy-order") is toy and "toy-order" in available_partitioners()
        with pytest.raises(ConfigError, match=rf"already registered \(by {__name__}\)"):
            register_partitioner("toy-order")(toy)
    finally:
        PARTITIONERS.unregister("toy-order")


def test_micro_batch_strategies_registry():
    assert isinstance(STRATEGIES, Registry)
    assert STRATEGIES.names() == ("metis", "random", "range", "reg")
    assert all(callable(STRATEGIES.get(name)) and STRATEGIES.entry(name).summary for name in STRATEGIES)
