"""The command line as a user meets it: subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO


def run(*args, check_code=0):
    proc = subprocess.run([sys.executable, "-m", "graphstore", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == check_code, proc.stderr
    return proc


@pytest.fixture(scope="module")
def edge_list(tmp_path_factory):
    d = tmp_path_factory.mktemp("el")
    rng = np.random.default_rng(0)
    edges = rng.integers(0, 200, size=(900, 2))
    np.savetxt(d / "edges.txt", edges, fmt="%d")
    np.save(d / "features.npy", rng.normal(size=(200, 5)).astype(np.float32))
    np.save(d / "labels.npy", rng.integers(0, 3, 200))
    return d


def test_convert_info_verify_round(edge_list, tmp_path):
    out = tmp_path / "g.gs"
    proc = run("convert", edge_list, out, "--partitions", "4", "--partitioner", "random")
    assert "wrote" in proc.stdout and "edge cut" in proc.stdout
    info = json.loads(run("info", out, "--json").stdout)
    for key in ["num_nodes", "num_edges", "directed", "num_partitions", "partition_size", "feature_dim",
                "num_classes", "num_relations", "splits", "format_version", "bytes_on_disk"]:
        assert key in info, key
    assert info["num_nodes"] == 200 and info["feature_dim"] == 5 and info["num_classes"] == 3
    assert info["num_partitions"] == 4 and info["partition_size"] == 50
    assert info["directed"] is False and info["num_relations"] == 0 and info["format_version"] == 1
    assert sum(info["splits"].values()) > 0
    assert "OK" in run("verify", out).stdout
    assert "partitions 4 x 50" in run("info", out).stdout


def test_errors_are_one_line_exit_1(edge_list, tmp_path):
    out = tmp_path / "g.gs"
    run("convert", edge_list, out, "--partitions", "2")
    proc = run("convert", edge_list, out, "--partitions", "2", check_code=1)
    assert proc.stderr.count("\n") == 1 and "already exists" in proc.stderr and "Traceback" not in proc.stderr
    proc = run("info", tmp_path / "nothing.gs", check_code=1)
    assert proc.stderr.strip() == f"graphstore info: error: {tmp_path / 'nothing.gs'}: no such store"
    proc = run("convert", tmp_path / "no_such_source", tmp_path / "x.gs", check_code=1)
    assert proc.stderr.count("\n") == 1 and "no_such_source" in proc.stderr
    (out / "edges" / "src" / "c" / "0").write_bytes(b"garbage!")
    proc = run("verify", out, check_code=1)
    assert "edges/src chunk 0" in proc.stderr and proc.stderr.count("\n") == 1


def test_a_reader_that_stops_reading_ends_the_output_quietly(edge_list, tmp_path):
    """``graphstore info X | head``: a closed pipe ends the command as it ends `cat`, without
    an error line (SIGPIPE's status, 141)."""
    out = tmp_path / "g.gs"
    run("convert", edge_list, out, "--partitions", "2")
    with subprocess.Popen([sys.executable, "-m", "graphstore", "info", str(out)], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        proc.stdout.close()  # the reader is gone before the first line is written
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=300) == 141 and err == ""


def test_convert_says_a_symmetric_source_lists_its_edges_both_ways(tmp_path):
    """The summary line counts the rows a source repeats as duplicates, and the edges it
    already lists both ways apart (issue 31, 7: they were all "duplicate edges merged")."""
    pairs = [(u, u + 1 + k) for u in range(30) for k in range(2)]
    rows = pairs + [(v, u) for u, v in pairs] + pairs[:3] + [(40, 41)]  # 3 repeats, 1 edge one way
    (tmp_path / "sym").mkdir()
    np.savetxt(tmp_path / "sym" / "edges.txt", np.array(rows), fmt="%d")
    np.save(tmp_path / "sym" / "labels.npy", np.arange(42) % 2)
    proc = run("convert", tmp_path / "sym", tmp_path / "g.gs", "--partitions", "2")
    assert ("124 edges read, 0 self loops dropped, 3 duplicate edges merged, "
            "1 reverse edges added (120 listed both ways already)") in proc.stdout
    assert "122 edges (both directions)" in proc.stdout
    proc = run("convert", tmp_path / "sym", tmp_path / "d.gs", "--partitions", "2", "--directed")
    assert "124 edges read, 0 self loops dropped, 3 duplicate edges merged\n" in proc.stdout


def test_bad_usage_exits_2(tmp_path):
    run("convert", check_code=2)
    run("convert", "a", "b", "--partitions", "0", check_code=2)
    run("convert", "a", "b", "--partitions", "2", "--partition-bytes", "4MiB", check_code=2)
    run("frobnicate", check_code=2)


@pytest.mark.parametrize(("value", "message"), [("lots", "expected a size like 512MiB (got 'lots')"),
                                                 ("0KiB", "a size must be positive (got '0KiB')")])
def test_a_bad_byte_size_names_the_option_and_the_problem(value, message):
    proc = run("convert", "a", "b", "--partition-memory", value, check_code=2)
    assert f"argument --partition-memory: {message}" in proc.stderr


def test_partition_bytes_accepts_units(edge_list, tmp_path):
    out = tmp_path / "g.gs"
    run("convert", edge_list, out, "--partition-bytes", "2KiB", "--partitioner", "sequential")
    info = json.loads(run("info", out, "--json").stdout)
    assert info["num_partitions"] > 4
    assert info["partitioner"]["num_partitions_rule"].startswith("--partition-bytes: ceil(")


def test_hubs_rewrites_the_static_cache_group_and_upgrade_adds_it(edge_list, tmp_path):
    import graphstore

    out = tmp_path / "g.gs"
    run("convert", edge_list, out, "--partitions", "4", "--partitioner", "random", "--hub-fraction", "0")
    with graphstore.open(out) as store:
        assert store.hubs is None
    proc = run("upgrade", out)
    assert "and the hub group" in proc.stdout
    with graphstore.open(out) as store:
        assert store.hubs.fraction == 0.01 and store.hubs.num_hubs == 2  # ceil(0.01 * 200)
    proc = run("hubs", out, "--fraction", "0.1")
    assert "20 hubs (0.1 of the nodes) touch" in proc.stdout
    with graphstore.open(out) as store:
        assert store.hubs.num_hubs == 20 and store.verifies_partial_reads
    run("verify", out)
    proc = run("hubs", out, "--fraction", "1.5", check_code=1)
    assert proc.stderr.count("\n") == 1 and "hub fraction must be in [0, 1]" in proc.stderr
    run("hubs", out, "--fraction", "0")
    with graphstore.open(out) as store:
        assert store.hubs is None
    run("verify", out)
    proc = run("convert", edge_list, tmp_path / "bad.gs", "--partitions", "4", "--hub-fraction", "-1", check_code=1)
    assert "--hub-fraction must be in [0, 1]" in proc.stderr and not (tmp_path / "bad.gs").exists()
