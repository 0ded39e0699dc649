"""Time to accuracy: how long each training scheme takes to reach the in-memory reference's
validation accuracy (as MariusGNN reports its results).

    python tools/bench_time_to_accuracy.py --json OUT [--quick] [--work /work/tta]
        [--datasets cora,citeseer,amazon_photo] [--schemes minibatch,megabatch,disk,macrobatch]
        [--seeds 0,1,2] [--variants "megabatch:--balance-labels on;megabatch:--reuse 1"]
        [--epochs 300] [--patience 30] [--buffer-partitions 8] [--trainer-flags "..."]
        [--no-ooc | --ooc-store full|quick|tiny|PATH] [--ooc-seeds 0] [--no-dgl] [--rerun]

What is measured
----------------
Every run is ``trainers/node_classification.py --eval-every 1 --patience P --epochs E
--seed S --metrics-out M.json`` in a child process (``OMP_NUM_THREADS=1``, one at a time:
the timings are the point), its output read line by line so that the moment each epoch's
line is printed is known.

* **Target**: the median over the seeds of the reference's (``minibatch``, in memory) best
  validation accuracy (the highest ``valid.acc`` of its evaluated epochs), minus
  ``--margin`` (0.01, one point). Validation only: the test split plays no part in the target
  nor in any time.
* **Time to target** of a run: the cumulative training time, the sum of the epochs'
  ``time_s`` (an epoch's training wall seconds, its buffer loads included), up to and
  including the first epoch whose ``valid.acc`` >= target. Excluded: the evaluation after
  each epoch (``eval_time_s``: the measurement's probe; every epoch is evaluated, which a
  real run need not do), the process start-up (imports, opening the store, building the
  loaders) and the final test. Secondary, with everything included: ``wall_to_target_s``,
  seconds from the child's launch to the printed line of that epoch (start-up, training and
  every evaluation so far). Also per run: the epoch (0-based ``epoch``, and
  ``epochs_to_target`` trained), the training samples (``train_targets``, summed) and the
  bytes read by training (``io.bytes_read`` plus macro-batching's row fetches,
  ``macro_batching.bytes_read``, which ``io`` leaves out; summed) up to it, the evaluation
  time up to it,
  and the test accuracy of the trainer's selected model (``final.test.acc``: the epoch of
  best validation accuracy, ties to the lower validation loss, restored and scored once;
  ``final.selection`` is kept per seed). A run that never reaches the target has
  ``time_to_target_s`` null, with its best validation accuracy and why.
* **Per scheme**: medians over the seeds (a seed that never reached the target counts as
  slower than any that did, so the median is null when half or more did not), the ratio of
  the median time to the reference's (``ratio_to_minibatch``; the headline), and two
  secondary ratios to the reference's: time per training sample (the whole run's training
  time over its samples: megabatch's ``reuse`` 2 trains every target twice an epoch) and
  time per epoch (the median epoch's ``time_s``).

Parts
-----
1. The shared node-classification datasets (Cora, CiteSeer, Amazon Photo under ``--data``),
   converted once into ``WORK/stores`` with ``--partitions 32`` (METIS). Schemes:
   ``minibatch`` (the reference), ``megabatch`` and ``disk`` forced out of core with
   ``--buffer-partitions 8`` (a quarter of the partitions: about a quarter of the feature
   bytes), ``macrobatch``; ``--variants`` adds extra flag sets per scheme, each a key of its
   own (``megabatch[--balance-labels on]``). Every other hyper-parameter is the trainer's
   default or derived from the data (batch size, feature normalisation, evaluation: recorded
   in each run's ``derived``, ``eval_scheme``, ``eval_fanouts``). Evaluation is the trainer's
   default: exact layer-wise inference, every neighbour, for every scheme since commit
   8320205 (before it, megabatch and disk were exact and the others sampled every neighbour
   in memory: the same function on these graphs), so the probe is the same for every scheme.

   The trainer and the package change while runs go on: each run records a digest of
   ``trainers/*.py`` and ``graphstore/**/*.py`` at its launch (``code_digest``), a recorded
   run is reused only under the same digest, and the JSON's ``code`` says whether one
   dataset's runs mixed versions.
2. The out-of-core benchmark graph (tools/bench_outofcore.py's synthetic store with
   locality: ``--ooc-store full`` its 7.3M-node store, ``quick`` its cached 2.1M-node store
   built by `bench_outofcore.ensure_quick_stores`, ``tiny`` a 20k-node store of the same kind
   built the same way, or a path): ``minibatch`` uncapped (the reference), ``megabatch`` and
   ``disk`` under bench_outofcore's cgroup v1 memory cap (1 GiB for the full store,
   `bench_outofcore.quick_cap_mib` otherwise), the page cache dropped before each run, the
   buffer left to the trainer's default (a share of the cgroup's headroom) unless
   ``--ooc-buffer-bytes``. The store must have a ``valid`` split (checked; none is invented).
   Beside them DGL 1.1.3 + numpy memmap at its best (bench_outofcore's `GatheringSampler`
   workers, sorted row gathers, ``MADV_RANDOM``; `child_dgl_tta` here), trained with the
   reference's hyper-parameters (fanouts, batch size, hidden width, dropout, learning rate,
   weight decay, feature normalisation), each epoch evaluated on validation exactly, as the
   reference is: layer-wise over full-neighbour blocks, every node's hidden rows in memory
   (DGL's examples' inference, `dgl_layerwise_logits`; ``--dgl-eval sampled`` uses its
   sampling loader at the reference's evaluation fanouts instead, or at
   ``--dgl-eval-fanouts``: every neighbour of the 2.1M-node store's 419k validation nodes
   at once OOMs DGL under the cap and under the wide cap, and at 25,10 one validation pass
   ran over 13 minutes; the row's description names the choice), its time to target measured the same way (training
   time only; its epoch 0 includes starting the loader's workers, as the trainer's includes
   its first loads). If the cap kills DGL (its structure is in memory beside the page cache) it
   runs again under bench_outofcore's wide cap (the cap, its structure and 512 MiB).
   On the full store an epoch trains 300,000 targets (``--ooc-train-targets``; the trainer's
   ``--train-targets``, the same nodes for DGL), bench_outofcore's paper configuration: its
   whole train split (4.4M nodes) makes a DGL epoch hours. The other stores train their
   whole split. This part is for a quiet machine and a long budget (``--ooc-epochs``,
   ``--ooc-patience``).

``--quick`` (a smoke run of the harness, a few minutes): Cora only, seed 0, at most 20 epochs,
patience 5, runs under ``WORK/quick``; the out-of-core part on the ``tiny`` store (cached in
``--ooc-cache-dir``), capped but without dropping the page cache (other jobs share this
machine), 5 epochs, patience 3: it checks the path, it is not out of core.

A run whose metrics file is complete and whose command line, cap and code digest are
unchanged is not run again (``--rerun`` forces it): its recorded timings are reused and marked
``reused``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

try:
    from tools import bench_outofcore, benchkit, run_accuracy
except ImportError:  # run as a script: tools/ is on sys.path
    import bench_outofcore
    import benchkit
    import run_accuracy

REPO = Path(__file__).resolve().parents[1]
FULL_STORE_TRAIN_TARGETS = 300_000
"""Training targets an epoch on the full out-of-core store: bench_outofcore's paper
configuration (its whole split, 4.4M nodes, makes a DGL epoch hours)."""
TRAINER = REPO / "trainers" / "node_classification.py"
SCHEMES = ("minibatch", "megabatch", "disk", "macrobatch")
REFERENCE = "minibatch"
OUT_OF_CORE = ("megabatch", "disk")
"""Schemes given ``--buffer-partitions`` on the shared datasets, and run under the cap on the
out-of-core graph."""
DGL = "dgl-memmap"
MARGIN = 0.01
TOLERANCE = 1e-9
"""An accuracy within this of the target reaches it (``0.017 - 0.01`` is a hair above 0.007)."""
EPOCH_LINE = re.compile(r"^epoch (\d+)/(\d+)\s")
"""The trainer's (and `child_dgl_tta`'s) line after each epoch's evaluation: ``epoch 3/300  ...``."""
TINY_STORE = {"num_nodes": 20_000, "avg_degree": 10, "feature_dim": 32, "num_classes": 10, "communities": 40,
              "locality": 0.75, "homophily": 0.2, "num_partitions": 16, "seed": 0}
