"""What both trainer scripts share: the metrics JSON, checkpoints, per-epoch seeding,
progress bars and the error exit (their options are in ``options``).

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

import contextlib
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphstore._argparse import stdout_closed, stdout_reader_gone
from graphstore.errors import ConfigError, GraphStoreError
from graphstore.layout._durable import fsync_tree, write_atomically
from graphstore.loaders.defaults import memory_budget, step_share
from graphstore.loaders.pipeline import default_loader_threads
from graphstore.loaders.seeds import epoch_seed
from graphstore.units import jsonable

__all__ = [
    "Checkpointer", "MetricsWriter", "epoch_seed", "io_stats", "peak_memory_bytes", "progress", "run",
    "versions",
]

try:
    from trainers.options import CommonOptions
except ImportError:  # run as a script
    from options import CommonOptions

log = logging.getLogger(__name__)

# Options that say where things go or how to start, not what is trained: a resumed run may
# change them (marked in their fields).
RUN_ONLY = CommonOptions.run_only_names() | {"derived"}
"""``derived`` is the rules that chose defaults (a resumed run takes the checkpoint's values)."""


# ---------------------------------------------------------------------- device

def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: CUDA is not available in this torch build or machine; "
                          "use --device cpu")
    return torch.device(name)


# ---------------------------------------------------------------------- seeding

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


@contextlib.contextmanager
def layer_progress(desc: str, total: int) -> Iterator[Callable[[int, int, float], None] | None]:
    """A tqdm bar over a layer-wise pass's layers on a terminal (each a pass over the store),
    as the ``on_layer`` callback of `graphstore.inference.infer_layerwise`; None otherwise."""
    if not (sys.stdout.isatty() and sys.stderr.isatty()):
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, unit="layer", leave=False, dynamic_ncols=True) as bar:
        yield lambda layer, layers, seconds: bar.update(1)


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
    import zarr

    import graphstore

    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "zarr": zarr.__version__, "graphstore": graphstore.__version__}


def mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


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
            # jsonable leaves unknown types as they are: json.dumps then refuses them (TypeError).
            text = json.dumps(jsonable(self.record), indent=2, allow_nan=True)
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


def default_buffer(args: Any, *, whole_graph: bool, saved: dict[str, Any] | None = None) -> tuple[dict[str, Any], str | None]:
    """The buffer when neither ``--buffer-bytes`` nor ``--buffer-partitions`` is given:
    ``({"buffer_bytes": B}, rule)`` from the memory this process may still use
    (`graphstore.loaders.defaults.memory_budget`), or a resumed run's recorded choice (so it
    replays the same plan whatever memory is free now); ``({}, None)`` when a flag gives it
    or the scheme holds the whole graph anyway."""
    if whole_graph or args.buffer_bytes is not None or args.buffer_partitions is not None:
        return {}, None
    if saved is not None and (saved.get("buffer_bytes") or saved.get("buffer_partitions")):
        return ({"buffer_bytes": saved.get("buffer_bytes"), "buffer_partitions": saved.get("buffer_partitions")},
                "the resumed checkpoint's")
    budget = memory_budget()
    figure, rule = least_over_ranks(budget.bytes, budget.rule)
    return {"buffer_bytes": figure}, rule


def training_step_share(args: Any, *, buffer_bytes: int | None, whole_graph: bool,
                        buffer_rule: str | None, saved: dict[str, Any] | None = None
                        ) -> tuple[dict[str, Any], str | None]:
    """Part of an out-of-core scheme's byte budget for the batch in training:
    ``({"buffer_bytes": B - S, "micro_batch_budget": S}, rule)`` (`graphstore.loaders.defaults.step_share`),
    so that the buffer, the batches made ahead and the batch being trained together stay
    within ``B``. A batch whose estimated step (`graphstore.nn.estimate_step_memory`)
    exceeds ``S`` is split into micro-batches (Betty) whose gradients add up to the batch's;
    a batch within it trains as it is (the model's own state,
    `graphstore.nn.model_state_bytes`, is added to ``S`` where the loader is made).
    ``({}, None)`` where it does not apply: the whole graph resident (no byte budget bounds
    it), a capacity in partitions, or micro-batching asked for by flag. A resumed run keeps
    its checkpoint's split."""
    if (whole_graph or buffer_bytes is None or args.micro_batches is not None
            or args.micro_batch_budget is not None):
        return {}, None
    if buffer_rule == "the resumed checkpoint's" and saved is not None and saved.get("micro_batch_budget"):
        return {"micro_batch_budget": saved["micro_batch_budget"]}, "the resumed checkpoint's"
    rest, step, rule = step_share(buffer_bytes)  # the rule `graphstore plan` shows too
    return {"buffer_bytes": rest, "micro_batch_budget": step}, rule


