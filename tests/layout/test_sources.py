"""Source readers: every registered reader through the conformance checks
(`graphstore.testing.readers`: the graph agrees with itself, converts and verifies), real
datasets' known statistics, hand-made layouts read back exactly, format detection, and the
bad-input suite (every message names file and line/array)."""

from __future__ import annotations

import gzip
import io
import shutil
import sys
import tarfile
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphstore.errors import SourceError, SourceNotFoundError
from graphstore.layout.sources import (
    TASK_LINK,
    TASK_NODE,
    _io,
    available_formats,
    detect_format,
    get_reader,
    read_source,
    register_reader,
)
from graphstore.layout.sources.ogb import locate_ogb
from graphstore.testing.readers import check_reader, check_source_graph
from tests.conftest import REPO

@pytest.fixture
def data_dir(shared_data) -> Path:
    """../shared/data (the conftest fixture: skipped on a user's machine, a failure in CI)."""
    return shared_data


@pytest.fixture
def small_chunks(monkeypatch):
    """Tiny chunks so every multi-chunk path runs on hand-made data."""
    monkeypatch.setattr(_io, "EDGE_CHUNK_ROWS", 3)
    monkeypatch.setattr(_io, "FEATURE_CHUNK_BYTES", 8)


def read(path, tmp_path, **kwargs):
    return read_source(path, work_dir=tmp_path / "work", **kwargs)


def all_edges(graph):
    chunks = list(graph.edges())
    src = np.concatenate([c.src for c in chunks]) if chunks else np.zeros(0, np.int64)
    dst = np.concatenate([c.dst for c in chunks]) if chunks else np.zeros(0, np.int64)
    rel = None
    if chunks and chunks[0].rel is not None:
        rel = np.concatenate([c.rel for c in chunks])
    for c in chunks:
        assert c.src.dtype == np.int64 and c.dst.dtype == np.int64
    return src, dst, rel


def all_features(graph):
    return np.concatenate(list(graph.features()))


def undirected_pairs(src, dst) -> int:
    """Distinct unordered non-loop pairs."""
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    keep = lo != hi
    return len(np.unique(lo[keep] * (hi.max() + 1) + hi[keep]))


def write_csv_gz(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(text)
    return path


def lines(rows) -> str:
    return "".join(",".join(str(v) for v in row) + "\n" for row in rows)


# --------------------------------------------------------------------------- real data


def test_cora_statistics(data_dir, tmp_path):
    g = read(data_dir / "cora_planetoid", tmp_path)
    assert (g.name, g.format, g.num_nodes) == ("cora", "planetoid", 2708)
    assert (g.feature_dim, g.num_classes) == (1433, 7)
    assert not g.directed and g.tasks == (TASK_NODE,)
    src, dst, _ = all_edges(g)
    assert len(src) == 5278 and undirected_pairs(src, dst) == 5278
    assert {k: len(v) for k, v in g.node_splits.items()} == {"train": 140, "valid": 500, "test": 1000}
    x = all_features(g)
    assert x.shape == (2708, 1433) and x.dtype == np.float32 and set(np.unique(x)) <= {0.0, 1.0}
    assert g.labels.shape == (2708,) and g.labels.min() == 0
    assert np.array_equal(g.node_splits["train"], np.arange(140))


def test_citeseer_statistics(data_dir, tmp_path):
    g = read(data_dir / "citeseer_planetoid" / "raw", tmp_path)
    assert (g.num_nodes, g.feature_dim, g.num_classes) == (3327, 3703, 6)
    assert {k: len(v) for k, v in g.node_splits.items()} == {"train": 120, "valid": 500, "test": 1000}
    src, dst, _ = all_edges(g)
    assert undirected_pairs(src, dst) == 4552
    x = all_features(g)
    missing = np.flatnonzero(g.labels == -1)
    assert len(missing) == 15 and g.extra["missing_feature_rows"] == 15
    assert not x[missing].any()
    assert not np.isin(missing, g.node_splits["test"]).any()


def test_amazon_photo_statistics(data_dir, tmp_path):
    zipped = data_dir / "amazon_photo" / "amazon-photo.zip"
    assert detect_format(zipped) == "npz"
    g = read(zipped, tmp_path, seed=3)
    assert (g.format, g.num_nodes, g.feature_dim, g.num_classes) == ("npz", 7650, 745, 8)
    assert not g.directed
    src, dst, _ = all_edges(g)
    assert undirected_pairs(src, dst) == 119081
    assert all_features(g).shape == (7650, 745)
    splits = g.node_splits
    assert {k: len(v) for k, v in splits.items()} == {"train": 160, "valid": 240, "test": 7250}
    assert np.all(np.bincount(g.labels[splits["train"]], minlength=8) == 20)
    assert np.all(np.bincount(g.labels[splits["valid"]], minlength=8) == 30)
    assert len(np.unique(np.concatenate(list(splits.values())))) == 7650
    assert g.split_origin["seed"] == 3 and "20 train" in g.split_origin["rule"]
    again = read(zipped, tmp_path, seed=3)
    other = read(zipped, tmp_path, seed=4)
    assert np.array_equal(again.node_splits["train"], splits["train"])
    assert not np.array_equal(other.node_splits["train"], splits["train"])


def test_wn18rr_statistics(data_dir, tmp_path):
    archive = data_dir / "wn18rr" / "WN18RR.tar.gz"
    assert detect_format(archive) == "kg"
    g = read(archive, tmp_path)
    assert (g.format, g.num_nodes, g.num_relations, g.directed) == ("kg", 40943, 11, True)
    assert g.tasks == (TASK_LINK,)
    assert {k: len(v.src) for k, v in g.edge_splits.items()} == {"train": 86835, "valid": 3034, "test": 3134}
    src, dst, rel = all_edges(g)
    assert len(src) == 86835 and rel is not None and rel.max() == 10
    assert len(g.node_names) == 40943 and len(g.relation_names) == 11
    # First appearance: the first training line's head and tail are entities 0 and 1.
    assert (src[0], dst[0], rel[0]) == (0, 1, 0) and g.node_names[0] == "00260881"
    assert g.relation_names[0] == "_hypernym"


def test_ogbl_ddi_by_name_under_root(data_dir, tmp_path):
    g = read("ogbl-ddi", tmp_path, options={"root": str(data_dir)})
    assert (g.name, g.format, g.num_nodes, g.feature_dim, g.directed) == ("ogbl-ddi", "ogb", 4267, 0, False)
    assert g.tasks == (TASK_LINK,) and g.features is None
    src, dst, _ = all_edges(g)
    assert len(src) == 1067911
    valid, test, train = g.edge_splits["valid"], g.edge_splits["test"], g.edge_splits["train"]
    assert (len(valid.src), len(valid.neg_src)) == (133489, 101882)
    assert (len(test.src), len(test.neg_src)) == (133489, 95599)
    assert valid.neg_dst.shape == (101882,)
    assert np.array_equal(train.src, src) and np.array_equal(train.dst, dst)
    assert "train.pt is absent" in g.split_origin["train"] and g.split_origin["name"] == "target"
    assert g.describe_edge(0) == "line 1"
    assert g.files["edges"].endswith("raw/edge.csv.gz")
    assert g.files["split:valid"].endswith("split/target/valid.pt")


def test_detect_real_datasets(data_dir):
    assert detect_format(data_dir / "cora_planetoid") == "planetoid"
    assert detect_format(data_dir / "citeseer_planetoid" / "raw") == "planetoid"
    assert detect_format(data_dir / "ogbl_ddi") == "ogb"
    assert detect_format("ogbn-papers100M") == "ogb"


# --------------------------------------------------------------------------- hand-made OGB


NODE_EDGES = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 0], [1, 4]])
NODE_FEAT = np.arange(18, dtype=np.float32).reshape(6, 3) / 4


