"""Implicit-GEMM CUDA kernels for the three directions (CUTLASS's formulation).

Per group ``gi`` each direction is one GEMM ``C[M, N] = A[M, K] . B[K, N]`` whose operands
are never materialised: a thread block computes a ``BM x BN`` tile of ``C``, stepping over
``K`` in slices of ``BK`` that the block stages in shared memory (``As[BK, BM]``,
``Bs[BK, BN]``, gathered straight from the canonical tensors with zeros outside the
image); each of its ``(BM/TM) * (BN/TN)`` threads keeps a ``TM x TN`` register tile of
``C``, read out of shared memory in 16-byte words (see the comment above
:func:`fwd_gemm` for the layout, the warp tiles and the double buffering).

With ``i = o*s - p + t*d`` per axis (see :mod:`numbaconv.kernels.cpu.direct`):

* forward: ``M = mb*od*oh*ow`` pixels, ``N = ocg``, ``K = kd*kh*kw*icg`` (tap, channel).
* backward data, by stride phase (oneDNN; JAX's ``conv_transpose`` algebra): the inputs with
  ``(i + p) % s == q`` receive exactly the taps with ``t*d % s == q``, i.e.
  ``t = t0 + u*s/gcd(s, d)``, and read ``o = j - c0 - u*d/gcd(s, d)`` for ``i = s*j + q - p``.
  Each phase is a dense stride-1 GEMM (``M = mb * prod(#j)``, ``N = icg``,
  ``K = prod(#taps) * ocg``) handled by its own thread blocks (``blockIdx.z``), so there is no
  scatter and no test for divisibility in the inner loop; a phase without taps writes zeros.
* backward weights: ``M = kd*kh*kw*icg`` (tap, channel), ``N = ocg``, ``K = mb*od*oh*ow``
  split over ``blockIdx.z`` into ``nsplit`` ranges of pixels, each writing its own partial
  ``dW``; :func:`reduce_partials` sums the partials in a fixed order (deterministic, no
  atomics).

Kernels take flat (1-D) views of the canonical contiguous arrays and validate nothing; a
factory builds one per (dtype, tile, geometry, splits), the geometry's 22 ints (``mb g
icg ocg``, input, filter and output sizes, strides, dilations, leading pads) and the split
count being compile-time constants. Each thread's share of a tile load is decoded into a
pixel once per tap (forward, backward data) or per output row (weights). float16 never
reaches them: the backend widens it to float32 once, on the device.
"""
import functools

from numba import cuda, float32, float64, int64, uint32, uint64

from . import _ptx
from ._ptx import (ALIGN, LAUNCH_BOUNDS, VECTOR, WIDTH,  # noqa: F401
                   index_type, tf32_round_py)


# -- vector loads and stores in shared memory ------------------------------------------------
# ``load16(a, i)`` is ``(a[i], a[i+1], ...)`` (4 float32 or 2 float64) read by one vector load
# (``ld.shared.v4.f32``, SASS ``LDS.128``); numba compiles reads of neighbouring elements into
# scalar loads only. ``load8`` reads 8 bytes (``LDS.64``), ``store16(a, i, v)`` writes a tuple
# of 16 bytes (``STS.128``). ``a`` is a 1-D C-contiguous array whose element ``i`` starts on
# a boundary of the access's size: the kernels below declare their shared tiles
# ``ALIGN``-aligned and index them in whole words. Under the CUDA simulator
# (``NUMBA_ENABLE_CUDASIM=1``) they are plain functions with the same result, so the
# kernels call them unchanged there.
#
# ``tf32_round(v)``: ``v`` rounded to TF32 (10 explicit mantissa bits, round to nearest, ties
# away from zero: PTX ``cvt.rna.tf32.f32``), as a float32 whose low 13 bits are zero.
# ``mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)``: one warp-wide
# ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`` (D = A . B + C, A 16x8, B 8x8, C
# and D 16x8 float32), each lane passing its fragments (PTX ISA, "Matrix Fragments for
# mma.m16n8k8": lane ``l``, ``g = l // 4``, ``t = l % 4``: ``a_r = A[g + 8*(r%2),
# t + 4*(r//2)]``, ``b_r = B[t + 4*r, g]``, ``c_r = C[g + 8*(r//2), 2*t + r%2]``); returns
# the lane's four elements of D. All are inline PTX from Numba intrinsics whose code
# generation is :mod:`._ptx`'s. Under the simulator ``tf32_round`` is a NumPy function with
# the same result, and the TF32 multiply of a slice reads each thread's rows and columns
# from shared memory itself (a lane cannot see another's registers there).

if _ptx.SIM:
    load16, load8, store16 = _ptx.load16_py, _ptx.load8_py, _ptx.store16_py
    tf32_round = tf32_round_py
    mma_tf32 = None
else:
    from numba.cuda.extending import intrinsic

    @intrinsic
    def load16(typingctx, a, i):
        return _ptx.vector_load(16, a, i)

    @intrinsic
    def load8(typingctx, a, i):
        return _ptx.vector_load(8, a, i)

    @intrinsic
    def store16(typingctx, a, i, v):
        return _ptx.store16(a, i, v)

    @intrinsic
    def tf32_round(typingctx, v):
        return _ptx.tf32_round(v)

    @intrinsic
    def mma_tf32(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        return _ptx.mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)


_TYPES = {"float32": float32, "float64": float64}


def _check(bm, bn, bk, tm, tn):
    if bm % tm or bn % tn or min(bm, bn, bk, tm, tn) < 1:
        raise ValueError(f"CUDA tiles: block {bm}x{bn}x{bk} must be a multiple of the thread "
                         f"tile {tm}x{tn}")


def thread_map(nty, ntx):
    """``(lx, ly, wx)``: thread ``tid`` of a block of ``nty x ntx`` threads is lane
    ``tid % (lx*ly)`` of warp tile ``tid // (lx*ly)``; warp tiles are ``ly x lx`` threads,
    ``wx`` of them across. A warp of 8 x 4 threads reads 8 distinct 16-byte words of the A
    tile and 4 of the B tile per step (one shared-memory wavefront each) where a warp of
    2 x 16 threads would read 2 and 16 (two wavefronts for B). Blocks that are not a whole
    number of such warp tiles are one tile, row-major."""
    if (nty * ntx) % 32 == 0:
        for lx in (4, 8, 2, 16, 1, 32):
            ly = 32 // lx
            if ntx % lx == 0 and nty % ly == 0:
                return lx, ly, ntx // lx
    return ntx, nty, 1


