"""Tile transforms of the Winograd strategy (the transformed-domain GEMMs run in BLAS).

Every Winograd pass (Lavin and Gray, 2016) is built from two moves between a channels-last
image ``[n, h, w, c]`` and a tile-major transformed stack ``[alpha*alpha, tiles, c]``
(``alpha = m + 2``):

* :func:`to_tiles`: cut the image into ``q x q`` patches at origins ``(m*ti + off_h,
  m*tj + off_w)`` (zero outside the image) and map each with ``L d L^T``: ``L = B^T``
  (``kind`` 0, ``q = alpha``: input tiles) or ``L = A`` (``kind`` 1, ``q = m``: the ``dy``
  tiles of the weight gradient, F(3x3, m x m));
* :func:`from_tiles`: map each transformed tile with ``A^T s A`` and write the ``m x m``
  result at ``(m*ti, m*tj)``, clipped to the image.

The matrices are Lavin's F(2,3) and F(4,3) (points 0, +-1, +-2, infinity), written out as
formulas, one per output row (``_bt*_row``, ``_a*_row``, ``_at*_row``; the strategy holds
the same matrices for the filter transforms, and the tests check both against the
reference). A 2-D transform is two separable passes; each output row of a pass is one loop
over contiguous channels, which the loop vectoriser turns into SIMD code. Interior tiles
are read and written in place; border tiles go through a small zero-filled scratch patch.

Tile ``t`` is ``(n, ti, tj)`` in C order over ``[nb, th, tw]``; a call handles the tiles
``t0 <= t < t1`` and uses row ``t - t0`` of its stack, so the driver may run the whole
problem at once or in blocks.

Everything here is compiled without ``reassoc`` (``reassociate=False``): the transforms
reduce nothing, and with it a transform compiled in one process and the same transform
loaded from Numba's disk cache in another rounded differently (a different bit pattern
for the same inputs, within the tolerance); ``tests/test_determinism.py`` checks it.
"""
import types

import numpy as np
from llvmlite import ir
from numba.core import types as nbtypes
from numba.extending import intrinsic

from numbaconv._jit import helper, kernel


