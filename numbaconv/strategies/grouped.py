"""Direct strategy, grouped variant: few channels per group, vectorised across groups.

The source operands are copied once to the group-minor layout of
:mod:`numbaconv.kernels.cpu.grouped` (``[nvg, ..., C/g, VL]``: vectors across groups, the
last one padded with zero lanes; the source of a gather padded with zeros along ``w``), and
the register-blocked kernels run there; the gathers (forward and backward data) with a 2-D
or 1-D filter copy their source block by block instead, each block's rows into a buffer
that stays in L2. Forward and backward data store their tiles straight into the
channels-last result; backward weights sums its per-thread partials and transposes them
back in one pass. Every operand the micro-kernels read starts on a 64-byte boundary.
"""
import math

import numpy as np

from . import canonical_shapes, geo, itemsize, result_dtype, w_padding
from ._gemm_common import gemm_guard, result_columns
from .. import memory
from .direct import Direct

#: Below this many groups the group-minor vector is too short to pay for the transposes,
#: where per-group GEMMs take the problem; where they decline it too (fewer than 16
#: channels per group), the grouped kernels are still faster than the plain loop nest
#: (docs/performance.md, "Few groups of few channels"), unless the channels a gather
#: tile runs along number fewer than ``MIN_TILE_CHANNELS`` (the tiles then go pixel by
#: pixel).
MIN_GROUPS = 8
MIN_TILE_CHANNELS = 3
#: Above this many channels per group, GEMMs per group are efficient enough.
MAX_GROUP_CHANNELS = 64
#: Backward weights sums each tile over blocks of output pixels whose x and dy vectors (one
#: vector of groups) take at most this many bytes, so that they stay in L1 while every tile
#: of the tap passes over them; and of at least ``BWD_W_MIN_PIXELS`` pixels (a tile's
#: accumulators are loaded and stored once per block and tap).
BWD_W_BLOCK_BYTES = 24 * 1024
#: The gathers (forward and backward data) with a 2-D or 1-D filter copy their source (x,
#: dY) to group-minor block by block: per block of at most this many rows of the result
#: (of one image), the source rows its taps read, into a buffer of at most
#: ``GATHER_BLOCK_BYTES`` (it stays in L2 while the block's rows gather from it), in at
#: least ``GATHER_MIN_BLOCKS`` blocks per core.
GATHER_BLOCK_ROWS = 8
GATHER_BLOCK_BYTES = 512 * 1024
GATHER_MIN_BLOCKS = 4
BWD_W_MIN_PIXELS = 32

R_NOT_GROUPED = "not grouped (groups {g})"
R_DEPTHWISE = "depthwise (groups == channels): the depthwise variant is simpler"
R_FEW_GROUPS = ("{g} groups: vectors across groups shorter than %d lanes, and the "
                "per-group GEMMs take it" % MIN_GROUPS)
R_FEW_TILE_CHANNELS = ("{g} groups of {c} {what} channels (< %d): pixel-by-pixel tiles over "
                       "vectors of fewer than %d groups" % (MIN_TILE_CHANNELS, MIN_GROUPS))
R_WIDE_GROUPS = "{icg}x{ocg} channels per group: per-group GEMMs are efficient (> %d)" % (
    MAX_GROUP_CHANNELS)


def _kernels():
    from ..kernels.cpu import grouped
    return grouped


def _vectors(p):
    """``(nvg, VL)``: vectors across the groups, lanes per vector. The full register width,
    unless half of it (on 64-byte-vector hosts only, where the two halves of a 512-bit FMA
    run as two 256-bit ones anyway) holds the groups in fewer lanes: 8 groups in float32
    fill a 256-bit vector and half of a 512-bit one; half vectors run ResNeXt-3D's 8-group
    layers 1.9-3.3x faster (docs/performance.md, "Numbers behind the constants", grouped
    half-width vectors). 16 groups stay on full vectors, where two half vectors are slower.

    float64 takes the same widths: the micro-kernel is an LLVM function of its own, never
    inlined, so the float64 gather tile's accumulators stay in registers on full 512-bit
    vectors (see ``kernels/cpu/grouped.py``)."""
    k = _kernels()
    item = itemsize(p)
    vbytes = k.VECTOR_BYTES
    if vbytes == 64:
        half = k.HALF_BYTES
        if (k.group_vectors(p.g, item, half) * k.lanes(item, half)
                < k.group_vectors(p.g, item) * k.lanes(item)):
            vbytes = half
    return k.group_vectors(p.g, item, vbytes), k.lanes(item, vbytes)