def make_ogb_node(root: Path, *, labels_text="0\nnan\n2\n\n1\n0\n") -> Path:
    raw = root / "raw"
    write_csv_gz(raw / "edge.csv.gz", lines(NODE_EDGES))
    write_csv_gz(raw / "num-node-list.csv.gz", "6\n")
    write_csv_gz(raw / "num-edge-list.csv.gz", "7\n")
    write_csv_gz(raw / "node-feat.csv.gz", lines(NODE_FEAT))
    write_csv_gz(raw / "node-label.csv.gz", labels_text)
    write_csv_gz(raw / "node_year.csv.gz", "2000\n" * 6)
    split = root / "split" / "time"
    write_csv_gz(split / "train.csv.gz", "0\n2\n")
    write_csv_gz(split / "valid.csv.gz", "4\n")
    write_csv_gz(split / "test.csv.gz", "5\n")
    return root


def test_ogb_node_csv_read_back_exactly(tmp_path, small_chunks):
    root = make_ogb_node(tmp_path / "ogbn_arxiv")
    assert detect_format(root) == "ogb"
    g = read(root, tmp_path)
    assert (g.name, g.num_nodes, g.feature_dim, g.num_classes, g.directed) == ("ogbn-arxiv", 6, 3, 3, True)
    src, dst, rel = all_edges(g)
    assert np.array_equal(np.stack([src, dst], 1), NODE_EDGES) and rel is None
    assert len(list(g.edges())) == 3  # chunks of 3 edges
    assert np.array_equal(all_features(g), NODE_FEAT)
    assert g.labels.tolist() == [0, -1, 2, -1, 1, 0]
    assert {k: v.tolist() for k, v in g.node_splits.items()} == {"train": [0, 2], "valid": [4], "test": [5]}
    assert g.split_origin == {"kind": "shipped", "name": "time"} and g.tasks == (TASK_NODE,)
    assert g.describe_edge(4) == "line 5" and g.describe_feature_row(0) == "line 1"
    assert set(g.files) >= {"edges", "features", "labels", "split:train", "split:valid", "split:test"}
    assert g.extra["ignored_raw_files"] == ["node_year.csv.gz"]


def test_ogb_directedness_table_and_override(tmp_path):
    root = make_ogb_node(tmp_path / "ogbn_products")
    assert read(root, tmp_path).directed is False
    assert read(root, tmp_path, options={"directed": True}).directed is True


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("fortran", [False, True])
def test_ogb_npz_variant_read_back_exactly(tmp_path, small_chunks, compressed, fortran):
    rng = np.random.default_rng(0)
    n, e, d = 11, 17, 5
    edge_index = rng.integers(0, n, (2, e))
    if fortran:
        edge_index = np.asfortranarray(edge_index)
    feat = rng.standard_normal((n, d)).astype(np.float32)
    label = rng.integers(0, 4, (n, 1)).astype(np.float64)
    label[[1, 7]] = np.nan
    raw = tmp_path / "ogbn_papers100M" / "raw"
    raw.mkdir(parents=True)
    save = np.savez_compressed if compressed else np.savez
    save(raw / "data.npz", edge_index=edge_index, node_feat=feat, num_nodes_list=np.array([n]),
         num_edges_list=np.array([e]))
    save(raw / "node-label.npz", node_label=label)
    split = tmp_path / "ogbn_papers100M" / "split" / "time"
    for s, ids in {"train": "0\n1\n", "valid": "2\n", "test": "3\n"}.items():
        write_csv_gz(split / f"{s}.csv.gz", ids)

    g = read(tmp_path / "ogbn_papers100M", tmp_path)
    assert (g.name, g.num_nodes, g.feature_dim, g.directed) == ("ogbn-papers100M", n, d, True)
    src, dst, _ = all_edges(g)
    assert np.array_equal(src, edge_index[0]) and np.array_equal(dst, edge_index[1])
    assert np.array_equal(all_features(g), feat)
    expected = np.where(np.isnan(label[:, 0]), -1, label[:, 0]).astype(np.int64)
    assert np.array_equal(g.labels, expected)
    assert g.extra["layout"] == "npz" and g.describe_edge(3) == "edge_index[:, 3]"


def test_ogb_npz_float16_features_stay_float16(tmp_path):
    raw = tmp_path / "ogbn_half" / "raw"
    raw.mkdir(parents=True)
    feat = np.linspace(-1, 1, 12, dtype=np.float16).reshape(4, 3)
    np.savez(raw / "data.npz", edge_index=np.array([[0, 1], [1, 2]]), node_feat=feat,
             num_nodes_list=np.array([4]), num_edges_list=np.array([2]))
    g = read(tmp_path / "ogbn_half", tmp_path)
    chunks = list(g.features())
    assert all(c.dtype == np.float16 for c in chunks) and np.array_equal(np.concatenate(chunks), feat)
    assert g.labels is None and g.tasks == ()


def make_ogb_npz_node(root: Path, label: np.ndarray, splits: dict[str, str]) -> Path:
    n = len(label)
    raw = root / "raw"
    raw.mkdir(parents=True)
    np.savez(raw / "data.npz", edge_index=np.array([[0, 1], [1, 2]]), num_nodes_list=np.array([n]))
    np.savez(raw / "node-label.npz", node_label=label)
    for s, ids in splits.items():
        write_csv_gz(root / "split" / "random" / f"{s}.csv.gz", ids)
    return root


