"""The implicit variant of the GEMM strategy (backward data as register tiles of dX summed
over the taps straight from a zero-padded dY, :mod:`numbaconv.kernels.cpu.igemm`) against
the float64 NumPy reference, in both parallel schemes: 1-D, 2-D and 3-D, strides (stride
phases with one to four taps, and phases no tap reaches), dilations, pads on either side
wider than the kernel, row tiles across rows and images with a last partial tile,
channel panels of partial width, fewer tiles than threads, float16/32/64, one thread; the
filter packing alone; and the planner's choice of it."""
import itertools
import math

import numpy as np
import pytest

import numbaconv as nc
from numbaconv import planner
from numbaconv.kernels.cpu import igemm
from numbaconv.strategies import _gemm_common
from numbaconv.strategies import igemm as strategy
from reference import (case_operands, conv_bwd_data_ref, conv_fwd_ref, normalized_error,
                       tolerance)

# (mb, ic, oc, input spatial, kernel, stride, dilation, pads_begin, pads_end)
CASES = [
    # 3x3 stride 1: one phase of 9 taps, tiles across rows and images
    (2, 16, 8, (9, 11), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    # 3x3 stride 2: four phases of 1, 2, 2 and 4 taps; 32 channels (a half panel)
    (2, 32, 24, (10, 9), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
    # 1-D, 5 taps, 64 input channels (one full panel), 3 images of 13 pixels
    (3, 64, 40, (13,), (5,), (1,), (1,), (2,), (2,)),
    # 3-D, strides and dilations mixed per axis, asymmetric pads
    (1, 48, 16, (7, 6, 5), (3, 2, 3), (2, 1, 2), (1, 2, 1), (1, 0, 2), (2, 1, 1)),
    # 1x1 at stride 2 over a long reduction: one live phase, the others all zero (dY in
    # place)
    (2, 16, 160, (8, 8), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)),
    # 2x2 at stride 3: a phase that no tap reaches
    (2, 16, 16, (9, 9), (2, 2), (3, 3), (1, 1), (0, 0), (0, 0)),
    # dilation 2, pads wider than the kernel's reach on one side, 80 channels (a panel
    # and a quarter), 5 pixels in all per row
    (1, 80, 72, (5, 5), (3, 3), (1, 1), (2, 2), (3, 1), (0, 2)),
    # fewer row tiles than threads: 4 pixels
    (1, 16, 32, (2, 2), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
]
IDS = [f"mb{c[0]}ic{c[1]}oc{c[2]}i{'x'.join(map(str, c[3]))}k{'x'.join(map(str, c[4]))}"
       f"s{'x'.join(map(str, c[5]))}" for c in CASES]


def _run(case, dtype, seed=0, entry="gemm[implicit]"):
    mb, ic, oc, isz, k, st, dl, pb, pe = case
    x, w, dy, geom, attrs = case_operands(case, dtype, seed)
    w0, dy0 = w.copy(), dy.copy()
    plan = nc.plan("convolution_backprop_data", dy, w, isz, strategy=entry, **attrs)
    assert f"{plan.strategy}[{plan.variant}]" == entry, plan
    got = nc.convolution_backprop_data(dy, w, isz, strategy=entry, **attrs)
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    assert np.array_equal(w, w0) and np.array_equal(dy, dy0)  # inputs untouched
    return normalized_error(got, conv_bwd_data_ref, dy, w, isz, **geom)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_implicit_variant_matches_reference(case, dtype):
    assert _run(case, dtype) <= tolerance(dtype)


@pytest.mark.parametrize("by_panels", [True, False])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_implicit_variant_parallel_modes(case, by_panels, monkeypatch):
    """Both parallel schemes on every case: over channel panels, each packing its own
    filter chunks, and over row blocks after one packing pass (the planner picks by the
    packed filter's size against L2; the test cases are small)."""
    monkeypatch.setattr(strategy, "_by_panels", lambda *a: by_panels)
    assert _run(case, "float32", seed=5) <= tolerance("float32")


def test_panel_count_shares_out_evenly():
    """One panel more where that shares the channels out over the threads in panels of one
    width, at least three vectors each; else full register tiles."""
    assert strategy._panel_count(192, 64, 16, 2) == 4      # 4 x 48 (googlenet:5b_3x3)
    assert strategy._panel_count(128, 64, 16, 2) == 2      # already even
    assert strategy._panel_count(160, 64, 16, 2) == 3      # 48 x 3 + 16: not one width
    assert strategy._panel_count(320, 64, 16, 2) == 5      # 6 panels of 64 cover it in 5
    assert strategy._panel_count(64, 64, 16, 2) == 1       # 2 x 32: two vectors
    assert strategy._panel_count(48, 64, 16, 2) == 1       # 32 + 16
    assert strategy._panel_count(192, 64, 16, 16) == 3     # one more is not 16
    assert strategy._panel_count(96, 32, 8, 2) == 4        # 4 x 24 (float64 on AVX-512)


@pytest.mark.parametrize("entry", ["gemm[implicit]", "gemm[regions]"])
@pytest.mark.parametrize("case", [
    # 3 full panels' channels at stride 1 and 2 with pads (regions with padded rows)
    (2, 3, 24, (7, 8), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    (1, 3, 16, (9, 7), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
])
def test_even_panels_match_reference(case, entry, monkeypatch):
    """Channel panels counted to share out over 2 threads (:func:`_panel_count`: 3
    register tiles' channels as 4 panels on AVX-512), in the panel-parallel mode of both
    variants, against the reference."""
    mb, tiles, oc, isz, k, st, dl, pb, pe = case
    case = (mb, tiles * igemm.panel(4), oc, isz, k, st, dl, pb, pe)
    monkeypatch.setattr(strategy, "_by_panels", lambda *a: True)
    monkeypatch.setattr(strategy, "MIN_SKIPPED", 0.0)
    nt = nc.get_num_threads()
    nc.set_num_threads(2)
    _fresh()
    try:
        if igemm.panel(4) == 64:
            assert strategy._panel_count(case[1], 64, 16, 2) == 4
        assert _run(case, "float32", seed=3, entry=entry) <= tolerance("float32")
    finally:
        nc.set_num_threads(nt)
        _fresh()


#: Channel counts that are not whole vectors (16 float32 / 8 float64 lanes on AVX-512, 8 /
#: 4 on AVX2): the last vector of each tile row stored masked.
PARTIAL = [
    # R(2+1)D's temporal 3x1x1 over 45 channels: 3 vectors, the last of 13 lanes (float32)
    (1, 45, 64, (6, 5, 7), (3, 1, 1), (1, 1, 1), (1, 1, 1), (1, 0, 0), (1, 0, 0)),
    # strided phases over 21 channels
    (2, 21, 24, (9, 8), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
    # a full panel and a panel of 6 channels, 5x5 with pads (regions at the borders)
    (1, 70, 40, (7, 9), (5, 5), (1, 1), (1, 1), (2, 2), (2, 2)),
]
PARTIAL_IDS = [f"ic{c[1]}k{'x'.join(map(str, c[4]))}s{'x'.join(map(str, c[5]))}"
               for c in PARTIAL]


@pytest.mark.parametrize("by_panels", [True, False])
@pytest.mark.parametrize("entry", ["gemm[implicit]", "gemm[regions]"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", PARTIAL, ids=PARTIAL_IDS)
def test_partial_vectors_touch_only_their_channels(case, dtype, entry, by_panels, monkeypatch):
    """Channels that are not whole vectors: against the reference, into an ``out=`` that
    is a window of a NaN-filled array (the elements around it, and the row padding after
    each pixel's channels, must stay NaN: a tile's last vector is masked to its lanes),
    in both parallel schemes."""
    mb, ic, oc, isz, k, st, dl, pb, pe = case
    monkeypatch.setattr(strategy, "_by_panels", lambda *a: by_panels)
    monkeypatch.setattr(strategy, "MIN_SKIPPED", 0.0)  # regions wherever any is skipped
    _fresh()
    assert ic % igemm.lanes(np.dtype(dtype).itemsize)
    x, w, dy, geom, attrs = case_operands(case, dtype, ic)
    plan = nc.plan("convolution_backprop_data", dy, w, isz, strategy=entry, **attrs)
    assert f"{plan.strategy}[{plan.variant}]" == entry and not plan.tiles["stream"], plan
    # the result one element into a NaN buffer: anything written past either end of it
    # shows, and its rows start off the vectors' boundaries
    buf = np.full(x.size + 2 * ic, np.nan, dtype)
    out = buf[1:1 + x.size].reshape(x.shape)
    got = nc.convolution_backprop_data(dy, w, isz, strategy=entry, out=out, **attrs)
    assert got is out or np.shares_memory(got, buf)
    assert np.isnan(buf[0]) and np.isnan(buf[1 + x.size:]).all()
    assert not np.isnan(out).any()
    assert normalized_error(out, conv_bwd_data_ref, dy, w, isz, **geom) <= tolerance(dtype)
    _fresh()


@pytest.mark.parametrize("entry", ["gemm[implicit]", "gemm[regions]"])
def test_partial_vectors_of_groups(entry, monkeypatch):
    """Two groups of 20 channels: each group's tiles are masked to its own channels (the
    next group's first lanes are not overwritten)."""
    monkeypatch.setattr(strategy, "MIN_SKIPPED", 0.0)
    _fresh()
    rng = np.random.default_rng(7)
    dy = rng.standard_normal((2, 7, 6, 48)).astype(np.float32)
    w = rng.standard_normal((3, 3, 20, 48)).astype(np.float32)
    attrs = dict(strides=1, pads_begin=1, pads_end=1, groups=2)
    got = nc.convolution_backprop_data(dy, w, (7, 6), strategy=entry, **attrs)
    err = normalized_error(got, conv_bwd_data_ref, dy, w, (7, 6), stride=1, dilation=1,
                           pads_begin=1, pads_end=1, groups=2)
    assert err <= tolerance("float32")
    _fresh()


def test_partial_vectors_float16():
    """float16 over a channel count that is not whole vectors (float32 scratch, rounded
    into dX per row)."""
    case = PARTIAL[0]
    assert _run(case, "float16", seed=1) <= tolerance("float16")


def test_partial_vectors_rule():
    """A 1x1 layer at stride 1 without pads over channels that are not whole vectors
    stays with the GEMMs on the arrays themselves, named as the reason."""
    dy = np.zeros((2, 6, 6, 64), np.float32)
    w = np.zeros((1, 1, 44, 64), np.float32)  # 44: not whole vectors of 8 or 16 lanes
    with pytest.raises(ValueError, match=r"1x1 at stride 1 without pads over 44 input "
                                         r"channels \(not whole"):
        nc.plan("convolution_backprop_data", dy, w, (6, 6), strides=1,
                strategy="gemm[implicit]")
    w3 = np.zeros((3, 3, 44, 64), np.float32)
    plan = nc.plan("convolution_backprop_data", dy, w3, (6, 6), strides=1, pads_begin=1,
                   pads_end=1, strategy="gemm[implicit]")
    assert plan.variant == "implicit"


def test_panels_rule():
    """Panels for a packed phase filter above the threshold that shares out evenly."""
    assert strategy._by_panels(9, 512, 8, 64, 4, 2, 512 * 1024)
    assert not strategy._by_panels(9, 512, 1, 64, 4, 2, 512 * 1024)   # one panel, 2 threads
    assert not strategy._by_panels(1, 128, 2, 64, 4, 2, 512 * 1024)   # 64 KiB: in L2


def test_panel_widths_share_the_channels_evenly():
    """Panels of whole vectors, as even as the panel count allows (the
    parallel-modes test above runs them: 80 channels as 48 + 32, 48 as one panel of 48)."""
    nr = igemm.panel(4)          # 64 float32 lanes on AVX-512 hosts, 16 on AVX2
    vl = nr // igemm.NV
    step = vl
    for C in (16, 48, 80, 96, 200, 256, 1000):
        npan = -(-C // nr)
        width = strategy._panel_width(C, nr, npan, vl)
        assert width % vl == 0 and width <= nr
        assert -(-C // width) == npan                  # the same panels
        assert width * npan - C < step * npan           # each short of C/npan by < a step
    if nr == 64:
        assert strategy._panel_width(80, 64, 2, 16) == 48
        assert strategy._panel_width(256, 64, 4, 16) == 64


def test_implicit_variant_float16():
    assert _run(CASES[1], "float16") <= tolerance("float16")


@pytest.mark.parametrize("by_panels", [True, False])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_implicit_variant_float16_converts_in_the_kernels(case, by_panels, monkeypatch):
    """float16 dY is widened as it is padded and dX rounded from float32 scratch in both
    parallel schemes: bit for bit float32's result on the widened operands, rounded once
    (zero phases, partial panels, a last partial row tile); the user's arrays are left
    alone."""
    monkeypatch.setattr(strategy, "_by_panels", lambda *a: by_panels)
    planner.clear_plan_cache()
    try:
        mb, ic, oc, isz, k, st, dl, pb, pe = case
        rng = np.random.default_rng(11)
        w = rng.standard_normal((*k, ic, oc)).astype(np.float16)
        osz = conv_fwd_ref(np.zeros((1, *isz, ic)), np.zeros(w.shape), stride=st,
                           dilation=dl, pads_begin=pb, pads_end=pe).shape[1:-1]
        dy = rng.standard_normal((mb, *osz, oc)).astype(np.float16)
        attrs = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe)
        plan = nc.plan("convolution_backprop_data", dy, w, isz, **attrs)
        assert plan.variant == "implicit"
        assert strategy.STRATEGY.half_operands(plan.problem, plan.tiles) == {"dy", "result"}
        saved = dy.copy(), w.copy()
        got = nc.convolution_backprop_data(dy, w, isz, **attrs)
        want = nc.convolution_backprop_data(dy.astype(np.float32), w.astype(np.float32),
                                            isz, strategy="gemm[implicit]",
                                            **attrs).astype(np.float16)
        assert got.dtype == np.float16 and got.shape == want.shape
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
        np.testing.assert_array_equal(dy, saved[0])
        np.testing.assert_array_equal(w, saved[1])
    finally:
        planner.clear_plan_cache()


def test_implicit_variant_one_thread():
    nt = nc.get_num_threads()
    try:
        nc.set_num_threads(1)
        assert _run(CASES[3], "float32", seed=3) <= tolerance("float32")
    finally:
        nc.set_num_threads(nt)


@pytest.mark.parametrize("nr", [8, 16, 32, 48])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("C,K", [(64, 40), (80, 17), (16, 33)])
def test_pack_filter(C, K, dtype, nr):
    """The packed panels hold w[t, c, k] at [panel, t, k, lane], zeros past C, for every
    panel width a host's tiles use (8: float64 with 256-bit vectors, narrower than the
    16 x 16 transposes; 48: a panel-parallel width), writing nothing past the panels (the
    8-channel panels once overran the buffer: heap corruption on AVX2 hosts)."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((5, C, K)).astype(dtype)
    taps = np.array([3, 0, 4], np.int64)
    npan = -(-C // nr)
    size = npan * len(taps) * K * nr
    buf = np.full(size + 64, np.nan, dtype)
    out = buf[:size].reshape(npan, len(taps), K, nr)
    igemm.pack_filter(w, taps, out)
    want = np.zeros((len(taps), npan * nr, K), dtype)
    want[:, :C] = w[taps]
    want = want.reshape(len(taps), npan, nr, K).transpose(1, 0, 3, 2)
    assert np.array_equal(out, want)
    assert np.isnan(buf[size:]).all(), "wrote past the panels"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("C,K", [(496, 128), (70, 3), (21, 37), (1, 1)])
def test_claimed_filter_packed_in_registers(C, K, dtype, monkeypatch):
    """1x1 backward data's ``W^T`` panels from the register-transposing pack (forced on
    small filters too) are exactly NumPy's ``pack_panels``, and the claimed GEMM on them
    matches the reference."""
    from numbaconv.kernels.cpu import ukernel as uk
    from numbaconv.strategies import gemm as sgemm
    monkeypatch.setattr(sgemm, "PACK_IN_REGISTERS_FROM", 0)
    w2 = np.random.default_rng(C + K).standard_normal((C, K)).astype(dtype)
    got = sgemm.packed_wt(w2)
    assert got.shape == (-(-C // uk.panel(w2.itemsize)), K, uk.panel(w2.itemsize))
    assert np.array_equal(got, uk.pack_panels(w2.T))
    if C < _gemm_common.MIN_N:  # the GEMM entries decline so few result columns
        return
    x, w, dy, geom, attrs = case_operands((2, C, K, (5, 6), (1, 1), (1, 1), (1, 1), (0, 0),
                                           (0, 0)), dtype)
    out = nc.convolution_backprop_data(dy, w, x.shape[1:-1], strategy="gemm[claimed]",
                                       **attrs)
    assert normalized_error(out, conv_bwd_data_ref, dy, w, x.shape[1:-1], **geom) <= \
        tolerance(dtype)


def test_implicit_variant_choice():
    """Dense backward data takes the implicit variant, and up to MAX_GROUPS groups (each
    group's problem judged alone); more groups, 1x1 layers over channel counts that are
    not whole vectors, short 1x1 reductions, the other directions and the BLAS engine do
    not."""
    def plan(ic, oc, k=(3,), groups=1, strides=1, op="convolution_backprop_data"):
        x = np.zeros((2, 30, ic), np.float32)
        o = (30 - k[0]) // strides + 1
        dy = np.zeros((2, o, oc), np.float32)
        attrs = dict(strides=strides, pads_begin=0, pads_end=0, groups=groups)
        if op == "convolution_backprop_filters":
            return nc.plan(op, x, k, dy, **attrs)
        w = np.zeros((*k, ic // groups, oc), np.float32)
        return nc.plan(op, dy, w, (30,), **attrs)

    assert plan(64, 64).variant == "implicit"
    assert plan(64, 256, k=(1,)).variant == "implicit"          # a long 1x1 reduction
    short = plan(64, 64, k=(1,))
    assert short.variant != "implicit" and "1x1 at stride 1" in str(short)
    from numbaconv.strategies import igemm as s_igemm
    assert plan(64, 64, groups=2).variant == "implicit"
    many = plan(160, 160, groups=s_igemm.MAX_GROUPS + 1)
    assert many.variant != "implicit" and "groups" in str(many)
    # channels that are not whole vectors: a masked last vector (20 a group, 20 in all),
    # except for a 1x1 layer at stride 1 without pads
    assert plan(40, 64, groups=2).variant == "implicit"
    assert plan(20, 64).variant == "implicit"
    odd = plan(20, 256, k=(1,))
    assert odd.variant != "implicit" and "not whole" in str(odd)
    assert plan(64, 64, op="convolution_backprop_filters").variant != "implicit"


@pytest.mark.parametrize("side, groups, variant", [(14, 3, "claimed"), (7, 3, "claimed"),
                                                   (28, 3, "implicit"), (14, 1, "implicit")])
def test_grouped_1x1_over_few_rows_goes_to_claimed(side, groups, variant, monkeypatch):
    """With 256-bit vectors a grouped 1x1 backward data over fewer than GROUPED_1X1_ROWS
    rows of dY is gemm[claimed]'s (ShuffleNet's stage3_gconv2: 8 x 14 x 14 = 1568 rows, 3
    groups of 40 <- 160 channels), with the reason in the plan; over more rows, and
    without groups, the implicit GEMM keeps it; the claimed result matches the reference.
    With 512-bit vectors (not measured) the implicit GEMM keeps them all."""
    import dataclasses

    import numbaconv.machine
    real = numbaconv.machine.machine()
    monkeypatch.setattr(numbaconv.machine, "machine",
                        lambda: dataclasses.replace(real, vector_bytes=32))
    planner.clear_plan_cache()
    rng = np.random.default_rng(side + groups)
    dy = rng.standard_normal((8, side, side, 480)).astype(np.float32)
    w = rng.standard_normal((1, 1, 120 // groups, 480)).astype(np.float32)
    kw = dict(strides=1, pads_begin=0, pads_end=0, groups=groups)
    plan = nc.plan("convolution_backprop_data", dy, w, (side, side), **kw)
    from numbaconv.kernels.cpu import igemm
    if variant == "implicit" and (120 // groups) % igemm.lanes(4):
        # the kernels' own vectors (512-bit on an AVX-512 host) refuse 40 channels: the
        # row rule must not be the reason
        assert "claim the groups' row blocks" not in str(plan), plan
        assert "not whole" in str(plan), plan
    else:
        assert plan.variant == variant, plan
    if variant == "claimed" and groups > 1:
        assert f"over {8 * side * side} rows" in str(plan), plan
        got = nc.convolution_backprop_data(dy, w, (side, side), **kw)
        err = normalized_error(got, conv_bwd_data_ref, dy, w, (side, side), stride=1,
                               dilation=1, pads_begin=0, pads_end=0, groups=groups)
        assert err <= tolerance("float32")
    monkeypatch.setattr(numbaconv.machine, "machine",
                        lambda: dataclasses.replace(real, vector_bytes=64))
    planner.clear_plan_cache()
    wide = nc.plan("convolution_backprop_data", dy, w, (side, side), **kw)
    assert "claim the groups' row blocks" not in str(wide), wide
    planner.clear_plan_cache()


def test_implicit_variant_declines_the_blas_engine(monkeypatch):
    from numbaconv import config
    monkeypatch.setattr(config, "GEMM_ENGINE", "blas")
    dy, w = np.zeros((2, 28, 64), np.float32), np.zeros((3, 64, 64), np.float32)
    plan = nc.plan("convolution_backprop_data", dy, w, (30,), strides=1, pads_begin=0,
                   pads_end=0)
    assert plan.variant != "implicit" and "GEMM_ENGINE" in str(plan)


def test_padded_extent_covers_every_tap():
    """Every phase pixel's every tap reads inside the padded dY (the kernel does no bounds
    checks)."""
    from numbaconv.strategies._gemm_common import stride_phases as _phases
    dy = np.zeros((1, 4, 5, 3, 8), np.float32)
    w = np.zeros((3, 2, 3, 16, 8), np.float32)
    plan = nc.plan("convolution_backprop_data", dy, w, (7, 6, 5), strides=(2, 1, 2),
                   dilations=(1, 2, 1), pads_begin=(1, 0, 2), pads_end=(2, 1, 1))
    p = plan.problem
    phases = _phases(p)
    pads = strategy._pads(p, phases)
    for _, grid, taps in phases:
        for _, off in taps:
            for a in range(3):
                lead, extent = pads[a]
                if grid[a]:
                    assert 0 <= lead + off[a] and grid[a] - 1 + off[a] + lead < extent


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_pad_dy_writes_every_element(dtype):
    """``pad_dy`` copies dY into the middle of dYp (float16 widened to float32) and zeroes
    all the rest itself, leading and trailing pads on every axis: a NaN-filled dYp comes
    back with no NaN left."""
    rng = np.random.default_rng(3)
    dy = rng.standard_normal((2, 3, 4, 5, 6)).astype(dtype)
    lead = np.array([1, 2, 0], np.int64)
    ct = np.float32 if dtype == np.float16 else dtype
    dyp = np.full((2, 5, 7, 8, 6), np.nan, ct)
    src = dy.view(np.uint16) if dtype == np.float16 else dy
    igemm.pad_dy(src, dyp, lead)
    want = np.zeros(dyp.shape, ct)
    want[:, 1:4, 2:6, 0:5, :] = dy.astype(ct)
    np.testing.assert_array_equal(dyp, want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_streamed_tiles_match_plain_stores(case, dtype, monkeypatch):
    """With every dX streamed (non-temporal stores where one chunk takes all of a phase's
    taps and the tiles start on vector boundaries; plain stores elsewhere), the result is
    bit for bit that of plain stores, and matches the reference."""
    from numbaconv.api import _op
    mb, ic, oc, isz, k, st, dl, pb, pe = case
    x, w, dy, geom, attrs = case_operands(case, dtype, 11)
    got = {}
    for stream in (False, True):
        monkeypatch.setattr(strategy, "streams", lambda *a, s=stream: s)
        monkeypatch.setattr(strategy, "_by_panels", lambda *a: False)
        planner.clear_plan_cache()
        _op.clear_memo()
        plan = nc.plan("convolution_backprop_data", dy, w, isz, **attrs)
        assert plan.tiles["stream"] is stream
        got[stream] = nc.convolution_backprop_data(dy, w, isz, **attrs)
    planner.clear_plan_cache()
    _op.clear_memo()
    np.testing.assert_array_equal(got[True], got[False])
    assert normalized_error(got[True], conv_bwd_data_ref, dy, w, isz, **geom) <= tolerance(dtype)


# Dilated and heavily padded layers, where backward data runs region by region over the
# taps that reach inside dY (kernels.cpu.igemm.bwd_d_regions*): (mb, ic, oc, input
# spatial, kernel, stride, dilation, pads_begin, pads_end)
REGION_CASES = [
    # DeepLab's ASPP shape in small: dilation 6 over 13x13, 9 regions of 4, 6 and 9 taps
    (1, 32, 24, (13, 13), (3, 3), (1, 1), (6, 6), (6, 6), (6, 6)),
    # stride 2 with dilation 3: four phases, each split on its own taps
    (2, 16, 16, (14, 11), (3, 3), (2, 2), (3, 3), (3, 3), (3, 3)),
    # 3-D, mixed dilations and strides per axis
    (1, 16, 24, (6, 9, 10), (3, 3, 3), (1, 2, 1), (2, 3, 4), (2, 3, 4), (2, 2, 4)),
    # 1-D, dilation 16 over 40 pixels (WaveNet/QuartzNet-like), 3 images
    (3, 32, 16, (40,), (3,), (1,), (16,), (16,), (16,)),
    # dilation 8 without pads: pixels 4-7 of each axis that no tap reaches (regions of
    # zeros)
    (2, 16, 8, (12, 12), (2, 2), (1, 1), (8, 8), (0, 0), (0, 0)),
    # 5x5 over 7x7 images: many one-pixel regions with partial tiles
    (4, 16, 16, (7, 7), (5, 5), (1, 1), (1, 1), (2, 2), (2, 2)),
    # 5x5x5 over 4x8x8 (V-Net's last stage in small): boxes of whole rows along w
    (1, 16, 16, (4, 8, 8), (5, 5, 5), (1, 1, 1), (1, 1, 1), (2, 2, 2), (2, 2, 2)),
    # 96 input channels: in the panel scheme two even panels of 48 (not 64 and 32)
    (1, 96, 24, (9, 9), (3, 3), (1, 1), (3, 3), (3, 3), (3, 3)),
]
REGION_IDS = [f"i{'x'.join(map(str, c[3]))}k{'x'.join(map(str, c[4]))}"
              f"d{'x'.join(map(str, c[6]))}s{'x'.join(map(str, c[5]))}" for c in REGION_CASES]


def _fresh():
    from numbaconv.api import _op
    planner.clear_plan_cache()
    _op.clear_memo()
    strategy._TABLES.clear()
    strategy._regions.cache_clear()
    strategy._reads_dy.cache_clear()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", REGION_CASES, ids=REGION_IDS)
def test_per_tap_boxes_match_reference(case, dtype, monkeypatch):
    """Every phase by per-tap boxes (overlapping: a box of zeros over the whole grid, then
    each tap's own box adding to it), in the panel scheme, against the reference; the
    dilated case without pads has pixels that no tap reaches (zeros from the first
    box)."""
    monkeypatch.setattr(strategy, "_by_panels", lambda *a: True)
    monkeypatch.setattr(strategy, "TAP_BOXES_MARGIN", -2.0)  # always per-tap
    monkeypatch.setattr(strategy, "MIN_SKIPPED", -2.0)
    _fresh()
    try:
        assert _run(case, dtype, seed=5, entry="gemm[regions]") <= tolerance(dtype)
        used = [v for v in strategy._TABLES.values() if v is not None]
        assert used and all(v[1] for v in used)  # every phase ran by per-tap boxes
    finally:
        _fresh()


def _case_problem(case):
    """The backward-data problem of a ``REGION_CASES`` / ``CASES`` tuple (planned on
    zeros)."""
    mb, ic, oc, isz, k, st, dl, pb, pe = case
    osz = conv_fwd_ref(np.zeros((1, *isz, 1), np.float32), np.zeros((*k, 1, 1), np.float32),
                       stride=st, dilation=dl, pads_begin=pb, pads_end=pe).shape[1:-1]
    return nc.plan("convolution_backprop_data", np.zeros((mb, *osz, oc), np.float32),
                   np.zeros((*k, ic, oc), np.float32), isz, strides=st, dilations=dl,
                   pads_begin=pb, pads_end=pe).problem


@pytest.mark.parametrize("case", REGION_CASES + CASES, ids=REGION_IDS + IDS)
def test_tap_boxes_cover_each_tap_where_it_reaches_inside(case):
    """tap_boxes: first the whole grid with no taps, then per tap one box holding exactly
    the pixels whose dY pixel for that tap lies inside; and what they skip (in whole row
    tiles) never less than the products on the padding allow."""
    from numbaconv.kernels.cpu import igemm
    from numbaconv.strategies._gemm_common import stride_phases, tap_boxes
    p = _case_problem(case)
    for _, grid, taps in stride_phases(p):
        if not taps:
            continue
        boxes, skipped = tap_boxes(p, grid, taps)
        assert boxes[0] == ((0, 0, 0), tuple(grid), [])
        by_tap = {pos[0]: (lo, hi) for lo, hi, pos in boxes[1:]}
        assert len(by_tap) == len(boxes) - 1
        useful = 0
        for i, (_, b) in enumerate(taps):
            inside = np.zeros(grid, bool)
            for j in itertools.product(*(range(n) for n in grid)):
                inside[j] = all(0 <= j[a] + b[a] < p.osz[a] for a in range(3))
            useful += inside.sum()
            if i not in by_tap:
                assert not inside.any()
                continue
            lo, hi = by_tap[i]
            box = np.zeros(grid, bool)
            box[tuple(slice(u, v) for u, v in zip(lo, hi))] = True
            assert (box == inside).all(), (i, b, lo, hi)
        total = -(-p.mb * math.prod(grid) // igemm.MR) * len(taps)
        assert 1 - skipped >= p.mb * useful / (total * igemm.MR) - 1e-12


@pytest.mark.parametrize("by_panels", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", REGION_CASES, ids=REGION_IDS)
def test_regions_match_reference_and_the_full_sum(case, dtype, by_panels, monkeypatch):
    """Region by region (every phase that skips at least MIN_SKIPPED of its products)
    against the reference, in both parallel schemes; and bit for bit the result of
    summing every tap over the padded dY (skipped products are exact zeros, the chunks of
    taps and their order are the same) where no phase runs by per-tap boxes (whose tiles
    add to dX once per tap)."""
    from numbaconv.strategies._gemm_common import stride_phases
    mb, ic, oc, isz, k, st, dl, pb, pe = case
    monkeypatch.setattr(strategy, "_by_panels", lambda *a: by_panels)
    _fresh()
    assert _run(case, dtype, seed=3, entry="gemm[regions]") <= tolerance(dtype)
    x, w, dy, geom, attrs = case_operands(case, dtype, 4)
    p = nc.plan("convolution_backprop_data", dy, w, isz, **attrs).problem
    assert max(strategy._regions(p, g, t)[1] for _, g, t in stride_phases(p) if t) \
        >= strategy.MIN_SKIPPED
    got = {}
    for entry in ("gemm[regions]", "gemm[implicit]"):
        monkeypatch.setattr(strategy, "MIN_SKIPPED", 0.0)  # every phase that skips any
        got[entry] = nc.convolution_backprop_data(dy, w, isz, strategy=entry, **attrs)
    per_tap = any(v[1] for v in strategy._TABLES.values() if v is not None)
    _fresh()
    if not per_tap:
        assert np.array_equal(got["gemm[regions]"], got["gemm[implicit]"])


@pytest.mark.parametrize("case", REGION_CASES + CASES, ids=REGION_IDS + IDS)
def test_regions_partition_the_phase_grid(case):
    """The boxes of every phase cover its grid once, and a box's taps are exactly those
    whose dY pixel lies inside for each of its pixels (checked pixel by pixel)."""
    from numbaconv.strategies._gemm_common import stride_phases
    p = _case_problem(case)
    for _, grid, taps in stride_phases(p):
        if not taps:
            continue
        regions, skipped, kind = strategy._regions(p, grid, taps)
        assert kind in ("exact", "rows")
        exact = kind == "exact"
        seen = np.zeros(grid, int)
        for lo, hi, pos in regions:
            seen[tuple(slice(u, v) for u, v in zip(lo, hi))] += 1
            some = set()
            for j in itertools.product(*(range(u, v) for u, v in zip(lo, hi))):
                inside = [i for i, (_, b) in enumerate(taps)
                          if all(0 <= j[a] + b[a] < p.osz[a] for a in range(3))]
                if exact:
                    assert inside == pos, (j, inside, pos)
                else:  # whole rows: every tap reaching inside for a pixel is summed
                    assert set(inside) <= set(pos), (j, inside, pos)
                    assert hi[2] - lo[2] == grid[2]
                some.update(inside)
            assert some == set(pos)  # and none that reaches inside for no pixel
        assert (seen == 1).all()
        assert skipped < 1.0  # (negative where the regions' partial tiles cost more)


def test_regions_entry_choice():
    """gemm[regions] comes before gemm[implicit]: it takes dilated layers (ASPP-like), and
    a padded 3x3 layer over a large image (every tap reaches inside nearly everywhere, but
    the regions read dY in place, where gemm[implicit] copies it with padding); it
    declines a 1x1 layer (nothing to pad, nothing skipped), a layer whose regions are
    not exact, and float16, with their reasons."""
    attrs = dict(strides=1, dilations=6, pads_begin=6, pads_end=6)
    dy = np.zeros((1, 20, 20, 64), np.float32)
    w = np.zeros((3, 3, 128, 64), np.float32)
    plan = nc.plan("convolution_backprop_data", dy, w, (20, 20), **attrs)
    assert (plan.strategy, plan.variant) == ("gemm", "regions"), plan
    assert plan.tiles["skipped"] >= strategy.MIN_SKIPPED
    wide = nc.plan("convolution_backprop_data", np.zeros((2, 56, 56, 64), np.float32), w,
                   (56, 56), strides=1, pads_begin=1, pads_end=1)
    assert strategy.REGIONS.accepts(wide.problem) is None        # (winograd runs it)
    assert strategy._skipped(wide.problem) < strategy.MIN_SKIPPED
    assert strategy._reads_dy(wide.problem) and strategy._needs_padding(wide.problem)
    one = nc.plan("convolution_backprop_data", np.zeros((2, 56, 56, 256), np.float32),
                  np.zeros((1, 1, 128, 256), np.float32), (56, 56), strides=1)
    assert one.variant != "regions"
    why = strategy.REGIONS.accepts(one.problem)
    assert why.startswith("every tap reaches inside dY") and strategy.R_NO_COPY in why, why
    # 1-D, 7 taps over 32 pixels with pads of 3 (HiFi-GAN's conv_pre): whole-row regions,
    # not exact: dY is padded anyway
    odd = nc.plan("convolution_backprop_data", np.zeros((4, 32, 64), np.float32),
                  np.zeros((7, 80, 64), np.float32), (32,), strides=1, pads_begin=3,
                  pads_end=3)
    if not strategy._reads_dy(odd.problem):
        assert odd.variant != "regions"
        assert strategy.R_NOT_EXACT in strategy.REGIONS.accepts(odd.problem)
    half = nc.plan("convolution_backprop_data", dy.astype(np.float16), w.astype(np.float16),
                   (20, 20), strategy="gemm[implicit]", **attrs).problem
    assert strategy.REGIONS.accepts(half) == strategy.R_HALF


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_regions_read_a_padded_layers_dy_in_place(groups, dtype):
    """A padded 3x3 layer (pads of 1) whose regions are exact but skip few products: the
    regions read dY itself (no zero-padded copy), with one group and with two, against
    the reference and bit for bit the implicit GEMM over the padded copy."""
    rng = np.random.default_rng(groups)
    dy = rng.standard_normal((2, 20, 19, 32 * groups)).astype(dtype)
    w = rng.standard_normal((3, 3, 16, 32 * groups)).astype(dtype)
    attrs = dict(strides=1, pads_begin=1, pads_end=1, groups=groups)
    p = nc.plan("convolution_backprop_data", dy, w, (20, 19), strategy="gemm[regions]",
                **attrs).problem
    q = _gemm_common.group_problem(p)
    assert strategy._skipped(p) < strategy.MIN_SKIPPED
    assert strategy._needs_padding(q) and strategy._reads_dy(q)
    assert strategy.REGIONS.accepts(p) is None
    got = nc.convolution_backprop_data(dy, w, (20, 19), strategy="gemm[regions]", **attrs)
    full = nc.convolution_backprop_data(dy, w, (20, 19), strategy="gemm[implicit]", **attrs)
    err = normalized_error(got, conv_bwd_data_ref, dy, w, (20, 19), stride=1, dilation=1,
                           pads_begin=1, pads_end=1, groups=groups)
    assert err <= tolerance(dtype)
    assert np.array_equal(got, full)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_narrow_panels_pack_only_the_channels(dtype, monkeypatch):
    """gemm[regions] packs dX's 16 or 21 channels as B rows of whole vectors (not NR wide),
    gemm[implicit] and float16 keep NR; the narrow panel gives gemm[regions] the bits of
    the full one."""
    from numbaconv.kernels.cpu import igemm as k
    vl = k.lanes(np.dtype(dtype).itemsize)
    for ic in (16, 21):
        case = (2, ic, 24, (9, 11), (3, 3), (1, 1), (2, 2), (2, 2), (2, 2))
        p = _case_problem(case)
        item = np.dtype(dtype).itemsize
        if ic >= k.panel(item):
            continue
        monkeypatch.setattr(strategy, "NARROW_PANEL", True)
        assert strategy._panel_nr(p, item) == -(-ic // vl) * vl
        assert strategy._panel_nr(p, item, full=True) == k.panel(item)
        x, w, dy, geom, attrs = case_operands(case, dtype, 5)
        got = {}
        for narrow in (True, False):
            monkeypatch.setattr(strategy, "NARROW_PANEL", narrow)
            _fresh()
            got[narrow] = nc.convolution_backprop_data(dy, w, case[3], strategy="gemm[regions]",
                                                       **attrs)
        monkeypatch.setattr(strategy, "NARROW_PANEL", True)
        _fresh()
        np.testing.assert_array_equal(got[True], got[False])
        assert _run(case, dtype, seed=6, entry="gemm[regions]") <= tolerance(dtype)
    _fresh()
