"""The direct strategy: loop nests over the convolution itself; accepts every problem."""
import math

import numpy as np

from . import Strategy, canonical_shapes, geo, itemsize


class Direct(Strategy):
    name = "direct"

    def tiles(self, problem, machine):
        if problem.direction != "bwd_w":
            return {"rows": problem.mb * problem.isz[0] * problem.isz[1]
                    if problem.direction == "bwd_d"
                    else problem.mb * problem.osz[0] * problem.osz[1]}
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
            y = np.zeros(ys, ct)
            k.fwd_direct(ops["x"], ops["w"], y, g)
            return y
        if problem.direction == "bwd_d":
            dx = np.empty(xs, ct)
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


DIRECT = Direct()
