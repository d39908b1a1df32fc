"""The transposed patch GEMM of the weight gradient: vectors across input channels.

``dW[t, c, k] = sum over output pixels p of x[p shifted by tap t, c] * dy[p, k]``. For a
layer with few output channels (DenseNet's growth layers, 12-48 outputs; detection heads;
GoogLeNet's 5x5 branches) a GEMM whose vectors run across the output channels wastes lanes
and loads a vector of ``dy`` per handful of multiply-adds. Transposed, ``dW^T[k, (t, c)] =
sum_p dy[p, k] * x[p + t, c]``: each step broadcasts ``mr`` values of ``dy`` (one pixel, ``mr``
output channels) and loads ``nv`` vectors of ``x`` (one pixel's input channels at the tap),
``mr x nv`` fused multiply-adds on a register tile. Grouped layers whose groups hold whole
vectors of input channels (ResNeXt's 16 and 32) run group by group on the arrays in place.

Per tap, the output pixels of a row whose tap lies inside the input along ``w`` are a
contiguous range: each output row is one segment of the reduction (taps along ``d`` and
``h`` that leave the input drop the row), and a tile's accumulators stay in registers
across all the rows of a block (sized so that the block's ``dy`` stays in L1), not one
short row as in the untransposed ``gemm[patch]``. ``x`` is read in place (its channels a
whole number of vectors, else a padded copy). Each thread sums a contiguous share of the
output rows into its own partial ``dW^T``; the partials are added once, in a fixed order
(bitwise the same results for the same inputs, thread count and host).

The micro-kernel is LLVM IR through ``numba.extending.intrinsic`` as in ``ukernel.py`` (self-
contained here: Numba's cache checks only a function's own file).
"""
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from numbaconv._jit import dtype_name, helper, separate
from numbaconv.kernels.cpu._host import VECTOR_BYTES

#: The register tiles, ``(rows, most vectors)``: rows of output channels (broadcast) x
#: vectors of input channels; ``rows*vectors`` accumulators, the loaded vectors and a
#: broadcast within the register file (32 with AVX-512, 16 else). The first takes output
#: channels in twelves (DenseNet-BC's 12, SSD's 24), the second in sixteens (16, 32, 48:
#: no padded rows where 12 does not divide them; one vector of input channels a step),
#: the third in twos (a head's 2-7 output channels: each step two broadcasts and up to
#: four vectors of a pixel's input channels, so that one pass streams 64 of them, 256
#: bytes a pixel, with AVX-512; three vectors run as two and one).
TILES = ((12, 2), (16, 1), (2, 4)) if VECTOR_BYTES == 64 else ((6, 2), (8, 1), (2, 4))


def lanes(itemsize):
    """Vector lanes for an element size."""
    return VECTOR_BYTES // itemsize


def _micro(nv, mr):
    """``C[i, :nv*VL] += sum_s sum_j A[s, j, i] * B[s, j, :nv*VL]``: a ``mr x nv`` tile of
    vectors in registers over a reduction given as ``nseg`` segments (``segs``: the
    address of ``3*nseg`` int64, each segment's element offsets from ``a`` and from ``b``
    and its number of steps). ``A[s, j, i]`` (broadcast) is at ``a + aoff_s + j*csa + i``,
    ``B[s, j, v]`` (a vector) at ``b + boff_s + j*ldb + v*VL``, tile row ``i`` at ``c +
    i*ldc``; all in elements, unaligned. The float type comes from ``work``'s dtype; B's
    elements are float16 bits where ``bsrc``'s dtype is uint16 (widened as they load:
    ``vcvtph2ps`` with F16C, one per vector of ``mr`` multiply-adds), else of ``work``'s
    type (A's always are: a broadcast widened from float16 costs a conversion per
    multiply-add row, measured 1.3-1.6x slower than widening dY first)."""

    @intrinsic
    def micro(typingctx, a, csa, b, ldb, c, ldc, segs, nseg, work, bsrc):
        sig = types.void(*([types.intp] * 8), work, bsrc)
        dtype = work.dtype
        half = bsrc.dtype == types.uint16

        def codegen(context, builder, signature, args):
            a, csa, b, ldb, c, ldc, segs, nseg, _, _ = args
            f = context.get_value_type(dtype)
            vl = VECTOR_BYTES // context.get_abi_sizeof(f)
            vty = ir.VectorType(f, vl)
            fp, vp = f.as_pointer(), vty.as_pointer()
            i64, i32 = ir.IntType(64), ir.IntType(32)
            name = "llvm.fma.v%d%s" % (vl, "f32" if dtype == types.float32 else "f64")
            fma = cgutils.get_or_insert_function(builder.module,
                                                 ir.FunctionType(vty, [vty] * 3), name)
            pa = builder.inttoptr(a, fp)
            pb = builder.inttoptr(b, ir.IntType(16).as_pointer() if half else fp)
            pc = builder.inttoptr(c, fp)
            ps = builder.inttoptr(segs, i64.as_pointer())
            zero = ir.Constant(vty, None)
            undef = ir.Constant(vty, ir.Undefined)
            splat = ir.Constant(ir.VectorType(i32, vl), None)
            # accumulators as allocas: mem2reg turns them into registers
            acc = [[cgutils.alloca_once_value(builder, zero) for _ in range(nv)]
                   for _ in range(mr)]
            with cgutils.for_range(builder, nseg) as sloop:
                s3 = builder.mul(sloop.index, ir.Constant(i64, 3))
                ao = builder.load(builder.gep(ps, [s3]))
                bo = builder.load(builder.gep(ps, [builder.add(s3, ir.Constant(i64, 1))]))
                kl = builder.load(builder.gep(ps, [builder.add(s3, ir.Constant(i64, 2))]))
                sa = builder.gep(pa, [ao])
                sb = builder.gep(pb, [bo])
                with cgutils.for_range(builder, kl) as jloop:
                    j = jloop.index
                    ja = builder.gep(sa, [builder.mul(j, csa)])
                    jb = builder.gep(sb, [builder.mul(j, ldb)])
                    bv = [_load(builder, builder.gep(jb, [ir.Constant(i64, v * vl)]), vl,
                                half) for v in range(nv)]
                    for i in range(mr):
                        s = builder.load(builder.gep(ja, [ir.Constant(i64, i)]))
                        s = builder.insert_element(undef, s, ir.Constant(i32, 0))
                        s = builder.shuffle_vector(s, undef, splat)
                        for v in range(nv):
                            builder.store(builder.call(fma, [s, bv[v],
                                                             builder.load(acc[i][v])]),
                                          acc[i][v])
            for i in range(mr):
                row = builder.gep(pc, [builder.mul(ldc, ir.Constant(i64, i))])
                for v in range(nv):
                    p = builder.bitcast(builder.gep(row, [ir.Constant(i64, v * vl)]), vp)
                    builder.store(builder.fadd(builder.load(acc[i][v]),
                                               builder.load(p, align=1)), p, align=1)
            return context.get_dummy_value()

        return sig, codegen

    return micro


