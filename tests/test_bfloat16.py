"""bfloat16 (the ``ml_dtypes`` NumPy dtype): every op and every planner entry forced by
``strategy=`` against the float64 reference within docs/contract.md section 10's bound,
computed in float32 and rounded once (bit for bit the float32 call's result rounded to
nearest even), ``out=``, NaN and Inf, the conversion kernels bit for bit, mixed dtypes,
and that numbaconv never needs ml_dtypes itself.

The bound: the operands are exact bfloat16 values, so the float32 sums carry only
float32's error (1e-5 of the scale, 1e-4 under Winograd), and the one rounding to
bfloat16's 8 significant bits moves a result by at most half a unit in its last place,
2^-8 of its magnitude: ``2^-8 + 1e-5`` (``2^-8 + 1e-4`` under Winograd).
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

import numbaconv as nc  # noqa: E402
from numbaconv import planner  # noqa: E402
from numbaconv.backends import cpu  # noqa: E402
from numbaconv.strategies import label  # noqa: E402
from reference import (TOL_BF16, assert_matches, conv_bwd_data_ref,  # noqa: E402
                       conv_bwd_filter_ref, conv_fwd_ref, depthwise_to_xio, normalized_error,
                       oix_to_xio, to_channels_last, xio_to_oix)
from strategy_cases import CASES, call, operands, patch  # noqa: E402
from strategy_cases import plan as plan_of  # noqa: E402
from numbaconv.strategies import bf16dot as bf16dot_strategy  # noqa: E402
from numbaconv.strategies.bf16dot import STRATEGY as BF16_DOT, host_has_bf16  # noqa: E402
from numbaconv.strategies.bf16amx import STRATEGY as BF16_AMX  # noqa: E402
from numbaconv.strategies.bf16amx import TAPS as BF16_AMX_TAPS  # noqa: E402
from numbaconv.kernels.cpu import _amx  # noqa: E402
from numbaconv.kernels.cpu import bf16dot as bf16dot_kernels  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)


def _bf16(rng, *shape):
    return rng.standard_normal(shape).astype(BF16)


def _out_size(isz, ksz, stride, dilation, pads_begin, pads_end):
    """The forward output's spatial size."""
    return tuple((i + b + e - (kk - 1) * d - 1) // s + 1
                 for i, kk, s, d, b, e in zip(isz, ksz, stride, dilation, pads_begin, pads_end))


def _rounded(a):
    """float32 results rounded to bfloat16 by ml_dtypes (round to nearest even)."""
    with np.errstate(invalid="ignore"):
        return np.asarray(a, np.float32).astype(BF16)


def _same_bits(got, want):
    assert got.dtype == BF16 and want.dtype == BF16, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    g, w = got.view(np.uint16), want.view(np.uint16)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (f"{bad.size} of {g.size} elements differ, first "
                           f"{got.reshape(-1)[bad[0]]} != {want.reshape(-1)[bad[0]]}")


def _as_f32(ops):
    return {k: np.asarray(v, np.float32) for k, v in ops.items()}


# -- the conversion kernels, bit for bit ---------------------------------------------------------
@pytest.mark.parametrize("parallel", [False, True])
def test_every_bfloat16_widens_to_its_bits_shifted(parallel):
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(BF16).reshape(256, 256)
    got = cpu.to_float32(h[:, ::-1], parallel)  # a non-contiguous operand
    assert got.dtype == np.float32 and got.flags.c_contiguous
    want = (h[:, ::-1].view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[finite], h[:, ::-1][finite].astype(np.float32))


@pytest.mark.parametrize("parallel", [False, True])
def test_rounding_to_bfloat16_is_nearest_even_with_nan_kept(parallel):
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2 ** 32, 300_000, dtype=np.uint64).astype(np.uint32)
    special = np.array([
        0x3F808000, 0x3F818000,      # ties: to the even neighbour (down, up)
        0x3F808001, 0x3F807FFF,      # just above / below a tie
        0x7F7FFFFF, 0x7F7F7FFF,      # rounds up to Inf / stays the largest finite
        0xFF7FFFFF,                  # to -Inf
        0x7F800000, 0xFF800000,      # Inf
        0x7F800001, 0xFF800001,      # NaN with its payload in the lower half only
        0x7FC00000, 0x7FFFFFFF,      # quiet NaN, NaN that would carry into the sign
        0x00000000, 0x80000000,      # zeros
        0x00000001, 0x00008000, 0x00018000, 0x807FFFFF,  # subnormals
    ], np.uint32)
    x = np.concatenate([special, bits]).view(np.float32)
    got = cpu.to_bfloat16(x, parallel)
    assert got.dtype == BF16 and got.shape == x.shape
    want = _rounded(x)
    nan = np.isnan(x)
    assert np.isnan(got[nan]).all()
    np.testing.assert_array_equal(np.signbit(got[nan]), np.signbit(x[nan]))
    np.testing.assert_array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))
    assert list(got[:9].view(np.uint16)) == [0x3F80, 0x3F82, 0x3F81, 0x3F80, 0x7F80, 0x7F7F,
                                            0xFF80, 0x7F80, 0xFF80]


# -- every planner entry forced by strategy= ---------------------------------------------------
def _first_case_per_entry():
    seen = {}
    for c in CASES:
        if c.dtype == "float32":
            seen.setdefault((c.label, c.direction), c)
    return seen


ENTRIES = _first_case_per_entry()


def _reference(case, ops):
    nd = len(case.isz)
    pb, pe = case.pads or ((0,) * nd, (0,) * nd)
    kw = dict(stride=case.stride or 1, dilation=case.dilation or 1, pads_begin=pb,
              pads_end=pe, groups=case.g)
    if case.direction == "fwd":
        return conv_fwd_ref, (ops["x"], ops["w"]), kw
    if case.direction == "bwd_d":
        return (lambda dy, w, **k: conv_bwd_data_ref(dy, w, case.isz, **k)), \
            (ops["dy"], ops["w"]), kw
    return (lambda x, dy, **k: conv_bwd_filter_ref(x, dy, case.k, **k)), \
        (ops["x"], ops["dy"]), kw


def test_every_entry_has_a_bfloat16_case():
    for direction in ("fwd", "bwd_d", "bwd_w"):
        for s in planner.candidates(direction):
            assert ((label(s), direction) in ENTRIES
                    or label(s) in ("gemm[bf16-dot]", "gemm[bf16-amx]",
                                    "gemm[bf16-amx-taps]")
                    and direction in BF16_DOT_DIRECTIONS
                    or label(s) == "gemm[bf16-regions]" and direction == "bwd_d"
                    or label(s) == "gemm[bf16-wgrad]" and direction == "bwd_w"), \
                (label(s), direction)


@pytest.mark.parametrize("key", sorted(ENTRIES), ids=[f"{k[0]}-{k[1]}" for k in sorted(ENTRIES)])
def test_forced_entry_in_bfloat16(key, monkeypatch):
    """Each entry, forced: within the bound of the reference, and exactly the float32
    call on the same values rounded once."""
    case = ENTRIES[key]
    forced = type(case)(**{**case.__dict__, "strategy": case.label, "dtype": "bfloat16"})
    patch(forced, monkeypatch)
    ops = operands(forced)
    assert all(a.dtype == BF16 for a in ops.values())
    kept = {k: v.copy() for k, v in ops.items()}
    p = plan_of(forced, ops)
    assert label(planner.implementation(p)) == case.label, str(p)
    assert p.problem.dtype == "bfloat16" and p.problem.compute_dtype == "float32"
    got = call(forced, ops)
    ref_fn, args, kw = _reference(forced, ops)
    assert_matches(got, BF16, ref_fn, *args, strategy=p.strategy, **kw)
    _same_bits(got, _rounded(call(forced, _as_f32(ops))))
    for k in ops:  # inputs untouched
        np.testing.assert_array_equal(ops[k].view(np.uint16), kept[k].view(np.uint16))


