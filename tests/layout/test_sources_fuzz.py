"""Bad sources, fuzzed: every reader against truncated, corrupted and mis-shaped files.

Each test builds a small valid dataset of one format from a seeded random graph, damages
one of its files (or its archive) and converts it. The property, for every reader:

    either a valid store (it opens and `verify` passes), or a `SourceError` whose message
    is one line and names the damaged file; no other exception, and nothing left behind
    (no output, no hidden ``.<name>.tmp-*`` directory).

A damage that still leaves a valid dataset (a flipped digit that is still an in-range
id) may convert; the store must then be consistent. Mutations: truncation at a random
byte, overwritten bytes, random bytes (keeping a prefix, so parsers get past the magic),
an empty file, and per-format mis-shaped content (wrong column counts, non-numeric tokens,
NaN, negative or out-of-range ids; npz/npy/pt arrays of the wrong shape or dtype, object
arrays, missing keys; pickles of the wrong type).

``GRAPHSTORE_FUZZ_EXAMPLES`` raises the number of examples per reader for a longer run.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import re
import shutil
import tarfile
import tempfile
import warnings
import zipfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphstore
from graphstore.errors import SourceError
from graphstore.layout.sources import read_source
from tests.conftest import REPO

EXAMPLES = int(os.environ.get("GRAPHSTORE_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    # Generous: a slow example is a finding only when it is far past the others (a hang
    # is caught by pytest's faulthandler_timeout as well).
    deadline=timedelta(seconds=30),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

MUTATIONS = ("truncate", "overwrite", "random", "empty", "misshape", "misshape")
"""Kinds of damage; mis-shaped content is drawn twice as often (it reaches deepest)."""


# --------------------------------------------------------------------------- the graph


@dataclass(frozen=True)
class Graph:
    """A small random graph every builder writes in its own format."""

    n: int
    src: np.ndarray
    dst: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    splits: dict[str, np.ndarray]


def random_graph(seed: int) -> Graph:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 9))
    e = int(rng.integers(n, 2 * n + 1))
    src = rng.integers(0, n, e)
    dst = (src + rng.integers(1, n, e)) % n  # no self loops: never an empty graph
    features = rng.standard_normal((n, int(rng.integers(1, 4)))).round(3).astype(np.float32)
    labels = rng.integers(0, int(rng.integers(2, 4)), n)
    order = rng.permutation(n)
    splits = {"train": order[: n // 2], "valid": order[n // 2 : 3 * n // 4], "test": order[3 * n // 4 :]}
    return Graph(n, src, dst, features, labels, splits)


# --------------------------------------------------------------------------- file helpers


def is_gzip(path: Path) -> bool:
    return path.read_bytes()[:2] == b"\x1f\x8b"


def write_text(path: Path, text: str, *, gz: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8", errors="surrogatepass")
    # mtime=0: the same text gives the same bytes, so hypothesis replays are exact.
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


def rows_text(rows, sep: str = ",") -> str:
    return "".join(sep.join(str(v) for v in row) + "\n" for row in rows)


def pack_zip(directory: Path, out: Path) -> None:
    """Zip ``directory`` with fixed timestamps: equal inputs give equal bytes, so the
    byte offsets hypothesis draws mean the same thing when it replays an example."""
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(directory.rglob("*")):
            if f.is_file():
                info = zipfile.ZipInfo(f"{directory.name}/{f.relative_to(directory).as_posix()}",
                                       date_time=(2020, 1, 1, 0, 0, 0))
                zf.writestr(info, f.read_bytes(), compress_type=zipfile.ZIP_DEFLATED)


def pack_tar_gz(directory: Path, out: Path) -> None:
    """``directory`` as a .tar.gz with fixed timestamps and owners (see `pack_zip`)."""

    def fixed(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tf:
        tf.add(directory, arcname=directory.name, filter=fixed)
    out.write_bytes(gzip.compress(buffer.getvalue(), mtime=0))


@dataclass
class Case:
    """A valid dataset on disk, and how to damage it."""

    source: Path
    """What `convert` is given: a directory, a file or an archive."""
    files: list[Path]
    """The dataset's files (inside ``stage`` when the source is an archive)."""
    sep: str = ","
    """Field separator of its text files."""
    pack: Callable[[], None] | None = None
    """Rebuilds the archive at ``source`` from ``files`` after one of them changed."""
    options: dict | None = None
    """Extra keyword options for `graphstore.convert`."""

    def targets(self) -> list[Path]:
        return self.files + ([self.source] if self.pack is not None else [])


# --------------------------------------------------------------------------- builders


def build_ogb_csv(d: Path, g: Graph) -> Case:
    root = d / "ogbn_fuzz"
    raw, split = root / "raw", root / "split" / "random"
    labels = g.labels.astype(float)
    labels[0] = np.nan  # an unlabeled node, as OGB writes it
    files = [
        write_text(raw / "edge.csv.gz", rows_text(zip(g.src, g.dst)), gz=True),
        write_text(raw / "num-node-list.csv.gz", f"{g.n}\n", gz=True),
        write_text(raw / "num-edge-list.csv.gz", f"{len(g.src)}\n", gz=True),
        write_text(raw / "node-feat.csv.gz", rows_text(g.features), gz=True),
        write_text(raw / "node-label.csv.gz", "".join("\n" if np.isnan(v) else f"{int(v)}\n" for v in labels),
                   gz=True),
    ]
    files += [write_text(split / f"{s}.csv.gz", rows_text(ids[:, None]), gz=True)
              for s, ids in g.splits.items()]
    return Case(root, files)


