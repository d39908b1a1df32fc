"""The AMX entries: ``gemm[bf16-amx-taps]`` and ``gemm[bf16-amx]``.

``gemm[bf16-amx]`` runs the same products as :mod:`.bf16dot` (im2col of the source, the
filter packed into panels of pairs, stride phases for backward data, x transposed for a
1x1 weight gradient) with the AMX micro-kernel of :mod:`numbaconv.kernels.cpu.bf16dot`
(``amx_gemm``): 32 x 64 tiles of C summed by ``tdpbf16ps``, 16 times the multiply-adds of
one ``vdpbf16ps`` per instruction. At 0.6-1.5 TFLOP/s on two cores its GEMM leaves the
AVX512_BF16 entries and the float32 Winograd entry far behind (docs/performance.md,
"bfloat16"), so it declines only what ``gemm[bf16-dot]`` declines for its shape.
``gemm[bf16-amx-taps]`` (:class:`Bf16AmxTaps`, before it) reads each tap's tiles from the
zero-padded source where they lie, for the layers where im2col costs as much as the GEMM.
Both come first among the bfloat16 entries on a host with AMX (Intel Xeon from Sapphire
Rapids on) whose operating system grants the process AMX's state.
"""
import itertools
import math

import numpy as np

from . import canonical_shapes
from .. import memory
from .bf16dot import (BLOCKS_PER_THREAD, Bf16Dot, _bits, _packed_filter_t, _threads,
                      dot_guards, shape_guards)

R_AMX = "this host has no AMX tiles with bfloat16 products (amx-tile, amx-bf16)"
R_AMX_OS = "the operating system did not grant AMX's tile state to this process"

#: Pairs of the reduction per block and most rows per block: measured on 25088 x 576 x 64
#: to 2048^3 GEMMs (docs/performance.md, "bfloat16").
KC2 = 256
MAX_MC = 256


class Bf16Amx(Bf16Dot):
    variant = "bf16-amx"
    kc2 = KC2
    max_mc = MAX_MC
    #: im2col's rows whole 16-pair steps of the tiles (zeros past the taps): no step
    #: through the micro-kernel's zero-padded copies (a stem's 147 values: 160).
    kp_align = 32

    def kernels(self):
        from ..kernels.cpu.bf16dot import AMX
        return AMX

    def accepts(self, p):
        why = amx_guards(p)
        return why if why is not None else shape_guards(p)


def amx_guards(p):
    """The reason the AMX entries decline ``p`` for its dtype, groups or host, or None."""
    why = dot_guards(p)
    if why is not None:
        return why
    from ..kernels.cpu import _amx
    if not _amx.host_has_amx():
        return R_AMX
    if not _amx.request_amx():
        return R_AMX_OS
    return None


STRATEGY = Bf16Amx()


# -- gemm[bf16-amx-taps]: stride-1 correlations with the taps read in place ------------------

R_STRIDE = ("stride {s} (stride 1 only, but for backward data: each tap is then one row "
            "offset of the padded source)")
R_ONE_TAP = "a 1x1 kernel (no taps to read in place: gemm[bf16-amx] runs it as one GEMM)"
R_REDUCTION = ("{k} reduction channels (a multiple of 32 only: a tile reads 16 pairs of "
               "one pixel)")
R_RESULT = "{n} result channels (a multiple of 64 only: whole panels)"
R_ROWS_W = "{c} input channels (a multiple of 32 only: whole 32-row tiles of dW)"
#: Most reduction channels at stride 1, as measured: with B tile-major (``tile_major``) the
#: taps ran ResNet-50's 3x3 layers over 128 and 256 channels 1.2-1.9x as fast as
#: ``gemm[bf16-amx]``'s GEMM over im2col (forced, same process, forward and backward data;
#: row-major, 128 channels had been 1.05-1.2x slower). Strided backward data, whose phases
#: ``gemm[bf16-amx]`` runs as several small GEMMs over im2col, has no limit (ResNet-50's
#: strided 3x3 layers over 128-512 channels 1.08-1.46x faster here; docs/performance.md,
#: "bfloat16").
MAX_REDUCTION = 256
R_WIDE = ("{k} reduction channels (> {most}) at stride 1: gemm[bf16-amx]'s GEMM over im2col "
          "runs as fast")
