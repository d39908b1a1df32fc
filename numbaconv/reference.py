"""A slow, obviously-correct NumPy reference (float64), used by ``numbaconv check`` and bench.

Arrays are channels-last ``[N, *X, C]`` with 1-3 spatial dims and XIO filters
``[*X, C/groups, K]``. Every kernel tap is one strided slice of the zero-padded input and one
matrix product per group, so the reference shares no code with the Numba kernels.
"""
import itertools

import numpy as np


def _taps(ksz):
    return itertools.product(*(range(k) for k in ksz))


def _slices(t, osz, stride, dilation):
    return tuple(slice(ti * d, ti * d + (o - 1) * s + 1, s)
                 for ti, o, s, d in zip(t, osz, stride, dilation))


def out_size(isz, ksz, stride, dilation, pb, pe):
    return tuple((i + b + e - (k - 1) * d - 1) // s + 1
                 for i, k, s, d, b, e in zip(isz, ksz, stride, dilation, pb, pe))


def conv_fwd(x, w, stride, dilation, pb, pe, groups=1):
    """y = conv(x, w) in float64."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    nd = x.ndim - 2
    ksz, icg, oc = w.shape[:nd], w.shape[nd], w.shape[nd + 1]
    ocg = oc // groups
    osz = out_size(x.shape[1:-1], ksz, stride, dilation, pb, pe)
    xp = np.pad(x, [(0, 0), *zip(pb, pe), (0, 0)])
    y = np.zeros((x.shape[0], *osz, oc))
    for t in _taps(ksz):
        xs = xp[(slice(None), *_slices(t, osz, stride, dilation))]
        for gi in range(groups):
            y[..., gi * ocg:(gi + 1) * ocg] += (
                xs[..., gi * icg:(gi + 1) * icg] @ w[t][:, gi * ocg:(gi + 1) * ocg])
    return y


def conv_bwd_data(dy, w, isz, stride, dilation, pb, pe, groups=1):
    """dx = conv^T(dy, w) for an input of spatial size ``isz``, in float64."""
    dy = np.asarray(dy, np.float64)
    w = np.asarray(w, np.float64)
    nd = dy.ndim - 2
    ksz, icg, oc = w.shape[:nd], w.shape[nd], w.shape[nd + 1]
    ocg = oc // groups
    osz = dy.shape[1:-1]
    span = [max(i + b + e, (o - 1) * s + (k - 1) * d + 1)
            for i, b, e, o, s, k, d in zip(isz, pb, pe, osz, stride, ksz, dilation)]
    dxp = np.zeros((dy.shape[0], *span, icg * groups))
    for t in _taps(ksz):
        sl = (slice(None), *_slices(t, osz, stride, dilation))
        for gi in range(groups):
            dxp[sl + (slice(gi * icg, (gi + 1) * icg),)] += (
                dy[..., gi * ocg:(gi + 1) * ocg] @ w[t][:, gi * ocg:(gi + 1) * ocg].T)
    crop = tuple(slice(b, b + i) for b, i in zip(pb, isz))
    return dxp[(slice(None), *crop)]


def conv_bwd_filter(x, dy, ksz, stride, dilation, pb, pe, groups=1):
    """dw (XIO) = gradient of <conv(x, w), dy> with respect to w, in float64."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    ic, oc = x.shape[-1], dy.shape[-1]
    icg, ocg = ic // groups, oc // groups
    osz = dy.shape[1:-1]
    xp = np.pad(x, [(0, 0), *zip(pb, pe), (0, 0)])
    dw = np.zeros((*ksz, icg, oc))
    for t in _taps(ksz):
        xs = xp[(slice(None), *_slices(t, osz, stride, dilation))]
        for gi in range(groups):
            a = xs[..., gi * icg:(gi + 1) * icg].reshape(-1, icg)
            b = dy[..., gi * ocg:(gi + 1) * ocg].reshape(-1, ocg)
            dw[t][:, gi * ocg:(gi + 1) * ocg] = a.T @ b
    return dw


def normalized_error(got, ref, ref_abs):
    """docs/contract.md section 10: max |got - ref| over max of the reference on absolute values."""
    scale = float(np.max(np.abs(ref_abs))) if np.size(ref_abs) else 0.0
    err = float(np.max(np.abs(np.asarray(got, np.float64) - ref))) if np.size(ref) else 0.0
    return err / scale if scale > 0 else err


#: Bound of float32 problems computed with ``precision="tf32"``: every product's operands
#: are rounded to TF32 (relative error at most 2^-11 each, so 2^-10 + 2^-22 per product,
#: summed at most 2^-10 of ``ref_abs``), plus float32's own bound for the sums.
TF32_TOLERANCE = 2 ** -10 + 1e-5
#: bfloat16 (inputs exact, accumulated in float32, rounded once): the rounding's relative
#: error, at most 2^-8 (half a unit in the last of its 8 significant bits), plus float32's
#: bound for the accumulation (docs/contract.md section 10).
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 4e-3, "bfloat16": 2 ** -8 + 1e-5}
WINOGRAD_TOLERANCE = {"float64": 1e-12, "float32": 1e-4, "float16": 4e-3,
                      "bfloat16": 2 ** -8 + 1e-4}
