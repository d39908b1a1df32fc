"""AMX tiles for the bfloat16 kernels: the IR of their micro-kernels, the tile
configuration, and the operating system's permission. Plain Python that runs while a
kernel compiles (a shared module, see the sharing rule in :mod:`numbaconv.kernels`): the
kernel modules declare their own intrinsics, each one call of :func:`void_call` with a
builder here. After editing this file,
clear Numba's cache (its callers' files, which key the cache, did not change).

AMX (Advanced Matrix Extensions, Intel Xeon from Sapphire Rapids on) adds eight tile
registers of up to 16 rows x 64 bytes and ``tdpbf16ps``, which adds to a 16 x 16 float32
tile ``C`` the product of a 16 x 32 bfloat16 tile ``A`` and a tile ``B`` of 16 rows of 16
pairs: ``C[i, j] += sum_p A[i, 2p] B[p, 2j] + A[i, 2p+1] B[p, 2j+1]``, 8192 multiply-adds
in one instruction (16 times ``vdpbf16ps``'s). ``B``'s rows of pairs are exactly
``bf16dot.pack_pairs``' panels, and ``A``'s rows are bfloat16 rows as they are. Products
of two bfloat16 are exact in float32; sums are rounded in float32; subnormal inputs and
results are flushed to zero.

The micro-kernels compute a 32 x 64 tile of C: tile registers 0-3 hold a 32 x 32 half of
it, 4-5 two 16-row tiles of A, 6-7 two 16-column tiles of B; the two halves of the 64
columns run one after the other over the reduction. The tiles are configured per thread
(``ldtilecfg``: :func:`config_tiles`, at the start of each block of work, released at its
end), and the operating system must grant the process AMX's state first (Linux's
``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``: :func:`request_amx`, asked by
the entries before they accept a problem).
"""
import ctypes

from llvmlite import ir
from numba.core import cgutils, types

from numbaconv.kernels.cpu import _host
from numbaconv.kernels.cpu._ir import _BFloat

#: Rows of a micro-kernel tile (two 16-row AMX tiles) and its columns (a packed panel's).
MR = 32
NR = 64
#: Pairs of the reduction per AMX step (one 64-byte tile row of A).
KSTEP = 16

_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_P8 = _I8.as_pointer()


def _fn(builder, name, args):
    return cgutils.get_or_insert_function(builder.module,
                                          ir.FunctionType(ir.VoidType(), args), name)


def _tile(k):
    return ir.Constant(_I8, k)


def _k(v):
    return ir.Constant(_I64, v)


#: C tiles 0-3 of a 32 x 32 half of the micro-kernels' tile: (first row, first column).
_CTS = ((0, 0), (0, 16), (16, 0), (16, 16))


def _tile_ops(builder):
    """``(load, store, zero, dot)``: ``tileloadd``, ``tilestored``, ``tilezero`` and
    ``tdpbf16ps``, tile numbers as immediate ``i8``."""
    return (_fn(builder, "llvm.x86.tileloadd64", [_I8, _P8, _I64]),
            _fn(builder, "llvm.x86.tilestored64", [_I8, _P8, _I64]),
            _fn(builder, "llvm.x86.tilezero", [_I8]),
            _fn(builder, "llvm.x86.tdpbf16ps", [_I8, _I8, _I8]))


def _step(builder, load, dot, a, sa, b, sb):
    """One step of 16 pairs: the two A tiles (``a``: addresses, rows ``sa`` bytes apart)
    and two B tiles (``b``, ``sb``) loaded into tiles 4-7, then multiplied into C tiles
    0-3. (Each load just before the first product that needs it measured the same: 1.7-2.7
    TFLOP/s on two threads either way, operands in L1.)"""
    for t, (addr, stride) in enumerate(((a[0], sa), (a[1], sa), (b[0], sb), (b[1], sb))):
        builder.call(load, [_tile(4 + t), addr, stride])
    for t, (x, y) in enumerate(((4, 6), (4, 7), (5, 6), (5, 7))):
        builder.call(dot, [_tile(t), _tile(x), _tile(y)])


