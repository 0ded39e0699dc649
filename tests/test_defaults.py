"""The defaults derived from the data and the machine (`graphstore.loaders.defaults`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import graphstore
from graphstore.errors import ConfigError
from graphstore.layout._convert import ConvertOptions, convert
from graphstore.loaders.defaults import (
    MEMORY_SHARE,
    default_batch_size,
    feature_normalization,
    mem_available,
    memory_budget,
)
from tests.conftest import REPO, make_graph


@pytest.mark.parametrize("num_train, batch", [(140, 64), (20, 20), (4000, 500), (10_000_000, 1000)])
def test_the_batch_is_a_fraction_of_the_training_split(num_train, batch):
    assert default_batch_size(num_train)[0] == batch


def test_bag_of_words_rows_are_row_normalised(tmp_path):
    graphstore.convert(REPO / "data" / "cora", tmp_path / "cora.gs", num_partitions=4, partitioner="random")
    mode, rule = feature_normalization(graphstore.open(tmp_path / "cora.gs"))
    assert mode == "row" and "no negative entries" in rule


def test_dense_or_signed_rows_are_left_alone(tmp_path):
    graph, _ = make_graph(num_nodes=400, num_edges=1600, feature_dim=8)  # rows [i, i + 0.5, ...]: dense
    convert(graph, tmp_path / "g.gs", ConvertOptions(num_partitions=3, partitioner="random"))
    mode, rule = feature_normalization(graphstore.open(tmp_path / "g.gs"))
    assert mode == "none" and "signed or dense" in rule


def test_memory_budget_is_a_share_of_what_the_kernel_reports(monkeypatch):
    monkeypatch.delenv("GRAPHSTORE_MEMORY_BYTES", raising=False)
    budget = memory_budget()
    # Read /proc/meminfo here, independently of the module.
    text = Path("/proc/meminfo").read_text()
    free = int(next(line for line in text.splitlines() if line.startswith("MemAvailable:")).split()[1]) * 1024
    assert 0 < budget.available <= free * 1.1 + (256 << 20)
    assert budget.bytes == int(budget.available * MEMORY_SHARE)
    monkeypatch.setenv("GRAPHSTORE_MEMORY_BYTES", str(3 << 30))
    assert memory_budget().bytes == int((3 << 30) * MEMORY_SHARE)
    monkeypatch.setenv("GRAPHSTORE_MEMORY_BYTES", "3GiB")
    assert memory_budget().bytes == int((3 << 30) * MEMORY_SHARE)
    monkeypatch.setenv("GRAPHSTORE_MEMORY_BYTES", "lots")
    with pytest.raises(ConfigError, match="GRAPHSTORE_MEMORY_BYTES: expected a size"):
        memory_budget()
    assert mem_available() is not None


@pytest.mark.skipif(not os.access("/sys/fs/cgroup/memory", os.W_OK),
                    reason="needs a writable cgroup v1 memory controller (root on Linux)")
def test_memory_budget_reads_the_cgroup_limit(tmp_path):
    """A process in a memory cgroup capped at 1 GiB sees (at most) that cap, not the machine."""
    group = Path("/sys/fs/cgroup/memory") / f"graphstore-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(1 << 30))
        code = ("import os,sys; open(sys.argv[1], 'w').write(str(os.getpid()));"
                "from graphstore.loaders.defaults import memory_budget; b = memory_budget();"
                "print(b.source, b.available)")
        proc = subprocess.run(["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$0" -c "$1" /dev/null',
                               sys.executable, code], capture_output=True, text=True, timeout=120,
                              env={k: v for k, v in os.environ.items() if k != "GRAPHSTORE_MEMORY_BYTES"})
        assert proc.returncode == 0, proc.stderr
        source, available = proc.stdout.split()
        assert source == "cgroup" and 0 < int(available) <= 1 << 30
    finally:
        group.rmdir()
