"""bfloat16 GEMM with AVX512_BF16's dot-product instruction: ``C (float32) = A @ B`` for
bfloat16 ``A`` and ``B``, for the ``gemm[bf16-dot]`` entry, and the same blocked GEMM on
AMX tiles for ``gemm[bf16-amx]`` (:func:`amx_gemm`: another micro-kernel, from
:mod:`_amx`, bound into a copy of :func:`_block_body`).

``vdpbf16ps`` (``llvm.x86.avx512bf16.dpbf16ps.512``) takes 16 lanes of float32
accumulators and two vectors of 32 bfloat16 each, read as 16 pairs, and adds to lane ``j``
the two products of pair ``j`` of the one vector with pair ``j`` of the other: twice the
multiply-adds of an FMA on float32 per instruction, from operands half as wide. The
products of two bfloat16 are exact in float32; the sums are rounded in float32 (inputs and
results that are subnormal are flushed to zero by the instruction).

The reduction therefore runs over pairs: ``A`` is row-major bfloat16 with an even row
length, so that ``A[i, 2p]`` and ``A[i, 2p+1]`` form one 32-bit word, which the micro-kernel
broadcasts; ``B`` is packed by :func:`pack_pairs` into panels ``[N/NR, K/2, NR]`` of 32-bit
words, word ``(p, j)`` holding ``B[2p, j]`` (low half) and ``B[2p+1, j]`` (high half).
An ``MR x NR`` tile of ``C`` (``NR = NV*16``) lives in ``MR*NV`` registers for a block of the
reduction. :func:`gemm` blocks the reduction by ``kc2`` pairs (a ``kc2 x NR`` panel of B,
32 KiB, stays in L1 while every row tile of a block of rows meets it) and shares blocks of
rows among the threads. Rows and columns past the last whole tile go through scratch
tiles, so C is exactly ``[M, N]``.

:func:`im2col` gathers the rows of A from a canonical bfloat16 image (bits, ``uint16``):
row ``m`` (an output pixel) holds, tap by tap, the channels of the pixel that tap meets (or
zeros), as the forward pass and (at stride 1, with flipped taps) backward data need it.

Integer bits throughout: Numba has no bfloat16 type, so arrays are ``uint16`` (and
``uint32`` for pairs); LLVM's ``bfloat`` type appears only inside the micro-kernel's IR.
"""
from types import SimpleNamespace

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from numbaconv._jit import helper, kernel, par_for, separate, specialise
from numbaconv.kernels.cpu import _amx
from numbaconv.kernels.cpu._ir import bf16_round, dpbf16, store_pair_columns, transpose_block

#: Rows of a register tile and vectors across it: 24 accumulators, 4 loaded vectors and a
#: broadcast fit AVX-512's 32 registers.
MR = 6
NV = 4
#: Columns of a tile (16 float32 lanes per vector).
NR = NV * 16


@intrinsic
def _micro(typingctx, a, lda, b, c, ldc, k2, beta, d, ldd):
    """``C[:MR, :NR] (+)= A[:MR, :2*k2] @ B[:2*k2, :NR]``: ``a`` the address of A's first
    pair (rows ``lda`` pairs apart), ``b`` of a packed panel (``k2`` rows of ``NR`` pairs),
    ``c`` of C's first element (rows ``ldc`` floats apart). ``beta``: bit 0 adds to what C
    holds (else stores), bit 1 rounds the sum to bfloat16 bits at ``d`` (rows ``ldd``
    elements apart; C is then only read) instead of storing it to C."""
    sig = types.void(*[types.intp] * 9)

    def codegen(context, builder, signature, args):
        a, lda, b, c, ldc, k2, beta, d, ldd = args
        f32, i16, i32, i64 = ir.FloatType(), ir.IntType(16), ir.IntType(32), ir.IntType(64)
        vf, vi = ir.VectorType(f32, 16), ir.VectorType(i32, 16)
        dot, vb = dpbf16(builder)
        vh = ir.VectorType(i16, 16)
        pa = builder.inttoptr(a, i32.as_pointer())
        pb = builder.inttoptr(b, vi.as_pointer())
        pc = builder.inttoptr(c, f32.as_pointer())
        pd = builder.inttoptr(d, i16.as_pointer())
        zero = ir.Constant(vf, None)
        undef = ir.Constant(vi, ir.Undefined)
        splat = ir.Constant(vi, None)
        # accumulators as allocas: mem2reg turns them into registers
        acc = [[cgutils.alloca_once_value(builder, zero) for _ in range(NV)]
               for _ in range(MR)]
        arow = [builder.mul(lda, ir.Constant(i64, i)) for i in range(MR)]
        with cgutils.for_range(builder, k2) as loop:
            k = loop.index
            kb = builder.mul(k, ir.Constant(i64, NV))
            bv = [builder.bitcast(builder.load(builder.gep(
                pb, [builder.add(kb, ir.Constant(i64, v))]), align=4), vb)
                for v in range(NV)]
            for i in range(MR):
                s = builder.load(builder.gep(pa, [builder.add(arow[i], k)]), align=4)
                s = builder.insert_element(undef, s, ir.Constant(i32, 0))
                s = builder.bitcast(builder.shuffle_vector(s, undef, splat), vb)
                for v in range(NV):
                    builder.store(builder.call(dot, [builder.load(acc[i][v]), s, bv[v]]),
                                  acc[i][v])

        def c_at(i, v):
            off = builder.add(builder.mul(ldc, ir.Constant(i64, i)), ir.Constant(i64, 16 * v))
            return builder.bitcast(builder.gep(pc, [off]), vf.as_pointer())

        one = ir.Constant(i64, 1)
        add = builder.icmp_signed("!=", builder.and_(beta, one), ir.Constant(i64, 0))
        rnd = builder.icmp_signed("!=", builder.and_(beta, ir.Constant(i64, 2)),
                                  ir.Constant(i64, 0))
        with builder.if_then(add):
            for i in range(MR):
                for v in range(NV):
                    p = c_at(i, v)
                    builder.store(builder.fadd(builder.load(acc[i][v]), builder.load(p, align=4)),
                                  acc[i][v])
        with builder.if_else(rnd) as (then, otherwise):
            with then:
                for i in range(MR):
                    for v in range(NV):
                        off = builder.add(builder.mul(ldd, ir.Constant(i64, i)),
                                          ir.Constant(i64, 16 * v))
                        bits = bf16_round(builder, builder.bitcast(builder.load(acc[i][v]), vi))
                        builder.store(bits, builder.bitcast(builder.gep(pd, [off]),
                                                            vh.as_pointer()), align=2)
            with otherwise:
                for i in range(MR):
                    for v in range(NV):
                        builder.store(builder.load(acc[i][v]), c_at(i, v), align=4)
        return context.get_dummy_value()

    return sig, codegen


