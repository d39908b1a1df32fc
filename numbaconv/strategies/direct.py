"""The direct strategy: loop nests over the convolution itself; accepts every problem."""
import math

import numpy as np

from . import Strategy, canonical_shapes, geo, itemsize
from .. import memory


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
        if problem.direction == "fwd":
            y = memory.zeros(ys, ct)
            k.fwd_direct(ops["x"], ops["w"], y, g)
            return y
        if problem.direction == "bwd_d":
            dx = memory.empty(xs, ct)
            if tiles.get("accumulate") == "per-pixel":
                k.bwd_d_direct_acc(ops["dy"], ops["w"], dx, g)
            else:
                k.bwd_d_direct(ops["dy"], ops["w"], dx, g)
            return dx
        chunks = tiles["chunks"]
        part = np.zeros((chunks, *ws), ct)
        k.bwd_w_direct(ops["x"], ops["dy"], part, g)
        if chunks == 1:
            return part[0]
        dw = np.empty(ws, ct)
        k.reduce_partials(part.reshape(chunks, -1), dw.reshape(-1))
        return dw

    def numba_parallel(self, problem, tiles):
        return True


DIRECT = Direct()
