"""Depthwise 3x3 row kernels (multiplier 1, kernel depth 1, column dilation 1): the filter
or the tap accumulators in registers for a whole row.

The span kernels of :mod:`numbaconv.kernels.cpu.depthwise_spans` take one row tap at a time
(three filter vectors in registers; dX read back and added to per row tap; dW's partials
read and written per block of pixels), and the nine-term kernels load the nine filter
vectors again for every pixel: both issue about as many vector loads as FMAs, which bounds
them by the load ports rather than the FMA units. Here a whole row of the result is made
per channel vector:

* backward data at column stride 1 or 2 (:func:`bwd_d_depthwise_3x3_rows`): dX row ``i``
  takes the (up to three) dY rows that reach it. The row's filter vectors are loaded once;
  blocks of ``S*PB`` dX pixels keep their sums in registers while each of the block's
  ``PB + 2 // S`` dY vectors per row tap is loaded once and added to the (up to three)
  pixels it reaches, so strided backward data needs no stride phases; dX is written once,
  with no zero-fill.
* backward weights at column stride 1 or 2 (:func:`bwd_w_depthwise_3x3_rows`): the nine
  tap sums of a dY row live in registers for the whole row; per block the ``PB`` dY vectors
  are loaded once and every input vector once per row tap, feeding the taps that read it;
  the sums are added to the thread's partial dW once per row.

Pixels whose taps leave the input (the row's ends) take a checked one-pixel path; rows
with fewer row taps in range are their own compiled variants (one to three row taps), so
no multiply is spent on padding. Channels beyond the last whole vector run the same code
with masked loads and stores. The inner loops are LLVM IR through
``numba.extending.intrinsic``, as the span kernels are (the loop vectoriser keeps
accumulators in memory); the row drivers are separate serial helpers that the serial
kernels run over their chunks of rows in parallel through ``par_for``.

Canonical arrays as in :mod:`numbaconv.kernels`; the filter is ``[1, 3, 3, 1, C]``.
"""
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from numbaconv._jit import dtype_name, helper, kernel, par_for, separate, specialise
from numbaconv.kernels.cpu._host import STREAMS, VECTOR_BYTES
from numbaconv.kernels.cpu._ir import (Operand, at, compute_type, fma_fn, ir_types, lane_range,
                                       table)

#: Output pixels per register block: PB sums (backward data) or PB dY vectors (backward
#: weights), plus nine filter vectors or nine tap sums and one loaded vector, within the
#: 32 vector registers of AVX-512 (16 with AVX2: the compiler spills a few there).
PB = 8
#: The tail blocks after the last full block of a row (the binary digits of the rest, largest
#: first): a 14-pixel row has no full block at column stride 2 and one at stride 1, and
#: pixel-by-pixel (checked, with per-pixel filter loads at stride 2) its rest ran at a
#: third of the block rate.
TAILS = (4, 2, 1)


def _const(v):
    return ir.Constant(ir.IntType(64), v)


def _channel_vectors(builder, C, vl, body, head):
    """``body(c, mask)`` for every whole vector of channels from channel ``head`` on
    (``mask`` None), then for the two masked pieces (a ``<vl x i1>`` lane mask each, one
    compiled body in a two-step loop): the ``head`` channels before the whole vectors (as
    the top ``head`` lanes of the vector at channel ``head - vl``) and the rest after
    them, each when not empty. ``head`` (``0 <= head <= C``, less than ``vl``) puts every
    whole vector, and the head's, on a vector boundary where the operands start off one
    (see ``row_head``). Same process, 1 thread, 144 channels 16 bytes off the boundary,
    head piece from channel 0 -> as top lanes: weight gradient 128 -> 115 us (stride 2,
    64x128), 152 -> 144 (stride 1, 32x128); backward data 145 -> 133 (stride 1)."""
    nfull = builder.sdiv(builder.sub(C, head), _const(vl))
    with cgutils.for_range(builder, nfull) as lp:
        body(builder.add(head, builder.mul(lp.index, _const(vl))), None)
    cfull = builder.add(head, builder.mul(nfull, _const(vl)))
    rem = builder.sub(C, cfull)
    with cgutils.for_range(builder, _const(2)) as lp:
        first = builder.icmp_signed("==", lp.index, _const(0))
        n = builder.select(first, head, rem)
        with builder.if_then(builder.icmp_signed(">", n, _const(0))):
            # the head piece as the top lanes of the vector that ends at channel ``head``
            # (on the boundary, as every whole vector after it): a vector from channel 0
            # would straddle two cache lines
            lo = builder.select(first, builder.sub(_const(vl), head), _const(0))
            hi = builder.select(first, _const(vl), rem)
            body(builder.select(first, builder.sub(head, _const(vl)), cfull),
                 lane_range(builder, lo, hi, vl))


