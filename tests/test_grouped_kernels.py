"""The grouped variant of ``direct`` (register-blocked kernels on the group-minor layout,
:mod:`numbaconv.kernels.cpu.grouped`) against the float64 NumPy reference: every path of its
kernels (stride phases, phases no tap reaches, runs of taps, dilation, asymmetric pads,
1-D/2-D/3-D, tile and channel remainders, a partial last vector of groups, row and column
blocks of backward weights), in float32 and float64. Shapes are small: the file's time is
mostly compilation."""
import numpy as np
import pytest

import numbaconv as nc
from numbaconv.strategies import grouped
from reference import (conv_bwd_data_ref, conv_bwd_filter_ref, conv_fwd_ref, normalized_error,
                       tolerance)

# (groups, ic, oc, input spatial, kernel, stride, dilation, pads_begin, pads_end)
CASES = [
    # 3-D, 4x4 channels per group, 16 groups: the resnext3d shape, small
    (16, 64, 64, (3, 5, 9), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1)),
    # 3-D stride 2 (phases with one and two taps), 8 groups of 8x8
    (8, 64, 64, (4, 6, 9), (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), (1, 0, 1)),
    # 2-D, 16 in / 32 out channels per group, stride 2 along w only, asymmetric pads
    # (16 in: the strided gathers of a grouped weight gradient with unequal channels)
    (8, 128, 256, (5, 7), (3, 3), (1, 2), (1, 1), (1, 0), (0, 2)),
    # 2-D, 17 in / 3 out per group (channel and tile remainders), dilation 2 along w
    (8, 136, 24, (6, 11), (3, 3), (1, 1), (1, 2), (2, 2), (1, 1)),
    # 1-D, 3 in / 17 out per group, 12 groups (a partial last vector of groups), stride 3
    # with a kernel of extent 3: every phase has one tap
    (12, 36, 204, (13,), (3,), (3,), (1,), (2,), (0,)),
    # 1-D 1x1 at stride 3: phases that no tap reaches (zeros), 16 in / 8 out per group
    (16, 256, 128, (10,), (1,), (3,), (1,), (0,), (0,)),
    # 2-D, 4 in / 32 out per group, stride 2 and dilation 2 together, big pads; rows
    # narrower than a tile
    (16, 64, 512, (7, 3), (2, 2), (2, 2), (2, 2), (2, 3), (1, 2)),
    # 3-D, 8 groups of 32x32 at stride 2 (ResNeXt-3D conv_3d:12, small): half-width
    # vectors in float32 on AVX-512 hosts
    (8, 256, 256, (3, 5, 6), (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), (1, 1, 1)),
    # 3-D, 8 in / 16 out per group, kernel 1 along d, width 2 (fewer pixels than a tile)
    (16, 128, 256, (2, 4, 2), (1, 3, 3), (1, 1, 1), (1, 1, 1), (0, 1, 1), (0, 1, 1)),
    # 2-D, 16 groups of 16x16 over 7-pixel rows (ResNeXt's 7x7 layers): seven-pixel
    # tiles in every pass that gathers (TILE_D7 on AVX-512 hosts)
    (16, 256, 256, (3, 7), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    # 2-D stride 2 over 14-pixel rows (ResNeXt's layer4_0, small): backward data's two
    # stride phases of 7 pixels each; 3 out per group: 3 channels of the forward's tiles
    (16, 160, 48, (2, 14), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
]
IDS = [f"g{c[0]}ic{c[1]}oc{c[2]}i{'x'.join(map(str, c[3]))}k{'x'.join(map(str, c[4]))}"
       f"s{'x'.join(map(str, c[5]))}d{'x'.join(map(str, c[6]))}" for c in CASES]


def _run(direction, case, dtype, mb=2, seed=0, strategy="direct"):
    """The normalised error (docs/contract.md section 10) of the grouped variant, forced, on
    one case (``strategy=None``: of the planner's choice)."""
    g, ic, oc, isz, k, st, dl, pb, pe = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((mb, *isz, ic)).astype(dtype)
    w = rng.standard_normal((*k, ic // g, oc)).astype(dtype)
    geom = dict(stride=st, dilation=dl, pads_begin=pb, pads_end=pe, groups=g)
    dy = rng.standard_normal(conv_fwd_ref(x, w, **geom).shape).astype(dtype)
    attrs = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe, groups=g,
                 strategy=strategy)
    call, ref = {"fwd": (("convolution", (x, w)), (conv_fwd_ref, x, w)),
                 "bwd_d": (("convolution_backprop_data", (dy, w, isz)),
                           (conv_bwd_data_ref, dy, w, isz)),
                 "bwd_w": (("convolution_backprop_filters", (x, k, dy)),
                           (conv_bwd_filter_ref, x, dy, k))}[direction]
    plan = nc.plan(call[0], *call[1], **attrs)
    assert strategy is None or (plan.strategy, plan.variant) == ("direct", "grouped")
    got = getattr(nc, call[0])(*call[1], **attrs)
    assert got.dtype == np.dtype(dtype)
    return normalized_error(got, *ref, **geom)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("direction", ["fwd", "bwd_d", "bwd_w"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grouped_kernels_match_reference(case, direction, dtype):
    assert _run(direction, case, dtype) <= tolerance(dtype)


def test_row_tiles_cover_rows_with_the_fewest_products():
    """The gather tile per row: seven-pixel tiles for seven-pixel rows of three or more
    channels on AVX-512 hosts, else the six- or five-pixel tile that wastes least, pixel by
    pixel for rows narrower than a tile."""
    k = grouped._kernels()
    P, NV = k.TILE_D
    if k.HAS_D7:
        assert k.row_tile(7, 16) == (7, 3, 3)
        assert k.row_tile(7, 32) == (7, 3, 3)
        assert k.row_tile(9, 3) == (7, 3, 3)   # not 27 one-vector tiles
        assert k.row_tile(14, 16) == (P - 1, NV, 1)  # 15 pixels x 16 beat 14 x 18
        assert k.row_tile(28, 16) == (P, NV, 2)
        assert k.row_tile(7, 2) == (1, 1, 0)
    else:  # 256-bit vectors: two output channels fill the tile's vectors (NV = 2)
        assert k.row_tile(7, 16)[2] in (1, 2)
        assert k.row_tile(7, 1) == (1, 1, 0)
    assert k.row_tile(3, 16) == (1, 1, 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_grouped_bwd_w_small_blocks(dtype, monkeypatch):
    """Backward weights in blocks of a few pixels: many column blocks with a partial last
    one, several rows per block, more chunks than rows of one image."""
    monkeypatch.setattr(grouped, "BWD_W_BLOCK_BYTES", 1)
    monkeypatch.setattr(grouped, "BWD_W_MIN_PIXELS", 5)
    for case in (CASES[0], CASES[3]):
        assert _run("bwd_w", case, dtype) <= tolerance(dtype)
    monkeypatch.setattr(grouped, "BWD_W_MIN_PIXELS", 24)  # rows of 9: 2 rows per block
    assert _run("bwd_w", CASES[0], dtype, mb=3) <= tolerance(dtype)


# (groups, ic, oc, input spatial, kernel, stride, dilation, pads_begin, pads_end): fewer
# than 8 groups of fewer than 16 channels, which the per-group GEMMs decline
FEW_GROUP_CASES = [
    (2, 16, 16, (9, 10), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    (4, 16, 16, (8, 7), (3, 3), (2, 1), (1, 1), (1, 1), (1, 1)),
    (3, 24, 9, (7, 11), (5, 5), (1, 1), (1, 1), (2, 2), (2, 2)),
    (2, 8, 24, (5, 4, 6), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1)),
]


@pytest.mark.parametrize("direction", ["fwd", "bwd_d", "bwd_w"])
@pytest.mark.parametrize("case", FEW_GROUP_CASES,
                         ids=[f"g{c[0]}ic{c[1]}oc{c[2]}k{'x'.join(map(str, c[4]))}"
                              for c in FEW_GROUP_CASES])
def test_few_groups_of_few_channels_plan_the_grouped_kernels(case, direction):
    """2 to 7 groups of fewer than 16 channels: every GEMM declines them, and the grouped
    kernels, though their vectors of groups are mostly empty lanes, are faster than the
    plain loop nest; planned by default and matching the reference. (Weight gradients
    of at most 4 such groups take per-group GEMMs instead:
    test_few_groups_weight_gradient_takes_per_group_gemms.)"""
    g, ic, oc, isz, k, st, dl, pb, pe = case
    x = np.zeros((2, *isz, ic), np.float32)
    w = np.zeros((*k, ic // g, oc), np.float32)
    kw = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe, groups=g)
    dy = np.zeros(nc.convolution(x, w, **kw).shape, np.float32)
    args = {"fwd": ("convolution", x, w), "bwd_d": ("convolution_backprop_data", dy, w, isz),
            "bwd_w": ("convolution_backprop_filters", x, k, dy)}[direction]
    plan = nc.plan(*args, **kw)
    from numbaconv.strategies import _gemm_common
    if direction == "bwd_w" and _gemm_common.gemm_guard(plan.problem) is None:
        assert plan.strategy == "gemm" and g < _gemm_common.FEW_GROUPS_W, str(plan)
    else:
        assert (plan.strategy, plan.variant) == ("direct", "grouped"), str(plan)
    assert _run(direction, case, "float32", strategy=None) <= tolerance("float32")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_few_groups_weight_gradient_takes_per_group_gemms(dtype):
    """Weight gradients of 2 to 4 groups of 2-15 channels run per-group GEMMs, where the
    grouped kernels' vectors would be at least half empty; 6 groups stay on the grouped
    kernels (docs/performance.md, "Few groups of few channels")."""
    case = (2, 4, 32, (9, 10), (5, 5), (1, 1), (1, 1), (2, 2), (2, 2))
    g, ic, oc, isz, k, st, dl, pb, pe = case
    x = np.zeros((2, *isz, ic), np.float32)
    dy = np.zeros((2, *isz, oc), np.float32)
    kw = dict(strides=st, pads_begin=pb, pads_end=pe, groups=g)
    plan = nc.plan("convolution_backprop_filters", x, k, dy, **kw)
    assert plan.strategy == "gemm", str(plan)
    err = _run("bwd_w", case, dtype, strategy=None)
    assert err <= tolerance(dtype)
    plan6 = nc.plan("convolution_backprop_filters", np.zeros((2, 9, 10, 24), np.float32),
                    (3, 3), np.zeros((2, 9, 10, 72), np.float32), strides=1, pads_begin=1,
                    pads_end=1, groups=6)
    assert (plan6.strategy, plan6.variant) == ("direct", "grouped"), str(plan6)


def test_few_groups_stay_where_gemms_or_the_loop_nest_do_better():
    """Groups of 16 or more channels stay on the per-group GEMMs (ShuffleNet's 3 groups);
    a gather over 2 channels per group would go pixel by pixel and stays on ``direct``."""
    w = np.zeros((1, 1, 20, 240), np.float32)
    plan = nc.plan("convolution_backprop_data", np.zeros((2, 14, 14, 240), np.float32), w,
                   (14, 14), strides=1, groups=3)
    assert plan.strategy == "gemm", str(plan)
    w = np.zeros((5, 5, 2, 32), np.float32)
    plan = nc.plan("convolution_backprop_data", np.zeros((2, 14, 14, 32), np.float32), w,
                   (14, 14), strides=1, pads_begin=2, pads_end=2, groups=2)
    assert (plan.strategy, plan.variant) == ("direct", ""), str(plan)
    assert "2 groups of 2 input channels (< 3)" in str(plan)


def test_grouped_three_groups(monkeypatch):
    """Fewer groups than vector lanes (the strategy's floor lowered): one partial vector."""
    monkeypatch.setattr(grouped, "MIN_GROUPS", 2)
    case = (3, 12, 9, (6, 7), (3, 3), (2, 1), (1, 1), (1, 1), (1, 0))
    for direction in ("fwd", "bwd_d", "bwd_w"):
        assert _run(direction, case, "float64") <= tolerance("float64")


@pytest.mark.parametrize("direction", ["fwd", "bwd_d", "bwd_w"])
@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[7], CASES[9]],
                         ids=[IDS[0], IDS[4], IDS[7], IDS[9]])
def test_grouped_float16_converts_in_the_kernels(case, direction):
    """float16 data is widened as it is copied to group-minor, and forward and backward
    data round their tiles as they store them: bit for bit float32's result on the
    widened operands, rounded once (full and half vectors, a partial vector of groups,
    channels not a multiple of 4); the user's arrays are left alone."""
    g, ic, oc, isz, k, st, dl, pb, pe = case
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, *isz, ic)).astype(np.float16)
    w = rng.standard_normal((*k, ic // g, oc)).astype(np.float16)
    attrs = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe, groups=g,
                 strategy="direct")
    dy = rng.standard_normal(nc.convolution(x, w, **attrs).shape).astype(np.float16)
    call = {"fwd": ("convolution", lambda x, w, dy: (x, w)),
            "bwd_d": ("convolution_backprop_data", lambda x, w, dy: (dy, w, isz)),
            "bwd_w": ("convolution_backprop_filters", lambda x, w, dy: (x, k, dy))}
    name, args = call[direction]
    plan = nc.plan(name, *args(x, w, dy), **attrs)
    assert plan.variant == "grouped"
    assert grouped.STRATEGY.half_operands(plan.problem, plan.tiles)
    saved = [a.copy() for a in (x, w, dy)]
    got = getattr(nc, name)(*args(x, w, dy), **attrs)
    f32 = [a.astype(np.float32) for a in (x, w, dy)]
    want = getattr(nc, name)(*args(*f32), **attrs).astype(np.float16)
    assert got.dtype == np.float16 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    for a, b in zip((x, w, dy), saved):
        np.testing.assert_array_equal(a, b)


def test_grouped_float16_and_noncontiguous():
    """float16 is computed in float32 by the caller; a non-contiguous input still works."""
    case = CASES[1]
    assert _run("bwd_d", case, "float16") <= tolerance("float16")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 5, 7, 128)).astype(np.float32)[:, :, ::-1]
    w = rng.standard_normal((3, 3, 8, 128)).astype(np.float32)
    geom = dict(stride=1, dilation=1, pads_begin=1, pads_end=1, groups=16)
    got = nc.convolution(x, w, strides=1, pads_begin=1, pads_end=1, groups=16,
                         strategy="direct")
    assert normalized_error(got, conv_fwd_ref, x, w, **geom) <= tolerance("float32")


_FUSED_CASES = [c for c in CASES if len(c[4]) < 3 or c[4][0] == 1]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", _FUSED_CASES,
                         ids=[IDS[CASES.index(c)] for c in _FUSED_CASES])
