"""The rows variant of the GEMM strategy (backward weights with strided views of the input
as the GEMM's A, :func:`numbaconv.kernels.cpu.ukernel.gemm_rows_bwd_w`) against the float64
NumPy reference: 1-D, 2-D and 3-D, strides, pads on either side (including pads wider
than the kernel, whose taps leave the input), dilation along d and h, row-tile and
column remainders, fewer output pixels than threads, float16/32/64; and the planner's
choice of it."""
import numpy as np
import pytest

import numbaconv as nc
from numbaconv.strategies import rowgemm
from reference import case_operands, conv_bwd_filter_ref, normalized_error, tolerance

# (mb, ic, oc, input spatial, kernel, stride, dilation, pads_begin, pads_end)
CASES = [
    # the 1-D stem of the conv1d suite, small: 7 taps x 3 channels = 21 rows of A
    (3, 3, 64, (40,), (7,), (2,), (1,), (3,), (3,)),
    # WaveNet-like: 2 taps x 32 channels, no padding (x used in place)
    (2, 32, 32, (37,), (2,), (1,), (1,), (0,), (0,)),
    # 2-D stem-like, asymmetric pads, 17 output channels (a partial vector)
    (2, 3, 17, (11, 13), (7, 7), (2, 2), (1, 1), (3, 2), (2, 3)),
    # 2-D, dilation along h, pads wider than the kernel along h, stride 3 along w
    (1, 5, 8, (6, 10), (3, 4), (1, 3), (2, 1), (4, 1), (3, 0)),
    # 3-D, stride and dilation along d, one output pixel per row
    (2, 4, 12, (5, 4, 3), (3, 2, 3), (2, 1, 1), (2, 1, 1), (1, 0, 0), (1, 1, 0)),
    # one output pixel in all (fewer pixels than threads)
    (1, 6, 9, (3,), (3,), (1,), (1,), (0,), (0,)),
]
IDS = [f"mb{c[0]}ic{c[1]}oc{c[2]}i{'x'.join(map(str, c[3]))}k{'x'.join(map(str, c[4]))}"
       f"s{'x'.join(map(str, c[5]))}" for c in CASES]


def _run(case, dtype, seed=0):
    mb, ic, oc, isz, k, st, dl, pb, pe = case
    x, w, dy, geom, attrs = case_operands(case, dtype, seed)
    x0, dy0 = x.copy(), dy.copy()
    # forced: stems and long rows plan gemm[patch] (tests/test_patch.py)
    force = "gemm[rows]"
    plan = nc.plan("convolution_backprop_filters", x, k, dy, strategy=force, **attrs)
    assert (plan.strategy, plan.variant) == ("gemm", "rows"), plan
    got = nc.convolution_backprop_filters(x, k, dy, strategy=force, **attrs)
    assert got.dtype == np.dtype(dtype) and got.shape == w.shape
    assert np.array_equal(x, x0) and np.array_equal(dy, dy0)  # inputs untouched
    return normalized_error(got, conv_bwd_filter_ref, x, dy, k, **geom)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_rows_variant_matches_reference(case, dtype):
    assert _run(case, dtype) <= tolerance(dtype)


def test_rows_variant_float16():
    assert _run(CASES[0], "float16") <= tolerance("float16")


def test_rows_variant_one_thread():
    nt = nc.get_num_threads()
    try:
        nc.set_num_threads(1)
        assert _run(CASES[2], "float32", seed=3) <= tolerance("float32")
    finally:
        nc.set_num_threads(nt)


def test_rows_variant_choice(without_patch_t):
    """Few weights per tap row and few output channels take the rows variant; wider
    problems, dilation along w, groups and the other directions do not. (Rows of 16
    input pixels: longer rows, and stems, take gemm[patch], tests/test_patch.py.)"""
    def plan(ic, oc, k=(7,), dl=(1,), groups=1, op="convolution_backprop_filters"):
        x = np.zeros((2, 16, ic), np.float32)
        dy = np.zeros((2, 16 - (k[0] - 1) * dl[0], oc), np.float32)
        attrs = dict(strides=1, dilations=dl, pads_begin=0, pads_end=0, groups=groups)
        if op == "convolution_backprop_filters":
            return nc.plan(op, x, k, dy, **attrs)
        w = np.zeros((*k, ic // groups, oc), np.float32)
        return nc.plan(op, dy, w, (16,), **attrs)

    assert plan(8, 64).variant == "rows"
    assert plan(3, 64).variant == "patch"  # a stem: tests/test_patch.py
    assert plan(32, 64, k=(2,)).variant == "rows"
    wide = plan(32, 64, k=(3,))          # 96 weights per tap row
    assert wide.variant != "rows" and "weights per tap row" in str(wide)
    assert plan(8, rowgemm.MAX_OUTPUT_CHANNELS + 1).variant != "rows"
    dil = plan(8, 64, dl=(2,))
    assert dil.variant != "rows" and "dilation 2 along w" in str(dil)
    assert plan(16, 64, k=(3,), groups=2).variant != "rows"
    assert plan(3, 64, op="convolution_backprop_data").variant != "rows"
    one = plan(16, 32, k=(1,))           # 1x1: the GEMM strategy's operands are the arrays
    assert one.variant != "rows" and "1x1" in str(one)


def test_rows_variant_declines_the_blas_engine(monkeypatch):
    from numbaconv import config
    monkeypatch.setattr(config, "GEMM_ENGINE", "blas")
    x, dy = np.zeros((2, 30, 8), np.float32), np.zeros((2, 24, 64), np.float32)
    plan = nc.plan("convolution_backprop_filters", x, (7,), dy, strides=1, pads_begin=0,
                   pads_end=0)
    assert plan.variant != "rows" and "GEMM_ENGINE" in str(plan)
