"""Depthwise direct loop nests (groups == channels, channel multiplier ``m``).

The general direct kernels loop over groups and then over ``C/g = 1`` channels: nothing to
vectorise. Here the innermost loop runs over all channels ``c`` of one pixel, contiguous in
channels-last data, so every tap is one vector sweep over the row of channels; each tensor is
read once per tap from L1/L2 and written once (the arithmetic intensity of a depthwise 3x3 is
about 2 flop per byte: it is bound by memory bandwidth, not by FMAs).

Canonical arrays as in :mod:`numbaconv.kernels`; the filter is ``[kd, kh, kw, 1, C*m]`` with
output channel ``c*m + j`` reading input channel ``c``.

Here: the general loop nests and the nine-term 3x3 kernels. Multiplier 1 has its own SIMD
kernels: the span kernels (:mod:`.depthwise_spans`) and the 3x3 row kernels
(:mod:`.depthwise_rows`).
"""
from numbaconv._jit import dtype_name, separate

#: The general row drivers' signature (each a separate helper that a serial kernel runs
#: over its rows in parallel through ``par_for``, so that Numba's parallel passes never see
#: the loop nest): three 5-D arrays, the geometry, a row.
_SIG5 = "void({T}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], int64[::1], int64)"


def fwd_depthwise(x, w, y, geo):
    """y (zeroed) = depthwise conv(x, w)."""
    _fwd_row.run(dtype_name(y.dtype), geo[0] * geo[10] * geo[11], x, w, y, geo)