@pytest.mark.parametrize("layout", ["csv", "npz"])
def test_ogb_labels_and_node_splits_are_memory_maps_under_work_dir(tmp_path, small_chunks, layout):
    """Labels and node splits stream into .npy files (one chunk in memory at a time) and
    come back as read-only int64 memory maps in this read's own folder of the work dir."""
    if layout == "csv":
        root = make_ogb_node(tmp_path / "ogbn_arxiv")
        labels, classes = [0, -1, 2, -1, 1, 0], 3
        splits = {"train": [0, 2], "valid": [4], "test": [5]}
    else:
        label = np.array([[3], [np.nan], [0], [1], [np.nan], [2], [3], [0]])
        splits = {"train": [0, 2, 3, 5, 6, 7, 1], "valid": [4], "test": []}
        root = make_ogb_npz_node(tmp_path / "ogbn_papers100M", label,
                                 {s: "".join(f"{i}\n" for i in ids) for s, ids in splits.items()})
        labels, classes = [3, -1, 0, 1, -1, 2, 3, 0], 4
    work = (tmp_path / "work").resolve()
    g = read(root, tmp_path)
    again = read(root, tmp_path)  # a second read must not overwrite the first one's files
    arrays = {"labels": g.labels, **{f"split:{k}": v for k, v in g.node_splits.items()}}
    assert set(arrays) == {"labels", "split:train", "split:valid", "split:test"}
    folders = set()
    for role, array in arrays.items():
        assert isinstance(array, np.memmap), role
        assert array.dtype == np.int64 and array.ndim == 1 and not array.flags.writeable, role
        file = Path(array.filename).resolve()
        assert file.is_relative_to(work) and file.suffix == ".npy", role
        folders.add(file.parent)
    assert len(folders) == 1
    assert Path(again.labels.filename).resolve().parent not in folders
    assert g.labels.tolist() == labels and g.num_classes == classes
    assert {k: v.tolist() for k, v in g.node_splits.items()} == splits
    assert again.labels.tolist() == labels
    assert not list(work.rglob("*.part"))  # the raw side files are gone


def test_ogb_streamed_label_errors_name_the_right_line(tmp_path, small_chunks):
    """With 3-row chunks: errors past the first chunk still name their line/row, a parse
    error anywhere still wins over a bad class id, and the count is the file's."""
    root = make_ogb_node(tmp_path / "ogbn_a", labels_text="0\n1\n2\n0\n1.5\n0\n")
    with pytest.raises(SourceError, match="node-label.csv.gz line 5: 1.5 is not a class id"):
        read(root, tmp_path)
    root = make_ogb_node(tmp_path / "ogbn_b", labels_text="0\n1.5\n2\n0\n1\n0\n0,1\n")
    with pytest.raises(SourceError, match="node-label.csv.gz line 7: expected 1 columns, got 2"):
        read(root, tmp_path)
    root = make_ogb_node(tmp_path / "ogbn_c", labels_text="0\n1\n2\n" * 3)
    with pytest.raises(SourceError, match="node-label.csv.gz: 9 labels but .* says 6 nodes"):
        read(root, tmp_path)
    label = np.array([[0.0], [1], [2], [0], [-2], [1]])
    root = make_ogb_npz_node(tmp_path / "ogbn_d", label, {})
    with pytest.raises(SourceError, match=r"node-label.npz\[node_label\] row 4: -2.0 is not a class id"):
        read(root, tmp_path)


def test_ogb_blank_first_label_line_is_unlabeled(tmp_path):
    g = read(make_ogb_node(tmp_path / "ogbn_x", labels_text="\n1\n2\n\n0\nnan\n"), tmp_path)
    assert g.labels.tolist() == [-1, 1, 2, -1, 0, -1]


def test_ogb_heterogeneous_refused(tmp_path):
    root = make_ogb_node(tmp_path / "ogbn_mag")
    (root / "raw" / "relations").mkdir()
    with pytest.raises(SourceError, match="relations: heterogeneous OGB datasets"):
        read(root, tmp_path)


def save_pt(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)


def make_ogb_link_raw(root: Path, edges: np.ndarray, num_nodes: int, reltype=None) -> None:
    raw = root / "raw"
    write_csv_gz(raw / "edge.csv.gz", lines(edges))
    write_csv_gz(raw / "num-node-list.csv.gz", f"{num_nodes}\n")
    write_csv_gz(raw / "num-edge-list.csv.gz", f"{len(edges)}\n")
    if reltype is not None:
        write_csv_gz(raw / "edge_reltype.csv.gz", lines(np.asarray(reltype)[:, None]))


def make_ogb_collab(root: Path) -> Path:
    """ogbl-collab's layout: ``edge`` / ``edge_neg`` pairs in .pt splits."""
    edges = np.array([[0, 1], [1, 2], [2, 3]])
    make_ogb_link_raw(root, edges, 5)
    split = root / "split" / "time"
    save_pt(split / "train.pt",
            {"edge": torch.tensor(edges), "weight": torch.ones(3), "year": torch.zeros(3)})
    save_pt(split / "valid.pt", {"edge": np.array([[3, 4]]), "edge_neg": np.array([[0, 4], [1, 3]])})
    save_pt(split / "test.pt", {"edge": torch.tensor([[0, 2]]), "edge_neg": torch.tensor([[2, 4]])})
    return root


def test_ogb_link_edge_and_edge_neg(tmp_path):
    g = read(make_ogb_collab(tmp_path / "ogbl_collab"), tmp_path)
    assert g.tasks == (TASK_LINK,) and g.directed is False and g.name == "ogbl-collab"
    v = g.edge_splits["valid"]
    assert (v.src.tolist(), v.dst.tolist()) == ([3], [4])
    assert (v.neg_src.tolist(), v.neg_dst.tolist()) == ([0, 1], [4, 3])
    assert g.edge_splits["train"].src.tolist() == [0, 1, 2] and g.edge_splits["train"].neg_src is None
    assert g.extra["split_extra_keys"] == {"train": ["weight", "year"]}
    assert "train" not in g.split_origin


CITATION2_NEG = np.array([[2, 3, 4], [0, 1, 5]])


def make_ogb_citation2(root: Path) -> Path:
    """ogbl-citation2's layout: ``source_node`` / ``target_node`` with candidate negatives."""
    make_ogb_link_raw(root, np.array([[0, 1], [2, 3]]), 6)
    split = root / "split" / "time"
    save_pt(split / "train.pt", {"source_node": torch.tensor([0, 2]), "target_node": torch.tensor([1, 3])})
    save_pt(split / "valid.pt", {"source_node": torch.tensor([4, 5]), "target_node": torch.tensor([5, 4]),
                                 "target_node_neg": torch.tensor(CITATION2_NEG)})
    save_pt(split / "test.pt", {"source_node": torch.tensor([1]), "target_node": torch.tensor([2]),
                                "target_node_neg": torch.tensor([[0, 3, 5]])})
    return root


