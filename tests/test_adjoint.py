"""Both gradients are the exact adjoints of the forward op, and the TF-style and generic names
agree on the same problem.

<conv(x, w), dy> == <x, bwd_data(w, dy)> == <w, bwd_filter(x, dy)> in float64."""
import numpy as np
import pytest

import numbaconv as nc
from reference import (depthwise_to_xio, out_shape, same_pads_nd, to_channels_first,
                       to_channels_last, xio_to_depthwise, xio_to_oix)

RTOL = 1e-10


def _dot(a, b):
    return float(np.sum(np.asarray(a, np.float64) * np.asarray(b, np.float64)))


def _assert_adjoint(y, dy, x, dx, w, dw):
    a, b, c = _dot(y, dy), _dot(x, dx), _dot(w, dw)
    scale = max(abs(a), _dot(np.abs(y), np.abs(dy)), 1e-300)
    assert abs(a - b) <= RTOL * scale, (a, b)
    assert abs(a - c) <= RTOL * scale, (a, c)


def _random_configs(count, seed):
    """Valid generic configurations: 1-3 spatial dims, groups, strides, dilations, pads,
    auto_pad, layouts."""
    r = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        nd = int(r.integers(1, 4))
        groups = int(r.choice([1, 1, 2, 3]))
        cg, kg = int(r.integers(1, 3)), int(r.integers(1, 3))
        ks = tuple(int(v) for v in r.integers(1, 4, nd))
        s = tuple(int(v) for v in r.integers(1, 4, nd))
        d = tuple(int(v) for v in r.integers(1, 3, nd))
        pb = tuple(int(v) for v in r.integers(0, 3, nd))
        pe = tuple(int(v) for v in r.integers(0, 3, nd))
        xs = tuple(int(v) for v in r.integers(1, 8 - nd, nd))
        auto_pad = str(r.choice(["none", "none", "same_upper", "same_lower", "valid"]))
        if auto_pad in ("same_upper", "same_lower"):
            epb, epe = same_pads_nd(xs, ks, s, d, lower=auto_pad == "same_lower")
        elif auto_pad == "valid":
            epb = epe = (0,) * nd
        else:
            epb, epe = pb, pe
        if any(xs[a] + epb[a] + epe[a] < (ks[a] - 1) * d[a] + 1 for a in range(nd)):
            continue
        cfg = dict(n=int(r.integers(1, 3)), x=xs, c=cg * groups, f=ks, k=kg * groups, s=s, d=d,
                   pb=pb, pe=pe, auto_pad=auto_pad, groups=groups,
                   dfmt=str(r.choice(["NXC", "NCX"])), ffmt=str(r.choice(["XIO", "OIX"])),
                   o=out_shape(xs, ks, s, d, epb, epe))
        cfg["id"] = (f"{nd}d-g{groups}-k{ks}-s{s}-d{d}-{auto_pad}-{cfg['dfmt']}-"
                     f"{cfg['ffmt']}").replace(" ", "")
        out.append(cfg)
    return out


