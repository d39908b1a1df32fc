"""The oneDNN-Graph-style names of docs/contract.md section 3 (1-D, 2-D, 3-D; groups; asymmetric pads; auto_pad;
output_padding; NXC/NCX; XIO/OIX) against the NumPy reference."""
from typing import NamedTuple

import numpy as np
import pytest

import numbaconv as nc
from reference import (assert_matches, conv_bwd_data_ref, conv_bwd_filter_ref, conv_fwd_ref,
                       oix_to_xio, onednn_pads, out_shape, same_pads_nd, to_channels_first,
                       to_channels_last, xio_to_oix)

F16, F32, F64 = np.float16, np.float32, np.float64


class Case(NamedTuple):
    id: str
    n: int
    x: tuple
    c: int
    f: tuple
    k: int
    strides: tuple
    dilations: tuple
    pads_begin: tuple
    pads_end: tuple
    auto_pad: object = None
    groups: int = 1
    dfmt: str = "NXC"
    ffmt: str = "XIO"
    dtype: type = F32


def data_to_lib(a, dfmt):
    return np.ascontiguousarray(to_channels_first(a)) if dfmt == "NCX" else a


def data_from_lib(a, dfmt):
    return to_channels_last(a) if dfmt == "NCX" else a


def filt_to_lib(w, ffmt):
    return np.ascontiguousarray(xio_to_oix(w)) if ffmt == "OIX" else w


def filt_from_lib(w, ffmt):
    return oix_to_xio(w) if ffmt == "OIX" else w


def attrs(case):
    kw = dict(strides=list(case.strides), dilations=list(case.dilations), groups=case.groups,
              data_format=case.dfmt, filter_format=case.ffmt)
    if case.pads_begin is not None:
        kw["pads_begin"] = list(case.pads_begin)
        kw["pads_end"] = list(case.pads_end)
    if case.auto_pad is not None:
        kw["auto_pad"] = case.auto_pad
    return kw


def geometry(case, x_spatial=None):
    x_spatial = case.x if x_spatial is None else x_spatial
    nd = len(x_spatial)
    pb0 = case.pads_begin if case.pads_begin is not None else (0,) * nd
    pe0 = case.pads_end if case.pads_end is not None else (0,) * nd
    pb, pe = onednn_pads(case.auto_pad, x_spatial, case.f, case.strides, case.dilations, pb0, pe0)
    return dict(s=case.strides, d=case.dilations, pb=pb, pe=pe, g=case.groups)


