"""What every benchmark in tools/ measures the same way: the disk, the process, the machine.

* the disk: `dd_read` (sequential read, direct IO), `dd_read_parallel`, `dd_bandwidth`
  (write then cold read), `ensure_dd_file`, `drop_caches`, `du`;
* a process: `proc_io` (``/proc/<pid>/io``), `vm_hwm_bytes` (its peak RSS), `run_measured`
  (a child's wall time and ``ru_maxrss``), `MemoryCap` and `run_capped` (the same inside a
  cgroup v1 memory cap, the page cache counted), `run_child` (a tool's own ``--child``);
* the machine: `machine_record`, `read_ahead_kb`, `sysfs_int`;
* results: `median_range`, `write_json`, `command_line`, `elapsed_logger`, `require_root`;
* DGL's interpreter: `ensure_dgl_python`.

Standard library only, imported lazily where it is not: bench_outofcore.py imports this in
DGL's own interpreter, which has no graphstore.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
DGL_VERSION = "1.1.3"
TORCH_VERSION = "2.13.0"
"""What ``ensure_dgl_python`` installs into a new DGL environment."""


# ---------------------------------------------------------------------- the disk

def drop_caches() -> None:
    """Write back dirty pages, then drop the page cache (root only): the next read is cold."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def du(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def ensure_dd_file(path: Path, nbytes: int, *, block_bytes: int = 4 << 20) -> Path:
    """``path`` holding ``nbytes // block_bytes`` random blocks, written with direct IO unless
    a file of ``nbytes`` is already there (it is reused across runs)."""
    if not path.exists() or path.stat().st_size != nbytes:
        subprocess.run(["dd", "if=/dev/urandom", f"of={path}", f"bs={block_bytes >> 20}M",
                        f"count={nbytes // block_bytes}", "oflag=direct", "conv=fsync"],
                       check=True, capture_output=True)
    return path


def dd_read(path: Path, *, drop_cache: bool = True, dd_seconds: bool = False) -> dict:
    """Sequential read of ``path`` with ``dd iflag=direct bs=4M``: ``bytes``, ``seconds``,
    ``bytes_per_s``.

    Direct IO bypasses the page cache; ``drop_cache`` drops it anyway first (cold metadata).
    With ``dd_seconds`` the time is dd's own report (no process start-up) and the wall time is
    kept as ``wall_seconds``.
    """
    if drop_cache:
        drop_caches()
    start = time.perf_counter()
    run = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4M", "iflag=direct"], check=True,
                         capture_output=True, text=True)
    wall = time.perf_counter() - start
    if not dd_seconds:
        size = path.stat().st_size
        return {"bytes": size, "seconds": wall, "bytes_per_s": size / wall}
    match = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", run.stderr)
    size, seconds = (int(match.group(1)), float(match.group(2))) if match else (path.stat().st_size, wall)
    return {"bytes": size, "seconds": seconds, "wall_seconds": wall, "bytes_per_s": size / seconds}