def _bwd_d_phases(p):
    """Backward data along w, per stride phase ``q`` (input pixels ``q + s*j``): the taps
    that reach it, as ``(dy offset, tap)`` in the order of the offsets (pixel ``j`` reads dy
    pixel ``j + offset``); and ``(left, width)`` of the zero-padded dy that every tap of
    every pixel reads inside."""
    iw, kw, ow, sw, dw, pw = p.isz[2], p.ksz[2], p.osz[2], p.stride[2], p.dilation[2], \
        p.pad_begin[2]
    phases, lo, hi = [], 0, ow - 1
    for q in range(sw):
        taps = sorted(((q + pw - t * dw) // sw, t) for t in range(kw)
                      if (q + pw - t * dw) % sw == 0)
        phases.append(taps)
        if q < iw and taps:
            lo = min(lo, taps[0][0])
            hi = max(hi, -(-(iw - q) // sw) - 1 + taps[-1][0])
    return phases, -lo, hi - lo + 1


def _to_group_minor(a, g, vec, left=0, width=None):
    """``[mb, d, h, w, g*C]`` -> zero-padded ``[nvg, mb, d, h, width, C, VL]`` (float16
    bits, uint16, widened to float32 on the way)."""
    width = a.shape[3] if width is None else width
    dtype = np.float32 if a.dtype == np.uint16 else a.dtype
    out = memory.empty((vec[0], *a.shape[:3], width, a.shape[4] // g, vec[1]), dtype,
                       offset=0)
    _kernels().to_group_minor(np.ascontiguousarray(a), out, np.int64(g), np.int64(left))
    return out


def _fwd_filter(w, p, vec):
    """``[kd, kh, kw, icg, g*ocg]`` -> ``[nvg, kd, kh, kw, icg, ocg, VL]``."""
    out = memory.empty((vec[0], math.prod(p.ksz) * p.icg * p.ocg * vec[1]), w.dtype, offset=0)
    _kernels().pack_filter(np.ascontiguousarray(w), out, np.int64(0),
                           np.arange(p.ksz[2], dtype=np.int64), np.int64(p.g), False,
                           np.int64(vec[1]))
    return out


def _src_rows(p, rb):
    """The most rows (along h) of a gather's source that a block of ``rb`` rows of its
    result reads: of dY for backward data, of x for the forward pass."""
    kh, sh, dh = p.ksz[1], p.stride[1], p.dilation[1]
    if p.direction == "bwd_d":
        return min(p.osz[1], (rb - 1 + (kh - 1) * dh) // sh + 1)
    return min(p.isz[1], (rb - 1) * sh + (kh - 1) * dh + 1)


def _block_rows(p, cores):
    """Rows of the result per block of a blocked gather (:func:`kernels.cpu.grouped.
    bwd_d_fused`, :func:`~kernels.cpu.grouped.fwd_fused`): ``GATHER_BLOCK_ROWS``, fewer
    where that leaves fewer than ``GATHER_MIN_BLOCKS`` blocks per core, or where the
    block's source rows in group-minor take more than ``GATHER_BLOCK_BYTES``. 0 for 3-D
    filters: every block would copy the source planes of all its taps along d, each
    plane then copied ``kd`` times (ResNeXt-3D's backward data ran 6-16% slower so): the
    source is copied to group-minor once, whole, first."""
    if p.ksz[0] > 1:
        return 0
    if p.direction == "bwd_d":
        slabs, rows, wp, c = p.mb * p.isz[0], p.isz[1], _bwd_d_phases(p)[2], p.ocg
    else:
        slabs, rows, wp, c = p.mb * p.osz[0], p.osz[1], w_padding(p)[1], p.icg
    row = wp * c * math.prod(_vectors(p)) * itemsize(p)
    rb = GATHER_BLOCK_ROWS
    while rb > 1 and (slabs * -(-rows // rb) < GATHER_MIN_BLOCKS * cores
                      or _src_rows(p, rb) * row > GATHER_BLOCK_BYTES):
        rb -= 1
    return rb


def _bwd_d_filter(w, p, vec, phases, left):
    """The backward-data filter and tables of :func:`kernels.cpu.grouped.bwd_d_gm`: per
    phase, its taps along w in the order of their dy offsets, ``[kd, kh, nq, ocg, icg, VL]``
    (one vector of groups after the other); ``qtab`` and the runs of taps whose dy pixels
    follow each other."""
    per_tap = p.ksz[0] * p.ksz[1] * p.icg * p.ocg * vec[1]
    wq = memory.empty((vec[0], max(1, sum(len(t) for t in phases) * per_tap)), w.dtype,
                      offset=0)
    qtab, runs, pos = [], [], 0
    for taps in phases:
        qtab.append((pos, len(taps), len(runs)))
        first = len(runs)
        for j, (off, _) in enumerate(taps):
            if len(runs) > first and off == runs[-1][0] - left + runs[-1][2]:
                runs[-1][2] += 1
            else:
                runs.append([off + left, j, 1])
        if taps:
            _kernels().pack_filter(np.ascontiguousarray(w), wq, np.int64(pos),
                                   np.array([t for _, t in taps], np.int64), np.int64(p.g),
                                   True, np.int64(vec[1]))
            pos += len(taps) * per_tap
    return (wq, np.array(qtab, np.int64).reshape(-1, 3),
            np.array(runs, np.int64).reshape(-1, 3))


class GroupedDirect(Direct):
    """The register-blocked loop nests of :mod:`numbaconv.kernels.cpu.grouped`."""

    variant = "grouped"
    compile_heavy = True

    def accepts(self, p):
        if p.g == 1:
            return R_NOT_GROUPED.format(g=p.g)
        if p.g == p.ic:
            return R_DEPTHWISE
        if p.g < MIN_GROUPS:
            if gemm_guard(p) is None:
                return R_FEW_GROUPS.format(g=p.g)
            # forward and backward data gather along their result's channels
            c = result_columns(p)
            if p.direction != "bwd_w" and c < MIN_TILE_CHANNELS:
                what = "input" if p.direction == "bwd_d" else "output"
                return R_FEW_TILE_CHANNELS.format(g=p.g, c=c, what=what)
        if max(p.icg, p.ocg) > MAX_GROUP_CHANNELS:
            return R_WIDE_GROUPS.format(icg=p.icg, ocg=p.ocg)
        return None

    def tiles(self, p, machine):
        if p.direction == "bwd_w":
            rows = p.mb * p.osz[0] * p.osz[1]
            per_pixel = (p.icg + p.ocg) * _vectors(p)[1] * itemsize(p)
            pixels = max(BWD_W_MIN_PIXELS, BWD_W_BLOCK_BYTES // per_pixel)
            cols = max(1, min(p.osz[2], pixels))
            return {"chunks": max(1, min(machine.cores, rows)), "block_cols": cols,
                    "block_rows": max(1, pixels // cols)}
        if p.direction == "bwd_d":
            return {"rows": p.mb * p.isz[0] * p.isz[1],
                    "block_rows": _block_rows(p, machine.cores),
                    "threads": max(1, machine.cores)}
        return {"rows": p.mb * p.osz[0] * p.osz[1],
                "block_rows": _block_rows(p, machine.cores),
                "threads": max(1, machine.cores)}

    def workspace_bytes(self, p, tiles):
        gp = math.prod(_vectors(p))
        taps = math.prod(p.ksz)
        mb, (id_, ih, _), (od, oh, ow) = p.mb, p.isz, p.osz
        x_gm = mb * id_ * ih * w_padding(p)[1] * p.icg * gp
        # the gathers' per-thread block buffers, in source rows (bwd_w's block_rows are
        # its own)
        rb = int(tiles.get("block_rows", 0)) if p.direction != "bwd_w" else 0
        buffer_rows = tiles.get("threads", 1) * p.ksz[0] * _src_rows(p, rb) if rb else 0
        if p.direction == "fwd":  # x in group-minor: whole, or a block per thread
            if rb:
                x_gm = buffer_rows * w_padding(p)[1] * p.icg * gp
            n = x_gm + taps * p.icg * p.ocg * gp
        elif p.direction == "bwd_d":  # dY in group-minor: whole, or a block per thread
            rows = buffer_rows if rb else mb * od * oh
            n = rows * _bwd_d_phases(p)[2] * p.ocg * gp + taps * p.icg * p.ocg * gp
        else:
            n = (x_gm + mb * od * oh * ow * p.ocg * gp
                 + tiles.get("chunks", 1) * taps * p.icg * p.ocg * gp)
        return n * itemsize(p)

    def half_operands(self, p, tiles):
        """The copies to group-minor widen float16 data as they transpose it; forward and
        backward data round their tiles to float16 as they store them. The filter and
        the weight gradient (small, reduced from float32 partials) stay float32."""
        return frozenset({"fwd": ("x", "result"), "bwd_d": ("dy", "result"),
                          "bwd_w": ("x", "dy")}[p.direction])

    def run(self, p, tiles, ops):
        k = _kernels()
        xs, ys, ws = canonical_shapes(p)
        ct, g, vec = np.dtype(p.compute_dtype), p.g, _vectors(p)
        gv = geo(p)
        if p.direction == "fwd":
            left, width = w_padding(p)
            y = memory.empty(ys, result_dtype(ops["x"], ct))
            wf = _fwd_filter(ops["w"], p, vec)
            rb = int(tiles.get("block_rows", 0))
            if rb:
                k.fwd_fused(np.ascontiguousarray(ops["x"]), wf, y, gv, np.int64(vec[1]),
                            np.int64(left), np.int64(width), np.int64(rb))
            else:
                k.fwd_gm(_to_group_minor(ops["x"], g, vec, left, width), wf, y, gv,
                         np.int64(left))
            return y
        if p.direction == "bwd_d":
            phases, left, width = _bwd_d_phases(p)
            wq, qtab, runs = _bwd_d_filter(ops["w"], p, vec, phases, left)
            dx = memory.empty(xs, result_dtype(ops["dy"], ct))
            rb = int(tiles.get("block_rows", 0))
            if rb:
                k.bwd_d_fused(np.ascontiguousarray(ops["dy"]), wq, dx, gv, qtab, runs,
                              np.int64(vec[1]), np.int64(left), np.int64(width),
                              np.int64(rb))
            else:
                k.bwd_d_gm(_to_group_minor(ops["dy"], g, vec, left, width), wq, dx, gv,
                           qtab, runs)
            return dx
        left, width = w_padding(p)
        xp = _to_group_minor(ops["x"], g, vec, left, width)
        dyg = _to_group_minor(ops["dy"], g, vec)
        chunks = int(tiles["chunks"])
        part = memory.empty((chunks, vec[0], *p.ksz, p.icg, p.ocg, vec[1]), ct, offset=0)
        part.fill(0)
        k.bwd_w_gm(xp, dyg, part, gv, np.int64(left), np.int64(tiles["block_rows"]),
                   np.int64(tiles["block_cols"]))
        dw = np.empty(ws, ct)
        k.reduce_w(part.reshape(chunks, vec[0], -1, p.icg, p.ocg, vec[1]),
                   dw.reshape(-1, p.icg, p.oc))
        return dw


STRATEGY = GroupedDirect()