#: Weight gradients over more channels (input or output) decline: there the float32
#: sums of every tap's 32 x 64 blocks pass through L2 and L3 once per part, and
#: ``gemm[bf16-amx]`` ran as fast or faster (ResNet-50, forced, same process, ms taps /
#: amx, B tile-major: 28 x 28 over 128 channels 2.05 / 3.68 and 3.74 / 9.08, 14 x 14 over
#: 256 2.79 / 2.25 and 4.25 / 4.33; docs/performance.md, "bfloat16").
MAX_WGRAD_CHANNELS = 128
R_WIDE_W = "weight gradient over {c} channels (> {most}): gemm[bf16-amx] runs it faster"
#: Most rows of the padded grid per output pixel: past it (small images with wide pads)
#: the grid's dropped rows cost more than ``gemm[bf16-amx]``'s im2col (docs/performance.md,
#: "bfloat16").
MAX_WASTE = 1.5
R_WASTE = ("the padded grid is {r:.2f}x the output pixels (> {most:.2f}): its pad rows and "
           "columns would cost more than im2col")


def _taps_axes(p):
    """Per axis (depth, height, width), the source's size, the output's size and the taps'
    offsets into the source (output pixel ``o`` reads source pixel ``o + a``): forward
    ``a = t*d - pad``, backward data ``a = pad - t*d``."""
    fwd = p.direction != "bwd_d"  # a weight gradient reads x as the forward pass does
    src, out = (p.isz, p.osz) if fwd else (p.osz, p.isz)
    axes = []
    for s, o, k, d, pb in zip(src, out, p.ksz, p.dilation, p.pad_begin):
        offs = [t * d - pb if fwd else pb - t * d for t in range(k)]
        axes.append((s, o, offs))
    return axes