def build_ogb_npz(d: Path, g: Graph, compressed: bool) -> Case:
    root = d / "ogbn_fuzz"
    raw = root / "raw"
    raw.mkdir(parents=True)
    save = np.savez_compressed if compressed else np.savez
    save(raw / "data.npz", edge_index=np.stack([g.src, g.dst]), node_feat=g.features,
         num_nodes_list=np.array([g.n]), num_edges_list=np.array([len(g.src)]))
    label = g.labels.astype(np.float64)[:, None]
    label[0] = np.nan
    save(raw / "node-label.npz", node_label=label)
    files = [raw / "data.npz", raw / "node-label.npz"]
    files += [write_text(root / "split" / "random" / f"{s}.csv.gz", rows_text(ids[:, None]), gz=True)
              for s, ids in g.splits.items()]
    return Case(root, files)


def build_ogb_link(d: Path, g: Graph, as_numpy: bool, typed: bool = False) -> Case:
    """ogbl-ddi's layout (``edge``/``edge_neg``), or with ``typed`` ogbl-wikikg2's
    (``head``/``relation``/``tail`` with ``tail_neg``, and ``raw/edge_reltype.csv.gz``)."""
    root = d / ("ogbl_wikikg2" if typed else "ogbl_fuzz")
    raw, split = root / "raw", root / "split" / "target"
    rel = (g.src + 2 * g.dst) % 3
    files = [
        write_text(raw / "edge.csv.gz", rows_text(zip(g.src, g.dst)), gz=True),
        write_text(raw / "num-node-list.csv.gz", f"{g.n}\n", gz=True),
        write_text(raw / "num-edge-list.csv.gz", f"{len(g.src)}\n", gz=True),
    ]
    if typed:
        files.append(write_text(raw / "edge_reltype.csv.gz", rows_text(rel[:, None]), gz=True))
    split.mkdir(parents=True)
    # ogbl-ddi ships numpy arrays in legacy pickles; newer datasets torch tensors.
    wrap = (lambda a: a) if as_numpy else torch.from_numpy
    for s, part in (("train", slice(None)), ("valid", slice(0, 2)), ("test", slice(-2, None))):
        src, dst = g.src[part].copy(), g.dst[part].copy()
        if typed:
            obj = {"head": wrap(src), "relation": wrap(rel[part].copy()), "tail": wrap(dst)}
            if s != "train":
                obj["tail_neg"] = wrap(np.stack([g.src[:3]] * len(src)))
        else:
            obj = {"edge": wrap(np.stack([src, dst], 1))}
            if s != "train":
                obj["edge_neg"] = wrap(np.stack([g.dst, g.src], 1)[:2].copy())
        torch.save(obj, split / f"{s}.pt")
        files.append(split / f"{s}.pt")
    return Case(root, files)


PLANETOID_TRAIN = 6
PLANETOID_ALLX = 506  # train + the 500 validation nodes the public split takes


def build_planetoid(d: Path, g: Graph, protocol: int = 2) -> Case:
    raw = d / "fuzz" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(g.n)
    num_test = g.n
    num_nodes = PLANETOID_ALLX + num_test + 1  # one test-range id without a row (as CiteSeer)
    dim, classes = g.features.shape[1], int(g.labels.max()) + 1

    def feats(rows: int) -> sp.csr_matrix:
        return sp.csr_matrix((rng.random((rows, dim)) < 0.3).astype(np.float32))

    def onehot(rows: int) -> np.ndarray:
        return np.eye(classes, dtype=np.int64)[rng.integers(0, classes, rows)]

    # The test range skips one id that is not its last (the last fixes the node count).
    test_index = PLANETOID_ALLX + rng.permutation(np.delete(np.arange(num_test + 1), rng.integers(num_test)))
    adjacency = defaultdict(list)
    for u, v in zip(rng.integers(0, num_nodes, 2 * num_nodes), rng.integers(0, num_nodes, 2 * num_nodes)):
        adjacency[int(u)].append(int(v))
    objects = {"x": feats(PLANETOID_TRAIN), "y": onehot(PLANETOID_TRAIN), "allx": feats(PLANETOID_ALLX),
               "ally": onehot(PLANETOID_ALLX), "tx": feats(num_test), "ty": onehot(num_test),
               "graph": adjacency}
    files = []
    for part, obj in objects.items():
        with open(raw / f"ind.fuzz.{part}", "wb") as f:
            pickle.dump(obj, f, protocol=protocol)
        files.append(raw / f"ind.fuzz.{part}")
    files.append(write_text(raw / "ind.fuzz.test.index", rows_text(test_index[:, None]), gz=False))
    return Case(d / "fuzz", files)


def gnn_benchmark_arrays(g: Graph, *, extras: bool) -> dict[str, np.ndarray]:
    """A gnn-benchmark npz's arrays; ``extras`` adds the original collection's object arrays."""
    adj = sp.csr_matrix((np.ones(len(g.src), np.float32), (g.src, g.dst)), shape=(g.n, g.n))
    attr = sp.csr_matrix(g.features)
    arrays = {
        "adj_data": adj.data, "adj_indices": adj.indices, "adj_indptr": adj.indptr,
        "adj_shape": np.array(adj.shape),
        "attr_data": attr.data, "attr_indices": attr.indices, "attr_indptr": attr.indptr,
        "attr_shape": np.array(attr.shape),
        "labels": g.labels,
        "class_names": np.array([f"class {c}" for c in range(int(g.labels.max()) + 1)]),
    }
    if extras:
        # shchur/gnn-benchmark's cora.npz, citeseer.npz ... carry these as pickled objects.
        arrays["idx_to_node"] = np.array([{i: f"paper{i}" for i in range(g.n)}], dtype=object)
        arrays["idx_to_class"] = np.array([{0: "a"}], dtype=object)
        arrays["attr_text"] = np.array([f"text {i}" for i in range(g.n)], dtype=object)
    return arrays


