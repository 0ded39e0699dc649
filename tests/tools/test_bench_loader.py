"""tools/bench_loader.py: its sink, its comparisons and goals, and the whole --quick run,
through bench_outofcore's cached quick store at a size a test builds in seconds.

The run keeps the page cache (``--no-drop-caches``: a test must not flush a shared
machine's); as root with a cgroup v1 memory controller the out-of-core children run under
the cap, and without one the JSON must say they did not (checked, not skipped). DGL is
made absent on purpose in the main run (its row must carry the reason, not crash the run);
its real path runs in a second test where a DGL interpreter exists.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tools import bench_loader as bl
from tools import bench_outofcore as bo

REPO = Path(__file__).resolve().parents[2]
SMALL = {"num_nodes": 20000, "avg_degree": 6, "feature_dim": 32, "num_classes": 4, "communities": 16,
         "locality": 0.75, "homophily": 0.2, "num_partitions": 8, "seed": 0}
"""bench_outofcore's QUICK_STORE, small: 2.5 MB of features in 8 partitions."""
CAP_MIB, PROCESS_MIB = 1024, 1022  # a 2 MiB buffer budget: the 2.5 MB of features take several states


# ---------------------------------------------------------------------- the sink

def _parts(ids, features, labels):
    return bl.BatchParts(hashed=[torch.tensor(ids), torch.tensor(labels)], features=features, touched=[],
                         samples=len(labels))


def test_the_sink_tells_equal_batches_from_moved_or_changed_rows():
    x = torch.arange(12.0).reshape(4, 3)
    sinks = [bl.Sink() for _ in range(4)]
    sinks[0](_parts([5, 6, 7, 8], x, [1, 0]))
    sinks[1](_parts([5, 6, 7, 8], x.clone(), [1, 0]))
    sinks[2](_parts([5, 6, 7, 8], x[[1, 0, 2, 3]], [1, 0]))  # two rows swapped: the same ids, wrong gather
    changed = x.clone()
    changed[3, 1] += 1.0
    sinks[3](_parts([5, 6, 7, 8], changed, [1, 0]))
    digests = [s.digests[0] for s in sinks]
    assert digests[0] == digests[1] and len(set(digests)) == 3
    assert sinks[0].samples == 2 and sinks[0].gathered_bytes == x.numel() * 4
    assert sinks[0].checksum == pytest.approx(float(x.sum()) + 26 + 1)


def test_same_batches_compares_with_one_thread_and_names_the_first_difference():
    runs = [{"system": bl.MEMORY, "threads": t, "batch_digests": d, "sequence_digest": str(t)}
            for t, d in ((2, ["a", "b", "c"]), (1, ["a", "b", "c"]), (4, ["a", "x", "c"]), (8, ["a", "b"]))]
    bl.mark_same_batches(runs)
    assert [r["same_batches"] for r in runs] == [True, True, False, False]
    assert runs[2]["first_different_batch"] == 1 and runs[3]["first_different_batch"] == 2
    assert runs[0]["same_batches_reference"]["threads"] == 1


# ---------------------------------------------------------------------- goals

def _row(system, threads, sps, disk_limit=None):
    return {"system": system, "threads": threads, "samples_per_s": sps,
            "disk_limit_samples_per_s": disk_limit}