# -- every op, layout and rank --------------------------------------------------------------------
def _tf_cases():
    """(id, call(dtype) -> (got, ref_fn, ref_args, ref_kw)) for the TF-style ops."""
    rng = np.random.default_rng(11)
    out = []

    def add(id_, fn):
        out.append(pytest.param(fn, id=id_))

    # conv2d NCHW, strided, dilated, SAME
    x2, w2 = _bf16(rng, 2, 6, 9, 8), _bf16(rng, 3, 3, 6, 5)      # x NCHW [2, 6, 9, 8]
    pb, pe = (2, 2), (2, 2)  # SAME for 9x8, k3 d2 s1

    def conv2d(dt):
        got = nc.conv2d(x2.astype(dt), w2.astype(dt), 1, "SAME", data_format="NCHW",
                        dilations=[1, 1, 2, 2])
        return (to_channels_last(got), conv_fwd_ref, (to_channels_last(x2), w2),
                dict(dilation=2, pads_begin=pb, pads_end=pe))
    add("conv2d-nchw-dilated", conv2d)

    # conv2d_backprop_input NHWC, stride 2, grouped filter (C / filter_in = 2 groups)
    wg, dyg = _bf16(rng, 3, 3, 4, 6), _bf16(rng, 2, 5, 4, 6)

    def bwd_input(dt):
        got = nc.conv2d_backprop_input([2, 9, 8, 8], wg.astype(dt), dyg.astype(dt), 2,
                                       "SAME")
        return (got, lambda dy, w, **k: conv_bwd_data_ref(dy, w, (9, 8), **k), (dyg, wg),
                dict(stride=2, pads_begin=(1, 0), pads_end=(1, 1), groups=2))
    add("conv2d_backprop_input-grouped-s2", bwd_input)

    # conv2d_backprop_filter EXPLICIT pads
    xf, dyf = _bf16(rng, 2, 7, 7, 4), _bf16(rng, 2, 7, 6, 5)

    def bwd_filter(dt):
        got = nc.conv2d_backprop_filter(xf.astype(dt), [3, 2, 4, 5], dyf.astype(dt), 1,
                                        "EXPLICIT",
                                        explicit_paddings=[0, 0, 1, 1, 0, 0, 0, 0])
        return (got, lambda x, dy, **k: conv_bwd_filter_ref(x, dy, (3, 2), **k), (xf, dyf),
                dict(pads_begin=(1, 0), pads_end=(1, 0)))
    add("conv2d_backprop_filter-explicit", bwd_filter)

    # the V2 ops take a bfloat16 array for the shape they do not read
    def bwd_input_v2(dt):
        got = nc.conv2d_backprop_input_v2(np.zeros((2, 9, 8, 8), dt), wg.astype(dt),
                                          dyg.astype(dt), 2, "SAME")
        return (got, lambda dy, w, **k: conv_bwd_data_ref(dy, w, (9, 8), **k), (dyg, wg),
                dict(stride=2, pads_begin=(1, 0), pads_end=(1, 1), groups=2))
    add("conv2d_backprop_input_v2", bwd_input_v2)

    def bwd_filter_v2(dt):
        got = nc.conv2d_backprop_filter_v2(xf.astype(dt), np.zeros((3, 2, 4, 5), dt),
                                           dyf.astype(dt), 1, [[1, 1], [0, 0]])
        return (got, lambda x, dy, **k: conv_bwd_filter_ref(x, dy, (3, 2), **k), (xf, dyf),
                dict(pads_begin=(1, 0), pads_end=(1, 0)))
    add("conv2d_backprop_filter_v2-pairs", bwd_filter_v2)

    # depthwise, multiplier 2
    xd, wd = _bf16(rng, 2, 8, 8, 4), _bf16(rng, 3, 3, 4, 2)
    dyd = _bf16(rng, 2, 8, 8, 8)
    wd_xio = depthwise_to_xio(wd)
    same = dict(pads_begin=(1, 1), pads_end=(1, 1), groups=4)

    def dw_fwd(dt):
        got = nc.depthwise_conv2d_native(xd.astype(dt), wd.astype(dt), 1, "SAME")
        return got, conv_fwd_ref, (xd, wd_xio), same
    add("depthwise_conv2d_native", dw_fwd)

    def dw_bwd_input(dt):
        got = nc.depthwise_conv2d_native_backprop_input([2, 8, 8, 4], wd.astype(dt),
                                                        dyd.astype(dt), 1, "SAME")
        return (got, lambda dy, w, **k: conv_bwd_data_ref(dy, w, (8, 8), **k),
                (dyd, wd_xio), same)
    add("depthwise_conv2d_native_backprop_input", dw_bwd_input)

    def dw_bwd_filter(dt):
        got = nc.depthwise_conv2d_native_backprop_filter(xd.astype(dt), [3, 3, 4, 2],
                                                         dyd.astype(dt), 1, "SAME")
        # [3, 3, 4, 2] depthwise filter <- XIO [3, 3, 1, 8]
        return (got.reshape(3, 3, 1, 8),
                lambda x, dy, **k: conv_bwd_filter_ref(x, dy, (3, 3), **k), (xd, dyd), same)
    add("depthwise_conv2d_native_backprop_filter", dw_bwd_filter)

    # 3-D, NCDHW forward and NDHWC backward passes
    x3, w3 = _bf16(rng, 1, 3, 5, 6, 4), _bf16(rng, 2, 3, 2, 3, 4)   # x NCDHW
    dy3 = _bf16(rng, 1, 5, 6, 4, 4)                                  # NDHWC, SAME s1
    p3 = dict(pads_begin=(0, 1, 0), pads_end=(1, 1, 1))

    def c3d(dt):
        got = nc.conv3d(x3.astype(dt), w3.astype(dt), [1, 1, 1, 1, 1], "SAME",
                        data_format="NCDHW")
        return to_channels_last(got), conv_fwd_ref, (to_channels_last(x3), w3), p3
    add("conv3d-ncdhw", c3d)

    def c3d_bwd_input(dt):
        got = nc.conv3d_backprop_input_v2([1, 5, 6, 4, 3], w3.astype(dt), dy3.astype(dt),
                                          [1, 1, 1, 1, 1], "SAME")
        return (got, lambda dy, w, **k: conv_bwd_data_ref(dy, w, (5, 6, 4), **k),
                (dy3, w3), p3)
    add("conv3d_backprop_input_v2", c3d_bwd_input)

    x3l = to_channels_last(x3)

    def c3d_bwd_filter(dt):
        got = nc.conv3d_backprop_filter_v2(np.ascontiguousarray(x3l).astype(dt),
                                           [2, 3, 2, 3, 4], dy3.astype(dt), [1, 1, 1, 1, 1],
                                           "SAME")
        return (got, lambda x, dy, **k: conv_bwd_filter_ref(x, dy, (2, 3, 2), **k),
                (x3l, dy3), p3)
    add("conv3d_backprop_filter_v2", c3d_bwd_filter)
    return out


def _generic_cases():
    rng = np.random.default_rng(12)
    out = []
    for nd, g, fmt, ffmt in ((1, 2, "NCX", "OIX"), (2, 1, "NXC", "XIO"),
                             (3, 2, "NXC", "OIX"), (2, 6, "NCX", "XIO")):
        c, k = 6, (6 if g == 6 else 4)
        isz = (9, 7, 5)[:nd]
        ksz = (3, 2, 2)[:nd]
        st, dil = (2, 1, 1)[:nd], (1, 2, 1)[:nd]
        pb, pe = (1, 0, 1)[:nd], (1, 1, 0)[:nd]
        osz = tuple((i + b + e - (kk - 1) * d - 1) // s + 1
                    for i, kk, s, d, b, e in zip(isz, ksz, st, dil, pb, pe))
        x_cl, dy_cl = _bf16(rng, 2, *isz, c), _bf16(rng, 2, *osz, k)
        w_xio = _bf16(rng, *ksz, c // g, k)
        x = x_cl if fmt == "NXC" else np.moveaxis(x_cl, -1, 1)
        dy = dy_cl if fmt == "NXC" else np.moveaxis(dy_cl, -1, 1)
        w = w_xio if ffmt == "XIO" else xio_to_oix(w_xio)
        attrs = dict(strides=st, dilations=dil, pads_begin=pb, pads_end=pe, groups=g,
                     data_format=fmt, filter_format=ffmt)
        kw = dict(stride=st, dilation=dil, pads_begin=pb, pads_end=pe, groups=g)
        cl = (lambda a: a) if fmt == "NXC" else to_channels_last
        wl = (lambda a: a) if ffmt == "XIO" else oix_to_xio
        tag = f"{nd}d-g{g}-{fmt}-{ffmt}"

        def fwd(dt, x=x, w=w, attrs=attrs, kw=kw, cl=cl, x_cl=x_cl, w_xio=w_xio):
            got = nc.convolution(x.astype(dt), w.astype(dt), **attrs)
            return cl(got), conv_fwd_ref, (x_cl, w_xio), kw

        def bwd_d(dt, dy=dy, w=w, attrs=attrs, kw=kw, cl=cl, dy_cl=dy_cl, w_xio=w_xio,
                  isz=isz):
            got = nc.convolution_backprop_data(dy.astype(dt), w.astype(dt), isz, **attrs)
            return (cl(got), lambda a, b, **k_: conv_bwd_data_ref(a, b, isz, **k_),
                    (dy_cl, w_xio), kw)

        def bwd_w(dt, x=x, dy=dy, attrs=attrs, kw=kw, wl=wl, x_cl=x_cl, dy_cl=dy_cl,
                  ksz=ksz):
            got = nc.convolution_backprop_filters(x.astype(dt), ksz, dy.astype(dt), **attrs)
            return (wl(got), lambda a, b, **k_: conv_bwd_filter_ref(a, b, ksz, **k_),
                    (x_cl, dy_cl), kw)
        out += [pytest.param(fwd, id=f"convolution-{tag}"),
                pytest.param(bwd_d, id=f"convolution_backprop_data-{tag}"),
                pytest.param(bwd_w, id=f"convolution_backprop_filters-{tag}")]
    return out


@pytest.mark.parametrize("mode", ["planner", "float32-kernels", "planner-small"])
@pytest.mark.parametrize("fn", _tf_cases() + _generic_cases())
def test_op_in_bfloat16(fn, mode, monkeypatch):
    """Every op, 1-D to 3-D, grouped and depthwise, both layouts: within the bound.
    ``planner``: the planner's choice (``gemm[bf16-dot]`` where the host has AVX512_BF16
    and the problem suits it); ``float32-kernels``: that entry off, the compiled float32
    strategies on widened operands, bit for bit the float32 call rounded once;
    ``planner-small``: the planner's choice for a small problem (the numpy entry), also
    bit for bit."""
    if mode == "planner-small":
        from numbaconv import config
        monkeypatch.setattr(config, "SMALL_FLOPS", 10 ** 9)
    if mode == "float32-kernels":
        monkeypatch.setattr(type(BF16_DOT), "accepts", lambda self, p: "off in this test")
    got, ref_fn, args, kw = fn(BF16)
    assert_matches(got, BF16, ref_fn, *args, **kw)
    if mode != "planner":
        want, *_ = fn(np.float32)
        _same_bits(got, _rounded(want))


# -- gemm[bf16-dot]: AVX512_BF16's dot products -------------------------------------------------
BF16_DOT_DIRECTIONS = ("fwd", "bwd_d", "bwd_w")
needs_bf16_dot = pytest.mark.skipif(not host_has_bf16(), reason="no AVX512_BF16 on this host")
needs_amx = pytest.mark.skipif(not (host_has_bf16() and _amx.request_amx()),
                               reason="no AMX tiles with bfloat16 products on this host")
#: The GEMM kernels that share :func:`bf16dot._block_body`: AVX512_BF16's 6 x 64 tile and
#: AMX's 32 x 64 tile (``gemm[bf16-amx]``).
GEMM_KERNELS = ["bf16dot", pytest.param("bf16amx", marks=needs_amx)]


def _gemm_kernel(name):
    return bf16dot_kernels if name == "bf16dot" else bf16dot_kernels.AMX


@pytest.fixture(autouse=True)
def _avx512_bf16_entries_first(request, monkeypatch):
    """The planner's choices among the AVX512_BF16 entries, tested in their own tests, do
    not depend on whether the host has AMX: there ``gemm[bf16-amx-taps]`` and
    ``gemm[bf16-amx]`` (first where they accept) are switched off (not in their cases that name it)."""
    name = request.node.name
    if any(e in name for e in ("bf16_dot", "bf16_regions", "bf16_wgrad")) \
            and "amx" not in name:
        for entry in (BF16_AMX, BF16_AMX_TAPS):
            monkeypatch.setattr(entry, "accepts", lambda p: "switched off by the test's fixture")
        planner.clear_plan_cache()
    yield
    planner.clear_plan_cache()

#: (id, direction, mb, input size, C, K, kernel, stride, dilation, pads): odd channel
#: counts (an odd reduction, a last row tile and a last panel of partial width), 1-D to 3-D
_DOT = [
    ("fwd-2d-odd", "fwd", 2, (9, 7), 5, 70, (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))),
    ("fwd-1d-strided-dilated", "fwd", 3, (17,), 6, 9, (3,), (2,), (2,), ((2,), (1,))),
    ("fwd-3d", "fwd", 1, (4, 5, 6), 4, 8, (2, 3, 2), (1, 2, 1), (1, 1, 1),
     ((0, 1, 1), (1, 1, 0))),
    ("bwd_d-2d-dilated", "bwd_d", 2, (10, 9), 7, 66, (3, 3), (1, 1), (2, 1),
     ((2, 1), (1, 1))),
    ("bwd_d-3d", "bwd_d", 1, (4, 5, 5), 3, 5, (3, 2, 3), (1, 1, 1), (1, 1, 1),
     ((1, 0, 1), (1, 1, 1))),
    # strided backward data: one product per stride phase (phases no tap reaches are
    # zeros; a 1x1 phase reading dY pixel for pixel multiplies dY itself)
    ("bwd_d-2d-s2", "bwd_d", 2, (11, 10), 6, 16, (3, 3), (2, 2), (1, 1), ((1, 1), (1, 0))),
    ("bwd_d-2d-s3-dilated-odd", "bwd_d", 1, (13, 11), 5, 7, (3, 2), (3, 2), (2, 3),
     ((2, 0), (1, 2))),
    ("bwd_d-1x1-s2", "bwd_d", 2, (9, 8), 4, 18, (1, 1), (2, 2), (1, 1), ((0, 0), (0, 0))),
    ("bwd_d-1d-s4", "bwd_d", 3, (23,), 3, 9, (5,), (4,), (1,), ((2,), (1,))),
    ("bwd_d-3d-s2", "bwd_d", 1, (5, 7, 6), 4, 6, (3, 3, 2), (2, 1, 2), (1, 1, 1),
     ((1, 1, 0), (1, 0, 1))),
    # an even K: the filter packed as 32-bit words, transposed in 16 x 16 blocks (a full
    # panel of 64 channels and a partial one; a full block of 16 pairs and a tail)
    ("bwd_d-2d-wide-even", "bwd_d", 1, (6, 5), 70, 36, (3, 3), (1, 1), (1, 1),
     ((1, 1), (1, 1))),
    ("bwd_d-2d-s2-wide-even", "bwd_d", 1, (9, 8), 40, 34, (3, 3), (2, 2), (1, 1),
     ((1, 1), (1, 0))),
    ("bwd_w-2d-strided", "bwd_w", 3, (11, 10), 6, 13, (3, 3), (2, 2), (1, 1),
     ((1, 1), (1, 0))),
    ("bwd_w-1d-odd-pixels", "bwd_w", 1, (15,), 3, 7, (5,), (1,), (1,), ((2,), (2,))),
    # x transposed in registers, 32 pixels x 16 channels at a time (padding pixels read
    # as zeros; a tail of channels and of pixels element by element)
    ("bwd_w-2d-wide", "bwd_w", 2, (9, 10), 40, 24, (3, 3), (1, 1), (1, 1),
     ((1, 1), (1, 1))),
    ("bwd_w-1x1-wide", "bwd_w", 1, (8, 9), 48, 20, (1, 1), (1, 1), (1, 1),
     ((0, 0), (0, 0))),
    # few rows of dW over a long reduction: the reduction in parts, summed after
    ("bwd_w-1x1-split", "bwd_w", 2, (41, 50), 8, 70, (1, 1), (1, 1), (1, 1),
     ((0, 0), (0, 0))),
]


