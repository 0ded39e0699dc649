"""End to end: trainers/link_prediction.py on a small clustered knowledge graph (4
partitions): learnable embeddings through the disk scheme's COMET buffer, filtered MRR
above the random baseline, exact resume with the embeddings restored, encoders."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import graphstore
from graphstore.errors import ConfigError
from graphstore.layout.embeddings import EmbeddingTable
from graphstore.loaders import EdgeLoader
from trainers import common
from trainers import link_prediction as lp

FAST = ["--embedding-dim", 16, "--negatives", 32, "--num-chunks", 4, "--batch-size", 256, "--lr", 0.1,
        "--buffer-partitions", 2]  # out of core whatever the memory (the disk scheme)


def run(argv) -> int:
    return common.run(lp.PROG, lp.main, [str(a) for a in argv])


def random_mrr(num_nodes: int) -> float:
    """Expected MRR of a uniformly random ranking among ``num_nodes`` candidates."""
    return sum(1 / r for r in range(1, num_nodes + 1)) / num_nodes


def test_disk_comet_learns_embeddings_in_the_store(fresh_kg, tmp_path, capsys):
    out = tmp_path / "m.json"
    assert run(["--store", fresh_kg, "--scheme", "disk", "--policy", "comet", "--epochs", 5,
                "--metrics-out", out, *FAST]) == 0
    m = json.loads(out.read_text())
    loader = m["config"]["loader"]
    assert (loader["policy"], loader["capacity"], loader["num_logical_partitions"]) == ("comet", 2, 4)
    assert loader["spread_buckets"] is True  # the default out of core, recorded
    assert m["config"]["learnable_embeddings"] and m["config"]["eval"] == "filtered"
    assert {"mrr", "hits@1", "hits@3", "hits@10"} <= set(m["final"]["test"])
    for e in m["epochs"]:  # every epoch writes its updated embeddings back
        assert e["io"]["bytes_written"] > 0 and "stall_s" in e["io"]
    # Double buffering gives COMET (2 logical partitions of 2, swapped one at a time) 4 slots:
    # here the whole graph, so once read it stays; the first epoch must read it.
    assert m["epochs"][0]["io"]["bytes_read"] > 0
    losses = [e["train_loss"] for e in m["epochs"]]
    assert losses[-1] < losses[0]
    store = graphstore.open(fresh_kg)
    trained = EmbeddingTable.open(store).read_all()
    # What the run started from: the seeded initialisation, reproduced on a copy.
    init = np.concatenate([np.random.default_rng([0, k]).standard_normal(
        (stop - start, 16), dtype=np.float32) * np.float32(1e-3)
        for k in range(store.num_partitions) for start, stop in [store.partition_range(k)]])
    assert np.abs(trained[:, 0] - init).mean() > 10 * np.abs(init).mean()
    assert (trained[:, 1] > 0).all(axis=1).mean() > 0.9  # Adagrad state of (almost) every row
    assert m["final"]["test"]["mrr"] > 3 * random_mrr(store.num_nodes)
    assert "logical partitions 4" in capsys.readouterr().out


# An RGCN samples through the buffer: its batches must not depend on the slots earlier
# epochs left (under COMET here they differ between a straight and a resumed run; an RGCN
# sampling in local-id order diverged after the resume).
ENCODED = ["--encoder", "rgcn", "--model", "complex", "--fanouts", "5,5"]


@pytest.mark.parametrize("policy, encoder", [("beta", []), ("comet", ENCODED)], ids=["embeddings", "rgcn"])
def test_resume_restores_the_embeddings_exactly(kg_store, tmp_path, policy, encoder):
    import shutil

    stores = {}
    for name in ("straight", "split"):
        stores[name] = tmp_path / f"{name}.gs"
        shutil.copytree(kg_store, stores[name])
    # Every epoch evaluated: the default rhythm follows the clock, which two runs do not share.
    args = ["--scheme", "disk", "--policy", policy, *encoder, *FAST, "--eval-every", 1]
    a, b = tmp_path / "a", tmp_path / "b"
    assert run(["--store", stores["straight"], *args, "--epochs", 3, "--checkpoint-dir", a,
                "--metrics-out", a / "m.json"]) == 0
    assert run(["--store", stores["split"], *args, "--epochs", 1, "--checkpoint-dir", b]) == 0
    # Another run's embeddings in the store (as after training past the checkpoint and
    # crashing) must not leak into the resumed run: the checkpoint's copy is restored.
    assert run(["--store", stores["split"], *args, "--epochs", 1, "--seed", 9]) == 0
    assert run(["--store", stores["split"], *args, "--epochs", 3, "--checkpoint-dir", b, "--resume",
                "--metrics-out", b / "m.json"]) == 0
    ma, mb = json.loads((a / "m.json").read_text()), json.loads((b / "m.json").read_text())
    assert ma["final"] == mb["final"]
    assert [e["train_loss"] for e in ma["epochs"]] == [e["train_loss"] for e in mb["epochs"]]
    ea = EmbeddingTable.open(graphstore.open(stores["straight"])).read_all()
    eb = EmbeddingTable.open(graphstore.open(stores["split"])).read_all()
    assert np.array_equal(ea, eb)
    sa = torch.load(a / "epoch-0002" / "state.pt", weights_only=False)["model"]
    sb = torch.load(b / "epoch-0002" / "state.pt", weights_only=False)["model"]
    assert all(torch.equal(v, sb[k]) for k, v in sa.items())


@pytest.mark.parametrize("encoder, model, lr", [("sage", "distmult", 0.01), ("rgcn", "complex", 0.05),
                                                ("gat", "transe", 0.01)])
def test_encoders_train_and_evaluate(fresh_kg, tmp_path, encoder, model, lr):
    out = tmp_path / "m.json"
    assert run(["--store", fresh_kg, "--encoder", encoder, "--model", model, "--fanouts", "5,5",
                "--epochs", 4, "--optimizer", "adam", "--metrics-out", out, *FAST[:-2], "--lr", lr]) == 0
    m = json.loads(out.read_text())
    assert m["config"]["encoder"] == encoder and m["config"]["loader"]["fanouts"] == [5, 5]
    losses = [e["train_loss"] for e in m["epochs"]]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < 0.95 * losses[0]
    # Learned, not merely finite: 4 epochs reach 2-6x a random ranking's MRR on this graph.
    assert m["final"]["valid"]["mrr"] > 1.5 * random_mrr(graphstore.open(fresh_kg).num_nodes)


def test_unfiltered_is_not_above_filtered(fresh_kg, tmp_path):
    outs = {}
    for mode in ("filtered", "unfiltered"):
        outs[mode] = tmp_path / f"{mode}.json"
        argv = ["--store", fresh_kg, "--epochs", 1, "--eval", mode, "--metrics-out", outs[mode], *FAST]
        assert run(argv) == 0
    f, u = (json.loads(outs[k].read_text())["final"]["test"]["mrr"] for k in ("filtered", "unfiltered"))
    # Strictly: training edges outrank some test positives, and only the filter removes them.
    assert u < f


def test_store_without_edge_splits_is_one_line(cora_store, capsys):
    assert run(["--store", cora_store, "--epochs", 1]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a 'valid' edge split" in err


def test_ogb_eval_needs_shipped_negatives(fresh_kg, capsys):
    assert run(["--store", fresh_kg, "--epochs", 1, "--eval", "ogb", *FAST]) == 1
    assert "ships no negative edge pairs" in capsys.readouterr().err


def write_clustered_ogbl(root, *, num_nodes: int = 120, num_clusters: int = 4, seed: int = 0) -> None:
    """An ogbl-ddi-like raw directory (undirected, no features, shipped negatives): edges
    inside clusters, valid/test negatives across clusters, so a trained model ranks
    positives above the negatives while a random one does not."""
    import gzip

    rng = np.random.default_rng(seed)
    cluster = np.arange(num_nodes) % num_clusters
    pairs = np.array([(u, v) for u in range(num_nodes) for v in range(u + 1, num_nodes)
                      if cluster[u] == cluster[v] and rng.random() < 0.5])
    pairs = pairs[rng.permutation(len(pairs))]
    n_eval = len(pairs) // 10
    parts = {"valid": pairs[:n_eval], "test": pairs[n_eval:2 * n_eval], "train": pairs[2 * n_eval:]}
    cross = np.array([(u, v) for u in range(num_nodes) for v in range(u + 1, num_nodes)
                      if cluster[u] != cluster[v]])
    raw = root / "raw"
    raw.mkdir(parents=True)
    for name, text in {"edge.csv.gz": "".join(f"{u},{v}\n" for u, v in parts["train"]),
                       "num-node-list.csv.gz": f"{num_nodes}\n",
                       "num-edge-list.csv.gz": f"{len(parts['train'])}\n"}.items():
        with gzip.open(raw / name, "wt") as fh:
            fh.write(text)
    split = root / "split" / "target"
    split.mkdir(parents=True)
    torch.save({"edge": torch.from_numpy(parts["train"])}, split / "train.pt")
    for name in ("valid", "test"):
        neg = cross[rng.choice(len(cross), 300, replace=False)]
        torch.save({"edge": torch.from_numpy(parts[name]), "edge_neg": torch.from_numpy(neg)}, split / f"{name}.pt")


def test_ogb_style_sage_with_mlp_decoder_and_one_negative_per_positive(tmp_path):
    """OGB's ogbl-ddi recipe: full-neighbourhood SAGE over learnable embeddings, the MLP
    link predictor on h_i * h_j, one negative of its own per positive (destination only),
    logistic loss, Hits@K on the shipped negatives."""
    write_clustered_ogbl(tmp_path / "ogbl_toy")
    store = tmp_path / "toy.gs"
    graphstore.convert(tmp_path / "ogbl_toy", store, num_partitions=2, partitioner="random")
    out = tmp_path / "m.json"
    assert run(["--store", store, "--model", "mlp", "--encoder", "sage", "--fanouts=-1,-1",
                "--embedding-dim", 16, "--hidden", 16, "--embedding-scale", 0.3, "--dropout", 0.1,
                "--negatives", 1, "--num-chunks", 256, "--batch-size", 256, "--degree-fraction", 0,
                "--corrupt", "dst", "--loss", "logistic", "--optimizer", "adam", "--lr", 0.01,
                "--embedding-lr", 0.05, "--epochs", 15, "--eval-every", 15, "--metrics-out", out]) == 0
    m = json.loads(out.read_text())
    assert m["config"]["eval"] == "ogb" and m["config"]["corrupt"] == "dst"
    assert m["config"]["loader"]["negatives"] == 1 and m["config"]["loader"]["fanouts"] == [-1, -1]
    losses = [e["train_loss"] for e in m["epochs"]]
    # logistic loss with one negative: 2 ln 2 at chance; it must fall well below
    assert losses[0] > 1.0 and losses[-1] < 0.8 * losses[0]
    # 300 shipped negatives: a random scorer puts about 20/300 of positives above the 20th
    assert m["final"]["valid"]["hits@20"] > 0.5 and m["final"]["test"]["hits@20"] > 0.5
    state = lp.LinkPredictionOptions.parse(["--model", "mlp", "--store", "x"])
    assert (state.decoder_layers, state.corrupt) == (3, "both")


@pytest.mark.parametrize("model", ["distmult", "mlp", "transe"])
@pytest.mark.parametrize("corrupt", ["both", "dst"])
@pytest.mark.parametrize("num_chunks", [6, 2])
def test_pairwise_loss_equals_the_chunked_loss(model, corrupt, num_chunks):
    """One chunk per positive takes the pairwise path; it must give the decoder's loss."""
    from graphstore.nn import DECODERS

    torch.manual_seed(0)
    dec = DECODERS[model](8, num_relations=3).double()
    with torch.no_grad():
        dec.relations.normal_()
    s, o = torch.randn(6, 8, dtype=torch.float64), torch.randn(6, 8, dtype=torch.float64)
    rel = torch.tensor([0, 1, 2, 0, 1, 2])
    n = torch.randn(num_chunks, 3, 8, dtype=torch.float64)
    chunk_of = torch.arange(6) * num_chunks // 6
    for kind in ("softmax", "logistic", "margin"):
        got = lp.link_prediction_loss(dec, s, rel, o, n, chunk_of, corrupt=corrupt, kind=kind)
        want = dec.loss(s, rel, o, chunk_of=chunk_of, neg_dst=n, neg_src=n if corrupt == "both" else None,
                        kind=kind)
        torch.testing.assert_close(got, want)
    if corrupt == "both":  # the source side counts: dst-only is a different number
        dst_only = lp.link_prediction_loss(dec, s, rel, o, n, chunk_of, corrupt="dst", kind="margin")
        assert not torch.allclose(dst_only, want)  # want: both ends, margin


