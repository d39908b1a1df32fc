"""Packing loop nests of the GEMM strategy (the GEMMs themselves run in BLAS).

One gather covers every im2col the GEMM strategy needs. A GEMM row is a point ``j`` of a
3-D grid ``J`` (with the batch in front: row ``r`` is ``(n, jd, jh, jw)`` in C order); tap
``t`` of that row reads the source at ``j * a + boff[t]`` (per axis), zero outside:

* forward and backward weights: source ``x``, grid = output, ``a`` = stride,
  ``boff[t] = t*dilation - pad_begin``;
* backward data, stride phase ``q`` (input positions ``i = q + s*j``): source ``dy``,
  ``a = 1``, ``boff[t] = (q + pad_begin - t*dilation) / s`` for the taps where that division
  is exact (Lavin's and oneDNN's stride-phase decomposition: no scatter-add).
"""
from numbaconv._jit import kernel


# Serial on purpose: BLAS owns the cores between packs (see numbaconv.blas).
@kernel(parallel=False)
def im2col(src, col, grid, a, boff, c0, r0):
    """col[rr, t, c] = src[n, j*a + boff[t], c0 + c] (0 outside) for rows r0 + rr."""
    rows, ntaps, cn = col.shape[0], col.shape[1], col.shape[2]
    jd_n, jh_n, jw_n = grid[0], grid[1], grid[2]
    s_d, s_h, s_w = src.shape[1], src.shape[2], src.shape[3]
    for rr in range(rows):
        r = r0 + rr
        jw = r % jw_n
        q = r // jw_n
        jh = q % jh_n
        q = q // jh_n
        jd = q % jd_n
        n = q // jd_n
        for t in range(ntaps):
            p_d = jd * a[0] + boff[t, 0]
            p_h = jh * a[1] + boff[t, 1]
            p_w = jw * a[2] + boff[t, 2]
            if 0 <= p_d < s_d and 0 <= p_h < s_h and 0 <= p_w < s_w:
                for c in range(cn):
                    col[rr, t, c] = src[n, p_d, p_h, p_w, c0 + c]
            else:
                for c in range(cn):
                    col[rr, t, c] = 0


@kernel(parallel=False)
def scatter_phase(tmp, dx, grid, stride, phase, c0, r0):
    """dx[n, phase + stride*j, c0 + c] = tmp[rr, c] for rows r0 + rr of the phase grid."""
    rows, cn = tmp.shape[0], tmp.shape[1]
    jd_n, jh_n, jw_n = grid[0], grid[1], grid[2]
    for rr in range(rows):
        r = r0 + rr
        jw = r % jw_n
        q = r // jw_n
        jh = q % jh_n
        q = q // jh_n
        jd = q % jd_n
        n = q // jd_n
        i_d = phase[0] + stride[0] * jd
        i_h = phase[1] + stride[1] * jh
        i_w = phase[2] + stride[2] * jw
        for c in range(cn):
            dx[n, i_d, i_h, i_w, c0 + c] = tmp[rr, c]
