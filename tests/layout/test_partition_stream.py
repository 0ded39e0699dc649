"""Tests of the ``stream`` partitioner (multilevel, memory-bounded) and of its place as the
converter's default above METIS's reach: exact balance, determinism, cut against METIS on
a graph with communities, the blocks-on-disk path, the memory setting's validation."""

from __future__ import annotations

import itertools
import logging
import threading
import os

import numpy as np
import pytest

from graphstore.errors import ConfigError
from graphstore.layout import _convert
from graphstore.layout import partition as part_mod
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout._staging import EdgeStager, StagedEdges
from graphstore.layout.partition import (
    PARTITION_MEMORY_BYTES,
    default_memory_bytes,
    partition_nodes,
)
from tests.conftest import make_graph


def stage(directory, num_nodes: int, src, dst, *, both_directions: bool = True) -> StagedEdges:
    stager = EdgeStager(str(directory), num_nodes=num_nodes, with_rel=False)
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    stager.append(src, dst, None)
    if both_directions:  # as the converter stages an undirected source
        stager.append(dst, src, None, added_reverse=True)
    return stager.finish()


def community_graph(num_nodes: int = 20_000, communities: int = 40, *, degree: int = 10,
                    locality: float = 0.75, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Equal communities scattered over the ids; each undirected edge stays inside its
    source's community with probability ``locality``, else goes anywhere."""
    rng = np.random.default_rng(seed)
    size = num_nodes // communities
    members = rng.permutation(num_nodes)
    community = np.empty(num_nodes, dtype=np.int64)
    community[members] = np.arange(num_nodes) // size
    num_edges = num_nodes * degree // 2
    src = rng.integers(0, num_nodes, num_edges)
    inside = members[community[src] * size + rng.integers(0, size, num_edges)]
    dst = np.where(rng.random(num_edges) < locality, inside, rng.integers(0, num_nodes, num_edges))
    return src, dst


def cut_fraction(labels: np.ndarray, src: np.ndarray, dst: np.ndarray) -> float:
    keep = src != dst
    return float(np.mean(labels[src[keep]] != labels[dst[keep]]))


def scratch_left(directory) -> list[str]:
    """Files next to the staged edges that are not the stager's own."""
    return sorted(set(os.listdir(directory)) - {"edges_src.i32", "edges_dst.i32", "edges_src.i64", "edges_dst.i64",
                                                "in_count.npy"})


@pytest.fixture(scope="module")
def communities(tmp_path_factory):
    src, dst = community_graph()
    return src, dst, stage(tmp_path_factory.mktemp("communities"), 20_000, src, dst)


# ------------------------------------------------------------------------ cut quality


def test_cut_within_a_stated_factor_of_metis_on_a_community_graph(communities):
    # Measured on four such graphs: stream/METIS 1.02-1.04 (METIS cuts about 0.31, random
    # 0.94). 1.15 leaves room for other METIS builds, not for a regression to LDG's 2x.
    src, dst, edges = communities
    cuts = {m: cut_fraction(np.asarray(partition_nodes(m, edges=edges, num_partitions=16, seed=1).labels),
                            src, dst) for m in ("metis", "stream", "random")}
    assert cuts["random"] > 0.9
    assert cuts["stream"] <= 1.15 * cuts["metis"], cuts


def test_coarsens_before_metis_and_reports_its_levels(communities):
    _, _, edges = communities
    info = partition_nodes("stream", edges=edges, num_partitions=16, seed=1).info
    levels = info["levels"]
    assert levels[0][0] == 20_000 and len(levels) >= 2
    # Every level smaller than the one before; METIS saw only the coarsest.
    assert all(b[0] < a[0] for a, b in itertools.pairwise(levels))
    assert info["metis"] and info["metis_nodes"] == levels[-1][0] < 20_000 // 4
    assert info["refinement_moves"] and info["threads"] >= 1


# ---------------------------------------------------------------- balance, determinism


@pytest.mark.parametrize(("num_nodes", "num_partitions"),
                         [(10, 6), (997, 7), (3000, 64), (3000, 1), (5000, 5000), (4096, 16)])
def test_labels_are_exactly_the_equal_blocks(tmp_path, num_nodes, num_partitions):
    # N=10, p=6 has an empty last block (2, 2, 2, 2, 2, 0); p=N gives one node each.
    rng = np.random.default_rng(num_nodes)
    src, dst = rng.integers(0, num_nodes, 4 * num_nodes), rng.integers(0, num_nodes, 4 * num_nodes)
    edges = stage(tmp_path, num_nodes, src, dst)
    labels = partition_nodes("stream", edges=edges, num_partitions=num_partitions, seed=0).labels
    assert labels.dtype == np.int64 and labels.shape == (num_nodes,)
    np.testing.assert_array_equal(np.bincount(labels, minlength=num_partitions),
                                  part_mod._block_sizes(num_nodes, num_partitions))


def test_deterministic_for_a_seed_whatever_the_threads_and_chunks(communities, monkeypatch):
    _, _, edges = communities
    base = partition_nodes("stream", edges=edges, num_partitions=16, seed=3).labels
    monkeypatch.setattr(part_mod, "_stream_threads", lambda: 1)
    np.testing.assert_array_equal(
        partition_nodes("stream", edges=edges, num_partitions=16, seed=3, chunk_edges=12_345).labels, base)
    monkeypatch.setattr(part_mod, "_stream_threads", lambda: 3)
    np.testing.assert_array_equal(
        partition_nodes("stream", edges=edges, num_partitions=16, seed=3).labels, base)
    other = partition_nodes("stream", edges=edges, num_partitions=16, seed=4).labels
    assert (other != base).mean() > 0.01


def test_blocks_on_disk_give_valid_labels_and_leave_no_scratch(tmp_path, monkeypatch):
    # A budget just above the node state: the graph no longer fits in memory at once, so
    # every level goes through row-block files next to the staged edges.
    num_nodes = 20_000
    src, dst = community_graph(num_nodes, seed=5)
    edges = stage(tmp_path, num_nodes, src, dst)
    monkeypatch.setattr(part_mod, "_STREAM_MIN_BLOCK_BYTES", 4 << 20)  # a budget the input level outgrows
    budget = part_mod._STREAM_NODE_BYTES * num_nodes + part_mod._STREAM_MIN_BLOCK_BYTES
    monkeypatch.setattr(part_mod, "_STREAM_BLOCK_ENTRIES", 20_000)  # small blocks: many of them
    result = partition_nodes("stream", edges=edges, num_partitions=16, seed=0,
                             partition_memory_bytes=budget)
    monkeypatch.undo()
    assert result.info["blocks"] > 8
    np.testing.assert_array_equal(np.bincount(result.labels, minlength=16),
                                  part_mod._block_sizes(num_nodes, 16))
    in_memory = partition_nodes("stream", edges=edges, num_partitions=16, seed=0)
    assert in_memory.info["blocks"] == 1
    assert cut_fraction(result.labels, src, dst) <= 1.1 * cut_fraction(in_memory.labels, src, dst)
    assert scratch_left(tmp_path) == []


def test_without_metis_room_it_still_balances_and_says_so(communities, monkeypatch, caplog):
    src, dst, edges = communities
    monkeypatch.setattr(part_mod, "_STREAM_METIS_BYTES", 10**12)
    with caplog.at_level(logging.WARNING, logger=part_mod.__name__):
        result = partition_nodes("stream", edges=edges, num_partitions=16, seed=0)
    assert not result.info["metis"]
    assert "too large for METIS" in caplog.text
    np.testing.assert_array_equal(np.bincount(result.labels, minlength=16),
                                  part_mod._block_sizes(20_000, 16))
    assert cut_fraction(result.labels, src, dst) < 0.9  # refinement still found structure


def test_directed_input_and_no_edges(tmp_path):
    # Directed edges are used in both directions; a graph without edges still balances.
    edges = stage(tmp_path / "d", 50, np.arange(49), np.arange(1, 50), both_directions=False)
    labels = partition_nodes("stream", edges=edges, num_partitions=5, seed=0).labels
    assert cut_fraction(labels, np.arange(49), np.arange(1, 50)) <= 0.2  # a path: few cuts
    empty = stage(tmp_path / "e", 30, [], [])
    labels = partition_nodes("stream", edges=empty, num_partitions=4, seed=0).labels
    np.testing.assert_array_equal(np.bincount(labels, minlength=4), [8, 8, 8, 6])


# ------------------------------------------------------------------ the memory setting


@pytest.mark.parametrize("value", [0, -1, 1.5, "1GiB", True])
def test_bad_memory_values_are_one_line_config_errors(tmp_path, value):
    edges = stage(tmp_path, 4, [0, 1], [1, 2])
    with pytest.raises(ConfigError, match=r"^partition_memory_bytes \(--partition-memory\) must be a "
                                          r"positive int") as info:
        partition_nodes("stream", edges=edges, num_partitions=2, seed=0, partition_memory_bytes=value)
    assert "\n" not in str(info.value)


def test_a_budget_below_the_node_state_names_the_minimum(tmp_path):
    edges = stage(tmp_path, 1000, [0, 1], [1, 2])
    need = part_mod._STREAM_NODE_BYTES * 1000 + part_mod._STREAM_MIN_BLOCK_BYTES
    with pytest.raises(ConfigError, match=rf"must be at least {need} .* on 1000 nodes \(got {need - 1}\)"):
        partition_nodes("stream", edges=edges, num_partitions=2, seed=0, partition_memory_bytes=need - 1)
    # Exactly the minimum works; the other partitioners ignore the setting.
    partition_nodes("stream", edges=edges, num_partitions=2, seed=0, partition_memory_bytes=need)
    partition_nodes("random", edges=edges, num_partitions=2, seed=0, partition_memory_bytes=1)


def test_default_budget_grows_with_the_nodes_only_past_one_gib():
    assert default_memory_bytes(1_000_000) == PARTITION_MEMORY_BYTES == 1 << 30
    big = 100_000_000
    assert default_memory_bytes(big) == part_mod._STREAM_NODE_BYTES * big + (256 << 20)


def test_peak_memory_follows_the_budget(tmp_path, monkeypatch):
    # The blocks are what the budget sizes: a tight budget keeps the peak allocation
    # (tracemalloc sees numpy's buffers) well under a loose one's.
    import tracemalloc

    num_nodes = 20_000
    src, dst = community_graph(num_nodes, seed=2)
    edges = stage(tmp_path, num_nodes, src, dst)
    monkeypatch.setattr(part_mod, "_STREAM_MIN_BLOCK_BYTES", 4 << 20)  # a budget the input level outgrows
    peaks = {}
    for budget in (part_mod._STREAM_NODE_BYTES * num_nodes + (4 << 20), 1 << 30):
        tracemalloc.start()
        partition_nodes("stream", edges=edges, num_partitions=16, seed=0, partition_memory_bytes=budget)
        peaks[budget] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    tight, loose = sorted(peaks)
    assert peaks[tight] <= tight
    assert peaks[tight] < peaks[loose]


# ----------------------------------------------------------------- convert's default


@pytest.mark.parametrize(("threshold", "expected"), [(0, "stream"), (10**12, "metis")])
def test_convert_default_is_stream_above_metis_reach(tmp_path, monkeypatch, threshold, expected):
    monkeypatch.setattr(_convert, "METIS_AUTO_MAX_EDGES", threshold)
    graph, _ = make_graph(num_nodes=400, num_edges=2000)
    manifest = convert(graph, tmp_path / "g.gs", ConvertOptions(num_partitions=4))
    assert manifest.partitioner["method"] == expected
    assert manifest.partitioner["requested"] == "auto"


@pytest.mark.parametrize(("memory", "expected"), [("1MiB", "stream"), ("8GiB", "metis")])
def test_convert_default_is_stream_where_metis_would_not_fit_in_memory(tmp_path, monkeypatch, memory, expected):
    """METIS holds the whole graph (about METIS_BYTES_PER_EDGE a staged edge): under the
    edge threshold, the default still takes stream where that would not fit the memory the
    process may use (GRAPHSTORE_MEMORY_BYTES stands in for a cgroup cap), and says why."""
    monkeypatch.setenv("GRAPHSTORE_MEMORY_BYTES", memory)
    graph, _ = make_graph(num_nodes=400, num_edges=20000)
    manifest = convert(graph, tmp_path / "g.gs", ConvertOptions(num_partitions=4))
    assert manifest.partitioner["method"] == expected
    assert "GRAPHSTORE_MEMORY_BYTES" in manifest.partitioner["method_rule"]


def test_convert_passes_the_budget_and_rejects_bad_ones(tmp_path, monkeypatch):
    graph, _ = make_graph(num_nodes=400, num_edges=2000)
    manifest = convert(graph, tmp_path / "g.gs", ConvertOptions(
        num_partitions=4, partitioner="stream", partition_memory_bytes=64 << 20))
    assert manifest.partitioner["info"]["memory_bytes"] == 64 << 20
    graph, _ = make_graph(num_nodes=400, num_edges=2000)
    with pytest.raises(ConfigError, match="partition_memory_bytes"):
        convert(graph, tmp_path / "h.gs", ConvertOptions(num_partitions=4, partitioner="stream",
                                                         partition_memory_bytes=-5))
    assert not (tmp_path / "h.gs").exists()


def test_cli_flag_reaches_the_partitioner(tmp_path, capsys):
    import graphstore
    from graphstore.cli import main

    edgelist = tmp_path / "edges.txt"
    src, dst = community_graph(2_000, 10, seed=1)
    edgelist.write_text("".join(f"{a} {b}\n" for a, b in zip(src.tolist(), dst.tolist(), strict=True)))
    out = tmp_path / "g.gs"
    assert main(["convert", str(edgelist), str(out), "--partitioner", "stream", "--partitions", "4",
                 "--partition-memory", "48MiB"]) == 0
    assert graphstore.open(out).manifest.partitioner["info"]["memory_bytes"] == 48 << 20
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", str(edgelist), str(tmp_path / "x.gs"), "--partition-memory", "0"])
    assert exit_info.value.code == 2
    assert "--partition-memory" in capsys.readouterr().err


def test_listed_ranges_are_the_rows_not_marked_as_added_reverses():
    # The stream partitioner reads only the rows the source listed (`listed_ranges`); they
    # must be exactly the complement of `added_reverse` over any window.
    rng = np.random.default_rng(0)
    for _ in range(2000):
        n = int(rng.integers(1, 60))
        cuts = np.sort(rng.choice(n + 1, size=2 * int(rng.integers(0, 5)), replace=False)) if n > 8 else None
        runs = None if cuts is None or cuts.size == 0 else cuts.reshape(-1, 2)
        edges = StagedEdges("s", "d", None, n, 5, reverse_runs=runs)
        start = int(rng.integers(0, n))
        count = int(rng.integers(0, n - start + 1))
        added = edges.added_reverse(start, count)
        got = np.zeros(count, dtype=bool)
        for lo, hi in edges.listed_ranges(start, count):
            assert 0 <= lo < hi <= count
            got[lo:hi] = True
        np.testing.assert_array_equal(got, np.ones(count, bool) if added is None else ~added)


def test_a_failed_scratch_write_reaches_the_caller_and_stops_the_writer(tmp_path, monkeypatch):
    # Block files are written on the level builder's own thread: its error must surface
    # in the caller, and the thread be joined, before the scratch directory is removed.
    num_nodes = 20_000
    src, dst = community_graph(num_nodes, seed=5)
    edges = stage(tmp_path, num_nodes, src, dst)
    monkeypatch.setattr(part_mod, "_STREAM_MIN_BLOCK_BYTES", 4 << 20)
    budget = part_mod._STREAM_NODE_BYTES * num_nodes + part_mod._STREAM_MIN_BLOCK_BYTES
    writes = []
    real_append = part_mod._LevelBuilder._append

    def failing_append(self, path, array, b):
        writes.append(path)
        if len(writes) == 5:
            raise OSError(28, "No space left on device", path)
        return real_append(self, path, array, b)

    monkeypatch.setattr(part_mod._LevelBuilder, "_append", failing_append)
    with pytest.raises(OSError, match="No space left"):
        partition_nodes("stream", edges=edges, num_partitions=16, seed=0, chunk_edges=5_000,
                        partition_memory_bytes=budget)
    assert len(writes) >= 5
    assert not [t for t in threading.enumerate() if t.name.startswith("stream-write")]
    assert scratch_left(tmp_path) == []


@pytest.mark.parametrize("compiled", [True, False])
def test_a_weighted_level_with_empty_blocks_keeps_their_weights(tmp_path, monkeypatch, compiled):
    # A coarse level whose entries all fall in a few row blocks: every block, empty ones
    # too, must come back with its (float64) weights, as the passes read them.
    monkeypatch.setattr(part_mod, "_USE_COMPILED", compiled)
    builder = part_mod._LevelBuilder(1_000, 400_000, 1 << 16, str(tmp_path), "w", weighted=True)
    assert not builder.in_memory and len(builder.bounds) - 1 > 3
    rows = np.array([0, 0, 1, 999], dtype=np.int32)  # the first and last blocks only
    cols = np.array([5, 5, 7, 1], dtype=np.int32)
    weights = np.array([1.0, 2.0, 4.0, 8.0])
    builder.add(rows, cols, weights)
    level = builder.finish(np.ones(1_000, dtype=np.int64), part_mod._Workers(1))
    for b in range(len(level.blocks)):
        indptr, indices, data = level.block(b)
        assert data is not None and data.dtype == np.float64 and data.shape == indices.shape
        inside = (rows >= level.bounds[b]) & (rows < level.bounds[b + 1])
        assert data.sum() == weights[inside].sum(), b
    assert sum(level.block(b)[1].shape[0] == 0 for b in range(len(level.blocks))) >= 2  # empty blocks
    level.drop()
