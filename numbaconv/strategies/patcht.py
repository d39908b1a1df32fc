"""The GEMM strategy's patch-t variant: the weight gradient as the transposed patch GEMM,
vectors across input channels, for layers with few output channels.

``dW^T[k, (t, c)] = sum over output pixels of dy[pixel, k] * x[pixel shifted by tap t, c]``
(:mod:`numbaconv.kernels.cpu.patcht`): each step broadcasts ``MR`` (12 with AVX-512) output
channels' ``dy`` and multiplies one or two vectors of the input's channels at the tap. Per
tap, each output row's pixels whose tap lies inside the input along w are one segment of
the reduction, and a register tile sums over all the rows of a block. ``x`` and ``dy`` are
read in place, unless the input channels need padding to whole vectors or the output
channels to whole tiles (a copy, zeros past the channels). ``gemm[patch]`` (vectors across
the output channels) wastes lanes below 16 output channels (12 of 16 for DenseNet-BC's
growth layers) and runs one GEMM per output row, too short over 7-28 pixel rows;
``gemm[slabs]`` copies im2col slabs first.
Each thread sums a contiguous share of the output rows into a private partial; the
partials are added once, in a fixed order.
"""
import math

import numpy as np

from . import Strategy, canonical_shapes, geo, itemsize
from .. import config, memory

#: Most output channels: beyond them the untransposed GEMMs have vectors enough.
MAX_OUTPUT_CHANNELS = 48
#: Least input channels: one whole vector of them (float32, AVX-512) per step.
MIN_INPUT_CHANNELS = 16
#: Most lanes wasted by rounding the input channels to whole vectors and the output
#: channels to whole register tiles (multiply-adds on zeros), as a share of the work.
MAX_WASTE = 0.25
#: 1x1 layers with at least this many output channels: gemm[split-k]'s one GEMM over every
#: pixel wins (measured: docs/performance.md, "Weight gradients with few output channels").
POINTWISE_OUTPUTS = 32
#: Output rows of at least this many pixels, with output channels in whole vectors:
#: gemm[patch]'s one GEMM per row, vectors across the output channels, is as fast or faster.
LONG_ROW_PIXELS = 32
#: Bytes of ``dy`` per block of output rows: a tile broadcasts from it for every tap and
#: vector of input channels, so it stays in L1.
BLOCK_BYTES = 16 * 1024

R_DIRECTION = "the patch-t variant is backward weights only"
R_GROUPS = "{g} groups (one group only)"
R_WIDE = ("{k} output channels (> %d): the GEMMs with vectors across them are efficient"
          % MAX_OUTPUT_CHANNELS)
R_FEW_C = "{c} input channels (< %d): less than a vector of them" % MIN_INPUT_CHANNELS
R_WASTE = ("{c} input and {k} output channels padded to {cp} x {kp}: {w:.0%} of the "
           "multiply-adds on zeros (> " + f"{MAX_WASTE:.0%})")
R_POINTWISE = ("1x1 with {k} output channels (>= %d): gemm[split-k]'s one GEMM over every "
               "pixel wins" % POINTWISE_OUTPUTS)
R_LONG_ROWS = ("{k} output channels in whole vectors over rows of {ow} pixels (>= %d): "
               "gemm[patch]'s GEMM per row wins" % LONG_ROW_PIXELS)
R_BLAS = "GEMM_ENGINE is 'blas' (the patch-t variant runs on the Numba engine)"


def _kernels():
    from ..kernels.cpu import patcht
    return patcht


def padded(p):
    """``(Cp, Kp)``: input channels in whole vectors, output channels in whole tiles."""
    k = _kernels()
    vl = k.lanes(itemsize(p))
    return -(-p.ic // vl) * vl, -(-p.oc // k.MR) * k.MR


class PatchT(Strategy):
    name = "gemm"
    variant = "patch-t"
    compile_heavy = True
    directions = ("bwd_w",)

    def accepts(self, p):
        if p.direction != "bwd_w":
            return R_DIRECTION
        if p.g != 1:
            return R_GROUPS.format(g=p.g)
        if p.oc > MAX_OUTPUT_CHANNELS:
            return R_WIDE.format(k=p.oc)
        if p.ic < MIN_INPUT_CHANNELS:
            return R_FEW_C.format(c=p.ic)
        if math.prod(p.ksz) == 1 and p.oc >= POINTWISE_OUTPUTS:
            return R_POINTWISE.format(k=p.oc)
        vl = _kernels().lanes(itemsize(p))
        if p.oc % vl == 0 and p.osz[2] >= LONG_ROW_PIXELS:
            return R_LONG_ROWS.format(k=p.oc, ow=p.osz[2])
        cp, kp = padded(p)
        waste = 1 - p.ic * p.oc / (cp * kp)
        if waste > MAX_WASTE:
            return R_WASTE.format(c=p.ic, k=p.oc, cp=cp, kp=kp, w=waste)
        if config.GEMM_ENGINE == "blas":
            return R_BLAS
        return None

    def tiles(self, p, machine):
        rows = p.mb * p.osz[0] * p.osz[1]
        _, kp = padded(p)
        per_row = p.osz[2] * kp * itemsize(p)
        return {"chunks": max(1, min(machine.cores, rows)),
                "block_rows": max(1, BLOCK_BYTES // per_row)}

    def workspace_bytes(self, p, tiles):
        cp, kp = padded(p)
        n = tiles["chunks"] * kp * math.prod(p.ksz) * cp
        if cp != p.ic:
            n += p.mb * math.prod(p.isz) * cp
        if kp != p.oc:
            n += p.mb * math.prod(p.osz) * kp
        return n * itemsize(p)

    def run(self, p, tiles, ops):
        k = _kernels()
        ct = np.dtype(p.compute_dtype)
        cp, kp = padded(p)
        x, dy = ops["x"], ops["dy"]  # canonical: [mb, d, h, w, C]
        if cp == p.ic:
            x = np.ascontiguousarray(x, ct)
        else:  # channels to whole vectors
            xp = memory.empty((*x.shape[:4], cp), ct)
            xp[..., p.ic:] = 0
            xp[..., :p.ic] = x
            x = xp
        if kp == p.oc:
            dy = np.ascontiguousarray(dy, ct)
        else:  # output channels to whole register tiles
            dyp = memory.empty((*dy.shape[:4], kp), ct)
            dyp[..., p.oc:] = 0
            dyp[..., :p.oc] = dy
            dy = dyp
        taps = math.prod(p.ksz)
        chunks = int(tiles["chunks"])
        rb = int(tiles["block_rows"])
        part = np.zeros((chunks, kp, taps * cp), ct)
        segs = np.empty((chunks, 3 * rb), np.int64)
        k.bwd_w(x, dy, part, geo(p), np.int64(rb), segs)
        acc = part[0]
        for j in range(1, chunks):  # in a fixed order: the same bits for the same inputs
            acc += part[j]
        dw = acc[:p.oc].reshape(p.oc, taps, cp)[:, :, :p.ic].transpose(1, 2, 0)
        return np.ascontiguousarray(dw).reshape(canonical_shapes(p)[2])

    def numba_parallel(self, p, tiles):
        return True


STRATEGY = PatchT()