def _load(builder, p, n, half):
    """``n`` floats at ``p``, widened from float16 bits when ``half``."""
    if not half:
        ty = ir.VectorType(p.type.pointee, n)
        return builder.load(builder.bitcast(p, ty.as_pointer()), align=1)
    bits = builder.load(builder.bitcast(p, ir.VectorType(ir.IntType(16), n).as_pointer()),
                        align=1)
    return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), n)),
                         ir.VectorType(ir.FloatType(), n))


_t12_1, _t12_2 = _micro(1, TILES[0][0]), _micro(2, TILES[0][0])
_t16_1 = _micro(1, TILES[1][0])
_t2_1, _t2_2, _t2_4 = _micro(1, TILES[2][0]), _micro(2, TILES[2][0]), _micro(4, TILES[2][0])


@helper
def _tile(shape, nv, a, csa, b, ldb, c, ldc, segs, nseg, work, src):
    """The register tile ``TILES[shape]`` with ``nv`` vectors (:func:`_micro`)."""
    if shape == 1:
        _t16_1(a, csa, b, ldb, c, ldc, segs, nseg, work, src)
    elif shape == 2:
        if nv == 4:
            _t2_4(a, csa, b, ldb, c, ldc, segs, nseg, work, src)
        elif nv == 2:
            _t2_2(a, csa, b, ldb, c, ldc, segs, nseg, work, src)
        else:
            _t2_1(a, csa, b, ldb, c, ldc, segs, nseg, work, src)
    elif nv == 2:
        _t12_2(a, csa, b, ldb, c, ldc, segs, nseg, work, src)
    else:
        _t12_1(a, csa, b, ldb, c, ldc, segs, nseg, work, src)


def bwd_w(x, dy, part, geo, rb, shape, segs, group_parts=1, col_parts=1, dw=None):
    """``part[j] += dW^T`` over share ``j`` of the output rows (flat over ``mb, od, oh``),
    each share's groups in ``group_parts`` contiguous parts and each group's columns
    ``(tap, tile of output channels)`` in ``col_parts`` contiguous parts, all in parallel
    (every item writes its own groups' and columns' part of its share's partial). ``x [mb,
    id, ih, iw, g*Cp]`` and ``dy [mb, od, oh, ow, g*Kp]``: per group ``Cp`` input channels
    (a whole number of vectors) and ``Kp`` output channels (a whole number of the tile's
    rows), read in place (a copy with zeros past the channels where a single group's are
    not); ``x`` as float16 bits (uint16) for a float32 ``part``, widened as it loads;
    ``part [chunks, g, Kp, taps*Cp]`` zeroed, its rows ``(group, output channel)`` and
    columns ``(tap, input channel)``; ``shape`` the register tile (an index into
    :data:`TILES`); ``segs [chunks*group_parts*col_parts, 3*rb]`` scratch. Output rows go
    in blocks of ``rb``. With ``fuse`` (one share of the rows: ``part`` is then dW^T
    whole) each item also writes its finished part into ``dw [taps, Ci, g, Ki]`` (the
    result's layout, ``Ci``/``Ki`` a group's real channels): no pass over dW after."""
    name = "float16" if x.dtype == np.uint16 else dtype_name(part.dtype)
    fuse = dw is not None
    if dw is None:
        dw = np.empty((0, 0, 0, 0), part.dtype)
    _chunk.run(name, part.shape[0] * np.int64(group_parts) * np.int64(col_parts), x, dy, part, geo,
               rb, shape, segs, np.int64(group_parts), np.int64(col_parts), dw, fuse)


