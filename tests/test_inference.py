"""Layer-wise inference out of core equals the in-memory full-graph forward of the same
model, for every layer kind, 2 and 3 layers, any capacity; memory stays within the
capacity; a corrupted scratch or spilled accumulator is caught."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import graphstore
from graphstore.errors import CorruptStoreError
from graphstore.inference import InferenceStats, infer_layerwise
from graphstore.inference.layerwise import ScratchRows
from graphstore.nn import GNN, LayerView

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    out = tmp_path_factory.mktemp("cora") / "cora.gs"
    graphstore.convert(REPO / "data" / "cora", out, num_partitions=7, partitioner="metis")
    with graphstore.open(out) as store:
        yield store


def full_graph_forward(model: GNN, store) -> torch.Tensor:
    """The model over the whole graph in memory: every node an output, all its in-edges."""
    p = store.num_partitions
    parts = [store.read_bucket(i, j) for j in range(p) for i in range(p)]
    src = torch.from_numpy(np.concatenate([b[0] for b in parts]).astype(np.int64))
    dst = torch.from_numpy(np.concatenate([b[1] for b in parts]).astype(np.int64))
    order = torch.argsort(dst, stable=True)
    src, dst = src[order], dst[order]
    n = store.num_nodes
    view = LayerView(n, n, slice(0, n), src, torch.bincount(dst, minlength=n), dst)
    x = torch.from_numpy(np.asarray(store.features[...], dtype=np.float32))
    degrees = torch.from_numpy(store.read_degree("in").astype(np.int64))
    with torch.no_grad():
        return model.eval()(x, [view] * model.num_layers, degrees=degrees if model.kind == "gcn" else None)


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("kind", ["sage", "gcn", "gat", "gin"])
def test_layerwise_inference_equals_the_full_graph_forward(cora, kind, layers):
    torch.manual_seed(layers)
    model = GNN(kind, in_dim=cora.feature_dim, hidden_dim=16, out_dim=cora.num_classes, num_layers=layers, heads=2)
    want = full_graph_forward(model, cora).numpy()
    for capacity in (2, 3, 7):  # one swap at a time, an odd capacity, everything resident
        stats = InferenceStats()
        got = infer_layerwise(model, cora, capacity=capacity, stats=stats)
        assert got.shape == want.shape
        assert float(np.abs(got - want).max()) < 1e-4, (kind, layers, capacity)
        assert stats.max_resident_partitions <= capacity
        assert stats.bytes_read >= stats.planned_bytes > 0


def test_a_node_subset_and_the_work_dir(cora, tmp_path):
    model = GNN("sage", in_dim=cora.feature_dim, hidden_dim=8, out_dim=cora.num_classes, num_layers=2)
    test = cora.read_node_split("test")
    everything = infer_layerwise(model, cora, capacity=3)
    subset = infer_layerwise(model, cora, capacity=3, nodes=test, work_dir=tmp_path / "w", keep=True)
    np.testing.assert_array_equal(subset, everything[test])
    assert len(list((tmp_path / "w").glob("graphstore-infer-*/layer2.npy"))) == 1  # kept
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the caller's")
    infer_layerwise(model, cora, capacity=3, work_dir=tmp_path / "mine")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]  # only its own scratch went


def test_each_finished_layer_is_reported(cora):
    """``on_layer`` (the trainers' progress bar over an exact evaluation) hears of every
    layer once, in order, with the seconds the stats record for it."""
    model = GNN("sage", in_dim=cora.feature_dim, hidden_dim=8, out_dim=cora.num_classes, num_layers=3)
    heard, stats = [], InferenceStats()
    infer_layerwise(model, cora, capacity=3, stats=stats, on_layer=lambda *a: heard.append(a))
    assert [(layer, total) for layer, total, _ in heard] == [(1, 3), (2, 3), (3, 3)]
    assert [s for _, _, s in heard] == stats.per_layer_seconds


def test_spilled_accumulators_and_scratch_rows_are_checked(cora, tmp_path):
    model = GNN("sage", in_dim=cora.feature_dim, hidden_dim=8, out_dim=cora.num_classes, num_layers=2)
    stats = InferenceStats()
    infer_layerwise(model, cora, capacity=2, stats=stats)
    assert stats.spill_bytes > 0  # with two partitions resident, destinations leave unfinished
    rows = ScratchRows(tmp_path / "r.npy", 10, 3, 4)
    rows.write(1, np.ones((4, 3), dtype=np.float32))
    np.testing.assert_array_equal(rows.read(1), np.ones((4, 3)))
    on_disk = np.load(tmp_path / "r.npy", mmap_mode="r+")
    on_disk[5, 1] = 7.0  # a flipped value on disk
    on_disk.flush()
    with pytest.raises(CorruptStoreError, match="partition 1 fail their checksum"):
        rows.read(1)


@pytest.mark.parametrize("relations, bases", [(3, 2), (3, None), (40, None)],
                         ids=["bases", "per-relation", "many-relations"])
def test_rgcn_over_relations(tmp_path, relations, bases):
    """Exact in the compact form too: sums per destination with every relation's count known
    up front, and (one weight per relation, R x out wider than the input) the input rows as
    sources, projected per edge by its relation's weight."""
    from graphstore.layout._convert import ConvertOptions, convert
    from tests.conftest import make_graph

    graph, _ = make_graph(num_nodes=300, num_edges=2500, directed=True, num_relations=relations)
    out = tmp_path / "kg.gs"
    convert(graph, out, ConvertOptions(num_partitions=5, partitioner="random", seed=2))
    with graphstore.open(out) as store:
        torch.manual_seed(0)
        model = GNN("rgcn", in_dim=store.feature_dim, hidden_dim=12, out_dim=4, num_layers=2,
                    num_relations=store.num_relations, num_bases=bases).eval()
        p = store.num_partitions
        parts = [store.read_bucket(i, j) for j in range(p) for i in range(p)]
        src, dst, rel = (torch.from_numpy(np.concatenate([b[k] for b in parts]).astype(np.int64)) for k in range(3))
        order = torch.argsort(dst, stable=True)
        src, dst, rel = src[order], dst[order], rel[order]
        n = store.num_nodes
        view = LayerView(n, n, slice(0, n), src, torch.bincount(dst, minlength=n), dst)
        x = torch.from_numpy(np.asarray(store.features[...], dtype=np.float32))
        with torch.no_grad():
            want = model(x, [view, view], edge_type=[rel, rel]).numpy()
        got = infer_layerwise(model, store, capacity=2)
    assert float(np.abs(got - want).max()) < 1e-4


def test_save_and_load_a_model_then_infer_from_the_command_line(cora, tmp_path, capsys):
    from graphstore.cli import main
    from graphstore.inference import load_model, save_model

    torch.manual_seed(1)
    model = GNN("gat", in_dim=cora.feature_dim, hidden_dim=8, out_dim=cora.num_classes, num_layers=2, heads=2)
    save_model(model, tmp_path / "m.pt")
    loaded, recorded = load_model(tmp_path / "m.pt")
    assert recorded == {} and loaded.hyperparameters == model.hyperparameters
    test = cora.read_node_split("test")
    want = infer_layerwise(model, cora, capacity=3, nodes=test)
    assert main(["infer", str(cora.path), "--checkpoint", str(tmp_path / "m.pt"), "--split", "test",
                 "--out", str(tmp_path / "p.npz"), "--capacity", "3"]) == 0
    with np.load(tmp_path / "p.npz") as got:
        np.testing.assert_array_equal(got["logits"], want)
        np.testing.assert_array_equal(got["ids"], test)
        np.testing.assert_array_equal(got["predictions"], want.argmax(1))
    assert "gat x2 over every node" in capsys.readouterr().out
    (tmp_path / "bad.pt").write_bytes(b"not a model")
    assert main(["infer", str(cora.path), "--checkpoint", str(tmp_path / "bad.pt"), "--out",
                 str(tmp_path / "q.npy")]) == 1
    assert "bad.pt: cannot read the model" in capsys.readouterr().err
    assert not (tmp_path / "q.npy").exists()


def test_infer_from_a_trainer_checkpoint(cora, tmp_path):
    import sys

    from graphstore.cli import main
    from graphstore.inference import load_model

    sys.path.insert(0, str(REPO))
    from trainers import common
    from trainers import node_classification as nc

    ckpt = tmp_path / "ckpt"
    assert common.run(nc.PROG, nc.main, ["--store", str(cora.path), "--epochs", "1", "--fanouts", "5,5",
                                         "--hidden", "16", "--normalize-features", "row",
                                         "--checkpoint-dir", str(ckpt)]) == 0
    model, config = load_model(ckpt, cora)
    assert config["normalize_features"] == "row" and model.kind == "sage"
    from graphstore.nn import normalize_rows

    want = infer_layerwise(model, cora, capacity=2, input_transform=normalize_rows)
    assert main(["infer", str(cora.path), "--checkpoint", str(ckpt), "--split", "all",
                 "--out", str(tmp_path / "all.npy"), "--capacity", "2"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "all.npy"), want)


def test_infer_refuses_what_does_not_fit_in_one_line_before_any_work(cora, tmp_path, capsys):
    """Another store's trainer checkpoint, a saved model whose in_dim is not the features'
    width, an --out without .npy/.npz: one line each, before the walk (its work directory
    is never made) and with no temporary output left behind."""
    import sys

    from graphstore.cli import main
    from graphstore.inference import save_model
    from graphstore.layout._convert import ConvertOptions, convert
    from tests.conftest import make_graph

    sys.path.insert(0, str(REPO))
    from trainers import common
    from trainers import node_classification as nc

    graph, _ = make_graph(num_nodes=200, num_edges=900, feature_dim=5, num_classes=3)
    other = tmp_path / "other.gs"
    convert(graph, other, ConvertOptions(num_partitions=2, partitioner="random"))
    ckpt = tmp_path / "ckpt"
    assert common.run(nc.PROG, nc.main, ["--store", str(other), "--epochs", "1", "--fanouts", "3,3",
                                         "--hidden", "8", "--checkpoint-dir", str(ckpt)]) == 0
    save_model(GNN("gcn", in_dim=5, hidden_dim=8, out_dim=cora.num_classes, num_layers=2), tmp_path / "m.pt")
    work, out = tmp_path / "work", tmp_path / "p.npy"
    d = cora.feature_dim
    for checkpoint, problem in [(ckpt, f"layers.0.fc_self.weight is [8, 5] in the file but [8, {d}] for {cora.path}"),
                                (tmp_path / "m.pt", f"m.pt: in_dim is 5 but {cora.path} has {d} features")]:
        capsys.readouterr()
        assert main(["infer", str(cora.path), "--checkpoint", str(checkpoint), "--out", str(out),
                     "--work-dir", str(work)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("graphstore infer: error: ") and err.count("\n") == 1 and problem in err, err
    assert not work.exists() and not out.exists()
    save_model(GNN("gcn", in_dim=d, hidden_dim=8, out_dim=cora.num_classes, num_layers=2), tmp_path / "fits.pt")
    with pytest.raises(SystemExit) as exited:
        main(["infer", str(cora.path), "--checkpoint", str(tmp_path / "fits.pt"), "--out", str(tmp_path / "preds"),
              "--work-dir", str(work)])
    assert exited.value.code == 2
    assert "argument --out: " in capsys.readouterr().err
    assert not work.exists() and not list(tmp_path.glob("*preds*")) and not list(tmp_path.glob(".*"))


def test_a_changed_spilled_accumulator_is_refused(tmp_path):
    from graphstore.inference.layerwise import _restore, _spill
    from graphstore.nn import SAGEConv

    layer = SAGEConv(4, 3)
    h = torch.randn(5, 4)
    with torch.no_grad():  # as inference runs
        acc = layer.partial_begin(h)
        layer.partial_update(acc, h, torch.tensor([0, 1, 2]), torch.tensor([1, 1, 4]))
    path = tmp_path / "acc.bin"
    _spill(path, acc)
    back, _ = _restore(path)  # read back whole, and the file is gone
    assert torch.equal(back.total, acc.total) and torch.equal(back.count, acc.count) and not path.exists()
    _spill(path, acc)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40  # a changed value (the last byte of the last field) under the old checksum
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match="acc.bin: a spilled accumulator fails its checksum"):
        _restore(path)
    _spill(path, acc)
    path.write_bytes(path.read_bytes()[:-6])
    with pytest.raises(CorruptStoreError, match="acc.bin: a spilled accumulator is cut short"):
        _restore(path)


def test_a_byte_budget_picks_each_layers_capacity(cora):
    from graphstore.errors import ConfigError
    from graphstore.inference import min_buffer_bytes

    torch.manual_seed(3)
    # 1433 features to 8 hidden units: the first layer's walk moves 8-wide rows.
    model = GNN("sage", in_dim=cora.feature_dim, hidden_dim=8, out_dim=cora.num_classes, num_layers=3)
    want = full_graph_forward(model, cora).numpy()
    least = min_buffer_bytes(model, cora)
    for budget in (least, 3 * least, 1 << 30):
        stats = InferenceStats()
        got = infer_layerwise(model, cora, buffer_bytes=budget, stats=stats)
        assert float(np.abs(got - want).max()) < 1e-4, budget
        assert len(stats.capacities) == 3 and all(2 <= c <= cora.num_partitions for c in stats.capacities)
        assert stats.max_resident_partitions == max(stats.capacities)
    assert stats.capacities == [cora.num_partitions] * 3  # 1 GiB holds everything
    with pytest.raises(ConfigError, match="buffer_bytes 1000 is too small for layer 0"):
        infer_layerwise(model, cora, buffer_bytes=1000)
    with pytest.raises(ConfigError, match="not both"):
        infer_layerwise(model, cora, buffer_bytes=least, capacity=2)


def test_states_come_in_pieces_and_prefetch_changes_nothing(cora, monkeypatch):
    import graphstore.inference.layerwise as lw

    model = GNN("gat", in_dim=cora.feature_dim, hidden_dim=8, out_dim=cora.num_classes, num_layers=2, heads=2)
    steps = []
    pieces = lw._Walk._pieces
    monkeypatch.setattr(lw._Walk, "_pieces", lambda self, *a: steps.append(pieces(self, *a)) or steps[-1])
    # A capacity without a budget: pieces of the largest bucket's size.
    ahead = infer_layerwise(model, cora, capacity=2)
    states = {s for s, _ in steps[0]}
    assert len(steps[0]) > len(states)  # some state's buckets came in more than one piece
    alone = infer_layerwise(model, cora, capacity=2, prefetch=False)
    np.testing.assert_array_equal(ahead, alone)  # the same pieces in the same order


def test_an_error_while_reading_ahead_reaches_the_caller_and_nothing_is_left(cora, tmp_path):
    model = GNN("sage", in_dim=cora.feature_dim, hidden_dim=8, out_dim=cora.num_classes, num_layers=2)

    def rows(k):
        if k == 4:
            raise OSError(f"partition {k}: the disk went away")
        return cora.read_features(k)

    with pytest.raises(OSError, match="partition 4: the disk went away"):
        infer_layerwise(model, cora, capacity=2, input_rows=rows, work_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []  # the scratch went with the failed run
    import threading

    assert not [t for t in threading.enumerate() if t.name.startswith("graphstore-infer")]  # joined


def test_an_all_zero_field_is_spilled_as_its_shape(tmp_path):
    from graphstore.inference.layerwise import _restore, _spill
    from graphstore.nn import SAGEConv

    layer = SAGEConv(4, 300)
    with torch.no_grad():
        acc = layer.partial_begin(torch.randn(1000, 4))
    acc.own = None
    written = _spill(tmp_path / "a.bin", acc)
    assert written < 100  # [1000, 4] zeros and [1000] zero counts: two shapes
    back, _ = _restore(tmp_path / "a.bin")
    assert torch.equal(back.total, acc.total) and back.count.dtype == torch.int64 and not back.count.any()
