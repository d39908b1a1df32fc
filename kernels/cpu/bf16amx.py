"""Stride-1 correlations in bfloat16 with their taps read in place, on AMX tiles: the
kernels of ``gemm[bf16-amx-taps]`` (:mod:`_amx` for the tiles).

A forward pass or backward data at stride 1 sums, per tap, the source shifted by the tap
times that tap's filter. Over the source zero-padded so that every tap stays inside it,
and flattened to pixels, an output pixel ``(n, z, y, x)`` taken as row ``q = n*P + (z*Hp +
y)*Wp + x`` of the padded grid (``P = Dp*Hp*Wp``) reads tap ``t``'s source pixel at row
``q + offs[t]``: one row offset per tap, so that an AMX tile of A is 16 consecutive rows of
the padded source read where they lie (rows a pixel's channels apart), and no im2col matrix
is written. The grid's rows that are no output pixel (the pad columns and rows) are
computed and dropped: ``(Dp*Hp*Wp) / (od*oh*ow)`` times the useful work.
"""
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from numbaconv._jit import helper, separate
from numbaconv.kernels.cpu._amx import (MR, NR, config_tiles, ensure_amx, release_tiles,
                                        taps_tile, void_call, wgrad_tile)
from numbaconv.kernels.cpu._ir import store_pair_columns


@intrinsic
def _amx_config(typingctx):
    """``ldtilecfg`` (:func:`_amx.config_tiles`)."""
    return void_call(config_tiles, 0)


@intrinsic
def _amx_release(typingctx):
    """``tilerelease`` (:func:`_amx.release_tiles`)."""
    return void_call(release_tiles, 0)


@intrinsic
def _micro_taps(typingctx, a, lda, offs, ntaps, b, k2, rows, d):
    """:func:`_amx.taps_tile` (the filter's panels tile-major: :func:`_amx.tile_major`)."""
    return void_call(taps_tile, 8)


@helper(inline=True)
def _grid_pixel(q, dp, hp, wp):
    """``(n, z, y, x)``: row ``q`` of a padded grid of ``dp x hp x wp`` pixels per item."""
    plane = hp * wp
    n = q // (dp * plane)
    e = q - n * (dp * plane)
    z = e // plane
    e -= z * plane
    y = e // wp
    return n, z, y, e - y * wp


def taps(src, offs, bp, d, geo, nrb):
    """A stride-1 correlation with its taps read in place: ``d[dest(o), :] = sum_t
    src[q(o) + offs[t], :] @ B_t`` rounded to bfloat16, for ``src`` the zero-padded source
    flattened to pixels (``uint32`` pairs ``[rows, K2]``, ``K2`` a multiple of 16, at least
    ``geo[0] + max(offs) + MR`` rows), ``bp`` the packed panels of the taps' filters
    (``[N/NR, taps*K2, NR]``, tap-major) and ``d`` ``uint16 [pixels, N]`` (``N`` a
    multiple of ``NR``). Output pixel ``o = (n, z, y, x)`` of a ``gz x gy x gx`` grid is
    row ``q(o) = n*P + (z*Hp + y)*Wp + x`` of the padded grid (``P = Dp*Hp*Wp``): each tap
    is one row offset, and the grid's rows that are no output pixel (its pad columns and
    rows) are computed and dropped. Pixel ``o`` goes to row ``dest(o) = ((n*Z + cz +
    sz*z)*Y + cy + sy*y)*X + cx + sx*x`` of ``d`` (a stride phase of backward data: the
    phase's pixels ``c + s*j`` of a ``Z x Y x X`` result; ``s`` 1 and ``c`` 0 for a whole
    one). ``geo``: int64 ``[rows of the grid (a multiple of MR), mb, Dp, Hp, Wp, gz, gy, gx,
    sz, sy, sx, cz, cy, cx, Z, Y, X]``. In parallel over ``nrb`` blocks of rows."""
    ensure_amx()
    _taps_block.run("bf16", nrb, src, offs, bp, d, geo, nrb)