@needs_bf16_dot
@pytest.mark.parametrize("entry", ["gemm[bf16-dot]",
                                   pytest.param("gemm[bf16-amx]", marks=needs_amx)])
@pytest.mark.parametrize("case", _DOT, ids=[c[0] for c in _DOT])
def test_bf16_dot_entry(case, entry, monkeypatch):
    """Forced, on edges of every tile: within the bound of the float64 reference, and (the
    AMX GEMM) the same bits call after call (the entries' rules for narrow layers off:
    these shapes are about the kernels' edges)."""
    for name in ("MIN_DATA_CHANNELS", "STEM_CHANNELS"):
        monkeypatch.setattr(bf16dot_strategy, name, 0)
    _, direction, mb, isz, c, k, ksz, st, dil, pads = case
    _check_forced(entry, direction, mb, isz, c, k, ksz, st, dil, pads,
                  seed=len(isz) + c + k)


def _check_forced(entry, direction, mb, isz, c, k, ksz, st, dil, pads, seed):
    """One pass of one layer forced on ``entry`` (C input, K output channels): within the
    bound of the float64 reference, and the same bits on a second call."""
    pb, pe = pads
    rng = np.random.default_rng(seed)
    osz = _out_size(isz, ksz, st, dil, pb, pe)
    x, w, dy = _bf16(rng, mb, *isz, c), _bf16(rng, *ksz, c, k), _bf16(rng, mb, *osz, k)
    attrs = dict(strides=st, dilations=dil, pads_begin=pb, pads_end=pe, strategy=entry)
    kw = dict(stride=st, dilation=dil, pads_begin=pb, pads_end=pe)
    if direction == "fwd":
        def call():
            return nc.convolution(x, w, **attrs)
        ref_fn, args = conv_fwd_ref, (x, w)
    elif direction == "bwd_d":
        def call():
            return nc.convolution_backprop_data(dy, w, isz, **attrs)
        ref_fn, args = (lambda a, b, **q: conv_bwd_data_ref(a, b, isz, **q)), (dy, w)
    else:
        def call():
            return nc.convolution_backprop_filters(x, ksz, dy, **attrs)
        ref_fn, args = (lambda a, b, **q: conv_bwd_filter_ref(a, b, ksz, **q)), (x, dy)
    got = call()
    assert_matches(got, BF16, ref_fn, *args, **kw)
    _same_bits(call(), got)


@needs_bf16_dot
def test_bf16_dot_entry_declines_with_reasons():
    x = np.zeros((1, 8, 8, 8), BF16)
    with pytest.raises(ValueError, match=r"gemm\[bf16-dot\]: 2 groups \(one group only\)"):
        nc.plan("convolution", x, np.zeros((3, 3, 4, 8), BF16), strides=1, groups=2,
                strategy="gemm[bf16-dot]")
    p = nc.plan("convolution_backprop_data", np.zeros((1, 3, 3, 8), BF16),
                np.zeros((3, 3, 32, 8), BF16), (6, 6), strides=2, pads_begin=1, pads_end=1)
    assert (p.strategy, p.variant) == ("gemm", "bf16-regions")  # (before bf16-dot)
    p = nc.plan("convolution_backprop_data", np.zeros((1, 3, 3, 8), BF16),
                np.zeros((3, 3, 32, 8), BF16), (6, 6), strides=2, pads_begin=1, pads_end=1,
                strategy="gemm[bf16-dot]")
    assert (p.strategy, p.variant) == ("gemm", "bf16-dot")  # strided: phase by phase
    # narrow layers go to the float32 entries: backward data into few channels, a stem's
    # weight gradient, 1x1 weight gradients over few channels
    with pytest.raises(ValueError, match=r"backward data into 3 channels \(< 32\)"):
        nc.plan("convolution_backprop_data", np.zeros((1, 4, 4, 64), BF16),
                np.zeros((7, 7, 3, 64), BF16), (8, 8), strides=2, pads_begin=3, pads_end=2,
                strategy="gemm[bf16-dot]")
    with pytest.raises(ValueError, match=r"weight gradient of 3 input channels \(<= 4"):
        nc.plan("convolution_backprop_filters", np.zeros((1, 8, 8, 3), BF16), (3, 3),
                np.zeros((1, 8, 8, 64), BF16), strides=1, pads_begin=1, pads_end=1,
                strategy="gemm[bf16-dot]")
    with pytest.raises(ValueError, match=r"weight gradient into 24 channels \(< 32\)"):
        nc.plan("convolution_backprop_filters", np.zeros((1, 8, 8, 64), BF16), (3, 3),
                np.zeros((1, 8, 8, 24), BF16), strides=1, pads_begin=1, pads_end=1,
                strategy="gemm[bf16-dot]")
    with pytest.raises(ValueError, match=r"weight gradient of 16 rows \(taps x input"):
        nc.plan("convolution_backprop_filters", np.zeros((1, 8, 8, 16), BF16), (1, 1),
                np.zeros((1, 8, 8, 64), BF16), strides=1, strategy="gemm[bf16-dot]")
    for c, k in ((64, 256), (256, 512), (32, 32)):
        p = nc.plan("convolution_backprop_filters", np.zeros((1, 8, 8, c), BF16), (1, 1),
                    np.zeros((1, 8, 8, k), BF16), strides=1)
        assert (p.strategy, p.variant) == ("gemm", "bf16-dot")
    with pytest.raises(ValueError, match=r"float32, not bfloat16"):
        nc.plan("convolution", x.astype(np.float32), np.zeros((3, 3, 8, 8), np.float32),
                strides=1, strategy="gemm[bf16-dot]")
    p = nc.plan("convolution", x, np.zeros((3, 3, 8, 8), BF16), strides=1)
    assert (p.strategy, p.variant) == ("gemm", "bf16-dot")
    # 3x3 at stride 1 over 64 to 255 channels: left to Winograd's float32 kernels
    x = np.zeros((2, 28, 28, 128), BF16)
    with pytest.raises(ValueError, match=r"3x3 at stride 1 over 128 channels \(64 to 255\)"):
        nc.plan("convolution", x, np.zeros((3, 3, 128, 128), BF16), strides=1, pads_begin=1,
                pads_end=1, strategy="gemm[bf16-dot]")
    p = nc.plan("convolution", x, np.zeros((3, 3, 128, 128), BF16), strides=1, pads_begin=1,
                pads_end=1)
    assert p.strategy == "winograd"
    p = nc.plan("convolution", x, np.zeros((3, 3, 128, 128), BF16), strides=2, pads_begin=1,
                pads_end=1)
    assert (p.strategy, p.variant) == ("gemm", "bf16-dot")
    # backward data of the same layer stays on the dot products, summed from dY in place
    p = nc.plan("convolution_backprop_data", x, np.zeros((3, 3, 128, 128), BF16), (28, 28),
                strides=1, pads_begin=1, pads_end=1)
    assert (p.strategy, p.variant) == ("gemm", "bf16-regions")