def test_ogb_link_target_node_neg(tmp_path):
    g = read(make_ogb_citation2(tmp_path / "ogbl_citation2"), tmp_path)
    assert g.directed is True
    v = g.edge_splits["valid"]
    assert v.neg_src is None and np.array_equal(v.neg_dst, CITATION2_NEG) and v.src.tolist() == [4, 5]


def make_ogb_wikikg(root: Path) -> Path:
    """ogbl-wikikg2's layout: typed edges, ``head`` / ``relation`` / ``tail`` splits."""
    edges = np.array([[0, 1], [1, 2], [2, 0], [3, 1]])
    make_ogb_link_raw(root, edges, 4, reltype=[0, 2, 1, 2])
    split = root / "split" / "time"

    def triple(h, r, t):
        return {"head": torch.tensor(h), "relation": torch.tensor(r), "tail": torch.tensor(t)}

    save_pt(split / "train.pt", triple([0, 1, 2, 3], [0, 2, 1, 2], [1, 2, 0, 1]))
    save_pt(split / "valid.pt", {**triple([0], [3], [2]), "head_neg": torch.tensor([[1, 3]]),
                                 "tail_neg": torch.tensor([[1, 3]])})
    save_pt(split / "test.pt", {**triple([1], [1], [3]), "head_neg": torch.tensor([[0, 2]]),
                                "tail_neg": torch.tensor([[0, 2]])})
    return root


def test_ogb_link_wikikg_relations(tmp_path, small_chunks):
    root = make_ogb_wikikg(tmp_path / "ogbl_wikikg2")
    g = read(root, tmp_path)
    assert g.directed is True and g.num_relations == 4
    src, dst, rel = all_edges(g)
    assert rel.tolist() == [0, 2, 1, 2]
    v = g.edge_splits["valid"]
    assert v.rel.tolist() == [3] and v.neg_dst.tolist() == [[1, 3]]
    assert g.extra["split_extra_keys"] == {"valid": ["head_neg"], "test": ["head_neg"]}
    write_csv_gz(root / "raw" / "edge_reltype.csv.gz", "0\n2\n1\n")
    with pytest.raises(SourceError, match="edge_reltype.csv.gz: 3 lines but .*edge.csv.gz has more edges"):
        all_edges(read(root, tmp_path))


def test_ogb_split_choice(tmp_path):
    root = make_ogb_node(tmp_path / "ogbn_x")
    shutil.copytree(root / "split" / "time", root / "split" / "random")
    with pytest.raises(SourceError, match="several splits.*random, time.*--split"):
        read(root, tmp_path)
    assert read(root, tmp_path, options={"split": "random"}).split_origin["name"] == "random"
    with pytest.raises(SourceNotFoundError, match="split/nope.*available: random, time"):
        read(root, tmp_path, options={"split": "nope"})


def install_fake_ogb(monkeypatch, tmp_path, download):
    pkg_dir = tmp_path / "fake_ogb" / "linkproppred"
    pkg_dir.mkdir(parents=True)
    (pkg_dir / "master.csv").write_text(
        ",ogbl-toy\nurl,http://example.invalid/toy.zip\ndownload_name,toy\nadd_inverse_edge,True\n"
    )
    names = ("ogb", "ogb.utils", "ogb.utils.url", "ogb.linkproppred")
    modules = {name: types.ModuleType(name) for name in names}
    modules["ogb.linkproppred"].__file__ = str(pkg_dir / "__init__.py")
    modules["ogb.utils.url"].download_url = download
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)


def test_ogb_name_download_with_ogb(monkeypatch, tmp_path):
    payload = tmp_path / "payload.zip"
    with zipfile.ZipFile(payload, "w") as zf:
        zf.writestr("toy/raw/edge.csv.gz", gzip.compress(b"0,1\n1,2\n"))
        zf.writestr("toy/raw/num-node-list.csv.gz", gzip.compress(b"3\n"))
        zf.writestr("toy/split/s/valid.pt", b"")
    calls = []

    def download(url, folder, log=True):
        calls.append(url)
        return shutil.copy(payload, Path(folder) / "toy.zip")

    install_fake_ogb(monkeypatch, tmp_path, download)
    root = tmp_path / "datasets"
    found = locate_ogb("ogbl-toy", root)
    assert calls == ["http://example.invalid/toy.zip"] and found == root / "ogbl_toy"
    assert (found / "raw" / "edge.csv.gz").is_file() and not (root / "toy.zip").exists()
    assert locate_ogb("ogbl-toy", root) == found and len(calls) == 1  # found, not fetched again


def test_ogb_name_missing_lists_every_place(monkeypatch, tmp_path):
    # ogb is a test dependency (the metrics are checked against its Evaluator): hide it and
    # any submodule another test imported, so that import ogb.* -> ImportError.
    for name in [n for n in sys.modules if n.startswith("ogb.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ogb", None)
    with pytest.raises(SourceNotFoundError) as err:
        read("ogbn-arxiv", tmp_path, options={"root": str(tmp_path / "r")})
    message = str(err.value)
    assert "raw/edge.csv.gz" in message and "not installed" in message
    assert str(tmp_path / "r" / "ogbn_arxiv" / "raw") in message
    assert str(tmp_path / "r" / "ogbn-arxiv" / "raw") in message

    def no_network(url, folder, log=True):
        raise OSError("Name or service not known")

    install_fake_ogb(monkeypatch, tmp_path, no_network)
    with pytest.raises(SourceNotFoundError, match="ogbl-toy.*failed.*Name or service not known"):
        read("ogbl-toy", tmp_path, options={"root": str(tmp_path / "r")})


# --------------------------------------------------------------------------- hand-made others


def make_gnn_npz(path: Path) -> dict:
    adj = np.array([[0, 1, 0, 0], [0, 0, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=np.float32)
    attr = np.arange(12, dtype=np.float64).reshape(4, 3)
    onehot = np.array([[1, 0], [0, 1], [0, 0], [1, 0]])
    rows, cols = np.nonzero(adj)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=4))])
    lr, lc = np.nonzero(onehot)
    lptr = np.concatenate([[0], np.cumsum(np.bincount(lr, minlength=4))])
    np.savez(path, adj_data=adj[rows, cols], adj_indices=cols, adj_indptr=indptr, adj_shape=[4, 4],
             attr_matrix=attr, label_data=np.ones(len(lr)), label_indices=lc, label_indptr=lptr,
             label_shape=[4, 2], class_names=np.array(["a", "b"]))
    return {"rows": rows, "cols": cols, "attr": attr}


