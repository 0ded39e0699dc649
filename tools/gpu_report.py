"""The GPU device check's two Python steps (``tools/gpu_check.sh``, docs/gpu.md, issue 33).

``loader``: epoch 0 of a trainer run's training loader alone (no model, no device), rebuilt
from the settings the trainer recorded in its metrics (store, scheme, policy, partitions
resident, reuse, fanouts, batch size, seed, micro- and macro-batching), at the trainer's
loader thread count or the ones asked for; its wall time is the ``loader_only_s`` beside
the trainer's CUDA epoch::

    python3 tools/gpu_report.py loader --from-metrics WORK/train_megabatch.json --json OUT.json

``assemble``: ``$OUT/gpu.json`` from what the stages left in the work folder: the card's
name, torch, the CUDA suite's counts (its JUnit XML), every trainer run beside its loader
alone, ``tools/bench_loader.py``'s thread sweep when it ran, each stage's exit code and
time, and every error met::

    python3 tools/gpu_report.py assemble --work WORK --out OUT

The JSON (issue 33): ``{"device", "torch", "tests": {"passed", "failed", "skipped", ...},
"runs": [{"scheme", "device_type", "epoch_s", "loader_only_s", "samples_per_s", "test_acc",
"threads", ...}], ...}``. A trainer row's ``loader_only_s`` is this tool's ``loader`` epoch
at the trainer's thread count; bench_loader's rows (``"source": "bench_loader"``,
``device_type`` ``"cpu"``: no model) give its samples per second at 1, 4, 8 and 16 threads,
and ``loader_only_s`` the time they imply for the trainer's epoch. ``goals`` holds issue 33's
"a GPU epoch at most 1.3x the loader alone at the best thread count", per scheme.

Standard library only in ``assemble`` (it must write a record even where graphstore or
torch fail to import); ``loader`` imports graphstore.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

SCHEMES = ("minibatch", "megabatch", "disk", "microbatch", "macrobatch")
GOAL_EPOCH_OVER_LOADER = 1.3
"""Issue 33: a GPU epoch at most this many times the loader alone at its best thread count."""


# ------------------------------------------------------------------------- loader alone

# The trainer's recorded train-loader settings (`NodeLoaderSettings.to_dict()`) that are
# NodeLoader arguments, by their argument name. Not capacity and buffer_bytes both: the
# partitions the trainer's buffer held are what the loader alone gets.
SETTINGS_ARGS = {"split": "split", "fanouts": "fanouts", "batch_size": "batch_size", "scheme": "scheme",
                 "policy": "policy", "capacity": "capacity", "reuse": "reuse", "shuffle": "shuffle",
                 "seed": "seed", "prefetch": "prefetch", "static_cache_fraction": "static_cache",
                 "micro_batches": "micro_batches", "micro_strategy": "micro_strategy",
                 "macro_batches": "macro_batches", "macro_batch_bytes": "macro_batch_bytes",
                 "feature_cache_bytes": "feature_cache_bytes", "feature_cache": "feature_cache",
                 "cache_lookahead": "cache_lookahead", "balance_labels": "balance_labels"}


def loader_arguments(settings: dict) -> dict:
    """NodeLoader keyword arguments that rebuild the loader whose settings a trainer recorded."""
    kwargs = {arg: settings[key] for key, arg in SETTINGS_ARGS.items() if settings.get(key) is not None}
    if "fanouts" in kwargs:
        kwargs["fanouts"] = tuple(kwargs["fanouts"])
    return kwargs


def loader_epoch(store_path: str, settings: dict, threads: int) -> dict:
    """Wall time of epoch 0 of the training loader alone (the loader the trainer's settings
    describe, at ``threads`` loader threads), every batch drawn and dropped."""
    import graphstore
    from graphstore.loaders import NodeLoader

    kwargs = loader_arguments(settings)
    with graphstore.open(store_path) as store:
        t0 = time.perf_counter()
        loader = NodeLoader(store, loader_threads=threads, **kwargs)
        built = time.perf_counter() - t0
        batches = targets = 0
        t1 = time.perf_counter()
        for batch in loader.epoch(0):
            batches += 1
            targets += int(batch.dense.num_targets)
        seconds = time.perf_counter() - t1
    return {"scheme": kwargs.get("scheme"), "threads": threads, "epoch_s": seconds, "setup_s": built,
            "batches": batches, "targets": targets, "samples_per_s": targets / seconds if seconds > 0 else None,
            "arguments": {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}}


def cmd_loader(args) -> int:
    metrics = json.loads(Path(args.from_metrics).read_text())
    settings = metrics["config"]["loaders"]["train"]
    trained_at = (metrics["epochs"][0].get("loader") or {}).get("threads")
    counts = [int(t) for t in args.threads.split(",")] if args.threads else [trained_at]
    rows = []
    for threads in counts:
        row = loader_epoch(metrics["config"]["store"], settings, threads)
        print(f"loader alone: {row['scheme']} at {threads} threads: {row['epoch_s']:.2f} s, "
              f"{row['samples_per_s'] or 0:,.0f} samples/s ({row['batches']} batches)", flush=True)
        rows.append(row)
    Path(args.json).write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0


# ------------------------------------------------------------------------------ assemble


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def stages(work: Path) -> list[dict]:
    """``stages.tsv``: one line per stage, ``name rc seconds limit``, as gpu_check.sh writes it."""
    out = []
    try:
        lines = (work / "stages.tsv").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split("\t")
        if len(parts) >= 3:
            rc = int(parts[1]) if parts[1].lstrip("-").isdigit() else None
            out.append({"name": parts[0], "rc": rc, "seconds": float(parts[2]),
                        "limit_s": float(parts[3]) if len(parts) > 3 and parts[3] else None,
                        "timed_out": rc in (124, 137), "skipped": parts[1] == "skipped"})
    return out


def stage_output(log: str, name: str) -> str:
    """What stage ``name`` printed: the log between its start and end lines (gpu_check.sh's)."""
    start = log.rfind(f"] stage {name} (limit")
    if start < 0:
        return ""
    end = log.find(f"] stage {name}: exit", start)
    return log[start:end if end >= 0 else len(log)]


def last_error_line(text: str) -> str | None:
    """The last line of ``text`` that reads as an error (pytest's ``ERROR:``, a CLI's ``error:``,
    a traceback's last line)."""
    keys = ("ERROR", "Error", "error:", "Exception", "FAILED", "not found")
    return next((line.strip() for line in reversed(text.splitlines()) if any(k in line for k in keys)), None)


def from_log(output: str, counts: dict) -> None:
    """Counts from pytest's verbose lines (``path::test PASSED [ 5%]``), for a run cut short."""
    for line in output.splitlines():
        m = re.match(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", line)
        if m is None:
            continue
        counts["total"] += 1
        outcome = m.group(2)
        key = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "errors"}.get(outcome, "skipped")
        counts[key] += 1
        if key in ("failed", "errors"):
            counts["failed_tests"].append(m.group(1))


def test_counts(junit: Path, stage: dict | None, log: str) -> dict:
    """The CUDA suite's counts from pytest's JUnit XML; without one (pytest stopped before
    writing it: ``GS_REQUIRE_CUDA=1`` on a machine without a device, a crash, the stage's
    timeout) zeros, with the stage's exit code and the log's last error line as the reason."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "total": 0,
              "exit_code": None if stage is None else stage["rc"], "failed_tests": []}
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError) as exc:
        output = stage_output(log, "tests")
        from_log(output, counts)
        reason = last_error_line(output)
        counts["error"] = (f"no JUnit XML ({type(exc).__name__}; pytest stopped before writing it), the counts "
                           f"read off the log's per-test lines: " + (reason or "see gpu_check.log"))
        return counts
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    for suite in suites:
        for case in suite.iter("testcase"):
            counts["total"] += 1
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            if case.find("failure") is not None:
                counts["failed"] += 1
                counts["failed_tests"].append(name)
            elif case.find("error") is not None:
                counts["errors"] += 1
                counts["failed_tests"].append(name)
            elif case.find("skipped") is not None:
                counts["skipped"] += 1
            else:
                counts["passed"] += 1
    if counts["total"] == 0 and counts["exit_code"] != 0:  # pytest stopped before running a test
        counts["error"] = (f"pytest exit {counts['exit_code']}, no test ran: "
                           + (last_error_line(stage_output(log, "tests")) or "see gpu_check.log"))
    return counts


def device_facts(work: Path) -> dict:
    """The card (nvidia-smi's name, as the check recorded it) and torch, asked in a child so a
    broken torch still leaves a record."""
    facts = {"device": None, "torch": None, "cuda": None, "python": sys.version.split()[0]}
    smi = (work / "nvidia_smi.txt")
    if smi.is_file():
        names = [line.strip() for line in smi.read_text().splitlines() if line.strip()]
        facts["device"] = ", ".join(names) or None
    probe = ("import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
             "'available': torch.cuda.is_available(), 'name': torch.cuda.get_device_name(0) "
             "if torch.cuda.is_available() else None}))")
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
        got = json.loads(done.stdout.strip().splitlines()[-1])
        facts.update(torch=got["torch"], cuda=got["cuda"], cuda_available=got["available"])
        facts["device"] = facts["device"] or got["name"]
    except Exception as exc:  # noqa: BLE001 - the record is written whatever failed
        facts["torch_error"] = f"{type(exc).__name__}: {exc}"
    if facts["device"] is None:
        facts["device"] = "none: no CUDA device seen (nvidia-smi and torch)"
    return facts


def trainer_rows(work: Path, loader_alone: dict[str, dict], errors: list[str]) -> list[dict]:
    rows = []
    for scheme in SCHEMES:
        m = read_json(work / f"train_{scheme}.json")
        if m is None:
            errors.append(f"trainer {scheme}: no metrics (see the stage's exit code and gpu_check.log)")
            continue
        epoch = m["epochs"][0]
        targets = epoch.get("train_targets")
        threads = (epoch.get("loader") or {}).get("threads")
        alone = loader_alone.get(scheme)
        row = {"scheme": scheme, "device_type": m["config"].get("device", "cuda"), "source": "trainer",
               "epoch_s": epoch["time_s"], "loader_only_s": None if alone is None else alone["epoch_s"],
               "samples_per_s": targets / epoch["time_s"] if targets and epoch["time_s"] else None,
               "test_acc": m["final"]["test"]["acc"], "threads": threads, "train_targets": targets,
               "eval_time_s": epoch.get("eval_time_s"), "train_loss": epoch.get("train_loss"),
               "peak_memory_bytes": m.get("peak_memory_bytes"), "loader_stats": epoch.get("loader")}
        if alone is not None and alone["threads"] != threads:
            errors.append(f"loader alone for {scheme} ran at {alone['threads']} threads, the trainer at {threads}")
        if row["loader_only_s"]:
            row["epoch_over_loader"] = row["epoch_s"] / row["loader_only_s"]
        rows.append(row)
    return rows


def bench_loader_rows(work: Path, trainer: list[dict], errors: list[str]) -> list[dict]:
    """bench_loader's rows from every ``bench_loader*.json`` (one per system; its schema as of
    issue 32: ``runs`` of ``{"scheme", "threads", "samples_per_s", ...}``), read defensively:
    the tool is another issue's."""
    targets = {r["scheme"]: r["train_targets"] for r in trainer if r.get("train_targets")}
    found = []
    for path in sorted(work.glob("bench_loader*.json")):
        data = read_json(path)
        if data is None:
            errors.append(f"bench_loader: {path.name} does not parse")
            continue
        found += data.get("runs") or []
    rows = []
    for r in found:
        if not isinstance(r, dict) or r.get("scheme") not in SCHEMES:
            continue
        sps = r.get("samples_per_s")
        n = targets.get(r["scheme"])
        rows.append({"scheme": r["scheme"], "device_type": "cpu", "source": "bench_loader", "epoch_s": None,
                     "loader_only_s": n / sps if n and sps else None, "samples_per_s": sps, "test_acc": None,
                     "threads": r.get("threads"), "system": r.get("system"), "same_batches": r.get("same_batches"),
                     "bytes_read": r.get("bytes_read"), "error": r.get("error")})
    return rows


def reuse_comparison(work: Path, errors: list[str]) -> dict | None:
    """Megabatch's epoch at its default reuse beside HierBatching's ``--reuse 2`` (the
    check's ``train_megabatch_reuse2`` stage): what a second pass over each mega-batch costs
    on the card, the evidence for the default there (on the CPU it doubles the epoch)."""
    runs = {}
    for name in ("train_megabatch", "train_megabatch_reuse2"):
        m = read_json(work / f"{name}.json")
        if m is None:
            if name.endswith("reuse2"):
                errors.append("trainer megabatch --reuse 2: no metrics (see the stage's exit code and gpu_check.log)")
            return None
        epoch = m["epochs"][0]
        runs[name] = {"reuse": m["config"]["loaders"]["train"]["reuse"], "epoch_s": epoch["time_s"],
                      "train_targets": epoch.get("train_targets"), "train_loss": epoch.get("train_loss"),
                      "valid_acc": m["final"]["valid"]["acc"], "test_acc": m["final"]["test"]["acc"]}
    once, twice = runs["train_megabatch"], runs["train_megabatch_reuse2"]
    return {"default": once, "reuse_2": twice,
            "epoch_ratio": twice["epoch_s"] / once["epoch_s"] if once["epoch_s"] else None}


def goals(runs: list[dict]) -> dict:
    """Per scheme: the CUDA epoch over the loader alone at its best thread count (this tool's
    loader epoch, or bench_loader's rate over the trainer's targets), and whether it is at
    most 1.3."""
    out = {}
    for row in (r for r in runs if r["source"] == "trainer" and r["epoch_s"]):
        alone = [r["loader_only_s"] for r in runs if r["scheme"] == row["scheme"] and r["source"] != "trainer"
                 and r["loader_only_s"]] + ([row["loader_only_s"]] if row["loader_only_s"] else [])
        if not alone:
            out[row["scheme"]] = {"value": None, "goal": GOAL_EPOCH_OVER_LOADER, "met": None}
            continue
        value = row["epoch_s"] / min(alone)
        out[row["scheme"]] = {"value": value, "goal": GOAL_EPOCH_OVER_LOADER, "met": value <= GOAL_EPOCH_OVER_LOADER}
    return out


def cmd_assemble(args) -> int:
    work, out = Path(args.work), Path(args.out)
    errors: list[str] = []
    try:
        log = (out / "gpu_check.log").read_text(errors="replace")
    except OSError:
        log = ""
    stage_rows = stages(work)
    by_name = {s["name"]: s for s in stage_rows}
    for s in stage_rows:
        if s["skipped"]:
            errors.append(f"stage {s['name']}: skipped (no time left, or nothing to run it on; see gpu_check.log)")
        elif s["rc"] != 0:
            why = last_error_line(stage_output(log, s["name"]))
            errors.append(f"stage {s['name']}: exit {s['rc']}" + (" (timed out)" if s["timed_out"] else "")
                          + (f": {why}" if why else ""))
    loader_alone = {}
    for scheme in SCHEMES:
        data = read_json(work / f"loader_{scheme}.json")
        if data and data.get("rows"):
            loader_alone[scheme] = data["rows"][0]
    trainer = trainer_rows(work, loader_alone, errors)
    runs = trainer + bench_loader_rows(work, trainer, errors)
    record = {
        **device_facts(work),
        "tests": test_counts(out / "junit.xml", by_name.get("tests"), log),
        "runs": runs,
        "goals": {"epoch_over_best_loader": goals(runs)},
        "reuse": reuse_comparison(work, errors),
        "graph": read_json(work / "graph.json"),
        "stages": stage_rows,
        "errors": errors,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": os.uname().nodename,
        "cpu_count": os.cpu_count(),
    }
    (out / "gpu.json").write_text(json.dumps(record, indent=1) + "\n")
    t = record["tests"]
    print(f"gpu.json: device {record['device']!r}, torch {record['torch']}; tests passed {t['passed']}, "
          f"failed {t['failed']}, errors {t['errors']}, skipped {t['skipped']}"
          + (f" ({t['error']})" if t.get("error") else ""))
    for row in trainer:
        ratio = row.get("epoch_over_loader")
        print(f"  {row['scheme']:<10} epoch {row['epoch_s']:.2f} s, loader alone "
              f"{row['loader_only_s'] or float('nan'):.2f} s" + (f" ({ratio:.2f}x)" if ratio else "")
              + f", {row['samples_per_s'] or 0:,.0f} samples/s, test acc {row['test_acc']:.4f}, "
              f"{row['threads']} threads")
    reuse = record["reuse"]
    if reuse and reuse["epoch_ratio"]:
        print(f"  megabatch --reuse 2: epoch {reuse['reuse_2']['epoch_s']:.2f} s, {reuse['epoch_ratio']:.2f}x the "
              f"default reuse {reuse['default']['reuse']}'s; valid acc {reuse['reuse_2']['valid_acc']:.4f} "
              f"against {reuse['default']['valid_acc']:.4f}")
    for e in errors:
        print(f"  error: {e}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    lo = sub.add_parser("loader", help="one epoch of a trainer run's training loader alone",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    lo.add_argument("--from-metrics", required=True, metavar="M.json",
                    help="the trainer's metrics: its store and its train loader's recorded settings")
    lo.add_argument("--threads", default=None, help="loader thread counts, comma-separated (default: the trainer's)")
    lo.add_argument("--json", required=True)
    asm = sub.add_parser("assemble", help="write OUT/gpu.json from the work folder",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    asm.add_argument("--work", required=True, help="the check's work folder (stages.tsv, train_*.json, ...)")
    asm.add_argument("--out", required=True, help="where gpu.json goes (gpu_check.log and junit.xml are read there)")
    args = ap.parse_args(argv)
    return cmd_loader(args) if args.command == "loader" else cmd_assemble(args)


if __name__ == "__main__":
    sys.exit(main())