def test_bwd_d_blocks_copy_what_the_whole_copy_does(case, dtype):
    """Backward data with dY copied to group-minor block by block (2-D and 1-D filters)
    equals, bit for bit, the gather on dY copied whole (which the reference checks above):
    blocks of 1, 2, 3 and 8 rows (partial last blocks, a block's taps reaching rows of dY
    outside the image, stride phases), float16 bits widened on the way."""
    from numbaconv import memory
    from numbaconv.strategies import canonical_shapes, geo
    k = grouped._kernels()
    g, ic, oc, isz, kk, st, dl, pb, pe = case
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, *isz, ic)).astype(dtype)
    w = rng.standard_normal((*kk, ic // g, oc)).astype(dtype)
    attrs = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe, groups=g)
    dy = nc.convolution(x, w, strategy="numpy", **attrs).astype(dtype)
    p = nc.plan("convolution_backprop_data", dy, w, isz, **attrs).problem
    vec = grouped._vectors(p)
    phases, left, width = grouped._bwd_d_phases(p)
    w32 = w.astype(np.float32).reshape(*p.ksz, p.icg, p.oc)
    wq, qtab, runs = grouped._bwd_d_filter(w32, p, vec, phases, left)
    d5 = dy.reshape(p.mb, *p.osz, p.oc)
    bits = d5.view(np.uint16) if dtype == "float16" else d5
    out = np.uint16 if dtype == "float16" else np.float32
    whole = memory.empty(canonical_shapes(p)[0], out)
    k.bwd_d_gm(grouped._to_group_minor(bits, g, vec, left, width), wq, whole, geo(p), qtab,
               runs)
    for rb in (1, 2, 3, 8):
        blocks = np.full(canonical_shapes(p)[0], 7, out)
        k.bwd_d_fused(bits, wq, blocks, geo(p), qtab, runs, np.int64(vec[1]), np.int64(left),
                      np.int64(width), np.int64(rb))
        assert np.array_equal(blocks, whole), rb
    ref = conv_bwd_data_ref(dy.astype(np.float64), w.astype(np.float64), isz, stride=st,
                            dilation=dl, pads_begin=pb, pads_end=pe, groups=g)
    got = (whole.view(np.float16) if dtype == "float16" else whole).reshape(ref.shape)
    assert normalized_error(got, lambda *a, **kw: ref) <= tolerance(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", _FUSED_CASES,
                         ids=[IDS[CASES.index(c)] for c in _FUSED_CASES])
def test_fwd_blocks_copy_what_the_whole_copy_does(case, dtype):
    """The forward pass with x copied to group-minor block by block equals, bit for bit,
    the gather on x copied whole: blocks of 1, 2, 3 and 8 rows."""
    from numbaconv import memory
    from numbaconv.strategies import canonical_shapes, geo, w_padding
    k = grouped._kernels()
    g, ic, oc, isz, kk, st, dl, pb, pe = case
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, *isz, ic)).astype(dtype)
    w = rng.standard_normal((*kk, ic // g, oc)).astype(dtype)
    attrs = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe, groups=g)
    p = nc.plan("convolution", x, w, **attrs).problem
    vec = grouped._vectors(p)
    left, width = w_padding(p)
    wf = grouped._fwd_filter(w.astype(np.float32).reshape(*p.ksz, p.icg, p.oc), p, vec)
    x5 = x.reshape(p.mb, *p.isz, p.ic)
    bits = x5.view(np.uint16) if dtype == "float16" else x5
    out = np.uint16 if dtype == "float16" else np.float32
    whole = memory.empty(canonical_shapes(p)[1], out)
    k.fwd_gm(grouped._to_group_minor(bits, g, vec, left, width), wf, whole, geo(p),
             np.int64(left))
    for rb in (1, 2, 3, 8):
        blocks = np.full(canonical_shapes(p)[1], 7, out)
        k.fwd_fused(bits, wf, blocks, geo(p), np.int64(vec[1]), np.int64(left),
                    np.int64(width), np.int64(rb))
        assert np.array_equal(blocks, whole), rb
    ref = conv_fwd_ref(x.astype(np.float64), w.astype(np.float64), stride=st, dilation=dl,
                       pads_begin=pb, pads_end=pe, groups=g)
    got = (whole.view(np.float16) if dtype == "float16" else whole).reshape(ref.shape)
    assert normalized_error(got, lambda *a, **kw: ref) <= tolerance(dtype)


def test_gather_block_rows_rule():
    """Blocks of ``GATHER_BLOCK_ROWS`` rows, fewer for too few blocks per core or a source
    buffer over ``GATHER_BLOCK_BYTES``; none (the source copied whole) for 3-D filters."""
    def problem(mb, h, c, g, k=(1, 3, 3), op="convolution_backprop_data"):
        x = np.zeros((mb, *(h if isinstance(h, tuple) else (h, h)), c), np.float32)
        w = np.zeros((*k[-len(x.shape) + 2:], c // g, c), np.float32)
        attrs = dict(strides=1, pads_begin=1, pads_end=1, groups=g)
        if op == "convolution":
            return nc.plan(op, x, w, **attrs).problem
        return nc.plan(op, np.zeros_like(x), w, x.shape[1:-1], **attrs).problem
    rows = grouped.GATHER_BLOCK_ROWS
    for op in ("convolution_backprop_data", "convolution"):
        assert grouped._block_rows(problem(8, 28, 256, 32, op=op), 2) == rows
        assert grouped._block_rows(problem(1, 16, 256, 32, op=op), 2) == 2  # 8 blocks
        assert grouped._block_rows(problem(2, (4, 6, 6), 64, 16, (3, 3, 3), op=op), 2) == 0
    # a wide image: a padded row of dY in group-minor is 128 KiB (128 pixels x 8 channels
    # x 32 groups in float32), so 2 rows of dX (4 of dY) fill GATHER_BLOCK_BYTES
    wide = problem(8, (16, 126), 256, 32)
    assert grouped._block_rows(wide, 2) == 2
    assert grouped._src_rows(wide, 2) * 128 * 1024 <= grouped.GATHER_BLOCK_BYTES


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_micro_kernels_operands_start_on_64_byte_boundaries(dtype):
    """A group vector read across two cache lines is two loads (docs/performance.md,
    "Grouped backward data"): the packed filters, the group-minor copies and the gathers'
    block buffers start on 64-byte boundaries, whatever the allocator hands out."""
    from numbaconv.kernels.cpu import grouped as k
    from numbaconv.problem import ConvProblem
    from numbaconv.strategies import w_padding
    like = np.zeros(1, dtype)
    for n in (1, 3, 17, 1000, 4099):
        for _ in range(8):  # allocations between, so that the raw starts vary
            np.empty(n % 7 + 1, dtype)
            buf = k._aligned_empty(n, like)
            assert buf.shape == (n,) and buf.dtype == np.dtype(dtype)
            assert buf.ctypes.data % 64 == 0
    p = ConvProblem("bwd_d", 2, 8, 64, 64, (1, 7, 7), (1, 3, 3), (1, 7, 7), (1, 1, 1),
                    (1, 1, 1), (0, 1, 1), (0, 1, 1), 2, dtype, "NXC", "XIO", op="test")
    vec = grouped._vectors(p)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((1, 3, 3, 8, 64)).astype(dtype)
    x = rng.standard_normal((2, 1, 7, 7, 64)).astype(dtype)
    phases, left, _ = grouped._bwd_d_phases(p)
    wq = grouped._bwd_d_filter(w, p, vec, phases, left)[0]
    wf = grouped._fwd_filter(w, p, vec)
    xg = grouped._to_group_minor(x, p.g, vec, *w_padding(p))
    for a in (wq, wf, xg):
        assert a.ctypes.data % 64 == 0