def test_gnn_benchmark_npz_plain_and_zipped(tmp_path, small_chunks):
    expected = make_gnn_npz(tmp_path / "toy.npz")
    with zipfile.ZipFile(tmp_path / "toy.zip", "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.write(tmp_path / "toy.npz", "toy.npz")
    for source in (tmp_path / "toy.npz", tmp_path / "toy.zip"):
        assert detect_format(source) == "npz"
        g = read(source, tmp_path)
        src, dst, _ = all_edges(g)
        assert np.array_equal(src, expected["rows"]) and np.array_equal(dst, expected["cols"])
        assert np.array_equal(all_features(g), expected["attr"].astype(np.float32))
        assert g.labels.tolist() == [0, 1, -1, 0] and g.num_classes == 2 and g.name == "toy"
        assert g.extra["class_names"] == ["a", "b"]
        assert sorted(np.concatenate(list(g.node_splits.values())).tolist()) == [0, 1, 3]


def write_kg(directory: Path, *, train, valid, test) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in (("train", train), ("valid", valid), ("test", test)):
        (directory / f"{name}.txt").write_text(text)
    return directory


def test_kg_numbering_rule_and_archives(tmp_path):
    kg = write_kg(tmp_path / "toykg" / "inner", train="b\tr1\ta\na\tr2\tc\n", valid="d\tr1\tb\n",
                  test="c\tr3\te\n")
    with tarfile.open(tmp_path / "toykg.tar.gz", "w:gz") as tf:
        tf.add(kg, arcname="toykg")
    with zipfile.ZipFile(tmp_path / "toykg.zip", "w") as zf:
        for f in kg.iterdir():
            zf.write(f, f.name)
    for source in (tmp_path / "toykg", tmp_path / "toykg.tar.gz", tmp_path / "toykg.zip"):
        assert detect_format(source) == "kg"
        g = read(source, tmp_path)
        assert g.node_names.tolist() == ["b", "a", "c", "d", "e"]
        assert g.relation_names == ("r1", "r2", "r3")
        assert g.edge_splits["valid"].src.tolist() == [3] and g.edge_splits["test"].rel.tolist() == [2]
        src, dst, rel = all_edges(g)
        assert (src.tolist(), dst.tolist(), rel.tolist()) == ([0, 1], [1, 2], [0, 1])
        assert g.describe_edge(1) == "line 2" and g.name == "toykg"


def make_edgelist_file(directory: Path) -> tuple[Path, np.ndarray]:
    """``g.txt``: a comment, a blank line, then 60 nodes' distinct undirected pairs."""
    rng = np.random.default_rng(1)
    pairs = np.unique(np.sort(rng.integers(0, 60, (400, 2)), axis=1), axis=0)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    text = "# a comment\n\n" + "".join(f"{u} {v}\n" for u, v in pairs)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "g.txt").write_text(text)
    return directory / "g.txt", pairs


def test_edgelist_link_split_holds_out_edges(tmp_path):
    _, pairs = make_edgelist_file(tmp_path)
    assert detect_format(tmp_path / "g.txt") == "edgelist"
    g = read(tmp_path / "g.txt", tmp_path, seed=5)
    assert g.tasks == (TASK_LINK,) and not g.directed and g.num_nodes == pairs.max() + 1
    src, dst, _ = all_edges(g)
    graph_keys = set(zip(np.minimum(src, dst).tolist(), np.maximum(src, dst).tolist()))
    held = 0
    for name, fraction in (("valid", 0.05), ("test", 0.10)):
        split = g.edge_splits[name]
        assert len(split.src) == int(fraction * len(pairs))
        held += len(split.src)
        assert not graph_keys & set(zip(split.src.tolist(), split.dst.tolist()))
        lo, hi = np.minimum(split.neg_src, split.neg_dst), np.maximum(split.neg_src, split.neg_dst)
        neg = set(zip(lo.tolist(), hi.tolist()))
        assert not neg & set(map(tuple, pairs.tolist())) and len(split.neg_src) == len(split.src)
    assert len(src) == len(pairs) - held == len(g.edge_splits["train"].src)
    assert g.split_origin["seed"] == 5
    # The first kept edge sits on line 3, after the comment and the blank line.
    first_kept = np.flatnonzero((pairs[:, 0] == src[0]) & (pairs[:, 1] == dst[0]))[0]
    assert g.describe_edge(0) == f"line {first_kept + 3}"
    again = read(tmp_path / "g.txt", tmp_path, seed=5)
    assert np.array_equal(again.edge_splits["test"].src, g.edge_splits["test"].src)


EDGELIST_FEATURES = np.arange(40, dtype=np.float64).reshape(8, 5)


def make_edgelist_dir(d: Path) -> Path:
    """``edges.csv`` with ``features.npy`` and ``labels.npy`` (node 7 unlabeled, edgeless)."""
    d.mkdir(parents=True)
    (d / "edges.csv").write_text("0,1\n1,2\n2,3\n3,4\n4,0\n")
    np.save(d / "features.npy", EDGELIST_FEATURES)
    np.save(d / "labels.npy", np.array([0, 1, 0, 1, 0, 1, 0, -1]))
    return d


def test_edgelist_directory_with_features_and_labels(tmp_path, small_chunks):
    d = make_edgelist_dir(tmp_path / "mygraph")
    features = EDGELIST_FEATURES
    assert detect_format(d) == "edgelist"
    g = read(d, tmp_path, seed=2)
    assert (g.name, g.num_nodes, g.feature_dim, g.num_classes) == ("mygraph", 8, 5, 2)
    assert np.array_equal(all_features(g), features.astype(np.float32))
    assert len(list(g.features())) > 1
    src, dst, _ = all_edges(g)
    assert src.tolist() == [0, 1, 2, 3, 4] and g.describe_edge(2) == "line 3"
    splits = g.node_splits
    assert len(splits["train"]) == 7 and len(splits["valid"]) == 0 and 7 not in splits["train"]
    assert "RandomNodeSplit" in g.split_origin["rule"]


def test_edgelist_extra_columns_ignored(tmp_path):
    (tmp_path / "w.tsv").write_text("0\t1\t0.5\n1\t2\t0.25\n2\t0\t1.0\n")
    with pytest.warns(UserWarning) as said:
        g = read(tmp_path / "w.tsv", tmp_path, options={"directed": True})
    # Once, naming the file and what is dropped: a typed or weighted graph must not turn
    # into a plain one without a word.
    assert len(said) == 1
    assert str(said[0].message).startswith(f"{tmp_path / 'w.tsv'}: column 3 ignored (line 1: '0.5')")
    assert g.extra["ignored_columns"] == 1 and g.directed and g.num_nodes == 3
    # Three distinct edges: 5 % and 10 % of them round down to nothing held out.
    assert all_edges(g)[0].tolist() == [0, 1, 2] and len(g.edge_splits["valid"].src) == 0


