"""``convert --feature-dtype`` (issue 34, 1): features stored, checksummed and read as
stored in float16, bfloat16 (uint16 bit patterns) or float32; out-of-range values refused."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import graphstore
from graphstore.errors import ConfigError, CorruptStoreError, SourceError
from graphstore.layout.dtypes import decode, encode, first_overflow, storage_dtype
from tests.conftest import REPO
from tests.half_sources import DTYPES, convert, rounded, source_rows, stored_rows, write_source


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    features, labels = source_rows()
    return write_source(tmp_path_factory.mktemp("src"), features, labels), features


@pytest.fixture(scope="module")
def stores(source, tmp_path_factory):
    root = tmp_path_factory.mktemp("stores")
    return {dt: convert(source[0], root / f"{dt}.gs", dt) for dt in DTYPES}


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_are_the_source_rounded_to_the_dtype(source, stores, dtype):
    """Every row equals torch's cast of the float32 source row to the dtype (round to
    nearest even), read back in source order; a half store is not the source itself."""
    features = source[1]
    with graphstore.open(stores[dtype]) as store:
        assert store.manifest.feature_dtype == dtype
        assert store.array("nodes/features").dtype == storage_dtype(dtype)
        assert store.array("nodes/features").dtype.itemsize == (4 if dtype == "float32" else 2)
        rows = stored_rows(store)[store.to_store_ids(np.arange(store.num_nodes))]  # source order
    assert rows.dtype == np.float32
    assert np.array_equal(rows, rounded(features, dtype))
    assert np.array_equal(rows, features) == (dtype == "float32")


def test_the_default_keeps_the_sources_dtype(source, tmp_path):
    """No option: a float32 source stays float32 (and a float16 one float16, tested with
    the float16 fixture in tests/conftest.py)."""
    with graphstore.open(convert(source[0], tmp_path / "d.gs", None)) as store:
        assert store.manifest.feature_dtype == "float32"


@pytest.mark.parametrize("dtype", DTYPES)
def test_verify_checks_the_stored_bytes(stores, dtype, tmp_path):
    """Checksums are over the stored 16- or 32-bit values: a flipped byte in a feature chunk
    is found."""
    import shutil

    graphstore.verify(stores[dtype])
    copy = tmp_path / "c.gs"
    shutil.copytree(stores[dtype], copy)
    chunk = sorted((copy / "nodes" / "features" / "c").rglob("*"))
    chunk = next(p for p in chunk if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x40
    chunk.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError):
        graphstore.verify(copy)


def test_a_value_beyond_float16s_range_is_refused_in_one_line(tmp_path):
    """|x| >= 65520 would be inf in float16: refused naming the file, row, column and the
    remedy; bfloat16 and float32 hold it."""
    features, labels = source_rows(num_nodes=200)
    features[37, 5] = -70000.0
    src = write_source(tmp_path / "src", features, labels)
    with pytest.raises(SourceError) as info:
        convert(src, tmp_path / "f16.gs", "float16")
    message = str(info.value)
    assert "\n" not in message
    assert "features.npy" in message and "column 5" in message and "float16" in message and "-70000" in message
    assert not (tmp_path / "f16.gs").exists()
    with graphstore.open(convert(src, tmp_path / "bf16.gs", "bfloat16")) as store:
        row = stored_rows(store)[int(store.to_store_ids(np.array([37]))[0])]
    assert row[5] == -70144.0  # bfloat16's nearest: 8 bits of mantissa


def test_65504_is_float16s_largest_and_kept(tmp_path):
    features, labels = source_rows(num_nodes=200)
    features[3, 1] = 65504.0
    features[4, 2] = 65519.0  # rounds down to 65504, not up to inf
    with graphstore.open(convert(write_source(tmp_path / "src", features, labels), tmp_path / "f.gs", "float16")) as s:
        rows = stored_rows(s)[s.to_store_ids(np.arange(s.num_nodes))]
    assert rows[3, 1] == rows[4, 2] == 65504.0


def test_bfloat16_encoding_is_torchs():
    """The numpy encoding (round to nearest even on the dropped 16 bits) equals torch's
    float32 -> bfloat16 cast bit for bit, ties and subnormals included; values past
    bfloat16's range are found."""
    import torch

    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0, 10, 5000), rng.normal(0, 1e-39, 100), [0.0, -0.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8,
                                                                           3.3e38]]).astype(np.float32)
    ours = encode(x[None, :], "bfloat16")[0]
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.uint16).numpy()
    assert np.array_equal(ours, theirs)
    assert np.array_equal(decode(ours, "bfloat16"), torch.from_numpy(x).to(torch.bfloat16).float().numpy())
    assert first_overflow(ours[None, :], "bfloat16") is None
    assert first_overflow(encode(np.array([[1.0, 3.4e38]], dtype=np.float32), "bfloat16"), "bfloat16") == (0, 1)


def test_an_unknown_dtype_is_a_config_error(source, tmp_path):
    with pytest.raises(ConfigError, match="float16, bfloat16"):
        convert(source[0], tmp_path / "x.gs", "int8")


def test_the_command_line_option(source, tmp_path):
    out = tmp_path / "cli.gs"
    proc = subprocess.run([sys.executable, "-m", "graphstore", "convert", str(source[0]), str(out), "--partitions",
                           "2", "--feature-dtype", "bfloat16"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    info = subprocess.run([sys.executable, "-m", "graphstore", "info", str(out)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert "(bfloat16)" in info.stdout
    bad = subprocess.run([sys.executable, "-m", "graphstore", "convert", str(source[0]), str(tmp_path / "y.gs"),
                          "--feature-dtype", "half"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert bad.returncode == 2 and "--feature-dtype" in bad.stderr
