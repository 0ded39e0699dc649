"""Tests of tools/bench_time_to_accuracy.py: time to target from hand-made metrics records
(reached, never reached, failed runs), the medians and ratios over seeds, the variants'
parsing, and one real ``--quick`` run in a subprocess whose JSON is read back against the
metrics files its own runs wrote (the command line and the JSON are the interface).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tools import bench_time_to_accuracy as tta

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "bench_time_to_accuracy.py"


def _record(accs, times, *, eval_s=0.5, targets=10, bytes_read=100, stopped_early=None, epochs=None,
            patience=30) -> dict:
    """A trainer metrics record: epoch i has validation accuracy ``accs[i]`` (None: not
    evaluated) and training time ``times[i]``."""
    return {"config": {"epochs": epochs or len(accs), "patience": patience},
            "epochs": [{"epoch": i, "time_s": t, "eval_time_s": eval_s, "train_targets": targets,
                        "io": {"bytes_read": bytes_read},
                        "valid": None if a is None else {"acc": a, "loss": 1.0 - a}}
                       for i, (a, t) in enumerate(zip(accs, times, strict=True))],
            "final": {"epoch": 0, "valid": {"acc": 0.0}, "test": {"acc": 0.75},
                      "selection": "best validation"},
            "stopped_early": stopped_early}


# ---------------------------------------------------------------------- time to target

def test_time_is_the_cumulative_training_time_to_the_first_epoch_at_target():
    m = _record([0.5, 0.7, None, 0.79, 0.81, 0.60], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    walls = {0: 10.0, 1: 13.0, 2: 16.5, 3: 21.0, 4: 27.0, 5: 33.0}
    r = tta.time_to_target(m, 0.79, epoch_wall_s=walls)
    assert r["reached"] and r["epoch"] == 3 and r["epochs_to_target"] == 4
    assert r["time_to_target_s"] == 1.0 + 2.0 + 3.0 + 4.0  # the unevaluated epoch's training counts too
    assert r["eval_time_to_target_s"] == 4 * 0.5  # reported apart, never added to the time
    assert r["samples_to_target"] == 40 and r["bytes_read_to_target"] == 400
    assert r["wall_to_target_s"] == 21.0  # the process's wall time at that epoch's line
    assert r["best_valid_acc"] == 0.81 and r["best_valid_epoch"] == 4 and r["epochs_run"] == 6
    assert r["why_not_reached"] is None
    # Without the printed lines' times the wall figure is unknown, not guessed.
    assert tta.time_to_target(m, 0.79)["wall_to_target_s"] is None


def test_a_target_one_point_under_a_best_is_reached_despite_float_rounding():
    assert 0.017 - 0.01 > 0.007  # why the target is rounded and compared with a tolerance
    assert tta.reference_target([0.017]) == 0.007
    r = tta.time_to_target(_record([0.0, 0.007], [1.0, 1.0]), 0.017 - 0.01)  # even unrounded
    assert r["reached"] and r["epoch"] == 1
    target = tta.reference_target([0.80])
    assert target == 0.79
    # The reference itself reaches its own target at or before its best epoch.
    assert tta.time_to_target(_record([0.5, 0.8, 0.7], [1.0, 1.0, 1.0]), target)["epoch"] == 1


def test_a_record_that_never_reaches_the_target_says_why():
    m = _record([0.5, 0.72, 0.70], [1.0, 1.0, 1.0], stopped_early=2, epochs=300, patience=1)
    r = tta.time_to_target(m, 0.79)
    assert not r["reached"]
    for key in ("epoch", "epochs_to_target", "time_to_target_s", "wall_to_target_s", "samples_to_target",
                "bytes_read_to_target", "eval_time_to_target_s"):
        assert r[key] is None, key
    assert r["best_valid_acc"] == 0.72 and r["best_valid_epoch"] == 1
    assert "0.7200" in r["why_not_reached"] and "0.7900" in r["why_not_reached"]
    assert "stopped early" in r["why_not_reached"]
    exhausted = tta.time_to_target(_record([0.5, 0.6], [1.0, 1.0]), 0.79)["why_not_reached"]
    assert "all 2 epochs" in exhausted
    unevaluated = tta.time_to_target(_record([None, None], [1.0, 1.0]), 0.79)
    assert "no epoch was evaluated" in unevaluated["why_not_reached"]
    assert "no epoch" in tta.time_to_target({"epochs": []}, 0.79)["why_not_reached"]
    assert "no target" in tta.time_to_target(_record([0.9], [1.0]), None)["why_not_reached"]


def test_macro_batching_fetches_count_as_bytes_read():
    m = _record([0.9], [1.0], bytes_read=0)
    m["epochs"][0]["macro_batching"] = {"bytes_read": 4096}
    assert tta.time_to_target(m, 0.8)["bytes_read_to_target"] == 4096


def test_best_valid_skips_unevaluated_epochs_and_keeps_the_first_best():
    assert tta.best_valid(_record([None, 0.6, 0.8, 0.8, None], [1.0] * 5)) == (0.8, 2)
    assert tta.best_valid(_record([None], [1.0])) == (None, None)


def test_a_failed_run_has_no_time_and_says_so():
    run = {"returncode": 1, "output_tail": "Traceback ...\nConfigError: the budget refuses\n"}
    row = tta.seed_record(3, run, None, 0.79)
    assert row["seed"] == 3 and not row["reached"] and row["time_to_target_s"] is None
    assert "exit 1" in row["why_not_reached"] and "budget refuses" in row["why_not_reached"]


def test_seed_record_reads_the_printed_epoch_times_and_the_selected_model():
    run = {"returncode": 0, "epoch_wall_s": {"0": 5.0, "1": 7.5}, "process_wall_s": 9.0}
    row = tta.seed_record(0, run, _record([0.5, 0.9], [1.0, 2.0]), 0.8)
    assert row["wall_to_target_s"] == 7.5 and row["time_to_target_s"] == 3.0
    assert row["test_acc_at_best_valid"] == 0.75 and row["selection"] == "best validation"
    assert row["time_per_sample_s"] == pytest.approx(3.0 / 20) and row["epoch_time_s_median"] == 1.5


# ---------------------------------------------------------------------- medians and ratios

def test_median_counts_a_seed_that_never_reached_as_slower_than_any():
    assert tta.median_or_none([3.0, 1.0, 2.0]) == 2.0
    assert tta.median_or_none([3.0, None, 1.0]) == 3.0  # None sorts last: the median moves up
    assert tta.median_or_none([3.0, None, None]) is None  # most seeds never reached it
    assert tta.median_or_none([1.0, None]) is None  # half: the median is not finite
    assert tta.median_or_none([]) is None


def _row(seed, t, *, samples=100, epoch=1.0, per_sample=0.01, acc=0.8):
    reached = t is not None
    return {"seed": seed, "reached": reached, "time_to_target_s": t,
            "wall_to_target_s": t + 10 if reached else None,
            "epochs_to_target": 3 if reached else None, "samples_to_target": samples if reached else None,
            "bytes_read_to_target": None, "eval_time_to_target_s": None, "best_valid_acc": 0.8,
            "test_acc_at_best_valid": acc, "epoch_time_s_median": epoch, "time_per_sample_s": per_sample}


def test_scheme_medians_and_ratios_to_the_reference():
    schemes = {
        "minibatch": tta.summarize_scheme([_row(0, 2.0, acc=0.80), _row(1, 4.0, acc=0.82),
                                           _row(2, 3.0, acc=0.81)]),
        "megabatch": tta.summarize_scheme([_row(0, 9.0, samples=300, epoch=2.5, per_sample=0.02),
                                           _row(1, None, epoch=2.5), _row(2, 6.0, samples=200, epoch=3.0)]),
        "disk": tta.summarize_scheme([_row(0, None), _row(1, None), _row(2, 5.0)]),
    }
    tta.add_ratios(schemes)
    mini, mega, disk = schemes["minibatch"], schemes["megabatch"], schemes["disk"]
    assert mini["median_time_to_target_s"] == 3.0 and mini["ratio_to_minibatch"] == 1.0
    assert mini["test_acc_at_best_valid"] == 0.81
    assert mini["test_acc_at_best_valid_per_seed"] == [0.80, 0.82, 0.81]
    assert mega["seeds_reached"] == "2/3"
    assert mega["median_time_to_target_s"] == 9.0  # 6, 9, never
    assert mega["ratio_to_minibatch"] == 3.0
    assert mega["wall_ratio_to_minibatch"] == pytest.approx(19.0 / 13.0)
    assert mega["samples_to_target_ratio_to_minibatch"] == 3.0
    assert mega["per_epoch_ratio_to_minibatch"] == 2.5
    assert mega["per_sample_ratio_to_minibatch"] == pytest.approx(1.0)  # median of 0.02, 0.01, 0.01
    assert disk["seeds_reached"] == "1/3" and disk["median_time_to_target_s"] is None
    assert disk["ratio_to_minibatch"] is None and disk["per_epoch_ratio_to_minibatch"] == 1.0
    assert tta.ratio(1.0, None) is None and tta.ratio(1.0, 0.0) is None


def test_analyse_takes_the_target_from_the_reference_seeds():
    runs = {"minibatch": {s: ({"returncode": 0}, _record([0.5, best], [1.0, 1.0]))
                          for s, best in ((0, 0.80), (1, 0.84), (2, 0.82))},
            "disk": {0: ({"returncode": 0}, _record([0.5, 0.7, 0.815], [2.0, 2.0, 2.0]))}}
    part = tta.analyse(runs, {"disk": {"scheme": "disk", "flags": ["--buffer-partitions", "8"]}}, 0.01)
    assert part["target_valid_acc"] == 0.81  # median 0.82 - 0.01
    assert part["reference"]["best_valid_acc_per_seed"] == {"0": 0.80, "1": 0.84, "2": 0.82}
    disk = part["schemes"]["disk"]
    assert disk["flags"] == ["--buffer-partitions", "8"] and disk["median_time_to_target_s"] == 6.0
    # Seed 0's best is under the target of the seeds' median: the reference need not reach it every time.
    assert part["schemes"]["minibatch"]["seeds_reached"] == "2/3"
    assert disk["ratio_to_minibatch"] == 3.0


def test_the_code_digest_follows_the_trainers_and_the_package(tmp_path):
    (tmp_path / "trainers").mkdir()
    (tmp_path / "graphstore" / "nn").mkdir(parents=True)
    (tmp_path / "trainers" / "node_classification.py").write_text("patience = 20\n")
    (tmp_path / "graphstore" / "nn" / "layers.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("docs\n")
    first = tta.code_digest(tmp_path)
    (tmp_path / "README.md").write_text("other docs\n")
    assert tta.code_digest(tmp_path) == first  # not code a run executes
    (tmp_path / "graphstore" / "nn" / "layers.py").write_text("x = 2\n")
    second = tta.code_digest(tmp_path)
    assert second != first
    (tmp_path / "trainers" / "node_classification.py").write_text("patience = 30\n")
    assert tta.code_digest(tmp_path) not in (first, second)


def test_variants_are_keyed_by_their_flags():
    texts = ["megabatch:--balance-labels on;megabatch:--reuse 1", "disk:--policy sequential"]
    assert tta.parse_variants(texts) == [
        ("megabatch[--balance-labels on]", "megabatch", ["--balance-labels", "on"]),
        ("megabatch[--reuse 1]", "megabatch", ["--reuse", "1"]),
        ("disk[--policy sequential]", "disk", ["--policy", "sequential"])]
    for bad in ("megabatch", "nosuch:--x", "disk:"):
        with pytest.raises(ValueError, match="SCHEME:FLAGS"):
            tta.parse_variants([bad])


def test_unknown_datasets_and_schemes_are_usage_errors(tmp_path):
    for flags, message in ((["--datasets", "pubmed"], "unknown datasets"),
                           (["--schemes", "betty"], "unknown schemes"),
                           (["--variants", "x:--y"], "SCHEME:FLAGS")):
        r = subprocess.run([sys.executable, str(TOOL), "--json", str(tmp_path / "x.json"), *flags],
                           capture_output=True, text=True, cwd=REPO)
        assert r.returncode == 2 and message in r.stderr
    assert not (tmp_path / "x.json").exists()


# ---------------------------------------------------------------------- one real --quick run

@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    if not (REPO.parent / "shared" / "data" / "cora_planetoid").is_dir():
        pytest.skip("../shared/data not present")
    work = tmp_path_factory.mktemp("tta")
    out = work / "tta.json"
    proc = subprocess.run([sys.executable, str(TOOL), "--quick", "--work", str(work), "--json", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def _check_part(part: dict, schemes: set[str], *, epochs: int, patience: int) -> None:
    """Every figure of a dataset's (or the out-of-core graph's) entry against the metrics
    files its runs wrote."""
    ref_metrics = json.loads(Path(part["schemes"]["minibatch"]["per_seed"][0]["metrics"]).read_text())
    ref_best = max(e["valid"]["acc"] for e in ref_metrics["epochs"] if e["valid"] is not None)
    assert part["reference"]["best_valid_acc_median"] == ref_best
    assert part["target_valid_acc"] == pytest.approx(ref_best - 0.01, abs=1e-12)
    target = part["target_valid_acc"]
    assert schemes <= set(part["schemes"])
    ref_time = part["schemes"]["minibatch"]["median_time_to_target_s"]
    assert ref_time is not None and ref_time > 0  # the reference reaches a point under its own best
    for key, scheme in part["schemes"].items():
        if "per_seed" not in scheme:
            assert scheme.get("skipped"), key
            continue
        (row,) = scheme["per_seed"]
        m = json.loads(Path(row["metrics"]).read_text())
        assert m["config"]["epochs"] == epochs and m["config"]["patience"] == patience, key
        assert len(m["epochs"]) <= epochs
        assert row["test_acc_at_best_valid"] == m["final"]["test"]["acc"], key
        assert row["selection"] == m["final"]["selection"]
        if not row["reached"]:
            assert row["time_to_target_s"] is None and scheme["median_time_to_target_s"] is None
            assert row["best_valid_acc"] < target and row["why_not_reached"], key
            continue
        k = next(i for i, e in enumerate(m["epochs"]) if e["epoch"] == row["epoch"])
        upto = m["epochs"][: k + 1]
        assert all(e["valid"] is not None for e in upto)  # --eval-every 1
        assert upto[-1]["valid"]["acc"] >= target - 1e-9, key
        assert all(e["valid"]["acc"] < target for e in upto[:-1]), key  # the first epoch at target
        assert row["time_to_target_s"] > 0
        assert row["time_to_target_s"] == pytest.approx(sum(e["time_s"] for e in upto), rel=1e-12), key
        assert row["eval_time_to_target_s"] == pytest.approx(sum(e["eval_time_s"] for e in upto), rel=1e-12)
        assert row["samples_to_target"] == sum(e["train_targets"] for e in upto)
        assert row["epochs_to_target"] == k + 1
        # The wall time from launch holds the start-up and the evaluations: more than training.
        assert row["time_to_target_s"] + row["eval_time_to_target_s"] < row["wall_to_target_s"]
        assert row["wall_to_target_s"] <= row["process_wall_s"]
        assert scheme["median_time_to_target_s"] == row["time_to_target_s"]
        assert scheme["ratio_to_minibatch"] == pytest.approx(row["time_to_target_s"] / ref_time)
        assert scheme["per_epoch_ratio_to_minibatch"] > 0 and scheme["per_sample_ratio_to_minibatch"] > 0
        assert not math.isnan(scheme["test_acc_at_best_valid"])
    assert part["schemes"]["minibatch"]["ratio_to_minibatch"] == 1.0


@pytest.mark.slow
def test_quick_run_times_are_the_epochs_sums_of_its_own_metrics(quick_run):
    result, stdout = quick_run
    assert result["quick"] and "--quick" in result["command"]
    assert {"cpu", "cores", "python", "torch"} <= set(result["machine"])
    assert "validation" in result["selection"] and "evaluation" in result["selection"]
    assert list(result["datasets"]) == ["cora"]
    cora = result["datasets"]["cora"]
    assert cora["seeds"] == [0] and cora["partitions"] == 32
    _check_part(cora, {"minibatch", "megabatch", "disk", "macrobatch"}, epochs=20, patience=5)
    assert cora["schemes"]["megabatch"]["flags"] == ["--buffer-partitions", "8"]
    mega = json.loads(Path(cora["schemes"]["megabatch"]["per_seed"][0]["metrics"]).read_text())
    assert mega["config"]["loaders"]["train"]["capacity"] == 8  # forced out of core: 8 of 32 partitions
    assert "target valid acc" in stdout and "megabatch" in stdout
    code = result["code"]
    assert code["commit"] and len(code["digest_now"]) == 16
    digests = {row["code_digest"] for s in cora["schemes"].values() for row in s["per_seed"]}
    assert code["run_digests"]["cora"] == sorted(digests) and code["mixed"]["cora"] == (len(digests) > 1)


@pytest.mark.filterwarnings("ignore:Dataloader CPU affinity opt is not enabled")  # DGL's advice, not ours
@pytest.mark.parametrize("workers", [0, 2])
def test_dgls_layerwise_evaluation_equals_its_loader_over_every_neighbour(workers):
    """DGL's side of the comparison evaluates as its examples do, a layer at a time over
    full-neighbour blocks; its logits are those of DGL's own sampling loader at fanouts of
    -1 (every neighbour), so the baseline's validation is exact, as the reference's. With
    worker processes too, whose batches come back out of order."""
    dgl = pytest.importorskip("dgl", reason="DGL is an optional baseline (not installed)")
    import numpy as np
    import torch

    from tools import bench_outofcore as bo

    rng = np.random.default_rng(0)
    n, d = 300, 8
    g = dgl.graph((torch.from_numpy(rng.integers(0, n, 3000)), torch.from_numpy(rng.integers(0, n, 3000))),
                  num_nodes=n)
    feats = rng.standard_normal((n, d)).astype(np.float32)
    labels = torch.from_numpy(rng.integers(0, 3, n))
    torch.manual_seed(0)
    model = bo.dgl_sage({"feature_dim": d, "hidden": 16, "num_classes": 3, "fanouts": [5, 5], "dropout": 0.5})
    nodes = np.sort(rng.choice(n, 50, replace=False))
    got = tta.dgl_layerwise_logits(model, g, feats, labels, nodes, prepare=lambda x: x, workers=workers,
                                   batch_size=64)
    sampler = bo.GatheringSampler(dgl.dataloading.NeighborSampler([-1, -1]), feats, labels)
    [(_, out, blocks, x, y)] = list(dgl.dataloading.DataLoader(g, torch.from_numpy(nodes), sampler,
                                                                batch_size=len(nodes), shuffle=False))
    assert torch.equal(out, torch.from_numpy(nodes)) and torch.equal(y, labels[out])
    with torch.no_grad():
        want = model.eval()(blocks, x)
    assert got.shape == (len(nodes), 3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_quick_run_out_of_core_part_checks_the_valid_split(quick_run):
    result, _ = quick_run
    ooc = result["ooc"]
    assert "valid" in ooc["store"]["split_names"] and ooc["store"]["kind"] == "tiny"
    assert ooc["settings"]["not_out_of_core"] and not ooc["settings"]["page_cache_dropped"]
    _check_part(ooc, {"minibatch", "megabatch", "disk", tta.DGL}, epochs=5, patience=3)
    assert ooc["schemes"]["minibatch"]["capped"] is False and ooc["schemes"]["megabatch"]["capped"] is (
        ooc["settings"]["cap_enforced"])
    dgl = ooc["schemes"][tta.DGL]
    if "per_seed" in dgl:  # DGL is an optional extra: without it the row says why
        spec = json.loads(Path(dgl["per_seed"][0]["metrics"]).read_text())["config"]
        ref = json.loads(Path(ooc["schemes"]["minibatch"]["per_seed"][0]["metrics"]).read_text())["config"]
        for k in ("fanouts", "eval_fanouts", "batch_size", "hidden", "dropout", "lr", "weight_decay",
                  "normalize_features"):
            assert spec[k] == ref[k], k
        assert spec["dgl_eval"] == "layerwise" and spec["eval_scheme"] == "dgl layerwise"
