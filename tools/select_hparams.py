"""Choose a dataset's node-classification hyper-parameters on its validation split only.

Runs ``trainers/node_classification.py`` (through `tools/run_accuracy.py`'s stores, base
config and job runner) for every point of a grid, on the reference scheme and a few seeds,
and picks the point with the highest mean validation accuracy at the best-validation epoch.
Test accuracy is in each run's metrics file, but this tool never reads it: the choice cannot
depend on it. The chosen flags are what `run_accuracy.NC_DATASET_FLAGS` should hold.

Usage::

    .venv/bin/python tools/select_hparams.py --work /work/accuracy2 --dataset amazon_photo \\
        --json docs/benchmarks/hparams_amazon_photo.json

Output ``{"dataset", "variant", "seeds", "rule", "grid": [{"flags", "valid_best_mean",
"valid_best", "valid_final_mean", "best_epochs"}], "chosen": {"flags", ...}}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

try:  # the sibling tool: stores, base config, job runner
    from tools import benchkit
    from tools import run_accuracy as ra
except ImportError:  # run as a script: tools/ is on sys.path
    import benchkit
    import run_accuracy as ra

# Around the values earlier probes tried (git history of docs/benchmarks.md, "How Photo's
# setting was found"): the learning rate row-normalised inputs need, light or usual weight
# decay, and the two hidden widths of the Planetoid and Photo settings. 200 epochs.
GRID = {"--lr": ["0.005", "0.01", "0.02"], "--weight-decay": ["5e-5", "5e-4"], "--hidden": ["64", "128"]}
EPOCHS = "200"


def grid_points(grid: dict[str, list[str]]) -> list[list[str]]:
    names = list(grid)
    return [[f for name, value in zip(names, values) for f in (name, value)]
            for values in itertools.product(*(grid[name] for name in names))]


def choose(rows: list[dict]) -> dict:
    """The grid row with the highest mean best-validation accuracy. Ties are common on 240
    validation nodes (one node is 0.4 point): the last epoch's mean validation accuracy
    breaks them, then the earlier point of the grid."""
    return max(rows, key=lambda r: (r["valid_best_mean"], r["valid_final_mean"]))


def validation_figures(path: Path) -> dict:
    """The validation accuracies of one finished run (its test figures are not read)."""
    m = json.loads(path.read_text())
    return {"valid_best": m["best"]["valid"]["acc"], "valid_final": m["final"]["valid"]["acc"],
            "best_epoch": m["best"]["epoch"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="run_accuracy's work directory (stores are made there)")
    ap.add_argument("--data", type=Path, default=ra.ROOT.parent / "shared" / "data", help="the shared datasets")
    ap.add_argument("--dataset", default="amazon_photo")
    ap.add_argument("--variant", default="minibatch", help="the scheme the choice is made on (the reference)")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--rerun", action="store_true")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in ra.parse_list(args.seeds)]
    ra.convert(args.dataset, args.data, args.work)
    runner = argparse.Namespace(work=args.work / "select" / args.dataset, quick=False, rerun=args.rerun)
    (runner.work / "stores").mkdir(parents=True, exist_ok=True)
    link = runner.work / "stores" / f"{args.dataset}.gs"
    if not link.exists():
        link.symlink_to(ra.stores_dir(args.work) / f"{args.dataset}.gs")
    rows = []
    for point in grid_points(GRID):
        tag = "_".join(f"{name.strip('-')}{value}" for name, value in zip(point[::2], point[1::2]))
        figures = []
        for seed in seeds:
            flags = (ra.NC_BASE + ra.NC_VARIANTS[args.variant][0] + point + ["--epochs", EPOCHS, "--seed", str(seed)])
            job = dict(dataset=args.dataset, variant=f"{args.variant}_{tag}", seed=seed,
                       script="trainers/node_classification.py", flags=flags, copy_store=False)
            t0 = time.perf_counter()
            _, ok, _ = ra.run_job(job, runner)
            out = runner.work / "runs" / args.dataset / job["variant"] / f"seed{seed}.json"
            if not ok:
                raise SystemExit(f"{out.with_suffix('.log')}: the run failed")
            figures.append(validation_figures(out))
            print(f"{tag} seed {seed}: valid best {figures[-1]['valid_best']:.4f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
        rows.append({"flags": point, "valid_best": [f["valid_best"] for f in figures],
                     "valid_best_mean": statistics.fmean(f["valid_best"] for f in figures),
                     "valid_final_mean": statistics.fmean(f["valid_final"] for f in figures),
                     "best_epochs": [f["best_epoch"] for f in figures]})
    chosen = choose(rows)
    result = {"dataset": args.dataset, "variant": args.variant, "seeds": seeds, "epochs": int(EPOCHS),
              "base": ra.NC_BASE, "grid_axes": GRID,
              "rule": "highest mean validation accuracy at the best-validation epoch over the seeds, ties "
                      "broken by the mean validation accuracy at the last epoch; test accuracy not read",
              "grid": rows, "chosen": chosen}
    benchkit.write_json(args.json, result)
    print("chosen:", " ".join(chosen["flags"]), f"valid {chosen['valid_best_mean']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
