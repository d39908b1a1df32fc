"""The depthwise kernels (``numbaconv.kernels.cpu.depthwise``, ``depthwise_spans``,
``depthwise_rows``) against the NumPy reference: the multiplier-1 span kernels (explicit
SIMD, any kernel size, stride, dilation, padding and rank) on interior and border pixels,
every stride phase (including phases no tap reaches), column tables of more than three
taps, channel counts that are not a multiple of the vector width, pixel and channel
blocks crossed; and the general kernels that multiplier 2 still takes. Small shapes: the
file runs in seconds once its kernels are compiled."""
import numpy as np
import pytest

import numbaconv as nc
from numbaconv.kernels.cpu import depthwise as k
from numbaconv.kernels.cpu import depthwise_spans as ks
from numbaconv.kernels.cpu import depthwise_rows as kr

from reference import conv_bwd_data_ref, conv_bwd_filter_ref, conv_fwd_ref, normalized_error, \
    out_shape, same_pads_nd, tolerance

# (channels, input spatial, kernel, stride, dilation, pads_begin, pads_end, multiplier)
CASES = {
    "3x3_s1_p1_odd": (17, (9, 10), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), 1),
    "3x3_s1_long_rows": (33, (5, 23), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), 1),
    # full 8-pixel blocks at stride 2: the weight gradient's sliding-window path
    "3x3_s2_long_rows": (19, (4, 41), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), 1),
    "3x3_s2_p1": (3, (8, 7), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), 1),
    "3x3_s2_tf_same": (33, (10, 12), (3, 3), (2, 2), (1, 1), "same", "same", 1),
    "3x3_s2_tf_same_odd": (17, (9, 11), (3, 3), (2, 2), (1, 1), "same", "same", 1),
    "3x3_d2": (16, (7, 9), (3, 3), (1, 1), (2, 2), (2, 2), (2, 2), 1),
    "3x3_s2_d2_empty_phases": (5, (9, 8), (3, 3), (2, 2), (2, 2), (2, 1), (2, 2), 1),
    "3x3_s3": (8, (11, 13), (3, 3), (3, 3), (1, 1), (1, 1), (1, 1), 1),
    "3x3_no_pad": (7, (6, 9), (3, 3), (1, 2), (1, 1), (0, 0), (0, 0), 1),
    "3x3_big_pad": (4, (3, 4), (3, 3), (1, 1), (1, 1), (3, 2), (2, 3), 1),
    "5x2_mixed": (6, (7, 6), (5, 2), (1, 2), (2, 1), (2, 0), (1, 2), 1),
    "1x7_column_chunks": (3, (4, 13), (1, 7), (1, 1), (1, 1), (0, 3), (0, 3), 1),
    "1d": (5, (11,), (3,), (3,), (2,), (2,), (0,), 1),
    # long kernel rows (planned: padded rows; the bordered spans, called directly: the
    # column taps in chunks of 3, 2, 1)
    "1x20_fold": (9, (3, 40), (1, 20), (1, 1), (1, 1), (0, 9), (0, 10), 1),
    "3x17_fold_rows": (5, (4, 30), (3, 17), (1, 1), (1, 1), (1, 8), (1, 8), 1),
    "1d_k33_s2_fold": (20, (90,), (33,), (2,), (1,), (16,), (16,), 1),
    "1d_k24_big_pads": (17, (60,), (24,), (1,), (1,), (20,), (15,), 1),
    "1d_k21_d2_unfolded": (8, (60,), (21,), (1,), (2,), (20,), (20,), 1),
    # 5- and 7-tap rows (planned: padded rows)
    "5x5_one_chunk": (19, (9, 12), (5, 5), (1, 1), (1, 1), (2, 2), (2, 2), 1),
    "3x7_one_chunk": (9, (6, 13), (3, 7), (1, 1), (1, 1), (1, 3), (1, 3), 1),
    "1d_k39_fold_and_7": (12, (70,), (39,), (1,), (1,), (19,), (19,), 1),
    "3d": (4, (4, 5, 6), (2, 3, 3), (2, 1, 2), (1, 2, 1), (1, 1, 0), (0, 1, 1), 1),
    "mult2_s2": (6, (7, 6), (3, 3), (2, 1), (1, 2), (1, 0), (2, 1), 2),
    "mult2_3x3": (5, (6, 7), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), 2),
}


def _pads(case):
    c, isz, ks, st, dl, pb, pe, m = case
    if pb == "same":
        pb, pe = same_pads_nd(isz, ks, st, dl)
    return pb, pe


def _operands(case, dtype, seed=0):
    c, isz, ks, st, dl, _, _, m = case
    pb, pe = _pads(case)
    rng = np.random.default_rng(seed)
    osz = out_shape(isz, ks, st, dl, pb, pe)
    x = rng.standard_normal((2, *isz, c)).astype(dtype)
    w = rng.standard_normal((*ks, 1, c * m)).astype(dtype)
    dy = rng.standard_normal((2, *osz, c * m)).astype(dtype)
    attrs = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe, groups=c)
    return x, w, dy, attrs


#: The depthwise entries of ``direct`` and the loop nest each runs.
KERNELS = {"depthwise-rows": "rows_3x3", "depthwise-unrolled": "unrolled_3x3",
           "depthwise-spans": "spans", "depthwise": "general"}


def _kernel(plan):
    """The depthwise loop nest ``plan`` runs."""
    assert plan.strategy == "direct" and plan.variant in KERNELS, str(plan)
    return KERNELS[plan.variant]


