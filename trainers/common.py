"""What both trainer scripts share: options from flags and a TOML file, the metrics JSON,
checkpoints, per-epoch seeding, progress bars and the error exit.

Not part of the wheel: the scripts run from a checkout (``python trainers/...``), so this
module is imported by path (the scripts put ``trainers/`` on ``sys.path``).

Checkpoint layout (one directory per run, ``--checkpoint-dir D``)::

    D/latest                 the name of the newest complete checkpoint ("epoch-0003")
    D/epoch-0003/state.pt    model, optimizer, epoch, RNG states, history, configuration
    D/epoch-0003/embeddings/params/...   (link prediction) a copy of the store's embeddings

A checkpoint is written into a hidden temporary directory and renamed into place whole,
then ``latest`` is replaced (temp file + ``os.replace``): a crash at any moment leaves the
previous checkpoint intact and ``latest`` pointing at a complete one.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import random
import resource
import shutil
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphstore.errors import ConfigError, GraphStoreError
from graphstore.layout._durable import fsync_tree, write_atomically

__all__ = [
    "Checkpointer", "MetricsWriter", "add_common_options", "byte_size", "epoch_seed", "fanout_list",
    "io_stats", "parse_options", "peak_memory_bytes", "positive_int", "progress", "run",
    "versions",
]

log = logging.getLogger(__name__)

# Options that say where things go or how to start, not what is trained: a resumed run may
# change them, and a config file must not set `config` itself.
RUN_ONLY = frozenset({"config", "resume", "epochs", "metrics_out", "checkpoint_dir", "device", "store"})


# ---------------------------------------------------------------------- option types

def positive_int(text: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected an integer (got {text!r})") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive (got {value})")
    return value


def fanout_list(text: str) -> tuple[int, ...]:
    """``"15,10,5"`` -> (15, 10, 5); -1 means all neighbours. ``fanouts[0]`` is the hop
    nearest the targets (the last GNN layer's)."""
    try:
        values = tuple(int(t) for t in str(text).split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like 15,10 (got {text!r})") from None
    if not values or any(v == 0 or v < -1 for v in values):
        raise argparse.ArgumentTypeError(
            f"fanouts must be positive or -1 (all), one per layer (got {text!r})")
    return values


def byte_size(text: str) -> int:
    """``4194304``, ``4MiB``, ``512K``, ``1G`` -> bytes (as ``graphstore convert``)."""
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = str(text).strip().lower().removesuffix("b").removesuffix("i")
    unit = t[-1] if t and t[-1] in units else ""
    try:
        value = float(t[: len(t) - len(unit)]) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 256MiB (got {text!r})") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive (got {text!r})")
    return int(value)


def unit_float(text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a number (got {text!r})") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1) (got {value})")
    return value


# ---------------------------------------------------------------------- options

def add_common_options(parser: argparse.ArgumentParser) -> None:
    """The options both trainers take (run control, output, buffer)."""
    parser.add_argument("--config", metavar="C.toml",
                        help="TOML file giving any option below by its long name (flags override it)")
    parser.add_argument("--store", metavar="S.gs", help="the store to train on (required)")
    parser.add_argument("--buffer-partitions", type=positive_int, metavar="C",
                        help="partitions the buffer holds (default by scheme)")
    parser.add_argument("--buffer-bytes", type=byte_size, metavar="B",
                        help="buffer budget in bytes instead of partitions, e.g. 512MiB")
    parser.add_argument("--batch-size", type=positive_int, default=1000)
    parser.add_argument("--epochs", type=positive_int, default=10)
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate")
    parser.add_argument("--seed", type=int, default=0,
                        help="with the epoch number, every random choice (init, sampling, dropout)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--no-prefetch", dest="prefetch", action="store_false",
                        help="load buffer states in the foreground (for measuring stalls)")
    parser.add_argument("--metrics-out", metavar="M.json", help="write the metrics JSON here")
    parser.add_argument("--checkpoint-dir", metavar="D", help="save a checkpoint here after every epoch")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the last checkpoint in --checkpoint-dir")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")