def test_embedding_adam_learns_resumes_exactly_and_is_minibatch_only(kg_store, tmp_path, capsys):
    import shutil

    stores = {}
    for name in ("straight", "split", "adagrad"):
        stores[name] = tmp_path / f"{name}.gs"
        shutil.copytree(kg_store, stores[name])
    args = [*FAST[:-2], "--lr", 0.01, "--embedding-lr", 0.01]
    adam = ["--embedding-optimizer", "adam"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert run(["--store", stores["straight"], *args, *adam, "--epochs", 3, "--checkpoint-dir", a,
                "--metrics-out", a / "m.json"]) == 0
    assert run(["--store", stores["split"], *args, *adam, "--epochs", 1, "--checkpoint-dir", b]) == 0
    assert run(["--store", stores["split"], *args, *adam, "--epochs", 3, "--checkpoint-dir", b, "--resume",
                "--metrics-out", b / "m.json"]) == 0
    assert run(["--store", stores["adagrad"], *args, "--epochs", 3]) == 0
    ma, mb = json.loads((a / "m.json").read_text()), json.loads((b / "m.json").read_text())
    assert ma["final"] == mb["final"] and ma["config"]["embedding_optimizer"] == "adam"
    e = {k: EmbeddingTable.open(graphstore.open(v)).read_all() for k, v in stores.items()}
    assert np.array_equal(e["straight"], e["split"])       # the first moment came back with the checkpoint
    assert not np.allclose(e["straight"][:, 0], e["adagrad"][:, 0])
    # Adam's second moment is an average of g*g (below max g*g), Adagrad's a growing sum.
    assert e["straight"][:, 1].max() < e["adagrad"][:, 1].max()
    assert ma["final"]["test"]["mrr"] > 3 * random_mrr(graphstore.open(kg_store).num_nodes)
    assert run(["--store", stores["adagrad"], *args, *adam, "--scheme", "disk", "--epochs", 1]) == 1
    assert "minibatch scheme only" in capsys.readouterr().err


def test_pair_corruption_scores_random_edges():
    from graphstore.nn import DECODERS, link_loss

    torch.manual_seed(0)
    dec = DECODERS["distmult"](4, num_relations=2)
    with torch.no_grad():
        dec.relations.normal_()
    s, o, rel = torch.randn(4, 4), torch.randn(4, 4), torch.tensor([0, 1, 1, 0])
    n = torch.randn(2, 4, 4)                       # 2 chunks of 4 negatives: 2 random edges each
    chunk_of = torch.tensor([0, 0, 1, 1])
    got = lp.link_prediction_loss(dec, s, rel, o, n, chunk_of, corrupt="pair", kind="logistic")
    per = n[chunk_of]
    neg = torch.stack([(per[:, 0] * dec.relations[rel] * per[:, 1]).sum(1),
                       (per[:, 2] * dec.relations[rel] * per[:, 3]).sum(1)], 1)
    torch.testing.assert_close(got, link_loss((s * dec.relations[rel] * o).sum(1), neg, kind="logistic"))
    # the positives' own ends are not in the negatives: changing them moves only the positive term
    assert not torch.allclose(got, lp.link_prediction_loss(dec, s, rel, o, n, chunk_of, corrupt="dst",
                                                           kind="logistic"))
    with pytest.raises(ConfigError, match="even"):
        lp.link_prediction_loss(dec, s, rel, o, n[:, :3], chunk_of, corrupt="pair")


@pytest.mark.parametrize("encoder", ["sage", "rgcn"])
def test_exact_encoder_evaluation_ranks_as_the_in_memory_one(fresh_kg, tmp_path, encoder):
    """--eval-encoder exact (every node's representation layer by layer from the store, two
    partitions resident) ranks as the whole-graph encoder in memory does. One torch thread:
    link prediction with an encoder replays bit for bit only then (docs/benchmarks.md)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        base = ["--store", fresh_kg, "--encoder", encoder, "--fanouts", "5,5", "--epochs", 1, "--scheme", "disk",
                "--buffer-partitions", 2, *FAST]
        for mode in ("exact", "memory"):
            assert run([*base, "--eval-encoder", mode, "--metrics-out", tmp_path / f"{mode}.json"]) == 0
    finally:
        torch.set_num_threads(threads)
    exact, memory = (json.loads((tmp_path / f"{m}.json").read_text()) for m in ("exact", "memory"))
    assert exact["epochs"][0]["train_loss"] == memory["epochs"][0]["train_loss"]
    for split in ("valid", "test"):
        for metric, value in memory["final"][split].items():
            assert abs(exact["final"][split][metric] - value) < 1e-6, (split, metric)


# ---------------------------------------------------------------------- defaults and selection

# A learning rate high enough that validation MRR peaks early on the toy graph and patience stops.
OVERSHOOT = ["--batch-size", 256, "--lr", 0.5, "--embedding-dim", 16, "--eval-every", 1]  # every epoch: not by the clock


def test_patience_restores_the_best_validation_model_into_the_store(kg_store, tmp_path):
    import shutil

    stores = {name: tmp_path / f"{name}.gs" for name in ("patient", "short")}
    for path in stores.values():
        shutil.copytree(kg_store, path)
    out = tmp_path / "m.json"
    assert run(["--store", stores["patient"], *OVERSHOOT, "--epochs", 30, "--patience", 3, "--metrics-out", out]) == 0
    m = json.loads(out.read_text())
    best, trained = m["final"]["epoch"], len(m["epochs"])
    assert m["stopped_early"] == trained - 1 == best + 3 < 29  # stopped by patience, not by --epochs
    assert all("test" not in e for e in m["epochs"])  # training shows validation only
    assert m["final"] == m["best"] and m["final"]["selection"].startswith(f"best validation mrr: epoch {best + 1}")
    # The restored model scores on validation exactly what it scored when it was evaluated.
    assert m["final"]["valid"] == m["epochs"][best]["valid"]
    # And the store holds that model's embeddings: those of a run that stopped at that epoch.
    short = tmp_path / "short.json"
    assert run(["--store", stores["short"], *OVERSHOOT, "--epochs", best + 1, "--patience", 0,
                "--metrics-out", short]) == 0
    assert json.loads(short.read_text())["final"] == {**m["final"], "selection": f"best validation mrr: epoch "
                                                      f"{best + 1} of {best + 1} trained"}
    values = [EmbeddingTable.open(graphstore.open(stores[k])).read_all()[:, 0] for k in ("patient", "short")]
    assert np.array_equal(*values)


def test_resume_keeps_the_best_model_for_the_end(kg_store, tmp_path):
    import shutil

    stores = {name: tmp_path / f"{name}.gs" for name in ("straight", "split")}
    for path in stores.values():
        shutil.copytree(kg_store, path)
    args = [*OVERSHOOT, "--patience", 0, "--epochs", 7]
    a, b = tmp_path / "a", tmp_path / "b"
    assert run(["--store", stores["straight"], *args, "--metrics-out", a / "m.json"]) == 0
    ma = json.loads((a / "m.json").read_text())
    assert ma["final"]["epoch"] < 4  # the best epoch is before the interruption's last epoch below
    assert run(["--store", stores["split"], *args[:-1], 5, "--checkpoint-dir", b]) == 0
    assert run(["--store", stores["split"], *args, "--checkpoint-dir", b, "--resume", "--metrics-out", b / "m.json"]) == 0
    assert json.loads((b / "m.json").read_text())["final"] == ma["final"]
    values = [EmbeddingTable.open(graphstore.open(stores[k])).read_all()[:, 0] for k in ("straight", "split")]
    assert np.array_equal(*values)


def test_defaults_come_from_the_kind_of_graph_and_the_memory(kg_store, tmp_path, monkeypatch):
    write_clustered_ogbl(tmp_path / "ogbl_toy")
    plain = tmp_path / "toy.gs"
    graphstore.convert(tmp_path / "ogbl_toy", plain, num_partitions=2, partitioner="random")

    def resolved(store):
        args = lp.LinkPredictionOptions.parse(["--store", str(store)])
        with graphstore.open(store) as s:
            return lp.resolve_defaults(args, s)

    kg, rules = resolved(kg_store)  # 3 relation types, 240 entities: negatives capped at the entities
    assert (kg.embedding_dim, kg.negatives, kg.num_chunks, kg.degree_fraction, kg.regularization) == (
        400, 240, 1, 0.0, 0.1)
    assert "knowledge graph (3 relation types)" in rules["negatives"]
    other, rules = resolved(plain)  # no relation types: MariusGNN's setting
    assert (other.embedding_dim, other.negatives, other.num_chunks, other.degree_fraction,
            other.regularization) == (100, 256, 8, 0.5, 0.0)
    assert "MariusGNN" in rules["negatives"]
    # A wide table that would take more than a quarter of the memory budget is narrowed.
    monkeypatch.setenv("GRAPHSTORE_MEMORY_BYTES", str(2 * 240 * 400 * 8 * 4 - 1))
    narrow, rules = resolved(kg_store)
    assert narrow.embedding_dim == 100 and "do not fit" in rules["embedding_dim"]
    monkeypatch.delenv("GRAPHSTORE_MEMORY_BYTES")
    # A given --buffer-bytes is the run's budget: a d=400 table (240 x 400 values and Adagrad
    # state, 768,000 bytes) is sized against it, not against the machine's memory.
    for given, dim in ((4 * 768_000 - 1, 100), (4 * 768_000, 400)):
        args = lp.LinkPredictionOptions.parse(["--store", str(kg_store), "--buffer-bytes", str(given)])
        with graphstore.open(kg_store) as s:
            sized, rules = lp.resolve_defaults(args, s)
        assert sized.embedding_dim == dim and "(2.9 MiB)" in rules["embedding_dim"], rules["embedding_dim"]
    # Given flags win, and the choice is recorded with its rule in the metrics.
    out = tmp_path / "m.json"
    assert run(["--store", plain, "--epochs", 1, "--negatives", 16, "--metrics-out", out]) == 0
    config = json.loads(out.read_text())["config"]
    assert config["negatives"] == 16 and "negatives" not in config["derived"]
    assert config["embedding_dim"] == 100 and config["derived"]["embedding_dim"].startswith("100: MariusGNN")


@pytest.mark.parametrize("budget", [1 << 20, 48 << 20, 512 << 20, 8 << 30, None])
@pytest.mark.parametrize("eval_batch", [16, 256, 4096])
def test_ranking_blocks_fit_the_steps_share_of_the_budget(budget, eval_batch):
    """Full ranking scores [eval batch, chunk] blocks; under --buffer-bytes their values and
    temporaries fit the eighth of the budget kept for the step (WN18RR at 48 MiB: 630 -> 489
    MiB peak, the same metrics), down to a floor of 1,024 candidates."""
    from graphstore.loaders.defaults import step_share

    chunk = lp.eval_candidate_chunk(budget, eval_batch)
    assert lp.MIN_CANDIDATE_CHUNK <= chunk <= lp.MAX_CANDIDATE_CHUNK
    if budget is None:
        assert chunk == lp.MAX_CANDIDATE_CHUNK
        return
    block = eval_batch * chunk * 4 * lp.SCORE_BLOCK_COPIES
    assert block <= step_share(budget)[1] or chunk == lp.MIN_CANDIDATE_CHUNK
    # The most that fit: one more candidate would not (unless capped).
    assert chunk == lp.MAX_CANDIDATE_CHUNK or chunk == lp.MIN_CANDIDATE_CHUNK or \
        block + eval_batch * 4 * lp.SCORE_BLOCK_COPIES > step_share(budget)[1]


@pytest.mark.parametrize("corrupt", ["both", "dst"])
def test_micro_batches_give_the_batchs_gradient(fresh_kg, corrupt):
    """One real batch of the KG store, through `batch_backward` whole and in runs: the same
    loss, the same gradient of every parameter and of every input row."""
    args = lp.LinkPredictionOptions.parse(["--store", str(fresh_kg), "--embedding-dim", "16", "--negatives", "32",
                                           "--num-chunks", "4", "--batch-size", "256", "--corrupt", corrupt])
    store = graphstore.open(fresh_kg, mode="r+")
    try:
        table = lp.init_embeddings(store, 16, scale=0.1, seed=0)
        loader = EdgeLoader(store, batch_size=256, negatives=32, num_chunks=4, scheme="minibatch", embeddings=table,
                            seed=0)
        args, _ = lp.resolve_defaults(args, store)
        model = lp.LinkModel(args, in_dim=16, num_relations=max(1, store.num_relations)).double()
        batch = next(iter(loader.epoch(0)))
        results = []
        for step_bytes in (None, 64 << 10):
            model.zero_grad(set_to_none=True)
            loss, x, rows, parts = lp.batch_backward(model, batch, use_embeddings=True, rgcn=False,
                                                     device=torch.device("cpu"), step_bytes=step_bytes,
                                                     corrupt=corrupt)
            results.append((float(loss), x.grad.clone(), rows.clone(), parts,
                            [p.grad.clone() for p in model.parameters()]))
    finally:
        store.close()
    (l1, g1, r1, p1, w1), (l2, g2, r2, p2, w2) = results
    assert p1 == 1 and p2 > 2
    assert torch.equal(r1, r2)
    assert l2 == pytest.approx(l1, rel=1e-12)
    assert torch.allclose(g2, g1, rtol=1e-9, atol=1e-15)
    assert all(torch.allclose(a, b, rtol=1e-9, atol=1e-15) for a, b in zip(w1, w2))
