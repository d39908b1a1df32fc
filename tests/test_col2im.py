"""Backward data as GEMM + col2im (the GEMM strategy's variant for few input channels),
against the float64 reference: every geometry the scatter handles (w runs clipped at both
edges, dilated taps, strides wider than the kernel, 1-D and 3-D), row bands of one image
split among tasks, and both GEMM engines."""
import numpy as np
import pytest

import numbaconv as nc
from numbaconv import config, planner
from numbaconv import reference as R
from numbaconv.strategies import col2im as S

# (ic, oc, input spatial, kernel, stride, dilation, pads_begin, pads_end)
CASES = [
    (3, 16, (13, 12), (7, 7), (2, 2), (1, 1), (3, 3), (2, 3)),     # the stem, shrunk
    (2, 9, (17,), (9,), (3,), (2,), (4,), (1,)),                   # 1-D, dilated
    (1, 8, (5, 6, 7), (3, 3, 3), (1, 2, 1), (1, 1, 2), (1, 0, 2), (0, 1, 1)),  # 3-D
    (4, 12, (9, 11), (3, 5), (1, 2), (2, 2), (0, 2), (1, 1)),      # dilated w: per-tap path
    (2, 8, (11, 10), (2, 4), (3, 3), (1, 1), (0, 1), (0, 0)),      # stride > kernel along h
]
IDS = ["stem", "1d_dilated", "3d", "dilated_w", "wide_stride"]


def _check(case, dtype, mb=2, **plan_kw):
    ic, oc, isz, k, st, dl, pb, pe = case
    rng = np.random.default_rng(7)
    w = rng.standard_normal((*k, ic, oc))
    ysz = R.conv_fwd(np.zeros((1, *isz, ic)), w, st, dl, pb, pe, 1).shape[1:-1]
    dy = rng.standard_normal((mb, *ysz, oc))
    attrs = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe, strategy="gemm")
    dyc, wc = dy.astype(dtype), w.astype(dtype)
    plan = nc.plan("convolution_backprop_data", dyc, wc, isz, **attrs)
    assert (plan.strategy, plan.variant) == ("gemm", "col2im"), str(plan)
    for key, v in plan_kw.items():
        assert plan.tiles[key] == v, str(plan)
    dyc_before = dyc.copy()
    got = nc.convolution_backprop_data(dyc, wc, isz, **attrs)
    np.testing.assert_array_equal(dyc, dyc_before)  # the input is not touched
    d, w64 = dyc.astype(np.float64), wc.astype(np.float64)
    ref = R.conv_bwd_data(d, w64, isz, st, dl, pb, pe, 1)
    ra = R.conv_bwd_data(abs(d), abs(w64), isz, st, dl, pb, pe, 1)
    assert got.dtype == np.dtype(dtype) and got.shape == ref.shape
    err = R.normalized_error(got, ref, ra)
    assert err <= R.TOLERANCE[dtype], err
    return got


