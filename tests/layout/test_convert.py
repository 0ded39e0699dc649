"""Conversion: round trips, partition layout, flags and counts, atomicity, converter-level
bad input. Sources here are hand-made `SourceGraph`s (see conftest.make_graph)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import graphstore
from graphstore.errors import ConfigError, SourceError, StoreExistsError, StoreNotFoundError
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout._verify import verify_store
from graphstore.layout.sources.base import EdgeChunk
from tests.conftest import REPO, make_graph


def expected_edges(raw, *, directed, keep_self_loops=False, keep_duplicates=False):
    """The stored edge multiset the rules promise, as a sorted list of tuples (source ids)."""
    src, dst = raw["src"], raw["dst"]
    rel = raw.get("rel")
    rows = []
    for k in range(len(src)):
        s, d = int(src[k]), int(dst[k])
        r = () if rel is None else (int(rel[k]),)
        if s == d and not keep_self_loops:
            continue
        rows.append((s, d, *r))
        if not directed and s != d:
            rows.append((d, s, *r))
    if not keep_duplicates:
        rows = set(rows)
    return sorted(rows)


def stored_edges(store):
    orig = store.to_source_ids(np.arange(store.num_nodes))
    src = orig[store.array("edges/src")[...]]
    dst = orig[store.array("edges/dst")[...]]
    cols = [src, dst]
    if store.manifest.has_relations:
        cols.append(store.array("edges/rel")[...])
    return sorted(zip(*[c.tolist() for c in cols]))


@pytest.mark.parametrize("partitioner", ["metis", "random", "sequential", "stream"])
@pytest.mark.parametrize("directed", [False, True])
def test_round_trip_every_partitioner(tmp_path, partitioner, directed):
    graph, raw = make_graph(directed=directed)
    manifest = convert(graph, tmp_path / "g.gs", ConvertOptions(num_partitions=6, partitioner=partitioner))
    store = graphstore.open(tmp_path / "g.gs")
    n = graph.num_nodes
    orig = store.to_source_ids(np.arange(n))
    assert sorted(orig.tolist()) == list(range(n))
    np.testing.assert_array_equal(store.to_store_ids(orig), np.arange(n))
    np.testing.assert_array_equal(store.features[...], raw["features"][orig])
    np.testing.assert_array_equal(store.labels[...], raw["labels"][orig])
    assert stored_edges(store) == expected_edges(raw, directed=directed)
    for name, ids in graph.node_splits.items():
        np.testing.assert_array_equal(store.read_node_split(name), np.sort(store.to_store_ids(ids)))
    # Partition-contiguous, inside a partition in ascending source id.
    size = store.partition_size
    assert size == -(-n // 6) and manifest.num_partitions == 6
    for k in range(6):
        start, stop = store.partition_range(k)
        assert (np.diff(orig[start:stop]) > 0).all()
        np.testing.assert_array_equal(store.read_features(k), raw["features"][orig[start:stop]])
    assert manifest.partitioner["method"] == partitioner
    assert manifest.conversion["self_loops_dropped"] == int((raw["src"] == raw["dst"]).sum()) >= 5
    verify_store(tmp_path / "g.gs")


def test_degrees_and_buckets_match_the_edges(tmp_path):
    graph, raw = make_graph(num_nodes=200, num_edges=2000)
    convert(graph, tmp_path / "g.gs", ConvertOptions(num_partitions=5, partitioner="random", seed=3))
    store = graphstore.open(tmp_path / "g.gs")
    src, dst = store.array("edges/src")[...], store.array("edges/dst")[...]
    np.testing.assert_array_equal(store.read_degree("in"), np.bincount(dst, minlength=200))
    np.testing.assert_array_equal(store.read_degree("out"), np.bincount(src, minlength=200))
    size = store.partition_size
    total = 0
    for i in range(5):
        for j in range(5):
            bs, bd, rel = store.read_bucket(i, j)
            assert rel is None
            mask = (src // size == i) & (dst // size == j)
            assert sorted(zip(bs.tolist(), bd.tolist())) == sorted(zip(src[mask].tolist(), dst[mask].tolist()))
            assert list(zip(bd.tolist(), bs.tolist())) == sorted(zip(bd.tolist(), bs.tolist()))
            total += len(bs)
    assert total == store.num_edges
    cut = int(((src // size) != (dst // size)).sum())
    assert store.manifest.partitioner["cut_edges"] == cut
    assert store.manifest.partitioner["edge_cut"] == pytest.approx(cut / store.num_edges)


def test_flags_keep_self_loops_and_duplicates(tmp_path):
    graph, raw = make_graph(directed=True)
    m = convert(graph, tmp_path / "k.gs", ConvertOptions(num_partitions=3, keep_self_loops=True,
                                                         keep_duplicates=True, partitioner="random"))
    store = graphstore.open(tmp_path / "k.gs")
    assert stored_edges(store) == expected_edges(raw, directed=True, keep_self_loops=True, keep_duplicates=True)
    assert m.num_edges == len(raw["src"])
    assert m.conversion["self_loops"] == int((raw["src"] == raw["dst"]).sum()) and m.conversion["self_loops_dropped"] == 0
    assert m.conversion["duplicates_merged"] == 0
    m2 = convert(graph, tmp_path / "d.gs", ConvertOptions(num_partitions=3, partitioner="random"))
    # The fixture repeats 7 edges; a random graph may repeat a few more by chance.
    merged = len(raw["src"]) - m2.conversion["self_loops"] - m2.num_edges
    assert m2.conversion["duplicates_merged"] == merged >= 7
    verify_store(tmp_path / "k.gs")


def test_relations_are_kept_and_distinguish_duplicates(tmp_path):
    graph, raw = make_graph(directed=True, num_relations=4, feature_dim=0)
    m = convert(graph, tmp_path / "r.gs", ConvertOptions(num_partitions=4, partitioner="stream"))
    store = graphstore.open(tmp_path / "r.gs")
    assert store.num_relations == 4 and store.features is None and store.feature_dim == 0
    # Knowledge-graph triples are stored as given: self loops stay unless asked otherwise.
    assert stored_edges(store) == expected_edges(raw, directed=True, keep_self_loops=True)
    assert m.conversion["self_loops_dropped"] == 0 and m.conversion["self_loops"] >= 5
    convert(graph, tmp_path / "d.gs", ConvertOptions(num_partitions=4, keep_self_loops=False))
    assert stored_edges(graphstore.open(tmp_path / "d.gs")) == expected_edges(raw, directed=True)
    for j in range(4):
        _, bd, rel = store.read_bucket(1, j)
        assert rel is not None and len(rel) == len(bd)
    verify_store(tmp_path / "r.gs")


def expected_counts(raw, *, directed, keep_self_loops=False, keep_duplicates=False):
    """The conversion counts the rules promise, from the source rows alone (sets, no sort)."""
    cols = [raw["src"], raw["dst"]] + ([raw["rel"]] if "rel" in raw else [])
    rows = [row for row in zip(*[c.tolist() for c in cols]) if keep_self_loops or row[0] != row[1]]
    given = set(rows)
    reverses = [] if directed else [(d, s, *r) for s, d, *r in rows if s != d]
    present = sum((d, s, *r) in given for s, d, *r in given if s != d) if not directed else 0
    return {
        "duplicates": len(rows) - len(given),
        "duplicates_merged": 0 if keep_duplicates else len(rows) - len(given),
        "reverse_edges_present": present,
        "reverse_edges_added": len(reverses) if keep_duplicates else len(set(reverses) - given),
    }


def counts_of(manifest):
    return {k: manifest.conversion[k] for k in
            ("duplicates", "duplicates_merged", "reverse_edges_present", "reverse_edges_added")}


def test_a_symmetric_source_counts_its_duplicates_not_its_reverse_edges(tmp_path):
    """An edge list that lists every edge both ways (issue 31, 7): the reverse edges the
    converter adds and merges are not duplicates; only rows the source repeats are."""
    rng = np.random.default_rng(7)
    pairs = set()
    while len(pairs) < 60:
        u, v = sorted(rng.choice(40, 2, replace=False).tolist())
        pairs.add((u, v))
    both_ways = [(u, v) for u, v in sorted(pairs)] + [(v, u) for u, v in sorted(pairs)]  # 120 rows
    repeats = [both_ways[3], both_ways[70], both_ways[70], both_ways[100]]  # 4 true duplicates
    one_way = [(41, 42), (41, 42)]  # listed one way, twice: its reverse is added, once
    rows = both_ways + repeats + one_way + [(5, 5)]  # and a self loop, dropped
    rows = [rows[k] for k in rng.permutation(len(rows))]
    (tmp_path / "sym").mkdir()
    np.savetxt(tmp_path / "sym" / "edges.txt", np.array(rows), fmt="%d")
    np.save(tmp_path / "sym" / "labels.npy", np.arange(43) % 3)  # a node task: no edge held out
    raw = {"src": np.array(rows)[:, 0], "dst": np.array(rows)[:, 1]}

    m = convert(tmp_path / "sym", tmp_path / "u.gs", ConvertOptions(num_partitions=3, partitioner="random"))
    assert counts_of(m) == {"duplicates": 5, "duplicates_merged": 5, "reverse_edges_present": 120,
                            "reverse_edges_added": 1} == expected_counts(raw, directed=False)
    assert m.num_edges == 122 and m.conversion["staged_edges"] == 126 + 126
    assert stored_edges(graphstore.open(tmp_path / "u.gs")) == expected_edges(raw, directed=False)

    # Directed: nothing is added, so every merge is a repeated row, as before.
    m = convert(tmp_path / "sym", tmp_path / "d.gs", ConvertOptions(num_partitions=3, partitioner="random",
                                                                    reader_options={"directed": True}))
    assert counts_of(m) == {"duplicates": 5, "duplicates_merged": 5, "reverse_edges_present": 0,
                            "reverse_edges_added": 0} == expected_counts(raw, directed=True)
    assert m.num_edges == 121 == m.conversion["staged_edges"] - m.conversion["duplicates_merged"]

    # Kept duplicates: the counts still say what the source repeats and what it listed
    # both ways (each of those 120 edges is now stored twice).
    m = convert(tmp_path / "sym", tmp_path / "k.gs", ConvertOptions(num_partitions=3, partitioner="random",
                                                                    keep_duplicates=True))
    assert counts_of(m) == {"duplicates": 5, "duplicates_merged": 0, "reverse_edges_present": 120,
                            "reverse_edges_added": 126}
    assert counts_of(m) == expected_counts(raw, directed=False, keep_duplicates=True)
    assert m.num_edges == m.conversion["staged_edges"] == 252


@pytest.mark.parametrize(("directed", "num_relations", "keep_duplicates"),
                         [(False, 0, False), (False, 0, True), (True, 0, False), (False, 3, False),
                          (False, 3, True)])
def test_merge_counts_add_up_on_both_sort_paths(tmp_path, directed, num_relations, keep_duplicates):
    """Half reversed copies, half repeats, on the packed-key sort and (with relations) the
    lexsort: the counts match a count of the source rows, and the stored edges add up."""
    graph, raw = make_graph(num_nodes=120, num_edges=1200, directed=directed, num_relations=num_relations,
                            feature_dim=0 if num_relations else 3, edge_chunk=97, duplicates=20)
    flip = np.arange(4, 1160, 4)
    # Every fourth row the reverse of the row before it (the graph streams these arrays).
    raw["src"][flip], raw["dst"][flip] = raw["dst"][flip - 1], raw["src"][flip - 1]
    if num_relations:
        raw["rel"][flip] = raw["rel"][flip - 1]
    options = ConvertOptions(num_partitions=4, partitioner="random", chunk_edges=500, keep_self_loops=False,
                             keep_duplicates=keep_duplicates)
    m = convert(graph, tmp_path / "g.gs", options)
    expected = expected_counts(raw, directed=directed, keep_duplicates=keep_duplicates)
    assert counts_of(m) == expected
    assert expected["duplicates"] >= 20 and (directed or expected["reverse_edges_present"] >= 2 * 250)
    c = m.conversion
    assert m.num_edges == (c["source_edges"] - c["self_loops_dropped"] - c["duplicates_merged"]
                           + c["reverse_edges_added"])
    store = graphstore.open(tmp_path / "g.gs")
    assert stored_edges(store) == expected_edges(raw, directed=directed, keep_duplicates=keep_duplicates)


def test_small_streaming_chunks_give_the_same_store(tmp_path):
    graph, _ = make_graph(num_nodes=500, num_edges=4000, edge_chunk=37, feature_chunk=11)
    convert(graph, tmp_path / "a.gs", ConvertOptions(num_partitions=4, partitioner="random", chunk_edges=53))
    convert(graph, tmp_path / "b.gs", ConvertOptions(num_partitions=4, partitioner="random"))
    a, b = graphstore.open(tmp_path / "a.gs"), graphstore.open(tmp_path / "b.gs")
    for name in ["edges/src", "edges/dst", "edges/bucket_offsets", "nodes/orig_id", "nodes/features"]:
        np.testing.assert_array_equal(a.array(name)[...], b.array(name)[...])


def test_feature_chunks_never_straddle_partitions(tmp_path):
    # 3000 x 1000 float32 = 12 MB in 2 partitions: 6 MB each, under the 8 MiB limit;
    # with 1 partition the 12 MB must be split into equal slices.
    graph, _ = make_graph(num_nodes=3000, num_edges=3000, feature_dim=1000, feature_chunk=512)
    for p in (1, 2, 7):
        m = convert(graph, tmp_path / f"c{p}.gs", ConvertOptions(num_partitions=p, partitioner="sequential"))
        rows = m.chunks["node_rows"]
        size = m.partition_size
        assert size % rows == 0 or rows % size == 0
        assert rows * 1000 * 4 <= 8 << 20
        verify_store(tmp_path / f"c{p}.gs")


def test_default_partition_count_follows_partition_bytes(tmp_path):
    graph, _ = make_graph(num_nodes=2000, num_edges=4000, feature_dim=64)
    m = convert(graph, tmp_path / "d.gs", ConvertOptions(partition_bytes=64 << 10, partitioner="random"))
    total = 2000 * 64 * 4 + m.conversion["staged_edges"] * 2 * 4
    assert m.num_partitions == -(-total // (64 << 10))
    assert "partition-bytes" in m.partitioner["num_partitions_rule"]


def test_default_partitions_hold_neighbourhoods_on_small_wide_graphs(tmp_path):
    """Wide rows would make the byte rule cut a small graph into tiny partitions; the
    default keeps at least MIN_PARTITION_NODES nodes a partition (a graph below it is one
    partition)."""
    from graphstore.layout._convert import DEFAULT_PARTITION_BYTES, MIN_PARTITION_NODES

    n = 3 * MIN_PARTITION_NODES + 100
    graph, _ = make_graph(num_nodes=n, num_edges=4 * n, feature_dim=1024)
    assert n * 1024 * 4 > 10 * DEFAULT_PARTITION_BYTES  # the byte rule alone asks for 10+ partitions
    m = convert(graph, tmp_path / "wide.gs", ConvertOptions(partitioner="random"))
    assert m.num_partitions == 3 and m.partition_size >= MIN_PARTITION_NODES
    assert f"at least {MIN_PARTITION_NODES} nodes" in m.partitioner["num_partitions_rule"]
    tiny, _ = make_graph(num_nodes=500, num_edges=2000, feature_dim=2048)
    assert convert(tiny, tmp_path / "tiny.gs", ConvertOptions(partitioner="random")).num_partitions == 1


def test_default_partitions_of_a_large_narrow_graph_follow_the_bytes(tmp_path):
    """Where partitions of DEFAULT_PARTITION_BYTES already hold more nodes than the floor,
    the byte rule decides alone."""
    from graphstore.layout._convert import DEFAULT_PARTITION_BYTES, MIN_PARTITION_NODES

    n = 60_000
    graph, _ = make_graph(num_nodes=n, num_edges=8 * n, feature_dim=64, edge_chunk=50_000, feature_chunk=20_000)
    m = convert(graph, tmp_path / "narrow.gs", ConvertOptions(partitioner="random"))
    total = n * 64 * 4 + m.conversion["staged_edges"] * 2 * 4
    assert m.num_partitions == -(-total // DEFAULT_PARTITION_BYTES) > 1
    assert m.partition_size > MIN_PARTITION_NODES


def test_a_knowledge_graph_is_partitioned_randomly_by_default(tmp_path):
    """Sources without features (a knowledge graph, ogbl-ddi) default to random partitions
    (the rule is recorded); --partitioner still decides, and sources with features keep
    METIS."""
    root = tmp_path / "kg"
    root.mkdir()
    rng = np.random.default_rng(0)
    for name, count in (("train", 600), ("valid", 40), ("test", 40)):
        lines = [f"e{h}\tr{r}\te{t}" for h, r, t in zip(rng.integers(0, 200, count), rng.integers(0, 3, count),
                                                          rng.integers(0, 200, count))]
        (root / f"{name}.txt").write_text("\n".join(lines) + "\n")
    m = graphstore.convert(root, tmp_path / "kg.gs", num_partitions=4)
    assert m.partitioner["method"] == "random" and "without features" in m.partitioner["method_rule"]
    m = graphstore.convert(root, tmp_path / "kg_metis.gs", num_partitions=4, partitioner="metis")
    assert m.partitioner["method"] == "metis" and m.partitioner["method_rule"] == "--partitioner"
    graph, _ = make_graph(num_nodes=300, num_edges=1500)
    assert convert(graph, tmp_path / "g.gs", ConvertOptions(num_partitions=3)).partitioner["method"] == "metis"
    featureless, _ = make_graph(num_nodes=300, num_edges=1500, feature_dim=0)  # as ogbl-ddi
    assert featureless.features is None
    m = convert(featureless, tmp_path / "plain.gs", ConvertOptions(num_partitions=3))
    assert m.partitioner["method"] == "random" and "without features" in m.partitioner["method_rule"]


# ------------------------------------------------------------------------- atomicity


def test_failure_part_way_leaves_nothing_and_rerun_works(tmp_path):
    graph, _ = make_graph()

    def broken_features():
        yield np.zeros((70, 3), dtype=np.float32)
        raise OSError("disk went away")

    broken = dataclasses.replace(graph, features=broken_features)
    out = tmp_path / "out.gs"
    with pytest.raises(OSError, match="disk went away"):
        convert(broken, out, ConvertOptions(num_partitions=2))
    assert not out.exists()
    assert os.listdir(tmp_path) == []  # no temporary directory left either
    convert(graph, out, ConvertOptions(num_partitions=2))
    verify_store(out)


def test_existing_output_is_untouched_without_overwrite(tmp_path):
    graph, raw = make_graph()
    out = tmp_path / "out.gs"
    convert(graph, out, ConvertOptions(num_partitions=2, partitioner="random", seed=1))
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    with pytest.raises(StoreExistsError, match="--overwrite"):
        convert(graph, out, ConvertOptions(num_partitions=3))
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    # Overwrite replaces it only once the new store is complete.
    convert(graph, out, ConvertOptions(num_partitions=3, overwrite=True))
    assert graphstore.open(out).num_partitions == 3
    assert [p.name for p in tmp_path.iterdir()] == ["out.gs"]


KILL_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    sys.path.insert(0, {repo!r})
    from tests.conftest import make_graph
    import dataclasses
    from graphstore.layout._convert import ConvertOptions, convert
    graph, _ = make_graph()
    def slow_features():
        yield np.zeros((70, 3), dtype=np.float32)
        print("started", flush=True)
        time.sleep(60)
    convert(dataclasses.replace(graph, features=slow_features), {out!r}, ConvertOptions(num_partitions=2))
    """
)


