"""Implicit-GEMM backward data: register tiles of ``dX`` summed over the taps straight from
a zero-padded ``dY``, with no im2col matrix and no pass over ``dX`` per tap.

Backward data at stride ``s`` splits into stride phases ``q`` (dX positions ``q + s*j``);
in a phase, tap ``t`` with an exact offset ``b_t = (q + pad - t*dil) / s`` gives

    dX[q + s*j, c] += sum_k dY[j + b_t, k] * W[t, c, k]

(see :mod:`numbaconv.strategies.gemm`). With ``dY`` padded by zeros so that every
``j + b_t`` of every phase lies inside (``dyp``), the ``k``-vector a phase pixel ``j``
needs for tap ``t`` starts ``seg[t]`` elements after pixel ``j``'s own place in ``dyp``:
one constant offset per tap. So an ``MR x NR`` tile of ``dX`` (``MR`` consecutive phase
pixels, across rows and images as they come; ``NR`` channels) is one register tile of a
GEMM whose reduction runs over segments (taps) of ``K`` contiguous elements each:

    acc[i, :] = sum_t sum_k dyp[arow[i] + seg[t] + k] * Bp[t, k, :]

with ``Bp`` the filter packed per phase into ``[panels, taps, K, NR]`` (the ``NR``
channels of a panel contiguous, zero past ``C``). The micro-kernel (:func:`_micro`) is the
one of :mod:`numbaconv.kernels.cpu.ukernel` (``MR x NV`` vectors of accumulators, one
broadcast and ``NV`` loads per step: BLIS's and oneDNN's brgemm's scheme) with each row's
``A`` address given explicitly and the reduction walking a list of segments, so a tile
spans row and image boundaries freely and is stored once per chunk of taps.

Blocking (BLIS's loop order with an ``mc`` row block): a parallel loop over blocks of row
tiles; in a block, for each panel of ``NR`` channels, for each chunk of taps whose packed
filter (``chunk * K * NR``) stays in L2, every tile of the block. The block's ``dX`` tiles
stay in L1/L2 across the chunks (stored with ``beta`` 1 after the first), and the filter
chunk is read from L2 by every tile.

Regions (the planner entry ``gemm[regions]``): where a tap reads only dY's padding for
part of a phase's pixels (dilated layers, large filters over small images), the phase
grid is cut into boxes within which each tap reaches inside for every pixel or for none,
and :func:`bwd_d_regions` / :func:`bwd_d_regions_panels` sum each box's
own taps only, through a micro-kernel variant that finds each tap's filter rows in a
table (``_micro(nv, btab=True)``) instead of one after the other.

float16 (computed in float32, docs/contract.md section 5): :func:`pad_dy` widens ``dY``
from its float16 bits as it pads it, and :func:`bwd_d_phase_half` /
:func:`bwd_d_phase_panels_half` compute each thread's block (or panel) in float32 scratch
that stays in L2 and round it into a float16 ``dX`` once it is done, so no float32 ``dX``
is written out and read back.

This module is self-contained (see :mod:`numbaconv.kernels`): its micro-kernel is its own
copy, so that Numba's per-file cache never keeps a stale caller.
"""
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from numbaconv._jit import dtype_name, helper, kernel, par_for, separate

from numbaconv.kernels.cpu._host import STREAMS, VECTOR_BYTES  # noqa: E402
from numbaconv.kernels.cpu._ir import (beta_store, lane_mask, masked_io,  # noqa: E402
                                       transpose_block)

#: Rows of a register tile and the most vectors across it (as ukernel's: ``MR*NV``
#: accumulators, ``NV`` loaded vectors and a broadcast within 32 registers with AVX-512).
MR = 6
NV = 4 if VECTOR_BYTES == 64 else 2


def lanes(itemsize):
    return VECTOR_BYTES // itemsize


def panel(itemsize):
    """Channels of a full register tile (``NR``)."""
    return NV * lanes(itemsize)


