"""Open Graph Benchmark datasets in their raw layout, read straight from the files.

Not through ogb's dataset classes: those prompt interactively, download when a file is
missing and cache ``.pt`` files that newer torch refuses. Two raw layouts::

    <root>/raw/edge.csv.gz, num-node-list.csv.gz, num-edge-list.csv.gz,
               [node-feat.csv.gz], [node-label.csv.gz], [edge_reltype.csv.gz]
    <root>/raw/data.npz (edge_index, node_feat, num_nodes_list, num_edges_list),
               [node-label.npz]                                  (ogbn-papers100M)
    <root>/split/<name>/{train,valid,test}.csv.gz     node property prediction
    <root>/split/<name>/{train,valid,test}.pt         link property prediction

Edges and features stream in chunks. Node labels and node split ids are streamed chunk
by chunk into ``.npy`` files under the work directory and handed out as read-only
memory maps, so reading them never holds an [N] array in memory. Link-prediction
``.pt`` splits are pickles and load whole, through torch's weights-only unpickler with
numeric numpy arrays allowed (what OGB's files hold), so a tampered file cannot run code.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from graphstore.errors import SourceError, SourceNotFoundError
from graphstore.layout.sources import _io
from graphstore.layout.sources._io import NpyMember, ReadContext, dataset_name
from graphstore.layout.sources._pickle import TORCH_SAFE_GLOBALS, materialize
from graphstore.layout.sources.base import TASK_LINK, TASK_NODE, EdgeChunk, EdgeSplit, SourceGraph

__all__ = ["OGB_NAME", "find_ogb_root", "is_ogb_name", "locate_ogb", "ogb_directed", "read_ogb"]

log = logging.getLogger(__name__)

OGB_NAME = re.compile(r"^ogb[nlg][-_][A-Za-z0-9][A-Za-z0-9_-]*$")
"""What an OGB dataset name looks like (``ogbn-arxiv``, ``ogbl_ddi``)."""

# Datasets OGB loads without adding inverse edges (master.csv ``add_inverse_edge`` False):
# their edge lists are directed. Every other single-graph dataset is undirected.
_DIRECTED = frozenset({"ogbn-arxiv", "ogbn-papers100m", "ogbl-citation2", "ogbl-wikikg2"})
# Folder names inside ogb's download zips, for an extracted zip or a folder never renamed.
_DOWNLOAD_NAMES = {
    "arxiv": "ogbn-arxiv",
    "products": "ogbn-products",
    "papers100M-bin": "ogbn-papers100M",
    "ddi": "ogbl-ddi",
    "collab": "ogbl-collab",
    "ppassoc": "ogbl-ppa",
    "citation-v2": "ogbl-citation2",
    "wikikg-v2": "ogbl-wikikg2",
}
_SPLITS = ("train", "valid", "test")
_HETERO_MARKERS = ("num-node-dict.csv.gz", "relations", "triplet-type-list.csv.gz", "edge_index_dict.npz")


def is_ogb_name(text: str) -> bool:
    """True when ``text`` looks like an OGB dataset name rather than a path."""
    return bool(OGB_NAME.match(str(text)))


def ogb_name(text: str) -> str:
    """Canonical name: ``ogbl_ddi`` -> ``ogbl-ddi``, ``arxiv`` (ogb's zip folder) ->
    ``ogbn-arxiv``; other names unchanged."""
    m = re.match(r"^(ogb[nlg])_(.+)$", text, flags=re.IGNORECASE)
    if m:
        return f"{m.group(1)}-{m.group(2)}"
    return _DOWNLOAD_NAMES.get(text, text)


def ogb_directed(name: str) -> bool:
    """Whether OGB treats the dataset's edge list as directed (see `_DIRECTED`)."""
    return ogb_name(name).lower() in _DIRECTED


def find_ogb_root(path: Path) -> Path:
    """The dataset directory (the one holding ``raw/``) for ``path`` or ``path/..``."""
    if (path / "raw").is_dir():
        return path
    if path.name == "raw" and path.is_dir():
        return path.parent
    raise SourceNotFoundError(f"raw/: directory not found (looked in {path})")


def locate_ogb(name: str, root: str | os.PathLike | None) -> Path:
    """Find (or, if ogb is installed, download) the dataset ``name`` under ``root``.

    Looks for ``<root>/<name with underscores>`` and ``<root>/<name>``; without a root,
    under ``./dataset`` (ogb's default) and ``.``. Never prompts.

    Raises
    ------
    SourceNotFoundError
        Nothing found and nothing downloaded; the message lists every place looked.
    """
    roots = [Path(root)] if root is not None else [Path.cwd() / "dataset", Path.cwd()]
    canonical = ogb_name(name)
    dir_names = list(dict.fromkeys([canonical.replace("-", "_"), canonical, name]))
    looked = [r / d for r in roots for d in dir_names]
    for candidate in looked:
        if (candidate / "raw").is_dir():
            return candidate
    downloaded, note = _download_with_ogb(canonical, roots[0])
    if downloaded is not None:
        return downloaded
    raise SourceNotFoundError(
        f"{canonical}: raw/edge.csv.gz (or raw/data.npz) not found; looked in "
        f"{', '.join(str(p / 'raw') for p in looked)}; {note}"
    )


def _download_with_ogb(name: str, root: Path) -> tuple[Path | None, str]:
    """Fetch the dataset with ogb's own downloader, when ogb is importable."""
    try:
        ogb_url = importlib.import_module("ogb.utils.url")
    except ImportError:
        return None, "the ogb package is not installed, so nothing was downloaded (pass --root DIR)"
    kind = {"ogbn": "nodeproppred", "ogbl": "linkproppred", "ogbg": "graphproppred"}[name[:4].lower()]
    try:
        package = importlib.import_module(f"ogb.{kind}")
        master = pd.read_csv(Path(package.__file__).parent / "master.csv", index_col=0,
                             keep_default_na=False)
        url, download_name = str(master[name]["url"]), str(master[name]["download_name"])
    except Exception as e:  # any failure reading ogb's own table means: no download
        return None, f"ogb has no download entry for {name} ({type(e).__name__}: {e})"
    target = root / name.replace("-", "_")
    log.info("downloading %s from %s into %s", name, url, root)
    previous = socket.getdefaulttimeout()
    # ogb's downloader opens the URL without a timeout; bound it so no network fails fast.
    socket.setdefaulttimeout(60)
    try:
        root.mkdir(parents=True, exist_ok=True)
        archive = Path(ogb_url.download_url(url, str(root), log=False))
        _io.extract_archive(archive, root, display=str(archive))
        archive.unlink()
        if (root / download_name).is_dir() and not target.exists():
            (root / download_name).rename(target)
    except Exception as e:  # network, disk or archive errors all end the attempt
        return None, f"downloading {url} with ogb failed ({type(e).__name__}: {e})"
    finally:
        socket.setdefaulttimeout(previous)
    if not (target / "raw").is_dir():
        return None, f"downloaded {url} but found no {target / 'raw'}"
    return target, ""


# --------------------------------------------------------------------------- helpers


def _raw_file(raw: Path, stem: str) -> Path | None:
    for name in (f"{stem}.csv.gz", f"{stem}.csv"):
        if (raw / name).is_file():
            return raw / name
    return None


def _single_count(file: Path, ctx: ReadContext) -> int:
    display = ctx.show(file)
    values = _io.read_csv_all(file, ncols=1, dtype=np.int64, display=display)[:, 0]
    if len(values) != 1:
        raise SourceError(
            f"{display}: {len(values)} lines (one per graph); only single-graph datasets "
            "(node or link property prediction) are supported"
        )
    if values[0] < 0:
        raise SourceError(f"{display} line 1: count {int(values[0])} is negative")
    return int(values[0])


def _to_numpy(value, display: str, key: str) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        raise SourceError(f"{display}[{key!r}]: expected integer node ids, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def _load_pt(file: Path):
    """``torch.load`` with the weights-only unpickler: a split file cannot run code, and
    its numpy arrays are rebuilt from checked state (`_pickle`), which a damaged file
    cannot turn into a crash."""
    import torch  # deferred: only link datasets need it

    allow = getattr(torch.serialization, "safe_globals", None)
    if allow is None:
        # torch < 2.5 cannot allow-list numpy arrays for the weights-only loader; the
        # legacy loader reads files of the dataset the user chose to convert.
        return torch.load(file, weights_only=False, map_location="cpu")
    with allow(TORCH_SAFE_GLOBALS):
        return materialize(torch.load(file, weights_only=True, map_location="cpu"))


def _pt_problem(error: Exception) -> str:
    """One line for a failed ``torch.load``: the refused global if that was it.

    torch's weights-only failures are paragraphs of advice around one line of reason;
    the advice (load with ``weights_only=False``) is not for files that are damaged.
    """
    text = str(error)
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    if paragraphs and paragraphs[0].startswith("Weights only load failed"):
        reasons = [p for p in paragraphs[1:] if not p.startswith("Check the documentation")]
        text = " ".join(reasons) or paragraphs[0]
        text = re.sub(r"^.*WeightsUnpickler error: ", "", text, flags=re.DOTALL)
        refused = re.search(r"GLOBAL (\S+)|function (\S+)|but got (<class '[^']+'>)", text)
        if refused:
            name = next(g for g in refused.groups() if g)
            return (f"it refers to {name}, which an OGB split never holds (only tensors and "
                    "numeric arrays); refusing to unpickle it")
    # torch's zip reader appends a paragraph about reporting bugs; the file is what is wrong.
    text = re.split(r" This is an internal miniz error| \(Could this error message be improved", text)[0]
    return f"{type(error).__name__}: {_io.one_line(text)}"


def _read_pt_split(file: Path, num_nodes: int, nodes_from: str, ctx: ReadContext
                   ) -> tuple[EdgeSplit, list[str]]:
    """One ``split/<name>/<split>.pt`` as an `EdgeSplit` and the keys it did not use.

    Node ids are checked to lie in ``[0, num_nodes)``; ``nodes_from`` names the file
    that gave ``num_nodes``. Relation ids are the caller's to check.
    """
    display = ctx.show(file)
    try:
        obj = _load_pt(file)
    except FileNotFoundError:
        raise SourceNotFoundError(f"{display}: file not found (looked in {file.parent})") from None
    except Exception as e:  # torch.load raises many types for a bad file
        raise SourceError(f"{display}: cannot load ({_pt_problem(e)})") from None
    if not isinstance(obj, dict):
        raise SourceError(f"{display}: expected a dict of arrays, got {type(obj).__name__}")

    def get(key: str, ndim: int, *, node_ids: bool = True) -> np.ndarray:
        array = _to_numpy(obj[key], display, key)
        if array.ndim != ndim:
            raise SourceError(f"{display}[{key!r}]: expected {ndim} dimensions, got shape {array.shape}")
        if node_ids:
            # Checked here, not only by the converter, so the message names the key and
            # the [row, column] of a bad id in a 2-D array.
            bad = np.argwhere((array < 0) | (array >= num_nodes))
            if len(bad):
                at = tuple(int(i) for i in bad[0])
                raise SourceError(f"{display}[{key!r}][{', '.join(map(str, at))}]: node id {array[at]} "
                                  f"out of range [0, {num_nodes}) ({nodes_from} says {num_nodes} nodes)")
        return array

    def check_rows(key: str, array: np.ndarray, n: int) -> None:
        if len(array) != n:
            raise SourceError(f"{display}[{key!r}]: {len(array)} rows, expected {n} (one per positive)")

    if "edge" in obj:
        used = {"edge", "edge_neg"}
        edge = get("edge", 2)
        if edge.shape[1] != 2:
            raise SourceError(f"{display}['edge']: expected shape [n, 2], got {edge.shape}")
        neg_src = neg_dst = None
        if "edge_neg" in obj:
            neg = get("edge_neg", 2)
            if neg.shape[1] != 2:
                raise SourceError(f"{display}['edge_neg']: expected shape [m, 2], got {neg.shape}")
            neg_src, neg_dst = neg[:, 0].copy(), neg[:, 1].copy()
        split = EdgeSplit(src=edge[:, 0].copy(), dst=edge[:, 1].copy(), neg_src=neg_src, neg_dst=neg_dst)
    elif "source_node" in obj:
        used = {"source_node", "target_node", "target_node_neg"}
        if "target_node" not in obj:
            raise SourceError(f"{display}: has 'source_node' but no 'target_node'")
        src, dst = get("source_node", 1), get("target_node", 1)
        check_rows("target_node", dst, len(src))
        neg_dst = None
        if "target_node_neg" in obj:
            neg_dst = get("target_node_neg", 2)
            check_rows("target_node_neg", neg_dst, len(src))
        split = EdgeSplit(src=src, dst=dst, neg_dst=neg_dst)
    elif "head" in obj:
        used = {"head", "relation", "tail", "tail_neg"}
        for key in ("relation", "tail"):
            if key not in obj:
                raise SourceError(f"{display}: has 'head' but no {key!r}")
        src, rel, dst = get("head", 1), get("relation", 1, node_ids=False), get("tail", 1)
        check_rows("relation", rel, len(src))
        check_rows("tail", dst, len(src))
        neg_dst = None
        if "tail_neg" in obj:
            neg_dst = get("tail_neg", 2)
            check_rows("tail_neg", neg_dst, len(src))
        split = EdgeSplit(src=src, dst=dst, rel=rel, neg_dst=neg_dst)
    else:
        raise SourceError(
            f"{display}: unknown split layout (keys {sorted(map(str, obj))}); expected 'edge', "
            "'source_node'/'target_node' or 'head'/'relation'/'tail'"
        )
    return split, sorted(str(k) for k in obj if k not in used)


def _choose_split_dir(root: Path, ctx: ReadContext) -> Path | None:
    split_root = root / "split"
    names = sorted(p.name for p in split_root.iterdir() if p.is_dir()) if split_root.is_dir() else []
    wanted = ctx.option("split")
    if wanted is not None:
        if str(wanted) not in names:
            raise SourceNotFoundError(
                f"split/{wanted}: directory not found (looked in {split_root}; "
                f"available: {', '.join(names) or 'none'})"
            )
        return split_root / str(wanted)
    if len(names) > 1:
        raise SourceError(f"{split_root}: several splits ({', '.join(names)}); choose one with --split")
    return split_root / names[0] if names else None


# --------------------------------------------------------------------------- reader


@dataclass
class _Graph:
    """What the two raw layouts (csv, npz) have in common, before splits."""

    num_nodes: int = 0
    num_edges_declared: int | None = None
    edges: Callable[[], Iterator[EdgeChunk]] | None = None
    feature_dim: int = 0
    features: Callable[[], Iterator[np.ndarray]] | None = None
    labels: np.ndarray | None = None
    """[N] int64 read-only memory map of a ``.npy`` under ``scratch``, or None."""
    num_classes: int = 0
    """Largest label + 1, computed while streaming (0 when nothing is labeled)."""
    scratch: Path | None = None
    """This read's folder under the work directory for spilled arrays (labels, splits)."""
    describe_edge: Callable[[int], str] | None = None
    describe_feature_row: Callable[[int], str] | None = None
    rel_file: Path | None = None
    files: dict[str, str] = field(default_factory=dict)
    consumed: set[str] = field(default_factory=set)
    """Names of the raw files read; the rest are reported as ignored."""


def _csv_graph(raw: Path, ctx: ReadContext) -> _Graph:
    g = _Graph()
    node_count_file = _raw_file(raw, "num-node-list")
    edge_file = _raw_file(raw, "edge")
    for stem, found in (("num-node-list", node_count_file), ("edge", edge_file)):
        if found is None:
            raise SourceNotFoundError(f"raw/{stem}.csv.gz: file not found (looked in {ctx.show(raw)})")
    g.num_nodes = _single_count(node_count_file, ctx)
    if not 0 < g.num_nodes <= _io.MAX_NUM_NODES:
        raise SourceError(f"{ctx.show(node_count_file)} line 1: {g.num_nodes} nodes; expected a count "
                          f"in [1, {_io.MAX_NUM_NODES}]")
    g.files["num_nodes"] = str(node_count_file)
    edge_count_file = _raw_file(raw, "num-edge-list")
    g.num_edges_declared = _single_count(edge_count_file, ctx) if edge_count_file else None
    g.rel_file = _raw_file(raw, "edge_reltype")
    g.files["edges"] = str(edge_file)
    g.consumed |= {p.name for p in (node_count_file, edge_count_file, edge_file, g.rel_file) if p}

    edge_display = ctx.show(edge_file)
    rel_file, declared, num_nodes = g.rel_file, g.num_edges_declared, g.num_nodes

    def edges():
        step = _io.EDGE_CHUNK_ROWS
        pairs = _io.iter_csv(edge_file, ncols=2, dtype=np.int64, chunk_rows=step, display=edge_display)
        rels = None
        if rel_file is not None:
            rels = _io.iter_csv(rel_file, ncols=1, dtype=np.int64, chunk_rows=step,
                                display=ctx.show(rel_file))
        total = 0
        for chunk in pairs:
            rel = None
            if rels is not None:
                rel_chunk = next(rels, None)
                if rel_chunk is None or len(rel_chunk) != len(chunk):
                    have = total + (0 if rel_chunk is None else len(rel_chunk))
                    raise SourceError(
                        f"{ctx.show(rel_file)}: {have} lines but {edge_display} has more edges "
                        f"(at least {total + len(chunk)})"
                    )
                rel = np.ascontiguousarray(rel_chunk[:, 0])
            if len(chunk) and chunk.max() >= num_nodes:
                # The converter would say "out of range"; only here is it known that the
                # range comes from another file, which may be the damaged one.
                row, col = np.argwhere(chunk >= num_nodes)[0]
                raise SourceError(
                    f"{edge_display} line {total + row + 1}: {('source', 'destination')[col]} node id "
                    f"{chunk[row, col]} out of range [0, {num_nodes}) ({ctx.show(node_count_file)} "
                    f"says {num_nodes} nodes)"
                )
            total += len(chunk)
            yield EdgeChunk(src=np.ascontiguousarray(chunk[:, 0]),
                            dst=np.ascontiguousarray(chunk[:, 1]), rel=rel)
        if rels is not None and next(rels, None) is not None:
            raise SourceError(f"{ctx.show(rel_file)}: more lines than the {total} edges of {edge_display}")
        if declared is not None and total != declared:
            raise SourceError(
                f"{edge_display}: {total} edges but {ctx.show(edge_count_file)} says {declared}"
            )

    g.edges = edges
    g.describe_edge = lambda i: f"line {i + 1}"
    g.describe_feature_row = lambda i: f"line {i + 1}"

    feat_file = _raw_file(raw, "node-feat")
    if feat_file is not None:
        g.consumed.add(feat_file.name)
        g.files["features"] = str(feat_file)
        feat_display = ctx.show(feat_file)
        dim = _io.count_columns(feat_file, display=feat_display)
        g.feature_dim = dim
        num_nodes = g.num_nodes

        def features():
            rows = 0
            for chunk in _io.iter_csv(feat_file, ncols=dim, dtype=np.float32,
                                      chunk_rows=_io.feature_chunk_rows(dim), display=feat_display):
                rows += len(chunk)
                yield chunk
            if rows != num_nodes:
                raise SourceError(
                    f"{feat_display}: {rows} rows but {ctx.show(node_count_file)} says {num_nodes} nodes"
                )

        g.features = features

    label_file = _raw_file(raw, "node-label")
    if label_file is not None:
        g.consumed.add(label_file.name)
        g.files["labels"] = str(label_file)
        display = ctx.show(label_file)
        width = _io.count_columns(label_file, display=display)
        if width > 1:
            raise SourceError(
                f"{display}: {width} label columns; multi-task labels are not supported"
            )
        g.scratch = _io.spill_dir(ctx, "ogb-")
        # Streamed into a .npy of N rows. Errors keep the precedence of reading the whole
        # file first: a parse error anywhere, then the first bad class id, then the count.
        bad: SourceError | None = None
        rows = 0
        with _io.Int64Spill(g.scratch / "labels.npy", length=max(0, g.num_nodes)) as spill:
            for chunk in _io.iter_csv(label_file, ncols=1, dtype=np.float64,
                                      chunk_rows=_io.EDGE_CHUNK_ROWS, display=display, missing_ok=True):
                if bad is None:
                    try:
                        spill.append(_io.class_ids(chunk[:, 0],
                                                   lambda i, first=rows: f"{display} line {first + i + 1}"))
                    except SourceError as e:
                        bad = e
                rows += len(chunk)
            if bad is not None:
                raise bad
            if rows != g.num_nodes:
                raise SourceError(
                    f"{display}: {rows} labels but {ctx.show(node_count_file)} says {g.num_nodes} nodes"
                )
            g.labels = spill.finish()
            g.num_classes = spill.max + 1
    return g


def _npz_count(m: NpyMember) -> int:
    """The one count of a single-graph ``num_nodes_list`` / ``num_edges_list``."""
    if m.dtype.kind not in "iu":
        raise SourceError(f"{m.display}: expected integer counts, got dtype {m.dtype}")
    parts = list(_io.iter_npy_flat(m, start=0, stop=m.size, chunk=max(1, m.size)))
    counts = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if len(counts) != 1:
        raise SourceError(f"{m.display}: {len(counts)} graphs; only single-graph datasets are supported")
    if counts[0] < 0 or counts[0] > np.iinfo(np.int64).max:
        raise SourceError(f"{m.display}: count {counts[0]} is not a size")
    return int(counts[0])


def _npz_graph(raw: Path, ctx: ReadContext) -> _Graph:
    g = _Graph()
    data_file = raw / "data.npz"
    display = ctx.show(data_file)
    members = _io.npz_members(data_file, display=display)
    g.files.update({"edges": str(data_file), "num_nodes": str(data_file)})
    g.consumed.add("data.npz")

    def need(key: str) -> NpyMember:
        if key not in members:
            raise SourceError(f"{display}: array {key!r} missing (has {_io.show_names(members)})")
        return members[key]

    g.num_nodes = _npz_count(need("num_nodes_list"))
    if not 0 < g.num_nodes <= _io.MAX_NUM_NODES:
        raise SourceError(f"{need('num_nodes_list').display}: {g.num_nodes} nodes; expected a count "
                          f"in [1, {_io.MAX_NUM_NODES}]")
    g.num_edges_declared = _npz_count(members["num_edges_list"]) if "num_edges_list" in members else None

    ei = need("edge_index")
    if len(ei.shape) != 2 or ei.shape[0] != 2 or ei.dtype.kind not in "iu":
        raise SourceError(f"{ei.display}: expected integer shape [2, E], got {ei.dtype} {ei.shape}")
    num_edges = ei.shape[1]
    if g.num_edges_declared is not None and g.num_edges_declared != num_edges:
        raise SourceError(f"{ei.display}: {num_edges} edges but num_edges_list says {g.num_edges_declared}")

    def edges():
        step = _io.EDGE_CHUNK_ROWS
        if ei.fortran_order:
            # Column-major [2, E] is E consecutive (src, dst) pairs.
            for flat in _io.iter_npy_flat(ei, start=0, stop=2 * num_edges, chunk=2 * step):
                pairs = flat.reshape(-1, 2).astype(np.int64)
                yield EdgeChunk(src=np.ascontiguousarray(pairs[:, 0]), dst=np.ascontiguousarray(pairs[:, 1]))
            return
        # Row-major: row 0 (sources) then row 1 (destinations); walk both in step.
        srcs = _io.iter_npy_flat(ei, start=0, stop=num_edges, chunk=step)
        dsts = _io.iter_npy_flat(ei, start=num_edges, stop=2 * num_edges, chunk=step)
        for s, d in zip(srcs, dsts):
            yield EdgeChunk(src=s.astype(np.int64), dst=d.astype(np.int64))

    g.edges = edges
    g.describe_edge = lambda i: f"edge_index[:, {i}]"
    g.describe_feature_row = lambda i: f"node_feat[{i}]"

    feat = members.get("node_feat")
    if feat is not None and not feat.dtype.hasobject and feat.shape:  # None is saved as an object
        if len(feat.shape) != 2 or feat.dtype.kind not in "biuf":
            raise SourceError(f"{feat.display}: expected numeric shape [N, D], got {feat.dtype} {feat.shape}")
        if feat.shape[0] != g.num_nodes:
            raise SourceError(f"{feat.display}: {feat.shape[0]} rows but num_nodes_list says {g.num_nodes}")
        g.feature_dim = int(feat.shape[1])
        g.files["features"] = str(data_file)
        out_dtype = _io.feature_dtype(feat.dtype)
        rows = _io.feature_chunk_rows(g.feature_dim, out_dtype.itemsize)
        g.features = lambda: _io.iter_npy_rows(feat, chunk_rows=rows, dtype=out_dtype)

    label_file = raw / "node-label.npz"
    if label_file.is_file():
        g.consumed.add(label_file.name)
        g.files["labels"] = str(label_file)
        label_display = ctx.show(label_file)
        label_members = _io.npz_members(label_file, display=label_display)
        if "node_label" not in label_members:
            has = _io.show_names(label_members)
            raise SourceError(f"{label_display}: array 'node_label' missing (has {has})")
        m = label_members["node_label"]
        if len(m.shape) == 2 and m.shape[1] > 1:
            raise SourceError(f"{m.display}: {m.shape[1]} label columns; multi-task labels are not supported")
        if len(m.shape) not in (1, 2) or m.dtype.kind not in "biuf":
            raise SourceError(f"{m.display}: expected numeric shape [N] or [N, 1], got {m.dtype} {m.shape}")
        if m.shape[0] != g.num_nodes:
            raise SourceError(f"{m.display}: {m.shape[0]} labels but num_nodes_list says {g.num_nodes} nodes")
        # Converted chunk by chunk into a .npy of N rows: no [N] array is ever in memory.
        g.scratch = _io.spill_dir(ctx, "ogb-")
        with _io.Int64Spill(g.scratch / "labels.npy", length=m.shape[0]) as spill:
            for chunk in _io.iter_npy_flat(m, start=0, stop=m.size, chunk=_io.EDGE_CHUNK_ROWS):
                first = spill.count
                spill.append(_io.class_ids(chunk, lambda i, first=first: f"{m.display} row {first + i}"))
            g.labels = spill.finish()
            g.num_classes = spill.max + 1
    return g


def _num_relations(rel_file: Path | None, splits: dict[str, EdgeSplit], split_files: dict[str, Path],
                   ctx: ReadContext) -> int:
    """Largest relation id + 1 over the graph's and the splits' relations.

    Ids of the graph's edges outside ``[0, MAX_CLASS_ID]`` are refused here, naming the
    relation file and line (the converter would name the edge file); larger split ids
    too, naming the split file: the store keeps relation ids as int32.
    """
    highest = -1
    if rel_file is not None:
        display = ctx.show(rel_file)
        row = 0
        for chunk in _io.iter_csv(rel_file, ncols=1, dtype=np.int64, chunk_rows=_io.EDGE_CHUNK_ROWS,
                                  display=display):
            rel = chunk[:, 0]
            bad = np.flatnonzero((rel < 0) | (rel > _io.MAX_CLASS_ID))
            if len(bad):
                raise SourceError(f"{display} line {row + int(bad[0]) + 1}: relation id {int(rel[bad[0]])} "
                                  f"is not in [0, {_io.MAX_CLASS_ID}]")
            if len(rel):
                highest = max(highest, int(rel.max()))
            row += len(rel)
    for name, split in splits.items():
        if split.rel is not None and len(split.rel):
            top = int(np.argmax(split.rel))
            if split.rel[top] > _io.MAX_CLASS_ID:
                raise SourceError(f"{ctx.show(split_files[name])}['relation'][{top}]: relation id "
                                  f"{int(split.rel[top])} is larger than {_io.MAX_CLASS_ID}")
            highest = max(highest, int(split.rel[top]))
    return highest + 1


def read_ogb(path: Path, ctx: ReadContext) -> SourceGraph:
    """Read an OGB node or link property prediction dataset from its raw files.

    Node task when node labels exist, link task when ``split/<name>/*.pt`` exist.
    ``directed`` follows OGB (`ogb_directed`), unless the ``directed`` option is given.
    For a link dataset without ``train.pt`` (the shared ogbl-ddi copy) the training
    edges are the raw edges; ``split_origin["train"]`` says so.
    """
    root = find_ogb_root(path)
    raw = root / "raw"
    for marker in _HETERO_MARKERS:
        if (raw / marker).exists():
            raise SourceError(
                f"{ctx.show(raw / marker)}: heterogeneous OGB datasets (ogbn-mag, ogbl-biokg) are "
                "not supported"
            )
    if (raw / "graph-label.csv.gz").exists():
        raise SourceError(
            f"{ctx.show(raw / 'graph-label.csv.gz')}: graph property prediction datasets are not supported"
        )
    layout = "npz" if (raw / "data.npz").is_file() and _raw_file(raw, "edge") is None else "csv"
    g = _npz_graph(raw, ctx) if layout == "npz" else _csv_graph(raw, ctx)

    name = ogb_name(ctx.origin) if is_ogb_name(ctx.origin) else ogb_name(dataset_name(str(root)))
    split_dir = _choose_split_dir(root, ctx)
    split_files = {}
    node_splits: dict[str, np.ndarray] = {}
    edge_splits: dict[str, EdgeSplit] = {}
    extra: dict = {"layout": layout}
    origin: dict = {"kind": "none"}
    tasks: list[str] = []

    if g.labels is not None:
        tasks.append(TASK_NODE)
        if split_dir is not None:
            for s in _SPLITS:
                file = _raw_file(split_dir, s)
                if file is None:
                    raise SourceNotFoundError(
                        f"split/{split_dir.name}/{s}.csv.gz: file not found "
                        f"(looked in {ctx.show(split_dir)})"
                    )
                # Streamed into a .npy; the line count is known only at the end.
                with _io.Int64Spill(g.scratch / f"split-{s}.npy") as spill:
                    for chunk in _io.iter_csv(file, ncols=1, dtype=np.int64,
                                              chunk_rows=_io.EDGE_CHUNK_ROWS, display=ctx.show(file)):
                        spill.append(chunk[:, 0])
                    node_splits[s] = spill.finish()
                split_files[s] = file
            origin = {"kind": "shipped", "name": split_dir.name}

    if split_dir is not None and any(split_dir.glob("*.pt")):
        tasks.append(TASK_LINK)
        nodes_from = ctx.show(g.files["num_nodes"])
        unused: dict[str, list[str]] = {}
        for s in ("valid", "test"):
            file = split_dir / f"{s}.pt"
            edge_splits[s], unused[s] = _read_pt_split(file, g.num_nodes, nodes_from, ctx)
            split_files[s] = file
        origin = {"kind": "shipped", "name": split_dir.name}
        train_file = split_dir / "train.pt"
        if train_file.is_file():
            edge_splits["train"], unused["train"] = _read_pt_split(train_file, g.num_nodes, nodes_from, ctx)
            split_files["train"] = train_file
        else:
            # Only the training edges are missing, and for OGB link datasets those are
            # exactly the raw graph edges. Held in memory like the .pt splits would be.
            chunks = list(g.edges())

            def joined(part: str) -> np.ndarray:
                arrays = [getattr(c, part) for c in chunks]
                return np.concatenate(arrays) if arrays else np.zeros(0, np.int64)

            has_rel = bool(chunks) and chunks[0].rel is not None
            edge_splits["train"] = EdgeSplit(
                src=joined("src"), dst=joined("dst"), rel=joined("rel") if has_rel else None
            )
            split_files["train"] = Path(g.files["edges"])
            origin["train"] = (
                f"raw edges: split/{split_dir.name}/train.pt is absent, so the training edges "
                "are the raw graph edges"
            )
        if any(unused.values()):
            extra["split_extra_keys"] = {s: keys for s, keys in unused.items() if keys}

    num_relations = 0
    if any(split.rel is not None for split in edge_splits.values()) and g.rel_file is None:
        # Typed split edges need typed graph edges, and only the raw file has those.
        raise SourceNotFoundError(
            f"raw/edge_reltype.csv.gz: file not found (looked in {ctx.show(raw)}); the split "
            "files give relations, so the graph edges need them too"
        )
    if g.rel_file is not None:
        num_relations = _num_relations(g.rel_file, edge_splits, split_files, ctx)
        g.files["relations"] = str(g.rel_file)

    g.files.update({f"split:{s}": str(f) for s, f in split_files.items()})
    ignored = sorted(p.name for p in raw.iterdir() if p.name not in g.consumed)
    if ignored:
        extra["ignored_raw_files"] = ignored
    if g.num_edges_declared is not None:
        extra["num_edges_declared"] = g.num_edges_declared
    num_classes = g.num_classes if g.labels is not None else 0

    return SourceGraph(
        name=name,
        format="ogb",
        path=ctx.origin,
        num_nodes=g.num_nodes,
        directed=bool(ctx.option("directed", ogb_directed(name))),
        edges=g.edges,
        num_relations=num_relations,
        feature_dim=g.feature_dim,
        features=g.features,
        labels=g.labels,
        num_classes=num_classes,
        node_splits=node_splits,
        edge_splits=edge_splits,
        split_origin=origin,
        tasks=tuple(tasks),
        files=g.files,
        describe_edge=g.describe_edge,
        describe_feature_row=g.describe_feature_row,
        extra=extra,
    )
