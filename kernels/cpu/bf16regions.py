"""bfloat16 backward data as register tiles summed over the taps straight from dY, on
AVX512_BF16's dot products, for the ``gemm[bf16-regions]`` entry.

Backward data at stride ``s`` splits into stride phases (see
:mod:`numbaconv.kernels.cpu.igemm`); a phase's grid is cut into regions within which every
tap reaches inside dY for every pixel or for none, and a region sums only its own taps. So
an ``MR x NR`` tile of dX (``MR`` phase pixels of one region, across rows and images as
they come; ``NR`` channels) is

    acc[i, :] = sum_{t in region} sum_p dy32[arow[i] + aoff[t] + p] . Bp[boff[t] + p, :]

with ``dy32`` dY's bfloat16 bits read as 32-bit words (pairs of channels: ``K`` even), and
``Bp`` the phase's filter packed into pairs, ``[panels, taps, K/2, NR]`` words
(:func:`numbaconv.kernels.cpu.bf16dot.pack_taps`). ``vdpbf16ps`` adds both products of a
pair per lane. Every tap of a tile is summed in registers and the tile is rounded to
bfloat16 once, into dX's rows wherever they are (a stride phase's pixels are ``s`` apart):
no im2col matrix, no zero-padded copy of dY, no float32 dX, no product with padding.

Against ``gemm[bf16-dot]`` (im2col, then one GEMM) this saves the im2col matrix's trip
through memory (``taps`` times dY's bytes, written and read) and, over small images, the
products with padding that the im2col rows hold (a fifth of them at 7 x 7 with a 3 x 3
filter).
"""
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from numbaconv._jit import separate
from numbaconv.kernels.cpu._ir import bf16_round, dpbf16, lane_mask, masked_io

#: Rows of a register tile and vectors across it (as :mod:`numbaconv.kernels.cpu.bf16dot`:
#: 24 accumulators, 4 loaded vectors and a broadcast within AVX-512's 32 registers).
MR = 6
NV = 4
#: Channels of a tile (16 float32 lanes per vector).
NR = NV * 16


@intrinsic
def _micro(typingctx, a, arows, pairs, nseg, k2, b, d, drows, width):
    """``D[drows[i] + j] = bf16(sum_s sum_p A[arows[i] + pairs[s, 0] + p] . B[pairs[s, 1]
    + p*NR + j])`` for the ``MR`` rows ``i`` and the columns ``j < width`` (at most
    ``NR``): ``a`` the address of dY's words, ``arows`` / ``drows`` / ``pairs`` addresses
    of int64 tables (word offsets into A; element offsets into D; per segment, A's word
    offset and B's), ``nseg`` segments of ``k2`` pairs, ``b`` the address of a packed
    panel's words, ``d`` of D's first element (bfloat16 bits). No segments: zeros."""
    sig = types.void(*[types.intp] * 9)

    def codegen(context, builder, signature, args):
        a, arows, pairs, nseg, k2, b, d, drows, width = args
        f32, i16, i32, i64 = ir.FloatType(), ir.IntType(16), ir.IntType(32), ir.IntType(64)
        vf, vi = ir.VectorType(f32, 16), ir.VectorType(i32, 16)
        dot, vb = dpbf16(builder)
        vh = ir.VectorType(i16, 16)
        i64p = i64.as_pointer()
        pa = builder.inttoptr(a, i32.as_pointer())
        pb = builder.inttoptr(b, vi.as_pointer())
        pd = builder.inttoptr(d, i16.as_pointer())
        ptab = builder.inttoptr(pairs, i64p)
        zero = ir.Constant(vf, None)
        undef = ir.Constant(vi, ir.Undefined)
        splat = ir.Constant(vi, None)
        # accumulators as allocas: mem2reg turns them into registers
        acc = [[cgutils.alloca_once_value(builder, zero) for _ in range(NV)]
               for _ in range(MR)]
        arow = [builder.load(builder.gep(builder.inttoptr(arows, i64p), [ir.Constant(i64, i)]))
                for i in range(MR)]
        with cgutils.for_range(builder, nseg) as sloop:
            s2 = builder.mul(sloop.index, ir.Constant(i64, 2))
            aoff = builder.load(builder.gep(ptab, [s2]))
            boff = builder.load(builder.gep(ptab, [builder.add(s2, ir.Constant(i64, 1))]))
            base = [builder.add(arow[i], aoff) for i in range(MR)]
            bvec = builder.sdiv(boff, ir.Constant(i64, 16))  # B's rows in vectors
            with cgutils.for_range(builder, k2) as loop:
                k = loop.index
                kb = builder.add(bvec, builder.mul(k, ir.Constant(i64, NV)))
                bv = [builder.bitcast(builder.load(builder.gep(
                    pb, [builder.add(kb, ir.Constant(i64, v))]), align=4), vb)
                    for v in range(NV)]
                for i in range(MR):
                    s = builder.load(builder.gep(pa, [builder.add(base[i], k)]), align=4)
                    s = builder.insert_element(undef, s, ir.Constant(i32, 0))
                    s = builder.bitcast(builder.shuffle_vector(s, undef, splat), vb)
                    for v in range(NV):
                        builder.store(builder.call(dot, [builder.load(acc[i][v]), s, bv[v]]),
                                      acc[i][v])
        _, mstore = masked_io(builder, vh, 16)
        drow = [builder.load(builder.gep(builder.inttoptr(drows, i64p), [ir.Constant(i64, i)]))
                for i in range(MR)]
        for v in range(NV):
            left = builder.sub(width, ir.Constant(i64, 16 * v))  # this vector's columns
            whole = builder.icmp_signed(">=", left, ir.Constant(i64, 16))
            some = builder.icmp_signed(">", left, ir.Constant(i64, 0))
            with builder.if_then(some):
                mask = builder.select(whole, ir.Constant(ir.VectorType(ir.IntType(1), 16),
                                                         [1] * 16),
                                      lane_mask(builder, left, 16))
                for i in range(MR):
                    bits = bf16_round(builder, builder.bitcast(builder.load(acc[i][v]), vi))
                    p = builder.bitcast(builder.gep(pd, [builder.add(
                        drow[i], ir.Constant(i64, 16 * v))]), vh.as_pointer())
                    with builder.if_else(whole) as (full, part):
                        with full:
                            builder.store(bits, p, align=2)
                        with part:
                            mstore(bits, p, mask)
        return context.get_dummy_value()

    return sig, codegen