def test_kill_part_way_leaves_no_valid_store_and_rerun_cleans_up(tmp_path):
    out = tmp_path / "out.gs"
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT.format(repo=str(REPO), out=str(out))],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".out.gs.tmp-")]
        assert len(leftovers) == 1
        with pytest.raises(StoreNotFoundError, match="no graphstore manifest"):
            graphstore.open(leftovers[0])  # the half-written directory is not a store
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert not out.exists()
    with pytest.raises(StoreNotFoundError):
        graphstore.open(out)
    graph, _ = make_graph()
    convert(graph, out, ConvertOptions(num_partitions=2))
    verify_store(out)
    assert [p.name for p in tmp_path.iterdir()] == ["out.gs"]  # the dead run's temporary went


# ------------------------------------------------------------------------- bad input


def bad(graph, tmp_path, match, **options):
    with pytest.raises(SourceError, match=match) as info:
        convert(graph, tmp_path / "bad.gs", ConvertOptions(num_partitions=2, **options))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "bad.gs").exists()
    return str(info.value)


def test_edge_id_out_of_range_names_file_and_line(tmp_path):
    graph, raw = make_graph(num_nodes=50, num_edges=100, edge_chunk=30)
    src = raw["src"].copy()
    src[42] = 50

    def edges():
        yield EdgeChunk(src[:30], raw["dst"][:30])
        yield EdgeChunk(src[30:], raw["dst"][30:])

    msg = bad(dataclasses.replace(graph, edges=edges), tmp_path, "out of range")
    assert msg.startswith("memory:edges line 43: source node id 50 out of range [0, 50)")