def test_goals_compare_rows_at_the_same_thread_count():
    runs = [_row(bl.MEMORY, 1, 1000.0), _row(bl.MEMORY, 2, 1700.0),
            _row(bl.MEGABATCH, 1, 900.0, disk_limit=5000.0), _row(bl.MEGABATCH, 2, 1000.0, disk_limit=1200.0),
            _row(bl.DISK, 1, 700.0, disk_limit=800.0), _row(bl.DGL, 0, 50.0), _row(bl.DGL, 4, 95.0),
            {"system": bl.MACROBATCH, "threads": 1, "samples_per_s": None, "error": "killed"}]
    goals = bl.compute_goals(runs)
    assert all({"value", "goal", "met"} <= g.keys() for g in goals.values())
    two = goals["memory_2_threads_vs_1"]
    assert two["value"] == pytest.approx(1.7) and two["met"]
    mega = goals["graphstore-megabatch_vs_limit"]
    # 1 thread: 900 / min(1000, 5000); 2 threads: 1000 / min(1700, 1200), the worse one.
    assert mega["by_threads"] == {1: pytest.approx(0.9), 2: pytest.approx(1000 / 1200)} and mega["met"]
    assert goals["graphstore-disk_vs_limit"]["value"] == pytest.approx(700 / 800) and \
        goals["graphstore-disk_vs_limit"]["met"]
    macro = goals["graphstore-macrobatch_vs_limit"]
    assert macro["value"] is None and macro["met"] is None and "killed" in macro["why_no_value"]
    vs_dgl = goals["best_out_of_core_vs_dgl"]
    assert vs_dgl["value"] == pytest.approx(1000 / 95) and vs_dgl["met"]
    assert vs_dgl["dgl_best_num_workers"] == 4 and vs_dgl["best"] == {"system": bl.MEGABATCH, "threads": 2}
    assert goals["memory_scaling"]["by_threads"] == {1: 1.0, 2: pytest.approx(0.85)}


def test_limits_use_the_plans_bytes_at_the_disks_speed():
    runs = [{"system": bl.MEGABATCH, "samples_per_s": 10.0, "samples": 1000, "planned_bytes": 4 << 30,
             "bytes_read": 5 << 30},
            {"system": bl.MEMORY, "samples_per_s": 10.0, "samples": 1000, "planned_bytes": 0, "bytes_read": 0,
             "gathered_bytes_per_s": 2e9, "numpy_gather_bytes_per_s": 4e9}]
    bl.add_limits(runs, disk_bytes_per_s=float(1 << 30))
    assert runs[0]["disk_limit_samples_per_s"] == pytest.approx(250.0)  # 4 s of reads for 1000 samples
    assert runs[1]["disk_limit_samples_per_s"] is None and runs[1]["gather_vs_numpy_gather"] == 0.5
    assert "rows_limit_samples_per_s" not in runs[0]
    # Macro-batching: also the rows its rounds needed, at the same speed.
    macro = {"system": bl.MACROBATCH, "samples_per_s": 10.0, "samples": 1000, "planned_bytes": 8 << 30,
             "rows_union": 1 << 20, "row_bytes": 512}
    bl.add_limits([macro], disk_bytes_per_s=float(1 << 30))
    assert macro["disk_limit_samples_per_s"] == pytest.approx(125.0)
    assert macro["rows_limit_bytes"] == 512 << 20 and macro["rows_limit_samples_per_s"] == pytest.approx(2000.0)


# ---------------------------------------------------------------------- the whole run

@pytest.fixture(scope="module")
def quick_cache(tmp_path_factory):
    """The quick store's cache directory, shared by the runs (the first builds the store)."""
    return tmp_path_factory.mktemp("loader_quick")


def _run(tmp_path, cache, *extra) -> dict:
    out = tmp_path / "bench_loader.json"
    argv = ["--quick", "--json", str(out), "--cache-dir", str(cache), "--workdir", str(tmp_path / "work"),
            "--cap-mib", str(CAP_MIB), "--process-mib", str(PROCESS_MIB), "--targets", "3000",
            "--batch-size", "500", "--dd-mib", "16", "--gather-seconds", "0.1", "--no-drop-caches", *extra]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bo, "QUICK_STORE", SMALL)
        assert bl.main(argv) == 0
    return json.loads(out.read_text())


