"""The windows variant of the GEMM strategy (weight gradients tap by tap over the window of
output pixels whose tap lies inside the input, :mod:`numbaconv.strategies.windows`)
against the float64 NumPy reference: 1-D, 2-D and 3-D, strides, dilations, pads on either
side and pads wider than a tap's reach (taps that read nothing but padding), batches,
float16/32/64; the windows themselves against a brute-force count; inputs untouched,
bitwise-equal repeated calls; and the planner's choice of it."""
import itertools

import numpy as np
import pytest

import numbaconv as nc
from numbaconv.problem import ConvProblem
from numbaconv.strategies import windows as W
from reference import case_operands, conv_bwd_filter_ref, normalized_error, tolerance

# (mb, ic, oc, input spatial, kernel, stride, dilation, pads_begin, pads_end)
CASES = [
    # DeepLab's ASPP: dilation 12 over a 13x13 map (most taps half in the padding)
    (1, 64, 64, (13, 13), (3, 3), (1, 1), (12, 12), (12, 12), (12, 12)),
    # SSD's fc6-like: dilation 3, batch 2, asymmetric pads
    (2, 64, 72, (9, 8), (3, 3), (1, 1), (3, 2), (3, 1), (2, 3)),
    # pads wider than a tap's reach (along h the first tap reads only padding), stride 2
    # and dilation along w
    (2, 64, 64, (3, 9), (3, 3), (1, 2), (3, 3), (6, 4), (0, 6)),
    # 3-D over few slices (C3D's conv4b-like)
    (1, 64, 80, (3, 5, 6), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1)),
    # 3-D, 5x5x5 over 2x4x4 (V-Net's stage 5-like), stride 2 along d
    (1, 64, 64, (4, 4, 4), (5, 5, 5), (2, 1, 1), (1, 1, 1), (2, 2, 2), (2, 2, 2)),
    # 1-D, dilated, a batch of 3
    (3, 96, 64, (17,), (5,), (1,), (4,), (8,), (8,)),
]
IDS = [f"mb{c[0]}ic{c[1]}oc{c[2]}i{'x'.join(map(str, c[3]))}k{'x'.join(map(str, c[4]))}"
       f"s{'x'.join(map(str, c[5]))}d{'x'.join(map(str, c[6]))}" for c in CASES]


def _operands(case, dtype, seed=0):
    mb, ic, oc, isz, k, st, dl, pb, pe = case
    x, w, dy, geom, attrs = case_operands(case, dtype, seed)
    return x, dy, k, geom, attrs


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_windows_match_reference(case, dtype):
    x, dy, k, geom, attrs = _operands(case, dtype)
    x0, dy0 = x.copy(), dy.copy()
    plan = nc.plan("convolution_backprop_filters", x, k, dy, strategy="gemm[windows]", **attrs)
    assert (plan.strategy, plan.variant) == ("gemm", "windows"), plan
    got = nc.convolution_backprop_filters(x, k, dy, strategy="gemm[windows]", **attrs)
    assert got.dtype == np.dtype(dtype) and got.shape == (*k, x.shape[-1], dy.shape[-1])
    assert np.array_equal(x, x0) and np.array_equal(dy, dy0)  # inputs untouched
    err = normalized_error(got, conv_bwd_filter_ref, x, dy, k, **geom)
    assert err <= tolerance(dtype), err


def test_taps_that_read_only_padding_give_zeros():
    """Case 2's pads reach past some taps' every output: their rows of dW are zeros."""
    x, dy, k, geom, attrs = _operands(CASES[2], "float64")
    got = nc.convolution_backprop_filters(x, k, dy, strategy="gemm[windows]", **attrs)
    ref = conv_bwd_filter_ref(x, dy, k, **geom)
    empty = [t for t, w in enumerate(W.windows(_problem(CASES[2])))
             if any(n == 0 for _, n, _ in w)]
    assert empty, "the case should have taps on padding only"
    flat = got.reshape(-1, *got.shape[-2:])
    for t in empty:
        assert not flat[t].any()
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def _problem(case):
    mb, ic, oc, isz, k, st, dl, pb, pe = case
    n = len(isz)
    lift = (lambda v, f: (f,) * (3 - n) + tuple(v))
    osz = tuple((i + b + e - d * (kk - 1) - 1) // s + 1
                for i, kk, s, d, b, e in zip(isz, k, st, dl, pb, pe))
    return ConvProblem("bwd_w", mb, 1, ic, oc, lift(isz, 1), lift(k, 1), lift(osz, 1),
                       lift(st, 1), lift(dl, 1), lift(pb, 0), lift(pe, 0), n, "float32")


def test_axis_windows_against_brute_force():
    for o, i, s, d, p, t in itertools.product(range(1, 7), range(1, 8), (1, 2, 3), (1, 2, 5),
                                              range(0, 6), range(0, 4)):
        valid = [q for q in range(o) if 0 <= q * s - p + t * d < i]
        o0, n, i0 = W._axis_window(o, i, s, d, p, t)
        assert n == len(valid)
        if valid:
            assert list(range(o0, o0 + n)) == valid and i0 == valid[0] * s - p + t * d


def test_windows_are_bitwise_reproducible():
    x, dy, k, _, attrs = _operands(CASES[1], "float32", 3)
    a = nc.convolution_backprop_filters(x, k, dy, strategy="gemm[windows]", **attrs)
    b = nc.convolution_backprop_filters(x, k, dy, strategy="gemm[windows]", **attrs)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_windows_choice():
    """The planner takes it for dilated layers with wide pads and 3-D layers over few
    slices (64+ channels, one group); it declines the rest with its reasons."""
    def problem(ic, oc, n=33, k=3, d=1, p=1, g=1, s=1):
        o = (n + 2 * p - d * (k - 1) - 1) // s + 1
        return ConvProblem("bwd_w", 1, g, ic, oc, (1, n, n), (1, k, k), (1, o, o),
                           (1, s, s), (1, d, d), (0, p, p), (0, p, p), 2, "float32")

    aspp = problem(256, 256, d=12, p=12)                       # DeepLab's ASPP
    assert W.pad_share(aspp) > 0.4 and W.STRATEGY.accepts(aspp) is None
    x = np.zeros((1, 33, 33, 256), np.float32)
    plan = nc.plan("convolution_backprop_filters", x, (3, 3), x, strides=1, dilations=12,
                   pads_begin=12, pads_end=12)
    assert (plan.strategy, plan.variant) == ("gemm", "windows")
    assert "on the padding" in W.STRATEGY.accepts(problem(256, 256, s=2))  # 3x3, pad 1
    assert "too thin" in W.STRATEGY.accepts(problem(32, 256, d=12, p=12))
    assert "one tap" in W.STRATEGY.accepts(problem(256, 256, k=1, p=0))
    assert "one group" in W.STRATEGY.accepts(problem(256, 256, d=12, p=12, g=2))
    with pytest.raises(ValueError, match="windows"):
        nc.convolution(np.zeros((1, 9, 9, 64), np.float32), np.zeros((3, 3, 64, 64),
                       np.float32), strides=1, pads_begin=1, pads_end=1,
                       strategy="gemm[windows]")
