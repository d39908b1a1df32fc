"""``gemm[bf16-amx]``: bfloat16 problems as ``gemm[bf16-dot]``'s GEMMs, on AMX tiles.

The same products as :mod:`.bf16dot` (im2col of the source, the filter packed into
panels of pairs, stride phases for backward data, x transposed for a 1x1 weight gradient),
with the micro-kernel of :mod:`numbaconv.kernels.cpu.bf16amx`: 32 x 64 tiles of C summed by
``tdpbf16ps``, 16 times the multiply-adds of one ``vdpbf16ps`` per instruction. On a host
with AMX (Intel Xeon from Sapphire Rapids on) it is the first bfloat16 entry: at 0.6-1.5
TFLOP/s on two cores its GEMM leaves the AVX512_BF16 entries and the float32 Winograd
entry far behind (docs/performance.md, "bfloat16"), so it declines only what
``gemm[bf16-dot]`` declines for its shape.
"""
from .bf16dot import Bf16Dot, dot_guards, shape_guards

R_AMX = "this host has no AMX tiles with bfloat16 products (amx-tile, amx-bf16)"
R_AMX_OS = "the operating system did not grant AMX's tile state to this process"

#: Pairs of the reduction per block and most rows per block: measured on 25088 x 576 x 64
#: to 2048^3 GEMMs (docs/performance.md, "bfloat16").
KC2 = 256
MAX_MC = 256


class Bf16Amx(Bf16Dot):
    variant = "bf16-amx"
    kc2 = KC2
    max_mc = MAX_MC

    def kernels(self):
        from ..kernels.cpu import bf16amx
        return bf16amx

    def accepts(self, p):
        why = dot_guards(p)
        if why is not None:
            return why
        from ..kernels.cpu import bf16amx
        if not bf16amx.host_has_amx():
            return R_AMX
        if not bf16amx.request_amx():
            return R_AMX_OS
        return shape_guards(p)


STRATEGY = Bf16Amx()
