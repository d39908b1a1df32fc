"""Direct convolution loop nests for the three directions, any geometry.

Coordinates: an output position ``o`` and a tap ``t`` read input position
``i = o*s - p + t*d`` (per axis; ``p`` is the leading pad). The three kernels are the
forward pass and its two adjoints written as gathers, so no two parallel iterations ever
write the same element:

* forward:        y[n, o, k]  = sum_{t, c} x[n, o*s - p + t*d, c] * w[t, c, k]
* backward data:  dx[n, i, c] = sum_{t, k : (i + p - t*d) % s == 0}
                                  dy[n, (i+p-t*d)/s, k] * w[t, c, k]
* backward weights: dw[t, c, k] = sum_{n, o} x[n, o*s - p + t*d, c] * dy[n, o, k], each thread
  summing a contiguous range of output rows into its own partial ``dw``; the partials are
  reduced once, in a fixed order, afterwards (deterministic for a given thread count).

The innermost loop always runs over contiguous channels (output channels of a group).
Each row (or chunk) is a separate helper (``numbaconv._jit.separate``) that a small serial
kernel runs on every thread through the shared launcher ``numbaconv._jit.par_for``:
Numba's parallel passes never see the loop nest, and no kernel compiles a parallel region
of its own.

Each kernel computes a block of rows (``r0 .. r1 - 1`` of the rows it runs over; for the
weight gradient block ``blk`` of ``nblk`` of every chunk's rows), so that a long call can
be several launches with Python in between (where signals such as Ctrl-C are handled). A
row's result never depends on the blocks: the blocks of a weight gradient add each chunk's
rows into its partial in the same order as one launch does, so any blocking gives the
same bits.
"""
import numpy as np

from numbaconv._jit import dtype_name, separate

#: The row drivers' signature: three 5-D arrays of the compute dtype, the geometry, the
#: block's first row and the row within the block.
_SIG5 = ("void({T}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], int64[::1], "
         "int64, int64)")


def fwd_direct(x, w, y, geo, r0, r1):
    """y (zeroed, ``[mb, od, oh, ow, oc]``) = conv(x, w), output rows ``r0 .. r1 - 1`` (of
    the ``mb * od * oh`` rows ``(n, o_d, o_h)``)."""
    _fwd_row.run(dtype_name(y.dtype), r1 - r0, x, w, y, geo, r0)


