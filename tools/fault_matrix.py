#!/usr/bin/env python
"""Fault matrix: inject real faults into real stores and record what graphstore does.

Issue 12 promises integrity on every read, one writer at a time, and durable writes. This
tool checks those promises the way they get broken in practice: real stores on disk, real
processes (the ``graphstore`` command and the trainer scripts, run as subprocesses), and
``kill -9`` sent at an observed moment (after a conversion phase's log line, after an
epoch's line, when a temporary file of an embedding write-back appears), bits flipped
inside one edge bucket or node partition of a chunk file (so that the partial-read path
is what has to catch them, not only ``verify``), truncated and missing chunk files, a
tmpfs that fills up, a file system that refuses ``O_DIRECT`` (tmpfs before Linux 6.6;
ramfs), and a second writer. Each fault is one row:

========== =============================================================================
fault      what was done
detected   ``yes`` / ``no``: graphstore noticed (for faults that need handling rather
           than noticing, such as a tmpfs without ``O_DIRECT``: it handled them);
           ``not run`` with the reason (not root, no strace); ``error``: the tool failed
how        the one-line error graphstore printed, or the check that caught the fault
data_lost  ``none`` or what was lost (silently wrong data counts as lost)
exit_code  of the process the fault was aimed at (-9: it was killed)
one_line   the error was one line on stderr with nothing else there (no traceback, no
           warning); None where no error was expected or none was printed
seconds    the row's wall time
========== =============================================================================

Each row also has ``name``, ``ok`` (detected and every check passed), ``checks`` (name ->
passed), ``problems`` (the failed checks in words), ``commands`` (every command run, to
repeat a row by hand), ``notes`` and row-specific ``details``. The rows are written as a
JSON list to ``--json`` and printed as a markdown table.

Usage::

    .venv/bin/python tools/fault_matrix.py --json OUT.json [--workdir DIR] [--only NAMES]
        [--jobs 2] [--seed 0] [--keep] [--list]

``--only`` takes row names or group names, comma-separated (``--list`` prints them).
Rows that mount a tmpfs or ramfs need root; without it they say ``not run`` and why. Every
subprocess has a timeout; mounts, processes this tool started and the work directory are
cleaned up however the tool ends (an error, Ctrl-C, SIGTERM). Stores are tiny (Cora, a
240-node knowledge graph, a 200k-node synthetic graph for the conversion kills) so the
whole matrix runs in about two minutes on a quiet two-core machine (twice that when other
work shares the cores).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import faulthandler
import hashlib
import json
import os
import random
import re
import select
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
GRAPHSTORE = [PY, "-m", "graphstore"]
NC = [PY, str(REPO / "trainers" / "node_classification.py")]
LP = [PY, str(REPO / "trainers" / "link_prediction.py")]
CORA_SOURCE = REPO / "data" / "cora"
# The trainer tests' fast settings: a few seconds per run, most of it Python start-up.
NC_FAST = ["--fanouts", "10,10", "--hidden", "32", "--lr", "0.02", "--batch-size", "1000", "--normalize-features", "none",
           # out of core whatever the memory (the buffer is sized from memory by default), and a
           # validation pass every epoch, so a resumed run selects what an uninterrupted one does
           "--buffer-partitions", "4", "--eval-every", "1"]
LP_FAST = ["--negatives", "32", "--num-chunks", "4", "--batch-size", "256", "--lr", "0.1", "--buffer-partitions", "2"]
TIMEOUT = 120.0
"""Seconds any one subprocess may run before it is killed (and the row says so)."""
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}  # lines arrive as printed: kills land on time

_PROCS: list[Proc] = []
_MOUNTS: list[Path] = []
_GLOBAL_LOCK = threading.Lock()


class NotRun(Exception):
    """The row cannot run on this machine (not root, no strace); the message says why."""


# ---------------------------------------------------------------------- processes


@dataclass
class Result:
    """A finished subprocess: its command, exit code, output and wall time."""

    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    @property
    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]

    @property
    def error(self) -> str:
        """The ``PROG: error: ...`` line (else the last line of stderr, else "")."""
        lines = self.stderr_lines
        return next((line for line in lines if ": error: " in line), lines[-1] if lines else "")

    @property
    def one_line(self) -> bool:
        """Exactly one line on stderr, and it is the error (no traceback, no warnings)."""
        lines = self.stderr_lines
        return len(lines) == 1 and ": error: " in lines[0]


class Proc:
    """A subprocess running in the background whose output lines are collected as they
    arrive, so the tool can act at the moment a line appears (`wait_line`)."""

    def __init__(self, argv: Sequence[Any], *, cwd: Path | None = None, stdin_pipe: bool = False,
                 timeout: float = TIMEOUT, env: dict[str, str] | None = None) -> None:
        self.argv = [str(a) for a in argv]
        self.timeout = timeout
        self.started = time.perf_counter()
        self.popen = subprocess.Popen(
            self.argv, cwd=cwd, env={**ENV, **(env or {})}, text=True, bufsize=1,
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        with _GLOBAL_LOCK:
            _PROCS.append(self)
        self.pid = self.popen.pid
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._closed = {"stdout": False, "stderr": False}
        self._cond = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(name, getattr(self.popen, name)),
                                          daemon=True) for name in ("stdout", "stderr")]
        for t in self._readers:
            t.start()

    def _read(self, name: str, stream) -> None:
        for line in stream:
            with self._cond:
                self.lines[name].append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._closed[name] = True
            self._cond.notify_all()

    def wait_line(self, pattern: str, *, stream: str = "stdout", timeout: float = 60.0) -> str | None:
        """The first line of ``stream`` matching ``pattern`` (waiting for it), or None when
        the stream ends or ``timeout`` passes first."""
        regex = re.compile(pattern)
        end = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                lines = self.lines[stream]
                for line in lines[seen:]:
                    if regex.search(line):
                        return line
                seen = len(lines)
                left = end - time.monotonic()
                if self._closed[stream] or left <= 0:
                    return None
                self._cond.wait(min(left, 0.5))

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL this process (ours, by its pid), if it still runs."""
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = None) -> Result:
        """Wait for the exit (killing it past its timeout) and return what it did."""
        left = self.timeout - (time.perf_counter() - self.started) if timeout is None else timeout
        timed_out = False
        try:
            self.popen.wait(timeout=max(0.1, left))
        except subprocess.TimeoutExpired:
            timed_out = True
            self.kill()
            self.popen.wait()
        for t in self._readers:
            t.join(timeout=10)
        if self.popen.stdin is not None:
            try:
                self.popen.stdin.close()
            except OSError:
                pass
        with self._cond:
            out, err = "\n".join(self.lines["stdout"]), "\n".join(self.lines["stderr"])
        if timed_out:
            err += f"\n[fault_matrix: timed out after {self.timeout:.0f} s and was killed]"
        seconds = time.perf_counter() - self.started
        return Result(self.argv, self.popen.returncode, out, err, seconds, timed_out)


def run(argv: Sequence[Any], *, cwd: Path | None = None, timeout: float = TIMEOUT,
        env: dict[str, str] | None = None) -> Result:
    """Run a command to its end (at most ``timeout`` seconds); ``env`` adds variables."""
    return Proc(argv, cwd=cwd, timeout=timeout, env=env).wait()


