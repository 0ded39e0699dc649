"""`infer_layerwise` with a ``device``, on the CPU: the path a CUDA device takes (rows read
into host staging, copied into the slots; accumulators restored into staging, then
copied; edges copied per piece; outputs brought back) forced on the CPU gives the host
path's result bit for bit and the same IO counts, for every layer kind; a device this
machine lacks, or one the model is not on, is refused in one line before anything is read;
``graphstore infer --device``. The CUDA runs themselves are in ``tests/cuda/test_inference.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graphstore
from graphstore.errors import ConfigError
from graphstore.inference import (InferenceStats, infer_layerwise, load_model, min_buffer_bytes,
                                  resolve_device, save_model)
from graphstore.inference import layerwise as lw
from graphstore.nn import GNN, AggregationModel

NO_CUDA = not torch.cuda.is_available()
STATS = ("bytes_read", "bytes_written", "planned_bytes", "spill_bytes", "max_resident_partitions",
         "capacities")
"""`InferenceStats` fields that count the store's and the scratch files' bytes (and the plan):
the same whatever the device."""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """600 nodes, 5000 directed edges in chunks of 400 (a bucket is cut under the least
    budget), 3 relations, 16 features equal to node ids, 4 random partitions."""
    from graphstore.layout._convert import ConvertOptions, convert
    from tests.conftest import make_graph

    graph, _ = make_graph(num_nodes=600, num_edges=5000, directed=True, feature_dim=16, num_relations=3,
                          seed=7)
    out = tmp_path_factory.mktemp("device") / "g.gs"
    convert(graph, out, ConvertOptions(num_partitions=4, partitioner="random", seed=0))
    with graphstore.open(out) as opened:
        yield opened


def model_for(store, kind: str, *, bases: int | None = 2) -> GNN:
    """A 2-layer ``kind`` with its weights moved off their initial values (biases too)."""
    torch.manual_seed(0)
    model = GNN(kind, in_dim=store.feature_dim, hidden_dim=16, out_dim=store.num_classes, num_layers=2,
                heads=2, num_relations=store.num_relations, num_bases=bases)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def scaled(rows: torch.Tensor) -> torch.Tensor:
    return rows / 600.0  # features are node ids: keep the logits moderate


def staged_on_the_cpu(monkeypatch) -> list[tuple]:
    """The device's path from here on, on the CPU; returns the shapes of the host staging
    buffers it makes (so a test can see it ran)."""
    monkeypatch.setattr(lw, "_staged", lambda device: True)
    made, host = [], lw._Walk._host
    monkeypatch.setattr(lw._Walk, "_host",
                        lambda self, shape, *a: made.append(tuple(shape)) or host(self, shape, *a))
    return made


MODELS = [("sage", 2), ("gcn", 2), ("gat", 2), ("gin", 2), ("rgcn", 2),
          ("rgcn", None)]  # RGCN without bases: its compact form's input rows as prepared sources
HELD = [("capacity", True), ("budget", True), ("budget", False)]  # (what sets the capacity, prefetch)


@pytest.mark.parametrize(("held", "prefetch"), HELD)
@pytest.mark.parametrize(("kind", "bases"), MODELS)
def test_the_device_path_on_the_cpu_is_the_host_path_bit_for_bit(store, monkeypatch, kind, bases, held,
                                                                  prefetch):
    model = model_for(store, kind, bases=bases)
    # capacity 2 of 4: partitions leave before their last in-bucket (accumulators spilled and
    # restored); the least budget: buckets cut into pieces besides.
    kw = {"capacity": 2} if held == "capacity" else {"buffer_bytes": min_buffer_bytes(model, store)}
    before, after = InferenceStats(), InferenceStats()
    want = infer_layerwise(model, store, stats=before, input_transform=scaled, prefetch=prefetch, **kw)
    made = staged_on_the_cpu(monkeypatch)
    got = infer_layerwise(model, store, stats=after, input_transform=scaled, prefetch=prefetch, device="cpu",
                          **kw)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
    assert np.abs(want).max() > 0.1  # not a trivial zero
    assert {n: getattr(after, n) for n in STATS} == {n: getattr(before, n) for n in STATS}
    assert before.spill_bytes > 0
    # Every layer's admissions went through staging (4 partitions, 2 layers, at least one field).
    assert len(made) >= 2 * store.num_partitions


@pytest.mark.parametrize("op", ["mean", "gcn"])
def test_a_weightless_model_runs_where_it_is_told(store, monkeypatch, op):
    """`AggregationModel` has no parameters: ``device`` alone says where it runs."""
    model = AggregationModel(op, store.feature_dim)
    want = infer_layerwise(model, store, capacity=2)
    staged_on_the_cpu(monkeypatch)
    got = infer_layerwise(model, store, capacity=2, device=torch.device("cpu"))
    assert got.tobytes() == want.tobytes()


def test_devices_are_checked_in_one_line_before_anything_is_read(store, tmp_path):
    assert resolve_device("cpu") == resolve_device(torch.device("cpu")) == torch.device("cpu")
    for wrong in ("tpu", "gpu:0", "cuda:x"):
        with pytest.raises(ConfigError, match=rf"^device must be cpu, cuda or cuda:N \(got '{wrong}'\)$"):
            resolve_device(wrong)
    model = model_for(store, "sage")
    work = tmp_path / "work"
    if NO_CUDA:
        no_cuda = r"^device 'cuda': torch sees no CUDA device on this machine \(use cpu\)$"
        with pytest.raises(ConfigError, match=no_cuda):
            infer_layerwise(model, store, capacity=2, device="cuda", work_dir=work)
    # A model is never moved: one on another device than the one asked for is refused.
    elsewhere = model_for(store, "sage").to("meta")
    with pytest.raises(ConfigError, match=r"^device is cpu but the model is on meta \(move it first"):
        infer_layerwise(elsewhere, store, capacity=2, device="cpu", work_dir=work)
    model.layers[1].to("meta")
    with pytest.raises(ConfigError, match=r"^the model is on several devices \(cpu, meta\)"):
        infer_layerwise(model, store, capacity=2, work_dir=work)
    assert not work.exists()


def test_load_model_puts_the_model_on_the_device(store, tmp_path):
    save_model(model_for(store, "gcn"), tmp_path / "m.pt")
    model, _ = load_model(tmp_path / "m.pt", store, device="cpu")
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    if NO_CUDA:
        with pytest.raises(ConfigError, match="torch sees no CUDA device"):
            load_model(tmp_path / "m.pt", store, device="cuda:0")


def test_graphstore_infer_device(store, tmp_path, capsys):
    """``--device cpu`` is the default's output; a malformed device is a usage error (2); a
    CUDA device this machine lacks, one line and exit 1, nothing written."""
    from graphstore.cli import main

    save_model(model_for(store, "gat"), tmp_path / "m.pt")
    base = ["infer", str(store.path), "--checkpoint", str(tmp_path / "m.pt"), "--split", "all",
            "--capacity", "2"]
    assert main([*base, "--out", str(tmp_path / "default.npy")]) == 0
    assert main([*base, "--out", str(tmp_path / "cpu.npy"), "--device", "cpu"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("s on cpu")
    assert np.load(tmp_path / "cpu.npy").tobytes() == np.load(tmp_path / "default.npy").tobytes()
    with pytest.raises(SystemExit) as exited:
        main([*base, "--out", str(tmp_path / "x.npy"), "--device", "gpu"])
    assert exited.value.code == 2
    assert "argument --device: 'gpu' must be cpu, cuda or cuda:N" in capsys.readouterr().err
    if NO_CUDA:
        assert main([*base, "--out", str(tmp_path / "cuda.npy"), "--device", "cuda"]) == 1
        err = capsys.readouterr().err
        assert err == ("graphstore infer: error: device 'cuda': torch sees no CUDA device on this machine "
                       "(use cpu)\n")
        assert not (tmp_path / "cuda.npy").exists()
