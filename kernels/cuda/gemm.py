"""Implicit-GEMM CUDA kernels for the three directions (CUTLASS's formulation).

Per group ``gi`` each direction is one GEMM ``C[M, N] = A[M, K] . B[K, N]`` whose operands
are never materialised: a thread block computes a ``BM x BN`` tile of ``C``, stepping over
``K`` in slices of ``BK`` that the block stages in shared memory (``As[BK, BM]``,
``Bs[BK, BN]``, gathered straight from the canonical tensors with zeros outside the
image); each of its ``(BM/TM) * (BN/TN)`` threads keeps a ``TM x TN`` register tile of
``C``. Thread ``(ty, tx)`` owns rows ``ty + a*BM/TM`` and columns ``tx + b*BN/TN``, so a warp
reads consecutive ``Bs`` columns (no bank conflicts) and writes consecutive channels. The
tile loads are laid out so that consecutive threads read consecutive channels (coalesced),
and the part of each load's address that does not depend on the ``K`` step is decoded once,
before the main loop.

With ``i = o*s - p + t*d`` per axis (see :mod:`numbaconv.kernels.cpu.direct`):

* forward: ``M = mb*od*oh*ow`` pixels, ``N = ocg``, ``K = kd*kh*kw*icg`` (tap, channel).
* backward data, by stride phase (oneDNN; JAX's ``conv_transpose`` algebra): the inputs with
  ``(i + p) % s == q`` receive exactly the taps with ``t*d % s == q``, i.e.
  ``t = t0 + u*s/gcd(s, d)``, and read ``o = j - c0 - u*d/gcd(s, d)`` for ``i = s*j + q - p``.
  Each phase is a dense stride-1 GEMM (``M = mb * prod(#j)``, ``N = icg``,
  ``K = prod(#taps) * ocg``) handled by its own thread blocks (``blockIdx.z``), so there is no
  scatter and no test for divisibility in the inner loop; a phase without taps writes zeros.
* backward weights: ``M = kd*kh*kw*icg`` (tap, channel), ``N = ocg``, ``K = mb*od*oh*ow``
  split over ``blockIdx.z`` into ``nsplit`` ranges of pixels, each writing its own partial
  ``dW``; :func:`reduce_partials` sums the partials in a fixed order (deterministic, no
  atomics).

Kernels take canonical contiguous arrays, the geometry as a tuple of 22 ints (see
:func:`numbaconv.kernels.geometry`) and validate nothing. float16 never reaches them: the
backend widens it to float32 once, on the device.
"""
import functools

from numba import cuda, float32, float64, int64

_TYPES = {"float32": float32, "float64": float64}


def axis_phase(q, s, d, p, k, n_in):
    """One axis of stride phase ``q``: ``(t0, tstep, nt, c0, ostep, j0, nj)``.

    Taps ``t0 + u*tstep`` (``u < nt``) feed the inputs ``i = s*j + q - p``
    (``j0 <= j < j0 + nj``) from outputs ``o = j - c0 - u*ostep``. The host's copy (the
    planner sizes the grid with it) of the code :func:`bwd_d_gemm` inlines: kernels call no
    device functions, whose compilation needs a GPU (numba compiles them for the current
    device), so that ``compile_ptx`` works on machines without one.
    """
    a = s
    b = d
    while b != 0:
        a, b = b, a % b
    tstep = s // a
    ostep = d // a
    t0 = -1
    for t in range(tstep):
        if (t * d) % s == q:
            t0 = t
            break
    nt = 0
    c0 = 0
    if t0 >= 0 and t0 < k:
        nt = (k - t0 + tstep - 1) // tstep
        c0 = (t0 * d - q) // s
    j0 = (p - q + s - 1) // s
    nj = (n_in + p - q + s - 1) // s - j0
    if nj < 0:
        nj = 0
    return t0, tstep, nt, c0, ostep, j0, nj




def _check(bm, bn, bk, tm, tn):
    if bm % tm or bn % tn or min(bm, bn, bk, tm, tn) < 1:
        raise ValueError(f"CUDA tiles: block {bm}x{bn}x{bk} must be a multiple of the thread "
                         f"tile {tm}x{tn}")


