"""Packing loop nests of the GEMM strategy (the GEMMs themselves run in BLAS or in
:mod:`.ukernel`): im2col, the stride-phase scatter, and the transposed taps of W.

One gather covers every im2col the GEMM strategy needs. A GEMM row is a point ``j`` of a
3-D grid ``J`` (with the batch in front: row ``r`` is ``(n, jd, jh, jw)`` in C order); tap
``t`` of that row reads the source at ``j * a + boff[t]`` (per axis), zero outside:

* forward and backward weights: source ``x``, grid = output, ``a`` = stride,
  ``boff[t] = t*dilation - pad_begin``;
* backward data, stride phase ``q`` (input positions ``i = q + s*j``): source ``dy``,
  ``a = 1``, ``boff[t] = (q + pad_begin - t*dilation) / s`` for the taps where that division
  is exact (Lavin's and oneDNN's stride-phase decomposition: no scatter-add).
"""
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from numbaconv._jit import helper, kernel


@intrinsic
def _widen(typingctx, v):
    """A source element as a float: float16 bits (uint16) widened to float32 (``fpext``:
    ``vcvtph2ps`` with F16C, which LLVM vectorises in a loop), else as it is."""
    if v == types.uint16:
        def codegen(context, builder, signature, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

        return types.float32(v), codegen

    def same(context, builder, signature, args):
        return args[0]

    return v(v), same


# A GEMM row's grid point is found once per call and then stepped row by row: four integer
# divisions per row took most of the time of narrow rows (2800 rows of 7 taps x 3
# channels, conv1d:2's backward-weights slab: 85 -> 57 us).
@helper
def _grid_point(r, jd_n, jh_n, jw_n):
    """``(n, jd, jh, jw)`` of row ``r`` of the grid (batch in front, C order)."""
    jw = r % jw_n
    q = r // jw_n
    jh = q % jh_n
    q = q // jh_n
    return q // jd_n, q % jd_n, jh, jw


@helper
def _next_point(n, jd, jh, jw, jd_n, jh_n, jw_n):
    """The grid point of the row after ``(n, jd, jh, jw)``."""
    jw += 1
    if jw == jw_n:
        jw = 0
        jh += 1
        if jh == jh_n:
            jh = 0
            jd += 1
            if jd == jd_n:
                jd = 0
                n += 1
    return n, jd, jh, jw


# Serial on purpose: BLAS owns the cores between packs (see numbaconv.blas).
@kernel(parallel=False)
def im2col(src, col, grid, a, boff, runs, c0, r0):
    """col[rr, t, c] = src[n, j*a + boff[t], c0 + c] (0 outside) for rows r0 + rr.

    ``runs[i] = (t0, L)`` splits the taps into runs whose offsets differ only in w, by 1 from
    tap to tap: when a run lies inside the source and takes every channel, its ``L * cn``
    values are contiguous in both ``src`` and ``col`` and are copied as one block (ResNet's
    7x7 stem over 3 channels: blocks of 21 values instead of 3). A ``src`` of float16 bits
    (uint16) is widened into a float32 ``col`` as it is copied."""
    rows, ntaps, cn = col.shape[0], col.shape[1], col.shape[2]
    jd_n, jh_n, jw_n = grid[0], grid[1], grid[2]
    s_d, s_h, s_w, s_c = src.shape[1], src.shape[2], src.shape[3], src.shape[4]
    sf = src.reshape(src.size)
    cf = col.reshape(col.size)
    full = cn == s_c
    n, jd, jh, jw = _grid_point(r0, jd_n, jh_n, jw_n)
    for rr in range(rows):
        if rr > 0:
            n, jd, jh, jw = _next_point(n, jd, jh, jw, jd_n, jh_n, jw_n)
        for ri in range(runs.shape[0]):
            t0 = runs[ri, 0]
            L = runs[ri, 1]
            p_d = jd * a[0] + boff[t0, 0]
            p_h = jh * a[1] + boff[t0, 1]
            p_w = jw * a[2] + boff[t0, 2]
            dh_in = 0 <= p_d < s_d and 0 <= p_h < s_h
            if full and dh_in and p_w >= 0 and p_w + L <= s_w:
                # unsigned offsets: no negative-index wraparound, so the copies vectorise
                e = np.uint64((((n * s_d + p_d) * s_h + p_h) * s_w + p_w) * s_c)
                o = np.uint64((rr * ntaps + t0) * cn)
                for i in range(np.uint64(L * cn)):
                    cf[o + i] = _widen(sf[e + i])
                continue
            for t in range(t0, t0 + L):
                pw = p_w + (t - t0)
                o = np.uint64((rr * ntaps + t) * cn)
                if dh_in and 0 <= pw < s_w:
                    e = np.uint64((((n * s_d + p_d) * s_h + p_h) * s_w + pw) * s_c + c0)
                    for c in range(np.uint64(cn)):
                        cf[o + c] = _widen(sf[e + c])
                else:
                    for c in range(np.uint64(cn)):
                        cf[o + c] = 0


@kernel(parallel=False)
def scatter_phase(tmp, dx, grid, stride, phase, c0, r0):
    """dx[n, phase + stride*j, c0 + c] = tmp[rr, c] for rows r0 + rr of the phase grid.

    Flat unsigned offsets, as in :func:`im2col`: indexing the 5-D ``dx`` per channel kept
    the negative-index checks in the inner loop (one stride phase of res3a_branch2b's
    backward data, 3.2 MB: 0.79-1.17 ms that way, 0.24 ms flat)."""
    rows, cn = tmp.shape[0], tmp.shape[1]
    jd_n, jh_n, jw_n = grid[0], grid[1], grid[2]
    s_d, s_h, s_w, s_c = dx.shape[1], dx.shape[2], dx.shape[3], dx.shape[4]
    df = dx.reshape(dx.size)
    tf = tmp.reshape(tmp.size)
    n, jd, jh, jw = _grid_point(r0, jd_n, jh_n, jw_n)
    for rr in range(rows):
        if rr > 0:
            n, jd, jh, jw = _next_point(n, jd, jh, jw, jd_n, jh_n, jw_n)
        i_d = phase[0] + stride[0] * jd
        i_h = phase[1] + stride[1] * jh
        i_w = phase[2] + stride[2] * jw
        e = np.uint64((((n * s_d + i_d) * s_h + i_h) * s_w + i_w) * s_c + c0)
        o = np.uint64(rr * cn)
        for c in range(np.uint64(cn)):
            df[e + c] = tf[o + c]


@kernel(parallel=False)
def transpose_taps(w, idx, k0, out):
    """``out[j, k, c] = w[idx[j], c, k0 + k]`` for ``w`` ``[taps, C, K]`` and ``out``
    ``[len(idx), kn, C]``: the backward-data B operand (``W_q^T``, unit column stride) built
    in 16x16 blocks that stay in L1 (NumPy's transposing copy of 9 taps of 512x512 took
    24 ms, this 1-2 ms)."""
    C = w.shape[1]
    kn = out.shape[1]
    for j in range(idx.shape[0]):
        t = idx[j]
        for c0 in range(0, C, 16):
            c1 = min(C, c0 + 16)
            for q0 in range(0, kn, 16):
                q1 = min(kn, q0 + 16)
                for k in range(q0, q1):
                    for c in range(c0, c1):
                        out[j, k, c] = w[t, c, k0 + k]
