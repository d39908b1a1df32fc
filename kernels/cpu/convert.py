"""float16 <-> float32 and bfloat16 <-> float32 conversion of whole arrays, in SIMD.

float16 operands are computed in float32 (docs/contract.md section 5): the backend widens
them once on the way in and rounds the result once on the way out. NumPy's casts between
the two run about half a billion elements a second here (3.2 M elements: 6.1 ms up,
10.2 ms down, against 1.4 ms for a float32 copy), which made float16 calls up to 8x
slower than float32 ones. Numba's CPU target has no float16 type, so the arrays are
handed over as ``uint16`` views and converted through LLVM's ``half`` type: ``fpext`` and
``fptrunc`` on 8-wide vectors, which x86's F16C turns into ``vcvtph2ps`` / ``vcvtps2ph``
(IEEE round-to-nearest-even, infinities, NaNs and subnormals exactly as NumPy's casts).

:func:`available` says whether the host has F16C; without it (LLVM would call a
soft-float helper the JIT may not link) the backend keeps NumPy's casts.

Each conversion comes serial and parallel. Around BLAS calls (GEMM and Winograd
strategies) the serial one runs: OpenBLAS's idle workers busy-wait on the cores for a
while after a call, and a parallel region there fought them (0.5 M elements: 3.9 ms in
parallel next to Winograd's GEMMs, 0.17 ms for 3.2 M alone); OpenMP's threads spin after a
parallel conversion likewise, against the Python worker threads of the GEMM strategy's
tasks. Around strategies that compute in Numba parallel regions alone
(``Strategy.numba_parallel``: the direct loop nests, the implicit GEMM, the rows variant,
the split-K weight gradient) the parallel one runs: MobileNet's dw576_14 backward data in
float16 took 0.60 ms with it, 1.52 ms with the serial one (float32: 0.47 ms); ResNet-50's
res4b_branch2a weight gradient 5.03 -> 4.09 ms, res2a_branch2a's 1.44 -> 1.24.
"""
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from numbaconv._jit import helper, kernel, separate
from numbaconv.kernels.cpu._host import F16C
from numbaconv.kernels.cpu._ir import bf16_round

#: Elements per SIMD step (one 256-bit vector of float32).
VL = 8
#: Elements per block of the loop (a multiple of VL).
BLOCK = 1 << 15


def available():
    """Whether this host converts in hardware (F16C)."""
    return F16C