@separate(_SIG5, noalias=True, float32="float32", float64="float64")
def _fwd_row(x, w, y, geo, r):
    """Output row ``r`` of :func:`fwd_depthwise`."""
    C, m = geo[1], geo[3]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    n = r // (od * oh)
    o_d = (r // oh) % od
    o_h = r % oh
    for t_d in range(kd):
        i_d = o_d * sd - pd + t_d * dd
        if i_d < 0 or i_d >= id_:
            continue
        for t_h in range(kh):
            i_h = o_h * sh - ph + t_h * dh
            if i_h < 0 or i_h >= ih:
                continue
            for o_w in range(ow):
                for t_w in range(kw):
                    i_w = o_w * sw - pw + t_w * dw
                    if i_w < 0 or i_w >= iw:
                        continue
                    for j in range(m):
                        for c in range(C):
                            y[n, o_d, o_h, o_w, c * m + j] += (
                                x[n, i_d, i_h, i_w, c] * w[t_d, t_h, t_w, 0, c * m + j])


def bwd_d_depthwise(dy, w, dx, geo):
    """dx (zeroed) = depthwise conv^T(dy, w), as a gather over the taps that reach each row."""
    _bwd_d_row.run(dtype_name(dx.dtype), geo[0] * geo[4] * geo[5], dy, w, dx, geo)


@separate(_SIG5, noalias=True, float32="float32", float64="float64")
def _bwd_d_row(dy, w, dx, geo, r):
    """Input row ``r`` of :func:`bwd_d_depthwise`."""
    C, m = geo[1], geo[3]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    n = r // (id_ * ih)
    i_d = (r // ih) % id_
    i_h = r % ih
    for t_d in range(kd):
        a_d = i_d + pd - t_d * dd
        if a_d < 0:
            break
        if a_d % sd != 0 or a_d // sd >= od:
            continue
        o_d = a_d // sd
        for t_h in range(kh):
            a_h = i_h + ph - t_h * dh
            if a_h < 0:
                break
            if a_h % sh != 0 or a_h // sh >= oh:
                continue
            o_h = a_h // sh
            for i_w in range(iw):
                for t_w in range(kw):
                    a_w = i_w + pw - t_w * dw
                    if a_w < 0:
                        break
                    if a_w % sw != 0 or a_w // sw >= ow:
                        continue
                    o_w = a_w // sw
                    for j in range(m):
                        for c in range(C):
                            dx[n, i_d, i_h, i_w, c] += (
                                dy[n, o_d, o_h, o_w, c * m + j] * w[t_d, t_h, t_w, 0, c * m + j])


def bwd_w_depthwise(x, dy, part, geo):
    """part[j] (zeroed, ``[kd, kh, kw, 1, C*m]``): dW summed over the output rows of chunk j."""
    _bwd_w_chunk.run(dtype_name(part.dtype), part.shape[0], x, dy, part, geo)


@separate("void({T}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], {T}[:, :, :, :, :, ::1], "
          "int64[::1], int64)", noalias=True, float32="float32", float64="float64")
def _bwd_w_chunk(x, dy, part, geo, ch):
    """Chunk ``ch`` of :func:`bwd_w_depthwise`."""
    mb, C, m = geo[0], geo[1], geo[3]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    rows = mb * od * oh
    nchunks = part.shape[0]
    pj = part[ch]
    for r in range(rows * ch // nchunks, rows * (ch + 1) // nchunks):
        n = r // (od * oh)
        o_d = (r // oh) % od
        o_h = r % oh
        for t_d in range(kd):
            i_d = o_d * sd - pd + t_d * dd
            if i_d < 0 or i_d >= id_:
                continue
            for t_h in range(kh):
                i_h = o_h * sh - ph + t_h * dh
                if i_h < 0 or i_h >= ih:
                    continue
                for o_w in range(ow):
                    for t_w in range(kw):
                        i_w = o_w * sw - pw + t_w * dw
                        if i_w < 0 or i_w >= iw:
                            continue
                        for j in range(m):
                            for c in range(C):
                                pj[t_d, t_h, t_w, 0, c * m + j] += (
                                    x[n, i_d, i_h, i_w, c] * dy[n, o_d, o_h, o_w, c * m + j])


def fwd_depthwise_3x3(x, w, y, geo):
    """y = depthwise conv(x, w) for 3x3 filters (kd = 1, multiplier 1), any stride/dilation.

    Interior pixels sum their nine taps in one expression, so the accumulator of each
    channel lives in a vector register and y is written once (instead of read and written
    per tap); border pixels take the checked per-tap loop.
    """
    _fwd3_row.run(dtype_name(y.dtype), geo[0] * geo[10] * geo[11], x, w, y, geo)


@separate("void({T}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], "
          "int64[::1], int64)", float32="float32", float64="float64")
def _fwd3_row(x, w, y, geo, r):
    """Output row ``r`` (flat over ``mb, od, oh``) of :func:`fwd_depthwise_3x3`."""
    C = geo[1]
    id_, ih, iw = geo[4], geo[5], geo[6]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dh, dw = geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    n = r // (od * oh)
    o_d = (r // oh) % od
    o_h = r % oh
    i_d = o_d * sd - pd
    h0 = o_h * sh - ph
    rows_in = 0 <= i_d < id_ and h0 >= 0 and h0 + 2 * dh < ih
    for o_w in range(ow):
        w0 = o_w * sw - pw
        if rows_in and w0 >= 0 and w0 + 2 * dw < iw:
            h1, h2, w1, w2 = h0 + dh, h0 + 2 * dh, w0 + dw, w0 + 2 * dw
            for c in range(C):
                y[n, o_d, o_h, o_w, c] = (
                    x[n, i_d, h0, w0, c] * w[0, 0, 0, 0, c]
                    + x[n, i_d, h0, w1, c] * w[0, 0, 1, 0, c]
                    + x[n, i_d, h0, w2, c] * w[0, 0, 2, 0, c]
                    + x[n, i_d, h1, w0, c] * w[0, 1, 0, 0, c]
                    + x[n, i_d, h1, w1, c] * w[0, 1, 1, 0, c]
                    + x[n, i_d, h1, w2, c] * w[0, 1, 2, 0, c]
                    + x[n, i_d, h2, w0, c] * w[0, 2, 0, 0, c]
                    + x[n, i_d, h2, w1, c] * w[0, 2, 1, 0, c]
                    + x[n, i_d, h2, w2, c] * w[0, 2, 2, 0, c])
        else:
            for c in range(C):
                y[n, o_d, o_h, o_w, c] = 0
            if i_d < 0 or i_d >= id_:
                continue
            for t_h in range(3):
                i_h = h0 + t_h * dh
                if i_h < 0 or i_h >= ih:
                    continue
                for t_w in range(3):
                    i_w = w0 + t_w * dw
                    if i_w < 0 or i_w >= iw:
                        continue
                    for c in range(C):
                        y[n, o_d, o_h, o_w, c] += x[n, i_d, i_h, i_w, c] * w[0, t_h, t_w, 0, c]


def bwd_d_depthwise_3x3(dy, w, dx, geo):
    """dx = depthwise conv^T(dy, w) for 3x3 filters at stride 1 (kd = 1, multiplier 1).

    At stride 1 every tap reaches every input pixel, so the gather has the forward's shape
    with the taps reversed: dx[i] = sum_t dy[i + p - t*d] * w[t]; interior pixels sum the
    nine terms in one expression (see :func:`fwd_depthwise_3x3`).
    """
    _bwd_d3_row.run(dtype_name(dx.dtype), geo[0] * geo[4] * geo[5], dy, w, dx, geo)


@separate("void({T}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], "
          "int64[::1], int64)", float32="float32", float64="float64")
def _bwd_d3_row(dy, w, dx, geo, r):
    """Input row ``r`` (flat over ``mb, id, ih``) of :func:`bwd_d_depthwise_3x3`."""
    C = geo[1]
    id_, ih, iw = geo[4], geo[5], geo[6]
    od, oh, ow = geo[10], geo[11], geo[12]
    dh, dw = geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    n = r // (id_ * ih)
    i_d = (r // ih) % id_
    i_h = r % ih
    o_d = i_d + pd
    h0 = i_h + ph  # output row of tap 0; tap t reads h0 - t*dh
    rows_in = o_d < od and h0 - 2 * dh >= 0 and h0 < oh
    for i_w in range(iw):
        w0 = i_w + pw
        if rows_in and w0 - 2 * dw >= 0 and w0 < ow:
            h1, h2, w1, w2 = h0 - dh, h0 - 2 * dh, w0 - dw, w0 - 2 * dw
            for c in range(C):
                dx[n, i_d, i_h, i_w, c] = (
                    dy[n, o_d, h0, w0, c] * w[0, 0, 0, 0, c]
                    + dy[n, o_d, h0, w1, c] * w[0, 0, 1, 0, c]
                    + dy[n, o_d, h0, w2, c] * w[0, 0, 2, 0, c]
                    + dy[n, o_d, h1, w0, c] * w[0, 1, 0, 0, c]
                    + dy[n, o_d, h1, w1, c] * w[0, 1, 1, 0, c]
                    + dy[n, o_d, h1, w2, c] * w[0, 1, 2, 0, c]
                    + dy[n, o_d, h2, w0, c] * w[0, 2, 0, 0, c]
                    + dy[n, o_d, h2, w1, c] * w[0, 2, 1, 0, c]
                    + dy[n, o_d, h2, w2, c] * w[0, 2, 2, 0, c])
        else:
            for c in range(C):
                dx[n, i_d, i_h, i_w, c] = 0
            if o_d >= od:
                continue
            for t_h in range(3):
                o_h = h0 - t_h * dh
                if o_h < 0 or o_h >= oh:
                    continue
                for t_w in range(3):
                    o_w = w0 - t_w * dw
                    if o_w < 0 or o_w >= ow:
                        continue
                    for c in range(C):
                        dx[n, i_d, i_h, i_w, c] += dy[n, o_d, o_h, o_w, c] * w[0, t_h, t_w, 0, c]
