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

Kernels take flat (1-D) views of the canonical contiguous arrays, the geometry as a tuple
of 22 ints (see :func:`numbaconv.kernels.geometry`) and validate nothing. Each thread's
share of a tile load is decoded into a pixel once per tap (forward, backward data) or per
output row (weights), so the K loop does no 64-bit division. float16 never reaches them: the
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


def _loads(bm, bn, bk, tm, tn):
    nty = bm // tm
    ntx = bn // tn
    nt = nty * ntx
    return nty, ntx, nt, (bm * bk + nt - 1) // nt, (bk * bn + nt - 1) // nt


@functools.lru_cache(maxsize=None)
def fwd_gemm(dtype, bm, bn, bk, tm, tn):
    """``y[n, o, gi*ocg + col] = sum_{t, c} x[n, o*s - p + t*d, gi*icg + c] * w[t, c, gi*ocg + col]``.

    ``x``, ``w`` and ``y`` are flat (1-D views of the canonical arrays). Grid
    ``(ceil(M/bm), ceil(ocg/bn), g)``, ``(bm/tm)*(bn/tn)`` threads; ``y`` is fully written.
    ``K`` runs tap by tap and, within a tap, over channel slices of ``bk``: the input
    position of each of a thread's A loads is worked out once per tap, so the slice loop
    does no division (the 64-bit divisions of a per-element decode cost ten times the
    multiply-adds on a GPU).
    """
    _check(bm, bn, bk, tm, tn)
    T = _TYPES[dtype]
    nty, ntx, nt, a_loads, b_loads = _loads(bm, bn, bk, tm, tn)
    pm = bm + 1  # padded rows (a closure constant: shared shapes must be literal)

    def fwd_gemm(x, w, y, geo):
        # As rows padded by one: the loads store with kk fastest, bm apart
        As = cuda.shared.array((bk, pm), T)
        Bs = cuda.shared.array((bk, bn), T)
        acc = cuda.local.array((tm, tn), T)
        ra = cuda.local.array(tm, T)
        rb = cuda.local.array(tn, T)
        # per A load: image's first row (n*id), first input plane/row/col (o*s - p), and the
        # flat offset of the current tap's pixel (-1: outside the image or past M)
        lbase = cuda.local.array(a_loads, int64)
        lbd = cuda.local.array(a_loads, int64)
        lbh = cuda.local.array(a_loads, int64)
        lbw = cuda.local.array(a_loads, int64)
        loff = cuda.local.array(a_loads, int64)
        mb, g, icg, ocg = geo[0], geo[1], geo[2], geo[3]
        id_, ih, iw = geo[4], geo[5], geo[6]
        kd, kh, kw = geo[7], geo[8], geo[9]
        od, oh, ow = geo[10], geo[11], geo[12]
        sd, sh, sw = geo[13], geo[14], geo[15]
        dd, dh, dw = geo[16], geo[17], geo[18]
        pd, ph, pw = geo[19], geo[20], geo[21]
        ic = g * icg
        oc = g * ocg
        tid = cuda.threadIdx.x
        tx = tid % ntx
        ty = tid // ntx
        m0 = cuda.blockIdx.x * bm
        n0 = cuda.blockIdx.y * bn
        gi = cuda.blockIdx.z
        M = mb * od * oh * ow
        xc = gi * icg
        wc = gi * ocg + n0
        for a in range(tm):
            for b in range(tn):
                acc[a, b] = T(0)
        for l in range(a_loads):
            m = m0 + (tid + l * nt) // bk
            lbase[l] = -1
            if m < M:
                o_w = m % ow
                r = m // ow
                o_h = r % oh
                r = r // oh
                lbase[l] = (r // od) * id_
                lbd[l] = (r % od) * sd - pd
                lbh[l] = o_h * sh - ph
                lbw[l] = o_w * sw - pw
        for t in range(kd * kh * kw):
            t_w = t % kw
            t_h = (t // kw) % kh
            t_d = t // (kw * kh)
            for l in range(a_loads):
                loff[l] = -1
                if lbase[l] >= 0:
                    i_d = lbd[l] + t_d * dd
                    i_h = lbh[l] + t_h * dh
                    i_w = lbw[l] + t_w * dw
                    if (i_d >= 0 and i_d < id_ and i_h >= 0 and i_h < ih
                            and i_w >= 0 and i_w < iw):
                        loff[l] = (((lbase[l] + i_d) * ih + i_h) * iw + i_w) * ic + xc
            wt = t * icg * oc + wc
            for c0 in range(0, icg, bk):
                for l in range(a_loads):
                    e = tid + l * nt
                    if e < bm * bk:
                        kk = e % bk
                        c = c0 + kk
                        v = T(0)
                        if loff[l] >= 0 and c < icg:
                            v = x[loff[l] + c]
                        As[kk, e // bk] = v
                for l in range(b_loads):
                    e = tid + l * nt
                    if e < bk * bn:
                        nn = e % bn
                        c = c0 + e // bn
                        v = T(0)
                        if c < icg and n0 + nn < ocg:
                            v = w[wt + c * oc + nn]
                        Bs[e // bn, nn] = v
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
                for b in range(tn):
                    col = tx + b * ntx
                    if n0 + col < ocg:
                        y[m * oc + wc + col] = acc[a, b]

    return cuda.jit(fwd_gemm)


@functools.lru_cache(maxsize=None)
def bwd_d_gemm(dtype, bm, bn, bk, tm, tn):
    """``dx`` by stride phase: ``dx[n, i, gi*icg + c] = sum dy[n, o, gi*ocg + k] * w[t, c, gi*ocg + k]``.

    Flat ``dy``, ``w``, ``dx``. Grid ``(ceil(max_phase_M/bm), ceil(icg/bn), g*sd*sh*sw)``;
    every element of ``dx`` belongs to exactly one phase and is written once (zeros where no
    tap reaches it). ``K`` runs over the phase's taps and, within a tap, over slices of
    ``bk`` output channels (no division in the slice loop, as in :func:`fwd_gemm`).
    """
    _check(bm, bn, bk, tm, tn)
    T = _TYPES[dtype]
    nty, ntx, nt, a_loads, b_loads = _loads(bm, bn, bk, tm, tn)
    pm = bm + 1  # padded rows (a closure constant: shared shapes must be literal)
    pn = bn + 1

    def bwd_d_gemm(dy, w, dx, geo):
        # both tiles store with kk fastest: rows padded by one
        As = cuda.shared.array((bk, pm), T)
        Bs = cuda.shared.array((bk, pn), T)
        acc = cuda.local.array((tm, tn), T)
        ra = cuda.local.array(tm, T)
        rb = cuda.local.array(tn, T)
        lbase = cuda.local.array(a_loads, int64)
        lbd = cuda.local.array(a_loads, int64)
        lbh = cuda.local.array(a_loads, int64)
        lbw = cuda.local.array(a_loads, int64)
        loff = cuda.local.array(a_loads, int64)
        mb, g, icg, ocg = geo[0], geo[1], geo[2], geo[3]
        id_, ih, iw = geo[4], geo[5], geo[6]
        kh, kw = geo[8], geo[9]
        od, oh, ow = geo[10], geo[11], geo[12]
        sd, sh, sw = geo[13], geo[14], geo[15]
        pd, ph, pw = geo[19], geo[20], geo[21]
        ic = g * icg
        oc = g * ocg
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
        yc = gi * ocg
        for a in range(tm):
            for b in range(tn):
                acc[a, b] = T(0)
        for l in range(a_loads):
            m = m0 + (tid + l * nt) // bk
            lbase[l] = -1
            if m < M:
                j_w = m % njw
                r = m // njw
                j_h = r % njh
                r = r // njh
                lbase[l] = (r // njd) * od
                lbd[l] = j0d + r % njd - c0d
                lbh[l] = j0h + j_h - c0h
                lbw[l] = j0w + j_w - c0w
        for u in range(ntd * nth * ntw):
            u_w = u % ntw
            u_h = (u // ntw) % nth
            u_d = u // (ntw * nth)
            for l in range(a_loads):
                loff[l] = -1
                if lbase[l] >= 0:
                    o_d = lbd[l] - u_d * osd
                    o_h = lbh[l] - u_h * osh
                    o_w = lbw[l] - u_w * osw
                    if (o_d >= 0 and o_d < od and o_h >= 0 and o_h < oh
                            and o_w >= 0 and o_w < ow):
                        loff[l] = (((lbase[l] + o_d) * oh + o_h) * ow + o_w) * oc + yc
            wt = (((t0d + u_d * tsd) * kh + t0h + u_h * tsh) * kw + t0w + u_w * tsw) * icg * oc + yc
            for k0 in range(0, ocg, bk):
                for l in range(a_loads):
                    e = tid + l * nt
                    if e < bm * bk:
                        kk = e % bk
                        k = k0 + kk
                        v = T(0)
                        if loff[l] >= 0 and k < ocg:
                            v = dy[loff[l] + k]
                        As[kk, e // bk] = v
                for l in range(b_loads):
                    e = tid + l * nt
                    if e < bk * bn:
                        kk = e % bk
                        nn = e // bk
                        k = k0 + kk
                        v = T(0)
                        if k < ocg and n0 + nn < icg:
                            v = w[wt + (n0 + nn) * oc + k]
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
                base = (((n * id_ + i_d) * ih + i_h) * iw + i_w) * ic + gi * icg + n0
                for b in range(tn):
                    col = tx + b * ntx
                    if n0 + col < icg:
                        dx[base + col] = acc[a, b]

    return cuda.jit(bwd_d_gemm)


@functools.lru_cache(maxsize=None)
def bwd_w_gemm(dtype, bm, bn, bk, tm, tn):
    """Split-K weight gradient: ``part[j, t, c, gi*ocg + k] = sum_{pixels of split j} x * dy``.

    Flat ``x`` and ``dy``; ``part`` is ``[nsplit, kd*kh*kw*icg*oc]``. Grid
    ``(ceil(kd*kh*kw*icg/bm), ceil(ocg/bn), g*nsplit)``; every element of ``part`` is
    written once. ``K`` (the output pixels) runs in chunks of ``bk`` pixels of one output
    row: ``Q = mb*od*oh*ceil(ow/bk)`` chunks, split ``j`` summing chunks
    ``[Q*j // nsplit, Q*(j+1) // nsplit)``; the chunk's row is advanced by counters, not
    decoded by division.
    """
    _check(bm, bn, bk, tm, tn)
    T = _TYPES[dtype]
    nty, ntx, nt, a_loads, b_loads = _loads(bm, bn, bk, tm, tn)

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
        mb, g, icg, ocg = geo[0], geo[1], geo[2], geo[3]
        id_, ih, iw = geo[4], geo[5], geo[6]
        kd, kh, kw = geo[7], geo[8], geo[9]
        od, oh, ow = geo[10], geo[11], geo[12]
        sd, sh, sw = geo[13], geo[14], geo[15]
        ic = g * icg
        oc = g * ocg
        tid = cuda.threadIdx.x
        tx = tid % ntx
        ty = tid // ntx
        m0 = cuda.blockIdx.x * bm
        n0 = cuda.blockIdx.y * bn
        nsplit = part.shape[0]
        gi = cuda.blockIdx.z // nsplit
        sp = cuda.blockIdx.z % nsplit
        M = kd * kh * kw * icg
        nchunk = (ow + bk - 1) // bk
        Q = mb * od * oh * nchunk
        qb = Q * sp // nsplit
        qe = Q * (sp + 1) // nsplit
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
        # the first chunk's row (n, o_d, o_h) and first column
        ow0 = (qb % nchunk) * bk
        r = qb // nchunk
        o_h = r % oh
        r = r // oh
        o_d = r % od
        n = r // od
        for q in range(qb, qe):
            yrow = ((n * od + o_d) * oh + o_h) * ow
            for l in range(a_loads):
                e = tid + l * nt
                if e < bm * bk:
                    kk = e // bm
                    o_w = ow0 + kk
                    v = T(0)
                    if lc[l] >= 0 and o_w < ow:
                        i_d = o_d * sd + ltd[l]
                        i_h = o_h * sh + lth[l]
                        i_w = o_w * sw + ltw[l]
                        if (i_d >= 0 and i_d < id_ and i_h >= 0 and i_h < ih
                                and i_w >= 0 and i_w < iw):
                            v = x[(((n * id_ + i_d) * ih + i_h) * iw + i_w) * ic + lc[l]]
                    As[kk, e % bm] = v
            for l in range(b_loads):
                e = tid + l * nt
                if e < bk * bn:
                    nn = e % bn
                    kk = e // bn
                    o_w = ow0 + kk
                    v = T(0)
                    if o_w < ow and n0 + nn < ocg:
                        v = dy[(yrow + o_w) * oc + yc + nn]
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
            ow0 += bk
            if ow0 >= ow:
                ow0 = 0
                o_h += 1
                if o_h >= oh:
                    o_h = 0
                    o_d += 1
                    if o_d >= od:
                        o_d = 0
                        n += 1
        for a in range(tm):
            m = m0 + ty + a * nty
            if m < M:
                for b in range(tn):
                    col = tx + b * ntx
                    if n0 + col < ocg:
                        part[sp, m * oc + yc + col] = acc[a, b]

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
