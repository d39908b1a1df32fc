"""LLVM IR builders shared by the kernel modules that write their inner loops as IR (through
``numba.extending.intrinsic``): vector types, FMA, masked and float16 loads and stores,
tables of offsets.

Plain Python that runs while a kernel compiles, no jitted code (the sharing rule of
:mod:`numbaconv.kernels`): what these emit is compiled into each caller, so after editing
this file clear Numba's cache (its callers' files, which key the cache, did not change).
"""
from llvmlite import ir
from numba.core import cgutils, types

from numbaconv.kernels.cpu._host import VECTOR_BYTES


def ir_types(context, dtype):
    f = context.get_value_type(dtype)
    vl = VECTOR_BYTES // context.get_abi_sizeof(f)
    return f, ir.VectorType(f, vl), vl


def fma_fn(builder, ty, dtype, vl):
    suffix = "f32" if dtype == types.float32 else "f64"
    name = ("llvm.fma.v%d%s" % (vl, suffix)) if vl > 1 else ("llvm.fma." + suffix)
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3), name)


def table(builder, addr, n):
    """``n`` int64 loaded from the address ``addr``."""
    i64 = ir.IntType(64)
    p = builder.inttoptr(addr, i64.as_pointer())
    return [builder.load(builder.gep(p, [ir.Constant(i64, k)])) for k in range(n)]


def at(builder, base, off, ty):
    """Pointer to a ``ty`` at element ``off`` of the float pointer ``base``."""
    p = builder.gep(base, [off])
    return p if ty is base.type.pointee else builder.bitcast(p, ty.as_pointer())


def beta_store(builder, beta):
    """``(store, add)`` for a register tile's stores as its ``beta`` (int64) says:
    ``store(value, ptr)`` adds the vector to what is at ``ptr`` (``beta`` 1), stores it
    (0), or streams it past the caches (2: non-temporal, ``ptr`` on a vector boundary, no
    read for ownership); ``add`` is the ``beta == 1`` predicate, for a caller's own
    (masked) stores."""
    i64 = ir.IntType(64)
    add = builder.icmp_signed("==", beta, ir.Constant(i64, 1))
    plain = builder.icmp_signed("==", beta, ir.Constant(i64, 0))
    stream = builder.icmp_signed("==", beta, ir.Constant(i64, 2))
    nontemporal = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])

    def store(val, p):
        with builder.if_then(add):
            builder.store(builder.fadd(val, builder.load(p, align=1)), p, align=1)
        with builder.if_then(plain):
            builder.store(val, p, align=1)
        with builder.if_then(stream):
            st = builder.store(val, p, align=VECTOR_BYTES)
            st.set_metadata("nontemporal", nontemporal)

    return store, add


class _BFloat(ir.Type):
    """LLVM's ``bfloat`` (llvmlite has no such type): ``vdpbf16ps``'s operand type."""

    def _to_string(self):
        return "bfloat"

    def __eq__(self, other):
        return isinstance(other, _BFloat)

    def __hash__(self):
        return hash("bfloat")


def dpbf16(builder):
    """``(dot, vb)``: AVX512_BF16's ``vdpbf16ps`` on 512-bit vectors
    (``llvm.x86.avx512bf16.dpbf16ps.512``: 16 float32 accumulators, two vectors of 32
    bfloat16 read as 16 pairs each) and its operand type ``vb`` (``<32 x bfloat>``, what a
    vector of 16 ``i32`` pairs is bitcast to)."""
    vf = ir.VectorType(ir.FloatType(), 16)
    vb = ir.VectorType(_BFloat(), 32)
    dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vb, vb]),
                                         "llvm.x86.avx512bf16.dpbf16ps.512")
    return dot, vb


def bf16_round(builder, u):
    """bfloat16 bits (``i16``, or a vector of them) of the float32 bits ``u`` (``i32`` or a
    vector): round to nearest, ties to even, by adding ``0x7fff`` plus the lowest kept bit
    and keeping the upper half (an overflow carries into the exponent and gives Inf, as it
    should); a NaN keeps its upper half with the quiet bit set (one whose payload lies in
    the lower half would otherwise round to Inf). Integer operations only."""
    ty = u.type
    width = ty.count if isinstance(ty, ir.VectorType) else 0

    def c32(v):
        k = ir.Constant(ir.IntType(32), v)
        return ir.Constant(ty, [k] * width) if width else k

    hi = builder.lshr(u, c32(16))
    rounded = builder.lshr(builder.add(builder.add(u, c32(0x7FFF)), builder.and_(hi, c32(1))),
                           c32(16))
    nan = builder.icmp_unsigned(">", builder.and_(u, c32(0x7FFFFFFF)), c32(0x7F800000))
    val = builder.select(nan, builder.or_(hi, c32(0x40)), rounded)
    return builder.trunc(val, ir.VectorType(ir.IntType(16), width) if width else ir.IntType(16))


