"""The direct strategy's narrow variant: weight gradients with few output channels.

A head (U-Net's 2 classes, EDSR's 3 colours, a 1-channel vocoder output) has fewer output
channels than a GEMM needs columns (``_gemm_common.MIN_N``), so every ``gemm`` entry
declines it, and the plain ``direct`` loop nest's innermost loop, over those 1-7 output
channels, is too short for a vector. This entry sums, pixel by pixel,

    dW[t, c, k] += x[pixel shifted by tap t, c] * dy[pixel, k]

with the input channels ``c`` innermost (a contiguous row of ``x`` and of a transposed
``[taps, K, C]`` partial, in L1) and each ``dy`` value a scalar (see
:func:`numbaconv.kernels.cpu.direct.bwd_w_narrow`). Each chunk of output rows (one per
core) sums into its own partial; the partials are added once, in a fixed order, and
transposed to ``[taps, C, K]``: bitwise the same for the same inputs on the same host,
whatever the thread count. Long calls run as several launches over row blocks, as
``direct``'s (Ctrl-C between them), with the same bits.
"""
import math

import numpy as np

from . import Strategy, canonical_shapes, geo, itemsize
from ._gemm_common import MIN_N
from .direct import row_blocks

R_DIRECTION = "the narrow variant is backward weights only"
R_GROUPS = "{g} groups (one group only)"
R_WIDE = ("{k} output channels (>= %d): enough GEMM columns, and the output channels make "
          "the plain loop nest's vectors" % MIN_N)
R_FEW_C = ("{c} input channels < {k} output channels: too short a vector across the input "
           "channels")
#: Most bytes of one partial dW: half of a 32 KiB L1 data cache, where the accumulator is
#: read and written once per multiply-add.
MAX_PARTIAL_BYTES = 16 * 1024
R_L1 = ("partial dW of {n} B > %d B (half of a 32 KiB L1): the accumulator would leave L1"
        % MAX_PARTIAL_BYTES)


class Narrow(Strategy):
    name = "direct"
    variant = "narrow"
    directions = ("bwd_w",)

    def accepts(self, p):
        if p.direction != "bwd_w":
            return R_DIRECTION
        if p.g != 1:
            return R_GROUPS.format(g=p.g)
        if p.oc >= MIN_N:
            return R_WIDE.format(k=p.oc)
        if p.ic < p.oc:
            return R_FEW_C.format(c=p.ic, k=p.oc)
        n = math.prod(p.ksz) * p.ic * p.oc * itemsize(p)
        if n > MAX_PARTIAL_BYTES:
            return R_L1.format(n=n)
        return None

    def tiles(self, p, machine):
        rows = p.mb * p.osz[0] * p.osz[1]
        # One private partial dW per core (rows split in contiguous ranges), added once.
        return {"chunks": max(1, min(machine.cores, rows))}

    def workspace_bytes(self, p, tiles):
        return tiles["chunks"] * math.prod(canonical_shapes(p)[2]) * itemsize(p)

    def run(self, p, tiles, ops):
        from ..kernels.cpu import direct as k

        ws = canonical_shapes(p)[2]
        taps = math.prod(p.ksz)
        ct = p.compute_dtype
        chunks = tiles["chunks"]
        part = np.zeros((chunks, taps, p.oc, p.ic), ct)
        rows = p.mb * p.osz[0] * p.osz[1]
        nblk = len(row_blocks(p, -(-rows // chunks)))
        g = geo(p)
        for blk in range(nblk):
            k.bwd_w_narrow(ops["x"], ops["dy"], part, g, blk, nblk)
        # At most 16 KiB per partial: added in NumPy, in chunk order (nothing to compile).
        acc = part[0]
        for j in range(1, chunks):
            acc += part[j]
        return np.ascontiguousarray(acc.transpose(0, 2, 1)).reshape(ws)

    def numba_parallel(self, p, tiles):
        return True


STRATEGY = Narrow()