@separate("void({S}[:, :, :, :, ::1], {T}[:, :, :, :, ::1], {T}[:, :, :, ::1], int64[::1], "
          "int64, int64, int64[:, ::1], int64, int64, {T}[:, :, :, ::1], boolean, int64)",
          noalias=True, float32=dict(S="float32", T="float32"),
          float64=dict(S="float64", T="float64"), float16=dict(S="uint16", T="float32"))
def _chunk(x, dy, parts, geo, rb, shape, seg_all, group_parts, col_parts, res, fuse, j):
    """Item ``j`` of :func:`bwd_w`: share ``j // (group_parts * col_parts)`` of the
    output rows, part ``j // col_parts % group_parts`` of the groups and part ``j %
    col_parts`` of each group's ``(tap, tile)`` columns (tap-major), into that share's
    partial (``seg_all[j]``: its segment lists), and with ``fuse`` into the result
    ``res`` (:func:`bwd_w`'s ``dw``)."""
    nch = parts.shape[0]
    jr, jg, jc = j // (group_parts * col_parts), j // col_parts % group_parts, j % col_parts
    rows = geo[0] * geo[10] * geo[11]
    r0, r1 = rows * jr // nch, rows * (jr + 1) // nch
    part, segs = parts[jr], seg_all[j]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    g = part.shape[0]
    g0, g1 = g * jg // group_parts, g * (jg + 1) // group_parts
    kp = part.shape[1]
    ldc = part.shape[2]
    cp = ldc // (kd * kh * kw)
    xs, ys = x.shape[4], dy.shape[4]  # pixel pitches: g*Cp and g*Kp
    mr = TILES[shape][0]
    most = TILES[shape][1]
    it, ix = part.itemsize, x.itemsize  # dy's elements are part's
    vl = VECTOR_BYTES // it
    work = np.empty(0, part.dtype)
    px, py, pc = x.ctypes.data, dy.ctypes.data, part.ctypes.data
    sp = segs.ctypes.data
    # this item's columns: units (tap, tile of mr output channels), tap-major
    nkt = kp // mr
    units = kd * kh * kw * nkt
    u0, u1 = units * jc // col_parts, units * (jc + 1) // col_parts
    t0, t1 = u0 // nkt, (u1 + nkt - 1) // nkt
    for rs in range(r0, r1, rb):
        re = min(r1, rs + rb)
        # group by group, so that a group's block of dy stays in L1 across the taps
        for gi in range(g0, g1):
            for t in range(t0, t1):
                t_d = t // (kh * kw)
                t_h = t // kw % kh
                t_w = t % kw
                # the output pixels of a row whose tap t_w lies inside the input
                off = t_w * dw - pw
                lo = min(ow, max(0, (-off + sw - 1) // sw))
                hi = max(lo, min(ow, (iw - 1 - off) // sw + 1))
                if hi == lo:
                    continue
                ns = 0
                for r in range(rs, re):
                    n = r // (od * oh)
                    o_d = (r // oh) % od
                    o_h = r % oh
                    i_d = o_d * sd - pd + t_d * dd
                    i_h = o_h * sh - ph + t_h * dh
                    if i_d < 0 or i_d >= id_ or i_h < 0 or i_h >= ih:
                        continue
                    segs[3 * ns] = (r * ow + lo) * ys
                    segs[3 * ns + 1] = (((n * id_ + i_d) * ih + i_h) * iw + lo * sw
                                        + off) * xs
                    segs[3 * ns + 2] = hi - lo
                    ns += 1
                if ns == 0:
                    continue
                # this item's tiles of output channels at tap t
                k_lo = max(u0, t * nkt) - t * nkt
                k_hi = min(u1, (t + 1) * nkt) - t * nkt
                c0 = 0
                while c0 < cp:
                    nv = min(most, (cp - c0) // vl)
                    if nv == 3:  # (no three-vector tile: two, then one)
                        nv = 2
                    for k0 in range(k_lo * mr, k_hi * mr, mr):
                        _tile(shape, nv, py + (gi * kp + k0) * it, ys,
                              px + (gi * cp + c0) * ix, sw * xs,
                              pc + ((gi * kp + k0) * ldc + t * cp + c0) * it, ldc,
                              sp, ns, work, x)
                    c0 += nv * vl
    if fuse:  # this item's finished columns, transposed into the result
        ci, ki = res.shape[1], res.shape[3]
        for t in range(t0, t1):
            k_lo = (max(u0, t * nkt) - t * nkt) * mr
            k_hi = min(ki, (min(u1, (t + 1) * nkt) - t * nkt) * mr)
            for gi in range(g0, g1):
                for k in range(k_lo, k_hi):
                    for c in range(ci):
                        res[t, c, gi, k] = part[gi, k, t * cp + c]