@intrinsic
def _widen(typingctx, v):
    """A source element as a float: float16 bits (uint16) widened to float32 (``fpext``),
    else as it is."""
    if v == nbtypes.uint16:
        def codegen(context, builder, signature, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

        return nbtypes.float32(v), codegen

    def same(context, builder, signature, args):
        return args[0]

    return v(v), same


@intrinsic
def _store_as(typingctx, arr, i, v):
    """``arr[i] = v`` with ``v`` rounded to float16 bits (nearest even) when ``arr`` holds
    them (uint16), else cast as an assignment would."""
    sig = nbtypes.void(arr, i, v)

    def codegen(context, builder, signature, args):
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        if aty.dtype == nbtypes.uint16:
            val = builder.bitcast(builder.fptrunc(args[2], ir.HalfType()), ir.IntType(16))
        else:
            val = context.cast(builder, args[2], signature.args[2], aty.dtype)
        builder.store(val, ptr)
        return context.get_dummy_value()

    return sig, codegen


# -- 1-D transforms, one output row each ------------------------------------------------------
# d[o + c] = (L[a] . (s[e + i*st + c])_i) for c < n. One store per loop: the loop vectoriser
# gives up on a loop that stores through several runtime-offset pointers (it would need more
# runtime alias checks than it allows), so every output row gets its own channel loop.
# Offsets are unsigned: a signed index gets Numba's negative-index wraparound, which turns
# the contiguous loads into gathers (and slicing views instead costs refcount atomics).
# Scaling by 2, 4, 8 is written as additions: an integer literal times a float32 is a
# float64 in Numba.
@helper(reassociate=False)
def _bt2_row(a, s, e, st, d, o, n):
    u = np.uint64(st)
    e0 = np.uint64(e)
    e1 = e0 + u
    e2 = e1 + u
    e3 = e2 + u
    o0 = np.uint64(o)
    nn = np.uint64(n)
    if a == 0:
        for c in range(nn):
            d[o0 + c] = s[e0 + c] - s[e2 + c]
    elif a == 1:
        for c in range(nn):
            d[o0 + c] = s[e1 + c] + s[e2 + c]
    elif a == 2:
        for c in range(nn):
            d[o0 + c] = s[e2 + c] - s[e1 + c]
    else:
        for c in range(nn):
            d[o0 + c] = s[e1 + c] - s[e3 + c]


@helper(reassociate=False)
def _a2_row(a, s, e, st, d, o, n):
    u = np.uint64(st)
    e0 = np.uint64(e)
    e1 = e0 + u
    o0 = np.uint64(o)
    nn = np.uint64(n)
    if a == 0:
        for c in range(nn):
            d[o0 + c] = s[e0 + c]
    elif a == 1:
        for c in range(nn):
            d[o0 + c] = s[e0 + c] + s[e1 + c]
    elif a == 2:
        for c in range(nn):
            d[o0 + c] = s[e0 + c] - s[e1 + c]
    else:
        for c in range(nn):
            d[o0 + c] = -s[e1 + c]


@helper(reassociate=False)
def _at2_row(a, s, e, st, d, o, n):
    u = np.uint64(st)
    e0 = np.uint64(e)
    e1 = e0 + u
    e2 = e1 + u
    e3 = e2 + u
    o0 = np.uint64(o)
    nn = np.uint64(n)
    if a == 0:
        for c in range(nn):
            d[o0 + c] = s[e0 + c] + s[e1 + c] + s[e2 + c]
    else:
        for c in range(nn):
            d[o0 + c] = s[e1 + c] - s[e2 + c] - s[e3 + c]


@helper(reassociate=False)
def _bt4_row(a, s, e, st, d, o, n):
    # B^T of F(4,3): [4 0 -5 0 1 0], [0 -4 -4 1 1 0], [0 4 -4 -1 1 0], [0 -2 -1 2 1 0],
    # [0 2 -1 -2 1 0], [0 4 0 -5 0 1]
    u = np.uint64(st)
    e0 = np.uint64(e)
    e1 = e0 + u
    e2 = e1 + u
    e3 = e2 + u
    e4 = e3 + u
    e5 = e4 + u
    o0 = np.uint64(o)
    nn = np.uint64(n)
    if a == 0:
        for c in range(nn):
            t = s[e0 + c] - s[e2 + c]
            t = t + t
            d[o0 + c] = t + t + s[e4 + c] - s[e2 + c]
    elif a == 1:
        for c in range(nn):
            t = s[e1 + c] + s[e2 + c]
            t = t + t
            d[o0 + c] = s[e3 + c] + s[e4 + c] - (t + t)
    elif a == 2:
        for c in range(nn):
            t = s[e1 + c] - s[e2 + c]
            t = t + t
            d[o0 + c] = s[e4 + c] - s[e3 + c] + (t + t)
    elif a == 3:
        for c in range(nn):
            t = s[e3 + c] - s[e1 + c]
            d[o0 + c] = s[e4 + c] - s[e2 + c] + (t + t)
    elif a == 4:
        for c in range(nn):
            t = s[e3 + c] - s[e1 + c]
            d[o0 + c] = s[e4 + c] - s[e2 + c] - (t + t)
    else:
        for c in range(nn):
            t = s[e1 + c] - s[e3 + c]
            t = t + t
            d[o0 + c] = t + t + s[e5 + c] - s[e3 + c]


@helper(reassociate=False)
def _a4_row(a, s, e, st, d, o, n):
    # A = (A^T)^T of F(4,3): rows [1 0 0 0], [1 1 1 1], [1 -1 1 -1], [1 2 4 8], [1 -2 4 -8],
    # [0 0 0 1]
    u = np.uint64(st)
    e0 = np.uint64(e)
    e1 = e0 + u
    e2 = e1 + u
    e3 = e2 + u
    o0 = np.uint64(o)
    nn = np.uint64(n)
    if a == 0:
        for c in range(nn):
            d[o0 + c] = s[e0 + c]
    elif a == 1:
        for c in range(nn):
            d[o0 + c] = s[e0 + c] + s[e1 + c] + s[e2 + c] + s[e3 + c]
    elif a == 2:
        for c in range(nn):
            d[o0 + c] = s[e0 + c] - s[e1 + c] + s[e2 + c] - s[e3 + c]
    elif a == 3:
        for c in range(nn):
            t = s[e2 + c] + s[e3 + c] + s[e3 + c]     # d2 + 2 d3
            t = s[e1 + c] + t + t                     # d1 + 2 d2 + 4 d3
            d[o0 + c] = s[e0 + c] + t + t
    elif a == 4:
        for c in range(nn):
            t = s[e2 + c] - s[e3 + c] - s[e3 + c]     # d2 - 2 d3
            t = t + t - s[e1 + c]                     # -d1 + 2 d2 - 4 d3
            d[o0 + c] = s[e0 + c] + t + t
    else:
        for c in range(nn):
            d[o0 + c] = s[e3 + c]


@helper(reassociate=False)
def _at4_row(a, s, e, st, d, o, n):
    # A^T of F(4,3): [1 1 1 1 1 0], [0 1 -1 2 -2 0], [0 1 1 4 4 0], [0 1 -1 8 -8 1]
    u = np.uint64(st)
    e0 = np.uint64(e)
    e1 = e0 + u
    e2 = e1 + u
    e3 = e2 + u
    e4 = e3 + u
    e5 = e4 + u
    o0 = np.uint64(o)
    nn = np.uint64(n)
    if a == 0:
        for c in range(nn):
            d[o0 + c] = s[e0 + c] + s[e1 + c] + s[e2 + c] + s[e3 + c] + s[e4 + c]
    elif a == 1:
        for c in range(nn):
            t = s[e3 + c] - s[e4 + c]
            d[o0 + c] = s[e1 + c] - s[e2 + c] + (t + t)
    elif a == 2:
        for c in range(nn):
            t = s[e3 + c] + s[e4 + c]
            t = t + t
            d[o0 + c] = s[e1 + c] + s[e2 + c] + (t + t)
    else:
        for c in range(nn):
            t = s[e3 + c] - s[e4 + c]
            t = t + t
            t = t + t
            d[o0 + c] = s[e1 + c] - s[e2 + c] + (t + t) + s[e5 + c]


# -- one compiled chain per transform and tile size -----------------------------------------
# The tile helper and the entry kernels below are templates: ``_chain`` makes a copy of them
# per (transform, m) whose global ``_ROW`` (or ``_TILE``) is that transform's row function,
# with its own qualified name (so its own cache index; Numba freezes globals as constants).
# A call then compiles only the chain it uses: F(4x4) forward compiles B^T(4) and A^T(4),
# not all six transforms inlined into every caller (measured, float32 F(4x4) forward, empty
# cache: first call 8.7 s with one kernel dispatching on ``kind`` and ``m`` at run time).
# ``m`` stays a run-time argument: as a constant, LLVM unrolls the tile loops and inlines
# the row's vectorised loops 36 times over (2x the compile time). Closures would do the
# same, but Numba keys a cached closure on a pickle of its cells, which differs between
# processes for a dispatcher: the cache would never hit.
_ROW = _TILE = None
#: False in the float16-bits copies of the entry kernels: every tile then goes through the
#: float32 patch, widened as it is read (``to_tiles``) or rounded as it is written
#: (``from_tiles``). A frozen constant, so Numba prunes the in-place branch there before
#: typing it (a uint16 image and the float32 patch cannot be one variable).
_IN_PLACE = True


def _tile(m, kind, s, e, si, sj, tmp, d, o, da, db, n, cb):
    """d[o + a*da + b*db + c] = (L x L^T)[a, b, c] with x[i, j, c] = s[e + i*si + j*sj + c]:
    first along i into ``tmp`` ([p, q, cb]), then along j. L is ``_ROW``'s transform."""
    p = m + 2 if kind < 2 else m
    q = m if kind == 1 else m + 2
    for a in range(p):
        for j in range(q):
            _ROW(a, s, e + j * sj, si, tmp, (a * q + j) * cb, n)
    for a in range(p):
        for b in range(p):
            _ROW(b, tmp, a * q * cb, cb, d, o + a * da + b * db, n)


@helper(reassociate=False)
def _patch(flat, buf, n, h0, w0, q, H, W, C, c0, cn, cb):
    """``buf[(i*q + j)*cb + c] = src[n, h0 + i, w0 + j, c0 + c]`` (0 outside the image) for
    ``flat``, the flat ``[.., H, W, C]`` source; float16 bits are widened."""
    for i in range(q):
        h = h0 + i
        for j in range(q):
            w = w0 + j
            bv = buf[(i * q + j) * cb:]
            if 0 <= h < H and 0 <= w < W:
                sv = flat[((n * H + h) * W + w) * C + c0:]
                for c in range(cn):
                    bv[c] = _widen(sv[c])
            else:
                for c in range(cn):
                    bv[c] = 0


@helper(reassociate=False)
def _unpatch(buf, flat, n, h0, w0, m, H, W, K, k0, kn, cb):
    """``dst[n, h0 + a, w0 + b, k0 + k] = buf[(a*m + b)*cb + k]`` for the positions inside
    ``flat``, the flat ``[.., H, W, K]`` result; rounded when it holds float16 bits."""
    for a in range(min(m, H - h0)):
        for b in range(min(m, W - w0)):
            o = ((n * H + h0 + a) * W + w0 + b) * K + k0
            bo = (a * m + b) * cb
            for k in range(kn):
                _store_as(flat, o + k, buf[bo + k])


def _to_tiles(src, out, m, kind, off_h, off_w, th, tw, t0, t1, cb):
    """out[a*alpha + b, t - t0, c] = (L d_t L^T)[a, b, c] for tiles t0 <= t < t1, where
    d_t[i, j, c] = src[n, m*ti + off_h + i, m*tj + off_w + j, c] (0 outside) and
    L = B^T (kind 0, q = alpha) or A (kind 1, q = m) of F(m, 3)."""
    H, W, C = src.shape[1], src.shape[2], src.shape[3]
    alpha = m + 2
    q = alpha if kind == 0 else m
    R = out.shape[1]
    flat = src.reshape(src.size)
    dst = out.reshape(out.size)
    buf = np.empty(q * q * cb, out.dtype)
    tmp = np.empty(alpha * alpha * cb, out.dtype)
    for t in range(t0, t1):
        tj = t % tw
        r = t // tw
        ti = r % th
        n = r // th
        h0 = ti * m + off_h
        w0 = tj * m + off_w
        row = t - t0
        inside = h0 >= 0 and w0 >= 0 and h0 + q <= H and w0 + q <= W
        for c0 in range(0, C, cb):
            cn = min(cb, C - c0)
            if _IN_PLACE and inside:  # interior tiles are read in place
                s, e, si, sj = flat, ((n * H + h0) * W + w0) * C + c0, W * C, C
            else:            # border tiles through a zero-filled patch
                _patch(flat, buf, n, h0, w0, q, H, W, C, c0, cn, cb)
                s, e, si, sj = buf, 0, q * cb, cb
            _TILE(m, kind, s, e, si, sj, tmp, dst, row * C + c0, alpha * R * C, R * C, cn, cb)


def _from_tiles(src, dst, m, th, tw, t0, t1, cb):
    """dst[n, m*ti + a, m*tj + b, k] = (A^T s_t A)[a, b, k] for tiles t0 <= t < t1 and the
    positions inside dst, where s_t[i, j, k] = src[i*alpha + j, t - t0, k]."""
    H, W, K = dst.shape[1], dst.shape[2], dst.shape[3]
    alpha = m + 2
    R = src.shape[1]
    s = src.reshape(src.size)
    flat = dst.reshape(dst.size)
    buf = np.empty(m * m * cb, src.dtype)
    tmp = np.empty(m * alpha * cb, src.dtype)
    for t in range(t0, t1):
        tj = t % tw
        r = t // tw
        ti = r % th
        n = r // th
        h0 = ti * m
        w0 = tj * m
        row = t - t0
        inside = _IN_PLACE and h0 + m <= H and w0 + m <= W
        for k0 in range(0, K, cb):
            kn = min(cb, K - k0)
            if _IN_PLACE and inside:  # interior tiles are written in place
                d, o, da, db = flat, ((n * H + h0) * W + w0) * K + k0, W * K, K
            else:            # border tiles through a patch, clipped to dst
                d, o, da, db = buf, 0, m * cb, cb
            _TILE(m, 2, s, row * K + k0, alpha * R * K, R * K, tmp, d, o, da, db, kn, cb)
            if not inside:
                _unpatch(buf, flat, n, h0, w0, m, H, W, K, k0, kn, cb)


def _copy(fn, name, **globals_):
    """``fn`` with ``globals_`` bound and its own qualified name ``<fn>_<name>``."""
    g = dict(fn.__globals__)
    g.update(globals_)
    f = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__)
    f.__qualname__ = f"{fn.__name__}_{name}"
    f.__doc__ = fn.__doc__
    return f