def _config_values(parser: argparse.ArgumentParser, path: str) -> dict[str, Any]:
    """The TOML file's options as argparse destinations, converted and checked like flags."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None
    # Flat tables are allowed for readability ([loader] batch-size = ...): merged in.
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            flat.update(value)
        else:
            flat[key] = value
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}
    by_flag = {s.lstrip("-").replace("-", "_"): a for a in actions.values() for s in a.option_strings}
    out: dict[str, Any] = {}
    for key, value in flat.items():
        name = key.replace("-", "_")
        action = by_flag.get(name) or actions.get(name)
        if action is None:
            known = ", ".join(sorted(k.replace("_", "-") for k in by_flag if len(k) > 1))
            raise ConfigError(f"{path}: unknown option {key!r} (known: {known})")
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            if not isinstance(value, bool):
                raise ConfigError(f"{path}: {key} must be true or false (got {value!r})")
            # `no-prefetch = true` means prefetch = False.
            flag_is_negative = isinstance(action, argparse._StoreFalseAction) and name != action.dest
            out[action.dest] = (not value) if flag_is_negative else value
            continue
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        if action.type is not None:
            try:
                value = action.type(value if isinstance(value, str) else str(value))
            except argparse.ArgumentTypeError as e:
                raise ConfigError(f"{path}: {key}: {e}") from None
            except ValueError:
                raise ConfigError(f"{path}: {key}: cannot read {value!r} as {action.type.__name__}") from None
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(str, action.choices))
            raise ConfigError(f"{path}: {key} must be one of {choices} (got {value!r})")
        out[action.dest] = value
    return out


def parse_options(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Flags over the ``--config`` file over the defaults.

    Raises
    ------
    ConfigError
        On an unreadable config file or an unknown or invalid option in it.
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if known.config:
        parser.set_defaults(**_config_values(parser, known.config))
    args = parser.parse_args(argv)
    if not args.store:
        parser.error("--store is required (as a flag or in the config file)")
    if args.buffer_partitions is not None and args.buffer_bytes is not None:
        parser.error("give --buffer-partitions or --buffer-bytes, not both")
    if args.resume and not args.checkpoint_dir:
        parser.error("--resume needs --checkpoint-dir")
    return args


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: CUDA is not available in this torch build or machine; "
                          "use --device cpu")
    return torch.device(name)


# ---------------------------------------------------------------------- seeding

def epoch_seed(seed: int, epoch: int, salt: int = 0) -> int:
    """A seed per (run seed, epoch, purpose): every epoch's randomness is replayable alone,
    which is what makes ``--resume`` reach the same result as an uninterrupted run."""
    entropy = [int(seed) & 0xFFFFFFFF, int(epoch), int(salt), 0x7261696E]
    state = np.random.SeedSequence(entropy).generate_state(1, np.uint64)
    return int(state[0]) & ((1 << 63) - 1)


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------- progress and stats

def progress(iterable: Iterable, *, desc: str, total: int | None = None) -> Iterable:
    """A tqdm bar on a terminal; the plain iterable otherwise (logs and pipes stay clean)."""
    if not (sys.stdout.isatty() and sys.stderr.isatty()):
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, leave=False, dynamic_ncols=True)


def io_stats(stats: Sequence[Any]) -> dict[str, Any]:
    """Buffer counters of one or more epochs' passes (`BufferStats`), summed, for the JSON."""
    out = {"bytes_read": 0, "bytes_written": 0, "stall_s": 0.0, "read_s": 0.0, "write_s": 0.0,
           "states": 0, "partitions_loaded": 0, "swaps": 0, "planned_bytes": 0}
    for s in stats:
        if s is None:
            continue
        out["bytes_read"] += int(s.bytes_read)
        out["bytes_written"] += int(s.bytes_written)
        out["stall_s"] += float(s.stall_seconds)
        out["read_s"] += float(s.read_seconds)
        out["write_s"] += float(s.write_seconds)
        out["states"] += int(s.states)
        out["partitions_loaded"] += int(s.partitions_loaded)
        out["swaps"] += int(s.swaps)
        out["planned_bytes"] += int(s.planned_bytes)
    return out


def peak_memory_bytes() -> int:
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def versions() -> dict[str, str]:
    import graphstore
    import zarr

    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "zarr": zarr.__version__, "graphstore": graphstore.__version__}


def mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return value.tolist()
    if isinstance(value, (Path, torch.device)):
        return str(value)
    if isinstance(value, (tuple, set)):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: whole or not at all, and durable once returned."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, text.encode())


