"""Register-blocked loop nests for grouped convolutions with few channels per group.

Batched per-group GEMMs of 4-32 channels run far from peak, and vectors across the channels
of one group are short. Here the operand that is read many times is copied group-minor:
``[nvg, ..., C/g, VL]``, group ``gi`` in lane ``gi % VL`` of vector ``gi // VL`` (the last
vector's extra lanes zero), so that every operand of the inner product is a vector across
groups: for input channel ``c`` and output channel ``k`` of every group at once,
``dx[.., c, :] += dy[.., k, :] * w[.., c, k, :]`` and ``dw[.., c, k, :] += x[.., c, :] *
dy[.., k, :]`` are element-wise FMAs, with no broadcast and no shuffle (the depthwise
kernels' trick; depthwise is ``C/g = K/g = 1``).

One micro-kernel (:func:`_micro`, explicit SIMD in LLVM IR as in ``ukernel.py``, but
self-contained here: Numba's cache checks only a function's own file) does the work: a
tile of ``P x NV`` vector accumulators held in registers over a whole reduction given as a
list of segments (runs of kernel taps, or rows of pixels), stored once. It is an LLVM
function of its own, never inlined: inlined into the row loops of the float64 gathers,
LLVM's register allocator kept only 22 of the 32 vector registers in the reduction loop
and spilled the accumulators on every step (ResNeXt-3D conv_3d:4 backward data in float64
on full vectors, 2 threads: 20.5 ms inlined, 7.7 ms as a function; float32 unchanged).
The drivers are:

* forward and backward data (oneDNN's derivation: backward data is a forward convolution
  of ``dy`` with the flipped, transposed filter; at stride ``s`` one per stride phase, a
  gather, never a scatter-add): a tile is ``P`` output pixels of a row x ``NV`` channels of
  a vector of groups, the reduction runs over the taps that reach the row and the channels
  they read; taps along w whose source pixels follow each other make one segment. The
  tile is transposed on its way out and stored straight into the channels-last result.
* backward weights: a tile is ``P x NV`` (input x output channels) of one tap, the
  reduction runs over a block of output pixels sized to stay in L1; each thread owns a
  partial dW (group-minor), reduced and transposed once.

The source operands are copied to group-minor with zero padding along ``w`` (by register
transposes, at the speed of a copy), so that no tile ever tests a pixel against the
border: taps along ``d`` and ``h`` that leave the input are simply not in a row's segments.
Backward data can copy dY block by block instead (:func:`bwd_d_fused`): each
parallel iteration copies the rows of dY its block of dX rows reads into a buffer of its
own, which stays in L2, rather than all of dY going to memory and back.

Layouts: ``xp`` ``[nvg, mb, id, ih, iw + pads, icg, VL]``, ``dyp`` ``[nvg, mb, od, oh, ow +
pads, ocg, VL]``, forward filter ``[nvg, kd, kh, kw, icg, ocg, VL]``, backward-data filter
``[nvg, phase blocks of [kd, kh, taps of the phase, ocg, icg, VL]]``, weight partials
``[chunks, nvg, kd, kh, kw, icg, ocg, VL]``.
"""
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from numbaconv._jit import dtype_name, helper, separate


#: Bytes of one SIMD register on this host (the lanes of a group vector).
from numbaconv.kernels.cpu._host import VECTOR_BYTES  # noqa: E402
from numbaconv.kernels.cpu._ir import transpose  # noqa: E402
#: Register tiles (rows x vectors) of the backward-data and backward-weights micro-kernels:
#: rows*vectors accumulators plus the loaded operands fit the register file (16 vector
#: registers with AVX2, 32 with AVX-512).
TILE_D = (6, 4) if VECTOR_BYTES == 64 else (5, 2)
#: The gather tile with one row fewer, for rows that it covers with fewer wasted pixels
#: (the last tile of a row overlaps the one before it): 14 pixels are three 6-pixel tiles
#: (18 computed) or three 5-pixel ones (15). Seven rows (7 x 4 accumulators, 4 B vectors and
#: an A vector: 33 registers) spill and run at half speed.
TILE_D5 = (TILE_D[0] - 1, TILE_D[1])
#: A seven-pixel gather tile of three vectors (21 accumulators, 3 B vectors and an A
#: vector: 25 registers, AVX-512 only), for seven-pixel rows: ResNeXt's 7x7 layers and
#: the stride phases of its 14-pixel rows, which the 6- and 5-pixel tiles cover with 12
#: or 10 computed pixels. The row driver takes it where it computes at most
#: ``D7_SHARE`` of the pixel-channel products the better of the other two does.
TILE_D7 = (7, 3) if VECTOR_BYTES == 64 else TILE_D5
HAS_D7 = VECTOR_BYTES == 64
D7_SHARE = 0.9
TILE_W = (4, 4) if VECTOR_BYTES == 64 else (2, 4)


#: The narrower vector width the kernels also run with (half a register): on AVX-512 hosts
#: an 8-group problem in float32 fills a 256-bit vector and would leave half of a 512-bit
#: one zero (Zen 4 executes a 512-bit FMA as two 256-bit halves, so the narrow vector
#: loses nothing there); the strategy picks the width per problem.
HALF_BYTES = VECTOR_BYTES // 2


def lanes(itemsize, vbytes=None):
    """Groups in one vector for an element size (8 float32 or 4 float64 with AVX2);
    ``vbytes``: the vector's bytes (default: the module's ``VECTOR_BYTES``, read when
    called, so that a test can plan for another host's width)."""
    return (VECTOR_BYTES if vbytes is None else vbytes) // itemsize


