"""GEMM strategy, grouped variant: backward data of grouped layers whose groups are square
and one vector of channels wide, as register tiles across several groups.

``direct[grouped]`` vectorises across groups: it copies dY to a group-minor layout (lane =
group) and transposes its tiles back into dX. ``gemm[implicit]`` runs each group as a GEMM
of its own, whose register tile has one vector per row when the group has 16 float32
channels (ResNeXt's third stage): 6 multiply-adds per broadcast and per-group calls. Here
(:mod:`numbaconv.kernels.cpu.ggemm`) a register tile is ``MR`` pixels x ``NG`` groups x
``NC`` vectors of channels, over ``gemm[regions]``' exact region tables: dY is read and dX
written in place, channels-last, with nothing copied but the filter.
"""
import math

import numpy as np

from . import Strategy, itemsize
from ._gemm_common import (group_problem, region_boxes, region_tables, stride_phases,
                           unpadded)
from .. import memory

#: Row tiles per parallel item in regions that sum every tap (fewer taps: more tiles);
#: each item runs once per block of groups.
BLOCK_TILES = 16
#: Most vectors per group's channels: one. Groups of two vectors, and of half a vector,
#: ran slower than ``direct[grouped]`` (docs/performance.md, "Grouped backward data").
MAX_VECTORS = 1
#: Strided layers only over at most this many dY pixels per image: over larger ones
#: ``direct[grouped]``'s copy to group-minor was as fast or faster (same section).
MAX_STRIDED_PIXELS = 256

R_DIRECTION = "the grouped GEMM variant is backward data only"
R_NOT_GROUPED = "one group"
R_DEPTHWISE = "depthwise (one channel per group): the depthwise entries' case"
R_HALF = ("float16: direct[grouped] widens float16 bits in its own copies (here the backend "
          "would widen dY and round dX in passes of their own)")
R_LANES = ("{c} -> {k} channels per group: not square groups of {nv} whole vector(s) of "
           "{lanes} lanes")
R_STRIDED = ("stride {s} over {px} dY pixels per image (> %d): direct[grouped]'s copy "
             "to group-minor was as fast or faster" % MAX_STRIDED_PIXELS)
R_HOST = ("{vb}-byte vectors: measured only with 64-byte ones (AVX-512), where a tile of 6 "
          "pixels x 4 groups holds 24 accumulators")
#: Vector widths (bytes) whose hosts take this entry: it was measured on AVX-512 only; with
#: 32-byte vectors a tile holds 2 groups (12 accumulators), not measured against
#: direct[grouped]. The kernels themselves run at any width (the tests patch this).
VECTOR_BYTES_MEASURED = (64,)


def _kernels():
    from ..kernels.cpu import ggemm
    return ggemm


def vectors(p):
    """Vectors of a group's channels (input and output alike), or None where the groups
    are not square or not whole vectors."""
    k = _kernels()
    vl = k.lanes(itemsize(p))
    if p.icg != p.ocg or p.icg % vl:
        return None
    return p.icg // vl


class GroupedGemm(Strategy):
    name = "gemm"
    variant = "grouped"
    compile_heavy = True
    directions = ("bwd_d",)

    def accepts(self, p):
        if p.direction != "bwd_d":
            return R_DIRECTION
        if p.g == 1:
            return R_NOT_GROUPED
        if p.g == p.ic:
            return R_DEPTHWISE
        vb = _kernels().VECTOR_BYTES
        if vb not in VECTOR_BYTES_MEASURED:
            return R_HOST.format(vb=vb)
        if p.dtype == "float16":
            return R_HALF
        nc = vectors(p)
        if nc is None or nc > MAX_VECTORS:
            return R_LANES.format(c=p.icg, k=p.ocg, lanes=_kernels().lanes(itemsize(p)),
                                  nv=MAX_VECTORS)
        px = math.prod(p.osz)
        if max(p.stride) > 1 and px > MAX_STRIDED_PIXELS:
            return R_STRIDED.format(s=max(p.stride), px=px)
        return None

    def tiles(self, p, machine):
        nc = vectors(p)
        return {"vectors": nc, "groups": _kernels().groups_per_tile(nc),
                "block_tiles": BLOCK_TILES}

    def workspace_bytes(self, p, tiles):
        from ..kernels.cpu import igemm
        q = group_problem(p)
        regions = max(len(region_boxes(q, grid, taps, True)[0])
                      for _, grid, taps in stride_phases(q))
        return (math.prod(p.ksz) * p.icg * p.oc + regions * igemm.MR * p.ic) * itemsize(p)

    def run(self, p, tiles, ops):
        k = _kernels()
        ct = np.dtype(p.compute_dtype)
        dy = np.ascontiguousarray(ops["dy"])
        q = group_problem(p)
        w = np.ascontiguousarray(ops["w"]).reshape(math.prod(p.ksz), q.ic, p.g, q.oc)
        dx = memory.empty((p.mb, *p.isz, p.ic), ct, offset=0)
        nc = int(tiles["vectors"])
        for idx, offs, rtab, pairs, items, padded in _tables(p, int(tiles["block_tiles"])):
            # the phase's filter, [g, taps, K, C]: a group's tap rows one after the other
            bp = np.ascontiguousarray(w[idx].transpose(2, 0, 3, 1))
            work = memory.empty(max(1, len(rtab)) * k.MR * p.ic, ct, offset=0)
            if len(padded):  # the padded rows' C offsets: into this call's scratch
                offs = offs.copy()
                offs.reshape(-1)[padded] += (work.ctypes.data - dx.ctypes.data) // ct.itemsize
            k.bwd_d(dy, bp, dx, offs, items, rtab, pairs, nc, work)
        return dx

    def numba_parallel(self, p, tiles):
        return True


#: The region tables of recent problems (Python work of tens of microseconds per region).
_TABLES = {}


def _tables(p, block_tiles):
    """Per stride phase with pixels: ``(tap indices, offs, rtab, pairs, items, padded)`` of
    :func:`~numbaconv.strategies._gemm_common.region_tables` for group 0 of the whole arrays (dY
    itself as the frame, rows of all channels), items of about ``block_tiles`` full tiles'
    work."""
    key = (p, block_tiles)
    if key not in _TABLES:
        from ..kernels.cpu import igemm
        assert igemm.MR == _kernels().MR
        q = group_problem(p)
        out = []
        for qq, grid, taps in stride_phases(q):
            if q.mb * math.prod(grid) == 0:
                continue
            # exact boxes: each tap reaches inside dY for all of a box's pixels or for none
            # (a box that no tap reaches stores zeros)
            regions = region_boxes(q, grid, taps, True)[0]
            offs, rtab, pairs, _, items, padded = region_tables(
                q, qq, unpadded(q), (p.oc, p.ic, 0, 0), regions, taps, p.ic,
                block_tiles * len(taps), q.ic)
            out.append((np.array([t for t, _ in taps], np.int64), offs, rtab, pairs, items,
                        padded))
        if len(_TABLES) >= 64:
            _TABLES.clear()
        _TABLES[key] = tuple(out)
    return _TABLES[key]


STRATEGY = GroupedGemm()