@separate(_SIG5, noalias=True, float32="float32", float64="float64")
def _fwd_row(x, w, y, geo, r0, i):
    """Output row ``r0 + i`` of :func:`fwd_direct`."""
    r = r0 + i
    g, icg, ocg = geo[1], geo[2], geo[3]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    n = r // (od * oh)
    o_d = (r // oh) % od
    o_h = r % oh
    for o_w in range(ow):
        for t_d in range(kd):
            i_d = o_d * sd - pd + t_d * dd
            if i_d < 0 or i_d >= id_:
                continue
            for t_h in range(kh):
                i_h = o_h * sh - ph + t_h * dh
                if i_h < 0 or i_h >= ih:
                    continue
                for t_w in range(kw):
                    i_w = o_w * sw - pw + t_w * dw
                    if i_w < 0 or i_w >= iw:
                        continue
                    for gi in range(g):
                        for c in range(icg):
                            xv = x[n, i_d, i_h, i_w, gi * icg + c]
                            for k in range(gi * ocg, gi * ocg + ocg):
                                y[n, o_d, o_h, o_w, k] += xv * w[t_d, t_h, t_w, c, k]


def bwd_d_direct(dy, w, dx, geo, r0, r1):
    """dx (``[mb, id, ih, iw, ic]``) = conv^T(dy, w), input rows ``r0 .. r1 - 1`` (of the
    ``mb * id * ih`` rows ``(n, i_d, i_h)``) fully overwritten."""
    _bwd_d_row.run(dtype_name(dx.dtype), r1 - r0, dy, w, dx, geo, r0)


@separate(_SIG5, noalias=True, float32="float32", float64="float64")
def _bwd_d_row(dy, w, dx, geo, r0, i):
    """Input row ``r0 + i`` of :func:`bwd_d_direct`."""
    r = r0 + i
    g, icg, ocg = geo[1], geo[2], geo[3]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    n = r // (id_ * ih)
    i_d = (r // ih) % id_
    i_h = r % ih
    for i_w in range(iw):
        for cc in range(g * icg):
            dx[n, i_d, i_h, i_w, cc] = 0
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
                for t_w in range(kw):
                    a_w = i_w + pw - t_w * dw
                    if a_w < 0:
                        break
                    if a_w % sw != 0 or a_w // sw >= ow:
                        continue
                    o_w = a_w // sw
                    for gi in range(g):
                        for c in range(icg):
                            acc = dx.dtype.type(0)
                            for k in range(gi * ocg, gi * ocg + ocg):
                                acc += dy[n, o_d, o_h, o_w, k] * w[t_d, t_h, t_w, c, k]
                            dx[n, i_d, i_h, i_w, gi * icg + c] += acc


def bwd_d_direct_acc(dy, w, dx, geo, r0, r1):
    """As :func:`bwd_d_direct` for few input channels: per pixel, one vector accumulator per
    input channel runs over all taps and is reduced once (instead of one horizontal sum per
    tap and channel, which dominates when ``C/g`` is small and the taps many)."""
    _bwd_d_acc_row.run(dtype_name(dx.dtype), r1 - r0, dy, w, dx, geo, r0)


@separate(_SIG5, noalias=True, float32="float32", float64="float64")
def _bwd_d_acc_row(dy, w, dx, geo, r0, i):
    """Input row ``r0 + i`` of :func:`bwd_d_direct_acc`."""
    r = r0 + i
    g, icg, ocg = geo[1], geo[2], geo[3]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    n = r // (id_ * ih)
    i_d = (r // ih) % id_
    i_h = r % ih
    acc = np.empty((g * icg, ocg), dx.dtype)
    for i_w in range(iw):
        acc[:, :] = 0
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
                for t_w in range(kw):
                    a_w = i_w + pw - t_w * dw
                    if a_w < 0:
                        break
                    if a_w % sw != 0 or a_w // sw >= ow:
                        continue
                    o_w = a_w // sw
                    for gi in range(g):
                        for c in range(icg):
                            for k in range(ocg):
                                acc[gi * icg + c, k] += (dy[n, o_d, o_h, o_w, gi * ocg + k]
                                                         * w[t_d, t_h, t_w, c, gi * ocg + k])
        for cc in range(g * icg):
            s = acc[cc, 0]
            for k in range(1, ocg):
                s += acc[cc, k]
            dx[n, i_d, i_h, i_w, cc] = s


def bwd_w_direct(x, dy, part, geo, blk, nblk):
    """Per-chunk partial weight gradients: part[j] (zeroed before the first block) adds
    block ``blk`` of ``nblk`` of the output rows of chunk j, in row order."""
    _bwd_w_chunk.run(dtype_name(part.dtype), part.shape[0], x, dy, part, geo, blk, nblk)


@separate("void({T}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], {T}[:, :, :, :, :, ::1], "
          "int64[::1], int64, int64, int64)", noalias=True, float32="float32", float64="float64")
def _bwd_w_chunk(x, dy, part, geo, blk, nblk, j):
    """Block ``blk`` of chunk ``j``'s rows of :func:`bwd_w_direct`."""
    mb, g, icg, ocg = geo[0], geo[1], geo[2], geo[3]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    rows = mb * od * oh
    nchunks = part.shape[0]
    c0 = rows * j // nchunks
    c1 = rows * (j + 1) // nchunks
    r0 = c0 + (c1 - c0) * blk // nblk
    r1 = c0 + (c1 - c0) * (blk + 1) // nblk
    pj = part[j]
    for r in range(r0, r1):
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
                        for gi in range(g):
                            for c in range(icg):
                                xv = x[n, i_d, i_h, i_w, gi * icg + c]
                                for k in range(gi * ocg, gi * ocg + ocg):
                                    pj[t_d, t_h, t_w, c, k] += xv * dy[n, o_d, o_h, o_w, k]


#: Elements per iteration of :func:`reduce_partials`.
REDUCE_BLOCK = 1 << 12


def reduce_partials(part, out):
    """out[...] = sum_j part[j, ...], in a fixed order (flat views, same element count)."""
    _reduce_block.run(dtype_name(out.dtype), (out.size + REDUCE_BLOCK - 1) // REDUCE_BLOCK, part,
                      out)


@separate("void({T}[:, ::1], {T}[::1], int64)", noalias=True, float32="float32",
          float64="float64")
def _reduce_block(part, out, b):
    """Block ``b`` of :func:`reduce_partials`'s elements: partial by partial, each
    added to the block of ``out`` (vectors across the elements; each element's sum in the
    partials' order)."""
    e0 = b * REDUCE_BLOCK
    o = out[e0:min(out.size, e0 + REDUCE_BLOCK)]
    n = o.size
    p = part[0, e0:e0 + n]
    for e in range(n):
        o[e] = p[e]
    for j in range(1, part.shape[0]):
        p = part[j, e0:e0 + n]
        for e in range(n):
            o[e] += p[e]


def bwd_w_narrow(x, dy, part, geo, blk, nblk):
    """Per-chunk partial weight gradients for few output channels, transposed:
    ``part[j, t, k, c]`` (zeroed before the first block; ``t`` the flat tap
    ``(t_d*kh + t_h)*kw + t_w``) adds block ``blk`` of ``nblk`` of the output rows of chunk
    ``j``, in row order, pixel by pixel. The innermost loop runs over the input channels of
    one input pixel (contiguous in ``x`` and in ``part[j, t, k]``), each output channel's
    ``dy`` value a scalar: vectors across ``C`` where :func:`bwd_w_direct`'s innermost loop,
    over the few output channels, is too short for a vector. One group only."""
    _narrow_chunk.run(dtype_name(part.dtype), part.shape[0], x, dy, part, geo, blk, nblk)


@separate("void({T}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], {T}[:, :, :, ::1], "
          "int64[::1], int64, int64, int64)", noalias=True, float32="float32", float64="float64")
def _narrow_chunk(x, dy, part, geo, blk, nblk, j):
    """Block ``blk`` of chunk ``j``'s rows of :func:`bwd_w_narrow`."""
    mb, icg, ocg = geo[0], geo[2], geo[3]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    rows = mb * od * oh
    nchunks = part.shape[0]
    c0 = rows * j // nchunks
    c1 = rows * (j + 1) // nchunks
    r0 = c0 + (c1 - c0) * blk // nblk
    r1 = c0 + (c1 - c0) * (blk + 1) // nblk
    pj = part[j]
    for r in range(r0, r1):
        n = r // (od * oh)
        o_d = (r // oh) % od
        o_h = r % oh
        for o_w in range(ow):
            for t_d in range(kd):
                i_d = o_d * sd - pd + t_d * dd
                if i_d < 0 or i_d >= id_:
                    continue
                for t_h in range(kh):
                    i_h = o_h * sh - ph + t_h * dh
                    if i_h < 0 or i_h >= ih:
                        continue
                    for t_w in range(kw):
                        i_w = o_w * sw - pw + t_w * dw
                        if i_w < 0 or i_w >= iw:
                            continue
                        t = (t_d * kh + t_h) * kw + t_w
                        for k in range(ocg):
                            d = dy[n, o_d, o_h, o_w, k]
                            for c in range(icg):
                                pj[t, k, c] += x[n, i_d, i_h, i_w, c] * d
