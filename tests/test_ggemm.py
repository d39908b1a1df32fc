"""The grouped variant of the GEMM strategy (backward data of square groups of one vector
of channels as register tiles across several groups, over exact regions of dY read in
place, :mod:`numbaconv.kernels.cpu.ggemm`) against the float64 NumPy reference: 1-D, 2-D
and 3-D, strides (phases of one to four taps, a phase no tap reaches), dilations, pads
wider than the kernel (boxes no tap reaches), a last block of fewer groups than a tile
holds, float32/float64, one thread; and the planner's rule."""
import dataclasses

import numpy as np
import pytest

import numbaconv as nc
from numbaconv import planner
from numbaconv.kernels.cpu import ggemm
from numbaconv.strategies import ggemm as strategy
from reference import conv_bwd_data_ref, conv_fwd_ref, normalized_error, tolerance

# (mb, groups, input spatial, kernel, stride, dilation, pads_begin, pads_end)
CASES = [
    # 3x3 stride 1: 9 exact boxes, tiles across rows and images; 5 groups (a block of the
    # tile's groups and the rest one at a time)
    (2, 5, (9, 11), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    # 3x3 stride 2: four phases of 1, 2, 2 and 4 taps
    (2, 4, (10, 9), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
    # 1-D, 5 taps, 3 images of 13 pixels, 9 groups
    (3, 9, (13,), (5,), (1,), (1,), (2,), (2,)),
    # 3-D, strides and dilations mixed per axis, asymmetric pads
    (1, 2, (7, 6, 5), (3, 2, 3), (2, 1, 2), (1, 2, 1), (1, 0, 2), (2, 1, 1)),
    # 2x2 at stride 3: a phase that no tap reaches (zeros)
    (2, 4, (9, 9), (2, 2), (3, 3), (1, 1), (0, 0), (0, 0)),
    # dilation 2, pads wider than the kernel's reach on one side (boxes no tap reaches)
    (1, 6, (5, 5), (3, 3), (1, 1), (2, 2), (3, 1), (0, 2)),
    # no padding (one box per phase), fewer row tiles than threads
    (1, 8, (3, 4), (2, 2), (1, 1), (1, 1), (0, 0), (0, 0)),
]
IDS = [f"mb{c[0]}g{c[1]}i{'x'.join(map(str, c[2]))}k{'x'.join(map(str, c[3]))}"
       f"s{'x'.join(map(str, c[4]))}" for c in CASES]


@pytest.fixture(autouse=True)
def _any_host(monkeypatch):
    """The planner takes the entry on AVX-512 hosts only; the kernels run on any."""
    monkeypatch.setattr(strategy, "VECTOR_BYTES_MEASURED", (16, 32, 64))
    planner.clear_plan_cache()
    yield
    planner.clear_plan_cache()


def _run(case, dtype, seed=0):
    mb, g, isz, k, st, dl, pb, pe = case
    c = ggemm.lanes(np.dtype(dtype).itemsize)  # one vector of channels per group
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((mb, *isz, g * c)).astype(dtype)
    w = rng.standard_normal((*k, c, g * c)).astype(dtype)
    geom = dict(stride=st, dilation=dl, pads_begin=pb, pads_end=pe, groups=g)
    dy = rng.standard_normal(conv_fwd_ref(x, w, **geom).shape).astype(dtype)
    w0, dy0 = w.copy(), dy.copy()
    attrs = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe, groups=g)
    plan = nc.plan("convolution_backprop_data", dy, w, isz, strategy="gemm[grouped]", **attrs)
    assert (plan.strategy, plan.variant) == ("gemm", "grouped"), plan
    got = nc.convolution_backprop_data(dy, w, isz, strategy="gemm[grouped]", **attrs)
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    assert np.array_equal(w, w0) and np.array_equal(dy, dy0)  # inputs untouched
    return got, normalized_error(got, conv_bwd_data_ref, dy, w, isz, **geom)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grouped_gemm_matches_reference(case, dtype):
    got, err = _run(case, dtype)
    assert err <= tolerance(dtype)
    assert np.isfinite(got).all()  # every element written (dX is not zeroed first)


def test_grouped_gemm_one_thread():
    n = nc.get_num_threads()
    nc.set_num_threads(1)
    try:
        assert _run(CASES[0], "float32", seed=3)[1] <= tolerance("float32")
    finally:
        nc.set_num_threads(n)


def test_grouped_gemm_writes_every_element(monkeypatch):
    """dX comes from the memory pool unzeroed: fill what the pool hands out with NaN, and
    every element must still be written (the regions and stride phases cover dX exactly,
    a partial tile's padded rows go to the scratch)."""
    from numbaconv import memory
    real = memory.empty

    def nan_empty(*a, **k):
        out = real(*a, **k)
        if out.dtype.kind == "f":
            out.fill(np.nan)
        return out

    monkeypatch.setattr(memory, "empty", nan_empty)
    for case in CASES:
        got, err = _run(case, "float32", seed=7)
        assert np.isfinite(got).all() and err <= tolerance("float32"), case


def _problem(g, icg, ocg, hw, stride=1, dtype="float32"):
    osz = -(-hw // stride)
    dy = np.zeros((2, osz, osz, g * ocg), dtype)
    w = np.zeros((3, 3, icg, g * ocg), dtype)
    return nc.plan("convolution_backprop_data", dy, w, (hw, hw), strides=stride,
                   pads_begin=1, pads_end=1, groups=g, strategy="direct")


def test_rule():
    """Square groups of one vector, any host width the entry was measured on, strided
    layers only over small dY; float16 and other channel counts declined with a reason."""
    vl = ggemm.lanes(4)
    s = strategy.STRATEGY
    assert s.accepts(_problem(32, vl, vl, 14).problem) is None
    assert s.accepts(_problem(32, vl, vl, 28, stride=2).problem) is None   # 14x14 dY
    assert "stride 2 over 784 dY pixels per image (> 256)" in s.accepts(
        _problem(32, vl, vl, 56, stride=2).problem)
    assert "square" in s.accepts(_problem(32, vl, 2 * vl, 14).problem)
    assert "square" in s.accepts(_problem(16, 2 * vl, 2 * vl, 14).problem)  # two vectors
    assert "float16" in s.accepts(_problem(32, vl, vl, 14, dtype="float16").problem)
    assert "one group" in s.accepts(_problem(1, vl, vl, 14).problem)
    p = _problem(32, vl, vl, 14).problem
    assert s.accepts(dataclasses.replace(p, direction="bwd_w")) is not None


def test_rule_by_host(monkeypatch):
    """Measured on 64-byte-vector hosts only: elsewhere it declines, naming the width."""
    monkeypatch.setattr(strategy, "VECTOR_BYTES_MEASURED", (64,))
    vl = ggemm.lanes(4)
    why = strategy.STRATEGY.accepts(_problem(32, vl, vl, 14).problem)
    if ggemm.VECTOR_BYTES == 64:
        assert why is None
    else:
        assert f"{ggemm.VECTOR_BYTES}-byte" in why


def test_planner_takes_it_for_resnext_third_stage(monkeypatch):
    """ResNeXt-50's 14x14 layer (32 groups of 16 float32 channels) on an AVX-512 host."""
    if ggemm.VECTOR_BYTES != 64:
        pytest.skip("the rule is for 64-byte-vector hosts")
    monkeypatch.setattr(strategy, "VECTOR_BYTES_MEASURED", (64,))
    dy = np.zeros((8, 14, 14, 512), np.float32)
    w = np.zeros((3, 3, 16, 512), np.float32)
    p = nc.plan("convolution_backprop_data", dy, w, (14, 14), strides=1, pads_begin=1,
                pads_end=1, groups=32)
    assert (p.strategy, p.variant) == ("gemm", "grouped"), p
    assert p.tiles["vectors"] == 1 and p.tiles["groups"] == ggemm.NVT