def _round_row(builder, pf, i, off, pd):
    """Row ``i`` of a 32 x 32 float32 block on the stack (``pf``: vectors of 16) rounded to
    bfloat16 and stored at element ``off`` of ``pd`` by AVX512_BF16's ``vcvtne2ps2bf16``
    (every AMX-BF16 CPU has it): 32 values in one instruction, round to nearest even, NaN
    kept quiet, the same bits as the integer rounding of :func:`_ir.bf16_round`."""
    vf = ir.VectorType(ir.FloatType(), 16)
    vals = [builder.load(builder.gep(pf, [builder.add(builder.mul(i, _k(2)), _k(v))]),
                         align=4) for v in range(2)]
    vb = ir.VectorType(_BFloat(), 32)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vb, [vf, vf]),
                                        "llvm.x86.avx512bf16.cvtne2ps2bf16.512")
    bits = builder.bitcast(builder.call(fn, [vals[1], vals[0]]), ir.VectorType(_I16, 32))
    builder.store(bits, builder.bitcast(builder.gep(pd, [off]),
                                        ir.VectorType(_I16, 32).as_pointer()), align=2)


def _store_block(builder, store, pout):
    """C tiles 0-3 (a 32 x 32 float32 block, :data:`_CTS`) stored to the stack block
    ``pout``, rows 128 bytes apart."""
    for t, (r, j) in enumerate(_CTS):
        builder.call(store, [_tile(t), builder.gep(pout, [_k(4 * (32 * r + j))]), _k(128)])


def void_call(build, nargs):
    """``(signature, codegen)`` of an intrinsic that takes ``nargs`` integers (addresses,
    counts) and returns nothing, its code ``build(builder, args)``: the kernel modules
    declare their own ``@intrinsic`` functions, whose bodies are one call here."""
    def codegen(context, builder, signature, args):
        build(builder, args)
        return context.get_dummy_value()

    return types.void(*[types.intp] * nargs), codegen


def config_tiles(builder, args=()):
    """``ldtilecfg``: palette 1, eight tiles of 16 rows x 64 bytes (this thread's tiles,
    zeroed)."""
    cfg = cgutils.alloca_once(builder, ir.ArrayType(_I8, 64))
    builder.store(ir.Constant(ir.ArrayType(_I8, 64), None), cfg)
    p = builder.bitcast(cfg, _P8)
    builder.store(ir.Constant(_I8, 1), p)
    for t in range(8):
        colsb = builder.bitcast(builder.gep(p, [ir.Constant(_I32, 16 + 2 * t)]),
                                _I16.as_pointer())
        builder.store(ir.Constant(_I16, 64), colsb)
        builder.store(ir.Constant(_I8, 16), builder.gep(p, [ir.Constant(_I32, 48 + t)]))
    builder.call(_fn(builder, "llvm.x86.ldtilecfg", [_P8]), [p])


def release_tiles(builder, args=()):
    """``tilerelease``: this thread's tiles back to their initial state (no AMX state for
    the operating system to save at a context switch)."""
    builder.call(_fn(builder, "llvm.x86.tilerelease", []), [])