def kill_all() -> None:
    """SIGKILL every process this tool started that still runs (each by its own pid)."""
    with _GLOBAL_LOCK:
        procs = list(_PROCS)
    for p in procs:
        p.kill()
    for p in procs:
        try:
            p.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def parallel(*calls: Callable[[], Any]) -> list[Any]:
    """Run independent calls (each usually one subprocess) two at a time: two cores."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


# ---------------------------------------------------------------------- mounts


def _umount(path: Path) -> None:
    for argv in (["umount", str(path)], ["umount", "-l", str(path)]):
        if subprocess.run(argv, capture_output=True, timeout=30).returncode == 0:
            break
    with _GLOBAL_LOCK:
        if path in _MOUNTS:
            _MOUNTS.remove(path)


@contextmanager
def mounted(path: Path, fstype: str = "tmpfs", size: str | None = None):
    """A ``fstype`` file system (tmpfs, ramfs) of ``size`` mounted at ``path`` for the
    block; unmounted afterwards, even on an error (processes still using it are killed
    first, else the unmount would fail)."""
    if os.geteuid() != 0:
        raise NotRun(f"needs root to mount a {fstype} (mount -t {fstype}); run the tool as root")
    path.mkdir(parents=True, exist_ok=True)
    options = ["-o", f"size={size}"] if size else []
    res = subprocess.run(["mount", "-t", fstype, *options, fstype, str(path)],
                         capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise NotRun(f"cannot mount a {fstype} at {path}: {res.stderr.strip() or res.returncode}")
    with _GLOBAL_LOCK:
        _MOUNTS.append(path)
    try:
        yield path
    finally:
        kill_all()
        _umount(path)


def fill(path: Path) -> int:
    """Write a ballast file at ``path`` until its file system is full; returns its bytes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    total = 0
    try:
        for block in (1 << 16, 4096, 512, 1):  # big steps, then the last crumbs
            while True:
                try:
                    total += os.write(fd, b"\0" * block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return total


# ---------------------------------------------------------------------- inotify


class DirWatch:
    """Files created in some directories, as the kernel reports them (inotify), so a kill
    can follow the creation of a write-back's temporary file within microseconds."""

    IN_CREATE = 0x100

    def __init__(self, dirs: Iterable[Path]) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if not hasattr(libc, "inotify_init1"):
            raise NotRun("no inotify on this system")
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.dirs: dict[int, Path] = {}
        try:
            for d in dirs:
                wd = libc.inotify_add_watch(self.fd, os.fsencode(d), self.IN_CREATE)
                if wd < 0:
                    raise OSError(ctypes.get_errno(), f"inotify_add_watch {d} failed")
                self.dirs[wd] = Path(d)
        except BaseException:
            os.close(self.fd)
            raise

    def events(self, timeout: float) -> list[Path]:
        """Paths created since the last call (waiting up to ``timeout`` for one)."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        out, i = [], 0
        while i + 16 <= len(data):
            wd, _mask, _cookie, n = struct.unpack_from("iIII", data, i)
            name = data[i + 16 : i + 16 + n].split(b"\0", 1)[0].decode(errors="replace")
            out.append(self.dirs.get(wd, Path("?")) / name)
            i += 16 + n
        return out

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> DirWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------- stores


def write_clustered_kg(directory: Path, *, num_nodes: int = 240, num_clusters: int = 8,
                       num_relations: int = 3, num_triples: int = 3000, seed: int = 0) -> None:
    """``train/valid/test.txt`` of a small learnable knowledge graph (tail in the head's
    cluster), as the trainer tests use: link prediction learns it in a few epochs."""
    rng = np.random.default_rng(seed)
    cluster = np.arange(num_nodes) % num_clusters
    members = [np.flatnonzero(cluster == c) for c in range(num_clusters)]
    head = rng.integers(0, num_nodes, num_triples * 2)
    tail = np.array([rng.choice(members[cluster[h]]) for h in head])
    rel = rng.integers(0, num_relations, head.size)
    triples = np.unique(np.stack([head, rel, tail], 1), axis=0)
    triples = triples[rng.permutation(len(triples))][:num_triples]
    n_eval = len(triples) // 10
    parts = {"valid": triples[:n_eval], "test": triples[n_eval:2 * n_eval], "train": triples[2 * n_eval:]}
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in parts.items():
        lines = [f"e{h}\tr{r}\te{t}" for h, r, t in rows]
        if name == "train":  # every entity in training
            lines += [f"e{v}\tr0\te{(v + num_clusters) % num_nodes}" for v in range(num_nodes)]
        (directory / f"{name}.txt").write_text("\n".join(lines) + "\n")


def chunk_location(store: Path, name: str, row: int) -> tuple[Path, int, int]:
    """Where row ``row`` of array ``name`` lies: (chunk file, byte offset in it, row bytes).

    Read from the array's ``zarr.json`` (regular grid chunked on axis 0, raw little-endian
    rows then a crc32c trailer: the layout `graphstore.layout._chunkio` documents).
    """
    meta = json.loads((store / name / "zarr.json").read_text())
    shape = meta["shape"]
    rows_per_chunk = meta["chunk_grid"]["configuration"]["chunk_shape"][0]
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(meta["data_type"]).itemsize
    sep = meta["chunk_key_encoding"]["configuration"]["separator"]
    key = sep.join(["c", str(row // rows_per_chunk)] + ["0"] * (len(shape) - 1))
    return store / name / key, (row % rows_per_chunk) * row_bytes, row_bytes


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    """XOR one bit of the file in place (size and times of the rest untouched)."""
    size = path.stat().st_size
    if not 0 <= offset < size - 4:  # the last 4 bytes are the chunk's crc32c: flip data
        raise ValueError(f"{path}: offset {offset} is not inside the data of a {size}-byte chunk file")
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, offset)[0] ^ (1 << bit)
        os.pwrite(fd, bytes([byte]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def bucket_name(i: int, j: int) -> str:
    """How graphstore names bucket (i, j) in its errors."""
    return f"bucket (src partition {i}, dst partition {j})"


def try_read(fn: Callable[[], Any]) -> tuple[str | None, str]:
    """Run an in-process read; (exception class name or None, its message on one line
    or "" when the read succeeded)."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the row reports whatever it was
        return type(exc).__name__, str(exc)
    return None, ""


def store_state(path: Path) -> str:
    """What sits at ``path``: "missing", "complete store", or why it does not open."""
    import graphstore

    if not path.exists():
        return "missing"
    kind, message = try_read(lambda: graphstore.open(path).close())
    return "complete store" if kind is None else f"{kind}: {message}"


def tree_digest(path: Path) -> str:
    """sha256 over the relative paths and bytes of every file under ``path`` (locks aside)."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file() and p.name != ".writer.lock"):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def read_all_embeddings(store: Path) -> tuple[str | None, str, np.ndarray | None]:
    """Every partition of the store's embeddings through `EmbeddingTable.read_partition`
    (checksum verified): (error kind or None, message, the table)."""
    import graphstore
    from graphstore.layout.embeddings import EmbeddingTable

    out: list[np.ndarray] = []

    def read() -> None:
        with graphstore.open(store) as s:
            out.append(EmbeddingTable.open(s).read_all())

    kind, message = try_read(read)
    return kind, message, out[0] if out else None


def metrics_signature(path: Path) -> dict[str, Any]:
    """What an exact resume must reproduce: final metrics, and each epoch's loss and metrics."""
    m = json.loads(path.read_text())
    return {"final": m["final"],
            "epochs": [{"train_loss": e["train_loss"], "valid": e.get("valid"), "test": e.get("test")}
                       for e in m["epochs"]]}


class Lab:
    """The work directory and the base stores, made once and copied by the rows that
    damage them."""

    def __init__(self, workdir: Path, seed: int) -> None:
        self.workdir = workdir
        self.seed = seed
        self._cache: dict[str, Path] = {}
        self._lock = threading.RLock()  # kg() makes kg_source() inside its own _once

    def dir(self, name: str) -> Path:
        """A fresh directory for a row."""
        d = self.workdir / name
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d

    def _once(self, key: str, make: Callable[[], Path]) -> Path:
        with self._lock:
            if key not in self._cache:
                self._cache[key] = make()
            return self._cache[key]

    def cora(self) -> Path:
        """Cora, 8 METIS partitions: 4 feature chunks of 2 partitions, one edge chunk."""
        import graphstore

        def make() -> Path:
            out = self.workdir / "base" / "cora.gs"
            graphstore.convert(CORA_SOURCE, out, num_partitions=8, partitioner="metis")
            return out
        return self._once("cora", make)

    def cora_compressed(self) -> Path:
        """Cora as ``convert --compress`` writes it: every array zstd, read through zarr."""
        import graphstore

        def make() -> Path:
            out = self.workdir / "base" / "cora-zstd.gs"
            graphstore.convert(CORA_SOURCE, out, num_partitions=8, partitioner="metis", compress=True)
            return out
        return self._once("cora_compressed", make)

    def kg_source(self) -> Path:
        def make() -> Path:
            out = self.workdir / "base" / "kg-src"
            write_clustered_kg(out)
            return out
        return self._once("kg_source", make)

    def kg(self) -> Path:
        """The knowledge graph: 240 entities, 3 relations, 4 random partitions, no features."""
        import graphstore

        def make() -> Path:
            out = self.workdir / "base" / "kg.gs"
            graphstore.convert(self.kg_source(), out, num_partitions=4, partitioner="random")
            return out
        return self._once("kg", make)

    def _synthetic(self, name: str, *, num_nodes: int, feature_dim: int) -> Path:
        def make() -> Path:
            out = self.workdir / "base" / name
            res = run([PY, REPO / "tools" / "make_synthetic.py", "--out", out, "--num-nodes", num_nodes,
                       "--avg-degree", 10, "--feature-dim", feature_dim, "--layout", "npz", "--no-progress"])
            if res.returncode != 0:
                raise RuntimeError(f"make_synthetic failed: {res.error}")
            return out
        return self._once(name, make)

    def synthetic(self) -> Path:
        """A 200k-node synthetic OGB dataset: METIS makes its conversion last seconds."""
        return self._synthetic("synthetic", num_nodes=200000, feature_dim=32)

    def synthetic_aligned(self) -> Path:
        """32768 nodes x 128 float32 features: 4 partitions of exactly 4 MiB, one chunk
        each, so the buffer's partition reads are whole aligned chunks (O_DIRECT reads)."""
        return self._synthetic("synthetic-aligned", num_nodes=32768, feature_dim=128)

    def copy(self, store: Path, dest: Path) -> Path:
        shutil.copytree(store, dest)
        return dest


