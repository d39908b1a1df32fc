"""The GEMM strategy's windows variant: weight gradients tap by tap over the valid window.

For tap ``t`` the output pixels whose input pixel ``o*s - p + t*d`` lies inside the input
form a box (along every axis a contiguous range of outputs); outside it the tap reads the
zero padding. A dilated layer with wide pads (DeepLab's ASPP at dilation 12 over 33x33,
SSD's fc6 at dilation 6) or a 3-D layer over a few slices (C3D's conv4b: 3x3x3 over 4
slices) leaves a large share of every tap's pixels in the padding, and an im2col GEMM
(``gemm[slabs]``) multiplies those zeros: 20-60% of its work on the zoo's layers. Here

    dW[t] = X[window of t]^T @ dY[window of t]

one BLAS GEMM per tap (``C x K`` over the window's pixels), the windows copied to
contiguous rows where they are not (the centre tap of a stride-1 layer reads the arrays
in place), on every BLAS thread. Nothing is compiled; each tap's GEMM writes its own rows
of ``dW`` (the same bits for the same inputs, thread count and host).
"""
import math

import numpy as np

from . import Strategy, canonical_shapes, itemsize

#: Least share of an im2col GEMM's multiply-adds on the padding's zeros for this entry to
#: take a layer, and the least input and output channels: below them a tap's GEMM is too
#: thin for BLAS and the copies of the windows cost more than the zeros (docs/
#: performance.md, "Dilated and padded weight gradients").
MIN_PAD_SHARE = 0.2
MIN_CHANNELS = 64

R_DIRECTION = "the windows variant is backward weights only"
R_GROUPS = "{g} groups (one group only)"
R_ONE_TAP = "one tap: no padding to skip"
R_CHANNELS = ("{c} input and {k} output channels (< %d): a tap's GEMM too thin for BLAS"
              % MIN_CHANNELS)
R_PADDING = ("{share:.0%} of an im2col GEMM's multiply-adds on the padding (< "
             + f"{MIN_PAD_SHARE:.0%}): the windows' copies cost more than the zeros")


def _axis_window(o, i, s, d, p, t):
    """``(first output, outputs, first input)`` of tap ``t`` along one axis: the outputs
    ``o0 .. o0 + n - 1`` whose input ``o*s - p + t*d`` lies in ``[0, i)``."""
    off = t * d - p
    lo = max(0, -(off // s))                # the first output whose input is >= 0
    hi = min(o, (i - 1 - off) // s + 1)     # past the last whose input is < i
    n = max(0, hi - lo)
    return lo, n, lo * s + off


def windows(p):
    """Per tap (flat, ``(t_d*kh + t_h)*kw + t_w``): per axis ``(o0, n, i0)`` (see
    :func:`_axis_window`)."""
    axes = [[_axis_window(p.osz[a], p.isz[a], p.stride[a], p.dilation[a], p.pad_begin[a], t)
             for t in range(p.ksz[a])] for a in range(3)]
    return [(axes[0][td], axes[1][th], axes[2][tw]) for td in range(p.ksz[0])
            for th in range(p.ksz[1]) for tw in range(p.ksz[2])]


def pad_share(p):
    """The share of an im2col GEMM's multiply-adds that fall on the zero padding."""
    full = math.prod(p.osz)
    wins = windows(p)
    valid = sum(math.prod(n for _, n, _ in w) for w in wins)
    return 1 - valid / (full * len(wins)) if full else 0.0


class GemmWindows(Strategy):
    name = "gemm"
    variant = "windows"
    directions = ("bwd_w",)

    def accepts(self, p):
        if p.direction != "bwd_w":
            return R_DIRECTION
        if p.g != 1:
            return R_GROUPS.format(g=p.g)
        if math.prod(p.ksz) == 1:
            return R_ONE_TAP
        if min(p.ic, p.oc) < MIN_CHANNELS:
            return R_CHANNELS.format(c=p.ic, k=p.oc)
        share = pad_share(p)
        if share < MIN_PAD_SHARE:
            return R_PADDING.format(share=share)
        return None

    def tiles(self, p, machine):
        return {"pad_share": round(pad_share(p), 3)}

    def workspace_bytes(self, p, tiles):
        """The largest tap's window of x and of dY, copied (rows of C and K)."""
        most = max(math.prod(n for _, n, _ in w) for w in windows(p))
        return p.mb * most * (p.ic + p.oc) * itemsize(p)

    def run(self, p, tiles, ops):
        from .. import blas, memory
        from ._gemm_common import blas_threads

        ct = np.dtype(p.compute_dtype)
        x = np.asarray(ops["x"], ct).reshape(canonical_shapes(p)[0])
        dy = np.asarray(ops["dy"], ct).reshape(canonical_shapes(p)[1])
        wins = windows(p)
        dw = memory.empty((len(wins), p.ic, p.oc), ct)  # (recycled: no page faults)
        with blas.threads(blas_threads()):
            for t, w in enumerate(wins):
                rows = p.mb * math.prod(n for _, n, _ in w)
                if rows == 0:  # the tap reads nothing but padding
                    dw[t] = 0
                    continue
                xs = (slice(None),) + tuple(slice(i0, i0 + (n - 1) * s + 1, s)
                                            for (_, n, i0), s in zip(w, p.stride))
                ys = (slice(None),) + tuple(slice(o0, o0 + n) for o0, n, _ in w)
                np.matmul(_rows(x[xs], rows, p.ic, ct).T, _rows(dy[ys], rows, p.oc, ct),
                          out=dw[t])
        return dw.reshape(canonical_shapes(p)[2])


def _rows(a, rows, cols, ct):
    """``a`` as ``[rows, cols]``: itself where it is contiguous, else a copy in the pool's
    memory."""
    from .. import memory
    if a.flags.c_contiguous:
        return a.reshape(rows, cols)
    out = memory.empty(a.shape, ct)
    np.copyto(out, a)
    return out.reshape(rows, cols)


STRATEGY = GemmWindows()