def gemm_tile(builder, args):
    """``C[:MR, :NR] (+)= A[:MR, :2*k2] @ B[:2*k2, :NR]`` on AMX tiles, with
    ``bf16dot._micro``'s arguments: ``a`` the address of A's first pair (rows ``lda``
    pairs apart), ``b`` of a packed panel (``k2`` rows of ``NR`` pairs), ``c`` of C's first
    element (rows ``ldc`` floats apart); ``beta`` bit 0 adds to what C holds, bit 1 rounds
    the sum to bfloat16 bits at ``d`` (rows ``ldd`` elements apart) instead of storing it
    to C. The last ``k2 % 16`` pairs go through zero-padded copies of A's and B's rows (a
    tile reads 16 pairs; past the block lie other values, which may be Inf or NaN).
    Rounded by ``vcvtne2ps2bf16`` (:func:`_round_row`)."""
    a, lda, b, c, ldc, k2, beta, d, ldd = args
    f32 = ir.FloatType()
    vf = ir.VectorType(f32, 16)
    load, store, zero, dot = _tile_ops(builder)
    k = _k

    pa = builder.inttoptr(a, _P8)
    pb = builder.inttoptr(b, _P8)
    pc = builder.inttoptr(c, _P8)
    pd = builder.inttoptr(d, _I16.as_pointer())
    sa = builder.mul(lda, k(4))  # bytes between A's rows
    sc = builder.mul(ldc, k(4))
    a16 = builder.mul(sa, k(16))  # A's second 16 rows
    whole = builder.udiv(k2, k(KSTEP))
    rest = builder.sub(k2, builder.mul(whole, k(KSTEP)))
    tail = builder.icmp_signed(">", rest, k(0))
    add = builder.icmp_signed("!=", builder.and_(beta, k(1)), k(0))
    rnd = builder.icmp_signed("!=", builder.and_(beta, k(2)), k(0))
    # zero-padded copies of the last rest pairs: A's 32 rows, a half panel of B
    at = cgutils.alloca_once(builder, ir.ArrayType(_I32, MR * KSTEP))
    bt = cgutils.alloca_once(builder, ir.ArrayType(_I32, KSTEP * 32))
    out = cgutils.alloca_once(builder, ir.ArrayType(f32, MR * 32))
    pat = builder.bitcast(at, _I32.as_pointer())
    pbt = builder.bitcast(bt, _I32.as_pointer())
    pout = builder.bitcast(out, _P8)
    pa32 = builder.bitcast(pa, _I32.as_pointer())
    pb32 = builder.bitcast(pb, _I32.as_pointer())
    k0 = builder.mul(whole, k(KSTEP))
    with builder.if_then(tail):
        builder.store(ir.Constant(ir.ArrayType(_I32, MR * KSTEP), None), at)
        with cgutils.for_range(builder, k(MR)) as li:
            with cgutils.for_range(builder, rest) as lp:
                src = builder.add(builder.mul(li.index, lda), builder.add(k0, lp.index))
                dst = builder.add(builder.mul(li.index, k(KSTEP)), lp.index)
                builder.store(builder.load(builder.gep(pa32, [src]), align=4),
                              builder.gep(pat, [dst]))
    for h in range(2):  # the two 32-column halves of the tile
        col = 32 * h

        def c_at(r, j):
            return builder.gep(pc, [builder.add(builder.mul(sc, k(r)), k(4 * (col + j)))])

        with builder.if_else(add) as (then, otherwise):
            with then:
                for t, (r, j) in enumerate(_CTS):
                    builder.call(load, [_tile(t), c_at(r, j), sc])
            with otherwise:
                for t in range(4):
                    builder.call(zero, [_tile(t)])
        with cgutils.for_range(builder, whole) as loop:
            ao = builder.mul(loop.index, k(4 * KSTEP))
            bo = builder.add(builder.mul(loop.index, k(4 * KSTEP * NR)), k(4 * col))
            _step(builder, load, dot,
                  (builder.gep(pa, [ao]), builder.gep(pa, [builder.add(ao, a16)])), sa,
                  (builder.gep(pb, [bo]), builder.gep(pb, [builder.add(bo, k(64))])),
                  k(4 * NR))
        with builder.if_then(tail):
            builder.store(ir.Constant(ir.ArrayType(_I32, KSTEP * 32), None), bt)
            with cgutils.for_range(builder, rest) as lp:
                with cgutils.for_range(builder, k(32)) as lj:
                    src = builder.add(builder.mul(builder.add(k0, lp.index), k(NR)),
                                      builder.add(lj.index, k(col)))
                    dst = builder.add(builder.mul(lp.index, k(32)), lj.index)
                    builder.store(builder.load(builder.gep(pb32, [src]), align=4),
                                  builder.gep(pbt, [dst]))
            pat8, pbt8 = builder.bitcast(pat, _P8), builder.bitcast(pbt, _P8)
            _step(builder, load, dot, (pat8, builder.gep(pat8, [k(4 * KSTEP * 16)])),
                  k(4 * KSTEP), (pbt8, builder.gep(pbt8, [k(64)])), k(128))
        with builder.if_else(rnd) as (then, otherwise):
            with then:  # through the stack: rounded rows of 16 into D
                _store_block(builder, store, pout)
                pf = builder.bitcast(out, vf.as_pointer())
                with cgutils.for_range(builder, k(MR)) as li:
                    _round_row(builder, pf, li.index,
                               builder.add(builder.mul(li.index, ldd), k(col)), pd)
            with otherwise:
                for t, (r, j) in enumerate(_CTS):
                    builder.call(store, [_tile(t), c_at(r, j), sc])


