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
from numba.core import types
from numba.extending import intrinsic

from numbaconv._jit import separate
from numbaconv.kernels.cpu._amx import MR, NR, config_tiles, release_tiles, taps_tile


@intrinsic
def _amx_config(typingctx):
    """``ldtilecfg`` (:func:`_amx.config_tiles`)."""
    def codegen(context, builder, signature, args):
        config_tiles(builder)
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def _amx_release(typingctx):
    """``tilerelease`` (:func:`_amx.release_tiles`)."""
    def codegen(context, builder, signature, args):
        release_tiles(builder)
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def _micro_taps(typingctx, a, lda, offs, ntaps, b, k2, rows, d):
    """:func:`_amx.taps_tile`."""
    def codegen(context, builder, signature, args):
        taps_tile(builder, args)
        return context.get_dummy_value()

    return types.void(*[types.intp] * 8), codegen


def taps(src, offs, bp, d, geo, nrb):
    """A stride-1 correlation with its taps read in place: ``d[o, :] = sum_t src[q(o) +
    offs[t], :] @ B_t`` rounded to bfloat16, for ``src`` the zero-padded source flattened
    to pixels (``uint32`` pairs ``[rows, K2]``, ``K2`` a multiple of 16, at least
    ``geo[0] + max(offs) + MR`` rows), ``bp`` the packed panels of the taps' filters
    (``[N/NR, taps*K2, NR]``, tap-major) and ``d`` ``uint16 [mb*od*oh*ow, N]`` (``N`` a
    multiple of ``NR``). Output pixel ``o = (n, z, y, x)`` is row ``q(o) = n*P + (z*Hp +
    y)*Wp + x`` of the padded grid (``P = Dp*Hp*Wp``): each tap is one row offset, and the
    grid's rows that are no output pixel (its pad columns and rows) are computed and
    dropped. ``geo``: int64 ``[rows of the grid (a multiple of MR), mb, Dp, Hp, Wp, od, oh,
    ow]``. In parallel over ``nrb`` blocks of rows."""
    _taps_block.run("bf16", nrb, src, offs, bp, d, geo, nrb)


@separate(bf16="void(uint32[:, ::1], int64[::1], uint32[:, :, ::1], uint16[:, ::1], "
               "int64[::1], int64, int64)")
def _taps_block(src, offs, bp, d, geo, nrb, blk):
    """Block ``blk`` of :func:`taps`' rows."""
    mq, mb, dp, hp, wp, od, oh, ow = (geo[0], geo[1], geo[2], geo[3], geo[4], geo[5],
                                      geo[6], geo[7])
    K2 = src.shape[1]
    N = d.shape[1]
    ntaps = offs.shape[0]
    tiles = mq // MR
    r0 = MR * (blk * tiles // nrb)
    r1 = MR * ((blk + 1) * tiles // nrb)
    plane = hp * wp
    P = dp * plane
    rows = np.empty(MR, np.int64)
    pa0, po, pr = src.ctypes.data, offs.ctypes.data, rows.ctypes.data
    pb0, pd0 = bp.ctypes.data, d.ctypes.data
    _amx_config()
    for i0 in range(r0, r1, MR):
        valid = 0
        for r in range(MR):
            q = i0 + r
            n = q // P
            e = q - n * P
            z = e // plane
            e -= z * plane
            y = e // wp
            x = e - y * wp
            if n < mb and z < od and y < oh and x < ow:
                rows[r] = (((n * od + z) * oh + y) * ow + x) * N
                valid += 1
            else:
                rows[r] = -1
        if valid == 0:
            continue
        for q in range(N // NR):
            _micro_taps(pa0 + i0 * K2 * 4, K2, po, ntaps, pb0 + q * ntaps * K2 * NR * 4, K2,
                        pr, pd0 + q * NR * 2)
    _amx_release()