@pytest.mark.parametrize("engine", ["blas", "numba"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_col2im_matches_reference(case, engine, monkeypatch):
    monkeypatch.setattr(config, "GEMM_ENGINE", engine)
    monkeypatch.setattr(config, "GEMM_SLAB_BYTES", 600)  # blocks of a few output rows
    _check(case, "float64", engine=engine)


@pytest.mark.parametrize("engine", ["blas", "numba"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_col2im_whole_images_per_block(case, engine, monkeypatch):
    """Images small enough go several to one GEMM (5 images: blocks of 2, 2 and 1 on two
    workers)."""
    monkeypatch.setattr(config, "GEMM_ENGINE", engine)
    monkeypatch.setattr(config, "GEMM_SLAB_BYTES", 1 << 22)
    expect = {"images": 2} if nc.get_num_threads() == 2 else {}
    _check(case, "float64", mb=5, engine=engine, **expect)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_col2im_low_precision(dtype):
    _check(CASES[0], dtype)


@pytest.mark.parametrize("blocks", ["rows", "bands", "images"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_col2im_float16_converts_block_by_block(case, blocks, monkeypatch):
    """float16 dY goes in as bits, widened block by block, and dX comes out as bits,
    rounded task by task (whole images, or each band's rows at every depth): bit for bit
    float32's result on the widened operands, rounded once."""
    monkeypatch.setattr(config, "GEMM_SLAB_BYTES", 1 << 22 if blocks == "images" else 600)
    if blocks == "bands":
        orig = S.Col2imGemm.tiles
        monkeypatch.setattr(S.Col2imGemm, "tiles", lambda self, p, m: {
            **orig(self, p, m), **({"bands": 3} if "bands" in orig(self, p, m) else {})})
    planner.clear_plan_cache()
    assert S.STRATEGY.half_operands(None, {}) == {"dy", "result"}
    _check(case, "float16", mb=3)  # against the reference, the input not touched
    ic, oc, isz, k, st, dl, pb, pe = case
    rng = np.random.default_rng(3)
    w = rng.standard_normal((*k, ic, oc)).astype(np.float16)
    ysz = R.conv_fwd(np.zeros((1, *isz, ic)), w, st, dl, pb, pe, 1).shape[1:-1]
    dy = rng.standard_normal((3, *ysz, oc)).astype(np.float16)
    attrs = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe, strategy="gemm")
    got = nc.convolution_backprop_data(dy, w, isz, **attrs)
    want = nc.convolution_backprop_data(dy.astype(np.float32), w.astype(np.float32), isz,
                                        **attrs)
    np.testing.assert_array_equal(got.view(np.uint16), want.astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("bands", [2, 3, 5])
def test_col2im_row_bands_give_the_same_result(bands, monkeypatch):
    """Bands of one image recompute the output rows they share and keep only their own
    input rows: the same sums in the same order, so exactly the same result."""
    monkeypatch.setattr(config, "GEMM_SLAB_BYTES", 300)
    whole = _check(CASES[0], "float64", mb=1)
    orig = S.Col2imGemm.tiles
    monkeypatch.setattr(S.Col2imGemm, "tiles",
                        lambda self, p, m: {**orig(self, p, m), "bands": bands})
    planner.clear_plan_cache()  # the plan above is cached with the planner's own bands
    np.testing.assert_array_equal(_check(CASES[0], "float64", mb=1, bands=bands), whole)


def test_col2im_is_the_default_for_the_stem_shape():
    dy = np.zeros((2, 4, 4, 64), np.float32)
    w = np.zeros((7, 7, 3, 64), np.float32)
    plan = nc.plan("conv2d_backprop_input", [2, 8, 8, 3], w, dy, [1, 2, 2, 1],
                   [[0, 0], [3, 3], [3, 3], [0, 0]])
    assert (plan.strategy, plan.variant) == ("gemm", "col2im"), str(plan)


def test_col2im_declines_with_reasons():
    """Forcing ``gemm`` where both variants decline names each with its reason."""
    dy = np.zeros((1, 8, 8, 16), np.float32)
    # (a 1x1 kernel would be gemm[identity]'s: tests/test_strategies.py,
    # test_narrow_results_run_as_blas_gemms)
    with pytest.raises(ValueError, match=r"declines.*gemm\[col2im\]: taps x input "
                                         r"channels = 6 \(< 16\)"):
        nc.convolution_backprop_data(dy[:, :, :7], np.zeros((1, 2, 3, 16), np.float32),
                                     (8, 8), strides=1, strategy="gemm")
    with pytest.raises(ValueError, match=r"gemm\[col2im\]: grouped \(2 groups\)"):
        nc.convolution_backprop_data(dy, np.zeros((3, 3, 2, 16), np.float32), (8, 8),
                                     strides=1, pads_begin=1, pads_end=1, groups=2,
                                     strategy="gemm")