# -- gemm[bf16-regions]: backward data summed from dY in place, region by region -------------------
#: (id, mb, input size, C, K, kernel, stride, dilation, pads): partial row tiles and a
#: partial last panel of channels, stride phases (some that no tap reaches: zeros),
#: regions that sum no tap at all (a dilated filter wider than the image), 1-D to 3-D
_REGIONS = [
    ("3x3-partial-panel", 2, (9, 7), 70, 34, (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))),
    ("3x3-s2", 2, (11, 10), 40, 16, (3, 3), (2, 2), (1, 1), ((1, 1), (1, 0))),
    ("1x1-s2", 2, (9, 8), 64, 18, (1, 1), (2, 2), (1, 1), ((0, 0), (0, 0))),
    ("5x5-s3-dilated", 1, (13, 11), 33, 8, (3, 2), (3, 2), (2, 3), ((2, 0), (1, 2))),
    ("dilated-wider-than-image", 2, (3, 4), 32, 6, (3, 3), (1, 1), (4, 4), ((4, 4), (4, 4))),
    ("1d-s4", 3, (23,), 48, 10, (5,), (4,), (1,), ((2,), (1,))),
    ("3d-s2", 1, (5, 7, 6), 36, 6, (3, 3, 2), (2, 1, 2), (1, 1, 1), ((1, 1, 0), (1, 0, 1))),
]


@needs_bf16_dot
@pytest.mark.parametrize("case", _REGIONS, ids=[c[0] for c in _REGIONS])
def test_bf16_regions_entry(case):
    """Forced: within the bound of the float64 reference, the same bits call after call,
    and the operands untouched."""
    _, mb, isz, c, k, ksz, st, dil, (pb, pe) = case
    rng = np.random.default_rng(len(isz) + c + k)
    osz = _out_size(isz, ksz, st, dil, pb, pe)
    w, dy = _bf16(rng, *ksz, c, k), _bf16(rng, mb, *osz, k)
    w0, dy0 = w.copy(), dy.copy()
    attrs = dict(strides=st, dilations=dil, pads_begin=pb, pads_end=pe,
                 strategy="gemm[bf16-regions]")
    got = nc.convolution_backprop_data(dy, w, isz, **attrs)
    assert_matches(got, BF16, lambda a, b, **q: conv_bwd_data_ref(a, b, isz, **q), dy, w,
                   stride=st, dilation=dil, pads_begin=pb, pads_end=pe)
    _same_bits(nc.convolution_backprop_data(dy, w, isz, **attrs), got)
    _same_bits(dy, dy0)
    _same_bits(w, w0)


@needs_bf16_dot
def test_bf16_regions_entry_declines_with_reasons(monkeypatch):
    # the filter's limit as on a host with 1 MiB of L2 (between the two 7 x 7 layers' 576
    # and 1152 KiB per panel, below), whatever this host's L2
    from numbaconv.machine import machine
    from numbaconv.strategies import bf16regions
    monkeypatch.setattr(bf16regions, "PANEL_L2_FRACTION", (1 << 20) / machine().l2_bytes)

    def plan(dy, w, isz, **kw):
        return nc.plan("convolution_backprop_data", np.zeros(dy, BF16), np.zeros(w, BF16),
                       isz, strategy="gemm[bf16-regions]", **kw)

    with pytest.raises(ValueError, match=r"bf16-regions\]: 33 dY channels \(odd\)"):
        plan((1, 8, 8, 33), (3, 3, 64, 33), (8, 8), strides=1, pads_begin=1, pads_end=1)
    with pytest.raises(ValueError, match=r"1x1 at stride 1 without pads"):
        plan((1, 8, 8, 64), (1, 1, 64, 64), (8, 8), strides=1)
    with pytest.raises(ValueError, match=r"1152 KiB of packed filter per 64-channel panel"):
        plan((1, 7, 7, 1024), (3, 3, 64, 1024), (7, 7), strides=1, pads_begin=1, pads_end=1)
    with pytest.raises(ValueError, match=r"backward data into 16 channels \(< 32\)"):
        plan((1, 8, 8, 64), (3, 3, 16, 64), (8, 8), strides=1, pads_begin=1, pads_end=1)
    with pytest.raises(ValueError, match=r"2 groups"):
        plan((1, 8, 8, 64), (3, 3, 32, 64), (8, 8), strides=1, pads_begin=1, pads_end=1,
             groups=2)
    # where it declines, gemm[bf16-dot] takes the layer; ResNet-50's largest it takes
    p = nc.plan("convolution_backprop_data", np.zeros((1, 7, 7, 1024), BF16),
                np.zeros((3, 3, 64, 1024), BF16), (7, 7), strides=1, pads_begin=1, pads_end=1)
    assert (p.strategy, p.variant) == ("gemm", "bf16-dot")
    p = nc.plan("convolution_backprop_data", np.zeros((1, 7, 7, 512), BF16),
                np.zeros((3, 3, 512, 512), BF16), (7, 7), strides=1, pads_begin=1, pads_end=1)
    assert (p.strategy, p.variant) == ("gemm", "bf16-regions")


@needs_bf16_dot
def test_bf16_dot_splits_a_weight_gradients_reduction_only_where_it_pays(monkeypatch):
    """The reduction over pixels is split for few rows (taps x C) or a long reduction, not
    for rows that make enough blocks over a short one (ResNet-50's 28 x 28 layers)."""
    monkeypatch.setattr(nc.config, "THREADS", 2)

    def ks(mb, hw, c, k, ksz=(1, 1)):
        p = nc.plan("convolution_backprop_filters", np.zeros((mb, hw, hw, c), BF16), ksz,
                    np.zeros((mb, hw, hw, k), BF16), strides=1, pads_begin=ksz[0] // 2,
                    pads_end=ksz[0] // 2,
                    strategy="gemm[bf16-dot]")
        return p.tiles["ks"]

    assert ks(8, 28, 512, 128) == 1    # res3b_branch2a: 3136 pairs, 86 row tiles
    assert ks(8, 28, 128, 512) == 1    # res3a_branch2c
    assert ks(8, 56, 256, 64) > 1      # res2b_branch2a: 12544 pairs
    assert ks(8, 56, 64, 256) > 1      # res2a_branch1: 11 row tiles
    assert ks(8, 28, 8, 64, (3, 3)) > 1  # 72 rows: 12 row tiles


# -- gemm[bf16-wgrad]: weight gradients with x paired into the GEMM's panels ----------------------
#: (id, mb, input size, C, K, kernel, stride, dilation, pads): a last panel of fewer than 64
#: channels, row tiles past K, an odd count of output pixels (a last pair of one), strides
#: and dilations, taps reading padding, 1-D to 3-D, one panel shared in parts of dY's rows
_WGRAD = [
    ("3x3-partial-panel", 2, (9, 7), 96, 40, (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))),
    ("3x3-s2-odd-pixels", 1, (11, 9), 64, 38, (3, 3), (2, 2), (1, 1), ((1, 1), (1, 0))),
    ("3x3-dilated", 2, (12, 10), 32, 64, (3, 3), (1, 1), (2, 3), ((2, 3), (2, 3))),
    ("1d-5", 3, (23,), 40, 34, (5,), (2,), (1,), ((2,), (1,))),
    ("3d", 1, (4, 5, 6), 70, 32, (3, 3, 2), (1, 2, 1), (1, 1, 1), ((1, 1, 0), (0, 1, 1))),
    ("2x2-wide", 2, (8, 8), 128, 66, (2, 2), (2, 2), (1, 1), ((0, 0), (0, 0))),
]


@needs_bf16_dot
@pytest.mark.parametrize("case", _WGRAD, ids=[c[0] for c in _WGRAD])
def test_bf16_wgrad_entry(case, monkeypatch):
    """Forced (its rules about speed off): within the bound of the float64 reference, the
    same bits call after call, the operands untouched."""
    from numbaconv.strategies import bf16wgrad
    monkeypatch.setattr(bf16wgrad, "MIN_PAIRS", 0)
    monkeypatch.setattr(bf16wgrad, "WINOGRAD_BELOW", 0)
    _, mb, isz, c, k, ksz, st, dil, (pb, pe) = case
    rng = np.random.default_rng(len(isz) + c + k)
    osz = _out_size(isz, ksz, st, dil, pb, pe)
    x, dy = _bf16(rng, mb, *isz, c), _bf16(rng, mb, *osz, k)
    x0, dy0 = x.copy(), dy.copy()
    attrs = dict(strides=st, dilations=dil, pads_begin=pb, pads_end=pe,
                 strategy="gemm[bf16-wgrad]")
    got = nc.convolution_backprop_filters(x, ksz, dy, **attrs)
    assert_matches(got, BF16, lambda a, b, **q: conv_bwd_filter_ref(a, b, ksz, **q), x, dy,
                   stride=st, dilation=dil, pads_begin=pb, pads_end=pe)
    _same_bits(nc.convolution_backprop_filters(x, ksz, dy, **attrs), got)
    _same_bits(x, x0)
    _same_bits(dy, dy0)


@needs_bf16_dot
def test_bf16_wgrad_shares_a_panel_in_parts_of_dys_rows(monkeypatch):
    """Three taps of one 64-channel panel over two threads: two parts of dY^T's rows each
    (six tasks), K not a whole number of row tiles in either part."""
    monkeypatch.setattr(nc.config, "THREADS", 2)
    rng = np.random.default_rng(5)
    x, dy = _bf16(rng, 2, 32, 32, 64), _bf16(rng, 2, 32, 32, 70)
    attrs = dict(strides=1, pads_begin=(0, 1), pads_end=(0, 1), strategy="gemm[bf16-wgrad]")
    assert nc.plan("convolution_backprop_filters", x, (1, 3), dy, **attrs).tiles["parts"] == 2
    got = nc.convolution_backprop_filters(x, (1, 3), dy, **attrs)
    assert_matches(got, BF16, lambda a, b, **q: conv_bwd_filter_ref(a, b, (1, 3), **q), x, dy,
                   stride=1, dilation=1, pads_begin=(0, 1), pads_end=(0, 1))


