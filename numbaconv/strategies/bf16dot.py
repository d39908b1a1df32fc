"""``gemm[bf16-dot]``: bfloat16 problems as one GEMM on AVX512_BF16's dot products.

Each direction is one product ``C = A @ B`` of bfloat16 matrices summed in float32
(:mod:`numbaconv.kernels.cpu.bf16dot`) and rounded to bfloat16 once, by the GEMM's tiles as
their reductions end (no float32 result is written and read again):

* forward:          ``Y [M, K] = im2col(X) [M, taps*C] @ W [taps*C, K]``
* backward data:    ``dX [M', C] = im2col~(dY) [M', taps*K] @ W~ [taps*K, C]``, at stride 1:
  the taps flipped (pixel ``i`` meets ``dY[i + pad - t*d]``) and ``W~[t*K + k, c] = W[t, c, k]``;
  at a larger stride one such product per stride phase (the pixels ``q + s*j`` of dX), over
  the taps that reach that phase (:func:`_phase_axes`), written into the phase's pixels
* backward weights: ``dW [taps*C, K] = im2col(X)^T [taps*C, M] @ dY [M, K]``

with ``M`` the output pixels of the batch and ``M'`` the input pixels. The operands arrive
as bfloat16 bits (``bf16_operands``): no widening pass, and half the bytes of float32
through every copy. One group only.
"""
import math

import numpy as np

from . import Strategy, canonical_shapes
from ._gemm_common import identity, stride_phases
from .. import memory

#: Backward data declines fewer result channels than this, weight gradients fewer output
#: channels or rows (taps x input channels), and stems of at most ``STEM_CHANNELS`` input
#: channels: there the float32 entries on widened operands were measured faster
#: (docs/performance.md, "bfloat16").
MIN_DATA_CHANNELS = 32
STEM_CHANNELS = 4

R_DTYPE = "{dtype}, not bfloat16 (the dot products take bfloat16 pairs)"
R_HOST = "this host has no AVX512_BF16 (vdpbf16ps)"
R_GROUPS = "{g} groups (one group only)"
R_NARROW_D = ("backward data into {c} channels (< %d): most of every 64-column register "
              "tile would be idle; the float32 entries on widened operands win"
              % MIN_DATA_CHANNELS)
R_STEM_W = ("weight gradient of {c} input channels (<= %d, a stem): the float32 patch "
            "GEMM on widened operands wins" % STEM_CHANNELS)
R_NARROW_W = ("weight gradient into {k} channels (< %d): most of every 64-column register "
              "tile would be idle; the float32 entries on widened operands win"
              % MIN_DATA_CHANNELS)
R_FEW_ROWS_W = ("weight gradient of {r} rows (taps x input channels < %d): the float32 "
                "entries on widened operands win" % MIN_DATA_CHANNELS)
R_WINOGRAD = ("3x3 at stride 1 over {c} channels ({lo} to {hi}), forward or weight "
              "gradient: the float32 Winograd entry's fewer multiplies win")

#: 2-D 3x3 forward passes and weight gradients at stride 1 whose smaller channel count
#: lies in this range are left to the Winograd entry (on widened operands), measured
#: faster there on ResNet-50's 56x56 and 28x28 layers; from 256 channels (14x14) this entry
#: wins. Backward data stays here (as fast or faster, and without Winograd's rounding;
#: docs/performance.md, "bfloat16"). Below 64 channels Winograd declines anyway.
WINOGRAD_CHANNELS = (64, 255)

