"""The ``numpy`` strategy: one batched matrix product per kernel tap on strided views, in
NumPy alone, for small problems.

A small problem's kernel takes well under a millisecond on any strategy, but its first
call on a compiled strategy costs one to several seconds of Numba compiling (and about a
quarter of a second of Numba's own start-up even from the disk cache). Here nothing is
compiled: for each tap ``t`` the input pixels it meets form a strided view of the
zero-padded input, ``X_t[n, o, c] = xpad[n, o*s + t*d, c]``, and

* forward:          ``Y += X_t @ W_t``            (``[M, C/g] x [C/g, K/g]`` per group)
* backward data:    ``dXpad[view t] += dY @ W_t^T``  (the views of one tap never overlap)
* backward weights: ``dW_t = X_t^T @ dY``

with the groups as the batch axis of ``np.matmul``, summed over the taps in order, in the
compute dtype. The planner takes it only for problems under ``config.SMALL_FLOPS``
(``Strategy.small_only``); ``strategy="numpy"`` forces it on any problem.

``numpy[depthwise]`` (:class:`NumpyDepthwise`), ranked before it, takes the small depthwise
problems with channel multiplier 1 (``groups == in == out channels``): there every group's
product is ``[M, 1] x [1, 1]``, and ``np.matmul`` loops over ``groups x taps`` of them
(2160 for a 7x7x240 layer), so each tap is one elementwise product over all channels
instead:

* forward:          ``Y += X_t * w_t``
* backward data:    ``dXpad[view t] += dY * w_t``
* backward weights: ``dw_t = sum over pixels of X_t * dY``

(``w_t`` the tap's row of ``C`` weights, broadcast over the pixels), summed over the taps in
order; the pixel sum of the weight gradient is ``np.add.reduce`` over a ``[M, C]`` array,
whose order NumPy fixes for given shapes. Nothing is compiled and no thread is used, so the
result is the same for any thread count.
"""
import itertools

import numpy as np

from . import Strategy, canonical_shapes
from ..problem import numpy_dtype


def _padded_shape(p):
    return tuple(i + b + e for i, b, e in zip(p.isz, p.pad_begin, p.pad_end))


def _view(a, t, p):
    """The pixels of padded ``a [mb, D, H, W, C]`` that tap ``t`` meets, ``[mb, *osz, C]``."""
    sl = [slice(None)]
    for ti, di, si, oi in zip(t, p.dilation, p.stride, p.osz):
        start = ti * di
        sl.append(slice(start, start + (oi - 1) * si + 1, si))
    return a[tuple(sl) + (slice(None),)]


def _grouped(a, g):
    """``[M, g*n]`` -> ``[g, M, n]`` (a view)."""
    m = a.shape[0]
    return a.reshape(m, g, -1).transpose(1, 0, 2)


def _ungrouped(a):
    """``[g, M, n]`` -> ``[M, g*n]``."""
    return a.transpose(1, 0, 2).reshape(a.shape[1], -1)


def _pad(x, p):
    xp = np.zeros((p.mb, *_padded_shape(p), p.ic), x.dtype)
    inner = tuple(slice(b, b + i) for b, i in zip(p.pad_begin, p.isz))
    xp[(slice(None),) + inner] = x
    return xp


def _compute(a, ct, bits):
    """An operand in the compute dtype (float16 and bfloat16 come as their ``uint16`` bits,
    ``bits`` their dtype)."""
    return a.view(bits).astype(ct) if a.dtype == np.uint16 else np.asarray(a, ct)