class MetricsWriter:
    """Collects the run's record and rewrites ``M.json`` after every epoch (atomically), so
    an interrupted run still leaves the epochs it finished."""

    def __init__(self, path: str | None, *, task: str, config: dict[str, Any]) -> None:
        self.path = Path(path) if path else None
        self.record: dict[str, Any] = {"task": task, "config": config, "epochs": [], "final": None,
                                       "best": None, "versions": versions()}
        self.started = time.perf_counter()

    def write(self, **fields: Any) -> None:
        self.record.update(fields)
        self.record["peak_memory_bytes"] = peak_memory_bytes()
        self.record["wall_time_s"] = time.perf_counter() - self.started
        if self.path is not None:
            text = json.dumps(self.record, indent=2, default=_jsonable, allow_nan=True)
            atomic_write_text(self.path, text + "\n")


# ---------------------------------------------------------------------- checkpoints

class Checkpointer:
    """Per-epoch checkpoints in ``directory`` (layout in the module docstring)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def save(self, epoch: int, state: dict[str, Any], *, snapshots: dict[str, Path] | None = None) -> Path:
        """Write ``state`` (torch-serialisable) and copies of the ``snapshots`` directories
        (name -> source directory) as the checkpoint of ``epoch``; returns its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"epoch-{epoch:04d}"
        final = self.directory / name
        tmp = self.directory / f".{name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            torch.save(state, tmp / "state.pt")
            for key, source in (snapshots or {}).items():
                # A write-back's temporary file is not part of the snapshot.
                shutil.copytree(source, tmp / key, ignore=shutil.ignore_patterns(".*.tmp"))
            fsync_tree(tmp)  # on disk before the rename that makes it a checkpoint
            if final.exists():  # a rerun of this epoch (an earlier run's leftovers)
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        atomic_write_text(self.directory / "latest", name + "\n")
        # Older checkpoints are dropped only once the new one is complete and current.
        for old in self.directory.glob("epoch-*"):
            if old.name != name and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        return final

    def latest(self) -> Path:
        """The newest complete checkpoint.

        Raises
        ------
        ConfigError
            When the directory holds none.
        """
        pointer = self.directory / "latest"
        if not pointer.is_file():
            raise ConfigError(f"{self.directory}: no checkpoint to resume from (no 'latest' file); "
                              "run without --resume first")
        path = self.directory / pointer.read_text().strip()
        if not (path / "state.pt").is_file():
            raise ConfigError(f"{path}: checkpoint is incomplete (no state.pt)")
        return path

    @staticmethod
    def load(path: Path) -> dict[str, Any]:
        try:
            # Our own file: it holds RNG states and Python objects, not only tensors.
            return torch.load(path / "state.pt", map_location="cpu", weights_only=False)
        except Exception as e:  # a truncated or foreign file: say which
            raise ConfigError(f"{path / 'state.pt'}: cannot read the checkpoint ({e})") from None


def check_resume_config(saved: dict[str, Any], current: dict[str, Any], where: Path) -> None:
    """A resumed run must train the same thing: every option but the run-only ones agrees."""
    for key in sorted(set(saved) | set(current)):
        if key in RUN_ONLY:
            continue
        if saved.get(key) != current.get(key):
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{where}: the checkpoint was written with {flag} {saved.get(key)!r}, this run "
                              f"has {current.get(key)!r}; resume with the same options or start a new "
                              "--checkpoint-dir")


def restore_directory(snapshot: Path, target: Path) -> None:
    """Copy every file of ``snapshot`` over ``target`` file by file, each atomically and
    durably (temp, fsync, ``os.replace``), so a reader never sees a half-written chunk."""
    for source in sorted(p for p in snapshot.rglob("*") if p.is_file()):
        dest = target / source.relative_to(snapshot)
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(dest, source.read_bytes())  # one chunk file: a partition at most


# ---------------------------------------------------------------------- running

def run(prog: str, main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Call ``main``; a known error prints one line and returns 1 (no traceback)."""
    try:
        return main(argv)
    except GraphStoreError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"{prog}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


def finite_or_raise(loss: float, epoch: int) -> None:
    if not math.isfinite(loss):
        raise ConfigError(f"epoch {epoch}: the training loss is {loss} (diverged); lower --lr")
