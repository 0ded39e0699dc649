"""`graphstore.open`: what it exposes, and what it refuses (with a message naming why)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import zarr

import graphstore
from graphstore.errors import ConfigError, StoreError, StoreNotFoundError, StoreVersionError
from graphstore.layout._arrays import new_array
from graphstore.layout._convert import ConvertOptions, convert
from tests.conftest import make_graph


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    graph, _ = make_graph(num_nodes=120, num_edges=600)
    path = tmp_path_factory.mktemp("s") / "g.gs"
    convert(graph, path, ConvertOptions(num_partitions=4, partitioner="random", seed=5))
    return path


def test_metadata_and_repr(store_path):
    store = graphstore.open(store_path)
    assert (store.num_nodes, store.num_partitions, store.partition_size) == (120, 4, 30)
    assert store.feature_dim == 3 and store.num_classes == 4 and store.num_relations == 0
    assert store.directed is False and store.split_names == ["train", "valid", "test"]
    text = repr(store)
    assert "\n" not in text and "120 nodes" in text and "4 partitions x 30" in text
    assert store.manifest.partitioner["method"] == "random"
    assert store.manifest.split_origin == {"kind": "handmade", "seed": 0}


def test_partition_reads_and_errors(store_path):
    store = graphstore.open(store_path)
    assert store.partition_range(3) == (90, 120)
    assert store.read_features(1).shape == (30, 3)
    assert store.read_labels(2).dtype == np.int32
    with pytest.raises(ConfigError, match=r"partition_id must be in \[0, 4\) \(got 4\)"):
        store.read_features(4)
    with pytest.raises(ConfigError, match="known: train, valid, test"):
        store.read_node_split("nope")
    with pytest.raises(ConfigError, match="outside"):
        store.to_store_ids(np.array([120]))
    with pytest.raises(ConfigError, match="mode must be"):
        graphstore.open(store_path, mode="w")


def test_labels_of_an_id_array(store_path):
    """``read_labels`` takes a partition or, as a user reaches for it, an array of store ids
    in any order (it failed on numpy's "truth value of an array is ambiguous")."""
    with graphstore.open(store_path) as store:
        every = np.asarray(store.labels[...])
        ids = np.array([119, 0, 45, 45, 31, 89])                          # any order, repeats
        got = store.read_labels(ids)
        assert got.dtype == np.int32 and np.array_equal(got, every[ids])
        assert np.array_equal(store.read_labels(ids.tolist()), every[ids])
        assert np.array_equal(store.read_labels(np.int64(2)), every[60:90])      # a numpy scalar: a partition
        assert store.read_labels(np.zeros(0, np.int64)).shape == (0,)
        with pytest.raises(ConfigError, match=r"read_labels: store ids must be in \[0, 120\) \(got 120\)"):
            store.read_labels(np.array([3, 120]))
        with pytest.raises(ConfigError, match=r"read_labels: store ids must be integers \(got float64\)"):
            store.read_labels(np.array([1.5]))


def test_features_of_an_id_array(store_path):
    """``read_features`` takes an array of store ids as ``read_labels`` does (it failed the
    same way); the rows come from the blocks that hold them, in the order asked."""
    with graphstore.open(store_path) as store:
        every = np.asarray(store.features[...])
        ids = np.array([119, 0, 45, 45, 31, 89])
        got = store.read_features(ids)
        assert got.dtype == every.dtype and np.array_equal(got, every[ids])
        assert np.array_equal(store.read_features(np.int64(2)), every[60:90])
        assert store.read_features(np.zeros(0, np.int64)).shape == (0, every.shape[1])
        with pytest.raises(ConfigError, match=r"read_features: store ids must be in \[0, 120\) \(got -1\)"):
            store.read_features([-1])


def test_missing_path_and_non_store(tmp_path):
    with pytest.raises(StoreNotFoundError, match="no such store"):
        graphstore.open(tmp_path / "absent.gs")
    (tmp_path / "plain").mkdir()
    with pytest.raises(StoreNotFoundError, match="no zarr.json"):
        graphstore.open(tmp_path / "plain")
    zarr.open_group(str(tmp_path / "half.gs"), mode="w")
    with pytest.raises(StoreNotFoundError, match="interrupted conversion"):
        graphstore.open(tmp_path / "half.gs")


def _edit_manifest(path, **changes):
    meta_path = path / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["attributes"]["graphstore"].update(changes)
    meta_path.write_text(json.dumps(meta))


def test_unknown_format_version(copy):
    _edit_manifest(copy, format_version=2)
    with pytest.raises(StoreVersionError, match="format_version 2 is not supported"):
        graphstore.open(copy)


def test_missing_manifest_field(copy):
    meta = json.loads((copy / "zarr.json").read_text())
    del meta["attributes"]["graphstore"]["partition_size"]
    (copy / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match="manifest lacks field.*partition_size"):
        graphstore.open(copy)


def test_missing_array(copy):
    shutil.rmtree(copy / "edges" / "dst")
    with pytest.raises(StoreError, match="array edges/dst is missing"):
        graphstore.open(copy)


def test_misshaped_array(copy):
    group = zarr.open_group(str(copy), mode="r+")
    del group["nodes/labels"]
    new_array(group, "nodes/labels", shape=(119,), dtype="int32", chunks=(119,))
    with pytest.raises(StoreError, match=r"nodes/labels has shape \(119,\), expected \(120,\)"):
        graphstore.open(copy)


def test_manifest_that_does_not_cover_the_nodes(copy):
    _edit_manifest(copy, partition_size=20)
    with pytest.raises(StoreError, match="do not cover 120 nodes"):
        graphstore.open(copy)
