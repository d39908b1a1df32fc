"""Depthwise span kernels for multiplier 1, with explicit SIMD: any kernel size, stride,
dilation, padding and rank (backward data and backward weights; the forward pass on
backward data's spans, with X in dY's place).

Canonical arrays as in :mod:`numbaconv.kernels`; the filter is ``[kd, kh, kw, 1, C]``.
"""
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from numbaconv._jit import dtype_name, helper, kernel, par_for, separate
from numbaconv.kernels.cpu._host import VECTOR_BYTES
from numbaconv.kernels.cpu._ir import at, fma_fn, ir_types, lane_mask, masked_io, table


# ---------------------------------------------------------------------------------------
# Both backward passes use these for every multiplier-1 problem except 3x3 filters at
# column stride 1 or 2 without column dilation (the row kernels of ``depthwise_rows``) and
# backward data's 3x3 stride 1 with column dilation and wide channels (the nine-term
# kernel of ``depthwise``): see the strategy. Backward data from 5 column taps and the
# forward pass run over padded rows (the end of this comment).
#
# Numba's loop vectoriser keeps accumulators in memory, not registers, so the inner loops are
# written in LLVM IR through ``numba.extending.intrinsic``, as in ``ukernel``. A "span" is a
# run of pixels that one table of taps reaches in full: the interior of a stride phase of a
# dX row (input columns q, q+s, ...: each phase has its own fixed column taps, so strided
# backward data is a gather with no modulo tests and no scatter), or the interior of a dY
# row; border pixels are spans of one pixel with the taps that reach them. A span's table is
# row taps (runtime count) x column taps (``NT`` = 3, 2 or 1, unrolled; longer kernel rows
# are cut into chunks). The IR walks the span in blocks of ``PB`` pixels, and per block each
# channel vector, then each row tap, then the block's pixels:
#
# * backward data: a full block's pixels each sum their products over every row tap in a
#   register (each row tap's ``NT`` filter vectors loaded once for the block, each dY
#   vector once for the taps that read it), and dX is written once per column chunk; a
#   short block (a span's end) adds each row tap's products to dX, in L1. Every dX element
#   is written by the kernel (pixels no tap reaches get zeros): no zero-fill, no
#   read-modify-write outside L1.
# * backward weights: the ``NT`` accumulators of a row tap stay in registers across the
#   block and are added to the thread's partial dW once per block. Threads take contiguous
#   ranges of dY rows with private partials, zeroed and reduced inside the kernel.
#
# Channels beyond the last whole vector run the same code with masked loads and stores.
# The drivers are separate serial helpers that serial kernels run over their chunks of
# rows in parallel through ``par_for`` (no parallel region of their own to compile).
#
# Backward data over padded rows (``_bwd_d_rows_pad``, the strategy's tile ``padded``)
# has no border pixels and no sliding block: each dY row is copied once between zeros in
# blocks of ``PAD_VECTORS`` vectors of channels, and ``_pspan`` keeps PB_D pixels x
# PAD_VECTORS vectors of sums in registers over a flat list of taps, each dY vector an FMA
# memory operand at a constant offset from one pointer.
# ---------------------------------------------------------------------------------------

#: Pixels per block of a span (backward data, backward weights): a block's slices of the
#: operands stay in L1 while its channel vectors sweep it, and backward weights adds its
#: register accumulators to the partial dW once per block (measured: docs/performance.md,
#: Numbers behind the constants). Backward data's 7: rows of 7, 14, 28 and 56 pixels are
#: whole blocks (and the padded rows' blocks of 7 pixels x 2 vectors fit 16 registers).
PB_D = 7
PB_W = 8
#: Channel vectors per block, in bytes of one pixel's slice (wider channels are cut).
CB_BYTES = 4096


def _loops(builder, npix, C, vl, pb, cbv, emit):
    """``emit(c, p0, cnt, mask)`` over blocks of ``cbv`` channel vectors x ``pb`` pixels:
    per channel block, per pixel block (the last may be shorter), per channel vector
    starting at channel ``c`` (``mask`` None); then the channels beyond the last whole
    vector as one vector with a lane mask (``<vl x i1>``). A block's slices of every operand
    stay in L1 while its channel vectors sweep it."""
    i64 = ir.IntType(64)

    def const(v):
        return ir.Constant(i64, v)

    def pixel_blocks(body):
        nblk = builder.sdiv(builder.add(npix, const(pb - 1)), const(pb))
        with cgutils.for_range(builder, nblk) as lp:
            p0 = builder.mul(lp.index, const(pb))
            left = builder.sub(npix, p0)
            body(p0, builder.select(builder.icmp_signed("<", left, const(pb)), left, const(pb)))

    nfull = builder.sdiv(C, const(vl))
    cfull = builder.mul(nfull, const(vl))
    with cgutils.for_range(builder, builder.sdiv(builder.add(nfull, const(cbv - 1)),
                                                 const(cbv))) as cb:
        v0 = builder.mul(cb.index, const(cbv))
        left = builder.sub(nfull, v0)
        nv = builder.select(builder.icmp_signed("<", left, const(cbv)), left, const(cbv))

        def vec_body(p0, cnt):
            with cgutils.for_range(builder, nv) as lp:
                emit(builder.mul(builder.add(v0, lp.index), const(vl)), p0, cnt, None)

        pixel_blocks(vec_body)
    rem = builder.sub(C, cfull)
    with builder.if_then(builder.icmp_signed(">", rem, const(0))):
        mask = lane_mask(builder, rem, vl)
        pixel_blocks(lambda p0, cnt: emit(cfull, p0, cnt, mask))


def _block_loader(builder, load, base_ptr, base, C, mask, ty):
    """``get(j)``: the ``ty`` vector at element ``base + j*C`` of ``base_ptr`` (pixel ``j``
    of a block), loaded on first use and reused by every later tap that reads it."""
    cache = {}

    def get(j):
        if j not in cache:
            off = builder.add(base, builder.mul(C, ir.Constant(ir.IntType(64), j)))
            cache[j] = load(at(builder, base_ptr, off, ty), mask)
        return cache[j]

    return get


