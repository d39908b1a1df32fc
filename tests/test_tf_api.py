"""The TensorFlow-style names of docs/contract.md section 2 against the NumPy reference.

Each curated case fixes a geometry (layout, padding mode, strides, dilations, groups or the
depthwise multiplier, dtype, how strides/dilations are spelt); every case is run through the
forward op and both gradients (and the *_v2 spellings)."""
from typing import NamedTuple

import numpy as np
import pytest

import numbaconv as nc
from reference import (assert_matches, conv_bwd_data_ref, conv_bwd_filter_ref, conv_fwd_ref,
                       depthwise_to_xio, out_shape, tf_pads, to_channels_first,
                       to_channels_last, xio_to_depthwise)

F16, F32, F64 = np.float16, np.float32, np.float64


class Case(NamedTuple):
    id: str
    n: int
    x: tuple            # spatial input size
    c: int
    f: tuple            # spatial filter size
    k: int              # output channels (depthwise: the multiplier)
    strides: tuple
    dilations: tuple
    padding: object     # "SAME", "VALID", ("EXPLICIT", pairs) or ("PAIRS", pairs)
    fmt: str
    groups: int = 1
    dtype: type = F32
    form: str = "spatial"  # how strides / dilations are spelt: int, spatial, full


# --------------------------------------------------------------------------- helpers
def channels_first(fmt):
    return fmt in ("NCHW", "NCDHW", "NCW")


def tf_geometry(case):
    """The TF spelling of the case's strides, dilations, padding and explicit_paddings."""
    nd = len(case.x)
    cf = channels_first(case.fmt)

    def full(v, fill):
        return [fill, fill, *v] if cf else [fill, *v, fill]

    if case.form == "int":
        assert len(set(case.strides)) == 1 and len(set(case.dilations)) == 1
        s, d = case.strides[0], case.dilations[0]
        d = None if d == 1 else d            # None means the default
    elif case.form == "spatial":
        s, d = list(case.strides), list(case.dilations)
    else:
        s, d = full(case.strides, 1), full(case.dilations, 1)
    explicit = None
    if isinstance(case.padding, str):
        padding, pairs = case.padding, None
    else:
        mode, pairs = case.padding
        if mode == "EXPLICIT":
            padding = "EXPLICIT"
            explicit = [v for p in full(pairs, (0, 0)) for v in p]
        else:
            padding = [list(p) for p in full(pairs, (0, 0))]
    assert pairs is None or len(pairs) == nd
    return s, d, padding, explicit


def canonical_pads(case):
    mode = case.padding if isinstance(case.padding, str) else "EXPLICIT"
    pairs = None if isinstance(case.padding, str) else case.padding[1]
    return tf_pads(mode, case.x, case.f, case.strides, case.dilations, pairs)


def to_lib(a, fmt):
    return np.ascontiguousarray(to_channels_first(a)) if channels_first(fmt) else a


def from_lib(a, fmt):
    return to_channels_last(a) if channels_first(fmt) else a


