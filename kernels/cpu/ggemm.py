"""Implicit-GEMM backward data for grouped layers of square groups whose channels are whole
vectors: register tiles spanning several groups, read from dY and written to dX in place.

Per group ``g`` (``C`` input and ``C`` output channels) and stride phase (see
:mod:`numbaconv.kernels.cpu.igemm`), backward data is

    dX[q + s*j, g*C + c] = sum_t sum_k dY[j + b_t, g*C + k] * W[t, c, g*C + k]

a GEMM of ``C`` columns: one to four vectors. A register tile of one group alone would hold
that many vectors per row, too few for the broadcast of each dY element to pay (ResNeXt's
groups of 16 float32 channels: one vector). Here a tile is ``MR`` pixels x ``NG`` groups x
``NC`` vectors (``C = NC * VL``), ``MR * NG * NC`` accumulators: per reduction step the
``NG * NC`` filter vectors are loaded and each of the ``MR * NG`` dY elements is broadcast
into ``NC`` multiply-adds (an FMA with a broadcast memory operand on AVX-512). The tiles'
pixels and the taps they sum come from ``gemm[regions]``' exact region tables (every tap of
a region reaches inside dY for every pixel of it), so dY is read where it is, with no
zero-padded copy, and with no copy to a group-minor layout (what
:mod:`numbaconv.kernels.cpu.grouped` does to vectorise across groups): the group offsets
are added to the tables' offsets of group 0.

Layouts: ``dy [mb, od, oh, ow, g*C]``, ``dx [mb, id, ih, iw, g*C]`` (each tile writes ``NG *
NC`` vectors of a row, from group ``g0``'s channels on), the phase's packed filter ``bp [g,
taps, C, C]`` (``bp[g, t, k, :] = W[tap_t, :, g*C + k]``).

This module is self-contained (see :mod:`numbaconv.kernels`): its micro-kernel is its own.
"""
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from numbaconv._jit import dtype_name, separate, specialise

from numbaconv.kernels.cpu._host import VECTOR_BYTES  # noqa: E402

#: Pixels of a register tile: the region tables of ``gemm[regions]`` are made in tiles of
#: this many rows (``igemm.MR``; the strategy checks the two agree).
MR = 6
#: Vectors of accumulators per tile row (``NG * NC`` at most this): ``MR * NVT``
#: accumulators, ``NVT`` filter vectors and a broadcast within the register file (32
#: vector registers with AVX-512, 16 with AVX2).
NVT = 4 if VECTOR_BYTES == 64 else 2


def lanes(itemsize):
    return VECTOR_BYTES // itemsize


def _micro(ng, nc, vbytes):
    """``C[crows[i] + gi*cg + v*VL : +VL] = sum_s sum_k A[arows[i] + pairs[s, 0] + gi*KC +
    k] * B[pairs[s, 1] + gi*bg + k*KC + v*VL : +VL]`` for the ``MR`` rows ``i``, groups
    ``gi < ng`` and vectors ``v < nc``, ``k < KC = nc * VL`` (element offsets from ``a``,
    ``b`` and ``c``; ``arows``, ``crows`` and ``pairs``: addresses of int64 arrays), over
    ``nseg`` segments (taps). The groups are square, ``KC`` input and output channels each,
    so that the offsets between the ``MR * ng`` elements of A a step broadcasts are
    constants of the code (displacements from ``MR`` row pointers: ``MR * ng`` pointers
    would spill from the 16 general registers). The tile is stored once; with no segments
    it stores zeros."""

    @intrinsic
    def micro(typingctx, a, arows, pairs, nseg, b, c, crows, bg, cg, work):
        sig = types.void(*([types.intp] * 9), work)
        dtype = work.dtype

        def codegen(context, builder, signature, args):
            f = context.get_value_type(dtype)
            i64 = ir.IntType(64)
            fnty = ir.FunctionType(ir.VoidType(), [i64] * 9)
            name = "numbaconv_ggemm_micro_%d_%d_%d_%s" % (ng, nc, vbytes, dtype)
            fn = cgutils.get_or_insert_function(builder.module, fnty, name)
            if fn.is_declaration:
                fn.linkage = "internal"
                fn.attributes.add("noinline")
                inner = ir.IRBuilder(fn.append_basic_block("entry"))
                _micro_body(inner, f, dtype, list(fn.args), ng, nc, vbytes, context)
                inner.ret_void()
            builder.call(fn, list(args[:-1]))
            return context.get_dummy_value()

        return sig, codegen

    return micro


