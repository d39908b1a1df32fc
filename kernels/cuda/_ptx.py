"""Shared by the CUDA GEMM kernel modules (:mod:`.gemm`, :mod:`.tf32`): the typing and code
generation of their inline-PTX intrinsics, the features of the numba CUDA target they
compile for, the simulator's Python twins of the intrinsics, and the stride-phase
geometry of backward data (:func:`axis_phase`, host Python).

Plain Python, no jitted code (the sharing rule of :mod:`numbaconv.kernels`): each kernel
module declares its own ``@intrinsic`` functions, whose bodies are one call here
(``return _ptx.vector_load(16, a, i)``), so the code they emit is compiled into that
module's kernels only.

Each builder takes the intrinsic's argument types and returns ``(signature, codegen)``, or
None where the types do not fit (numba then reports no matching implementation).
"""
import inspect

from numba import config as _nconfig
from numba import cuda

#: Elements per 16-byte word.
WIDTH = {"float32": 4, "float64": 2}

SIM = bool(_nconfig.ENABLE_CUDASIM)


def _takes(fn, name):
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False


#: Alignment (bytes) of the shared tiles read by 16-byte loads; None in the simulator,
#: which does not take the ``alignment=`` argument of ``cuda.shared.array``.
ALIGN = None if SIM else 16
#: Whether 16-byte shared loads are used: the simulator (same results), and numba-cuda,
#: whose ``cuda.shared.array`` takes ``alignment=``; numba's own older CUDA target does
#: not, and its kernels read shared memory one element at a time.
VECTOR = ALIGN is None or _takes(cuda.shared.array, "alignment")
#: Whether ``cuda.jit`` takes ``launch_bounds=`` (numba-cuda).
LAUNCH_BOUNDS = ALIGN is not None and _takes(cuda.jit, "launch_bounds")


def index_type(*sizes):
    """int32 for the kernels' per-thread offsets where every array of the problem has fewer
    than 2**31 elements (half the registers of int64), else int64."""
    from numba import int32, int64
    return int32 if max(sizes) < 2 ** 31 else int64


