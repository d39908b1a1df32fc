"""The GEMM strategy's stem variant: weight gradients with few input channels.

A network's first layer (3 colours, 1 audio or medical channel) has a weight gradient
``dW[t, c, k] = sum over pixels of x[pixel shifted by tap t, c] * dy[pixel, k]`` with a
short patch (27 rows for 3x3 over RGB) against a long reduction (every output pixel of
the batch) and few output channels. The rows variant reduces over one output row per
GEMM call and one tap row at a time, 9-21 rows of A against a 6-row register tile, and
went through scratch tiles wherever the output channels are not whole vectors: 5-50% of
the sgemm peak on such layers.

This entry makes one GEMM per output row of every patch row whose tap row lies inside
the input (:func:`numbaconv.kernels.cpu.ukernel.gemm_stem_bwd_w`): A's rows are taken
from the input at offsets listed in a table, so no patch is copied, the register tile is
sized to the output channels (14 rows for one vector of them, 9 for two, 6 for four),
and ``dy`` is read in place. Every dilation, stride and
padding is exact: the pixels whose taps reach into the padding along w are added one by
one, and tap rows outside the input are skipped. Each thread sums a contiguous share of
the output rows into a private partial dW; the partials are added once, in a fixed order.
"""
import math

import numpy as np

from . import Strategy, canonical_shapes, geo
from ._gemm_common import MIN_N, task_workers
from .. import config

#: Most input channels: above them a patch row's taps are long enough for the rows and
#: slabs variants' GEMMs.
MAX_INPUT_CHANNELS = 4
#: Most output channels: the register tiles cover up to four vectors of them per pass, and
#: past 128 im2col slabs feed a full-width GEMM (the 1-D encoders of speech models, 1 input
#: channel against 512 outputs).
MAX_OUTPUT_CHANNELS = 128

R_DIRECTION = "the stem variant is backward weights only"
R_GROUPS = "{g} groups (one group only)"
R_CHANNELS = "{c} input channels (> %d): not a stem" % MAX_INPUT_CHANNELS
R_NARROW = "{k} output channels (< %d): too few GEMM columns" % MIN_N
R_WIDE = "{k} output channels (> %d): im2col slabs and a full-width GEMM win" % (
    MAX_OUTPUT_CHANNELS)
R_POINTWISE = "1x1: one patch row per input channel (gemm[split-k] reads x as it is)"
R_BLAS = "GEMM_ENGINE is 'blas' (the stem variant runs on the Numba engine)"


class Stem(Strategy):
    name = "gemm"
    variant = "stem"
    compile_heavy = True
    directions = ("bwd_w",)

    def accepts(self, p):
        if p.direction != "bwd_w":
            return R_DIRECTION
        if p.g != 1:
            return R_GROUPS.format(g=p.g)
        if p.ic > MAX_INPUT_CHANNELS:
            return R_CHANNELS.format(c=p.ic)
        if p.oc < MIN_N:
            return R_NARROW.format(k=p.oc)
        if p.oc > MAX_OUTPUT_CHANNELS:
            return R_WIDE.format(k=p.oc)
        if math.prod(p.ksz) == 1:
            return R_POINTWISE
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
        return ct, kp, m, nw, uk.stem_work(p.osz[2], kp)

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
        idx = np.empty((nw, uk.stem_index(m)), np.int64)
        uk.gemm_stem_bwd_w(x.ctypes.data, dy.ctypes.data, parts, geo(p), work, idx)
        dw = parts[0, :m, :p.oc].copy()
        for i in range(1, nw):  # in a fixed order: the same bits for the same inputs
            dw += parts[i, :m, :p.oc]
        return dw.reshape(canonical_shapes(p)[2])

    def numba_parallel(self, p, tiles):
        return True


STRATEGY = Stem()