def taps_tile(builder, args):
    """``C[:MR, :NR] = sum_t A_t @ B_t`` rounded to bfloat16 into D's rows: ``A_t`` the
    ``MR`` rows of ``2*k2`` bfloat16 at ``a + offs[t]*lda*4`` bytes (rows ``lda`` pairs
    apart; ``offs`` the address of an int64 array of ``ntaps`` row offsets), ``B_t`` the
    ``k2`` rows of a packed panel from ``b + t*k2*NR*4`` bytes; row ``i`` of C goes to the
    ``NR`` bfloat16 at ``d + rows[i]*2`` bytes (``rows`` the address of ``MR`` int64), or
    nowhere where ``rows[i]`` is negative. ``k2`` is a multiple of 16 (the entry's rule).
    The panel is tile-major (each block of 16 rows four 1 KiB tiles of 16 columns one after
    the other, :func:`tile_major`); rounded by ``vcvtne2ps2bf16`` (:func:`_round_row`)."""
    a, lda, offs, ntaps, b, k2, rows, d = args
    f32 = ir.FloatType()
    vf = ir.VectorType(f32, 16)
    load, store, zero, dot = _tile_ops(builder)
    k = _k

    pa = builder.inttoptr(a, _P8)
    pb = builder.inttoptr(b, _P8)
    pd = builder.inttoptr(d, _I16.as_pointer())
    po = builder.inttoptr(offs, _I64.as_pointer())
    pr = builder.inttoptr(rows, _I64.as_pointer())
    sa = builder.mul(lda, k(4))
    a16 = builder.mul(sa, k(16))
    steps = builder.udiv(k2, k(KSTEP))
    tapb = builder.mul(k2, k(4 * NR))  # bytes of a tap's rows of the panel
    out = cgutils.alloca_once(builder, ir.ArrayType(f32, MR * 32))
    pout = builder.bitcast(out, _P8)
    for h in range(2):
        col = 32 * h
        for t in range(4):
            builder.call(zero, [_tile(t)])
        with cgutils.for_range(builder, ntaps) as lt:
            at = builder.gep(pa, [builder.mul(builder.load(builder.gep(po, [lt.index])),
                                              sa)])
            # this half's two tiles of each 16-row block (1 KiB tiles, rows 64 bytes apart)
            bt = builder.gep(pb, [builder.add(builder.mul(lt.index, tapb), k(2048 * h))])
            with cgutils.for_range(builder, steps) as ls:
                ao = builder.mul(ls.index, k(4 * KSTEP))
                bo = builder.mul(ls.index, k(4 * KSTEP * NR))
                _step(builder, load, dot,
                      (builder.gep(at, [ao]), builder.gep(at, [builder.add(ao, a16)])), sa,
                      (builder.gep(bt, [bo]), builder.gep(bt, [builder.add(bo, k(1024))])),
                      k(64))
        _store_block(builder, store, pout)
        pf = builder.bitcast(out, vf.as_pointer())
        with cgutils.for_range(builder, k(MR)) as li:
            dst = builder.load(builder.gep(pr, [li.index]))
            with builder.if_then(builder.icmp_signed(">=", dst, k(0))):
                _round_row(builder, pf, li.index, builder.add(dst, k(col)), pd)