def loader_threads(args: Any) -> int:
    """``--loader-threads``, or the default for the run's device (`default_loader_threads`)."""
    return args.loader_threads if args.loader_threads is not None else default_loader_threads(args.device)


def least_over_ranks(figure: int, rule: str) -> tuple[int, str]:
    """A default read from this process's memory (``figure``, chosen by ``rule``), made the
    same on every rank: each reads its own free memory at its own moment, and the ranks
    must plan alike (their steps are matched one for one, and `check_ranks_agree` refuses
    a difference), so all take the least of them. One process: as given."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return figure, rule
    world = torch.distributed.get_world_size()
    if world == 1:
        return figure, rule
    least = torch.tensor([figure], dtype=torch.int64)
    torch.distributed.all_reduce(least, op=torch.distributed.ReduceOp.MIN)
    if int(least) != figure:
        return int(least), f"the least of {world} ranks' defaults ({rule} on this one)"
    return figure, f"{rule}, the least of {world} ranks"


EVAL_MARGIN = 1.5
"""The default evaluation rhythm counts the next evaluation as 1.5 times the last: passes
vary, and the last epoch is evaluated whatever the budget, so an exact fit overshot half
(50.9 % on a 34k-node, 8,415-feature graph)."""


def should_evaluate(args: Any, epoch: int, train_s: float, eval_s: float, last_eval_s: float = 0.0) -> bool:
    """Whether ``epoch`` (0-based) ends with a validation pass: every ``args.eval_every``
    epochs, or by default (``eval_every`` None) when evaluation so far plus one more
    (`EVAL_MARGIN` times as long as the last one) stays within the training time so far (so
    it is at most half of the run: a slow exact evaluation runs every few epochs, a cheap
    one every epoch); the first and the last epoch (``args.epochs``) always."""
    if epoch == args.epochs - 1:
        return True
    if args.eval_every is not None:
        return (epoch + 1) % args.eval_every == 0
    return eval_s + EVAL_MARGIN * last_eval_s <= train_s


def check_resume_config(saved: dict[str, Any], current: dict[str, Any], where: Path,
                        run_only: frozenset[str] = RUN_ONLY) -> None:
    """A resumed run must train the same thing: every option but the run-only ones (the
    script's own, ``run_only``) agrees."""
    for key in sorted(set(saved) | set(current)):
        if key in run_only:
            continue
        if saved.get(key) != current.get(key):
            if key == "world_size":  # not a flag: torchrun's --nproc-per-node (absent: one process)
                raise ConfigError(f"{where}: the checkpoint was written by {saved.get(key) or 1} rank(s), this run has "
                                  f"{current.get(key) or 1}; resume with torchrun --nproc-per-node "
                                  f"{saved.get(key) or 1} (each rank's share of an epoch depends on it)")
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
    except BrokenPipeError as e:
        if not stdout_reader_gone():
            print(f"{prog}: error: {e.strerror or e}", file=sys.stderr)
            return 1
        # `train.py | head`: the reader has gone; the run has already been unwound (the buffer's
        # dirty partitions written back on the way out), so stop as Unix tools do, quietly.
        return stdout_closed()
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"{prog}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def under_torchrun() -> bool:
    """Whether torchrun started this process as one of several ranks."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def run_ranks(train: Callable[[Any], int], args: Any) -> int:
    """``train(args)``; under torchrun any error prints one line naming the rank and ends the
    process at once (`graphstore.distributed.fail_fast`: torchrun then stops the other ranks,
    none is left waiting in a collective), and the process group is torn down after."""
    if not under_torchrun():
        return train(args)
    from graphstore.distributed import fail_fast

    status = fail_fast(train)(args)
    torch.distributed.destroy_process_group()
    return status


def join_ranks(device: torch.device) -> tuple[int, int, torch.device]:
    """``(rank, world_size, device)``: the process group torchrun set up joined (gloo on CPU,
    NCCL on CUDA, each rank on ``cuda:LOCAL_RANK``), or ``(0, 1, device)`` alone."""
    if not under_torchrun():
        return 0, 1, device
    from graphstore.distributed import init_process_group

    rank, world = init_process_group(device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())  # LOCAL_RANK's, set by the group
    return rank, world, device


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


def finite_or_raise(loss: float, epoch: int) -> None:
    if not math.isfinite(loss):
        raise ConfigError(f"epoch {epoch}: the training loss is {loss} (diverged); lower --lr")