"""The --quick out-of-core store: bench_outofcore's kind of graph, small enough to build and
train in seconds (a check of the harness, not out of core)."""
DEFAULT_CACHE_DIR = Path("~/.cache/graphstore-bench/tta")
SELECTION = (f"target = the median over seeds of the reference ({REFERENCE}) run's best validation "
             "accuracy, minus the margin; time to target = the cumulative training time (the epochs' "
             "time_s, buffer loads included; evaluation, start-up and the final test excluded) up to and "
             "including the first epoch whose validation accuracy >= target; wall_to_target_s = the "
             "process's wall time from its launch to that epoch's line (start-up and every evaluation "
             "included); test accuracy only of the trainer's selected model (best validation accuracy, "
             "ties to the lower validation loss, restored and scored once on test)")


# ---------------------------------------------------------------------- pure functions

def best_valid(metrics: Mapping) -> tuple[float | None, int | None]:
    """The highest validation accuracy of ``metrics``'s evaluated epochs and its epoch (the
    first such), or (None, None) when no epoch was evaluated.

    >>> best_valid({"epochs": [{"epoch": 0, "valid": {"acc": 0.5}}, {"epoch": 1, "valid": None},
    ...                        {"epoch": 2, "valid": {"acc": 0.7}}, {"epoch": 3, "valid": {"acc": 0.7}}]})
    (0.7, 2)
    """
    best, at = None, None
    for e in metrics.get("epochs") or []:
        v = e.get("valid")
        if v is not None and v.get("acc") is not None and (best is None or v["acc"] > best):
            best, at = v["acc"], e["epoch"]
    return best, at


def reference_target(best_valid_accs: Sequence[float | None], margin: float = MARGIN) -> float | None:
    """The target: the median of the reference seeds' best validation accuracies minus
    ``margin`` (rounded to 12 digits); None when no seed has one.

    >>> reference_target([0.80, 0.79, 0.81])
    0.79
    >>> reference_target([None, None]) is None
    True
    """
    done = [a for a in best_valid_accs if a is not None]
    return round(statistics.median(done) - margin, 12) if done else None


def time_to_target(metrics: Mapping, target: float | None, *,
                   epoch_wall_s: Mapping[int, float] | None = None) -> dict:
    """When the run of ``metrics`` (the trainer's metrics JSON) first reached ``target``.

    ``time_to_target_s`` is the sum of the epochs' ``time_s`` (training only) up to and
    including the first epoch whose ``valid.acc`` >= ``target``; ``eval_time_to_target_s``,
    ``samples_to_target`` (``train_targets``) and ``bytes_read_to_target`` (training's
    `epoch_bytes_read`) sum the same epochs; ``wall_to_target_s`` is ``epoch_wall_s[epoch]``
    (seconds from the process's launch to that epoch's line) when given. A run that never
    reaches it has those None and ``why_not_reached``.

    >>> m = {"epochs": [{"epoch": 0, "time_s": 1.0, "eval_time_s": 0.5, "train_targets": 10,
    ...                  "io": {"bytes_read": 100}, "valid": {"acc": 0.5}},
    ...                 {"epoch": 1, "time_s": 2.0, "eval_time_s": 0.5, "train_targets": 10,
    ...                  "io": {"bytes_read": 100}, "valid": {"acc": 0.8}}]}
    >>> r = time_to_target(m, 0.79, epoch_wall_s={0: 4.0, 1: 7.0})
    >>> r["reached"], r["epoch"], r["time_to_target_s"], r["samples_to_target"], r["wall_to_target_s"]
    (True, 1, 3.0, 20, 7.0)
    >>> time_to_target(m, 0.9)["time_to_target_s"] is None
    True
    """
    epochs = list(metrics.get("epochs") or [])
    best, best_epoch = best_valid(metrics)
    out = {"target_valid_acc": target, "reached": False, "epoch": None, "epochs_to_target": None,
           "time_to_target_s": None, "eval_time_to_target_s": None, "wall_to_target_s": None,
           "samples_to_target": None, "bytes_read_to_target": None, "best_valid_acc": best,
           "best_valid_epoch": best_epoch, "epochs_run": len(epochs), "why_not_reached": None}
    train_s = eval_s = 0.0
    samples = bytes_read = 0
    for count, e in enumerate(epochs, start=1):
        train_s += e["time_s"]
        eval_s += e.get("eval_time_s") or 0.0
        samples += e.get("train_targets") or 0
        bytes_read += epoch_bytes_read(e)
        v = e.get("valid")
        if target is None or v is None or v.get("acc") is None or v["acc"] + TOLERANCE < target:
            continue
        wall = None if epoch_wall_s is None else epoch_wall_s.get(e["epoch"])
        out.update(reached=True, epoch=e["epoch"], epochs_to_target=count, time_to_target_s=train_s,
                   eval_time_to_target_s=eval_s, wall_to_target_s=wall, samples_to_target=samples,
                   bytes_read_to_target=bytes_read)
        return out
    out["why_not_reached"] = why_not_reached(metrics, target, best, best_epoch)
    return out


def epoch_bytes_read(epoch: Mapping) -> int:
    """Bytes an epoch's training read from the store: the buffer's (``io.bytes_read``) plus
    macro-batching's row fetches (``macro_batching.bytes_read``, which ``io`` leaves out).

    >>> epoch_bytes_read({"io": {"bytes_read": 0}, "macro_batching": {"bytes_read": 4096}})
    4096
    """
    return (((epoch.get("io") or {}).get("bytes_read") or 0)
            + ((epoch.get("macro_batching") or {}).get("bytes_read") or 0))


def why_not_reached(metrics: Mapping, target: float | None, best: float | None,
                    best_epoch: int | None) -> str:
    """One line: why a run has no time to ``target``."""
    epochs = metrics.get("epochs") or []
    if target is None:
        return "no target: the reference has no validation accuracy"
    if not epochs:
        return "the run recorded no epoch"
    if best is None:
        return "no epoch was evaluated on validation"
    config = metrics.get("config") or {}
    if metrics.get("stopped_early") is not None:
        end = (f"stopped early after {len(epochs)} epochs (no improvement for "
               f"{config.get('patience', '?')} epochs)")
    elif metrics.get("final") is None:
        end = f"the run ended after {len(epochs)} epochs without its final evaluation"
    else:
        end = f"all {len(epochs)} epochs of --epochs {config.get('epochs', len(epochs))} run"
    return f"best validation accuracy {best:.4f} (epoch {best_epoch}) < target {target:.4f}; {end}"