def transpose(builder, rows):
    """The columns of the matrix whose rows are the vectors ``rows`` (a power-of-two
    count, one length): element ``j`` of row ``i`` is element ``i`` of column ``j``. By
    shuffles: a tree of concatenations into one vector, then one shuffle per column."""
    i32 = ir.IntType(32)
    n, width = len(rows), rows[0].type.count
    vecs, w = list(rows), width
    while len(vecs) > 1:
        cat = ir.Constant(ir.VectorType(i32, 2 * w), list(range(2 * w)))
        vecs = [builder.shuffle_vector(vecs[k], vecs[k + 1], cat)
                for k in range(0, len(vecs), 2)]
        w *= 2
    big = vecs[0]
    undef = ir.Constant(big.type, ir.Undefined)
    return [builder.shuffle_vector(big, undef, ir.Constant(ir.VectorType(i32, n),
                                                           [i * width + j for i in range(n)]))
            for j in range(width)]


def transpose_block(builder, src, lds, dst, ldd, vt, align):
    """A square block of ``vt``'s lanes a side transposed in registers (:func:`transpose`):
    row ``r`` loaded from address ``src + r*lds`` bytes, column ``c`` stored to ``dst +
    c*ldd`` bytes, one vector of ``vt`` each (``align``: their alignment in bytes)."""
    i8, i64 = ir.IntType(8), ir.IntType(64)
    ps = builder.inttoptr(src, i8.as_pointer())
    pd = builder.inttoptr(dst, i8.as_pointer())
    rows = [builder.load(builder.bitcast(builder.gep(ps, [builder.mul(lds, ir.Constant(
        i64, r))]), vt.as_pointer()), align=align) for r in range(vt.count)]
    for c, col in enumerate(transpose(builder, rows)):
        at = builder.gep(pd, [builder.mul(ldd, ir.Constant(i64, c))])
        builder.store(col, builder.bitcast(at, vt.as_pointer()), align=align)


def _iota_splat(builder, v, vl):
    """``(iota, splat)``: ``<vl x i64>`` vectors ``0 .. vl - 1`` and ``v`` in every lane."""
    i64 = ir.IntType(64)
    vi = ir.VectorType(i64, vl)
    iota = ir.Constant(vi, [ir.Constant(i64, i) for i in range(vl)])
    splat = builder.shuffle_vector(
        builder.insert_element(ir.Constant(vi, ir.Undefined), v, ir.Constant(ir.IntType(32), 0)),
        ir.Constant(vi, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), vl), None))
    return iota, splat


def lane_mask(builder, n, vl):
    """``<vl x i1>``: lanes ``0 .. n - 1`` on, for the channels beyond the last whole vector."""
    iota, splat = _iota_splat(builder, n, vl)
    return builder.icmp_signed("<", iota, splat)


def lane_range(builder, lo, hi, vl):
    """``<vl x i1>``: lanes ``lo .. hi - 1`` on. Masked-off lanes are neither loaded nor
    stored (``llvm.masked.load``/``store``), so they may lie outside the operand."""
    iota, low = _iota_splat(builder, lo, vl)
    _, high = _iota_splat(builder, hi, vl)
    return builder.and_(builder.icmp_signed(">=", iota, low), builder.icmp_signed("<", iota, high))


