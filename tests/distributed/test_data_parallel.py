"""Data-parallel training of every scheme under DistributedDataParallel (torchrun, gloo on
loopback): the ranks' shares of an epoch are disjoint and together are the epoch; two
(and three) ranks reach, in float64 and with dropout, the parameters one process reaches on
the same batches with gradient accumulation (to 1e-10) for minibatch, megabatch, disk,
microbatch and macrobatch; the trainer runs under torchrun, writes from rank 0 only and resumes
exactly; a rank that raises ends the job with its error, long before the group's timeout.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

import graphstore
from graphstore.errors import ConfigError
from graphstore.loaders import NodeLoader, Shard
from tests.distributed.launch import torchrun

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SCHEMES = {"minibatch": {}, "megabatch": {}, "disk": {}, "microbatch": {"micro_batches": 2},
           "macrobatch": {"macro_batches": 2}}


@pytest.fixture(scope="module")
def cora(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cora") / "cora.gs"
    graphstore.convert(REPO / "data" / "cora", out, num_partitions=8, partitioner="metis")
    return out


def targets_of(loader: NodeLoader, epoch: int) -> list[list[int]]:
    return [b.store_ids[-b.dense.num_targets:].tolist() for b in loader.epoch(epoch)]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_ranks_shares_are_disjoint_and_make_the_epoch(cora, scheme):
    with graphstore.open(cora) as store:
        def loader(**kw):
            return NodeLoader(store, split="train", fanouts=(3, 3), batch_size=16, seed=2, scheme=scheme,
                              **SCHEMES[scheme], **kw)

        single = loader()
        want = Counter(t for batch in targets_of(single, 1) for t in batch)
        assert set(want) == set(store.read_node_split("train").tolist())
        for world in (2, 3):
            shares = [loader(rank=r, world_size=world) for r in range(world)]
            got = [targets_of(s, 1) for s in shares]
            assert [len(g) for g in got] == [s.num_batches(1) for s in shares]
            assert all(s.num_steps(1) == max(len(g) for g in got) for s in shares)
            # Disjoint: no target trained by two ranks in one pass; together, the epoch.
            assert sum((Counter(t for b in g for t in b) for g in got), Counter()) == want
            by_states = scheme in ("megabatch", "disk")  # several states; the others one
            assert shares[0].shard.by_states(len(shares[0].plan(1).states)) == by_states
            if by_states:  # each rank loaded only its block of the states
                loaded = [s.last_stats.states for s in shares]
                assert sum(loaded) == len(single.plan(1).states) and min(loaded) >= 1
            assert shares[0].settings.world_size == world and single.settings.world_size is None
            assert "world_size" not in single.settings.to_dict()


def test_shard_rules():
    assert [list(Shard(r, 3).states(7)) for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert list(Shard(1, 3).states(2)) == [0, 1]  # fewer states than ranks: by batches
    assert Shard(1, 2).batch_counts([3, 4], by_states=True) == [3, 4]
    assert Shard(1, 2).steps([3, 4]) == 4 and Shard(0, 2).steps([9]) == 5
    with pytest.raises(ConfigError, match="rank must be in"):
        Shard(2, 2)


@pytest.mark.parametrize("nproc", [2, 3])
def test_ranks_train_as_one_process_accumulating_their_batches(cora, tmp_path, nproc):
    start = time.monotonic()
    done = torchrun(nproc, HERE / "dp_worker.py", cora, tmp_path, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {}
    for rank in range(nproc):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["world_size"] == nproc
        results.update(record["results"])
    assert set(results) == {"minibatch", "megabatch", "disk", "microbatch", "macrobatch", "microbatch-gcn"}
    for scheme, r in results.items():
        assert r["max_abs_diff"] < 1e-10, (scheme, r)
        assert r["moved"] > 1e-3, scheme  # the epochs did train
        assert r["losses"][1] < r["losses"][0], scheme
    # Uneven shares were padded (and still matched): the ranks' batch counts differ.
    assert any(len(set(counts)) > 1 for r in results.values() for counts in r["batches_per_rank"])
    print(f"data-parallel exactness, {nproc} ranks, 6 cases x 2 epochs: {time.monotonic() - start:.1f} s; "
          + ", ".join(f"{s} {r['max_abs_diff']:.1e}" for s, r in results.items()))


def trainer(cora, out: Path, scheme: str, *extra) -> subprocess.CompletedProcess:
    return torchrun(2, REPO / "trainers" / "node_classification.py", "--store", cora, "--scheme", scheme,
                    "--fanouts", "5,5", "--hidden", "16", "--batch-size", "32", "--lr", "0.02", "--dropout", "0.5",
                    "--seed", "3", "--normalize-features", "none", "--eval-every", "1",
                    *(["--buffer-partitions", "2"] if scheme in ("megabatch", "disk") else []), *extra, timeout=150)


def test_the_trainer_runs_under_torchrun(cora, tmp_path):
    out = tmp_path / "m.json"
    done = trainer(cora, out, "minibatch", "--epochs", "3", "--eval-scheme", "minibatch", "--metrics-out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("\nepoch ") + done.stdout.startswith("epoch ") == 3  # rank 0 alone prints
    m = json.loads(out.read_text())
    assert m["config"]["world_size"] == 2 and m["config"]["loaders"]["valid"]["world_size"] == 2
    losses = [e["train_loss"] for e in m["epochs"]]
    assert losses[-1] < losses[0]
    assert all(e["train_targets"] == 140 for e in m["epochs"])  # the two ranks' targets together
    assert m["final"]["test"]["acc"] > 0.5


def test_the_trainer_resumes_exactly_under_torchrun(cora, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    done = trainer(cora, straight, "megabatch", "--epochs", "2", "--checkpoint-dir", straight,
                   "--metrics-out", straight / "m.json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert trainer(cora, split, "megabatch", "--epochs", "1", "--checkpoint-dir", split).returncode == 0
    done = trainer(cora, split, "megabatch", "--epochs", "2", "--checkpoint-dir", split, "--resume",
                   "--metrics-out", split / "m.json")
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = (json.loads((d / "m.json").read_text()) for d in (straight, split))
    assert b["resumed_from"] == 0 and a["config"]["eval_scheme"] == "exact"
    assert [e["train_loss"] for e in a["epochs"]] == [e["train_loss"] for e in b["epochs"]]
    assert a["final"] == b["final"] and a["final"]["test"]["acc"] > 0.5
    pa, pb = (torch.load(d / "epoch-0001" / "state.pt", weights_only=False)["model"] for d in (straight, split))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_a_raising_rank_stops_the_others_with_its_error(cora):
    timeout_s = 60.0
    start = time.monotonic()
    done = torchrun(2, HERE / "dp_failing_worker.py", cora, timeout_s, timeout=timeout_s)
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert "rank 1: ValueError: boom on rank 1 in step 2: the others must stop" in done.stderr
    assert elapsed < timeout_s / 2, f"the job took {elapsed:.0f} s: rank 0 waited for the group's timeout"