def median_or_none(values: Sequence[float | None]) -> float | None:
    """The median of ``values`` where None (a seed that never reached the target) counts as
    slower than any value: None when half or more are None, or when there are none.

    >>> median_or_none([3.0, None, 1.0]), median_or_none([3.0, None]), median_or_none([])
    (3.0, None, None)
    """
    if not values:
        return None
    m = statistics.median(math.inf if v is None else v for v in values)
    return None if math.isinf(m) else m


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, None when either is missing or ``b`` is not positive.

    >>> ratio(3.0, 1.5), ratio(None, 1.0), ratio(1.0, 0.0)
    (2.0, None, None)
    """
    return None if a is None or b is None or b <= 0 else a / b


def run_figures(metrics: Mapping) -> dict:
    """What a finished run says beyond its time to target: the selected model's accuracies and
    rule, its speed (median epoch, training time per sample), its configuration's derived
    choices."""
    epochs = metrics.get("epochs") or []
    final = metrics.get("final") or {}
    config = metrics.get("config") or {}
    train_s = sum(e["time_s"] for e in epochs)
    samples = sum(e.get("train_targets") or 0 for e in epochs)
    loader = (config.get("loaders") or {}).get("train") or {}
    return {
        "test_acc_at_best_valid": (final.get("test") or {}).get("acc"),
        "valid_acc_at_best_valid": (final.get("valid") or {}).get("acc"),
        "selected_epoch": final.get("epoch"), "selection": final.get("selection"),
        "stopped_early": metrics.get("stopped_early") is not None,
        "stopped_at_epoch": metrics.get("stopped_early"),
        "train_time_s": train_s, "eval_time_s": sum(e.get("eval_time_s") or 0.0 for e in epochs),
        "epoch_time_s_median": statistics.median(e["time_s"] for e in epochs) if epochs else None,
        "samples": samples, "time_per_sample_s": train_s / samples if samples else None,
        "peak_memory_bytes": metrics.get("peak_memory_bytes"),
        "settings": {k: loader.get(k) for k in ("scheme", "policy", "num_partitions", "capacity",
                                                "buffer_bytes", "static_cache_nodes", "reuse", "batch_size",
                                                "fanouts")},
        "eval_scheme": config.get("eval_scheme"), "eval_fanouts": config.get("eval_fanouts"),
        "derived": config.get("derived"),
    }


def seed_record(seed: int, run: Mapping, metrics: Mapping | None, target: float | None) -> dict:
    """One seed's row: the run (exit, timings), its time to ``target`` and its figures; a run
    that failed or left no metrics has no time, and says why."""
    kept = ("returncode", "process_wall_s", "peak_rss_bytes", "cap_bytes", "cgroup_peak_bytes", "oom_kills",
            "reused", "metrics", "log", "note", "code_digest")
    row = {"seed": seed, **{k: run.get(k) for k in kept}}
    if metrics is None or not metrics.get("epochs"):
        row.update(time_to_target(metrics or {}, target))
        tail = (run.get("output_tail") or "").strip().splitlines()[-3:]
        row["why_not_reached"] = (f"the run failed (exit {run.get('returncode')}) and left no epochs: "
                                  + " | ".join(tail))
        return row
    walls = {int(k): v for k, v in (run.get("epoch_wall_s") or {}).items()}
    row.update(time_to_target(metrics, target, epoch_wall_s=walls))
    row.update(run_figures(metrics))
    if run.get("returncode") not in (0, None):
        row["failed"] = f"exit {run.get('returncode')} after {len(metrics['epochs'])} epochs"
    return row


def summarize_scheme(per_seed: Sequence[Mapping]) -> dict:
    """Medians over the seeds (`median_or_none` for the figures a seed may lack)."""
    def med(key: str) -> float | None:
        return median_or_none([r.get(key) for r in per_seed])

    def plain(key: str) -> float | None:
        values = [r[key] for r in per_seed if r.get(key) is not None]
        return statistics.median(values) if values else None

    return {
        "seeds_reached": f"{sum(bool(r.get('reached')) for r in per_seed)}/{len(per_seed)}",
        "median_time_to_target_s": med("time_to_target_s"),
        "median_wall_to_target_s": med("wall_to_target_s"),
        "median_epochs_to_target": med("epochs_to_target"),
        "median_samples_to_target": med("samples_to_target"),
        "median_bytes_read_to_target": med("bytes_read_to_target"),
        "median_eval_time_to_target_s": med("eval_time_to_target_s"),
        "best_valid_acc_median": plain("best_valid_acc"),
        "test_acc_at_best_valid": plain("test_acc_at_best_valid"),
        "test_acc_at_best_valid_per_seed": [r.get("test_acc_at_best_valid") for r in per_seed],
        "epoch_time_s_median": plain("epoch_time_s_median"),
        "time_per_sample_s_median": plain("time_per_sample_s"),
        "per_seed": list(per_seed),
    }


def add_ratios(schemes: dict[str, dict], reference: str = REFERENCE) -> None:
    """Each scheme's medians over the reference's: time to target (the headline), wall time to
    target, samples and epochs to target, time per sample, time per epoch."""
    ref = schemes.get(reference) or {}
    pairs = {"ratio_to_minibatch": "median_time_to_target_s",
             "wall_ratio_to_minibatch": "median_wall_to_target_s",
             "samples_to_target_ratio_to_minibatch": "median_samples_to_target",
             "epochs_to_target_ratio_to_minibatch": "median_epochs_to_target",
             "per_sample_ratio_to_minibatch": "time_per_sample_s_median",
             "per_epoch_ratio_to_minibatch": "epoch_time_s_median"}
    for entry in schemes.values():
        for name, key in pairs.items():
            entry[name] = ratio(entry.get(key), ref.get(key))


def parse_variants(texts: Sequence[str] | None,
                   schemes: Sequence[str] = SCHEMES) -> list[tuple[str, str, list[str]]]:
    """``"megabatch:--balance-labels on;megabatch:--reuse 1"`` (one or more texts) as
    ``(key, scheme, extra flags)``; the key names the flags.

    >>> for variant in parse_variants(["megabatch:--balance-labels on;disk:--reuse 1"]):
    ...     print(variant)
    ('megabatch[--balance-labels on]', 'megabatch', ['--balance-labels', 'on'])
    ('disk[--reuse 1]', 'disk', ['--reuse', '1'])
    """
    out = []
    for text in texts or []:
        for item in filter(None, (t.strip() for t in text.split(";"))):
            scheme, sep, flags = item.partition(":")
            if not sep or scheme.strip() not in schemes or not flags.strip():
                raise ValueError(f"a variant is SCHEME:FLAGS with SCHEME in {', '.join(schemes)} "
                                 f"(got {item!r})")
            argv = shlex.split(flags)
            out.append((f"{scheme.strip()}[{shlex.join(argv)}]", scheme.strip(), argv))
    return out


def safe_name(key: str) -> str:
    """A run directory's name for a scheme key.

    >>> safe_name("megabatch[--reuse 1]")
    'megabatch_--reuse_1'
    """
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", key).strip("_") or "run"


# ---------------------------------------------------------------------- running a child

def job_env() -> dict:
    return dict(run_accuracy.job_env(), PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def run_streaming(argv: list[str], log_path: Path, *, cap_bytes: int | None = None,
                  cap_name: str = "graphstore_tta") -> dict:
    """Run ``argv`` (in a cgroup v1 memory cap of ``cap_bytes`` when given), copying its
    output to ``log_path`` and timing each epoch's line from the launch
    (``epoch_wall_s``: epoch index -> seconds); its exit, wall time, peak RSS and the cap's
    counters."""
    cap = benchkit.MemoryCap(f"{cap_name}_{os.getpid()}", cap_bytes) if cap_bytes else None
    walls: dict[int, float] = {}
    tail: deque[str] = deque(maxlen=40)
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w") as log:
            log.write(shlex.join(argv) + "\n")
            log.flush()
            start = time.perf_counter()
            proc = subprocess.Popen((cap.prefix() if cap else []) + argv, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, cwd=REPO, env=job_env())
            with proc.stdout:
                for line in proc.stdout:
                    now = time.perf_counter() - start
                    log.write(line)
                    tail.append(line)
                    m = EPOCH_LINE.match(line)
                    if m:
                        walls[int(m.group(1)) - 1] = now
            _, status, usage = os.wait4(proc.pid, 0)
            seconds = time.perf_counter() - start
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        stats = cap.stats() if cap else {"cap_bytes": None, "cgroup_peak_bytes": None, "cap_hits": None,
                                         "oom_kills": None}
    finally:
        if cap:
            cap.close()
    return {"argv": argv, "returncode": proc.returncode, "process_wall_s": seconds,
            "peak_rss_bytes": usage.ru_maxrss * 1024, "epoch_wall_s": {str(k): v for k, v in walls.items()},
            "output_tail": "".join(tail)[-3000:], **stats}


def code_digest(root: Path = REPO) -> str:
    """A digest of the code a trainer run executes (``trainers/*.py``, ``graphstore/**/*.py``):
    other sessions edit the checkout while runs go on, so each run records the code it started
    with."""
    h = hashlib.sha256()
    for path in sorted([*(root / "trainers").glob("*.py"), *(root / "graphstore").rglob("*.py")]):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def code_record(parts: Mapping[str, Mapping]) -> dict:
    """The checkout's commit and uncommitted changes under trainers/ and graphstore/ (read-only
    git), and the code digests the runs of each part started with."""
    def git(*cmd: str) -> str | None:
        r = subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True, check=False)
        return r.stdout.strip() if r.returncode == 0 else None

    digests = {name: sorted({row.get("code_digest") or "?" for s in part.get("schemes", {}).values()
                             for row in s.get("per_seed", [])}) for name, part in parts.items()}
    return {"commit": git("rev-parse", "HEAD"),
            "uncommitted": (git("status", "--porcelain", "--", "trainers", "graphstore") or "").splitlines(),
            "digest_now": code_digest(), "run_digests": digests,
            "mixed": {name: len(d) > 1 for name, d in digests.items()}}


def load_metrics(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def run_once(argv: list[str], out: Path, *, cap_bytes: int | None, drop_cache: bool, rerun: bool,
             log) -> dict:
    """One trainer (or DGL child) run writing metrics to ``out``, recorded beside it in
    ``out.run.json``; a finished run with the same command line and cap is reused."""
    sidecar = out.with_suffix(".run.json")
    digest = code_digest()
    key = {"argv": argv, "cap_bytes": cap_bytes, "code_digest": digest}
    if not rerun and sidecar.exists():
        old = load_metrics(sidecar)
        metrics = load_metrics(out)
        if (old and {k: old.get(k) for k in key} == key
                and old.get("returncode") == 0 and metrics and metrics.get("final")):
            log(f"  reusing {out}")
            return dict(old, reused=True)
    out.unlink(missing_ok=True)
    if drop_cache:
        benchkit.drop_caches()
    log(f"  run {shlex.join(argv[1:])}" + (f"  (cap {cap_bytes >> 20} MiB)" if cap_bytes else ""))
    run = run_streaming(argv, out.with_suffix(".log"), cap_bytes=cap_bytes)
    run.update(reused=False, metrics=str(out), log=str(out.with_suffix(".log")), code_digest=digest,
               page_cache_dropped=drop_cache, loadavg_after=list(os.getloadavg()))
    benchkit.write_json(sidecar, run)
    state = "ok" if run["returncode"] == 0 else f"FAILED (exit {run['returncode']}, see {run['log']})"
    log(f"    {state} in {run['process_wall_s']:.1f} s")
    return run


def trainer_argv(store: Path, scheme: str, flags: Sequence[str], *, seed: int, epochs: int, patience: int,
                 out: Path, extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, str(TRAINER), "--store", str(store), "--scheme", scheme, *flags, *extra,
            "--eval-every", "1", "--patience", str(patience), "--epochs", str(epochs), "--seed", str(seed),
            "--metrics-out", str(out)]


def analyse(runs: Mapping[str, Mapping[int, tuple[dict, dict | None]]], descriptions: Mapping[str, dict],
            margin: float) -> dict:
    """``runs[key][seed] = (run, metrics)`` -> the target (from the reference's seeds) and each
    key's per-seed rows, medians and ratios."""
    ref = runs.get(REFERENCE) or {}
    ref_best = {seed: best_valid(m or {})[0] for seed, (_, m) in sorted(ref.items())}
    target = reference_target(list(ref_best.values()), margin)
    schemes = {}
    for key, by_seed in runs.items():
        rows = [seed_record(seed, run, metrics, target) for seed, (run, metrics) in sorted(by_seed.items())]
        schemes[key] = {**descriptions.get(key, {}), **summarize_scheme(rows)}
    add_ratios(schemes)
    done = [v for v in ref_best.values() if v is not None]
    reference = {"scheme": REFERENCE, "best_valid_acc_per_seed": {str(s): v for s, v in ref_best.items()},
                 "best_valid_acc_median": statistics.median(done) if done else None, "margin": margin,
                 "target_rule": f"median over seeds of {REFERENCE}'s best validation accuracy - {margin}"}
    return {"target_valid_acc": target, "reference": reference, "schemes": schemes}


# ---------------------------------------------------------------------- part 1: the shared datasets

def convert_store(name: str, args, log) -> Path:
    """``WORK/stores/<name>_p<P>.gs``, converted from ``--data`` once (METIS, ``--partitions``)."""
    src, extra = run_accuracy.NC_DATASETS[name]
    out = args.work / "stores" / f"{name}_p{args.partitions}.gs"
    if (out / "zarr.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "graphstore", "convert", str(args.data / src), str(out), "--partitions",
           str(args.partitions), "--partitioner", "metis", "--overwrite", *extra]
    log(f"convert {name}: {shlex.join(cmd[1:])}")
    r = subprocess.run(cmd, cwd=REPO, env=job_env(), capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"converting {name} failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    return out


def dataset_plan(args) -> list[tuple[str, str, list[str], str]]:
    """``(key, scheme, flags, description)`` of every run key on a shared dataset: the
    reference first."""
    base = {"minibatch": ([], "in memory (the reference)"),
            "megabatch": (["--buffer-partitions", str(args.buffer_partitions)],
                          f"HierBatching, {args.buffer_partitions} of {args.partitions} partitions resident"),
            "disk": (["--buffer-partitions", str(args.buffer_partitions)],
                     f"MariusGNN node policy, {args.buffer_partitions} of {args.partitions} partitions "
                     "resident"),
            "macrobatch": ([], "BatchGNN macro-batches (structure in memory, rows read per macro-batch)")}
    plan = [(s, s, base[s][0], base[s][1]) for s in args.schemes]
    plan += [(key, scheme, base[scheme][0] + extra, f"{base[scheme][1]}, plus {shlex.join(extra)}")
             for key, scheme, extra in args.variants]
    return plan


def run_dataset(name: str, args, log) -> dict:
    store = convert_store(name, args, log)
    log(f"{name}: {store}")
    runs: dict[str, dict[int, tuple[dict, dict | None]]] = {}
    descriptions = {}
    for key, scheme, flags, description in dataset_plan(args):
        descriptions[key] = {"scheme": scheme, "flags": flags + args.trainer_flags,
                             "description": description}
        runs[key] = {}
        for seed in args.seeds:
            out = args.runs_dir / name / safe_name(key) / f"seed{seed}.json"
            argv = trainer_argv(store, scheme, flags, seed=seed, epochs=args.epochs, patience=args.patience,
                                out=out, extra=args.trainer_flags)
            run = run_once(argv, out, cap_bytes=None, drop_cache=False, rerun=args.rerun, log=log)
            runs[key][seed] = (run, load_metrics(out))
    result = analyse(runs, descriptions, args.margin)
    result.update(store=str(store), partitions=args.partitions, seeds=args.seeds, epochs=args.epochs,
                  patience=args.patience)
    return result


# ---------------------------------------------------------------------- part 2: the out-of-core graph

def resolve_ooc_store(args, log) -> tuple[Path | None, dict]:
    """The out-of-core store's path and how it was made, or (None, why it is missing)."""
    choice = args.ooc_store
    if choice in ("quick", "tiny"):
        params = dict(bench_outofcore.QUICK_STORE if choice == "quick" else TINY_STORE,
                      layout_code=bench_outofcore._layout_code_digest())
        cache = (bench_outofcore.DEFAULT_CACHE_DIR.expanduser() if choice == "quick"
                 else args.ooc_cache_dir / "tiny")
        built = bench_outofcore.ensure_quick_stores(cache, params, log)
        return Path(built["metis"]), {"kind": choice, "params": params, "cache_dir": str(cache),
                                      "reused": built["reused"], "build_s": built["build_s"]}
    path = bench_outofcore.DEFAULT_STORE if choice == "full" else Path(choice)
    if not path.exists():
        how = ("make it with the commands in tools/bench_outofcore.py's docstring" if choice == "full"
               else "no such store")
        return None, {"kind": choice, "path": str(path), "missing": f"{path} does not exist: {how}"}
    return path, {"kind": "full" if choice == "full" else "path"}


def run_ooc(args, log) -> dict:
    """Part 2: the reference uncapped, megabatch and disk under the cap (cold cache), DGL +
    memmap beside them; the same analysis as the shared datasets."""
    sys.path.insert(0, str(REPO))
    import graphstore

    path, made = resolve_ooc_store(args, log)
    if path is None:
        return {"store": made, "skipped": made["missing"]}
    store = graphstore.open(path)
    info = bench_outofcore.store_info(store, path, "main")
    info.update(made, split_names=list(store.split_names))
    if "valid" not in store.split_names or "train" not in store.split_names:
        store.close()
        return {"store": info,
                "skipped": f"the store has no train and valid splits (it has {store.split_names}): time to a "
                           "validation accuracy cannot be measured; none was invented"}
    feature_bytes = store.num_nodes * store.feature_dim * 4
    store.close()
    iso = bench_outofcore.isolation()
    cap_mib = args.ooc_cap_mib or (1024 if made["kind"] == "full"
                                   else bench_outofcore.quick_cap_mib(feature_bytes, args.ooc_process_mib))
    cap_bytes = (cap_mib << 20) if iso["cap_enforced"] else None
    drop = iso["page_cache_dropped"] and not args.no_drop_caches
    kept = "page cache not dropped (--quick or --no-drop-caches: other jobs share this machine)"
    settings = {"cap_bytes": cap_mib << 20, "cap_enforced": cap_bytes is not None, "page_cache_dropped": drop,
                "isolation_note": iso["why"] or (None if drop else kept),
                "feature_bytes": feature_bytes, "features_vs_cap": feature_bytes / (cap_mib << 20),
                "buffer": (f"--buffer-bytes {args.ooc_buffer_bytes}" if args.ooc_buffer_bytes else
                           "the trainer's default: a share of the memory the process may use (the cgroup's "
                           "headroom)"),
                "epochs": args.ooc_epochs, "patience": args.ooc_patience, "seeds": args.ooc_seeds,
                "not_out_of_core": made["kind"] == "tiny"}
    log(f"out-of-core graph {path}: {info['num_nodes']:,} nodes, features {feature_bytes / 2**20:.0f} MiB, "
        f"cap {cap_mib} MiB ({'enforced' if cap_bytes else 'NOT enforced'}), page cache "
        f"{'dropped' if drop else 'kept'} before each run")
    buffer = ["--buffer-bytes", str(args.ooc_buffer_bytes)] if args.ooc_buffer_bytes else []
    subset = [] if args.ooc_train_targets is None else ["--train-targets", str(args.ooc_train_targets)]
    settings["train_targets"] = args.ooc_train_targets or "the whole train split"
    plan = [(REFERENCE, subset, None, "in memory, uncapped (the reference)")]
    plan += [(s, buffer + subset, cap_bytes, f"{s} under the {cap_mib} MiB cap") for s in OUT_OF_CORE]
    runs: dict[str, dict[int, tuple[dict, dict | None]]] = {}
    descriptions = {}
    for scheme, flags, cap, description in plan:
        descriptions[scheme] = {"scheme": scheme, "flags": flags + args.trainer_flags,
                                "description": description, "capped": cap is not None}
        runs[scheme] = {}
        for seed in args.ooc_seeds:
            out = args.runs_dir / "ooc" / safe_name(path.name) / scheme / f"seed{seed}.json"
            argv = trainer_argv(path, scheme, flags, seed=seed, epochs=args.ooc_epochs,
                                patience=args.ooc_patience, out=out, extra=args.trainer_flags)
            run = run_once(argv, out, cap_bytes=cap, drop_cache=drop, rerun=args.rerun, log=log)
            runs[scheme][seed] = (run, load_metrics(out))
    dgl_note = None
    if args.no_dgl:
        dgl_note = "not run (--no-dgl)"
    else:
        dgl_note = run_dgl(args, path, runs, descriptions, cap_bytes=cap_bytes, drop=drop, log=log)
    result = analyse(runs, descriptions, args.margin)
    if dgl_note:
        result["schemes"].setdefault(DGL, {"skipped": dgl_note})
    result.update(store=info, settings=settings)
    return result


def dgl_python(args) -> tuple[str | None, str | None]:
    """An interpreter with dgl (never created here): ``--dgl-python``, this one, or
    ``.venv-dgl``'s; or (None, why not)."""
    candidates = ([args.dgl_python] if args.dgl_python
                  else [sys.executable, str(REPO / ".venv-dgl" / "bin" / "python")])
    tried = []
    for py in candidates:
        if not Path(py).exists():
            tried.append(f"{py}: missing")
            continue
        r = subprocess.run([py, "-c", "import dgl"], capture_output=True, text=True, check=False,
                           env=job_env())
        if r.returncode == 0:
            return py, None
        tried.append(f"{py}: {(r.stderr.strip().splitlines() or ['import dgl failed'])[-1]}")
    return None, "no interpreter with dgl (" + "; ".join(tried) + ")"


def dgl_spec(config: Mapping, *, store, files: Mapping, split_files: Mapping, args, seed: int,
             out: Path) -> dict:
    """What `child_dgl_tta` is given: the reference run's hyper-parameters and evaluation
    fanouts, the store's shape, DGL's inputs."""
    return {**{k: str(files[k]) for k in ("features", "indptr", "indices", "labels")},
            **{k: str(v) for k, v in split_files.items()},
            "num_nodes": store.num_nodes, "feature_dim": store.feature_dim, "num_classes": store.num_classes,
            "fanouts": list(config["fanouts"]), "eval_fanouts": dgl_eval_fanouts(args, config),
            "dgl_eval": dgl_eval(args), "layerwise_batch_size": DGL_LAYERWISE_BATCH,
            "batch_size": config["batch_size"],
            "eval_batch_size": config.get("eval_batch_size") or config["batch_size"],
            "hidden": config["hidden"], "dropout": config["dropout"], "lr": config["lr"],
            "weight_decay": config["weight_decay"], "normalize_features": config["normalize_features"],
            "lr_schedule": config.get("lr_schedule", "none"), "model": config.get("model", "sage"),
            "epochs": args.ooc_epochs, "patience": args.ooc_patience, "seed": seed, "threads": 1,
            "num_workers": args.dgl_workers, "madvise_random": True, "metrics_out": str(out)}


def dgl_eval(args) -> str:
    """``--dgl-eval``, else ``sampled`` when fanouts are given for it, else ``layerwise``."""
    return args.dgl_eval or ("sampled" if args.dgl_eval_fanouts else "layerwise")


def dgl_eval_fanouts(args, config: Mapping) -> list[int]:
    """DGL's validation fanouts: ``--dgl-eval-fanouts``, else the reference run's."""
    if args.dgl_eval_fanouts:
        return [int(f) for f in str(args.dgl_eval_fanouts).split(",")]
    return list(config["eval_fanouts"])


def run_dgl(args, path: Path, runs: dict, descriptions: dict, *, cap_bytes: int | None, drop: bool,
            log) -> str | None:
    """DGL + memmap per seed under the cap (the wide cap when the cap kills it), added to
    ``runs``; or why it did not run."""
    import numpy as np

    import graphstore
    from trainers.node_classification import train_targets

    ref = runs.get(REFERENCE) or {}
    configs = {seed: (m or {}).get("config") for seed, (_, m) in ref.items()}
    if not any(configs.values()):
        return "not run: the reference run left no configuration to copy"
    py, why = dgl_python(args)
    if py is None:
        return f"not run: {why}"
    store = graphstore.open(path)
    try:
        work = args.ooc_cache_dir / "dgl_inputs"
        files = bench_outofcore.prepare_dgl_inputs(store, path, work)
        tag = bench_outofcore._store_tag(path, store)
        split_files = {}
        for split in ("valid", "test"):
            split_files[f"{split}_ids"] = work / f"{split}_{tag}.npy"
            np.save(split_files[f"{split}_ids"], np.asarray(store.read_node_split(split), np.int64))
        # bench_outofcore's wide cap: room for DGL's in-memory structure on top of the cap.
        step = 64 << 20
        wide = cap_bytes and -(-(cap_bytes + files["structure_bytes"] + (512 << 20)) // step) * step
        config0 = next(c for c in configs.values() if c)
        descriptions[DGL] = {
            "scheme": "dgl", "flags": [], "capped": cap_bytes is not None, "interpreter": py,
            "description": (f"DGL NeighborSampler + DataLoader ({args.dgl_workers} workers sampling and "
                            "gathering rows from a numpy memmap, MADV_RANDOM, sorted gathers); the "
                            "reference's hyper-parameters; validation "
                            + (f"layer-wise over full-neighbour blocks of {DGL_LAYERWISE_BATCH} nodes, the "
                               "first layer's rows from the memmap in node order, every node's hidden rows "
                               "in memory (DGL's examples' exact inference; the reference's evaluation is "
                               "exact too)" if dgl_eval(args) == "layerwise" else
                               f"with fanouts {dgl_eval_fanouts(args, config0)} (--dgl-eval-fanouts: sampled, "
                               f"where the reference's evaluation is {config0['eval_fanouts']}, "
                               f"{config0.get('eval_fanouts_rule')})" if args.dgl_eval_fanouts else
                               f"with fanouts {config0['eval_fanouts']} (the reference's evaluation: "
                               f"{config0.get('eval_fanouts_rule')})")),
            "dgl_eval": dgl_eval(args),
            "eval_fanouts": dgl_eval_fanouts(args, config0),
            "wide_cap_bytes": wide or None}
        runs[DGL] = {}
        for seed, config in sorted(configs.items()):
            if not config:
                continue
            out = args.runs_dir / "ooc" / safe_name(path.name) / DGL / f"seed{seed}.json"
            # The targets the reference trained: its --train-targets subset (drawn by the trainer's own rule).
            train = train_targets(store, argparse.Namespace(train_targets=config.get("train_targets"), seed=seed))
            train_file = work / f"train_{tag}_{len(train)}_seed{seed}.npy"
            np.save(train_file, train)
            spec = dgl_spec(config, store=store, files=files, split_files={**split_files, "train_ids": train_file},
                            args=args, seed=seed, out=out)
            argv = [py, str(Path(__file__).resolve()), "--child", json.dumps(spec, sort_keys=True)]
            run = run_once(argv, out, cap_bytes=cap_bytes, drop_cache=drop, rerun=args.rerun, log=log)
            if cap_bytes and run["returncode"] != 0 and run.get("oom_kills"):
                killed = {k: run.get(k)
                          for k in ("cap_bytes", "returncode", "oom_kills", "cgroup_peak_bytes")}
                log(f"  the cap killed DGL: again under the wide cap ({wide >> 20} MiB)")
                run = run_once(argv, out, cap_bytes=wide, drop_cache=drop, rerun=True, log=log)
                run["note"] = (f"the {cap_bytes >> 20} MiB cap killed it; run under the wide cap "
                               f"{wide >> 20} MiB")
                run["killed_under_cap"] = killed
            runs[DGL][seed] = (run, load_metrics(out))
    finally:
        store.close()
    return None


def child_dgl_tta(spec: dict) -> None:
    """DGL + memmap training with validation after every epoch, in the trainer's metrics
    layout (runs in DGL's interpreter: nothing from graphstore).

    The model mirrors the trainer's GraphSage: mean-aggregator ``SAGEConv`` layers, ReLU and
    dropout between them; Adam with weight decay; row normalisation of gathered rows when
    the reference derived it. Early stopping and the restored best model follow the trainer:
    higher validation accuracy, or the same with a lower loss, improves; a run stops after
    ``patience`` epochs without improvement; the best model is scored once on valid and test.
    """
    import copy

    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(spec["threads"])
    import dgl

    started = time.perf_counter()
    torch.manual_seed(spec["seed"])
    g, labels, feats = bench_outofcore.load_dgl_inputs(spec)
    ids = {s: np.load(spec[f"{s}_ids"]).astype(np.int64) for s in ("train", "valid", "test")}
    workers = int(spec["num_workers"])

    def loader(split: str, fanouts: list[int], batch_size: int, shuffle: bool):
        # DGL lists fanouts input layer first; the trainer's fanouts[0] is the hop nearest the targets.
        neighbours = dgl.dataloading.NeighborSampler(list(fanouts)[::-1])
        sampler = bench_outofcore.GatheringSampler(neighbours, feats, labels)
        kwargs = {"num_workers": workers}
        if workers:
            kwargs.update(multiprocessing_context="fork", persistent_workers=True)
        return dgl.dataloading.DataLoader(g, torch.from_numpy(ids[split]), sampler, batch_size=batch_size,
                                          shuffle=shuffle, drop_last=False, **kwargs)

    def prepare(x: torch.Tensor) -> torch.Tensor:
        if spec["normalize_features"] != "row":
            return x
        norm = x.abs().sum(dim=1, keepdim=True)
        return x / torch.where(norm > 0, norm, torch.ones_like(norm))

    model = bench_outofcore.dgl_sage(spec)
    opt = torch.optim.Adam(model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])
    train = loader("train", spec["fanouts"], spec["batch_size"], True)
    layerwise = spec.get("dgl_eval", "sampled") == "layerwise"
    evaluation = {} if layerwise else {s: loader(s, spec["eval_fanouts"], spec["eval_batch_size"], False)
                                       for s in ("valid", "test")}

    def accuracy_and_loss(logits: torch.Tensor, y: torch.Tensor) -> dict:
        mask = y >= 0
        seen = int(mask.sum())
        nan = float("nan")
        if not seen:
            return {"acc": nan, "loss": nan}
        return {"acc": int((logits[mask].argmax(1) == y[mask]).sum()) / seen,
                "loss": float(F.cross_entropy(logits[mask], y[mask], reduction="sum")) / seen}

    @torch.no_grad()
    def evaluate(split: str) -> dict:
        model.eval()
        if layerwise:
            nodes = ids[split]
            logits = dgl_layerwise_logits(model, g, feats, labels, nodes, prepare=prepare, workers=workers,
                                          batch_size=int(spec["layerwise_batch_size"]))
            return accuracy_and_loss(logits, labels[torch.from_numpy(nodes)])
        parts = [(model(blocks, prepare(x)), y) for _, _, blocks, x, y in evaluation[split]]
        return accuracy_and_loss(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))

    history, best, best_state, stopped = [], None, None, None
    for epoch in range(spec["epochs"]):
        lr = spec["lr"] if spec["lr_schedule"] != "cosine" else (
            spec["lr"] * 0.5 * (1.0 + math.cos(math.pi * epoch / spec["epochs"])))
        for group in opt.param_groups:
            group["lr"] = lr
        io0, t0 = bench_outofcore._tree_read_bytes(), time.perf_counter()
        model.train()
        total, count = 0.0, 0
        for _, _, blocks, x, y in train:
            logits = model(blocks, prepare(x))
            mask = y >= 0
            loss = F.cross_entropy(logits[mask], y[mask])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            k = int(mask.sum())
            total, count = total + float(loss.detach()) * k, count + k
        t1 = time.perf_counter()
        bytes_read = bench_outofcore._tree_read_bytes() - io0
        valid = evaluate("valid")
        t2 = time.perf_counter()
        record = {"epoch": epoch, "lr": lr, "train_loss": total / max(count, 1), "train_targets": count,
                  "valid": valid, "time_s": t1 - t0, "eval_time_s": t2 - t1, "io": {"bytes_read": bytes_read}}
        history.append(record)
        if best is None or valid["acc"] > best["valid"]["acc"] or (
                valid["acc"] == best["valid"]["acc"] and valid["loss"] < best["valid"]["loss"]):
            best, best_state = record, copy.deepcopy(model.state_dict())
        print(f"epoch {epoch + 1}/{spec['epochs']}  train loss {record['train_loss']:.4f}  valid acc "
              f"{valid['acc']:.4f} loss {valid['loss']:.4f}  (+{t2 - t1:.2f} s eval)  {t1 - t0:.2f} s  "
              f"read {bytes_read / 2**20:.1f} MiB", flush=True)
        if spec["patience"] and epoch - best["epoch"] >= spec["patience"]:
            stopped = epoch
            break
    model.load_state_dict(best_state)
    scores = {s: evaluate(s) for s in ("valid", "test")}
    selection = (f"best validation accuracy: epoch {best['epoch'] + 1} of {len(history)} trained"
                 + (f" (stopped early, patience {spec['patience']})" if stopped is not None else ""))
    metrics = {"task": "node_classification", "system": DGL,
               "config": {**{k: v for k, v in spec.items() if k != "metrics_out"},
                          "eval_scheme": "dgl layerwise" if layerwise else "dgl sampled", "dgl": dgl.__version__,
                          "torch": torch.__version__},
               "epochs": history, "final": {"epoch": best["epoch"], **scores, "selection": selection},
               "stopped_early": stopped, "train_time_s": sum(e["time_s"] for e in history),
               "eval_time_s": sum(e["eval_time_s"] for e in history),
               "wall_time_s": time.perf_counter() - started,
               "peak_memory_bytes": benchkit.vm_hwm_bytes()}
    out = Path(spec["metrics_out"])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(metrics, indent=1))
    tmp.replace(out)
    print(f"final: valid acc {scores['valid']['acc']:.4f}  test acc {scores['test']['acc']:.4f}  "
          f"({selection})", flush=True)