#: Pairs of rows of B per block of :func:`pack_pairs`' work.
PACK_PAIRS = 64


def pack_pairs(b, bp):
    """``bp[q, p, j] = B[2p, q*NR + j] | B[2p+1, q*NR + j] << 16`` (zero past B's edges) for
    ``b`` a 2-D ``uint16`` array of any strides (bfloat16 bits) and ``bp`` ``uint32``
    ``[ceil(N/NR), ceil(K/2), NR]``, C-contiguous; in parallel over (panel, block of
    ``PACK_PAIRS`` pairs)."""
    nb = -(-bp.shape[1] // PACK_PAIRS)
    _pack_rows.run("bf16" if b.flags.c_contiguous else "bf16_strided", bp.shape[0] * nb, b,
                   bp)


@separate("void(uint16[:, {L}], uint32[:, :, ::1], int64)", noalias=True,
          bf16=dict(L="::1"), bf16_strided=dict(L=":"))
def _pack_rows(b, bp, t):
    """Block ``t`` (flat over (panel, block of pairs)) of :func:`pack_pairs`' ``bp``."""
    k2 = bp.shape[1]
    nb = (k2 + PACK_PAIRS - 1) // PACK_PAIRS
    q = t // nb
    p0 = (t - q * nb) * PACK_PAIRS
    _pair_rows(b, bp[q], p0, min(k2, p0 + PACK_PAIRS), q * NR, p0)


@helper(inline=True)
def _grid_pixel(m, d, h, w):
    """``(n, z, y, x)``: pixel ``m`` of a grid of ``d x h x w`` pixels per image."""
    plane = h * w
    n = m // (d * plane)
    e = m - n * (d * plane)
    z = e // plane
    e -= z * plane
    y = e // w
    return n, z, y, e - y * w


@helper(inline=True)
def _pair_rows(b, dst, p0, p1, c0, r0):
    """``dst[r0 + p - p0, j] = B[2p, c0 + j] | B[2p+1, c0 + j] << 16`` for ``p0 <= p < p1``
    (zero past B's edges, rows as well as columns: a panel may hold more pairs than B,
    up to the AMX entry's multiple of 16): where the panel lies inside B and both rows of a pair exist, a
    plain loop the compiler vectorises (a C-contiguous ``b``); else value by value."""
    K, N = b.shape
    whole = min(p1, K // 2) if c0 + NR <= N else p0
    for p in range(p0, whole):
        lo = b[2 * p, c0:c0 + NR]
        hi = b[2 * p + 1, c0:c0 + NR]
        row = dst[r0 + p - p0]
        for j in range(NR):
            row[j] = np.uint32(lo[j]) | (np.uint32(hi[j]) << np.uint32(16))
    for p in range(whole, p1):
        for j in range(NR):
            col = c0 + j
            lo = np.uint32(0)
            hi = np.uint32(0)
            if col < N and 2 * p < K:
                lo = np.uint32(b[2 * p, col])
                if 2 * p + 1 < K:
                    hi = np.uint32(b[2 * p + 1, col])
            dst[r0 + p - p0, j] = lo | (hi << np.uint32(16))


#: Side of the square blocks of 32-bit words :func:`pack_taps` transposes in registers.
TB = 16


def pack_taps(w32, taps, bp):
    """Backward data's B panels straight from the filter: ``bp[q, i*K2 + p, j] =
    w32[taps[i], q*NR + j, p]`` (zero past ``C``) for ``w32`` the filter's bits ``[T, C,
    K]`` read as ``uint32`` ``[T, C, K2]`` (``K`` even, so that each word already holds
    the pair ``W[t, c, 2p]`` (low half), ``W[t, c, 2p+1]`` (high half) that
    :func:`pack_pairs` would build for ``W~[t*K + k, c] = W[t, c, k]``) and ``bp``
    ``uint32`` ``[ceil(C/NR), len(taps)*K2, NR]``: per (panel, tap) a 32-bit transpose in
    ``TB x TB`` blocks, rows read and written contiguously, in parallel over (panel,
    tap)."""
    _pack_tap.run("bf16", bp.shape[0] * taps.shape[0], w32, taps, bp)


@intrinsic
def _transpose_words(typingctx, src, lds, dst, ldd):
    """A ``TB x TB`` block of 32-bit words transposed in registers: row ``r`` at ``src +
    r*lds`` bytes, column ``c`` stored to ``dst + c*ldd`` bytes (one 64-byte store each)."""
    sig = types.void(types.intp, types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        src, lds, dst, ldd = args
        transpose_block(builder, src, lds, dst, ldd, ir.VectorType(ir.IntType(32), TB), 4)
        return context.get_dummy_value()

    return sig, codegen


@separate("void(uint32[:, :, ::1], int64[::1], uint32[:, :, ::1], int64)", noalias=True,
          bf16="bf16")
def _pack_tap(w32, taps, bp, qt):
    """(Panel, tap) ``qt`` of :func:`pack_taps`: whole ``TB x TB`` blocks transposed in
    registers (:func:`_transpose_words`), blocks past ``C`` or ``K2`` word by word."""
    C, K2 = w32.shape[1], w32.shape[2]
    nt = taps.shape[0]
    q = qt // nt
    i = qt - q * nt
    t = taps[i]
    pw, pb0 = np.int64(w32.ctypes.data), np.int64(bp.ctypes.data)
    for c0 in range(0, NR, TB):
        cg = q * NR + c0
        for p0 in range(0, K2, TB):
            pb = min(TB, K2 - p0)
            if cg + TB <= C and pb == TB:
                _transpose_words(pw + ((t * C + cg) * K2 + p0) * 4, K2 * 4,
                                 pb0 + ((q * bp.shape[1] + i * K2 + p0) * NR + c0) * 4, NR * 4)
            else:  # a block past C or K2: element by element, zeros past C
                for b in range(pb):
                    for a in range(TB):
                        c = cg + a
                        bp[q, i * K2 + p0 + b, c0 + a] = w32[t, c, p0 + b] if c < C else 0


def put_phase(c, dx, geo):
    """Stride phase ``q`` of backward data's result written into its pixels of ``dx``
    (``[mb, D, H, W, C]``, bfloat16 bits or float32): pixel ``(n, q + s*j)`` gets row ``j``
    (flat over the phase's grid) of ``c`` (``[m, C]``, ``dx``'s dtype), or zeros where
    ``c`` has no rows (a phase no tap reaches). ``geo``: int64 ``[sz, sy, sx, qz, qy,
    qx]``. In parallel over blocks of the phase's pixels: NumPy's strided assignment ran
    on one thread (and a phase's zeros were a separate strided pass)."""
    name = "bits" if dx.dtype == np.uint16 else "f32"
    g = [(dx.shape[1 + a] - geo[3 + a] + geo[a] - 1) // geo[a] for a in range(3)]
    m = dx.shape[0] * g[0] * g[1] * g[2]
    _put_phase_block.run(name, -(-m // PHASE_ROWS), c, dx, geo)


#: Pixels per block of :func:`put_phase`.
PHASE_ROWS = 128


@separate("void({T}[:, ::1], {T}[:, :, :, :, ::1], int64[::1], int64)", noalias=True,
          bits=dict(T="uint16"), f32=dict(T="float32"))
def _put_phase_block(c, dx, geo, blk):
    """Block ``blk`` of :func:`put_phase`."""
    mb, D, H, W, C = dx.shape
    sz, sy, sx, qz, qy, qx = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    gz = (D - qz + sz - 1) // sz
    gy = (H - qy + sy - 1) // sy
    gx = (W - qx + sx - 1) // sx
    m = mb * gz * gy * gx
    zero = c.shape[0] == 0
    for r in range(blk * PHASE_ROWS, min(m, (blk + 1) * PHASE_ROWS)):
        n, z, y, x = _grid_pixel(r, gz, gy, gx)
        dst = dx[n, qz + sz * z, qy + sy * y, qx + sx * x]
        if zero:
            for k in range(C):
                dst[k] = 0
        else:
            src = c[r]
            for k in range(C):
                dst[k] = src[k]


def im2col(src, rows, out, geo, sign):
    """Rows of A from ``src`` (``uint16`` ``[mb, d, h, w, C]``, C-contiguous): row ``m`` of
    ``out`` (``uint16`` ``[M, Kp]``, ``Kp`` the even number at or above ``taps*C``) is output
    pixel ``m`` of ``rows`` ``(mb, od, oh, ow)``, and holds for each tap ``t`` (row-major
    over the kernel) the ``C`` channels of the source pixel ``o*s + sign*t*d + off`` on each
    axis, or zeros outside the source. ``geo``: int64
    ``[sd sh sw dd dh dw offd offh offw kd kh kw]``."""
    _im2col_row.run("bf16", rows[0] * rows[1] * rows[2] * rows[3], src, rows, out, geo, sign)


@separate(bf16="void(uint16[:, :, :, :, ::1], int64[::1], uint16[:, ::1], int64[::1], int64, "
               "int64)", noalias=True)
def _im2col_row(src, rows, out, geo, sign, m):
    """Row ``m`` of :func:`im2col`'s ``out``."""
    od, oh, ow = rows[1], rows[2], rows[3]
    _, sdp, shp, swp, C = src.shape
    kp = out.shape[1]
    sd, sh, sw, dd, dh, dw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    fd, fh, fw, kd, kh, kw = geo[6], geo[7], geo[8], geo[9], geo[10], geo[11]
    n, z, y, x = _grid_pixel(m, od, oh, ow)
    row = out[m]
    col = 0
    # a kernel row whose taps are consecutive pixels all inside the source (forward, no
    # dilation along w) is one run of kw*C values: one copy instead of kw (a stem's
    # 7 taps x 3 channels)
    ix0 = x * sw + fw
    run = sign == 1 and dw == 1 and 0 <= ix0 and ix0 + kw <= swp
    for a in range(kd):
        iz = z * sd + sign * a * dd + fd
        for b in range(kh):
            iy = y * sh + sign * b * dh + fh
            inside = 0 <= iz < sdp and 0 <= iy < shp
            if run and inside:
                seg = src[n, iz, iy].reshape(-1)[ix0 * C:(ix0 + kw) * C]
                dst = row[col:col + kw * C]
                for e in range(kw * C):
                    dst[e] = seg[e]
                col += kw * C
                continue
            for c in range(kw):
                ix = x * sw + sign * c * dw + fw
                dst = row[col:col + C]
                if inside and 0 <= ix < swp:
                    px = src[n, iz, iy, ix]
                    for ch in range(C):
                        dst[ch] = px[ch]
                else:
                    for ch in range(C):
                        dst[ch] = 0
                col += C
    for ch in range(col, kp):
        row[ch] = 0


#: Pixels per block of :func:`im2col_t`.
PIXELS = 64
#: A register transpose's pixels (pairs of them make the 32-bit words of a row of ``out``)
#: and channels.
TP, TC = 32, 16


@intrinsic
def _transpose_pairs(typingctx, rowp, dst, ldd):
    """``TP`` pixels x ``TC`` channels of bfloat16 bits, transposed in registers: pixel
    ``j``'s ``TC`` channels start at the address ``rowp[j]`` (``rowp``: the address of an
    int64 array), and channel ``c``'s ``TP`` pixels go to ``dst + c*ldd`` bytes (one
    64-byte store). Pixels ``2p`` and ``2p+1`` are interleaved into 32-bit words, whose 16
    x 16 matrix LLVM transposes with vector shuffles: no element moves alone."""
    sig = types.void(types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        rowp, dst, ldd = args
        i16, i64 = ir.IntType(16), ir.IntType(64)
        v16 = ir.VectorType(i16, TC)
        prow = builder.inttoptr(rowp, i64.as_pointer())
        rows = []
        for j in range(TP):
            a = builder.load(builder.gep(prow, [ir.Constant(i64, j)]))
            rows.append(builder.load(builder.inttoptr(a, v16.as_pointer()), align=2))
        store_pair_columns(builder, rows, dst, ldd)
        return context.get_dummy_value()

    return sig, codegen


def im2col_t(src, rows, out, geo):
    """:func:`im2col` transposed (``sign`` 1): ``out`` ``uint16`` ``[taps*C, Me]`` (``Me``
    the even number at or above the ``M`` output pixels; the column past them zero) holds in
    row ``t*C + c`` channel ``c`` of the pixel tap ``t`` meets, for every output pixel: the
    left operand of a weight gradient, its reduction over pixels contiguous in pairs."""
    im2col_t_kernel(_im2col_t_block.table("bf16"), src, rows, out, geo)


@kernel(parallel=False)
def im2col_t_kernel(fns, src, rows, out, geo):
    """:func:`im2col_t` with its address table, in parallel over (tap, block of ``PIXELS``
    output pixels)."""
    M = rows[0] * rows[1] * rows[2] * rows[3]
    par_for(_im2col_t_block, fns, geo[9] * geo[10] * geo[11] * ((M + PIXELS - 1) // PIXELS),
            src, rows, out, geo)


@separate(bf16="void(uint16[:, :, :, :, ::1], int64[::1], uint16[:, ::1], int64[::1], int64)",
          noalias=True)
def _im2col_t_block(src, rows, out, geo, tb):
    """(Tap, block of pixels) ``tb`` of :func:`im2col_t`."""
    mb, od, oh, ow = rows[0], rows[1], rows[2], rows[3]
    _, sdp, shp, swp, C = src.shape
    me = out.shape[1]
    sd, sh, sw, dd, dh, dw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    fd, fh, fw, kh, kw = geo[6], geo[7], geo[8], geo[10], geo[11]
    M = mb * od * oh * ow
    nblk = (M + PIXELS - 1) // PIXELS
    flat = src.reshape(-1)
    t = tb // nblk
    m0 = (tb - t * nblk) * PIXELS
    m1 = min(M, m0 + PIXELS)
    a = t // (kh * kw)
    b = (t - a * kh * kw) // kw
    c = t - a * kh * kw - b * kw
    offs = np.empty(PIXELS, np.int64)
    rowp = np.empty(TP, np.int64)
    zeros = np.zeros(TC, np.uint16)
    for m in range(m0, m1):
        n, z, y, x = _grid_pixel(m, od, oh, ow)
        iz = z * sd + a * dd + fd
        iy = y * sh + b * dh + fh
        ix = x * sw + c * dw + fw
        if 0 <= iz < sdp and 0 <= iy < shp and 0 <= ix < swp:
            offs[m - m0] = (((n * sdp + iz) * shp + iy) * swp + ix) * C
        else:
            offs[m - m0] = -1
    # whole blocks of TP pixels x TC channels in registers, the rest element by element
    ps, po = flat.ctypes.data, out.ctypes.data
    ldd = out.shape[1] * 2
    j0 = 0
    cw = C - C % TC
    while j0 + TP <= m1 - m0:
        for c0 in range(0, cw, TC):
            for j in range(TP):
                o = offs[j0 + j]
                # (``zeros`` read here, not only its address: Numba frees an array
                # after its last use)
                rowp[j] = ps + (o + c0) * 2 if o >= 0 else zeros.ctypes.data
            _transpose_pairs(rowp.ctypes.data, po + ((t * C + c0) * me + m0 + j0) * 2, ldd)
        j0 += TP
    for ch in range(C):
        row = t * C + ch
        for j in range(0 if ch >= cw else j0, m1 - m0):
            o = offs[j]
            out[row, m0 + j] = flat[o + ch] if o >= 0 else 0
        if m1 == M and me > M:
            out[row, M] = 0


#: Whether a copy of :func:`_block_body` takes x and B as they are (``_block_fused``) or
#: not (``_block``: its code for them pruned away, a third of its compile time).
_FUSED = False
#: Whether a copy runs AMX's micro-kernel (``_block_amx*`` bind ``_AMX``, ``MR``,
#: ``_micro`` and the tile set-up ``_tiles_on`` / ``_tiles_off`` in their copies).
_AMX = False
_tiles_on = _tiles_off = None


def _block_body(a, xt, bp, braw, c, d, kc2, nrb, ks, npb, blk):
    """Block ``blk`` of :func:`gemm`: row block ``blk % nrb`` of ``nrb``, over part ``blk //
    nrb % ks`` of ``ks`` of the reduction, for block ``blk // (nrb * ks)`` of ``npb`` of
    the panels of columns."""
    at = xt.shape[0] > 0  # A = xt transposed: each block of the reduction transposed here
    M = xt.shape[1] if at else a.shape[0]
    K2 = (xt.shape[0] + 1) // 2 if at else a.shape[1]
    pairs = braw.shape[0] > 0  # B as it is: each panel of a block of the reduction paired here
    bl = np.empty((kc2 if pairs else 0, NR), np.uint32)
    pz = blk // (nrb * ks)
    kz = (blk - pz * nrb * ks) // nrb
    rb = blk - (pz * ks + kz) * nrb
    tiles = (M + MR - 1) // MR
    r0 = MR * (rb * tiles // nrb)
    r1 = min(M, MR * ((rb + 1) * tiles // nrb))
    chunk = -(-K2 // (ks * kc2)) * kc2  # whole blocks of the reduction per part
    ka, kb = min(K2, kz * chunk), min(K2, (kz + 1) * chunk)
    rnd = d.shape[0] > 0
    N = d.shape[1] if rnd else c.shape[1]
    npan = (N + NR - 1) // NR
    qa, qb = pz * npan // npb, (pz + 1) * npan // npb  # this block's panels
    wa = np.zeros((MR, kc2), np.uint32)
    wc = np.zeros((MR, NR), np.float32)
    if rnd:  # the partial sums of a longer reduction in this block's rows of C of its own
        c = np.empty((r1 - r0 if kb - ka > kc2 else 0, N), np.float32)
        c0 = r0
    else:  # part kz's sums in rows kz*M.. of C
        c0 = -kz * M
        if ka == kb:  # nothing of the reduction left for this part
            for i in range(r0, r1):
                for j in range(qa * NR, min(N, qb * NR)):
                    c[i - c0, j] = 0
    # addresses as int64 alike: one inlining of the micro-kernel's typing, not two
    pa0, pb0, pc0 = np.int64(a.ctypes.data), np.int64(bp.ctypes.data), np.int64(c.ctypes.data)
    pd0 = np.int64(d.ctypes.data)
    pwa, pwc = np.int64(wa.ctypes.data), np.int64(wc.ctypes.data)
    pbl = np.int64(bl.ctypes.data)
    wu = wc.view(np.uint32)
    if _AMX:
        _tiles_on()
    # A's block of the reduction, transposed from xt (rows r0..r1), and the pixel rows of
    # one register transpose
    al = np.empty((r1 - r0 if at else 0, kc2), np.uint32)
    pal = np.int64(al.ctypes.data)
    rowp = np.empty(TP, np.int64)
    if at:
        src, sa, sr, scol = al, pal, kc2, 0
    else:
        src, sa, sr, scol = a, pa0, K2, 0
    for k0 in range(ka, kb, kc2):
        kk = min(kc2, kb - k0)
        beta = (0 if k0 == ka else 1) | (2 if rnd and k0 + kc2 >= kb else 0)
        if _FUSED and at:
            _transpose_block(xt, al, rowp, r0, r1, k0, kk)
            roff = r0
        else:
            scol = k0
            roff = 0
        for q in range(qa, qb):
            j = q * NR
            w = min(NR, N - j)
            if _FUSED and pairs:
                _pair_rows(braw, bl, k0, k0 + kk, j, 0)
                pb = pbl
            else:
                pb = pb0 + (q * K2 * NR + k0 * NR) * 4
            for i0 in range(r0, r1, MR):
                im = min(MR, r1 - i0)
                if im == MR:
                    pa, lda = sa + ((i0 - roff) * sr + scol) * 4, sr
                else:  # a zero-padded copy of the last rows
                    for i in range(MR):
                        for k in range(kk):
                            wa[i, k] = src[i0 - roff + i, scol + k] if i < im else 0
                    pa, lda = pwa, wa.shape[1]
                whole = im == MR and w == NR
                if whole:
                    pc, ldc, bt = pc0 + ((i0 - c0) * N + j) * 4, N, beta
                    pd, ldd = pd0 + (i0 * N + j) * 2, N
                else:  # through the scratch tile: only im x w of C (or D) is touched
                    if beta & 1:
                        for i in range(im):
                            for jj in range(w):
                                wc[i, jj] = c[i0 - c0 + i, j + jj]
                    pc, ldc, bt, pd, ldd = pwc, NR, beta & 1, pwc, NR
                # (one call site: the micro-kernel's code is emitted once)
                _micro(pa, lda, pb, pc, ldc, kk, bt, pd, ldd)
                if not whole:
                    if beta & 2:
                        for i in range(im):
                            for jj in range(w):
                                d[i0 + i, j + jj] = _round_bits(wu[i, jj])
                    else:
                        for i in range(im):
                            for jj in range(w):
                                c[i0 - c0 + i, j + jj] = wc[i, jj]
    if _AMX:
        _tiles_off()


@helper(inline=True)
def _transpose_block(xt, al, rowp, r0, r1, k0, kk):
    """``al[c - r0, p] = xt[2(k0+p), c] | xt[2(k0+p)+1, c] << 16`` for ``r0 <= c < r1``,
    ``p < kk`` (zero past xt's pixels): ``TC`` channels x ``TP`` pixels at a time by the
    register transpose (:func:`_transpose_pairs`), the rest value by value."""
    P, C = xt.shape
    px = np.int64(xt.ctypes.data)
    pal = np.int64(al.ctypes.data)
    ldd = al.shape[1] * 4
    whole = min(kk, (P - 2 * k0) // TP * (TP // 2))  # pairs in whole transposes
    whole -= whole % (TP // 2)
    cw = r0 + (r1 - r0) // TC * TC
    prow = np.int64(rowp.ctypes.data)
    for g in range(0, whole, TP // 2):
        for c0 in range(r0, cw, TC):
            for j in range(TP):
                rowp[j] = px + ((2 * (k0 + g) + j) * C + c0) * 2
            _transpose_pairs(prow, pal + ((c0 - r0) * al.shape[1] + g) * 4, ldd)
    for c in range(r0, r1):
        row = al[c - r0]
        first = whole if c < cw else 0
        for p in range(first, kk):
            q = 2 * (k0 + p)
            lo = np.uint32(xt[q, c]) if q < P else np.uint32(0)
            hi = np.uint32(xt[q + 1, c]) if q + 1 < P else np.uint32(0)
            row[p] = lo | (hi << np.uint32(16))


@intrinsic
def _round_bits(typingctx, u):
    """The bfloat16 bits of the float32 bits ``u`` (one value; :func:`_ir.bf16_round`)."""
    def codegen(context, builder, signature, args):
        return bf16_round(builder, args[0])

    return types.uint16(types.uint32), codegen


_BLOCK_SIG = ("void(uint32[:, ::1], uint16[:, ::1], uint32[:, :, ::1], uint16[:, ::1], "
              "float32[:, ::1], uint16[:, ::1], int64, int64, int64, int64, int64)")
_block = separate(bf16=_BLOCK_SIG)(specialise(_block_body, "plain", _FUSED=False))
_block_fused = separate(bf16=_BLOCK_SIG)(specialise(_block_body, "fused", _FUSED=True))
_NO_BITS = np.zeros((0, 0), np.uint16)


def gemm(a, bp, c, kc2, nrb, d=None, ks=1, b=None, xt=None, npb=1):
    """``C = A @ B``: ``a`` ``uint32`` ``[M, K2]`` (pairs of bfloat16 along each row), ``bp``
    :func:`pack_pairs`' panels of B ``[ceil(N/NR), K2, NR]``, ``c`` float32 ``[M, N]``
    C-contiguous. The rows, in whole register tiles, are cut into ``nrb`` blocks as even as
    the tiles allow, shared among the threads; the reduction runs in blocks of ``kc2``
    pairs. With ``d`` (``uint16 [M, N]``, C-contiguous) the product is rounded to bfloat16
    bits there instead, as each tile's reduction ends (``c`` is then not touched: pass any
    float32 ``[0, N]`` array). ``ks`` > 1 (without ``d``): the reduction in ``ks`` parts of
    whole blocks, each a block of the threads' work, part ``z``'s sums in rows ``z*M ..``
    of ``c`` ``[ks*M, N]`` (the caller adds them): for few rows over a long reduction (a
    weight gradient over few channels), where blocks of rows alone would leave threads
    idle or read B once per block. With ``b`` (B itself, ``uint16 [K, N]``, C-contiguous;
    ``bp`` then unused) each block pairs the panels of its blocks of the reduction as it
    meets them, into a panel of its own that stays in L1: for a B that only one block of
    rows reads (``nrb`` 1), where packing it whole first would write and read it again.
    With ``xt`` (``uint16 [P, M]``, C-contiguous; ``a`` then unused) A is ``xt``
    transposed, pixel pairs along its rows (a 1x1 weight gradient's ``x``), each block of
    the reduction transposed in registers as the GEMM reaches it. ``npb`` > 1: the panels
    of columns in that many groups, each group's blocks after the previous group's (the
    parallel loop's runs of blocks then share one group's panels of B, where every row
    block would otherwise read all of B: few rows against many columns)."""
    run_blocks(_block, _block_fused, a, bp, c, kc2, nrb, d, ks, b, xt, npb)


def run_blocks(block, block_fused, a, bp, c, kc2, nrb, d, ks, b, xt, npb):
    """:func:`gemm` with its two copies of :func:`_block_body` (the AMX entry passes
    its own)."""
    if d is not None and ks > 1:
        raise ValueError("bf16dot.gemm: a reduction in parts (ks > 1) returns float32 sums; "
                         "round them after adding (d must be None)")
    (block if b is None and xt is None else block_fused).run(
        "bf16", ks * nrb * npb, a, _NO_BITS if xt is None else xt, bp,
        _NO_BITS if b is None else b, c, _NO_BITS if d is None else d, kc2, nrb, ks, npb)


# -- weight gradients with x paired as the GEMM goes (gemm[bf16-wgrad]) ------------------------

@intrinsic
def _pair_pixels(typingctx, s0, s1, dst):
    """``dst[j] = s0[j] | s1[j] << 16`` for the 64 bfloat16 channels at the addresses
    ``s0`` and ``s1`` (two pixels of x): one row of 64 words of a packed panel of B."""
    sig = types.void(types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        s0, s1, dst = args
        i16, i32 = ir.IntType(16), ir.IntType(32)
        vh = ir.VectorType(i16, NR)
        v0 = builder.load(builder.inttoptr(s0, vh.as_pointer()), align=2)
        v1 = builder.load(builder.inttoptr(s1, vh.as_pointer()), align=2)
        mix = ir.Constant(ir.VectorType(i32, 2 * NR),
                          [v for j in range(NR) for v in (j, NR + j)])
        words = builder.bitcast(builder.shuffle_vector(v0, v1, mix), ir.VectorType(i32, NR))
        builder.store(words, builder.inttoptr(dst, ir.VectorType(i32, NR).as_pointer()),
                      align=4)
        return context.get_dummy_value()

    return sig, codegen


def wgrad(at, x, geo, c, dw, kc2, parts):
    """A weight gradient's ``C [K, taps*Cin] (float32) = dY^T @ im2col(x)`` with ``at``
    dY transposed into pairs of pixels (``uint32 [K, K2]``, :func:`im2col_t` of dY) and
    im2col(x)'s pairs of pixels built block by block of the reduction into a panel of 64
    words per pair that stays in L1 (:func:`_pair_pixels`), never as a whole matrix.
    ``x`` ``uint16 [mb, D, H, W, Cin]``; ``geo`` int64: the output's ``od, oh, ow``, then
    strides, dilations, the negated leading pads and the kernel, as :func:`im2col_t`
    takes them. In parallel over (tap, panel of 64 input channels, part of ``parts`` of
    dY's rows): each sums its own block of ``c`` (float32 scratch, in L2 across the blocks
    of the reduction), so no partial sums, then writes it rounded and transposed into ``dw``
    (``uint16 [taps*Cin, K]``, the weight gradient's bits) by 16 x 16 register
    transposes."""
    npan = (x.shape[4] + NR - 1) // NR
    taps = geo[12] * geo[13] * geo[14]
    _wgrad_task.run("bf16", taps * npan * parts, at, x, geo, c, dw, kc2, parts)


@separate(bf16="void(uint32[:, ::1], uint16[:, :, :, :, ::1], int64[::1], float32[:, ::1], "
               "uint16[:, ::1], int64, int64, int64)")
def _wgrad_task(at, x, geo, c, dw, kc2, parts, task):
    """Task ``task`` of :func:`wgrad`."""
    K, K2 = at.shape
    mb, D, H, W, Cin = x.shape
    od, oh, ow = geo[0], geo[1], geo[2]
    sd, sh, sw, ld, lh, lw = geo[3], geo[4], geo[5], geo[6], geo[7], geo[8]
    fd, fh, fw, kh, kw = geo[9], geo[10], geo[11], geo[13], geo[14]
    npan = (Cin + NR - 1) // NR
    part = task % parts
    q = (task // parts) % npan
    t = task // (parts * npan)
    a = t // (kh * kw)
    b = (t - a * kh * kw) // kw
    e = t - a * kh * kw - b * kw
    c0 = q * NR
    w = min(NR, Cin - c0)
    tiles = (K + MR - 1) // MR
    r0 = MR * (part * tiles // parts)
    r1 = min(K, MR * ((part + 1) * tiles // parts))
    M = mb * od * oh * ow
    ldc = c.shape[1]
    col = t * Cin + c0
    bl = np.empty((kc2, NR), np.uint32)
    wa = np.zeros((MR, kc2), np.uint32)
    wc = np.zeros((MR, NR), np.float32)
    zeros = np.zeros(NR, np.uint16)
    flat = x.reshape(-1)
    px, pz = np.int64(flat.ctypes.data), np.int64(zeros.ctypes.data)
    pbl, pat, pcc = np.int64(bl.ctypes.data), np.int64(at.ctypes.data), np.int64(c.ctypes.data)
    pwa, pwc = np.int64(wa.ctypes.data), np.int64(wc.ctypes.data)
    src = np.empty(2, np.int64)
    for k0 in range(0, K2, kc2):
        kk = min(kc2, K2 - k0)
        # this block's pairs of pixels of x at tap t, channels c0.., as words
        n, z, y, u = _grid_pixel(2 * k0, od, oh, ow)
        for p in range(kk):
            for h in range(2):
                src[h] = -1
                if 2 * (k0 + p) + h < M:
                    iz = z * sd + a * ld + fd
                    iy = y * sh + b * lh + fh
                    ix = u * sw + e * lw + fw
                    if 0 <= iz < D and 0 <= iy < H and 0 <= ix < W:
                        src[h] = (((n * D + iz) * H + iy) * W + ix) * Cin + c0
                    u += 1  # the next output pixel
                    if u == ow:
                        u = 0
                        y += 1
                        if y == oh:
                            y = 0
                            z += 1
                            if z == od:
                                z = 0
                                n += 1
            if w == NR:
                _pair_pixels(px + src[0] * 2 if src[0] >= 0 else pz,
                             px + src[1] * 2 if src[1] >= 0 else pz, pbl + p * NR * 4)
            else:  # a last panel of fewer channels: word by word, zeros past them
                for j in range(NR):
                    lo = np.uint32(flat[src[0] + j]) if src[0] >= 0 and j < w else np.uint32(0)
                    hi = np.uint32(flat[src[1] + j]) if src[1] >= 0 and j < w else np.uint32(0)
                    bl[p, j] = lo | (hi << np.uint32(16))
        beta = 0 if k0 == 0 else 1
        for i0 in range(r0, r1, MR):
            im = min(MR, r1 - i0)
            if im == MR:
                pa, lda = pat + (i0 * K2 + k0) * 4, K2
            else:  # a zero-padded copy of the last rows
                for i in range(MR):
                    for k in range(kk):
                        wa[i, k] = at[i0 + i, k0 + k] if i < im else 0
                pa, lda = pwa, kc2
            if im == MR and w == NR:
                _micro(pa, lda, pbl, pcc + (i0 * ldc + col) * 4, ldc, kk, beta, pcc, 0)
            else:  # through the scratch tile: only im x w of C is touched
                if beta:
                    for i in range(im):
                        for j in range(w):
                            wc[i, j] = c[i0 + i, col + j]
                _micro(pa, lda, pbl, pwc, NR, kk, beta, pwc, 0)
                for i in range(im):
                    for j in range(w):
                        c[i0 + i, col + j] = wc[i, j]
    # the block rounded into dW, transposed: whole TB x TB blocks in registers
    cu = c.view(np.uint32)
    tmp = np.empty((TB, TB), np.uint32)
    ptmp = np.int64(tmp.ctypes.data)
    for i0 in range(r0, r1, TB):
        for j0 in range(0, w, TB):
            if i0 + TB <= r1 and j0 + TB <= w:
                _transpose_words(pcc + (i0 * ldc + col + j0) * 4, ldc * 4, ptmp, TB * 4)
                for jj in range(TB):
                    for ii in range(TB):
                        dw[col + j0 + jj, i0 + ii] = _round_bits(tmp[jj, ii])
            else:
                for jj in range(min(TB, w - j0)):
                    for ii in range(min(TB, r1 - i0)):
                        dw[col + j0 + jj, i0 + ii] = _round_bits(cu[i0 + ii, col + j0 + jj])


# -- the same blocked GEMM on AMX tiles (gemm[bf16-amx]) -----------------------------------------

#: Rows of the AMX micro-kernel's tile (:mod:`_amx`).
AMX_MR = _amx.MR


@intrinsic
def _amx_config(typingctx):
    """``ldtilecfg`` (:func:`_amx.config_tiles`)."""
    return _amx.void_call(_amx.config_tiles, 0)


@intrinsic
def _amx_release(typingctx):
    """``tilerelease`` (:func:`_amx.release_tiles`)."""
    return _amx.void_call(_amx.release_tiles, 0)


@intrinsic
def _micro_amx(typingctx, a, lda, b, c, ldc, k2, beta, d, ldd):
    """:func:`_micro` on AMX tiles, ``AMX_MR`` x ``NR`` (:func:`_amx.gemm_tile`)."""
    return _amx.void_call(_amx.gemm_tile, 9)


_block_amx = separate(bf16=_BLOCK_SIG)(specialise(
    _block_body, "amx", _FUSED=False, MR=AMX_MR, _micro=_micro_amx, _AMX=True,
    _tiles_on=_amx_config, _tiles_off=_amx_release))
_block_amx_fused = separate(bf16=_BLOCK_SIG)(specialise(
    _block_body, "amx_fused", _FUSED=True, MR=AMX_MR, _micro=_micro_amx, _AMX=True,
    _tiles_on=_amx_config, _tiles_off=_amx_release))


def amx_gemm(a, bp, c, kc2, nrb, d=None, ks=1, b=None, xt=None, npb=1):
    """:func:`gemm` on AMX tiles (same arguments, row blocks in tiles of ``AMX_MR`` rows).
    AMX's state is asked for first where this process has not yet (:func:`_amx.ensure_amx`)."""
    _amx.ensure_amx()
    run_blocks(_block_amx, _block_amx_fused, a, bp, c, kc2, nrb, d, ks, b, xt, npb)


#: :func:`amx_gemm` with its tile's rows, as the strategies take a GEMM kernel (``gemm``,
#: ``MR``, ``NR``, ``pack_pairs``; this module itself is the AVX512_BF16 one).
AMX = SimpleNamespace(gemm=amx_gemm, MR=AMX_MR, NR=NR, pack_pairs=pack_pairs)


#: Pairs of the reduction per micro-kernel call of :func:`amx_peak` (A's 32 rows and B's panel,
#: 16 KiB and 32 KiB, stay in L1).
AMX_PEAK_PAIRS = 128


@separate(bf16="void(uint32[:, :, ::1], uint32[:, :, ::1], float32[:, :, ::1], int64, int64)")
def _amx_peak_task(a, b, c, reps, t):
    """``reps`` micro-kernel calls on thread-task ``t``'s own L1-resident operands."""
    _amx_config()
    pa, pb, pc = a[t].ctypes.data, b[t].ctypes.data, c[t].ctypes.data
    for _ in range(reps):
        _micro_amx(pa, AMX_PEAK_PAIRS, pb, pc, NR, AMX_PEAK_PAIRS, 1, pc, 0)
    _amx_release()


def amx_peak(threads, seconds=0.2):
    """The micro-kernel's rate in GFLOP/s on ``threads`` tasks at once, its operands in L1
    (the bench's compute roof for bfloat16 on an AMX host): the best of three timings."""
    import time
    a = np.zeros((threads, AMX_MR, AMX_PEAK_PAIRS), np.uint32)
    b = np.zeros((threads, AMX_PEAK_PAIRS, NR), np.uint32)
    c = np.zeros((threads, AMX_MR, NR), np.float32)
    flop = 2.0 * AMX_MR * NR * 2 * AMX_PEAK_PAIRS
    _amx.ensure_amx()
    _amx_peak_task.run("bf16", threads, a, b, c, 1)
    reps, best = 64, float("inf")
    while True:
        t0 = time.perf_counter()
        _amx_peak_task.run("bf16", threads, a, b, c, reps)
        dt = time.perf_counter() - t0
        if dt > seconds / 4 or reps > 1 << 24:
            break
        reps *= 4
    for _ in range(3):
        t0 = time.perf_counter()
        _amx_peak_task.run("bf16", threads, a, b, c, reps)
        best = min(best, time.perf_counter() - t0)
    return threads * reps * flop / best / 1e9