def group_vectors(g, itemsize, vbytes=None):
    """Vectors across ``g`` groups (the last one padded with zero lanes)."""
    return -(-g // lanes(itemsize, vbytes))


def _micro_body(builder, context, dtype, args, P, NV, to_last, vbytes, half=False):
    """The body of :func:`_micro`'s function (``args`` its LLVM arguments); ``half``: C
    (and the scratch) hold float16 bits, the tile rounded on its way out (``to_last``)."""
    a, b, c, segs, nseg, ars, acs, bcs, crs, ccs, nl, beta, pw = args
    f = context.get_value_type(dtype)
    vl = vbytes // context.get_abi_sizeof(f)
    vty = ir.VectorType(f, vl)
    fp, vp = f.as_pointer(), vty.as_pointer()
    i64, i32 = ir.IntType(64), ir.IntType(32)
    name = "llvm.fma.v%d%s" % (vl, "f32" if dtype == types.float32 else "f64")
    fma = cgutils.get_or_insert_function(builder.module,
                                         ir.FunctionType(vty, [vty] * 3), name)
    pa = builder.inttoptr(a, fp)
    pb = builder.inttoptr(b, fp)
    pc = builder.inttoptr(c, ir.IntType(16).as_pointer() if half else fp)
    if half:
        pw = builder.bitcast(pw, pc.type)
    ps = builder.inttoptr(segs, i64.as_pointer())
    zero = ir.Constant(vty, None)
    acc = [[cgutils.alloca_once_value(builder, zero) for _ in range(NV)]
           for _ in range(P)]
    aro = [builder.mul(ars, ir.Constant(i64, p)) for p in range(P)]
    with cgutils.for_range(builder, nseg) as sloop:
        s3 = builder.mul(sloop.index, ir.Constant(i64, 3))
        ao = builder.load(builder.gep(ps, [s3]))
        bo = builder.load(builder.gep(ps, [builder.add(s3, ir.Constant(i64, 1))]))
        kl = builder.load(builder.gep(ps, [builder.add(s3, ir.Constant(i64, 2))]))
        sa = builder.gep(pa, [ao])
        sb = builder.gep(pb, [bo])
        with cgutils.for_range(builder, kl) as jloop:
            j = jloop.index
            ja = builder.gep(sa, [builder.mul(j, acs)])
            jb = builder.bitcast(builder.gep(sb, [builder.mul(j, bcs)]), vp)
            av = [builder.load(builder.bitcast(builder.gep(ja, [aro[p]]), vp),
                               align=1) for p in range(P)]
            bv = [builder.load(builder.gep(jb, [ir.Constant(i64, v)]), align=1)
                  for v in range(NV)]
            for p in range(P):
                for v in range(NV):
                    builder.store(builder.call(fma, [av[p], bv[v],
                                                     builder.load(acc[p][v])]),
                                  acc[p][v])
    if to_last:
        for p in range(P):
            cp = builder.gep(pc, [builder.mul(crs, ir.Constant(i64, p))])
            vals = [builder.load(acc[p][v]) for v in range(NV)]
            width = vl
            while len(vals) > 1:  # concatenate: one [NV*VL] vector, channel-major
                if len(vals) % 2:
                    vals.append(ir.Constant(vals[0].type, None))
                mask = ir.Constant(ir.VectorType(i32, 2 * width),
                                   list(range(2 * width)))
                vals = [builder.shuffle_vector(vals[k], vals[k + 1], mask)
                        for k in range(0, len(vals), 2)]
                width *= 2
            big = vals[0]
            if half:  # round once, as float16 bits (vcvtps2ph)
                n = big.type.count  # NV * VL, or more where an odd NV was padded
                big = builder.bitcast(builder.fptrunc(big, ir.VectorType(ir.HalfType(), n)),
                                      ir.VectorType(ir.IntType(16), n))
            undef = ir.Constant(big.type, ir.Undefined)
            for lane in range(vl):
                # lanes past the last group go to the scratch ``work`` instead
                q = builder.select(
                    builder.icmp_signed(">", nl, ir.Constant(i64, lane)),
                    builder.gep(cp, [builder.mul(ccs, ir.Constant(i64, lane))]), pw)
                if NV == 1:
                    builder.store(builder.extract_element(big, ir.Constant(i32, lane)),
                                  q)
                else:
                    mask = ir.Constant(ir.VectorType(i32, NV),
                                       [v * vl + lane for v in range(NV)])
                    out = builder.shuffle_vector(big, undef, mask)
                    builder.store(out, builder.bitcast(q, out.type.as_pointer()),
                                  align=1)
        return
    add = builder.icmp_signed("!=", beta, ir.Constant(i64, 0))
    for p in range(P):
        cp = builder.bitcast(builder.gep(pc, [builder.mul(crs, ir.Constant(i64, p))]),
                             vp)
        for v in range(NV):
            q = builder.gep(cp, [ir.Constant(i64, v)])
            val = builder.load(acc[p][v])
            with builder.if_else(add) as (then, otherwise):
                with then:
                    builder.store(builder.fadd(val, builder.load(q, align=1)), q,
                                  align=1)
                with otherwise:
                    builder.store(val, q, align=1)
    return


def _micro(P, NV, to_last, vbytes=VECTOR_BYTES):
    """``C[p, v] (+)= sum_s sum_j A[s, j, p] * B[s, j, v]``, element-wise over the lanes: a
    ``P x NV`` tile of vectors kept in registers over a whole reduction (LLVM allocas that
    mem2reg turns into registers).

    The reduction runs over ``nseg`` segments; ``segs`` is the address of ``3*nseg`` int64,
    each segment's element offsets from ``a`` and from ``b`` and its number of steps ``j``.
    Vector ``A[s, j, p]`` starts at ``a + aoff_s + j*acs + p*ars``, ``B[s, j, v]`` at ``b +
    boff_s + j*bcs + v*VL`` (the ``NV`` vectors of B are contiguous, so that their offsets are
    constants). All in elements, unaligned.

    Without ``to_last``, tile vector ``C[p, v]`` is at ``c + p*crs + v*VL`` and ``beta``
    non-zero adds the tile to C, else stores it. With ``to_last`` the tile is transposed on
    its way out, to channels-last: lane ``l < nl`` of ``C[p, v]`` is stored at ``c + p*crs +
    l*ccs + v`` (the NV channels of one group are contiguous; the other lanes are stored
    to ``work``, which must hold NV elements). No segment gives zeros. The float type comes
    from ``work``'s dtype, C's too: a ``work`` of uint16 means float32 operands and, with
    ``to_last``, a C of float16 bits. The body is :func:`_micro_body`, emitted once per
    module as a ``noinline`` function (see the module's docstring)."""

    @intrinsic
    def micro(typingctx, a, b, c, segs, nseg, ars, acs, bcs, crs, ccs, nl, beta, work):
        sig = types.void(*([types.intp] * 12), work)
        dtype, half = _half_bits(work.dtype)
        assert to_last or not half

        def codegen(context, builder, signature, args):
            f = context.get_value_type(dtype)
            fp, i64 = f.as_pointer(), ir.IntType(64)
            # the scratch of stores past the last group: work's data
            pw = builder.bitcast(context.make_array(work)(context, builder, args[-1]).data, fp)
            fnty = ir.FunctionType(ir.VoidType(), [i64] * 12 + [fp])
            name = "numbaconv_grouped_micro_%d_%d_%d_%d_%s%s" % (P, NV, to_last, vbytes, dtype,
                                                                 "_half" if half else "")
            fn = cgutils.get_or_insert_function(builder.module, fnty, name)
            if fn.is_declaration:
                fn.linkage = "internal"
                fn.attributes.add("noinline")
                inner = ir.IRBuilder(fn.append_basic_block("entry"))
                _micro_body(inner, context, dtype, list(fn.args), P, NV, to_last, vbytes,
                            half)
                inner.ret_void()
            builder.call(fn, list(args[:-1]) + [pw])
            return context.get_dummy_value()

        return sig, codegen

    return micro


def _half_bits(dtype):
    """``(float dtype, half)``: arrays of uint16 are float16 bits, computed in float32."""
    return (types.float32, True) if dtype == types.uint16 else (dtype, False)


def _source_loader(builder, ptr, half):
    """``load(p, n)``: ``n`` floats (a scalar when ``n`` is 0) at the source pointer ``p``,
    widened from float16 bits when ``half`` (``fpext``: ``vcvtph2ps`` with F16C)."""
    def load(p, n):
        if not half:
            ty = p.type.pointee if n == 0 else ir.VectorType(p.type.pointee, n)
            return builder.load(p if n == 0 else builder.bitcast(p, ty.as_pointer()),
                                align=1)
        hty = ir.HalfType() if n == 0 else ir.VectorType(ir.HalfType(), n)
        ity = ir.IntType(16) if n == 0 else ir.VectorType(ir.IntType(16), n)
        fty = ir.FloatType() if n == 0 else ir.VectorType(ir.FloatType(), n)
        bits = builder.load(builder.bitcast(p, ity.as_pointer()), align=1)
        return builder.fpext(builder.bitcast(bits, hty), fty)

    return load


@intrinsic
def _widen(typingctx, v):
    """A source element as a float: float16 bits (uint16) widened to float32, else as is."""
    if v == types.uint16:
        def codegen(context, builder, signature, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

        return types.float32(v), codegen

    def same(context, builder, signature, args):
        return args[0]

    return v(v), same


def _transpose(cc, to_lanes, vbytes=VECTOR_BYTES):
    """A register transpose between channels-last and group-minor for one pixel and one
    vector of groups: with ``to_lanes``, ``VL`` rows of ``cc`` channels (row ``i`` at ``src +
    i*ss``) become ``cc`` vectors of ``VL`` lanes (vector ``j`` at ``dst + j*ds``); else the
    reverse. Addresses and strides in bytes and elements, ``VL`` from ``work``'s dtype (the
    source's): a source of float16 bits (uint16) is widened on the way into float32."""

    @intrinsic
    def tr(typingctx, src, ss, dst, ds, work):
        sig = types.void(types.intp, types.intp, types.intp, types.intp, work)
        dtype, half = _half_bits(work.dtype)

        def codegen(context, builder, signature, args):
            src, ss, dst, ds, _ = args
            f = context.get_value_type(dtype)
            vl = vbytes // context.get_abi_sizeof(f)
            nin, win = (vl, cc) if to_lanes else (cc, vl)
            i64, i32 = ir.IntType(64), ir.IntType(32)
            ps = builder.inttoptr(src, (ir.IntType(16) if half else f).as_pointer())
            pd = builder.inttoptr(dst, f.as_pointer())
            load = _source_loader(builder, ps, half)

            def at(p, stride, i):
                return builder.gep(p, [builder.mul(stride, ir.Constant(i64, i))])

            if win == 1:
                vals = [load(at(ps, ss, i), 0) for i in range(nin)]
                vec = ir.Constant(ir.VectorType(f, nin), ir.Undefined)
                for i, v in enumerate(vals):
                    vec = builder.insert_element(vec, v, ir.Constant(i32, i))
                builder.store(vec, builder.bitcast(pd, vec.type.as_pointer()), align=1)
                return context.get_dummy_value()
            vecs = [load(at(ps, ss, i), win) for i in range(nin)]
            if nin == 1:
                for j in range(win):
                    builder.store(builder.extract_element(vecs[0], ir.Constant(i32, j)),
                                  at(pd, ds, j))
                return context.get_dummy_value()
            vout = ir.VectorType(f, nin)
            for j, col in enumerate(transpose(builder, vecs)):
                builder.store(col, builder.bitcast(at(pd, ds, j), vout.as_pointer()), align=1)
            return context.get_dummy_value()

        return sig, codegen

    return tr


_to4, _to1 = _transpose(4, True), _transpose(1, True)
_to4h, _to1h = _transpose(4, True, HALF_BYTES), _transpose(1, True, HALF_BYTES)


@helper
def _to_lanes(four, full, src, ss, dst, ds, work):
    """:func:`_transpose` to lanes of 4 channels (``four``) or 1, on full or half vectors."""
    if four:
        if full:
            _to4(src, ss, dst, ds, work)
        else:
            _to4h(src, ss, dst, ds, work)
    elif full:
        _to1(src, ss, dst, ds, work)
    else:
        _to1h(src, ss, dst, ds, work)


_from4, _from1 = _transpose(4, False), _transpose(1, False)
_from4h, _from1h = _transpose(4, False, HALF_BYTES), _transpose(1, False, HALF_BYTES)


@helper
def _to_channels(four, full, src, ss, dst, ds, work):
    """:func:`_transpose` from lanes back to 4 channels (``four``) or 1, on full or half
    vectors."""
    if four:
        if full:
            _from4(src, ss, dst, ds, work)
        else:
            _from4h(src, ss, dst, ds, work)
    elif full:
        _from1(src, ss, dst, ds, work)
    else:
        _from1h(src, ss, dst, ds, work)


def to_group_minor(src, dst, g, pl):
    """``src [mb, d, h, w, g*C]`` -> ``dst [nvg, mb, d, h, wp, C, VL]``: group ``gi`` in
    lane ``gi % VL`` of vector ``gi // VL``, pixel ``i`` at ``pl + i``, zeros in the padding
    pixels and lanes. A ``src`` of float16 bits (uint16) is widened into a float32 ``dst``
    on the way (no pass of its own)."""
    name = "float16" if src.dtype == np.uint16 else dtype_name(dst.dtype)
    _gm_row.run(name, src.shape[0] * src.shape[1] * src.shape[2], src, dst, g, pl)


@separate("void({S}[:, :, :, :, ::1], {T}[:, :, :, :, :, :, ::1], int64, int64, int64)",
          float32=dict(S="float32", T="float32"), float64=dict(S="float64", T="float64"),
          float16=dict(S="uint16", T="float32"))
def _gm_row(src, dst, g, pl, r):
    """Row ``r`` (flat over ``mb, d, h``) of :func:`to_group_minor`."""
    wp, C, vl = dst.shape[4], dst.shape[5], dst.shape[6]
    rows = src.shape[0] * src.shape[1] * src.shape[2]
    _gm_into(src, dst.reshape(-1), r * wp * C * vl, rows * wp * C * vl, wp, C, vl, g, pl, r)


@helper
def _gm_into(src, d1, orow0, gstride, wp, C, vl, g, pl, r):
    """Row ``r`` (flat over ``mb, d, h``) of ``src [mb, d, h, w, g*C]`` into the
    group-minor ``d1``: vector ``gv``'s ``[wp, C, VL]`` row at element ``orow0 +
    gv*gstride``, pixel ``i`` at ``pl + i``, zeros in the padding pixels and lanes (see
    :func:`to_group_minor`)."""
    w = src.shape[3]
    nvg = (g + vl - 1) // vl
    pst, cst = C * vl, vl
    s1 = src.reshape(-1)
    its, it = src.itemsize, d1.itemsize
    full = vl * it == VECTOR_BYTES
    ps, pd = src.ctypes.data, d1.ctypes.data
    for i_w in range(wp):  # pixels outermost: the source read once, in order
        s = i_w - pl
        for gv in range(nvg):
            g0 = gv * vl
            n = min(vl, g - g0)
            o = orow0 + gv * gstride + i_w * pst
            if s < 0 or s >= w or n < vl:
                for c in range(C):
                    for l in range(vl):
                        d1[o + c * cst + l] = 0
            if s < 0 or s >= w:
                continue
            base = (r * w + s) * C * g + g0 * C
            if n < vl:  # the last, partial vector of groups
                for l in range(n):
                    for c in range(C):
                        d1[o + c * cst + l] = _widen(s1[base + l * C + c])
                continue
            c = 0
            while c < C:
                four = c + 4 <= C
                _to_lanes(four, full, ps + (base + c) * its, C, pd + (o + c * cst) * it,
                          cst, src)
                c += 4 if four else 1


def pack_filter(w, out, pos, taps, g, transposed, vl):
    """Filter ``w [kd, kh, kw, icg, g*ocg]`` -> the block at ``pos`` of every row of ``out
    [nvg, *]``: ``[kd, kh, len(taps), icg, ocg, VL]``, or ``[..., ocg, icg, VL]`` when
    ``transposed``; tap ``j`` along w is ``w``'s tap ``taps[j]``, lane ``l`` of vector ``gv``
    is group ``gv*vl + l`` (zero past the last group). In parallel over (vector, tap), by
    register transposes of ``VL`` groups x 4 channels (a serial element-by-element pass took
    0.35 ms for ResNeXt-3D conv_3d:6's 27 x 16 x 32 x 16 filter, a quarter of its kernel;
    this one 0.04 ms)."""
    _pack_row.run(dtype_name(w.dtype), out.shape[0] * w.shape[0] * w.shape[1] * taps.shape[0], w,
                  out, pos, taps, g, transposed, vl)


@separate("void({T}[:, :, :, :, ::1], {T}[:, ::1], int64, int64[::1], int64, boolean, "
          "int64, int64)", float32="float32", float64="float64")
def _pack_row(w, out, pos, taps, g, transposed, vl, r):
    """Block ``r`` (flat over vector, tap) of :func:`pack_filter`."""
    kd, kh, kw, icg = w.shape[0], w.shape[1], w.shape[2], w.shape[3]
    row = w.shape[4]
    ocg = row // g
    nj = taps.shape[0]
    sc, sk = (1, icg) if transposed else (ocg, 1)  # a filter element's stride in a tap block
    blk = icg * ocg * vl
    it = w.itemsize
    full = vl * it == VECTOR_BYTES
    w1 = w.reshape(-1)
    pw, po = w.ctypes.data, out.ctypes.data
    gv = r // (kd * kh * nj)
    rt = r % (kd * kh * nj)
    t_d = rt // (kh * nj)
    t_h = (rt // nj) % kh
    j = rt % nj
    o = pos + rt * blk
    po_v = po + gv * out.shape[1] * it
    src = ((t_d * kh + t_h) * kw + taps[j]) * icg * row + gv * vl * ocg
    nl = min(vl, g - gv * vl)
    for c in range(icg):
        if nl < vl:  # the last, partial vector of groups
            for k in range(ocg):
                d = o + (c * sc + k * sk) * vl
                for l in range(vl):
                    out[gv, d + l] = w1[src + c * row + l * ocg + k] if l < nl else 0
            continue
        k = 0
        while k < ocg:
            four = k + 4 <= ocg
            _to_lanes(four, full, pw + (src + c * row + k) * it, ocg,
                      po_v + (o + (c * sc + k * sk) * vl) * it, sk * vl, w)
            k += 4 if four else 1


_tile_d = _micro(TILE_D[0], TILE_D[1], True)
_tile_d5 = _micro(TILE_D5[0], TILE_D5[1], True)
_tile_dd = _micro(1, 1, True)
_tile_d7 = _micro(TILE_D7[0], TILE_D7[1], True)
_tile_d7h = _micro(TILE_D7[0], TILE_D7[1], True, HALF_BYTES)
_tile_w = _micro(TILE_W[0], TILE_W[1], False)
_tile_w1 = _micro(1, 1, False)
_tile_dh = _micro(TILE_D[0], TILE_D[1], True, HALF_BYTES)
_tile_d5h = _micro(TILE_D5[0], TILE_D5[1], True, HALF_BYTES)
_tile_ddh = _micro(1, 1, True, HALF_BYTES)
_tile_wh = _micro(TILE_W[0], TILE_W[1], False, HALF_BYTES)
_tile_w1h = _micro(1, 1, False, HALF_BYTES)


@helper
def _gather_tile(rows, full, a, b, c, segs, ns, ars, acs, bcs, crs, ccs, nl, work):
    """A ``TILE_D7`` tile (``rows`` 3), a ``TILE_D`` one (``rows`` 2), a ``TILE_D5`` one
    (``rows`` 1) or a 1 x 1 one (``rows`` 0), stored channels-last, on full or half
    vectors."""
    if rows == 3:
        if full:
            _tile_d7(a, b, c, segs, ns, ars, acs, bcs, crs, ccs, nl, 0, work)
        else:
            _tile_d7h(a, b, c, segs, ns, ars, acs, bcs, crs, ccs, nl, 0, work)
    elif rows == 2:
        if full:
            _tile_d(a, b, c, segs, ns, ars, acs, bcs, crs, ccs, nl, 0, work)
        else:
            _tile_dh(a, b, c, segs, ns, ars, acs, bcs, crs, ccs, nl, 0, work)
    elif rows == 1:
        if full:
            _tile_d5(a, b, c, segs, ns, ars, acs, bcs, crs, ccs, nl, 0, work)
        else:
            _tile_d5h(a, b, c, segs, ns, ars, acs, bcs, crs, ccs, nl, 0, work)
    elif full:
        _tile_dd(a, b, c, segs, ns, ars, acs, bcs, crs, ccs, nl, 0, work)
    else:
        _tile_ddh(a, b, c, segs, ns, ars, acs, bcs, crs, ccs, nl, 0, work)


@helper
def _sum_tile(whole, full, a, b, c, segs, ns, ars, acs, bcs, crs, work):
    """A ``TILE_W`` tile (``whole``) or a 1 x 1 one, added to C, on full or half vectors."""
    if whole:
        if full:
            _tile_w(a, b, c, segs, ns, ars, acs, bcs, crs, 0, 0, 1, work)
        else:
            _tile_wh(a, b, c, segs, ns, ars, acs, bcs, crs, 0, 0, 1, work)
    elif full:
        _tile_w1(a, b, c, segs, ns, ars, acs, bcs, crs, 0, 0, 1, work)
    else:
        _tile_w1h(a, b, c, segs, ns, ars, acs, bcs, crs, 0, 0, 1, work)


@helper
def row_tile(npix, nout):
    """``(pixels, vectors, rows)`` of the gather tile for a row of ``npix`` pixels and
    ``nout`` channels (``rows`` as :func:`_gather_tile` takes it; 0: pixel by pixel): the
    one that computes the fewest pixel-channel products (tiles overlap at the ends),
    ``TILE_D7`` only where it computes at most ``D7_SHARE`` of the others' best."""
    P, NV, rows = TILE_D[0], TILE_D[1], 2
    P5 = TILE_D5[0]
    if -(-npix // P5) * P5 < -(-npix // P) * P:
        P, rows = P5, 1
    best = -(-npix // P) * P * (-(-nout // NV) * NV)
    if npix < P or nout < NV:  # pixel by pixel: one vector per product
        best = npix * nout * NV * P
        rows = 0
    if HAS_D7 and npix >= TILE_D7[0] and nout >= TILE_D7[1]:
        P7, NV7 = TILE_D7[0], TILE_D7[1]
        if -(-npix // P7) * P7 * (-(-nout // NV7) * NV7) <= D7_SHARE * best:
            P, NV, rows = P7, NV7, 3
    if rows == 0:
        P, NV = 1, 1
    return P, NV, rows


@separate("void(int64, int64, int64, int64[::1], int64, int64[::1], int64, int64, int64, int64, "
          "int64, int64, int64, int64, int64, int64, int64, int64, {W}[::1])",
          float32=dict(W="float32"), float64=dict(W="float64"), float16=dict(W="uint16"))
def _row_tiles(a, b, c, segs, sst, nss, nrows, cst, npix, nout, nl, ars, acs, bcs, crs, ccs,
               vl, it, work):
    """``nrows`` rows of a gather convolution, each ``npix`` output pixels x ``nout``
    channels of ``nl`` groups, in the tiles :func:`row_tile` picks (``TILE_D``, ``TILE_D5``
    or ``TILE_D7``, whichever computes the fewest products; the last tile of a row or of
    the channels overlaps the one before it, recomputing a few: tiles are stored, not
    added) stored channels-last. Row ``r``'s reduction is the ``nss[r]`` segments at
    ``segs[r*sst:]`` (offsets from ``a`` and ``b``), its result ``cst`` elements after row
    ``r - 1``'s. The channel tiles are the outer loop, so that one tile's filter vectors
    (B, ``vl`` apart, steps ``bcs`` apart) serve every row's pixel tiles in turn (1.05-1.07x
    on ResNeXt-50's 7x7 and 14x14 backward data, docs/performance.md, "Grouped backward
    data"). ResNeXt-3D conv_3d:6 (14-pixel rows, 2 threads, float32): 1.51 -> 1.35 ms
    with 5-pixel tiles; conv_3d:12 (two 14-pixel phases) 2.18 -> 1.99 ms. ``it``: the
    bytes of A's and B's elements; C's are ``work``'s (float16 bits where ``work`` is
    uint16). Compiled on its own (the forward and backward-data row drivers call it
    through ``tiles``, their first argument: one compile for both, and a unit of its own
    for a first call's helper process)."""
    itc = work.itemsize
    full = vl * it == VECTOR_BYTES
    P, NV, rows = row_tile(npix, nout)
    ps = segs.ctypes.data
    if rows > 0:
        k = 0
        while k < nout:
            kk = min(k, nout - NV)
            for r in range(nrows):
                ns = nss[r]
                cr = c + r * cst * itc
                j = 0
                while j < npix:
                    jj = min(j, npix - P)
                    _gather_tile(rows, full, a + jj * ars * it, b + kk * vl * it,
                                 cr + (jj * crs + kk) * itc, ps + r * sst * 8, ns, ars, acs,
                                 bcs, crs, ccs, nl, work)
                    j += P
            k += NV
    else:
        for k in range(nout):
            for r in range(nrows):
                ns = nss[r]
                cr = c + r * cst * itc
                for jj in range(npix):
                    _gather_tile(0, full, a + jj * ars * it, b + k * vl * it,
                                 cr + (jj * crs + k) * itc, ps + r * sst * 8, ns, ars, acs,
                                 bcs, crs, ccs, nl, work)


def variant(data, result):
    """The name of the separate row drivers' variant for group-minor ``data`` and a
    ``result`` that may hold float16 bits."""
    return "float16" if result.dtype == np.uint16 else dtype_name(data.dtype)


def fwd_gm(xp, wf, y, geo, pl):
    """``y [mb, od, oh, ow, g*ocg]`` = grouped conv(xp, wf) (``xp`` group-minor, padded by
    ``pl`` along w; ``wf [nvg, kd, kh, kw, icg, ocg, VL]``), row by row
    (:func:`_fwd_rows`)."""
    name = variant(xp, y)
    rows = geo[0] * geo[10] * geo[11]
    seg_all = np.empty((rows, 3 * geo[7] * geo[8] * geo[9]), np.int64)
    _fwd_row.run(name, rows, _row_tiles.table(name), xp, wf, y, geo, pl, seg_all)


@separate("void(int64[::1], {T}[:, :, :, :, :, :, ::1], {T}[:, ::1], {Y}[:, :, :, :, ::1], "
           "int64[::1], int64, int64[:, ::1], int64)",
           float32=dict(T="float32", Y="float32"), float64=dict(T="float64", Y="float64"),
           float16=dict(T="float32", Y="uint16"))
def _fwd_row(tiles, xp, wf, y, geo, pl, seg_all, r):
    """Row ``r`` (flat over image, depth, row) of :func:`fwd_gm`."""
    n = r // (geo[10] * geo[11])
    o_d = (r // geo[11]) % geo[10]
    o_h = r % geo[11]
    work = np.empty(TILE_D[1], y.dtype)  # the micro-kernel's scratch
    nss = np.empty(1, np.int64)
    _fwd_rows(tiles, xp.ctypes.data, xp[0].size, wf, y, geo, seg_all[r], nss, n, o_d, o_h,
              o_h + 1, xp.shape[4], pl, xp.shape[6], 0, -1, xp.itemsize, work)


@helper
def _fwd_rows(tiles, pa, gstride, wf, y, geo, segs, nss, n, o_d, h0, h1, wp, pl, vl, lo, nrow,
              it, work):
    """Rows ``h0 .. h1`` of y (image ``n``, depth ``o_d``) gathered from x in group-minor
    at address ``pa`` (vector ``gv``'s ``gstride`` elements further on; ``it``-byte
    elements): x's row ``(t_d, i_h)`` is a block buffer's row ``t_d*nrow + i_h - lo``
    where ``nrow >= 0``, else row ``(n*id + i_d)*ih + i_h`` of all of x. With dilation 1
    along w, the taps along w of one row make one segment (their x pixels and filter rows
    are contiguous)."""
    g, icg, ocg = geo[1], geo[2], geo[3]
    id_, ih = geo[4], geo[5]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    nvg = (g + vl - 1) // vl
    itc = y.itemsize  # y may hold float16 bits
    ws = wf[0].size
    oc = g * ocg
    pb, pc = wf.ctypes.data, y.ctypes.data
    runs = 1 if dw == 1 else kw  # segments per (t_d, t_h)
    sst = 3 * kd * kh * runs  # a row's segments in ``segs``
    for o_h in range(h0, h1):
        ns = 0
        base = (o_h - h0) * sst
        for t_d in range(kd):
            i_d = o_d * sd - pd + t_d * dd
            if i_d < 0 or i_d >= id_:
                continue
            for t_h in range(kh):
                i_h = o_h * sh - ph + t_h * dh
                if i_h < 0 or i_h >= ih:
                    continue
                row = t_d * nrow + i_h - lo if nrow >= 0 else (n * id_ + i_d) * ih + i_h
                for u in range(runs):
                    segs[base + 3 * ns] = (row * wp + u * dw + pl - pw) * icg * vl
                    segs[base + 3 * ns + 1] = ((t_d * kh + t_h) * kw + u) * icg * ocg * vl
                    segs[base + 3 * ns + 2] = icg * (kw if runs == 1 else 1)
                    ns += 1
        nss[o_h - h0] = ns
    crow = ((n * od + o_d) * oh + h0) * ow * oc
    for gv in range(nvg):
        _row_tiles(tiles, pa + gv * gstride * it, pb + gv * ws * it,
                   pc + (crow + gv * vl * ocg) * itc, segs, sst, nss, h1 - h0, ow * oc, ow,
                   ocg, min(vl, g - gv * vl), sw * icg * vl, vl, ocg * vl, oc, ocg, vl, it,
                   work)


def bwd_d_gm(dyp, wq, dx, geo, qtab, runs):
    """``dx [mb, id, ih, iw, g*icg]`` = grouped conv^T(dyp, w) (``dyp`` group-minor and
    zero-padded along w): per row and stride phase ``q`` along w, a gather over the taps
    that reach it. ``wq [nvg, phases: kd, kh, nq, ocg, icg, VL]``: phase q's nq taps along
    w in the order of their dy pixels; ``qtab [sw, 3]``: (offset of phase q in wq, nq, its
    first run), ``runs [*, 3]``: (padded dy pixel of output pixel 0, first tap, taps) of
    the runs of phase q's taps whose dy pixels follow each other (one segment each)."""
    name = variant(dyp, dx)
    rows = geo[0] * geo[4] * geo[5]
    seg_all = np.empty((rows, 3 * geo[7] * geo[8] * max(1, runs.shape[0])), np.int64)
    _bwd_d_row.run(name, rows, _row_tiles.table(name), dyp, wq, dx, geo, qtab, runs, seg_all)


@separate("void(int64[::1], {T}[:, :, :, :, :, :, ::1], {T}[:, ::1], {Y}[:, :, :, :, ::1], "
           "int64[::1], int64[:, ::1], int64[:, ::1], int64[:, ::1], int64)",
           float32=dict(T="float32", Y="float32"), float64=dict(T="float64", Y="float64"),
           float16=dict(T="float32", Y="uint16"))
def _bwd_d_row(tiles, dyp, wq, dx, geo, qtab, runs, seg_all, r):
    """Row ``r`` (flat over image, depth, row) of :func:`bwd_d_gm`."""
    n = r // (geo[4] * geo[5])
    i_d = (r // geo[5]) % geo[4]
    i_h = r % geo[5]
    work = np.empty(TILE_D[1], dx.dtype)  # the micro-kernel's scratch
    nss = np.empty(1, np.int64)
    _bwd_d_rows(tiles, dyp.ctypes.data, dyp[0].size, wq, dx, geo, qtab, runs, seg_all[r], nss, n,
                i_d, i_h, i_h + 1, dyp.shape[4], dyp.shape[6], 0, -1, dyp.itemsize, work)


@helper
def _bwd_d_rows(tiles, pa, gstride, wq, dx, geo, qtab, runs, segs, nss, n, i_d, h0, h1, wp, vl,
                lo, nrow, it, work):
    """Rows ``h0 .. h1`` of dX (image ``n``, depth ``i_d``) gathered, phase by phase, from
    dY in group-minor at address ``pa`` (vector ``gv``'s ``gstride`` elements further on;
    ``it``-byte elements): dY's row ``(t_d, o_h)`` is a block buffer's row ``t_d*nrow +
    o_h - lo`` where ``nrow >= 0``, else row ``(n*od + o_d)*oh + o_h`` of all of dY."""
    g, icg, ocg = geo[1], geo[2], geo[3]
    id_, ih, iw = geo[4], geo[5], geo[6]
    kd, kh = geo[7], geo[8]
    od, oh = geo[10], geo[11]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh = geo[16], geo[17]
    pd, ph = geo[19], geo[20]
    nvg = (g + vl - 1) // vl
    itc = dx.itemsize  # dx may hold float16 bits
    ws = wq[0].size
    ic = g * icg
    nruns = runs.shape[0]
    tap = ocg * icg * vl
    pb, pc = wq.ctypes.data, dx.ctypes.data
    sst = 3 * kd * kh * max(1, nruns)  # a row's segments in ``segs``
    for q in range(min(sw, iw)):
        npix = (iw - q + sw - 1) // sw
        q0, nq, r0 = qtab[q, 0], qtab[q, 1], qtab[q, 2]
        r1 = qtab[q + 1, 2] if q + 1 < sw else nruns
        for i_h in range(h0, h1):
            ns = 0
            base = (i_h - h0) * sst
            for t_d in range(kd):
                a_d = i_d + pd - t_d * dd
                if a_d < 0 or a_d % sd != 0 or a_d // sd >= od:
                    continue
                o_d = a_d // sd
                for t_h in range(kh):
                    a_h = i_h + ph - t_h * dh
                    if a_h < 0 or a_h % sh != 0 or a_h // sh >= oh:
                        continue
                    o_h = a_h // sh
                    row = t_d * nrow + o_h - lo if nrow >= 0 else (n * od + o_d) * oh + o_h
                    for u in range(r0, r1):
                        segs[base + 3 * ns] = (row * wp + runs[u, 0]) * ocg * vl
                        segs[base + 3 * ns + 1] = (q0 + ((t_d * kh + t_h) * nq + runs[u, 1])
                                                   * tap)
                        segs[base + 3 * ns + 2] = runs[u, 2] * ocg
                        ns += 1
            nss[i_h - h0] = ns
        crow = (((n * id_ + i_d) * ih + h0) * iw + q) * ic
        for gv in range(nvg):
            _row_tiles(tiles, pa + gv * gstride * it, pb + gv * ws * it,
                       pc + (crow + gv * vl * icg) * itc, segs, sst, nss, h1 - h0, iw * ic,
                       npix, icg, min(vl, g - gv * vl), ocg * vl, vl, icg * vl, sw * ic, icg,
                       vl, it, work)


@helper
def _aligned_empty(n, like):
    """``n`` elements of ``like``'s dtype starting on a 64-byte boundary: a group vector (32
    or 64 bytes) across a cache line is two loads (ResNeXt-50's 32-group backward data
    ran up to 1.3x slower off the boundary). The caller passes the result, or its
    address, to the call that reads it: Numba frees an array after its last use, and
    allocates nothing in between."""
    pad = 64 // like.itemsize
    raw = np.empty(n + pad, like.dtype)
    s = (pad - (raw.ctypes.data % 64) // like.itemsize) % pad
    return raw[s:s + n]


def fwd_fused(x, wf, y, geo, vl, pl, wp, rb):
    """:func:`fwd_gm` on the channels-last ``x [mb, id, ih, iw, g*icg]`` itself:
    per block of ``rb`` rows of y (of one image and depth), the rows of x that its taps
    read are copied to group-minor (``[nvg, kd, rows, wp, icg, VL]``, zero-padded by ``pl``
    along w) into a buffer of the iteration's own (see :func:`bwd_d_fused`)."""
    name = "float16" if x.dtype == np.uint16 else dtype_name(x.dtype)
    blocks = geo[0] * geo[10] * ((geo[11] + rb - 1) // rb)
    seg_all = np.empty((blocks, rb * 3 * geo[7] * geo[8] * geo[9]), np.int64)
    _fwd_block.run(name, blocks, _row_tiles.table(name), x, wf, y, geo, vl, pl, wp, rb,
                   seg_all)


@separate("void(int64[::1], {S}[:, :, :, :, ::1], {T}[:, ::1], {Y}[:, :, :, :, ::1], "
          "int64[::1], int64, int64, int64, int64, int64[:, ::1], int64)",
          float32=dict(S="float32", T="float32", Y="float32"),
          float64=dict(S="float64", T="float64", Y="float64"),
          float16=dict(S="uint16", T="float32", Y="uint16"))
def _fwd_block(tiles, x, wf, y, geo, vl, pl, wp, rb, seg_all, b):
    """Block ``b`` (flat over image, depth, blocks of ``rb`` rows) of
    :func:`fwd_fused`; the row gathers are :func:`_fwd_rows`."""
    segs = seg_all[b]
    g, icg = geo[1], geo[2]
    id_, ih = geo[4], geo[5]
    kd, kh = geo[7], geo[8]
    od, oh = geo[10], geo[11]
    sd, sh = geo[13], geo[14]
    dd, dh = geo[16], geo[17]
    pd, ph = geo[19], geo[20]
    nvg = (g + vl - 1) // vl
    nhb = (oh + rb - 1) // rb
    n = b // (od * nhb)
    o_d = (b // nhb) % od
    h0 = (b % nhb) * rb
    h1 = min(oh, h0 + rb)
    # the rows of x the block's taps read: lo..hi along h, each valid tap along d
    lo = max(0, h0 * sh - ph)
    hi = min(ih - 1, (h1 - 1) * sh - ph + (kh - 1) * dh)
    nrow = max(0, hi - lo + 1)
    row = wp * icg * vl
    gstride = kd * nrow * row
    nss = np.empty(h1 - h0, np.int64)
    buf = _aligned_empty(max(1, nvg * gstride), wf)  # float32 for float16 bits
    for t_d in range(kd):
        i_d = o_d * sd - pd + t_d * dd
        if i_d < 0 or i_d >= id_:
            continue
        for j in range(nrow):
            _gm_into(x, buf, (t_d * nrow + j) * row, gstride, wp, icg, vl, g, pl,
                     (n * id_ + i_d) * ih + lo + j)
    work = np.empty(TILE_D[1], y.dtype)  # the micro-kernel's scratch
    _fwd_rows(tiles, buf.ctypes.data, gstride, wf, y, geo, segs, nss, n, o_d, h0, h1, wp, pl, vl,
              lo, nrow, buf.itemsize, work)


def bwd_d_fused(dy, wq, dx, geo, qtab, runs, vl, pl, wp, rb):
    """:func:`bwd_d_gm` on the channels-last ``dy [mb, od, oh, ow, g*ocg]`` itself:
    per block of ``rb`` rows of dX (of one image and depth), the rows of dY that its taps
    read are copied to group-minor (``[nvg, kd, rows, wp, ocg, VL]``, zero-padded by ``pl``
    along w) into a buffer of the iteration's own, which stays in L2 while the block's rows
    gather from it: no group-minor copy of all of dY written to memory and read back.
    The row gathers are :func:`_bwd_d_rows`."""
    name = "float16" if dy.dtype == np.uint16 else dtype_name(dy.dtype)
    blocks = geo[0] * geo[4] * ((geo[5] + rb - 1) // rb)
    seg_all = np.empty((blocks, rb * 3 * geo[7] * geo[8] * max(1, runs.shape[0])), np.int64)
    _bwd_d_block.run(name, blocks, _row_tiles.table(name), dy, wq, dx, geo, qtab, runs, vl, pl,
                     wp, rb, seg_all)


@separate("void(int64[::1], {S}[:, :, :, :, ::1], {T}[:, ::1], {Y}[:, :, :, :, ::1], "
          "int64[::1], int64[:, ::1], int64[:, ::1], int64, int64, int64, int64, "
          "int64[:, ::1], int64)",
          float32=dict(S="float32", T="float32", Y="float32"),
          float64=dict(S="float64", T="float64", Y="float64"),
          float16=dict(S="uint16", T="float32", Y="uint16"))
def _bwd_d_block(tiles, dy, wq, dx, geo, qtab, runs, vl, pl, wp, rb, seg_all, b):
    """Block ``b`` (flat over image, depth, blocks of ``rb`` rows) of
    :func:`bwd_d_fused`."""
    segs = seg_all[b]
    g, ocg = geo[1], geo[3]
    id_, ih = geo[4], geo[5]
    kd, kh = geo[7], geo[8]
    od, oh = geo[10], geo[11]
    sd, sh = geo[13], geo[14]
    dd, dh = geo[16], geo[17]
    pd, ph = geo[19], geo[20]
    nvg = (g + vl - 1) // vl
    nhb = (ih + rb - 1) // rb
    n = b // (id_ * nhb)
    i_d = (b // nhb) % id_
    h0 = (b % nhb) * rb
    h1 = min(ih, h0 + rb)
    # the rows of dY the block's taps read: lo..hi along h, each valid tap along d
    lo = max(0, -(-(h0 + ph - (kh - 1) * dh) // sh))
    hi = min(oh - 1, (h1 - 1 + ph) // sh)
    nrow = max(0, hi - lo + 1)
    row = wp * ocg * vl
    gstride = kd * nrow * row
    nss = np.empty(h1 - h0, np.int64)
    buf = _aligned_empty(max(1, nvg * gstride), wq)  # float32 for float16 bits
    for t_d in range(kd):
        a_d = i_d + pd - t_d * dd
        if a_d < 0 or a_d % sd != 0 or a_d // sd >= od:
            continue
        o_d = a_d // sd
        for j in range(nrow):
            _gm_into(dy, buf, (t_d * nrow + j) * row, gstride, wp, ocg, vl, g, pl,
                     (n * od + o_d) * oh + lo + j)
    work = np.empty(TILE_D[1], dx.dtype)  # the micro-kernel's scratch
    _bwd_d_rows(tiles, buf.ctypes.data, gstride, wq, dx, geo, qtab, runs, segs, nss, n, i_d, h0,
                h1, wp, vl, lo, nrow, buf.itemsize, work)


def bwd_w_gm(xp, dyg, part, geo, pl, rb, wc):
    """``part[j] += ``dW over the output rows of chunk j (``part`` zeroed, ``[chunks, nvg,
    kd, kh, kw, icg, ocg, VL]``; ``xp`` padded by ``pl`` along w, ``dyg`` unpadded). The
    pixels go in blocks of ``rb`` rows x ``wc`` columns (sized to stay in L1); per block and
    tap, every ``TILE_W`` tile of (input x output channels) sums over the block's rows that
    the tap keeps inside the input."""
    # segment lists allocated here, not in the loop: the micro-kernel reads them by address
    seg_all = np.empty((part.shape[0], 3 * rb), np.int64)
    _bwd_w_chunk.run(dtype_name(xp.dtype), part.shape[0], xp, dyg, part, geo, pl, rb, wc,
                     seg_all)


@separate("void({T}[:, :, :, :, :, :, ::1], {T}[:, :, :, :, :, :, ::1], "
           "{T}[:, :, :, :, :, :, :, ::1], int64[::1], int64, int64, int64, int64[:, ::1], "
           "int64)", float32="float32", float64="float64")
def _bwd_w_chunk(xp, dyg, parts, geo, pl, rb, wc, seg_all, ch):
    """Chunk ``ch`` of :func:`bwd_w_gm`'s output rows into its partial ``parts[ch]``."""
    nch = parts.shape[0]
    rows = geo[0] * geo[10] * geo[11]
    r0, r1 = rows * ch // nch, rows * (ch + 1) // nch
    part, segs = parts[ch], seg_all[ch]
    icg, ocg = geo[2], geo[3]
    id_, ih = geo[4], geo[5]
    kd, kh, kw = geo[7], geo[8], geo[9]
    od, oh, ow = geo[10], geo[11], geo[12]
    sd, sh, sw = geo[13], geo[14], geo[15]
    dd, dh, dw = geo[16], geo[17], geo[18]
    pd, ph, pw = geo[19], geo[20], geo[21]
    nvg, wp, vl = xp.shape[0], xp.shape[4], xp.shape[6]
    P, NV = TILE_W
    it = part.itemsize
    full = vl * it == VECTOR_BYTES
    xs, ys, cs = xp[0].size, dyg[0].size, part[0].size
    work = np.empty(0, part.dtype)
    pa, pb, pc = xp.ctypes.data, dyg.ctypes.data, part.ctypes.data
    sp = segs.ctypes.data
    tap = icg * ocg * vl
    cf = icg - icg % P
    kf = ocg - ocg % NV
    for rs in range(r0, r1, rb):
        for w0 in range(0, ow, wc):
            kl = min(wc, ow - w0)
            for t_d in range(kd):
                for t_h in range(kh):
                    ns = 0
                    for r in range(rs, min(r1, rs + rb)):
                        n = r // (od * oh)
                        o_d = (r // oh) % od
                        o_h = r % oh
                        i_d = o_d * sd - pd + t_d * dd
                        i_h = o_h * sh - ph + t_h * dh
                        if i_d < 0 or i_d >= id_ or i_h < 0 or i_h >= ih:
                            continue
                        segs[3 * ns] = ((((n * id_ + i_d) * ih + i_h) * wp + pl - pw
                                         + w0 * sw) * icg * vl)
                        segs[3 * ns + 1] = (((n * od + o_d) * oh + o_h) * ow + w0) * ocg * vl
                        segs[3 * ns + 2] = kl
                        ns += 1
                    if ns == 0:
                        continue
                    for gv in range(nvg):
                        for t_w in range(kw):
                            a = pa + (gv * xs + t_w * dw * icg * vl) * it
                            b = pb + gv * ys * it
                            c = pc + (gv * cs + ((t_d * kh + t_h) * kw + t_w) * tap) * it
                            for c0 in range(0, cf, P):
                                for k0 in range(0, kf, NV):
                                    _sum_tile(True, full, a + c0 * vl * it, b + k0 * vl * it,
                                              c + (c0 * ocg + k0) * vl * it, sp, ns, vl,
                                              sw * icg * vl, ocg * vl, ocg * vl, work)
                            for c0 in range(icg):
                                for k0 in range(ocg):
                                    if c0 < cf and k0 < kf:
                                        continue
                                    _sum_tile(False, full, a + c0 * vl * it, b + k0 * vl * it,
                                              c + (c0 * ocg + k0) * vl * it, sp, ns, vl,
                                              sw * icg * vl, ocg * vl, ocg * vl, work)


def reduce_w(part, dw):
    """``dw [T, icg, g*ocg]`` = the sum over chunks of ``part [chunks, nvg, T, icg, ocg,
    VL]`` (summed into ``part[0]``), in parallel over (tap, input channel), by register
    transposes of 4 channels x ``VL`` groups (serially, element by element, it took 0.26 ms
    of ResNeXt-3D conv_3d:12's weight gradient)."""
    _reduce_row.run(dtype_name(dw.dtype), part.shape[2] * part.shape[3], part, dw)


@separate("void({T}[:, :, :, :, :, ::1], {T}[:, :, ::1], int64)", float32="float32",
          float64="float64")
def _reduce_row(part, dw, tc):
    """(Tap, input channel) ``tc`` of :func:`reduce_w`."""
    nch, nvg, T, icg, ocg, vl = part.shape
    g = dw.shape[2] // ocg
    it = dw.itemsize
    full = vl * it == VECTOR_BYTES
    p1, d1 = part.reshape(-1), dw.reshape(-1)
    cs = p1.size // nch
    pp, pd = part.ctypes.data, dw.ctypes.data
    n = ocg * vl
    for gv in range(nvg):
        sb = (gv * T * icg + tc) * n
        for j in range(1, nch):
            for e in range(n):
                p1[sb + e] += p1[j * cs + sb + e]
        db = tc * g * ocg + gv * vl * ocg
        nl = min(vl, g - gv * vl)
        if nl < vl:  # the last, partial vector of groups
            for l in range(nl):
                for k in range(ocg):
                    d1[db + l * ocg + k] = p1[sb + k * vl + l]
            continue
        k = 0
        while k < ocg:
            four = k + 4 <= ocg
            _to_channels(four, full, pp + (sb + k * vl) * it, vl, pd + (db + k) * it, ocg,
                         dw)
            k += 4 if four else 1