CONFIGS = _random_configs(16, seed=7)


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c["id"] for c in CONFIGS])
def test_generic_adjoint(cfg, rng):
    x = rng.standard_normal((cfg["n"],) + cfg["x"] + (cfg["c"],))
    w = rng.standard_normal(cfg["f"] + (cfg["c"] // cfg["groups"], cfg["k"]))
    dy = rng.standard_normal((cfg["n"],) + cfg["o"] + (cfg["k"],))
    if cfg["dfmt"] == "NCX":
        x, dy = to_channels_first(x).copy(), to_channels_first(dy).copy()
    if cfg["ffmt"] == "OIX":
        w = xio_to_oix(w).copy()
    kw = dict(strides=list(cfg["s"]), dilations=list(cfg["d"]), pads_begin=list(cfg["pb"]),
              pads_end=list(cfg["pe"]), auto_pad=cfg["auto_pad"], groups=cfg["groups"],
              data_format=cfg["dfmt"], filter_format=cfg["ffmt"])
    y = nc.convolution(x, w, **kw)
    assert y.shape == dy.shape and y.dtype == np.float64
    dx = nc.convolution_backprop_data(dy, w, list(x.shape), **kw)
    dw = nc.convolution_backprop_filters(x, list(w.shape), dy, **kw)
    assert dx.shape == x.shape and dw.shape == w.shape
    _assert_adjoint(y, dy, x, dx, w, dw)


TF_CONFIGS = [
    # (id, data_format, x spatial, C, filter spatial, K, strides, dilations, padding, explicit)
    ("nhwc-same-s2", "NHWC", (6, 5), 3, (3, 3), 2, (2, 2), (1, 1), "SAME", None),
    ("nchw-same-d2-s2", "NCHW", (7, 6), 2, (3, 2), 3, (2, 1), (2, 2), "SAME", None),
    ("nhwc-explicit-d2", "NHWC", (5, 6), 2, (2, 3), 2, (1, 2), (2, 1), "EXPLICIT",
     [0, 0, 1, 2, 2, 0, 0, 0]),
    ("nchw-valid-s3", "NCHW", (7, 7), 3, (2, 2), 2, (3, 3), (1, 1), "VALID", None),
]


@pytest.mark.parametrize("cfg", TF_CONFIGS, ids=[c[0] for c in TF_CONFIGS])
def test_tf_conv2d_adjoint(cfg, rng):
    _, fmt, xs, c, fs, k, s, d, padding, explicit = cfg
    x = rng.standard_normal((2,) + xs + (c,))
    w = rng.standard_normal(fs + (c, k))
    s_full, d_full = [1, *s, 1], [1, *d, 1]
    if fmt == "NCHW":
        x = to_channels_first(x).copy()
        s_full, d_full = [1, 1, *s], [1, 1, *d]
    kw = dict(strides=s_full, padding=padding, data_format=fmt, dilations=d_full,
              explicit_paddings=explicit)
    y = nc.conv2d(x, w, **kw)
    dy = rng.standard_normal(y.shape)
    dx = nc.conv2d_backprop_input(list(x.shape), w, dy, **kw)
    dw = nc.conv2d_backprop_filter(x, list(w.shape), dy, **kw)
    _assert_adjoint(y, dy, x, dx, w, dw)


@pytest.mark.parametrize("mult", [1, 2])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_tf_depthwise_adjoint(fmt, mult, rng):
    x = rng.standard_normal((2, 6, 7, 3))
    if fmt == "NCHW":
        x = to_channels_first(x).copy()
    w = rng.standard_normal((3, 2, 3, mult))
    kw = dict(strides=2, padding="SAME", data_format=fmt, dilations=[2, 1])
    y = nc.depthwise_conv2d_native(x, w, **kw)
    dy = rng.standard_normal(y.shape)
    dx = nc.depthwise_conv2d_native_backprop_input(list(x.shape), w, dy, **kw)
    dw = nc.depthwise_conv2d_native_backprop_filter(x, list(w.shape), dy, **kw)
    _assert_adjoint(y, dy, x, dx, w, dw)


@pytest.mark.parametrize("fmt", ["NDHWC", "NCDHW"])
def test_tf_conv3d_adjoint(fmt, rng):
    x = rng.standard_normal((1, 5, 4, 6, 2))
    if fmt == "NCDHW":
        x = to_channels_first(x).copy()
    w = rng.standard_normal((2, 3, 2, 2, 3))
    kw = dict(strides=[2, 1, 2], padding="SAME", data_format=fmt, dilations=[1, 1, 2])
    y = nc.conv3d(x, w, **kw)
    dy = rng.standard_normal(y.shape)
    dx = nc.conv3d_backprop_input_v2(list(x.shape), w, dy, **kw)
    dw = nc.conv3d_backprop_filter_v2(x, list(w.shape), dy, **kw)
    _assert_adjoint(y, dy, x, dx, w, dw)


# --------------------------------------------------------------------------- agreement
def _close(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = max(float(np.max(np.abs(b))), 1e-300) if b.size else 1.0
    assert float(np.max(np.abs(a - b), initial=0.0)) <= 1e-12 * scale


@pytest.mark.parametrize("padding", ["SAME", "VALID", "EXPLICIT"])
def test_tf_conv2d_agrees_with_generic(padding, rng):
    """conv2d* NHWC (SAME odd pixel at the end) == convolution* NXC/XIO with the same pads."""
    x = rng.standard_normal((2, 6, 7, 4))
    w = rng.standard_normal((3, 2, 2, 4))          # grouped: C/groups = 2
    s, d = (2, 2), (1, 2)
    if padding == "SAME":
        pb, pe = same_pads_nd((6, 7), (3, 2), s, d)
        explicit = None
    elif padding == "VALID":
        pb, pe, explicit = (0, 0), (0, 0), None
    else:
        pb, pe = (2, 1), (0, 1)
        explicit = [0, 0, 2, 0, 1, 1, 0, 0]
    tf = dict(strides=list(s), padding=padding, dilations=list(d), explicit_paddings=explicit)
    gen = dict(strides=list(s), dilations=list(d), pads_begin=list(pb), pads_end=list(pe),
               groups=2)
    y_tf, y_gen = nc.conv2d(x, w, **tf), nc.convolution(x, w, **gen)
    _close(y_tf, y_gen)
    dy = rng.standard_normal(y_gen.shape)
    _close(nc.conv2d_backprop_input(x.shape, w, dy, **tf),
           nc.convolution_backprop_data(dy, w, x.shape, **gen))
    _close(nc.conv2d_backprop_filter(x, w.shape, dy, **tf),
           nc.convolution_backprop_filters(x, w.shape, dy, **gen))
    # SAME is same_upper
    if padding == "SAME":
        up = dict(strides=list(s), dilations=list(d), auto_pad="same_upper", groups=2)
        _close(nc.convolution_backprop_filters(x, [3, 2], dy, **up),
               nc.conv2d_backprop_filter(x, w.shape, dy, **tf))


def test_nchw_agrees_with_nhwc_and_oix_with_xio(rng):
    x = rng.standard_normal((2, 5, 6, 3))
    w = rng.standard_normal((3, 3, 3, 2))
    kw = dict(strides=[2, 1], padding="SAME", dilations=[1, 2])
    y = nc.conv2d(x, w, **kw)
    dy = rng.standard_normal(y.shape)
    xc, dyc = to_channels_first(x).copy(), to_channels_first(dy).copy()
    _close(to_channels_last(nc.conv2d(xc, w, data_format="NCHW", **kw)), y)
    _close(to_channels_last(nc.conv2d_backprop_input(xc.shape, w, dyc, data_format="NCHW",
                                                     **kw)),
           nc.conv2d_backprop_input(x.shape, w, dy, **kw))
    _close(nc.conv2d_backprop_filter(xc, w.shape, dyc, data_format="NCHW", **kw),
           nc.conv2d_backprop_filter(x, w.shape, dy, **kw))
    gen = dict(strides=[2, 1], dilations=[1, 2], auto_pad="same_upper")
    wo = xio_to_oix(w).copy()
    _close(nc.convolution(xc, wo, data_format="NCX", filter_format="OIX", **gen),
           to_channels_first(y))
    _close(nc.convolution_backprop_filters(x, wo.shape, dy, filter_format="OIX", **gen),
           xio_to_oix(nc.convolution_backprop_filters(x, w.shape, dy, **gen)))


@pytest.mark.parametrize("mult", [1, 2])
def test_depthwise_agrees_with_groups_equal_channels(mult, rng):
    c = 3
    x = rng.standard_normal((2, 6, 5, c))
    w = rng.standard_normal((3, 2, c, mult))
    wx = depthwise_to_xio(w)                         # [3, 2, 1, c*mult], channel ci*m + mi
    tf = dict(strides=[1, 2, 2, 1], padding="SAME", dilations=[1, 2, 1, 1])
    gen = dict(strides=[2, 2], dilations=[2, 1], auto_pad="same_upper", groups=c)
    y = nc.depthwise_conv2d_native(x, w, **tf)
    _close(y, nc.convolution(x, wx, **gen))
    dy = rng.standard_normal(y.shape)
    _close(nc.depthwise_conv2d_native_backprop_input(x.shape, w, dy, **tf),
           nc.convolution_backprop_data(dy, wx, x.shape, **gen))
    _close(nc.depthwise_conv2d_native_backprop_filter(x, w.shape, dy, **tf),
           xio_to_depthwise(nc.convolution_backprop_filters(x, wx.shape, dy, **gen), c))


def test_conv3d_agrees_with_generic(rng):
    x = rng.standard_normal((2, 4, 5, 4, 2))
    w = rng.standard_normal((2, 2, 3, 2, 3))
    tf = dict(strides=[1, 2, 1], padding="VALID", dilations=[2, 1, 1])
    gen = dict(strides=[1, 2, 1], dilations=[2, 1, 1])
    y = nc.conv3d(x, w, **tf)
    _close(y, nc.convolution(x, w, **gen))
    dy = rng.standard_normal(y.shape)
    _close(nc.conv3d_backprop_input_v2(x.shape, w, dy, **tf),
           nc.convolution_backprop_data(dy, w, x.shape, **gen))
    _close(nc.conv3d_backprop_filter_v2(x, w.shape, dy, **tf),
           nc.convolution_backprop_filters(x, w.shape, dy, **gen))
