"""The direct strategy: loop nests over the convolution itself; accepts every problem.

A call of more than :data:`BLOCK_FLOPS` runs as several kernel launches over consecutive
blocks of rows, each within about 0.2 s, so that Python handles signals (Ctrl-C) between
them rather than only when the whole call ends; the blocks give the single launch's bits
(see :mod:`numbaconv.kernels.cpu.direct`)."""
import math

import numpy as np

from . import Strategy, canonical_shapes, geo, itemsize
from .. import memory


#: Nominal FLOPs per kernel launch beyond which a call runs as several launches over row
#: blocks: 0.2 s at a conservative 1 GFLOP/s; a launch costs tens of microseconds, under a
#: thousandth of a block (measured: docs/performance.md, Numbers behind the constants).
BLOCK_FLOPS = 2e8


def row_blocks(problem, rows):
    """Blocks of at most about :data:`BLOCK_FLOPS` each (one for a smaller problem), at
    most one per row: ``[(r0, r1), ...]`` over ``rows`` rows."""
    n = int(max(1, min(rows, math.ceil(problem.flops / BLOCK_FLOPS))))
    return [(rows * b // n, rows * (b + 1) // n) for b in range(n)]


#: Backward data keeps a per-pixel ``[C, K/g]`` accumulator when the input channels per group
#: are few (per-tap horizontal sums would dominate) and the accumulator fits in half of L1.
ACC_MAX_ICG = 8


class Direct(Strategy):
    name = "direct"

    def tiles(self, problem, machine):
        if problem.direction == "bwd_d":
            acc_bytes = problem.ic * problem.ocg * itemsize(problem)
            per_pixel = problem.icg <= ACC_MAX_ICG and acc_bytes <= machine.l1d_bytes // 2
            return {"rows": problem.mb * problem.isz[0] * problem.isz[1],
                    "accumulate": "per-pixel" if per_pixel else "per-tap"}
        if problem.direction == "fwd":
            return {"rows": problem.mb * problem.osz[0] * problem.osz[1]}
        rows = problem.mb * problem.osz[0] * problem.osz[1]
        # One private partial dW per thread (rows split in contiguous ranges), reduced once.
        return {"chunks": max(1, min(machine.cores, rows))}

    def workspace_bytes(self, problem, tiles):
        if problem.direction != "bwd_w" or tiles.get("chunks", 1) == 1:
            return 0
        return tiles["chunks"] * math.prod(canonical_shapes(problem)[2]) * itemsize(problem)

    def run(self, problem, tiles, ops):
        from ..kernels.cpu import direct as k

        xs, ys, ws = canonical_shapes(problem)
        ct = problem.compute_dtype
        g = geo(problem)
        p = problem
        if p.direction == "fwd":
            y = memory.zeros(ys, ct)
            for r0, r1 in row_blocks(p, p.mb * p.osz[0] * p.osz[1]):
                k.fwd_direct(ops["x"], ops["w"], y, g, r0, r1)
            return y
        if p.direction == "bwd_d":
            dx = memory.empty(xs, ct)
            kern = (k.bwd_d_direct_acc if tiles.get("accumulate") == "per-pixel"
                    else k.bwd_d_direct)
            for r0, r1 in row_blocks(p, p.mb * p.isz[0] * p.isz[1]):
                kern(ops["dy"], ops["w"], dx, g, r0, r1)
            return dx
        chunks = tiles["chunks"]
        part = np.zeros((chunks, *ws), ct)
        # blocks of every chunk's rows (all chunks, one per thread, busy in each launch)
        rows = p.mb * p.osz[0] * p.osz[1]
        nblk = len(row_blocks(p, -(-rows // chunks)))
        for blk in range(nblk):
            k.bwd_w_direct(ops["x"], ops["dy"], part, g, blk, nblk)
        if chunks == 1:
            return part[0]
        dw = np.empty(ws, ct)
        k.reduce_partials(part.reshape(chunks, -1), dw.reshape(-1))
        return dw

    def numba_parallel(self, problem, tiles):
        return True


DIRECT = Direct()