def test_non_finite_feature_is_named(tmp_path):
    graph, raw = make_graph(num_nodes=50, num_edges=100)
    feats = raw["features"].copy()
    feats[33, 2] = np.nan
    msg = bad(dataclasses.replace(graph, features=lambda: iter([feats])), tmp_path, "non-finite")
    assert msg == "memory:features row 33: non-finite value nan in column 2"


@pytest.mark.parametrize("rows", [49, 51])
def test_feature_row_count_must_match(tmp_path, rows):
    graph, _ = make_graph(num_nodes=50, num_edges=100)
    feats = np.ones((rows, 3), dtype=np.float32)
    bad(dataclasses.replace(graph, features=lambda: iter([feats])), tmp_path, "one per node")


def test_labels_of_wrong_length_or_range(tmp_path):
    graph, raw = make_graph(num_nodes=50, num_edges=100)
    bad(dataclasses.replace(graph, labels=raw["labels"][:-1]), tmp_path, r"shape \(49,\), expected \(50,\)")
    labels = raw["labels"].copy()
    labels[7] = 9
    bad(dataclasses.replace(graph, labels=labels), tmp_path, "label 9 of node 7 is outside")


def test_empty_graphs_are_refused(tmp_path):
    graph, _ = make_graph(num_nodes=50, num_edges=100)
    bad(dataclasses.replace(graph, edges=lambda: iter([])), tmp_path, "has no edges")
    loops = np.arange(10)
    bad(dataclasses.replace(graph, edges=lambda: iter([EdgeChunk(loops, loops)])), tmp_path,
        "no edges after dropping 10 self loops")
    bad(dataclasses.replace(graph, num_nodes=0), tmp_path, "no nodes")


