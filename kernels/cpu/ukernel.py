"""A register-blocked GEMM in Numba: ``C = A @ B`` (or ``C += A @ B``) with an explicit-SIMD
micro-kernel, for the GEMM strategy's tall, thin products where NumPy's BLAS runs far from
the machine's peak.

The micro-kernel is written in LLVM IR through ``numba.extending.intrinsic``: an
``MR x (NV*VL)`` tile of ``C`` lives in ``MR*NV`` vector registers for the whole reduction
(``VL`` lanes each: 16 float32 with AVX-512), and every step of the reduction loads ``NV``
vectors of a row of ``B``, broadcasts ``MR`` scalars of a column of ``A`` and issues
``MR*NV`` fused multiply-adds (BLIS's and oneDNN's brgemm's scheme). Numba's own loop
vectoriser cannot do this: it keeps the accumulators in memory, not in registers.

Operands are raw addresses with element strides, so one compiled driver serves every view
(transposed, group slices, column blocks) with no copies:

* ``A[i, k]`` at ``a + i*rsa + k*csa`` (any positive strides: row-major slabs or transposes);
* ``B[k, j]`` at ``b + k*rsb + j*csb`` (any non-negative strides: the driver packs each
  ``kc x nc`` block of B into contiguous panels before the micro-kernel reads it);
* ``C[i, j]`` at ``c + i*ldc + j`` (unit column stride), or at ``c + rowmap[i] + j`` with a
  row map: the backward-data stride phases write their rows straight into every s-th pixel
  of ``dX`` this way, with no temporary and no scatter.

The driver blocks the reduction by ``kc`` (an ``MR x kc`` tile of ``A`` stays in L1 while it
meets every panel of the block) and the columns by ``nc`` (a ``kc x nc`` block of ``B`` stays
in L2, packed into contiguous ``kc x NR`` panels, while every row tile meets it). Edges are
exact: a last row tile of fewer than ``MR`` rows is copied into a padded scratch tile, the
last panel of B is zero-padded, and columns beyond the last whole vector go through a
scratch tile of ``C``; nothing outside the operands is read or written.

The vector width comes from the host (:mod:`._host`: AVX-512 64 bytes, AVX/AVX2 32, else
16). Numba keys its disk cache on the host CPU, so code cached on one machine is never
loaded on another.
"""
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from numbaconv._jit import dtype_name, helper, kernel, separate
from numbaconv.kernels.cpu._host import STREAMS, VECTOR_BYTES
from numbaconv.kernels.cpu._ir import beta_store
#: Rows of a register tile, and the most vectors across it: MR*NV accumulators plus NV
#: loaded vectors and one broadcast must fit the register file (32 with AVX-512, 16 else).
MR = 6
NV = 4 if VECTOR_BYTES == 64 else 2


def lanes(itemsize):
    """Vector lanes for an element size (16 float32 or 8 float64 with AVX-512)."""
    return VECTOR_BYTES // itemsize


def panel(itemsize):
    """Columns of a full register tile."""
    return NV * lanes(itemsize)


