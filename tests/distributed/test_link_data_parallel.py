"""Data-parallel link prediction (torchrun, gloo on loopback): the ranks' shares of an
epoch are disjoint and together are the epoch under every scheme and plan; two (and three)
ranks reach the parameters and the embedding table one process reaches on the same batches
with gradient accumulation (float64 weights, float32 embeddings), with the table replicated
(minibatch) or owned by partition (disk, the ``disjoint`` plan), and with an encoder over
features (disk: COMET's states in blocks); the trainer runs under
torchrun, writes from rank 0 only and resumes exactly; a rank that raises ends the job.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import graphstore
from graphstore.errors import ConfigError
from graphstore.layout.embeddings import EmbeddingTable
from graphstore.loaders import EdgeLoader
from tests.distributed.launch import torchrun
from tests.trainers.conftest import write_clustered_kg
from trainers import link_prediction as lp

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def kg(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kg")
    write_clustered_kg(root / "src")
    out = root / "kg.gs"
    graphstore.convert(root / "src", out, num_partitions=8, partitioner="random")
    return out


@pytest.fixture(scope="module")
def featured(tmp_path_factory) -> Path:
    """An ogbl-like graph with node features (its cluster, one-hot, and noise): the encoder
    reads features, nothing is written to the store."""
    import gzip

    import numpy as np

    from tests.trainers.test_link_prediction import write_clustered_ogbl

    root = tmp_path_factory.mktemp("featured")
    write_clustered_ogbl(root / "src", num_nodes=120, num_clusters=4)
    rng = np.random.default_rng(0)
    x = np.concatenate([np.eye(4)[np.arange(120) % 4], rng.standard_normal((120, 4))], axis=1)
    with gzip.open(root / "src" / "raw" / "node-feat.csv.gz", "wt") as fh:
        fh.write("".join(",".join(f"{v:.6f}" for v in row) + "\n" for row in x))
    out = root / "featured.gs"
    graphstore.convert(root / "src", out, num_partitions=8, partitioner="random")
    return out


def copy_of(store: Path, dest: Path) -> Path:
    shutil.copytree(store, dest)
    return dest


def edges_of(loader: EdgeLoader, epoch: int) -> list[tuple[int, int]]:
    out = []
    for b in loader.epoch(epoch):
        ids = b.graph.node_ids
        out += list(zip(ids[b.src].tolist(), ids[b.dst].tolist()))
    return out


@pytest.mark.parametrize("scheme, policy, table", [("minibatch", None, False), ("disk", "comet", False),
                                                   ("disk", "disjoint", False), ("disk", None, True)],
                         ids=["minibatch", "disk-comet-blocks", "disk-disjoint", "disk-embeddings"])
def test_the_ranks_shares_are_disjoint_and_make_the_epoch(kg, tmp_path, scheme, policy, table):
    store_path = copy_of(kg, tmp_path / "kg.gs")
    with graphstore.open(store_path, mode="r+") as store:
        emb = EmbeddingTable.create(store, 4) if table else None

        def loader(**kw):
            return EdgeLoader(store, batch_size=64, negatives=4, scheme=scheme, policy=policy, capacity=4,
                              seed=3, embeddings=emb, **kw)

        single = loader()
        want = Counter(edges_of(single, 1))
        assert sum(want.values()) == store.num_edges
        for world in (2, 3):
            shares = [loader(rank=r, world_size=world) for r in range(world)]
            got = [edges_of(s, 1) for s in shares]
            assert [len(g) for g in got] != [] and sum((Counter(g) for g in got), Counter()) == want
            steps = [s.round_steps(1) for s in shares]
            assert all([st for _, st in r] == [st for _, st in steps[0]] for r in steps)  # the ranks agree
            assert [s.num_batches(1) for s in shares] == [sum(own for own, _ in r) for r in steps]
            placement = shares[0].settings.embedding_placement
            if table:  # with embeddings the disk scheme runs the disjoint rounds, each partition one rank's
                assert shares[0].policy == "disjoint" and placement == "owned" and len(steps[0]) > 1
            else:
                assert placement is None


@pytest.mark.parametrize("partitioner, num_partitions, bound", [("metis", 8, 1.2), ("random", 5, 1.3)])
def test_disjoint_rounds_balance_the_ranks_steps(tmp_path, partitioner, num_partitions, bound):
    """Three ranks on a clustered KG: the rounds' busiest ranks add up to within ``bound`` of
    the batches split evenly (METIS puts most edges inside partitions, where a plan that
    gathered them in one round padded it to 1.47x; with 5 partitions a rank idled every
    round, 1.63x); every rank trains in every round with 5 partitions; still every edge once
    and each partition one rank's in a round."""
    write_clustered_kg(tmp_path / "src")
    store_path = tmp_path / "kg.gs"
    graphstore.convert(tmp_path / "src", store_path, num_partitions=num_partitions, partitioner=partitioner)
    with graphstore.open(store_path, mode="r+") as store:
        emb = EmbeddingTable.create(store, 4)

        def loader(**kw):
            return EdgeLoader(store, batch_size=64, negatives=4, scheme="disk", capacity=4, seed=3, embeddings=emb,
                              **kw)

        shares = [loader(rank=r, world_size=3) for r in range(3)]
        table = np.array([[own for own, _ in s.round_steps(1)] for s in shares]).T  # [round, rank] batches
        steps = [st for _, st in shares[0].round_steps(1)]
        assert steps == table.max(axis=1).tolist()
        assert sum(steps) <= bound * table.sum() / 3, table.tolist()
        if num_partitions == 5:
            assert (table > 0).all(), table.tolist()  # no rank idles a round
        plan = shares[0].plan(1)
        rounds, held = np.asarray(plan.state_rounds), np.zeros((len(plan.states), num_partitions), dtype=int)
        for k, state in enumerate(plan.states):
            held[k, list(state)] = 1
        assert all(held[rounds == t].sum(axis=0).max() == 1 for t in np.unique(rounds))
        got = sum((Counter(edges_of(s, 1)) for s in shares), Counter())
        assert got == Counter(edges_of(loader(), 1)) and sum(got.values()) == store.num_edges