def build_npz(d: Path, g: Graph, *, zipped: bool, extras: bool) -> Case:
    stage = d / "stage" / "fuzz"
    stage.mkdir(parents=True)
    np.savez(stage / "fuzz.npz", **gnn_benchmark_arrays(g, extras=extras))
    files = [stage / "fuzz.npz"]
    if not zipped:
        return Case(files[0], files)
    archive = d / "fuzz.zip"
    case = Case(archive, files, pack=lambda: pack_zip(stage, archive))
    case.pack()
    return case


def build_kg(d: Path, g: Graph, *, archived: bool) -> Case:
    stage = d / "stage" / "fuzzkg"
    rel = (g.src * 3 + g.dst) % 4
    triples = [(f"e{u}", f"r{r}", f"e{v}") for u, r, v in zip(g.src, rel, g.dst)]
    k = len(triples)
    parts = {"train": triples[: k - 2], "valid": triples[k - 2 : k - 1], "test": triples[k - 1 :]}
    files = [write_text(stage / f"{s}.txt", rows_text(rows, "\t"), gz=False) for s, rows in parts.items()]
    if not archived:
        return Case(stage, files, sep="\t")
    archive = d / "fuzzkg.tar.gz"
    case = Case(archive, files, sep="\t", pack=lambda: pack_tar_gz(stage, archive))
    case.pack()
    return case


def build_edgelist(d: Path, g: Graph, *, node_task: bool, gz: bool, sep: str) -> Case:
    name = {",": "edges.csv", "\t": "edges.tsv", " ": "edges.txt"}[sep] + (".gz" if gz else "")
    if not node_task:  # a lone file: link prediction with a generated split
        path = write_text(d / "fuzz" / name.replace("edges", "fuzz"),
                          "# src dst\n" + rows_text(zip(g.src, g.dst), sep), gz=gz)
        return Case(path, [path], sep=sep)
    root = d / "fuzz"
    files = [write_text(root / name, rows_text(zip(g.src, g.dst), sep), gz=gz)]
    np.save(root / "features.npy", g.features)
    np.save(root / "labels.npy", g.labels)
    return Case(root, files + [root / "features.npy", root / "labels.npy"], sep=sep)


# --------------------------------------------------------------------------- mutations


TOKENS = ["0", "1", "2", "3", "7", "8", "9", "-1", "-7", "nan", "NaN", "inf", "-inf", "1.5", "1e3", "x",
          "", " ", "99999999999999999999", "9000000000000000000", "0x1F", '"3"', "\x00", "é", "\ufffd", "3 4", "#"]


def weird_array(data, a: np.ndarray) -> np.ndarray:
    """``a`` made wrong in one way: shape, dtype, a bad value, or objects."""
    # Casting NaN labels to int8 warns; the warning is no finding (pytest makes it an error).
    with np.errstate(all="ignore"):
        return _weird_array(data, np.asarray(a))


def _weird_array(data, a: np.ndarray) -> np.ndarray:
    kind = data.draw(st.sampled_from([
        "flat", "extra_dim", "transpose", "short", "long", "empty", "scalar", "nan", "inf",
        "negative", "huge", "strings", "objects", "bool", "int8", "complex", "fortran", "big_endian",
    ]), label="array damage")
    flat = a.reshape(-1)
    if kind == "flat":
        return flat
    if kind == "extra_dim":
        return a[..., None]
    if kind == "transpose":
        return a.T if a.ndim > 1 else a[None]
    if kind == "short":
        return a[:-1]
    if kind == "long":
        return np.concatenate([a, a[:1]]) if a.ndim else a
    if kind == "empty":
        return a[:0] if a.ndim else flat[:0]
    if kind == "scalar":
        return np.array(flat[0] if flat.size else 0)
    if kind in ("nan", "inf", "negative", "huge"):
        if flat.dtype.kind not in "biuf" or not flat.size:
            return flat.astype(str)
        value = {"nan": np.nan, "inf": np.inf, "negative": -data.draw(st.integers(1, 5), label="neg"),
                 "huge": data.draw(st.sampled_from([9, 2**31, 2**40, 2**62]), label="huge")}[kind]
        out = a.astype(np.float64) if kind in ("nan", "inf") else a.copy()
        pos = data.draw(st.integers(0, flat.size - 1), label="position")
        if out.dtype.kind in "iu" and not np.can_cast(np.min_scalar_type(value), out.dtype):
            out = out.astype(np.int64)
        out.reshape(-1)[pos] = value
        return out
    if kind == "strings":
        return a.astype(str)
    if kind == "objects":
        return np.array([{"x": 1}] * max(1, len(flat)), dtype=object)
    if kind == "bool":
        return a.astype(bool)
    if kind == "int8":
        return a.astype(np.int8) if a.dtype.kind in "biuf" else a
    if kind == "complex":
        return a.astype(np.complex64) if a.dtype.kind in "biuf" else a
    if kind == "fortran":
        return np.asfortranarray(a.T) if a.ndim > 1 else a
    return a.astype(a.dtype.newbyteorder(">")) if a.dtype.kind in "biuf" else a