def test_a_wrong_format_for_an_archive_names_the_archive(tmp_path):
    """The reader looks inside the archive's extraction, a temporary directory deleted by
    the time the user reads the message: the message names the archive instead."""
    make_edgelist_dir(tmp_path / "mygraph")
    archive = tmp_path / "mygraph.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(tmp_path / "mygraph", arcname="mygraph")
    for fmt in ("npz", "planetoid", "ogb", "kg"):
        with pytest.raises(SourceNotFoundError) as raised:
            read(archive, tmp_path, format=fmt)
        message = str(raised.value)
        assert f"{archive}/mygraph" in message and str(tmp_path / "work") not in message, message


# --------------------------------------------------------------------------- conformance


def make_npz_sample(d: Path) -> Path:
    d.mkdir(parents=True)
    make_gnn_npz(d / "toy.npz")
    return d / "toy.npz"


SAMPLES = {
    "ogb node csv": ("ogb", True, lambda d: make_ogb_node(d / "ogbn_arxiv")),
    "ogb node npz": ("ogb", False, lambda d: make_ogb_npz_node(
        d / "ogbn_papers100M", np.array([[1.0], [np.nan], [0]]), {"train": "0\n", "valid": "2\n", "test": ""})),
    "ogb link edge_neg": ("ogb", False, lambda d: make_ogb_collab(d / "ogbl_collab")),
    "ogb link target_node_neg": ("ogb", True, lambda d: make_ogb_citation2(d / "ogbl_citation2")),
    "ogb link relations": ("ogb", True, lambda d: make_ogb_wikikg(d / "ogbl_wikikg2")),
    "kg": ("kg", True, lambda d: write_kg(d / "toykg", train="b\tr1\ta\na\tr2\tc\n", valid="d\tr1\tb\n",
                                          test="c\tr3\te\n")),
    "edgelist file": ("edgelist", True, lambda d: make_edgelist_file(d)[0]),
    "edgelist directory": ("edgelist", False, lambda d: make_edgelist_dir(d / "mygraph")),
    "npz": ("npz", True, make_npz_sample),
    # No hand-made Planetoid pickles: the embedded Cora (data/cora) stands in.
    "planetoid": ("planetoid", True, lambda d: shutil.copytree(REPO / "data" / "cora", d / "cora")),
}
"""A small well-formed source of each layout the readers know: (format, whether to convert
and verify it as well, builder(directory) -> source path). Conversion costs a second of
fsyncs, so it runs on one sample per format and on the ones whose splits or relations
take another path through the converter."""


def test_every_format_has_a_converted_sample():
    assert {fmt for fmt, convert, _ in SAMPLES.values() if convert} == set(available_formats())


@pytest.mark.parametrize("sample", SAMPLES)
def test_every_reader_passes_the_conformance_checks(tmp_path, small_chunks, sample):
    fmt, convert, build = SAMPLES[sample]
    source = build(tmp_path / "src")
    assert detect_format(source) == fmt
    check_reader(fmt, source, work_dir=tmp_path / "work", convert=convert)


def archive(directory: Path, out: Path, wrapper: str | None) -> Path:
    """Pack ``directory`` as .zip or .tar.gz, under a ``wrapper`` folder or at the top."""
    files = [f for f in sorted(directory.rglob("*")) if f.is_file()]

    def name(f: Path) -> str:
        rel = f.relative_to(directory).as_posix()
        return f"{wrapper}/{rel}" if wrapper else rel

    if out.name.endswith(".zip"):
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for f in files:
                zf.write(f, name(f))
    else:
        with tarfile.open(out, "w:gz") as tf:
            for f in files:
                tf.add(f, name(f))
    return out


@pytest.mark.parametrize("suffix", [".zip", ".tar.gz"])
@pytest.mark.parametrize("wrapper", [None, "wrapped"])
def test_detect_and_read_every_format_from_archives(tmp_path, suffix, wrapper):
    sources = {
        "ogb": make_ogb_node(tmp_path / "ogb_src"),
        "kg": write_kg(tmp_path / "kg_src", train="a\tr\tb\n", valid="b\tr\ta\n",
                       test="a\tr\ta\n"),
        "edgelist": tmp_path / "edgelist_src",
        "npz": tmp_path / "npz_src",
    }
    sources["edgelist"].mkdir()
    (sources["edgelist"] / "edges.tsv").write_text("0\t1\n1\t2\n")
    sources["npz"].mkdir()
    make_gnn_npz(sources["npz"] / "toy.npz")
    # No hand-made Planetoid pickles: the embedded Cora (data/cora) stands in.
    sources["planetoid"] = shutil.copytree(REPO / "data" / "cora", tmp_path / "planetoid_src")
    for fmt, directory in sources.items():
        assert detect_format(directory) == fmt
        packed = archive(directory, tmp_path / f"{fmt}{suffix}", wrapper)
        assert detect_format(packed) == fmt, packed
        graph = read(packed, tmp_path)
        assert graph.format == fmt and graph.num_nodes > 0 and graph.path == str(packed)
        check_source_graph(graph)
        assert all(Path(f).is_relative_to(tmp_path / "work") for f in graph.files.values())


def test_ogb_download_zip_layout(tmp_path):
    """ogb's own zip holds ``arxiv/raw/...``; its folder name maps back to ogbn-arxiv."""
    packed = archive(make_ogb_node(tmp_path / "src"), tmp_path / "arxiv.zip", "arxiv")
    g = read(packed, tmp_path)
    assert (g.name, g.directed, g.num_nodes) == ("ogbn-arxiv", True, 6)
    assert len(all_edges(g)[0]) == 7


def test_registry(tmp_path):
    assert available_formats() == ("edgelist", "kg", "npz", "ogb", "planetoid")
    assert callable(get_reader("kg"))
    with pytest.raises(ValueError, match="already registered"):
        register_reader("kg", get_reader("kg"))
    with pytest.raises(SourceError, match="unknown source format 'nope'.*edgelist, kg, npz, ogb, planetoid"):
        get_reader("nope")
    with pytest.raises(SourceError, match="unknown source format"):
        read(tmp_path, tmp_path, format="nope")


# --------------------------------------------------------------------------- bad input