def _converter(n, widen):
    """``n`` elements from the address ``src`` at element ``i`` to ``dst`` at element ``i``:
    uint16 (half bits) -> float32 when ``widen``, else float32 -> uint16."""

    @intrinsic
    def convert(typingctx, src, dst, i):
        sig = types.void(types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            s, d, idx = args
            half, f32, i16 = ir.HalfType(), ir.FloatType(), ir.IntType(16)
            if n == 1:
                hty, fty, ity = half, f32, i16
            else:
                hty, fty, ity = (ir.VectorType(half, n), ir.VectorType(f32, n),
                                 ir.VectorType(i16, n))
            if widen:
                p = builder.gep(builder.inttoptr(s, i16.as_pointer()), [idx])
                bits = builder.load(builder.bitcast(p, ity.as_pointer()), align=2)
                val = builder.fpext(builder.bitcast(bits, hty), fty)
                q = builder.gep(builder.inttoptr(d, f32.as_pointer()), [idx])
                builder.store(val, builder.bitcast(q, fty.as_pointer()), align=4)
            else:
                p = builder.gep(builder.inttoptr(s, f32.as_pointer()), [idx])
                val = builder.load(builder.bitcast(p, fty.as_pointer()), align=4)
                bits = builder.bitcast(builder.fptrunc(val, hty), ity)
                q = builder.gep(builder.inttoptr(d, i16.as_pointer()), [idx])
                builder.store(bits, builder.bitcast(q, ity.as_pointer()), align=2)
            return context.get_dummy_value()

        return sig, codegen

    return convert


_widen8, _widen1 = _converter(VL, True), _converter(1, True)
_narrow8, _narrow1 = _converter(VL, False), _converter(1, False)


@helper
def _convert(ps, pd, i, i1, up):
    """Elements ``i .. i1 - 1``: half bits -> float32 when ``up``, else float32 -> half."""
    while i + VL <= i1:
        if up:
            _widen8(ps, pd, i)
        else:
            _narrow8(ps, pd, i)
        i += VL
    while i < i1:
        if up:
            _widen1(ps, pd, i)
        else:
            _narrow1(ps, pd, i)
        i += 1


@kernel(parallel=False)
def convert(src, dst, up):
    """``dst[:] = float32(src)`` for ``src`` the uint16 bits of a float16 array when ``up``,
    else ``dst[:] = float16(src)`` (round to nearest even) as uint16 bits of a float32
    ``src``; both flat, C-contiguous, of one size."""
    _convert(src.ctypes.data, dst.ctypes.data, 0, src.size, up)


def convert_parallel(src, dst, up):
    """:func:`convert` in blocks of ``BLOCK`` elements on every thread."""
    _convert_block.run("up" if up else "down", (src.size + BLOCK - 1) // BLOCK, src, dst, up)


@separate("void({S}[::1], {D}[::1], boolean, int64)", noalias=True,
          up=dict(S="uint16", D="float32"), down=dict(S="float32", D="uint16"))
def _convert_block(src, dst, up, b):
    """Block ``b`` of :func:`convert_parallel`: float16 bits (``uint16``) -> float32 when
    ``up``, else float32 -> float16 bits."""
    _convert(src.ctypes.data, dst.ctypes.data, b * BLOCK, min(src.size, (b + 1) * BLOCK),
             up)


# -- bfloat16 -------------------------------------------------------------------------------------
# bfloat16 is the upper half of a float32: widening is a 16-bit shift of the bits, rounding
# is :func:`_ir.bf16_round` (round to nearest even, NaN kept; integer operations only: every
# host, no F16C needed).
# Written as vector IR on addresses, as the float16 converters: the same loops on arrays
# stayed scalar inside a parallel region (10x slower than the serial loop).

def _bf16_converter(n, widen):
    """``n`` elements from the address ``src`` at element ``i`` to ``dst`` at element ``i``:
    uint16 (bfloat16 bits) -> uint32 (float32 bits) when ``widen``, else the reverse,
    rounded."""

    @intrinsic
    def convert(typingctx, src, dst, i):
        sig = types.void(types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            s, d, idx = args
            i16, i32 = ir.IntType(16), ir.IntType(32)
            if n == 1:
                t16, t32 = i16, i32

                def c32(v):
                    return ir.Constant(i32, v)
            else:
                t16, t32 = ir.VectorType(i16, n), ir.VectorType(i32, n)

                def c32(v):
                    return ir.Constant(t32, [v] * n)
            if widen:
                p = builder.gep(builder.inttoptr(s, i16.as_pointer()), [idx])
                bits = builder.zext(builder.load(builder.bitcast(p, t16.as_pointer()),
                                                 align=2), t32)
                val = builder.shl(bits, c32(16))
                q = builder.gep(builder.inttoptr(d, i32.as_pointer()), [idx])
                builder.store(val, builder.bitcast(q, t32.as_pointer()), align=4)
            else:
                p = builder.gep(builder.inttoptr(s, i32.as_pointer()), [idx])
                u = builder.load(builder.bitcast(p, t32.as_pointer()), align=4)
                q = builder.gep(builder.inttoptr(d, i16.as_pointer()), [idx])
                builder.store(bf16_round(builder, u), builder.bitcast(q, t16.as_pointer()),
                              align=2)
            return context.get_dummy_value()

        return sig, codegen

    return convert


_bf_widen8, _bf_widen1 = _bf16_converter(VL, True), _bf16_converter(1, True)
_bf_round8, _bf_round1 = _bf16_converter(VL, False), _bf16_converter(1, False)


@helper
def _convert_bf16(ps, pd, i, i1, up):
    """Elements ``i .. i1 - 1``: bfloat16 bits -> float32 bits when ``up``, else rounded."""
    while i + VL <= i1:
        if up:
            _bf_widen8(ps, pd, i)
        else:
            _bf_round8(ps, pd, i)
        i += VL
    while i < i1:
        if up:
            _bf_widen1(ps, pd, i)
        else:
            _bf_round1(ps, pd, i)
        i += 1


@kernel(parallel=False)
def convert_bf16(src, dst, up):
    """``dst[:] = float32(src)`` for ``src`` the uint16 bits of a bfloat16 array and ``dst``
    the uint32 bits of a float32 one when ``up``, else ``dst[:] = bfloat16(src)`` (round
    to nearest even, NaN kept) from float32 bits to bfloat16 bits; flat, C-contiguous, of
    one size."""
    _convert_bf16(src.ctypes.data, dst.ctypes.data, 0, src.size, up)


def convert_bf16_parallel(src, dst, up):
    """:func:`convert_bf16` in blocks of ``BLOCK`` elements on every thread."""
    _convert_bf16_block.run("up" if up else "down", (src.size + BLOCK - 1) // BLOCK, src, dst, up)


@separate("void({S}[::1], {D}[::1], boolean, int64)", noalias=True,
          up=dict(S="uint16", D="uint32"), down=dict(S="uint32", D="uint16"))
def _convert_bf16_block(src, dst, up, b):
    """Block ``b`` of :func:`convert_bf16_parallel`: bfloat16 bits (``uint16``) -> float32
    bits (``uint32``) when ``up``, else float32 bits -> bfloat16 bits, rounded."""
    _convert_bf16(src.ctypes.data, dst.ctypes.data, b * BLOCK,
                  min(src.size, (b + 1) * BLOCK), up)
