"""Fixtures of the CUDA suite (every module here is marked ``cuda``: skipped without a
device, all for one reason; ``GS_REQUIRE_CUDA=1`` fails the session instead, see
``tests/conftest.py``). Small graphs are built in the tests; the trainer tests use the
embedded Cora and the small knowledge graph of ``tests/trainers/conftest.py``.

The subprocesses (SAR and DDP workers, the trainers run alone) get the repository on
``PYTHONPATH`` in front of what the caller had, so wheels installed into a target folder
(the GPU machine's ``/tmp/site``, ``tools/gpu_check.sh``) stay importable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
# The trainer tests' stores, shared rather than converted a second way.
from tests.trainers.conftest import cora_store, kg_store  # noqa: F401


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a worker process: the repository first on ``PYTHONPATH``, the
    caller's entries kept (an installed target folder), one thread per process."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def run_python(*args: object, timeout: float = 150) -> subprocess.CompletedProcess:
    """``python args...`` from the repository root, output captured, never raising on a
    failed exit (the tests read the code and the tail of stderr)."""
    return subprocess.run([sys.executable, *map(str, args)], env=subprocess_env(), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, check=False)


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    """600 nodes, 5000 directed edges, 3 relations, 16 float features (node ids: every
    gathered row names its node), 4 classes, 4 random partitions."""
    from graphstore.layout._convert import ConvertOptions, convert
    from tests.conftest import make_graph

    graph, _ = make_graph(num_nodes=600, num_edges=5000, directed=True, feature_dim=16, num_relations=3, seed=7)
    out = tmp_path_factory.mktemp("cuda_small") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=4, partitioner="random", seed=0))
    return out