# ---------------------------------------------------------------------- rows


@dataclass
class Row:
    """One fault and what graphstore did about it (columns in the module docstring)."""

    name: str
    fault: str
    detected: str = "no"
    how: str = ""
    data_lost: str = "none"
    exit_code: int | str | None = None
    one_line: bool | None = None
    seconds: float = 0.0
    ok: bool = False
    checks: dict[str, bool] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    _kinds: dict[str, str] = field(default_factory=dict, repr=False)

    def check(self, name: str, passed: bool, note: str = "", *, kind: str = "detect") -> bool:
        """Record a check. ``kind``: "detect" (decides ``detected``), "lost" (data kept),
        "line" (message form) or "setup" (the fault happened as intended)."""
        self.checks[name] = bool(passed)
        self._kinds[name] = kind
        if not passed:
            self.problems.append(f"{name}: {note}" if note else name)
        return bool(passed)

    def ran(self, result: Result) -> Result:
        """Note a finished command (for repeating the row by hand); returns it."""
        self.commands.append(result.command)
        if result.timed_out:
            self.problems.append(f"timed out: {result.command}")
        return result

    def finish(self) -> None:
        if self.detected not in ("not run", "error"):
            detect = [ok for n, ok in self.checks.items() if self._kinds[n] == "detect"]
            self.detected = "yes" if detect and all(detect) else "no"
        self.ok = self.detected == "yes" and not self.problems
        self.how = " ".join(self.how.split())  # one line in the table, whatever came in

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


@dataclass(frozen=True)
class RowSpec:
    name: str
    group: str
    fault: str
    fn: Callable[[Lab, Row], None]
    parallel_ok: bool = False
    """True: no kill timing in the row, so it may run beside another such row."""


ROWS: list[RowSpec] = []


def row(name: str, group: str, fault: str, *, parallel_ok: bool = False):
    """Register a row function ``fn(lab, row)``."""
    def register(fn: Callable[[Lab, Row], None]) -> Callable[[Lab, Row], None]:
        ROWS.append(RowSpec(name, group, fault, fn, parallel_ok))
        return fn
    return register


def expect_error(r: Row, res: Result, *, names: Sequence[str], what: str, code: int = 1) -> None:
    """The common checks of a refused or failed command: exit ``code``, one line, naming
    every string of ``names``; fills ``how``, ``exit_code`` and ``one_line``."""
    r.exit_code = res.returncode
    r.how = res.error or f"not detected: no error printed, exit {res.returncode}"
    r.one_line = res.one_line if res.stderr_lines or res.returncode != 0 else None
    r.check(f"{what} exits {code}", res.returncode == code, f"exit code {res.returncode}")
    missing = [n for n in names if n not in res.error]
    r.check(f"{what}'s error names {', '.join(names)}", not missing, f"missing {missing} in {res.error!r}")
    if res.returncode == 0 and not res.stderr_lines:
        return  # no error at all: the checks above failed already, there is no line to judge
    if not r.check(f"{what}'s error is one line", res.one_line, kind="line"):
        r.details.setdefault("stderr", {})[what] = res.stderr[-2000:]


# ---- 1. kill -9 during convert --------------------------------------------------------


@row("kill_convert", "kill", "kill -9 during convert (at 3 moments), then convert again")
def kill_convert(lab: Lab, r: Row) -> None:
    source = lab.synthetic()
    d = lab.dir("kill_convert")
    out = d / "syn.gs"
    argv = [*GRAPHSTORE, "-v", "convert", source, out, "--partitioner", "metis"]
    # Moments from the converter's own phase log (-v, on stderr): METIS running, edge
    # chunks half written, and everything written (fsync and rename come next).
    moments = [("partitioning", r"_convert: partition \.\.\."),
               ("writing edges", r"_convert: write edges \.\.\."),
               ("after the segment checksums (fsync, rename next)", r"_convert: segment checksums done")]
    kills = []
    for label, pattern in moments:
        p = Proc(argv, cwd=d)
        line = p.wait_line(pattern, stream="stderr", timeout=90)
        p.kill()
        res = r.ran(p.wait(30))
        temps = sorted(t.name for t in d.glob(f".{out.name}.tmp-*"))
        state = store_state(out)
        kills.append({"moment": label, "exit_code": res.returncode, "temporaries": temps, "at_out": state})
        r.check(f"killed {label}", line is not None and res.returncode == -signal.SIGKILL,
                f"line seen: {line is not None}, exit {res.returncode}", kind="setup")
        if state == "complete store":
            # The kill came after the rename: a whole store, which is allowed. Move it
            # away so the next kill meets the same situation.
            r.notes.append(f"kill {label} landed after the rename: a complete store at OUT")
            shutil.rmtree(out)
        else:
            r.check(f"no store at OUT after the kill {label}",
                    not out.exists() or "StoreNotFoundError" in state, f"OUT holds: {state}")
    final = r.ran(run(argv, cwd=d))
    left = sorted(t.name for t in d.glob(f".{out.name}.tmp-*"))
    r.check("the next convert succeeds", final.returncode == 0, final.error)
    r.check("no .OUT.tmp-* left after the next convert", not left, f"left: {left}", kind="lost")
    verify = r.ran(run([*GRAPHSTORE, "verify", out], cwd=d))
    r.check("the new store verifies", verify.returncode == 0, verify.error)
    r.details["kills"] = kills
    r.exit_code = -signal.SIGKILL
    opened = [k["at_out"] for k in kills]
    most = max(len(k["temporaries"]) for k in kills)
    r.how = (f"after each kill OUT was {'/'.join(sorted(set(opened)))} with {most} temporary dir(s) beside "
             f"it; the next convert removed them ({len(left)} left) and succeeded (exit {final.returncode}), "
             f"verify exit {verify.returncode}")
    r.data_lost = "none" if not left else f"stale temporaries left: {left}"


@row("kill_overwrite", "kill",
     "kill -9 during convert --overwrite (late phase; and at its swap, via strace)")
def kill_overwrite(lab: Lab, r: Row) -> None:
    d = lab.dir("kill_overwrite")
    out = lab.copy(lab.cora(), d / "cora.gs")
    before = tree_digest(out)
    argv = [*GRAPHSTORE, "-v", "convert", CORA_SOURCE, out, "--partitions", "8", "--overwrite"]
    # (a) a kill at the last phase, from its log line: the old store must be untouched.
    p = Proc(argv, cwd=d)
    line = p.wait_line(r"_convert: segment checksums done", stream="stderr", timeout=60)
    p.kill()
    res = r.ran(p.wait(30))
    r.check("killed after the segment checksums", line is not None and res.returncode == -signal.SIGKILL,
            f"exit {res.returncode}", kind="setup")
    state_a = store_state(out)
    same = out.exists() and tree_digest(out) == before
    # The old store untouched, or (had the kill come after the rename) the new one whole.
    r.check("(a) OUT holds a complete store after a late kill", state_a == "complete store",
            f"OUT: {state_a}", kind="lost")
    if not same:
        r.notes.append("(a) the late kill came after the rename: OUT holds the new store")
    # (b) the swap itself. convert --overwrite replaces the store with one renameat2
    # (RENAME_EXCHANGE): there is no moment between an "old store aside" rename and a "new
    # store in place" one any more. strace delivers the SIGKILL at the entry of the main
    # thread's first rename-family call, the exchange (zarr's own renames run on worker
    # threads, which strace does not follow without -f): OUT must still be the old store.
    strace = shutil.which("strace")
    if strace is None:
        r.notes.append("strace not installed: the kill at the swap was not run")
    else:
        traced = [strace, "-qq", "-o", os.devnull, "-e", "trace=rename,renameat,renameat2",
                  "-e", "inject=rename,renameat,renameat2:signal=SIGKILL:when=1",
                  *GRAPHSTORE, "convert", CORA_SOURCE, out, "--partitions", "8", "--overwrite"]
        # No .pyc writes (renames of their own on the main thread) to throw the count off.
        res_b = r.ran(run(traced, cwd=d, env={"PYTHONDONTWRITEBYTECODE": "1"}))
        olds = sorted(t.name for t in d.glob(f".{out.name}.tmp-*.old"))
        state_b = store_state(out)
        landed = res_b.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)
        r.check("(b) strace killed convert at its swap", landed,
                f"exit {res_b.returncode}, .old dirs {olds}, OUT {state_b}", kind="setup")
        r.details["between_renames"] = {"exit_code": res_b.returncode, "at_out": state_b, "old_dirs": olds}
        r.check("(b) OUT is never a partial store", state_b in ("missing", "complete store"), state_b)
        r.check("(b) a store is at OUT after the kill", state_b == "complete store",
                f"OUT: {state_b}; the old store sits in {olds}", kind="lost")
        # What the user does next: the same command again.
        again = r.ran(run(argv, cwd=d))
        olds_after = sorted(t.name for t in d.glob(f".{out.name}.tmp-*"))
        r.details["between_renames"]["next_convert"] = {"exit_code": again.returncode, "left": olds_after}
        if state_b != "complete store":
            r.data_lost = (f"the old store: after the kill OUT was {state_b}; left beside it: {olds}; "
                           f"after the next convert: {olds_after}")
    r.exit_code = -signal.SIGKILL
    r.how = (f"(a) late kill: OUT {state_a}, bytes unchanged: {same}"
             + (f"; (b) kill at the swap (renameat2 RENAME_EXCHANGE): OUT {r.details['between_renames']['at_out']}"
                if "between_renames" in r.details else ""))