#: Linux's ``arch_prctl`` system call on x86-64, its request for permission to use an
#: extended state component, and AMX's tile data component.
_SYS_ARCH_PRCTL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_GRANTED = []


def host_has_amx():
    """Whether the CPU has AMX tiles with bfloat16 products (LLVM's host features)."""
    return "amx-tile" in _host.FEATURES and "amx-bf16" in _host.FEATURES


def request_amx():
    """Whether this process may use AMX's tiles: on Linux the kernel grants the (8 KiB)
    tile state on request, once per process (asked once, the answer kept); elsewhere, or
    where the request fails, False (the entry then declines)."""
    if not _GRANTED:
        ok = False
        if host_has_amx():
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                ok = libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL),
                                  ctypes.c_long(_ARCH_REQ_XCOMP_PERM),
                                  ctypes.c_long(_XFEATURE_XTILEDATA)) == 0
            except (OSError, AttributeError):
                ok = False
        _GRANTED.append(ok)
    return _GRANTED[0]


def wgrad_tile(builder, args):
    """``C[:MR, :NR] += A[:MR, :2*k2] @ B[:2*k2, :NR]`` for a weight gradient's blocks: ``a``
    the address of A's first pair (rows ``lda`` pairs apart), ``b`` of B's first pair-row
    (pair-rows ``ldb`` words apart: dY paired along pixels, as it is), ``c`` of a float32
    block (rows ``ldc`` floats apart) read and written back. ``k2`` is a multiple of 16
    (the caller pads the reduction with zeros). B is tile-major (each block of 16
    pair-rows ``ldb/16`` tiles of 16 x 16 words one after the other; ``b`` the address of
    the block's first tile of these columns)."""
    a, lda, b, ldb, c, ldc, k2 = args
    load, store, _, dot = _tile_ops(builder)
    k = _k

    pa = builder.inttoptr(a, _P8)
    pb = builder.inttoptr(b, _P8)
    pc = builder.inttoptr(c, _P8)
    sa = builder.mul(lda, k(4))
    sb = builder.mul(ldb, k(4))
    sc = builder.mul(ldc, k(4))
    a16 = builder.mul(sa, k(16))
    b16 = builder.mul(sb, k(16))
    steps = builder.udiv(k2, k(KSTEP))
    for h in range(2):
        col = 32 * h

        def c_at(r, j):
            return builder.gep(pc, [builder.add(builder.mul(sc, k(r)), k(4 * (col + j)))])

        for t, (r, j) in enumerate(_CTS):
            builder.call(load, [_tile(t), c_at(r, j), sc])
        with cgutils.for_range(builder, steps) as ls:
            ao = builder.mul(ls.index, k(4 * KSTEP))
            bo = builder.add(builder.mul(ls.index, b16), k(64 * col))
            _step(builder, load, dot,
                  (builder.gep(pa, [ao]), builder.gep(pa, [builder.add(ao, a16)])), sa,
                  (builder.gep(pb, [bo]), builder.gep(pb, [builder.add(bo, k(1024))])), k(64))
        for t, (r, j) in enumerate(_CTS):
            builder.call(store, [_tile(t), c_at(r, j), sc])


def tile_major(bp):
    """Packed panels ``[npan, R, NR]`` (``R`` a multiple of 16) rearranged so that each
    block of 16 rows is four 16 x 16 tiles of words one after the other (a tile loads 1 KiB
    of consecutive bytes instead of 16 rows 256 bytes apart), in the same shape."""
    n, r, w = bp.shape
    return bp.reshape(n, r // 16, 16, w // 16, 16).transpose(0, 1, 3, 2, 4).copy().reshape(
        n, r, w)


def ensure_amx():
    """Ask for AMX's state (once per process) before any tile instruction runs: a process
    that runs a plan made elsewhere (the warm-up's workers, started afresh) has not asked
    yet, and a tile instruction without the grant kills it (SIGILL). Where the request
    fails, a RuntimeError instead."""
    if not request_amx():
        raise RuntimeError("numbaconv: this process was not granted AMX's tile state "
                           "(arch_prctl); plan again here, where the AMX entries decline")
