"""Slow, obviously-correct NumPy references for the tests (independent of numbaconv).

Canonical form used throughout:

* data ``x`` / ``dx`` and ``dy`` are channels-last, ``[N, *X, C]`` with 1 to 3 spatial dims;
* filters ``w`` / ``dw`` are XIO, ``[*X, C/groups, K]``; output channel ``k`` belongs to group
  ``k // (K/groups)`` and reads input channels ``g*C/groups .. (g+1)*C/groups - 1``;
* geometry per spatial axis: ``stride``, ``dilation`` (1 = none), ``pads_begin``, ``pads_end``.

Everything accumulates in float64. The forward pass is a sum over kernel taps of strided
slices of the zero-padded input; backward data scatters ``dy`` back through the same slices
into a padded buffer and crops it; backward filter is the per-tap correlation of the same
slices with ``dy``.  These are the definitions, written loop-by-loop, not derived formulas.
"""
import itertools
import math

import numpy as np

TOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5, np.dtype(np.float16): 4e-3}
#: docs/contract.md section 10: float32 under the Winograd strategy
TOL_WINOGRAD_F32 = 1e-4
#: docs/contract.md section 10: bfloat16 (ml_dtypes; not a key of ``TOL``, which would need
#: ml_dtypes imported): inputs are exact, float32 sums carry float32's error, and rounding
#: the result once to bfloat16's 8 significant bits adds at most 2^-8 of its magnitude.
TOL_BF16 = 2 ** -8 + 1e-5
TOL_WINOGRAD_BF16 = 2 ** -8 + 1e-4


# --------------------------------------------------------------------------- geometry
def _tup(v, nd, name):
    if np.isscalar(v):
        return (int(v),) * nd
    v = tuple(int(a) for a in v)
    assert len(v) == nd, (name, v, nd)
    return v


def out_size(i, k, s, d, pb, pe):
    """Forward output size of one axis (floor division, as every framework does)."""
    ek = (k - 1) * d + 1
    assert i + pb + pe >= ek, "filter larger than padded input"
    return (i + pb + pe - ek) // s + 1


def out_shape(x_spatial, k_spatial, stride, dilation, pads_begin, pads_end):
    nd = len(x_spatial)
    return tuple(out_size(x_spatial[a], k_spatial[a], stride[a], dilation[a], pads_begin[a],
                          pads_end[a]) for a in range(nd))


