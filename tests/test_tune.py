"""tune=True: candidates timed once, winner cached on disk, bad caches ignored with a warning."""
import json
import warnings

import numpy as np
import pytest

import numbaconv as nc
from numbaconv import config, tune


@pytest.fixture
def tune_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "TUNE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _args():
    x = np.ones((1, 6, 6, 16), np.float32)
    dy = np.ones((1, 6, 6, 16), np.float32)
    return x, [3, 3, 16, 16], dy, 1, "SAME"


def test_tune_times_once_then_uses_cache(tune_dir, monkeypatch):
    p1 = nc.plan("conv2d_backprop_filter", *_args(), tune=True)
    assert "tuned now" in p1.reason
    data = json.loads((tune_dir / "tune.json").read_text())
    (entry,) = data["entries"].values()
    assert entry["strategy"] == p1.strategy + (f"[{p1.variant}]" if p1.variant else "")
    assert set(entry["seconds"]) == {"gemm[rows]", "gemm", "direct"}

    def no_timing(*a, **k):
        raise AssertionError("a cached problem must not be timed again")

    monkeypatch.setattr(tune, "time_strategy", no_timing)
    p2 = nc.plan("conv2d_backprop_filter", *_args(), tune=True)
    assert (p2.strategy, p2.variant) == (p1.strategy, p1.variant) and "cached" in p2.reason
    # the op itself runs with the tuned plan and gives the right answer
    x, fs, dy, s, pad = _args()
    got = nc.conv2d_backprop_filter(x, fs, dy, s, pad, tune=True)
    ref = nc.conv2d_backprop_filter(x, fs, dy, s, pad, strategy="direct")
    np.testing.assert_allclose(got, ref, rtol=1e-5)


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": "other"}), "[]"])
def test_corrupt_or_foreign_cache_is_ignored_with_warning(tune_dir, content):
    (tune_dir / "tune.json").write_text(content)
    with pytest.warns(RuntimeWarning, match="ignor"):
        p = nc.plan("conv2d_backprop_filter", *_args(), tune=True)
    assert p.strategy in ("gemm", "direct")
    # rewritten as a valid cache
    assert json.loads((tune_dir / "tune.json").read_text())["format"].startswith("numbaconv")


def test_cached_entry_naming_a_declining_strategy_is_not_trusted(tune_dir):
    nc.plan("conv2d_backprop_filter", *_args(), tune=True)
    path = tune_dir / "tune.json"
    data = json.loads(path.read_text())
    for e in data["entries"].values():
        e["strategy"] = "winograd"  # not an accepted candidate here
    path.write_text(json.dumps(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = nc.plan("conv2d_backprop_filter", *_args(), tune=True)
    assert p.strategy in ("gemm", "direct") and "tuned now" in p.reason


def test_tune_must_be_bool():
    with pytest.raises(TypeError, match="tune"):
        nc.plan("conv2d_backprop_filter", *_args(), tune="yes")
