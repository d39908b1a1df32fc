"""GEMM strategy, rows variant: backward weights with an input view for A, no im2col.

With dilation 1 along w, the ``kw*C`` weights a channels-last output pixel meets along w
are contiguous in the input, ``sw*C`` elements after its neighbour's. So for one output
row and one tap (t_d, t_h), the im2col block ``A[t_w*C + c, o] = x[row, o*sw + t_w, c]``
is a strided view of the input row (rows of A one element apart, columns ``sw*C`` apart),
and

    dW[t_d, t_h] += A @ dY[row]        ([kw*C, ow] x [ow, K])

runs on the Numba GEMM engine (:func:`numbaconv.kernels.cpu.ukernel.gemm_rows_bwd_w`)
straight from the input, padded along w only. The GEMM strategy packs the same
``A`` into im2col slabs first: for few weights per pixel (a 1-D stem: 7 taps x 3
channels; WaveNet's 2 x 32) against few output channels, the packing costs as much as
the product. Each thread (a Numba parallel loop: no Python worker hand-off, which
costs about as much as a small layer's product) sums a contiguous share of the output
pixels into a private partial dW; the partials are added once.
"""
import math

import numpy as np

from . import Strategy, canonical_shapes, geo, itemsize, w_padding
from ._gemm_common import MIN_N, UK_KC, identity, sum_partials, task_workers
from .. import config, memory

#: Most weights per output pixel and tap row (``kw * C/g``) and most output channels: above
#: them im2col slabs and a GEMM win (measured: docs/performance.md, Numbers behind the
#: constants).
MAX_ROW_WEIGHTS = 64
MAX_OUTPUT_CHANNELS = 64

R_DIRECTION = "the rows variant is backward weights only"
R_GROUPS = "{g} groups (one group only)"
R_DILATION = "dilation {d} along w (the view needs 1)"
R_WIDE = ("{n} weights per tap row x {k} output channels (> %d or > %d): im2col slabs "
          "and a GEMM win" % (MAX_ROW_WEIGHTS, MAX_OUTPUT_CHANNELS))
R_NARROW = "{k} output channels (< %d): too few GEMM columns" % MIN_N
R_IDENTITY = ("1x1 at stride 1 without pads: gemm[split-k] or gemm[identity] packs nothing "
              "either")
R_BLAS = "GEMM_ENGINE is 'blas' (the rows variant runs on the Numba engine)"


class RowGemm(Strategy):
    name = "gemm"
    variant = "rows"
    compile_heavy = True
    directions = ("bwd_w",)

    def accepts(self, p):
        if p.direction != "bwd_w":
            return R_DIRECTION
        if p.g != 1:
            return R_GROUPS.format(g=p.g)
        if p.dilation[2] != 1:
            return R_DILATION.format(d=p.dilation[2])
        if p.oc < MIN_N:
            return R_NARROW.format(k=p.oc)
        if identity(p):
            return R_IDENTITY
        if config.GEMM_ENGINE == "blas":
            return R_BLAS
        if p.ksz[2] * p.icg > MAX_ROW_WEIGHTS or p.oc > MAX_OUTPUT_CHANNELS:
            return R_WIDE.format(n=p.ksz[2] * p.icg, k=p.oc)
        return None

    def tiles(self, p, machine):
        from ..kernels.cpu import ukernel as uk
        panel = uk.panel(itemsize(p))
        nc = max(panel, -(-p.oc // panel) * panel)
        return {"engine": "numba", "workers": task_workers(p), "kc": UK_KC, "nc": int(nc)}

    def workspace_bytes(self, p, tiles):
        from ..kernels.cpu import ukernel as uk
        item = itemsize(p)
        nw = tiles["workers"]
        left, width = w_padding(p)
        xp = 0 if (left, width) == (0, p.isz[2]) else p.mb * math.prod(p.isz[:2]) * width * p.ic
        part = nw * math.prod(p.ksz) * p.ic * p.oc
        stage = 0
        if np.dtype(p.dtype) == np.float16:  # xp in float16; a float32 stage per thread
            xp //= 2
            stage = nw * uk.rows_stage(geo(p), tiles["kc"])
        return (xp + part + stage + nw * uk.workspace(tiles["kc"], item, tiles["nc"])) * item

    def run(self, p, tiles, ops):
        from ..kernels.cpu import ukernel as uk
        ct = np.dtype(p.compute_dtype)
        half = ops["dy"].dtype == np.uint16  # float16 bits: widened in the kernel
        st = np.uint16 if half else ct
        x = np.ascontiguousarray(ops["x"], st)
        dy = np.ascontiguousarray(ops["dy"], st)
        left, width = w_padding(p)
        if (left, width) == (0, p.isz[2]):
            xp = x
        else:  # (float16 +0.0 is all zero bits too)
            xp = memory.zeros((p.mb, *p.isz[:2], width, p.ic), st)
            xp[:, :, :, left:left + p.isz[2]] = x
        nw = max(1, min(int(tiles["workers"]), p.mb * math.prod(p.osz)))
        kc, nc = int(tiles["kc"]), int(tiles["nc"])
        parts = np.zeros((nw, math.prod(p.ksz) * p.ic, p.oc), ct)
        work = np.empty((nw, uk.workspace(kc, ct.itemsize, nc)), ct)
        gv = geo(p)
        if half:  # widened kc output pixels of dY, and of each tap row of X, at a time
            stage = np.empty((nw, uk.rows_stage(gv, kc)), ct)
            uk.gemm_rows_bwd_w_half(xp, dy, parts, gv, np.int64(kc), np.int64(nc), work,
                                    stage)
        else:
            uk.gemm_rows_bwd_w(xp, dy, parts, gv, np.int64(kc), np.int64(nc), work)
        dw = sum_partials(list(parts), nw)
        return dw.reshape(canonical_shapes(p)[2])

    def numba_parallel(self, p, tiles):
        return True

    def half_operands(self, p, tiles):
        """dY and each tap row's span of X are widened ``kc`` output pixels at a time
        (``ukernel.gemm_rows_bwd_w_half``)."""
        return frozenset({"x", "dy"})


STRATEGY = RowGemm()