def _micro(nv, btab=False):
    """``C[crows[i] + :nv*VL] (+)= sum_s sum_k A[arows[i] + segs[s] + k] * B[s*kl + k, :]``
    for the ``MR`` rows ``i`` (element offsets from ``a``, ``c``; ``arows``, ``segs`` and
    ``crows``: addresses of int64 arrays), ``nseg`` segments of ``kl`` elements each, ``B``
    packed with rows ``ldb`` elements apart. ``beta`` 0 stores the tile, 1 adds it to C, 2
    streams it (non-temporal stores: every row of the tile on a vector boundary); with no
    segments it stores zeros (or leaves C as it is). ``tail`` (0: none) is the number of
    lanes of C that the last vector of each row covers (a channel count that is not a
    whole number of vectors): its load and store are masked to them, so the tile never
    touches the next pixel's channels. ``btab``: ``segs`` holds pairs, each segment's
    ``A`` offset and the element offset of its first ``B`` row (segments whose filter
    rows are not one after the other: a region's taps)."""

    @intrinsic
    def micro(typingctx, a, arows, segs, nseg, kl, b, ldb, c, crows, beta, tail, work):
        sig = types.void(types.intp, types.intp, types.intp, types.intp, types.intp,
                         types.intp, types.intp, types.intp, types.intp, types.intp,
                         types.intp, work)
        dtype = work.dtype

        def codegen(context, builder, signature, args):
            a, arows, segs, nseg, kl, b, ldb, c, crows, beta, tail, _ = args
            f = context.get_value_type(dtype)
            vl = VECTOR_BYTES // context.get_abi_sizeof(f)
            vty = ir.VectorType(f, vl)
            fp, vp = f.as_pointer(), vty.as_pointer()
            i64 = ir.IntType(64)
            i64p = i64.as_pointer()
            name = "llvm.fma.v%d%s" % (vl, "f32" if dtype == types.float32 else "f64")
            fma = cgutils.get_or_insert_function(builder.module,
                                                 ir.FunctionType(vty, [vty] * 3), name)
            pa = builder.inttoptr(a, fp)
            pb = builder.inttoptr(b, fp)
            pc = builder.inttoptr(c, fp)
            parows = builder.inttoptr(arows, i64p)
            psegs = builder.inttoptr(segs, i64p)
            zero = ir.Constant(vty, None)
            undef = ir.Constant(vty, ir.Undefined)
            splat = ir.Constant(ir.VectorType(ir.IntType(32), vl), None)
            acc = [[cgutils.alloca_once_value(builder, zero) for _ in range(nv)]
                   for _ in range(MR)]
            arow = [builder.load(builder.gep(parows, [ir.Constant(i64, i)]))
                    for i in range(MR)]
            with cgutils.for_range(builder, nseg) as sloop:
                s = sloop.index
                if btab:
                    s2 = builder.mul(s, ir.Constant(i64, 2))
                    seg = builder.load(builder.gep(psegs, [s2]))
                    b0 = builder.load(builder.gep(psegs, [builder.add(s2,
                                                                      ir.Constant(i64, 1))]))
                else:
                    seg = builder.load(builder.gep(psegs, [s]))
                    b0 = builder.mul(builder.mul(s, kl), ldb)
                base = [builder.add(arow[i], seg) for i in range(MR)]
                with cgutils.for_range(builder, kl) as loop:
                    k = loop.index
                    bk = builder.add(b0, builder.mul(k, ldb))
                    bv = [builder.load(builder.bitcast(
                        builder.gep(pb, [builder.add(bk, ir.Constant(i64, v * vl))]), vp),
                        align=1) for v in range(nv)]
                    for i in range(MR):
                        x = builder.load(builder.gep(pa, [builder.add(base[i], k)]))
                        x = builder.insert_element(undef, x, ir.Constant(ir.IntType(32), 0))
                        x = builder.shuffle_vector(x, undef, splat)
                        for v in range(nv):
                            builder.store(
                                builder.call(fma, [x, bv[v], builder.load(acc[i][v])]),
                                acc[i][v])
            store, add = beta_store(builder, beta)
            # the last vector's lanes below ``tail``, where it is partial
            mask = lane_mask(builder, tail, vl)
            partial = builder.icmp_signed("!=", tail, ir.Constant(i64, 0))
            mload, mstore = masked_io(builder, vty, vl)
            for i in range(MR):
                crow = builder.load(builder.gep(builder.inttoptr(crows, i64p),
                                                [ir.Constant(i64, i)]))
                for v in range(nv):
                    p = builder.bitcast(
                        builder.gep(pc, [builder.add(crow, ir.Constant(i64, v * vl))]), vp)
                    val = builder.load(acc[i][v])
                    if v == nv - 1:
                        with builder.if_else(partial) as (masked, whole):
                            with masked:  # (never streamed: the strategy's rule)
                                with builder.if_then(add):
                                    mstore(builder.fadd(val, mload(p, mask)), p, mask)
                                with builder.if_then(builder.not_(add)):
                                    mstore(val, p, mask)
                            with whole:
                                store(val, p)
                    else:
                        store(val, p)
            return context.get_dummy_value()

        return sig, codegen

    return micro


_micro1, _micro2, _micro3, _micro4 = (_micro(n) for n in (1, 2, 3, 4))
_micro1t, _micro2t, _micro3t, _micro4t = (_micro(n, True) for n in (1, 2, 3, 4))


@helper
def _vectors(width, vl):
    """A tile's width in vectors as the kernels pass it (``nv`` below): ``n + 8*tail`` for
    ``width`` channels in ``n`` vectors of ``vl`` lanes, ``tail`` the lanes of a partial
    last vector (0 where the last vector is whole)."""
    n = (width + vl - 1) // vl
    tail = width - (n - 1) * vl
    return n + 8 * (tail if tail < vl else 0)


@helper
def _call(nv, a, arows, segs, nseg, kl, b, ldb, c, crows, beta, work):
    """The micro-kernel of ``nv & 7`` vectors, its last one ``nv >> 3`` lanes wide where
    that is not 0 (:func:`_vectors`)."""
    n = nv & 7
    tail = nv >> 3
    if n == 4:
        _micro4(a, arows, segs, nseg, kl, b, ldb, c, crows, beta, tail, work)
    elif n == 3:
        _micro3(a, arows, segs, nseg, kl, b, ldb, c, crows, beta, tail, work)
    elif n == 2:
        _micro2(a, arows, segs, nseg, kl, b, ldb, c, crows, beta, tail, work)
    else:
        _micro1(a, arows, segs, nseg, kl, b, ldb, c, crows, beta, tail, work)