@functools.lru_cache(maxsize=None)
def fwd_gemm(dtype, bm, bn, bk, tm, tn):
    """``y[n, o, gi*ocg + col] = sum_{t, c} x[n, o*s - p + t*d, gi*icg + c] * w[t, c, gi*ocg + col]``.

    Grid ``(ceil(M/bm), ceil(ocg/bn), g)``, ``(bm/tm)*(bn/tn)`` threads; ``y`` is fully
    written.
    """
    _check(bm, bn, bk, tm, tn)
    T = _TYPES[dtype]
    nty = bm // tm
    ntx = bn // tn
    nt = nty * ntx
    a_loads = (bm * bk + nt - 1) // nt
    b_loads = (bk * bn + nt - 1) // nt

    def fwd_gemm(x, w, y, geo):
        As = cuda.shared.array((bk, bm), T)
        Bs = cuda.shared.array((bk, bn), T)
        acc = cuda.local.array((tm, tn), T)
        ra = cuda.local.array(tm, T)
        rb = cuda.local.array(tn, T)
        # per A load: image, first input row/col/plane (o*s - p) or -huge when out of range
        ln = cuda.local.array(a_loads, int64)
        lbd = cuda.local.array(a_loads, int64)
        lbh = cuda.local.array(a_loads, int64)
        lbw = cuda.local.array(a_loads, int64)
        mb, g, icg, ocg = geo[0], geo[1], geo[2], geo[3]
        id_, ih, iw = geo[4], geo[5], geo[6]
        kh, kw = geo[8], geo[9]
        od, oh, ow = geo[10], geo[11], geo[12]
        sd, sh, sw = geo[13], geo[14], geo[15]
        dd, dh, dw = geo[16], geo[17], geo[18]
        pd, ph, pw = geo[19], geo[20], geo[21]
        tid = cuda.threadIdx.x
        tx = tid % ntx
        ty = tid // ntx
        m0 = cuda.blockIdx.x * bm
        n0 = cuda.blockIdx.y * bn
        gi = cuda.blockIdx.z
        M = mb * od * oh * ow
        K = geo[7] * kh * kw * icg
        xc = gi * icg
        wc = gi * ocg + n0
        for a in range(tm):
            for b in range(tn):
                acc[a, b] = T(0)
        for l in range(a_loads):
            m = m0 + (tid + l * nt) // bk
            ln[l] = -1
            if m < M:
                o_w = m % ow
                r = m // ow
                o_h = r % oh
                r = r // oh
                ln[l] = r // od
                lbd[l] = (r % od) * sd - pd
                lbh[l] = o_h * sh - ph
                lbw[l] = o_w * sw - pw
        for k0 in range(0, K, bk):
            for l in range(a_loads):
                e = tid + l * nt
                if e < bm * bk:
                    kk = e % bk
                    v = T(0)
                    k = k0 + kk
                    if ln[l] >= 0 and k < K:
                        c = k % icg
                        t = k // icg
                        i_w = lbw[l] + (t % kw) * dw
                        i_h = lbh[l] + ((t // kw) % kh) * dh
                        i_d = lbd[l] + (t // (kw * kh)) * dd
                        if (i_d >= 0 and i_d < id_ and i_h >= 0 and i_h < ih
                                and i_w >= 0 and i_w < iw):
                            v = x[ln[l], i_d, i_h, i_w, xc + c]
                    As[kk, e // bk] = v
            for l in range(b_loads):
                e = tid + l * nt
                if e < bk * bn:
                    nn = e % bn
                    kk = e // bn
                    k = k0 + kk
                    v = T(0)
                    if k < K and n0 + nn < ocg:
                        t = k // icg
                        v = w[t // (kw * kh), (t // kw) % kh, t % kw, k % icg, wc + nn]
                    Bs[kk, nn] = v
            cuda.syncthreads()
            for kk in range(bk):
                for a in range(tm):
                    ra[a] = As[kk, ty + a * nty]
                for b in range(tn):
                    rb[b] = Bs[kk, tx + b * ntx]
                for a in range(tm):
                    for b in range(tn):
                        acc[a, b] += ra[a] * rb[b]
            cuda.syncthreads()
        for a in range(tm):
            m = m0 + ty + a * nty
            if m < M:
                o_w = m % ow
                r = m // ow
                o_h = r % oh
                r = r // oh
                o_d = r % od
                n = r // od
                for b in range(tn):
                    col = tx + b * ntx
                    if n0 + col < ocg:
                        y[n, o_d, o_h, o_w, wc + col] = acc[a, b]

    return cuda.jit(fwd_gemm)


@functools.lru_cache(maxsize=None)
def bwd_d_gemm(dtype, bm, bn, bk, tm, tn):
    """``dx`` by stride phase: ``dx[n, i, gi*icg + c] = sum dy[n, o, gi*ocg + k] * w[t, c, gi*ocg + k]``.

    Grid ``(ceil(max_phase_M/bm), ceil(icg/bn), g*sd*sh*sw)``; every element of ``dx``
    belongs to exactly one phase and is written once (zeros where no tap reaches it).
    """
    _check(bm, bn, bk, tm, tn)
    T = _TYPES[dtype]
    nty = bm // tm
    ntx = bn // tn
    nt = nty * ntx
    a_loads = (bm * bk + nt - 1) // nt
    b_loads = (bk * bn + nt - 1) // nt

    def bwd_d_gemm(dy, w, dx, geo):
        As = cuda.shared.array((bk, bm), T)
        Bs = cuda.shared.array((bk, bn), T)
        acc = cuda.local.array((tm, tn), T)
        ra = cuda.local.array(tm, T)
        rb = cuda.local.array(tn, T)
        ln = cuda.local.array(a_loads, int64)
        lbd = cuda.local.array(a_loads, int64)
        lbh = cuda.local.array(a_loads, int64)
        lbw = cuda.local.array(a_loads, int64)
        mb, icg, ocg = geo[0], geo[2], geo[3]
        od, oh, ow = geo[10], geo[11], geo[12]
        sd, sh, sw = geo[13], geo[14], geo[15]
        pd, ph, pw = geo[19], geo[20], geo[21]
        tid = cuda.threadIdx.x
        tx = tid % ntx
        ty = tid // ntx
        m0 = cuda.blockIdx.x * bm
        n0 = cuda.blockIdx.y * bn
        nph = sd * sh * sw
        gi = cuda.blockIdx.z // nph
        q = cuda.blockIdx.z % nph
        q_w = q % sw
        q_h = (q // sw) % sh
        q_d = q // (sw * sh)
        # axis_phase(q, s, d, p, k, i) per axis, inlined; phs[a] = t0 tstep nt c0 ostep j0 nj
        phs = cuda.local.array((3, 7), int64)
        for a in range(3):
            qa = q_w if a == 2 else (q_h if a == 1 else q_d)
            s = geo[13 + a]
            d = geo[16 + a]
            u = s
            v = d
            while v != 0:
                u, v = v, u % v
            tstep = s // u
            t0 = -1
            for t in range(tstep):
                if (t * d) % s == qa:
                    t0 = t
                    break
            phs[a, 0] = t0
            phs[a, 1] = tstep
            phs[a, 2] = 0
            phs[a, 3] = 0
            phs[a, 4] = d // u
            if t0 >= 0 and t0 < geo[7 + a]:
                phs[a, 2] = (geo[7 + a] - t0 + tstep - 1) // tstep
                phs[a, 3] = (t0 * d - qa) // s
            j0 = (geo[19 + a] - qa + s - 1) // s
            phs[a, 5] = j0
            nj = (geo[4 + a] + geo[19 + a] - qa + s - 1) // s - j0
            phs[a, 6] = nj if nj > 0 else 0  # (the builtin max would be a device function)
        t0d, tsd, ntd, c0d, osd, j0d, njd = phs[0, 0], phs[0, 1], phs[0, 2], phs[0, 3], phs[0, 4], phs[0, 5], phs[0, 6]
        t0h, tsh, nth, c0h, osh, j0h, njh = phs[1, 0], phs[1, 1], phs[1, 2], phs[1, 3], phs[1, 4], phs[1, 5], phs[1, 6]
        t0w, tsw, ntw, c0w, osw, j0w, njw = phs[2, 0], phs[2, 1], phs[2, 2], phs[2, 3], phs[2, 4], phs[2, 5], phs[2, 6]
        M = mb * njd * njh * njw
        if m0 >= M:  # uniform over the block: phases differ in size
            return
        K = ntd * nth * ntw * ocg
        yc = gi * ocg
        for a in range(tm):
            for b in range(tn):
                acc[a, b] = T(0)
        for l in range(a_loads):
            m = m0 + (tid + l * nt) // bk
            ln[l] = -1
            if m < M:
                j_w = m % njw
                r = m // njw
                j_h = r % njh
                r = r // njh
                ln[l] = r // njd
                lbd[l] = j0d + r % njd - c0d
                lbh[l] = j0h + j_h - c0h
                lbw[l] = j0w + j_w - c0w
        for k0 in range(0, K, bk):
            for l in range(a_loads):
                e = tid + l * nt
                if e < bm * bk:
                    kk = e % bk
                    k = k0 + kk
                    v = T(0)
                    if ln[l] >= 0 and k < K:
                        u = k // ocg
                        o_w = lbw[l] - (u % ntw) * osw
                        o_h = lbh[l] - ((u // ntw) % nth) * osh
                        o_d = lbd[l] - (u // (ntw * nth)) * osd
                        if (o_d >= 0 and o_d < od and o_h >= 0 and o_h < oh
                                and o_w >= 0 and o_w < ow):
                            v = dy[ln[l], o_d, o_h, o_w, yc + k % ocg]
                    As[kk, e // bk] = v
            for l in range(b_loads):
                e = tid + l * nt
                if e < bk * bn:
                    kk = e % bk
                    nn = e // bk
                    k = k0 + kk
                    v = T(0)
                    if k < K and n0 + nn < icg:
                        u = k // ocg
                        v = w[t0d + (u // (ntw * nth)) * tsd, t0h + ((u // ntw) % nth) * tsh,
                              t0w + (u % ntw) * tsw, n0 + nn, yc + k % ocg]
                    Bs[kk, nn] = v
            cuda.syncthreads()
            for kk in range(bk):
                for a in range(tm):
                    ra[a] = As[kk, ty + a * nty]
                for b in range(tn):
                    rb[b] = Bs[kk, tx + b * ntx]
                for a in range(tm):
                    for b in range(tn):
                        acc[a, b] += ra[a] * rb[b]
            cuda.syncthreads()
        for a in range(tm):
            m = m0 + ty + a * nty
            if m < M:
                j_w = m % njw
                r = m // njw
                j_h = r % njh
                r = r // njh
                i_d = (j0d + r % njd) * sd + q_d - pd
                n = r // njd
                i_h = (j0h + j_h) * sh + q_h - ph
                i_w = (j0w + j_w) * sw + q_w - pw
                for b in range(tn):
                    col = tx + b * ntx
                    if n0 + col < icg:
                        dx[n, i_d, i_h, i_w, gi * icg + n0 + col] = acc[a, b]

    return cuda.jit(bwd_d_gemm)


@functools.lru_cache(maxsize=None)
def bwd_w_gemm(dtype, bm, bn, bk, tm, tn):
    """Split-K weight gradient: ``part[j, t, c, gi*ocg + k] = sum_{pixels of split j} x * dy``.

    Grid ``(ceil(kd*kh*kw*icg/bm), ceil(ocg/bn), g*nsplit)`` with ``nsplit = part.shape[0]``;
    every element of ``part`` is written once. Split ``j`` sums the output pixels
    ``[P*j // nsplit, P*(j+1) // nsplit)`` of ``P = mb*od*oh*ow``.
    """
    _check(bm, bn, bk, tm, tn)
    T = _TYPES[dtype]
    nty = bm // tm
    ntx = bn // tn
    nt = nty * ntx
    a_loads = (bm * bk + nt - 1) // nt
    b_loads = (bk * bn + nt - 1) // nt

    def bwd_w_gemm(x, dy, part, geo):
        As = cuda.shared.array((bk, bm), T)
        Bs = cuda.shared.array((bk, bn), T)
        acc = cuda.local.array((tm, tn), T)
        ra = cuda.local.array(tm, T)
        rb = cuda.local.array(tn, T)
        lc = cuda.local.array(a_loads, int64)
        ltd = cuda.local.array(a_loads, int64)
        lth = cuda.local.array(a_loads, int64)
        ltw = cuda.local.array(a_loads, int64)
        mb, icg, ocg = geo[0], geo[2], geo[3]
        id_, ih, iw = geo[4], geo[5], geo[6]
        kd, kh, kw = geo[7], geo[8], geo[9]
        od, oh, ow = geo[10], geo[11], geo[12]
        sd, sh, sw = geo[13], geo[14], geo[15]
        tid = cuda.threadIdx.x
        tx = tid % ntx
        ty = tid // ntx
        m0 = cuda.blockIdx.x * bm
        n0 = cuda.blockIdx.y * bn
        nsplit = part.shape[0]
        gi = cuda.blockIdx.z // nsplit
        sp = cuda.blockIdx.z % nsplit
        M = kd * kh * kw * icg
        P = mb * od * oh * ow
        kb = P * sp // nsplit
        ke = P * (sp + 1) // nsplit
        yc = gi * ocg + n0
        for a in range(tm):
            for b in range(tn):
                acc[a, b] = T(0)
        for l in range(a_loads):
            m = m0 + (tid + l * nt) % bm
            lc[l] = -1
            if m < M:
                lc[l] = gi * icg + m % icg
                t = m // icg
                ltw[l] = (t % kw) * geo[18] - geo[21]
                lth[l] = ((t // kw) % kh) * geo[17] - geo[20]
                ltd[l] = (t // (kw * kh)) * geo[16] - geo[19]
        for k0 in range(kb, ke, bk):
            for l in range(a_loads):
                e = tid + l * nt
                if e < bm * bk:
                    kk = e // bm
                    k = k0 + kk
                    v = T(0)
                    if lc[l] >= 0 and k < ke:
                        o_w = k % ow
                        r = k // ow
                        o_h = r % oh
                        r = r // oh
                        i_d = (r % od) * sd + ltd[l]
                        i_h = o_h * sh + lth[l]
                        i_w = o_w * sw + ltw[l]
                        if (i_d >= 0 and i_d < id_ and i_h >= 0 and i_h < ih
                                and i_w >= 0 and i_w < iw):
                            v = x[r // od, i_d, i_h, i_w, lc[l]]
                    As[kk, e % bm] = v
            for l in range(b_loads):
                e = tid + l * nt
                if e < bk * bn:
                    nn = e % bn
                    kk = e // bn
                    k = k0 + kk
                    v = T(0)
                    if k < ke and n0 + nn < ocg:
                        o_w = k % ow
                        r = k // ow
                        o_h = r % oh
                        r = r // oh
                        v = dy[r // od, r % od, o_h, o_w, yc + nn]
                    Bs[kk, nn] = v
            cuda.syncthreads()
            for kk in range(bk):
                for a in range(tm):
                    ra[a] = As[kk, ty + a * nty]
                for b in range(tn):
                    rb[b] = Bs[kk, tx + b * ntx]
                for a in range(tm):
                    for b in range(tn):
                        acc[a, b] += ra[a] * rb[b]
            cuda.syncthreads()
        for a in range(tm):
            m = m0 + ty + a * nty
            if m < M:
                c = m % icg
                t = m // icg
                t_w = t % kw
                t_h = (t // kw) % kh
                t_d = t // (kw * kh)
                for b in range(tn):
                    col = tx + b * ntx
                    if n0 + col < ocg:
                        part[sp, t_d, t_h, t_w, c, yc + col] = acc[a, b]

    return cuda.jit(bwd_w_gemm)


@functools.lru_cache(maxsize=None)
def reduce_partials(dtype):
    """``out[e] = sum_j part[j, e]`` in the order ``j = 0, 1, ...`` (deterministic)."""
    def reduce_partials(part, out):
        nsplit = part.shape[0]
        e = cuda.grid(1)
        step = cuda.gridsize(1)
        while e < out.shape[0]:
            acc = part[0, e]
            for j in range(1, nsplit):
                acc += part[j, e]
            out[e] = acc
            e += step

    return cuda.jit(reduce_partials)
