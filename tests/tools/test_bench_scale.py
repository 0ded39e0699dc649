"""Tests of tools/bench_scale.py: the least-squares fit and its projection on runs of known
cost, and a smoke run end to end (two tiny graphs generated and converted under the cap)
whose JSON has every field the issue names, resumed without rerunning a recorded stage; a
slow test runs every stage (the epochs, inference, the structure-heavy run's verify)."""

from __future__ import annotations

import json
import os

import pytest

from tools import bench_scale as bs


def _run(num_nodes: int, stored_edges: int, feature_bytes: int, seconds: float, rss: int, *, heavy=False) -> dict:
    stage = {"s": seconds, "peak_rss_bytes": rss, "mem_cap_bytes": 4 << 30}
    return {"num_nodes": num_nodes, "stored_edges": stored_edges, "feature_bytes": feature_bytes,
            "structure_heavy": heavy, "stages": {"convert": dict(stage), "infer": dict(stage)}}


def _cost(edges: int, feats: int) -> float:
    return 2.0 + 1e-7 * edges + 3e-9 * feats


def test_least_squares_recovers_an_exact_linear_model_and_refuses_dependent_columns():
    rows = [[1.0, e, f] for e, f in ((1e6, 5e8), (2e6, 1e9), (4e6, 2e9), (4e6, 1e7))]
    coef = bs.least_squares(rows, [_cost(r[1], r[2]) for r in rows])
    assert coef == pytest.approx([2.0, 1e-7, 3e-9], rel=1e-6)
    # Feature bytes proportional to edges: the columns are dependent.
    assert bs.least_squares([[1.0, e, 500 * e] for e in (1e6, 2e6, 4e6)], [1.0, 2.0, 3.0]) is None
    assert bs.least_squares([[1.0, 1.0]], [1.0]) is None  # fewer rows than columns
    assert bs.solve([[1.0, 2.0], [2.0, 4.0]], [1.0, 2.0]) is None


def test_fit_separates_edges_from_features_with_a_narrow_run_and_projects_the_targets():
    runs = [_run(n, 28 * n, 256 * n, _cost(28 * n, 256 * n), 1_000_000_000 + 10 * n)
            for n in (1 << 20, 2 << 20, 4 << 20)]
    runs.append(_run(1 << 20, 60 << 20, 8 << 20, _cost(60 << 20, 8 << 20), 1_000_000_000 + 10 * (1 << 20), heavy=True))
    fits = bs.fit_runs(runs)
    conv = fits["convert"]
    assert conv["runs"] == 4
    assert conv["seconds"] == pytest.approx({"intercept": 2.0, "stored_edges": 1e-7, "feature_bytes": 3e-9}, rel=1e-6)
    assert conv["peak_rss_bytes"] == pytest.approx({"intercept": 1e9, "num_nodes": 10.0}, rel=1e-6)
    assert fits["epoch_disk"] is None  # no run finished it
    proj = bs.project(fits)
    for name, spec in bs.TARGETS.items():
        point = bs.target_point(spec)
        assert point["stored_edges"] == 2 * spec["num_edges"]
        assert point["feature_bytes"] == spec["num_nodes"] * spec["feature_dim"] * 2
        assert proj[name]["convert_s"] == pytest.approx(_cost(point["stored_edges"], point["feature_bytes"]), rel=1e-6)
        assert proj[name]["peak_rss_bytes"] == pytest.approx(1e9 + 10 * spec["num_nodes"], rel=1e-6)
        assert set(proj[name]["stages"]) == {"convert", "infer"}
    # MAG240M's 768-d features cost more than papers100M's 128-d at fewer edges.
    assert proj["mag240m_papers"]["convert_s"] > proj["papers100m"]["convert_s"]


def test_contended_timings_stay_out_of_the_time_fit_but_not_the_memory_fit():
    runs = [_run(n, 28 * n, 256 * n, _cost(28 * n, 256 * n), 1_000_000_000 + 10 * n)
            for n in (1 << 20, 2 << 20, 4 << 20)]
    # A run timed beside other work: three times as slow, its memory as the others'.
    slow = _run(8 << 20, 28 * (8 << 20), 256 * (8 << 20), 3 * _cost(28 * (8 << 20), 256 * (8 << 20)),
                1_000_000_000 + 10 * (8 << 20))
    slow["timings_contended"] = True
    fit = bs.fit_stage([*runs, slow], "convert")
    assert fit["runs"] == 4 and fit["timed_runs"] == 3
    assert bs.predict(fit["seconds"], {"stored_edges": 28 << 24, "feature_bytes": 256 << 24}) == pytest.approx(
        _cost(28 << 24, 256 << 24), rel=1e-6)
    assert fit["max_peak_rss_bytes"] == 1_000_000_000 + 10 * (8 << 20)
    with_it = bs.fit_stage([*runs, slow], "convert", include_contended=True)
    assert with_it["timed_runs"] == 4
    assert bs.predict(with_it["seconds"], {"stored_edges": 28 << 24, "feature_bytes": 256 << 24}) > 1.5 * _cost(
        28 << 24, 256 << 24)