def misshape_text(path: Path, data, sep: str) -> None:
    gz = is_gzip(path)
    raw = gzip.decompress(path.read_bytes()) if gz else path.read_bytes()
    lines = raw.decode("utf-8").splitlines()
    rows = data.draw(st.lists(st.lists(st.sampled_from(TOKENS), max_size=4), max_size=4), label="rows")
    new = [sep.join(r) for r in rows]
    how = data.draw(st.sampled_from(["insert", "replace", "whole"]), label="how")
    at = data.draw(st.integers(0, len(lines)), label="line")
    if how == "insert":
        lines[at:at] = new
    elif how == "replace":
        lines[at : at + 1] = new
    else:
        lines = new
    ending = data.draw(st.sampled_from(["\n", "\r\n", ""]), label="ending")
    write_text(path, "\n".join(lines) + ending, gz=gz)


def misshape_npz(path: Path, data) -> None:
    with np.load(path, allow_pickle=True) as z:
        arrays = {k: z[k] for k in z.files}
    key = data.draw(st.sampled_from(sorted(arrays)), label="key")
    if data.draw(st.integers(0, 5), label="drop?") == 0:
        del arrays[key]
    else:
        arrays[key] = weird_array(data, arrays[key])
    compressed = data.draw(st.booleans(), label="compressed")
    with open(path, "wb") as f:  # a file object: np.savez would add ".npz" to a name
        (np.savez_compressed if compressed else np.savez)(f, **arrays)


def misshape_npy(path: Path, data) -> None:
    array = weird_array(data, np.load(path, allow_pickle=False))
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=True)


def misshape_pt(path: Path, data) -> None:
    obj = torch.load(path, weights_only=False)
    how = data.draw(st.sampled_from(["value", "value", "drop", "rename", "whole"]), label="pt damage")
    key = data.draw(st.sampled_from(sorted(obj)), label="key")
    if how == "value":
        array = weird_array(data, np.asarray(obj[key]))
        as_tensor = data.draw(st.booleans(), label="tensor")
        if as_tensor and array.dtype.kind in "biufc" and array.dtype.isnative:
            obj[key] = torch.from_numpy(np.ascontiguousarray(array))
        else:
            obj[key] = array
    elif how == "drop":
        del obj[key]
    elif how == "rename":
        obj[key + "_x"] = obj.pop(key)
    else:
        obj = data.draw(st.sampled_from([None, [1, 2], "edge", (np.zeros((2, 2)),), torch.zeros(3, 2),
                                         {1: torch.zeros(2, 2, dtype=torch.long)}]), label="object")
    torch.save(obj, path)


def misshape_pickle(path: Path, data) -> None:
    with open(path, "rb") as f:
        obj = pickle.load(f, encoding="latin1")
    if isinstance(obj, dict):
        keys = list(obj)
        key = keys[data.draw(st.integers(0, len(keys) - 1), label="node")]
        how = data.draw(st.sampled_from(["value", "key", "type", "list"]), label="graph damage")
        if how == "value":
            obj[key] = data.draw(st.sampled_from([[-1], [10**6], [1.5], ["a"], None, 3, [[1]], [2**70]]),
                                 label="neighbours")
        elif how == "key":
            obj[data.draw(st.sampled_from([-3, 10**6, "x", 1.5, None]), label="bad key")] = [0]
        elif how == "type":
            obj = list(obj.items())
        else:
            obj = dict(obj)  # a plain dict is as good as a defaultdict
    elif sp.issparse(obj):
        how = data.draw(st.sampled_from(["dense", "array", "nan", "wide", "short"]), label="matrix damage")
        if how == "dense":
            obj = obj.toarray()
        elif how == "array":
            obj = weird_array(data, obj.toarray())
        elif how == "nan":
            obj = obj.astype(np.float64)
            if obj.nnz:
                obj.data[0] = np.nan
        elif how == "wide":
            obj = sp.hstack([obj, sp.csr_matrix((obj.shape[0], 1))]).tocsr()
        else:
            obj = obj[:-1]
    else:
        how = data.draw(st.sampled_from(["array", "array", "none", "list"]), label="array damage")
        if how == "array":
            obj = weird_array(data, np.asarray(obj))
        elif how == "none":
            obj = None
        else:
            obj = np.asarray(obj).tolist()
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def misshape(path: Path, data, case: Case) -> None:
    name = path.name
    if name.endswith(".npz"):
        misshape_npz(path, data)
    elif name.endswith(".npy"):
        misshape_npy(path, data)
    elif name.endswith(".pt"):
        misshape_pt(path, data)
    elif name.startswith("ind.") and not name.endswith(".index"):
        misshape_pickle(path, data)
    else:
        misshape_text(path, data, case.sep)


def damage(case: Case, data) -> Path:
    """Apply one drawn mutation to one of the case's files; return the damaged file."""
    targets = case.targets()
    target = targets[data.draw(st.integers(0, len(targets) - 1), label="file")]
    kind = data.draw(st.sampled_from(MUTATIONS), label="mutation")
    if kind == "misshape" and target == case.source and case.pack is not None:
        kind = "overwrite"  # an archive's content is mis-shaped through its members
    payload = bytearray(target.read_bytes())
    if kind == "truncate":
        payload = payload[: data.draw(st.integers(0, max(0, len(payload) - 1)), label="cut")]
    elif kind == "overwrite":
        edits = data.draw(st.lists(st.tuples(st.integers(0, len(payload) - 1), st.integers(0, 255)),
                                   min_size=1, max_size=4), label="edits")
        for pos, value in edits:
            payload[pos] = value if payload[pos] != value else value ^ 0xFF
    elif kind == "random":
        keep = data.draw(st.integers(0, min(len(payload), 40)), label="prefix")
        payload = payload[:keep] + data.draw(st.binary(min_size=1, max_size=300), label="bytes")
    elif kind == "empty":
        payload = bytearray()
    if kind == "misshape":
        misshape(target, data, case)
    else:
        target.write_bytes(bytes(payload))
    if target != case.source and case.pack is not None:
        case.pack()
    return target


