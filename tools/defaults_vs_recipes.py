"""The trainers' defaults (``--store`` alone) against the tuned recipes, per dataset and seed.

    python tools/defaults_vs_recipes.py [--work /work/defaults] [--data ../shared/data]
        [--datasets cora,citeseer,amazon_photo] [--seeds 0,1,2] [--variants defaults,recipe,...]
        [--quick] --json docs/benchmarks/defaults.json

Every store is converted by ``graphstore convert`` with its defaults (what a new user gets).
Each variant runs ``trainers/node_classification.py`` as a subprocess with
``OMP_NUM_THREADS=1``: ``defaults`` with ``--store`` alone; ``recipe`` with the dataset's tuned
recipe (``trainers/configs/cora_sage.toml``, Amazon Photo with the setting chosen on
validation in ``tools/run_accuracy.py``); further variants change one default at a time, to
choose the defaults on validation. Every figure is the restored best-validation model's
(the trainer's selection rule); the choice between variants reads ``valid`` only, ``test`` is
reported beside it. Results: per run, and per dataset and variant the mean over seeds of
valid and test accuracy, epochs trained and wall seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

DATASETS = {
    "cora": "cora_planetoid/raw",
    "citeseer": "citeseer_planetoid/raw",
    "amazon_photo": "amazon_photo/amazon-photo.zip",
}
RECIPES = {
    "cora": ["--config", "trainers/configs/cora_sage.toml"],
    "citeseer": ["--config", "trainers/configs/cora_sage.toml"],
    # tools/run_accuracy.py's NC_DATASET_FLAGS: chosen on validation (docs/benchmarks.md).
    "amazon_photo": ["--config", "trainers/configs/cora_sage.toml", "--lr", "0.02", "--weight-decay", "5e-5",
                     "--hidden", "128", "--epochs", "200"],
}
VARIANTS = {
    # name: flags over --store (None: the dataset's recipe)
    "defaults": [],
    "recipe": None,
    # One default changed at a time (the candidates the defaults were chosen among).
    # The batch floor: 64 (the default on these splits) against 32 and 128.
    "batch32": ["--batch-size", "32"],
    "batch128": ["--batch-size", "128"],
    "no_normalization": ["--normalize-features", "none"],
    "lr0.005": ["--lr", "0.005"],
    "lr0.02": ["--lr", "0.02"],
    "patience50": ["--patience", "50"],
}


def convert(data: Path, work: Path, name: str) -> Path:
    out = work / "stores" / f"{name}.gs"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([PY, "-m", "graphstore", "convert", str(data / DATASETS[name]), str(out)], check=True,
                       cwd=ROOT, stdout=subprocess.DEVNULL)
    return out


def run_one(store: Path, flags: list[str], out: Path) -> dict:
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        started = time.perf_counter()
        with open(out.with_suffix(".log"), "w") as log:
            subprocess.run([PY, "trainers/node_classification.py", "--store", str(store), *flags,
                            "--metrics-out", str(out)], check=True, cwd=ROOT, env=env, stdout=log,
                           stderr=subprocess.STDOUT)
        m = json.loads(out.read_text())
        m["process_wall_s"] = time.perf_counter() - started
        out.write_text(json.dumps(m))
    m = json.loads(out.read_text())
    return {"valid": m["final"]["valid"]["acc"], "test": m["final"]["test"]["acc"], "epochs": len(m["epochs"]),
            "best_epoch": m["final"]["epoch"], "wall_s": m.get("process_wall_s", m["wall_time_s"]),
            "selection": m["final"].get("selection"),
            "batch_size": m["config"]["batch_size"], "normalize_features": m["config"]["normalize_features"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/work/defaults"))
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--variants", default="defaults,recipe")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--quick", action="store_true", help="seed 0, defaults only, 5 epochs")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    variants = ["defaults"] if args.quick else args.variants.split(",")
    results: dict = {"selection": "the restored best-validation model (valid accuracy, the trainer's rule); "
                                  "variants compared on valid only", "runs": {}, "summary": {}}
    for name in args.datasets.split(","):
        store = convert(args.data, args.work, name)
        for variant in variants:
            flags = RECIPES[name] if VARIANTS[variant] is None else list(VARIANTS[variant])
            if args.quick:
                flags = [*flags, "--epochs", "5"]
            runs = []
            for seed in seeds:
                out = args.work / ("quick" if args.quick else "runs") / name / variant / f"seed{seed}.json"
                r = run_one(store, [*flags, "--seed", str(seed)], out)
                runs.append(r)
                print(f"{name} {variant} seed {seed}: valid {r['valid']:.4f} test {r['test']:.4f} "
                      f"epochs {r['epochs']} {r['wall_s']:.1f} s", flush=True)
            results["runs"][f"{name}/{variant}"] = runs
            results["summary"][f"{name}/{variant}"] = {
                key: statistics.fmean(r[key] for r in runs) for key in ("valid", "test", "epochs", "wall_s")}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