def bwd_d_regions(dy32, bp, dx, offs, items, rtab, pairs, C):
    """One stride phase of backward data over its regions: ``dy32`` dY's bits as words
    (``uint32``, C-contiguous, any shape), ``bp`` the phase's filter packed into pairs
    ``[panels, taps, K/2, NR]`` (``uint32``), ``dx`` bfloat16 bits (``uint16``, any
    C-contiguous shape). Tables as :func:`numbaconv.strategies._gemm_common.region_tables`
    makes them, in the units of these arrays: ``offs [tiles, 2, MR]`` (A word offsets, dX
    element offsets; a region's last tile padded into scratch rows addressed from ``dx``),
    ``rtab [R, 4]`` (a region's tiles and its entries in ``pairs``), ``pairs [E, 2]`` (a
    tap's A word offset and its first B word in a panel), ``items [I, 3]`` (``(region, t0,
    t1)``, the parallel loop's iterations). ``C``: dX's channels (the last panel may be
    partial). The parallel loop runs over (channel panel, item), panel by panel: a
    thread's run of iterations reads one panel of the filter from L2, where items that each
    took every panel read the whole filter in turn (ResNet-50's res5b_branch2b, 4.5 MiB of
    packed filter: 4.86 -> 3.93 ms)."""
    _item.run("bf16", items.shape[0] * bp.shape[0], dy32.reshape(dy32.size), bp,
              dx.reshape(dx.size), offs, items, rtab, pairs, C)


@separate(bf16="void(uint32[::1], uint32[:, :, :, ::1], uint16[::1], int64[:, :, ::1], "
               "int64[:, ::1], int64[:, ::1], int64[:, ::1], int64, int64)")
def _item(dy, bp, dx, offs, items, rtab, pairs, C, j):
    """Iteration ``j`` of :func:`bwd_d_regions`: one panel of an item's tiles."""
    ni = items.shape[0]
    it = j % ni
    q = j // ni
    r, t0, t1 = items[it, 0], items[it, 1], items[it, 2]
    e0, ne = rtab[r, 2], rtab[r, 3]
    k2 = bp.shape[2]
    pa, pd = np.int64(dy.ctypes.data), np.int64(dx.ctypes.data)
    po = np.int64(offs.ctypes.data)
    pp = np.int64(pairs.ctypes.data) + e0 * 16
    pb0 = np.int64(bp.ctypes.data)
    panel_words = bp.shape[1] * bp.shape[2] * bp.shape[3]
    w = min(NR, C - q * NR)
    pb = pb0 + q * panel_words * 4
    for ti in range(t0, t1):
        _micro(pa, po + ti * 2 * MR * 8, pp, ne, k2, pb, pd + q * NR * 2,
               po + (ti * 2 + 1) * MR * 8, w)