def _check_plan(op, args, attrs, multiplier=1):
    plan = nc.plan(op, *args, **attrs)
    if multiplier != 1:
        assert _kernel(plan) == "general"
    elif op == "convolution_backprop_filters":
        assert _kernel(plan) in ("spans", "rows_3x3")
    else:
        assert _kernel(plan) in ("spans", "unrolled_3x3", "rows_3x3")
    return plan


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", list(CASES))
def test_depthwise_backward_matches_reference(name, dtype):
    case = CASES[name]
    if case[-1] != 1 and dtype == "float32":
        pytest.skip("multiplier 2 runs the general kernels: float64 is enough")
    x, w, dy, attrs = _operands(case, dtype)
    isz, ks = case[1], case[2]
    ref_attrs = dict(stride=attrs["strides"], dilation=attrs["dilations"],
                     pads_begin=attrs["pads_begin"], pads_end=attrs["pads_end"],
                     groups=attrs["groups"])
    _check_plan("convolution_backprop_data", (dy, w, isz), attrs, case[-1])
    got = nc.convolution_backprop_data(dy, w, isz, **attrs)
    assert got.dtype == np.dtype(dtype)
    err = normalized_error(got, conv_bwd_data_ref, dy, w, isz, **ref_attrs)
    assert err <= tolerance(dtype), f"bwd_d {name} {dtype}: {err:.2e}"

    _check_plan("convolution_backprop_filters", (x, ks, dy), attrs, case[-1])
    got = nc.convolution_backprop_filters(x, ks, dy, **attrs)
    assert got.dtype == np.dtype(dtype)
    err = normalized_error(got, conv_bwd_filter_ref, x, dy, ks, **ref_attrs)
    assert err <= tolerance(dtype), f"bwd_w {name} {dtype}: {err:.2e}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c[-1] == 1])
def test_forward_span_driver_matches_reference(name, dtype):
    """The forward pass on backward data's spans, called directly on every multiplier-1
    case (strided and dilated ones too, which the planner leaves to the general loop
    nest): Y from np.empty, every element written, with one, two and five row chunks."""
    from numbaconv.strategies import canonical_shapes, geo

    case = CASES[name]
    x, w, dy, attrs = _operands(case, dtype, seed=5)
    p = nc.plan("convolution", x, w, **attrs).problem
    xs, ys, ws = canonical_shapes(p)
    for chunks in (1, 2, 5):
        y = np.full(ys, np.nan, dtype)
        ks.fwd_depthwise_m1(x.reshape(xs), w.reshape(ws), y, geo(p), chunks)
        got = y.reshape(dy.shape)
        assert not np.isnan(got).any(), f"{name}: pixels left unwritten"
        err = normalized_error(got, conv_fwd_ref, x, w, stride=attrs["strides"],
                               dilation=attrs["dilations"], pads_begin=attrs["pads_begin"],
                               pads_end=attrs["pads_end"], groups=attrs["groups"])
        assert err <= tolerance(dtype), f"fwd {name} {dtype} chunks {chunks}: {err:.2e}"