def _micro_body(builder, f, dtype, args, ng, nc, vbytes, context):
    a, arows, pairs, nseg, b, c, crows, bg, cg = args
    vl = vbytes // context.get_abi_sizeof(f)
    vty = ir.VectorType(f, vl)
    fp, vp = f.as_pointer(), vty.as_pointer()
    i64 = ir.IntType(64)
    # steps per segment, A's group stride and B's row stride: the group's channels
    kl = ag = ldb = ir.Constant(i64, nc * vl)
    i64p = i64.as_pointer()
    name = "llvm.fma.v%d%s" % (vl, "f32" if dtype == types.float32 else "f64")
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty] * 3), name)
    pa = builder.inttoptr(a, fp)
    pb = builder.inttoptr(b, fp)
    pc = builder.inttoptr(c, fp)
    parows = builder.inttoptr(arows, i64p)
    ppairs = builder.inttoptr(pairs, i64p)
    pcrows = builder.inttoptr(crows, i64p)
    zero = ir.Constant(vty, None)
    undef = ir.Constant(vty, ir.Undefined)
    splat = ir.Constant(ir.VectorType(ir.IntType(32), vl), None)
    acc = [[[cgutils.alloca_once_value(builder, zero) for _ in range(nc)] for _ in range(ng)]
           for _ in range(MR)]
    arow = [builder.load(builder.gep(parows, [ir.Constant(i64, i)])) for i in range(MR)]
    goff_a = [builder.mul(ag, ir.Constant(i64, gi)) for gi in range(ng)]
    goff_b = [builder.mul(bg, ir.Constant(i64, gi)) for gi in range(ng)]
    with cgutils.for_range(builder, nseg) as sloop:
        s2 = builder.mul(sloop.index, ir.Constant(i64, 2))
        seg = builder.load(builder.gep(ppairs, [s2]))
        b0 = builder.load(builder.gep(ppairs, [builder.add(s2, ir.Constant(i64, 1))]))
        rowp = [builder.gep(pa, [builder.add(arow[i], seg)]) for i in range(MR)]
        bbase = [builder.add(b0, goff_b[gi]) for gi in range(ng)]
        with cgutils.for_range(builder, kl) as loop:
            k = loop.index
            bk = builder.mul(k, ldb)
            bv = [[builder.load(builder.bitcast(builder.gep(
                pb, [builder.add(builder.add(bbase[gi], bk), ir.Constant(i64, v * vl))]), vp),
                align=1) for v in range(nc)] for gi in range(ng)]
            for i in range(MR):
                for gi in range(ng):
                    x = builder.load(builder.gep(rowp[i], [builder.add(goff_a[gi], k)]))
                    x = builder.insert_element(undef, x, ir.Constant(ir.IntType(32), 0))
                    x = builder.shuffle_vector(x, undef, splat)
                    for v in range(nc):
                        builder.store(builder.call(fma, [x, bv[gi][v],
                                                         builder.load(acc[i][gi][v])]),
                                      acc[i][gi][v])
    for i in range(MR):
        crow = builder.load(builder.gep(pcrows, [ir.Constant(i64, i)]))
        for gi in range(ng):
            cbase = builder.add(crow, builder.mul(cg, ir.Constant(i64, gi)))
            for v in range(nc):
                p = builder.bitcast(builder.gep(pc, [builder.add(cbase,
                                                                 ir.Constant(i64, v * vl))]),
                                    vp)
                builder.store(builder.load(acc[i][gi][v]), p, align=1)


