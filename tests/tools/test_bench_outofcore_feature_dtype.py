"""``tools/bench_outofcore.py --feature-dtype`` (issue 34, 1): the --quick stores converted to
another feature dtype are cached beside float32's, under their own names."""

from __future__ import annotations

import graphstore
from tests.tools.test_bench_outofcore import TINY
from tools import bench_outofcore as bo


def test_a_half_quick_store_is_cached_apart_from_float32s(tmp_path):
    params = dict(TINY, feature_dtype="float16")
    built = bo.ensure_quick_stores(tmp_path, params, lambda msg: None)
    assert built["metis"].name == "quick_metis_float16.gs" and (tmp_path / "quick_stores_float16.json").exists()
    for method in ("metis", "stream"):
        with graphstore.open(built[method]) as store:
            assert store.manifest.feature_dtype == "float16"
    assert bo.quick_stores_invalid(tmp_path, params) is None
    assert "no quick_stores.json" in bo.quick_stores_invalid(tmp_path, TINY)  # float32's is another cache
    _, args = bo.parse_args(["--json", str(tmp_path / "o.json"), "--quick", "--feature-dtype", "bfloat16"])
    assert args.feature_dtype == "bfloat16"