# --------------------------------------------------------------------------- the property


def check_convert(case: Case, damaged: Path, workdir: Path) -> None:
    """Either a valid store, or a one-line `SourceError` naming ``damaged``; nothing left behind."""
    out = workdir / "out" / "fuzz.gs"
    try:
        with warnings.catch_warnings():
            # Damage that adds a separator to an edge list's first line adds a column: said
            # by a warning, then read as two columns, as any such file is.
            warnings.filterwarnings("ignore", r".*: columns? 3(-\d+)? ignored \(line", UserWarning)
            graphstore.convert(case.source, out, **(case.options or {}))
    except SourceError as e:
        message = str(e)
        assert "\n" not in message and "\r" not in message, f"multi-line message: {message!r}"
        assert damaged.name in message, f"message does not name {damaged.name}: {message!r}"
        assert not out.exists(), "a failed conversion left an output"
    else:
        store = graphstore.open(out)
        assert store.manifest.num_nodes > 0
        graphstore.verify(out)
    leftovers = sorted(p.name for p in out.parent.glob(f".{out.name}.tmp-*"))
    assert not leftovers, f"temporary directories left behind: {leftovers}"


def run_case(build: Callable[[Path, Graph], Case], seed: int, data) -> None:
    with tempfile.TemporaryDirectory(prefix="gs-fuzz-") as tmp:
        workdir = Path(tmp)
        case = build(workdir / "src", random_graph(seed))
        damaged = damage(case, data)
        check_convert(case, damaged, workdir)


SEEDS = st.integers(0, 2**16)


@FUZZ
@given(seed=SEEDS, data=st.data())
def test_ogb_csv_fuzzed(seed, data):
    run_case(build_ogb_csv, seed, data)


@FUZZ
@given(seed=SEEDS, compressed=st.booleans(), data=st.data())
def test_ogb_npz_fuzzed(seed, compressed, data):
    run_case(lambda d, g: build_ogb_npz(d, g, compressed), seed, data)


@FUZZ
@given(seed=SEEDS, as_numpy=st.booleans(), typed=st.booleans(), data=st.data())
def test_ogb_pt_splits_fuzzed(seed, as_numpy, typed, data):
    run_case(lambda d, g: build_ogb_link(d, g, as_numpy, typed), seed, data)


@FUZZ
@given(seed=SEEDS, protocol=st.sampled_from([2, 4, 5]), data=st.data())
def test_planetoid_fuzzed(seed, protocol, data):
    # Protocol 2 is what the original (Python 2) files use; 4 and 5 what Python 3 writes.
    run_case(lambda d, g: build_planetoid(d, g, protocol), seed, data)


@FUZZ
@given(seed=SEEDS, zipped=st.booleans(), extras=st.booleans(), data=st.data())
def test_gnn_benchmark_npz_fuzzed(seed, zipped, extras, data):
    run_case(lambda d, g: build_npz(d, g, zipped=zipped, extras=extras), seed, data)


@FUZZ
@given(seed=SEEDS, archived=st.booleans(), data=st.data())
def test_kg_triples_fuzzed(seed, archived, data):
    run_case(lambda d, g: build_kg(d, g, archived=archived), seed, data)


@FUZZ
@given(seed=SEEDS, node_task=st.booleans(), gz=st.booleans(), sep=st.sampled_from([",", "\t", " "]),
       data=st.data())
def test_edgelist_fuzzed(seed, node_task, gz, sep, data):
    run_case(lambda d, g: build_edgelist(d, g, node_task=node_task, gz=gz, sep=sep), seed, data)