@needs_bf16_dot
def test_bf16_wgrad_entry_declines_with_reasons():
    def plan(x, ksz, dy, **kw):
        return nc.plan("convolution_backprop_filters", np.zeros(x, BF16), ksz,
                       np.zeros(dy, BF16), strategy="gemm[bf16-wgrad]", **kw)

    with pytest.raises(ValueError, match=r"bf16-wgrad\]: a 1x1 layer"):
        plan((8, 28, 28, 64), (1, 1), (8, 28, 28, 64), strides=1)
    with pytest.raises(ValueError, match=r"196 pairs of output pixels \(< 512\)"):
        plan((8, 7, 7, 512), (3, 3), (8, 7, 7, 512), strides=1, pads_begin=1, pads_end=1)
    with pytest.raises(ValueError, match=r"3x3 at stride 1 over 64 channels \(< 128\)"):
        plan((8, 56, 56, 64), (3, 3), (8, 56, 56, 64), strides=1, pads_begin=1, pads_end=1)
    with pytest.raises(ValueError, match=r"16 input channels \(< 32\)"):
        plan((8, 28, 28, 16), (3, 3), (8, 28, 28, 64), strides=1, pads_begin=1, pads_end=1)
    with pytest.raises(ValueError, match=r"24 output channels \(< 32\)"):
        plan((8, 28, 28, 64), (3, 3), (8, 28, 28, 24), strides=1, pads_begin=1, pads_end=1)
    with pytest.raises(ValueError, match=r"2 groups"):
        plan((8, 28, 28, 64), (3, 3), (8, 28, 28, 64), strides=1, pads_begin=1, pads_end=1,
             groups=2)
    # ResNet-50's res3b_branch2b and res5b_branch2b: here, and gemm[bf16-dot]
    p = nc.plan("convolution_backprop_filters", np.zeros((8, 28, 28, 128), BF16), (3, 3),
                np.zeros((8, 28, 28, 128), BF16), strides=1, pads_begin=1, pads_end=1)
    assert (p.strategy, p.variant) == ("gemm", "bf16-wgrad")
    p = nc.plan("convolution_backprop_filters", np.zeros((8, 7, 7, 512), BF16), (3, 3),
                np.zeros((8, 7, 7, 512), BF16), strides=1, pads_begin=1, pads_end=1)
    assert (p.strategy, p.variant) == ("gemm", "bf16-dot")


@needs_bf16_dot
@pytest.mark.parametrize("entry", ["gemm[bf16-dot]",
                                   pytest.param("gemm[bf16-amx]", marks=needs_amx)])
def test_bf16_dot_flushes_products_below_float32s_normal_range(entry):
    """The instructions treat subnormal inputs and results as zero (as oneDNN's bfloat16
    kernels do): products below 2^-126 vanish on these entries, while the float32 kernels
    keep them (as subnormals, and round them to bfloat16's subnormals)."""
    x = np.full((1, 4, 4, 8), 1e-19, BF16)
    w = np.full((1, 1, 8, 8), 1e-19, BF16)
    v = float(np.float32(BF16.type(1e-19))) ** 2  # 1e-38: subnormal in float32
    assert v < 2.0 ** -126
    dot = nc.convolution(x, w, strides=1, strategy=entry)
    assert not dot.view(np.uint16).any()
    direct = nc.convolution(x, w, strides=1, strategy="direct")
    assert np.all(np.abs(direct.astype(np.float64) - 8 * v) <= 8 * v * 2 ** -7)
    # a normal range is unaffected
    big = nc.convolution(x * BF16.type(1e10), w * BF16.type(1e10), strides=1,
                         strategy=entry)
    assert np.all(np.abs(big.astype(np.float64) / (8 * v * 1e20) - 1) < 2 ** -6)