def _micro(nv, mr=MR, row_table=False, half=False):
    """The micro-kernel with ``nv`` vectors across: ``C[:mr, :nv*VL] (+)= A[:mr, :kc] @
    B[:kc, :nv*VL]``: ``beta`` 0 stores the tile, 1 adds it to C, 2 streams it
    (non-temporal stores: every row of the tile must start on a vector boundary). Row ``i``
    of the C tile starts at element ``crows[i]`` after ``c`` (``crows``: the address of mr
    int64). With ``row_table``, row ``i`` of A starts at element ``rsa[i]`` after ``a``
    (``rsa``: the address of mr int64) instead of ``i * rsa``: any rows of an input, as the
    taps of a convolution (:func:`_patch_bwd_w`). The float type comes from the ``work``
    array's dtype.

    ``half`` adds a vector half as wide after the ``nv`` whole ones: ``VL/2`` more columns,
    loaded, multiplied and stored at that width (a 256-bit FMA where a 512-bit one would
    leave half its lanes idle: half the work on a core that splits 512-bit FMAs in two,
    as AMD's Zen 4 does). ``beta + 4`` then stores only the first half of that vector: a
    quarter-vector tail (narrower still would save no more: the halves are the narrowest
    unit of work there)."""

    @intrinsic
    def micro(typingctx, a, rsa, csa, b, ldb, c, crows, kc, beta, work):
        sig = types.void(types.intp, types.intp, types.intp, types.intp, types.intp,
                         types.intp, types.intp, types.intp, types.intp, work)
        dtype = work.dtype

        def codegen(context, builder, signature, args):
            a, rsa, csa, b, ldb, c, crows, kc, beta, _ = args
            f = context.get_value_type(dtype)
            vl = VECTOR_BYTES // context.get_abi_sizeof(f)
            vty = ir.VectorType(f, vl)
            fp = f.as_pointer()
            # the vectors across the tile: (first column, lanes)
            cols = [(v * vl, vl) for v in range(nv)] + ([(nv * vl, vl // 2)] if half else [])
            i64 = ir.IntType(64)
            suffix = "f32" if dtype == types.float32 else "f64"

            def fma_of(n):
                ty = ir.VectorType(f, n)
                return cgutils.get_or_insert_function(builder.module,
                                                      ir.FunctionType(ty, [ty] * 3),
                                                      "llvm.fma.v%d%s" % (n, suffix))
            fmas = [fma_of(n) for _, n in cols]
            pa = builder.inttoptr(a, fp)
            pb = builder.inttoptr(b, fp)
            pc = builder.inttoptr(c, fp)
            undef = ir.Constant(vty, ir.Undefined)
            # accumulators as allocas: mem2reg turns them into registers
            acc = [[cgutils.alloca_once_value(builder, ir.Constant(ir.VectorType(f, n), None))
                    for _, n in cols] for _ in range(mr)]
            if row_table:
                ptab = builder.inttoptr(rsa, i64.as_pointer())
                arow = [builder.load(builder.gep(ptab, [ir.Constant(i64, i)]))
                        for i in range(mr)]
            else:
                arow = [builder.mul(rsa, ir.Constant(i64, i)) for i in range(mr)]
            with cgutils.for_range(builder, kc) as loop:
                k = loop.index
                bk = builder.mul(k, ldb)
                ak = builder.mul(k, csa)
                bv = [builder.load(builder.bitcast(
                    builder.gep(pb, [builder.add(bk, ir.Constant(i64, j))]),
                    ir.VectorType(f, n).as_pointer()), align=1) for j, n in cols]
                for i in range(mr):
                    s = builder.load(builder.gep(pa, [builder.add(arow[i], ak)]))
                    s = builder.insert_element(undef, s, ir.Constant(ir.IntType(32), 0))
                    for v, (_, n) in enumerate(cols):
                        sv = builder.shuffle_vector(
                            s, undef, ir.Constant(ir.VectorType(ir.IntType(32), n), None))
                        builder.store(builder.call(fmas[v], [sv, bv[v],
                                                             builder.load(acc[i][v])]),
                                      acc[i][v])
            if half:  # beta + 4: the half vector's first half only
                quarter = builder.icmp_signed("!=", builder.and_(beta, ir.Constant(i64, 4)),
                                              ir.Constant(i64, 0))
                beta = builder.and_(beta, ir.Constant(i64, 3))
                low = ir.Constant(ir.VectorType(ir.IntType(32), max(1, vl // 4)),
                                  list(range(max(1, vl // 4))))
            store, _ = beta_store(builder, beta)
            for i in range(mr):
                # row i of the tile starts crows[i] elements after c
                crow = builder.load(builder.gep(builder.inttoptr(crows, i64.as_pointer()),
                                                [ir.Constant(i64, i)]))
                for v, (j, n) in enumerate(cols):
                    p = builder.gep(pc, [builder.add(crow, ir.Constant(i64, j))])
                    val = builder.load(acc[i][v])
                    if n == vl or vl < 4:  # (no quarter of a 2-lane vector)
                        store(val, builder.bitcast(p, ir.VectorType(f, n).as_pointer()))
                        continue
                    with builder.if_else(quarter) as (narrow, whole):
                        with narrow:
                            store(builder.shuffle_vector(val, val, low), builder.bitcast(
                                p, ir.VectorType(f, vl // 4).as_pointer()))
                        with whole:
                            store(val, builder.bitcast(p, ir.VectorType(f, n).as_pointer()))
            return context.get_dummy_value()

        return sig, codegen

    return micro


_micro1, _micro2, _micro3, _micro4 = (_micro(n) for n in (1, 2, 3, 4))
#: 0-3 whole vectors and half of one more (see :func:`_micro`)
_micro_h0, _micro_h1, _micro_h2, _micro_h3 = (_micro(n, half=True) for n in range(4))


#: Added to :func:`_gemm`'s ``beta``: C's rows hold whole vectors past its ``N`` columns
#: (``ldc`` at least ``N`` rounded up to vectors, the columns past ``N`` scratch), so a
#: last panel of partial vectors stores its tiles whole instead of through the scratch
#: tile (its B panel is packed zero-padded either way).
ROOM = 4

#: An empty row map: C's rows ``ldc`` apart.
_NO_MAP = np.empty(0, np.int64)

#: Rows of B further apart than this are packed (see :func:`gemm`).
PACK_ROW_BYTES = 4096


@intrinsic
def _copy_bytes(typingctx, dst, src, nbytes):
    """``nbytes`` from the address ``src`` to ``dst`` (``llvm.memcpy``; the ranges do not
    overlap; nothing where ``nbytes <= 0``), or zeros where ``src`` is 0 (``llvm.memset``)."""
    sig = types.void(types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        d, s, nb = args
        i64 = ir.IntType(64)
        with builder.if_then(builder.icmp_signed(">", nb, ir.Constant(i64, 0))):
            dp = builder.inttoptr(d, ir.IntType(8).as_pointer())
            with builder.if_else(builder.icmp_signed("==", s, ir.Constant(i64, 0))) as (
                    zero, copy):
                with zero:
                    cgutils.memset(builder, dp, nb, 0)
                with copy:
                    cgutils.raw_memcpy(builder, dp, builder.inttoptr(
                        s, ir.IntType(8).as_pointer()), nb, 1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _prefetch(typingctx, addr, nbytes):
    """Prefetch ``nbytes`` from the address ``addr`` into L2 (``prefetcht1``, line by line;
    nothing where ``nbytes <= 0``)."""
    sig = types.void(types.intp, types.intp)

    def codegen(context, builder, signature, args):
        a, nb = args
        i8p, i32, i64 = ir.IntType(8).as_pointer(), ir.IntType(32), ir.IntType(64)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0")
        nl = builder.sdiv(builder.add(nb, ir.Constant(i64, 63)), ir.Constant(i64, 64))
        with cgutils.for_range(builder, nl) as lp:
            ptr = builder.inttoptr(builder.add(a, builder.mul(lp.index, ir.Constant(i64, 64))),
                                   i8p)
            builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 2),
                              ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


def workspace(kc, itemsize, nc=None):
    """Elements of scratch :func:`gemm` needs for a reduction block of ``kc`` and a column
    block of ``nc`` (default: the column block :func:`matmul` picks for ``kc``)."""
    nr = panel(itemsize)
    if nc is None:
        nc = default_nc(kc, itemsize)
    ncp = -(-nc // nr) * nr
    return MR * kc + kc * ncp + MR * nr


def default_nc(kc, itemsize):
    """A column block whose packed ``kc x nc`` panels fill about 512 KiB."""
    return max(panel(itemsize), (512 * 1024 // (kc * itemsize)) // panel(itemsize)
               * panel(itemsize))


_GEMM_SIG = ("void(int64, int64, int64, int64, int64, int64, int64, int64, int64[::1], int64, "
             "int64, int64, int64, int64, int64, {T}[::1], boolean)")


def gemm(a, rsa, csa, b, rsb, csb, c, ldc, rowmap, M, N, K, beta, kc, nc, work, pf=False):
    """See :func:`_gemm`: the serial GEMM called from Python (its separately compiled
    variant for ``work``'s dtype, the one the parallel kernels call)."""
    _gemm.dispatcher(a, rsa, csa, b, rsb, csb, c, ldc, rowmap, M, N, K, beta, kc, nc, work,
                     bool(pf))


@separate(_GEMM_SIG, float32="float32", float64="float64")
def _gemm(a, rsa, csa, b, rsb, csb, c, ldc, rowmap, M, N, K, beta, kc, nc, work, pf):
    """``C[:M, :N] = A @ B`` (``beta`` 0) or ``C += A @ B`` (``beta`` 1) on raw addresses
    (see the module docstring); ``B[k, j]`` at ``b + k*rsb + j*csb`` (any non-negative
    strides: a transposed weight matrix needs no copy); ``rowmap`` (int64, empty: ``i*ldc``)
    holds the element offset of each row of C. ``work`` is scratch of :func:`workspace`
    elements and sets the dtype. ``nc`` is a multiple of the panel width.

    A transposed B, or one whose rows lie more than ``PACK_ROW_BYTES`` apart, has every
    ``kc x nc`` block packed once into contiguous ``kc x NR`` panels (as BLIS does), so the
    micro-kernel streams 256-byte rows whatever B's strides; a narrow row-major B is read
    in place (packing it cost a quarter of a 64x64 weight gradient), all but a last panel of
    partial vectors, which is packed zero-padded.

    ``pf``: where the rows of A's next reduction block (``A`` a transpose whose columns are
    whole rows, ``rsa`` 1 and ``csa`` ``M``) and of B's (``csb`` 1, ``rsb`` ``N``) are
    contiguous, prefetch them into L2 while the present block computes, a share per row
    tile. A weight gradient's ``X^T`` steps a row of X (``M`` elements) per step of the
    reduction, and the hardware prefetchers stop at every 4 KiB page: 256x64 over 25088
    pixels (32 MB) ran at 156 GFLOP/s against 190 for 6272 pixels (8 MB, in L3)."""
    it = work.itemsize
    vl = VECTOR_BYTES // it
    nr = NV * vl
    ncp = (nc + nr - 1) // nr * nr
    offs = np.empty(2 * MR, np.int64)
    wa = work[: MR * kc]                       # padded row tile of A: [MR, kc]
    wb = work[MR * kc: MR * kc + kc * ncp]     # packed panels of B: [ncp/nr, kc, nr]
    wc = work[MR * kc + kc * ncp:]             # scratch tile of C: [MR, nr]
    # addresses as int64, as the operands' are: one typing of _call, not two
    pwa, pwb, pwc = np.int64(wa.ctypes.data), np.int64(wb.ctypes.data), np.int64(wc.ctypes.data)
    tile_rows = offs[:MR]                      # C offsets of the current row tile
    for i in range(MR):
        offs[MR + i] = i * nr                  # rows of the scratch tile
    p_rows = np.int64(offs.ctypes.data)
    p_wrows = p_rows + MR * 8
    mapped = rowmap.shape[0] > 0
    # pack B unless its rows are contiguous and close: a transposed B, or rows a multiple
    # of 4 KiB apart that evict each other from L1 (392x512x2048 ran at 40 GFLOP/s unpacked)
    pack = csb != 1 or rsb * it > PACK_ROW_BYTES
    pfa = pf and rsa == 1 and csa == M
    pfb = pf and csb == 1 and rsb == N
    ntiles = (M + MR - 1) // MR
    room = beta >= ROOM        # C's rows hold whole vectors past N (see ROOM)
    for p0 in range(0, K, kc):
        kk = min(kc, K - p0)
        bt = (beta - ROOM if room else beta) if p0 == 0 else 1
        # the next block's rows of A and B, a share per row tile (see pf)
        nk = min(kc, K - p0 - kk)
        abytes = nk * M * it if pfa else 0
        bbytes = nk * N * it if pfb else 0
        ashare = (abytes // ntiles + 63) // 64 * 64
        bshare = (bbytes // ntiles + 63) // 64 * 64
        for j0 in range(0, N, nc):
            j1 = min(N, j0 + nc)
            npan = (j1 - j0 + nr - 1) // nr
            # pack: panel q, row k, lane jj <- B[p0 + k, j0 + q*nr + jj] (0 past j1); with
            # contiguous, narrow rows only a last panel of partial vectors is packed
            for q in range(npan):
                w = min(nr, j1 - j0 - q * nr)
                if not (pack or w % vl):
                    continue
                o = q * kk * nr
                if csb == 1 or rsb != 1:  # rows of B contiguous (or neither): by rows
                    for k in range(kk):
                        src = (p0 + k) * rsb + (j0 + q * nr) * csb
                        for jj in range(w):
                            wb[o + k * nr + jj] = _load(b, src + jj * csb, work)
                        for jj in range(w, nr):
                            wb[o + k * nr + jj] = 0
                else:  # columns of B contiguous (a transposed matrix): by columns
                    for jj in range(w):
                        src = p0 + (j0 + q * nr + jj) * csb
                        for k in range(kk):
                            wb[o + k * nr + jj] = _load(b, src + k, work)
                    for k in range(kk):
                        for jj in range(w, nr):
                            wb[o + k * nr + jj] = 0
            for i0 in range(0, M, MR):
                im = min(MR, M - i0)
                if j0 == 0 and nk > 0:
                    t = i0 // MR
                    if abytes > 0:
                        o = min(t * ashare, abytes)
                        _prefetch(a + (p0 + kk) * M * it + o, min(ashare, abytes - o))
                    if bbytes > 0:
                        o = min(t * bshare, bbytes)
                        _prefetch(b + (p0 + kk) * N * it + o, min(bshare, bbytes - o))
                for i in range(im):
                    tile_rows[i] = rowmap[i0 + i] if mapped else (i0 + i) * ldc
                if im == MR:
                    pa, ra, ca = a + (i0 * rsa + p0 * csa) * it, rsa, csa
                else:  # fewer than MR rows left: a zero-padded copy of the tile
                    for i in range(MR):
                        for k in range(kk):
                            wa[i * kc + k] = (_load(a, (i0 + i) * rsa + (p0 + k) * csa, work)
                                              if i < im else 0)
                    pa, ra, ca = pwa, kc, 1
                for q in range(npan):
                    j = j0 + q * nr
                    w = min(nr, j1 - j)
                    nv = (w + vl - 1) // vl
                    if pack or w % vl:
                        pb, ldb = pwb + q * kk * nr * it, nr
                    else:
                        pb, ldb = b + (p0 * rsb + j) * it, rsb
                    if im == MR and w != nv * vl and tail_fits(w, vl):
                        _call_tail(w, vl, pa, ra, ca, pb, ldb, c + j * it, p_rows, kk, bt,
                                   work)
                    elif im == MR and (w == nv * vl or room):
                        _call(nv, pa, ra, ca, pb, ldb, c + j * it, p_rows, kk, bt, work)
                    else:  # through the scratch tile: only im x w of C is touched
                        if bt:
                            for i in range(im):
                                for jj in range(w):
                                    wc[i * nr + jj] = _load(c, tile_rows[i] + j + jj, work)
                        _call(nv, pa, ra, ca, pb, ldb, pwc, p_wrows, kk, bt, work)
                        for i in range(im):
                            for jj in range(w):
                                _store(c, tile_rows[i] + j + jj, wc[i * nr + jj])


@intrinsic
def _claim(typingctx, counter, step):
    """Atomically ``counter[0] += step``; returns the value it had (LLVM ``atomicrmw``)."""
    sig = types.int64(counter, types.int64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.atomic_rmw("add", ary.data, args[1], "monotonic")

    return sig, codegen


@separate("void(int64, int64, int64, {T}[:, :, ::1], int64, int64, int64, int64, int64[::1], "
          "{T}[::1], {T}[::1], {T}[::1], int64)", float32="float32", float64="float64")
def _claimed_block(a, rsa, csa, bp, c, ldc, im_total, N, offs, wa, wc, work, beta):
    """``C[:im_total, :N] = A @ B`` for one claimed block of rows: ``A`` at address ``a``
    (strides ``rsa``, ``csa``), ``C`` at address ``c`` (rows ``ldc`` apart), ``B`` all of
    :func:`pack_panels`' panels. ``offs``, ``wa``, ``wc``: :func:`gemm_claimed`'s scratch.
    ``beta`` 2 streams the whole tiles into C (see :func:`_micro`; C's rows then start on
    vector boundaries)."""
    it = work.itemsize
    vl = VECTOR_BYTES // it
    nr = NV * vl
    npan, K = bp.shape[0], bp.shape[1]
    # addresses as int64, as the operands' are: one typing of _call, not two
    pwa, pwc, pb0 = np.int64(wa.ctypes.data), np.int64(wc.ctypes.data), np.int64(bp.ctypes.data)
    tile_rows = offs[:MR]
    p_rows = np.int64(offs.ctypes.data)
    p_wrows = p_rows + MR * 8
    first = 0
    if npan == 1 and N == 2 * vl:
        # two vectors of columns: the patch kernel's taller tile (PATCH_MR), so that a
        # row of B feeds more FMAs than the 6-row tile's; the rows left over below
        first = _claimed_tall(a, rsa, csa, pb0, K, c, ldc, im_total, offs, work, beta)
    for i0 in range(first, im_total, MR):
        im = min(MR, im_total - i0)
        for i in range(im):
            tile_rows[i] = (i0 + i) * ldc
        if im == MR:
            pa, ra, ca = a + i0 * rsa * it, rsa, csa
        else:
            for i in range(MR):
                for k in range(K):
                    wa[i * K + k] = _load(a, (i0 + i) * rsa + k * csa, work) if i < im else 0
            pa, ra, ca = pwa, K, 1
        for q in range(npan):
            j = q * nr
            w = min(nr, N - j)
            nv = (w + vl - 1) // vl
            pb = pb0 + q * K * nr * it
            if im == MR and w == nv * vl:
                _call(nv, pa, ra, ca, pb, nr, c + j * it, p_rows, K, beta, work)
            elif im == MR and tail_fits(w, vl):
                _call_tail(w, vl, pa, ra, ca, pb, nr, c + j * it, p_rows, K, beta, work)
            else:
                _call(nv, pa, ra, ca, pb, nr, pwc, p_wrows, K, 0, work)
                for i in range(im):
                    for jj in range(w):
                        _store(c, tile_rows[i] + j + jj, wc[i * nr + jj])


@helper
def _claimed_tall(a, rsa, csa, b, K, c, ldc, im_total, offs, work, beta):
    """The whole tall tiles of :func:`_claimed_block` for two vectors of columns, B one
    packed panel at ``b`` (``K`` rows): ``PATCH_MR[2]`` rows each (their C offsets in
    ``offs`` past the ``2*MR`` of the 6-row tiles). Returns the first row left. Old / new
    code in alternating processes, best ms (2 threads, Zen 4): efficientnet_b0:mb1_project
    backward data 0.752 / 0.664, wavenet:residual_1x1 0.385 / 0.365,
    squeezenet:fire2_expand1x1 0.284 / 0.285. One vector's 14-row tile lost
    (efficientnet_b0:mb2_expand 2.56 / 3.21, vnet:head 3.10 / 4.15)."""
    it = work.itemsize
    vl = VECTOR_BYTES // it
    mt = _PATCH_ROWS[1]
    rows = offs[2 * MR:]
    p_rows = np.int64(offs.ctypes.data) + 2 * MR * 8
    i0 = 0
    while i0 + mt <= im_total:
        for i in range(mt):
            rows[i] = (i0 + i) * ldc
        _tall2(a + i0 * rsa * it, rsa, csa, b, NV * vl, c, p_rows, K, beta, work)
        i0 += mt
    return i0


@helper
def _claimed_scratch(K, work):
    """:func:`gemm_claimed`'s scratch views: tile row offsets (the C tile's, then the
    scratch tile's, then a tall tile's: :func:`_claimed_tall`), the padded last row tile
    of A ``[MR, K]`` and the scratch tile of C ``[MR, NR]``."""
    nr = NV * (VECTOR_BYTES // work.itemsize)
    offs = np.empty(2 * MR + PATCH_SLACK, np.int64)
    for i in range(MR):
        offs[MR + i] = i * nr
    return offs, work[: MR * K], work[MR * K: MR * K + MR * nr]


def gemm_claimed(a, rsa, csa, bp, c, ldc, M, N, counter, chunk, work):
    """See :func:`gemm_claimed_kernel` (its address table for ``work``'s dtype added)."""
    gemm_claimed_kernel(_claimed_block.table(dtype_name(work.dtype)), a, rsa, csa, bp, c, ldc, M,
                        N, counter, chunk, work)


@kernel(parallel=False)
def gemm_claimed_kernel(fns, a, rsa, csa, bp, c, ldc, M, N, counter, chunk, work):
    """``C[:M, :N] = A @ B`` with all of B packed once by :func:`pack_panels` (``bp``:
    ``[panels, K, NR]``, zero-padded) and the rows of A and C shared out at run time: the
    caller claims blocks of ``chunk`` rows (a multiple of ``MR``) from ``counter[0]`` until
    none are left. Every thread that calls this with the same counter takes blocks as it
    goes, so a thread that starts late or runs slow simply takes fewer (oneDNN's and
    OpenMP's dynamic schedule, with no task per block in Python). ``work``: scratch of
    :func:`claimed_workspace` elements, one per thread."""
    _claim_blocks(fns, a, rsa, csa, bp, c, ldc, M, N, counter, chunk, work, 0)


@helper
def _claim_blocks(fns, a, rsa, csa, bp, c, ldc, M, N, counter, chunk, work, beta):
    it = work.itemsize
    offs, wa, wc = _claimed_scratch(bp.shape[1], work)
    while True:
        r0 = _claim(counter, chunk)
        if r0 >= M:
            break
        r1 = min(M, r0 + chunk)
        _claimed_block(fns, a + r0 * rsa * it, rsa, csa, bp, c + r0 * ldc * it, ldc, r1 - r0,
                       N, offs, wa, wc, work, beta)


@intrinsic
def _sfence(typingctx):
    """``sfence``: this thread's streamed stores are visible before anything it does next."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        if STREAMS:  # elsewhere no stream is taken (see gemm_claimed_parallel)
            fn = cgutils.get_or_insert_function(builder.module,
                                                ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse.sfence")
            builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


def gemm_claimed_parallel(a, rsa, csa, bp, c, ldc, M, N, counter, chunk, work, stream):
    """:func:`gemm_claimed` on every thread of one parallel loop (``work``: one row of
    scratch per thread, :func:`_claimed_thread`): the threads claim blocks of ``chunk``
    rows from ``counter[0]`` as they go, with no Python worker thread to wake (0.07-0.2 ms
    each). ``stream``: write C's whole tiles with non-temporal stores (no read for
    ownership of a C larger than the caches; taken only where C's rows start on vector
    boundaries)."""
    name = dtype_name(work.dtype)
    it = work.itemsize
    beta = 2 if (stream and STREAMS and c % VECTOR_BYTES == 0
                 and (ldc * it) % VECTOR_BYTES == 0) else 0
    _claimed_thread.run(name, work.shape[0], _claimed_block.table(name), a, rsa, csa, bp, c,
                        ldc, M, N, counter, chunk, work, beta)


@separate("void(int64[::1], int64, int64, int64, {T}[:, :, ::1], int64, int64, int64, int64, "
          "int64[::1], int64, {T}[:, ::1], int64, int64)", float32="float32", float64="float64")
def _claimed_thread(fns, a, rsa, csa, bp, c, ldc, M, N, counter, chunk, work, beta, j):
    """Thread ``j`` of :func:`gemm_claimed_parallel`: blocks claimed with the
    scratch ``work[j]`` until none are left (``fns``: :func:`_claimed_block`'s table),
    then, where it streamed, a fence."""
    _claim_blocks(fns, a, rsa, csa, bp, c, ldc, M, N, counter, chunk, work[j], beta)
    if beta == 2:
        _sfence()


def gemm_claimed_groups(a, rsa, csa, bps, c, ldc, M, N, ga, gc, counter, chunk, work):
    """:func:`gemm_claimed_parallel` for ``g`` products at once (a grouped 1x1 layer):
    ``C_i[:M, :N] = A_i @ B_i`` for ``i < g``, ``A_i`` at ``a + i*ga`` and ``C_i`` at ``c +
    i*gc`` (elements; the same strides), ``bps [g, panels, K, NR]`` every ``B_i`` packed
    (:func:`pack_group_panels`). The threads claim (product, block of ``chunk`` rows) pairs
    from one counter in one parallel loop: no loop, and no wait for its slowest thread,
    per product."""
    name = dtype_name(work.dtype)
    _claimed_groups_thread.run(name, work.shape[0], _claimed_block.table(name), a, rsa, csa, bps,
                               c, ldc, M, N, ga, gc, counter, chunk, work)


@separate("void(int64[::1], int64, int64, int64, {T}[:, :, :, ::1], int64, int64, int64, "
          "int64, int64, int64, int64[::1], int64, {T}[:, ::1], int64)", float32="float32",
          float64="float64")
def _claimed_groups_thread(fns, a, rsa, csa, bps, c, ldc, M, N, ga, gc, counter, chunk, work,
                           j):
    """Thread ``j`` of :func:`gemm_claimed_groups`: (product, block) pairs claimed
    with the scratch ``work[j]`` until none are left."""
    it = work.itemsize
    g = bps.shape[0]
    per = (M + chunk - 1) // chunk  # blocks per product
    offs, wa, wc = _claimed_scratch(bps.shape[2], work[j])
    while True:
        b = _claim(counter, 1)
        if b >= g * per:
            break
        i = b // per
        r0 = (b - i * per) * chunk
        r1 = min(M, r0 + chunk)
        _claimed_block(fns, a + (i * ga + r0 * rsa) * it, rsa, csa, bps[i],
                       c + (i * gc + r0 * ldc) * it, ldc, r1 - r0, N, offs, wa, wc, work[j], 0)


@intrinsic
def _narrow(typingctx, v):
    """A float32 rounded to float16 (nearest even, as NumPy's cast), as its uint16 bits."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@helper
def _round_rows(src, dst, d0, n):
    """``dst[d0 : d0 + n] = float16(src[:n])`` as bits (unsigned offsets: no wraparound
    checks in the way of the vectoriser)."""
    b = np.uint64(d0)
    for i in range(np.uint64(n)):
        dst[b + i] = _narrow(src[i])


def gemm_claimed_half(a, bp, c, counter, chunk, work, stage):
    """See :func:`_claimed_half` (one thread's share, called from Python)."""
    gemm_claimed_half_kernel(_claimed_block.table("float32"), a, bp, c, counter, chunk, work,
                             stage)


@kernel(parallel=False)
def gemm_claimed_half_kernel(fns, a, bp, c, counter, chunk, work, stage):
    """:func:`_claimed_half` as a kernel of its own."""
    _claimed_half(fns, a, bp, c, counter, chunk, work, stage)


@helper
def _claimed_half(fns, a, bp, c, counter, chunk, work, stage):
    """:func:`gemm_claimed` for ``a [M, K]`` and ``c [M, N]`` as float16 bits (uint16,
    C-contiguous): each claimed block of rows is widened into this thread's float32
    ``stage`` (``chunk * (K + N)`` floats, reused, so that it stays in cache), multiplied
    there and rounded into ``c``, so float16 costs no pass over dY or dX of its own. The
    products are :func:`gemm_claimed`'s, bit for bit, rounded once."""
    M, K = a.shape
    N = c.shape[1]
    a1 = a.reshape(a.size)
    c1 = c.reshape(c.size)
    sa = stage[: chunk * K]
    sc = stage[chunk * K: chunk * (K + N)]
    offs, wa, wc = _claimed_scratch(K, work)
    while True:
        r0 = _claim(counter, chunk)
        if r0 >= M:
            break
        n = min(M, r0 + chunk) - r0
        _widen_rows(a1, r0 * K, sa, n * K)
        _claimed_block(fns, sa.ctypes.data, K, 1, bp, sc.ctypes.data, N, n, N, offs, wa, wc,
                       work, 0)
        _round_rows(sc, c1, r0 * N, n * N)


def gemm_claimed_half_parallel(a, bp, c, counter, chunk, work, stage):
    """:func:`gemm_claimed_half` on every thread of one parallel loop (``work`` and
    ``stage``: one row per thread), as :func:`gemm_claimed_parallel`."""
    _claimed_half_thread.run("float16", work.shape[0], _claimed_block.table("float32"), a, bp, c,
                             counter, chunk, work, stage)


@separate(noalias=True, float16="void(int64[::1], uint16[:, ::1], float32[:, :, ::1], "
          "uint16[:, ::1], int64[::1], int64, float32[:, ::1], float32[:, ::1], int64)")
def _claimed_half_thread(fns, a, bp, c, counter, chunk, work, stage, j):
    """Thread ``j`` of :func:`gemm_claimed_half_parallel` (``fns``:
    :func:`_claimed_block`'s table)."""
    _claimed_half(fns, a, bp, c, counter, chunk, work[j], stage[j])


def gemm_rows_bwd_w(xp, dy, parts, geo, kc, nc, work):
    """``parts[j] += dW`` over share ``j`` of the output pixels (flat over rows of ``ow``
    pixels), the shares in parallel (``work[j]``: share ``j``'s scratch of
    :func:`workspace` elements): see :func:`_rows_bwd_w`."""
    name = dtype_name(work.dtype)
    none = np.empty(0, np.uint16)
    _rows_bwd_w.run(name, parts.shape[0], _gemm.table(name), xp.ctypes.data, none,
                    dy.ctypes.data, none, work[:0], xp.shape[3], parts, geo, kc, nc, work)


#: Elements between the stages of :func:`gemm_rows_bwd_w_half` (an odd number of cache
#: lines, so that the X and dY stages' rows never fall on the same L1 sets: with the two
#: stages as separate arrays 32 KiB apart, two threads ran 1.1-1.4x slower by allocation).
STAGE_GAP = 528


def gemm_rows_bwd_w_half(xph, dyh, parts, geo, kc, nc, work, stage):
    """:func:`gemm_rows_bwd_w` with ``xp`` and ``dy`` as float16 bits (``xph``, ``dyh``,
    uint16): each output row's share of ``dy`` is widened ``kc`` pixels at a time into the
    thread's float32 stage (``kc * K`` floats) before their GEMMs, and each tap row's
    span of the input into a second one (``((kc-1)*sw + kw) * C`` floats), both reused, so
    that they stay in cache and float16 costs no pass over X or dY of its own; the
    products are float32's, bit for bit. ``stage[j]``: thread ``j``'s stages, dY's first,
    :data:`STAGE_GAP` elements apart (see :func:`rows_stage`)."""
    _rows_bwd_w.run("float32", parts.shape[0], _gemm.table("float32"), 0, xph.reshape(xph.size), 0,
                    dyh.reshape(dyh.size), stage, xph.shape[3], parts, geo, kc, nc, work)


def rows_stage(geo, kc):
    """Elements of one thread's stage for :func:`gemm_rows_bwd_w_half` (and a gap after
    it, so that the threads' stages stay apart too)."""
    C, K, kw, sw = int(geo[2]), int(geo[3]), int(geo[9]), int(geo[15])
    return kc * K + ((kc - 1) * sw + kw) * C + 2 * STAGE_GAP


@separate("void({T}[:, ::1], {T}[:, :, ::1], int64)", noalias=True, float32="float32",
          float64="float64")
def _add_parts(c, parts, i):
    """``c[i] += parts[j, i]`` for every partial ``j`` (a split-K product's rows)."""
    for j in range(parts.shape[0]):
        for n in range(c.shape[1]):
            c[i, n] += parts[j, i, n]


def gemm_split_k(a, rsa, csa, b, rsb, csb, c, parts, K, kc, nc, work, pf=True, n=0):
    """``C = A @ B`` with the reduction split into ``len(parts) + 1`` equal shares computed
    in parallel: share 0 into ``C`` (``c [M, N]``, C-contiguous), share ``j`` into
    ``parts[j - 1]``, then added to ``C`` in parallel over its rows. ``A`` and ``B`` on raw
    addresses as in :func:`gemm`; ``work[j]``: share ``j``'s scratch of :func:`workspace`
    elements. For a weight gradient's long reduction (dW = X^T @ dY over every pixel), in
    two parallel loops: no Python worker threads to wake (0.07-0.2 ms each) and no
    per-slab calls. ``pf``: prefetch each next reduction block (see :func:`gemm`). ``n``:
    the columns of the product where ``c`` and ``parts`` have more (whole vectors: see
    :data:`ROOM`); 0: all of them."""
    name = dtype_name(work.dtype)
    _split_k_share.run(name, parts.shape[0] + 1, _gemm.table(name), a, rsa, csa, b, rsb, csb,
                       c, parts, K, kc, nc, work, pf, n)
    _add_parts.run(name, c.shape[0], c, parts)


@separate("void(int64[::1], int64, int64, int64, int64, int64, int64, {T}[:, ::1], "
          "{T}[:, :, ::1], int64, int64, int64, {T}[:, ::1], boolean, int64, int64)",
          noalias=True, float32="float32", float64="float64")
def _split_k_share(fns, a, rsa, csa, b, rsb, csb, c, parts, K, kc, nc, work, pf, n, j):
    """Share ``j`` of :func:`gemm_split_k`'s reduction (``fns``: :func:`_gemm`'s
    table; ``n``: see :func:`gemm_split_k`)."""
    M, ldc = c.shape
    N = n if 0 < n < ldc else ldc
    nch = parts.shape[0] + 1
    it = work.itemsize
    k0 = K * j // nch
    k1 = K * (j + 1) // nch
    dst = c if j == 0 else parts[j - 1]
    if k1 == k0:
        dst[:, :] = 0
    else:
        _gemm(fns, a + k0 * csa * it, rsa, csa, b + k0 * rsb * it, rsb, csb,
              dst.ctypes.data, ldc, _NO_MAP, M, N, k1 - k0, ROOM if N < ldc else 0, kc,
              nc, work[j], pf)


def gemm_split_m(a, rsa, csa, b, rsb, csb, c, K, kc, nc, work):
    """``C = A @ B`` with the rows of ``C`` (``c [M, N]``, C-contiguous) split into
    ``len(work)`` shares of whole ``MR``-row tiles, computed in parallel (share ``j`` with
    the scratch ``work[j]`` of :func:`workspace` elements); ``A`` and ``B`` on raw
    addresses as in :func:`gemm`. For a weight gradient over few pixels (a short
    reduction into a tall dW), in one parallel region: no Python worker threads to wake
    (0.07-0.2 ms each)."""
    name = dtype_name(work.dtype)
    _split_m_share.run(name, work.shape[0], _gemm.table(name), a, rsa, csa, b, rsb, csb, c, K, kc,
                       nc, work)


@separate("void(int64[::1], int64, int64, int64, int64, int64, int64, {T}[:, ::1], int64, "
          "int64, int64, {T}[:, ::1], int64)", float32="float32", float64="float64")
def _split_m_share(fns, a, rsa, csa, b, rsb, csb, c, K, kc, nc, work, j):
    """Share ``j`` of :func:`gemm_split_m`'s rows (``fns``: :func:`_gemm`'s
    table)."""
    M, N = c.shape
    nch = work.shape[0]
    it = work.itemsize
    step = ((M + nch - 1) // nch + MR - 1) // MR * MR
    i0 = min(M, j * step)
    i1 = min(M, i0 + step)
    if i1 > i0:
        _gemm(fns, a + i0 * rsa * it, rsa, csa, b, rsb, csb, c.ctypes.data + i0 * N * it,
              N, _NO_MAP, i1 - i0, N, K, 0, kc, nc, work[j], False)


#: Rows of the patch kernel's register tile for ``nv`` vectors across (``rows * nv``
#: accumulators, ``nv`` loaded vectors and a broadcast within the register file, 32 with
#: AVX-512 and 16 otherwise): with one or two vectors of output channels the plain 6-row
#: tile keeps too few multiply-adds in flight to cover their latency. 14 and 9 rows also
#: cover a 3x3 RGB patch's 27 rows in 28 and 27.
PATCH_MR = {1: 14, 2: 9, 3: 8, 4: 6} if VECTOR_BYTES == 64 else {1: 12, 2: 6, 3: 4, 4: 3}
#: Rows of slack after a row table: the last tile of a row reads up to this many entries.
PATCH_SLACK = max(PATCH_MR.values())
_PATCH_ROWS = tuple(PATCH_MR[n] for n in (1, 2, 3, 4))
_patch1, _patch2, _patch3, _patch4 = (_micro(n, PATCH_MR[n], True) for n in (1, 2, 3, 4))
#: The two-vector tall tile with A's rows ``rsa`` apart (:func:`_claimed_tall`)
_tall2 = _micro(2, PATCH_MR[2])


def patch_index(M):
    """int64 scratch entries :func:`_patch_bwd_w` needs for ``M`` patch rows."""
    return 4 * (M + PATCH_SLACK)


#: Output rows whose end pixels :func:`_patch_bwd_w` runs through the register tiles
#: together: one GEMM per end pixel over this many rows, so that each tile of dW is
#: loaded and stored once per block of rows, not once per row.
EDGE_ROWS = 16


def patch_work(ow, kp, tap_rows=0, span=0, C=0):
    """Scratch elements :func:`_patch_bwd_w` needs per thread (``kp``: output channels
    rounded up to whole vectors; for the end pixels, ``EDGE_ROWS`` rows' zero-padded
    copies of the ``span`` input columns (``C`` elements each) one pixel reads in each of
    ``tap_rows`` (``kd*kh``) tap rows, and their rows of dY)."""
    return ow * kp + EDGE_ROWS * (tap_rows * span * C + kp)


def gemm_patch_bwd_w(px, py, parts, geo, work, idx):
    """``parts[j] += dW`` over share ``j`` of the output rows (flat over ``mb, od, oh``),
    the shares in parallel, each with its own scratch ``work[j]`` and ``idx[j]``: see
    :func:`_patch_bwd_w`."""
    name = dtype_name(work.dtype)
    _patch_bwd_w.run(name, parts.shape[0], _patch_call.table(name), _patch_ends.table(name),
                     px, py, parts, geo, work, idx)


@separate("void(int64[::1], int64[::1], int64, int64, {T}[:, :, ::1], int64[::1], {T}[:, ::1], "
          "int64[:, ::1], int64)", noalias=True, float32="float32", float64="float64")
def _patch_bwd_w(fns, ends_fns, px, py, parts, geo, works, idxs, j):
    """``part[m, k] += dW[m, k]`` (``part``: ``parts[j]``) over the output rows of share
    ``j`` of ``len(parts)`` equal shares (flat over ``mb, od, oh``) for a weight gradient
    as one GEMM per output row: ``m`` runs over the
    patch ``(t_d, t_h, t_w, c)``, ``KD*KH*KW*C`` rows, and ``part`` has one more, a sink
    for the padding rows of a last tile; its rows are ``kp`` (a whole number of vectors
    >= K) long, and only its first ``K`` columns are the result. ``x [mb, id, ih, iw, C]``
    and ``dy [mb, od, oh, ow, K]`` come as their addresses ``px`` and ``py`` (only read).

    For one output row, every patch row whose tap row lies inside the input is a row of
    A at a fixed element offset from the output pixel's input position, and consecutive
    output pixels are ``sw*C`` elements apart: ``part[rows] += A @ dY_row`` is one GEMM
    over the row's pixels with a table of A's row offsets (:func:`_micro` with
    ``row_table``) and of C's. B is ``dy``'s row in place, ``K`` elements a pixel: where
    ``K`` is not a whole number of vectors, a pixel's last vector runs into the next
    pixel's channels, which only reach the columns past ``K``; the last row of ``dy``,
    whose last vector would run past the array, is copied zero-padded into ``work``
    first. The row's pixels whose taps stay inside the input along w run through the
    register tiles. Those at its two ends, whose taps reach into the padding, run through
    the same tiles afterwards, one GEMM per end pixel over a block of ``EDGE_ROWS`` rows:
    its A a copy of the columns that pixel reads in every tap row of each row of the
    block (zeros outside the input), its B the pixel's rows of dY. ``work``
    (``works[j]``): :func:`patch_work` elements; ``idx`` (``idxs[j]``):
    :func:`patch_index` entries; ``fns``, ``ends_fns``: :func:`_patch_call`'s and
    :func:`_patch_ends`' tables (the end pixels are a unit of their own: the two halves
    compile at once where a first call has a helper process)."""
    nch = parts.shape[0]
    rows = geo[0] * geo[10] * geo[11]
    r0, r1 = rows * j // nch, rows * (j + 1) // nch
    part, work, idx = parts[j], works[j], idxs[j]
    C, K = geo[2], geo[3]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    it = work.itemsize
    vl = VECTOR_BYTES // it
    kp = part.shape[1]
    M = kd * kh * kw * C
    total = geo[0] * od * oh * ow * K
    pc = part.ctypes.data
    lo, hi = _inner_pixels(geo)
    n_ab = M + PATCH_SLACK
    aoff = idx[:n_ab]
    crow = idx[n_ab:2 * n_ab]
    pa_tab = idx.ctypes.data
    pc_tab = pa_tab + n_ab * 8
    for r in range(r0, r1):
        n = r // (od * oh)
        o_d = (r // oh) % od
        o_h = r % oh
        rows = 0
        for t_d in range(kd):
            i_d = o_d * sd - pd + t_d * dd
            if i_d < 0 or i_d >= id_:
                continue
            for t_h in range(kh):
                i_h = o_h * sh - ph + t_h * dh
                if i_h < 0 or i_h >= ih:
                    continue
                base = ((n * id_ + i_d) * ih + i_h) * iw * C
                m0 = (t_d * kh + t_h) * kw * C
                for t_w in range(kw):
                    for c in range(C):
                        aoff[rows] = base + t_w * dw * C + c
                        crow[rows] = (m0 + t_w * C + c) * kp
                        rows += 1
        if rows == 0 or hi <= lo:
            continue
        for i in range(rows, rows + PATCH_SLACK):  # a last tile's extra rows: into the sink
            aoff[i] = aoff[0]
            crow[i] = M * kp
        ybase = r * ow * K
        if (r * ow + hi - 1) * K + kp > total:  # the last vector would leave dy
            for o in range(lo, hi):
                for k in range(K):
                    work[o * kp + k] = _load(py, ybase + o * K + k, work)
                for k in range(K, kp):
                    work[o * kp + k] = 0
            b, ldb = np.int64(work.ctypes.data) + lo * kp * it, kp
        else:
            b, ldb = py + (ybase + lo * K) * it, K
        for j0 in range(0, kp, NV * vl):
            nv = min(NV, (kp - j0) // vl)
            mr = _PATCH_ROWS[nv - 1]
            for i0 in range(0, rows, mr):
                _patch_call(fns, nv, px + (lo * sw - pw) * C * it, pa_tab + i0 * 8, sw * C,
                            b + j0 * it, ldb, pc + j0 * it, pc_tab + i0 * 8, hi - lo, 1,
                            work)
    if lo == 0 and hi == ow:
        return
    _patch_ends(ends_fns, fns, px, py, part, geo, work, idx, r0, r1)


@helper(inline=True)
def _inner_pixels(geo):
    """``[lo, hi)``: the output pixels of a row whose taps all lie inside the input along
    w (those before ``lo`` and from ``hi`` on reach into the padding: the end pixels)."""
    iw, kw, ow, sw, dw, pw = geo[6], geo[9], geo[12], geo[15], geo[18], geo[21]
    lo = min(ow, (pw + sw - 1) // sw)
    return lo, max(lo, min(ow, (iw - 1 - (kw - 1) * dw + pw) // sw + 1))


@separate("void(int64[::1], int64, int64, {T}[:, ::1], int64[::1], {T}[::1], int64[::1], "
          "int64, int64)", noalias=True, float32="float32", float64="float64")
def _patch_ends(fns, px, py, part, geo, work, idx, r0, r1):
    """The end pixels of output rows ``[r0, r1)`` of :func:`_patch_bwd_w` (those whose
    taps reach into the padding along w): per block of ``EDGE_ROWS`` rows and end pixel,
    one GEMM over the block's rows, A a copy of the columns the pixel reads in every tap
    row (zeros outside the input), B the pixel's rows of dY. ``fns``: :func:`_patch_call`'s
    table; ``work``, ``idx``: the share's scratch (its row tables past the interior's)."""
    C, K = geo[2], geo[3]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    it = work.itemsize
    vl = VECTOR_BYTES // it
    kp = part.shape[1]
    M = kd * kh * kw * C
    pc = part.ctypes.data
    lo, hi = _inner_pixels(geo)
    span = (kw - 1) * dw + 1
    ecopy = kd * kh * span * C                          # one row's copy for one end pixel
    pe = np.int64(work.ctypes.data) + ow * kp * it      # EDGE_ROWS copies
    pyb = pe + EDGE_ROWS * ecopy * it                   # their rows of dY: [EDGE_ROWS, kp]
    n_ab = M + PATCH_SLACK
    eoff = idx[2 * n_ab:3 * n_ab]      # every patch row's offset in a row's copy
    erow = idx[3 * n_ab:4 * n_ab]      # and its row of dW
    pe_tab = idx.ctypes.data + 2 * n_ab * 8
    pr_tab = idx.ctypes.data + 3 * n_ab * 8
    for m in range(M):
        t = m // (kw * C)               # the tap row, t_d * kh + t_h
        u = m - t * kw * C              # t_w * C + c
        eoff[m] = t * span * C + (u // C) * dw * C + u % C
        erow[m] = m * kp
    for m in range(M, n_ab):            # a last tile's extra rows: into the sink
        eoff[m] = 0
        erow[m] = M * kp
    for rb in range(r0, r1, EDGE_ROWS):
        nb = min(EDGE_ROWS, r1 - rb)
        for e in range(ow):
            if lo <= e < hi:
                continue
            for q in range(nb):
                r = rb + q
                n = r // (od * oh)
                o_d = (r // oh) % od
                o_h = r % oh
                for t_d in range(kd):
                    i_d = o_d * sd - pd + t_d * dd
                    for t_h in range(kh):
                        i_h = o_h * sh - ph + t_h * dh
                        dst = pe + (q * ecopy + (t_d * kh + t_h) * span * C) * it
                        if 0 <= i_d < id_ and 0 <= i_h < ih:
                            base = ((n * id_ + i_d) * ih + i_h) * iw * C
                            _padded_cols(dst, px + base * it, e * sw - pw, span, iw, C * it)
                        else:
                            _copy_bytes(dst, 0, span * C * it)
                _copy_bytes(pyb + q * kp * it, py + (r * ow + e) * K * it, K * it)
                _copy_bytes(pyb + (q * kp + K) * it, 0, (kp - K) * it)
            for j0 in range(0, kp, NV * vl):
                nv = min(NV, (kp - j0) // vl)
                mr = _PATCH_ROWS[nv - 1]
                for i0 in range(0, M, mr):
                    _patch_call(fns, nv, pe, pe_tab + i0 * 8, ecopy, pyb + j0 * it, kp,
                                pc + j0 * it, pr_tab + i0 * 8, nb, 1, work)


@helper
def _padded_cols(dst, src, c0, cols, iw, cbytes):
    """Input columns ``[c0, c0 + cols)`` of the row at address ``src`` (``iw`` columns of
    ``cbytes`` each) to ``dst``, zeros for those outside ``[0, iw)``."""
    z0 = min(cols, max(0, -c0))
    z1 = min(cols, max(z0, iw - c0))
    _copy_bytes(dst, 0, z0 * cbytes)
    _copy_bytes(dst + z0 * cbytes, src + (c0 + z0) * cbytes, (z1 - z0) * cbytes)
    _copy_bytes(dst + z1 * cbytes, 0, (cols - z1) * cbytes)


@separate("void(int64, int64, int64, int64, int64, int64, int64, int64, int64, int64, "
          "{T}[::1])", float32="float32", float64="float64")
def _patch_call(nv, a, arows, csa, b, ldb, c, crows, kc, beta, work):
    """The patch micro-kernel for ``nv`` vectors of columns (:func:`_micro` with
    ``row_table``), compiled on its own and called through its address: linked into
    :func:`_patch_bwd_w`, LLVM copied its four unrolled tiles into both call sites."""
    if nv == 4:
        _patch4(a, arows, csa, b, ldb, c, crows, kc, beta, work)
    elif nv == 3:
        _patch3(a, arows, csa, b, ldb, c, crows, kc, beta, work)
    elif nv == 2:
        _patch2(a, arows, csa, b, ldb, c, crows, kc, beta, work)
    else:
        _patch1(a, arows, csa, b, ldb, c, crows, kc, beta, work)


@intrinsic
def _widen(typingctx, v):
    """float16 bits (uint16) widened to float32 (``fpext``: ``vcvtph2ps`` with F16C, which
    LLVM vectorises in a loop)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def _widen_bf16(typingctx, v):
    """bfloat16 bits (uint16) widened to float32: the bits as the float's upper half."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        w = builder.shl(builder.zext(args[0], i32), ir.Constant(i32, 16))
        return builder.bitcast(w, ir.FloatType())

    return sig, codegen


@helper
def _widen_rows(src, s0, dst, n):
    """``dst[:n] = float32(src[s0 : s0 + n])`` for ``src`` float16 bits (unsigned offsets:
    no wraparound checks in the way of the vectoriser)."""
    b = np.uint64(s0)
    for i in range(np.uint64(n)):
        dst[i] = _widen(src[b + i])


@helper
def _widen_rows_bf16(src, s0, dst, n):
    """:func:`_widen_rows` for ``src`` bfloat16 bits."""
    b = np.uint64(s0)
    for i in range(np.uint64(n)):
        dst[i] = _widen_bf16(src[b + i])


def gemm_split_k_half(x, dy, c, parts, kc, nc, work, stage, bf16=False):
    """:func:`gemm_split_k` for ``dW = X^T @ dY`` with ``x [P, M]`` and ``dy [P, N]`` as
    float16 bits (uint16), or bfloat16 bits with ``bf16``: each share widens its pixels one
    reduction block of ``kc`` at a time into its own float32 stage (``stage[j]``: ``kc *
    (M + N)`` floats, reused, so that it stays in cache) and multiplies from there, so the
    16-bit types cost no pass over X and dY of their own. The blocks are
    :func:`gemm_split_k`'s, so the sums are bit for bit float32's on the widened values.
    ``c [M, N]``, ``parts``, ``work`` as :func:`gemm_split_k`'s."""
    _split_k_half_share.run("float16", parts.shape[0] + 1, _gemm.table("float32"), x, dy, c,
                            parts, kc, nc, work, stage, bool(bf16))
    _add_parts.run("float32", c.shape[0], c, parts)


@separate(noalias=True, float16="void(int64[::1], uint16[:, ::1], uint16[:, ::1], "
          "float32[:, ::1], float32[:, :, ::1], int64, int64, float32[:, ::1], float32[:, ::1], "
          "boolean, int64)")
def _split_k_half_share(fns, x, dy, c, parts, kc, nc, work, stage, bf16, j):
    """Share ``j`` of :func:`gemm_split_k_half`'s reduction (``fns``:
    :func:`_gemm`'s table; ``bf16``: the bits are bfloat16's, else float16's)."""
    M, N = c.shape
    P = x.shape[0]
    nch = parts.shape[0] + 1
    x1 = x.reshape(x.size)
    y1 = dy.reshape(dy.size)
    k0 = P * j // nch
    k1 = P * (j + 1) // nch
    dst = c if j == 0 else parts[j - 1]
    if k1 == k0:
        dst[:, :] = 0
        return
    sx = stage[j, : kc * M]
    sy = stage[j, kc * M:]
    for r0 in range(k0, k1, kc):
        n = min(kc, k1 - r0)
        if bf16:
            _widen_rows_bf16(x1, r0 * M, sx, n * M)
            _widen_rows_bf16(y1, r0 * N, sy, n * N)
        else:
            _widen_rows(x1, r0 * M, sx, n * M)
            _widen_rows(y1, r0 * N, sy, n * N)
        _gemm(fns, sx.ctypes.data, 1, M, sy.ctypes.data, N, 1, dst.ctypes.data, N,
              _NO_MAP, M, N, n, 0 if r0 == k0 else 1, kc, nc, work[j], False)


@separate("void(int64[::1], int64, uint16[::1], int64, uint16[::1], {T}[:, ::1], int64, "
          "{T}[:, :, ::1], int64[::1], int64, int64, {T}[:, ::1], int64)",
          float32="float32", float64="float64")
def _rows_bwd_w(gemm_fns, px, xh, py, dyh, stage, wp, parts, geo, kc, nc, works, j):
    """``parts[j] += dW`` over share ``j`` of ``len(parts)`` equal shares of the output
    pixels (flat over rows of ``ow`` pixels), with the scratch ``works[j]`` of
    :func:`workspace` elements: backward weights as GEMMs whose A is a strided view of the
    input, with no im2col. ``xp [mb, id, ih, wp, C]`` is ``x`` padded along w only (pixel
    ``i`` of a row at ``pw + i``, every tap of every output pixel inside, dilation 1 along
    w), ``dy [mb, od, oh, ow, K]``, ``parts[j] [kd, kh, kw*C, K]`` (one group). For an
    output row and a tap (t_d, t_h) that keeps it inside the input, ``part[t_d, t_h] += A
    @ dY_row`` with ``A[t_w*C + c, o] = xp[row, o*sw + t_w, c]`` at element ``o*sw*C +
    t_w*C + c`` of the input row: rows of A one element apart, columns ``sw*C`` apart
    (``kw*C`` contiguous weights per pixel: a 1-D stem's 7 taps x 3 channels). ``xp`` and
    ``dy`` come as their addresses ``px`` and ``py`` (only read: they may be read-only
    arrays), ``wp`` is ``xp``'s padded width. With float16 bits in ``xh`` and ``dyh`` (not
    empty; ``px`` and ``py`` then unused), each row's share of ``dyh`` is taken ``kc``
    pixels at a time and widened first into the float32 stage ``ys`` (``kc * K``
    elements), and each tap row's span of ``xh`` into ``xs`` (``((kc-1)*sw + kw) * C``
    elements): share ``j``'s stages in ``stage[j]`` (see
    :func:`gemm_rows_bwd_w_half`); otherwise ``stage`` is unused."""
    C, K = geo[2], geo[3]
    id_, ih = geo[4], geo[5]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh = geo[16], geo[17]
    pd, ph = geo[19], geo[20]
    nch = parts.shape[0]
    total = geo[0] * od * oh * ow
    t0, t1 = total * j // nch, total * (j + 1) // nch
    part, work = parts[j], works[j]
    half = dyh.size > 0
    if half:
        ny = kc * K
        xs = stage[j, ny + STAGE_GAP: ny + STAGE_GAP + ((kc - 1) * sw + kw) * C]
        ys = stage[j, :ny]
        px, py = np.int64(xs.ctypes.data), np.int64(ys.ctypes.data)
    else:
        xs = ys = work[:0]
    it = work.itemsize
    pc = part.ctypes.data
    M = kw * C
    nomap = geo[:0]  # no row map: rows of C ``ldc`` apart
    r = t0 // ow
    while r * ow < t1:
        o0 = max(t0 - r * ow, 0)
        o1 = min(t1 - r * ow, ow)
        n = r // (od * oh)
        o_d = (r // oh) % od
        o_h = r % oh
        # float16: the row in pieces of kc pixels (the GEMM's own reduction blocks, so
        # that every partial sum is float32's), each widened into the stages first
        step = kc if half else o1 - o0
        for q0 in range(o0, o1, step):
            q1 = min(o1, q0 + step)
            if half:
                _widen_rows(dyh, (r * ow + q0) * K, ys, (q1 - q0) * K)
                b = py
            else:
                b = py + ((r * ow + q0) * K) * it
            for t_d in range(kd):
                i_d = o_d * sd - pd + t_d * dd
                if i_d < 0 or i_d >= id_:
                    continue
                for t_h in range(kh):
                    i_h = o_h * sh - ph + t_h * dh
                    if i_h < 0 or i_h >= ih:
                        continue
                    s0 = (((n * id_ + i_d) * ih + i_h) * wp + q0 * sw) * C
                    if half:  # the span of the input row this tap row reads
                        _widen_rows(xh, s0, xs, ((q1 - q0 - 1) * sw + kw) * C)
                        a = px
                    else:
                        a = px + s0 * it
                    c = pc + ((t_d * kh + t_h) * M * K) * it
                    _gemm(gemm_fns, a, 1, sw * C, b, K, 1, c, K, nomap, M, K, q1 - q0, 1,
                          kc, nc, work, False)
        r += 1


@intrinsic
def _load(typingctx, base, index, work):
    """``base[index]`` for an address ``base`` of ``work``'s dtype."""
    dtype = work.dtype
    sig = dtype(types.intp, types.intp, work)

    def codegen(context, builder, signature, args):
        f = context.get_value_type(dtype)
        p = builder.gep(builder.inttoptr(args[0], f.as_pointer()), [args[1]])
        return builder.load(p)

    return sig, codegen


@intrinsic
def _store(typingctx, base, index, value):
    """``base[index] = value`` for an address ``base`` of ``value``'s type."""
    sig = types.void(types.intp, types.intp, value)

    def codegen(context, builder, signature, args):
        f = context.get_value_type(value)
        p = builder.gep(builder.inttoptr(args[0], f.as_pointer()), [args[1]])
        builder.store(args[2], p)
        return context.get_dummy_value()

    return sig, codegen


@helper
def _call(nv, a, rsa, csa, b, ldb, c, crows, kc, beta, work):
    if nv == 4:
        _micro4(a, rsa, csa, b, ldb, c, crows, kc, beta, work)
    elif nv == 3:
        _micro3(a, rsa, csa, b, ldb, c, crows, kc, beta, work)
    elif nv == 2:
        _micro2(a, rsa, csa, b, ldb, c, crows, kc, beta, work)
    else:
        _micro1(a, rsa, csa, b, ldb, c, crows, kc, beta, work)


@helper
def _call_tail(w, vl, a, rsa, csa, b, ldb, c, crows, kc, beta, work):
    """:func:`_call` for a tile ``w`` columns wide, ``w`` a quarter or a half of a vector
    past whole vectors (see :func:`tail_fits`): the last vector half as wide, and only its
    first half stored for a quarter."""
    nv = w // vl
    if (w - nv * vl) * 4 == vl:
        beta += 4
    if nv == 0:
        _micro_h0(a, rsa, csa, b, ldb, c, crows, kc, beta, work)
    elif nv == 1:
        _micro_h1(a, rsa, csa, b, ldb, c, crows, kc, beta, work)
    elif nv == 2:
        _micro_h2(a, rsa, csa, b, ldb, c, crows, kc, beta, work)
    else:
        _micro_h3(a, rsa, csa, b, ldb, c, crows, kc, beta, work)


@helper(inline=True)
def tail_fits(w, vl):
    """Whether a tile ``w`` columns wide (less than a panel) ends a quarter or a half of a
    vector past whole vectors, which :func:`_call_tail` stores exactly."""
    r = w % vl
    return r * 4 == vl or r * 2 == vl


def work_dtype(dtype):
    """The dtype the kernel computes in for ``dtype`` (float32 or float64 only)."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"ukernel: float32 or float64 only, got {dtype}")
    return dtype


def _check(A, B, dtype, N):
    M, K = A.shape
    it = np.dtype(dtype).itemsize
    if not (A.dtype == B.dtype == work_dtype(dtype)) or B.shape[0] != K or B.shape[1] != N:
        raise ValueError(f"ukernel: {A.shape} {A.dtype} @ {B.shape} {B.dtype} -> "
                         f"{N} columns of {np.dtype(dtype)}")
    if M * K * N and min(A.strides + B.strides) < 0:
        raise ValueError("ukernel: every operand stride must be non-negative")
    return M, K, it


def _run(A, B, c, ldc, rowmap, M, N, K, it, accumulate, kc, nc, work):
    if nc is None:
        nc = default_nc(kc, it)
    need = workspace(kc, it, nc)
    if work is None or work.size < need:
        work = np.empty(need, A.dtype)
    gemm(A.ctypes.data, A.strides[0] // it, A.strides[1] // it, B.ctypes.data,
         B.strides[0] // it, B.strides[1] // it, c, ldc, rowmap, M, N, K,
         1 if accumulate else 0, kc, nc, work)


def matmul(A, B, C, accumulate=False, kc=256, nc=None, work=None):
    """``C = A @ B`` (or ``C += A @ B``) for 2-D float32/float64 NumPy arrays of one dtype;
    ``C`` needs a unit column stride (``A`` and ``B`` any non-negative strides). ``work``:
    scratch of :func:`workspace` elements (allocated when missing). Returns ``C``."""
    N = C.shape[1]
    M, K, it = _check(A, B, C.dtype, N)
    if C.shape[0] != M or not C.flags.writeable:
        raise ValueError(f"ukernel.matmul: C of shape {C.shape} for {M}x{N}")
    if M * N and ((C.strides[1] != it and N > 1) or C.strides[0] < 0):
        raise ValueError("ukernel.matmul: C needs a unit column stride")
    if M and N:
        if K == 0:
            if not accumulate:
                C[...] = 0
            return C
        _run(A, B, C.ctypes.data, C.strides[0] // it, _NO_MAP, M, N, K, it, accumulate, kc,
             nc, work)
    return C


def matmul_rows(A, B, out, rows, accumulate=False, kc=256, nc=None, work=None):
    """Row ``i`` of ``A @ B`` written to ``out.flat[rows[i] : rows[i] + N]`` (or added to it)
    for a C-contiguous ``out``: a GEMM whose result rows land anywhere in ``out`` (a stride
    phase of ``dX``). ``rows``: int64 element offsets, each row inside ``out``."""
    N = B.shape[1]
    M, K, it = _check(A, B, out.dtype, N)
    rows = np.ascontiguousarray(rows, np.int64)
    if not out.flags.c_contiguous or not out.flags.writeable or rows.shape != (M,):
        raise ValueError("ukernel.matmul_rows: out must be C-contiguous and writeable, with "
                         "one row offset per row of A")
    if M and N:
        if rows.min() < 0 or rows.max() + N > out.size:
            raise ValueError("ukernel.matmul_rows: a row offset lies outside out")
        if K == 0:
            if not accumulate:
                flat = out.reshape(-1)
                for r in rows:
                    flat[r:r + N] = 0
            return out
        _run(A, B, out.ctypes.data, 0, rows, M, N, K, it, accumulate, kc, nc, work)
    return out


def pack_panels(B):
    """All of ``B`` (``K x N``, any strides) as contiguous ``[panels, K, NR]`` panels,
    zero-padded past column N: :func:`gemm_claimed`'s B operand, packed once per product
    instead of once per thread and block."""
    return pack_group_panels(B[None])[0]


def pack_group_panels(B):
    """:func:`pack_panels` of every ``B[i]`` (``B``: ``g x K x N``, any strides) in one pass:
    ``[g, panels, K, NR]``, :func:`gemm_claimed_groups`' operand."""
    g, K, N = B.shape
    nr = panel(B.itemsize)
    npan = max(1, -(-N // nr))
    wide = np.zeros((g, K, npan * nr), B.dtype)
    wide[:, :, :N] = B
    return np.ascontiguousarray(wide.reshape(g, K, npan, nr).transpose(0, 2, 1, 3))


def claimed_workspace(K, itemsize):
    """Elements of per-thread scratch :func:`gemm_claimed` needs for a reduction of ``K``."""
    return MR * K + MR * panel(itemsize)


def matmul_claimed(A, Bp, C, counter, chunk, work=None):
    """``C = A @ B`` for ``Bp = pack_panels(B)``, on the rows this thread claims from
    ``counter`` (an int64 array, zero before the first thread starts): call it from every
    worker with the same ``counter`` and ``C`` is complete once all have returned. ``C``
    needs a unit column stride; ``chunk`` is rounded up to a multiple of ``MR``."""
    M, K = A.shape
    N = C.shape[1]
    if (Bp.ndim != 3 or Bp.shape[1] != K or Bp.shape[2] != panel(C.itemsize)
            or Bp.shape[0] * Bp.shape[2] < N or not Bp.flags.c_contiguous):
        raise ValueError(f"ukernel.matmul_claimed: B panels {Bp.shape} for {M}x{K} @ {K}x{N}")
    _check(A, Bp[0], C.dtype, Bp.shape[2])
    if C.shape[0] != M or not C.flags.writeable:
        raise ValueError(f"ukernel.matmul_claimed: C of shape {C.shape} for {M}x{N}")
    if M * N and ((C.strides[1] != C.itemsize and N > 1) or C.strides[0] < 0):
        raise ValueError("ukernel.matmul_claimed: C needs a unit column stride")
    if counter.dtype != np.int64 or counter.shape != (1,):
        raise ValueError("ukernel.matmul_claimed: counter must be one int64")
    if not (M and N):
        return C
    if K == 0:
        C[...] = 0
        return C
    it = C.itemsize
    need = claimed_workspace(K, it)
    if work is None or work.size < need:
        work = np.empty(need, A.dtype)
    chunk = max(MR, -(-int(chunk) // MR) * MR)
    gemm_claimed(A.ctypes.data, A.strides[0] // it, A.strides[1] // it, Bp, C.ctypes.data,
                 C.strides[0] // it, M, N, counter, chunk, work)
    return C


def claimed_stage(chunk, K, N):
    """Elements of per-thread float32 stage :func:`matmul_claimed_half` needs."""
    chunk = max(MR, -(-int(chunk) // MR) * MR)
    return chunk * (K + N)


def matmul_claimed_half(A, Bp, C, counter, chunk, work=None, stage=None):
    """:func:`matmul_claimed` for ``A`` and ``C`` float16 (or their uint16 bits),
    C-contiguous, computed in float32 (``Bp``: float32 panels): each claimed block of rows
    is widened into a per-thread stage and rounded into ``C`` once (see
    :func:`gemm_claimed_half`). Returns ``C``."""
    M, K = A.shape
    N = C.shape[1]
    if (A.dtype not in (np.float16, np.uint16) or C.dtype != A.dtype
            or not (A.flags.c_contiguous and C.flags.c_contiguous) or not C.flags.writeable
            or C.shape[0] != M):
        raise ValueError(f"ukernel.matmul_claimed_half: A {A.shape} {A.dtype} and C "
                         f"{C.shape} {C.dtype}: float16, C-contiguous, writeable C")
    if (Bp.ndim != 3 or Bp.dtype != np.float32 or Bp.shape[1] != K
            or Bp.shape[2] != panel(4) or Bp.shape[0] * Bp.shape[2] < N
            or not Bp.flags.c_contiguous):
        raise ValueError(f"ukernel.matmul_claimed_half: B panels {Bp.shape} {Bp.dtype} for "
                         f"{M}x{K} @ {K}x{N}")
    if counter.dtype != np.int64 or counter.shape != (1,):
        raise ValueError("ukernel.matmul_claimed_half: counter must be one int64")
    if not (M and N):
        return C
    if K == 0:
        C[...] = 0
        return C
    chunk = max(MR, -(-int(chunk) // MR) * MR)
    if work is None or work.size < claimed_workspace(K, 4):
        work = np.empty(claimed_workspace(K, 4), np.float32)
    if stage is None or stage.size < claimed_stage(chunk, K, N):
        stage = np.empty(claimed_stage(chunk, K, N), np.float32)
    gemm_claimed_half(A.view(np.uint16), Bp, C.view(np.uint16), counter, chunk, work, stage)
    return C