def test_missing_source_and_missing_ogb_file(tmp_path):
    with pytest.raises(SourceNotFoundError, match="no-such-dir: no such file"):
        read(tmp_path / "no-such-dir", tmp_path)
    root = make_ogb_node(tmp_path / "ogbn_x")
    (root / "raw" / "num-node-list.csv.gz").unlink()
    missing = r"raw/num-node-list.csv.gz: file not found \(looked in .*ogbn_x/raw\)"
    with pytest.raises(SourceNotFoundError, match=missing):
        read(root, tmp_path)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("0,1\n1,2\n2,3,4\n3,4\n", "edge.csv.gz line 3: expected 2 columns, got 3"),
        ("0,1\n1\n2,3\n", "edge.csv.gz line 2: expected 2 columns, got 1"),
        ("0,1\n1,2\n2,x\n", "edge.csv.gz line 3: 'x' is not an integer"),
        ("0,1\n1.5,2\n", "edge.csv.gz line 2: '1.5' is not an integer"),
    ],
)
def test_malformed_edge_rows_name_file_and_line(tmp_path, text, problem):
    root = make_ogb_node(tmp_path / "ogbn_x")
    write_csv_gz(root / "raw" / "edge.csv.gz", text)
    g = read(root, tmp_path)
    with pytest.raises(SourceError, match=problem):
        all_edges(g)


def test_edge_count_disagreeing_with_num_edge_list(tmp_path):
    root = make_ogb_node(tmp_path / "ogbn_x")
    write_csv_gz(root / "raw" / "num-edge-list.csv.gz", "8\n")
    with pytest.raises(SourceError, match="7 edges but .*num-edge-list.csv.gz says 8"):
        all_edges(read(root, tmp_path))


@pytest.mark.parametrize(
    "text, problem",
    [
        ("1,2,3\n4,abc,6\n", "node-feat.csv.gz line 2: 'abc' is not a number"),
        ("1,2,3\n4,5\n", "node-feat.csv.gz line 2: expected 3 columns, got 2"),
        ("1,2,3\n4,,6\n", "node-feat.csv.gz line 2: empty value in column 2"),
    ],
)
def test_malformed_feature_rows(tmp_path, text, problem):
    root = make_ogb_node(tmp_path / "ogbn_x")
    write_csv_gz(root / "raw" / "node-feat.csv.gz", text)
    with pytest.raises(SourceError, match=problem):
        all_features(read(root, tmp_path))


def test_feature_rows_fewer_than_nodes(tmp_path):
    root = make_ogb_node(tmp_path / "ogbn_x")
    write_csv_gz(root / "raw" / "node-feat.csv.gz", "1,2,3\n")
    with pytest.raises(SourceError, match="node-feat.csv.gz: 1 rows but .* says 6 nodes"):
        all_features(read(root, tmp_path))


def test_label_problems(tmp_path):
    root = make_ogb_node(tmp_path / "ogbn_a", labels_text="0\n1\n2\n")
    short = "node-label.csv.gz: 3 labels but .*num-node-list.csv.gz says 6 nodes"
    with pytest.raises(SourceError, match=short):
        read(root, tmp_path)
    root = make_ogb_node(tmp_path / "ogbn_b", labels_text="0,1\n1,0\n" * 3)
    with pytest.raises(SourceError, match="multi-task labels are not supported"):
        read(root, tmp_path)
    root = make_ogb_node(tmp_path / "ogbn_c", labels_text="0\n1\n2.5\n0\n0\n0\n")
    with pytest.raises(SourceError, match="node-label.csv.gz line 3: 2.5 is not a class id"):
        read(root, tmp_path)


def test_multi_graph_count_file(tmp_path):
    root = make_ogb_node(tmp_path / "ogbn_x")
    write_csv_gz(root / "raw" / "num-node-list.csv.gz", "3\n3\n")
    with pytest.raises(SourceError, match="num-node-list.csv.gz: 2 lines .*single-graph"):
        read(root, tmp_path)


def test_split_files_unparsable_vs_unknown_id(tmp_path):
    root = make_ogb_node(tmp_path / "ogbn_x")
    write_csv_gz(root / "split" / "time" / "valid.csv.gz", "4\n99\n")
    assert read(root, tmp_path).node_splits["valid"].tolist() == [4, 99]  # range: the converter's check
    write_csv_gz(root / "split" / "time" / "valid.csv.gz", "4\nfour\n")
    with pytest.raises(SourceError, match="split/time/valid.csv.gz line 2: 'four' is not an integer"):
        read(root, tmp_path)


def test_bad_pt_split(tmp_path):
    root = tmp_path / "ogbl_x"
    make_ogb_link_raw(root, np.array([[0, 1]]), 2)
    save_pt(root / "split" / "s" / "valid.pt", {"edge": torch.tensor([[0, 1, 1]])})
    save_pt(root / "split" / "s" / "test.pt", {"edge": torch.tensor([[0, 1]])})
    with pytest.raises(SourceError, match=r"valid.pt\['edge'\]: expected shape \[n, 2\]"):
        read(root, tmp_path)
    save_pt(root / "split" / "s" / "valid.pt", {"pairs": torch.tensor([[0, 1]])})
    with pytest.raises(SourceError, match="valid.pt: unknown split layout"):
        read(root, tmp_path)
    (root / "split" / "s" / "valid.pt").write_bytes(b"not a pickle")
    with pytest.raises(SourceError, match="valid.pt: cannot load"):
        read(root, tmp_path)
    (root / "split" / "s" / "valid.pt").unlink()
    with pytest.raises(SourceNotFoundError, match="valid.pt: file not found"):
        read(root, tmp_path)


def test_corrupt_gzip(tmp_path):
    root = make_ogb_node(tmp_path / "ogbn_x")
    data = (root / "raw" / "edge.csv.gz").read_bytes()
    (root / "raw" / "edge.csv.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceError, match="edge.csv.gz: cannot read"):
        all_edges(read(root, tmp_path))


def test_truncated_npz_member(tmp_path):
    raw = tmp_path / "ogbn_x" / "raw"
    raw.mkdir(parents=True)
    buf = io.BytesIO()
    # The header promises 10 rows; only 4 rows of data follow.
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (10, 2)})
    buf.write(np.zeros((4, 2), np.float32).tobytes())
    with zipfile.ZipFile(raw / "data.npz", "w") as zf:
        zf.writestr("node_feat.npy", buf.getvalue())
        for key, value in {"edge_index": np.zeros((2, 1), np.int64), "num_nodes_list": np.array([10]),
                           "num_edges_list": np.array([1])}.items():
            out = io.BytesIO()
            np.save(out, value)
            zf.writestr(f"{key}.npy", out.getvalue())
    with pytest.raises(SourceError, match=r"data.npz\[node_feat\]: truncated"):
        all_features(read(tmp_path / "ogbn_x", tmp_path))