def axis_phase(q, s, d, p, k, n_in):
    """One axis of stride phase ``q``: ``(t0, tstep, nt, c0, ostep, j0, nj)``.

    Taps ``t0 + u*tstep`` (``u < nt``) feed the inputs ``i = s*j + q - p``
    (``j0 <= j < j0 + nj``) from outputs ``o = j - c0 - u*ostep``: the planner sizes
    backward data's grid with it, and backward data's kernels take the table of
    :func:`phase_table` as a constant.
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


def phase_table(geo):
    """Per stride phase ``q`` of backward data (``q_d, q_h, q_w`` row-major) of the 22-int
    geometry ``geo``: :func:`axis_phase` of the depth, height and width axes, flattened (21
    ints). Backward data's GEMM kernels take it as a compile-time constant and read their
    block's phase from it."""
    (mb, g, icg, ocg, id_, ih, iw, kd, kh, kw, od, oh, ow, sd, sh, sw, dd, dh, dw, pd, ph,
     pw) = geo
    return tuple(
        sum((axis_phase(qa, s, d, pa, k, n) for qa, s, d, pa, k, n in zip(
            (q // (sw * sh), (q // sw) % sh, q % sw), (sd, sh, sw), (dd, dh, dw),
            (pd, ph, pw), (kd, kh, kw), (id_, ih, iw))), ())
        for q in range(sd * sh * sw))


# -- the simulator's twins -------------------------------------------------------------------
def load16_py(a, i):
    if a.dtype.itemsize == 4:
        return (a[i], a[i + 1], a[i + 2], a[i + 3])
    return (a[i], a[i + 1])


def load8_py(a, i):
    return (a[i], a[i + 1])


def store16_py(a, i, v):
    for q in range(len(v)):
        a[i + q] = v[q]


def tf32_round_py(v):
    """``cvt.rna.tf32.f32`` in NumPy: round the magnitude's bits at bit 13, ties away."""
    import numpy as np
    b = np.asarray(v, np.float32).view(np.uint32)
    exp_all_ones = (b & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    r = np.where(exp_all_ones, b, (b + np.uint32(0x1000)) & np.uint32(0xFFFFE000))
    out = r.astype(np.uint32).view(np.float32)
    return out if out.shape else np.float32(out[()])


# -- intrinsic builders (not used under the simulator) ---------------------------------------
def _ir():
    from llvmlite import ir
    from numba import types
    return ir, types


def _element_pointer(context, builder, aty, arg, idx, ity):
    """Pointer to element ``idx`` of the 1-D array ``arg`` (type ``aty``)."""
    _, types = _ir()
    ary = context.make_array(aty)(context, builder, arg)
    i = context.cast(builder, idx, ity, types.intp)
    elt = context.get_data_type(aty.dtype)
    return builder.gep(builder.bitcast(ary.data, elt.as_pointer()), [i], inbounds=True)


def _shared_address(builder, ptr):
    """The 32-bit shared-state-space address of the generic pointer ``ptr``."""
    ir, _ = _ir()
    sh = builder.addrspacecast(ptr, ir.PointerType(ptr.type.pointee, 3))
    return builder.trunc(builder.ptrtoint(sh, ir.IntType(64)), ir.IntType(32))


def _float_array(a, ndim=1, contiguous=True):
    _, types = _ir()
    return (isinstance(a, types.Array) and a.ndim == ndim and (a.layout == "C" or not contiguous)
            and a.dtype in (types.float32, types.float64))


def vector_load(nbytes, a, i):
    """``(a[i], a[i+1], ...)``: ``nbytes`` (16 or 8) bytes of a 1-D C-contiguous float array
    as one vector load (``LDS.128``/``LDS.64`` in shared memory; ``i`` aligned to
    ``nbytes``)."""
    ir, types = _ir()
    if not (_float_array(a) and isinstance(i, types.Integer) and nbytes * 8 >= a.dtype.bitwidth):
        return None
    n = nbytes * 8 // a.dtype.bitwidth
    sig = types.UniTuple(a.dtype, n)(a, i)

    def codegen(context, builder, sig, args):
        aty, ity = sig.args
        ptr = _element_pointer(context, builder, aty, args[0], args[1], ity)
        elt = context.get_data_type(aty.dtype)
        vec = builder.load(builder.bitcast(ptr, ir.VectorType(elt, n).as_pointer()),
                           align=nbytes)
        vals = [builder.extract_element(vec, ir.Constant(ir.IntType(32), k)) for k in range(n)]
        return context.make_tuple(builder, sig.return_type, vals)

    return sig, codegen


def store16(a, i, v):
    """``a[i:i + n] = v``: one 16-byte vector store of a tuple of 4 float32 (2 float64)."""
    ir, types = _ir()
    if not (_float_array(a) and isinstance(i, types.Integer) and isinstance(v, types.UniTuple)
            and v.dtype == a.dtype and v.count * a.dtype.bitwidth == 128):
        return None
    sig = types.void(a, i, v)

    def codegen(context, builder, sig, args):
        aty, ity, vty = sig.args
        ptr = _element_pointer(context, builder, aty, args[0], args[1], ity)
        elt = context.get_data_type(aty.dtype)
        vec = ir.Constant(ir.VectorType(elt, vty.count), ir.Undefined)
        for k in range(vty.count):
            vec = builder.insert_element(vec, builder.extract_value(args[2], k),
                                         ir.Constant(ir.IntType(32), k))
        builder.store(vec, builder.bitcast(ptr, vec.type.as_pointer()), align=16)
        return context.get_dummy_value()

    return sig, codegen


def _f32_asm(v, text):
    """A float32 -> float32 intrinsic of one inline-PTX statement ``text`` (``$0`` the b32
    result, ``$1`` the f32 operand)."""
    ir, types = _ir()
    if v != types.float32:
        return None
    sig = types.float32(v)

    def codegen(context, builder, sig, args):
        asm = ir.InlineAsm(ir.FunctionType(ir.IntType(32), [ir.FloatType()]), text, "=r,f",
                           side_effect=False)
        return builder.bitcast(builder.call(asm, [args[0]]), ir.FloatType())

    return sig, codegen


def tf32_round(v):
    """``v`` rounded to TF32 (10 explicit mantissa bits, to nearest, ties away from zero:
    ``cvt.rna.tf32.f32``), as a float32 whose low 13 bits are zero."""
    return _f32_asm(v, "cvt.rna.tf32.f32 $0, $1;")


def tf32_round_hi(v):
    """``v``'s bits plus half a TF32 unit (0x1000) where ``v`` is finite, Inf and NaN
    unchanged: the tensor cores read the top 19 bits of a TF32 operand, so the product sees
    ``cvt.rna.tf32.f32`` of ``v`` (two instructions instead of three: no final mask)."""
    return _f32_asm(v, "{ .reg .pred p; .reg .f32 a; abs.f32 a, $1; "
                       "setp.lt.f32 p, a, 0f7F800000; mov.b32 $0, $1; "
                       "@p add.s32 $0, $0, 4096; }")


def mma_tf32(*args):
    """One warp-wide ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`` (D = A . B +
    C): arguments ``a0 a1 a2 a3 b0 b1 c0 c1 c2 c3`` (float32, the lane's fragments as the
    PTX ISA lays them out), result the lane's four elements of D."""
    ir, types = _ir()
    if len(args) != 10 or any(a != types.float32 for a in args):
        return None
    sig = types.UniTuple(types.float32, 4)(*args)

    def codegen(context, builder, sig, args):
        f32, i32 = ir.FloatType(), ir.IntType(32)
        ab = [builder.bitcast(v, i32) for v in args[:6]]  # TF32 bits in b32 registers
        fty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
        asm = ir.InlineAsm(
            fty, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
            "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
            "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", side_effect=False)
        d = builder.call(asm, ab + list(args[6:]))
        return context.make_tuple(builder, sig.return_type,
                                  [builder.extract_value(d, k) for k in range(4)])

    return sig, codegen


def cp_async(size, dst, di, src, si, n):
    """``cp.async`` of ``size`` bytes (16: ``.cg``, or 4: ``.ca``) from the float32 array
    ``src`` at element ``si`` to the shared float32 array ``dst`` at ``di``: the first
    ``n`` bytes of it (``size`` or 0), the rest zeros."""
    ir, types = _ir()
    if not (all(isinstance(a, types.Array) and a.ndim == 1 and a.dtype == types.float32
                for a in (dst, src))
            and all(isinstance(v, types.Integer) for v in (di, si, n))):
        return None
    sig = types.void(dst, di, src, si, n)
    cache = "cg" if size == 16 else "ca"

    def codegen(context, builder, sig, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        d = _element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        s = _element_pointer(context, builder, sig.args[2], args[2], args[3], sig.args[3])
        nb = context.cast(builder, args[4], sig.args[4], types.int32)
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i64, i32]),
                           f"cp.async.{cache}.shared.global [$0], [$1], {size}, $2;",
                           "r,l,r,~{memory}", side_effect=True)
        builder.call(asm, [_shared_address(builder, d), builder.ptrtoint(s, i64), nb])
        return context.get_dummy_value()

    return sig, codegen