@settings(FUZZ, max_examples=max(10, EXAMPLES // 3))
@given(part=st.sampled_from(["x", "y", "tx", "ty", "allx", "ally", "graph", "test.index"]), data=st.data())
def test_embedded_cora_fuzzed(part, data):
    """The real Planetoid files (Python 2 pickles, as the Planetoid authors wrote them),
    damaged byte by byte: the pickles a hand-made baseline cannot imitate."""
    with tempfile.TemporaryDirectory(prefix="gs-fuzz-") as tmp:
        workdir = Path(tmp)
        root = shutil.copytree(REPO / "data" / "cora", workdir / "cora")
        target = root / "raw" / f"ind.cora.{part}"
        case = Case(root, [target])
        kind = data.draw(st.sampled_from(["truncate", "overwrite", "random", "empty"]), label="mutation")
        data_for_kind = _FixedKind(data, kind)
        damaged = damage(case, data_for_kind)
        check_convert(case, damaged, workdir)


class _FixedKind:
    """``data`` for `damage`, with the mutation kind already chosen."""

    def __init__(self, data, kind: str) -> None:
        self.data, self.kind = data, kind

    def draw(self, strategy, label=None):
        if label == "mutation":
            return self.kind
        return self.data.draw(strategy, label=label)


# --------------------------------------------------------------------------- fixed cases


@pytest.mark.parametrize(
    "build",
    [
        build_ogb_csv,
        lambda d, g: build_ogb_npz(d, g, True),
        lambda d, g: build_ogb_link(d, g, True),
        lambda d, g: build_ogb_link(d, g, False),
        lambda d, g: build_ogb_link(d, g, True, typed=True),
        build_planetoid,
        lambda d, g: build_npz(d, g, zipped=True, extras=True),
        lambda d, g: build_kg(d, g, archived=True),
        lambda d, g: build_edgelist(d, g, node_task=True, gz=True, sep=","),
        lambda d, g: build_edgelist(d, g, node_task=False, gz=False, sep=" "),
    ],
    ids=["ogb-csv", "ogb-npz", "ogb-pt-numpy", "ogb-pt-torch", "ogb-pt-typed", "planetoid", "npz-zip",
         "kg-tar", "edgelist-node", "edgelist-link"],
)
def test_undamaged_baselines_convert(tmp_path, build):
    """The fuzzers' starting points are valid: damage is what makes a conversion fail."""
    case = build(tmp_path / "src", random_graph(7))
    out = tmp_path / "out.gs"
    graphstore.convert(case.source, out, **(case.options or {}))
    graphstore.verify(out)


def test_gnn_benchmark_object_arrays_are_skipped(tmp_path):
    """The original collection's files carry pickled extras (``idx_to_node`` ...) that the
    reader never needs: they are skipped unread, never unpickled."""
    g = random_graph(3)
    arrays = gnn_benchmark_arrays(g, extras=True)
    arrays["class_names"] = np.array(["a", "b", "c"], dtype=object)
    arrays["idx_to_node"] = np.array([{"x": 1}], dtype=object)
    np.savez(tmp_path / "cora.npz", **arrays)
    graph = read_source(tmp_path / "cora.npz", work_dir=tmp_path / "work")
    assert graph.num_nodes == g.n and np.array_equal(graph.labels, g.labels)
    assert "class_names" not in graph.extra  # an object array is not read, even for names
    graphstore.convert(tmp_path / "cora.npz", tmp_path / "cora.gs")
    graphstore.verify(tmp_path / "cora.gs")


def test_gnn_benchmark_needed_object_array_is_one_line_error(tmp_path):
    arrays = gnn_benchmark_arrays(random_graph(3), extras=False)
    arrays["labels"] = np.array([{"x": 1}] * len(arrays["labels"]), dtype=object)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(SourceError, match=r"^[^\n]*bad.npz\[labels\]: holds Python objects") as err:
        graphstore.convert(tmp_path / "bad.npz", tmp_path / "bad.gs")
    assert "\n" not in str(err.value) and not (tmp_path / "bad.gs").exists()


# --------------------------------------------------------------------------- findings
#
# What the fuzzers found (and a review of the same code paths turned up), pinned as
# plain examples so that they stay fixed whatever hypothesis draws next time.


def convert_outcome(case: Case, tmp_path: Path) -> str | None:
    """The one-line `SourceError` message of converting ``case``, or None for a valid store."""
    out = tmp_path / "out" / "found.gs"
    try:
        graphstore.convert(case.source, out, **(case.options or {}))
    except SourceError as e:
        message = str(e)
        assert "\n" not in message and not out.exists()
        assert not list(out.parent.glob(f".{out.name}.tmp-*"))
        return message
    graphstore.verify(out)
    return None


def file_of(case: Case, name: str) -> Path:
    return next(f for f in case.targets() if f.name == name)


def replace_line(path: Path, index: int, text: str) -> None:
    gz = is_gzip(path)
    raw = gzip.decompress(path.read_bytes()) if gz else path.read_bytes()
    lines = raw.decode().splitlines()
    lines[index] = text
    write_text(path, "\n".join(lines) + "\n", gz=gz)


def repickle(path: Path, obj, protocol: int = 2) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=protocol))


class BadArrayState:
    """Pickles as an ndarray whose state promises 2 int64 values but holds 8 bytes: given
    to numpy's own ``__setstate__``, damaged state like this can crash the process."""

    def __reduce__(self):
        return (np.ndarray.__reduce__(np.zeros(0))[0], (np.ndarray, (0,), b"b"),
                (1, (2,), np.dtype("<i8"), False, b"\0" * 8))


def set_zip_entry_field(path: Path, offset: int, value: bytes) -> None:
    """Overwrite a field of the first central-directory entry of a zip (or npz)."""
    data = bytearray(path.read_bytes())
    at = data.index(b"PK\x01\x02") + offset
    data[at : at + len(value)] = value
    path.write_bytes(bytes(data))


def _zero_x(case: Case) -> None:
    x = file_of(case, "ind.fuzz.x")
    with open(x, "rb") as f:
        shape = pickle.load(f).shape
    repickle(x, sp.csr_matrix(shape, dtype=np.float32))


def _huge_memo_id(case: Case) -> None:
    # A valid pickle that stores one value under memo id 2**31 - 1 (LONG_BINPUT).
    y = file_of(case, "ind.fuzz.y")
    data = y.read_bytes()
    y.write_bytes(data[:2] + b"Nr" + (2**31 - 1).to_bytes(4, "little") + b"0" + data[2:])


def _huge_bytearray(case: Case) -> None:
    file_of(case, "ind.fuzz.y").write_bytes(b"\x80\x05\x96" + (2**40).to_bytes(8, "little") + b"xx.")


def _pt_value(name: str, key: str, value) -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        path = file_of(case, name)
        obj = torch.load(path, weights_only=False)
        obj[key] = value(obj[key]) if callable(value) else value
        torch.save(obj, path)
    return mutate


def _tail_neg_out_of_range(neg: torch.Tensor) -> torch.Tensor:
    neg = neg.clone()
    neg[1, 0] = 2**31
    return neg


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch pwned-by-a-split-file",))


