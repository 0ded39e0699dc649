"""tools/make_wide_graph.py: a small version converts with the defaults into partitions of
at least 4,096 nodes, with the generated split, and its labels are learnable from its words."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

import graphstore
from graphstore.layout._convert import MIN_PARTITION_NODES
from tests.conftest import REPO


def test_a_wide_graph_converts_into_partitions_that_hold_neighbourhoods(tmp_path):
    out = tmp_path / "wide.npz"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "make_wide_graph.py"), str(out), "--nodes", "9000",
                           "--edges", "40000", "--features", "2000", "--classes", "4"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    m = graphstore.convert(out, tmp_path / "wide.gs")
    assert m.num_nodes == 9000 and m.feature_dim == 2000 and m.num_classes == 4
    # 9,000 rows of 8 KB: the byte rule alone would ask for 18 partitions.
    assert m.num_partitions == 9000 // MIN_PARTITION_NODES == 2
    assert m.splits == {"train": 80, "valid": 120, "test": 8800}
    with graphstore.open(tmp_path / "wide.gs") as store:
        x = store.read_features(0)
        y = np.asarray(store.read_labels(0))
        # 60 % of a node's words come from its class's slice: the slice's mass is largest.
        slices = x.reshape(len(x), 4, 500).sum(axis=2)
        assert (slices.argmax(axis=1) == y).mean() > 0.9