def dd_read_parallel(path: Path, streams: int = 4) -> dict:
    """Cold read of ``path`` by ``streams`` concurrent dd processes (direct IO, 4 MiB blocks),
    each a contiguous share: the disk at queue depth ``streams``, as the buffer reads it."""
    drop_caches()
    blocks = path.stat().st_size // (4 << 20)
    share = -(-blocks // streams)
    start = time.perf_counter()
    procs = [subprocess.Popen(["dd", f"if={path}", "of=/dev/null", "bs=4M", "iflag=direct", f"skip={k * share}",
                               f"count={share}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for k in range(streams)]
    for proc in procs:
        proc.wait()
    seconds = time.perf_counter() - start
    size = blocks * (4 << 20)
    return {"bytes": size, "streams": streams, "seconds": seconds, "bytes_per_s": size / seconds}


def dd_bandwidth(path: Path, size_mib: int) -> dict:
    """Sequential write then cold read of ``size_mib`` MiB at ``path`` (removed after) with
    direct IO, in bytes/s."""
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={size_mib // 4}",
                    "oflag=direct", "conv=fsync"], check=True, capture_output=True)
    write_s = time.perf_counter() - start
    read = dd_read(path)
    path.unlink()
    size = size_mib // 4 * 4 << 20
    return {"bytes": size, "write_bytes_per_s": size / write_s, "read_bytes_per_s": read["bytes_per_s"]}


# ---------------------------------------------------------------------- a process

def proc_io(pid: int | str = "self") -> dict[str, int]:
    """A process's ``/proc/<pid>/io`` counters; ``read_bytes`` is what it caused to be fetched
    from the device, page faults of a memory map included (reaped children's added to their
    parent's). Empty when unreadable (no such process, another user's).
    """
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return {}
    return parse_proc_io(text)


def parse_proc_io(text: str) -> dict[str, int]:
    """``key: value`` lines as ints.

    >>> parse_proc_io("rchar: 10\\nread_bytes: 4096\\n")
    {'rchar': 10, 'read_bytes': 4096}
    """
    return {k: int(v) for k, v in (line.split(": ") for line in text.splitlines() if line)}


def vm_hwm_bytes(pid: int | str = "self") -> int | None:
    """A process's peak RSS (``VmHWM``): per address space, so unlike ``ru_maxrss`` it does not
    carry the forking parent's RSS over ``fork`` and ``exec``. None when unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def run_measured(argv: list[str]) -> dict:
    """Run a child; wall time, exit code, its own peak RSS (wait4's rusage) and the tails of
    its output."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"seconds": seconds, "returncode": proc.returncode, "peak_rss_bytes": usage.ru_maxrss * 1024,
                "stdout": out.read()[-2000:], "stderr": err.read()[-2000:]}


class MemoryCap:
    """A cgroup v1 memory group capped at ``limit_bytes``; processes join via `prefix`."""

    def __init__(self, name: str, limit_bytes: int) -> None:
        self.path = CGROUP_ROOT / name
        if self.path.exists():
            self.path.rmdir()
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        self.limit_bytes = limit_bytes

    def prefix(self) -> list[str]:
        # The shell joins the group, then execs the command: every byte it maps is charged.
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "capped"]

    def stats(self) -> dict:
        def read(name: str) -> int:
            return int((self.path / name).read_text().split()[0])

        oom = dict(line.split() for line in (self.path / "memory.oom_control").read_text().splitlines())
        return {"cap_bytes": self.limit_bytes, "cgroup_peak_bytes": read("memory.max_usage_in_bytes"),
                "cap_hits": read("memory.failcnt"), "oom_kills": int(oom.get("oom_kill", 0))}

    def close(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass


def run_capped(argv: list[str], cap_bytes: int | None, name: str) -> dict:
    """`run_measured` inside a `MemoryCap` of ``cap_bytes`` named ``name`` (removed after),
    with its stats; ``cap_bytes`` None runs uncapped and reports the cap fields as None."""
    if cap_bytes is None:
        return dict(run_measured(argv), cap_bytes=None, cgroup_peak_bytes=None, cap_hits=None, oom_kills=None)
    cap = MemoryCap(f"{name}_{os.getpid()}", cap_bytes)
    try:
        return dict(run_measured(cap.prefix() + argv), **cap.stats())
    finally:
        cap.close()


def run_child(script: str | Path, spec: dict, *, cap_bytes: int | None, name: str, drop_cache: bool = True,
              python: str | None = None) -> dict:
    """``python script --child JSON(spec)`` (a tool measuring itself in a fresh process) through
    `run_capped`, after `drop_caches` when ``drop_cache``."""
    if drop_cache:
        drop_caches()
    argv = [python or sys.executable, str(Path(script).resolve()), "--child", json.dumps(spec)]
    return run_capped(argv, cap_bytes, name)


def require_root(parser) -> None:
    """Stop with a usage error unless root: dropping the page cache and cgroups need it."""
    if os.geteuid() != 0:
        parser.error("needs root: it drops the page cache and creates a cgroup")


# ---------------------------------------------------------------------- the machine

def sysfs_int(path: str | Path) -> int | None:
    """An integer sysfs (or procfs) file, None when it is missing or not a number."""
    try:
        return int(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_ahead_kb(path: str | Path) -> int | None:
    """The read-ahead (KiB) of the block device holding ``path``: how much one page fault of a
    memory map may read."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return None
    return sysfs_int(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/queue/read_ahead_kb")


def cpu_model() -> str:
    """The first ``model name`` of /proc/cpuinfo ("" when there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def mem_total_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _version(module: str):
    return lambda: importlib.import_module(module).__version__


MACHINE_FACTS = {
    "cpu": cpu_model,
    # One fact, three names: each benchmark's JSON keeps the key it has always had.
    "cores": os.cpu_count, "cpus": os.cpu_count, "cpu_count": os.cpu_count,
    "python": platform.python_version,
    "platform": platform.platform,
    "torch": _version("torch"),
    "numpy": _version("numpy"),
    "mem_total_bytes": mem_total_bytes,
}
"""What `machine_record` can name: key in the JSON -> how it is found."""


SHARED_MACHINE_NOTE = "shared, noisy machine: compare samplers within this run (ratios), not across runs"
"""The ``note`` of the sampling and out-of-core benchmarks' machine records."""


def machine_record(*facts: str, **extra) -> dict:
    """The machine's ``facts`` (keys of `MACHINE_FACTS`, in that order), then ``extra`` as given.

    >>> sorted(machine_record("cpus", "python", note="x"))
    ['cpus', 'note', 'python']
    """
    unknown = [f for f in facts if f not in MACHINE_FACTS]
    if unknown:
        raise ValueError(f"unknown machine facts {unknown}; known: {', '.join(MACHINE_FACTS)}")
    return {**{f: MACHINE_FACTS[f]() for f in facts}, **extra}


# ---------------------------------------------------------------------- results

def median_range(values: list[float]) -> dict:
    """``{"median", "min", "max", "runs"}`` of repeated measurements.

    >>> median_range([3.0, 1.0, 2.0])
    {'median': 2.0, 'min': 1.0, 'max': 3.0, 'runs': [3.0, 1.0, 2.0]}
    """
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def write_json(path: Path, data, *, indent: int = 1, final_newline: bool = True) -> None:
    """``data`` as JSON at ``path``, its folder created first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent) + ("\n" if final_newline else ""))


def command_line(script: str, argv: list[str] | None) -> str:
    """How the run was started, for the JSON: ``python tools/<script> ARGS``."""
    return " ".join(["python", script] + (argv if argv is not None else sys.argv[1:]))


def elapsed_logger(stream=None):
    """``log(msg)`` printing ``[  12.3s] msg``: seconds since this call, flushed at once."""
    start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:7.1f}s] {msg}", file=stream or sys.stdout, flush=True)

    return log


# ---------------------------------------------------------------------- DGL's interpreter

def ensure_dgl_python(args, log) -> tuple[str | None, str | None]:
    """An interpreter that imports dgl (``args.dgl_python``, else ``args.dgl_venv``'s, creating
    that venv when needed); or (None, reason)."""
    def works(py: str) -> str | None:
        try:
            r = subprocess.run([py, "-c", "import dgl, torch; print(dgl.__version__, torch.__version__)"],
                               capture_output=True, text=True, timeout=300, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{py} did not run: {exc}"
        if r.returncode != 0:
            return f"import dgl failed with {py}: {r.stderr.strip().splitlines()[-1:] or r.returncode}"
        return None

    if args.dgl_python:
        err = works(args.dgl_python)
        return (None, err) if err else (args.dgl_python, None)
    venv = Path(args.dgl_venv)
    py = venv / "bin" / "python"
    if py.exists() and works(str(py)) is None:
        return str(py), None
    log(f"creating the DGL environment in {venv} (torch=={TORCH_VERSION}, dgl=={DGL_VERSION})")
    steps = [["python3", "-m", "venv", str(venv)],
             [str(py), "-m", "pip", "install", "-q", f"torch=={TORCH_VERSION}"],
             [str(py), "-m", "pip", "install", "-q", f"dgl=={DGL_VERSION}"],
             # dgl 1.1.3 imports pkg_resources/packaging, which setuptools>=70 and a bare
             # venv do not provide; pip warns that torch wants a newer setuptools, harmlessly.
             [str(py), "-m", "pip", "install", "-q", "setuptools<70", "packaging"]]
    for cmd in steps:
        if cmd[0] != "python3" and not py.exists():
            return None, "virtual environment creation failed"
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"{' '.join(cmd)}: {exc}"
        if r.returncode != 0:
            tail = (r.stderr.strip().splitlines() or ["?"])[-1]
            return None, f"`{' '.join(cmd)}` failed: {tail}"
    err = works(str(py))
    return (None, err) if err else (str(py), None)