class NumpyTaps(Strategy):
    name = "numpy"
    small_only = True

    def half_operands(self, p, tiles):
        """float16 operands come as bits and are widened here, and the result goes back as
        float16 bits, rounded once: NumPy's casts, which need no compiled conversion
        kernel (on a small problem they cost microseconds)."""
        return frozenset({"x", "dy", "w", "result"})

    def bf16_operands(self, p, tiles):
        """bfloat16 likewise, with ml_dtypes' casts (round to nearest even)."""
        return frozenset({"x", "dy", "w", "result"})

    def workspace_bytes(self, p, tiles):
        xs, ys, ws = canonical_shapes(p)
        item = np.dtype(p.compute_dtype).itemsize
        padded = p.mb * int(np.prod(_padded_shape(p))) * p.ic
        tap = p.mb * int(np.prod(p.osz)) * (p.ic + p.oc)
        return (padded + tap) * item

    def run(self, p, tiles, ops):
        ct = np.dtype(p.compute_dtype)
        half = any(a.dtype == np.uint16 for a in ops.values())
        bits = numpy_dtype(p.dtype) if half else None
        ops = {k: _compute(a, ct, bits) for k, a in ops.items()}
        r = self._run(p, ops, ct)
        if not half:
            return r
        with np.errstate(invalid="ignore"):  # (ml_dtypes' cast flags NaN as invalid)
            return r.astype(bits).view(np.uint16)

    def _run(self, p, ops, ct):
        xs, ys, ws = canonical_shapes(p)
        g = p.g
        m = p.mb * int(np.prod(p.osz))
        taps = list(itertools.product(*(range(k) for k in p.ksz)))
        if p.direction == "fwd":
            xp = _pad(ops["x"], p)
            w = ops["w"]
            y = np.zeros((g, m, p.ocg), ct)
            for t in taps:
                xt = _grouped(_view(xp, t, p).reshape(m, p.ic), g)
                y += np.matmul(xt, _grouped(w[t], g))
            return _ungrouped(y).reshape(ys)
        if p.direction == "bwd_d":
            dy = _grouped(ops["dy"].reshape(m, p.oc), g)
            w = ops["w"]
            dxp = np.zeros((p.mb, *_padded_shape(p), p.ic), ct)
            for t in taps:
                part = np.matmul(dy, _grouped(w[t], g).transpose(0, 2, 1))  # [g, M, C/g]
                _view(dxp, t, p)[...] += _ungrouped(part).reshape(p.mb, *p.osz, p.ic)
            inner = tuple(slice(b, b + i) for b, i in zip(p.pad_begin, p.isz))
            return np.ascontiguousarray(dxp[(slice(None),) + inner])
        xp = _pad(ops["x"], p)
        dy = _grouped(ops["dy"].reshape(m, p.oc), g)
        dw = np.empty(ws, ct)
        for t in taps:
            xt = _grouped(_view(xp, t, p).reshape(m, p.ic), g)
            part = np.matmul(xt.transpose(0, 2, 1), dy)  # [g, C/g, K/g]
            dw[t] = part.transpose(1, 0, 2).reshape(p.icg, p.oc)
        return dw


STRATEGY = NumpyTaps()

R_NOT_DEPTHWISE = "not depthwise with multiplier 1 ({g} groups, {ic} -> {oc} channels)"


class NumpyDepthwise(NumpyTaps):
    variant = "depthwise"

    def accepts(self, p):
        if not p.g == p.ic == p.oc:
            return R_NOT_DEPTHWISE.format(g=p.g, ic=p.ic, oc=p.oc)
        return None

    def workspace_bytes(self, p, tiles):
        item = np.dtype(p.compute_dtype).itemsize
        padded = p.mb * int(np.prod(_padded_shape(p))) * p.ic
        return (padded + p.mb * int(np.prod(p.osz)) * p.oc) * item

    def _run(self, p, ops, ct):
        xs, ys, ws = canonical_shapes(p)
        c = p.ic
        taps = list(itertools.product(*(range(k) for k in p.ksz)))
        w = ops["w"].reshape(len(taps), c) if p.direction != "bwd_w" else None
        if p.direction == "fwd":
            xp = _pad(ops["x"], p)
            y = np.zeros(ys, ct)
            tmp = np.empty(ys, ct)
            for i, t in enumerate(taps):
                np.multiply(_view(xp, t, p), w[i], out=tmp)
                y += tmp
            return y
        if p.direction == "bwd_d":
            dy = ops["dy"]
            dxp = np.zeros((p.mb, *_padded_shape(p), c), ct)
            tmp = np.empty(ys, ct)
            for i, t in enumerate(taps):
                np.multiply(dy, w[i], out=tmp)
                _view(dxp, t, p)[...] += tmp
            inner = tuple(slice(b, b + i) for b, i in zip(p.pad_begin, p.isz))
            return np.ascontiguousarray(dxp[(slice(None),) + inner])
        xp = _pad(ops["x"], p)
        dy = ops["dy"]
        m = p.mb * int(np.prod(p.osz))
        dw = np.empty((len(taps), c), ct)
        tmp = np.empty(ys, ct)
        for i, t in enumerate(taps):
            np.multiply(_view(xp, t, p), dy, out=tmp)
            np.add.reduce(tmp.reshape(m, c), axis=0, out=dw[i])
        return dw.reshape(ws)


DEPTHWISE = NumpyDepthwise()