@separate(bf16="void(uint32[:, ::1], int64[::1], uint32[:, :, ::1], uint16[:, ::1], "
               "int64[::1], int64, int64)")
def _taps_block(src, offs, bp, d, geo, nrb, blk):
    """Block ``blk`` of :func:`taps`' rows."""
    mq, mb, dp, hp, wp, gz, gy, gx = (geo[0], geo[1], geo[2], geo[3], geo[4], geo[5],
                                      geo[6], geo[7])
    sz, sy, sx, cz, cy, cx = geo[8], geo[9], geo[10], geo[11], geo[12], geo[13]
    DZ, DY, DX = geo[14], geo[15], geo[16]
    K2 = src.shape[1]
    N = d.shape[1]
    ntaps = offs.shape[0]
    tiles = mq // MR
    r0 = MR * (blk * tiles // nrb)
    r1 = MR * ((blk + 1) * tiles // nrb)
    rows = np.empty(MR, np.int64)
    pa0, po, pr = src.ctypes.data, offs.ctypes.data, rows.ctypes.data
    pb0, pd0 = bp.ctypes.data, d.ctypes.data
    _amx_config()
    for i0 in range(r0, r1, MR):
        valid = 0
        for r in range(MR):
            n, z, y, x = _grid_pixel(i0 + r, dp, hp, wp)
            if n < mb and z < gz and y < gy and x < gx:
                rows[r] = (((n * DZ + cz + sz * z) * DY + cy + sy * y) * DX + cx + sx * x) * N
                valid += 1
            else:
                rows[r] = -1
        if valid == 0:
            continue
        for q in range(N // NR):
            _micro_taps(pa0 + i0 * K2 * 4, K2, po, ntaps, pb0 + q * ntaps * K2 * NR * 4, K2,
                        pr, pd0 + q * NR * 2)
    _amx_release()


# -- weight gradients with the taps read in place ---------------------------------------------

@intrinsic
def _micro_wgrad(typingctx, a, lda, b, ldb, c, ldc, k2):
    """:func:`_amx.wgrad_tile` (dY's pairs tile-major, as :func:`pair_grid` writes them)."""
    return void_call(wgrad_tile, 7)


#: Pairs per block of the pairing passes, and per block of a weight gradient's reduction
#: (its panels of x^T and dY stay in L2 while every tap meets them).
PAIR_BLOCK = 64
WGRAD_PAIRS = 1024


def pair_source_t(xp, xt0, xt1):
    """x's pixels paired along the reduction, transposed, at both parities:
    ``xt0[c, p] = xp[2p, c] | xp[2p+1, c] << 16`` and ``xt1[c, p] = xp[2p+1, c] |
    xp[2p+2, c] << 16`` for ``xp`` the padded source flattened to pixels (``uint16 [R,
    C]``, ``R >= 2*P2 + 2`` for ``P2`` the pairs of ``xt0``): a tap at an even row offset
    reads pairs of ``xt0``, one at an odd offset pairs of ``xt1``. In parallel over blocks of
    pairs."""
    _pair_t_block.run("bf16", -(-xt0.shape[1] // PAIR_BLOCK), xp, xt0, xt1)


@intrinsic
def _transpose_pairs(typingctx, src, lds, dst, ldd):
    """32 pixels x 16 channels of bfloat16 bits transposed in registers: pixel ``j``'s 16
    channels at ``src + j*lds`` bytes; pixels ``2i`` and ``2i+1`` interleaved into 32-bit
    words, and channel ``c``'s 16 words stored at ``dst + c*ldd`` bytes."""
    sig = types.void(types.intp, types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        src, lds, dst, ldd = args
        i8, i64 = ir.IntType(8), ir.IntType(64)
        v16 = ir.VectorType(ir.IntType(16), 16)
        ps = builder.inttoptr(src, i8.as_pointer())
        rows = [builder.load(builder.bitcast(builder.gep(ps, [builder.mul(lds, ir.Constant(
            i64, j))]), v16.as_pointer()), align=2) for j in range(32)]
        store_pair_columns(builder, rows, dst, ldd)
        return context.get_dummy_value()

    return sig, codegen


@separate(bf16="void(uint16[:, ::1], uint32[:, ::1], uint32[:, ::1], int64)", noalias=True)
def _pair_t_block(xp, xt0, xt1, blk):
    """Block ``blk`` of :func:`pair_source_t`: groups of 16 pairs x 16 channels transposed
    in registers (:func:`_transpose_pairs`, once per parity), the rest value by value."""
    C = xp.shape[1]
    X2 = xt0.shape[1]
    p0 = blk * PAIR_BLOCK
    p1 = min(X2, p0 + PAIR_BLOCK)
    whole = p0 + (p1 - p0) // 16 * 16 if C % 16 == 0 else p0
    px, pt0, pt1 = xp.ctypes.data, xt0.ctypes.data, xt1.ctypes.data
    for g in range(p0, whole, 16):
        for c0 in range(0, C, 16):
            at = px + (2 * g * C + c0) * 2
            _transpose_pairs(at, C * 2, pt0 + (c0 * X2 + g) * 4, X2 * 4)
            _transpose_pairs(at + C * 2, C * 2, pt1 + (c0 * X2 + g) * 4, X2 * 4)
    for c in range(C):
        r0 = xt0[c]
        r1 = xt1[c]
        for p in range(whole, p1):
            a = np.uint32(xp[2 * p, c])
            b = np.uint32(xp[2 * p + 1, c])
            e = np.uint32(xp[2 * p + 2, c])
            r0[p] = a | (b << np.uint32(16))
            r1[p] = b | (e << np.uint32(16))


def pair_grid(dy, dyp, geo):
    """dY on the padded grid, paired along it: ``dyp[p, k] = G[2p, k] | G[2p+1, k] << 16``
    with ``G[q]`` output pixel ``q``'s row of ``dy`` (``uint16 [mb*od*oh*ow, K]``, ``K`` a
    multiple of 16) where grid row ``q`` is one, else zeros; tile-major (each block of 16
    rows ``K/16`` tiles of 16 x 16 words: a tile is 1 KiB of consecutive bytes). ``geo``: int64 ``[rows, mb, Dp, Hp, Wp, od, oh,
    ow]`` (:func:`taps`'). In parallel over blocks of pairs."""
    _pair_grid_block.run("bf16", -(-dyp.shape[0] // PAIR_BLOCK), dy, dyp, geo)


@separate(bf16="void(uint16[:, ::1], uint32[:, ::1], int64[::1], int64)", noalias=True)
def _pair_grid_block(dy, dyp, geo, blk):
    """Block ``blk`` of :func:`pair_grid`."""
    mb, dp, hp, wp, od, oh, ow = geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    K = dy.shape[1]
    p0 = blk * PAIR_BLOCK
    p1 = min(dyp.shape[0], p0 + PAIR_BLOCK)
    src = np.empty(2, np.int64)
    flat = dyp.reshape(-1)
    for p in range(p0, p1):
        for h in range(2):
            n, z, y, x = _grid_pixel(2 * p + h, dp, hp, wp)
            src[h] = ((n * od + z) * oh + y) * ow + x \
                if n < mb and z < od and y < oh and x < ow else -1
        # row p's words: 16 in each of K/16 tiles
        base = p // 16 * K * 16 + p % 16 * 16
        if src[0] >= 0 and src[1] >= 0:
            lo = dy[src[0]]
            hi = dy[src[1]]
            for kt in range(0, K, 16):
                at = base + kt * 16
                for k in range(16):
                    flat[at + k] = np.uint32(lo[kt + k]) | (np.uint32(hi[kt + k])
                                                            << np.uint32(16))
        else:
            for kt in range(0, K, 16):
                at = base + kt * 16
                for k in range(16):
                    a = np.uint32(dy[src[0], kt + k]) if src[0] >= 0 else np.uint32(0)
                    b = np.uint32(dy[src[1], kt + k]) if src[1] >= 0 else np.uint32(0)
                    flat[at + k] = a | (b << np.uint32(16))


def wgrad(xt0, xt1, dyp, offs, c):
    """A stride-1 weight gradient's float32 sums ``c[part, t] (C x K) = sum_p A_t[:, p] @
    dyp[p, :]`` over part ``part`` of the grid's pairs, ``A_t`` x^T at tap ``t``'s row
    offset ``offs[t]`` (pairs of :func:`pair_source_t`: ``xt0`` at an even offset from pair
    ``offs[t] // 2``, ``xt1`` at an odd one). ``c`` float32 ``[parts, taps, C, K]``, zeros
    (``C`` a multiple of 32, ``K`` of 64); the caller adds the parts in order. Each part
    runs its pairs in blocks of ``WGRAD_PAIRS`` that every tap meets while they are in L2.
    In parallel over the parts."""
    ensure_amx()
    _wgrad_part.run("bf16", c.shape[0], xt0, xt1, dyp, offs, c)


@separate(bf16="void(uint32[:, ::1], uint32[:, ::1], uint32[:, ::1], int64[::1], "
               "float32[:, :, :, ::1], int64)")
def _wgrad_part(xt0, xt1, dyp, offs, c, part):
    """Part ``part`` of :func:`wgrad`."""
    parts, ntaps, C, K = c.shape
    P2 = dyp.shape[0]
    X2 = xt0.shape[1]
    steps = P2 // 16
    s0 = part * steps // parts * 16
    s1 = (part + 1) * steps // parts * 16
    pb0 = dyp.ctypes.data
    px0, px1 = xt0.ctypes.data, xt1.ctypes.data
    _amx_config()
    for p0 in range(s0, s1, WGRAD_PAIRS):
        kk = min(WGRAD_PAIRS, s1 - p0)
        for t in range(ntaps):
            o = offs[t]
            px = px1 if o % 2 else px0
            first = o // 2 + p0
            pc0 = c[part, t].ctypes.data
            for cb in range(0, C, MR):
                for kp in range(0, K, NR):
                    pb = pb0 + p0 * K * 4 + kp * 64
                    _micro_wgrad(px + (cb * X2 + first) * 4, X2, pb, K, pc0 + (cb * K + kp) * 4,
                                 K, kk)
    _amx_release()


# -- the zero-padded source -------------------------------------------------------------------

def pad_source(src, dst, geo):
    """``dst`` (``uint16 [rows, C]``) filled with the padded grid of ``src`` (``uint16 [mb,
    D, H, W, C]``): grid row ``n*P + (z*Hp + y)*Wp + x`` holds source pixel ``(n, z - lz,
    y - ly, x - lx)`` where that lies inside the source, else zeros, and every row past
    ``mb*P`` zeros. ``geo``: int64 ``[Dp, Hp, Wp, lz, ly, lx]``. One pass that writes each
    row once (no zeroed buffer written again), in parallel over blocks of grid rows."""
    rows = dst.shape[0]
    _pad_block.run("bf16", -(-rows // PAD_ROWS), src, dst, geo)


#: Grid rows per block of :func:`pad_source`.
PAD_ROWS = 256


@separate(bf16="void(uint16[:, :, :, :, ::1], uint16[:, ::1], int64[::1], int64)",
          noalias=True)
def _pad_block(src, dst, geo, blk):
    """Block ``blk`` of :func:`pad_source`."""
    mb, D, H, W, C = src.shape
    dp, hp, wp, lz, ly, lx = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    r0 = blk * PAD_ROWS
    r1 = min(dst.shape[0], r0 + PAD_ROWS)
    for q in range(r0, r1):
        row = dst[q]
        n, z, y, x = _grid_pixel(q, dp, hp, wp)
        z, y, x = z - lz, y - ly, x - lx
        if n < mb and 0 <= z < D and 0 <= y < H and 0 <= x < W:
            px = src[n, z, y, x]
            for c in range(C):
                row[c] = px[c]
        else:
            for c in range(C):
                row[c] = 0