# ---- 2. kill -9 during training, then --resume ---------------------------------------


@row("kill_train_nc", "kill",
     "kill -9 during node classification training (after epoch 2 of 4), then --resume")
def kill_train_nc(lab: Lab, r: Row) -> None:
    store = lab.cora()
    d = lab.dir("kill_train_nc")
    a, b = d / "straight", d / "killed"
    base = [*NC, "--store", store, "--scheme", "disk", "--epochs", 4, *NC_FAST]
    straight = Proc([*base, "--checkpoint-dir", a, "--metrics-out", a / "m.json"], cwd=d)
    killed = Proc([*base, "--checkpoint-dir", b, "--metrics-out", b / "m.json"], cwd=d)
    line = killed.wait_line(r"^epoch 2/4 ", timeout=90)
    killed.kill()
    res_k = r.ran(killed.wait(30))
    res_s = r.ran(straight.wait())
    r.check("killed after the epoch 2 line", line is not None and res_k.returncode == -signal.SIGKILL,
            f"exit {res_k.returncode}", kind="setup")
    r.check("the uninterrupted run succeeds", res_s.returncode == 0, res_s.error, kind="setup")
    res_r = r.ran(run([*base, "--checkpoint-dir", b, "--resume", "--metrics-out", b / "m.json"], cwd=d))
    _compare_resume(r, res_r, a / "m.json", b / "m.json")
    r.exit_code = res_k.returncode


@row("kill_train_lp", "kill",
     "kill -9 during link prediction (disk scheme, learnable embeddings; after epoch 2 of 3), then --resume")
def kill_train_lp(lab: Lab, r: Row) -> None:
    d = lab.dir("kill_train_lp")
    stores = {name: lab.copy(lab.kg(), d / f"{name}.gs") for name in ("straight", "killed")}
    a, b = d / "straight", d / "killed"
    args = ["--scheme", "disk", "--policy", "comet", "--epochs", 3, "--embedding-dim", 16, *LP_FAST]
    straight = Proc([*LP, "--store", stores["straight"], *args, "--checkpoint-dir", a,
                     "--metrics-out", a / "m.json"], cwd=d)
    base = [*LP, "--store", stores["killed"], *args, "--checkpoint-dir", b, "--metrics-out", b / "m.json"]
    killed = Proc(base, cwd=d)
    line = killed.wait_line(r"^epoch 2/3 ", timeout=90)
    killed.kill()
    res_k = r.ran(killed.wait(30))
    res_s = r.ran(straight.wait())
    r.check("killed after the epoch 2 line", line is not None and res_k.returncode == -signal.SIGKILL,
            f"exit {res_k.returncode}", kind="setup")
    r.check("the uninterrupted run succeeds", res_s.returncode == 0, res_s.error, kind="setup")
    res_r = r.ran(run([*base, "--resume"], cwd=d))
    _compare_resume(r, res_r, a / "m.json", b / "m.json")
    ka, ma, ea = read_all_embeddings(stores["straight"])
    kb, mb, eb = read_all_embeddings(stores["killed"])
    same = ea is not None and eb is not None and np.array_equal(ea, eb)
    r.check("the resumed store's embeddings equal the uninterrupted run's", same,
            f"{ka or ''} {ma} {kb or ''} {mb}".strip() or "values differ", kind="lost")
    r.exit_code = res_k.returncode
    if not same:
        r.data_lost = "embeddings differ from the uninterrupted run's"


def _compare_resume(r: Row, res: Result, straight: Path, resumed: Path) -> None:
    r.check("the resumed run succeeds", res.returncode == 0, res.error)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("resumed from")), "")
    if res.returncode != 0 or not straight.is_file() or not resumed.is_file():
        r.how = res.error or "no metrics"
        r.data_lost = "the run could not be resumed"
        return
    sa, sb = metrics_signature(straight), metrics_signature(resumed)
    same = sa == sb
    r.check("final and per-epoch metrics equal the uninterrupted run's", same,
            f"straight {sa['final']} / resumed {sb['final']}")
    r.details["final"] = sb["final"]
    r.details["resumed_from"] = json.loads(resumed.read_text()).get("resumed_from")
    verdict = "identical to" if same else "DIFFERENT from"
    r.how = f"{line}; final and per-epoch metrics {verdict} the uninterrupted run"
    r.data_lost = "none" if same else "the resumed run differs from the uninterrupted one"


# ---- 3. kill -9 during embedding write-back -------------------------------------------


@row("kill_writeback", "kill", "kill -9 during embedding write-back (link prediction disk scheme), 6 tries")
def kill_writeback(lab: Lab, r: Row) -> None:
    import graphstore
    from graphstore.layout._verify import verify_store
    from graphstore.layout.embeddings import EmbeddingTable

    d = lab.dir("kill_writeback")
    store = lab.copy(lab.kg(), d / "kg.gs")
    dim = 256  # 60 rows x 2 x 256 floats = 123 kB a partition: a write (and fsync) to land in
    with graphstore.open(store, mode="r+") as s:
        EmbeddingTable.create(s, dim)
        p = s.num_partitions
    dirs = [store / "embeddings" / "params" / "c" / str(k) / "0" for k in range(p)]
    argv = [*LP, "--store", store, "--scheme", "disk", "--policy", "comet", "--epochs", 3,
            "--embedding-dim", dim, *LP_FAST]
    rng = random.Random(lab.seed)
    tries = []
    # Try 0 kills the fresh run's initialisation (it rewrites every partition); the others
    # kill a training write-back, the n-th after the run's header, after a random delay.
    plan = [("init", 2, 0.0)] + [("training", rng.randint(1, 3), rng.choice([0.0, 0.0, 0.0005, 0.001, 0.003]))
                                 for _ in range(5)]
    for phase, nth, delay in plan:
        known = {f for dd in dirs for f in dd.iterdir()}
        with DirWatch(dirs) as watch:
            proc = Proc(argv, cwd=d)
            if phase == "training":
                proc.wait_line(r"^scheme ", timeout=90)
                watch.events(0)  # the initialisation's writes: not this try's target
            seen, killed_at = 0, None
            end = time.monotonic() + 60
            while killed_at is None and proc.running and time.monotonic() < end:
                for path in watch.events(0.05):
                    if path.name.endswith(".tmp"):
                        seen += 1
                        if seen == nth:
                            if delay:
                                time.sleep(delay)
                            proc.kill()
                            killed_at = path.name
                            break
            proc.kill()
            res = r.ran(proc.wait(30))
        left = sorted(str(f.relative_to(store)) for dd in dirs for f in dd.iterdir() if f not in known)
        kind, message, _ = read_all_embeddings(store)
        vkind, vmessage = try_read(lambda: verify_store(store))
        tries.append({"phase": phase, "nth_write": nth, "delay_s": delay, "killed_at": killed_at,
                      "exit_code": res.returncode, "mid_write": bool(left), "temporaries_left": left,
                      "partitions_read": kind is None, "verify": vkind or "OK",
                      "error": message or vmessage})
        r.check(f"try {len(tries)}: every embeddings partition reads", kind is None, f"{kind}: {message}")
        r.check(f"try {len(tries)}: the store verifies", vkind is None, f"{vkind}: {vmessage}")
    verify = r.ran(run([*GRAPHSTORE, "verify", store], cwd=d))
    r.check("graphstore verify exits 0 after all tries", verify.returncode == 0, verify.error)
    r.check("the verify prints nothing on stderr", not verify.stderr_lines,
            " | ".join(verify.stderr_lines)[:300], kind="line")
    landed = sum(t["mid_write"] for t in tries)
    r.check("at least one kill landed mid-write (a temporary file left behind)", landed > 0,
            "no kill caught a write in progress: rerun", kind="setup")
    stray = [f for t in tries for f in t["temporaries_left"]]
    if stray:
        r.notes.append(f"{len(stray)} temporary file(s) of killed write-backs stay in the store "
                       f"(nothing removes them; one partition's size each): {stray}")
    r.details["tries"] = tries
    r.exit_code = -signal.SIGKILL
    kills = sum(t["exit_code"] == -signal.SIGKILL for t in tries)
    r.how = (f"{kills} kills, {landed} mid-write; after each: "
             f"every partition read ({sum(t['partitions_read'] for t in tries)}/{len(tries)}), "
             f"store verified ({sum(t['verify'] == 'OK' for t in tries)}/{len(tries)}); "
             f"graphstore verify exit {verify.returncode}")
    bad = [t for t in tries if not t["partitions_read"] or t["verify"] != "OK"]
    r.data_lost = "none" if not bad else f"torn or unreadable embeddings after {len(bad)} kill(s)"