def test_split_with_unknown_node(tmp_path):
    graph, _ = make_graph(num_nodes=50, num_edges=100)
    graph = dataclasses.replace(graph, node_splits={"train": np.array([1, 2, 77])},
                                files={**graph.files, "split:train": "split/x/train.csv.gz"})
    msg = bad(graph, tmp_path, "unknown node")
    assert msg.startswith("split/x/train.csv.gz: node id 77 at position 2 is outside [0, 50)")


def test_too_many_partitions(tmp_path):
    graph, _ = make_graph(num_nodes=50, num_edges=100)
    with pytest.raises(ConfigError, match=r"--partitions must be in \[1, 50\]"):
        convert(graph, tmp_path / "x.gs", ConvertOptions(num_partitions=51))
    with pytest.raises(ConfigError, match="known"):
        convert(graph, tmp_path / "x.gs", ConvertOptions(num_partitions=2, partitioner="louvain"))
    assert os.listdir(tmp_path) == []


def test_conversion_time_is_recorded(tmp_path):
    graph, _ = make_graph()
    start = time.perf_counter()
    m = convert(graph, tmp_path / "t.gs", ConvertOptions(num_partitions=2))
    phases = m.conversion["seconds"]
    assert set(phases) >= {"stage edges", "partition", "write features", "write edges"}
    assert 0 <= sum(phases.values()) <= time.perf_counter() - start