def same_pads(i, k, s, d, lower=False):
    """TF SAME / oneDNN same_upper (odd pixel at the end); same_lower puts it first.

    out = ceil(in / s); total = max((out-1)*s + (k-1)*d + 1 - in, 0).
    Returns (pad_begin, pad_end, out).
    """
    o = -(-i // s)
    total = max((o - 1) * s + (k - 1) * d + 1 - i, 0)
    small, big = total // 2, total - total // 2
    return (big, small, o) if lower else (small, big, o)


def same_pads_nd(x_spatial, k_spatial, stride, dilation, lower=False):
    r = [same_pads(i, k, s, d, lower) for i, k, s, d in zip(x_spatial, k_spatial, stride,
                                                            dilation)]
    return tuple(a[0] for a in r), tuple(a[1] for a in r)


def _tap_slices(t, o_spatial, stride, dilation):
    """Index into the padded data that tap ``t`` reads for every output position."""
    return tuple(slice(t[a] * dilation[a], t[a] * dilation[a] + (o_spatial[a] - 1) * stride[a] + 1,
                       stride[a]) for a in range(len(t)))


def _check(x_nd, w_nd):
    assert 1 <= x_nd - 2 <= 3
    assert w_nd == x_nd


# --------------------------------------------------------------------------- references
def conv_fwd_ref(x, w, stride=1, dilation=1, pads_begin=0, pads_end=0, groups=1):
    """y[n, o, k] = sum_{t, c} xpad[n, o*s + t*d, g*Cg + c] * w[t, c, k]  (k in group g)."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    _check(x.ndim, w.ndim)
    nd = x.ndim - 2
    stride, dilation = _tup(stride, nd, "stride"), _tup(dilation, nd, "dilation")
    pb, pe = _tup(pads_begin, nd, "pb"), _tup(pads_end, nd, "pe")
    n, c = x.shape[0], x.shape[-1]
    ks, cg, k = w.shape[:nd], w.shape[nd], w.shape[nd + 1]
    assert c == cg * groups and k % groups == 0, (c, cg, k, groups)
    kg = k // groups
    o = out_shape(x.shape[1:-1], ks, stride, dilation, pb, pe)
    xp = np.pad(x, [(0, 0)] + list(zip(pb, pe)) + [(0, 0)])
    y = np.zeros((n,) + o + (k,))
    for t in itertools.product(*[range(a) for a in ks]):
        xs = xp[(slice(None),) + _tap_slices(t, o, stride, dilation)]
        for g in range(groups):
            y[..., g * kg:(g + 1) * kg] += np.einsum(
                "...c,ck->...k", xs[..., g * cg:(g + 1) * cg], w[t][:, g * kg:(g + 1) * kg])
    return y


def conv_bwd_data_ref(dy, w, x_spatial_shape, stride=1, dilation=1, pads_begin=0, pads_end=0,
                      groups=1):
    """Scatter: for each tap, add dy @ w[t]^T into the padded dx at the positions the forward
    pass read, then crop the padding.  Output positions beyond dy's extent (output_padding)
    simply receive nothing."""
    dy = np.asarray(dy, np.float64)
    w = np.asarray(w, np.float64)
    _check(dy.ndim, w.ndim)
    nd = dy.ndim - 2
    stride, dilation = _tup(stride, nd, "stride"), _tup(dilation, nd, "dilation")
    pb, pe = _tup(pads_begin, nd, "pb"), _tup(pads_end, nd, "pe")
    xs_sp = _tup(x_spatial_shape, nd, "x_spatial_shape")
    n, k = dy.shape[0], dy.shape[-1]
    o = dy.shape[1:-1]
    ks, cg = w.shape[:nd], w.shape[nd]
    assert w.shape[-1] == k and k % groups == 0
    kg, c = k // groups, cg * groups
    padded = tuple(xs_sp[a] + pb[a] + pe[a] for a in range(nd))
    for a in range(nd):
        assert (o[a] - 1) * stride[a] + (ks[a] - 1) * dilation[a] + 1 <= padded[a]
    dxp = np.zeros((n,) + padded + (c,))
    for t in itertools.product(*[range(a) for a in ks]):
        sl = (slice(None),) + _tap_slices(t, o, stride, dilation)
        for g in range(groups):
            dxp[sl + (slice(g * cg, (g + 1) * cg),)] += np.einsum(
                "...k,ck->...c", dy[..., g * kg:(g + 1) * kg], w[t][:, g * kg:(g + 1) * kg])
    crop = tuple(slice(pb[a], pb[a] + xs_sp[a]) for a in range(nd))
    return dxp[(slice(None),) + crop]


def conv_bwd_filter_ref(x, dy, kernel_spatial, stride=1, dilation=1, pads_begin=0, pads_end=0,
                        groups=1):
    """dw[t, c, k] = sum_{n, o} xpad[n, o*s + t*d, g*Cg + c] * dy[n, o, k]."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    _check(x.ndim, dy.ndim)
    nd = x.ndim - 2
    stride, dilation = _tup(stride, nd, "stride"), _tup(dilation, nd, "dilation")
    pb, pe = _tup(pads_begin, nd, "pb"), _tup(pads_end, nd, "pe")
    ks = _tup(kernel_spatial, nd, "kernel_spatial")
    c, k = x.shape[-1], dy.shape[-1]
    assert c % groups == 0 and k % groups == 0
    cg, kg = c // groups, k // groups
    o = dy.shape[1:-1]
    assert o == out_shape(x.shape[1:-1], ks, stride, dilation, pb, pe), "dy shape"
    xp = np.pad(x, [(0, 0)] + list(zip(pb, pe)) + [(0, 0)])
    dw = np.zeros(ks + (cg, k))
    for t in itertools.product(*[range(a) for a in ks]):
        xs = xp[(slice(None),) + _tap_slices(t, o, stride, dilation)]
        for g in range(groups):
            dw[t][:, g * kg:(g + 1) * kg] = np.tensordot(
                xs[..., g * cg:(g + 1) * cg], dy[..., g * kg:(g + 1) * kg],
                axes=(list(range(nd + 1)), list(range(nd + 1))))
    return dw


# --------------------------------------------------------------------------- layouts
def to_channels_last(a):
    """NCX -> NXC (NCHW -> NHWC, NCDHW -> NDHWC, NCW -> NWC)."""
    return np.moveaxis(np.asarray(a), 1, -1)


def to_channels_first(a):
    """NXC -> NCX."""
    return np.moveaxis(np.asarray(a), -1, 1)


def oix_to_xio(w):
    """oneDNN OIX [K, C/g, *X] -> XIO [*X, C/g, K]."""
    w = np.asarray(w)
    nd = w.ndim - 2
    return np.transpose(w, tuple(range(2, 2 + nd)) + (1, 0))


def xio_to_oix(w):
    """XIO [*X, C/g, K] -> OIX [K, C/g, *X]."""
    w = np.asarray(w)
    nd = w.ndim - 2
    return np.transpose(w, (nd + 1, nd) + tuple(range(nd)))


def depthwise_to_xio(w):
    """TF depthwise [fh, fw, C, m] -> XIO [fh, fw, 1, C*m], output channel c*m + mi
    (groups == C)."""
    w = np.asarray(w)
    fh, fw, c, m = w.shape
    out = np.zeros((fh, fw, 1, c * m), w.dtype)
    for ci in range(c):
        for mi in range(m):
            out[:, :, 0, ci * m + mi] = w[:, :, ci, mi]
    return out


def xio_to_depthwise(w, c):
    """Inverse of :func:`depthwise_to_xio`."""
    w = np.asarray(w)
    fh, fw, one, cm = w.shape
    assert one == 1 and cm % c == 0
    m = cm // c
    out = np.zeros((fh, fw, c, m), w.dtype)
    for ci in range(c):
        for mi in range(m):
            out[:, :, ci, mi] = w[:, :, 0, ci * m + mi]
    return out


def tf_pads(padding, x_spatial, k_spatial, stride, dilation, explicit=None):
    """(pads_begin, pads_end) for TF's "SAME"/"VALID"/"EXPLICIT" (explicit=[(b, e)] per
    spatial axis)."""
    nd = len(x_spatial)
    if padding == "SAME":
        return same_pads_nd(x_spatial, k_spatial, stride, dilation)
    if padding == "VALID":
        return (0,) * nd, (0,) * nd
    assert padding == "EXPLICIT"
    return tuple(p[0] for p in explicit), tuple(p[1] for p in explicit)


def onednn_pads(auto_pad, x_spatial, k_spatial, stride, dilation, pads_begin, pads_end):
    nd = len(x_spatial)
    if auto_pad in (None, "none"):
        return tuple(pads_begin), tuple(pads_end)
    if auto_pad == "valid":
        return (0,) * nd, (0,) * nd
    assert auto_pad in ("same_upper", "same_lower")
    return same_pads_nd(x_spatial, k_spatial, stride, dilation, lower=auto_pad == "same_lower")


# --------------------------------------------------------------------------- error measure
def case_operands(case, dtype, seed=0):
    """Seeded channels-last ``x``, XIO ``w`` and a ``dy`` of the forward's shape for a case
    ``(mb, ic, oc, isz, k, stride, dilation, pads_begin, pads_end)``, with the reference's
    keywords (``geom``) and the generic ops' (``attrs``): ``(x, w, dy, geom, attrs)``."""
    mb, ic, oc, isz, k, st, dl, pb, pe = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((mb, *isz, ic)).astype(dtype)
    w = rng.standard_normal((*k, ic, oc)).astype(dtype)
    geom = dict(stride=st, dilation=dl, pads_begin=pb, pads_end=pe)
    dy = rng.standard_normal(conv_fwd_ref(x, w, **geom).shape).astype(dtype)
    attrs = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe)
    return x, w, dy, geom, attrs