DGL_LAYERWISE_BATCH = 4096
"""Nodes per full-neighbour block in DGL's layer-wise evaluation."""


def dgl_layerwise_logits(model, g, feats, labels, nodes, *, prepare, workers: int, batch_size: int):
    """Logits of ``nodes`` by DGL's exact inference, as its GraphSage examples run it: one
    layer at a time over full-neighbour blocks of every node, each layer's output for all
    nodes held in memory ([N, hidden] float32), the last layer for ``nodes`` alone. The
    first layer's rows come from the memmap ``feats`` (gathered sorted, in the loader's
    workers), its blocks in node-id order, which on a partition-ordered store keeps the
    reads near each other. Every neighbour counts, so it equals the sampling loader at
    fanouts of -1 (the tests check it), without holding a two-hop neighbourhood at once."""
    import dgl
    import torch
    import torch.nn.functional as F

    model.eval()
    full = dgl.dataloading.MultiLayerFullNeighborSampler(1)
    h = None
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            last = i + 1 == len(model.layers)
            out_nodes = torch.as_tensor(nodes, dtype=torch.int64) if last else torch.arange(g.num_nodes())
            first = h is None
            sampler = bench_outofcore.GatheringSampler(full, feats, labels) if first else full
            kwargs = {"num_workers": workers, "multiprocessing_context": "fork"} if first and workers else {}
            batches = dgl.dataloading.DataLoader(g, out_nodes, sampler, batch_size=batch_size, shuffle=False,
                                                 drop_last=False, **kwargs)
            # Rows placed by each batch's output ids: with workers, placing them by position
            # gave wrong rows (chance accuracy on the 2.1M-node store; the test checks both).
            order = torch.argsort(out_nodes)
            ranked = out_nodes[order]
            y = torch.empty(len(out_nodes), layer._out_feats)
            for batch in batches:
                input_nodes, output_nodes, blocks = batch[0], batch[1], batch[2]
                x = prepare(batch[3]) if first else h[input_nodes]
                z = layer(blocks[0], x)
                y[order[torch.searchsorted(ranked, output_nodes)]] = z if last else F.relu(z)
            h = y
    return h


