"""`verify` finds damage: a flipped byte, a missing chunk, a broken invariant, and names
the array and chunk."""

from __future__ import annotations

import re

import numpy as np
import pytest
import zarr

import graphstore
from graphstore.errors import CorruptStoreError
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.layout._verify import store_summary, verify_store
from tests.conftest import make_graph


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    graph, _ = make_graph(num_nodes=400, num_edges=3000, num_relations=3, directed=True)
    path = tmp_path_factory.mktemp("v") / "g.gs"
    convert(graph, path, ConvertOptions(num_partitions=4, partitioner="random"))
    return path


def test_clean_store_verifies(store_path):
    result = verify_store(store_path)
    assert result["ok"] and result["num_nodes"] == 400


@pytest.mark.parametrize("array,chunk", [("nodes/features", "0/0"), ("edges/dst", "0"),
                                         ("splits/nodes/train", "0"), ("nodes/labels", "0")])
def test_flipped_byte_is_caught_and_named(copy, array, chunk):
    path = copy / array / "c" / chunk
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match=f"{array} chunk {chunk}: .*checksum"):
        verify_store(copy)


def test_a_checksum_mismatch_is_worded_as_every_read_words_it(copy):
    """verify names a failed chunk checksum in hex, as the trainers' reads do, not as zarr's
    raw bytes (``Stored: b'}\\x1fP\\xe7'``): the same two numbers either way."""
    path = copy / "nodes" / "labels" / "c" / "0"
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError) as verified:
        verify_store(copy)
    with graphstore.open(copy) as store, pytest.raises(CorruptStoreError) as read:
        store.read_rows("nodes/labels", 0, store.num_nodes)
    pair = r"checksum mismatch \(stored (0x[0-9a-f]{8}), computed (0x[0-9a-f]{8})\)"
    assert "b'" not in str(verified.value) and 'b"' not in str(verified.value)
    assert re.search(pair, str(verified.value)).groups() == re.search(pair, str(read.value)).groups()


def test_missing_chunk_file(copy):
    (copy / "nodes" / "out_degree" / "c" / "0").unlink()
    with pytest.raises(CorruptStoreError, match="nodes/out_degree chunk 0: chunk file is missing"):
        verify_store(copy)


def _rewrite(copy, name, mutate):
    # A consistent rewrite (checksums recomputed by zarr): only the invariants can catch it.
    arr = zarr.open_array(str(copy / name), mode="r+")
    values = arr[...]
    mutate(values)
    arr[...] = values


def test_edge_in_the_wrong_bucket(copy):
    _rewrite(copy, "edges/dst", lambda v: v.__setitem__(0, 399))
    with pytest.raises(CorruptStoreError, match=r"edges/dst chunk 0: edge 0 .* lies in bucket"):
        verify_store(copy)


def test_bucket_offsets_that_do_not_end_at_num_edges(copy):
    _rewrite(copy, "edges/bucket_offsets", lambda v: v.__setitem__(-1, v[-1] - 1))
    with pytest.raises(CorruptStoreError, match="edges/bucket_offsets"):
        verify_store(copy)


def test_orig_id_not_a_permutation(copy):
    _rewrite(copy, "nodes/orig_id", lambda v: v.__setitem__(5, v[6]))
    with pytest.raises(CorruptStoreError, match="nodes/orig_id chunk 0: not a permutation"):
        verify_store(copy)


def test_unsorted_bucket(copy):
    def swap(v):
        v[[0, 1]] = v[[1, 0]]

    _rewrite(copy, "edges/src", swap)
    _rewrite(copy, "edges/dst", swap)
    with pytest.raises(CorruptStoreError, match="breaks the .dst, src. order"):
        verify_store(copy)


def test_wrong_degree(copy):
    _rewrite(copy, "nodes/in_degree", lambda v: v.__setitem__(3, v[3] + 1))
    with pytest.raises(CorruptStoreError, match="nodes/in_degree chunk 0: node 3 has degree"):
        verify_store(copy)


def test_relation_out_of_range(copy):
    _rewrite(copy, "edges/rel", lambda v: v.__setitem__(10, 7))
    with pytest.raises(CorruptStoreError, match=r"edges/rel chunk 0: relation 7 outside \[0, 3\)"):
        verify_store(copy)


def test_summary_fields(store_path):
    s = store_summary(store_path)
    for key in ["num_nodes", "num_edges", "directed", "num_partitions", "partition_size", "feature_dim",
                "num_classes", "num_relations", "splits", "format_version", "bytes_on_disk"]:
        assert key in s
    assert s["num_relations"] == 3 and s["directed"] is True and s["format_version"] == 1
    assert s["bytes_on_disk"] == sum(f.stat().st_size for f in store_path.rglob("*") if f.is_file())
    assert s["arrays"]["edges/src"]["shape"] == [s["num_edges"]]
    assert 0 <= s["edge_cut"] <= 1
    assert np.isclose(sum(a["bytes_on_disk"] for a in s["arrays"].values()), s["bytes_on_disk"], rtol=0.05)
