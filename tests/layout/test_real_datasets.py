"""Round trips on every shared dataset and on synthetic OGB-layout ones: after the id
permutation the store holds exactly what the source files say, with the known statistics."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

import graphstore
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout._verify import verify_store
from graphstore.layout.sources import read_source
from tests.conftest import REPO

# name -> (source path under shared/data, nodes, stored directed edges, features, classes,
#          relations, {split: items})
KNOWN = {
    "cora": ("cora_planetoid", 2708, 10556, 1433, 7, 0, {"train": 140, "valid": 500, "test": 1000}),
    "citeseer": ("citeseer_planetoid", 3327, 9104, 3703, 6, 0, {"train": 120, "valid": 500, "test": 1000}),
    "amazon_photo": ("amazon_photo/amazon-photo.zip", 7650, 238162, 745, 8, 0, None),
    "wn18rr": ("wn18rr/WN18RR.tar.gz", 40943, 86835, 0, 0, 11, {"train": 86835, "valid": 3034, "test": 3134}),
    "ogbl_ddi": ("ogbl_ddi", 4267, 2135822, 0, 0, 0, {"train": 1067911, "valid": 133489, "test": 133489}),
}


def edge_keys(src, dst, rel, n):
    key = np.asarray(src, dtype=np.int64) * n + np.asarray(dst, dtype=np.int64)
    if rel is not None:
        key = key * 64 + np.asarray(rel, dtype=np.int64)
    return key


def expected_edge_keys(graph):
    """Stored edges the rules promise: both directions if undirected, duplicates merged, self
    loops dropped except in knowledge graphs (triples as given)."""
    keys = []
    for chunk in graph.edges():
        keep = (chunk.src != chunk.dst) | (graph.num_relations > 0)
        s, d = chunk.src[keep], chunk.dst[keep]
        r = None if chunk.rel is None else chunk.rel[keep]
        keys.append(edge_keys(s, d, r, graph.num_nodes))
        if not graph.directed:
            keys.append(edge_keys(d, s, r, graph.num_nodes))
    return np.unique(np.concatenate(keys))


def check_round_trip(graph, store):
    n = graph.num_nodes
    orig = store.to_source_ids(np.arange(n))
    src = orig[store.array("edges/src")[...]]
    dst = orig[store.array("edges/dst")[...]]
    rel = store.array("edges/rel")[...] if store.manifest.has_relations else None
    got = np.sort(edge_keys(src, dst, rel, n))
    np.testing.assert_array_equal(got, expected_edge_keys(graph))
    if graph.features is not None:
        source_features = np.concatenate(list(graph.features()))
        np.testing.assert_array_equal(store.features[...], source_features[orig])
    if graph.labels is not None:
        np.testing.assert_array_equal(store.labels[...], graph.labels[orig])
    for name, ids in graph.node_splits.items():
        np.testing.assert_array_equal(np.sort(store.to_source_ids(store.read_node_split(name))), np.sort(ids))
    for name, split in graph.edge_splits.items():
        stored = store.read_edge_split(name)
        np.testing.assert_array_equal(store.to_source_ids(stored.src), split.src)
        np.testing.assert_array_equal(store.to_source_ids(stored.dst), split.dst)
        if split.rel is not None:
            np.testing.assert_array_equal(stored.rel, split.rel)
        if split.neg_dst is not None:
            np.testing.assert_array_equal(store.to_source_ids(stored.neg_dst.ravel()), split.neg_dst.ravel())


@pytest.mark.parametrize("name", list(KNOWN))
def test_shared_dataset_round_trip(name, shared_data, tmp_path):
    rel_path, nodes, edges, dim, classes, relations, splits = KNOWN[name]
    source = tmp_path / "src" / rel_path.split("/")[-1]
    source.parent.mkdir()
    original = shared_data / rel_path
    (shutil.copytree if original.is_dir() else shutil.copy)(original, source)
    m = convert(source, tmp_path / f"{name}.gs", ConvertOptions(num_partitions=8))
    store = graphstore.open(tmp_path / f"{name}.gs")
    assert (m.num_nodes, m.num_edges, m.feature_dim, m.num_classes, m.num_relations) == (
        nodes, edges, dim, classes, relations)
    assert m.directed is (relations > 0)
    # Graphs without features (knowledge graphs, ogbl-ddi) are partitioned randomly by default,
    # the others by METIS.
    assert m.partitioner["method"] == ("metis" if dim else "random") and 0 < m.partitioner["edge_cut"] < 1
    if splits is not None:
        assert m.splits == splits
    else:  # generated: 20 per class train, 30 per class valid, rest test, seeded
        assert m.splits == {"train": 20 * classes, "valid": 30 * classes, "test": nodes - 50 * classes}
        assert m.split_origin["seed"] == 0
    graph = read_source(source, work_dir=tmp_path / "reread")
    check_round_trip(graph, store)
    verify_store(tmp_path / f"{name}.gs")


def test_ddi_negatives_and_wn18rr_names(shared_data, tmp_path):
    m = convert(shared_data / "ogbl_ddi", tmp_path / "ddi.gs",
                ConvertOptions(num_partitions=4, partitioner="random"))
    store = graphstore.open(tmp_path / "ddi.gs")
    valid = store.read_edge_split("valid")
    assert len(valid.neg_src) == 101882 and len(valid.neg_dst) == 101882
    assert len(store.read_edge_split("test").neg_src) == 95599
    assert m.tasks == ["link_prediction"]
    convert(shared_data / "wn18rr" / "WN18RR.tar.gz", tmp_path / "wn.gs", ConvertOptions(num_partitions=4))
    wn = graphstore.open(tmp_path / "wn.gs")
    names = wn.array("nodes/name")
    orig = wn.to_source_ids(np.arange(5))
    graph = read_source(shared_data / "wn18rr" / "WN18RR.tar.gz", work_dir=tmp_path / "w")
    assert names[:5].tolist() == graph.node_names[orig].tolist()
    assert len(wn.manifest.relation_names) == 11


@pytest.mark.parametrize(("kind", "layout"), [("node", "csv"), ("node", "npz"), ("link", "csv"), ("link", "npz")])
def test_synthetic_ogb_round_trip(tmp_path, layout, kind):
    out = tmp_path / "syn"
    subprocess.run([sys.executable, str(REPO / "tools" / "make_synthetic.py"), "--out", str(out), "--kind", kind,
                    "--layout", layout, "--num-nodes", "3000", "--feature-dim", "16", "--seed", "4",
                    "--no-progress"], check=True, capture_output=True)
    m = convert(out, tmp_path / "s.gs", ConvertOptions(num_partitions=5, partitioner="stream"))
    store = graphstore.open(tmp_path / "s.gs")
    graph = read_source(out, work_dir=tmp_path / "w")
    check_round_trip(graph, store)
    assert m.num_nodes == 3000 and m.feature_dim == 16
    verify_store(tmp_path / "s.gs")