#: Pairs of the reduction per block: a packed panel of B (``kc2 x NR`` words, 32 KiB)
#: stays in L1 while every row tile of a block meets it.
KC2 = 128
#: Most rows per block shared out to a thread, and blocks per thread at least.
MAX_MC = 192
BLOCKS_PER_THREAD = 4
#: A weight gradient's reduction split into parts (:func:`_split_reduction`): blocks of the
#: reduction per part at least, and the parts' float32 sums at most (bytes).
MIN_PART = 4
SPLIT_BYTES = 8 << 20
#: Most rows per block of a weight gradient whose reduction is split: up to this many rows
#: make one block, which pairs B as it goes (A's block of the reduction, 192 KiB, in L2).
SPLIT_MAX_MC = 384
#: A weight gradient's reduction is split (:func:`_split_reduction`) where its rows make
#: fewer than ``BLOCKS_PER_THREAD`` blocks per thread of ``MIN_BLOCK_TILES`` register
#: tiles, or where it is at least ``MIN_SPLIT_PAIRS`` pairs of pixels long: the parts'
#: float32 sums (added serially after) pay only over a long reduction, whose x a 1x1
#: layer's GEMM then transposes as it goes (ResNet-50's 56 x 56 layers, 12544 pairs: 1.2-
#: 1.75x as fast split); over 3136 pairs (28 x 28) blocks of rows alone ran 1.05-1.2x as
#: fast (docs/performance.md, "bfloat16").
MIN_BLOCK_TILES = 2
MIN_SPLIT_PAIRS = 8192


def host_has_bf16():
    from ..kernels.cpu._host import FEATURES
    return "avx512bf16" in FEATURES


def dot_guards(p):
    """The reason the AVX512_BF16 dot-product entries (``gemm[bf16-dot]``,
    ``gemm[bf16-regions]``, ``gemm[bf16-wgrad]``) share to decline ``p``, or None:
    another dtype, a host without the instruction, groups."""
    if p.dtype != "bfloat16":
        return R_DTYPE.format(dtype=p.dtype)
    if not host_has_bf16():
        return R_HOST
    if p.g != 1:
        return R_GROUPS.format(g=p.g)
    return None


def shape_guards(p):
    """The reason the bfloat16 GEMM entries (``gemm[bf16-dot]``, ``gemm[bf16-amx]``)
    decline ``p`` for its shape, or None: few result channels (most of every 64-column
    tile idle), a stem's weight gradient, few rows of a weight gradient."""
    if p.direction == "bwd_d" and p.ic < MIN_DATA_CHANNELS:
        return R_NARROW_D.format(c=p.ic)
    if p.direction == "bwd_w":
        if p.ic <= STEM_CHANNELS:
            return R_STEM_W.format(c=p.ic)
        if p.oc < MIN_DATA_CHANNELS:
            return R_NARROW_W.format(k=p.oc)
        if _taps(p) * p.ic < MIN_DATA_CHANNELS:
            return R_FEW_ROWS_W.format(r=_taps(p) * p.ic)
    return None


def _taps(p):
    return math.prod(p.ksz)


def _im2col_geo(p, backward_data):
    """The int64 geometry :func:`im2col` takes: strides, dilations, offsets, kernel."""
    if backward_data:  # source pixel i + pad - t*d (stride 1)
        return np.array([1, 1, 1, *p.dilation, *p.pad_begin, *p.ksz], np.int64), -1
    return np.array([*p.stride, *p.dilation, *(-b for b in p.pad_begin), *p.ksz],
                    np.int64), 1