def _jobs(p):
    """The stride-1 correlations a problem is made of: ``[(grid, step, start, offsets,
    taps)]``, each a grid of output pixels (per axis: its size, the step and start of its
    pixels in the result), the taps' offsets into the source per axis (grid pixel ``j``
    reads source pixel ``j + a``) and the taps' flat indices, kernel order. One job at
    stride 1; backward data at a larger stride has one per stride phase that a tap reaches
    (the phase's pixels ``c + s*j`` of dX meet dY pixel ``j + b0 - m*d`` through their
    ``m``-th tap: ``bf16dot._phase_axes``)."""
    if all(st == 1 for st in p.stride):
        axes = _taps_axes(p)
        out = tuple(o for _, o, _ in axes)
        return [(out, (1, 1, 1), (0, 0, 0), tuple(offs for _, _, offs in axes),
                 list(range(math.prod(p.ksz))))]
    from .bf16dot import _phase_axes
    jobs = []
    for q in itertools.product(*(range(st) for st in p.stride)):
        axes = _phase_axes(p, q)
        grid = tuple(-(-(i - qa) // st) for i, qa, st in zip(p.isz, q, p.stride))
        if any(n == 0 for _, _, n, _, _ in axes) or 0 in grid:
            continue
        offs = tuple(tuple(b0 - m * d for m in range(n)) for _, _, n, b0, d in axes)
        kh, kw = p.ksz[1], p.ksz[2]
        (d0, ds, dn, _, _), (h0, hs, hn, _, _), (w0, ws, wn, _, _) = axes
        taps = [(td * kh + th) * kw + tw for td in range(d0, d0 + dn * ds, ds)
                for th in range(h0, h0 + hn * hs, hs) for tw in range(w0, w0 + wn * ws, ws)]
        jobs.append((grid, tuple(p.stride), q, offs, taps))
    return jobs


def _padded_grid(p):
    """``(lead pads, padded sizes)`` per axis: the source zero-padded so that every tap of
    every job's output pixels reads inside it, and at least every job's grid."""
    src = p.osz if p.direction == "bwd_d" else p.isz
    jobs = _jobs(p)
    leads, sizes = [], []
    for ax in range(3):
        lo = min(min(j[3][ax]) for j in jobs)
        lead = max(0, -lo)
        size = max([src[ax] + lead] + [j[0][ax] - 1 + max(j[3][ax]) + lead + 1 for j in jobs]
                   + [j[0][ax] for j in jobs])
        leads.append(lead)
        sizes.append(size)
    return leads, sizes


def _waste(p):
    """Rows the jobs compute per output pixel."""
    _, sizes = _padded_grid(p)
    out = p.isz if p.direction == "bwd_d" else p.osz
    return len(_jobs(p)) * math.prod(sizes) / max(1, math.prod(out))


class Bf16AmxTaps(Bf16Dot):
    """Stride-1 layers as sums over taps of GEMMs whose tiles are read from the
    zero-padded source where they lie (:mod:`numbaconv.kernels.cpu.bf16amx`): no im2col
    matrix. Forward passes and backward data sum the taps into each output tile; weight
    gradients sum, per tap, x^T at the tap's offset times dY over the padded grid's
    pixels (x paired and transposed once at each parity, dY paired on the grid)."""

    variant = "bf16-amx-taps"

    def accepts(self, p):
        why = amx_guards(p)
        if why is not None:
            return why
        if p.direction != "bwd_d" and any(s != 1 for s in p.stride):
            return R_STRIDE.format(s="x".join(map(str, p.stride[3 - p.ndim:])))
        if math.prod(p.ksz) == 1:
            return R_ONE_TAP
        if p.direction == "bwd_w":
            if p.ic % 32:
                return R_ROWS_W.format(c=p.ic)
            if p.oc % 64:
                return R_RESULT.format(n=p.oc)
            if max(p.ic, p.oc) > MAX_WGRAD_CHANNELS:
                return R_WIDE_W.format(c=max(p.ic, p.oc), most=MAX_WGRAD_CHANNELS)
            w = _waste(p)
            return R_WASTE.format(r=w, most=MAX_WASTE) if w > MAX_WASTE else None
        red, res = (p.ic, p.oc) if p.direction == "fwd" else (p.oc, p.ic)
        if red % 32:
            return R_REDUCTION.format(k=red)
        if red > MAX_REDUCTION and all(st == 1 for st in p.stride):
            return R_WIDE.format(k=red, most=MAX_REDUCTION)
        if res % 64:
            return R_RESULT.format(n=res)
        w = _waste(p)
        if w > MAX_WASTE:
            return R_WASTE.format(r=w, most=MAX_WASTE)
        return None

    def tiles(self, p, machine):
        from ..kernels.cpu._amx import MR
        if p.direction == "bwd_w":
            return {"parts": _threads()}
        rows = p.mb * math.prod(_padded_grid(p)[1])
        tiles = -(-rows // MR)
        thr = _threads()
        nrb = max(BLOCKS_PER_THREAD * thr, -(-tiles // max(1, self.max_mc // MR)))
        return {"row_blocks": int(max(1, min(tiles, -(-nrb // thr) * thr)))}

    def workspace_bytes(self, p, tiles):
        from ..kernels.cpu._amx import MR
        leads, sizes = _padded_grid(p)
        if p.direction == "bwd_w":
            p2, x2 = _wgrad_pairs(p, leads, sizes)
            return ((2 * x2 + 2) * p.ic * 2 + 2 * p.ic * x2 * 4 + p2 * p.oc * 4
                    + (int(tiles["parts"]) + 1) * math.prod(p.ksz) * p.ic * p.oc * 4)
        red, res = (p.ic, p.oc) if p.direction == "fwd" else (p.oc, p.ic)
        rows = p.mb * math.prod(sizes)
        extra = max(0, _max_offset(p, leads, sizes)) + 2 * MR
        return (rows + extra) * red * 2 + math.prod(p.ksz) * red * res * 2

    def run(self, p, tiles, ops):
        from ..kernels.cpu import bf16amx as k
        from ..kernels.cpu._amx import MR, tile_major
        from ..kernels.cpu.bf16dot import NR, pack_pairs

        if p.direction == "bwd_w":
            return self._wgrad(p, tiles, ops)
        xs, ys, _ = canonical_shapes(p)
        fwd = p.direction == "fwd"
        src_op = ops["x"] if fwd else ops["dy"]
        bits = src_op.dtype == np.uint16
        src = _bits(src_op)
        taps = math.prod(p.ksz)
        red, res = (p.ic, p.oc) if fwd else (p.oc, p.ic)
        w3 = _bits(ops["w"]).reshape(taps, p.ic, p.oc)
        leads, sizes = _padded_grid(p)
        dp, hp, wp = sizes
        out = p.osz if fwd else p.isz
        per = dp * hp * wp
        rows = -(-p.mb * per // MR) * MR
        jobs = _jobs(p)
        offs = [np.array([((az + leads[0]) * hp + ay + leads[1]) * wp + ax + leads[2]
                          for az in oz for ay in oy for ax in ox], np.int64)
                for _, _, _, (oz, oy, ox), _ in jobs]
        padded = memory.empty((rows + int(max(o.max() for o in offs)) + MR, red), np.uint16)
        k.pad_source(np.ascontiguousarray(src).reshape(p.mb, *src.shape[1:4], red), padded,
                     np.array([dp, hp, wp, *leads], np.int64))
        whole = sum(math.prod(g) for g, *_ in jobs) == math.prod(out)
        d = (memory.empty if whole else np.zeros)((p.mb * math.prod(out), res), np.uint16)
        for (g, step, start, _, idx), o in zip(jobs, offs):
            if fwd:
                bp = memory.empty((res // NR, taps * red // 2, NR), np.uint32)
                pack_pairs(w3.reshape(taps * red, res), bp)
            else:
                bp = _packed_filter_t(w3, idx)
            bp = tile_major(bp)
            geo = np.array([rows, p.mb, dp, hp, wp, *g, *step, *start, *out], np.int64)
            k.taps(padded.view(np.uint32), o, bp, d, geo, int(tiles["row_blocks"]))
        shape = ys if fwd else xs
        if bits:
            return d.reshape(shape)
        # float32 operands (the tuner's): the bfloat16 result widened
        return (d.astype(np.uint32) << 16).view(np.float32).reshape(shape)

    def _wgrad(self, p, tiles, ops):
        """dW[t] = sum over the grid's pixels of x^T at tap t's row offset times dY (zeros
        on the grid's pad rows), in parts over the pixels added in order."""
        from ..kernels.cpu import bf16amx as k

        _, ys, ws = canonical_shapes(p)
        bits = ops["x"].dtype == np.uint16
        x, dy = _bits(ops["x"]), _bits(ops["dy"])
        leads, sizes = _padded_grid(p)
        dp, hp, wp = sizes
        (_, _, oz), (_, _, oy), (_, _, ox) = _taps_axes(p)
        offs = np.array([((az + leads[0]) * hp + ay + leads[1]) * wp + ax + leads[2]
                         for az in oz for ay in oy for ax in ox], np.int64)
        p2, x2 = _wgrad_pairs(p, leads, sizes)
        xp = memory.empty((2 * x2 + 2, p.ic), np.uint16)
        k.pad_source(np.ascontiguousarray(x).reshape(p.mb, *p.isz, p.ic), xp,
                     np.array([dp, hp, wp, *leads], np.int64))
        xt0 = memory.empty((p.ic, x2), np.uint32)
        xt1 = memory.empty((p.ic, x2), np.uint32)
        k.pair_source_t(xp, xt0, xt1)
        dyp = memory.empty((p2, p.oc), np.uint32)
        geo = np.array([2 * p2, p.mb, dp, hp, wp, *p.osz], np.int64)
        k.pair_grid(np.ascontiguousarray(dy).reshape(-1, p.oc), dyp, geo)
        parts = int(tiles["parts"])
        c = np.zeros((parts, len(offs), p.ic, p.oc), np.float32)
        k.wgrad(xt0, xt1, dyp, offs, c)
        dw = c[0]
        for i in range(1, parts):  # in order: the same bits call after call
            dw += c[i]
        return (_bits(dw) if bits else dw).reshape(ws)


def _wgrad_pairs(p, leads, sizes):
    """``(pairs of the grid, a multiple of 16; pairs of x^T)``: x^T reaches past the grid
    by the largest tap offset."""
    rows = p.mb * math.prod(sizes)
    p2 = -(-rows // 32) * 16
    return p2, p2 + _max_offset(p, leads, sizes) // 2 + 16


def _max_offset(p, leads, sizes):
    """The largest row offset of any job's tap into the padded source."""
    _, hp, wp = sizes
    return max(((max(oz) + leads[0]) * hp + max(oy) + leads[1]) * wp + max(ox) + leads[2]
               for _, _, _, (oz, oy, ox), _ in _jobs(p))


TAPS = Bf16AmxTaps()