def _prologue(context, builder, work, addrs, halves):
    """A row kernel's vector type and lanes, its operands (:class:`Operand` at the integer
    addresses ``addrs``; float16 bits where ``halves`` says so and the data array ``work``
    holds them) and its FMA."""
    dtype, half = compute_type(work.dtype)
    f, vty, vl = ir_types(context, dtype)
    ops = tuple(Operand(builder, a, vty, vl, half and h) for a, h in zip(addrs, halves))
    return vty, vl, ops, fma_fn(builder, vty, dtype, vl)


def _drow(NR, S, blocks=False):
    """One dX row of a 3x3 backward-data correlation at column stride ``S`` (1 or 2) over
    ``NR`` dY rows: for each pixel ``a < npix`` and channel ``c < C``, ``out[a*C + c] =
    sum_r sum_{t: (a + pw - t) = S*m, 0 <= m < win} dy[rows[r] + m*C + c] *
    w[wrow[r] + t*C + c]``. Blocks of ``S*PB`` pixels start at ``a0 = S*m0 - pw`` with
    ``m0 = m0lo + b*PB`` for ``b < nblk`` (the caller keeps every dY and dX column of a
    block inside); each block's sums stay in registers while each of its dY vectors is
    loaded once per row tap and added to the (up to three) pixels it reaches. Other
    pixels take the checked path. Addresses: ``inp``, ``wp``, ``outp`` (floats),
    ``trows``, ``twrow`` (NR int64 each).

    At stride 2 the blocks are the outer loop (the filter loaded again per block, but each
    block's operands read while they are in L1); at stride 1 the channel vectors, unless
    ``blocks`` (the filter loaded once per row and vector, but each dY row walked ``C``
    elements apart per vector). Which wins at stride 1 depends on the host: the plan's
    ``order`` picks the compiled variant (see :func:`d_tables` and
    :mod:`numbaconv.strategies.depthwise`). Measured in alternating processes (Zen 4, 2
    threads, float32, ms channels outer / blocks outer): dw144_56_s2 0.28-0.34 / 0.22,
    dw576_14_s2 0.11 / 0.086, dw96_112_s2 3.1-3.3 / 3.0-3.2; but dw576_14_s1 0.14-0.16 /
    0.19, dw960_7_s1 0.08-0.09 / 0.13-0.14."""
    lo = -(2 // S)  # the first dY column of a block, relative to m0

    @intrinsic
    def row(typingctx, inp, wp, outp, trows, twrow, npix, pw, m0lo, nblk, win, C, stream,
            head, work):
        sig = types.void(*([types.intp] * 13), work)

        def codegen(context, builder, signature, args):
            inp, wp, outp, trows, twrow, npix, pw, m0lo, nblk, win, C, stream, head, _ = args
            # float16 data: dY and dX as half bits, the filter in float32
            vty, vl, (pin, pwt, pout), fma = _prologue(
                context, builder, work, (inp, wp, outp), (True, False, True))
            streamed = builder.icmp_signed("!=", stream, _const(0))
            nontemporal = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])

            def put(values, offs, mask):
                """dX's vectors, streamed past the caches when asked (whole vectors of
                float32 or float64 only: every one starts on a vector boundary then)."""
                if mask is not None or pout.sty is not vty:
                    for v, o in zip(values, offs):
                        pout.store(v, o, mask)
                    return
                with builder.if_else(streamed) as (yes, no):
                    with yes:
                        for v, o in zip(values, offs):
                            st = builder.store(v, at(builder, pout.ptr, o, vty),
                                               align=VECTOR_BYTES)
                            st.set_metadata("nontemporal", nontemporal)
                    with no:
                        for v, o in zip(values, offs):
                            pout.store(v, o, None)
            rows, wrow = table(builder, trows, NR), table(builder, twrow, NR)
            zero = ir.Constant(vty, None)
            acc = cgutils.alloca_once(builder, vty)
            a0lo = builder.sub(builder.mul(m0lo, _const(S)), pw)

            def filt(c, mask):
                return [[pwt.load(builder.add(builder.add(wrow[r], c),
                                              builder.mul(C, _const(t))), mask)
                         for t in range(3)] for r in range(NR)]

            def checked(a, c, mask, wv):
                rowc = [builder.add(rows[r], c) for r in range(NR)]
                builder.store(zero, acc)
                for t in range(3):
                    e = builder.sub(builder.add(a, pw), _const(t))
                    m = builder.sdiv(e, _const(S)) if S > 1 else e
                    ok = builder.icmp_unsigned("<", m, win)
                    if S > 1:
                        ok = builder.and_(ok, builder.icmp_signed(
                            "==", builder.and_(e, _const(S - 1)), _const(0)))
                    with builder.if_then(ok):
                        mc = builder.mul(m, C)
                        v = builder.load(acc)
                        for r in range(NR):
                            d = pin.load(builder.add(rowc[r], mc), mask)
                            v = builder.call(fma, [d, wv[r][t], v])
                        builder.store(v, acc)
                put([builder.load(acc)], [builder.add(builder.mul(a, C), c)], mask)

            def block(m0, c, mask, wv, P):
                """A block of ``S*P`` dX pixels from dY columns ``m0 + lo .. m0 + P - 1``."""
                a0 = builder.sub(builder.mul(m0, _const(S)), pw)
                sums = [zero] * (S * P)
                for r in range(NR):
                    rb = builder.add(builder.add(rows[r], c), builder.mul(m0, C))
                    for i in range(lo, P):
                        d = pin.load(builder.add(rb, builder.mul(C, _const(i))), mask)
                        for t in range(3):
                            k = S * i + t
                            if 0 <= k < S * P:
                                sums[k] = builder.call(fma, [d, wv[r][t], sums[k]])
                ob = builder.add(builder.mul(a0, C), c)
                put(sums, [builder.add(ob, builder.mul(C, _const(k))) for k in range(S * P)],
                    mask)

            def full(b):
                return builder.add(m0lo, builder.mul(b, _const(PB)))

            # after the full blocks, ``rest < PB`` dY columns still meet the block bounds
            # (see ``blocks``): they go as tail blocks of 4, 2 and 1, not pixel by pixel
            mend = full(nblk)
            lim = builder.sdiv(builder.add(npix, pw), _const(S))
            lim = builder.select(builder.icmp_signed("<", win, lim), win, lim)
            rest = builder.sub(lim, mend)
            rest = builder.select(builder.icmp_signed(">", rest, _const(0)), rest, _const(0))
            aend = builder.sub(builder.mul(builder.add(mend, rest), _const(S)), pw)

            def tails(each):
                for P in TAILS:  # the P-block starts after the larger tail blocks taken
                    with builder.if_then(builder.icmp_signed(
                            "!=", builder.and_(rest, _const(P)), _const(0))):
                        each(builder.add(mend, builder.and_(rest, _const(-2 * P))), P)

            left = builder.select(builder.icmp_signed("<", a0lo, npix), a0lo, npix)
            if S == 1 and not blocks:
                def body(c, mask):
                    wv = filt(c, mask)
                    with cgutils.for_range_slice(builder, _const(0), left, _const(1)) as (a, _):
                        checked(a, c, mask, wv)
                    with cgutils.for_range(builder, nblk) as lp:
                        block(full(lp.index), c, mask, wv, PB)
                    tails(lambda m0, P: block(m0, c, mask, wv, P))
                    with cgutils.for_range_slice(builder, aend, npix, _const(1)) as (a, _):
                        checked(a, c, mask, wv)

                _channel_vectors(builder, C, vl, body, head)
            else:
                with cgutils.for_range_slice(builder, _const(0), left, _const(1)) as (a, _):
                    _channel_vectors(builder, C, vl,
                                     lambda c, mask: checked(a, c, mask, filt(c, mask)), head)
                with cgutils.for_range(builder, nblk) as lp:
                    _channel_vectors(builder, C, vl, lambda c, mask: block(
                        full(lp.index), c, mask, filt(c, mask), PB), head)
                tails(lambda m0, P: _channel_vectors(
                    builder, C, vl, lambda c, mask: block(m0, c, mask, filt(c, mask), P), head))
                with cgutils.for_range_slice(builder, aend, npix, _const(1)) as (a, _):
                    _channel_vectors(builder, C, vl,
                                     lambda c, mask: checked(a, c, mask, filt(c, mask)), head)
            return context.get_dummy_value()

        return sig, codegen

    return row


