"""``gemm[bf16-wgrad]``: bfloat16 weight gradients on AVX512_BF16's dot products, x paired
into the GEMM's panels block by block (no im2col matrix).

``gemm[bf16-dot]`` computes ``dW [taps*C, K] = im2col(x)^T @ dY``: the im2col matrix of x,
transposed so that pairs of pixels are 32-bit words (``taps`` times x's bytes), goes
through memory once written and once read. Here the product is turned around, ``dW^T [K,
taps*C] = dY^T @ im2col(x)``: dY transposed into pairs of pixels once (``K x M``, the
size of dY), and for each tap and panel of 64 input channels, each block of the reduction's
pixel pairs of x interleaved straight into a panel that stays in L1
(:func:`numbaconv.kernels.cpu.bf16dot.wgrad`), multiplied at once by every row tile of
dY^T. In parallel over (tap, channel panel, part of dY's rows), each task owning its
block of dW^T: no partial sums, a fixed order. Layers with more than one tap, one group.
"""
import math

import numpy as np

from . import Strategy, canonical_shapes
from .bf16dot import MIN_DATA_CHANNELS, _bits, dot_guards
from .. import memory

#: Pairs of pixels per block of the reduction: a packed panel of x (``KC2 x 64`` words,
#: 32 KiB) meets every row tile of dY^T while it is in L1.
KC2 = 128
#: Most parts of dY's rows per (tap, channel panel) task: enough tasks to share evenly.
MAX_PARTS = 4
#: Fewest taps: 1x1 layers stay on gemm[bf16-dot] (x transposed inside its GEMM, or dY's
#: pairs over blocks of rows), measured 1.03-1.46x as fast on 10 of ResNet-50's 11 1x1
#: weight gradients (res3b_branch2a 0.89x; docs/performance.md, "bfloat16").
MIN_TAPS = 2
#: Tasks per thread from which the tasks are left whole.
TASKS_PER_THREAD = 4
#: Fewest pairs of output pixels (the reduction): each task writes its float32 block once
#: per block of the reduction and rounds it into dW once, which a short reduction does not
#: pay for (ResNet-50's 7 x 7 layers, 196 pairs: 5.75 ms against gemm[bf16-dot]'s 4.90;
#: 14 x 14, 784 pairs: 4.96 / 5.24; docs/performance.md, "bfloat16").
MIN_PAIRS = 512
#: 3x3 stride-1 layers with fewer channels in or out than this are left to Winograd (on
#: widened operands), whose fewer multiplies won at 64 channels (res2a_branch2b 5.72 ms
#: against 6.52) and lost at 128 (res3b_branch2b 5.88 / 5.10).
WINOGRAD_BELOW = 128

R_DIRECTION = "the wgrad variant is weight gradients only"
R_ONE_TAP = "a 1x1 layer: gemm[bf16-dot] needs no im2col either, and was measured faster"
R_NARROW_C = ("{c} input channels (< %d): most of every 64-channel panel of x would be "
              "zeros" % MIN_DATA_CHANNELS)
R_SHORT = ("{pairs} pairs of output pixels (< %d): too short a reduction for each task's "
           "block of dW to pay its passes" % MIN_PAIRS)
R_WINOGRAD = ("3x3 at stride 1 over {c} channels (< %d): the float32 Winograd entry's fewer "
              "multiplies win" % WINOGRAD_BELOW)
R_NARROW_K = ("{k} output channels (< %d): too few rows of dY^T for its register tiles"
              % MIN_DATA_CHANNELS)


def _parts(p, threads):
    """Parts of dY^T's rows per (tap, panel) task: the fewest that make the tasks a multiple
    of the threads, or at least ``TASKS_PER_THREAD`` per thread."""
    from ..kernels.cpu.bf16dot import NR
    tasks = math.prod(p.ksz) * -(-p.ic // NR)
    parts = 1
    while (parts < MAX_PARTS and (tasks * parts) % threads
           and tasks * parts < TASKS_PER_THREAD * threads):
        parts += 1
    return parts


class Bf16Wgrad(Strategy):
    name = "gemm"
    variant = "bf16-wgrad"
    compile_heavy = True
    directions = ("bwd_w",)

    def accepts(self, p):
        if p.direction != "bwd_w":
            return R_DIRECTION
        why = dot_guards(p)
        if why is not None:
            return why
        if math.prod(p.ksz) < MIN_TAPS:
            return R_ONE_TAP
        if p.ic < MIN_DATA_CHANNELS:
            return R_NARROW_C.format(c=p.ic)
        if p.oc < MIN_DATA_CHANNELS:
            return R_NARROW_K.format(k=p.oc)
        pairs = -(-p.mb * math.prod(p.osz) // 2)
        if pairs < MIN_PAIRS:
            return R_SHORT.format(pairs=pairs)
        if (p.ndim == 2 and p.ksz == (1, 3, 3) and p.stride == (1, 1, 1)
                and p.dilation == (1, 1, 1) and min(p.ic, p.oc) < WINOGRAD_BELOW):
            return R_WINOGRAD.format(c=min(p.ic, p.oc))
        return None

    def tiles(self, p, machine):
        from ..runtime import threads
        return {"kc2": KC2, "parts": _parts(p, max(1, threads()))}

    def bf16_operands(self, p, tiles):
        return frozenset({"x", "dy"})

    def numba_parallel(self, p, tiles):
        return True

    def workspace_bytes(self, p, tiles):
        m = p.mb * math.prod(p.osz)
        return p.oc * (m + 1) * 2 + p.oc * math.prod(p.ksz) * p.ic * (4 + 2)

    def run(self, p, tiles, ops):
        from ..kernels.cpu import bf16dot as k
        _, _, ws = canonical_shapes(p)
        x = np.ascontiguousarray(_bits(ops["x"])).reshape(p.mb, *p.isz, p.ic)
        dy = np.ascontiguousarray(_bits(ops["dy"])).reshape(p.mb, *p.osz, p.oc)
        m = p.mb * math.prod(p.osz)
        me = -(-m // 2) * 2
        at = memory.empty((p.oc, me), np.uint16)  # dY^T, pixels in pairs
        k.im2col_t(dy, np.array([p.mb, *p.osz], np.int64), at,
                   np.array([1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1], np.int64))
        geo = np.array([*p.osz, *p.stride, *p.dilation, *(-b for b in p.pad_begin), *p.ksz],
                       np.int64)
        rows = math.prod(p.ksz) * p.ic
        c = memory.empty((p.oc, rows), np.float32)  # dW^T in float32, block by block
        dw = memory.empty((rows, p.oc), np.uint16)
        k.wgrad(at.view(np.uint32), x, geo, c, dw, np.int64(tiles["kc2"]),
                np.int64(tiles["parts"]))
        return dw.reshape(ws)


STRATEGY = Bf16Wgrad()