def test_a_falling_fit_becomes_a_rate_through_the_origin():
    runs = [_run(1000, 10_000, 0, 4.7, 1), _run(2000, 20_000, 0, 4.3, 1)]
    fit = bs.fit_stage(runs, "convert")
    assert set(fit["seconds"]) == {"stored_edges"}
    assert fit["seconds"]["stored_edges"] > 0


def test_fit_falls_back_to_edges_alone_and_never_projects_less_memory_than_measured():
    runs = [_run(n, 28 * n, 256 * n, 1.0 + 1e-6 * 28 * n, 3_000_000_000 - n) for n in (1000, 2000, 4000)]
    fit = bs.fit_stage(runs, "convert")
    assert set(fit["seconds"]) == {"intercept", "stored_edges"}
    assert fit["seconds"]["stored_edges"] == pytest.approx(1e-6)
    # A falling fit of memory (a cap's noise) is floored at the largest peak seen.
    proj = bs.project({"convert": fit})
    assert proj["papers100m"]["peak_rss_bytes"] == 3_000_000_000 - 1000
    assert bs.fit_stage(runs[:1], "convert") is None


def test_conversion_fit_and_phases_over_the_stream_partitioned_runs():
    def run(n, part, phases):
        r = _run(n, 28 * n, 256 * n, sum(phases.values()), 1 << 30)
        r["partitioner"] = part
        r["stages"]["convert"]["detail"] = {"phases_s": phases}
        return r

    # METIS at the smallest size costs 5x per edge; the projected graphs get stream.
    runs = [run(1 << 20, "metis", {"partition": 240.0, "write features": 3.0, "write edges": 5.0}),
            run(2 << 20, "stream", {"partition": 70.0, "write features": 6.0, "write edges": 8.0}),
            run(4 << 20, "stream", {"partition": 140.0, "write features": 12.0, "write edges": 16.0})]
    fits = bs.fit_runs(runs)
    assert fits["convert"]["runs"] == 2 and fits["convert"]["partitioner"] == "stream"
    assert fits["epoch_disk"] is None and fits["infer"]["runs"] == 3
    phases = bs.fit_phases(runs)
    assert set(phases["write features"]) == {"intercept", "feature_bytes"}
    assert phases["write features"]["feature_bytes"] == pytest.approx(6.0 / (256 * (2 << 20)))
    assert phases["partition"]["stored_edges"] == pytest.approx(70.0 / (28 * (2 << 20)))
    proj = bs.project(fits, phases=phases)
    for name, spec in bs.TARGETS.items():
        point = bs.target_point(spec)
        by_phase = proj[name]["convert_phases_s"]
        assert by_phase["write features"] == pytest.approx(6.0 * point["feature_bytes"] / (256 * (2 << 20)), rel=1e-6)
        assert proj[name]["convert_s"] == pytest.approx(sum(by_phase.values()))
        assert proj[name]["convert_s_stage_fit"] is not None
    assert bs.fit_phases(runs[:1]) is None  # one size: nothing to fit


def test_per_edge_rate_is_over_the_runs_of_the_main_width():
    runs = [_run(1000, 10_000, 0, 1.0, 1), _run(2000, 20_000, 0, 2.6, 1),
            _run(1000, 50_000, 0, 100.0, 1, heavy=True)]
    got = bs.per_edge(runs)
    assert set(got["s_per_edge"]) == {"1000", "2000"}
    assert got["max_over_min"] == pytest.approx(1.3)


def test_sizes_communities_and_disk_estimate():
    assert bs.parse_size("64M") == 64 << 20 and bs.parse_size("80000") == 80_000
    assert bs.communities_for(2_097_152, 10) == 340 and bs.communities_for(1000, 10) == 10
    est = bs.disk_estimate_bytes(50_000_000, 28, 128, "float16")
    assert est["source"] == 16 * 700_000_000 + 50_000_000 * 256 + 16 * 50_000_000
    assert est["peak"] > est["source"] + est["store"]
    # The measured runs' folders, staged endpoints kept to the end, peaked at 2.27 GB (2M
    # nodes, 64-d) and 60.6 GB (50M, 64-d): the estimate is on the safe side, by at most a quarter.
    for nodes, peak in ((2_097_152, 2.27e9), (50_000_000, 60.63e9)):
        assert peak < bs.disk_estimate_bytes(nodes, 28, 64, "float16", staged_removed=False)["peak"] < 1.25 * peak
    # The 4-d run past 2**31 stored edges (int32 source endpoints, staged ones dropped once
    # grouped) peaked at 67.9 GB while partitioning.
    assert 67.9e9 < bs.disk_estimate_bytes(36_000_000, 66, 4, "float16", edge_bytes=4)["peak"] < 1.25 * 67.9e9
    # int32 source endpoints halve the source's edge bytes
    narrow = bs.disk_estimate_bytes(50_000_000, 28, 128, "float16", edge_bytes=4)
    assert est["source"] - narrow["source"] == 8 * 700_000_000