def loader(contiguous, other, threads):
    """``(ch, passes)``: a tile of ``contiguous x other`` elements (``contiguous`` the axis
    that is contiguous in memory) is loaded by ``threads`` threads in ``passes`` passes,
    each thread reading ``ch`` consecutive elements per pass (``ch`` divides
    ``contiguous``, so a chunk never crosses a row)."""
    ch = next(c for c in (4, 3, 2, 1) if contiguous % c == 0)
    return ch, -(-(contiguous * other) // (threads * ch))


def tile_constants(dtype, bm, bn, bk, tm, tn):
    """The compile-time constants of a tile (see :func:`fwd_gemm`)."""
    _check(bm, bn, bk, tm, tn)
    nty, ntx = bm // tm, bn // tn
    vw = WIDTH[dtype]
    ga = vw if tm % vw == 0 and VECTOR else 1
    gb = vw if tn % vw == 0 and VECTOR else 1
    lx, ly, wx = thread_map(nty, ntx)
    return dict(nty=nty, ntx=ntx, nt=nty * ntx, vw=vw, ga=ga, ra=tm // ga, sa=nty * ga,
                gb=gb, rb=tn // gb, sb=ntx * gb, lx=lx, ly=ly, wx=wx, lanes=lx * ly,
                pa=bm + vw, pb=bn + vw)


#: Registers a GEMM thread may use: 65536 per SM over 512 threads (two 256-thread blocks).
MAX_REGISTERS = 128


def launch_bounds(threads, dtype="float32", precision="exact", bk=8, tmn=64):
    """``(threads per block, blocks per SM)`` that caps a float32 GEMM kernel at
    :data:`MAX_REGISTERS` registers per thread (PTX ``.maxntid``/``.minnctapersm``); float64
    (twice the registers per value) gets one block per SM, and so do the TF32 kernels with
    K slices deeper than 8 (twice the operands staged in registers across the multiply)
    or more than 64 accumulators per thread (``tmn``): up to 255 registers, each block's
    warps issuing more tensor-core work per slice."""
    if dtype != "float32" or (precision == "tf32" and (bk > 8 or tmn > 64)):
        return threads, 1
    return threads, max(1, 65536 // (MAX_REGISTERS * threads))


def _kernel(fn, threads, dtype, precision="exact", bk=8, tmn=64):
    """``cuda.jit(fn)`` with :func:`launch_bounds` (not in the simulator, which takes none)."""
    if not LAUNCH_BOUNDS:
        return cuda.jit(fn)
    return cuda.jit(fn, launch_bounds=launch_bounds(threads, dtype, precision, bk, tmn))


def unroll(bk, tm, tn):
    """K steps written out per iteration of the multiply loop: about 128 multiply-adds per
    iteration (the loop's own bookkeeping then costs under a tenth of the issue slots;
    the compiler unrolls a thread's register tile but not a slice of K steps), at most
    8 and half of ``bk`` (a fully written-out slice holds more registers across it), and
    a divisor of ``bk``."""
    return next(u for u in (8, 4, 2, 1)
                if bk % u == 0 and (u == 1 or u * tm * tn <= 128 and 2 * u <= bk))


@functools.lru_cache(maxsize=None)
def mma_step(dtype, bm, bn, bk, tm, tn, ku=None):
    """The multiply of one K slice (``bk`` steps) into a thread's register tile:
    ``acc[a, b] += As[kk, row a] * Bs[kk, col b]`` with ``As``/``Bs`` read from ``ao``/``bo``
    (the buffer plus the thread's first row/column) on, one 16-byte word per group of rows
    (columns). An inline device function; :func:`unroll` steps per loop iteration."""
    k = tile_constants(dtype, bm, bn, bk, tm, tn)
    GA, RA, SA, GB, RB, SB, VW = k["ga"], k["ra"], k["sa"], k["gb"], k["rb"], k["sb"], k["vw"]
    PA, PB = k["pa"], k["pb"]
    KU = ku or unroll(bk, tm, tn)

    def step(As, Bs, ao, bo, ra, rb, acc):
        for g in range(RA):
            if GA == VW:
                v4 = load16(As, ao + g * SA)
                for i in range(GA):
                    ra[g * GA + i] = v4[i]
            else:
                for i in range(GA):
                    ra[g * GA + i] = As[uint64(ao + g * SA + i)]
        for g in range(RB):
            if GB == VW:
                v4 = load16(Bs, bo + g * SB)
                for i in range(GB):
                    rb[g * GB + i] = v4[i]
            else:
                for i in range(GB):
                    rb[g * GB + i] = Bs[uint64(bo + g * SB + i)]
        for a in range(tm):
            for b in range(tn):
                acc[a * tn + b] += ra[a] * rb[b]

    step = cuda.jit(device=True, inline="always")(step)

    def mma_slice(As, Bs, ao, bo, ra, rb, acc):
        for ku in range(bk // KU):
            kk = ku * KU
            step(As, Bs, ao + kk * PA, bo + kk * PB, ra, rb, acc)
            if KU > 1:
                step(As, Bs, ao + (kk + 1) * PA, bo + (kk + 1) * PB, ra, rb, acc)
            if KU > 2:
                step(As, Bs, ao + (kk + 2) * PA, bo + (kk + 2) * PB, ra, rb, acc)
                step(As, Bs, ao + (kk + 3) * PA, bo + (kk + 3) * PB, ra, rb, acc)
            if KU > 4:
                step(As, Bs, ao + (kk + 4) * PA, bo + (kk + 4) * PB, ra, rb, acc)
                step(As, Bs, ao + (kk + 5) * PA, bo + (kk + 5) * PB, ra, rb, acc)
                step(As, Bs, ao + (kk + 6) * PA, bo + (kk + 6) * PB, ra, rb, acc)
                step(As, Bs, ao + (kk + 7) * PA, bo + (kk + 7) * PB, ra, rb, acc)

    return cuda.jit(device=True, inline="always")(mma_slice)


PRECISIONS = ("exact", "tf32")


def tf32_tile_reason(dtype, bm, bn, bk, tm, tn):
    """None where tile ``(bm, bn, bk, tm, tn)`` suits the TF32 kernels, else why not: warp
    tiles of ``8*tm x 4*tn`` (``tm/2`` x ``tn/2`` m16n8 tiles per warp: the same
    accumulators per thread as the FFMA tile), whole warps, slices of whole k8 steps."""
    if dtype != "float32":
        return f"TF32 takes float32 operands, not {dtype}"
    nt = (bm // tm) * (bn // tn)
    if tm % 2 or tn % 2 or bk % 8 or bm % (8 * tm) or bn % (4 * tn) or nt % 32:
        return (f"tile {bm}x{bn}x{bk} {tm}x{tn} is no whole number of m16n8k8 warp tiles "
                f"(thread tile even, BK a multiple of 8, {nt} threads a multiple of 32)")
    return None


@functools.lru_cache(maxsize=None)
def scheme(dtype, bm, bn, bk, tm, tn, precision="exact"):
    """How a thread of a GEMM kernel multiplies and where its accumulators sit.

    A dict: ``slice`` (the multiply of one K slice, :func:`mma_step` or its TF32 twin),
    ``offsets(tid)`` (inline: the thread's offsets into a shared A and B buffer for
    ``slice``, and its first result row and column), ``rnd`` (applied to every value
    stored into shared memory: identity, or ``tf32_round``), ``ra``/``rb`` (register
    operands per step), and the result row of accumulator row ``a`` is ``(a // ega)*esa +
    (a % ega)*eha + row0`` (columns likewise with ``egb``, ``esb``, ``ehb``).

    ``"exact"``: thread ``(ty, tx)`` of warp tiles of 8 x 4 threads owns groups of ``GA``
    consecutive rows ``SA`` apart (columns ``GB``, ``SB``), read as 16-byte words.
    ``"tf32"``: warp ``w`` owns the ``8*tm x 4*tn`` warp tile ``w`` (row-major over the
    block tile), split into m16n8 tiles; lane ``(g, t)`` holds rows ``g``, ``g + 8`` and
    columns ``2t``, ``2t + 1`` of each (:data:`mma_tf32`'s fragments).
    """
    k = tile_constants(dtype, bm, bn, bk, tm, tn)
    PA, PB = k["pa"], k["pb"]
    if precision == "exact":
        lanes, lx, ly, wx = k["lanes"], k["lx"], k["ly"], k["wx"]
        GA, SA, GB, SB = k["ga"], k["sa"], k["gb"], k["sb"]

        def offsets(tid):
            wq = tid // lanes
            lane = tid % lanes
            ty = (wq // wx) * ly + lane // lx
            tx = (wq % wx) * lx + lane % lx
            return ty * GA, tx * GB, ty * GA, tx * GB

        def rnd(v):
            return v

        return dict(slice=mma_step(dtype, bm, bn, bk, tm, tn),
                    offsets=cuda.jit(device=True, inline="always")(offsets),
                    rnd=cuda.jit(device=True, inline="always")(rnd), ra=tm, rb=tn,
                    ega=GA, esa=SA, eha=1, egb=GB, esb=SB, ehb=1, pa=PA, pb=PB)
    why = tf32_tile_reason(dtype, bm, bn, bk, tm, tn)
    if precision != "tf32" or why is not None:
        raise ValueError(f"GEMM precision {precision!r}: {why or 'unknown precision'}")
    WM, WN = 8 * tm, 4 * tn
    MI, NI = tm // 2, tn // 2
    WXN = bn // WN
    KS = bk // 8
    TN = tn
    PA, PB = padded_rows(bm, bn, "tf32")
    # A's rows are relabelled within the warp tile so that the two rows of a lane's
    # fragment at one k are neighbours in shared memory (an m16n8k8 product treats A's
    # rows independently, so relabelling them relabels D's rows the same way): logical
    # row 16*i + 8*h + g of m16 tile i sits at warp-tile row 64*(i//4) + 2*G4*g +
    # 2*(i%4) + h (G4 = min(MI, 4): groups of at most four m16 tiles, 64 rows). Registers
    # a0, a1 (k = t) and a2, a3 (k = t + 4) are then two 8-byte loads (LDS.64) straight
    # into the operand's register pairs; with A's rows 2 words modulo 4 longer than the
    # tile, the 16 lanes of each phase hit distinct banks (lane offsets 2*G4*g apart, at
    # most 8 words). B is read as the ISA lays it out (b0 at k = t, b1 at k = t + 4,
    # column g), B's rows 8 words modulo 32 longer than the tile (8 lanes' rows 8 banks
    # apart). Register r of m16 tile i comes from a_frag[r] + a_tile[i], b_r of n8 tile j
    # from b_frag[r] + 8*j, relative to the lane's offsets.
    G4 = min(MI, 4)
    AT = tuple(64 * (i // 4) + 2 * (i % 4) for i in range(MI))
    AF = (0, 1, 4 * PA, 4 * PA + 1)
    BF = (0, 4 * PB)

    def offsets_tc(tid):
        w = tid // 32
        g = (tid % 32) // 4
        t = tid % 4
        wm0 = (w // WXN) * WM
        wn0 = (w % WXN) * WN
        return t * PA + wm0 + 2 * G4 * g, t * PB + wn0 + g, wm0 + 2 * G4 * g, wn0 + 2 * t

    if _ptx.SIM:
        def slice_tc(As, Bs, ao, bo, ra, rb, acc):
            # each thread's own elements of D = A . B + C, from shared memory (k in order)
            tid = cuda.threadIdx.x
            g = (tid % 32) // 4
            t = tid % 4
            a0 = ao - t * PA
            b0 = bo - t * PB - g
            for ks in range(KS):
                for i in range(MI):
                    for h in range(2):
                        for j in range(NI):
                            for e in range(2):
                                v = acc[(2 * i + h) * TN + 2 * j + e]
                                for kk in range(8):
                                    kq = ks * 8 + kk
                                    v += (As[a0 + kq * PA + AT[i] + h]
                                          * Bs[b0 + kq * PB + 8 * j + 2 * t + e])
                                acc[(2 * i + h) * TN + 2 * j + e] = v
    else:
        def slice_tc(As, Bs, ao, bo, ra, rb, acc):
            for ks in range(KS):
                o = ao + ks * 8 * PA
                for i in range(MI):
                    lo = load8(As, o + AT[i])
                    hi = load8(As, o + 4 * PA + AT[i])
                    ra[4 * i] = lo[0]
                    ra[4 * i + 1] = lo[1]
                    ra[4 * i + 2] = hi[0]
                    ra[4 * i + 3] = hi[1]
                o = bo + ks * 8 * PB
                for j in range(NI):
                    rb[2 * j] = Bs[uint64(o + 8 * j)]
                    rb[2 * j + 1] = Bs[uint64(o + 4 * PB + 8 * j)]
                for i in range(MI):
                    for j in range(NI):
                        c0 = (2 * i) * TN + 2 * j
                        c2 = c0 + TN
                        d = mma_tf32(ra[4 * i], ra[4 * i + 1], ra[4 * i + 2], ra[4 * i + 3],
                                     rb[2 * j], rb[2 * j + 1], acc[c0], acc[c0 + 1],
                                     acc[c2], acc[c2 + 1])
                        acc[c0] = d[0]
                        acc[c0 + 1] = d[1]
                        acc[c2] = d[2]
                        acc[c2 + 1] = d[3]

    def rnd_tc(v):
        return tf32_round(v)

    return dict(slice=cuda.jit(device=True, inline="always")(slice_tc),
                offsets=cuda.jit(device=True, inline="always")(offsets_tc),
                rnd=cuda.jit(device=True, inline="always")(rnd_tc), ra=2 * tm, rb=tn,
                ega=8, esa=64, eha=1, egb=2, esb=8, ehb=1, a_frag=AF, b_frag=BF,
                a_tile=AT, b_step=8, pa=PA, pb=PB)


def padded_rows(bm, bn, precision="exact", dtype="float32"):
    """``(PA, PB)``: the row lengths of the shared tiles ``As[BK][PA]`` and ``Bs[BK][PB]``.
    The FFMA kernels pad a row by one 16-byte word (their transposed stores then hit
    distinct banks); the TF32 kernels A's by 2 words (rows 8-byte aligned, and the 16
    lanes of a phase of their LDS.64 fragment loads on distinct banks) and B's by 8 (a
    row 8 banks on from the one before: the 8 rows' 4 columns that a warp's scalar loads
    touch are distinct banks) -- see :func:`scheme`."""
    if precision == "tf32":
        return bm + 2, bn + 8
    vw = WIDTH[dtype]
    return bm + vw, bn + vw


def shared_bytes(dtype, bm, bn, bk, precision="exact"):
    """Static shared memory of the GEMM kernels: two buffers of each padded tile."""
    pa, pb = padded_rows(bm, bn, precision, dtype)
    return 2 * bk * (pa + pb) * (4 if dtype == "float32" else 8)


@functools.lru_cache(maxsize=None)
def row_store(rnd, dtype, ch, vector=True):
    """``put(buf, i, src, s)``: ``buf[i + q] = rnd(src[s + q])`` for ``q < ch``, ``rnd`` the
    scheme's rounding (:func:`scheme`'s ``rnd``: identity, or ``tf32_round``): one 16-byte
    store (:func:`store16`) where ``ch`` elements make a 16-byte word and the shared tiles
    are aligned (and ``vector``: the tile's rows are whole 16-byte words), else ``ch``
    scalar stores. For the stores of a tile row that is contiguous in shared memory (``i``
    a multiple of ``ch``)."""
    vw = WIDTH[dtype]
    if ch == vw == 4 and VECTOR and vector:
        def put(buf, i, src, s):
            store16(buf, i, (rnd(src[s]), rnd(src[s + 1]), rnd(src[s + 2]), rnd(src[s + 3])))
    elif ch == vw == 2 and VECTOR and vector:
        def put(buf, i, src, s):
            store16(buf, i, (rnd(src[s]), rnd(src[s + 1])))
    else:
        def put(buf, i, src, s):
            for q in range(ch):
                buf[uint64(i + q)] = rnd(src[s + q])
    return cuda.jit(device=True, inline="always")(put)


# The three kernels share one structure (repeated in each; the multiply is the inline
# device function of :func:`mma_step`):
#
# * thread (ty, tx) owns rows ``(a // GA)*SA + ty*GA + a % GA`` and columns
#   ``(b // GB)*SB + tx*GB + b % GB`` of the block tile: groups of GA (GB) consecutive rows
#   (columns), read from shared memory as one 16-byte word each (``load16``);
# * shared tiles ``As[buf, kk, m]`` and ``Bs[buf, kk, n]`` (``m``, ``n`` fastest), rows
#   padded by a 16-byte word: the transposed stores of a K-contiguous operand then hit 32
#   distinct banks per warp, and every row stays 16-byte aligned;
# * one loop step per K slice ``it``: read slice ``it`` from global memory into registers,
#   multiply slice ``it - 1`` out of shared buffer ``(it - 1) % 2``, store the registers
#   into buffer ``it % 2``, synchronise once (double buffering: the global loads' latency
#   hides behind the multiply-adds);
# * the geometry is a closure constant (one kernel per problem and tile, cached), so
#   divisions by sizes and strides fold into multiplications or away;
# * split-K: ``blockIdx.z`` also runs over ``nsplit`` contiguous ranges of K slices, each
#   written to its own partial result (``out`` is ``[nsplit, size]``, flat) and summed
#   afterwards by :func:`reduce_partials` in a fixed order.


@functools.lru_cache(maxsize=512)
def fwd_gemm(dtype, bm, bn, bk, tm, tn, geo, nsplit=1, precision="exact"):
    """``y[n, o, gi*ocg + col] = sum_{t, c} x[n, o*s - p + t*d, gi*icg + c] * w[t, c, gi*ocg + col]``.

    ``x``, ``w`` and ``y`` flat (1-D views of the canonical arrays; ``y`` is
    ``[nsplit, mb*od*oh*ow*oc]``). Grid ``(ceil(M/bm), ceil(ocg/bn), g*nsplit)``,
    ``(bm/tm)*(bn/tn)`` threads; ``y`` is fully written. ``K`` runs tap by tap and, within
    a tap, over channel slices of ``bk``; each thread's A loads are one pixel per pass,
    whose input offset is worked out once per tap.
    """
    k = tile_constants(dtype, bm, bn, bk, tm, tn)
    T = _TYPES[dtype]
    nt, lanes, lx, ly, wx = k["nt"], k["lanes"], k["lx"], k["ly"], k["wx"]
    GA, RA, SA, GB, RB, SB, VW = k["ga"], k["ra"], k["sa"], k["gb"], k["rb"], k["sb"], k["vw"]
    MB, G, ICG, OCG, ID, IH, IW, KD, KH, KW, OD, OH, OW, SD, SH, SW, DD, DH, DW, PD, PH, PW = geo
    IC, OC = G * ICG, G * OCG
    M = MB * OD * OH * OW
    NSL = -(-ICG // bk)
    Q = KD * KH * KW * NSL
    YS = M * OC
    # (32-bit divisions by constants where the slice count and the rows fit: a 64-bit one
    # takes about four times the instructions)
    UQ = uint32 if Q < 2 ** 32 else uint64
    UM = uint32 if M + bm < 2 ** 32 else uint64
    IX = index_type(MB * ID * IH * IW * IC, KD * KH * KW * ICG * OC, nsplit * YS)
    ACH, ANP = loader(bk, bm, nt)
    BCH, BNP = loader(bn, bk, nt)
    TMN = tm * tn
    ALIGNED = VECTOR and ALIGN is not None
    SCH = scheme(dtype, bm, bn, bk, tm, tn, precision)
    PA, PB = SCH["pa"], SCH["pb"]
    put_b = row_store(SCH["rnd"], dtype, BCH, PB % k["vw"] == 0)
    offsets, rnd, RAN, RBN = SCH["offsets"], SCH["rnd"], SCH["ra"], SCH["rb"]
    EGA, ESA, EHA = SCH["ega"], SCH["esa"], SCH["eha"]
    EGB, ESB, EHB = SCH["egb"], SCH["esb"], SCH["ehb"]
    mma_slice = SCH["slice"]
    ASZ, BSZ = 2 * bk * PA, 2 * bk * PB
    AE, BE = ANP * ACH, BNP * BCH

    def fwd_gemm(x, w, y):
        if ALIGNED:  # (a compile-time constant: numba drops the other branch)
            As = cuda.shared.array(ASZ, T, alignment=16)
        else:
            As = cuda.shared.array(ASZ, T)
        if ALIGNED:  # (a compile-time constant: numba drops the other branch)
            Bs = cuda.shared.array(BSZ, T, alignment=16)
        else:
            Bs = cuda.shared.array(BSZ, T)
        acc = cuda.local.array(TMN, T)
        ra = cuda.local.array(RAN, T)
        rb = cuda.local.array(RBN, T)
        ga = cuda.local.array(AE, T)
        gb = cuda.local.array(BE, T)
        # per A pass: the flat offset of the current tap's pixel (-1: outside the image)
        aoff = cuda.local.array(ANP, IX)
        tid = cuda.threadIdx.x
        ao_t, bo_t, row0, col0 = offsets(tid)
        m0 = cuda.blockIdx.x * bm
        n0 = cuda.blockIdx.y * bn
        gi = cuda.blockIdx.z // nsplit
        sp = cuda.blockIdx.z % nsplit
        qb = Q * sp // nsplit
        qe = Q * (sp + 1) // nsplit
        xc = gi * ICG
        wc = gi * OCG + n0
        for i in range(TMN):
            acc[i] = T(0)
        for it in range(qb, qe + 1):
            if it < qe:
                # slice it: tap t, channels c0... (divisions by constants; counters kept
                # across the multiply loop would hold registers)
                # (unsigned: a division by a constant is then a multiply-high and a
                # shift, without the sign fix-ups of Python's floor division)
                t = int64(UQ(it) // UQ(NSL))
                c0 = (it - t * NSL) * bk
                tq = UQ(t) // UQ(KW)
                t_w = t - int64(tq) * KW
                t_h = int64(tq % UQ(KH))
                t_d = int64(tq // UQ(KH))
                if c0 == 0 or it == qb:
                    # the pass's pixel, decoded again per tap (divisions by constants)
                    # rather than kept in registers across the multiply loop
                    for l in range(ANP):
                        e0 = (tid + l * nt) * ACH
                        m = m0 + e0 // bk
                        aoff[l] = -1
                        if e0 < bm * bk and m < M:
                            um = UM(m)
                            o_w = int64(um % UM(OW))
                            ur = um // UM(OW)
                            o_h = int64(ur % UM(OH))
                            ur = ur // UM(OH)
                            i_d = int64(ur % UM(OD)) * SD - PD + t_d * DD
                            i_h = o_h * SH - PH + t_h * DH
                            i_w = o_w * SW - PW + t_w * DW
                            if (i_d >= 0 and i_d < ID and i_h >= 0 and i_h < IH
                                    and i_w >= 0 and i_w < IW):
                                aoff[l] = (((int64(ur // UM(OD)) * ID + i_d) * IH + i_h)
                                           * IW + i_w) * IC + xc
                for l in range(ANP):
                    cc = c0 + ((tid + l * nt) * ACH) % bk
                    for j in range(ACH):
                        v = T(0)
                        if aoff[l] >= 0 and cc + j < ICG:
                            v = x[uint64(aoff[l] + cc + j)]
                        ga[l * ACH + j] = v
                wt = ((t_d * KH + t_h) * KW + t_w) * ICG * OC + wc
                for l in range(BNP):
                    e0 = (tid + l * nt) * BCH
                    c = c0 + e0 // bn
                    nn = e0 % bn
                    for j in range(BCH):
                        v = T(0)
                        if e0 < bk * bn and c < ICG and n0 + nn + j < OCG:
                            v = w[uint64(wt + c * OC + nn + j)]
                        gb[l * BCH + j] = v
            if it > qb:
                ab = ((it - qb - 1) % 2) * (bk * PA) + ao_t
                bb = ((it - qb - 1) % 2) * (bk * PB) + bo_t
                mma_slice(As, Bs, ab, bb, ra, rb, acc)
            if it < qe:
                ab = ((it - qb) % 2) * (bk * PA)
                bb = ((it - qb) % 2) * (bk * PB)
                for l in range(ANP):
                    e0 = (tid + l * nt) * ACH
                    if e0 < bm * bk:
                        row = e0 // bk
                        kk0 = e0 % bk
                        for j in range(ACH):
                            As[uint64(ab + (kk0 + j) * PA + row)] = rnd(ga[l * ACH + j])
                for l in range(BNP):
                    e0 = (tid + l * nt) * BCH
                    if e0 < bk * bn:
                        put_b(Bs, bb + (e0 // bn) * PB + e0 % bn, gb, l * BCH)
            cuda.syncthreads()
        for a in range(tm):
            m = m0 + (a // EGA) * ESA + (a % EGA) * EHA + row0
            if m < M:
                for b in range(tn):
                    col = (b // EGB) * ESB + (b % EGB) * EHB + col0
                    if n0 + col < OCG:
                        y[uint64(sp * YS + m * OC + wc + col)] = acc[a * tn + b]

    return _kernel(fwd_gemm, nt, dtype, precision, bk, tm * tn)


@functools.lru_cache(maxsize=512)
def bwd_d_gemm(dtype, bm, bn, bk, tm, tn, geo, nsplit=1, precision="exact"):
    """``dx`` by stride phase: ``dx[n, i, gi*icg + c] = sum dy[n, o, gi*ocg + k] * w[t, c, gi*ocg + k]``.

    Flat ``dy``, ``w``, ``dx`` (``dx`` is ``[nsplit, mb*id*ih*iw*ic]``). Grid
    ``(ceil(max_phase_M/bm), ceil(icg/bn), g*sd*sh*sw*nsplit)``; every element of ``dx``
    belongs to exactly one phase and is written once per split (zeros where no tap reaches
    it). ``K`` runs over the phase's taps and, within a tap, over slices of ``bk`` output
    channels (no division in the slice loop).
    """
    k = tile_constants(dtype, bm, bn, bk, tm, tn)
    T = _TYPES[dtype]
    nt, lanes, lx, ly, wx = k["nt"], k["lanes"], k["lx"], k["ly"], k["wx"]
    GA, RA, SA, GB, RB, SB, VW = k["ga"], k["ra"], k["sa"], k["gb"], k["rb"], k["sb"], k["vw"]
    MB, G, ICG, OCG, ID, IH, IW, KD, KH, KW, OD, OH, OW, SD, SH, SW, DD, DH, DW, PD, PH, PW = geo
    IC, OC = G * ICG, G * OCG
    NPH = SD * SH * SW
    NSL = -(-OCG // bk)
    XS = MB * ID * IH * IW * IC
    IX = index_type(MB * OD * OH * OW * OC, KD * KH * KW * ICG * OC, nsplit * XS)
    ACH, ANP = loader(bk, bm, nt)
    BCH, BNP = loader(bk, bn, nt)
    TMN = tm * tn
    ALIGNED = VECTOR and ALIGN is not None
    SCH = scheme(dtype, bm, bn, bk, tm, tn, precision)
    PA, PB = SCH["pa"], SCH["pb"]
    offsets, rnd, RAN, RBN = SCH["offsets"], SCH["rnd"], SCH["ra"], SCH["rb"]
    EGA, ESA, EHA = SCH["ega"], SCH["esa"], SCH["eha"]
    EGB, ESB, EHB = SCH["egb"], SCH["esb"], SCH["ehb"]
    mma_slice = SCH["slice"]
    ASZ, BSZ = 2 * bk * PA, 2 * bk * PB
    AE, BE = ANP * ACH, BNP * BCH
    PHASES = _ptx.phase_table(geo)

    def bwd_d_gemm(dy, w, dx):
        if ALIGNED:  # (a compile-time constant: numba drops the other branch)
            As = cuda.shared.array(ASZ, T, alignment=16)
        else:
            As = cuda.shared.array(ASZ, T)
        if ALIGNED:  # (a compile-time constant: numba drops the other branch)
            Bs = cuda.shared.array(BSZ, T, alignment=16)
        else:
            Bs = cuda.shared.array(BSZ, T)
        acc = cuda.local.array(TMN, T)
        ra = cuda.local.array(RAN, T)
        rb = cuda.local.array(RBN, T)
        ga = cuda.local.array(AE, T)
        gb = cuda.local.array(BE, T)
        apix = cuda.local.array(ANP, IX)
        abd = cuda.local.array(ANP, IX)
        abh = cuda.local.array(ANP, IX)
        abw = cuda.local.array(ANP, IX)
        aoff = cuda.local.array(ANP, IX)
        tid = cuda.threadIdx.x
        ao_t, bo_t, row0, col0 = offsets(tid)
        m0 = cuda.blockIdx.x * bm
        n0 = cuda.blockIdx.y * bn
        sp = cuda.blockIdx.z % nsplit
        zz = cuda.blockIdx.z // nsplit
        gi = zz // NPH
        q = zz % NPH
        q_w = q % SW
        q_h = (q // SW) % SH
        q_d = q // (SW * SH)
        # the phase's taps and pixels per axis (_ptx.phase_table, worked out on the host);
        # phs[a] = t0 tstep nt c0 ostep j0 nj
        phs = cuda.local.array((3, 7), int64)
        for a in range(3):
            for f in range(7):
                phs[a, f] = PHASES[q][a * 7 + f]
        t0d, tsd, ntd, c0d, osd, j0d, njd = phs[0, 0], phs[0, 1], phs[0, 2], phs[0, 3], phs[0, 4], phs[0, 5], phs[0, 6]
        t0h, tsh, nth, c0h, osh, j0h, njh = phs[1, 0], phs[1, 1], phs[1, 2], phs[1, 3], phs[1, 4], phs[1, 5], phs[1, 6]
        t0w, tsw, ntw, c0w, osw, j0w, njw = phs[2, 0], phs[2, 1], phs[2, 2], phs[2, 3], phs[2, 4], phs[2, 5], phs[2, 6]
        M = MB * njd * njh * njw
        if m0 >= M:  # uniform over the block: phases differ in size
            return
        Q = ntd * nth * ntw * NSL
        qb = Q * sp // nsplit
        qe = Q * (sp + 1) // nsplit
        yc = gi * OCG
        for i in range(TMN):
            acc[i] = T(0)
        for l in range(ANP):
            e0 = (tid + l * nt) * ACH
            m = m0 + e0 // bk
            apix[l] = -1
            if e0 < bm * bk and m < M:
                j_w = m % njw
                r = m // njw
                j_h = r % njh
                r = r // njh
                apix[l] = (r // njd) * OD
                abd[l] = j0d + r % njd - c0d
                abh[l] = j0h + j_h - c0h
                abw[l] = j0w + j_w - c0w
        u = qb // NSL
        k0 = (qb % NSL) * bk
        u_w = 0
        u_h = 0
        u_d = 0
        if ntw > 0 and nth > 0:
            u_w = u % ntw
            u_h = (u // ntw) % nth
            u_d = u // (ntw * nth)
        newtap = True
        for it in range(qb, qe + 1):
            if it < qe:
                if newtap:
                    for l in range(ANP):
                        aoff[l] = -1
                        if apix[l] >= 0:
                            o_d = abd[l] - u_d * osd
                            o_h = abh[l] - u_h * osh
                            o_w = abw[l] - u_w * osw
                            if (o_d >= 0 and o_d < OD and o_h >= 0 and o_h < OH
                                    and o_w >= 0 and o_w < OW):
                                aoff[l] = (((apix[l] + o_d) * OH + o_h) * OW + o_w) * OC + yc
                    newtap = False
                for l in range(ANP):
                    kc = k0 + ((tid + l * nt) * ACH) % bk
                    for j in range(ACH):
                        v = T(0)
                        if aoff[l] >= 0 and kc + j < OCG:
                            v = dy[uint64(aoff[l] + kc + j)]
                        ga[l * ACH + j] = v
                wt = ((((t0d + u_d * tsd) * KH + t0h + u_h * tsh) * KW + t0w + u_w * tsw)
                      * ICG * OC + yc)
                for l in range(BNP):
                    e0 = (tid + l * nt) * BCH
                    nn = e0 // bk
                    kc = k0 + e0 % bk
                    for j in range(BCH):
                        v = T(0)
                        if e0 < bk * bn and kc + j < OCG and n0 + nn < ICG:
                            v = w[uint64(wt + (n0 + nn) * OC + kc + j)]
                        gb[l * BCH + j] = v
                k0 += bk
                if k0 >= OCG:
                    k0 = 0
                    newtap = True
                    u_w += 1
                    if u_w == ntw:
                        u_w = 0
                        u_h += 1
                        if u_h == nth:
                            u_h = 0
                            u_d += 1
            if it > qb:
                ab = ((it - qb - 1) % 2) * (bk * PA) + ao_t
                bb = ((it - qb - 1) % 2) * (bk * PB) + bo_t
                mma_slice(As, Bs, ab, bb, ra, rb, acc)
            if it < qe:
                ab = ((it - qb) % 2) * (bk * PA)
                bb = ((it - qb) % 2) * (bk * PB)
                for l in range(ANP):
                    e0 = (tid + l * nt) * ACH
                    if e0 < bm * bk:
                        row = e0 // bk
                        kk0 = e0 % bk
                        for j in range(ACH):
                            As[uint64(ab + (kk0 + j) * PA + row)] = rnd(ga[l * ACH + j])
                for l in range(BNP):
                    e0 = (tid + l * nt) * BCH
                    if e0 < bk * bn:
                        nn = e0 // bk
                        kk0 = e0 % bk
                        for j in range(BCH):
                            Bs[uint64(bb + (kk0 + j) * PB + nn)] = rnd(gb[l * BCH + j])
            cuda.syncthreads()
        for a in range(tm):
            m = m0 + (a // EGA) * ESA + (a % EGA) * EHA + row0
            if m < M:
                j_w = m % njw
                r = m // njw
                j_h = r % njh
                r = r // njh
                i_d = (j0d + r % njd) * SD + q_d - PD
                n = r // njd
                i_h = (j0h + j_h) * SH + q_h - PH
                i_w = (j0w + j_w) * SW + q_w - PW
                base = sp * XS + (((n * ID + i_d) * IH + i_h) * IW + i_w) * IC + gi * ICG + n0
                for b in range(tn):
                    col = (b // EGB) * ESB + (b % EGB) * EHB + col0
                    if n0 + col < ICG:
                        dx[uint64(base + col)] = acc[a * tn + b]

    return _kernel(bwd_d_gemm, nt, dtype, precision, bk, tm * tn)


@functools.lru_cache(maxsize=512)
def bwd_w_gemm(dtype, bm, bn, bk, tm, tn, geo, nsplit=1, precision="exact"):
    """Split-K weight gradient: ``part[j, t, c, gi*ocg + k] = sum_{pixels of split j} x * dy``.

    Flat ``x``, ``dy`` and ``part`` (``[nsplit, kd*kh*kw*icg*oc]``). Grid
    ``(ceil(kd*kh*kw*icg/bm), ceil(ocg/bn), g*nsplit)``; every element of ``part`` is
    written once. ``K`` (the output pixels) runs in chunks of ``bk`` pixels of one output
    row: ``Q = mb*od*oh*ceil(ow/bk)`` chunks, split ``j`` summing chunks
    ``[Q*j // nsplit, Q*(j+1) // nsplit)``; the chunk's row is advanced by counters, not
    decoded by division.
    """
    k = tile_constants(dtype, bm, bn, bk, tm, tn)
    T = _TYPES[dtype]
    nt, lanes, lx, ly, wx = k["nt"], k["lanes"], k["lx"], k["ly"], k["wx"]
    GA, RA, SA, GB, RB, SB, VW = k["ga"], k["ra"], k["sa"], k["gb"], k["rb"], k["sb"], k["vw"]
    MB, G, ICG, OCG, ID, IH, IW, KD, KH, KW, OD, OH, OW, SD, SH, SW, DD, DH, DW, PD, PH, PW = geo
    IC, OC = G * ICG, G * OCG
    M = KD * KH * KW * ICG
    NCH = -(-OW // bk)
    Q = MB * OD * OH * NCH
    WS = M * OC
    IX = index_type(MB * ID * IH * IW * IC, MB * OD * OH * OW * OC, nsplit * WS)
    ACH, ANP = loader(bm, bk, nt)
    if ICG % ACH:
        # a pass's ACH rows must share one tap: one row per pass where ICG is no multiple
        ACH, ANP = 1, -(-(bm * bk) // nt)
    BCH, BNP = loader(bn, bk, nt)
    # each pass's tap state (channel, tap offsets) is kept in registers; with one row per
    # pass and the block's threads a multiple of BM, every pass of a thread has the same
    # row, and one state serves them all
    SAME = ACH == 1 and nt % bm == 0
    NS = 1 if SAME else ANP
    # (one row per pass of a 3-D problem holds more load registers across the multiply:
    # one K step per iteration of it then, or the 8x8 tile spills)
    SCH = scheme(dtype, bm, bn, bk, tm, tn, precision)
    PA, PB = SCH["pa"], SCH["pb"]
    put_a = row_store(SCH["rnd"], dtype, ACH, PA % k["vw"] == 0)
    put_b = row_store(SCH["rnd"], dtype, BCH, PB % k["vw"] == 0)
    offsets, rnd, RAN, RBN = SCH["offsets"], SCH["rnd"], SCH["ra"], SCH["rb"]
    EGA, ESA, EHA = SCH["ega"], SCH["esa"], SCH["eha"]
    EGB, ESB, EHB = SCH["egb"], SCH["esb"], SCH["ehb"]
    mma_slice = (mma_step(dtype, bm, bn, bk, tm, tn, 1 if SAME and ANP > 1 and KD > 1 else None)
                 if precision == "exact" else SCH["slice"])
    TMN = tm * tn
    ALIGNED = VECTOR and ALIGN is not None
    ASZ, BSZ = 2 * bk * PA, 2 * bk * PB
    AE, BE = ANP * ACH, BNP * BCH

    def bwd_w_gemm(x, dy, part):
        if ALIGNED:  # (a compile-time constant: numba drops the other branch)
            As = cuda.shared.array(ASZ, T, alignment=16)
        else:
            As = cuda.shared.array(ASZ, T)
        if ALIGNED:  # (a compile-time constant: numba drops the other branch)
            Bs = cuda.shared.array(BSZ, T, alignment=16)
        else:
            Bs = cuda.shared.array(BSZ, T)
        acc = cuda.local.array(TMN, T)
        ra = cuda.local.array(RAN, T)
        rb = cuda.local.array(RBN, T)
        ga = cuda.local.array(AE, T)
        gb = cuda.local.array(BE, T)
        # per A pass (one for all, SAME): its first channel in x (-1: past M) and tap
        # offsets t*d - p
        lc = cuda.local.array(NS, IX)
        ltd = cuda.local.array(NS, IX)
        lth = cuda.local.array(NS, IX)
        ltw = cuda.local.array(NS, IX)
        tid = cuda.threadIdx.x
        ao_t, bo_t, row0, col0 = offsets(tid)
        m0 = cuda.blockIdx.x * bm
        n0 = cuda.blockIdx.y * bn
        gi = cuda.blockIdx.z // nsplit
        sp = cuda.blockIdx.z % nsplit
        qb = Q * sp // nsplit
        qe = Q * (sp + 1) // nsplit
        yc = gi * OCG + n0
        for i in range(TMN):
            acc[i] = T(0)
        for l in range(NS):
            e0 = (tid + l * nt) * ACH
            m = m0 + e0 % bm
            lc[l] = -1
            if e0 < bm * bk and m < M:
                lc[l] = gi * ICG + m % ICG
                t = m // ICG
                ltw[l] = (t % KW) * DW - PW
                lth[l] = ((t // KW) % KH) * DH - PH
                ltd[l] = (t // (KW * KH)) * DD - PD
        # the first chunk's row (n, o_d, o_h) and first column
        ow0 = (qb % NCH) * bk
        r = qb // NCH
        o_h = r % OH
        r = r // OH
        o_d = r % OD
        n = r // OD
        for it in range(qb, qe + 1):
            if it < qe:
                yrow = ((n * OD + o_d) * OH + o_h) * OW
                for l in range(ANP):
                    e0 = (tid + l * nt) * ACH
                    o_w = ow0 + e0 // bm
                    si = 0 if SAME else l
                    for j in range(ACH):
                        v = T(0)
                        c = lc[si] + j
                        td, th, tw = ltd[si], lth[si], ltw[si]
                        if (e0 < bm * bk and lc[si] >= 0 and c - gi * ICG < ICG
                                and o_w < OW):
                            i_d = o_d * SD + td
                            i_h = o_h * SH + th
                            i_w = o_w * SW + tw
                            if (i_d >= 0 and i_d < ID and i_h >= 0 and i_h < IH
                                    and i_w >= 0 and i_w < IW):
                                v = x[uint64((((n * ID + i_d) * IH + i_h) * IW + i_w) * IC + c)]
                        ga[l * ACH + j] = v
                for l in range(BNP):
                    e0 = (tid + l * nt) * BCH
                    o_w = ow0 + e0 // bn
                    nn = e0 % bn
                    for j in range(BCH):
                        v = T(0)
                        if e0 < bk * bn and o_w < OW and n0 + nn + j < OCG:
                            v = dy[uint64((yrow + o_w) * OC + yc + nn + j)]
                        gb[l * BCH + j] = v
                ow0 += bk
                if ow0 >= OW:
                    ow0 = 0
                    o_h += 1
                    if o_h >= OH:
                        o_h = 0
                        o_d += 1
                        if o_d >= OD:
                            o_d = 0
                            n += 1
            if it > qb:
                ab = ((it - qb - 1) % 2) * (bk * PA) + ao_t
                bb = ((it - qb - 1) % 2) * (bk * PB) + bo_t
                mma_slice(As, Bs, ab, bb, ra, rb, acc)
            if it < qe:
                ab = ((it - qb) % 2) * (bk * PA)
                bb = ((it - qb) % 2) * (bk * PB)
                for l in range(ANP):
                    e0 = (tid + l * nt) * ACH
                    if e0 < bm * bk:
                        put_a(As, ab + (e0 // bm) * PA + e0 % bm, ga, l * ACH)
                for l in range(BNP):
                    e0 = (tid + l * nt) * BCH
                    if e0 < bk * bn:
                        put_b(Bs, bb + (e0 // bn) * PB + e0 % bn, gb, l * BCH)
            cuda.syncthreads()
        for a in range(tm):
            m = m0 + (a // EGA) * ESA + (a % EGA) * EHA + row0
            if m < M:
                for b in range(tn):
                    col = (b // EGB) * ESB + (b % EGB) * EHB + col0
                    if n0 + col < OCG:
                        part[uint64(sp * WS + m * OC + yc + col)] = acc[a * tn + b]

    return _kernel(bwd_w_gemm, nt, dtype, precision, bk, tm * tn)


@functools.lru_cache(maxsize=None)
def reduce_partials(dtype):
    """``out[e] = sum_j part[j, e]`` in the order ``j = 0, 1, ...`` (deterministic)."""
    def reduce_partials(part, out):
        nsplit = part.shape[0]
        e = cuda.grid(1)
        step = cuda.gridsize(1)
        while e < out.shape[0]:
            acc = part[0, e]
            for j in range(1, nsplit):
                acc += part[j, e]
            out[e] = acc
            e += step

    return cuda.jit(reduce_partials)