def _phase_axes(p, q):
    """Per axis, for stride phase ``q`` of backward data: ``(t0, step, n, b0, d)``: the taps
    ``t0 + m*step`` (``m < n``) reach the phase, and its pixel ``j`` meets dY pixel
    ``j + b0 - m*d`` through tap ``m`` (``n`` 0: no tap reaches it)."""
    out = []
    for qa, pb, k, dil, s in zip(q, p.pad_begin, p.ksz, p.dilation, p.stride):
        ts = [t for t in range(k) if (qa + pb - t * dil) % s == 0]
        if not ts:
            out.append((0, 1, 0, 0, 0))
            continue
        step = ts[1] - ts[0] if len(ts) > 1 else 1
        out.append((ts[0], step, len(ts), (qa + pb - ts[0] * dil) // s, step * dil // s))
    return out


def _transposes_x(p, tiles):
    """Whether a weight gradient's GEMM transposes x itself, block by block of the
    reduction: a 1x1 layer whose operands are the arrays themselves (``identity``: stride
    1, no pads) and whose channels are one block of rows (over several blocks of rows the
    separate transpose measured faster; docs/performance.md, "bfloat16")."""
    return (p.direction == "bwd_w" and identity(p) and int(tiles["row_blocks"]) == 1
            and int(tiles.get("panel_blocks", 1)) == 1)


def _threads():
    from ..runtime import threads
    return max(1, threads())


def _row_blocks(rows, mr=None, max_mc=MAX_MC):
    """Blocks of rows of A shared out to the threads (``nrb``): at least
    ``BLOCKS_PER_THREAD`` per thread and at most ``max_mc`` rows each, a multiple of the
    threads (the parallel loop hands each thread an equal count), at most one per register
    tile of ``mr`` rows (``bf16dot.MR`` unless given); :func:`bf16dot.gemm` cuts the tiles
    among them as evenly as they go."""
    from ..kernels.cpu.bf16dot import MR
    mr = mr or MR
    thr = _threads()
    tiles = -(-rows // mr)
    nrb = max(BLOCKS_PER_THREAD * thr, -(-tiles // max(1, max_mc // mr)))
    return int(max(1, min(tiles, -(-nrb // thr) * thr)))


def _split_reduction(rows, k2, n, mr=None, kc2=KC2, max_mc=MAX_MC):
    """``(nrb, ks)`` for a weight gradient's ``rows`` (``taps*C``) over ``k2`` pairs of
    pixels into ``n`` columns: where blocks of up to ``SPLIT_MAX_MC`` rows are fewer than
    ``BLOCKS_PER_THREAD`` per thread and either the rows make too few blocks of
    ``MIN_BLOCK_TILES`` tiles or the reduction is ``MIN_SPLIT_PAIRS`` pairs or longer,
    those blocks, each reduction split into ``ks``
    parts (each at least ``MIN_PART`` blocks of ``KC2`` pairs, every part's float32 sums
    together at most ``SPLIT_BYTES``; a count of blocks that is a multiple of the threads
    where the limits allow); else ``(_row_blocks(rows), 1)``. ``mr``, ``kc2``, ``max_mc``:
    the kernel's register tile rows, block of the reduction and rows per block."""
    from ..kernels.cpu.bf16dot import MR
    mr = mr or MR
    thr = _threads()
    want = BLOCKS_PER_THREAD * thr
    tiles = -(-rows // mr)
    nrb = -(-tiles // max(1, SPLIT_MAX_MC // mr))
    if nrb >= want or (tiles >= want * MIN_BLOCK_TILES and k2 < MIN_SPLIT_PAIRS):
        return _row_blocks(rows, mr, max_mc), 1
    most = min(max(1, k2 // (MIN_PART * kc2)), max(1, SPLIT_BYTES // (4 * rows * n)))
    ks = min(-(-want // nrb), most)
    while ks < most and (nrb * ks) % thr:
        ks += 1
    return (int(nrb), int(ks)) if ks > 1 else (_row_blocks(rows, mr, max_mc), 1)


def _filter_t(w3):
    """Backward data's B, ``W~[t*K + k, c] = W[t, c, k]``, from a filter ``w3 [taps, C,
    K]`` of bits: for one tap a strided view (the packing reads it through its strides),
    else a copy."""
    taps, c, k = w3.shape
    if taps == 1:
        return w3.reshape(c, k).T
    return np.ascontiguousarray(w3.transpose(0, 2, 1)).reshape(taps * k, c)


def _packed_filter_t(w3, taps, align=2):
    """Backward data's B (:func:`_filter_t` of the taps ``taps`` of ``w3 [T, C, K]``)
    packed into pairs: with ``K`` even each pair is one 32-bit word of the filter as it
    is, and the packing is a 32-bit transpose per tap (``pack_taps``, in parallel); else
    the serial copy of :func:`_filter_t`, then :func:`pack_pairs` (docs/performance.md,
    "bfloat16"). ``align``: the reduction's length rounded up to a multiple of it (the
    rows past the filter's zeros), as the im2col it multiplies."""
    from ..kernels.cpu import bf16dot as k
    _, c, kk = w3.shape
    taps = np.asarray(taps, np.int64)
    kp = -(-len(taps) * kk // align) * align
    bp = memory.empty((-(-c // k.NR), kp // 2, k.NR), np.uint32)
    if kk % 2 == 0:
        k.pack_taps(np.ascontiguousarray(w3).view(np.uint32), taps, bp)
        bp[:, len(taps) * kk // 2:] = 0
    else:
        k.pack_pairs(_filter_t(w3[taps]), bp)
    return bp


def _product(a, b, kp, kc2, nrb, bits=False, ks=1, xt=None, npb=1, kern=None):
    """``A @ B`` (``a [M, kp]``, ``kp`` even, and ``b [<= kp, N]``: bits): B packed into
    pairs first, or, where one block of rows reads all of it (``nrb`` 1: a weight gradient
    over few rows), paired by the GEMM panel by panel as it goes; ``bits``: as
    :func:`_gemm`; ``ks`` > 1: the reduction in that many parts (``bf16dot.gemm``), their
    sums added in order here; ``xt`` (``[P, M]``, ``a`` None): A is ``xt`` transposed, by
    the GEMM as it goes. ``kern``: the GEMM's kernel module (``bf16dot`` unless given)."""
    from ..kernels.cpu import bf16dot as k
    gk = kern or k
    if xt is not None:
        a = _NO_A
    n = b.shape[1]
    if nrb == 1 and b.flags.c_contiguous:
        bp, raw = _NO_PANELS, b
    else:
        bp, raw = memory.empty((-(-n // k.NR), kp // 2, k.NR), np.uint32), None
        k.pack_pairs(b, bp)
    if ks == 1:
        return _gemm(a, bp, n, kc2, nrb, bits, raw, xt, npb, kern)
    m = a.shape[0] if xt is None else xt.shape[1]
    parts = memory.empty((ks * m, n), np.float32)
    gk.gemm(_pairs(a), bp, parts, kc2, nrb, None, ks, raw, xt, npb)
    c = parts.reshape(ks, m, n).sum(axis=0)
    return _bits(c) if bits else c


_NO_PANELS = np.zeros((0, 0, 64), np.uint32)
_NO_A = np.zeros((0, 0), np.uint32)


def _gemm(a, bp, n, kc2, nrb, bits=False, b=None, xt=None, npb=1, kern=None):
    """``A @ B`` for ``a [M, kp]`` (or ``xt`` transposed) and B packed (``bp``; or ``b``,
    B itself, paired by the GEMM), ``n`` columns: float32, or with ``bits`` rounded to
    bfloat16 bits (``uint16``) by the kernel as each tile's reduction ends (no float32
    result written and read again). ``kern``: the GEMM's kernel module (``bf16dot``
    unless given)."""
    from ..kernels.cpu import bf16dot
    k = kern or bf16dot
    m = a.shape[0] if xt is None else xt.shape[1]
    if bits:
        d = memory.empty((m, n), np.uint16)
        k.gemm(_pairs(a), bp, np.empty((0, n), np.float32), kc2, nrb, d, 1, b, xt, npb)
        return d
    c = memory.empty((m, n), np.float32)
    k.gemm(_pairs(a), bp, c, kc2, nrb, None, 1, b, xt, npb)
    return c


def _bits(a):
    """bfloat16 bits of an operand (the tuner passes float32 ones: rounded here)."""
    if a.dtype == np.uint16:
        return a
    from ..kernels.cpu import convert
    a = np.ascontiguousarray(a, np.float32)
    out = np.empty(a.shape, np.uint16)
    convert.convert_bf16(a.reshape(-1).view(np.uint32), out.reshape(-1), False)
    return out


def _pairs(a):
    """A ``uint16`` matrix with an even row length as ``uint32`` pairs."""
    return a.view(np.uint32)


class Bf16Dot(Strategy):
    name = "gemm"
    variant = "bf16-dot"
    compile_heavy = True
    #: The reduction's block (pairs) and most rows per block of this entry's GEMM.
    kc2 = KC2
    max_mc = MAX_MC
    #: im2col's row length rounded up to a multiple of this (zeros past the taps).
    kp_align = 2

    def kernels(self):
        """The GEMM's kernel module (``gemm``, ``MR``)."""
        from ..kernels.cpu import bf16dot
        return bf16dot

    def accepts(self, p):
        why = dot_guards(p)
        if why is not None:
            return why
        why = shape_guards(p)
        if why is not None:
            return why
        lo, hi = WINOGRAD_CHANNELS
        if (p.direction != "bwd_d" and p.ndim == 2 and p.ksz == (1, 3, 3)
                and p.stride == (1, 1, 1) and p.dilation == (1, 1, 1)
                and lo <= min(p.ic, p.oc) <= hi):
            return R_WINOGRAD.format(c=min(p.ic, p.oc), lo=lo, hi=hi)
        return None

    def tiles(self, p, machine):
        if p.direction == "bwd_w":
            k2 = -(-p.mb * math.prod(p.osz) // 2)
            rows = _taps(p) * p.ic
            mr = self.kernels().MR
            nrb, ks = _split_reduction(rows, k2, p.oc, mr, self.kc2, self.max_mc)
            npan = -(-p.oc // 64)
            if ks == 1 and npan >= _threads() and rows * npan < p.oc * nrb:
                # blocks of panels re-read A fewer bytes than blocks of rows would re-read
                # B: few rows against many columns (docs/performance.md, "bfloat16")
                return {"kc2": self.kc2, "row_blocks": 1, "ks": 1, "panel_blocks": npan}
            return {"kc2": self.kc2, "row_blocks": nrb, "ks": ks}
        rows = p.mb * math.prod(p.isz if p.direction == "bwd_d" else p.osz)
        return {"kc2": self.kc2,
                "row_blocks": _row_blocks(rows, self.kernels().MR, self.max_mc)}

    def bf16_operands(self, p, tiles):
        return frozenset({"x", "dy", "w"})

    def numba_parallel(self, p, tiles):
        return True

    def workspace_bytes(self, p, tiles):
        from ..kernels.cpu.bf16dot import NR
        taps = _taps(p)
        m = p.mb * math.prod(p.osz)
        if p.direction == "fwd":
            k, n, rows = taps * p.ic, p.oc, m
        elif p.direction == "bwd_d":
            k, n, rows = taps * p.oc, p.ic, p.mb * math.prod(p.isz)
        else:
            k, n, rows = m, p.oc, taps * p.ic
        k2 = -(-k // self.kp_align) * self.kp_align // 2
        parts = int(tiles.get("ks", 1))
        # A (pairs), B's panels (none where one block of rows pairs B as it goes), the
        # reduction's parts' sums
        panels = 0 if int(tiles["row_blocks"]) == 1 else -(-n // NR) * k2 * NR * 4
        a = 0 if _transposes_x(p, tiles) else rows * k2 * 4
        return a + panels + (parts * rows * n * 4 if parts > 1 else 0)

    def run(self, p, tiles, ops):
        from ..kernels.cpu import bf16dot as k

        xs, ys, ws = canonical_shapes(p)
        taps = _taps(p)
        kc2, nrb = int(tiles["kc2"]), int(tiles["row_blocks"])
        if p.direction == "bwd_w":  # dW [taps*C, K] = im2col(X)^T @ dY, over pixels
            bits = ops["x"].dtype == np.uint16
            x, dy = _bits(ops["x"]), _bits(ops["dy"])
            m = p.mb * math.prod(p.osz)
            k2 = -(-m // 2)
            ks = int(tiles.get("ks", 1))
            npb = int(tiles.get("panel_blocks", 1))
            if _transposes_x(p, tiles):  # A is x transposed: by the GEMM as it goes
                return _product(None, dy.reshape(m, p.oc), 2 * k2, kc2, nrb, bits, ks,
                                np.ascontiguousarray(x).reshape(m, p.ic),
                                kern=self.kernels()).reshape(ws)
            a = memory.empty((taps * p.ic, 2 * k2), np.uint16)
            g, _ = _im2col_geo(p, False)
            k.im2col_t(x, np.array([p.mb, *p.osz], np.int64), a, g)
            return _product(a, dy.reshape(m, p.oc), 2 * k2, kc2, nrb, bits, ks,
                            npb=npb, kern=self.kernels()).reshape(ws)
        bwd = p.direction == "bwd_d"
        if bwd and any(s != 1 for s in p.stride):
            return self._bwd_d_phases(p, ops, kc2)
        # bfloat16 in (not the tuner's float32 operands): rounded by the GEMM, bits out
        bits = (ops["dy"] if bwd else ops["x"]).dtype == np.uint16
        src = _bits(ops["dy"] if bwd else ops["x"])
        w = _bits(ops["w"]).reshape(taps, p.ic, p.oc)
        c_in, c_out = (p.oc, p.ic) if bwd else (p.ic, p.oc)
        sizes = p.isz if bwd else p.osz
        m = p.mb * math.prod(sizes)
        if taps == 1 and c_in % 2 == 0 and all(s == 1 for s in p.stride) \
                and not any(p.pad_begin) and not any(p.pad_end):
            a = src.reshape(m, c_in)  # 1x1 at stride 1 without pads: the image itself
            kp, align = c_in, 2
        else:  # im2col's rows, zeros up to the entry's multiple
            align = self.kp_align
            kp = -(-taps * c_in // align) * align
            a = memory.empty((m, kp), np.uint16)
            g, sign = _im2col_geo(p, bwd)
            k.im2col(src, np.array([p.mb, *sizes], np.int64), a, g, sign)
        if bwd:
            c = _gemm(a, _packed_filter_t(w, range(taps), align), p.ic, kc2, nrb, bits,
                      kern=self.kernels())
        else:
            c = _product(a, w.reshape(taps * c_in, c_out), kp, kc2, nrb, bits,
                         kern=self.kernels())
        return c.reshape(xs if bwd else ys)

    def _bwd_d_phases(self, p, ops, kc2):
        """Backward data at a stride above 1: per stride phase, its pixels' rows of dX as
        one product over the taps that reach it (im2col of dY with those taps flipped),
        written into the phase's pixels of dX; a phase no tap reaches is zeros."""
        from ..kernels.cpu import bf16dot as k

        xs, _, _ = canonical_shapes(p)
        bits = ops["dy"].dtype == np.uint16
        dy = _bits(ops["dy"])
        w3 = _bits(ops["w"]).reshape(-1, p.ic, p.oc)
        dx = memory.empty((p.mb, *p.isz, p.ic), np.uint16 if bits else np.float32)
        none = np.zeros((0, p.ic), dx.dtype)
        for q, grid, taps in stride_phases(p):
            m = p.mb * math.prod(grid)
            if m == 0:
                continue
            geo_q = np.array([*p.stride, *q], np.int64)
            if not taps:
                k.put_phase(none, dx, geo_q)
                continue
            axes = _phase_axes(p, q)  # the phase's taps, a regular grid along each axis
            nq = len(taps)
            if (nq == 1 and p.oc % 2 == 0 and all(b0 == 0 for _, _, _, b0, _ in axes)
                    and grid == tuple(p.osz)):
                a = dy.reshape(m, p.oc)  # one tap reading dY pixel for pixel: dY itself
                align = 2
            else:  # im2col's rows, zeros up to the entry's multiple
                align = self.kp_align
                kp = -(-nq * p.oc // align) * align
                a = memory.empty((m, kp), np.uint16)
                geo = np.array([1, 1, 1, *(d for *_, d in axes), *(b0 for *_, b0, _ in axes),
                                *(n for _, _, n, _, _ in axes)], np.int64)
                k.im2col(dy, np.array([p.mb, *grid], np.int64), a, geo, -1)
            # the phase's taps, flat over the kernel, in the order of its rows of A
            (d0, ds, dn, _, _), (h0, hs, hn, _, _), (w0, ws_, wn, _, _) = axes
            kh, kw = p.ksz[1], p.ksz[2]
            idx = [(td * kh + th) * kw + tw for td in range(d0, d0 + dn * ds, ds)
                   for th in range(h0, h0 + hn * hs, hs) for tw in range(w0, w0 + wn * ws_, ws_)]
            c = _gemm(a, _packed_filter_t(w3, idx, align), p.ic, kc2,
                      _row_blocks(m, self.kernels().MR, self.max_mc), bits, kern=self.kernels())
            k.put_phase(c, dx, geo_q)
        return dx.reshape(xs)

STRATEGY = Bf16Dot()