def test_kg_line_without_three_fields(tmp_path):
    kg = write_kg(tmp_path / "kg", train="a\tr\tb\nc\td\ne\tr\tf\n", valid="", test="")
    with pytest.raises(SourceError, match=r"train.txt line 2: expected 3 tab-separated fields .*got 2"):
        read(kg, tmp_path)
    write_kg(kg, train="a\tr\tb\n", valid="a\tr\tb\tx\n", test="")
    with pytest.raises(SourceError, match="valid.txt line 1: expected 3 .*got 4"):
        read(kg, tmp_path)


def test_kg_bad_line_inside_archive_named_by_archive(tmp_path):
    kg = write_kg(tmp_path / "src", train="a\tr\tb\n", valid="oops\n", test="")
    with tarfile.open(tmp_path / "bad.tar.gz", "w:gz") as tf:
        tf.add(kg, arcname="bad")
    with pytest.raises(SourceError, match=r"bad.tar.gz/bad/valid.txt line 1"):
        read(tmp_path / "bad.tar.gz", tmp_path)


def test_edgelist_bad_rows_and_lengths(tmp_path):
    (tmp_path / "e.txt").write_text("# header comment\n0 1\n1 two\n")
    with pytest.raises(SourceError, match="e.txt line 3: 'two' is not an integer"):
        read(tmp_path / "e.txt", tmp_path)
    (tmp_path / "e.txt").write_text("0 1\n1 2\n")
    np.save(tmp_path / "labels.npy", np.array([0, 1]))
    disagree = "node counts disagree: num_nodes option is 3, .*labels.npy has 2 labels"
    with pytest.raises(SourceError, match=disagree):
        read(tmp_path / "e.txt", tmp_path, options={"labels": str(tmp_path / "labels.npy"), "num_nodes": 3})
    np.save(tmp_path / "features.npy", np.zeros((3, 2)))
    with pytest.raises(SourceError, match="features.npy has 3 rows, .*labels.npy has 2 labels"):
        read(tmp_path / "e.txt", tmp_path, options={"labels": str(tmp_path / "labels.npy"),
                                                     "features": str(tmp_path / "features.npy")})
    with pytest.raises(SourceNotFoundError, match="missing.npy: features file not found"):
        read(tmp_path / "e.txt", tmp_path, options={"features": str(tmp_path / "missing.npy")})


def test_options_checked(tmp_path, data_dir):
    with pytest.raises(SourceError, match="option 'features' is not used by the planetoid reader"):
        read(data_dir / "cora_planetoid", tmp_path, options={"features": "x.npy"})
    with pytest.raises(SourceError, match="unknown reader option"):
        read(data_dir / "cora_planetoid", tmp_path, options={"colour": "red"})
    with pytest.raises(SourceError, match="option directed must be true or false"):
        read(data_dir / "cora_planetoid", tmp_path, options={"directed": "yes"})
    assert read(data_dir / "cora_planetoid", tmp_path, options={"features": None}).num_nodes == 2708


def test_archive_guard(tmp_path):
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as zf:
        zf.writestr("train.txt", "a\tr\tb\n")
        zf.writestr("valid.txt", "")
        zf.writestr("test.txt", "")
        zf.writestr("../escape.txt", "x")
    with pytest.raises(SourceError, match="escape.txt' would be written outside"):
        read(tmp_path / "evil.zip", tmp_path, format="kg")
    assert not (tmp_path / "work" / "escape.txt").exists()
    link = tarfile.TarInfo("train.txt")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with tarfile.open(tmp_path / "evil.tar.gz", "w:gz") as tf:
        tf.addfile(link)
    with pytest.raises(SourceError, match="is a link or special file"):
        read(tmp_path / "evil.tar.gz", tmp_path, format="kg")


def test_planetoid_pickle_allow_list(tmp_path, data_dir):
    raw = tmp_path / "cora" / "raw"
    shutil.copytree(data_dir / "cora_planetoid" / "raw", raw)
    (raw / "ind.cora.graph").write_bytes(b"cos\nsystem\n(S'echo pwned'\ntR.")
    with pytest.raises(SourceError, match=r"ind.cora.graph: pickle refers to os.system.*refusing"):
        read(tmp_path / "cora", tmp_path)


def test_planetoid_dense_big_endian_features_read_as_the_sparse_ones(tmp_path, data_dir):
    # A pickle keeps the writer's byte order; a dense '>f4' matrix must read like the
    # sparse original (found by the sources fuzz test: scipy refuses non-native dtypes).
    import pickle
    import warnings

    raw = tmp_path / "cora" / "raw"
    shutil.copytree(data_dir / "cora_planetoid" / "raw", raw)
    with open(raw / "ind.cora.tx", "rb") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the file names scipy.sparse.csr
        tx = pickle.load(f, encoding="latin1")
    (raw / "ind.cora.tx").write_bytes(pickle.dumps(np.asarray(tx.todense(), dtype=">f4"), protocol=2))
    assert np.array_equal(all_features(read(tmp_path / "cora", tmp_path / "a")),
                          all_features(read(data_dir / "cora_planetoid", tmp_path / "b")))


def test_undetectable(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "readme.md").write_text("hi")
    with pytest.raises(SourceError, match="cannot tell the source format .*readme.md.*--format"):
        detect_format(tmp_path / "d")
    (tmp_path / "x.bin").write_bytes(b"\0")
    with pytest.raises(SourceError, match="cannot tell the source format"):
        detect_format(tmp_path / "x.bin")


# --------------------------------------------------------------------------- npz streaming


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(0, 40),
    cols=st.integers(1, 6),
    chunk=st.integers(1, 50),
    compressed=st.booleans(),
    dtype=st.sampled_from(["<f4", ">f8", "<i2"]),
)
def test_npz_member_streams_rows_exactly(tmp_path_factory, rows, cols, chunk, compressed, dtype):
    path = tmp_path_factory.mktemp("npz") / "a.npz"
    array = (np.arange(rows * cols).reshape(rows, cols) % 251).astype(dtype)
    (np.savez_compressed if compressed else np.savez)(path, a=array)
    member = _io.npz_members(path, display="a.npz")["a"]
    assert member.shape == (rows, cols)
    parts = list(_io.iter_npy_rows(member, chunk_rows=chunk, dtype=np.float64))
    got = np.concatenate(parts) if parts else np.zeros((0, cols))
    assert np.array_equal(got, array.astype(np.float64))
    assert all(len(p) <= chunk for p in parts)
