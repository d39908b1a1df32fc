"""Direct strategy, grouped variant: few channels per group, vectorised across groups."""
import math

import numpy as np

from . import canonical_shapes, geo, itemsize
from .direct import Direct

#: Below this many groups the group-minor vector is too short to pay for the transposes.
MIN_GROUPS = 8
#: Above this many channels per group, GEMMs per group are efficient enough.
MAX_GROUP_CHANNELS = 64

R_NOT_GROUPED = "not grouped (groups {g})"
R_DEPTHWISE = "depthwise (groups == channels): the depthwise variant is simpler"
R_FEW_GROUPS = "{g} groups: vectors across groups shorter than %d lanes" % MIN_GROUPS
R_WIDE_GROUPS = "{icg}x{ocg} channels per group: per-group GEMMs are efficient (> %d)" % (
    MAX_GROUP_CHANNELS)


def _group_minor(a, g):
    """``[..., g*c]`` -> contiguous ``[..., c, g]``."""
    return np.ascontiguousarray(
        np.swapaxes(a.reshape(*a.shape[:-1], g, a.shape[-1] // g), -1, -2))


def _group_major(a):
    """``[..., c, g]`` -> ``[..., g*c]`` (a view where the caller copies anyway)."""
    return np.swapaxes(a, -1, -2).reshape(*a.shape[:-2], a.shape[-1] * a.shape[-2])


class GroupedDirect(Direct):
    """The loop nests of :mod:`numbaconv.kernels.cpu.grouped`."""

    variant = "grouped"

    def accepts(self, p):
        if p.g == 1:
            return R_NOT_GROUPED.format(g=p.g)
        if p.g == p.ic:
            return R_DEPTHWISE
        if p.g < MIN_GROUPS:
            return R_FEW_GROUPS.format(g=p.g)
        if max(p.icg, p.ocg) > MAX_GROUP_CHANNELS:
            return R_WIDE_GROUPS.format(icg=p.icg, ocg=p.ocg)
        return None

    def workspace_bytes(self, p, tiles):
        # group-minor copies of the operands and the result, plus per-thread dW partials
        xs, ys, ws = canonical_shapes(p)
        copies = {"fwd": (xs, ws, ys), "bwd_d": (ys, ws, xs), "bwd_w": (xs, ys, ws)}
        total = sum(math.prod(s) for s in copies[p.direction]) * itemsize(p)
        return total + super().workspace_bytes(p, tiles)

    def run(self, p, tiles, ops):
        from ..kernels.cpu import grouped as k
        from ..kernels.cpu.direct import reduce_partials

        xs, ys, ws = canonical_shapes(p)
        ct, g = p.compute_dtype, p.g
        gv = geo(p)
        w_shape = (*p.ksz, p.icg, p.ocg, g)
        if p.direction == "fwd":
            y = np.zeros((*ys[:-1], p.ocg, g), ct)
            # w [t, icg, g*ocg] -> [t, icg, ocg, g]
            k.fwd_grouped(_group_minor(ops["x"], g), _group_minor(ops["w"], g), y, gv)
            return _group_major(y)
        if p.direction == "bwd_d":
            dx = np.zeros((*xs[:-1], p.icg, g), ct)
            k.bwd_d_grouped(_group_minor(ops["dy"], g), _group_minor(ops["w"], g), dx, gv)
            return _group_major(dx)
        chunks = tiles["chunks"]
        part = np.zeros((chunks, *w_shape), ct)
        k.bwd_w_grouped(_group_minor(ops["x"], g), _group_minor(ops["dy"], g), part, gv)
        if chunks == 1:
            dw = part[0]
        else:
            dw = np.empty(w_shape, ct)
            reduce_partials(part.reshape(chunks, -1), dw.reshape(-1))
        return _group_major(dw)


STRATEGY = GroupedDirect()
