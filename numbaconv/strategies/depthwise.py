"""Direct strategy, depthwise variant: groups == channels, vectorised across channels."""
import math

import numpy as np

from . import canonical_shapes, geo, itemsize
from .direct import Direct

R_NOT_DEPTHWISE = "not depthwise (groups {g} != channels {ic})"


class DepthwiseDirect(Direct):
    """The direct loop nests of :mod:`numbaconv.kernels.cpu.depthwise`."""

    variant = "depthwise"

    def accepts(self, p):
        if not (p.g == p.ic and p.g > 1):
            return R_NOT_DEPTHWISE.format(g=p.g, ic=p.ic)
        return None

    def run(self, p, tiles, ops):
        from ..kernels.cpu import depthwise as k
        from ..kernels.cpu.direct import reduce_partials

        xs, ys, ws = canonical_shapes(p)
        ct = p.compute_dtype
        g = geo(p)
        if p.direction == "fwd":
            y = np.zeros(ys, ct)
            k.fwd_depthwise(ops["x"], ops["w"], y, g)
            return y
        if p.direction == "bwd_d":
            dx = np.zeros(xs, ct)
            k.bwd_d_depthwise(ops["dy"], ops["w"], dx, g)
            return dx
        chunks = tiles["chunks"]
        part = np.zeros((chunks, *ws), ct)
        k.bwd_w_depthwise(ops["x"], ops["dy"], part, g)
        if chunks == 1:
            return part[0]
        dw = np.empty(ws, ct)
        reduce_partials(part.reshape(chunks, -1), dw.reshape(-1))
        return dw


STRATEGY = DepthwiseDirect()