def test_forward_spans_rule():
    """Forward takes the spans at column stride 1: over padded rows from PADDED_MIN_TAPS
    column taps, whatever the channels; with fewer, up to SPANS_FWD_MAX_BYTES of channels
    per pixel (3x3: the nine-term kernel first), the general loop nest otherwise; forced,
    the entry names its reason."""
    from numbaconv.strategies.depthwise import SPANS_FWD_MAX_BYTES

    def forward(c, stride=1, k=5, dtype=np.float32, kh=None):
        kh = k if kh is None else kh
        x = np.zeros((1, 12, 12, c), dtype)
        w = np.zeros((kh, k, 1, c), dtype)
        kw = dict(strides=stride, groups=c, pads_begin=(kh // 2, k // 2),
                  pads_end=(kh // 2, k // 2))
        return nc.plan("convolution", x, w, strategy="direct", **kw), kw, x, w

    most = SPANS_FWD_MAX_BYTES // 4
    assert _kernel(forward(most)[0]) == "spans"
    assert _kernel(forward(most, k=7)[0]) == "spans"
    assert _kernel(forward(most + 1)[0]) == "spans"  # padded: any width
    assert forward(most + 1)[0].tiles["padded"] is True
    assert _kernel(forward(most, k=3, kh=5)[0]) == "spans"
    assert _kernel(forward(most // 2, k=3, kh=5, dtype=np.float64)[0]) == "spans"
    assert _kernel(forward(most + 1, k=3, kh=5)[0]) == "general"
    assert _kernel(forward(most // 2 + 1, k=3, kh=5, dtype=np.float64)[0]) == "general"
    assert _kernel(forward(16, stride=2)[0]) == "general"
    assert _kernel(forward(16, k=3)[0]) == "unrolled_3x3"
    _, kw, x, w = forward(16, stride=(1, 2))
    with pytest.raises(ValueError, match="column stride 2"):
        nc.convolution(x, w, **kw, strategy="direct[depthwise-spans]")


def test_channel_blocks_are_crossed():
    """More channels than one channel block of the span kernels (float64: half as many
    lanes per byte), and a partial last vector."""
    c = ks.CB_BYTES // 8 + 13
    case = (c, (5, 6), (3, 3), (1, 2), (1, 1), (1, 1), (1, 1), 1)
    x, w, dy, attrs = _operands(case, "float64", seed=1)
    ref_attrs = dict(stride=attrs["strides"], dilation=attrs["dilations"],
                     pads_begin=attrs["pads_begin"], pads_end=attrs["pads_end"], groups=c)
    got = nc.convolution_backprop_data(dy, w, (5, 6), **attrs)
    assert normalized_error(got, conv_bwd_data_ref, dy, w, (5, 6), **ref_attrs) <= 1e-12
    got = nc.convolution_backprop_filters(x, (3, 3), dy, **attrs)
    assert normalized_error(got, conv_bwd_filter_ref, x, dy, (3, 3), **ref_attrs) <= 1e-12


def test_float16_runs_the_float32_kernels():
    case = CASES["3x3_s2_tf_same"]
    x, w, dy, attrs = _operands(case, "float16", seed=2)
    ref_attrs = dict(stride=attrs["strides"], dilation=attrs["dilations"],
                     pads_begin=attrs["pads_begin"], pads_end=attrs["pads_end"],
                     groups=attrs["groups"])
    got = nc.convolution_backprop_data(dy, w, case[1], **attrs)
    assert got.dtype == np.float16
    assert normalized_error(got, conv_bwd_data_ref, dy, w, case[1], **ref_attrs) <= 4e-3
    got = nc.convolution_backprop_filters(x, case[2], dy, **attrs)
    assert got.dtype == np.float16
    assert normalized_error(got, conv_bwd_filter_ref, x, dy, case[2], **ref_attrs) <= 4e-3


ROW_CASES = ["3x3_s1_p1_odd", "3x3_s2_long_rows", "3x3_s2_tf_same_odd", "3x3_big_pad",
             "3x3_no_pad"]


@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
@pytest.mark.parametrize("name", ROW_CASES)
def test_float16_row_kernels_convert_in_their_loads(name, data_format):
    """The row kernels take float16 data as bits and widen (round) it in their loads
    (stores): the result is bit for bit float32's on the widened operands, rounded once;
    the user's arrays are left alone."""
    case = CASES[name]
    x, w, dy, attrs = _operands(case, "float16", seed=3)
    isz, ks = case[1], case[2]
    if data_format == "NCX":
        x, dy = np.moveaxis(x, -1, 1).copy(), np.moveaxis(dy, -1, 1).copy()
    attrs["data_format"] = data_format
    saved = [a.copy() for a in (x, w, dy)]
    plan = nc.plan("convolution_backprop_data", dy, w, isz, **attrs)
    assert _kernel(plan) == "rows_3x3"
    got = nc.convolution_backprop_data(dy, w, isz, **attrs)
    want = nc.convolution_backprop_data(dy.astype(np.float32), w.astype(np.float32), isz,
                                        **attrs).astype(np.float16)
    assert got.dtype == np.float16 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    got = nc.convolution_backprop_filters(x, ks, dy, **attrs)
    want = nc.convolution_backprop_filters(x.astype(np.float32), ks, dy.astype(np.float32),
                                           **attrs).astype(np.float16)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    for a, b in zip((x, w, dy), saved):
        np.testing.assert_array_equal(a, b)


def test_float16_operands_the_row_kernels_take():
    from numbaconv.planner import implementation
    case = CASES["3x3_s1_p1_odd"]
    x, w, dy, attrs = _operands(case, "float16")
    plan = nc.plan("convolution_backprop_data", dy, w, case[1], **attrs)
    assert implementation(plan).half_operands(plan.problem, plan.tiles) == {"dy", "result"}
    plan = nc.plan("convolution_backprop_filters", x, case[2], dy, **attrs)
    assert implementation(plan).half_operands(plan.problem, plan.tiles) == {"x", "dy"}
    case = CASES["5x2_mixed"]
    x, w, dy, attrs = _operands(case, "float16")
    plan = nc.plan("convolution_backprop_data", dy, w, case[1], **attrs)
    assert implementation(plan).half_operands(plan.problem, plan.tiles) == frozenset()


def test_row_kernels_prefetch_only_operands_beyond_l3():
    """The prefetch tile: on where the operands the row kernels read (dY; X and dY) take
    at least a third of L3, off below, counted at 2 bytes an element for float16."""
    import dataclasses

    from numbaconv.machine import machine
    from numbaconv.strategies import depthwise

    case = (64, (40, 40), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), 1)
    for op, reads in (("convolution_backprop_data", 1), ("convolution_backprop_filters", 2)):
        for dtype, item in (("float32", 4), ("float16", 2)):
            x, w, dy, attrs = _operands(case, dtype)
            args = (dy, w, (40, 40)) if op == "convolution_backprop_data" else (x, (3, 3), dy)
            plan = nc.plan(op, *args, **attrs)
            assert _kernel(plan) == "rows_3x3" and "prefetch" in plan.tiles
            nbytes = reads * 2 * 40 * 40 * 64 * item
            for l3, want in ((3 * nbytes, True), (3 * nbytes + 3, False)):
                m = dataclasses.replace(machine(), l3_bytes=l3)
                assert depthwise._prefetch(plan.problem, m) == want, (op, dtype, l3)


def test_kernel_choice():
    """3x3 at column stride 1 or 2 with column dilation 1: the row kernels; 3x3 at stride 1
    with column dilation: the nine-term kernel for backward data from UNROLLED_MIN_BYTES
    of channels per pixel on, the span kernel below; every other multiplier-1 geometry:
    the span kernels."""
    from numbaconv.strategies.depthwise import UNROLLED_MIN_BYTES

    def kernels(c, dtype, stride, dilation=1, k=3):
        s = (stride, stride) if isinstance(stride, int) else stride
        pad = (k // 2, dilation * (k // 2))
        osz = out_shape((8, 8), (k, k), s, (1, dilation), pad, pad)
        dy = np.zeros((1, *osz, c), dtype)
        x = np.zeros((1, 8, 8, c), dtype)
        w = np.zeros((k, k, 1, c), dtype)
        kw = dict(strides=s, dilations=(1, dilation), groups=c, strategy="direct",
                  pads_begin=pad, pads_end=pad)
        return (_kernel(nc.plan("convolution_backprop_data", dy, w, (8, 8), **kw)),
                _kernel(nc.plan("convolution_backprop_filters", x, (k, k), dy, **kw)))

    wide = UNROLLED_MIN_BYTES // 4
    assert kernels(3, np.float32, 1) == ("rows_3x3", "rows_3x3")
    assert kernels(wide, np.float64, 1) == ("rows_3x3", "rows_3x3")
    assert kernels(wide, np.float32, (2, 2)) == ("rows_3x3", "rows_3x3")
    assert kernels(wide, np.float32, (3, 1)) == ("rows_3x3", "rows_3x3")
    assert kernels(wide, np.float32, (1, 3)) == ("spans", "spans")
    assert kernels(wide, np.float32, (1, 4)) == ("spans", "spans")
    assert kernels(wide - 1, np.float32, 1, dilation=2) == ("spans", "spans")
    assert kernels(wide, np.float32, 1, dilation=2) == ("unrolled_3x3", "spans")
    assert kernels(wide, np.float32, 1, k=5) == ("spans", "spans")
    # a filter as wide as the image: no span but border pixels, the general loop nests
    # (2 of 8 columns read no padding at 7x7 -> declined below SPANS_MIN_INTERIOR; 4 at
    # 5x5 -> the spans), except backward data over padded rows, which has no borders
    assert kernels(wide, np.float32, 1, k=7) == ("spans", "general")
    assert kernels(wide, np.float32, 1, k=5) == ("spans", "spans")


# (input spatial, dilation, pads_begin, pads_end): odd and even widths, widths of 1 and 2,
# no padding, wide and asymmetric padding, row dilation
SAME_SHAPE_3X3 = [((5, 9), (1, 1), (1, 1), (1, 1)), ((4, 8), (1, 1), (1, 1), (1, 1)),
                  ((3, 1), (1, 1), (1, 1), (1, 1)), ((3, 2), (1, 1), (1, 1), (1, 1)),
                  ((6, 7), (1, 1), (0, 0), (0, 0)), ((4, 6), (1, 1), (2, 3), (1, 0)),
                  ((7, 9), (2, 1), (2, 1), (2, 1)), ((5, 10), (1, 2), (1, 2), (1, 2))]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("geometry", SAME_SHAPE_3X3)
def test_3x3_stride1_backward_data_kernels(geometry, dtype):
    """The nine-term kernel and the row kernel (without column dilation), called directly
    on a NaN-filled dX with wide channels that are not a whole number of vectors, the row
    kernel also with several row chunks: every pixel written, and equal to the
    reference."""
    from numbaconv.strategies import canonical_shapes, geo

    isz, dl, pb, pe = geometry
    c = 67
    case = (c, isz, (3, 3), (1, 1), dl, pb, pe, 1)
    _, w, dy, attrs = _operands(case, dtype, seed=5)
    p = nc.plan("convolution_backprop_data", dy, w, isz, **attrs).problem
    xs, ys, ws = canonical_shapes(p)
    want = conv_bwd_data_ref(dy, w, isz, stride=(1, 1), dilation=dl, pads_begin=pb,
                             pads_end=pe, groups=c).reshape(xs)
    kernels = [("nine-term", lambda dx: k.bwd_d_depthwise_3x3(dy.reshape(ys), w.reshape(ws),
                                                                dx, geo(p)))]
    if dl[1] == 1:
        kernels += [(f"rows, {n} chunks, prefetch {pf}",
                     lambda dx, n=n, pf=pf: kr.bwd_d_depthwise_3x3_rows(
                         dy.reshape(ys), w.reshape(ws), dx, geo(p), n, pf))
                    for n, pf in ((1, False), (2, True), (7, False), (7, True))]
    for name, fn in kernels:
        dx = np.full(xs, np.nan, dtype)
        fn(dx)
        assert not np.isnan(dx).any(), name
        np.testing.assert_allclose(dx, want, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("name", ["3x3_s2_d2_empty_phases", "3x3_s3", "3x3_s2_tf_same_odd",
                                  "3x3_s1_p1_odd"])
def test_backward_data_writes_every_pixel(name):
    """dX comes from np.empty: the kernel must write every element once (phases and
    border pixels no tap reaches get zeros), also with one or several row chunks."""
    from numbaconv.strategies import canonical_shapes, geo

    case = CASES[name]
    _, w, dy, attrs = _operands(case, "float32", seed=3)
    plan = _check_plan("convolution_backprop_data", (dy, w, case[1]), attrs)
    p = plan.problem
    xs, ys, ws = canonical_shapes(p)
    want = nc.convolution_backprop_data(dy, w, case[1], **attrs).reshape(xs)
    for chunks in (1, 2, 5):
        dx = np.full(xs, np.nan, np.float32)
        ks.bwd_d_depthwise_m1(dy.reshape(ys), w.reshape(ws), dx, geo(p), chunks)
        assert not np.isnan(dx).any()
        # the planner's kernel may sum in another order (3x3 at stride 1: the row kernel)
        np.testing.assert_allclose(dx, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


# (channels, input spatial, kernel, stride, dilation, pads_begin, pads_end) for the padded
# backward-data driver: rows of whole blocks and with a short last block, a row of one
# block and rows shorter than the filter, channels with a masked rest, folded long rows,
# row strides and dilations, asymmetric and large pads, no pads, 3-D, 6 taps (chunks of 3
# that add to dX), column strides 2 to 4 (phases of 1 to 3 taps, and phases no tap
# reaches), a folded strided row, and column dilation (phases without sliding blocks)
PADDED = [(19, (9, 12), (5, 5), (1, 1), (1, 1), (2, 2), (2, 2)),
          (9, (6, 7), (3, 7), (1, 1), (1, 1), (1, 3), (1, 3)),
          (16, (3, 14), (5, 5), (1, 1), (1, 1), (2, 2), (2, 2)),
          (12, (70,), (39,), (1,), (1,), (19,), (19,)),
          (5, (7, 30), (3, 17), (2, 1), (2, 1), (1, 8), (0, 8)),
          (17, (60,), (24,), (1,), (1,), (20,), (15,)),
          (4, (4, 5, 6), (2, 3, 5), (2, 1, 1), (1, 2, 1), (1, 1, 0), (0, 1, 4)),
          (8, (5, 3), (3, 6), (1, 1), (1, 1), (1, 0), (1, 5)),
          (3, (2, 20), (1, 5), (1, 1), (1, 1), (0, 0), (0, 0)),
          (13, (9, 16), (5, 5), (2, 2), (1, 1), (1, 2), (2, 2)),
          (10, (5, 23), (3, 7), (1, 3), (1, 1), (1, 3), (1, 3)),
          (6, (3, 17), (1, 3), (1, 4), (1, 1), (0, 1), (0, 1)),
          (20, (90,), (33,), (2,), (1,), (16,), (16,)),
          (7, (6, 19), (3, 5), (1, 2), (1, 2), (1, 4), (1, 3))]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("geometry", PADDED)
def test_padded_backward_data_driver(geometry, dtype):
    """The padded driver called directly (one, two and more chunks than rows; dX from
    garbage, so that every element must be written) against the reference, and the
    span kernels' bordered driver on the same geometry agreeing with it."""
    from numbaconv.strategies import canonical_shapes, geo

    case = (*geometry, 1)
    _, w, dy, attrs = _operands(case, dtype, seed=8)
    p = nc.plan("convolution_backprop_data", dy, w, case[1], **attrs).problem
    xs, ys, ws = canonical_shapes(p)
    g = geo(p)
    want = conv_bwd_data_ref(dy, w, case[1], attrs["strides"], attrs["dilations"],
                             attrs["pads_begin"], attrs["pads_end"], case[0]).reshape(xs)
    tol = dict(rtol=tolerance(dtype), atol=tolerance(dtype) * np.abs(want).max())
    for chunks in (1, 2, 64):
        dx = np.full(xs, np.nan, dtype)
        ks.bwd_d_depthwise_m1(dy.reshape(ys), w.reshape(ws), dx, g, chunks, True)
        np.testing.assert_allclose(dx, want, err_msg=f"{chunks} chunks", **tol)
    dx = np.full(xs, np.nan, dtype)
    ks.bwd_d_depthwise_m1(dy.reshape(ys), w.reshape(ws), dx, g, 2, False)
    np.testing.assert_allclose(dx, want, **tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("geometry", [g for g in PADDED if g[3][-1] == 1])
def test_padded_forward_driver(geometry, dtype):
    """The padded forward driver (column stride 1) called directly on NaN-filled Y with 1,
    2 and 64 chunks, against the reference."""
    from numbaconv.strategies import canonical_shapes, geo

    case = (*geometry, 1)
    x, w, _, attrs = _operands(case, dtype, seed=9)
    p = nc.plan("convolution", x, w, **attrs).problem
    xs, ys, ws = canonical_shapes(p)
    want = conv_fwd_ref(x, w, attrs["strides"], attrs["dilations"], attrs["pads_begin"],
                        attrs["pads_end"], case[0]).reshape(ys)
    tol = dict(rtol=tolerance(dtype), atol=tolerance(dtype) * np.abs(want).max())
    for chunks in (1, 2, 64):
        y = np.full(ys, np.nan, dtype)
        ks.fwd_depthwise_m1(x.reshape(xs), w.reshape(ws), y, geo(p), chunks, True)
        np.testing.assert_allclose(y, want, err_msg=f"{chunks} chunks", **tol)


def test_padded_rows_rule():
    """The tile ``padded``: backward data from 5 column taps, strided or dilated or not."""
    from numbaconv.strategies.depthwise import PADDED_MIN_TAPS

    def plan(kw, sw=1, dw=1, c=16):
        dy_w = (80 + 2 * (kw // 2) * dw - dw * (kw - 1) - 1) // sw + 1
        dy = np.ones((1, 6, dy_w, c), np.float32)
        w = np.ones((3, kw, 1, c), np.float32)
        return nc.plan("convolution_backprop_data", dy, w, (6, 80), strides=(1, sw),
                       dilations=(1, dw), pads_begin=(1, kw // 2 * dw),
                       pads_end=(1, kw // 2 * dw), groups=c)

    assert PADDED_MIN_TAPS == 5
    for kw, sw, dw in ((5, 1, 1), (7, 1, 1), (33, 1, 1), (7, 1, 2), (5, 2, 1), (33, 2, 1)):
        p = plan(kw, sw, dw)
        assert p.variant == "depthwise-spans" and p.tiles["padded"] is True, str(p)
        # each thread's buffer rows (3 row taps of dY's columns and more, 16 channels) and
        # packed filter count as workspace
        ow = p.problem.osz[-1]
        assert p.workspace_bytes >= p.tiles["chunks"] * 4 * 16 * (3 * ow + 3 * kw), str(p)
    for kw, sw, dw in ((3, 1, 2), (3, 3, 1), (4, 1, 1)):
        p = plan(kw, sw, dw)
        assert p.tiles.get("padded", False) is False, str(p)
    # the forward pass: column stride 1 only (a strided output row reads its pixels apart)
    x = np.ones((1, 6, 80, 16), np.float32)
    for kw, sw, want in ((5, 1, True), (7, 1, True), (5, 2, None)):
        p = nc.plan("convolution", x, np.ones((3, kw, 1, 16), np.float32), strides=(1, sw),
                    pads_begin=(1, kw // 2), pads_end=(1, kw // 2), groups=16)
        if want is None:
            assert p.variant != "depthwise-spans", str(p)
        else:
            assert p.variant == "depthwise-spans" and p.tiles["padded"] is want, str(p)


def test_backward_weights_reduces_every_chunk():
    """Per-chunk partials are zeroed and reduced inside the kernel: any number of chunks
    (more than rows included) gives the same dW; scratch may hold garbage."""
    from numbaconv.strategies import canonical_shapes, geo

    case = CASES["3x3_s2_p1"]
    x, w, dy, attrs = _operands(case, "float64", seed=4)
    plan = _check_plan("convolution_backprop_filters", (x, case[2], dy), attrs)
    p = plan.problem
    xs, ys, ws = canonical_shapes(p)
    want = conv_bwd_filter_ref(x, dy, case[2], attrs["strides"], attrs["dilations"],
                               attrs["pads_begin"], attrs["pads_end"], attrs["groups"])
    for chunks in (1, 2, 3, 64):
        part = np.full((chunks, *ws), np.nan)
        dw = np.full(ws, np.nan)
        ks.bwd_w_depthwise_m1(x.reshape(xs), dy.reshape(ys), part, dw, geo(p))
        np.testing.assert_allclose(dw.reshape(want.shape), want, rtol=1e-12, atol=1e-12)


# (input spatial, stride, dilation, pads_begin, pads_end) for the row kernels' weight
# gradient: column stride 1 and 2, row strides 1 to 3, row dilation, widths of 1 and 2,
# pads wider than the filter, rows longer than a register block (8 pixels)
ROWS_BWD_W = [((5, 9), (1, 1), (1, 1), (1, 1), (1, 1)), ((3, 1), (1, 1), (1, 1), (1, 1), (1, 1)),
              ((4, 2), (1, 2), (1, 1), (1, 1), (1, 1)), ((6, 23), (2, 2), (1, 1), (1, 1), (1, 1)),
              ((7, 40), (3, 2), (2, 1), (2, 0), (0, 1)), ((4, 6), (1, 1), (1, 1), (3, 3), (2, 3)),
              ((5, 19), (2, 1), (1, 1), (0, 0), (0, 0))]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("geometry", ROWS_BWD_W)
def test_rows_backward_weights_kernel(geometry, dtype):
    """The row kernel's weight gradient called directly, with channels that are not a whole
    number of vectors: per-chunk partials are zeroed and reduced inside (any number of
    chunks, more than rows included; scratch and result may hold garbage)."""
    from numbaconv.strategies import canonical_shapes, geo

    isz, st, dl, pb, pe = geometry
    c = 37
    case = (c, isz, (3, 3), st, dl, pb, pe, 1)
    x, w, dy, attrs = _operands(case, dtype, seed=6)
    plan = _check_plan("convolution_backprop_filters", (x, (3, 3), dy), attrs)
    assert _kernel(plan) == "rows_3x3"
    p = plan.problem
    xs, ys, ws = canonical_shapes(p)
    want = conv_bwd_filter_ref(x, dy, (3, 3), st, dl, pb, pe, c)
    for chunks, pf in ((1, False), (2, True), (3, False), (3, True), (64, True)):
        part = np.full((chunks, *ws), np.nan, dtype)
        dw = np.full(ws, np.nan, dtype)
        kr.bwd_w_depthwise_3x3_rows(x.reshape(xs), dy.reshape(ys), part, dw, geo(p), pf)
        np.testing.assert_allclose(dw.reshape(want.shape), want, rtol=tolerance(dtype),
                                   atol=tolerance(dtype) * np.abs(want).max(),
                                   err_msg=f"{chunks} chunks, prefetch {pf}")


@pytest.mark.parametrize("name", ["3x3_s1_long_rows", "3x3_s2_long_rows", "3x3_s1_p1_odd"])
def test_span_kernels_where_the_row_kernels_run(name):
    """The span kernels still serve every geometry the row kernels do not; called directly
    on 3x3 cases that the planner now gives the row kernels, their sliding-window blocks
    stay checked against the reference."""
    from numbaconv.strategies import canonical_shapes, geo

    case = CASES[name]
    x, w, dy, attrs = _operands(case, "float64", seed=7)
    p = nc.plan("convolution_backprop_filters", x, case[2], dy, **attrs).problem
    xs, ys, ws = canonical_shapes(p)
    geom = dict(stride=attrs["strides"], dilation=attrs["dilations"],
                pads_begin=attrs["pads_begin"], pads_end=attrs["pads_end"], groups=case[0])
    dw = np.empty(ws)
    ks.bwd_w_depthwise_m1(x.reshape(xs), dy.reshape(ys), np.empty((2, *ws)), dw, geo(p))
    want = conv_bwd_filter_ref(x, dy, case[2], **geom)
    np.testing.assert_allclose(dw.reshape(want.shape), want, rtol=1e-12, atol=1e-12)
    dx = np.full(xs, np.nan)
    ks.bwd_d_depthwise_m1(dy.reshape(ys), w.reshape(ws), dx, geo(p), 2)
    want = conv_bwd_data_ref(dy, w, case[1], **geom)
    np.testing.assert_allclose(dx.reshape(want.shape), want, rtol=1e-12, atol=1e-12)


# (input spatial, stride, dilation, pads_begin, pads_end) for the row kernel's strided
# backward data: column stride 2 with odd and even widths, TF SAME (0 before, 1 after), pads
# wider than the filter, row strides 1 to 3, row dilation, widths of 1 and 2, and rows long
# enough for several 16-pixel register blocks
ROWS_BWD_D = [((7, 9), (2, 2), (1, 1), (1, 1), (1, 1)), ((6, 12), (2, 2), (1, 1), (0, 0), (1, 1)),
              ((5, 1), (1, 2), (1, 1), (1, 1), (1, 1)), ((4, 2), (2, 2), (1, 1), (1, 1), (1, 1)),
              ((7, 45), (3, 2), (2, 1), (2, 3), (0, 1)), ((6, 40), (2, 1), (1, 1), (1, 1), (1, 1)),
              ((4, 7), (1, 2), (1, 1), (3, 3), (2, 3)), ((3, 36), (1, 2), (1, 1), (0, 0), (0, 0))]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("geometry", ROWS_BWD_D)
def test_rows_backward_data_kernel(geometry, dtype):
    """The row kernel's backward data called directly on a NaN-filled dX with channels that
    are not a whole number of vectors, in one and several row chunks, channel vectors or
    blocks of pixels outermost: every pixel written (pixels and rows no tap reaches get
    zeros), and equal to the reference."""
    from numbaconv.strategies import canonical_shapes, geo

    isz, st, dl, pb, pe = geometry
    c = 37
    case = (c, isz, (3, 3), st, dl, pb, pe, 1)
    _, w, dy, attrs = _operands(case, dtype, seed=8)
    plan = _check_plan("convolution_backprop_data", (dy, w, isz), attrs)
    assert _kernel(plan) == "rows_3x3"
    p = plan.problem
    xs, ys, ws = canonical_shapes(p)
    want = conv_bwd_data_ref(dy, w, isz, st, dl, pb, pe, c).reshape(xs)
    for chunks, pf, blocks in ((1, False, False), (3, True, True), (3, False, False),
                               (1, False, True)):
        dx = np.full(xs, np.nan, dtype)
        kr.bwd_d_depthwise_3x3_rows(dy.reshape(ys), w.reshape(ws), dx, geo(p), chunks, pf,
                                    blocks=blocks)
        assert not np.isnan(dx).any(), f"{chunks} chunks, blocks outer {blocks}"
        np.testing.assert_allclose(dx, want, rtol=tolerance(dtype),
                                   atol=tolerance(dtype) * np.abs(want).max(),
                                   err_msg=f"{chunks} chunks, prefetch {pf}, blocks {blocks}")


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("pads", [((1, 1), (1, 1)), ((0, 0), (0, 1)), ((0, 2), (0, 0))])
def test_row_kernels_every_row_width(stride, pads):
    """Both row kernels over every row width from 1 to 27 (full 8-pixel blocks followed by
    every combination of the 4-, 2- and 1-pixel tail blocks, then the checked pixels), at
    column stride 1 and 2, with symmetric, TF-SAME-like and one-sided padding (backward
    data in both loop orders): dX written everywhere and both gradients equal to the
    float64 reference."""
    from numbaconv.strategies import canonical_shapes, geo

    pb, pe = pads
    c = 11  # one masked channel vector (float64: 8 lanes + 3)
    for width in range(1, 28):
        isz = (3, width)
        case = (c, isz, (3, 3), (1, stride), (1, 1), pb, pe, 1)
        if width + pb[1] + pe[1] < 3:  # no output column
            continue
        x, w, dy, attrs = _operands(case, "float64", seed=width)
        p = nc.plan("convolution_backprop_data", dy, w, isz, **attrs).problem
        assert _kernel(nc.plan("convolution_backprop_data", dy, w, isz,
                               **attrs)) == "rows_3x3"
        xs, ys, ws = canonical_shapes(p)
        want = conv_bwd_data_ref(dy, w, isz, (1, stride), (1, 1), pb, pe, c).reshape(xs)
        for blocks in (False, True):
            dx = np.full(xs, np.nan)
            kr.bwd_d_depthwise_3x3_rows(dy.reshape(ys), w.reshape(ws), dx, geo(p), 2, False,
                                        blocks=blocks)
            np.testing.assert_allclose(dx, want, rtol=1e-12, atol=1e-12,
                                       err_msg=f"backward data, width {width}, blocks {blocks}")
        part = np.full((2, *ws), np.nan)
        dw = np.full(ws, np.nan)
        kr.bwd_w_depthwise_3x3_rows(x.reshape(xs), dy.reshape(ys), part, dw, geo(p), False)
        want = conv_bwd_filter_ref(x, dy, (3, 3), (1, stride), (1, 1), pb, pe, c)
        np.testing.assert_allclose(dw.reshape(want.shape), want, rtol=1e-12, atol=1e-12,
                                   err_msg=f"backward weights, width {width}")


@pytest.mark.parametrize("vector_bytes", [32, 64])
def test_row_kernels_stream_dx_only_in_whole_lines(vector_bytes, monkeypatch):
    """A dX beyond the streaming threshold is streamed where one vector store fills a cache
    line (64-byte vectors), not with 32-byte vectors (half lines), nor in float16."""
    import dataclasses

    import numbaconv.machine
    from numbaconv.strategies.depthwise import STREAM_MIN_VECTOR_BYTES
    real = numbaconv.machine.machine()
    # an L3 of 64 KiB: the problem below is past the streaming threshold on any host
    monkeypatch.setattr(numbaconv.machine, "machine", lambda: dataclasses.replace(
        real, vector_bytes=vector_bytes, l3_bytes=64 * 1024))

    def stream(dtype):
        dy = np.zeros((2, 16, 16, 32), dtype)
        w = np.zeros((3, 3, 1, 32), dtype)
        plan = nc.plan("convolution_backprop_data", dy, w, (16, 16), strides=1, pads_begin=1,
                       pads_end=1, groups=32, strategy="direct[depthwise-rows]")
        return plan.tiles["stream"]

    assert stream(np.float32) == (vector_bytes >= STREAM_MIN_VECTOR_BYTES)
    assert stream(np.float64) == (vector_bytes >= STREAM_MIN_VECTOR_BYTES)
    assert not stream(np.float16)


def _aligned_nan(shape, dtype, offset=0):
    """A NaN-filled array on a 64-byte boundary (plus ``offset`` elements)."""
    n = int(np.prod(shape))
    raw = np.full(n + 64 + offset, np.nan, dtype)
    skip = (-raw.ctypes.data % 64) // raw.itemsize
    return raw[skip + offset: skip + offset + n].reshape(shape)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("stride", [1, 2])
def test_row_kernel_streams_dx(stride, dtype):
    """Backward data with dX streamed (non-temporal stores): bit for bit the plain stores'
    dX where every pixel's channels start on a vector boundary (32 or 48 channels, rows of
    1 to 20 pixels, every tail block), and the same dX where they do not (dX one element
    off the boundary; 40 channels, whose pixels are 160 or 320 bytes apart), with the
    stores then plain."""
    from numbaconv.strategies import canonical_shapes, geo

    for c in (32, 48, 40):
        for width in range(1, 21):
            isz = (4, width)
            case = (c, isz, (3, 3), (stride, stride), (1, 1), (1, 1), (1, 1), 1)
            _, w, dy, attrs = _operands(case, dtype, seed=width + c)
            p = nc.plan("convolution_backprop_data", dy, w, isz, **attrs).problem
            xs, ys, ws = canonical_shapes(p)
            plain = np.full(xs, np.nan, dtype)
            kr.bwd_d_depthwise_3x3_rows(dy.reshape(ys), w.reshape(ws), plain, geo(p), 2,
                                        False, False)
            want = conv_bwd_data_ref(dy, w, isz, (stride, stride), (1, 1), (1, 1), (1, 1),
                                     c).reshape(xs)
            np.testing.assert_allclose(plain, want, rtol=tolerance(dtype),
                                       atol=tolerance(dtype) * np.abs(want).max())
            for offset in (0, 1):
                dx = _aligned_nan(xs, dtype, offset)
                kr.bwd_d_depthwise_3x3_rows(dy.reshape(ys), w.reshape(ws), dx, geo(p), 2,
                                            False, True)
                np.testing.assert_array_equal(dx, plain, err_msg=f"{c} channels, width "
                                              f"{width}, offset {offset}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("stride", [1, 2])
def test_row_kernels_any_head(stride, dtype):
    """Both row kernels with every ``head`` (channels before the first whole vector) from 0
    to past C: the same gradients, equal to the reference (37 channels: a masked head, whole
    vectors and a masked rest; 11 rows of widths that take full and tail blocks)."""
    from numbaconv.strategies import canonical_shapes, geo

    c = 37
    case = (c, (5, 11), (3, 3), (stride, stride), (1, 1), (1, 1), (1, 1), 1)
    x, w, dy, attrs = _operands(case, dtype, seed=9)
    p = nc.plan("convolution_backprop_data", dy, w, (5, 11), **attrs).problem
    xs, ys, ws = canonical_shapes(p)
    want_d = conv_bwd_data_ref(dy, w, (5, 11), (stride, stride), (1, 1), (1, 1), (1, 1),
                               c).reshape(xs)
    want_w = conv_bwd_filter_ref(x, dy, (3, 3), (stride, stride), (1, 1), (1, 1), (1, 1), c)
    for head in (0, 1, 4, 8, 15, 16, 36, 37, 40):
        dx = np.full(xs, np.nan, dtype)
        kr.bwd_d_depthwise_3x3_rows(dy.reshape(ys), w.reshape(ws), dx, geo(p), 2, False,
                                    False, head)
        tol = tolerance(dtype)
        np.testing.assert_allclose(dx, want_d, rtol=tol, atol=tol * np.abs(want_d).max(),
                                   err_msg=f"head {head}")
        # the filter read from the kernel's placed copy (filters on and off a boundary):
        # the same sums in the same order
        for off in (0, 1, 3):
            wo = _aligned_nan(ws, dtype, off)
            wo[...] = w.reshape(ws)
            placed = np.full(xs, np.nan, dtype)
            kr.bwd_d_depthwise_3x3_rows(dy.reshape(ys), wo, placed, geo(p), 2, False,
                                        False, head, True)
            np.testing.assert_array_equal(placed, dx, err_msg=f"head {head}, filter {off}")
        # blocks of pixels outermost (stride 1; stride 2's only order): the same sums
        blocks = np.full(xs, np.nan, dtype)
        kr.bwd_d_depthwise_3x3_rows(dy.reshape(ys), w.reshape(ws), blocks, geo(p), 2, False,
                                    False, head, False, True)
        np.testing.assert_array_equal(blocks, dx, err_msg=f"head {head}, blocks outer")
        dw = np.full(ws, np.nan, dtype)
        kr.bwd_w_depthwise_3x3_rows(x.reshape(xs), dy.reshape(ys), np.empty((2, *ws), dtype),
                                    dw, geo(p), False, head)
        np.testing.assert_allclose(dw.reshape(want_w.shape), want_w, rtol=tol,
                                   atol=tol * np.abs(want_w).max(), err_msg=f"head {head}")


def test_row_head():
    """The head puts the rest of a pixel's channels on a vector boundary where a pixel
    spans whole vectors' worth of bytes, and is 0 where it cannot."""
    vb = kr.VECTOR_BYTES
    assert kr.row_head(4096, 64, 4, 4) == 0
    assert kr.row_head(4096 + 16, 64, 4, 4) == (vb - 16) // 4
    assert kr.row_head(4096 + 16, 64, 8, 8) == (vb - 16) // 8
    assert kr.row_head(4096 + 16, 2, 4, 4) == 0  # 8-byte pixels: no boundary to keep
    assert kr.row_head(4096 + 2, 64, 4, 4) == 0  # not on an element boundary
    # float16 data in float32 lanes: half as many bytes per vector
    assert kr.row_head(4096 + 16, 64, 2, 4) == (vb // 2 - 16) // 2


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_misaligned_operands_give_the_same_gradients(dtype):
    """Operands 16 or 32 bytes past a 64-byte boundary (NumPy's large arrays are 16 past
    one) take a head of channels so that the rest is aligned: both depthwise gradients bit
    for bit those of aligned operands, and the inputs left alone."""
    c, isz = 128, (6, 20)  # 8 whole vectors of float32 per pixel: the plans align
    for stride in (1, 2):
        case = (c, isz, (3, 3), (stride, stride), (1, 1), (1, 1), (1, 1), 1)
        x, w, dy, attrs = _operands(case, dtype, seed=stride)
        assert nc.plan("convolution_backprop_data", dy, w, isz, **attrs).tiles["align"]
        assert nc.plan("convolution_backprop_filters", x, (3, 3), dy, **attrs).tiles["align"]
        got = {}
        for mis in (0, 16, 32):
            xm, dym, wm = (_at_offset(a, mis) for a in (x, dy, w))
            saved = [a.copy() for a in (xm, dym, wm)]
            dx = nc.convolution_backprop_data(dym, wm, isz, **attrs)
            dw = nc.convolution_backprop_filters(xm, (3, 3), dym, **attrs)
            for a, b in zip((xm, dym, wm), saved):
                np.testing.assert_array_equal(a, b)
            got[mis] = (dx, dw)
        for mis in (16, 32):
            np.testing.assert_array_equal(got[mis][0], got[0][0], err_msg=f"dx, {mis} B")
            np.testing.assert_array_equal(got[mis][1], got[0][1], err_msg=f"dw, {mis} B")
        err = normalized_error(got[0][0], conv_bwd_data_ref, dy, w, isz, (stride, stride),
                               (1, 1), (1, 1), (1, 1), c)
        assert err <= tolerance(dtype)


def _at_offset(a, mis):
    """A copy of ``a`` starting ``mis`` bytes past a 64-byte boundary."""
    raw = np.empty(a.nbytes + 64, np.uint8)
    start = (mis - raw.ctypes.data) % 64
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out