def _npz_array(name: str, key: str, value) -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        path = file_of(case, name)
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        arrays[key] = value(arrays[key]) if callable(value) else value
        with open(path, "wb") as f:
            np.savez(f, **arrays)
    return mutate


def _npz_header_shape(case: Case) -> None:
    """data.npz whose node_feat header claims 10**9 rows; the data holds the few real ones."""
    path = file_of(case, "data.npz")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    feat = arrays.pop("node_feat")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": feat.dtype.str, "fortran_order": False, "shape": (10**9, feat.shape[1])})
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("node_feat.npy", header.getvalue() + feat.tobytes())
        for key, value in arrays.items():
            member = io.BytesIO()
            np.save(member, value)
            zf.writestr(f"{key}.npy", member.getvalue())


def _edge_text(name: str, index: int, text: str) -> Callable[[Case], None]:
    return lambda case: replace_line(file_of(case, name), index, text)


def _overwrite(name: str, offset: int, value: int) -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        path = file_of(case, name)
        data = bytearray(path.read_bytes())
        data[offset] = value
        path.write_bytes(bytes(data))
    return mutate


def _edit_pickle(name: str, edit: Callable) -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        path = file_of(case, name)
        with open(path, "rb") as f:
            obj = pickle.load(f)
        repickle(path, edit(obj))
    return mutate


def _broken_csr(m: sp.csr_matrix) -> sp.csr_matrix:
    del m.__dict__["indptr"]
    return m


def _graph_with(value) -> Callable[[dict], dict]:
    def edit(graph: dict) -> dict:
        graph[next(iter(graph))] = [value]
        return graph
    return edit


def _huge_labels(case: Case) -> None:
    path = file_of(case, "labels.npy")
    np.save(path, np.full(np.load(path).shape, 2**40))


def _one_node_no_splits(case: Case) -> None:
    for path in case.files:
        if path.suffix == ".pt":
            path.unlink()
    replace_line(file_of(case, "num-node-list.csv.gz"), 0, "1")


def _set_test_index(low: bool) -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        replace_line(file_of(case, "ind.fuzz.test.index"), 0, "3" if low else "999999")
    return mutate


OGB_CSV = build_ogb_csv
OGB_NPZ = lambda d, g: build_ogb_npz(d, g, False)
OGB_LINK = lambda d, g: build_ogb_link(d, g, True)
OGB_TYPED = lambda d, g: build_ogb_link(d, g, False, typed=True)
NPZ = lambda d, g: build_npz(d, g, zipped=False, extras=False)
NPZ_ZIP = lambda d, g: build_npz(d, g, zipped=True, extras=False)
EDGES_GZ = lambda d, g: build_edgelist(d, g, node_task=False, gz=True, sep=",")
EDGES_NODE = lambda d, g: build_edgelist(d, g, node_task=True, gz=False, sep=",")