# ---------------------------------------------------------------------- the summary

def _fmt(x, spec: str = ".2f", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def summary_lines(name: str, part: Mapping) -> list[str]:
    """A readable table of one dataset's (or the out-of-core graph's) schemes."""
    if "skipped" in part:
        return [f"{name}: skipped: {part['skipped']}"]
    ref = part["reference"]
    lines = [f"{name}: target valid acc {_fmt(part['target_valid_acc'], '.4f')} (= {REFERENCE} best valid, "
             f"median over seeds {_fmt(ref['best_valid_acc_median'], '.4f')}, - {ref['margin']})",
             f"  {'scheme':30s} {'reached':>7s} {'tta s':>8s} {'x ref':>6s} {'wall s':>7s} {'x ref':>6s} "
             f"{'epochs':>6s} {'samples':>8s} {'MiB read':>9s} {'s/sample x':>10s} {'s/epoch x':>9s} "
             f"{'best valid':>10s} {'test@best':>9s}"]
    for key, s in part["schemes"].items():
        if "per_seed" not in s:
            lines.append(f"  {key:30s} {s.get('skipped', '?')}")
            continue
        mib = s.get("median_bytes_read_to_target")
        lines.append(
            f"  {key:30s} {s['seeds_reached']:>7s} {_fmt(s['median_time_to_target_s']):>8s} "
            f"{_fmt(s['ratio_to_minibatch']):>6s} {_fmt(s['median_wall_to_target_s'], '.1f'):>7s} "
            f"{_fmt(s['wall_ratio_to_minibatch']):>6s} {_fmt(s['median_epochs_to_target'], '.0f'):>6s} "
            f"{_fmt(s['median_samples_to_target'], '.0f'):>8s} {_fmt(mib and mib / 2**20, '.1f'):>9s} "
            f"{_fmt(s['per_sample_ratio_to_minibatch']):>10s} {_fmt(s['per_epoch_ratio_to_minibatch']):>9s} "
            f"{_fmt(s['best_valid_acc_median'], '.4f'):>10s} {_fmt(s['test_acc_at_best_valid'], '.4f'):>9s}")
        for r in s["per_seed"]:
            if not r.get("reached"):
                lines.append(f"  {'':30s} seed {r['seed']}: not reached: {r.get('why_not_reached')}")
    return lines


def print_summary(result: Mapping) -> None:
    print("\ntime to target (tta: training seconds, evaluation excluded; wall: from launch, everything "
          "included; x ref: over minibatch's; medians over seeds)")
    for name, part in result["datasets"].items():
        print("\n".join(summary_lines(name, part)))
    if result.get("ooc") is not None:
        print("\n".join(summary_lines("out-of-core graph", result["ooc"])))
    code = result.get("code") or {}
    mixed = [name for name, m in (code.get("mixed") or {}).items() if m]
    if mixed:
        print(f"WARNING: the code changed between runs of {', '.join(mixed)} (code.run_digests): "
              "compare those rows with care, or run again with --rerun")


# ---------------------------------------------------------------------- main

def _ints(text: str) -> list[int]:
    return [int(t) for t in run_accuracy.parse_list(text)]


def parse_args(argv: Sequence[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the results here (required)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: cora, seed 0, at most 20 epochs, patience 5, the tiny out-of-core store")
    ap.add_argument("--work", type=Path, default=Path("/work/tta"),
                    help="stores and runs (kept between runs)")
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data", help="the shared datasets")
    ap.add_argument("--datasets", default=None,
                    help="comma-separated, from " + ",".join(run_accuracy.NC_DATASETS)
                    + " (default all; --quick: cora)")
    ap.add_argument("--schemes", default=",".join(SCHEMES),
                    help=f"comma-separated; {REFERENCE} is always run")
    ap.add_argument("--variants", action="append", default=None, metavar="SCHEME:FLAGS[;SCHEME:FLAGS]",
                    help="extra trainer flags for a scheme, a run of their own (repeatable)")
    ap.add_argument("--seeds", default=None, help="comma-separated (default 0,1,2; --quick: 0)")
    ap.add_argument("--partitions", type=int, default=32, help="partitions of the converted shared datasets")
    ap.add_argument("--buffer-partitions", type=int, default=8,
                    help="megabatch and disk: partitions resident")
    ap.add_argument("--epochs", type=int, default=None, help="most epochs a run (default 300; --quick 20)")
    ap.add_argument("--patience", type=int, default=None,
                    help="the trainer's --patience (default 30; --quick 5)")
    ap.add_argument("--margin", type=float, default=MARGIN, help="target = reference best valid acc - margin")
    ap.add_argument("--trainer-flags", default="", help="more flags for every trainer run (one shell string)")
    ap.add_argument("--rerun", action="store_true", help="run again even when a finished run is recorded")
    ap.add_argument("--no-ooc", action="store_true", help="skip the out-of-core graph")
    ap.add_argument("--ooc-store", default=None,
                    help="full (bench_outofcore's 7.3M-node store), quick (its 2.1M-node cached stores), "
                         "tiny (20k nodes, a harness check) or a store path (default full; --quick: tiny)")
    ap.add_argument("--ooc-seeds", default="0", help="seeds on the out-of-core graph")
    ap.add_argument("--ooc-epochs", type=int, default=None, help="most epochs there (default 20; --quick 5)")
    ap.add_argument("--ooc-train-targets", type=int, default=None,
                    help="training targets an epoch there, drawn by the trainer's --train-targets (the same nodes "
                         "for DGL) (default: 300,000 on the full store, as bench_outofcore's paper configuration; "
                         "the whole train split on the others)")
    ap.add_argument("--ooc-patience", type=int, default=None, help="patience there (default 5; --quick 3)")
    ap.add_argument("--ooc-cap-mib", type=int, default=None,
                    help="cgroup cap of megabatch, disk and DGL (default: bench_outofcore's for the store)")
    ap.add_argument("--ooc-process-mib", type=int, default=576,
                    help="the process's own memory in bench_outofcore's quick cap rule")
    ap.add_argument("--ooc-buffer-bytes", type=int, default=None,
                    help="--buffer-bytes of the capped trainer runs (default: the trainer's own choice)")
    ap.add_argument("--ooc-cache-dir", type=Path, default=DEFAULT_CACHE_DIR,
                    help="the tiny store and DGL's inputs (cached)")
    ap.add_argument("--no-drop-caches", action="store_true",
                    help="do not drop the page cache before ooc runs")
    ap.add_argument("--no-dgl", action="store_true", help="skip DGL + memmap on the out-of-core graph")
    ap.add_argument("--dgl-python", default=None,
                    help="an interpreter with dgl (default: this one, else .venv-dgl)")
    ap.add_argument("--dgl-workers", type=int, default=2,
                    help="DGL DataLoader workers (sampling + gathering rows)")
    ap.add_argument("--dgl-eval", choices=("layerwise", "sampled"), default=None,
                    help="DGL's validation: layer-wise over full-neighbour blocks, every node's hidden rows "
                         "in memory (its examples' exact inference, the reference's evaluation), or its "
                         "sampling loader at the evaluation fanouts (default: layerwise; sampled with "
                         "--dgl-eval-fanouts)")
    ap.add_argument("--dgl-eval-fanouts", default=None, metavar="F1,F2",
                    help="--dgl-eval sampled: DGL's validation fanouts (default: the reference's, every "
                         "neighbour; on the out-of-core graph that OOMs under the cap; e.g. 25,10 samples as "
                         "DGL's examples do, and the row then says so)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return ap, args
    if args.json is None:
        ap.error("--json is required")
    every = ",".join(run_accuracy.NC_DATASETS)
    args.datasets = run_accuracy.parse_list(args.datasets or ("cora" if args.quick else every))
    unknown = [d for d in args.datasets if d not in run_accuracy.NC_DATASETS]
    if unknown:
        ap.error(f"unknown datasets {unknown}; known: {', '.join(run_accuracy.NC_DATASETS)}")
    schemes = run_accuracy.parse_list(args.schemes)
    if set(schemes) - set(SCHEMES):
        ap.error(f"unknown schemes {sorted(set(schemes) - set(SCHEMES))}; known: {', '.join(SCHEMES)}")
    args.schemes = [REFERENCE] + [s for s in schemes if s != REFERENCE]
    try:
        args.variants = parse_variants(args.variants)
    except ValueError as exc:
        ap.error(str(exc))
    args.seeds = _ints(args.seeds or ("0" if args.quick else "0,1,2"))
    args.ooc_seeds = _ints(args.ooc_seeds)
    args.epochs = args.epochs or (20 if args.quick else 300)
    args.patience = args.patience if args.patience is not None else (5 if args.quick else 30)
    args.ooc_epochs = args.ooc_epochs or (5 if args.quick else 20)
    args.ooc_patience = args.ooc_patience if args.ooc_patience is not None else (3 if args.quick else 5)
    args.ooc_store = args.ooc_store or ("tiny" if args.quick else "full")
    if args.ooc_train_targets is None and args.ooc_store == "full":
        args.ooc_train_targets = FULL_STORE_TRAIN_TARGETS
    args.no_drop_caches = args.no_drop_caches or args.quick
    args.trainer_flags = shlex.split(args.trainer_flags)
    args.ooc_cache_dir = args.ooc_cache_dir.expanduser()
    args.runs_dir = args.work / ("quick" if args.quick else "runs")
    if not args.seeds or not args.ooc_seeds:
        ap.error("--seeds and --ooc-seeds need at least one seed")
    return ap, args


def main(argv: Sequence[str] | None = None) -> int:
    ap, args = parse_args(argv)
    if args.child:
        child_dgl_tta(json.loads(args.child))
        return 0
    log = benchkit.elapsed_logger()
    t0 = time.perf_counter()
    loadavg_start = list(os.getloadavg())
    args.work.mkdir(parents=True, exist_ok=True)
    datasets = {name: run_dataset(name, args, log) for name in args.datasets}
    ooc = None if args.no_ooc else run_ooc(args, log)
    result = {
        "command": benchkit.command_line("tools/bench_time_to_accuracy.py",
                                         None if argv is None else list(argv)),
        "quick": args.quick,
        "machine": benchkit.machine_record("cpu", "cores", "python", "torch", "numpy",
                                           loadavg_at_start=loadavg_start,
                                           loadavg_at_end=list(os.getloadavg()),
                                           note=benchkit.SHARED_MACHINE_NOTE),
        "selection": SELECTION,
        "settings": {"seeds": args.seeds, "epochs": args.epochs, "patience": args.patience,
                     "margin": args.margin,
                     "partitions": args.partitions, "buffer_partitions": args.buffer_partitions,
                     "trainer_flags": args.trainer_flags, "eval_every": 1, "threads": "OMP_NUM_THREADS=1",
                     "runs": "one at a time", "work": str(args.runs_dir)},
        "datasets": datasets,
        "ooc": ooc if ooc is not None else {"skipped": "--no-ooc"},
        "code": code_record({**datasets, **({"ooc": ooc} if ooc else {})}),
        "wall_s": time.perf_counter() - t0,
    }
    benchkit.write_json(args.json, result)
    print_summary(result)
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