def test_quick_run_measures_every_system_and_the_same_batches_at_every_thread_count(quick_cache, tmp_path):
    result = _run(tmp_path, quick_cache, "--dgl-python", str(tmp_path / "no-dgl" / "python"))
    assert {"runs", "goals", "limits", "machine", "goals_conditions", "store"} <= result.keys()
    assert result["store"]["path"] == str(quick_cache / "quick_metis.gs")
    assert result["quick_store"]["params"]["num_nodes"] == SMALL["num_nodes"]
    runs = result["runs"]
    assert all(set(bl.ROW_KEYS) <= r.keys() for r in runs)
    assert {(r["system"], r["threads"]) for r in runs if r["system"] != bl.DGL} == \
        {(s, t) for s in (bl.MEMORY, *bl.OUT_OF_CORE) for t in (1, 2)}
    capped = os.geteuid() == 0 and bo.benchkit.CGROUP_ROOT.is_dir()
    for r in (r for r in runs if r["system"] != bl.DGL):
        where = f"{r['system']}@{r['threads']}: {r.get('error') or r.get('refused')}"
        assert r["samples_per_s"] and r["samples_per_s"] > 0, where
        assert r["same_batches"] is True, where
        assert r["samples"] == r["settings"]["targets"] == 3000, where  # every target once
        assert r["settings"]["loader_threads"] == r["threads"], where
        assert r["settings"]["scheme"] == r["scheme"], where
        assert r["peak_rss_bytes"] > 0 and r["gathered_bytes_per_s"] > 0, where
        if r["system"] == bl.MEMORY:
            # The whole store was read in the warm-up; the timed epoch reads nothing.
            assert r["bytes_read"] == 0 and r["disk_limit_samples_per_s"] is None, where
            assert r["mem_cap_bytes"] is None and r["numpy_gather_bytes_per_s"] > 0, where
        else:
            assert r["bytes_read"] > 0 and r["disk_limit_samples_per_s"] > 0, where
            assert r["mem_cap_bytes"] == (CAP_MIB << 20 if capped else None), where
            assert r["settings"]["cap_enforced"] is capped, where
    # Macro-batching samples the whole graph's structure, as the memory loader: the same batches.
    digest = {(r["system"], r["threads"]): r["sequence_digest"] for r in runs if r["system"] != bl.DGL}
    assert digest[bl.MACROBATCH, 1] == digest[bl.MEMORY, 1] != digest[bl.MEGABATCH, 1]
    for r in (r for r in runs if r["system"] == bl.MACROBATCH):
        # By default a round holds a third of the buffer budget megabatch and disk get.
        assert r["settings"]["macro_batch_bytes"] == ((CAP_MIB - PROCESS_MIB) << 20) // 3
        assert 0 < r["rows_union"] * r["row_bytes"] <= r["bytes_read"]  # blocks hold more than the rows
        assert r["rows_limit_samples_per_s"] >= r["disk_limit_samples_per_s"]
    mega = [r for r in runs if r["system"] == bl.MEGABATCH]
    assert all(r["settings"]["capacity"] < SMALL["num_partitions"] for r in mega)  # several states
    if not capped:
        assert "NOT" in result["goals_conditions"]
    dgl = [r for r in runs if r["system"] == bl.DGL]
    assert [r["threads"] for r in dgl] == [0, 2, 4, 8]
    assert all(r["samples_per_s"] is None and "no-dgl" in r["skipped"] for r in dgl)
    goals = result["goals"]
    assert {"memory_2_threads_vs_1", "best_out_of_core_vs_dgl", "memory_scaling",
            *(f"{s}_vs_limit" for s in bl.OUT_OF_CORE)} == goals.keys()
    assert goals["memory_2_threads_vs_1"]["value"] > 0 and goals["best_out_of_core_vs_dgl"]["met"] is None
    assert set(result["limits"]["memory_gather_by_threads"]) == {"1", "2"}
    assert result["limits"]["disk"]["read_bytes_per_s"] > 0


DGL_PYTHON = REPO / ".venv-dgl" / "bin" / "python"


@pytest.mark.skipif(not DGL_PYTHON.exists(), reason="no DGL interpreter at .venv-dgl (DGL is an optional "
                    "baseline; tools/bench_sampling.py or a full bench_outofcore run creates it)")
def test_dgl_rows_measure_dgls_loader_with_the_same_sink(quick_cache, tmp_path):
    result = _run(tmp_path, quick_cache, "--systems", bl.DGL, "--dgl-workers", "0,2",
                  "--dgl-python", str(DGL_PYTHON))
    rows = result["runs"]
    assert [r["threads"] for r in rows] == [0, 2]
    for r in rows:
        assert r["samples_per_s"] > 0 and r["samples"] == 3000, r.get("error")
        assert r["settings"]["num_workers"] == r["threads"] and r["same_batches"] is not None
