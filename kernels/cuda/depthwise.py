"""Depthwise CUDA kernels: one result element per thread, channels across threads.

Depthwise problems (``g == ic``, ``icg == 1``, channel multiplier ``ocg``) have no GEMM to
speak of (``K`` is the number of taps) and are bound by memory bandwidth (docs/performance.md), so
these kernels read each operand in channels-last order with consecutive threads on
consecutive channels (coalesced) and accumulate in a register. They loop over ``icg`` and
``ocg`` as well, so they are correct for every grouping (the planner's GPU ``direct``).

* forward: a thread per ``y[n, o, k]``: ``sum_{t, c} x[n, o*s - p + t*d, gi*icg + c] * w[t, c, k]``.
* backward data: a thread per ``dx[n, i, cc]``, gathering the taps with
  ``(i + p - t*d) % s == 0`` (no scatter, each element written once).
* backward weights: a thread per ``dw[t, c, k]`` and per split of the output rows
  (``blockIdx.y``), into its own partial buffer, reduced afterwards in a fixed order by
  :func:`numbaconv.kernels.cuda.gemm.reduce_partials` (deterministic, no atomics).
"""
import functools

from numba import cuda, float32, float64, int64, uint64

_TYPES = {"float32": float32, "float64": float64}


@functools.lru_cache(maxsize=None)
def fwd_depthwise(dtype):
    """Grid-stride over ``y`` (``[mb, od, oh, ow, oc]``, fully written)."""
    T = _TYPES[dtype]

    def fwd_depthwise(x, w, y, geo):
        mb, g, icg, ocg = geo[0], geo[1], geo[2], geo[3]
        id_, ih, iw = geo[4], geo[5], geo[6]
        kd, kh, kw = geo[7], geo[8], geo[9]
        od, oh, ow = geo[10], geo[11], geo[12]
        sd, sh, sw = geo[13], geo[14], geo[15]
        dd, dh, dw = geo[16], geo[17], geo[18]
        pd, ph, pw = geo[19], geo[20], geo[21]
        oc = g * ocg
        size = mb * od * oh * ow * oc
        e = cuda.grid(1)
        step = cuda.gridsize(1)
        while e < size:
            k = e % oc
            r = e // oc
            o_w = r % ow
            r = r // ow
            o_h = r % oh
            r = r // oh
            o_d = r % od
            n = r // od
            xc = (k // ocg) * icg
            acc = T(0)
            for t_d in range(kd):
                i_d = o_d * sd - pd + t_d * dd
                if i_d < 0 or i_d >= id_:
                    continue
                for t_h in range(kh):
                    i_h = o_h * sh - ph + t_h * dh
                    if i_h < 0 or i_h >= ih:
                        continue
                    for t_w in range(kw):
                        i_w = o_w * sw - pw + t_w * dw
                        if i_w < 0 or i_w >= iw:
                            continue
                        for c in range(icg):
                            acc += x[n, i_d, i_h, i_w, xc + c] * w[t_d, t_h, t_w, c, k]
            y[n, o_d, o_h, o_w, k] = acc
            e += step

    return cuda.jit(fwd_depthwise)


@functools.lru_cache(maxsize=None)
def bwd_d_depthwise(dtype):
    """Grid-stride over ``dx`` (``[mb, id, ih, iw, ic]``, fully written).

    Per axis, the taps that reach input ``i`` are ``t0, t0 + ts, ...`` (``ts = s/gcd(s, d)``)
    reading outputs ``o0, o0 - os, ...`` (``os = d/gcd(s, d)``): found once per element, so
    the tap loops step without a division (testing every tap for ``(i + p - t*d) % s == 0``
    cost a 64-bit division per tap and axis).
    """
    T = _TYPES[dtype]

    def bwd_d_depthwise(dy, w, dx, geo):
        mb, g, icg, ocg = geo[0], geo[1], geo[2], geo[3]
        id_, ih, iw = geo[4], geo[5], geo[6]
        kd, kh, kw = geo[7], geo[8], geo[9]
        od, oh, ow = geo[10], geo[11], geo[12]
        ic = g * icg
        size = mb * id_ * ih * iw * ic
        # per axis: first tap, its output (per element), tap step, output step (per call)
        ax = cuda.local.array((3, 4), int64)
        for a in range(3):
            s = geo[13 + a]
            d = geo[16 + a]
            u = s
            v = d
            while v != 0:
                u, v = v, u % v
            ax[a, 2] = s // u
            ax[a, 3] = d // u
        e = cuda.grid(1)
        step = cuda.gridsize(1)
        while e < size:
            cc = e % ic
            r = e // ic
            i_w = r % iw
            r = r // iw
            i_h = r % ih
            r = r // ih
            i_d = r % id_
            n = r // id_
            c = cc % icg
            k0 = (cc // icg) * ocg
            for a in range(3):
                s = geo[13 + a]
                d = geo[16 + a]
                k = geo[7 + a]
                pos = (i_w if a == 2 else (i_h if a == 1 else i_d)) + geo[19 + a]
                t0 = k
                for t in range(ax[a, 2]):
                    if t < k and (pos - t * d) % s == 0:
                        t0 = t
                        break
                ax[a, 0] = t0
                ax[a, 1] = (pos - t0 * d) // s
            acc = T(0)
            t_d = ax[0, 0]
            o_d = ax[0, 1]
            while t_d < kd and o_d >= 0:
                if o_d < od:
                    t_h = ax[1, 0]
                    o_h = ax[1, 1]
                    while t_h < kh and o_h >= 0:
                        if o_h < oh:
                            t_w = ax[2, 0]
                            o_w = ax[2, 1]
                            while t_w < kw and o_w >= 0:
                                if o_w < ow:
                                    for k in range(k0, k0 + ocg):
                                        acc += dy[n, o_d, o_h, o_w, k] * w[t_d, t_h, t_w, c, k]
                                t_w += ax[2, 2]
                                o_w -= ax[2, 3]
                        t_h += ax[1, 2]
                        o_h -= ax[1, 3]
                t_d += ax[0, 2]
                o_d -= ax[0, 3]
            dx[n, i_d, i_h, i_w, cc] = acc
            e += step

    return cuda.jit(bwd_d_depthwise)


@functools.lru_cache(maxsize=None)
def bwd_w_depthwise(dtype):
    """``part[j, t, c, k]`` (every element written) over output rows of split ``j = blockIdx.y``.

    Grid ``(ceil(kd*kh*kw*icg*oc / threads), nsplit)``; split ``j`` sums the output rows
    ``[R*j // nsplit, R*(j+1) // nsplit)`` of ``R = mb*od*oh``.
    """
    T = _TYPES[dtype]

    def bwd_w_depthwise(x, dy, part, geo):
        mb, g, icg, ocg = geo[0], geo[1], geo[2], geo[3]
        id_, ih, iw = geo[4], geo[5], geo[6]
        kd, kh, kw = geo[7], geo[8], geo[9]
        od, oh, ow = geo[10], geo[11], geo[12]
        sd, sh, sw = geo[13], geo[14], geo[15]
        dd, dh, dw = geo[16], geo[17], geo[18]
        pd, ph, pw = geo[19], geo[20], geo[21]
        oc = g * ocg
        e = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if e >= kd * kh * kw * icg * oc:
            return
        nsplit = part.shape[0]
        sp = cuda.blockIdx.y
        rows = mb * od * oh
        r0 = rows * sp // nsplit
        r1 = rows * (sp + 1) // nsplit
        k = e % oc
        r = e // oc
        c = r % icg
        r = r // icg
        t_w = r % kw
        r = r // kw
        t_h = r % kh
        t_d = r // kh
        xc = (k // ocg) * icg + c
        acc = T(0)
        for row in range(r0, r1):
            o_h = row % oh
            o_d = (row // oh) % od
            n = row // (oh * od)
            i_d = o_d * sd - pd + t_d * dd
            i_h = o_h * sh - ph + t_h * dh
            if i_d < 0 or i_d >= id_ or i_h < 0 or i_h >= ih:
                continue
            for o_w in range(ow):
                i_w = o_w * sw - pw + t_w * dw
                if i_w >= 0 and i_w < iw:
                    acc += x[n, i_d, i_h, i_w, xc] * dy[n, o_d, o_h, o_w, k]
        part[sp, t_d, t_h, t_w, c, k] = acc

    return cuda.jit(bwd_w_depthwise)


# -- row kernels: depthwise proper (icg == 1), geometry as compile-time constants --------------
#
# A block of ``CT * nseg`` threads owns one row of results (fixed ``n`` and the two outer
# spatial coordinates), ``CT`` consecutive channels (lane ``cl``, coalesced) and
# ``WT = nseg * rw`` consecutive positions along the last axis (thread segment ``sg`` owns
# ``rw`` of them, accumulated in registers). The block first stages every source row it
# needs (one per outer tap pair, ``SPAN`` positions x ``CT`` channels) in shared memory, with
# zeros where a row or position lies outside the image, and the thread its filter taps in
# registers; the multiply-adds then read shared memory at the thread's base plus
# compile-time offsets, with no bounds test, division or index arithmetic of their own.

CT = 32    # channels per block (one warp's lanes)


def fwd_rows_span(geo, rw, nseg):
    """Source positions a block stages per row (forward)."""
    kw, sw, dw = geo[9], geo[15], geo[18]
    return (nseg * rw - 1) * sw + (kw - 1) * dw + 1


def bwd_d_rows_span(geo, rw, nseg):
    """``(first offset, positions)`` of the ``dy`` row a block stages (backward data)."""
    kw, pw, sw, dw = geo[9], geo[21], geo[15], geo[18]
    ob0 = (pw - (kw - 1) * dw) // sw
    return ob0, (nseg * rw - 1 + pw) // sw - ob0 + 1


@functools.lru_cache(maxsize=256)
def fwd_depthwise_rows(dtype, geo, rw, nseg):
    """``y[n, o, k] = sum_t x[n, o*s - p + t*d, k // ocg] * w[t, 0, k]`` for ``icg == 1``.

    Flat ``x``, ``w``, ``y``. Grid ``(mb*od*oh*ceil(ow/WT), ceil(oc/CT))``, ``CT*nseg``
    threads; ``y`` fully written.
    """
    T = _TYPES[dtype]
    MB, G, ICG, OCG, ID, IH, IW, KD, KH, KW, OD, OH, OW, SD, SH, SW, DD, DH, DW, PD, PH, PW = geo
    IC, OC = G * ICG, G * OCG
    WT = nseg * rw
    NSEG = nseg
    NWT = -(-OW // WT)
    SPAN = fwd_rows_span(geo, rw, nseg)
    ROWS = KD * KH
    KT = ROWS * KW
    SSZ = ROWS * SPAN * CT
    RW = rw

    def fwd_depthwise_rows(x, w, y):
        S = cuda.shared.array(SSZ, T)
        wr = cuda.local.array(KT, T)
        acc = cuda.local.array(RW, T)
        tid = cuda.threadIdx.x
        cl = tid % CT
        sg = tid // CT
        bx = cuda.blockIdx.x
        w0 = (bx % NWT) * WT
        r = bx // NWT
        o_h = r % OH
        r = r // OH
        o_d = r % OD
        n = r // OD
        k = cuda.blockIdx.y * CT + cl
        for t in range(KT):
            wr[t] = w[uint64(t * OC + k)] if k < OC else T(0)
        for e in range(tid, SSZ, CT * NSEG):
            c = e % CT
            s = (e // CT) % SPAN
            row = e // (CT * SPAN)
            i_d = o_d * SD - PD + (row // KH) * DD
            i_h = o_h * SH - PH + (row % KH) * DH
            i_w = w0 * SW - PW + s
            kc = cuda.blockIdx.y * CT + c
            v = T(0)
            if (kc < OC and i_d >= 0 and i_d < ID and i_h >= 0 and i_h < IH
                    and i_w >= 0 and i_w < IW):
                v = x[uint64((((n * ID + i_d) * IH + i_h) * IW + i_w) * IC + kc // OCG)]
            S[uint64(e)] = v
        cuda.syncthreads()
        base = sg * RW * SW * CT + cl
        for q in range(RW):
            acc[q] = T(0)
        for row in range(ROWS):
            for q in range(RW):
                for tw in range(KW):
                    acc[q] += (S[uint64(base + (row * SPAN + q * SW + tw * DW) * CT)]
                               * wr[row * KW + tw])
        if k < OC:
            for q in range(RW):
                o_w = w0 + sg * RW + q
                if o_w < OW:
                    y[uint64((((n * OD + o_d) * OH + o_h) * OW + o_w) * OC + k)] = acc[q]

    return cuda.jit(fwd_depthwise_rows)


@functools.lru_cache(maxsize=256)
def bwd_d_depthwise_rows(dtype, geo, rw, nseg):
    """``dx[n, i, c] = sum_t dy[n, (i + p - t*d)/s, c] * w[t, 0, c]`` (the taps where the
    division is exact) for ``icg == ocg == 1``.

    Flat ``dy``, ``w``, ``dx``. Grid ``(mb*id*ih*ceil(iw/WT), ceil(ic/CT))``; ``rw`` a
    multiple of the last stride, so that which taps reach each of a thread's positions is
    known at compile time; the outer axes' taps that miss a row stage zeros.
    """
    T = _TYPES[dtype]
    MB, G, ICG, OCG, ID, IH, IW, KD, KH, KW, OD, OH, OW, SD, SH, SW, DD, DH, DW, PD, PH, PW = geo
    C = G
    WT = nseg * rw
    NSEG = nseg
    NWT = -(-IW // WT)
    OB0, SPAN = bwd_d_rows_span(geo, rw, nseg)
    ROWS = KD * KH
    KT = ROWS * KW
    SSZ = ROWS * SPAN * CT
    RW = rw
    RS = rw // SW

    def bwd_d_depthwise_rows(dy, w, dx):
        S = cuda.shared.array(SSZ, T)
        wr = cuda.local.array(KT, T)
        acc = cuda.local.array(RW, T)
        tid = cuda.threadIdx.x
        cl = tid % CT
        sg = tid // CT
        bx = cuda.blockIdx.x
        w0 = (bx % NWT) * WT
        r = bx // NWT
        i_h = r % IH
        r = r // IH
        i_d = r % ID
        n = r // ID
        c = cuda.blockIdx.y * CT + cl
        for t in range(KT):
            wr[t] = w[uint64(t * C + c)] if c < C else T(0)
        for e in range(tid, SSZ, CT * NSEG):
            cc = cuda.blockIdx.y * CT + e % CT
            s = (e // CT) % SPAN
            row = e // (CT * SPAN)
            a_d = i_d + PD - (row // KH) * DD
            a_h = i_h + PH - (row % KH) * DH
            o_d = a_d // SD
            o_h = a_h // SH
            o_w = w0 // SW + OB0 + s
            v = T(0)
            if (cc < C and a_d >= 0 and a_d == o_d * SD and o_d < OD and a_h >= 0
                    and a_h == o_h * SH and o_h < OH and o_w >= 0 and o_w < OW):
                v = dy[uint64((((n * OD + o_d) * OH + o_h) * OW + o_w) * C + cc)]
            S[uint64(e)] = v
        cuda.syncthreads()
        base = (sg * RS - OB0) * CT + cl
        for q in range(RW):
            acc[q] = T(0)
        for row in range(ROWS):
            for q in range(RW):
                for tw in range(KW):
                    if (q + PW - tw * DW) % SW == 0:
                        acc[q] += (S[uint64(base + (row * SPAN + (q + PW - tw * DW) // SW) * CT)]
                                   * wr[row * KW + tw])
        if c < C:
            for q in range(RW):
                i_w = w0 + sg * RW + q
                if i_w < IW:
                    dx[uint64((((n * ID + i_d) * IH + i_h) * IW + i_w) * C + c)] = acc[q]

    return cuda.jit(bwd_d_depthwise_rows)


def bwd_w_rows_tiles(geo, rw, nseg):
    """``(column tiles, interior segments' first and last output column)`` of the weight
    gradient's row kernel: a block covers ``WT = nseg * rw`` output columns; a segment whose
    ``rw`` outputs and every input column they read lie inside the image (no padding) takes
    the kernel's loop without bounds tests."""
    kw, iw, ow, sw, dw, pw = geo[9], geo[6], geo[12], geo[15], geo[18], geo[21]
    lo = -(-pw // sw)  # first output whose first tap's column is >= 0
    # last output whose last tap's column is < iw
    hi = min(ow - 1, (iw - 1 + pw - (kw - 1) * dw) // sw)
    return -(-ow // (nseg * rw)), lo, hi


@functools.lru_cache(maxsize=256)
def bwd_w_depthwise_rows(dtype, geo, rw, nseg, nsplit):
    """``part[j, t, 0, k] = sum x[n, o*s - p + t*d, k // ocg] * dy[n, o, k]`` over the
    output rows and column tile of partial ``j``, for ``icg == 1``.

    Flat ``x``, ``dy``, ``part`` (``[nsplit, kd*kh*kw*oc]``, fully written). Grid
    ``(ceil(oc/CT), nsplit)``, ``CT*nseg`` threads; ``nsplit`` is a multiple of the column
    tiles ``NWT`` (:func:`bwd_w_rows_tiles`): block ``(bx, j)`` owns channels
    ``bx*CT + lane``, output columns ``[(j % NWT)*WT, +WT)`` and the output rows
    ``[R*i // S, R*(i+1) // S)`` of ``R = mb*od*oh``, ``i = j // NWT``,
    ``S = nsplit // NWT``.

    Thread ``(segment sg, lane)`` keeps one accumulator per tap in registers and steps
    over its rows: per row it loads its ``rw`` values of ``dy`` and, per tap row, the
    ``(rw-1)*sw + (kw-1)*dw + 1`` input values its outputs read, straight from global
    memory (channels-last, the lanes on consecutive channels: each warp load is one
    coalesced run; no value is read by two threads of a block but the ``kw-1`` columns of
    overlap between segments, so shared memory would only add copies), at the row's base
    plus compile-time offsets. The geometry is compile-time, the row's coordinates are
    counters, the tap rows' bounds are tested once per row, the columns' once per
    thread: segments inside the image take a loop with no bounds test at all, the
    image's first and last segments one that tests each column. Lanes past ``oc`` read
    channel ``oc - 1`` and store nothing. The ``nseg`` segments of a channel are summed
    at the end through shared memory, tap by tap, in a fixed order.
    """
    T = _TYPES[dtype]
    MB, G, ICG, OCG, ID, IH, IW, KD, KH, KW, OD, OH, OW, SD, SH, SW, DD, DH, DW, PD, PH, PW = geo
    IC, OC = G * ICG, G * OCG
    WT = nseg * rw
    NSEG = nseg
    NWT, LO, HI = bwd_w_rows_tiles(geo, rw, nseg)
    if nsplit % NWT:
        raise ValueError(f"bwd_w_depthwise_rows: {nsplit} partials are no multiple of the "
                         f"{NWT} column tiles")
    SPL = nsplit // NWT
    ROWS = KD * KH
    KT = ROWS * KW
    RW = rw
    XS = (rw - 1) * SW + (KW - 1) * DW + 1  # input columns a segment's row reads
    R = MB * OD * OH
    PS = KT * OC
    XROW = IW * IC   # elements between input rows
    XPL = IH * XROW  # between input planes
    RSZ = NSEG * CT

    def segment_rows(x, dy, acc, xv, dv, r0, r1, kx, ky, cb, ob, EDGE):
        """The multiply-adds of one segment over output rows ``[r0, r1)``: ``kx``/``ky``
        the lane's channel in ``x``/``dy``, ``cb`` its first input column, ``ob`` its
        first output column. ``EDGE`` (a constant) tests every column."""
        o_h = r0 % OH
        t = r0 // OH
        o_d = t % OD
        n = t // OD
        for r in range(r0, r1):
            i_d0 = o_d * SD - PD
            i_h0 = o_h * SH - PH
            # the first tap row's element offset; the others are compile-time offsets on it
            xb = ((n * ID + i_d0) * IH + i_h0) * XROW + cb * IC + kx
            yb = (((n * OD + o_d) * OH + o_h) * OW + ob) * OC + ky
            for q in range(RW):
                if EDGE:
                    v = T(0)
                    if ob + q < OW:
                        v = dy[uint64(yb + q * OC)]
                    dv[q] = v
                else:
                    dv[q] = dy[uint64(yb + q * OC)]
            for td in range(KD):
                okd = i_d0 + td * DD >= 0 and i_d0 + td * DD < ID
                for th in range(KH):
                    if okd and i_h0 + th * DH >= 0 and i_h0 + th * DH < IH:
                        rb = xb + td * DD * XPL + th * DH * XROW
                        for s in range(XS):
                            if EDGE:
                                v = T(0)
                                if cb + s >= 0 and cb + s < IW:
                                    v = x[uint64(rb + s * IC)]
                                xv[s] = v
                            else:
                                xv[s] = x[uint64(rb + s * IC)]
                        for tw in range(KW):
                            a = (td * KH + th) * KW + tw
                            for q in range(RW):
                                acc[a] += xv[q * SW + tw * DW] * dv[q]
            o_h += 1
            if o_h == OH:
                o_h = 0
                o_d += 1
                if o_d == OD:
                    o_d = 0
                    n += 1

    segment_rows = cuda.jit(device=True, inline="always")(segment_rows)

    def bwd_w_depthwise_rows(x, dy, part):
        Rs = cuda.shared.array(RSZ, T)
        acc = cuda.local.array(KT, T)
        xv = cuda.local.array(XS, T)
        dv = cuda.local.array(RW, T)
        tid = cuda.threadIdx.x
        cl = tid % CT
        sg = tid // CT
        k = cuda.blockIdx.x * CT + cl
        j = cuda.blockIdx.y
        wt = j % NWT
        sp = j // NWT
        ky = k if k < OC else OC - 1
        kx = ky // OCG
        ob = wt * WT + sg * RW
        cb = ob * SW - PW
        for t in range(KT):
            acc[t] = T(0)
        r0 = R * sp // SPL
        r1 = R * (sp + 1) // SPL
        if ob < OW:
            if ob >= LO and ob + RW - 1 <= HI:  # (uniform per warp: one segment)
                segment_rows(x, dy, acc, xv, dv, r0, r1, kx, ky, cb, ob, False)
            else:
                segment_rows(x, dy, acc, xv, dv, r0, r1, kx, ky, cb, ob, True)
        for t in range(KT):
            Rs[sg * CT + cl] = acc[t]
            cuda.syncthreads()
            if sg == 0:
                v = Rs[cl]
                for i in range(1, NSEG):
                    v += Rs[i * CT + cl]
                if k < OC:
                    part[uint64(j * PS + t * OC + k)] = v
            cuda.syncthreads()

    return cuda.jit(bwd_w_depthwise_rows)