def test_overlapping_policies_are_refused_with_embeddings_under_data_parallelism(kg, tmp_path):
    store_path = copy_of(kg, tmp_path / "kg.gs")
    with graphstore.open(store_path, mode="r+") as store:
        emb = EmbeddingTable.create(store, 4)
        with pytest.raises(ConfigError, match="policy 'comet' walks one buffer through overlapping states"):
            EdgeLoader(store, batch_size=64, negatives=4, scheme="disk", policy="comet", embeddings=emb,
                       rank=0, world_size=2)
        replica = EdgeLoader(store, batch_size=64, negatives=4, scheme="minibatch", embeddings=emb, rank=1,
                             world_size=2)
        assert replica.settings.embedding_placement == "replicated" and not replica.walk.write_back


@pytest.mark.parametrize("nproc", [2, 3])
def test_ranks_train_as_one_process_accumulating_their_batches(kg, featured, tmp_path, nproc):
    start = time.monotonic()
    ddp, replay = copy_of(kg, tmp_path / "ddp.gs"), copy_of(kg, tmp_path / "replay.gs")
    features = copy_of(featured, tmp_path / "featured.gs")
    done = torchrun(nproc, HERE / "lp_worker.py", ddp, replay, features, tmp_path / "out", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {}
    for rank in range(nproc):
        results.update(json.loads((tmp_path / "out" / f"rank{rank}.json").read_text())["results"])
    assert set(results) == {"minibatch", "disk", "minibatch-sage", "disk-sage", "features-minibatch-sage",
                            "features-disk-sage"}
    for case, r in results.items():
        assert r["param_diff"] < 1e-10, (case, r)
        assert r["param_moved"] > 1e-3, case  # the weights did train
        assert r["losses"][1] < r["losses"][0], case
        if case.startswith("features"):  # no embeddings: COMET's states in blocks, one per rank
            assert r["table_diff"] is None and r["placement"] is None
            assert r["policy"] == ("comet" if "disk" in case else "in_memory") and r["rounds"] == 1
            continue
        assert r["table_diff"] < 1e-10, (case, r)
        assert r["table_moved"] > 1e-3, case  # the embeddings did train
        assert r["placement"] == ("replicated" if case.startswith("minibatch") else "owned")
        if case.startswith("disk"):
            assert r["policy"] == "disjoint" and r["rounds"] > 1
    # Three ranks share a round's four partition pairs unevenly: some rank pads (and the
    # padding steps matched the others' steps).
    assert nproc == 2 or any(len(set(ranks)) > 1 for r in results.values() for epoch in r["batches_per_round"]
               for ranks in zip(*epoch))
    print(f"link data-parallel exactness, {nproc} ranks, 6 cases x 2 epochs: {time.monotonic() - start:.1f} s; "
          + ", ".join(f"{c} {r['param_diff']:.1e}/{r['table_diff']}" for c, r in results.items()))


def test_a_raising_rank_stops_the_others_with_its_error(kg, tmp_path):
    timeout_s = 60.0
    start = time.monotonic()
    done = torchrun(2, HERE / "lp_failing_worker.py", "raise", copy_of(kg, tmp_path / "kg.gs"), timeout_s,
                    timeout=timeout_s)
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert "rank 1: ValueError: boom on rank 1 in step 3: the others must stop" in done.stderr
    assert elapsed < timeout_s / 2, f"the job took {elapsed:.0f} s: rank 0 waited for the group's timeout"


def test_ranks_on_copies_of_the_store_are_refused(kg, tmp_path):
    """Each rank on its own copy: refused even when the copies hold the same table (rank 1's
    copy gets the very values rank 0 initialises, earlier)."""
    for rank in range(2):
        copy_of(kg, tmp_path / f"kg-{rank}.gs")
    with graphstore.open(tmp_path / "kg-1.gs", mode="r+") as store:
        EmbeddingTable.create(store, 8, seed=1)
    done = torchrun(2, HERE / "lp_failing_worker.py", "copies", tmp_path / "kg.gs", 60, timeout=60)
    assert done.returncode != 0
    assert "see other embedding files than rank 0" in done.stderr and "shared filesystem" in done.stderr, \
        done.stderr[-2000:]
    shutil.rmtree(tmp_path / "kg-1.gs" / "embeddings")  # a copy without the table: refused as well
    done = torchrun(2, HERE / "lp_failing_worker.py", "copies", tmp_path / "kg.gs", 60, timeout=60)
    assert done.returncode != 0 and "on a shared filesystem" in done.stderr, done.stderr[-2000:]


def lp_trainer(store: Path, out: Path, *extra) -> subprocess.CompletedProcess:
    return torchrun(2, REPO / "trainers" / "link_prediction.py", "--store", store, "--scheme", "disk",
                    "--embedding-dim", "16", "--negatives", "32", "--num-chunks", "4", "--batch-size", "128",
                    "--lr", "0.1", "--seed", "2", *extra, timeout=180)


def test_the_link_trainer_runs_and_resumes_exactly_under_torchrun(kg, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    stores = {d: copy_of(kg, tmp_path / f"{d.name}.gs") for d in (straight, split)}
    done = lp_trainer(stores[straight], straight, "--epochs", "3", "--checkpoint-dir", straight,
                      "--metrics-out", straight / "m.json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("\nepoch ") + done.stdout.startswith("epoch ") == 3  # rank 0 alone prints
    assert "(2 ranks, DistributedDataParallel)" in done.stdout and "learnable embeddings (owned)" in done.stdout
    m = json.loads((straight / "m.json").read_text())
    assert m["config"]["world_size"] == 2
    loader = m["config"]["loader"]
    assert (loader["policy"], loader["embedding_placement"], loader["world_size"]) == ("disjoint", "owned", 2)
    with graphstore.open(kg) as store:
        assert all(e["train_edges"] == store.num_edges for e in m["epochs"])  # both ranks' edges together
        random_mrr = sum(1 / r for r in range(1, store.num_nodes + 1)) / store.num_nodes
    losses = [e["train_loss"] for e in m["epochs"]]
    assert losses[-1] < losses[0] and m["final"]["test"]["mrr"] > 3 * random_mrr
    assert all(e["io"]["bytes_written"] > 0 for e in m["epochs"])  # rank 0's rounds wrote its partitions
    # The ranks' split evaluation is one process's: the checkpoint's model and the stored table,
    # evaluated here whole.
    args = lp.LinkPredictionOptions.parse(["--store", str(stores[straight]), "--scheme", "disk",
                                           "--embedding-dim", "16", "--seed", "2"])
    with graphstore.open(stores[straight], mode="r+") as store:
        args, _ = lp.resolve_defaults(args, store)
        trainer = lp.Trainer(args, lp.resolve_config(args, store), store, torch.device("cpu"),
                             table=EmbeddingTable.open(store))
        trainer.model.load_state_dict(torch.load(straight / "epoch-0002" / "state.pt", weights_only=False)["model"])
        reps = trainer.representations()
        assert trainer.evaluate(reps, "test") == m["final"]["test"]
        assert trainer.evaluate(reps, "valid") == m["final"]["valid"]

    # Resumed after epoch 1 (another run's embeddings in the store meanwhile): the same run.
    assert lp_trainer(stores[split], split, "--epochs", "1", "--checkpoint-dir", split).returncode == 0
    assert lp_trainer(stores[split], tmp_path / "other", "--epochs", "1", "--seed", "9").returncode == 0
    done = lp_trainer(stores[split], split, "--epochs", "3", "--checkpoint-dir", split, "--resume",
                      "--metrics-out", split / "m.json")
    assert done.returncode == 0, done.stderr[-3000:]
    b = json.loads((split / "m.json").read_text())
    assert b["resumed_from"] == 0
    assert [e["train_loss"] for e in m["epochs"]] == [e["train_loss"] for e in b["epochs"]]
    assert m["final"] == b["final"]
    tables = []
    for d in (straight, split):
        with graphstore.open(stores[d]) as store:
            tables.append(EmbeddingTable.open(store).read_all())
    assert (tables[0] == tables[1]).all()


def test_more_ranks_than_partition_pairs_still_train_every_edge(tmp_path):
    """Two partitions, three ranks: the disjoint plan has one state, so two ranks only take
    part in its steps (padding), and every edge still trains once."""
    write_clustered_kg(tmp_path / "src", num_nodes=60, num_triples=400)
    store = tmp_path / "kg2.gs"
    graphstore.convert(tmp_path / "src", store, num_partitions=2, partitioner="random")
    out = tmp_path / "m.json"
    done = torchrun(3, REPO / "trainers" / "link_prediction.py", "--store", store, "--scheme", "disk",
                    "--embedding-dim", "8", "--negatives", "8", "--batch-size", "32", "--epochs", "2",
                    "--metrics-out", out, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    m = json.loads(out.read_text())
    with graphstore.open(store) as s:
        assert all(e["train_edges"] == s.num_edges for e in m["epochs"])
    assert m["config"]["loader"]["policy"] == "disjoint" and m["final"]["test"]["mrr"] > 0