@helper
def _call_t(nv, a, arows, pairs, nseg, kl, b, ldb, c, crows, beta, work):
    """:func:`_call` with a table of segments (``btab``)."""
    n = nv & 7
    tail = nv >> 3
    if n == 4:
        _micro4t(a, arows, pairs, nseg, kl, b, ldb, c, crows, beta, tail, work)
    elif n == 3:
        _micro3t(a, arows, pairs, nseg, kl, b, ldb, c, crows, beta, tail, work)
    elif n == 2:
        _micro2t(a, arows, pairs, nseg, kl, b, ldb, c, crows, beta, tail, work)
    else:
        _micro1t(a, arows, pairs, nseg, kl, b, ldb, c, crows, beta, tail, work)


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


@intrinsic
def _narrow(typingctx, v):
    """A float32 rounded to float16 (nearest even, as NumPy's cast), as its uint16 bits."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@intrinsic
def _transpose_block(typingctx, src, lds, dst, ldd, like):
    """A square block of ``like``'s dtype, a vector's lanes on a side, transposed in
    registers: row ``r`` at ``src + r*lds`` bytes, column ``c`` stored to ``dst + c*ldd``
    bytes (one vector load and store each, shuffles between: no element moves alone)."""
    sig = types.void(types.intp, types.intp, types.intp, types.intp, like)
    dtype = like.dtype

    def codegen(context, builder, signature, args):
        src, lds, dst, ldd, _ = args
        f = context.get_value_type(dtype)
        n = VECTOR_BYTES // context.get_abi_sizeof(f)
        transpose_block(builder, src, lds, dst, ldd, ir.VectorType(f, n), 1)
        return context.get_dummy_value()

    return sig, codegen


@separate("void({T}[::1], int64, int64, int64, int64, int64, {T}[::1], int64)",
          float32="float32", float64="float64")
def _pack(ws, C, K, tap, p, nr, od, dbase):
    """``od[dbase + k*nr + l] = ws[(tap*C + p*nr + l)*K + k]`` (0 past ``C``): one tap of
    panel ``p``, transposed in square blocks of a vector's lanes in registers
    (:func:`_transpose_block`: rows read and written a vector at a time).
    Blocks past ``C``, ``K`` or the panel's width (a panel narrower than a vector) go
    element by element (unsigned offsets, see
    :mod:`numbaconv.kernels.cpu.winograd`)."""
    n = VECTOR_BYTES // ws.itemsize
    it = ws.itemsize
    sbase = np.uint64(tap * C * K)
    db = np.uint64(dbase)
    pws, pod = np.int64(ws.ctypes.data), np.int64(od.ctypes.data)
    for c0 in range(0, nr, n):
        cb = min(n, nr - c0)
        for k0 in range(0, K, n):
            if cb == n and p * nr + c0 + n <= C and k0 + n <= K:
                _transpose_block(pws + (tap * C * K + (p * nr + c0) * K + k0) * it, K * it,
                                 pod + (dbase + k0 * nr + c0) * it, nr * it, ws)
            else:  # a block past C or K: element by element, zeros past C
                for j in range(k0, min(K, k0 + n)):
                    for i in range(cb):
                        c = p * nr + c0 + i
                        v = ws[sbase + np.uint64(c * K + j)] if c < C else 0
                        od[db + np.uint64(j * nr + c0 + i)] = v


def pack_filter(w, taps, out):
    """``out[p, t, k, l] = w[taps[t], p*NR + l, k]`` (0 for channels past ``C``): the
    filter ``w [T, C, K]`` as one phase's ``[panels, len(taps), K, NR]`` B panels (9 taps
    of 512 x 512 float32 in 0.61 ms on 2 threads, Zen 4: 31 GB/s read and written, where
    a scalar copy through a 16 x 16 block took 1.23 ms), in parallel over (panel, tap)."""
    name = dtype_name(w.dtype)
    _pack_tap.run(name, out.shape[0] * out.shape[1], _pack.table(name), w, taps, out)


@separate("void(int64[::1], {T}[:, :, ::1], int64[::1], {T}[:, :, :, ::1], int64)",
          float32="float32", float64="float64")
def _pack_tap(pack_fn, w, taps, out, pt):
    """(Panel, tap) ``pt`` of :func:`pack_filter`."""
    C, K = w.shape[1], w.shape[2]
    nt, nr = out.shape[1], out.shape[3]
    p = pt // nt
    t = pt % nt
    _pack(pack_fn, w.reshape(w.size), C, K, taps[t], p, nr, out.reshape(out.size),
          (p * nt + t) * K * nr)


@helper
def _tile_offsets(pg, t0, t1, offs, rel, width):
    """``offs[ti, 0, i]`` / ``offs[ti, 1, i]``: the element offsets in ``dyp`` / ``dx`` of
    row ``i`` of row tile ``t0 + ti`` (see :func:`bwd_d_phase` for ``pg``). Rows past the
    last pixel read row 0's ``A`` and write row ``i`` of a scratch block ``width``
    elements wide, ``rel`` elements after ``dx``."""
    mb, Jd, Jh, Jw = pg[0], pg[1], pg[2], pg[3]
    Dp, Hp, Wp = pg[4], pg[5], pg[6]
    Ld, Lh, Lw = pg[8], pg[9], pg[10]
    ID, IH, IW = pg[11], pg[12], pg[13]
    qd, qh, qw = pg[15], pg[16], pg[17]
    sd, sh, sw = pg[18], pg[19], pg[20]
    ka, cs, k0, c0 = pg[21], pg[22], pg[23], pg[24]
    P = mb * Jd * Jh * Jw
    for ti in range(t1 - t0):
        r0 = (t0 + ti) * MR
        for i in range(MR):
            r = r0 + i
            if r < P:
                jw = r % Jw
                u = r // Jw
                jh = u % Jh
                u = u // Jh
                jd = u % Jd
                n = u // Jd
                offs[ti, 0, i] = ((((n * Dp + jd + Ld) * Hp + jh + Lh) * Wp + jw + Lw) * ka
                                  + k0)
                offs[ti, 1, i] = ((((n * ID + qd + sd * jd) * IH + qh + sh * jh) * IW
                                   + qw + sw * jw) * cs + c0)
            else:
                offs[ti, 0, i] = offs[ti, 0, 0]
                offs[ti, 1, i] = rel + i * width


@helper
def _rel(scratch, pc, it):
    """``scratch``'s address as a signed element offset from the address ``pc`` (the
    addresses are unsigned: their difference must not wrap)."""
    return (np.int64(scratch.ctypes.data) - np.int64(pc)) // it


@separate("void(int64, int64, int64[:, :, ::1], int64, int64, int64, {T}[::1], int64, int64, "
          "int64, int64, {T}[::1])", float32="float32", float64="float64")
def _tiles(nv, pa, offs, psegs, ns, K, bmat, boff, nr, cp, beta, work):
    """Every row tile of ``offs`` (``[tiles, 2, MR]``: A and C row offsets) against ``ns``
    segments (taps) from ``psegs`` and the B panel rows at element ``boff`` of ``bmat``
    (with no segments: zeros). The arrays themselves are passed, not their addresses, so
    that they stay alive (Numba frees an array after its last use as an array)."""
    po = offs.ctypes.data
    b = bmat.ctypes.data + boff * bmat.itemsize
    for ti in range(offs.shape[0]):
        _call(nv, pa, po + ti * 2 * MR * 8, psegs, ns, K, b, nr, cp,
              po + (ti * 2 + 1) * MR * 8, beta, work)


@intrinsic
def _sfence(typingctx):
    """``sfence``: this thread's streamed stores are visible before anything it does next."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        if STREAMS:  # elsewhere no stream is taken (see bwd_d_phase)
            fn = cgutils.get_or_insert_function(builder.module,
                                                ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse.sfence")
            builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


def bwd_d_phase(dyp, bp, dx, segs, pg, chunk, nblocks, work, stream=False):
    """One stride phase of backward data: ``dx[q + s*j, :] = sum_t dyp[j + b_t, :] @
    Bp[t]`` for every phase pixel ``j`` (see the module docstring), in parallel over
    blocks of row tiles, with the filter packed beforehand (:func:`pack_filter`).

    ``pg`` (int64): ``mb, Jd, Jh, Jw`` (the phase grid), ``Dp, Hp, Wp, K`` (``dyp``'s
    spatial dims and channels), ``Ld, Lh, Lw`` (``dyp``'s leading pads), ``ID, IH, IW, C``
    (``dx``), ``qd, qh, qw``, ``sd, sh, sw``, ``K', C', k0, c0`` (the rows of ``dyp`` and
    ``dx`` hold ``K'`` and ``C'`` elements, the problem's channels from ``k0`` and ``c0``
    on: one group's of arrays that hold them all). ``segs[t]``: tap ``t``'s element offset in
    ``dyp`` (``((b_d*Hp + b_h)*Wp + b_w)*K``). ``bp [panels, taps, K, NR]``: the packed
    filter. ``chunk``: taps per micro-kernel call. Row tiles of ``MR`` pixels are split
    into ``nblocks`` equal blocks, one per parallel iteration; ``work``: per-block scratch
    rows ``[nblocks, MR * C_panels]`` for the rows past the last pixel. ``stream``: where
    one chunk takes every tap (each tile stored once) and every tile row of dX and of
    ``work`` starts on a vector boundary, the tiles are written with non-temporal stores
    (a dX larger than the caches then costs no read for ownership)."""
    cs, c0 = pg[22], pg[24]
    ntaps = bp.shape[1]
    it = dx.itemsize
    nt = (stream and STREAMS and ntaps <= chunk
          and (dx.ctypes.data + c0 * it) % VECTOR_BYTES == 0
          and (cs * it) % VECTOR_BYTES == 0 and work.ctypes.data % VECTOR_BYTES == 0
          and (work.shape[1] * it) % VECTOR_BYTES == 0)
    name = dtype_name(dx.dtype)
    _phase_block.run(name, nblocks, _tiles.table(name), dyp, bp, dx, segs, pg, chunk, nblocks,
                     work, 2 if nt else 0)


@separate("void(int64[::1], {T}[:, :, :, :, ::1], {T}[:, :, :, ::1], {T}[:, :, :, :, ::1], "
          "int64[::1], int64[::1], int64, int64, {T}[:, ::1], int64, int64)",
          float32="float32", float64="float64")
def _phase_block(tiles_fn, dyp, bp, dx, segs, pg, chunk, nblocks, work, first, blk):
    """Block ``blk`` of row tiles of :func:`bwd_d_phase` (``first``: the ``beta``
    of its first chunk of taps)."""
    K, C = pg[7], pg[14]
    P = pg[0] * pg[1] * pg[2] * pg[3]
    ntiles = (P + MR - 1) // MR
    npan, ntaps, nr = bp.shape[0], bp.shape[1], bp.shape[3]
    it = dx.itemsize
    vl = VECTOR_BYTES // it
    tpb = (ntiles + nblocks - 1) // nblocks
    pa, pc = dyp.ctypes.data, dx.ctypes.data
    psegs = segs.ctypes.data
    bflat, wflat = bp.reshape(bp.size), work.reshape(work.size)
    t0 = blk * tpb
    t1 = min(ntiles, t0 + tpb)
    if t0 >= t1:
        return
    nt = t1 - t0
    offs = np.empty((nt, 2, MR), np.int64)   # per tile: A rows, C rows
    rel = _rel(work[blk], pc, it)           # scratch rows as offsets from dx
    _tile_offsets(pg, t0, t1, offs, rel, npan * nr)
    for p in range(npan):
        nv = _vectors(min(nr, C - p * nr), vl)
        cp = pc + p * nr * it
        for c0 in range(0, max(ntaps, 1), chunk):  # no taps: one pass storing zeros
            ns = min(chunk, ntaps - c0)
            _tiles(tiles_fn, nv, pa, offs, psegs + c0 * 8, ns, K, bflat,
                   ((p * ntaps + c0) * K) * nr, nr, cp, 1 if c0 else first, wflat)
    if nt:
        _sfence()


def bwd_d_phase_panels(dyp, w, taps, dx, segs, pg, chunk, nr, work):
    """See :func:`bwd_d_phase_panels_kernel` (its address tables for ``dx``'s dtype
    added)."""
    name = dtype_name(dx.dtype)
    bwd_d_phase_panels_kernel(_phase_panel.table(name), _tiles.table(name), _pack.table(name),
                              dyp, w, taps, dx, segs, pg, chunk, nr, work)


@kernel(parallel=False)
def bwd_d_phase_panels_kernel(row_fn, tiles_fn, pack_fn, dyp, w, taps, dx, segs, pg, chunk,
                              nr, work):
    """:func:`bwd_d_phase` in parallel over the ``NR``-channel panels instead of row blocks,
    each iteration packing its own panel's filter chunk by chunk (``w [T, C, K]``,
    ``taps``: the phase's tap indices) into a local buffer that stays in L2 while every row
    tile of the phase meets it: the filter is read once and never written back, for
    phases with few pixels and a large filter. ``work``: scratch rows ``[1, MR * C_panels]``
    for the rows past the last pixel (each panel writes its own columns)."""
    C = pg[14]
    P = pg[0] * pg[1] * pg[2] * pg[3]
    ntiles = (P + MR - 1) // MR
    npan = (C + nr - 1) // nr
    offs = np.empty((ntiles, 2, MR), np.int64)
    _tile_offsets(pg, 0, ntiles, offs, _rel(work, dx.ctypes.data, dx.itemsize), npan * nr)
    par_for(_phase_panel, row_fn, npan, tiles_fn, pack_fn, dyp, w, taps, dx, segs, pg, chunk,
            nr, work, offs)


@separate("void(int64[::1], int64[::1], {T}[:, :, :, :, ::1], {T}[:, :, ::1], int64[::1], "
          "{T}[:, :, :, :, ::1], int64[::1], int64[::1], int64, int64, {T}[:, ::1], "
          "int64[:, :, ::1], int64)", float32="float32", float64="float64")
def _phase_panel(tiles_fn, pack_fn, dyp, w, taps, dx, segs, pg, chunk, nr, work, offs, p):
    """Panel ``p`` of :func:`bwd_d_phase_panels_kernel` (``offs``: every row tile's A and C
    row offsets). ``nr``: a multiple of the vector, at most ``NR``."""
    K, C = pg[7], pg[14]
    ntaps = taps.shape[0]
    it = dx.itemsize
    vl = VECTOR_BYTES // it
    pa, pc = dyp.ctypes.data, dx.ctypes.data
    psegs = segs.ctypes.data
    ws = w.reshape(w.size)
    wflat = work.reshape(work.size)
    nv = _vectors(min(nr, C - p * nr), vl)
    cp = pc + p * nr * it
    buf = np.empty(max(1, min(chunk, ntaps)) * K * nr, dx.dtype)
    for c0 in range(0, max(ntaps, 1), chunk):      # no taps: one pass storing zeros
        ns = min(chunk, ntaps - c0)
        for t in range(ns):
            _pack(pack_fn, ws, C, K, taps[c0 + t], p, nr, buf, t * K * nr)
        _tiles(tiles_fn, nv, pa, offs, psegs + c0 * 8, ns, K, buf, 0, nr, cp,
               1 if c0 else 0, wflat)


@separate("void(int64, int64, int64[:, :, ::1], int64, int64, int64, int64, int64, {T}[::1], "
          "int64, int64, int64, int64, {T}[::1])", float32="float32", float64="float64")
def _tiles_span(nv, pa, offs, t0, t1, ppairs, ns, K, bmat, boff, nr, cp, beta, work):
    """Row tiles ``t0 <= ti < t1`` of ``offs`` against ``ns`` segments given as pairs (A
    offset, B element offset from element ``boff`` of ``bmat``, which may be negative: a
    chunk's base) at address ``ppairs``; with no segments: zeros."""
    po = offs.ctypes.data
    b = bmat.ctypes.data + boff * bmat.itemsize
    for ti in range(t0, t1):
        _call_t(nv, pa, po + ti * 2 * MR * 8, ppairs, ns, K, b, nr, cp,
                po + (ti * 2 + 1) * MR * 8, beta, work)


def bwd_d_regions(dyp, bp, dx, offs, items, rtab, pairs, epos, chunk, nc, work):
    """:func:`bwd_d_phase` over regions of the phase grid, each summing only the taps that
    reach inside ``dY`` for every one of its pixels (dilated and heavily padded layers,
    whose border pixels read only padding for some taps: those products add zeros).

    ``offs [tiles, 2, MR]``: the A and C row offsets of every row tile, region after
    region (each region's last tile padded with its first row's A and scratch C rows in
    ``work``). ``rtab [R, 4]``: per region its tiles ``[t0, t1)`` and its taps
    ``pairs[e0 : e0 + n]`` (A offset in ``dyp``, element offset of the tap's rows in a
    panel of ``bp``), at positions ``epos`` among the phase's taps, in increasing order.
    ``bp [panels, taps, K, NR]``: the phase's packed filter. ``items [I, 3]``: the
    parallel work, ``(region, t0, t1)`` blocks of row tiles. One micro-kernel call per tile
    and chunk of ``chunk`` tap positions (the filter chunk stays in L2); a region with no
    taps stores zeros. ``nc``: the channels of dX computed (one group's, where ``dx``
    holds all of them and ``offs`` addresses that group's)."""
    name = dtype_name(dx.dtype)
    _regions_item.run(name, items.shape[0], _tiles_span.table(name), dyp, bp, dx, offs, items,
                      rtab, pairs, epos, chunk, nc, work)


@separate("void(int64[::1], {T}[:, :, :, :, ::1], {T}[:, :, :, ::1], {T}[:, :, :, :, ::1], "
          "int64[:, :, ::1], int64[:, ::1], int64[:, ::1], int64[:, ::1], int64[::1], int64, "
          "int64, {T}[:, ::1], int64)", float32="float32", float64="float64")
def _regions_item(tiles_fn, dyp, bp, dx, offs, items, rtab, pairs, epos, chunk, C, work, ii):
    """Item ``ii`` (a region's block of row tiles) of :func:`bwd_d_regions`."""
    npan, ntaps, K, nr = bp.shape[0], bp.shape[1], bp.shape[2], bp.shape[3]
    it = dx.itemsize
    vl = VECTOR_BYTES // it
    pa, pc = dyp.ctypes.data, dx.ctypes.data
    pp = pairs.ctypes.data
    bflat, wflat = bp.reshape(bp.size), work.reshape(work.size)
    r, t0, t1 = items[ii, 0], items[ii, 1], items[ii, 2]
    e0, ne = rtab[r, 2], rtab[r, 3]
    for p in range(npan):
        nv = _vectors(min(nr, C - p * nr), vl)
        cp = pc + p * nr * it
        if ne == 0:
            _tiles_span(tiles_fn, nv, pa, offs, t0, t1, pp, 0, K, bflat, 0, nr, cp, 0,
                        wflat)
            continue
        beta = 0
        j = e0
        while j < e0 + ne:
            c1 = (epos[j] // chunk + 1) * chunk
            j1 = j + 1
            while j1 < e0 + ne and epos[j1] < c1:
                j1 += 1
            _tiles_span(tiles_fn, nv, pa, offs, t0, t1, pp + j * 16, j1 - j, K, bflat,
                        p * ntaps * K * nr, nr, cp, beta, wflat)
            beta = 1
            j = j1


def bwd_d_regions_panels(dyp, w, taps, dx, offs, rtab, pairs, epos, chunk, nr, work,
                         overlap=False):
    """:func:`bwd_d_regions` in parallel over panels of ``nr`` channels (whole vectors, at
    most ``NR``: the strategy shares the channels evenly), each packing its own filter
    chunk by chunk as :func:`bwd_d_phase_panels_kernel` does (``pairs``' B offsets are
    positions times ``K * nr``: a chunk's buffer stands at ``-c0 * K * nr``);
    every region then sums its taps in the chunk (its first sum stores, later ones add; a
    region with no taps stores zeros). ``overlap``: the regions overlap (one per tap, after
    a first one of the whole grid with no taps: ``_gemm_common.tap_boxes``), so every sum
    adds to what the regions before it left."""
    name = dtype_name(dx.dtype)
    _regions_panel.run(name, (w.shape[1] + nr - 1) // nr, _tiles_span.table(name),
                       _pack.table(name), dyp, w, taps, dx, offs, rtab, pairs, epos, chunk, nr,
                       work, np.int64(1 if overlap else 0))


@separate("void(int64[::1], int64[::1], {T}[:, :, :, :, ::1], {T}[:, :, ::1], int64[::1], "
          "{T}[:, :, :, :, ::1], int64[:, :, ::1], int64[:, ::1], int64[:, ::1], int64[::1], "
          "int64, int64, {T}[:, ::1], int64, int64)", float32="float32", float64="float64")
def _regions_panel(tiles_fn, pack_fn, dyp, w, taps, dx, offs, rtab, pairs, epos, chunk, nr,
                   work, overlap, p):
    """Panel ``p`` of :func:`bwd_d_regions_panels` (``nr``: a multiple of the vector, at
    most ``NR``)."""
    C, K = w.shape[1], w.shape[2]
    ntaps = taps.shape[0]
    it = dx.itemsize
    vl = VECTOR_BYTES // it
    pa, pc = dyp.ctypes.data, dx.ctypes.data
    pp = pairs.ctypes.data
    ws = w.reshape(w.size)
    wflat = work.reshape(work.size)
    nreg = rtab.shape[0]
    nv = _vectors(min(nr, C - p * nr), vl)
    cp = pc + p * nr * it
    buf = np.empty(max(1, min(chunk, ntaps)) * K * nr, dx.dtype)
    for c0 in range(0, max(ntaps, 1), chunk):
        ns = min(chunk, ntaps - c0)
        for t in range(ns):
            _pack(pack_fn, ws, C, K, taps[c0 + t], p, nr, buf, t * K * nr)
        for r in range(nreg):
            t0, t1, e0, ne = rtab[r, 0], rtab[r, 1], rtab[r, 2], rtab[r, 3]
            if ne == 0:
                if c0 == 0:
                    _tiles_span(tiles_fn, nv, pa, offs, t0, t1, pp, 0, K, buf, 0, nr, cp,
                                0, wflat)
                continue
            j = e0
            while j < e0 + ne and epos[j] < c0:
                j += 1
            j1 = j
            while j1 < e0 + ne and epos[j1] < c0 + ns:
                j1 += 1
            if j1 > j:
                _tiles_span(tiles_fn, nv, pa, offs, t0, t1, pp + j * 16, j1 - j, K, buf,
                            -c0 * K * nr, nr, cp, 1 if overlap or epos[e0] < c0 else 0,
                            wflat)


@helper
def _to_scratch(offs, nt, dofs, ld):
    """Keep the ``dX`` row offsets of the first ``nt`` tiles of ``offs`` in ``dofs`` and
    point the tiles' C rows at float32 scratch rows ``ld`` elements apart instead."""
    for ti in range(nt):
        for i in range(MR):
            dofs[ti, i] = offs[ti, 1, i]
            offs[ti, 1, i] = (ti * MR + i) * ld


@helper
def _round_row(src, s0, dst, d0, n):
    """``dst[d0 : d0 + n] = float16(src[s0 : s0 + n])`` as bits (unsigned offsets: no
    wraparound checks in the way of the vectoriser)."""
    a, b = np.uint64(s0), np.uint64(d0)
    for c in range(np.uint64(n)):
        dst[b + c] = _narrow(src[a + c])


def pad_dy(dy, dyp, lead):
    """``dyp[n, Ld + d, Lh + h, Lw + w, :] = dy[n, d, h, w, :]`` and zeros everywhere else
    (``lead``: int64 ``Ld, Lh, Lw``), in parallel over the rows of ``dyp``, each written
    once: no zero-fill pass over ``dyp`` first. ``dy`` of float16 bits (uint16) is widened
    into the float32 ``dyp`` on the way, so that float16 costs no pass of its own."""
    name = "float16" if dy.dtype == np.uint16 else dtype_name(dyp.dtype)
    _pad_row.run(name, dyp.shape[0] * dyp.shape[1] * dyp.shape[2], dy, dyp, lead)


@separate("void({S}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], int64[::1], int64)",
          float32=dict(S="float32", T="float32"), float64=dict(S="float64", T="float64"),
          float16=dict(S="uint16", T="float32"))
def _pad_row(dy, dyp, lead, r):
    """Row ``r`` (flat over ``n, dp, hp``) of :func:`pad_dy`."""
    mb, D, H, W, K = dy.shape
    Dp, Hp, Wp = dyp.shape[1], dyp.shape[2], dyp.shape[3]
    Ld, Lh, Lw = lead[0], lead[1], lead[2]
    s1 = dy.reshape(dy.size)
    d1 = dyp.reshape(dyp.size)
    L = np.uint64(W * K)
    Lp = np.uint64(Wp * K)
    head = np.uint64(Lw * K)
    zero = d1.dtype.type(0)
    hp = r % Hp
    u = r // Hp
    dp = u % Dp
    n = u // Dp
    do = np.uint64(r) * Lp
    d = dp - Ld
    h = hp - Lh
    if 0 <= d < D and 0 <= h < H:
        so = np.uint64((n * D + d) * H + h) * L
        for i in range(head):
            d1[do + i] = zero
        for i in range(L):
            d1[do + head + i] = _widen(s1[so + i])
        for i in range(head + L, Lp):
            d1[do + i] = zero
    else:
        for i in range(Lp):
            d1[do + i] = zero


def bwd_d_phase_half(dyp, bp, dxh, segs, pg, chunk, nth, work):
    """:func:`bwd_d_phase` with ``dX`` as float16 bits (``dxh``, uint16): each thread's
    blocks of row tiles are computed in float32 into its own scratch (``work[th]``: ``MR``
    rows per tile of a block, ``C_panels`` floats each, reused block after block so that
    it stays in L2) and rounded into ``dxh`` once, row by row, when the block is done:
    no float32 ``dX`` to write out and read back. Blocks of at most ``work.shape[1] //
    (MR * C_panels)`` tiles, the blocks of ``nth`` contiguous shares in parallel."""
    _phase_share_half.run("float16", nth, _tiles.table("float32"), dyp, bp, dxh, segs, pg, chunk,
                          nth, work)


@separate("void(int64[::1], {T}[:, :, :, :, ::1], {T}[:, :, :, ::1], {Y}[:, :, :, :, ::1], "
          "int64[::1], int64[::1], int64, int64, {T}[:, ::1], int64)",
          float16=dict(T="float32", Y="uint16"))
def _phase_share_half(tiles_fn, dyp, bp, dxh, segs, pg, chunk, nth, work, th):
    """Thread ``th``'s share of blocks of :func:`bwd_d_phase_half`."""
    K, C = pg[7], pg[14]
    P = pg[0] * pg[1] * pg[2] * pg[3]
    ntiles = (P + MR - 1) // MR
    npan, ntaps, nr = bp.shape[0], bp.shape[1], bp.shape[3]
    ldw = npan * nr
    vl = nr // NV
    it = work.itemsize
    btiles = max(1, work.shape[1] // (MR * ldw))
    nblocks = (ntiles + btiles - 1) // btiles
    bpt = (nblocks + nth - 1) // nth
    pa = dyp.ctypes.data
    psegs = segs.ctypes.data
    d1 = dxh.reshape(dxh.size)
    bflat = bp.reshape(bp.size)
    ws = work[th]
    pw = ws.ctypes.data
    offs = np.empty((btiles, 2, MR), np.int64)  # per tile: A rows, scratch rows
    dofs = np.empty((btiles, MR), np.int64)     # per tile: dX rows
    for blk in range(th * bpt, min(nblocks, (th + 1) * bpt)):
        t0 = blk * btiles
        t1 = min(ntiles, t0 + btiles)
        nt = t1 - t0
        _tile_offsets(pg, t0, t1, offs, 0, 0)
        _to_scratch(offs, nt, dofs, ldw)
        for p in range(npan):
            nv = _vectors(min(nr, C - p * nr), vl)
            cp = pw + p * nr * it
            for c0 in range(0, max(ntaps, 1), chunk):  # no taps: one pass storing zeros
                ns = min(chunk, ntaps - c0)
                _tiles(tiles_fn, nv, pa, offs[:nt], psegs + c0 * 8, ns, K, bflat,
                       ((p * ntaps + c0) * K) * nr, nr, cp, 1 if c0 else 0, ws)
        for r in range(min(nt * MR, P - t0 * MR)):
            _round_row(ws, r * ldw, d1, dofs[r // MR, r % MR], C)


def bwd_d_phase_panels_half(dyp, w, taps, dxh, segs, pg, chunk, nr, work):
    """See :func:`bwd_d_phase_panels_half_kernel` (its address tables added)."""
    bwd_d_phase_panels_half_kernel(_panels_share_half.table("float16"), _tiles.table("float32"),
                                   _pack.table("float32"), dyp, w, taps, dxh, segs, pg, chunk,
                                   nr, work)


@kernel(parallel=False)
def bwd_d_phase_panels_half_kernel(row_fn, tiles_fn, pack_fn, dyp, w, taps, dxh, segs, pg,
                                   chunk, nr, work):
    """:func:`bwd_d_phase_panels` with ``dX`` as float16 bits (``dxh``, uint16): each
    panel's ``NR`` columns of every row are computed in float32 into its thread's scratch
    (``work[th]``, ``[row tiles * MR, NR]``, reused panel after panel) and rounded into
    ``dxh`` once the panel's last chunk of taps is done."""
    P = pg[0] * pg[1] * pg[2] * pg[3]
    ntiles = (P + MR - 1) // MR
    offs = np.empty((ntiles, 2, MR), np.int64)
    _tile_offsets(pg, 0, ntiles, offs, 0, 0)
    dofs = np.empty((ntiles, MR), np.int64)
    _to_scratch(offs, ntiles, dofs, nr)             # scratch rows, NR floats apart
    par_for(_panels_share_half, row_fn, work.shape[0], tiles_fn, pack_fn, dyp, w, taps, dxh,
            segs, pg, chunk, nr, work, offs, dofs)


@separate("void(int64[::1], int64[::1], {T}[:, :, :, :, ::1], {T}[:, :, ::1], int64[::1], "
          "{Y}[:, :, :, :, ::1], int64[::1], int64[::1], int64, int64, {T}[:, ::1], "
          "int64[:, :, ::1], int64[:, ::1], int64)", float16=dict(T="float32", Y="uint16"))
def _panels_share_half(tiles_fn, pack_fn, dyp, w, taps, dxh, segs, pg, chunk, nr, work, offs,
                       dofs, th):
    """Thread ``th``'s share of panels of :func:`bwd_d_phase_panels_half_kernel` (``offs``,
    ``dofs``: every row tile's A and scratch rows, and its dX rows)."""
    K, C = pg[7], pg[14]
    P = pg[0] * pg[1] * pg[2] * pg[3]
    npan = (C + nr - 1) // nr
    ntaps = taps.shape[0]
    nth = work.shape[0]
    vl = nr // NV
    pa = dyp.ctypes.data
    psegs = segs.ctypes.data
    ws = w.reshape(w.size)
    d1 = dxh.reshape(dxh.size)
    ppt = (npan + nth - 1) // nth
    sc = work[th]
    buf = np.empty(max(1, min(chunk, ntaps)) * K * nr, work.dtype)
    for p in range(th * ppt, min(npan, (th + 1) * ppt)):
        wdt = min(nr, C - p * nr)
        nv = _vectors(wdt, vl)
        for c0 in range(0, max(ntaps, 1), chunk):  # no taps: one pass storing zeros
            ns = min(chunk, ntaps - c0)
            for t in range(ns):
                _pack(pack_fn, ws, C, K, taps[c0 + t], p, nr, buf, t * K * nr)
            _tiles(tiles_fn, nv, pa, offs, psegs + c0 * 8, ns, K, buf, 0, nr,
                   sc.ctypes.data, 1 if c0 else 0, sc)
        for r in range(P):
            _round_row(sc, r * nr, d1, dofs[r // MR, r % MR] + p * nr, wdt)