# ---- 4. flipped bits ------------------------------------------------------------------


@dataclass
class Flip:
    """A bit to flip: the array, the base store, and the kind of piece of the array it
    lies in (which decides the in-process read that must catch it)."""

    array: str
    kind: str  # "nc" (Cora) or "lp" (the knowledge graph)
    segment: str | None  # "bucket" / "partition" / None (an array read whole)
    byte_in_row: int = 0
    split: str | None = None


def _largest_diagonal_bucket(store: Path) -> tuple[int, int, int]:
    """(i, first row, stop row) of the largest bucket (i, i): read whenever partition i
    is resident, whatever the policy's order."""
    import graphstore

    with graphstore.open(store) as s:
        ranges = [(s.bucket_range(i, i), i) for i in range(s.num_partitions)]
    (lo, hi), i = max(ranges, key=lambda x: x[0][1] - x[0][0])
    return i, lo, hi


def _flip_row(lab: Lab, r: Row, spec: Flip) -> None:
    import graphstore

    d = lab.dir(r.name)
    store = lab.copy(lab.cora() if spec.kind == "nc" else lab.kg(), d / "store.gs")
    with graphstore.open(store) as s:
        p = s.num_partitions
    expected = [spec.array]
    # The read that has to catch the bit: of its bucket or partition alone where it lies
    # in one (the partial-read path), else the array's whole read.
    if spec.segment == "bucket":
        i, lo, hi = _largest_diagonal_bucket(store)
        target_row = (lo + hi) // 2
        expected.append(bucket_name(i, i))

        def read(s: Any) -> Any:
            return s.read_bucket(i, i)
    elif spec.segment == "partition":
        k = p // 2 - 1 if p > 2 else 0  # partition 3 of 8: inside a chunk, not at its start
        with graphstore.open(store) as s:
            lo, hi = s.partition_range(k)
        target_row = (lo + hi) // 2
        expected.append(f"partition {k}")

        def read(s: Any) -> Any:
            return s.read_features(k) if spec.array == "nodes/features" else s.read_labels(k)
    elif spec.array == "edges/bucket_offsets":
        i, _, _ = _largest_diagonal_bucket(store)
        target_row = i * p + i + 1  # the end of bucket (i, i)

        def read(s: Any) -> Any:
            return None  # the offsets are read (whole) when the store opens
    else:  # a split, read whole through zarr
        target_row = 1

        def read(s: Any) -> Any:
            if spec.array.startswith("splits/nodes"):
                return s.read_node_split(spec.split)
            return s.read_edge_split(spec.split)
    path, offset, row_bytes = chunk_location(store, spec.array, target_row)
    flip_bit(path, offset + min(spec.byte_in_row, row_bytes - 1))
    rel = str(path.relative_to(store / spec.array))
    r.details.update({"chunk_file": str(path.relative_to(store)), "byte": offset, "row": target_row,
                      "expected_names": expected})

    def direct() -> None:
        with graphstore.open(store) as s:
            read(s)
    kind, message = try_read(direct)
    r.details["direct_read"] = {"error": kind, "message": message}
    r.check("an in-process read raises CorruptStoreError", kind == "CorruptStoreError", f"{kind}: {message}")
    missing = [n for n in expected if n not in message]
    r.check("the read's error names the array and the bucket/partition", not missing,
            f"missing {missing} in {message!r}")
    if spec.segment is not None:
        r.check("the read's error names the chunk file", f"chunk file {rel}" in message,
                f"no 'chunk file {rel}' in {message!r}", kind="line")
    if spec.kind == "nc":
        train = [*NC, "--store", store, "--scheme", "disk", "--epochs", 1, *NC_FAST]
    else:
        train = [*LP, "--store", store, "--scheme", "disk", "--policy", "comet", "--epochs", 1,
                 "--embedding-dim", 16, *LP_FAST]
    res, verify = parallel(lambda: run(train, cwd=d), lambda: run([*GRAPHSTORE, "verify", store], cwd=d))
    r.ran(res)
    r.ran(verify)
    # The trainer's reads are whole chunks or buckets; the chunk naming is enough there.
    expect_error(r, res, names=[spec.array], what="the trainer")
    r.check("the verify exits 1 naming the array", verify.returncode == 1 and spec.array in verify.error,
            f"exit {verify.returncode}: {verify.error}")
    r.check("the verify's error is one line", verify.one_line, " | ".join(verify.stderr_lines)[:400],
            kind="line")
    r.details["verify"] = verify.error
    r.data_lost = ("none" if res.returncode == 1
                   else f"the trainer read the flipped bit without an error (exit {res.returncode})")


@row("flip_features", "flip",
     "flipped bit in nodes/features (partition 3, inside a 2-partition chunk)", parallel_ok=True)
def flip_features(lab: Lab, r: Row) -> None:
    _flip_row(lab, r, Flip("nodes/features", "nc", "partition", byte_in_row=1))


@row("flip_labels", "flip",
     "flipped bit in nodes/labels (partition 3 of a one-chunk array)", parallel_ok=True)
def flip_labels(lab: Lab, r: Row) -> None:
    _flip_row(lab, r, Flip("nodes/labels", "nc", "partition"))


@row("flip_src", "flip", "flipped bit in edges/src (inside the largest diagonal bucket)", parallel_ok=True)
def flip_src(lab: Lab, r: Row) -> None:
    _flip_row(lab, r, Flip("edges/src", "nc", "bucket"))


@row("flip_dst", "flip", "flipped bit in edges/dst (inside the largest diagonal bucket)", parallel_ok=True)
def flip_dst(lab: Lab, r: Row) -> None:
    _flip_row(lab, r, Flip("edges/dst", "nc", "bucket"))


@row("flip_rel", "flip",
     "flipped bit in edges/rel (knowledge graph, inside the largest diagonal bucket)", parallel_ok=True)
def flip_rel(lab: Lab, r: Row) -> None:
    _flip_row(lab, r, Flip("edges/rel", "lp", "bucket"))


@row("flip_bucket_offsets", "flip", "flipped bit in edges/bucket_offsets", parallel_ok=True)
def flip_bucket_offsets(lab: Lab, r: Row) -> None:
    _flip_row(lab, r, Flip("edges/bucket_offsets", "nc", None))


@row("flip_node_split", "flip", "flipped bit in a node split (splits/nodes/train)", parallel_ok=True)
def flip_node_split(lab: Lab, r: Row) -> None:
    _flip_row(lab, r, Flip("splits/nodes/train", "nc", None, split="train"))


@row("flip_edge_split", "flip", "flipped bit in an edge split (splits/edges/valid/src)", parallel_ok=True)
def flip_edge_split(lab: Lab, r: Row) -> None:
    _flip_row(lab, r, Flip("splits/edges/valid/src", "lp", None, split="valid"))


@row("flip_embeddings", "flip",
     "flipped bit in embeddings/params (partition 2; the store's chunk and a checkpoint's copy "
     "restored by --resume)", parallel_ok=True)