_SIG = ("void({T}[:, :, :, :, ::1], {T}[:, :, :, ::1], {T}[:, :, :, :, ::1], "
        "int64[:, :, ::1], int64[:, ::1], int64[:, ::1], int64[:, ::1], int64, {T}[::1], "
        "int64)")


_NG = _MICRO = _MICRO1 = None  # bound per driver (see ``_DRIVERS``)


def _item(dy, bp, dx, offs, items, rtab, pairs, ngb, work, ii):
    """Parallel iteration ``ii`` of :func:`bwd_d`: item ``ii % nitems`` (a region's block of
    row tiles) for block ``ii // nitems`` of ``_NG`` groups (the last block may hold fewer,
    computed one group at a time). Blocks of groups outermost: the parallel loop's equal
    shares of iterations are equal shares of the work whatever the regions' sizes, and a
    thread keeps one block's filter in cache across its items."""
    g, ntaps, C = bp.shape[0], bp.shape[1], bp.shape[3]
    it = dx.itemsize
    nitems = items.shape[0]
    item, gb = ii % nitems, ii // nitems
    r, t0, t1 = items[item, 0], items[item, 1], items[item, 2]
    e0, ne = rtab[r, 2], rtab[r, 3]
    g0 = gb * _NG
    ng = min(_NG, g - g0)
    bg = ntaps * C * C
    pa = dy.ctypes.data + g0 * C * it
    pb = bp.ctypes.data + g0 * bg * it
    pc = dx.ctypes.data + g0 * C * it
    po = offs.ctypes.data
    pp = pairs.ctypes.data + e0 * 16
    # the whole region's taps per tile: a block's filter rows (taps x C x C per group)
    # stay in L1/L2 across its tiles (chunks of taps that fit L1, each tile stored and then
    # added to per chunk, were no faster)
    if ng == _NG:
        for ti in range(t0, t1):
            _MICRO(pa, po + ti * 2 * MR * 8, pp, ne, pb, pc, po + (ti * 2 + 1) * MR * 8,
                   bg, C, work)
        return
    for gi in range(ng):
        for ti in range(t0, t1):
            _MICRO1(pa + gi * C * it, po + ti * 2 * MR * 8, pp, ne, pb + gi * bg * it,
                    pc + gi * C * it, po + (ti * 2 + 1) * MR * 8, bg, C, work)


#: The driver: groups of one vector of channels, ``NVT`` groups per tile (and one at a time
#: for the last block's remainder). The micro-kernel also builds wider groups (``nc``
#: vectors, ``NVT // nc`` groups per tile); they ran slower than ``direct[grouped]``, so
#: the strategy takes one vector only (``numbaconv.strategies.ggemm.MAX_VECTORS``).
_DRIVERS = {nc: separate(_SIG, float32="float32", float64="float64")(
    specialise(_item, f"v{nc}", _NG=max(1, NVT // nc),
               _MICRO=_micro(max(1, NVT // nc), nc, VECTOR_BYTES),
               _MICRO1=_micro(1, nc, VECTOR_BYTES)))
    for nc in (1,)}


def groups_per_tile(nc):
    return max(1, NVT // nc)


def bwd_d(dy, bp, dx, offs, items, rtab, pairs, nc, work):
    """One stride phase of backward data over its exact regions, groups of ``nc`` vectors
    of input and as many output channels: for every item (``items [I, 3]``: ``(region, t0,
    t1)`` blocks of row tiles of ``offs [tiles, 2, MR]``, the A and C row offsets of group
    0) and every block of groups, the tiles summed over the region's taps (``rtab [R, 4]``:
    tiles and ``pairs`` entries per region; ``pairs [E, 2]``: a tap's A offset in dY and
    the element offset ``position * C * C`` of its rows in a group's packed filter ``bp
    [g, taps, C, C]``). ``work``: the scratch the padded rows' C offsets point into (rows
    of all groups' channels)."""
    name = dtype_name(dx.dtype)
    ngb = -(-bp.shape[0] // groups_per_tile(nc))
    _DRIVERS[nc].run(name, items.shape[0] * ngb, dy, bp, dx, offs, items, rtab, pairs, ngb,
                     work)