def _wrow(NR, S):
    """The nine tap sums of one dY row at column stride ``S`` over ``NR`` input rows: for
    each channel ``c < C``, ``part[prow[r] + b*C + c] += sum_{j < npix}
    x[rows[r] + (j*S + off + b)*C + c] * dy[j*C + c]``, input columns outside ``[0, win)``
    counting as zero; pixels ``jlo <= j < jhi`` have all three columns inside. Addresses:
    ``xp``, ``dyp``, ``pp`` (floats), ``trows``, ``tprow`` (NR int64 each)."""

    @intrinsic
    def row(typingctx, xp, dyp, pp, trows, tprow, npix, off, jlo, jhi, win, C, head, work):
        sig = types.void(*([types.intp] * 12), work)

        def codegen(context, builder, signature, args):
            xp, dyp, pp, trows, tprow, npix, off, jlo, jhi, win, C, head, _ = args
            # float16 data: X and dY as half bits, the partial dW in float32
            vty, vl, (px, pdy, ppart), fma = _prologue(
                context, builder, work, (xp, dyp, pp), (True, True, False))
            rows, prow = table(builder, trows, NR), table(builder, tprow, NR)
            zero = ir.Constant(vty, None)
            # the nine sums as allocas in the entry block: mem2reg keeps them in registers
            acc = [[cgutils.alloca_once(builder, vty) for _ in range(3)] for _ in range(NR)]

            def body(c, mask):
                for r in range(NR):
                    for b in range(3):
                        builder.store(zero, acc[r][b])
                rowc = [builder.add(rows[r], c) for r in range(NR)]

                def checked(j):
                    g = pdy.load(builder.add(builder.mul(j, C), c), mask)
                    for b in range(3):
                        col = builder.add(builder.add(builder.mul(j, _const(S)), off), _const(b))
                        with builder.if_then(builder.icmp_unsigned("<", col, win)):
                            e = builder.mul(col, C)
                            for r in range(NR):
                                v = px.load(builder.add(rowc[r], e), mask)
                                builder.store(builder.call(fma, [v, g, builder.load(acc[r][b])]),
                                              acc[r][b])

                def block(j0, P):
                    """Pixels ``j0 .. j0 + P - 1``, all three columns inside."""
                    gb = builder.add(builder.mul(j0, C), c)
                    g = [pdy.load(builder.add(gb, builder.mul(C, _const(p))), mask)
                         for p in range(P)]
                    base = builder.mul(builder.add(builder.mul(j0, _const(S)), off), C)
                    for r in range(NR):
                        a = [builder.load(acc[r][b]) for b in range(3)]
                        rb = builder.add(rowc[r], base)
                        for q in range((P - 1) * S + 3):
                            v = px.load(builder.add(rb, builder.mul(C, _const(q))), mask)
                            for b in range(3):
                                if (q - b) % S == 0 and 0 <= (q - b) // S < P:
                                    a[b] = builder.call(fma, [v, g[(q - b) // S], a[b]])
                        for b in range(3):
                            builder.store(a[b], acc[r][b])

                with cgutils.for_range(builder, jlo) as lp:
                    checked(lp.index)
                nblk = builder.sdiv(builder.sub(jhi, jlo), _const(PB))
                with cgutils.for_range(builder, nblk) as lp:
                    block(builder.add(jlo, builder.mul(lp.index, _const(PB))), PB)
                # the rest of the interior (< PB pixels) as tail blocks of 4, 2 and 1
                start = builder.add(jlo, builder.mul(nblk, _const(PB)))
                rest = builder.sub(jhi, start)
                for P in TAILS:
                    with builder.if_then(builder.icmp_signed(
                            "!=", builder.and_(rest, _const(P)), _const(0))):
                        block(builder.add(start, builder.and_(rest, _const(-2 * P))), P)
                with cgutils.for_range_slice(builder, jhi, npix, _const(1)) as (j, _):
                    checked(j)
                for r in range(NR):
                    for b in range(3):
                        q = builder.add(builder.add(prow[r], c), builder.mul(C, _const(b)))
                        ppart.store(builder.fadd(ppart.load(q, mask), builder.load(acc[r][b])),
                                    q, mask)

            _channel_vectors(builder, C, vl, body, head)
            return context.get_dummy_value()

        return sig, codegen

    return row


_drow1s1, _drow2s1, _drow3s1 = (_drow(n, 1) for n in (1, 2, 3))
_drow1s1b, _drow2s1b, _drow3s1b = (_drow(n, 1, True) for n in (1, 2, 3))
_drow1s2, _drow2s2, _drow3s2 = (_drow(n, 2) for n in (1, 2, 3))
_wrow1s1, _wrow2s1, _wrow3s1 = (_wrow(n, 1) for n in (1, 2, 3))
_wrow1s2, _wrow2s2, _wrow3s2 = (_wrow(n, 2) for n in (1, 2, 3))


@intrinsic
def _sfence(typingctx):
    """``sfence``: this thread's streamed stores are visible before anything it does next."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        if STREAMS:  # elsewhere no stream is taken (see bwd_d_depthwise_3x3_rows)
            fn = cgutils.get_or_insert_function(builder.module,
                                                ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse.sfence")
            builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _prefetch(typingctx, addr, nbytes):
    """Prefetch ``nbytes`` from the address ``addr`` into L2 (``prefetcht1``, line by line)."""
    sig = types.void(types.intp, types.intp)

    def codegen(context, builder, signature, args):
        a, nb = args
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0")
        nl = builder.sdiv(builder.add(nb, _const(63)), _const(64))
        with cgutils.for_range(builder, nl) as lp:
            ptr = builder.inttoptr(builder.add(a, builder.mul(lp.index, _const(64))), i8p)
            builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 2),
                              ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


def row_head(addr, C, itemsize, compute_itemsize):
    """Channels before the first vector boundary of a channels-last operand at ``addr``
    (``itemsize`` bytes per element, computed in vectors of ``compute_itemsize``-byte
    lanes): the ``head`` that puts every other vector of every pixel on a boundary, where
    each pixel's channels span whole vectors' worth of bytes; else 0. NumPy's large arrays
    start 16 bytes past a 64-byte boundary, so with 64-byte vectors every load of them
    straddles two cache lines."""
    vbytes = VECTOR_BYTES // compute_itemsize * itemsize
    mis = addr % vbytes
    if mis == 0 or mis % itemsize or (C * itemsize) % vbytes:
        return 0
    return min(C, (vbytes - mis) // itemsize)


@helper
def interior(npix, win, off, S):
    """``(jlo, jhi)``: the pixels ``j < npix`` whose three input columns ``j*S + off + b``
    (b = 0, 1, 2) all lie in ``[0, win)``, as one range (empty ranges start at ``npix``
    or where the left border ends)."""
    jlo = 0 if off >= 0 else (-off + S - 1) // S
    jhi = (win - 3 - off) // S + 1 if win - 3 - off >= 0 else 0
    jlo = min(jlo, npix)
    return jlo, min(max(jhi, jlo), npix)



@helper
def blocks(npix, win, pw, S):
    """``(m0lo, nblk)``: the backward-data blocks of :func:`_drow` at column stride
    ``S``: block ``b`` covers dX pixels ``S*m0 - pw + k`` (``k < S*PB``) from dY columns
    ``m0 - 2 // S .. m0 + PB - 1``, ``m0 = m0lo + b*PB``, all of them inside."""
    m0lo = max(2 // S, (pw + S - 1) // S)
    nblk = min((win - m0lo) // PB, (npix + pw - S * m0lo) // (S * PB))
    return m0lo, max(nblk, 0)



#: The column stride a copy of a row driver is specialised for (see ``_jit.specialise``):
#: 1 or 2 in the copies, each of which compiles only its stride's row kernels.
_SW = 0
#: The backward-data row kernels over 3, 2 and 1 dY rows, bound per copy (``_d_rows``).
_ROW3 = _ROW2 = _ROW1 = None


def _bwd_d_rows(rt, dy, w, dx, geo, nchunks, prefetch, stream, head, chunk):
    """The dX rows of chunk ``chunk`` of ``nchunks`` (see :func:`bwd_d_rows_kernel`), column
    stride ``_SW``; the row kernels over 3, 2 and 1 dY rows (``_ROW3``, ``_ROW2``,
    ``_ROW1``, each compiled apart) through the address tables ``rt[0]``, ``rt[1]``,
    ``rt[2]``. With ``stream``, an ``sfence`` after the chunk's streamed stores."""
    rows = geo[0] * geo[4] * geo[5]
    r0, r1 = rows * chunk // nchunks, rows * (chunk + 1) // nchunks
    C = geo[1]
    id_, ih, iw = geo[4], geo[5], geo[6]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dh = geo[17]
    pd, ph, pw = geo[19], geo[20], geo[21]
    it = dx.itemsize
    dyb, wb, dxb = dy.ctypes.data, w.ctypes.data, dx.ctypes.data
    trows = np.empty(3, np.int64)
    twrow = np.empty(3, np.int64)
    m0lo, nblk = blocks(iw, ow, pw, sw)
    ra, rb = trows.ctypes.data, twrow.ctypes.data
    dxf = dx.reshape(-1)
    for r in range(r0, r1):
        n = r // (id_ * ih)
        i_d = (r // ih) % id_
        i_h = r % ih
        e_d = i_d + pd
        nr = 0
        if e_d % sd == 0 and e_d // sd < od:
            o_d = e_d // sd
            for t_h in range(3):
                e = i_h + ph - t_h * dh
                if e >= 0 and e % sh == 0 and e // sh < oh:
                    trows[nr] = ((n * od + o_d) * oh + e // sh) * ow * C
                    twrow[nr] = t_h * 3 * C
                    nr += 1
        dxp = dxb + r * iw * C * it
        if prefetch and r + 1 < r1:
            # the next dX row's dY rows, into L2 while this row computes
            q = r + 1
            nq = q // (id_ * ih)
            q_d = (q // ih) % id_ + pd
            if q_d % sd == 0 and q_d // sd < od:
                for t_h in range(3):
                    e = q % ih + ph - t_h * dh
                    if e >= 0 and e % sh == 0 and e // sh < oh:
                        _prefetch(dyb + ((nq * od + q_d // sd) * oh + e // sh) * ow * C * it,
                                  ow * C * it)
        if nr == 0:
            dxf[r * iw * C:(r + 1) * iw * C] = 0
        elif nr == 3:
            _ROW3(rt[0], dyb, wb, dxp, ra, rb, iw, pw, m0lo, nblk, ow, C, stream, head, dx)
        elif nr == 2:
            _ROW2(rt[1], dyb, wb, dxp, ra, rb, iw, pw, m0lo, nblk, ow, C, stream, head, dx)
        else:
            _ROW1(rt[2], dyb, wb, dxp, ra, rb, iw, pw, m0lo, nblk, ow, C, stream, head, dx)
    if stream:
        _sfence()


def variant(a):
    """The name of the separate row driver's variant for data ``a`` (float16 as bits)."""
    return "float16" if a.dtype == np.uint16 else dtype_name(a.dtype)


def d_tables(sw, name, blocks=False):
    """The address tables of the backward-data row drivers for column stride ``sw`` and
    variant ``name``, and of their row kernels (``[3, variants]``, over 3, 2 and 1 dY rows;
    at stride 1 the ones with blocks of pixels outermost where ``blocks``): the ones the
    kernel runs compiled, the others left as they are (the kernel never calls them). The
    row kernels of one stride share their signature and variants, so the stride's driver
    calls either order's through the table it is given."""
    rows = [_d_rows["1b" if blocks else 1], _d_rows[2]]
    if sw == 1:
        return (_bwd_d_rows_s1.table(name), _bwd_d_rows_s2.table(),
                np.stack([f.table(name) for f in rows[0]]), np.stack([f.table() for f in rows[1]]))
    return (_bwd_d_rows_s1.table(), _bwd_d_rows_s2.table(name),
            np.stack([f.table() for f in rows[0]]), np.stack([f.table(name) for f in rows[1]]))


def w_tables(sw, name):
    """As :func:`d_tables`, for the weight-gradient row drivers."""
    if sw == 1:
        return _bwd_w_rows_s1.table(name), _bwd_w_rows_s2.table()
    return _bwd_w_rows_s1.table(), _bwd_w_rows_s2.table(name)


def bwd_d_depthwise_3x3_rows(dy, w, dx, geo, nchunks, prefetch, stream=False, head=0,
                             place=False, blocks=False):
    """See :func:`bwd_d_rows_kernel` (its address tables for ``dy``'s dtype added; at column
    stride 1 the row kernels with blocks of pixels outermost where ``blocks``)."""
    bwd_d_rows_kernel(*d_tables(int(geo[15]), variant(dy), blocks), dy, w, dx, geo, nchunks,
                      prefetch, stream, head, place)


def bwd_w_depthwise_3x3_rows(x, dy, part, dwt, geo, prefetch, head=0):
    """See :func:`bwd_w_rows_kernel` (its address tables for ``x``'s dtype added)."""
    bwd_w_rows_kernel(*w_tables(int(geo[15]), variant(x)), x, dy, part, dwt, geo, prefetch,
                      head)


@kernel(parallel=False)
def bwd_d_rows_kernel(fns1, fns2, rt1, rt2, dy, w, dx, geo, nchunks, prefetch, stream=False,
                      head=0, place=False):
    """dx = depthwise conv^T(dy, w) for 3x3 filters, multiplier 1, kernel depth 1, column
    stride 1 or 2 and column dilation 1 (any row stride, row dilation and padding). Each
    dX row is written once, a row kernel per channel vector (see the module docstring);
    threads take ``nchunks`` contiguous ranges of dX rows. ``prefetch``: prefetch the next
    row's dY rows into L2 while a row computes (see :func:`_prefetch`). ``stream``: write
    dX's whole vectors with non-temporal stores (float32 and float64, taken where every
    pixel's whole vectors start on a vector boundary): a dX larger than the caches then
    costs no read for ownership. ``head``: channels before the first whole vector (see
    :func:`row_head`; any value is correct, taken modulo the vector's lanes). ``place``:
    read the filter from a copy whose vectors past ``head`` channels start on vector
    boundaries, as dY's and dX's then do (9 x C elements, copied here: a copy in Python
    took 8 us of a 60 us call)."""
    it = dx.itemsize
    C = geo[1]
    head = min(max(head, 0) % (VECTOR_BYTES // max(it, 4)), C)  # less than a vector
    nt = (stream and STREAMS and it >= 4 and (dx.ctypes.data + head * it) % VECTOR_BYTES == 0
          and (C * it) % VECTOR_BYTES == 0)
    n = w.size
    itw = w.itemsize
    if place:
        buf = np.empty(n + VECTOR_BYTES // itw, w.dtype)
        s = (-(buf.ctypes.data + head * itw)) % VECTOR_BYTES // itw
        wf = w.reshape(-1)
        for i in range(n):  # a loop: slice assignment compiles NumPy's shape-error messages
            buf[s + i] = wf[i]
    else:
        buf = w.reshape(-1)
        s = 0
    wp = buf[s:s + n]
    if geo[15] == 1:
        par_for(_bwd_d_rows_s1, fns1, nchunks, rt1, dy, wp, dx, geo, nchunks, prefetch,
                1 if nt else 0, head)
    else:
        par_for(_bwd_d_rows_s2, fns2, nchunks, rt2, dy, wp, dx, geo, nchunks, prefetch,
                1 if nt else 0, head)


def _bwd_w_rows(x, dy, part, geo, prefetch, head, ch):
    """The dY rows of chunk ``ch`` (of ``part.shape[0]``) into the partial dW ``part[ch]``
    (zeroed here); with ``prefetch``, each next row's operands are prefetched."""
    rows = geo[0] * geo[10] * geo[11]
    nchunks = part.shape[0]
    r0, r1 = rows * ch // nchunks, rows * (ch + 1) // nchunks
    C = geo[1]
    id_, ih, iw = geo[4], geo[5], geo[6]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dh = geo[17]
    pd, ph, pw = geo[19], geo[20], geo[21]
    it = x.itemsize
    xb, dyb, pb = x.ctypes.data, dy.ctypes.data, part.ctypes.data
    pf = part.reshape(-1)
    pf[ch * 9 * C:(ch + 1) * 9 * C] = 0
    trows = np.empty(3, np.int64)
    tprow = np.empty(3, np.int64)
    off = -pw
    jlo, jhi = interior(ow, iw, off, sw)
    ra, rb = trows.ctypes.data, tprow.ctypes.data
    for r in range(r0, r1):
        n = r // (od * oh)
        o_d = (r // oh) % od
        o_h = r % oh
        i_d = o_d * sd - pd
        if i_d < 0 or i_d >= id_:
            continue
        nr = 0
        for t_h in range(3):
            i_h = o_h * sh - ph + t_h * dh
            if 0 <= i_h < ih:
                trows[nr] = ((n * id_ + i_d) * ih + i_h) * iw * C
                tprow[nr] = (ch * 9 + t_h * 3) * C
                nr += 1
        dyp = dyb + r * ow * C * it
        if prefetch and r + 1 < r1:
            # the next row's dY and input rows, into L2 while this row computes
            _prefetch(dyp + ow * C * it, ow * C * it)
            q = r + 1
            nq = q // (od * oh)
            q_d = (q // oh) % od * sd - pd
            if 0 <= q_d < id_:
                for t_h in range(3):
                    i_h = (q % oh) * sh - ph + t_h * dh
                    if 0 <= i_h < ih:
                        _prefetch(xb + ((nq * id_ + q_d) * ih + i_h) * iw * C * it,
                                  iw * C * it)
        if _SW == 1:
            if nr == 3:
                _wrow3s1(xb, dyp, pb, ra, rb, ow, off, jlo, jhi, iw, C, head, x)
            elif nr == 2:
                _wrow2s1(xb, dyp, pb, ra, rb, ow, off, jlo, jhi, iw, C, head, x)
            elif nr == 1:
                _wrow1s1(xb, dyp, pb, ra, rb, ow, off, jlo, jhi, iw, C, head, x)
        else:
            if nr == 3:
                _wrow3s2(xb, dyp, pb, ra, rb, ow, off, jlo, jhi, iw, C, head, x)
            elif nr == 2:
                _wrow2s2(xb, dyp, pb, ra, rb, ow, off, jlo, jhi, iw, C, head, x)
            elif nr == 1:
                _wrow1s2(xb, dyp, pb, ra, rb, ow, off, jlo, jhi, iw, C, head, x)


@helper
def _reduce_chunks(part, dwt):
    """``dwt`` = the sum of the per-chunk partials ``part[0] + part[1] + ...`` (the span
    kernels' own copy: this module shares no jitted code)."""
    nchunks = part.shape[0]
    TC = dwt.size
    pf = part.reshape(-1)
    df = dwt.reshape(-1)
    for i in range(TC):
        acc = pf[i]
        for ch in range(1, nchunks):
            acc += pf[ch * TC + i]
        df[i] = acc


@kernel(parallel=False)
def bwd_w_rows_kernel(fns1, fns2, x, dy, part, dwt, geo, prefetch, head=0):
    """dwt (``[1, 3, 3, 1, C]``) = dW of a 3x3 depthwise convolution, multiplier 1, kernel
    depth 1, column stride 1 or 2, column dilation 1 (any row stride, row dilation and
    padding). part (scratch, ``[nchunks, 1, 3, 3, 1, C]``): chunk j's sum over its
    contiguous range of dY rows, zeroed and reduced here. ``prefetch``: prefetch each next
    row's operands into L2 while a row computes (see :func:`_prefetch`). ``head``:
    channels before the first whole vector (see :func:`row_head`; any value is correct,
    taken modulo the vector's lanes)."""
    head = min(max(head, 0) % (VECTOR_BYTES // max(x.itemsize, 4)), geo[1])
    if geo[15] == 1:
        par_for(_bwd_w_rows_s1, fns1, part.shape[0], x, dy, part, geo, prefetch, head)
    else:
        par_for(_bwd_w_rows_s2, fns2, part.shape[0], x, dy, part, geo, prefetch, head)
    _reduce_chunks(part, dwt)


# The separate row drivers, one copy per column stride (compiled apart from the kernels,
# once per dtype; a plan compiles only its stride's copy).
#: Data ``{X}`` (float16 as bits), filter or partial dW ``{P}``, per variant.
_VARIANTS = dict(float32=dict(X="float32", P="float32"), float64=dict(X="float64", P="float64"),
                 float16=dict(X="uint16", P="float32"))
_D_SIG = ("void(int64[:, ::1], {X}[:, :, :, :, ::1], {P}[::1], {X}[:, :, :, :, ::1], "
          "int64[::1], int64, int64, int64, int64, int64)")


def _d_row(inp, wp, outp, trows, twrow, npix, pw, m0lo, nblk, win, C, stream, head, work):
    """One backward-data row kernel (``_ROW``, bound per copy) compiled on its own, so that
    a first call's helper process can compile the three of a stride while the call
    compiles the rest (see :mod:`numbaconv._ahead`)."""
    _ROW(inp, wp, outp, trows, twrow, npix, pw, m0lo, nblk, win, C, stream, head, work)


_ROW = None
_R_SIG = "void(" + "int64, " * 13 + "{W}[:, :, :, :, ::1])"
_R_VARIANTS = dict(float32=dict(W="float32"), float64=dict(W="float64"),
                   float16=dict(W="uint16"))
#: Column stride -> the separate row kernels over 3, 2 and 1 dY rows ("1b": stride 1 with
#: blocks of pixels outermost; compiled only where a plan takes them).
_d_rows = {S: [separate(_R_SIG, **_R_VARIANTS)(specialise(_d_row, f"{n}s{S}", _ROW=row))
               for n, row in ((3, r3), (2, r2), (1, r1))]
           for S, (r3, r2, r1) in ((1, (_drow3s1, _drow2s1, _drow1s1)),
                                   (2, (_drow3s2, _drow2s2, _drow1s2)),
                                   ("1b", (_drow3s1b, _drow2s1b, _drow1s1b)))}
_W_SIG = ("void({X}[:, :, :, :, ::1], {X}[:, :, :, :, ::1], {P}[:, :, :, :, :, ::1], "
          "int64[::1], int64, int64, int64)")
_bwd_d_rows_s1 = separate(_D_SIG, **_VARIANTS)(specialise(
    _bwd_d_rows, "s1", _SW=1, _ROW3=_d_rows[1][0], _ROW2=_d_rows[1][1], _ROW1=_d_rows[1][2]))
_bwd_d_rows_s2 = separate(_D_SIG, **_VARIANTS)(specialise(
    _bwd_d_rows, "s2", _SW=2, _ROW3=_d_rows[2][0], _ROW2=_d_rows[2][1], _ROW1=_d_rows[2][2]))
_bwd_w_rows_s1 = separate(_W_SIG, **_VARIANTS)(specialise(_bwd_w_rows, "s1", _SW=1))
_bwd_w_rows_s2 = separate(_W_SIG, **_VARIANTS)(specialise(_bwd_w_rows, "s2", _SW=2))