def flip_embeddings(lab: Lab, r: Row) -> None:
    import graphstore
    from graphstore.layout.embeddings import EmbeddingTable

    d = lab.dir(r.name)
    store = lab.copy(lab.kg(), d / "store.gs")
    ck = d / "ck"
    args = ["--store", store, "--scheme", "disk", "--policy", "comet", "--embedding-dim", 16, *LP_FAST,
            "--checkpoint-dir", ck]
    first = r.ran(run([*LP, *args, "--epochs", 1], cwd=d))
    r.check("a first epoch writes the embeddings and a checkpoint", first.returncode == 0, first.error,
            kind="setup")
    k = 2
    name = "embeddings/params"
    with graphstore.open(store) as s:
        lo, hi = s.partition_range(k)
    path, offset, _ = chunk_location(store, name, (lo + hi) // 2)
    flip_bit(path, offset + 1)  # a byte of a row's embedding value
    key = str(path.relative_to(store / name))

    def direct() -> None:
        with graphstore.open(store) as s:
            EmbeddingTable.open(s).read_partition(k)
    kind, message = try_read(direct)
    r.details["direct_read"] = {"error": kind, "message": message}
    r.check("EmbeddingTable.read_partition raises CorruptStoreError", kind == "CorruptStoreError",
            f"{kind}: {message}")
    names = [name, f"partition {k}", f"chunk file {key}"]
    missing = [n for n in names if n not in message]
    r.check("the read's error names the array, partition and chunk file", not missing, f"missing {missing}")
    verify = r.ran(run([*GRAPHSTORE, "verify", store], cwd=d))
    r.check("the verify exits 1 naming the array", verify.returncode == 1 and name in verify.error,
            f"exit {verify.returncode}: {verify.error}")
    r.check("the verify's error is one line", verify.one_line, " | ".join(verify.stderr_lines)[:400],
            kind="line")
    r.details["verify"] = verify.error
    # The training path: a damaged checkpoint copy, restored into the store by --resume
    # and then read by the buffer.
    flip_bit(ck / "epoch-0000" / "embeddings" / key, offset + 1)
    res = r.ran(run([*LP, *args, "--epochs", 2, "--resume"], cwd=d))
    expect_error(r, res, names=[name, f"partition {k}"], what="the resumed trainer")
    r.data_lost = ("none" if res.returncode == 1
                   else f"the trainer read the flipped bit without an error (exit {res.returncode})")


# ---- 5. truncated and missing chunk files ---------------------------------------------


def _chunk_row(lab: Lab, r: Row, array: str, chunk: str, *, truncate_to: float | None,
               read: Callable[[Any], Any], names: Sequence[str], compressed: bool = False) -> None:
    """Damage one chunk file of a Cora copy (truncate it to a fraction of its size, or
    delete it); an in-process read, the trainer and verify must each say so."""
    import graphstore

    d = lab.dir(r.name)
    store = lab.copy(lab.cora_compressed() if compressed else lab.cora(), d / "store.gs")
    path = store / array / chunk
    size = path.stat().st_size
    if truncate_to is None:
        path.unlink()
    else:
        os.truncate(path, int(size * truncate_to))
    r.details["chunk_file"] = str(path.relative_to(store))

    def direct() -> None:
        with graphstore.open(store) as s:
            read(s)
    kind, message = try_read(direct)
    r.details["direct_read"] = {"error": kind, "message": message}
    r.check("an in-process read raises CorruptStoreError", kind == "CorruptStoreError",
            f"{kind}: {message}" if kind else "the read returned data (fill values) without an error")
    missing = [n for n in names if n not in message]
    r.check("the read's error names the array and chunk file", not missing,
            f"missing {missing} in {message!r}")
    train = [*NC, "--store", store, "--scheme", "disk", "--epochs", 1, *NC_FAST]
    res, verify = parallel(lambda: run(train, cwd=d), lambda: run([*GRAPHSTORE, "verify", store], cwd=d))
    r.ran(res)
    r.ran(verify)
    expect_error(r, res, names=names, what="the trainer")
    r.check("the verify exits 1 naming the array", verify.returncode == 1 and array in verify.error,
            f"exit {verify.returncode}: {verify.error}")
    r.details["verify"] = verify.error
    if res.returncode == 0:
        r.how += f" (the trainer ran to the end); only verify caught it: {verify.error}"
    if kind is None or res.returncode == 0:
        r.data_lost = (f"{array} read as fill values (zeros) without an error"
                       + ("; the trainer ran to the end on them" if res.returncode == 0 else
                          f"; the trainer failed later with: {res.error}"))


@row("truncated_chunk", "truncated", "truncated chunk file (edges/src c/0 cut to a third)", parallel_ok=True)
def truncated_chunk(lab: Lab, r: Row) -> None:
    # A bucket past the cut: its bytes are not in the file any more.
    _chunk_row(lab, r, "edges/src", "c/0", truncate_to=1 / 3,
               read=lambda s: s.read_bucket(s.num_partitions - 1, s.num_partitions - 1),
               names=["edges/src", "chunk 0"])


@row("missing_chunk", "missing", "missing chunk file (nodes/features c/1/0)", parallel_ok=True)
def missing_chunk(lab: Lab, r: Row) -> None:
    _chunk_row(lab, r, "nodes/features", "c/1/0", truncate_to=None, read=lambda s: s.read_features(3),
               names=["nodes/features", "chunk 1/0", "missing"])


@row("missing_chunk_compressed", "missing",
     "missing chunk file in a compressed store (convert --compress; nodes/features c/1/0)", parallel_ok=True)
def missing_chunk_compressed(lab: Lab, r: Row) -> None:
    # Compressed arrays are read through zarr (not the chunk files directly).
    _chunk_row(lab, r, "nodes/features", "c/1/0", truncate_to=None, read=lambda s: s.read_features(3),
               names=["nodes/features", "missing"], compressed=True)


@row("missing_chunk_offsets", "missing",
     "missing chunk file of an array read through zarr (edges/bucket_offsets c/0)", parallel_ok=True)
def missing_chunk_offsets(lab: Lab, r: Row) -> None:
    _chunk_row(lab, r, "edges/bucket_offsets", "c/0", truncate_to=None, read=lambda s: s.read_bucket(3, 3),
               names=["edges/bucket_offsets", "missing"])


@row("missing_chunk_split", "missing",
     "missing chunk file of a split (splits/nodes/train c/0)", parallel_ok=True)
def missing_chunk_split(lab: Lab, r: Row) -> None:
    _chunk_row(lab, r, "splits/nodes/train", "c/0", truncate_to=None,
               read=lambda s: s.read_node_split("train"), names=["splits/nodes/train", "missing"])


# ---- 6. ENOSPC ------------------------------------------------------------------------


@row("enospc_convert", "enospc", "ENOSPC during convert (Cora, 16 MiB, into a 2 MiB tmpfs)")
def enospc_convert(lab: Lab, r: Row) -> None:
    d = lab.dir("enospc_convert")
    with mounted(d / "mnt", "tmpfs", "2m") as mnt:
        out = mnt / "cora.gs"
        res = r.ran(run([*GRAPHSTORE, "convert", CORA_SOURCE, out, "--partitions", "8"], cwd=d))
        expect_error(r, res, names=[str(out)], what="convert")
        r.check("the error says the disk is full", "no space left" in res.error.lower(), res.error)
        left = sorted(p.name for p in mnt.iterdir())
        r.check("nothing left on the tmpfs (no store, no temporary dir)", not left, f"left: {left}",
                kind="lost")
        r.details["left_on_tmpfs"] = left
        r.data_lost = "none" if not left else f"left behind: {left}"


@row("enospc_writeback", "enospc",
     "ENOSPC during embedding write-back (store on a 4 MiB tmpfs filled after epoch 1)")
def enospc_writeback(lab: Lab, r: Row) -> None:
    d = lab.dir("enospc_writeback")
    with mounted(d / "mnt", "tmpfs", "4m") as mnt:
        store = lab.copy(lab.kg(), mnt / "kg.gs")
        argv = [*LP, "--store", store, "--scheme", "disk", "--policy", "comet", "--epochs", 4,
                "--embedding-dim", 16, *LP_FAST]
        proc = Proc(argv, cwd=d)
        line = proc.wait_line(r"^epoch 1/4 ", timeout=90)
        ballast = fill(mnt / "ballast") if line is not None else 0
        free = shutil.disk_usage(mnt).free
        res = r.ran(proc.wait())
        r.check("the tmpfs filled up during training", line is not None and free < 4096,
                f"epoch line seen: {line is not None}, {free} bytes free", kind="setup")
        r.details.update({"ballast_bytes": ballast, "free_bytes": free})
        expect_error(r, res, names=[str(store)], what="the trainer")
        r.check("the error says the disk is full", "no space left" in res.error.lower(), res.error)
        kind, message, _ = read_all_embeddings(store)
        verify = r.ran(run([*GRAPHSTORE, "verify", store], cwd=d))
        r.check("every embeddings partition reads (old or new)", kind is None, f"{kind}: {message}",
                kind="lost")
        r.check("the store verifies", verify.returncode == 0, verify.error, kind="lost")
        temps = sorted(str(p.relative_to(store)) for p in store.rglob("*.tmp"))
        r.check("no temporary files left in the store", not temps, f"left: {temps}", kind="lost")
        r.details["verify"] = verify.stdout.strip()
        lost = [c for c in ("every embeddings partition reads (old or new)", "the store verifies")
                if not r.checks.get(c)]
        r.data_lost = "none" if not lost else "; ".join(lost) + " FAILED"


# ---- 7. a second writer ---------------------------------------------------------------

PROBE = r"""
import sys, warnings, json
import graphstore
from graphstore.errors import GraphStoreError
op, path = sys.argv[1], sys.argv[2]
try:
    if op == "hold":  # open with mode r+ and keep it open until stdin closes
        s = graphstore.open(path, mode="r+")
        print("holding", flush=True)
        sys.stdin.read()
        s.close()
    elif op in ("r", "r+"):
        graphstore.open(path, mode=op).close()
        print("opened", flush=True)
    elif op == "warnings":  # open twice: how many UnverifiedReadsWarning, and what they say
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                graphstore.open(path).close()
        print(json.dumps([{"category": w.category.__name__, "message": str(w.message)} for w in caught]))
except GraphStoreError as e:
    print(f"probe: error: {type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(1)
"""


def probe(op: str, store: Path) -> list[str]:
    return [PY, "-c", PROBE, op, str(store)]


@row("second_writer_open", "second_writer",
     "second writer: two processes open the store with mode r+", parallel_ok=True)
def second_writer_open(lab: Lab, r: Row) -> None:
    d = lab.dir("second_writer_open")
    store = lab.copy(lab.kg(), d / "kg.gs")
    holder = Proc(probe("hold", store), cwd=d, stdin_pipe=True, timeout=60)
    try:
        held = holder.wait_line(r"^holding", timeout=30)
        r.check("the first process holds the writer lock", held is not None, kind="setup")
        second, reader = parallel(lambda: run(probe("r+", store), cwd=d, timeout=30),
                                  lambda: run(probe("r", store), cwd=d, timeout=30))
        r.ran(second)
        r.ran(reader)
        expect_error(r, second, names=["StoreLockedError", str(store), f"pid {holder.pid}"],
                     what="the second r+ opener")
        r.check("a reader opens meanwhile (readers never wait)", reader.returncode == 0, reader.error)
        r.details["refused_in_s"] = round(second.seconds, 2)
    finally:
        holder.popen.stdin.close()
        done = r.ran(holder.wait(30))
    r.check("the first writer closes normally", done.returncode == 0, done.error, kind="setup")
    after = r.ran(run(probe("r+", store), cwd=d, timeout=30))
    r.check("r+ opens again once the writer is gone", after.returncode == 0, after.error)
    r.data_lost = "none"


@row("second_writer_trainer", "second_writer",
     "second writer: two link-prediction trainers with embeddings on one store")
def second_writer_trainer(lab: Lab, r: Row) -> None:
    d = lab.dir("second_writer_trainer")
    store = lab.copy(lab.kg(), d / "kg.gs")
    argv = [*LP, "--store", store, "--scheme", "disk", "--policy", "comet", "--epochs", 3,
            "--embedding-dim", 16, *LP_FAST]
    first = Proc(argv, cwd=d)
    header = first.wait_line(r"^scheme ", timeout=90)  # printed once the store is open r+
    # Paused while the second one runs, so that the overlap is certain (a tiny store
    # trains in less time than a trainer takes to start); resumed afterwards.
    if first.running:
        os.kill(first.pid, signal.SIGSTOP)
    try:
        second = r.ran(run(argv, cwd=d, timeout=60))
        running = first.running
    finally:
        if first.running:
            os.kill(first.pid, signal.SIGCONT)
    res1 = r.ran(first.wait())
    r.check("the first trainer had the store open when the second started", header is not None and running,
            "the first trainer was gone", kind="setup")
    expect_error(r, second, names=[str(store), f"pid {first.pid}"], what="the second trainer")
    r.check("the first trainer finishes normally", res1.returncode == 0 and "final:" in res1.stdout,
            res1.error, kind="lost")
    verify = r.ran(run([*GRAPHSTORE, "verify", store], cwd=d))
    r.check("the store verifies afterwards", verify.returncode == 0, verify.error, kind="lost")
    r.details["refused_in_s"] = round(second.seconds, 2)
    intact = res1.returncode == 0 and verify.returncode == 0
    r.data_lost = "none" if intact else "the first trainer or the store suffered"


# ---- 8. convert --overwrite under a running trainer -----------------------------------


@row("overwrite_under_trainer", "overwrite", "convert --overwrite of a store a trainer is reading")
def overwrite_under_trainer(lab: Lab, r: Row) -> None:
    d = lab.dir("overwrite_under_trainer")
    store = lab.copy(lab.cora(), d / "cora.gs")
    before = tree_digest(store)
    trainer = Proc([*NC, "--store", store, "--scheme", "disk", "--epochs", 3, *NC_FAST], cwd=d)
    line = trainer.wait_line(r"^epoch 1/", timeout=90)
    # Paused between epochs while convert runs (the overlap is certain), resumed after.
    if trainer.running:
        os.kill(trainer.pid, signal.SIGSTOP)
    try:
        conv = r.ran(run([*GRAPHSTORE, "convert", CORA_SOURCE, store, "--partitions", "8", "--overwrite"],
                         cwd=d, timeout=60))
        running = trainer.running
    finally:
        if trainer.running:
            os.kill(trainer.pid, signal.SIGCONT)
    res = r.ran(trainer.wait())
    r.check("the trainer was reading when convert ran", line is not None and running, kind="setup")
    expect_error(r, conv, names=[str(store), f"pid {trainer.pid}"], what="convert --overwrite")
    # "At once": the refusal comes before any conversion work (Cora converts in ~0.5 s
    # after the ~1 s start-up; the lock is taken first).
    r.check("refused at once (under 5 s, start-up included)", conv.seconds < 5, f"{conv.seconds:.1f} s")
    r.check("the trainer finishes normally", res.returncode == 0 and "final:" in res.stdout, res.error,
            kind="lost")
    same = tree_digest(store) == before
    r.check("the store is unchanged", same, kind="lost")
    r.details["refused_in_s"] = round(conv.seconds, 2)
    r.data_lost = "none" if same and res.returncode == 0 else "the store changed or the trainer failed"


# ---- 9. O_DIRECT refused --------------------------------------------------------------


def o_direct_refusal(directory: Path) -> str:
    """What ``open(O_DIRECT)`` of a file in ``directory`` gives: "EINVAL" etc., or "opens"."""
    probe_file = directory / ".odirect-probe"
    probe_file.write_bytes(b"\0" * 4096)
    try:
        os.close(os.open(probe_file, os.O_RDONLY | os.O_DIRECT))
        return "opens"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    finally:
        probe_file.unlink()


@row("no_odirect", "odirect",
     "O_DIRECT refused (EINVAL): store on a tmpfs, or a ramfs where tmpfs has O_DIRECT "
     "(convert, verify, train)")
def no_odirect(lab: Lab, r: Row) -> None:
    d = lab.dir("no_odirect")
    # tmpfs has O_DIRECT since Linux 6.6; ramfs never had it. Take the first that refuses.
    fstype, refused = "tmpfs", "?"
    for fstype in ("tmpfs", "ramfs"):
        with mounted(d / "probe", fstype, "8m" if fstype == "tmpfs" else None) as mnt:
            refused = o_direct_refusal(mnt)
        r.details[f"o_direct_on_{fstype}"] = refused
        if refused == "EINVAL":
            break
        r.notes.append(f"{fstype} accepts O_DIRECT on this kernel ({os.uname().release})")
    r.check("a file system that refuses O_DIRECT (EINVAL)", refused == "EINVAL",
            f"last tried {fstype}: {refused}", kind="setup")
    source = lab.synthetic_aligned()
    with mounted(d / "mnt", fstype, "64m" if fstype == "tmpfs" else None) as mnt:
        out = mnt / "syn.gs"
        conv = r.ran(run([*GRAPHSTORE, "convert", source, out, "--partitions", 4, "--partitioner", "random"],
                         cwd=d))
        r.check("convert works", conv.returncode == 0, conv.error)
        train = [*NC, "--store", out, "--scheme", "disk", "--epochs", 1, *NC_FAST]
        strace = shutil.which("strace")
        log = d / "openat.log"
        if strace:  # the evidence that the O_DIRECT path was taken, and refused
            train = [strace, "-f", "--seccomp-bpf", "-qq", "-e", "trace=openat", "-o", log, *train]
        verify, res = parallel(lambda: run([*GRAPHSTORE, "verify", out], cwd=d), lambda: run(train, cwd=d))
        r.ran(verify)
        r.ran(res)
        r.check("verify works", verify.returncode == 0, verify.error)
        r.check("a disk-scheme training run works", res.returncode == 0 and "final:" in res.stdout, res.error)
        attempts = []
        if strace and log.is_file():
            attempts = [line for line in log.read_text().splitlines()
                        if "syn.gs/" in line and re.search(r"O_DIRECT(?!ORY)", line)]
            refusals = [a for a in attempts if "EINVAL" in a]
            r.check("the trainer tried O_DIRECT, was refused, and read buffered", bool(refusals),
                    f"{len(attempts)} O_DIRECT opens, none refused", kind="setup")
            r.details["o_direct_opens"] = attempts[:5]
        else:
            r.notes.append("strace not installed: whether the trainer tried O_DIRECT is not shown")
        r.exit_code = res.returncode
        r.how = (f"{fstype}: open(O_DIRECT) -> {refused}; the trainer's O_DIRECT opens: "
                 f"{sum('EINVAL' in a for a in attempts)} refused, then buffered; "
                 f"convert exit {conv.returncode}, "
                 f"verify exit {verify.returncode}, training exit {res.returncode}")
        r.data_lost = "none"


# ---- 10. a store written before segment checksums -------------------------------------


@row("old_store", "upgrade",
     "store without segment checksums (checksums/ deleted): warning, info, upgrade, then a flipped bit")
def old_store(lab: Lab, r: Row) -> None:
    import graphstore

    d = lab.dir("old_store")
    store = lab.copy(lab.cora(), d / "cora.gs")
    shutil.rmtree(store / "checksums")
    warned, info = parallel(lambda: run(probe("warnings", store), cwd=d, timeout=60),
                            lambda: run([*GRAPHSTORE, "info", store], cwd=d))
    r.ran(warned)
    r.ran(info)
    caught = (json.loads(warned.stdout.strip().splitlines()[-1])
              if warned.returncode == 0 and warned.stdout.strip() else [])
    unverified = [w for w in caught if w["category"] == "UnverifiedReadsWarning"]
    r.check("opening warns UnverifiedReadsWarning once (two opens)", len(unverified) == 1,
            f"{len(unverified)} warnings: {caught} {warned.error}")
    r.check("the warning names `graphstore upgrade`",
            bool(unverified) and "graphstore upgrade" in unverified[0]["message"], kind="line")
    info_line = next((l.strip() for l in info.stdout.splitlines() if "checksums:" in l), "")
    r.check("graphstore info says partial reads are unverified", "NOT verified" in info_line,
            info_line or info.error)
    up = r.ran(run([*GRAPHSTORE, "upgrade", store], cwd=d))
    r.check("graphstore upgrade succeeds", up.returncode == 0, up.error)
    after = r.ran(run(probe("warnings", store), cwd=d, timeout=60))
    r.check("no warning after the upgrade",
            after.returncode == 0 and "UnverifiedReadsWarning" not in after.stdout,
            after.stdout.strip() or after.error)
    i, lo, hi = _largest_diagonal_bucket(store)
    path, offset, _ = chunk_location(store, "edges/src", (lo + hi) // 2)
    flip_bit(path, offset)

    def direct() -> None:
        with graphstore.open(store) as s:
            s.read_bucket(i, i)
    kind, message = try_read(direct)
    r.check("after the upgrade, a flipped bit in a bucket is caught at read", kind == "CorruptStoreError"
            and bucket_name(i, i) in message, f"{kind}: {message}")
    train = r.ran(run([*NC, "--store", store, "--scheme", "disk", "--epochs", 1, *NC_FAST], cwd=d))
    expect_error(r, train, names=["edges/src"], what="the trainer")
    r.details.update({"warning": unverified[0]["message"] if unverified else None, "info": info_line,
                      "upgrade": up.stdout.strip(), "direct_read": message})
    r.how = f"{info_line}; upgrade: {up.stdout.strip()}; then: {train.error}"
    r.data_lost = "none"


# ---------------------------------------------------------------------- running


def select_rows(only: str | None) -> list[RowSpec]:
    """The rows named (or in the groups named) by ``only``; all rows when None."""
    if not only:
        return list(ROWS)
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    known = {s.name for s in ROWS} | {s.group for s in ROWS}
    unknown = sorted(wanted - known)
    if unknown:
        raise SystemExit(f"fault_matrix: unknown rows or groups {unknown} (--list shows them)")
    return [s for s in ROWS if s.name in wanted or s.group in wanted]


def run_row(spec: RowSpec, lab: Lab) -> Row:
    r = Row(name=spec.name, fault=spec.fault)
    t0 = time.perf_counter()
    try:
        spec.fn(lab, r)
    except NotRun as exc:
        r.detected, r.how, r.data_lost = "not run", str(exc), "-"
    except Exception as exc:  # noqa: BLE001 - a failure of the tool is a row, not the end
        r.detected = "error"
        r.how = f"the tool failed: {type(exc).__name__}: {exc}"
        r.problems.append(traceback.format_exc())
    r.seconds = round(time.perf_counter() - t0, 1)
    r.finish()
    return r


def run_rows(specs: Sequence[RowSpec], lab: Lab, *, jobs: int = 2, progress: bool = True) -> list[Row]:
    """Run the rows in order; consecutive parallel-safe rows ``jobs`` at a time (the
    others alone: their kills and timings should not compete for the two cores)."""
    rows: list[Row] = []
    i = 0
    while i < len(specs):
        batch = [specs[i]]
        if specs[i].parallel_ok and jobs > 1:
            while i + len(batch) < len(specs) and specs[i + len(batch)].parallel_ok:
                batch.append(specs[i + len(batch)])
        if len(batch) == 1:
            done = [run_row(batch[0], lab)]
        else:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                try:
                    done = list(pool.map(lambda s: run_row(s, lab), batch))
                except BaseException:
                    kill_all()  # Ctrl-C or SIGTERM: end the rows' processes, not wait for them
                    raise
        for r in done:
            if progress:
                print(f"[{r.seconds:6.1f} s] {r.name}: detected {r.detected}, ok {r.ok}", file=sys.stderr,
                      flush=True)
        rows.extend(done)
        i += len(batch)
    return rows


def markdown_table(rows: Sequence[Row]) -> str:
    """The rows as a markdown table (the JSON's main columns)."""
    cols = ["fault", "detected", "how", "data_lost", "exit_code", "one_line", "seconds"]

    def cell(v: Any) -> str:
        text = "-" if v is None else str(v)
        return " ".join(text.split()).replace("|", "\\|")

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(getattr(r, c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def cleanup(workdir: Path | None, keep: bool) -> None:
    """Kill what is still running, unmount what is mounted, remove the work directory."""
    kill_all()
    for path in list(reversed(_MOUNTS)):
        _umount(path)
    if workdir is not None and not keep:
        shutil.rmtree(workdir, ignore_errors=True)


def _on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through main's finally: cleanup runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fault_matrix", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the rows here (a JSON list)")
    parser.add_argument("--workdir", type=Path,
                        help="put the run's directory here (default: a new one under /tmp)")
    parser.add_argument("--only", help="comma-separated row or group names (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel-safe rows run this many at a time")
    parser.add_argument("--seed", type=int, default=0, help="seeds the random kill moments")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (stores, logs)")
    parser.add_argument("--list", action="store_true", help="list the rows and groups, then exit")
    args = parser.parse_args(argv)
    if args.list:
        for s in ROWS:
            print(f"{s.name:24s} {s.group:14s} {s.fault}")
        return 0
    if args.json is None:
        parser.error("--json is required")
    specs = select_rows(args.only)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="fault_matrix-", dir=args.workdir or "/tmp"))
    # In-process verifies of stores a writer had open: zarr warns about .writer.lock (the
    # command line's own stderr is checked by the rows).
    warnings.filterwarnings("ignore", message=r".*\.writer\.lock.*")
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 PID prints every thread's stack
    t0 = time.perf_counter()
    try:
        rows = run_rows(specs, Lab(workdir, args.seed), jobs=args.jobs)
    finally:
        cleanup(workdir, args.keep)
        signal.signal(signal.SIGTERM, previous)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps([r.to_json() for r in rows], indent=2, default=str) + "\n")
    print(markdown_table(rows))
    bad = [r.name for r in rows if not r.ok]
    print(f"\n{len(rows)} rows in {time.perf_counter() - t0:.0f} s; {len(rows) - len(bad)} ok"
          + (f"; not ok: {', '.join(bad)}" if bad else "") + (f"; kept {workdir}" if args.keep else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