def make(case, rng):
    geo = geometry(case)
    o = out_shape(case.x, case.f, case.strides, case.dilations, geo["pb"], geo["pe"])
    x = rng.standard_normal((case.n,) + case.x + (case.c,)).astype(case.dtype)
    w = rng.standard_normal(case.f + (case.c // case.groups, case.k)).astype(case.dtype)
    dy = rng.standard_normal((case.n,) + o + (case.k,)).astype(case.dtype)
    return x, w, dy, geo


def fwd_ref(geo):
    return lambda x, w: conv_fwd_ref(x, w, geo["s"], geo["d"], geo["pb"], geo["pe"], geo["g"])


def bwd_data_ref(geo, x_spatial):
    return lambda dy, w: conv_bwd_data_ref(dy, w, x_spatial, geo["s"], geo["d"], geo["pb"],
                                           geo["pe"], geo["g"])


def bwd_filter_ref(geo, f_spatial):
    return lambda x, dy: conv_bwd_filter_ref(x, dy, f_spatial, geo["s"], geo["d"], geo["pb"],
                                             geo["pe"], geo["g"])


CASES = [
    # 1-D
    Case("1d-nxc-xio-asym", 2, (7,), 3, (3,), 4, (1,), (1,), (1,), (2,)),
    Case("1d-ncx-oix-s2-d2", 1, (7,), 2, (2,), 3, (2,), (2,), (0,), (1,), dfmt="NCX", ffmt="OIX"),
    Case("1d-groups2-same_upper-s2", 2, (6,), 4, (3,), 6, (2,), (1,), None, None, "same_upper",
         groups=2),
    Case("1d-same_lower-s2-ncx", 1, (6,), 2, (3,), 2, (2,), (1,), None, None, "same_lower",
         dfmt="NCX"),
    Case("1d-depthwise-valid-oix", 2, (7,), 3, (3,), 3, (1,), (1,), None, None, "valid", groups=3,
         ffmt="OIX"),
    # 2-D
    Case("2d-nxc-xio-asym-s12", 2, (5, 6), 3, (3, 2), 2, (1, 2), (1, 1), (2, 0), (0, 1)),
    Case("2d-ncx-oix-s2-d12", 1, (6, 5), 2, (3, 3), 3, (2, 2), (1, 2), (1, 0), (1, 2), dfmt="NCX",
         ffmt="OIX"),
    Case("2d-depthwise-g=C-same_upper", 2, (5, 5), 4, (3, 3), 4, (1, 1), (1, 1), None, None,
         "same_upper", groups=4),
    Case("2d-depthwise-mult2-same_lower-s2", 1, (6, 7), 3, (3, 3), 6, (2, 2), (1, 1), None, None,
         "same_lower", groups=3),
    Case("2d-groups3-valid-s21-ncx-oix", 1, (6, 6), 6, (2, 2), 3, (2, 1), (1, 1), None, None,
         "valid", groups=3, dfmt="NCX", ffmt="OIX"),
    Case("2d-same_upper-d2-s2", 2, (7, 7), 2, (3, 3), 2, (2, 2), (2, 2), None, None,
         "same_upper"),
    Case("2d-same_lower-odd", 1, (6, 6), 2, (2, 2), 3, (1, 1), (1, 1), None, None, "same_lower"),
    Case("2d-auto_pad-none-string", 1, (5, 5), 2, (3, 3), 2, (1, 1), (1, 1), (0, 2), (1, 0),
         "none"),
    Case("2d-valid-overrides-pads", 1, (6, 5), 2, (3, 2), 2, (1, 1), (1, 1), (2, 2), (1, 1),
         "valid"),
    Case("2d-same_upper-overrides-pads", 1, (5, 6), 2, (2, 3), 2, (2, 2), (1, 1), (3, 0), (0, 3),
         "same_upper"),
    Case("2d-f64-ncx-xio", 2, (5, 6), 3, (2, 3), 2, (2, 1), (1, 2), (1, 1), (0, 2), dfmt="NCX",
         dtype=F64),
    Case("2d-f16-nxc-oix-same_upper", 1, (6, 6), 2, (3, 3), 3, (2, 2), (1, 1), None, None,
         "same_upper", ffmt="OIX", dtype=F16),
    # 3-D
    Case("3d-nxc-xio-asym", 1, (4, 5, 3), 2, (2, 3, 2), 2, (1, 1, 1), (1, 1, 1), (1, 0, 1),
         (0, 2, 0)),
    Case("3d-ncx-oix-s2-same_upper", 1, (5, 4, 5), 2, (3, 3, 3), 3, (2, 2, 2), (1, 1, 1), None,
         None, "same_upper", dfmt="NCX", ffmt="OIX"),
    Case("3d-groups2-dil-valid", 2, (4, 6, 4), 4, (2, 2, 2), 4, (1, 1, 2), (1, 2, 1), None, None,
         "valid", groups=2),
    Case("3d-depthwise-mult2-same_lower", 1, (4, 4, 5), 2, (3, 2, 3), 4, (1, 2, 1), (1, 1, 1),
         None, None, "same_lower", groups=2),
    Case("3d-f64-ncx", 1, (4, 4, 4), 2, (2, 2, 2), 3, (2, 1, 1), (1, 1, 2), (0, 1, 1), (1, 0, 1),
         dfmt="NCX", dtype=F64),
]
IDS = [c.id for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_convolution(case, rng):
    x, w, dy, geo = make(case, rng)
    xl, wl = data_to_lib(x, case.dfmt), filt_to_lib(w, case.ffmt)
    xc, wc = xl.copy(), wl.copy()
    got = nc.convolution(xl, wl, **attrs(case))
    assert got.shape == data_to_lib(dy, case.dfmt).shape
    assert_matches(data_from_lib(got, case.dfmt), case.dtype, fwd_ref(geo), x, w)
    assert np.array_equal(xl, xc) and np.array_equal(wl, wc)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_convolution_backprop_data(case, rng):
    x, w, dy, geo = make(case, rng)
    xl, wl, dyl = (data_to_lib(x, case.dfmt), filt_to_lib(w, case.ffmt),
                   data_to_lib(dy, case.dfmt))
    wc, dyc = wl.copy(), dyl.copy()
    got = nc.convolution_backprop_data(dyl, wl, list(xl.shape), **attrs(case))
    assert got.shape == xl.shape
    assert_matches(data_from_lib(got, case.dfmt), case.dtype, bwd_data_ref(geo, case.x), dy, w)
    assert np.array_equal(wl, wc) and np.array_equal(dyl, dyc)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_convolution_backprop_filters(case, rng):
    x, w, dy, geo = make(case, rng)
    xl, wl, dyl = (data_to_lib(x, case.dfmt), filt_to_lib(w, case.ffmt),
                   data_to_lib(dy, case.dfmt))
    xc, dyc = xl.copy(), dyl.copy()
    got = nc.convolution_backprop_filters(xl, list(wl.shape), dyl, **attrs(case))
    assert got.shape == wl.shape
    assert_matches(filt_from_lib(got, case.ffmt), case.dtype, bwd_filter_ref(geo, case.f), x, dy)
    assert np.array_equal(xl, xc) and np.array_equal(dyl, dyc)


# --------------------------------------------------------------------------- output_shape
SHAPE_CASES = [c for c in CASES if c.id in (
    "1d-nxc-xio-asym", "1d-ncx-oix-s2-d2", "2d-ncx-oix-s2-d12", "2d-groups3-valid-s21-ncx-oix",
    "3d-nxc-xio-asym", "3d-ncx-oix-s2-same_upper")]


@pytest.mark.parametrize("form", ["full", "spatial", "tuple", "int32-array"])
@pytest.mark.parametrize("case", SHAPE_CASES, ids=[c.id for c in SHAPE_CASES])
def test_backprop_data_output_shape_forms(case, form, rng):
    x, w, dy, geo = make(case, rng)
    xl, wl, dyl = (data_to_lib(x, case.dfmt), filt_to_lib(w, case.ffmt),
                   data_to_lib(dy, case.dfmt))
    shape = {"full": list(xl.shape), "spatial": list(case.x), "tuple": tuple(xl.shape),
             "int32-array": np.array(xl.shape, np.int32)}[form]
    got = nc.convolution_backprop_data(dyl, wl, shape, **attrs(case))
    assert got.shape == xl.shape
    assert_matches(data_from_lib(got, case.dfmt), case.dtype, bwd_data_ref(geo, case.x), dy, w)


def omitted_spatial(case, o, output_padding=None):
    """docs/contract.md section 3: (o-1)*s + (k-1)*d + 1 - pb - pe + output_padding, or o*s under same_*."""
    nd = len(o)
    op = output_padding or (0,) * nd
    if case.auto_pad in ("same_upper", "same_lower"):
        return tuple(o[a] * case.strides[a] for a in range(nd))
    if case.auto_pad == "valid":
        pb = pe = (0,) * nd
    else:
        pb, pe = case.pads_begin, case.pads_end
    return tuple((o[a] - 1) * case.strides[a] + (case.f[a] - 1) * case.dilations[a] + 1 - pb[a]
                 - pe[a] + op[a] for a in range(nd))


OMIT_CASES = [c for c in CASES if c.dtype != F16]


@pytest.mark.parametrize("case", OMIT_CASES, ids=[c.id for c in OMIT_CASES])
def test_backprop_data_output_shape_omitted(case, rng):
    x, w, dy, geo = make(case, rng)
    o = dy.shape[1:-1]
    xs = omitted_spatial(case, o)
    geo2 = geometry(case, xs)
    # the inferred input size gives back the same forward output size
    assert out_shape(xs, case.f, case.strides, case.dilations, geo2["pb"], geo2["pe"]) == o
    wl, dyl = filt_to_lib(w, case.ffmt), data_to_lib(dy, case.dfmt)
    got = nc.convolution_backprop_data(dyl, wl, **attrs(case))
    expect = data_to_lib(np.zeros((case.n,) + xs + (case.c,)), case.dfmt).shape
    assert got.shape == expect
    assert_matches(data_from_lib(got, case.dfmt), case.dtype, bwd_data_ref(geo2, xs), dy, w)


OUTPUT_PADDING_CASES = [
    # (case, output_padding): every output_padding entry < the stride of its axis
    (Case("1d-s3-op2", 2, (7,), 2, (3,), 3, (3,), (1,), (1,), (0,)), (2,)),
    (Case("2d-s2-op10-ncx-oix", 1, (6, 5), 2, (3, 2), 2, (2, 2), (1, 1), (1, 0), (0, 1),
          dfmt="NCX", ffmt="OIX"), (1, 0)),
    (Case("2d-groups2-s2-d2-op11", 1, (7, 7), 4, (2, 3), 2, (2, 2), (2, 1), (0, 1), (1, 1),
          groups=2), (1, 1)),
    (Case("3d-s212-op101", 1, (5, 3, 5), 2, (2, 2, 3), 2, (2, 1, 2), (1, 1, 1), (1, 0, 0),
          (0, 0, 1)), (1, 0, 1)),
]


@pytest.mark.parametrize("case,output_padding", OUTPUT_PADDING_CASES,
                         ids=[c.id for c, _ in OUTPUT_PADDING_CASES])
def test_backprop_data_output_padding(case, output_padding, rng):
    x, w, dy, geo = make(case, rng)
    o = dy.shape[1:-1]
    xs = omitted_spatial(case, o, output_padding)
    # the extra pixels still map to the same forward output size (output_padding < stride)
    assert out_shape(xs, case.f, case.strides, case.dilations, geo["pb"], geo["pe"]) == o
    wl, dyl = filt_to_lib(w, case.ffmt), data_to_lib(dy, case.dfmt)
    got = nc.convolution_backprop_data(dyl, wl, output_padding=list(output_padding),
                                       **attrs(case))
    expect = data_to_lib(np.zeros((case.n,) + xs + (case.c,)), case.dfmt).shape
    assert got.shape == expect
    assert_matches(data_from_lib(got, case.dfmt), case.dtype, bwd_data_ref(geo, xs), dy, w)


def test_output_padding_below_dilation_with_stride_one(rng):
    """output_padding only has to be smaller than the stride *or* the dilation; the extra
    pixels receive no gradient beyond what the scatter of dy gives."""
    dy = rng.standard_normal((1, 4, 2))
    w = rng.standard_normal((3, 2, 2))
    got = nc.convolution_backprop_data(dy, w, strides=[1], dilations=[2], output_padding=[1])
    xs = (4 - 1) * 1 + (3 - 1) * 2 + 1 + 1
    assert got.shape == (1, xs, 2)
    assert_matches(got, F64, lambda a, b: conv_bwd_data_ref(a, b, (xs,), 1, 2, 0, 0), dy, w)


def test_output_padding_zero_is_default(rng):
    case = OUTPUT_PADDING_CASES[1][0]
    x, w, dy, geo = make(case, rng)
    wl, dyl = filt_to_lib(w, case.ffmt), data_to_lib(dy, case.dfmt)
    a = nc.convolution_backprop_data(dyl, wl, **attrs(case))
    b = nc.convolution_backprop_data(dyl, wl, output_padding=[0, 0], **attrs(case))
    xs = omitted_spatial(case, dy.shape[1:-1])
    assert_matches(data_from_lib(a, case.dfmt), F32, bwd_data_ref(geo, xs), dy, w)
    assert_matches(data_from_lib(b, case.dfmt), F32, bwd_data_ref(geo, xs), dy, w)


# --------------------------------------------------------------------------- filters_shape
FSHAPE_CASES = [c for c in CASES if c.id in (
    "1d-ncx-oix-s2-d2", "2d-nxc-xio-asym-s12", "2d-depthwise-mult2-same_lower-s2",
    "2d-groups3-valid-s21-ncx-oix", "3d-groups2-dil-valid")]


@pytest.mark.parametrize("ffmt", ["XIO", "OIX"])
@pytest.mark.parametrize("form", ["full", "spatial", "int32-array"])
@pytest.mark.parametrize("case", FSHAPE_CASES, ids=[c.id for c in FSHAPE_CASES])
def test_backprop_filters_shape_forms(case, form, ffmt, rng):
    case = case._replace(ffmt=ffmt)
    x, w, dy, geo = make(case, rng)
    xl, dyl, wl = data_to_lib(x, case.dfmt), data_to_lib(dy, case.dfmt), filt_to_lib(w, ffmt)
    fs = {"full": list(wl.shape), "spatial": list(case.f),
          "int32-array": np.array(wl.shape, np.int32)}[form]
    got = nc.convolution_backprop_filters(xl, fs, dyl, **attrs(case))
    assert got.shape == wl.shape
    assert_matches(filt_from_lib(got, ffmt), case.dtype, bwd_filter_ref(geo, case.f), x, dy)


# --------------------------------------------------------------------------- defaults, misc
def test_pads_default_to_zero_and_formats_default_to_nxc_xio(rng):
    x = rng.standard_normal((2, 5, 6, 3)).astype(F32)
    w = rng.standard_normal((2, 3, 3, 4)).astype(F32)
    got = nc.convolution(x, w, strides=[1, 2])
    assert_matches(got, F32, lambda a, b: conv_fwd_ref(a, b, (1, 2), 1, 0, 0, 1), x, w)
    dy = rng.standard_normal(got.shape).astype(F32)
    dx = nc.convolution_backprop_data(dy, w, [5, 6], strides=[1, 2])
    assert_matches(dx, F32, lambda a, b: conv_bwd_data_ref(a, b, (5, 6), (1, 2)), dy, w)
    dw = nc.convolution_backprop_filters(x, [2, 3], dy, strides=[1, 2])
    assert_matches(dw, F32, lambda a, b: conv_bwd_filter_ref(a, b, (2, 3), (1, 2)), x, dy)


def test_same_upper_and_same_lower_differ_only_by_the_odd_pixel(rng):
    """Odd total padding: upper puts the extra zero at the end, lower at the beginning."""
    x = rng.standard_normal((1, 6, 3)).astype(F64)
    w = rng.standard_normal((2, 3, 2)).astype(F64)
    assert same_pads_nd((6,), (2,), (1,), (1,)) == ((0,), (1,))
    up = nc.convolution(x, w, strides=[1], auto_pad="same_upper")
    lo = nc.convolution(x, w, strides=[1], auto_pad="same_lower")
    assert_matches(up, F64, lambda a, b: conv_fwd_ref(a, b, 1, 1, 0, 1), x, w)
    assert_matches(lo, F64, lambda a, b: conv_fwd_ref(a, b, 1, 1, 1, 0), x, w)


@pytest.mark.parametrize("direction", ["fwd", "bwd_data", "bwd_filters"])
def test_out_and_array_likes(direction, rng):
    case = CASES[6]  # 2-D NCX/OIX, strided, dilated, asymmetric pads
    x, w, dy, geo = make(case, rng)
    xl, wl, dyl = (data_to_lib(x, case.dfmt), filt_to_lib(w, case.ffmt),
                   data_to_lib(dy, case.dfmt))
    xf, wf, dyf = np.asfortranarray(xl), wl[::-1][::-1], np.asfortranarray(dyl)
    if direction == "fwd":
        out = np.full(dyl.shape, -1.0, F32)
        got = nc.convolution(xf, wf, out=out, **attrs(case))
        assert_matches(data_from_lib(out, case.dfmt), F32, fwd_ref(geo), x, w)
    elif direction == "bwd_data":
        out = np.full(xl.shape, -1.0, F32)
        got = nc.convolution_backprop_data(dyf, wf, xl.shape, out=out, **attrs(case))
        assert_matches(data_from_lib(out, case.dfmt), F32, bwd_data_ref(geo, case.x), dy, w)
    else:
        out = np.full(wl.shape, -1.0, F32)
        got = nc.convolution_backprop_filters(xf, wl.shape, dyf, out=out, **attrs(case))
        assert_matches(filt_from_lib(out, case.ffmt), F32, bwd_filter_ref(geo, case.f), x, dy)
    assert got is out


def test_empty_batch_and_empty_channels():
    x = np.zeros((0, 5, 3), F32)
    w = np.ones((2, 3, 4), F32)
    y = nc.convolution(x, w, strides=[2])
    assert y.shape == (0, 2, 4) and y.dtype == F32
    dw = nc.convolution_backprop_filters(x, [2], np.zeros((0, 2, 4), F32), strides=[2])
    assert dw.shape == (2, 3, 4) and not dw.any()
    dx = nc.convolution_backprop_data(np.zeros((0, 2, 4), F32), w, [0, 5, 3], strides=[2])
    assert dx.shape == (0, 5, 3)
    # no input channels: every output is an empty sum
    x = np.ones((2, 4, 4, 0), F64)
    w = np.ones((3, 3, 0, 2), F64)
    y = nc.convolution(x, w, strides=[1, 1])
    assert y.shape == (2, 2, 2, 2) and y.dtype == F64
    assert np.array_equal(y, np.zeros((2, 2, 2, 2)))
    dw = nc.convolution_backprop_filters(x, [3, 3], np.ones((2, 2, 2, 2), F64), strides=[1, 1])
    assert dw.shape == (3, 3, 0, 2)
    # no output channels
    dx = nc.convolution_backprop_data(np.ones((1, 2, 2, 0), F64), np.ones((3, 3, 2, 0), F64),
                                      [1, 4, 4, 2], strides=[1, 1])
    assert dx.shape == (1, 4, 4, 2) and np.array_equal(dx, np.zeros((1, 4, 4, 2)))


PAD_ONLY_CASES = [
    # 1x1 filters with padding at the end only: the last output rows read nothing but padding.
    # 8 channels make the problem GEMM-sized, so the default plan need not be the direct one.
    Case("1d-k1-pad-end", 1, (3,), 8, (1,), 8, (1,), (1,), (0,), (1,)),
    Case("2d-k1-pad-end-h", 2, (3, 3), 8, (1, 1), 8, (1, 1), (1, 1), (0, 0), (1, 0)),
    Case("2d-k1-pad-end-s2-ncx", 1, (4, 3), 8, (1, 1), 8, (2, 1), (1, 1), (0, 0), (2, 1),
         dfmt="NCX"),
]


@pytest.mark.parametrize("direction", ["fwd", "bwd_data", "bwd_filters"])
@pytest.mark.parametrize("case", PAD_ONLY_CASES, ids=[c.id for c in PAD_ONLY_CASES])
def test_outputs_that_read_only_padding(case, direction, rng):
    x, w, dy, geo = make(case, rng)
    xl, wl, dyl = (data_to_lib(x, case.dfmt), filt_to_lib(w, case.ffmt),
                   data_to_lib(dy, case.dfmt))
    if direction == "fwd":
        got = nc.convolution(xl, wl, **attrs(case))
        assert_matches(data_from_lib(got, case.dfmt), F32, fwd_ref(geo), x, w)
    elif direction == "bwd_data":
        got = nc.convolution_backprop_data(dyl, wl, list(xl.shape), **attrs(case))
        assert_matches(data_from_lib(got, case.dfmt), F32, bwd_data_ref(geo, case.x), dy, w)
    else:
        got = nc.convolution_backprop_filters(xl, list(wl.shape), dyl, **attrs(case))
        assert_matches(filt_from_lib(got, case.ffmt), F32, bwd_filter_ref(geo, case.f), x, dy)