def normalized_error(got, ref_fn, *operands, **kwargs):
    """docs/contract.md section 10: max|got - ref| / max(ref computed on |operands|).

    ``ref_fn(*operands, **kwargs)`` is the float64 reference; the operands are used exactly
    as the library saw them (e.g. the float16 values, upcast losslessly). Array operands are
    replaced by their absolute values for the scale; other arguments pass through.
    """
    got = np.asarray(got)
    ops64 = [np.asarray(a, np.float64) if isinstance(a, np.ndarray) else a for a in operands]
    ref = ref_fn(*ops64, **kwargs)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if got.size == 0:
        return 0.0
    got64 = got.astype(np.float64)
    if not np.all(np.isfinite(got64)):
        return math.inf
    num = float(np.max(np.abs(got64 - ref)))
    absops = [np.abs(a) if isinstance(a, np.ndarray) else a for a in ops64]
    den = float(np.max(ref_fn(*absops, **kwargs)))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def tolerance(dtype, strategy=None):
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return TOL_WINOGRAD_BF16 if strategy == "winograd" else TOL_BF16
    if dtype == np.float32 and strategy == "winograd":
        return TOL_WINOGRAD_F32
    return TOL[dtype]


def assert_matches(got, dtype, ref_fn, *operands, strategy=None, plan=None, **kwargs):
    """Assert ``got`` has ``dtype`` and is within the docs/contract.md section 10 tolerance of the reference.

    For float32 results whose error lies between the direct/GEMM and the Winograd bounds,
    ``plan`` (a zero-argument callable returning the library's Plan) tells which strategy ran.
    """
    dtype = np.dtype(dtype)
    assert isinstance(got, np.ndarray), type(got)
    assert got.dtype == dtype, (got.dtype, dtype)
    err = normalized_error(got, ref_fn, *operands, **kwargs)
    tol = tolerance(dtype, strategy)
    if (err > tol and (dtype == np.float32 or dtype.name == "bfloat16") and strategy is None
            and plan is not None):
        tol = tolerance(dtype, plan().strategy)
    assert err <= tol, f"normalized error {err:.3e} > {tol:.0e} ({dtype})"