def _chain(kind, m, row):
    name = f"{('bt', 'a', 'at')[kind]}{m}"
    tile = helper(_copy(_tile, name, _ROW=row), reassociate=False)
    # Serial on purpose: they run between BLAS calls, which own the cores (see
    # numbaconv.blas; measured on 2 cores, parallel transforms next to multithreaded GEMMs
    # ran 1.5-5x slower).
    # (each compiles on its first call: the float16-bits copy only where float16 runs)
    fn = _from_tiles if kind == 2 else _to_tiles
    return (kernel(_copy(fn, name, _TILE=tile), parallel=False, reassociate=False),
            kernel(_copy(fn, name + "_bits", _TILE=tile, _IN_PLACE=False), parallel=False,
                   reassociate=False))


#: (kind, m) -> (kernel, its float16-bits variant)
_CHAINS = {(kind, m): _chain(kind, m, row) for (kind, m), row in {
    (0, 2): _bt2_row, (1, 2): _a2_row, (2, 2): _at2_row,
    (0, 4): _bt4_row, (1, 4): _a4_row, (2, 4): _at4_row}.items()}


# -- entry points -------------------------------------------------------------------------------
def to_tiles(src, out, m, kind, off_h, off_w, th, tw, t0, t1, cb):
    """out[a*alpha + b, t - t0, c] = (L d_t L^T)[a, b, c] for tiles t0 <= t < t1, where
    d_t[i, j, c] = src[n, m*ti + off_h + i, m*tj + off_w + j, c] (0 outside) and
    L = B^T (kind 0, q = alpha) or A (kind 1, q = m) of F(m, 3). ``src`` may hold float16
    bits (uint16), widened into the float32 ``out``."""
    fn = _CHAINS[int(kind), int(m)][1 if src.dtype == np.uint16 else 0]
    fn(src, out, m, kind, off_h, off_w, th, tw, t0, t1, cb)


def from_tiles(src, dst, m, th, tw, t0, t1, cb):
    """dst[n, m*ti + a, m*tj + b, k] = (A^T s_t A)[a, b, k] for tiles t0 <= t < t1 and the
    positions inside dst, where s_t[i, j, k] = src[i*alpha + j, t - t0, k]. ``dst`` may
    hold float16 bits (uint16), rounded from the float32 ``src``'s transforms."""
    _CHAINS[2, int(m)][1 if dst.dtype == np.uint16 else 0](src, dst, m, th, tw, t0, t1, cb)
