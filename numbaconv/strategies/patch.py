"""The GEMM strategy's patch variant: weight gradients as one GEMM per output row, the
patch's rows read from the input in place through a table of offsets.

``dW[t, c, k] = sum over pixels of x[pixel shifted by tap t, c] * dy[pixel, k]``. For one
output row, every patch row ``(t, c)`` whose tap row lies inside the input is a row of A
at a fixed element offset from the output pixel's input position, consecutive pixels
``sw*C`` elements apart. So ``part[rows] += A @ dY_row`` is one GEMM over the row's pixels
whose A is the input itself, read through a table of row offsets
(:func:`numbaconv.kernels.cpu.ukernel.gemm_patch_bwd_w`): no im2col copy, any dilation and
stride, a register tile sized to the output channels (14 rows for one vector of them, 9
for two, 8 for three, 6 for four), and dY read in place; tap rows outside the input are
skipped. The few pixels at a row's ends, whose taps reach into the padding along w, run
through the same tiles afterwards, one GEMM per end pixel over a block of rows, its A a
zero-padded copy of the columns that pixel reads. Each thread sums a contiguous share of the output rows into a private partial dW; the partials
are added once, in a fixed order.

It takes first layers (at most 4 input channels), where im2col slabs or the rows variant
spent as long copying or in scratch tiles as multiplying (5-50% of the sgemm peak), and
other layers with up to 128 output channels whose output rows are long enough for the
GEMMs (at least ``MIN_ROW_PIXELS``) and whose row ends (their copies) are few; of
1x1 layers, those with at most ``MAX_POINTWISE_CHANNELS`` input channels.
"""
import math

import numpy as np

from . import Strategy, canonical_shapes, geo
from ._gemm_common import MIN_N, task_workers
from .. import config

#: Most input channels of a first layer (a stem): taken whatever its rows.
MAX_STEM_CHANNELS = 4
#: With more input channels, the fewest output pixels per row: shorter rows make short
#: GEMMs (each loads and stores its tile of dW) and im2col slabs win (measured:
#: docs/performance.md, "Weight gradients with few output channels").
MIN_ROW_PIXELS = 19
#: ... and the most pixels at a row's two ends (``(kw - 1) * dw``, each copied per tap
#: row before its GEMM), as a share of the row: ``1 / END_SHARE``.
END_SHARE = 8
#: Most input channels of a 1x1 layer: with more, gemm[split-k]'s one GEMM over every pixel
#: (x read as it is) wins; with fewer, its register tiles of x's channels run short
#: (measured: docs/performance.md, "Weight gradients with few output channels").
MAX_POINTWISE_CHANNELS = 32
#: Most output channels: the register tiles cover up to four vectors of them per pass, and
#: past 128 im2col slabs feed a full-width GEMM (the 1-D encoders of speech models, 1 input
#: channel against 512 outputs).
MAX_OUTPUT_CHANNELS = 128
#: On hosts with 256-bit vectors (AVX2) the most input channels: beyond them im2col slabs
#: on BLAS are faster there, on stems this entry is (measured: docs/performance.md, "CPU,
#: AVX2 host").
NARROW_VECTOR_INPUTS = 16

R_DIRECTION = "the patch variant is backward weights only"
R_GROUPS = "{g} groups (one group only)"
R_NARROW = "{k} output channels (< %d): too few GEMM columns" % MIN_N
R_WIDE = "{k} output channels (> %d): im2col slabs and a full-width GEMM win" % (
    MAX_OUTPUT_CHANNELS)
R_POINTWISE = ("1x1 over {c} input channels (> %d): gemm[split-k]'s one GEMM on x as it is "
               "wins" % MAX_POINTWISE_CHANNELS)
R_SHORT = ("{c} input channels (> %d, not a stem) and {ow} output pixels per row (< %d): "
           "short GEMMs" % (MAX_STEM_CHANNELS, MIN_ROW_PIXELS))
R_ENDS = ("{c} input channels (> %d, not a stem) and {e} of the row's {ow} output pixels "
          "at its ends (> 1/%d), each copied per tap row" % (MAX_STEM_CHANNELS, END_SHARE))
R_BLAS = "GEMM_ENGINE is 'blas' (the patch variant runs on the Numba engine)"
R_NARROW_VECTORS = ("{c} input channels (> %d) with 256-bit vectors: im2col slabs on BLAS "
                    "are faster" % NARROW_VECTOR_INPUTS)


class Patch(Strategy):
    name = "gemm"
    variant = "patch"
    compile_heavy = True
    directions = ("bwd_w",)

    def accepts(self, p):
        if p.direction != "bwd_w":
            return R_DIRECTION
        if p.g != 1:
            return R_GROUPS.format(g=p.g)
        if p.oc < MIN_N:
            return R_NARROW.format(k=p.oc)
        if p.oc > MAX_OUTPUT_CHANNELS:
            return R_WIDE.format(k=p.oc)
        if math.prod(p.ksz) == 1 and p.ic > MAX_POINTWISE_CHANNELS:
            return R_POINTWISE.format(c=p.ic)
        from ..machine import machine
        if p.ic > NARROW_VECTOR_INPUTS and machine().vector_bytes < 64:
            return R_NARROW_VECTORS.format(c=p.ic)
        if p.ic > MAX_STEM_CHANNELS:
            ow = p.osz[2]
            if ow < MIN_ROW_PIXELS:
                return R_SHORT.format(c=p.ic, ow=ow)
            ends = (p.ksz[2] - 1) * p.dilation[2]
            if ends * END_SHARE > ow:
                return R_ENDS.format(c=p.ic, e=ends, ow=ow)
        if config.GEMM_ENGINE == "blas":
            return R_BLAS
        return None

    def tiles(self, p, machine):
        return {"engine": "numba", "workers": task_workers(p)}

    def _sizes(self, p, tiles):
        from ..kernels.cpu import ukernel as uk
        ct = np.dtype(p.compute_dtype)
        vl = uk.lanes(ct.itemsize)
        kp = -(-p.oc // vl) * vl
        m = math.prod(p.ksz) * p.ic
        rows = p.mb * p.osz[0] * p.osz[1]
        nw = max(1, min(int(tiles["workers"]), rows))
        kd, kh, kw = p.ksz
        span = (kw - 1) * p.dilation[2] + 1
        return ct, kp, m, nw, uk.patch_work(p.osz[2], kp, kd * kh, span, p.ic)

    def workspace_bytes(self, p, tiles):
        ct, kp, m, nw, nwork = self._sizes(p, tiles)
        return nw * ((m + 1) * kp + nwork) * ct.itemsize + (m * p.oc) * ct.itemsize

    def run(self, p, tiles, ops):
        from ..kernels.cpu import ukernel as uk
        ct, kp, m, nw, nwork = self._sizes(p, tiles)
        x = np.ascontiguousarray(ops["x"], ct)
        dy = np.ascontiguousarray(ops["dy"], ct)
        parts = np.zeros((nw, m + 1, kp), ct)
        work = np.empty((nw, nwork), ct)
        idx = np.empty((nw, uk.patch_index(m)), np.int64)
        uk.gemm_patch_bwd_w(x.ctypes.data, dy.ctypes.data, parts, geo(p), work, idx)
        dw = parts[0, :m, :p.oc].copy()
        for i in range(1, nw):  # in a fixed order: the same bits for the same inputs
            dw += parts[i, :m, :p.oc]
        return dw.reshape(canonical_shapes(p)[2])

    def numba_parallel(self, p, tiles):
        return True


STRATEGY = Patch()