FINDINGS = {
    # pandas raised TypeError (and numpy warned) for "inf" in an integer column.
    "inf-in-int-column": (OGB_CSV, _edge_text("edge.csv.gz", 0, "inf,1"),
                          r"edge.csv.gz line 1: 'inf' is not an integer"),
    # inf labels were cast to int64 (a warning, then a garbage class id).
    "inf-label": (OGB_CSV, _edge_text("node-label.csv.gz", 1, "inf"),
                  r"node-label.csv.gz line 2: inf is not a class id"),
    # A label beyond int32 wrapped when the store wrote labels as int32.
    "huge-label": (EDGES_NODE, _huge_labels, r"labels.npy\[0\]: 1099511627776 is not a class id"),
    # zlib.error escaped while sniffing the separator of a damaged gzip.
    "damaged-gzip-sniff": (EDGES_GZ, _overwrite("fuzz.csv.gz", 10, 0), r"fuzz.csv.gz: cannot read"),
    # tokenize.TokenError escaped numpy's parse of a damaged .npy header.
    "npy-header-nul": (EDGES_NODE, _overwrite("features.npy", 60, 0),
                       r"features.npy: not a readable .npy array"),
    # Flag bits in a zip directory: NotImplementedError and RuntimeError escaped.
    "zip-method": (NPZ_ZIP, lambda case: set_zip_entry_field(case.source, 10, b"\x63\x00"),
                   r"fuzz.zip: (cannot extract|not a readable archive)"),
    "zip-encrypted": (NPZ_ZIP, lambda case: set_zip_entry_field(case.source, 8, b"\x01\x00"),
                      r"fuzz.zip: (cannot extract|not a readable archive)"),
    "npz-method": (NPZ, lambda case: set_zip_entry_field(case.source, 10, b"\x63\x00"),
                   r"fuzz.npz: not a readable .npz archive"),
    # scipy.sparse refused big-endian values (ValueError): they are valid numbers.
    "big-endian-attributes": (NPZ, _npz_array("fuzz.npz", "attr_data", lambda a: a.astype(">f4")), None),
    # A header promising 10**9 rows made numpy allocate before finding the data short.
    "npz-header-shape": (OGB_NPZ, _npz_header_shape, r"data.npz\[node_feat\]: truncated"),
    # A float count was read with int(): NaN raised ValueError.
    "nan-node-count": (OGB_NPZ, _npz_array("data.npz", "num_nodes_list", np.array([np.nan])),
                       r"data.npz\[num_nodes_list\]: expected integer counts"),
    # Only attr_shape says how wide rows are; the converter allocated them dense.
    "huge-attribute-width": (NPZ, _npz_array("fuzz.npz", "attr_shape", lambda s: np.array([s[0], 2**40])),
                             r"fuzz.npz\[attr_shape\]: 1099511627776 attribute columns"),
    # A count too small was reported at the edge file only; zero nodes named the folder.
    "node-count-too-small": (OGB_LINK, _edge_text("num-node-list.csv.gz", 0, "1"),
                             (r"\.pt\['edge'\]\[\d+, \d+\]: node id \d+ out of range \[0, 1\) "
                              r"\(.*num-node-list.csv.gz says 1 nodes\)")),
    "node-count-too-small-edges": (OGB_LINK, _one_node_no_splits,
                                   (r"edge.csv.gz line \d+: .* out of range \[0, 1\) "
                                    r"\(.*num-node-list.csv.gz says 1 nodes\)")),
    "node-count-zero": (OGB_CSV, _edge_text("num-node-list.csv.gz", 0, "0"),
                        r"num-node-list.csv.gz line 1: 0 nodes; expected a count in \[1, "),
    # A huge count sized the label file before the labels were counted (ValueError).
    "node-count-huge": (OGB_CSV, _edge_text("num-node-list.csv.gz", 0, "9000000000000000000"),
                        r"num-node-list.csv.gz line 1: 9000000000000000000 nodes; expected a count"),
    # A negative relation id was reported at edge.csv.gz.
    "negative-relation": (OGB_TYPED, _edge_text("edge_reltype.csv.gz", 2, "-1"),
                          r"edge_reltype.csv.gz line 3: relation id -1"),
    # A bad id in a 2-D negatives array crashed the converter's message (IndexError).
    "negatives-out-of-range": (OGB_TYPED, _pt_value("test.pt", "tail_neg", _tail_neg_out_of_range),
                               r"test.pt\['tail_neg'\]\[1, 0\]: node id 2147483648 out of range"),
    # Damaged array state reached numpy's __setstate__ (a crash for some states).
    "pt-array-state": (OGB_TYPED, _pt_value("valid.pt", "tail_neg", BadArrayState()),
                       r"valid.pt: cannot load .*array data has 8 bytes"),
    "planetoid-array-state": (build_planetoid,
                              lambda case: repickle(file_of(case, "ind.fuzz.y"), BadArrayState()),
                              r"ind.fuzz.y: not a readable Planetoid pickle .*array data has 8 bytes"),
    # torch.load(weights_only=False) would have run this.
    "pt-runs-code": (OGB_TYPED, _pt_value("valid.pt", "head", RunsCode()),
                     r"valid.pt: cannot load \(it refers to .*system.*refusing to unpickle it\)"),
    # The C unpickler sized its memo by the largest id: gigabytes for one damaged id.
    "planetoid-memo-id": (build_planetoid, _huge_memo_id, None),
    # BYTEARRAY8 allocated (and zeroed) whatever length the file claimed.
    "planetoid-bytearray": (build_planetoid, _huge_bytearray,
                            r"ind.fuzz.y: .*a bytearray of 1099511627776 bytes"),
    # A damaged GLOBAL named a "module" with a carriage return: a two-line message.
    "planetoid-control-character": (build_planetoid, lambda case: file_of(case, "ind.fuzz.y").write_bytes(
        b"\x80\x02cos\rx\nsystem\n."), r"ind.fuzz.y: pickle refers to 'os\\rx.system'"),
    # A CSR matrix missing an attribute raised AttributeError later.
    "planetoid-broken-csr": (build_planetoid, _edit_pickle("ind.fuzz.tx", _broken_csr),
                             r"ind.fuzz.tx: not a valid sparse matrix"),
    # A wider x was reported as tx.
    "planetoid-width": (build_planetoid, _edit_pickle(
        "ind.fuzz.x", lambda m: sp.hstack([m, sp.csr_matrix((m.shape[0], 1))]).tocsr()),
        r"ind.fuzz.x: feature widths differ"),
    # Python 3's protocol 2 writes b"" as bytes(): refused before.
    "planetoid-empty-matrix": (build_planetoid, _zero_x, None),
    # A float id was truncated (1.5 -> 1); a huge one overflowed the pair keys.
    "planetoid-float-id": (build_planetoid, _edit_pickle("ind.fuzz.graph", _graph_with(1.5)),
                           r"ind.fuzz.graph: adjacency list of node \d+ names 1.5, not a node id"),
    "planetoid-huge-id": (build_planetoid, _edit_pickle("ind.fuzz.graph", _graph_with(2**62)),
                          (r"ind.fuzz.graph: adjacency list of node \d+ names .*not a node id "
                           r".*ind.fuzz.test.index")),
    # A damaged test id below allx, or far past it (the converter allocated every id up to it).
    "planetoid-test-id-low": (build_planetoid, _set_test_index(True),
                              r"ind.fuzz.test.index: node id 3 is below 506"),
    "planetoid-test-id-high": (build_planetoid, _set_test_index(False),
                               r"ind.fuzz.test.index: node id 999999 leaves"),
}


@pytest.mark.parametrize("finding", sorted(FINDINGS))
def test_fuzzing_findings_stay_fixed(tmp_path, monkeypatch, finding):
    build, mutate, expected = FINDINGS[finding]
    monkeypatch.chdir(tmp_path)  # where RunsCode would leave its file
    case = build(tmp_path / "src", random_graph(1))
    mutate(case)
    message = convert_outcome(case, tmp_path)
    if expected is None:
        assert message is None, message
    else:
        assert message is not None and re.search(expected, message), message
    assert not (tmp_path / "pwned-by-a-split-file").exists()