def masked_io(builder, vty, vl):
    """``load(ptr, mask)`` and ``store(value, ptr, mask)`` of ``vty`` (no mask: plain);
    ``vty`` a vector of float, double or i16 (float16 bits)."""
    elem = vty.element
    name = ("f32" if isinstance(elem, ir.FloatType) else
            "f64" if isinstance(elem, ir.DoubleType) else "i%d" % elem.width)
    suffix = "v%d%s" % (vl, name)
    mty = ir.VectorType(ir.IntType(1), vl)
    vp = vty.as_pointer()
    mload = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vty, [vp, ir.IntType(32), mty, vty]),
        "llvm.masked.load.%s.p0" % suffix)
    mstore = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [vty, vp, ir.IntType(32), mty]),
        "llvm.masked.store.%s.p0" % suffix)
    one = ir.Constant(ir.IntType(32), 1)
    zero = ir.Constant(vty, None)

    def load(ptr, mask):
        if mask is None:
            return builder.load(ptr, align=1)
        return builder.call(mload, [ptr, one, mask, zero])

    def store(value, ptr, mask):
        if mask is None:
            builder.store(value, ptr, align=1)
        else:
            builder.call(mstore, [value, ptr, one, mask])

    return load, store


def half_io(builder, vl):
    """``load(ptr, mask)`` -> ``<vl x float>`` from float16 bits at ``ptr`` (a ``<vl x i16>``
    pointer) and ``store(value, ptr, mask)`` rounding a ``<vl x float>`` to them: the
    float16 conversion fused into a kernel's loads and stores (``fpext``/``fptrunc``, which
    F16C turns into ``vcvtph2ps``/``vcvtps2ph``, round to nearest even, as NumPy's casts)."""
    ity = ir.VectorType(ir.IntType(16), vl)
    hty = ir.VectorType(ir.HalfType(), vl)
    fty = ir.VectorType(ir.FloatType(), vl)
    raw_load, raw_store = masked_io(builder, ity, vl)

    def load(ptr, mask):
        return builder.fpext(builder.bitcast(raw_load(ptr, mask), hty), fty)

    def store(value, ptr, mask):
        raw_store(builder.bitcast(builder.fptrunc(value, hty), ity), ptr, mask)

    return load, store


class Operand:
    """One operand of an IR kernel at the integer address ``addr``: ``load(off, mask)``
    and ``store(value, off, mask)`` of the compute vector ``vty`` at element ``off``, the
    storage either ``vty``'s own element type or, when ``half``, float16 bits widened on
    load and rounded on store (see :func:`half_io`)."""

    def __init__(self, builder, addr, vty, vl, half=False):
        self.builder = builder
        if half:
            elem = ir.IntType(16)
            self.sty = ir.VectorType(elem, vl)
            self._load, self._store = half_io(builder, vl)
        else:
            elem = vty.element
            self.sty = vty
            self._load, self._store = masked_io(builder, vty, vl)
        self.ptr = builder.inttoptr(addr, elem.as_pointer())

    def load(self, off, mask):
        return self._load(at(self.builder, self.ptr, off, self.sty), mask)

    def store(self, value, off, mask):
        self._store(value, at(self.builder, self.ptr, off, self.sty), mask)


def compute_type(dtype):
    """``(compute dtype, half)`` of a kernel whose data arrays have element type
    ``dtype``: uint16 arrays are float16 bits computed in float32."""
    if dtype == types.uint16:
        return types.float32, True
    return dtype, False


def store_pair_columns(builder, rows, dst, ldd):
    """32 rows of 16 bfloat16 bits (``rows``: ``<16 x i16>`` vectors, pixels) transposed in
    registers and stored: rows ``2p`` and ``2p+1`` are interleaved into 32-bit words, the
    16 x 16 matrix of words is transposed with vector shuffles (no element moves alone),
    and column ``c`` (channel ``c``'s 16 pairs) is stored at the address ``dst + c*ldd``
    bytes (``dst``, ``ldd``: int64)."""
    i32, i64 = ir.IntType(32), ir.IntType(64)
    n = rows[0].type.count
    inter = ir.Constant(ir.VectorType(i32, 2 * n), [k for c in range(n) for k in (c, n + c)])
    words = [builder.bitcast(builder.shuffle_vector(rows[2 * p], rows[2 * p + 1], inter),
                             ir.VectorType(i32, n)) for p in range(len(rows) // 2)]
    pd = builder.inttoptr(dst, ir.IntType(8).as_pointer())
    vout = ir.VectorType(i32, len(rows) // 2)
    for c, col in enumerate(transpose(builder, words)):
        at = builder.gep(pd, [builder.mul(ldd, ir.Constant(i64, c))])
        builder.store(col, builder.bitcast(at, vout.as_pointer()), align=2)
