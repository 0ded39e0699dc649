"""BatchGNN's distributed feature fetch (`--feature-placement partitioned`) under torchrun,
gloo on loopback: each rank holds only its block of partitions' rows, a macro-batch round's
union comes from the owners in one collective round, the batches' features are the store's,
two ranks train to the parameters of the same run reading the store and of one process
replaying their batches (float64, to 1e-10), and the collective rounds are the macro-batch
rounds (B = all: one per epoch; B = 1: one per mini-batch), padded to equal counts; a
``macro_batch_bytes`` smaller than a macro-batch's union splits it into several collective
rounds and changes nothing in training.
"""

from __future__ import annotations

import json
import time

import pytest

import graphstore
from graphstore.distributed import PartitionedFetch
from graphstore.errors import ConfigError
from graphstore.loaders import NodeLoader
from graphstore.loaders.macro import FeatureFetch
from tests.distributed.launch import torchrun
from tests.distributed.test_data_parallel import HERE, cora, trainer  # noqa: F401 (cora: the fixture)


def test_two_ranks_fetch_from_the_owners_and_train_as_one_process(cora, tmp_path):  # noqa: F811
    start = time.monotonic()
    done = torchrun(2, HERE / "fetch_worker.py", cora, tmp_path, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # Each rank held its block of rows only; the blocks together are the graph.
    assert sum(r["results"]["fetch-B1"]["rows_held"] for r in ranks) == ranks[0]["num_nodes"]
    assert all(0 < r["results"]["fetch-B1"]["rows_held"] < r["num_nodes"] for r in ranks)
    replayed = {}
    for record in ranks:
        for case, r in record["results"].items():
            # (a) features: the store's rows, bit for bit, in every batch of this rank.
            assert r["features_max_abs_diff"] == 0.0 and r["batches_checked"] == r["epochs"][0]["batches"]
            # (b) training: as the same run reading the store, and as the replay.
            assert r["vs_store_max_abs_diff"] < 1e-10, (case, r)
            assert r["moved"] > 1e-3 and r["epochs"][1]["loss"] < r["epochs"][0]["loss"], case
            if "replay_max_abs_diff" in r:
                replayed[case] = r
            for e in r["epochs"]:
                s = e["stats"]
                # (c) one collective round per macro-batch round: B = all one, B = 1 one per batch.
                assert s["exchanges"] == s["rounds"] == (1 if case == "fetch-Ball" else e["batches"]), (case, s)
                assert s["rows_remote"] > 0 and s["rows_local"] > 0, (case, s)
                assert s["rows_local"] + s["rows_remote"] == s["rows_union"] == s["rows_fetched"]
                assert s["bytes_read"] == 0 and s["bytes_sent"] > 0  # nothing read from the store in an epoch
    assert set(replayed) == {"fetch-B1", "fetch-Ball"}
    for case, r in replayed.items():
        assert r["replay_max_abs_diff"] < 1e-10, (case, r)
        if case == "fetch-B1":  # every N-th batch: uneven shares, padded
            assert any(len(set(counts)) > 1 for counts in r["batches_per_rank"])
    for case in ("fetch-B1", "fetch-Ball"):
        for epoch in range(2):
            stats = [r["results"][case]["epochs"][epoch]["stats"] for r in ranks]
            # The same number of collectives on both ranks: the one with fewer rounds padded.
            assert len({s["exchanges"] + s["padding_exchanges"] for s in stats}) == 1, stats
    b1, ball = (sum(r["results"][c]["epochs"][0]["stats"]["rows_remote"] for r in ranks)
                for c in ("fetch-B1", "fetch-Ball"))
    assert ball < b1  # the union of all batches fetches each remote row once
    print(f"distributed fetch, 2 ranks: {time.monotonic() - start:.1f} s; remote rows B=1 {b1}, B=all {ball}; "
          + ", ".join(f"{c} replay {r['replay_max_abs_diff']:.1e}" for c, r in replayed.items()))


def test_a_byte_cap_splits_the_union_into_rounds_and_trains_the_same(cora, tmp_path):  # noqa: F811
    done = torchrun(2, HERE / "fetch_worker.py", cora, tmp_path, "fetch-split", "fetch-Ball", timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    cap = ranks[0]["split_bytes"]  # fetch_worker.SPLIT_BYTES (not imported: it edits dp_worker.CASES)
    split = [r["results"]["fetch-split"] for r in ranks]
    unsplit = [r["results"]["fetch-Ball"] for r in ranks]
    for r, whole in zip(split, unsplit, strict=True):
        assert r["features_max_abs_diff"] == 0.0 and r["batches_checked"] == r["epochs"][0]["batches"]
        # Training: bit for bit the unsplit run (the same samples, the same rows), and the
        # run reading the store.
        assert r["vs_unsplit_max_abs_diff"] == 0.0 and r["vs_store_max_abs_diff"] < 1e-10, r
        assert r["moved"] > 1e-3 and r["epochs"][1]["loss"] < r["epochs"][0]["loss"]
        for e, w in zip(r["epochs"], whole["epochs"], strict=True):
            s, u = e["stats"], w["stats"]
            assert e["loss"] == w["loss"] and e["batches"] == w["batches"]
            # One macro-batch (the cap never cut the samples short), its union in several
            # collective rounds, each round one exchange; each round's union under the cap.
            assert s["macro_batches"] == u["macro_batches"] == u["rounds"] == u["exchanges"] == 1, (s, u)
            assert s["exchanges"] == s["rounds"] > s["macro_batches"], s
            assert s["rows_union"] <= s["rounds"] * cap // (4 * ranks[0]["feature_dim"])
            # Rounds re-fetch rows their neighbours also need: at least the one union's rows.
            assert s["rows_union"] >= u["rows_union"] and s["rows_requested"] == u["rows_requested"]
            assert s["rows_local"] + s["rows_remote"] == s["rows_union"] == s["rows_fetched"]
            assert s["rows_remote"] > 0 and s["bytes_read"] == 0
    # One process replaying the ranks' batches (rank 0 replayed the split case).
    replayed = split[0]
    assert replayed["replay_max_abs_diff"] < 1e-10, replayed
    for epoch in range(2):
        stats = [r["epochs"][epoch]["stats"] for r in split]
        assert len({s["exchanges"] + s["padding_exchanges"] for s in stats}) == 1, stats
    rounds = [[r["epochs"][e]["stats"]["rounds"] for r in split] for e in range(2)]
    print(f"byte cap {cap:,}: rounds per rank {rounds}, replay {replayed['replay_max_abs_diff']:.1e}")


def test_the_fetch_is_injected_only_where_it_can_run(cora):  # noqa: F811
    with graphstore.open(cora) as store:
        kw = {"split": "train", "fanouts": (3, 3), "batch_size": 16, "seed": 1}
        plain = NodeLoader(store, scheme="macrobatch", macro_batches=2, **kw)
        # Any object with FeatureFetch's interface is the loader's fetch: the store's own, here.
        injected = NodeLoader(store, scheme="macrobatch", macro_batches=2, feature_fetch=FeatureFetch(store), **kw)
        for a, b in zip(plain.epoch(0), injected.epoch(0), strict=True):
            assert (a.features == b.features).all() and (a.store_ids == b.store_ids).all()
        assert injected.fetch_stats.rows_fetched == plain.fetch_stats.rows_fetched > 0
        with pytest.raises(ConfigError, match="feature_fetch are for"):
            NodeLoader(store, scheme="minibatch", feature_fetch=FeatureFetch(store), **kw)
        with pytest.raises(ConfigError, match="prefetch thread"):
            NodeLoader(store, scheme="macrobatch", prefetch=False, feature_fetch=FeatureFetch(store), **kw)
        with pytest.raises(ConfigError, match="width"):
            NodeLoader(store, scheme="macrobatch", feature_fetch=type("F", (), {"dim": 3})(), **kw)
        with pytest.raises(ConfigError, match="torchrun"):
            PartitionedFetch(store)  # no process group


def test_the_trainer_fetches_from_the_owners_as_it_reads_the_store(cora, tmp_path):  # noqa: F811
    runs = {}
    for placement in ("store", "partitioned"):
        out = tmp_path / f"{placement}.json"
        done = trainer(cora, out, "macrobatch", "--epochs", "2", "--macro-batches", "all", "--feature-placement",
                       placement, "--metrics-out", out)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[placement] = json.loads(out.read_text())
    store, parted = runs["store"], runs["partitioned"]
    assert parted["config"]["feature_placement"] == "partitioned" and "feature_placement" not in store["config"]
    # Training and evaluation (macrobatch too, through the same fetch) saw the same rows.
    assert [e["train_loss"] for e in parted["epochs"]] == [e["train_loss"] for e in store["epochs"]]
    assert parted["final"] == store["final"] and parted["final"]["test"]["acc"] > 0.5
    fetched = parted["epochs"][-1]["macro_batching"]  # rank 0's counters
    assert fetched["rows_remote"] > 0 and fetched["exchanges"] == fetched["rounds"] == 1
    assert fetched["bytes_read"] == 0 and store["epochs"][-1]["macro_batching"]["bytes_read"] > 0


@pytest.mark.parametrize("values, needle", [
    ({"feature_placement": "partitioned"}, "--feature-placement partitioned is for --scheme macrobatch"),
    ({"feature_placement": "partitioned", "scheme": "macrobatch", "prefetch": False}, "drop --no-prefetch"),
])
def test_the_placement_flag_is_checked(values, needle):
    from trainers.node_classification import NodeClassificationOptions

    with pytest.raises(ConfigError, match=needle):
        NodeClassificationOptions.from_dict({"store": "s", **values}, source="run.json")
