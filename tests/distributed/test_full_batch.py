"""SAR full-batch training across real processes (torchrun, gloo on loopback, float64): with
1, 2 and 4 ranks the loss, the outputs and every parameter's gradient equal single-process
full-batch training of the same model to 1e-10, for every layer type (RGCN with and
without bases), with and without BatchNorm, with dropout; SAR with and without edge chunks
and prefetch, and the domain-parallel baseline. A rank that raises ends the job with its
error, long before the process group's timeout."""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, make_graph
from tests.distributed.launch import torchrun

HERE = Path(__file__).resolve().parent
MODELS = {"sage", "gcn", "gin", "gat", "rgcn", "rgcn-nobases"}


@pytest.fixture(scope="module")
def store_path(tmp_path_factory) -> Path:
    import graphstore

    # 8 METIS partitions: 4 ranks hold 2 each; relations for RGCN; some nodes unlabeled.
    graph, _ = make_graph(num_nodes=300, num_edges=1500, feature_dim=6, num_classes=4, num_relations=3, seed=3)
    out = tmp_path_factory.mktemp("sar") / "graph.gs"
    graphstore.convert(graph, out, num_partitions=8, partitioner="metis")
    return out


@pytest.mark.parametrize("nproc", [1, 2, 4])
def test_loss_and_gradients_equal_single_process(store_path, tmp_path, nproc):
    out = tmp_path / "result.json"
    done = torchrun(nproc, HERE / "exactness_worker.py", str(store_path), str(out), timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == nproc
    assert (result["halo_rows"] > 0) == (nproc > 1)  # the ranks really do read each other's rows
    rows = result["results"]
    assert {r["model"] for r in rows} == MODELS
    assert {(r["batch_norm"], r["mode"]) for r in rows} == {(b, m) for b in (False, True)
                                                            for m in ("sar", "domain_parallel")}
    for r in rows:
        what = f"{r['model']} bn={r['batch_norm']} {r['mode']} chunk={r['edge_chunk']} prefetch={r['prefetch']}"
        assert r["grad_max_abs_diff"] < 1e-10, what
        assert r["out_max_abs_diff"] < 1e-10, what
        assert r["loss_abs_diff"] < 1e-10, what
        if r["batch_norm"]:
            assert r["running_stats_diff"] < 1e-10, what
        assert r["grad_max"] > 1e-3 and 0.5 < r["loss"] < 5, what  # a real gradient, a real loss
    # The baseline sends what SAR sends (the prepared rows, projected where the layer allows,
    # and their gradient back) wherever SAR fetches once a layer: the layers that aggregate
    # linearly; GAT and RGCN with bases fetch again in backward.
    sent = {(r["model"], r["batch_norm"], r["mode"]): (r["bytes_sent"], r["rows_received"]) for r in rows
            if r["edge_chunk"] in (7, None) and r["prefetch"] and r["mode"] == "domain_parallel" or
            (r["mode"] == "sar" and r["edge_chunk"] == 7 and r["prefetch"])}
    for model in ("sage", "gcn", "gin", "rgcn-nobases"):
        assert sent[(model, False, "domain_parallel")] == sent[(model, False, "sar")], model
        assert (sent[(model, False, "sar")][0] > 0) == (nproc > 1), model


@pytest.fixture(scope="module")
def two_components(tmp_path_factory) -> Path:
    """Two disconnected halves: METIS puts them on different ranks, so some pairs of ranks
    exchange nothing (empty messages are skipped on both ends, or the ring would hang)."""
    import dataclasses

    import graphstore
    from graphstore.layout.sources.base import EdgeChunk

    graph, _ = make_graph(num_nodes=200, num_edges=1200, feature_dim=6, num_classes=4, num_relations=3, seed=4)

    def edges():
        for chunk in graph.edges():
            keep = (chunk.src < 100) == (chunk.dst < 100)
            yield EdgeChunk(chunk.src[keep], chunk.dst[keep], chunk.rel[keep])

    out = tmp_path_factory.mktemp("sar2") / "graph.gs"
    graphstore.convert(dataclasses.replace(graph, edges=edges), out, num_partitions=4, partitioner="metis")
    return out


def test_ranks_that_share_no_edge_exchange_nothing_and_stay_exact(two_components, tmp_path):
    out = tmp_path / "result.json"
    done = torchrun(4, HERE / "exactness_worker.py", str(two_components), str(out), "sage,gat,rgcn", timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["empty_peers"] >= 1  # rank 0 reads nothing from some other rank
    assert {r["model"] for r in result["results"]} == {"sage", "gat", "rgcn"}
    for r in result["results"]:
        assert max(r["grad_max_abs_diff"], r["out_max_abs_diff"], r["loss_abs_diff"]) < 1e-10, r


def test_a_raising_rank_stops_the_others_with_its_error():
    timeout_s = 60.0
    start = time.monotonic()
    done = torchrun(3, HERE / "failing_worker.py", str(timeout_s), timeout=timeout_s)
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert "rank 1: ValueError: boom on rank 1: the others must stop" in done.stderr
    assert elapsed < timeout_s / 2, f"the job took {elapsed:.0f} s: the others waited for the group's timeout"


def test_the_trainer_trains_the_same_model_on_any_number_of_ranks_and_resumes(store_path, tmp_path):
    """3 epochs on one rank; 2 epochs on two ranks, then the third resumed from their
    checkpoint on one rank: the same losses and accuracies."""
    flags = ["--store", str(store_path), "--model", "gat", "--heads", "2", "--hidden", "8", "--layers", "3",
             "--batch-norm", "--dropout", "0.3", "--dtype", "float64", "--edge-chunk", "50"]
    runs = {}
    for name, nproc, extra in (("one", 1, ["--epochs", "3"]),
                               ("two", 2, ["--epochs", "2", "--checkpoint-dir", str(tmp_path / "ckpt")]),
                               ("resumed", 1, ["--epochs", "3", "--checkpoint-dir", str(tmp_path / "ckpt"),
                                               "--resume"])):
        out = tmp_path / f"{name}.json"
        done = torchrun(nproc, REPO / "trainers" / "full_batch.py", *flags, *extra, "--metrics-out", str(out),
                        timeout=110)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = json.loads(out.read_text())
    one, two = runs["one"], runs["resumed"]
    assert [e["epoch"] for e in two["epochs"]] == [0, 1, 2]  # two from the 2-rank run, one resumed
    assert runs["two"]["config"]["world_size"] == 2 and len(runs["two"]["rss_bytes_per_rank"]) == 2
    assert runs["two"]["comm_per_rank"][0]["rows_fetched_remote"] > 0
    assert one["comm_per_rank"][0]["rows_fetched_remote"] == 0
    losses = [[e["loss"] for e in r["epochs"]] for r in (one, two)]
    assert losses[0][2] < losses[0][0]  # it learns
    assert max(abs(a - b) for a, b in zip(*losses)) < 1e-10
    assert [e["valid"]["acc"] for e in one["epochs"]] == [e["valid"]["acc"] for e in two["epochs"]]


def test_a_layer_followed_by_batch_norm_has_no_bias():
    """BatchNorm subtracts the mean, so a bias before it has a zero true gradient: only
    round-off, which Adam would turn into steps of about lr that differ with the ranks."""
    from graphstore.distributed import FullBatchGNN

    for kind, extra in (("sage", {}), ("gcn", {}), ("gin", {}), ("gat", {"heads": 2}), ("rgcn", {"num_relations": 3})):
        model = FullBatchGNN(kind, batch_norm=True, in_dim=6, hidden_dim=8, out_dim=4, num_layers=3, **extra)
        names = {n for n, _ in model.named_parameters()}
        bias = "fc_self.bias" if kind in ("sage", "rgcn") else "mlp.2.bias" if kind == "gin" else "bias"
        assert f"gnn.layers.2.{bias}" in names, (kind, sorted(names))  # the last layer has no BatchNorm after it
        dropped = {f"gnn.layers.{k}.{bias}" for k in (0, 1)}  # the outputs BatchNorm shifts
        assert not dropped & names, kind
        plain = FullBatchGNN(kind, batch_norm=False, in_dim=6, hidden_dim=8, out_dim=4, num_layers=3, **extra)
        assert {n for n, _ in plain.named_parameters()} - names == dropped


def test_one_and_two_ranks_train_the_same_gat_with_batch_norm_in_float32(store_path, tmp_path):
    """GAT + BatchNorm + Adam in float32, 8 epochs on 1 and on 2 ranks: every parameter and
    running statistic within 5e-4 (the round-off of the sums' order), the same accuracies.
    With a bias before BatchNorm, that bias differed by 0.04 and the running mean by 0.02."""
    flags = ["--store", str(store_path), "--model", "gat", "--heads", "2", "--hidden", "8", "--layers", "3",
             "--batch-norm", "--dropout", "0.3", "--dtype", "float32", "--edge-chunk", "50", "--epochs", "8",
             "--normalize-features", "row"]
    states, metrics = {}, {}
    for nproc in (1, 2):
        ckpt, out = tmp_path / f"ckpt{nproc}", tmp_path / f"m{nproc}.json"
        done = torchrun(nproc, REPO / "trainers" / "full_batch.py", *flags, "--checkpoint-dir", str(ckpt),
                        "--metrics-out", str(out), timeout=110)
        assert done.returncode == 0, done.stderr[-3000:]
        latest = ckpt / (ckpt / "latest").read_text().strip() / "state.pt"
        states[nproc] = torch.load(latest, map_location="cpu", weights_only=False)["model"]
        metrics[nproc] = json.loads(out.read_text())["epochs"]
    one, two = states[1], states[2]
    assert one.keys() == two.keys()
    diffs = {k: float((one[k] - two[k]).abs().max()) for k in one if one[k].is_floating_point()}
    assert max(diffs.values()) < 5e-4, diffs
    assert "gnn.layers.0.bias" not in one
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(metrics[1], metrics[2])) < 1e-5
    for split in ("valid", "test"):
        assert [e[split]["acc"] for e in metrics[1]] == [e[split]["acc"] for e in metrics[2]]


@pytest.fixture(scope="module")
def wide_store(tmp_path_factory) -> Path:
    """48 MiB of float32 features in 8 partitions of 6 MiB: large against the noise of a
    process's resident set."""
    import graphstore

    graph, _ = make_graph(num_nodes=49152, num_edges=100000, feature_dim=256, num_classes=4, feature_chunk=4096,
                          edge_chunk=50000)
    out = tmp_path_factory.mktemp("wide") / "wide.gs"
    graphstore.convert(graph, out, num_partitions=8, partitioner="random")
    return out


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_loading_a_block_holds_one_copy_of_its_features_and_one_partition(wide_store, dtype):
    """The kernel's peak resident set during `load_block_data`, in a fresh process, against
    the features' bytes: one copy in the dtype asked for, plus (converting) one partition as
    stored. Concatenating the partitions held two copies (three while converting)."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(HERE / "block_memory_worker.py"), str(wide_store), dtype],
                          capture_output=True, text=True, env=env, timeout=110, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    m = json.loads(done.stdout)
    partition_bytes = m["stored_bytes"] // m["num_partitions"]
    assert m["features_bytes"] == 49152 * 256 * (4 if dtype == "float32" else 8)
    # One copy, one partition, and 4 MiB for the reader's and the allocator's own.
    assert m["extra_bytes"] < m["features_bytes"] + partition_bytes + (4 << 20), m


def test_rank_blocks_are_contiguous_and_cover_the_partitions():
    from graphstore.distributed import rank_partitions
    from graphstore.errors import ConfigError

    for p, n in ((8, 1), (8, 3), (16, 4), (5, 5)):
        runs = rank_partitions(p, n)
        assert runs[0][0] == 0 and runs[-1][1] == p and all(a[1] == b[0] for a, b in itertools.pairwise(runs))
        sizes = [b - a for a, b in runs]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    with pytest.raises(ConfigError, match="at least 4 partitions"):
        rank_partitions(3, 4)


def test_dropout_masks_depend_on_the_node_not_on_the_split():
    from graphstore.distributed import dropout_mask

    starts = [0, 10, 25, 31, 50]
    whole = dropout_mask(0.4, 6, starts, 0, seed=1, epoch=2, layer=1)
    halves = torch.cat([dropout_mask(0.4, 6, starts[:3], 0, seed=1, epoch=2, layer=1),
                        dropout_mask(0.4, 6, starts[2:], 2, seed=1, epoch=2, layer=1)])
    assert torch.equal(whole, halves) and whole.shape == (50, 6)
    assert set(whole.unique().tolist()) == {0.0, torch.tensor(1 / 0.6).item()}  # kept units scaled, float32
    other = dropout_mask(0.4, 6, starts, 0, seed=1, epoch=3, layer=1)
    assert not torch.equal(whole, other)  # a new epoch draws new masks