def statement(text):
    """A ``void()`` intrinsic of one inline-PTX statement with side effects on memory
    (``cp.async.commit_group;``, ``cp.async.wait_group N;``)."""
    ir, types = _ir()
    sig = types.void()

    def codegen(context, builder, sig, args):
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}",
                           side_effect=True)
        builder.call(asm, [])
        return context.get_dummy_value()

    return sig, codegen


def low_bits(a):
    """The low 4 bits of array ``a``'s data address (0: 16-byte aligned)."""
    ir, types = _ir()
    if not isinstance(a, types.Array):
        return None
    sig = types.int64(a)

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        v = builder.ptrtoint(ary.data, ir.IntType(64))
        return builder.and_(v, ir.Constant(ir.IntType(64), 15))

    return sig, codegen


def ldmatrix_x4(a, i):
    """``ldmatrix.sync.aligned.m8n8.x4.shared.b16`` with this lane's row at ``a[i]`` (one
    16-byte row of one of four 8x8 matrices of 16-bit elements, i.e. 8 rows of four 32-bit
    words): lane ``(g, t)`` receives word ``t`` of row ``g`` of each matrix."""
    ir, types = _ir()
    if not (isinstance(a, types.Array) and a.dtype == types.float32
            and isinstance(i, types.Integer)):
        return None
    sig = types.UniTuple(types.float32, 4)(a, i)

    def codegen(context, builder, sig, args):
        i32, f32 = ir.IntType(32), ir.FloatType()
        d = _element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        fty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32])
        asm = ir.InlineAsm(fty, "ldmatrix.sync.aligned.m8n8.x4.shared.b16 "
                           "{$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r,~{memory}",
                           side_effect=True)
        r = builder.call(asm, [_shared_address(builder, d)])
        vals = [builder.bitcast(builder.extract_value(r, k), f32) for k in range(4)]
        return context.make_tuple(builder, sig.return_type, vals)

    return sig, codegen