def _dspan(NT):
    """Backward-data span over ``nr`` row taps x ``NT`` column taps: for each pixel
    p < npix and channel c < C, ``dx[p*sdx + c] (+)= sum_r sum_k
    dy[trd[r] + tdy[k] + p*sdy + c] * w[trw[r] + tw[k] + c]``, added to dX when ``beta``.
    Addresses: ``dyp``, ``wp``, ``dxp`` (floats), ``trd``, ``trw`` (nr int64 each),
    ``tdy``, ``tw`` (NT int64 each). Per full block of pixels and channel vector, the
    block's sums stay in registers across the row taps; in a shorter block the row taps
    follow one another, each adding its NT products to the block of dX, in L1."""

    @intrinsic
    def span(typingctx, dyp, wp, dxp, trd, trw, nr, tdy, tw, npix, sdx, sdy, C, beta, work):
        sig = types.void(*([types.intp] * 13), work)
        dtype = work.dtype

        def codegen(context, builder, signature, args):
            dyp, wp, dxp, trd, trw, nr, tdy, tw, npix, sdx, sdy, C, beta, _ = args
            f, vty, vl = ir_types(context, dtype)
            fp = f.as_pointer()
            i64 = ir.IntType(64)
            pdy, pw, pdx = (builder.inttoptr(a, fp) for a in (dyp, wp, dxp))
            prd, prw = (builder.inttoptr(a, i64.as_pointer()) for a in (trd, trw))
            ody, ow_ = table(builder, tdy, NT), table(builder, tw, NT)
            add0 = builder.icmp_signed("!=", beta, ir.Constant(i64, 0))

            fma = fma_fn(builder, vty, dtype, vl)
            load, store = masked_io(builder, vty, vl)
            ty = vty

            # column taps of one stride phase one dY pixel apart (dilation 1, the usual
            # case): pixel p's tap k reads dY pixel p - k of the block, so a full block
            # loads PB_D + NT - 1 dY vectors once instead of PB_D*NT
            slide = builder.icmp_signed("==", sdy, C)
            for k in range(1, NT):
                want = builder.sub(ody[0], builder.mul(C, ir.Constant(i64, k)))
                slide = builder.and_(slide, builder.icmp_signed("==", ody[k], want))

            def loop_block(c, p0, cnt, dyc, wv, acc_on, mask, zero):
                with cgutils.for_range(builder, cnt) as lp:
                    p = builder.add(p0, lp.index)
                    px = at(builder, pdx, builder.add(builder.mul(p, sdx), c), ty)
                    a = builder.select(acc_on, load(px, mask), zero)
                    py = builder.mul(p, sdy)
                    for k in range(NT):
                        v = load(at(builder, pdy, builder.add(dyc[k], py), ty), mask)
                        a = builder.call(fma, [v, wv[k], a])
                    store(a, px, mask)

            def row_taps(c, mask, body):
                """``body(r, dyc, wv, acc_on)`` for each row tap ``r``."""
                with cgutils.for_range(builder, nr) as rl:
                    r = rl.index
                    rdy = builder.load(builder.gep(prd, [r]))
                    rw = builder.add(builder.load(builder.gep(prw, [r])), c)
                    acc_on = builder.or_(add0, builder.icmp_signed("!=", r, ir.Constant(i64, 0)))
                    wv = [load(at(builder, pw, builder.add(ow_[k], rw), ty), mask)
                          for k in range(NT)]
                    dyc = [builder.add(builder.add(ody[k], c), rdy) for k in range(NT)]
                    body(r, dyc, wv, acc_on)

            def emit(c, p0, cnt, mask):
                zero = ir.Constant(ty, None)
                full = builder.and_(slide, builder.icmp_signed("==", cnt,
                                                               ir.Constant(i64, PB_D)))
                with builder.if_else(full) as (fast, rest):
                    with fast:
                        # a full block: its PB_D sums stay in registers across every row
                        # tap, and dX is read (beta) and written once
                        px = [at(builder, pdx, builder.add(builder.mul(
                            builder.add(p0, ir.Constant(i64, q)), sdx), c), ty)
                            for q in range(PB_D)]
                        acc = [cgutils.alloca_once(builder, ty) for _ in range(PB_D)]
                        for q in range(PB_D):
                            builder.store(builder.select(add0, load(px[q], mask), zero),
                                          acc[q])

                        def sums(r, dyc, wv, acc_on):
                            dyload = _block_loader(builder, load, pdy,
                                                   builder.add(dyc[0], builder.mul(p0, sdy)),
                                                   C, mask, ty)
                            # each dY vector to every sum that reads it, then dead (from
                            # the block's last pixel down, so that every sum adds its
                            # taps in the order k = 0, 1, ...): PB_D sums, NT filter
                            # vectors and one dY vector live (each sum's taps in turn
                            # kept up to NT dY vectors live)
                            a = [builder.load(acc[q]) for q in range(PB_D)]
                            for j in range(PB_D - 1, -NT, -1):
                                d = dyload(j)
                                for k in range(NT):
                                    if 0 <= j + k < PB_D:
                                        a[j + k] = builder.call(fma, [d, wv[k], a[j + k]])
                            for q in range(PB_D):
                                builder.store(a[q], acc[q])
                        row_taps(c, mask, sums)
                        for q in range(PB_D):
                            store(builder.load(acc[q]), px[q], mask)
                    with rest:
                        row_taps(c, mask, lambda r, dyc, wv, acc_on: loop_block(
                            c, p0, cnt, dyc, wv, acc_on, mask, zero))

            _loops(builder, npix, C, vl, PB_D, max(1, CB_BYTES // VECTOR_BYTES), emit)
            return context.get_dummy_value()

        return sig, codegen

    return span


def _wspan(NT):
    """Backward-weights span over ``nr`` row taps x ``NT`` column taps: for each channel
    c < C, ``part[trp[r] + tp[k] + c] += sum_{p < npix} x[trx[r] + tx[k] + p*sx + c] *
    dy[p*sdy + c]``, the NT sums of a row tap in registers over a block of pixels.
    Addresses: ``xp``, ``dyp``, ``pp`` (floats), ``trx``, ``trp`` (nr int64), ``tx``,
    ``tp`` (NT int64)."""

    @intrinsic
    def span(typingctx, xp, dyp, pp, trx, trp, nr, tx, tp, npix, sx, sdy, C, work):
        sig = types.void(*([types.intp] * 12), work)
        dtype = work.dtype

        def codegen(context, builder, signature, args):
            xp, dyp, pp, trx, trp, nr, tx, tp, npix, sx, sdy, C, _ = args
            f, vty, vl = ir_types(context, dtype)
            fp = f.as_pointer()
            i64 = ir.IntType(64)
            px_, pdy, pp_ = (builder.inttoptr(a, fp) for a in (xp, dyp, pp))
            prx, prp = (builder.inttoptr(a, i64.as_pointer()) for a in (trx, trp))
            ox, op = table(builder, tx, NT), table(builder, tp, NT)
            # accumulators as allocas in the entry block: mem2reg makes them registers
            acc = [cgutils.alloca_once(builder, vty) for _ in range(NT)]
            fma = fma_fn(builder, vty, dtype, vl)
            load, store = masked_io(builder, vty, vl)
            ty = vty

            # column taps one pixel apart (dilation 1) at stride 1 or 2: pixel p's tap k
            # reads input pixel p*S + k of the block, so a full block loads each of its
            # (PB_W - 1)*S + NT input vectors once instead of PB_W*NT times
            contig = ir.Constant(ir.IntType(1), 1)
            for k in range(1, NT):
                want = builder.add(ox[0], builder.mul(C, ir.Constant(i64, k)))
                contig = builder.and_(contig, builder.icmp_signed("==", ox[k], want))
            slide = {S: builder.and_(contig, builder.icmp_signed(
                "==", sx, builder.mul(C, ir.Constant(i64, S)))) for S in (1, 2)}

            def slide_block(S, c, p0, xc, mask):
                xload = _block_loader(builder, load, px_,
                                      builder.add(xc[0], builder.mul(p0, sx)), C, mask, ty)
                accv = [builder.load(acc[k]) for k in range(NT)]
                for q in range(PB_W):
                    p = builder.add(p0, ir.Constant(i64, q))
                    g = load(at(builder, pdy, builder.add(builder.mul(p, sdy), c), ty), mask)
                    for k in range(NT):
                        accv[k] = builder.call(fma, [xload(q * S + k), g, accv[k]])
                for k in range(NT):
                    builder.store(accv[k], acc[k])

            def loop_block(c, p0, cnt, xc, mask):
                with cgutils.for_range(builder, cnt) as lp:
                    p = builder.add(p0, lp.index)
                    g = load(at(builder, pdy, builder.add(builder.mul(p, sdy), c), ty),
                             mask)
                    pxo = builder.mul(p, sx)
                    for k in range(NT):
                        v = load(at(builder, px_, builder.add(xc[k], pxo), ty), mask)
                        builder.store(builder.call(fma, [v, g, builder.load(acc[k])]),
                                      acc[k])

            def emit(c, p0, cnt, mask):
                full = builder.icmp_signed("==", cnt, ir.Constant(i64, PB_W))
                with cgutils.for_range(builder, nr) as rl:
                    r = rl.index
                    rx = builder.add(builder.load(builder.gep(prx, [r])), c)
                    rp = builder.add(builder.load(builder.gep(prp, [r])), c)
                    for k in range(NT):
                        builder.store(ir.Constant(ty, None), acc[k])
                    xc = [builder.add(ox[k], rx) for k in range(NT)]
                    if NT > 1:
                        with builder.if_else(builder.and_(full, slide[1])) as (s1, other):
                            with s1:
                                slide_block(1, c, p0, xc, mask)
                            with other:
                                with builder.if_else(builder.and_(full, slide[2])) as (s2, rest):
                                    with s2:
                                        slide_block(2, c, p0, xc, mask)
                                    with rest:
                                        loop_block(c, p0, cnt, xc, mask)
                    else:
                        loop_block(c, p0, cnt, xc, mask)
                    for k in range(NT):
                        q = at(builder, pp_, builder.add(op[k], rp), ty)
                        store(builder.fadd(load(q, mask), builder.load(acc[k])), q, mask)

            _loops(builder, npix, C, vl, PB_W, max(1, CB_BYTES // VECTOR_BYTES), emit)
            return context.get_dummy_value()

        return sig, codegen

    return span


_dspan3, _dspan2, _dspan1 = (_dspan(n) for n in (3, 2, 1))
_wspan3, _wspan2, _wspan1 = (_wspan(n) for n in (3, 2, 1))

#: Backward data over padded rows (:func:`_bwd_d_rows_pad`) keeps this many channel
#: vectors of a pixel together in its buffers (a block of channels, ``VB`` elements), so
#: that a block of PB_D pixels holds PB_D x PAD_VECTORS sums in registers and every dY
#: vector is a memory operand at a constant offset from one pointer.
PAD_VECTORS = 2


@intrinsic
def _pspan(typingctx, bp, wp, dxp, tdo, two, nt, npix, sdx, bs, wbs, nblk, C, work):
    """Backward data of one stride phase of a dX row over padded rows in blocks of
    channels: for each pixel ``p < npix`` and channel ``c < C`` (block ``b = c // VB``,
    lane ``l = c % VB``), ``dx[p*sdx + c] = sum_i buf[tdo[i] + b*bs + p*VB + l] *
    wpk[b*wbs + two[i] + l]`` over the ``nt`` taps ``i`` of the row (every row tap's
    column taps). Addresses ``bp`` (the buffer), ``wp`` (the packed filter), ``dxp``
    (floats), ``tdo``, ``two`` (``nt`` int64 each, elements). Per block of channels and
    of PB_D pixels the sums stay in registers across the taps (each sum adds them in
    their order); a block short of PB_D pixels reads on into the buffer's zeros and
    stores only its pixels; the last block of channels stores under lane masks."""
    sig = types.void(*([types.intp] * 12), work)
    dtype = work.dtype

    def codegen(context, builder, signature, args):
        bp, wp, dxp, tdo, two, nt, npix, sdx, bs, wbs, nblk, C, _ = args
        f, vty, vl = ir_types(context, dtype)
        V, PB = PAD_VECTORS, PB_D
        VB = V * vl
        fp = f.as_pointer()
        i64 = ir.IntType(64)

        def k64(v):
            return ir.Constant(i64, v)

        pbuf, pw, pdx = (builder.inttoptr(a, fp) for a in (bp, wp, dxp))
        ptd, ptw = (builder.inttoptr(a, i64.as_pointer()) for a in (tdo, two))
        fma = fma_fn(builder, vty, dtype, vl)
        load, store = masked_io(builder, vty, vl)
        zero = ir.Constant(vty, None)
        acc = [[cgutils.alloca_once(builder, vty) for _ in range(V)] for _ in range(PB)]
        nblkp = builder.sdiv(builder.add(npix, k64(PB - 1)), k64(PB))
        with cgutils.for_range(builder, nblk) as bl:
            c0 = builder.mul(bl.index, k64(VB))
            left = builder.sub(C, c0)
            whole = builder.icmp_signed(">=", left, k64(VB))
            masks = [lane_mask(builder, builder.sub(left, k64(v * vl)), vl) for v in range(V)]
            wb0 = builder.mul(bl.index, wbs)
            with cgutils.for_range(builder, nblkp) as pl:
                p0 = builder.mul(pl.index, k64(PB))
                cnt = builder.sub(npix, p0)
                bb0 = builder.add(builder.mul(bl.index, bs), builder.mul(p0, k64(VB)))
                for q in range(PB):
                    for v in range(V):
                        builder.store(zero, acc[q][v])
                with cgutils.for_range(builder, nt) as kl:
                    wo = builder.add(wb0, builder.load(builder.gep(ptw, [kl.index])))
                    wv = [load(at(builder, pw, builder.add(wo, k64(v * vl)), vty), None)
                          for v in range(V)]
                    dp = builder.gep(pbuf, [builder.add(
                        bb0, builder.load(builder.gep(ptd, [kl.index])))])
                    for q in range(PB):
                        for v in range(V):
                            d = load(at(builder, dp, k64(q * VB + v * vl), vty), None)
                            builder.store(builder.call(
                                fma, [d, wv[v], builder.load(acc[q][v])]), acc[q][v])

                def stores(mask):
                    for q in range(PB):
                        def one(q=q):
                            px = builder.add(builder.mul(builder.add(p0, k64(q)), sdx), c0)
                            for v in range(V):
                                store(builder.load(acc[q][v]),
                                      at(builder, pdx, builder.add(px, k64(v * vl)), vty),
                                      mask[v])
                        if q == 0:
                            one()
                        else:
                            with builder.if_then(builder.icmp_signed("<", k64(q), cnt)):
                                one()

                with builder.if_else(whole) as (yes, no):
                    with yes:
                        stores([None] * V)
                    with no:
                        stores(masks)
        return context.get_dummy_value()

    return sig, codegen





@helper
def _d_chunks(dyb, wb, dxp, trd, trw, nr, tdy, tw, k, nt, npix, sdx, sdy, C, beta, work):
    """Column taps ``k .. nt - 1`` of a backward-data span over ``nr`` row taps, in chunks
    of 3, 2 and 1: the first chunk stores dX unless ``beta``, the others add to it."""
    ra, rb = trd.ctypes.data, trw.ctypes.data
    a, b = tdy.ctypes.data, tw.ctypes.data
    while k < nt:
        r = nt - k
        if r >= 3:
            _dspan3(dyb, wb, dxp, ra, rb, nr, a + 8 * k, b + 8 * k, npix, sdx, sdy, C, beta,
                    work)
            k += 3
        elif r == 2:
            _dspan2(dyb, wb, dxp, ra, rb, nr, a + 8 * k, b + 8 * k, npix, sdx, sdy, C, beta,
                    work)
            k += 2
        else:
            _dspan1(dyb, wb, dxp, ra, rb, nr, a + 8 * k, b + 8 * k, npix, sdx, sdy, C, beta,
                    work)
            k += 1
        beta = 1


@helper
def _w_chunks(xb, dyp, pb, trx, trp, nr, tx, tp, nt, npix, sx, sdy, C, work):
    """A backward-weights span over ``nr`` row taps and ``nt`` column taps (column chunks
    of 3, 2 and 1)."""
    ra, rb = trx.ctypes.data, trp.ctypes.data
    a, b = tx.ctypes.data, tp.ctypes.data
    k = 0
    while k < nt:
        r = nt - k
        if r >= 3:
            _wspan3(xb, dyp, pb, ra, rb, nr, a + 8 * k, b + 8 * k, npix, sx, sdy, C, work)
            k += 3
        elif r == 2:
            _wspan2(xb, dyp, pb, ra, rb, nr, a + 8 * k, b + 8 * k, npix, sx, sdy, C, work)
            k += 2
        else:
            _wspan1(xb, dyp, pb, ra, rb, nr, a + 8 * k, b + 8 * k, npix, sx, sdy, C, work)
            k += 1


@intrinsic
def _copy(typingctx, dst, src, nbytes):
    """Copy ``nbytes`` from the address ``src`` to ``dst`` (``llvm.memcpy``: a constant
    size becomes a few vector moves)."""
    sig = types.void(types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        d, s, n = args
        i8p = ir.IntType(8).as_pointer()
        cgutils.raw_memcpy(builder, builder.inttoptr(d, i8p), builder.inttoptr(s, i8p), n, 1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _zero(typingctx, dst, nbytes):
    """Zero ``nbytes`` from the address ``dst`` (``llvm.memset``)."""
    sig = types.void(types.intp, types.intp)

    def codegen(context, builder, signature, args):
        d, n = args
        cgutils.memset(builder, builder.inttoptr(d, ir.IntType(8).as_pointer()), n, 0)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _store_zero(typingctx, base, index, work):
    """``base[index] = 0`` for an address ``base`` of ``work``'s dtype."""
    sig = types.void(types.intp, types.intp, work)
    dtype = work.dtype

    def codegen(context, builder, signature, args):
        f = context.get_value_type(dtype)
        p = builder.gep(builder.inttoptr(args[0], f.as_pointer()), [args[1]])
        builder.store(ir.Constant(f, None), p)
        return context.get_dummy_value()

    return sig, codegen


@helper(inline=True)
def _input_row_taps(geo, r, roff, rw, wbase):
    """The row taps (depth x height) of output row ``r`` (of ``mb*od*oh``) whose input row
    lies inside the input: the input rows' offsets into ``roff`` and the filter rows'
    offsets plus ``wbase`` into ``rw`` (elements); returns how many."""
    C = geo[1]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh = geo[10], geo[11]
    sd, sh = geo[13], geo[14]
    dd, dh = geo[16], geo[17]
    pd, ph = geo[19], geo[20]
    n = r // (od * oh)
    o_d = (r // oh) % od
    o_h = r % oh
    nr = 0
    for t_d in range(kd):
        i_d = o_d * sd - pd + t_d * dd
        if i_d < 0 or i_d >= id_:
            continue
        for t_h in range(kh):
            i_h = o_h * sh - ph + t_h * dh
            if i_h < 0 or i_h >= ih:
                continue
            roff[nr] = ((n * id_ + i_d) * ih + i_h) * iw * C
            rw[nr] = wbase + (t_d * kh + t_h) * kw * C
            nr += 1
    return nr


@helper(inline=True)
def _output_row_taps(geo, r, roff, rw):
    """The row taps (depth x height) that reach dX row ``r`` (of ``mb*id*ih``) from a dY
    row: the dY rows' offsets into ``roff`` and the filter rows' offsets into ``rw``
    (elements); returns how many."""
    C = geo[1]
    id_, ih = geo[4], geo[5]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh = geo[13], geo[14]
    dd, dh = geo[16], geo[17]
    pd, ph = geo[19], geo[20]
    n = r // (id_ * ih)
    i_d = (r // ih) % id_
    i_h = r % ih
    nr = 0
    for t_d in range(kd):
        a_d = i_d + pd - t_d * dd
        if a_d < 0:
            break
        if a_d % sd != 0 or a_d // sd >= od:
            continue
        for t_h in range(kh):
            a_h = i_h + ph - t_h * dh
            if a_h < 0:
                break
            if a_h % sh != 0 or a_h // sh >= oh:
                continue
            roff[nr] = ((n * od + a_d // sd) * oh + a_h // sh) * ow * C
            rw[nr] = (t_d * kh + t_h) * kw * C
            nr += 1
    return nr


def _bwd_d_rows(dy, w, dx, geo, nchunks, chunk):
    """The rows of dX in chunk ``chunk`` of ``nchunks`` (see :func:`bwd_d_depthwise_m1`)."""
    mb, C = geo[0], geo[1]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    ow, sw, dw, pw = geo[12], geo[15], geo[18], geo[21]
    rows = mb * id_ * ih
    r0, r1 = rows * chunk // nchunks, rows * (chunk + 1) // nchunks
    it = dx.itemsize
    dyb, wb, dxb = dy.ctypes.data, w.ctypes.data, dx.ctypes.data
    nq = min(sw, iw)
    big = (kw - 1) * dw // sw + 1  # keeps column arithmetic non-negative
    roff = np.empty(kd * kh, np.int64)
    rw = np.empty(kd * kh, np.int64)
    cb = np.empty(kw, np.int64)
    ct = np.empty(kw, np.int64)
    tdy = np.empty(kw, np.int64)
    tw = np.empty(kw, np.int64)
    for r in range(r0, r1):
        nr = _output_row_taps(geo, r, roff, rw)
        dxrow = r * iw * C
        for q in range(nq):
            npx = (iw - q + sw - 1) // sw  # input columns q, q + sw, ...
            nc = 0
            lo = 0
            hi = npx
            for t_w in range(kw):
                e = q + pw - t_w * dw + big * sw
                if e % sw != 0:
                    continue
                base = e // sw - big  # column j of the phase reads dy column j + base
                cb[nc] = base
                ct[nc] = t_w
                nc += 1
                lo = max(lo, -base)
                hi = min(hi, ow - base)
            lo = min(lo, npx)
            hi = max(hi, lo)
            j = 0
            while j < npx:
                j1 = hi if lo <= j < hi else j + 1
                nt = 0
                for b in range(nc):
                    o_w = j + cb[b]
                    if 0 <= o_w < ow:
                        tdy[nt] = o_w * C
                        tw[nt] = ct[b] * C
                        nt += 1
                dxp = dxb + (dxrow + (q + j * sw) * C) * it
                if nr == 0 or nt == 0:
                    for p in range(j1 - j):
                        for c in range(C):
                            _store_zero(dxp, p * sw * C + c, dx)
                else:
                    _d_chunks(dyb, wb, dxp, roff, rw, nr, tdy, tw, 0, nt, j1 - j, sw * C,
                              C, C, 0, dx)
                j = j1


@helper(inline=True)
def _aligned_zeros(n, like):
    """``n`` zeros of ``like``'s dtype starting on a 64-byte boundary (a vector load across
    a cache line costs two). The caller keeps the result in use until its last address is
    taken: Numba frees an array after its last use, and an address is not a use."""
    it = like.itemsize
    pad = 64 // it
    raw = np.empty(n + pad, like.dtype)  # zeroed below: np.zeros is an overload of its own
    s = (pad - (raw.ctypes.data % 64) // it) % pad
    out = raw[s:s + n]
    _zero(out.ctypes.data, n * it)
    return out


@helper(inline=True)
def _no_rows(n):
    """The ``tag`` of ``n`` empty buffer rows (see :func:`_stage_rows`): ``-1`` each, filled
    here from one ``np.empty`` (``np.full`` is an overload compiled of its own)."""
    tag = np.empty(n, np.int64)
    for i in range(n):
        tag[i] = -1
    return tag


@helper(inline=True)
def _pack_filter(w, wpk, T, C, VB):
    """``wpk[b, t, l] = w[t, b*VB + l]``: the ``T`` taps' filter in blocks of ``VB``
    channels (``wpk`` zeros past ``C``)."""
    it = w.itemsize
    for t in range(T):
        for b in range((C + VB - 1) // VB):
            _copy(wpk.ctypes.data + (b * T + t) * VB * it, w.ctypes.data + (t * C + b * VB) * it,
                  min(VB, C - b * VB) * it)


@helper(inline=True)
def _copy_row(buf, dst, src, npx, C, VB, bs):
    """``npx`` pixels of ``C`` channels at the address ``src`` into ``buf`` from element
    ``dst`` in blocks of ``VB`` channels ``bs`` elements apart, a pixel ``VB`` elements
    after the last (block by block: Numba's element loop, with its index wraparound, took
    as long as the spans themselves)."""
    it = buf.itemsize
    nblk = (C + VB - 1) // VB
    for p in range(npx):
        d = buf.ctypes.data + (dst + p * VB) * it
        s = src + p * C * it
        for b in range(nblk - 1):
            _copy(d + b * bs * it, s + b * VB * it, VB * it)
        _copy(d + (nblk - 1) * bs * it, s + (nblk - 1) * VB * it, (C - (nblk - 1) * VB) * it)


@helper(inline=True)
def _stage_rows(buf, tag, roff, rw, nr, src, npx, nh, nd, sl_d, sl_h, slot, bs, col0, C,
                VB):
    """The padded drivers' row taps in their buffer: the ``nr`` rows at element offsets
    ``roff`` of the operand at address ``src`` (rows of ``npx`` pixels of ``C``
    channels; ``nh`` rows per slice, ``nd`` slices per image) each copied, unless there
    already, into the buffer row of its depth and height residues (``sl_d`` x ``sl_h``
    rows of ``slot`` elements, blocks of channels ``bs`` apart, ``tag`` saying which row
    each holds) from column ``col0``; ``roff`` becomes the buffer rows' offsets and ``rw``
    (filter rows, in ``C``) the packed filter's (in ``VB``)."""
    it = buf.itemsize
    for i in range(nr):
        row = roff[i] // (npx * C)
        s = ((row // nh) % nd % sl_d) * sl_h + row % nh % sl_h
        if tag[s] != row:
            _copy_row(buf, s * slot + col0 * VB, src + roff[i] * it, npx, C, VB, bs)
            tag[s] = row
        roff[i] = s * slot
        rw[i] = rw[i] // C * VB


@helper(inline=True)
def _flat_taps(roff, rw, nr, tdb, twt, nk, VB, tdo, two):
    """Every row tap's ``nk`` column taps as one list for :func:`_pspan`: buffer offsets
    ``roff[i] + tdb[k]*VB`` into ``tdo``, filter offsets ``rw[i] + twt[k]`` into ``two``;
    returns how many."""
    nt = 0
    for i in range(nr):
        for k in range(nk):
            tdo[nt] = roff[i] + tdb[k] * VB
            two[nt] = rw[i] + twt[k]
            nt += 1
    return nt


def _bwd_d_rows_pad(dy, w, dx, geo, nchunks, chunk):
    """The rows of dX in chunk ``chunk`` of ``nchunks`` over padded rows (the tile
    ``padded``): each dY row a dX row reads is copied once into a row of this thread's
    buffer, between zeros and in blocks of ``VB`` channels (``PAD_VECTORS`` vectors), so
    that every dX pixel takes every column tap of its stride phase and a phase of a dX
    row is one :func:`_pspan` (no border pixels, whose one-pixel spans read and wrote dX
    once per row tap and chunk of taps), and every dY load is a constant offset from one
    pointer. The filter is packed the same way. A buffer row is kept per residue of the
    dY row's depth and height, enough for every row tap of a dX row, so that consecutive
    dX rows reuse the rows they share."""
    mb, C = geo[0], geo[1]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pw = geo[21]
    rows = mb * id_ * ih
    r0, r1 = rows * chunk // nchunks, rows * (chunk + 1) // nchunks
    it = dx.itemsize
    VB = PAD_VECTORS * (VECTOR_BYTES // it)
    nblk = (C + VB - 1) // VB
    T = kd * kh * kw
    # the filter in blocks of channels: wpk[b, t, l] = w[t, b*VB + l] (zeros past C)
    wpk = _aligned_zeros(nblk * T * VB, dy)
    _pack_filter(w, wpk, T, C, VB)
    # per stride phase q (dX columns q, q + sw, ...): its column taps, the phase's pixel
    # j reading dY column j + base (as in _bwd_d_rows)
    nq = min(sw, iw)
    big = (kw - 1) * dw // sw + 1  # keeps column arithmetic non-negative
    # the int64 tables as 1-D arrays of one kind (phase q's column taps from q*kw): each
    # other allocation (np.zeros, np.full, a 2-D shape) compiles an overload of its own
    ntap = np.empty(nq, np.int64)
    base = np.empty(nq * kw, np.int64)
    twt = np.empty(nq * kw, np.int64)
    lowest = 0
    for q in range(nq):
        ntap[q] = 0
        for t_w in range(kw):
            e = q + pw - t_w * dw + big * sw
            if e % sw == 0:
                base[q * kw + ntap[q]] = e // sw - big
                twt[q * kw + ntap[q]] = t_w * VB
                lowest = min(lowest, e // sw - big)
                ntap[q] += 1
    padl = -lowest  # buffer column of dY column 0
    # the last column read: a phase's last pixel plus a short block's overreach
    width = padl + max(ow, (iw - 1 + pw) // sw + 1) + PB_D
    tdb = np.empty(nq * kw, np.int64)
    for q in range(nq):
        for k in range(ntap[q]):
            tdb[q * kw + k] = base[q * kw + k] + padl
    sl_d = (kd - 1) * dd // sd + 1
    sl_h = (kh - 1) * dh // sh + 1
    bs = width * VB  # one block of channels of a buffer row
    slot = nblk * bs
    buf = _aligned_zeros(sl_d * sl_h * slot, dy)  # the middles copied on first use
    tag = _no_rows(sl_d * sl_h)  # which dY row each buffer row holds
    dxb = dx.ctypes.data
    dyb = dy.ctypes.data
    roff = np.empty(kd * kh, np.int64)
    rw = np.empty(kd * kh, np.int64)
    tdo = np.empty(kd * kh * kw, np.int64)  # a phase's taps: buffer and filter offsets
    two = np.empty(kd * kh * kw, np.int64)
    for r in range(r0, r1):
        nr = _output_row_taps(geo, r, roff, rw)
        _stage_rows(buf, tag, roff, rw, nr, dyb, ow, oh, od, sl_d, sl_h, slot, bs, padl, C,
                    VB)
        for q in range(nq):
            npx = (iw - q + sw - 1) // sw
            dxp = dxb + (r * iw + q) * C * it
            if nr == 0 or ntap[q] == 0:
                for p in range(npx):
                    for c in range(C):
                        _store_zero(dxp, p * sw * C + c, dx)
            else:
                nt = _flat_taps(roff, rw, nr, tdb[q * kw:], twt[q * kw:], ntap[q], VB, tdo,
                                two)
                # the buffers' addresses taken here, where they are used: Numba frees an
                # array after its last use, and an address is not a use
                _pspan(buf.ctypes.data, wpk.ctypes.data, dxp, tdo.ctypes.data,
                       two.ctypes.data, nt, npx, sw * C, bs, T * VB, nblk, C, dx)


_D_ROWS_SIG = ("void({T}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], "
               "int64[::1], int64, int64)")
#: the padded driver (see :func:`_bwd_d_rows_pad`)
_bwd_d_rows_pad = separate(_D_ROWS_SIG, float32="float32", float64="float64")(_bwd_d_rows_pad)


def _fwd_rows_pad(x, w, y, geo, nchunks, chunk):
    """The rows of Y in chunk ``chunk`` of ``nchunks`` over padded rows, column stride 1
    (:func:`_bwd_d_rows_pad` with X in dY's place): each input row an output row reads is
    copied once between zeros in blocks of channels, and an output row is one
    :func:`_pspan` over its row taps' column taps."""
    mb, C = geo[0], geo[1]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pw = geo[21]
    rows = mb * od * oh
    r0, r1 = rows * chunk // nchunks, rows * (chunk + 1) // nchunks
    it = y.itemsize
    VB = PAD_VECTORS * (VECTOR_BYTES // it)
    nblk = (C + VB - 1) // VB
    T = kd * kh * kw
    wpk = _aligned_zeros(nblk * T * VB, x)
    _pack_filter(w, wpk, T, C, VB)
    # output column j, tap t_w reads buffer column j + t_w*dw (input column j - pw +
    # t_w*dw at buffer column + pw); past the last: a short block's overreach
    width = max(pw + iw, ow + (kw - 1) * dw) + PB_D
    sl_d = (kd - 1) * dd + 1
    sl_h = (kh - 1) * dh + 1
    bs = width * VB
    slot = nblk * bs
    buf = _aligned_zeros(sl_d * sl_h * slot, x)
    tag = _no_rows(sl_d * sl_h)
    xb, yb = x.ctypes.data, y.ctypes.data
    roff = np.empty(kd * kh, np.int64)
    rw = np.empty(kd * kh, np.int64)
    tdb = np.empty(kw, np.int64)  # output pixel j, tap k: buffer column j + k*dw
    twt = np.empty(kw, np.int64)
    for k in range(kw):
        tdb[k] = k * dw
        twt[k] = k * VB
    tdo = np.empty(kd * kh * kw, np.int64)
    two = np.empty(kd * kh * kw, np.int64)
    for r in range(r0, r1):
        nr = _input_row_taps(geo, r, roff, rw, 0)
        _stage_rows(buf, tag, roff, rw, nr, xb, iw, ih, id_, sl_d, sl_h, slot, bs, pw, C, VB)
        nt = _flat_taps(roff, rw, nr, tdb, twt, kw, VB, tdo, two)
        yp = yb + r * ow * C * it
        if nt == 0:
            for e in range(ow * C):
                _store_zero(yp, e, y)
        else:
            _pspan(buf.ctypes.data, wpk.ctypes.data, yp, tdo.ctypes.data, two.ctypes.data, nt,
                   ow, C, bs, T * VB, nblk, C, y)


#: the padded forward driver (see :func:`_fwd_rows_pad`)
_fwd_rows_pad = separate(_D_ROWS_SIG, float32="float32", float64="float64")(_fwd_rows_pad)
_bwd_d_rows = separate(_D_ROWS_SIG, float32="float32", float64="float64")(_bwd_d_rows)


@helper(inline=True)
def _column_ranges(iw, kw, sw, dw, pw, ow, lo_t, hi_t):
    """Per column tap ``t_w`` of an output row of ``ow`` columns, the columns ``lo_t[t_w] <=
    o_w < hi_t[t_w]`` whose input column ``o_w*sw - pw + t_w*dw`` lies inside the ``iw``
    input columns; returns ``(lo, hi)``, the columns where every tap does (the interior
    span; empty where ``lo == hi``)."""
    lo = 0
    hi = ow
    for t_w in range(kw):
        a = pw - t_w * dw  # input column o_w*sw - a
        lo_t[t_w] = (a + sw - 1) // sw if a > 0 else 0
        hi_t[t_w] = min(ow, (iw - 1 + a) // sw + 1) if iw - 1 + a >= 0 else 0
        lo = max(lo, lo_t[t_w])
        hi = min(hi, hi_t[t_w])
    lo = min(lo, ow)
    return lo, max(hi, lo)


def _fwd_rows(x, w, y, geo, nchunks, chunk):
    """The rows of Y in chunk ``chunk`` of ``nchunks`` (see :func:`fwd_depthwise_m1`): the
    backward-data spans with X in dY's place. Per Y row, the row taps that reach it; its
    interior (every column tap inside X) is one span, border pixels spans of one. The
    column taps are listed last first, so that a span's pixel p reads X pixel p - k of
    its tap k's table entry, as backward data's sliding blocks expect."""
    mb, C, iw = geo[0], geo[1], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sw, dw, pw = geo[15], geo[18], geo[21]
    rows = mb * od * oh
    r0, r1 = rows * chunk // nchunks, rows * (chunk + 1) // nchunks
    it = y.itemsize
    xb, wb, yb = x.ctypes.data, w.ctypes.data, y.ctypes.data
    roff = np.empty(kd * kh, np.int64)
    rw = np.empty(kd * kh, np.int64)
    lo_t = np.empty(kw, np.int64)
    hi_t = np.empty(kw, np.int64)
    tx = np.empty(kw, np.int64)
    tw = np.empty(kw, np.int64)
    lo, hi = _column_ranges(iw, kw, sw, dw, pw, ow, lo_t, hi_t)
    for r in range(r0, r1):
        nr = _input_row_taps(geo, r, roff, rw, 0)
        j = 0
        while j < ow:
            j1 = hi if lo <= j < hi else j + 1
            nt = 0
            for t_w in range(kw - 1, -1, -1):
                if lo_t[t_w] <= j < hi_t[t_w]:
                    tx[nt] = (j * sw - pw + t_w * dw) * C
                    tw[nt] = t_w * C
                    nt += 1
            yp = yb + (r * ow + j) * C * it
            if nr == 0 or nt == 0:
                for p in range(j1 - j):
                    for c in range(C):
                        _store_zero(yp, p * C + c, y)
            else:
                _d_chunks(xb, wb, yp, roff, rw, nr, tx, tw, 0, nt, j1 - j, C, sw * C, C, 0, y)
            j = j1


_fwd_rows = separate(_D_ROWS_SIG, float32="float32", float64="float64")(_fwd_rows)


def padded_bytes(geo, direction, itemsize):
    """Bytes one thread of the padded drivers allocates for ``geo`` (``direction`` "fwd"
    or "bwd_d"): its buffer rows and packed filter (an upper bound)."""
    C = int(geo[1])
    iw, ow = int(geo[6]), int(geo[12])
    kd, kh, kw = (int(v) for v in geo[7:10])
    sd, sh, sw = (int(v) for v in geo[13:16])
    dd, dh, dw = (int(v) for v in geo[16:19])
    pw = int(geo[21])
    VB = PAD_VECTORS * (VECTOR_BYTES // itemsize)
    nblk = -(-C // VB)
    if direction == "fwd":
        width = max(pw + iw, ow + (kw - 1) * dw) + PB_D
        slots = ((kd - 1) * dd + 1) * ((kh - 1) * dh + 1)
    else:
        padl = (kw - 1) * dw // sw + 1
        width = padl + max(ow, (iw - 1 + pw) // sw + 1) + PB_D
        slots = ((kd - 1) * dd // sd + 1) * ((kh - 1) * dh // sh + 1)
    return (slots * width + kd * kh * kw) * nblk * VB * itemsize + 128


def bwd_d_depthwise_m1(dy, w, dx, geo, nchunks, padded=False):
    """dx = depthwise conv^T(dy, w) for multiplier 1, any kernel, stride, dilation and
    padding. Per dX row: the row taps that reach it; per column stride phase of the row:
    its column taps; the phase's interior (every column tap in range) is one span, its
    border pixels spans of one pixel. Threads take ``nchunks`` contiguous ranges of rows
    (the loop nest is a separate serial helper, run over the chunks in parallel). The
    forward pass runs here too, with the forward driver's table (:func:`fwd_depthwise_m1`:
    X, W and Y in the places of dY, W and dX)."""
    rows = _bwd_d_rows_pad if padded else _bwd_d_rows
    rows.run(dtype_name(dx.dtype), nchunks, dy, w, dx, geo, nchunks)


def fwd_depthwise_m1(x, w, y, geo, nchunks, padded=False):
    """y = depthwise conv(x, w) for multiplier 1, any kernel, stride, dilation and padding:
    :func:`bwd_d_depthwise_m1` running the forward row driver (:func:`_fwd_rows`; the padded
    one where ``padded``, which needs column stride 1), ``nchunks`` contiguous ranges of Y
    rows."""
    if padded:
        if geo[15] != 1:
            raise ValueError("the padded forward driver needs column stride 1")
        rows = _fwd_rows_pad
    else:
        rows = _fwd_rows
    rows.run(dtype_name(y.dtype), nchunks, x, w, y, geo, nchunks)


@separate("void({T}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], {T}[:, :, :, :, :, ::1], int64[::1], "
          "int64)", float32="float32", float64="float64")
def _bwd_w_rows(x, dy, part, geo, ch):
    """The output rows of chunk ``ch`` (of ``part.shape[0]``) into the partial dW
    ``part[ch]`` (zeroed here)."""
    mb, C, iw = geo[0], geo[1], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sw, dw, pw = geo[15], geo[18], geo[21]
    rows = mb * od * oh
    nchunks = part.shape[0]
    r0, r1 = rows * ch // nchunks, rows * (ch + 1) // nchunks
    it = x.itemsize
    xb, dyb, pb = x.ctypes.data, dy.ctypes.data, part.ctypes.data
    T = kd * kh * kw
    pf = part.reshape(-1)
    pf[ch * T * C:(ch + 1) * T * C] = 0
    roff = np.empty(kd * kh, np.int64)
    rw = np.empty(kd * kh, np.int64)
    lo_t = np.empty(kw, np.int64)
    hi_t = np.empty(kw, np.int64)
    tx = np.empty(kw, np.int64)
    tp = np.empty(kw, np.int64)
    lo, hi = _column_ranges(iw, kw, sw, dw, pw, ow, lo_t, hi_t)
    for r in range(r0, r1):
        nr = _input_row_taps(geo, r, roff, rw, ch * T * C)
        j = 0
        while nr > 0 and j < ow:
            j1 = hi if lo <= j < hi else j + 1
            nt = 0
            for t_w in range(kw):
                if lo_t[t_w] <= j < hi_t[t_w]:
                    tx[nt] = (j * sw - pw + t_w * dw) * C
                    tp[nt] = t_w * C
                    nt += 1
            dyp = dyb + (r * ow + j) * C * it
            _w_chunks(xb, dyp, pb, roff, rw, nr, tx, tp, nt, j1 - j, sw * C, C, C, x)
            j = j1


@helper
def reduce_chunks(part, dwt):
    """``dwt`` = the sum of the per-chunk partials ``part[0] + part[1] + ...``."""
    nchunks = part.shape[0]
    TC = dwt.size
    pf = part.reshape(-1)
    df = dwt.reshape(-1)
    for i in range(TC):
        acc = pf[i]
        for ch in range(1, nchunks):
            acc += pf[ch * TC + i]
        df[i] = acc


def bwd_w_depthwise_m1(x, dy, part, dwt, geo):
    """See :func:`bwd_w_m1_kernel` (its address table for ``part``'s dtype added)."""
    bwd_w_m1_kernel(_bwd_w_rows.table(dtype_name(part.dtype)), x, dy, part, dwt, geo)


@kernel(parallel=False)
def bwd_w_m1_kernel(fns, x, dy, part, dwt, geo):
    """dwt (``[kd, kh, kw, 1, C]``) = dW of multiplier 1, any kernel, stride, dilation and
    padding. part[j] (scratch, ``[nchunks, kd, kh, kw, 1, C]``): chunk j's sum over its
    contiguous range of output rows, zeroed and reduced here. Per dY row, the row taps in
    range; its interior (every column tap in range) is one span, border pixels spans of
    one (the loop nest is a separate serial helper, run over the chunks in parallel)."""
    par_for(_bwd_w_rows, fns, part.shape[0], x, dy, part, geo)
    reduce_chunks(part, dwt)