def _smoke(tmp_path, *extra):
    out = tmp_path / "scale.json"
    argv = ["--json", str(out), "--work", str(tmp_path / "work"), "--sizes", "2000,4000", "--targets", "200",
            "--train-cap-mib", "1024", "--convert-cap-mib", "1024", "--no-drop-caches", *extra]
    return bs.main(argv), out


def test_smoke_run_writes_every_field_and_resumes_without_rerunning(tmp_path):
    code, out = _smoke(tmp_path, "--stages", "generate,convert")
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["errors"] == []
    assert [r["num_nodes"] for r in doc["runs"]] == [2000, 4000]
    assert all(r["failed"] is None for r in doc["runs"])
    for run in doc["runs"]:
        assert run["feature_dim"] == 128 and run["feature_dtype"] == "float16"
        assert run["stored_edges"] > 2000 * 20  # about 28 per node, symmetrised, less duplicates
        assert set(run["stages"]) == {"generate", "convert"}
        for stage in run["stages"].values():
            assert stage["s"] > 0 and stage["peak_rss_bytes"] > 0
            assert "mem_cap_bytes" in stage
        # The source goes once converted, the store after the last stage.
        assert not (tmp_path / "work" / run["name"] / "source").exists()
        assert not (tmp_path / "work" / run["name"] / "store.gs").exists()
    assert set(doc["projection"]) == {"papers100m", "mag240m_papers"}
    assert doc["projection"]["papers100m"]["convert_s"] > 0
    assert doc["projection"]["papers100m"]["peak_rss_bytes"] > 0
    assert doc["fit"]["convert"]["runs"] == 2
    # Resumed: every stage is recorded, nothing runs again (the same seconds come back).
    code, out = _smoke(tmp_path, "--stages", "generate,convert")
    assert code == 0
    again = json.loads(out.read_text())
    assert [r["stages"] for r in again["runs"]] == [r["stages"] for r in doc["runs"]]


@pytest.mark.skipif(os.geteuid() != 0 or not bs.benchkit.CGROUP_ROOT.is_dir(), reason="needs root and cgroup v1")
def test_a_stage_killed_by_its_cap_is_reported_in_its_row(tmp_path):
    # 1 MiB cannot hold the interpreter: the conversion is OOM-killed, the run says so.
    code, out = _smoke(tmp_path, "--sizes", "2000", "--stages", "generate,convert", "--convert-cap-mib", "1")
    assert code == 1
    doc = json.loads(out.read_text())
    (run,) = doc["runs"]
    assert doc["errors"] and run["name"] in doc["errors"][0]
    assert run["failed"]["stage"] == "convert" and run["failed"]["returncode"] != 0
    assert "convert" not in run["stages"] and run["stored_edges"] is None
    assert "python -m graphstore convert" in run["failed"]["command"]


def test_the_neighbourhood_check_passes_on_its_store_and_fails_on_another_source(tmp_path):
    from graphstore import cli
    from tools import make_synthetic

    def source(seed):
        out = tmp_path / f"src{seed}"
        argv = ["--kind", "node", "--layout", "npz", "--num-nodes", "3000", "--avg-degree", "12", "--feature-dim",
                "4", "--edge-dtype", "int32", "--seed", str(seed), "--no-progress", "--out", str(out)]
        assert make_synthetic.main(argv) == 0
        return out

    good, other = source(0), source(1)
    assert cli.main(["convert", str(good), str(tmp_path / "s.gs"), "--partitions", "5"]) == 0
    got = bs.check_neighbourhoods(str(tmp_path / "s.gs"), str(good), seed=0, nodes=50, chunk=1000)
    assert got["checked_nodes"] == 150 and got["checked_partitions"] == [0, 2, 4]
    assert got["stored_edges"] == got["in_degree_sum"] == got["last_bucket_offset"] > 3000 * 10
    assert got["source_edges_scanned"] == 3000 * 6
    with pytest.raises(RuntimeError, match="neighbourhoods differ"):
        bs.check_neighbourhoods(str(tmp_path / "s.gs"), str(other), seed=0, nodes=50, chunk=1000)


@pytest.mark.slow
def test_every_stage_of_a_tiny_run(tmp_path):
    code, out = _smoke(tmp_path, "--sizes", "3000", "--heavy-nodes", "2000")
    assert code == 0
    doc = json.loads(out.read_text())
    heavy = [r for r in doc["runs"] if r["structure_heavy"]]
    assert len(heavy) == 1 and heavy[0]["feature_dim"] == 4
    assert heavy[0]["stages"]["verify"]["detail"]["verified"] is True
    assert heavy[0]["stages"]["verify"]["detail"]["checked_edges"] > 0
    assert heavy[0]["source_edge_dtype"] == "int32"
    for run in doc["runs"]:
        assert set(bs.STAGES) <= set(run["stages"])
        assert run["stages"]["infer"]["detail"]["rows"] == run["num_nodes"]
        for name in ("epoch_megabatch", "epoch_disk", "epoch_macrobatch"):
            assert run["stages"][name]["detail"]["epoch"]["samples"] > 0
