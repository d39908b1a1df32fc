"""Direct loop nests for grouped convolutions with few channels per group.

Batched per-group GEMMs of 4-32 channels run far from peak, and the generic direct loops
vectorise over at most ``K/g`` channels. Here the channels are stored group-minor
(``[..., C/g, g]`` instead of ``[..., g, C/g]``, a transpose made once by the strategy), so
for a fixed input channel ``c`` and output channel ``k`` of a group the innermost loop is
one contiguous FMA across all ``g`` groups: the depthwise kernels' trick (depthwise is the
case ``C/g = K/g = 1``), applied to small groups.

Layouts: ``x``/``dx`` ``[mb, id, ih, iw, icg, g]``, ``dy``/``y`` ``[mb, od, oh, ow, ocg, g]``,
``w``/``dw`` ``[kd, kh, kw, icg, ocg, g]``.
"""
from numba import prange

from numbaconv._jit import kernel


@kernel
def fwd_grouped(x, w, y, geo):
    """y (zeroed) = grouped conv(x, w)."""
    mb, g, icg, ocg = geo[0], geo[1], geo[2], geo[3]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    for r in prange(mb * od * oh):
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
                        for k in range(ocg):
                            c = 0
                            # four input channels per sweep: a quarter of the y traffic
                            while c + 4 <= icg:
                                for gi in range(g):
                                    y[n, o_d, o_h, o_w, k, gi] += (
                                        x[n, i_d, i_h, i_w, c, gi] * w[t_d, t_h, t_w, c, k, gi]
                                        + x[n, i_d, i_h, i_w, c + 1, gi]
                                        * w[t_d, t_h, t_w, c + 1, k, gi]
                                        + x[n, i_d, i_h, i_w, c + 2, gi]
                                        * w[t_d, t_h, t_w, c + 2, k, gi]
                                        + x[n, i_d, i_h, i_w, c + 3, gi]
                                        * w[t_d, t_h, t_w, c + 3, k, gi])
                                c += 4
                            for cr in range(c, icg):
                                for gi in range(g):
                                    y[n, o_d, o_h, o_w, k, gi] += (
                                        x[n, i_d, i_h, i_w, cr, gi] * w[t_d, t_h, t_w, cr, k, gi])


@kernel
def bwd_d_grouped(dy, w, dx, geo):
    """dx (zeroed) = grouped conv^T(dy, w), a gather over the taps that reach each row."""
    mb, g, icg, ocg = geo[0], geo[1], geo[2], geo[3]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    for r in prange(mb * id_ * ih):
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
                        for c in range(icg):
                            k = 0
                            # four output channels per sweep: a quarter of the dx traffic
                            while k + 4 <= ocg:
                                for gi in range(g):
                                    dx[n, i_d, i_h, i_w, c, gi] += (
                                        dy[n, o_d, o_h, o_w, k, gi] * w[t_d, t_h, t_w, c, k, gi]
                                        + dy[n, o_d, o_h, o_w, k + 1, gi]
                                        * w[t_d, t_h, t_w, c, k + 1, gi]
                                        + dy[n, o_d, o_h, o_w, k + 2, gi]
                                        * w[t_d, t_h, t_w, c, k + 2, gi]
                                        + dy[n, o_d, o_h, o_w, k + 3, gi]
                                        * w[t_d, t_h, t_w, c, k + 3, gi])
                                k += 4
                            for kr in range(k, ocg):
                                for gi in range(g):
                                    dx[n, i_d, i_h, i_w, c, gi] += (
                                        dy[n, o_d, o_h, o_w, kr, gi] * w[t_d, t_h, t_w, c, kr, gi])


@kernel
def bwd_w_grouped(x, dy, part, geo):
    """part[j] (zeroed, ``[kd, kh, kw, icg, ocg, g]``): dW over the output rows of chunk j."""
    mb, g, icg, ocg = geo[0], geo[1], geo[2], geo[3]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    rows = mb * od * oh
    nchunks = part.shape[0]
    for ch in prange(nchunks):
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
                    for t_w in range(kw):
                        o_w = 0
                        # four output pixels per sweep (when all four read inside the
                        # input): a quarter of the partial-dW traffic
                        while o_w + 4 <= ow:
                            i0 = o_w * sw - pw + t_w * dw
                            i3 = i0 + 3 * sw
                            if i0 >= 0 and i3 < iw:
                                i1 = i0 + sw
                                i2 = i1 + sw
                                for c in range(icg):
                                    for k in range(ocg):
                                        for gi in range(g):
                                            pj[t_d, t_h, t_w, c, k, gi] += (
                                                x[n, i_d, i_h, i0, c, gi] * dy[n, o_d, o_h, o_w, k, gi]
                                                + x[n, i_d, i_h, i1, c, gi]
                                                * dy[n, o_d, o_h, o_w + 1, k, gi]
                                                + x[n, i_d, i_h, i2, c, gi]
                                                * dy[n, o_d, o_h, o_w + 2, k, gi]
                                                + x[n, i_d, i_h, i3, c, gi]
                                                * dy[n, o_d, o_h, o_w + 3, k, gi])
                                o_w += 4
                            else:
                                if 0 <= i0 < iw:
                                    for c in range(icg):
                                        for k in range(ocg):
                                            for gi in range(g):
                                                pj[t_d, t_h, t_w, c, k, gi] += (
                                                    x[n, i_d, i_h, i0, c, gi]
                                                    * dy[n, o_d, o_h, o_w, k, gi])
                                o_w += 1
                        for o_r in range(o_w, ow):
                            i_w = o_r * sw - pw + t_w * dw
                            if i_w < 0 or i_w >= iw:
                                continue
                            for c in range(icg):
                                for k in range(ocg):
                                    for gi in range(g):
                                        pj[t_d, t_h, t_w, c, k, gi] += (
                                            x[n, i_d, i_h, i_w, c, gi] * dy[n, o_d, o_h, o_r, k, gi])