@needs_bf16_dot
@pytest.mark.parametrize("m, n, k, kc2, nrb", [
    (37, 64, 64, 128, 3),      # one block of the reduction, a last row tile of 1
    (50, 130, 258, 16, 4),     # 9 blocks of the reduction, a last panel of 2 columns
    (50, 70, 40, 8, 12),       # more row blocks than register tiles: some empty
    (7, 5, 4, 2, 1),           # every tile partial
])
@pytest.mark.parametrize("kern_name", GEMM_KERNELS)
def test_bf16_dot_gemm_rounds_in_its_tiles_as_the_backend_does(kern_name, m, n, k, kc2, nrb):
    """The GEMM rounding each tile to bfloat16 as its reduction ends (the partial sums of
    a longer one in its block's own float32 rows) gives, bit for bit, the float32 product
    rounded by the backend's converter: ties to even, NaN and Inf kept, overflow to Inf."""
    kern = _gemm_kernel(kern_name)
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    # the first columns of C exactly the specials of B's first row (A's first column ones,
    # the rest of those columns of B zeros): a NaN, infinities, a sum that overflows
    # bfloat16's range (3.3e38 + 3.3e38 in column 3), two ties, a subnormal's neighbour
    a[:, 0] = 1
    a[:, 1] = 1 if k > 1 else 0
    special = np.array([np.nan, np.inf, -np.inf, 3.3e38, 1.00390625, 1.01171875, -2.0,
                        2.0 ** -120], np.float32)
    j = min(n, 8)
    b[:, :j] = 0
    b[0, :j] = special[:j].astype(BF16)
    if k > 1 and j > 3:
        b[1, 3] = b[0, 3]
    bp = np.zeros((-(-n // kern.NR), k // 2, kern.NR), np.uint32)
    kern.pack_pairs(b.view(np.uint16), bp)
    a32 = a.view(np.uint16).view(np.uint32)
    c = np.full((m, n), np.nan, np.float32)
    kern.gemm(a32, bp, c, kc2, nrb)
    want = cpu.to_bfloat16(c).view(np.uint16)
    d = np.full((m, n), 0xABCD, np.uint16)
    kern.gemm(a32, bp, np.zeros((0, n), np.float32), kc2, nrb, d)
    np.testing.assert_array_equal(d, want)
    got = d.view(BF16).astype(np.float64)
    assert np.isnan(got[:, 0]).all() and (got[:, 1:3] == [np.inf, -np.inf]).all()
    if j > 6:
        assert (got[:, 3] == np.inf).all() and (got[:, 4:7] == [1.0, 1.015625, -2.0]).all()
    # and the product is right: within bfloat16's rounding of the float64 one
    with np.errstate(invalid="ignore"):
        ref = a.astype(np.float64) @ b.astype(np.float64)
        fin = np.isfinite(ref) & (np.abs(ref) < 3e38)
        assert np.all(np.abs(got - ref)[fin] <= 2 ** -8 * np.abs(ref)[fin] + 1e-4)


@needs_bf16_dot
@pytest.mark.parametrize("ks", [2, 3, 8])
@pytest.mark.parametrize("kern_name", GEMM_KERNELS)
def test_bf16_dot_gemm_splits_its_reduction(kern_name, ks):
    """The reduction in ``ks`` parts of whole blocks (the last one empty at 8 parts of
    4100 pairs: its sums must be zeros), part ``z``'s sums in rows ``z*M ..``: their sum
    is the product, within float32's rounding of the float64 one."""
    kern = _gemm_kernel(kern_name)
    rng = np.random.default_rng(ks)
    m, n, k = 9, 70, 8200
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    bp = np.zeros((-(-n // kern.NR), k // 2, kern.NR), np.uint32)
    kern.pack_pairs(b.view(np.uint16), bp)
    parts = np.full((ks * m, n), np.nan, np.float32)
    kern.gemm(a.view(np.uint16).view(np.uint32), bp, parts, 128, 2, None, ks)
    assert not np.isnan(parts).any()
    got = parts.reshape(ks, m, n).astype(np.float64).sum(axis=0)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    assert np.all(np.abs(got - ref) <= 1e-5 * scale)
    # each part is a real share of the work: no part holds the whole product
    assert all(np.abs(parts[z * m:(z + 1) * m] - ref).max() > 1 for z in range(ks))
    # parts are float32 sums: rounding them in the tiles is refused, not done per part
    with pytest.raises(ValueError, match=r"ks > 1"):
        kern.gemm(a.view(np.uint16).view(np.uint32), bp, parts, 128, 2,
                  np.zeros((m, n), np.uint16), ks)


@needs_bf16_dot
@pytest.mark.parametrize("m, n, k, nrb, ks, rnd", [
    (9, 70, 8201, 1, 3, False),    # odd rows of B (the last pair half zeros), 2 panels
    (13, 130, 1001, 1, 1, True),   # rounded in the tiles, a panel of 2 columns
    (20, 64, 600, 2, 2, False),    # two blocks of rows: each pairs B on its own
])
@pytest.mark.parametrize("kern_name", GEMM_KERNELS)
def test_bf16_dot_gemm_pairs_b_as_it_goes(kern_name, m, n, k, nrb, ks, rnd):
    """B handed over as it is and paired panel by panel inside the GEMM gives, bit for
    bit, the product over B packed whole first."""
    kern = _gemm_kernel(kern_name)
    rng = np.random.default_rng(m + k)
    a = rng.standard_normal((m, k + k % 2)).astype(BF16)
    a[:, k:] = 0
    b = rng.standard_normal((k, n)).astype(BF16).view(np.uint16)
    a32 = a.view(np.uint16).view(np.uint32)
    bp = np.zeros((-(-n // kern.NR), a32.shape[1], kern.NR), np.uint32)
    kern.pack_pairs(b, bp)
    none = np.zeros((0, 0, kern.NR), np.uint32)
    if rnd:
        want, got = (np.full((m, n), 0xABCD, np.uint16) for _ in range(2))
        kern.gemm(a32, bp, np.zeros((0, n), np.float32), 128, nrb, want)
        kern.gemm(a32, none, np.zeros((0, n), np.float32), 128, nrb, got, 1, b)
    else:
        want, got = (np.full((ks * m, n), np.nan, np.float32) for _ in range(2))
        kern.gemm(a32, bp, want, 128, nrb, None, ks)
        kern.gemm(a32, none, got, 128, nrb, None, ks, b)
    np.testing.assert_array_equal(got, want)
    if not rnd:
        ref = a.astype(np.float64)[:, :k] @ b.view(BF16).astype(np.float64)
        assert np.abs(want.reshape(ks, m, n).sum(axis=0) - ref).max() < 1e-3 * k ** 0.5


@needs_bf16_dot
@pytest.mark.parametrize("m, n, k, nrb, ks, npb, mode", [
    (50, 260, 300, 1, 1, 5, "rounded"),  # one panel per block, a last panel of 4 columns
    (50, 260, 300, 3, 1, 2, "float32"),  # groups of 2 and 3 panels over 3 row blocks
    (20, 200, 900, 1, 2, 4, "parts"),    # with the reduction in parts
    (13, 130, 301, 1, 1, 3, "raw"),      # B paired panel by panel as it goes
])
@pytest.mark.parametrize("kern_name", GEMM_KERNELS)
def test_bf16_dot_gemm_in_blocks_of_panels(kern_name, m, n, k, nrb, ks, npb, mode):
    """The panels of columns shared out in ``npb`` groups give, bit for bit, the product
    of one group."""
    kern = _gemm_kernel(kern_name)
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k + k % 2)).astype(BF16)
    a[:, k:] = 0
    b = rng.standard_normal((k, n)).astype(BF16).view(np.uint16)
    a32 = a.view(np.uint16).view(np.uint32)
    bp = np.zeros((-(-n // kern.NR), a32.shape[1], kern.NR), np.uint32)
    kern.pack_pairs(b, bp)
    none = np.zeros((0, 0, kern.NR), np.uint32)
    out = []
    for groups in (1, npb):
        if mode == "rounded" or mode == "raw":
            d = np.full((m, n), 0xABCD, np.uint16)
            kern.gemm(a32, none if mode == "raw" else bp, np.zeros((0, n), np.float32), 128,
                      nrb, d, 1, b if mode == "raw" else None, None, groups)
            out.append(d)
        else:
            c = np.full((ks * m, n), np.nan, np.float32)
            kern.gemm(a32, bp, c, 128, nrb, None, ks, None, None, groups)
            out.append(c)
    np.testing.assert_array_equal(out[1], out[0])
    got = out[0].view(BF16).astype(np.float64) if out[0].dtype == np.uint16 else \
        out[0].reshape(ks, m, n).sum(axis=0)
    ref = a.astype(np.float64)[:, :k] @ b.view(BF16).astype(np.float64)
    assert np.abs(got - ref).max() < 2e-2 * k ** 0.5


@needs_bf16_dot
def test_bf16_dot_weight_gradient_blocks_of_panels_for_few_rows(monkeypatch):
    """A 1x1 weight gradient of few rows (C) into many columns (K) shares out panels of
    columns, not blocks of rows (each of which would read all of dY): ResNet-50's
    res3a_branch2c; and matches the reference."""
    monkeypatch.setattr(nc.config, "THREADS", 2)
    rng = np.random.default_rng(11)
    x, dy = _bf16(rng, 8, 28, 28, 128), _bf16(rng, 8, 28, 28, 512)
    p = nc.plan("convolution_backprop_filters", x, (1, 1), dy, strides=1)
    assert (p.variant, p.tiles.get("panel_blocks")) == ("bf16-dot", 8)
    p = nc.plan("convolution_backprop_filters", _bf16(rng, 8, 28, 28, 512), (1, 1),
                _bf16(rng, 8, 28, 28, 128), strides=1)
    assert "panel_blocks" not in p.tiles  # res3b_branch2a: many rows, few columns
    got = nc.convolution_backprop_filters(x[:2], (1, 1), dy[:2], strides=1,
                                          strategy="gemm[bf16-dot]")
    assert_matches(got, BF16, lambda a, b, **q: conv_bwd_filter_ref(a, b, (1, 1), **q),
                   x[:2], dy[:2], stride=1, dilation=1, pads_begin=(0, 0), pads_end=(0, 0))


@needs_bf16_dot
@pytest.mark.parametrize("p, c, n, ks, rnd", [
    (1000, 64, 70, 2, False),   # whole register transposes, two panels, parts
    (1001, 40, 64, 1, True),    # a tail of 8 channels and an odd pixel, rounded in tiles
    (77, 35, 9, 1, False),      # no whole transpose at all
])
@pytest.mark.parametrize("kern_name", GEMM_KERNELS)
def test_bf16_dot_gemm_transposes_a_as_it_goes(kern_name, p, c, n, ks, rnd):
    """A handed over as x (``[P, C]``) and transposed block by block inside the GEMM gives,
    bit for bit, the product over x transposed into pixel pairs first."""
    kern = _gemm_kernel(kern_name)
    rng = np.random.default_rng(p + c)
    x = rng.standard_normal((p, c)).astype(BF16).view(np.uint16)
    dy = rng.standard_normal((p, n)).astype(BF16).view(np.uint16)
    k2 = (p + 1) // 2
    a = np.zeros((c, 2 * k2), np.uint16)
    a[:, :p] = x.T
    none, no_a = np.zeros((0, 0, kern.NR), np.uint32), np.zeros((0, 0), np.uint32)
    if rnd:
        want, got = (np.full((c, n), 0xABCD, np.uint16) for _ in range(2))
        kern.gemm(a.view(np.uint32), none, np.zeros((0, n), np.float32), 128, 1, want, 1, dy)
        kern.gemm(no_a, none, np.zeros((0, n), np.float32), 128, 1, got, 1, dy, x)
    else:
        want, got = (np.full((ks * c, n), np.nan, np.float32) for _ in range(2))
        kern.gemm(a.view(np.uint32), none, want, 128, 1, None, ks, dy)
        kern.gemm(no_a, none, got, 128, 1, None, ks, dy, x)
        ref = x.view(BF16).astype(np.float64).T @ dy.view(BF16).astype(np.float64)
        assert np.abs(got.reshape(ks, c, n).sum(axis=0) - ref).max() < 1e-3 * p ** 0.5
    np.testing.assert_array_equal(got, want)


# -- gemm[bf16-amx]: bf16-dot's GEMMs on AMX tiles ---------------------------------------------
@needs_amx
@pytest.mark.parametrize("m, k, kc2", [(40, 40, 128), (70, 100, 16), (33, 6, 128)])
def test_bf16_amx_gemm_reads_nothing_past_its_block(m, k, kc2):
    """A tile reads 16 pairs of A's row and 16 rows of B's panel; the last ``k2 % 16``
    pairs go through zero-padded copies. An Inf in A's first row and in the first rows of
    B's second panel reach only their own row and columns: every other entry is finite and
    right (a tile reading past its block would meet them times zero: NaN)."""
    kern = bf16dot_kernels.AMX
    rng = np.random.default_rng(m + k)
    n = 100
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    a[0, :] = np.inf
    b[:2, 64:] = np.inf
    bp = np.zeros((2, k // 2, kern.NR), np.uint32)
    bf16dot_kernels.pack_pairs(b.view(np.uint16), bp)
    c = np.full((m, n), np.nan, np.float32)
    kern.gemm(a.view(np.uint16).view(np.uint32), bp, c, kc2, 2)
    ref = a[1:].astype(np.float64) @ b[:, :64].astype(np.float64)
    assert np.isfinite(c[1:, :64]).all()
    assert np.abs(c[1:, :64] - ref).max() < 1e-5 * np.abs(ref).max() * k ** 0.5


@needs_amx
def test_amx_kernels_ask_for_amx_in_a_process_that_never_planned():
    """The warm-up's worker processes run plans made from task lists, never asking an
    entry whether it accepts (where the AMX entries ask Linux for AMX's state): a tile
    instruction without the grant kills the process (SIGILL; the warm-up died with a
    BrokenProcessPool). The kernels ask themselves."""
    code = textwrap.dedent("""
        from numbaconv import _warmup
        from numbaconv.kernels.cpu import _amx
        assert not _amx._GRANTED  # nothing has asked yet
        done = _warmup._run_group([("bfloat16", 0, "bwd_d", "gemm[bf16-amx-taps]"),
                                   ("bfloat16", 0, "bwd_w", "gemm[bf16-amx-taps]"),
                                   ("bfloat16", 6, "bwd_w", "gemm[bf16-amx]")])
        print("ran", len(done))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "ran 3" in r.stdout


@needs_amx
def test_bf16_amx_entry_is_first_where_it_accepts():
    """On an AMX host the planner takes ``gemm[bf16-amx]`` for the bfloat16 layers
    ``gemm[bf16-amx-taps]`` leaves, of every kind the bfloat16 GEMM takes: 1x1 layers, 3x3
    layers over many channels (Winograd's otherwise); narrow layers still go to the
    float32 entries."""
    rng = np.random.default_rng(3)
    x = _bf16(rng, 2, 28, 28, 128)
    for op, args, kw in [
            ("convolution", (_bf16(rng, 2, 14, 14, 512), _bf16(rng, 3, 3, 512, 512)),
             dict(pads_begin=1, pads_end=1)),
            ("convolution_backprop_data", (x, _bf16(rng, 1, 1, 64, 128), (28, 28)), {}),
            ("convolution_backprop_filters", (x, (1, 1), _bf16(rng, 2, 28, 28, 64)), {}),
            ("convolution_backprop_filters", (x, (3, 3), _bf16(rng, 2, 28, 28, 256)),
             dict(pads_begin=1, pads_end=1))]:
        p = nc.plan(op, *args, strides=1, **kw)
        assert (p.strategy, p.variant) == ("gemm", "bf16-amx"), (op, p)
    with pytest.raises(ValueError, match=r"gemm\[bf16-amx\]: backward data into 3 channels"):
        nc.plan("convolution_backprop_data", np.zeros((1, 4, 4, 64), BF16),
                np.zeros((7, 7, 3, 64), BF16), (8, 8), strides=2, pads_begin=3, pads_end=2,
                strategy="gemm[bf16-amx]")
    with pytest.raises(ValueError, match=r"gemm\[bf16-amx\]: 2 groups"):
        nc.plan("convolution", np.zeros((1, 8, 8, 8), BF16), np.zeros((3, 3, 4, 8), BF16),
                strides=1, groups=2, strategy="gemm[bf16-amx]")


# -- gemm[bf16-amx-taps]: stride-1 correlations with the taps read in place ------------------
#: (id, direction, mb, input size, reduction channels, result channels, kernel, dilation,
#: pads): 1-D to 3-D, dilations, asymmetric and wide pads (grids whose pad rows and
#: columns are dropped), grids whose rows are no multiple of the 32-row tile, two panels
_TAPS = [
    ("fwd-2d", "fwd", 2, (9, 10), 64, 64, (3, 3), (1, 1), ((1, 1), (1, 1))),
    ("fwd-2d-dilated-asym", "fwd", 1, (11, 7), 32, 128, (3, 2), (2, 1), ((2, 0), (1, 1))),
    ("fwd-1d", "fwd", 3, (29,), 96, 64, (5,), (1,), ((2,), (3,))),
    ("fwd-3d", "fwd", 1, (4, 6, 5), 32, 64, (3, 3, 3), (1, 1, 1), ((1, 1, 1), (1, 1, 1))),
    ("bwd_d-2d", "bwd_d", 2, (9, 10), 64, 64, (3, 3), (1, 1), ((1, 1), (1, 1))),
    ("bwd_d-2d-valid", "bwd_d", 1, (12, 9), 32, 64, (3, 3), (1, 1), ((0, 0), (0, 0))),
    ("bwd_d-2d-dilated", "bwd_d", 2, (10, 11), 64, 128, (3, 3), (2, 3), ((2, 3), (1, 2))),
    ("bwd_d-3d", "bwd_d", 1, (5, 4, 6), 32, 64, (2, 3, 3), (1, 1, 1), ((0, 1, 1), (1, 1, 1))),
    # weight gradients: (reduction channels) is x's C here, (result channels) dY's K; odd
    # tap offsets read x^T's second parity; a grid of pairs past 16 * 64 (several blocks
    # of the pairing pass) and one of fewer than 16 pairs
    ("bwd_w-2d", "bwd_w", 2, (9, 10), 64, 64, (3, 3), (1, 1), ((1, 1), (1, 1))),
    ("bwd_w-2d-dilated-asym", "bwd_w", 1, (11, 7), 32, 128, (3, 2), (2, 1), ((2, 0), (1, 1))),
    ("bwd_w-1d", "bwd_w", 3, (29,), 96, 64, (5,), (1,), ((2,), (3,))),
    ("bwd_w-1d-short", "bwd_w", 1, (5,), 32, 64, (3,), (1,), ((1,), (1,))),
    ("bwd_w-2d-long", "bwd_w", 2, (47, 40), 32, 64, (3, 3), (1, 1), ((1, 1), (1, 1))),
    ("bwd_w-3d", "bwd_w", 1, (4, 6, 5), 32, 64, (3, 3, 3), (1, 1, 1), ((1, 1, 1), (1, 1, 1))),
    # backward data at a stride: one job per stride phase a tap reaches (the others
    # zeros), each written into its phase's pixels
    ("bwd_d-2d-s2", "bwd_d", 2, (11, 10), 64, 64, (3, 3), (1, 1), ((1, 1), (1, 0)), (2, 2)),
    ("bwd_d-2d-s3-dilated", "bwd_d", 1, (13, 11), 32, 64, (3, 2), (2, 3), ((2, 0), (1, 2)),
     (3, 2)),
    ("bwd_d-1d-s4", "bwd_d", 3, (23,), 32, 128, (5,), (1,), ((2,), (1,)), (4,)),
    ("bwd_d-2d-s2x3-3x1", "bwd_d", 2, (9, 8), 64, 64, (3, 1), (1, 1), ((0, 0), (0, 0)), (2, 3)),
    ("bwd_d-3d-s2", "bwd_d", 1, (5, 7, 6), 32, 64, (3, 3, 2), (1, 1, 1), ((1, 1, 0), (1, 0, 1)),
     (2, 1, 2)),
]


@needs_amx
@pytest.mark.parametrize("case", _TAPS, ids=[c[0] for c in _TAPS])
def test_bf16_amx_taps_entry(case, monkeypatch):
    """Forced (its rules on channels and waste off): within the bound of the float64
    reference, and the same bits call after call."""
    from numbaconv.strategies import bf16amx as amx_strategy
    monkeypatch.setattr(amx_strategy, "MAX_REDUCTION", 1 << 20)
    monkeypatch.setattr(amx_strategy, "MAX_WGRAD_CHANNELS", 1 << 20)
    monkeypatch.setattr(amx_strategy, "MAX_WASTE", 1e9)
    _, direction, mb, isz, red, res, ksz, dil, pads, *stride = case
    c, k = (res, red) if direction == "bwd_d" else (red, res)
    st = stride[0] if stride else (1,) * len(isz)
    _check_forced("gemm[bf16-amx-taps]", direction, mb, isz, c, k, ksz, st, dil, pads,
                  seed=len(isz) + red + res)


@needs_amx
def test_bf16_amx_taps_drops_the_grids_pad_rows(monkeypatch):
    """The padded grid's rows that are no output pixel read the source's other pixels
    (an Inf among them) and are dropped: the result's non-finite entries are exactly the
    reference's."""
    from numbaconv.strategies import bf16amx as amx_strategy
    monkeypatch.setattr(amx_strategy, "MAX_WASTE", 1e9)
    rng = np.random.default_rng(5)
    dy = _bf16(rng, 2, 6, 7, 64)
    w = _bf16(rng, 3, 3, 64, 64)
    dy[0, 2, 6, 3] = np.inf  # a last column: the next grid row's pad column reads it
    got = nc.convolution_backprop_data(dy, w, (6, 7), strides=1, pads_begin=1, pads_end=1,
                                       strategy="gemm[bf16-amx-taps]")
    with np.errstate(invalid="ignore"):
        ref = conv_bwd_data_ref(dy.astype(np.float64), w.astype(np.float64), (6, 7),
                                stride=1, pads_begin=1, pads_end=1)
    bad = ~np.isfinite(got.astype(np.float64))
    np.testing.assert_array_equal(bad, ~np.isfinite(ref))
    assert 0 < bad.sum() < bad.size


@needs_amx
def test_bf16_amx_taps_weight_gradient_keeps_an_inf_to_its_channel(monkeypatch):
    """docs/contract.md section 5: an Inf in x reaches, through the grid's pad rows (dY's
    zeros there), only dW's entries of its own input channel; every other entry is finite
    and right."""
    from numbaconv.strategies import bf16amx as amx_strategy
    monkeypatch.setattr(amx_strategy, "MAX_WASTE", 1e9)
    rng = np.random.default_rng(6)
    x, dy = _bf16(rng, 2, 6, 7, 64), _bf16(rng, 2, 6, 7, 64)
    x[0, 0, 0, 5] = np.inf
    got = nc.convolution_backprop_filters(x, (3, 3), dy, strides=1, pads_begin=1, pads_end=1,
                                          strategy="gemm[bf16-amx-taps]")
    g = got.astype(np.float64)
    others = np.ones(64, bool)
    others[5] = False
    assert np.isfinite(g[:, :, others]).all()
    xf = x.copy()
    xf[0, 0, 0, 5] = 0
    ref = conv_bwd_filter_ref(xf.astype(np.float64), dy.astype(np.float64), (3, 3),
                              pads_begin=1, pads_end=1)
    assert np.abs(g[:, :, others] - ref[:, :, others]).max() <= 2 ** -7 * np.abs(ref).max()


@needs_amx
def test_bf16_amx_taps_entry_declines_with_reasons():
    def plan(x, w, **kw):
        return nc.plan("convolution", np.zeros(x, BF16), np.zeros(w, BF16),
                       strategy="gemm[bf16-amx-taps]", **kw)

    with pytest.raises(ValueError, match=r"amx-taps\]: stride 2x2 \(stride 1 only, but for "
                                         r"backward data"):
        plan((1, 16, 16, 64), (3, 3, 64, 64), strides=2, pads_begin=1, pads_end=1)
    with pytest.raises(ValueError, match=r"a 1x1 kernel"):
        plan((1, 16, 16, 64), (1, 1, 64, 64), strides=1)
    with pytest.raises(ValueError, match=r"48 reduction channels \(a multiple of 32"):
        plan((1, 16, 16, 48), (3, 3, 48, 64), strides=1, pads_begin=1, pads_end=1)
    with pytest.raises(ValueError, match=r"96 result channels \(a multiple of 64"):
        plan((1, 16, 16, 64), (3, 3, 64, 96), strides=1, pads_begin=1, pads_end=1)
    with pytest.raises(ValueError, match=r"512 reduction channels \(> 256\) at stride 1"):
        plan((1, 16, 16, 512), (3, 3, 512, 64), strides=1, pads_begin=1, pads_end=1)
    with pytest.raises(ValueError, match=r"the padded grid is 1\.65x the output pixels"):
        plan((1, 7, 7, 64), (3, 3, 64, 64), strides=1, pads_begin=1, pads_end=1)
    def plan_w(x, ksz, dy, **kw):
        return nc.plan("convolution_backprop_filters", np.zeros(x, BF16), ksz,
                       np.zeros(dy, BF16), strategy="gemm[bf16-amx-taps]", **kw)

    with pytest.raises(ValueError, match=r"48 input channels \(a multiple of 32 only"):
        plan_w((1, 16, 16, 48), (3, 3), (1, 16, 16, 64), strides=1, pads_begin=1, pads_end=1)
    with pytest.raises(ValueError, match=r"96 result channels"):
        plan_w((1, 16, 16, 64), (3, 3), (1, 16, 16, 96), strides=1, pads_begin=1, pads_end=1)
    with pytest.raises(ValueError, match=r"weight gradient over 256 channels \(> 128\)"):
        plan_w((1, 16, 16, 64), (3, 3), (1, 16, 16, 256), strides=1, pads_begin=1, pads_end=1)
    # strided backward data over any number of channels (ResNet-50's res4a_branch2b)
    p = nc.plan("convolution_backprop_data", np.zeros((2, 14, 14, 256), BF16),
                np.zeros((3, 3, 256, 256), BF16), (28, 28), strides=2, pads_begin=1,
                pads_end=0)
    assert (p.strategy, p.variant) == ("gemm", "bf16-amx-taps")
    # the layers it is for: 3x3 over 64 channels on large images, every direction
    x = np.zeros((2, 56, 56, 64), BF16)
    w = np.zeros((3, 3, 64, 64), BF16)
    for p in (nc.plan("convolution", x, w, strides=1, pads_begin=1, pads_end=1),
              nc.plan("convolution_backprop_data", x, w, (56, 56), strides=1, pads_begin=1,
                      pads_end=1),
              nc.plan("convolution_backprop_filters", x, (3, 3), x, strides=1, pads_begin=1,
                      pads_end=1)):
        assert (p.strategy, p.variant) == ("gemm", "bf16-amx-taps")


def test_bf16_amx_entry_declines_without_amx(monkeypatch):
    from numbaconv.kernels.cpu import _host
    monkeypatch.setattr(_host, "FEATURES", tuple(f for f in _host.FEATURES
                                                  if f != "amx-tile") + ("avx512bf16",))
    problem = nc.plan("convolution", np.zeros((1, 8, 8, 8), BF16),
                      np.zeros((3, 3, 8, 8), BF16), strides=1, strategy="numpy").problem
    assert BF16_AMX.accepts(problem) == \
        "this host has no AMX tiles with bfloat16 products (amx-tile, amx-bf16)"


@pytest.mark.parametrize("dtype", [np.uint16, np.float32])
@pytest.mark.parametrize("stride, q", [((1, 2, 2), (0, 1, 0)), ((2, 3, 1), (1, 2, 0)),
                                       ((1, 1, 4), (0, 0, 3))])
def test_put_phase_writes_exactly_its_pixels(dtype, stride, q):
    """A stride phase's rows go to its pixels ``q + s*j`` of dX (bits or the tuner's
    float32), or zeros for a phase no tap reaches; every other pixel is left as it was."""
    rng = np.random.default_rng(sum(stride) + sum(q))
    dx = rng.integers(1, 1000, (2, 5, 7, 9, 6)).astype(dtype)
    view = (slice(None), *(slice(a, None, b) for a, b in zip(q, stride)))
    want = dx.copy()
    c = rng.integers(1, 1000, (want[view][..., 0].size, 6)).astype(dtype)
    want[view] = c.reshape(want[view].shape)
    got = dx.copy()
    bf16dot_kernels.put_phase(c, got, np.array([*stride, *q], np.int64))
    np.testing.assert_array_equal(got, want)
    want[view] = 0
    bf16dot_kernels.put_phase(np.zeros((0, 6), dtype), got, np.array([*stride, *q], np.int64))
    np.testing.assert_array_equal(got, want)


def test_bf16_dot_entry_declines_without_avx512_bf16(monkeypatch):
    from numbaconv.kernels.cpu import _host
    monkeypatch.setattr(_host, "FEATURES", tuple(f for f in _host.FEATURES
                                                  if f != "avx512bf16"))
    assert BF16_DOT.accepts(nc.plan("convolution", np.zeros((1, 8, 8, 8), BF16),
                                    np.zeros((3, 3, 8, 8), BF16), strides=1).problem) == \
        "this host has no AVX512_BF16 (vdpbf16ps)"


def test_errors_are_of_the_size_the_bound_allows():
    """The bound is not loose: the errors of a long reduction come close to it (a
    reduction over many pixels, whose results are large against 2^-8 of the scale)."""
    rng = np.random.default_rng(8)
    x = np.abs(_bf16(rng, 4, 32, 32, 8)) + BF16.type(1)
    dy = np.abs(_bf16(rng, 4, 32, 32, 8)) + BF16.type(1)
    got = nc.conv2d_backprop_filter(x, [3, 3, 8, 8], dy, 1, "SAME")
    err = normalized_error(got, lambda a, b: conv_bwd_filter_ref(a, b, (3, 3), pads_begin=1,
                                                                 pads_end=1), x, dy)
    assert TOL_BF16 / 16 < err <= TOL_BF16, err


# -- out=, specials, empty problems ------------------------------------------------------------
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_out_in_bfloat16(data_format, rng):
    nhwc = data_format == "NHWC"
    x = _bf16(rng, *((2, 8, 8, 4) if nhwc else (2, 4, 8, 8)))
    w = _bf16(rng, 3, 3, 4, 6)
    want = nc.conv2d(x, w, 1, "SAME", data_format=data_format)
    out = np.full(want.shape, np.nan, BF16)
    r = nc.conv2d(x, w, 1, "SAME", data_format=data_format, out=out)
    assert r is out
    _same_bits(out, want)
    # a strided out= (every other element of a larger array)
    big = np.zeros((*want.shape[:-1], 2 * want.shape[-1]), BF16)
    r = nc.conv2d(x, w, 1, "SAME", data_format=data_format, out=big[..., ::2])
    _same_bits(np.ascontiguousarray(big[..., ::2]), want)
    assert not big[..., 1::2].view(np.uint16).any()
    dw = np.empty((3, 3, 4, 6), BF16)
    dy = want
    assert nc.conv2d_backprop_filter(x, [3, 3, 4, 6], dy, 1, "SAME", data_format=data_format,
                                     out=dw) is dw
    _same_bits(dw, nc.conv2d_backprop_filter(x, [3, 3, 4, 6], dy, 1, "SAME",
                                             data_format=data_format))


def test_out_of_another_dtype_is_refused(rng):
    x, w = _bf16(rng, 1, 6, 6, 2), _bf16(rng, 3, 3, 2, 2)
    with pytest.raises(TypeError, match=r"^out: expected dtype bfloat16 .*got float32"):
        nc.conv2d(x, w, 1, "SAME", out=np.empty((1, 6, 6, 2), np.float32))
    with pytest.raises(TypeError, match=r"^out: expected dtype float32 .*got bfloat16"):
        nc.conv2d(x.astype(np.float32), w.astype(np.float32), 1, "SAME",
                  out=np.empty((1, 6, 6, 2), BF16))


@pytest.mark.parametrize("strategy", ["direct", "numpy", None])
def test_nan_and_inf_propagate(strategy):
    """NaN and Inf in bfloat16 operands come out where the reference has them (Inf with
    operands of one sign, so that no Inf - Inf arises), finite results within the bound."""
    rng = np.random.default_rng(3)
    x = (np.abs(rng.standard_normal((1, 9, 9, 3))) + 0.5).astype(BF16)
    w = (np.abs(rng.standard_normal((3, 3, 3, 4))) + 0.5).astype(BF16)
    x[0, 1, 1, 0] = np.nan
    x[0, 6, 7, 2] = np.inf
    got = nc.conv2d(x, w, 1, "SAME", strategy=strategy)
    ref = conv_fwd_ref(x, w, pads_begin=1, pads_end=1)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref))
    assert np.isnan(got).sum() == 4 * 9 and np.isposinf(got).sum() == 4 * 9
    fin = np.isfinite(ref)
    scale = conv_fwd_ref(np.abs(np.where(np.isfinite(x.astype(np.float64)), x, 0)), w,
                         pads_begin=1, pads_end=1).max()
    assert np.abs(got[fin].astype(np.float64) - ref[fin]).max() / scale <= TOL_BF16
    # 2^127 + (2 - 2^-7) 2^126 = (2 - 2^-8) 2^127: a finite float32 halfway between
    # bfloat16's largest finite value (odd) and 2^128, which rounds (to even) to Inf
    big = np.array([0x7F00, 0x7EFF], np.uint16).view(BF16).reshape(1, 1, 2, 1)
    one = np.ones((1, 2, 1, 1), BF16)
    y = nc.conv2d(big, one, 1, "VALID", strategy=strategy)
    assert np.isfinite(nc.conv2d(big.astype(np.float32), one.astype(np.float32), 1, "VALID",
                                 strategy=strategy)).all()
    assert np.isposinf(y).all()


def test_empty_problem_gives_bfloat16_zeros():
    x = np.zeros((0, 5, 5, 3), BF16)
    w = np.ones((3, 3, 3, 2), BF16)
    y = nc.conv2d(x, w, 1, "SAME")
    assert y.dtype == BF16 and y.shape == (0, 5, 5, 2)
    dw = nc.conv2d_backprop_filter(x, [3, 3, 3, 2], np.zeros((0, 5, 5, 2), BF16), 1, "SAME")
    assert dw.dtype == BF16 and dw.shape == (3, 3, 3, 2) and not dw.view(np.uint16).any()


def test_non_contiguous_and_read_only_operands(rng):
    x = _bf16(rng, 2, 10, 9, 12)[:, ::-1, :, ::3]   # negative and non-unit strides
    w = _bf16(rng, 3, 3, 4, 5)
    x.flags.writeable = False
    w.flags.writeable = False
    got = nc.conv2d(x, w, 1, "VALID")
    want = nc.conv2d(np.ascontiguousarray(x).astype(np.float32), w.astype(np.float32), 1,
                     "VALID")
    _same_bits(got, _rounded(want))


# -- dtypes of one call, and what numbaconv needs ----------------------------------------------
def test_mixing_bfloat16_with_another_float_dtype_is_refused(rng):
    x, w = _bf16(rng, 1, 5, 5, 2), _bf16(rng, 3, 3, 2, 2)
    with pytest.raises(TypeError, match=r"^all arrays of one call must share one float dtype, "
                                        r"got input=bfloat16, filter=float32"):
        nc.conv2d(x, w.astype(np.float32), 1, "SAME")
    with pytest.raises(TypeError, match=r"share one float dtype, got output_delta=float16, "
                                        r"filter=bfloat16"):
        nc.convolution_backprop_data(x.astype(np.float16), w, (5, 5), strides=1,
                                     auto_pad="same_upper")
    # a list becomes float64: the message says how to pass it as bfloat16
    with pytest.raises(TypeError, match=r"pass np\.asarray\(filter, "
                                        r"dtype=ml_dtypes\.bfloat16\)"):
        nc.conv2d(x, w.astype(np.float64).tolist(), 1, "SAME")


def test_plan_names_bfloat16():
    x = np.zeros((2, 8, 8, 16), BF16)
    p = nc.plan("conv2d", x, np.zeros((3, 3, 16, 16), BF16), 1, "SAME")
    assert p.problem.dtype == "bfloat16" and p.problem.descriptor().endswith("_bfloat16")


def test_check_runs_bfloat16():
    from numbaconv.check import default_dtypes, run_check
    assert "bfloat16" in default_dtypes()
    assert run_check(dtypes=("bfloat16",), verbose=False) == 0


def test_numbaconv_imports_no_ml_dtypes_and_a_small_call_compiles_nothing():
    """``import numbaconv`` leaves ml_dtypes alone, and a first bfloat16 call on a small
    problem (the numpy entry) compiles or loads no kernel."""
    code = textwrap.dedent("""
        import sys
        import numbaconv as nc
        assert "ml_dtypes" not in sys.modules, "numbaconv imported ml_dtypes"
        import numpy as np, ml_dtypes
        bf = ml_dtypes.bfloat16
        x = np.ones((2, 16, 16, 8), bf)
        w = np.ones((3, 3, 8, 8), bf)
        y = nc.conv2d(x, w, 1, "SAME")
        assert y.dtype == bf and float(y[0, 5, 5, 0]) == 72.0, y[0, 5, 5, 0]
        nc.conv2d_backprop_input(x.shape, w, x, 1, "SAME")
        nc.conv2d_backprop_filter(x, w.shape, x, 1, "SAME")
        from numba.core.registry import CPUDispatcher
        used = sorted(f"{name}.{k}" for name, mod in list(sys.modules.items())
                      if name.startswith("numbaconv.kernels.cpu.")
                      for k, v in vars(mod).items()
                      if isinstance(v, CPUDispatcher) and v.signatures)
        print(used)
    """)
    env = dict(os.environ)
    env.pop("NUMBACONV_GEMM_ENGINE", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout
