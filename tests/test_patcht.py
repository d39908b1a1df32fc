"""The patch-t variant of the GEMM strategy (the weight gradient as the transposed patch
GEMM, vectors across input channels, :mod:`numbaconv.kernels.cpu.patcht`) against the
float64 NumPy reference: 1-D, 2-D and 3-D, strides, dilation along every axis, pads on
either side (wider than the kernel, and rows whose every pixel reaches into the padding
for some taps), input channels that are and are not whole vectors (the padded copy),
output channels that are and are not whole register tiles, float16/32/64, one thread,
bitwise-equal repeated calls; and the planner's choice of it."""
import numpy as np
import pytest

import numbaconv as nc
from numbaconv import config
from numbaconv.strategies import patcht
from reference import conv_bwd_filter_ref, conv_fwd_ref, normalized_error, tolerance

# (mb, ic, oc, input spatial, kernel, stride, dilation, pads_begin, pads_end[, groups])
CASES = [
    # DenseNet-BC's growth layer: 3x3 over 8x8, 48 -> 12 (one tile of output channels)
    (4, 48, 12, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    # GoogLeNet's 5x5 branch: 16 -> 32 (output channels padded to three tiles)
    (2, 16, 32, (9, 11), (5, 5), (1, 1), (1, 1), (2, 2), (2, 2)),
    # 24 input channels (padded to whole vectors: the copied input), stride 2, asymmetric
    (2, 24, 24, (11, 13), (3, 3), (2, 2), (1, 1), (1, 0), (0, 1)),
    # dilation along h and w, pads wider than the kernel's reach along h
    (1, 32, 20, (6, 10), (3, 4), (1, 3), (2, 2), (4, 1), (3, 0)),
    # 3-D, stride and dilation along d, pads on one side only
    (2, 16, 12, (5, 4, 6), (3, 2, 3), (2, 1, 1), (2, 1, 1), (1, 0, 1), (1, 1, 0)),
    # 1-D, taps whose every output pixel reads the padding
    (2, 64, 12, (5,), (7,), (1,), (1,), (6,), (6,)),
    # 1x1 at stride 2 over a detection head's channels, 24 outputs
    (2, 256, 24, (9, 9), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)),
    # more output rows than a block (several blocks per thread), 36 outputs
    (8, 32, 36, (20, 24), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    # 1x1 over a speech model's 1024 channels, 29 outputs (three tiles, the last padded);
    # at stride 2, which keeps it the entry's with 256-bit vectors too (at stride 1 there,
    # gemm[identity]'s)
    (2, 1024, 29, (40,), (1,), (2,), (1,), (0,), (0,)),
    # 16 output channels: the 16-row tile, no padding
    (2, 32, 16, (6, 7), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    # ResNeXt-like: 4 groups of 16 channels at stride 2 (groups read in place)
    (2, 64, 64, (9, 10), (3, 3), (2, 2), (1, 1), (1, 1), (1, 0), 4),
    # 3 groups of 32 input and 24 output channels, 3-D
    (1, 96, 72, (3, 5, 6), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1), 3),
    # heads (the two-row tile): a 3-D segmentation head, 32 -> 2, 1x1x1
    (1, 32, 2, (4, 6, 9), (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)),
    # 64 -> 3 (output channels padded to two tiles), 3x3 at stride 2, asymmetric pads
    (2, 64, 3, (9, 11), (3, 3), (2, 2), (1, 1), (1, 0), (0, 1)),
    # 48 -> 5, 1-D, dilated (three vectors of input channels: a pass of two, one of one)
    (2, 48, 5, (23,), (5,), (1,), (2,), (4,), (4,)),
]
IDS = [f"mb{c[0]}ic{c[1]}oc{c[2]}i{'x'.join(map(str, c[3]))}k{'x'.join(map(str, c[4]))}"
       f"s{'x'.join(map(str, c[5]))}" for c in CASES]


def _operands(case, dtype, seed):
    mb, ic, oc, isz, k, st, dl, pb, pe, *g = case
    g = g[0] if g else 1
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((mb, *isz, ic)).astype(dtype)
    w = rng.standard_normal((*k, ic // g, oc)).astype(dtype)
    geom = dict(stride=st, dilation=dl, pads_begin=pb, pads_end=pe, groups=g)
    dy = rng.standard_normal(conv_fwd_ref(x, w, **geom).shape).astype(dtype)
    attrs = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe, groups=g)
    return x, dy, k, geom, attrs


def _run(case, dtype, seed=0, strategy="gemm[patch-t]"):
    x, dy, k, geom, attrs = _operands(case, dtype, seed)
    x0, dy0 = x.copy(), dy.copy()
    plan = nc.plan("convolution_backprop_filters", x, k, dy, strategy=strategy, **attrs)
    assert (plan.strategy, plan.variant) == ("gemm", "patch-t"), plan
    got = nc.convolution_backprop_filters(x, k, dy, strategy=strategy, **attrs)
    g = attrs["groups"]
    assert got.dtype == np.dtype(dtype) and got.shape == (*k, x.shape[-1] // g, dy.shape[-1])
    assert np.array_equal(x, x0) and np.array_equal(dy, dy0)  # inputs untouched
    return normalized_error(got, conv_bwd_filter_ref, x, dy, k, **geom)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_patch_t_matches_reference(case, dtype):
    assert _run(case, dtype) <= tolerance(dtype)


@pytest.mark.parametrize("index", [0, 2, 9, 12])
def test_patch_t_float16(index):
    """Read in place as float16 bits and widened as loaded (cases 0 and 9, and the 3-D
    head 12 on the two-row tile), or padded into float32 copies (case 2)."""
    assert _run(CASES[index], "float16") <= tolerance("float16")


def test_patch_t_one_thread():
    nt = nc.get_num_threads()
    try:
        nc.set_num_threads(1)
        assert _run(CASES[7], "float32", seed=3) <= tolerance("float32")
    finally:
        nc.set_num_threads(nt)


def test_patch_t_is_bitwise_reproducible():
    x, dy, k, _, attrs = _operands(CASES[7], "float32", 5)
    first = nc.convolution_backprop_filters(x, k, dy, strategy="gemm[patch-t]", **attrs)
    for _ in range(4):
        again = nc.convolution_backprop_filters(x, k, dy, strategy="gemm[patch-t]", **attrs)
        assert np.array_equal(first.view(np.uint32), again.view(np.uint32))


def test_patch_t_reads_nothing_past_the_channels():
    """A non-contiguous input (a channel slice) is taken whole: channels outside the slice,
    huge, must not reach the result."""
    mb, ic, oc, isz = 2, 32, 12, (7, 9)
    rng = np.random.default_rng(6)
    big = rng.standard_normal((mb, *isz, ic + 16)).astype(np.float32)
    big[..., ic:] = 1e30
    x = big[..., :ic]
    dy = rng.standard_normal((mb, *isz, oc)).astype(np.float32)
    attrs = dict(strides=1, pads_begin=1, pads_end=1)
    got = nc.convolution_backprop_filters(x, (3, 3), dy, strategy="gemm[patch-t]", **attrs)
    want = conv_bwd_filter_ref(x.astype(np.float64), dy.astype(np.float64), (3, 3),
                               stride=(1, 1), dilation=(1, 1), pads_begin=(1, 1),
                               pads_end=(1, 1))
    assert np.abs(got - want).max() / np.abs(want).max() <= tolerance("float32")


def test_patch_t_choice(monkeypatch):
    """One group, 16 or more input channels, at most MAX_OUTPUT_CHANNELS outputs and little
    padding waste: the planner takes it; the rest decline with their reasons."""
    from numbaconv.kernels.cpu import ukernel
    if ukernel.VECTOR_BYTES < 64:
        pytest.skip("the limits below were measured on 512-bit-vector hosts; with 256-bit "
                    "vectors whole vectors of channels start at 8 and the tiles differ")
    monkeypatch.setattr(config, "SMALL_FLOPS", 0)

    def plan(ic, oc, k=(3, 3), n=14, groups=1, op="convolution_backprop_filters"):
        x = np.zeros((8, n, n, ic), np.float32)
        dy = np.zeros((8, n, n, oc), np.float32)
        attrs = dict(strides=1, pads_begin=k[0] // 2, pads_end=k[0] // 2, groups=groups)
        if op == "convolution_backprop_filters":
            return nc.plan(op, x, k, dy, **attrs)
        w = np.zeros((*k, ic // groups, oc), np.float32)
        return nc.plan(op, dy, w, (n, n), **attrs)

    mr = patcht._kernels().TILES[0][0]
    assert plan(48, 12).variant == "patch-t"
    assert plan(128, 2 * mr).variant == "patch-t"
    assert plan(16, 32, k=(5, 5), n=28).variant == "patch-t"    # rows of 28 pixels
    assert plan(16, 32, k=(5, 5), n=patcht.LONG_ROW_PIXELS).variant == "patch-t"  # 16 rows
    long = plan(16, 48, k=(5, 5), n=patcht.LONG_ROW_PIXELS)      # tiles of 12
    assert long.variant != "patch-t" and "rows of" in str(long)
    assert plan(256, 21, k=(1, 1)).variant == "patch-t"
    assert plan(192, 32, k=(1, 1)).variant == "patch-t"
    one = plan(192, 40, k=(1, 1))
    assert one.variant != "patch-t" and "1x1 layer" in str(one)
    # beyond MAX_OUTPUT_CHANNELS: short rows, 1x1 over few channels, 5x5, 3-D volumes
    n = patcht.LONG_ROW_PIXELS
    assert plan(192, 256, groups=2, n=n - 1).variant == "patch-t"   # (winograd: 1 group)
    assert plan(64, 128, k=(1, 1), n=n).variant == "patch-t"
    assert plan(48, 128, k=(5, 5), n=n).variant == "patch-t"
    wide = plan(192, 256, groups=2, n=n)   # (winograd takes it: groups of 96 -> 128)
    assert wide.variant != "patch-t" and "as fast" in patcht.STRATEGY.accepts(wide.problem)
    one = plan(96, 128, k=(1, 1), n=n)
    assert one.variant != "patch-t" and "as fast" in str(one)
    assert plan(48, patcht.WIDE_OUTPUT_CHANNELS + 16, n=7).variant != "patch-t"
    few = plan(8, 12)
    assert few.variant != "patch-t" and "less than a vector" in str(few)
    waste = plan(24, 20)   # 24 -> 32 channels, 20 -> 24 outputs
    assert waste.variant != "patch-t" and "on zeros" in str(waste)
    assert plan(512, 512, groups=32).variant == "patch-t"        # 16 x 16 a group
    grouped = plan(256, 256, groups=32)                          # 8 x 8 a group
    assert grouped.variant != "patch-t" and "less than a vector" in str(grouped)
    odd = plan(96, 60, groups=3)                                 # 32 x 20 a group
    assert odd.variant != "patch-t" and "read in place" in str(odd)
    dw = plan(32, 32, groups=32)
    assert dw.variant != "patch-t" and "depthwise" in str(dw)
    assert plan(48, 12, op="convolution_backprop_data").variant != "patch-t"
    # heads: the two-row tile for fewer than HEAD_OUTPUTS outputs over at most
    # HEAD_INPUT_CHANNELS inputs; over more, and for one output (half the tile on
    # zeros), direct[narrow]
    head = plan(patcht.HEAD_INPUT_CHANNELS, 2, k=(1, 1))
    assert head.variant == "patch-t" and head.tiles["tile"] == patcht.HEAD_TILE
    assert plan(patcht.HEAD_INPUT_CHANNELS, 3).tiles["tile"] == patcht.HEAD_TILE  # 3x3
    assert plan(patcht.HEAD_INPUT_CHANNELS, 3, k=(1, 1)).variant == "narrow"  # padded dy
    assert plan(32, patcht.HEAD_OUTPUTS - 1).tiles["tile"] == patcht.HEAD_TILE
    assert plan(2 * patcht.HEAD_INPUT_CHANNELS, 2, k=(1, 1)).variant == "narrow"
    assert plan(32, 1, k=(1, 1)).variant == "narrow"
    assert plan(32, patcht.HEAD_OUTPUTS).tiles.get("tile") != patcht.HEAD_TILE


def test_patch_t_takes_3d_volumes_with_many_outputs(monkeypatch):
    """3-D filters of 27+ taps over enough output positions take up to
    VOLUME_OUTPUT_CHANNELS outputs; a small volume (a short reduction into a large dW)
    does not."""
    from numbaconv.machine import machine
    if machine().vector_bytes < 64:
        pytest.skip("256-bit vectors: at most NARROW_VECTOR_OUTPUTS outputs per group")

    def plan(n, oc=256, ic=64):
        x = np.zeros((1, n, n, n, ic), np.float32)
        dy = np.zeros((1, n, n, n, oc), np.float32)
        return nc.plan("convolution_backprop_filters", x, (3, 3, 3), dy, strides=1,
                       pads_begin=1, pads_end=1)

    assert plan(10).variant == "patch-t"            # 1000 positions
    assert plan(8).variant != "patch-t"             # 512
    assert plan(10, patcht.VOLUME_OUTPUT_CHANNELS + 16).variant != "patch-t"
    assert plan(10, 512, ic=256).variant == "patch-t"   # 3.5M weights
    assert plan(10, 512, ic=512).variant != "patch-t"   # 7.1M weights


def test_patch_t_declines_the_blas_engine(monkeypatch):
    monkeypatch.setattr(config, "GEMM_ENGINE", "blas")
    x, dy = np.zeros((8, 8, 8, 48), np.float32), np.zeros((8, 8, 8, 12), np.float32)
    plan = nc.plan("convolution_backprop_filters", x, (3, 3), dy, strides=1, pads_begin=1,
                   pads_end=1)
    assert plan.variant != "patch-t" and "GEMM_ENGINE" in str(plan)


@pytest.mark.parametrize("cores", [4, 8, 16])
def test_patch_t_shares_groups_among_many_threads(cores, monkeypatch):
    """From ``GROUP_SPLIT_CORES`` cores on, grouped weight gradients share the groups among
    the threads (each writes only its own groups' rows, with the rows of the output split
    among what threads are left): the 4- and 3-group cases against the reference in every
    dtype, inputs untouched, the same bits twice."""
    import dataclasses

    import numbaconv.machine
    real = numbaconv.machine.machine()
    monkeypatch.setattr(numbaconv.machine, "machine",
                        lambda: dataclasses.replace(real, cores=cores))
    for index, groups in ((10, 4), (11, 3)):
        x, dy, k, _, attrs = _operands(CASES[index], "float32", 7)
        plan = nc.plan("convolution_backprop_filters", x, k, dy, strategy="gemm[patch-t]",
                       **attrs)
        assert plan.tiles.get("group_parts") == min(groups, cores), str(plan)
        # what threads are left share the rows, or (partials larger than the operands)
        # the columns
        left = plan.tiles["chunks"] * plan.tiles.get("col_parts", 1)
        assert left == max(1, cores // min(groups, cores)), plan
        for dtype in ("float32", "float64", "float16"):
            assert _run(CASES[index], dtype, seed=7) <= tolerance(dtype), (index, dtype)
        kw = dict(strategy="gemm[patch-t]", **attrs)
        first = nc.convolution_backprop_filters(x, k, dy, **kw)
        assert np.array_equal(first, nc.convolution_backprop_filters(x, k, dy, **kw))
    monkeypatch.setattr(numbaconv.machine, "machine",
                        lambda: dataclasses.replace(real, cores=patcht.GROUP_SPLIT_CORES - 1))
    from numbaconv import planner
    planner.clear_plan_cache()  # (the plans above were made for more cores)
    x, dy, k, _, attrs = _operands(CASES[10], "float32", 7)
    plan = nc.plan("convolution_backprop_filters", x, k, dy, strategy="gemm[patch-t]", **attrs)
    assert "group_parts" not in plan.tiles, plan


@pytest.fixture
def sixteen_cores(monkeypatch):
    """The planner sees a 16-core host (plans made for it are dropped afterwards)."""
    import dataclasses

    import numbaconv.machine
    from numbaconv import planner
    real = numbaconv.machine.machine()
    monkeypatch.setattr(numbaconv.machine, "machine",
                        lambda: dataclasses.replace(real, cores=16))
    planner.clear_plan_cache()
    yield
    planner.clear_plan_cache()


def test_patch_t_shares_columns_where_partials_outweigh_operands(sixteen_cores, monkeypatch):
    """On 16 cores with 512-bit vectors an I3D-shaped 3x3x3 weight gradient (784 output positions, 2.2 MB of
    dW against 1 MB of operands) shares dW's columns among the threads, one dW and no
    partials; a DenseNet growth layer (a tiny dW over many pixels) keeps its shares of
    the rows. Planning only: the kernels' results are the next test's."""
    import dataclasses

    import numbaconv.machine
    sixteen = numbaconv.machine.machine()
    monkeypatch.setattr(numbaconv.machine, "machine",
                        lambda: dataclasses.replace(sixteen, vector_bytes=64))

    def plan(mb, ic, oc, isz, k):
        x = np.zeros((mb, *isz, ic), np.float32)
        dy = np.zeros((mb, *isz, oc), np.float32)
        return nc.plan("convolution_backprop_filters", x, k, dy, strides=1,
                       pads_begin=1, pads_end=1, strategy="gemm[patch-t]")

    i3d = plan(1, 96, 208, (4, 14, 14), (3, 3, 3))
    assert i3d.tiles.get("col_parts") == 16 and i3d.tiles["chunks"] == 1, i3d
    growth = plan(8, 128, 12, (16, 16), (3, 3))
    assert "col_parts" not in growth.tiles and growth.tiles["chunks"] == 16, growth


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_patch_t_columns_shared_among_threads(case, sixteen_cores, monkeypatch):
    """Every case with dW's columns ``(tap, tile of output channels)`` shared among 16
    threads (forced: ``COL_SPLIT_SHARE`` 0), the rows among what threads are left: against
    the float64 reference, inputs untouched, the same bits twice; float64 and float16 on
    the 3-D and grouped cases."""
    monkeypatch.setattr(patcht, "COL_SPLIT_SHARE", 0.0)
    x, dy, k, _, attrs = _operands(case, "float32", 5)
    plan = nc.plan("convolution_backprop_filters", x, k, dy, strategy="gemm[patch-t]",
                   **attrs)
    gparts, cparts = plan.tiles.get("group_parts", 1), plan.tiles.get("col_parts", 1)
    mr = patcht._kernels().TILES[plan.tiles["tile"]][0]
    units = np.prod(k) * patcht.padded(plan.problem, plan.tiles["tile"])[1] // mr
    assert cparts > 1 or units == 1, plan  # (a 1x1 head: one tap, one tile)
    assert plan.tiles["chunks"] * cparts * gparts <= 16, plan
    dtypes = ("float32", "float64", "float16") if len(case[3]) == 3 else ("float32",)
    for dtype in dtypes:
        assert _run(case, dtype, seed=5) <= tolerance(dtype), dtype
    kw = dict(strategy="gemm[patch-t]", **attrs)
    x0, dy0 = x.copy(), dy.copy()
    first = nc.convolution_backprop_filters(x, k, dy, **kw)
    assert np.array_equal(first, nc.convolution_backprop_filters(x, k, dy, **kw))
    assert np.array_equal(x, x0) and np.array_equal(dy, dy0)


@pytest.mark.parametrize("vector_bytes", [32, 64])
def test_patch_t_on_256_bit_vectors_takes_narrow_layers_only(vector_bytes, monkeypatch):
    """With 256-bit vectors the entry takes at most NARROW_VECTOR_OUTPUTS output channels
    per group and NARROW_VECTOR_GROUPS groups (the GEMM entries and direct[grouped] are
    faster beyond); with 512-bit vectors both layers below are its."""
    import dataclasses

    import numbaconv.machine
    real = numbaconv.machine.machine()
    monkeypatch.setattr(numbaconv.machine, "machine",
                        lambda: dataclasses.replace(real, vector_bytes=vector_bytes))

    def why(ic, oc, g=1):
        p = nc.problem.ConvProblem("bwd_w", 8, g, ic, oc, (1, 14, 14), (1, 3, 3),
                                   (1, 14, 14), (1, 1, 1), (1, 1, 1), (0, 1, 1), (0, 1, 1),
                                   2, "float32")
        return patcht.STRATEGY.accepts(p)

    assert why(128, 32) is None                          # DenseNet's growth layer
    assert why(48, patcht.NARROW_VECTOR_OUTPUTS) is None
    wide, grouped = why(64, 64), why(512, 512, g=32)     # 16 outputs a group, 32 groups
    if vector_bytes == 64:
        assert wide is None and grouped is None
    else:
        assert "256-bit vectors" in wide and "64 output channels" in wide
        assert "256-bit vectors" in grouped and "32 group(s)" in grouped


@pytest.mark.parametrize("vector_bytes", [32, 64])
def test_patch_t_leaves_wider_1x1_layers_to_blas_on_256_bit_vectors(vector_bytes, monkeypatch):
    """With 256-bit vectors a 1x1 layer on the arrays themselves into more than
    NARROW_VECTOR_1X1_OUTPUTS output channels is gemm[identity]'s (one BLAS GEMM); a padded
    or strided 1x1 layer and one into fewer channels stay the entry's; 512-bit hosts keep
    their rules."""
    import dataclasses

    import numbaconv.machine
    real = numbaconv.machine.machine()
    monkeypatch.setattr(numbaconv.machine, "machine",
                        lambda: dataclasses.replace(real, vector_bytes=vector_bytes))

    def why(ic, oc, stride=1, pad=0):
        o = (14 + 2 * pad - 1) // stride + 1
        p = nc.problem.ConvProblem("bwd_w", 8, 1, ic, oc, (1, 14, 14), (1, 1, 1),
                                   (1, o, o), (1, stride, stride), (1, 1, 1), (0, pad, pad),
                                   (0, pad, pad), 2, "float32")
        return patcht.STRATEGY.accepts(p) or ""

    most = patcht.NARROW_VECTOR_1X1_OUTPUTS
    wider = why(120, most + 16)
    # the rule's own reason ("a 1x1 layer into ..."); other rules may name a 1x1 layer too
    # (gemm[patch-t]'s tile rows on the host's real vectors)
    rule = "a 1x1 layer into"
    assert rule not in why(64, 16) and rule not in why(120, most)
    assert rule not in why(120, most + 16, stride=2) and rule not in why(120, most + 16, pad=1)
    if vector_bytes == 64:
        assert "gemm[identity]" not in wider
    else:
        assert "1x1 layer into 40 output channels" in wider and "gemm[identity]" in wider