def make_problem(case, rng, depthwise=False):
    """Canonical (channels-last, XIO) operands already rounded to the case's dtype, and the
    library's operands in the case's layout. For depthwise, ``w`` is [fh, fw, C, m]."""
    pb, pe = canonical_pads(case)
    o = out_shape(case.x, case.f, case.strides, case.dilations, pb, pe)
    if depthwise:
        w = rng.standard_normal(case.f + (case.c, case.k)).astype(case.dtype)
        kout = case.c * case.k
    else:
        w = rng.standard_normal(case.f + (case.c // case.groups, case.k)).astype(case.dtype)
        kout = case.k
    x = rng.standard_normal((case.n,) + case.x + (case.c,)).astype(case.dtype)
    dy = rng.standard_normal((case.n,) + o + (kout,)).astype(case.dtype)
    geo = dict(s=case.strides, d=case.dilations, pb=pb, pe=pe,
               g=case.c if depthwise else case.groups)
    return x, w, dy, geo


def fwd_ref(geo, depthwise=False):
    def f(x, w):
        w = depthwise_to_xio(w) if depthwise else w
        return conv_fwd_ref(x, w, geo["s"], geo["d"], geo["pb"], geo["pe"], geo["g"])
    return f


def bwd_data_ref(geo, x_spatial, depthwise=False):
    def f(dy, w):
        w = depthwise_to_xio(w) if depthwise else w
        return conv_bwd_data_ref(dy, w, x_spatial, geo["s"], geo["d"], geo["pb"], geo["pe"],
                                 geo["g"])
    return f


def bwd_filter_ref(geo, f_spatial, depthwise=False, c=None):
    def f(x, dy):
        dw = conv_bwd_filter_ref(x, dy, f_spatial, geo["s"], geo["d"], geo["pb"], geo["pe"],
                                 geo["g"])
        return xio_to_depthwise(dw, c) if depthwise else dw
    return f


def tf_kwargs(case, with_explicit=True):
    s, d, padding, explicit = tf_geometry(case)
    kw = dict(strides=s, padding=padding, data_format=case.fmt, dilations=d)
    if with_explicit:
        kw["explicit_paddings"] = explicit
    else:
        assert explicit is None
    return kw


# --------------------------------------------------------------------------- 2-D cases
EXP = "EXPLICIT"
CASES_2D = [
    Case("nhwc-same-s1-int", 2, (5, 5), 3, (3, 3), 4, (1, 1), (1, 1), "SAME", "NHWC", form="int"),
    Case("nchw-same-s1", 2, (5, 5), 3, (3, 3), 4, (1, 1), (1, 1), "SAME", "NCHW"),
    Case("nhwc-same-odd-s2", 1, (6, 6), 2, (3, 3), 3, (2, 2), (1, 1), "SAME", "NHWC"),
    Case("nchw-same-odd-s2-full", 2, (6, 6), 2, (3, 3), 3, (2, 2), (1, 1), "SAME", "NCHW",
         form="full"),
    Case("nhwc-same-s3-rect-full", 1, (7, 5), 2, (2, 3), 3, (3, 2), (1, 1), "SAME", "NHWC",
         form="full"),
    Case("nhwc-same-even-k", 2, (4, 5), 3, (2, 2), 2, (1, 1), (1, 1), "SAME", "NHWC"),
    Case("nhwc-same-clipped-total-s3", 1, (6, 7), 2, (1, 2), 3, (3, 3), (1, 1), "SAME", "NHWC"),
    Case("nhwc-valid-s1", 2, (5, 6), 3, (3, 2), 4, (1, 1), (1, 1), "VALID", "NHWC"),
    Case("nchw-valid-s2-int", 1, (7, 7), 2, (3, 3), 3, (2, 2), (1, 1), "VALID", "NCHW",
         form="int"),
    Case("nhwc-valid-s3-rem", 2, (7, 7), 2, (2, 2), 2, (3, 3), (1, 1), "VALID", "NHWC"),
    Case("nhwc-explicit", 2, (5, 4), 3, (3, 3), 2, (1, 1), (1, 1), (EXP, ((1, 2), (0, 1))),
         "NHWC"),
    Case("nchw-explicit-s2-full", 1, (6, 5), 2, (3, 2), 3, (2, 2), (1, 1),
         (EXP, ((2, 0), (1, 1))), "NCHW", form="full"),
    Case("nhwc-pairs-s21", 2, (5, 5), 2, (3, 3), 2, (2, 1), (1, 1), ("PAIRS", ((1, 0), (2, 1))),
         "NHWC"),
    Case("nchw-pairs", 1, (4, 6), 3, (2, 3), 2, (1, 2), (1, 1), ("PAIRS", ((0, 1), (1, 1))),
         "NCHW"),
    Case("nhwc-dil2-same-int", 1, (6, 6), 2, (3, 3), 3, (1, 1), (2, 2), "SAME", "NHWC",
         form="int"),
    Case("nhwc-dil2-s2-same", 2, (7, 7), 2, (3, 3), 2, (2, 2), (2, 2), "SAME", "NHWC"),
    Case("nchw-dil12-s21-valid-full", 1, (7, 6), 3, (2, 3), 2, (2, 1), (1, 2), "VALID", "NCHW",
         form="full"),
    Case("nhwc-dil21-s2-explicit", 1, (6, 6), 2, (3, 2), 2, (2, 2), (2, 1),
         (EXP, ((1, 1), (0, 2))), "NHWC"),
    Case("nhwc-groups2-same", 2, (5, 5), 4, (3, 3), 6, (1, 1), (1, 1), "SAME", "NHWC", groups=2),
    Case("nchw-groups3-valid-s2", 1, (6, 6), 6, (2, 2), 3, (2, 2), (1, 1), "VALID", "NCHW",
         groups=3),
    Case("nhwc-groups2-dil2-s2", 1, (7, 6), 4, (3, 2), 4, (2, 2), (2, 2), "SAME", "NHWC",
         groups=2),
    Case("f64-nhwc-same-s2", 2, (5, 6), 3, (3, 3), 2, (2, 2), (1, 1), "SAME", "NHWC", dtype=F64),
    Case("f64-nchw-explicit-dil", 1, (6, 5), 2, (2, 3), 3, (1, 2), (2, 1),
         (EXP, ((1, 0), (2, 2))), "NCHW", dtype=F64),
    Case("f16-nhwc-same", 2, (5, 5), 3, (3, 3), 4, (1, 1), (1, 1), "SAME", "NHWC", dtype=F16),
    Case("f16-nchw-valid-s2", 1, (6, 7), 2, (3, 2), 3, (2, 2), (1, 1), "VALID", "NCHW",
         dtype=F16),
    Case("k1x1-s2-valid", 2, (5, 5), 3, (1, 1), 4, (2, 2), (1, 1), "VALID", "NHWC"),
    Case("filter-eq-input", 2, (4, 4), 2, (4, 4), 3, (1, 1), (1, 1), "VALID", "NHWC"),
]
IDS_2D = [c.id for c in CASES_2D]


@pytest.mark.parametrize("case", CASES_2D, ids=IDS_2D)
def test_conv2d(case, rng):
    x, w, dy, geo = make_problem(case, rng)
    xl, wl = to_lib(x, case.fmt), w
    xc, wc = xl.copy(), wl.copy()
    got = nc.conv2d(xl, wl, **tf_kwargs(case))
    assert_matches(from_lib(got, case.fmt), case.dtype, fwd_ref(geo), x, w)
    assert np.array_equal(xl, xc) and np.array_equal(wl, wc)


@pytest.mark.parametrize("case", CASES_2D, ids=IDS_2D)
def test_conv2d_backprop_input(case, rng):
    x, w, dy, geo = make_problem(case, rng)
    xl, dyl = to_lib(x, case.fmt), to_lib(dy, case.fmt)
    wc, dyc = w.copy(), dyl.copy()
    kw = tf_kwargs(case)
    ref = bwd_data_ref(geo, case.x)
    got = nc.conv2d_backprop_input(list(xl.shape), w, dyl, **kw)
    assert got.shape == xl.shape
    assert_matches(from_lib(got, case.fmt), case.dtype, ref, dy, w)
    # the v2 spelling takes an array and uses only its shape
    got2 = nc.conv2d_backprop_input_v2(np.full(xl.shape, np.nan, case.dtype), w, dyl, **kw)
    assert got2.shape == xl.shape
    assert_matches(from_lib(got2, case.fmt), case.dtype, ref, dy, w)
    assert np.array_equal(w, wc) and np.array_equal(dyl, dyc)


@pytest.mark.parametrize("case", CASES_2D, ids=IDS_2D)
def test_conv2d_backprop_filter(case, rng):
    x, w, dy, geo = make_problem(case, rng)
    xl, dyl = to_lib(x, case.fmt), to_lib(dy, case.fmt)
    xc, dyc = xl.copy(), dyl.copy()
    kw = tf_kwargs(case)
    ref = bwd_filter_ref(geo, case.f)
    got = nc.conv2d_backprop_filter(xl, list(w.shape), dyl, **kw)
    assert got.shape == w.shape
    assert_matches(got, case.dtype, ref, x, dy)
    got2 = nc.conv2d_backprop_filter_v2(xl, np.full(w.shape, np.nan, case.dtype), dyl, **kw)
    assert got2.shape == w.shape
    assert_matches(got2, case.dtype, ref, x, dy)
    assert np.array_equal(xl, xc) and np.array_equal(dyl, dyc)


# --------------------------------------------------------------------------- depthwise
# Case.k is the channel multiplier here; TF requires equal strides along H and W.
CASES_DW = [
    Case("nhwc-same-s1-m1", 2, (5, 5), 3, (3, 3), 1, (1, 1), (1, 1), "SAME", "NHWC", form="int"),
    Case("nchw-same-odd-s2-m2", 1, (6, 6), 2, (3, 3), 2, (2, 2), (1, 1), "SAME", "NCHW"),
    Case("nhwc-valid-s2-m2-full", 2, (7, 7), 3, (3, 3), 2, (2, 2), (1, 1), "VALID", "NHWC",
         form="full"),
    Case("nhwc-explicit-m1", 1, (5, 6), 4, (3, 2), 1, (1, 1), (1, 1), (EXP, ((1, 0), (0, 2))),
         "NHWC"),
    Case("nchw-dil2-same-m2", 1, (6, 6), 2, (3, 3), 2, (1, 1), (2, 2), "SAME", "NCHW"),
    Case("nhwc-dil2-s2-valid-m1", 2, (7, 7), 3, (2, 2), 1, (2, 2), (2, 2), "VALID", "NHWC"),
    Case("nhwc-pairs-s2-m2", 1, (5, 5), 2, (3, 3), 2, (2, 2), (1, 1), ("PAIRS", ((1, 1), (0, 1))),
         "NHWC"),
    Case("f64-nhwc-same-m2", 2, (5, 5), 3, (3, 3), 2, (1, 1), (1, 1), "SAME", "NHWC", dtype=F64),
    Case("f16-nhwc-valid-m1", 1, (6, 6), 4, (3, 3), 1, (1, 1), (1, 1), "VALID", "NHWC",
         dtype=F16),
]
IDS_DW = [c.id for c in CASES_DW]


@pytest.mark.parametrize("case", CASES_DW, ids=IDS_DW)
def test_depthwise_conv2d_native(case, rng):
    x, w, dy, geo = make_problem(case, rng, depthwise=True)
    xl = to_lib(x, case.fmt)
    got = nc.depthwise_conv2d_native(xl, w, **tf_kwargs(case))
    assert_matches(from_lib(got, case.fmt), case.dtype, fwd_ref(geo, True), x, w)


@pytest.mark.parametrize("case", CASES_DW, ids=IDS_DW)
def test_depthwise_conv2d_native_backprop_input(case, rng):
    x, w, dy, geo = make_problem(case, rng, depthwise=True)
    xl, dyl = to_lib(x, case.fmt), to_lib(dy, case.fmt)
    got = nc.depthwise_conv2d_native_backprop_input(list(xl.shape), w, dyl, **tf_kwargs(case))
    assert got.shape == xl.shape
    assert_matches(from_lib(got, case.fmt), case.dtype, bwd_data_ref(geo, case.x, True), dy, w)


@pytest.mark.parametrize("case", CASES_DW, ids=IDS_DW)
def test_depthwise_conv2d_native_backprop_filter(case, rng):
    x, w, dy, geo = make_problem(case, rng, depthwise=True)
    xl, dyl = to_lib(x, case.fmt), to_lib(dy, case.fmt)
    got = nc.depthwise_conv2d_native_backprop_filter(xl, list(w.shape), dyl, **tf_kwargs(case))
    assert got.shape == w.shape
    assert_matches(got, case.dtype, bwd_filter_ref(geo, case.f, True, case.c), x, dy)


# --------------------------------------------------------------------------- 3-D
CASES_3D = [
    Case("ndhwc-same-s1-int", 2, (4, 5, 4), 2, (2, 3, 2), 3, (1, 1, 1), (1, 1, 1), "SAME",
         "NDHWC", form="int"),
    Case("ncdhw-same-odd-s2", 1, (5, 4, 6), 2, (3, 3, 3), 2, (2, 2, 2), (1, 1, 1), "SAME",
         "NCDHW"),
    Case("ndhwc-valid-s123-full", 1, (5, 5, 7), 2, (2, 2, 3), 2, (1, 2, 3), (1, 1, 1), "VALID",
         "NDHWC", form="full"),
    Case("ncdhw-valid-dil211-full", 2, (5, 4, 4), 2, (2, 2, 2), 3, (1, 1, 1), (2, 1, 1), "VALID",
         "NCDHW", form="full"),
    Case("ndhwc-same-dil2-s2", 1, (5, 5, 5), 2, (2, 3, 2), 2, (2, 2, 2), (2, 2, 2), "SAME",
         "NDHWC"),
    Case("f64-ndhwc-same", 1, (4, 4, 5), 3, (3, 2, 2), 2, (1, 2, 1), (1, 1, 1), "SAME", "NDHWC",
         dtype=F64),
    Case("f16-ncdhw-valid", 1, (4, 5, 4), 2, (2, 2, 2), 2, (1, 1, 1), (1, 1, 1), "VALID",
         "NCDHW", dtype=F16),
]
IDS_3D = [c.id for c in CASES_3D]


@pytest.mark.parametrize("case", CASES_3D, ids=IDS_3D)
def test_conv3d(case, rng):
    x, w, dy, geo = make_problem(case, rng)
    got = nc.conv3d(to_lib(x, case.fmt), w, **tf_kwargs(case, with_explicit=False))
    assert_matches(from_lib(got, case.fmt), case.dtype, fwd_ref(geo), x, w)


@pytest.mark.parametrize("case", CASES_3D, ids=IDS_3D)
def test_conv3d_backprop_input_v2(case, rng):
    x, w, dy, geo = make_problem(case, rng)
    xl, dyl = to_lib(x, case.fmt), to_lib(dy, case.fmt)
    got = nc.conv3d_backprop_input_v2(list(xl.shape), w, dyl,
                                      **tf_kwargs(case, with_explicit=False))
    assert got.shape == xl.shape
    assert_matches(from_lib(got, case.fmt), case.dtype, bwd_data_ref(geo, case.x), dy, w)


@pytest.mark.parametrize("case", CASES_3D, ids=IDS_3D)
def test_conv3d_backprop_filter_v2(case, rng):
    x, w, dy, geo = make_problem(case, rng)
    xl, dyl = to_lib(x, case.fmt), to_lib(dy, case.fmt)
    got = nc.conv3d_backprop_filter_v2(xl, list(w.shape), dyl,
                                       **tf_kwargs(case, with_explicit=False))
    assert got.shape == w.shape
    assert_matches(got, case.dtype, bwd_filter_ref(geo, case.f), x, dy)


# --------------------------------------------------------------------------- sizes arguments
SIZES_CASE = Case("sizes", 2, (6, 5), 3, (3, 2), 4, (2, 1), (1, 1), "SAME", "NHWC")


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("form", ["list", "tuple", "int32-array", "int64-array", "spatial-list",
                                  "spatial-int32-array"])
def test_conv2d_backprop_input_sizes_forms(form, fmt, rng):
    case = SIZES_CASE._replace(fmt=fmt)
    x, w, dy, geo = make_problem(case, rng)
    xl, dyl = to_lib(x, fmt), to_lib(dy, fmt)
    full = xl.shape
    sizes = {"list": list(full), "tuple": tuple(full), "int32-array": np.array(full, np.int32),
             "int64-array": np.array(full, np.int64), "spatial-list": list(case.x),
             "spatial-int32-array": np.array(case.x, np.int32)}[form]
    got = nc.conv2d_backprop_input(sizes, w, dyl, **tf_kwargs(case))
    assert got.shape == full
    assert_matches(from_lib(got, fmt), F32, bwd_data_ref(geo, case.x), dy, w)


@pytest.mark.parametrize("form", ["full", "int32-array", "spatial"])
def test_depthwise_backprop_input_sizes_forms(form, rng):
    case = CASES_DW[1]   # NCHW, multiplier 2
    x, w, dy, geo = make_problem(case, rng, depthwise=True)
    xl, dyl = to_lib(x, case.fmt), to_lib(dy, case.fmt)
    sizes = {"full": list(xl.shape), "int32-array": np.array(xl.shape, np.int32),
             "spatial": list(case.x)}[form]
    got = nc.depthwise_conv2d_native_backprop_input(sizes, w, dyl, **tf_kwargs(case))
    assert got.shape == xl.shape
    assert_matches(from_lib(got, case.fmt), case.dtype, bwd_data_ref(geo, case.x, True), dy, w)


@pytest.mark.parametrize("op", ["conv2d", "depthwise", "conv3d"])
def test_filter_sizes_as_int32_array(op, rng):
    if op == "conv2d":
        case, fn, dw = SIZES_CASE, nc.conv2d_backprop_filter, False
    elif op == "depthwise":
        case, fn, dw = CASES_DW[2], nc.depthwise_conv2d_native_backprop_filter, True
    else:
        case, fn, dw = CASES_3D[0], nc.conv3d_backprop_filter_v2, False
    x, w, dy, geo = make_problem(case, rng, depthwise=dw)
    kw = tf_kwargs(case, with_explicit=op != "conv3d")
    got = fn(to_lib(x, case.fmt), np.array(w.shape, np.int32), to_lib(dy, case.fmt), **kw)
    assert got.shape == w.shape
    assert_matches(got, case.dtype, bwd_filter_ref(geo, case.f, dw, case.c), x, dy)


def test_conv3d_input_sizes_int32_array(rng):
    case = CASES_3D[1]
    x, w, dy, geo = make_problem(case, rng)
    xl = to_lib(x, case.fmt)
    got = nc.conv3d_backprop_input_v2(np.array(xl.shape, np.int32), w, to_lib(dy, case.fmt),
                                      **tf_kwargs(case, with_explicit=False))
    assert got.shape == xl.shape
    assert_matches(from_lib(got, case.fmt), case.dtype, bwd_data_ref(geo, case.x), dy, w)


# --------------------------------------------------------------------------- calling order
POS_CASE = Case("pos", 1, (5, 5), 2, (3, 3), 3, (2, 2), (1, 1), (EXP, ((1, 0), (1, 1))), "NCHW")


def test_positional_calling_order_2d(rng):
    """TF's documented positional order, every argument positional, `name` included."""
    case = POS_CASE
    x, w, dy, geo = make_problem(case, rng)
    xl, dyl = to_lib(x, case.fmt), to_lib(dy, case.fmt)
    s, d, padding, explicit = tf_geometry(case._replace(form="full"))
    y = nc.conv2d(xl, w, s, padding, None, "NCHW", d, explicit, "fwd")
    assert_matches(from_lib(y, "NCHW"), F32, fwd_ref(geo), x, w)
    dx = nc.conv2d_backprop_input(list(xl.shape), w, dyl, s, padding, True, "NCHW", d, explicit,
                                  "bwd_in")
    assert_matches(from_lib(dx, "NCHW"), F32, bwd_data_ref(geo, case.x), dy, w)
    dx2 = nc.conv2d_backprop_input_v2(xl, w, dyl, s, padding, False, "NCHW", d, explicit, "v2")
    assert_matches(from_lib(dx2, "NCHW"), F32, bwd_data_ref(geo, case.x), dy, w)
    dw = nc.conv2d_backprop_filter(xl, list(w.shape), dyl, s, padding, None, "NCHW", d, explicit,
                                   "bwd_f")
    assert_matches(dw, F32, bwd_filter_ref(geo, case.f), x, dy)
    dw2 = nc.conv2d_backprop_filter_v2(xl, w, dyl, s, padding, None, "NCHW", d, explicit, "v2")
    assert_matches(dw2, F32, bwd_filter_ref(geo, case.f), x, dy)


def test_positional_calling_order_depthwise(rng):
    case = POS_CASE._replace(k=2)
    x, w, dy, geo = make_problem(case, rng, depthwise=True)
    xl, dyl = to_lib(x, case.fmt), to_lib(dy, case.fmt)
    s, d, padding, explicit = tf_geometry(case._replace(form="full"))
    y = nc.depthwise_conv2d_native(xl, w, s, padding, "NCHW", d, explicit, "fwd")
    assert_matches(from_lib(y, "NCHW"), F32, fwd_ref(geo, True), x, w)
    dx = nc.depthwise_conv2d_native_backprop_input(list(xl.shape), w, dyl, s, padding, "NCHW", d,
                                                   explicit, "bwd_in")
    assert_matches(from_lib(dx, "NCHW"), F32, bwd_data_ref(geo, case.x, True), dy, w)
    dw = nc.depthwise_conv2d_native_backprop_filter(xl, list(w.shape), dyl, s, padding, "NCHW", d,
                                                    explicit, "bwd_f")
    assert_matches(dw, F32, bwd_filter_ref(geo, case.f, True, case.c), x, dy)


def test_positional_calling_order_3d(rng):
    case = CASES_3D[3]  # NCDHW, dilated, full-rank lists
    x, w, dy, geo = make_problem(case, rng)
    xl, dyl = to_lib(x, case.fmt), to_lib(dy, case.fmt)
    s, d, padding, _ = tf_geometry(case)
    y = nc.conv3d(xl, w, s, padding, "NCDHW", d, "fwd")
    assert_matches(from_lib(y, "NCDHW"), F32, fwd_ref(geo), x, w)
    dx = nc.conv3d_backprop_input_v2(list(xl.shape), w, dyl, s, padding, "NCDHW", d, "bwd_in")
    assert_matches(from_lib(dx, "NCDHW"), F32, bwd_data_ref(geo, case.x), dy, w)
    dw = nc.conv3d_backprop_filter_v2(xl, list(w.shape), dyl, s, padding, "NCDHW", d, "bwd_f")
    assert_matches(dw, F32, bwd_filter_ref(geo, case.f), x, dy)


def test_defaults_match_tf(rng):
    """data_format defaults to NHWC and dilations to 1; None means the default."""
    case = Case("d", 1, (5, 5), 2, (3, 3), 2, (1, 1), (1, 1), "SAME", "NHWC")
    x, w, dy, geo = make_problem(case, rng)
    a = nc.conv2d(x, w, [1, 1, 1, 1], "SAME")
    b = nc.conv2d(x, w, [1, 1, 1, 1], "SAME", data_format=None, dilations=None)
    assert_matches(a, F32, fwd_ref(geo), x, w)
    assert_matches(b, F32, fwd_ref(geo), x, w)


@pytest.mark.parametrize("op", ["conv2d", "conv2d_backprop_input", "conv2d_backprop_input_v2",
                                "conv2d_backprop_filter", "conv2d_backprop_filter_v2"])
def test_use_cudnn_on_gpu_string_is_type_error(op):
    """A TF2-style positional call puts data_format where use_cudnn_on_gpu is."""
    x = np.ones((1, 4, 4, 2), F32)
    w = np.ones((3, 3, 2, 2), F32)
    dy = np.ones((1, 4, 4, 2), F32)
    first = {"conv2d": (x, w), "conv2d_backprop_input": (list(x.shape), w, dy),
             "conv2d_backprop_input_v2": (x, w, dy),
             "conv2d_backprop_filter": (x, list(w.shape), dy),
             "conv2d_backprop_filter_v2": (x, w, dy)}[op]
    with pytest.raises(TypeError, match="use_cudnn_on_gpu"):
        getattr(nc, op)(*first, [1, 1, 1, 1], "SAME", "NHWC")


# --------------------------------------------------------------------------- out=
OUT_CASE = Case("out", 2, (5, 6), 2, (3, 2), 3, (2, 1), (1, 1), "SAME", "NCHW")


@pytest.mark.parametrize("direction", ["fwd", "bwd_input", "bwd_filter"])
def test_out_is_written_and_returned(direction, rng):
    case = OUT_CASE
    x, w, dy, geo = make_problem(case, rng)
    xl, dyl = to_lib(x, case.fmt), to_lib(dy, case.fmt)
    kw = tf_kwargs(case)
    if direction == "fwd":
        out = np.full(dyl.shape, 7.0, F32)
        got = nc.conv2d(xl, w, out=out, **kw)
        assert_matches(from_lib(out, case.fmt), F32, fwd_ref(geo), x, w)
    elif direction == "bwd_input":
        out = np.full(xl.shape, 7.0, F32)
        got = nc.conv2d_backprop_input(list(xl.shape), w, dyl, out=out, **kw)
        assert_matches(from_lib(out, case.fmt), F32, bwd_data_ref(geo, case.x), dy, w)
    else:
        out = np.full(w.shape, 7.0, F32)
        got = nc.conv2d_backprop_filter(xl, list(w.shape), dyl, out=out, **kw)
        assert_matches(out, F32, bwd_filter_ref(geo, case.f), x, dy)
    assert got is out


def test_out_depthwise_and_3d(rng):
    case = CASES_DW[2]
    x, w, dy, geo = make_problem(case, rng, depthwise=True)
    out = np.zeros(w.shape, F32)
    got = nc.depthwise_conv2d_native_backprop_filter(x, list(w.shape), dy, out=out,
                                                     **tf_kwargs(case))
    assert got is out
    assert_matches(out, F32, bwd_filter_ref(geo, case.f, True, case.c), x, dy)
    case = CASES_3D[0]
    x, w, dy, geo = make_problem(case, rng)
    out = np.zeros(x.shape, F32)
    got = nc.conv3d_backprop_input_v2(list(x.shape), w, dy, out=out,
                                      **tf_kwargs(case, with_explicit=False))
    assert got is out
    assert_matches(out, F32, bwd_data_ref(geo, case.x), dy, w)


# --------------------------------------------------------------------------- array-likes
LAYOUT_CASE = Case("lay", 2, (5, 5), 3, (3, 2), 2, (2, 1), (1, 2), (EXP, ((1, 1), (2, 0))),
                   "NHWC")


def _odd_layout(a, kind):
    """The same values as ``a`` in an unusual memory layout."""
    if kind == "strided":
        big = np.zeros(tuple(2 * s for s in a.shape), a.dtype)
        view = big[tuple(slice(None, None, 2) for _ in a.shape)]
        view[...] = a
        assert not view.flags.c_contiguous
        return view
    if kind == "fortran":
        f = np.asfortranarray(a)
        assert not f.flags.c_contiguous or a.ndim <= 1
        return f
    if kind == "negative":
        rev = np.ascontiguousarray(a[::-1, ..., ::-1])
        view = rev[::-1, ..., ::-1]
        assert any(st < 0 for st in view.strides)
        return view
    if kind == "list":
        return a.tolist()
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["strided", "fortran", "negative", "list"])
@pytest.mark.parametrize("direction", ["fwd", "bwd_input", "bwd_filter"])
def test_array_likes_and_inputs_unmodified(direction, kind, rng):
    dtype = F64 if kind == "list" else F32   # Python floats become float64
    case = LAYOUT_CASE._replace(dtype=dtype)
    x, w, dy, geo = make_problem(case, rng)
    kw = tf_kwargs(case)
    xs, ws, dys = _odd_layout(x, kind), _odd_layout(w, kind), _odd_layout(dy, kind)
    if direction == "fwd":
        got = nc.conv2d(xs, ws, **kw)
        assert_matches(got, dtype, fwd_ref(geo), x, w)
    elif direction == "bwd_input":
        got = nc.conv2d_backprop_input(list(x.shape), ws, dys, **kw)
        assert_matches(got, dtype, bwd_data_ref(geo, case.x), dy, w)
    else:
        got = nc.conv2d_backprop_filter(xs, list(w.shape), dys, **kw)
        assert_matches(got, dtype, bwd_filter_ref(geo, case.f), x, dy)
    for orig, passed in ((x, xs), (w, ws), (dy, dys)):
        assert np.array_equal(np.asarray(passed), orig), "an input was modified"


# --------------------------------------------------------------------------- edge values
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_empty_batch_gives_zeros(fmt):
    case = Case("e", 0, (5, 5), 2, (3, 3), 3, (2, 2), (1, 1), "SAME", fmt)
    x, w, dy, geo = make_problem(case, np.random.default_rng(0))
    xl, dyl = to_lib(x, fmt), to_lib(dy, fmt)
    assert xl.shape[0] == 0 and dyl.shape[0] == 0
    kw = tf_kwargs(case)
    y = nc.conv2d(xl, w, **kw)
    assert y.shape == dyl.shape and y.dtype == F32
    dx = nc.conv2d_backprop_input(list(xl.shape), w, dyl, **kw)
    assert dx.shape == xl.shape and dx.dtype == F32
    dw = nc.conv2d_backprop_filter(xl, list(w.shape), dyl, **kw)
    assert dw.shape == w.shape and dw.dtype == F32
    assert np.array_equal(dw, np.zeros(w.shape, F32))


def test_empty_batch_depthwise_and_3d():
    x = np.zeros((0, 4, 4, 2), F32)
    dy = np.zeros((0, 2, 2, 4), F32)
    dw = nc.depthwise_conv2d_native_backprop_filter(x, [3, 3, 2, 2], dy, [1, 2, 2, 1], "SAME")
    assert dw.shape == (3, 3, 2, 2) and not dw.any()
    x = np.zeros((0, 3, 4, 4, 2), F32)
    w = np.ones((2, 2, 2, 2, 3), F32)
    y = nc.conv3d(x, w, [1, 1, 1, 1, 1], "VALID")
    assert y.shape == (0, 2, 3, 3, 3)
    dy = np.zeros((0, 2, 3, 3, 3), F32)
    dw = nc.conv3d_backprop_filter_v2(x, [2, 2, 2, 2, 3], dy, [1, 1, 1, 1, 1], "VALID")
    assert dw.shape == (2, 2, 2, 2, 3) and not dw.any()


@pytest.mark.parametrize("dtype", [F32, F64])
def test_nan_propagates(dtype, rng):
    x = rng.uniform(0.5, 1.0, (2, 5, 5, 2)).astype(dtype)
    w = rng.uniform(0.5, 1.0, (3, 3, 2, 2)).astype(dtype)
    x[0, 2, 2, 1] = np.nan          # every VALID output of batch 0 reads this pixel
    y = nc.conv2d(x, w, 1, "VALID")
    assert np.isnan(y[0]).all() and np.isfinite(y[1]).all()
    dy = rng.uniform(0.5, 1.0, (2, 3, 3, 2)).astype(dtype)
    dw = nc.conv2d_backprop_filter(x, [3, 3, 2, 2], dy, 1, "VALID")
    # taps touching channel 1 read the NaN pixel at some output position
    assert np.isnan(dw[:, :, 1, :]).all() and np.isfinite(dw[:, :, 0, :]).all()
    dy2 = dy.copy()
    dy2[1, 0, 0, 0] = np.nan
    dx = nc.conv2d_backprop_input(x.shape, w, dy2, 1, "VALID")
    assert np.isnan(dx[1, :3, :3, :]).all() and np.isfinite(dx[0]).all()


def test_inf_propagates(rng):
    # the direct strategy computes exactly the sums of the definition, so only the outputs
    # that read the Inf pixel (with positive weights) are +Inf
    x = np.ones((1, 4, 4, 1), F32)
    x[0, 1, 1, 0] = np.inf
    w = rng.uniform(0.5, 1.0, (2, 2, 1, 1)).astype(F32)
    y = nc.conv2d(x, w, 1, "VALID", strategy="direct")
    expect_inf = np.zeros((3, 3), bool)
    expect_inf[:2, :2] = True
    assert np.array_equal(np.isposinf(y[0, :, :, 0]), expect_inf)
    assert np.isfinite(y[0, :, :, 0][~expect_inf]).all()


def test_read_only_inputs(rng):
    """Inputs are never modified, so read-only arrays must work."""
    case = LAYOUT_CASE
    x, w, dy, geo = make_problem(case, rng)
    for a in (x, w, dy):
        a.flags.writeable = False
    kw = tf_kwargs(case)
    assert_matches(nc.conv2d(x, w, **kw), F32, fwd_ref(geo), x, w)
    assert_matches(nc.conv2d_backprop_input(x.shape, w, dy, **kw), F32,
                   bwd_data_ref(geo, case.x), dy, w)
    assert_matches(nc.conv2d_backprop_filter(x, w.shape, dy, **kw), F32,
                   bwd_filter_ref(geo, case.f), x, dy)


@pytest.mark.parametrize("kind", ["strided-view", "fortran"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_out_with_unusual_memory_layout(fmt, kind, rng):
    """out= of the exact shape and dtype but not C-contiguous is still written in place."""
    case = OUT_CASE._replace(fmt=fmt)
    x, w, dy, geo = make_problem(case, rng)
    xl, dyl = to_lib(x, fmt), to_lib(dy, fmt)
    kw = tf_kwargs(case)

    def make_out(shape):
        if kind == "fortran":
            return np.full(shape, 3.0, F32, order="F")
        big = np.full(shape[:-1] + (2 * shape[-1],), 3.0, F32)
        return big[..., ::2]

    out = make_out(dyl.shape)
    assert nc.conv2d(xl, w, out=out, **kw) is out
    assert_matches(from_lib(out, fmt), F32, fwd_ref(geo), x, w)
    out = make_out(xl.shape)
    assert nc.conv2d_backprop_input(xl.shape, w, dyl, out=out, **kw) is out
    assert_matches(from_lib(out, fmt), F32, bwd_data_ref(geo, case.x), dy, w)
    out = make_out(w.shape)
    assert nc.conv2d_backprop_filter(xl, w.shape, dyl, out=out, **kw) is out
    assert_matches(out, F32, bwd_filter_ref(geo, case.f), x, dy)
