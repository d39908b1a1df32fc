"""The CUDA backend: canonicalise device operands on the device, launch, return the user's layout.

Same contract as :mod:`numbaconv.backends.cpu`, for arrays exposing
``__cuda_array_interface__`` (numba device arrays, CuPy arrays, torch CUDA tensors; wrapped
zero-copy by ``numba.cuda.from_cuda_array_interface``). Operands are brought to the
canonical layouts of :mod:`numbaconv.kernels` by small gather kernels (float16 widened to
float32 once, on the device; already-canonical operands are used in place), the kernels of
:mod:`numbaconv.kernels.cuda` run, and one scatter kernel writes the result in the user's
layout and dtype (rounding float16 once), into ``out=`` when given. Nothing goes through
the host, and the host never waits for the GPU.

Streams: a call's kernels go on the ``stream`` given to :func:`execute`, else on the stream
that its operands' ``__cuda_array_interface__`` names where they all share one, else on
numba's default stream; an operand from another stream is waited for on the device (an
event), not on the host. Scratch memory (canonical copies, split-K partials, intermediate
results) comes from a small per-stream pool (``CUDA_POOL_BYTES``), and so do results under
numba's own allocator: a result's block returns to the pool when the result and its views
are gone (numba's cudaMalloc / cudaFree, the latter waiting for the device, stay out of
the calls); under an External Memory Management plugin the user installed, results come
from the plugin. Free GPU memory is queried once per plan, not per call.

``numba.cuda`` is imported only inside functions here, so importing numbaconv needs no GPU,
driver or toolkit; device arrays without a usable GPU give a RuntimeError that says so.

Tunables are read from :mod:`numbaconv.config` at call time (tests patch them so that the
CUDA simulator, ``NUMBA_ENABLE_CUDASIM=1``, crosses tile edges with tiny tiles); the
defaults are in :data:`DEFAULTS`.
"""
import dataclasses
import functools
import math

import numpy as np

from .. import config
from ..strategies import canonical_shapes

#: Defaults of the ``config.CUDA_*`` tunables. ``None`` for the five GEMM tile sizes means
#: "per shape": the first of :data:`GEMM_TILES` that fills the GPU (see :func:`gemm_tile`).
DEFAULTS = {
    # implicit GEMM: block tile BM x BN, K slice BK, per-thread register tile TM x TN
    "CUDA_BLOCK_M": None,
    "CUDA_BLOCK_N": None,
    "CUDA_BLOCK_K": None,
    "CUDA_THREAD_M": None,
    "CUDA_THREAD_N": None,
    # threads per block of the element-wise kernels (depthwise, layout, reduction)
    "CUDA_THREADS": 256,
    # weight-gradient split: aim at this many thread blocks, each split summing at least
    # CUDA_SPLIT_MIN_PIXELS output pixels (rows for depthwise), at most CUDA_MAX_SPLITS splits
    "CUDA_TARGET_BLOCKS": 1024,
    "CUDA_SPLIT_MIN_PIXELS": 256,
    "CUDA_MAX_SPLITS": 64,
    # forward and backward data: the largest tile that still gives this many thread blocks,
    # else the smallest tile with K split into ranges of at least CUDA_SPLIT_MIN_SLICES
    # slices of BK until the grid has that many blocks (deterministic split-K)
    "CUDA_MIN_BLOCKS": 264,
    "CUDA_SPLIT_MIN_SLICES": 4,
    # device memory kept for reuse by later calls on the same stream: canonical copies,
    # partial results, intermediate results (bytes; 0 turns the pool off)
    "CUDA_POOL_BYTES": 256 << 20,
    # depthwise forward and backward data: the patch kernels (1) or the row kernels (0)
    "CUDA_DEPTHWISE_PATCH": 1,
    # precision="tf32": the least K slice of the tensor-core GEMM tiles where CUDA_BLOCK_K
    # is not set (8: two blocks per SM; 16: two k8 steps per slice, one block per SM);
    # None: per direction, TF32_BLOCK_K
    "CUDA_TF32_BLOCK_K": None,
    # precision="tf32": the cp.async-fed tensor-core kernels (kernels.cuda.tf32) where they
    # take the problem (1), or always the register-staged ones of kernels.cuda.gemm (0)
    "CUDA_TF32_ASYNC": 1,
    # ... and their slices in flight (2 or 3; None: 3 where they fit in 48 KiB)
    "CUDA_TF32_STAGES": None,
}

#: The TF32 tiles' least K slice per direction (``CUDA_TF32_BLOCK_K`` unset): backward data,
#: whose slices carry the most index work, gains from two k8 steps per slice; the weight
#: gradient loses (ResNet-50 on an H200, docs/performance.md "GPU").
TF32_BLOCK_K = {"fwd": 8, "bwd_d": 16, "bwd_w": 8}


_DEFAULT_ITEMS = tuple(DEFAULTS.items())


def settings():
    """The ``config.CUDA_*`` values a GPU plan depends on (the planner's cache key)."""
    return tuple([getattr(config, n, d) for n, d in _DEFAULT_ITEMS])

#: GEMM tiles ``(BM, BN, BK, TM, TN)``, largest first: 256 threads each but the last (128).
#: An 8x8 register tile does 64 multiply-adds per four 16-byte shared-memory loads (a 4x4
#: one 16 per two; its K slice is twice as deep, so that each slice's loads and index
#: arithmetic spread over as many multiply-adds), so the large tiles run at several
#: times the small ones' speed where
#: there are enough blocks to fill the GPU; where there are not, K is split (see
#: :func:`plan_tiles`) rather than the tile shrunk further. float64 stops at 8x4 (64
#: float64 accumulators alone take 128 registers).
GEMM_TILES = ((128, 128, 8, 8, 8), (128, 64, 8, 8, 4), (64, 64, 16, 4, 4), (64, 32, 16, 4, 4))
#: The gemm's ``N`` (output channels of the result, per group) below which the GPU
#: ``direct`` kernel runs instead: a 32-wide (or wider) tile would be mostly padding.
MIN_GEMM_N = 8

#: Hardware limits the launch configuration assumes (every GPU numba.cuda supports).
MAX_THREADS_PER_BLOCK = 1024
MAX_STATIC_SHARED = 48 * 1024
MAX_GRID_YZ = 65535

REASON_NO_WINOGRAD = "no Winograd kernel on the GPU"
REASON_GRID = "more than 65535 groups x phases/splits for one grid dimension"

_DATA_ALIASES = ("x", "dy")


def cfg(name):
    """A ``config.CUDA_*`` tunable, read at call time (``None`` where unset and per shape)."""
    v = getattr(config, name, DEFAULTS[name])
    return None if v is None else int(v)


def _cdiv(a, b):
    return -(-a // b)


# -- numba.cuda, lazily ----------------------------------------------------------------------
def _cuda(name="array"):
    try:
        from numba import cuda
    except Exception as exc:  # pragma: no cover - numba without its CUDA target
        raise RuntimeError(f"numbaconv: {name}: a device array was given but numba.cuda "
                           f"cannot be imported ({exc})") from None
    return cuda


def simulator():
    """True when numba.cuda runs in its simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    from numba import config as nconfig
    return bool(nconfig.ENABLE_CUDASIM)


def _require_gpu(cuda, name):
    if simulator():
        return
    try:
        ok = cuda.is_available()
    except Exception:  # pragma: no cover
        ok = False
    if not ok:
        raise RuntimeError(
            f"numbaconv: {name}: a device array was given but no usable CUDA GPU was found "
            "(numba.cuda.is_available() is False: no GPU, no driver, or no CUDA toolkit "
            "NVVM; `numba -s` shows why); pass NumPy arrays to run on the CPU")


def is_device_array(obj):
    """True for anything exposing ``__cuda_array_interface__``, and for numba's (also
    simulated) device arrays, which carry ``__cuda_ndarray__``; never imports numba.cuda."""
    return (hasattr(obj, "__cuda_array_interface__")
            or getattr(obj, "__cuda_ndarray__", False) is True)


def on_device(operands, out=None):
    """Whether a call runs on the GPU: all of its arrays are device arrays (TypeError if mixed)."""
    flags = [is_device_array(v) for v in operands.values()]
    if any(flags) and not all(flags):
        where = ", ".join(f"{k}={'device' if f else 'host'}"
                          for k, f in zip(operands, flags))
        raise TypeError(f"all arrays of one call must be on one device, got {where}")
    dev = bool(flags) and all(flags)
    if out is not None and is_device_array(out) != dev:
        raise TypeError(f"out: expected a {'device' if dev else 'NumPy'} array like the "
                        f"operands, got {type(out).__name__}")
    return dev


def _is_default(handle):
    """Whether a stream handle names a default stream: 0 (numba's default), 1 (legacy), 2
    (per-thread), or None (the CUDA Array Interface's "no stream")."""
    return handle is None or handle in (0, 1, 2)


def _is_numba_stream(stream):
    """Whether ``stream`` is a stream object numba launches on as it is (a numba stream):
    one with a ``synchronize`` method that is not a PyTorch or CuPy stream (those carry
    an integer ``cuda_stream`` or ``ptr``; numba launches on an external stream of their
    handle)."""
    return (hasattr(stream, "synchronize") and not isinstance(stream, int)
            and not isinstance(getattr(stream, "cuda_stream", None), int)
            and not isinstance(getattr(stream, "ptr", None), int))


def stream_handle(stream):
    """The integer handle of ``stream``: a numba stream, an int, or an object with a
    ``cuda_stream`` (PyTorch) or ``ptr`` (CuPy) attribute; 0 for None or numba's default."""
    if stream is None or stream == 0:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    h = getattr(stream, "handle", None)
    if h is not None:
        v = getattr(h, "value", h)
        try:
            return int(v or 0)
        except (TypeError, ValueError):
            pass
    try:
        return int(stream)
    except (TypeError, ValueError):
        raise TypeError(f"stream: expected a CUDA stream (numba, CuPy or PyTorch stream, or "
                        f"an integer handle), got {type(stream).__name__}") from None


def check_stream(stream):
    """``stream`` if it is a stream :func:`execute` can launch on: None, a numba stream
    (the simulator's too), an object with an integer ``cuda_stream`` (PyTorch) or ``ptr``
    (CuPy) attribute, or a non-negative integer handle; a TypeError or ValueError naming
    ``stream`` otherwise."""
    if stream is None:
        return None
    if isinstance(stream, (bool, float, str, bytes)):
        raise TypeError(f"stream: expected a CUDA stream (numba, CuPy or PyTorch stream, or "
                        f"an integer handle), got {stream!r}")
    if simulator():
        from numba import cuda
        if isinstance(stream, cuda.stream):
            return stream
    h = stream_handle(stream)  # TypeError naming stream for anything else
    if h < 0:
        raise ValueError(f"stream: a stream handle is a non-negative integer, got {h}")
    return stream


def as_device_array(value, name):
    """``value`` (exposing ``__cuda_array_interface__``) as a numba device array, zero-copy.

    TypeError for a dtype other than float16/32/64; RuntimeError when no GPU can be used.
    """
    cuda = _cuda(name)
    _require_gpu(cuda, name)
    try:
        if cuda.devicearray.is_cuda_ndarray(value):
            arr = value
        else:
            desc = value.__cuda_array_interface__
            # no host wait: the launch stream waits for the producer's (see execute)
            arr = cuda.from_cuda_array_interface(desc, owner=value, sync=False)
    except Exception as exc:
        raise RuntimeError(f"numbaconv: {name}: numba.cuda cannot use the device array "
                           f"{type(value).__name__} ({type(exc).__name__}: {exc})") from None
    if np.dtype(arr.dtype) not in (np.dtype(np.float16), np.dtype(np.float32),
                                   np.dtype(np.float64)):
        raise TypeError(f"{name}: expected dtype float16, float32 or float64, got {arr.dtype}")
    return arr


# -- the launch plan -------------------------------------------------------------------------
def _phase_rows(p):
    """Largest number of input positions of one stride phase, per axis."""
    from ..kernels.cuda._ptx import axis_phase
    return [max(axis_phase(q, s, d, b, k, n)[6] for q in range(s))
            for s, d, b, k, n in zip(p.stride, p.dilation, p.pad_begin, p.ksz, p.isz)]


def accepts(problem, kernel):
    """``None`` or the reason why GPU ``kernel`` (``"gemm"`` or ``"direct"``) declines."""
    if kernel == "winograd":
        return REASON_NO_WINOGRAD
    if kernel == "numpy":
        return "the numpy entry runs on the host's arrays only"
    if kernel == "gemm":
        z = problem.g * (math.prod(problem.stride) if problem.direction == "bwd_d" else 1)
        if z > MAX_GRID_YZ:
            return REASON_GRID
    return None


def _gemm_n(p):
    """``N`` of the implicit GEMM of ``p``: the result's channels per group."""
    return p.icg if p.direction == "bwd_d" else p.ocg


def _gemm_mnk(p):
    """``(M, N, blocks along z)`` of the implicit GEMM of ``p`` (z before weight splits)."""
    if p.direction == "fwd":
        return p.mb * math.prod(p.osz), _gemm_n(p), p.g
    if p.direction == "bwd_d":
        return p.mb * math.prod(_phase_rows(p)), _gemm_n(p), p.g * math.prod(p.stride)
    return math.prod(p.ksz) * p.icg, _gemm_n(p), p.g


def default_kernel(problem):
    """The GPU kernel family for ``problem``: depthwise-style ``direct`` or implicit ``gemm``.

    ``direct`` for depthwise and near-depthwise groupings, and where the GEMM's ``N`` (the
    result's channels per group) is below :data:`MIN_GEMM_N`: backward data of a 3-channel
    stem, for one, would use 3 of a tile's 32 or more columns.
    """
    p = problem
    if p.is_depthwise or p.icg == 1 and p.ocg <= 4:
        return "direct"
    return "direct" if _gemm_n(p) < MIN_GEMM_N else "gemm"


def gemm_tile(problem, mnk=None):
    """``(BM, BN, BK, TM, TN)`` of the implicit GEMM of ``problem``.

    The ``config.CUDA_BLOCK_*``/``CUDA_THREAD_*`` values where set (tests shrink them so
    that the simulator crosses tile edges); otherwise, among the tiles of
    :data:`GEMM_TILES` no wider than ``N``, for forward and backward data the first giving
    at least ``CUDA_MIN_BLOCKS`` thread blocks, and for the weight gradient (whose split
    fills the GPU) the first that ``M`` and ``N`` fill; under ``precision="tf32"`` its K
    slice at least ``CUDA_TF32_BLOCK_K`` (or the direction's :data:`TF32_BLOCK_K`) where
    the deeper tile still suits the TF32 kernels. ``mnk``: :func:`_gemm_mnk` of ``problem`` where the caller has it.
    """
    names = ("CUDA_BLOCK_M", "CUDA_BLOCK_N", "CUDA_BLOCK_K", "CUDA_THREAD_M", "CUDA_THREAD_N")
    fixed = [cfg(n) for n in names]
    if all(v is not None for v in fixed):
        return tuple(fixed)
    p = problem
    M, N, z = mnk or _gemm_mnk(p)
    tile = _first_tile(p, M, N, z)
    tile = tuple(v if v is not None else d for v, d in zip(fixed, tile))
    if p.precision == "tf32" and fixed[2] is None and p.compute_dtype == "float32":
        from ..kernels.cuda.gemm import tf32_tile_reason
        least = cfg("CUDA_TF32_BLOCK_K") or TF32_BLOCK_K[p.direction]
        deep = tile[:2] + (max(tile[2], least),) + tile[3:]
        if tf32_tile_reason("float32", *deep) is None:
            tile = deep
    return tile


def _first_tile(p, M, N, z):
    """The first of :data:`GEMM_TILES` that suits ``p`` (see :func:`gemm_tile`)."""
    narrowest = min(t[1] for t in GEMM_TILES)
    # no tile wider than N (a 64-channel result would leave half of a 128-wide tile idle)
    tiles = [t for t in GEMM_TILES
             if (np.dtype(p.compute_dtype).itemsize == 4 or t[3] * t[4] <= 32)
             and t[1] <= max(N, narrowest)]
    for t in tiles:
        if p.direction == "bwd_w":
            if M >= t[0] and N >= t[1]:
                break
        elif _cdiv(M, t[0]) * _cdiv(N, t[1]) * z >= cfg("CUDA_MIN_BLOCKS"):
            break
    return t


def plan_tiles(problem, kernel=None):
    """Launch configuration of ``problem`` on the GPU, as an immutable-friendly dict.

    Keys: ``kernel`` (``"gemm"`` or ``"direct"``), ``threads`` (per block), ``grid`` of the main
    kernel, ``splits`` (weight gradient partial buffers, 1 = none), ``shared_bytes`` (static
    shared memory per block), and for ``gemm`` ``block_m``, ``block_n``, ``block_k``,
    ``thread_m``, ``thread_n`` and ``phases`` (stride phases of backward data).
    """
    p = problem
    kernel = kernel or default_kernel(p)
    item = np.dtype(p.compute_dtype).itemsize
    target = cfg("CUDA_TARGET_BLOCKS")
    if kernel == "gemm":
        M, N, z = mnk = _gemm_mnk(p)
        bm, bn, bk, tm, tn = gemm_tile(p, mnk)
        if bm % tm or bn % tn:
            raise ValueError(f"config: CUDA_BLOCK_M/N ({bm}, {bn}) must be multiples of "
                             f"CUDA_THREAD_M/N ({tm}, {tn})")
        threads = (bm // tm) * (bn // tn)
        if threads > MAX_THREADS_PER_BLOCK:
            raise ValueError(f"config: {threads} threads per block exceed "
                             f"{MAX_THREADS_PER_BLOCK}")
        # two buffers of each tile, rows padded (kernels.cuda.gemm.padded_rows: a 16-byte
        # word; the TF32 kernels' own padding, imported as gemm_tile already does for them)
        pa, pb = bm + 16 // item, bn + 16 // item
        if p.precision == "tf32" and p.compute_dtype == "float32":
            from ..kernels.cuda.gemm import padded_rows
            pa, pb = padded_rows(bm, bn, "tf32")
        shared = 2 * bk * (pa + pb) * item
        t = {"kernel": "gemm", "block_m": bm, "block_n": bn, "block_k": bk, "thread_m": tm,
             "thread_n": tn, "threads": threads, "shared_bytes": shared, "splits": 1,
             "phases": 1}
        if p.direction == "bwd_d":
            t["phases"] = math.prod(p.stride)
        # the weight gradient's K runs in chunks of bk pixels of one output row (see
        # kernels.cuda.gemm)
        _split_k(t, p, (M, N, z), p.mb * p.osz[0] * p.osz[1] * _cdiv(p.osz[2], bk))
        return t
    patch = depthwise_patch(p) if cfg("CUDA_DEPTHWISE_PATCH") else None
    if patch is not None:
        return patch
    rows = depthwise_rows(p)
    if rows is not None:
        return rows
    threads = cfg("CUDA_THREADS")
    t = {"kernel": "direct", "threads": threads, "shared_bytes": 0, "splits": 1}
    if p.direction == "bwd_w":
        elems = math.prod(p.ksz) * p.icg * p.oc
        rows = p.mb * p.osz[0] * p.osz[1]
        base = max(1, _cdiv(elems, threads))
        min_rows = max(1, _cdiv(cfg("CUDA_SPLIT_MIN_PIXELS"), max(1, p.osz[2])))
        splits = min(_cdiv(target, base), rows // min_rows, cfg("CUDA_MAX_SPLITS"))
        t["splits"] = splits = max(1, splits)
        t["grid"] = (base, splits)
    else:
        elems = p.mb * (math.prod(p.osz) * p.oc if p.direction == "fwd"
                        else math.prod(p.isz) * p.ic)
        t["grid"] = (max(1, min(_cdiv(elems, threads), 1 << 20)),)
    return t


def axis_taps(s, d, k):
    """Per stride phase of one axis, how many taps reach it (backward data)."""
    from math import gcd
    step = s // gcd(s, d)
    return [len(range(t0, k, step)) if t0 is not None else 0
            for t0 in (next((t for t in range(step) if t * d % s == q), None)
                       for q in range(s))]


#: Row kernels (kernels.cuda.depthwise): channels per block, thread segments per block, most
#: filter taps kept in registers, most shared memory staged per block.
ROWS_CHANNELS, ROWS_SEGMENTS, ROWS_MAX_TAPS, ROWS_MAX_SHARED = 32, 8, 64, 40 * 1024


def row_config(direction, n, s):
    """``(rw, nseg)`` of a row kernel: results per thread and thread segments per block
    along a last axis of ``n`` results and stride ``s``. About 64 multiply-adds per thread
    for a 3x3 filter (fewer results per thread leave the stores' index arithmetic
    unshared), 64 results per block (a forward stride stages ``s`` source positions per
    result, backward data reaches each result from one tap in ``s``), fewer on narrow
    rows; backward data's ``rw`` is a multiple of ``s``."""
    if direction == "fwd":
        rw, nseg = 8, max(2, ROWS_SEGMENTS // s)
    else:
        rw, nseg = 8 * s, max(2, ROWS_SEGMENTS // s)
    while nseg > 2 and rw * nseg >= 2 * n:
        nseg //= 2
    return rw, nseg


def depthwise_rows(p):
    """Launch configuration of the depthwise row kernels for ``p``, or None where they do not
    apply: forward and weight gradient with ``icg == 1`` (any multiplier), backward data
    with ``icg == ocg == 1``, at most :data:`ROWS_MAX_TAPS` taps and
    :data:`ROWS_MAX_SHARED` bytes of staged rows. Keys as :func:`plan_tiles`, with
    ``variant`` ``"rows"`` and ``row_width`` (results per thread)."""
    if p.icg != 1 or (p.direction == "bwd_d" and p.ocg != 1):
        return None
    kd, kh, kw = p.ksz
    sd, sh, sw = p.stride
    dd, dh, dw = p.dilation
    if kd * kh * kw > ROWS_MAX_TAPS:
        return None
    item = np.dtype(p.compute_dtype).itemsize
    if p.direction == "bwd_w":
        # registers only (kernels.cuda.depthwise.bwd_w_depthwise_rows): one accumulator per
        # tap, a segment's dy values and one tap row's inputs; shared memory for the sum
        # of the segments; partials per (column tile, split of the output rows)
        from ..kernels.cuda.depthwise import bwd_w_rows_tiles
        rw, seg = row_config("fwd", p.osz[2], sw)
        geo = _geo(p)[0]
        nwt = bwd_w_rows_tiles(geo, rw, seg)[0]
        base = _cdiv(p.oc, ROWS_CHANNELS) * nwt
        rows = p.mb * p.osz[0] * p.osz[1]
        splits = min(_cdiv(cfg("CUDA_TARGET_BLOCKS"), base),
                     rows // cfg("CUDA_SPLIT_MIN_SLICES"), cfg("CUDA_MAX_SPLITS"),
                     MAX_GRID_YZ // nwt)
        splits = max(1, splits) * nwt
        return {"kernel": "direct", "variant": "rows", "threads": ROWS_CHANNELS * seg,
                "row_width": rw, "segments": seg, "shared_bytes": seg * ROWS_CHANNELS * item,
                "splits": splits, "grid": (_cdiv(p.oc, ROWS_CHANNELS), splits)}
    if p.direction == "fwd":
        rw, seg = row_config("fwd", p.osz[2], sw)
        span = (seg * rw - 1) * sw + (kw - 1) * dw + 1
        outer, last, ch = p.mb * p.osz[0] * p.osz[1], p.osz[2], p.oc
    else:
        rw, seg = row_config("bwd_d", p.isz[2], sw)
        ob0 = (p.pad_begin[2] - (kw - 1) * dw) // sw
        span = (seg * rw - 1 + p.pad_begin[2]) // sw - ob0 + 1
        outer, last, ch = p.mb * p.isz[0] * p.isz[1], p.isz[2], p.ic
    shared = kd * kh * span * ROWS_CHANNELS * item
    if shared > ROWS_MAX_SHARED:
        return None
    return {"kernel": "direct", "variant": "rows", "threads": ROWS_CHANNELS * seg,
            "row_width": rw, "segments": seg, "shared_bytes": shared, "splits": 1,
            "grid": (max(1, outer * _cdiv(last, seg * rw)), max(1, _cdiv(ch, ROWS_CHANNELS)))}


#: Patch kernels (kernels.cuda.depthwise_patch): most filter taps unrolled, the fewest warps
#: a layer should have (a patch halves, down to one result, until it has them: two waves
#: of 16 warps on each of 132 SMs).
PATCH_MAX_TAPS, PATCH_MIN_WARPS = 49, 4096


def patch_config(direction, k, s, n):
    """``(ph, pw, nseg)``: results per thread of a depthwise patch kernel along the last
    two axes, for filter sizes ``k``, strides ``s`` and result sizes ``n`` of those axes,
    and patches per channel lane and block. At stride 1 a 3x3 filter takes 4x4 results
    (a 6x6 window: 4 multiply-adds per load) and 8 patches per block; at stride 2, 2x8
    forward results and 4 patches (the window grows by the stride per result; a wide
    patch keeps the warp's loads along the rows), 4x8 backward-data results (a result
    takes one tap in four). The fastest of eight shapes on an H100 on the MobileNet-V2
    layers measured (docs/gpu.md), or as fast. Larger filters take fewer results;
    backward data's patch is a multiple of the strides."""
    taps = k[0] * k[1]
    if max(s) == 1:
        ph, pw, nseg = (4, 4, 8) if taps <= 9 else (2, 4, 8) if taps <= 25 else (2, 2, 8)
    elif direction == "fwd":
        ph, pw, nseg = (2, 8, 4) if taps <= 9 else (2, 2, 8)
    else:  # (a result takes about one tap in s[0]*s[1]: twice the results)
        ph, pw, nseg = (4, 8, 4) if taps <= 9 else (2, 4, 8)
    if direction == "bwd_d":  # whole strides (which taps reach a result: compile-time)
        ph, pw = max(s[0], ph - ph % s[0]), max(s[1], pw - pw % s[1])
    ph = min(ph, max(n[0], s[0] if direction == "bwd_d" else 1))
    pw = min(pw, max(n[1], s[1] if direction == "bwd_d" else 1))
    return ph, pw, nseg


def depthwise_patch(p):
    """Launch configuration of the depthwise patch kernels for ``p``, or None where they do
    not apply: forward with ``icg == 1`` (any multiplier), backward data with
    ``icg == ocg == 1``, at most :data:`PATCH_MAX_TAPS` taps per depth tap. Keys as
    :func:`plan_tiles`, with ``variant`` ``"patch"``, ``patch_h``/``patch_w`` (results per
    thread) and ``segments`` (patches per channel lane and block)."""
    if p.direction == "bwd_w" or p.icg != 1 or (p.direction == "bwd_d" and p.ocg != 1):
        return None
    _, kh, kw = p.ksz
    if kh * kw > PATCH_MAX_TAPS:
        return None
    n = p.osz if p.direction == "fwd" else p.isz
    ch = p.oc if p.direction == "fwd" else p.ic
    s = p.stride[1:]
    ph, pw, seg = patch_config(p.direction, (kh, kw), s, n[1:])
    ctiles = _cdiv(ch, ROWS_CHANNELS)

    def patches(ph, pw):
        return p.mb * n[0] * _cdiv(n[1], ph) * _cdiv(n[2], pw)
    # fewer results per thread while the layer has too few warps (small images, batches)
    while patches(ph, pw) * ctiles < PATCH_MIN_WARPS and ph * pw > 1:
        step_h, step_w = (s[0], s[1]) if p.direction == "bwd_d" else (1, 1)
        if pw >= ph and pw > step_w:
            pw = max(step_w, pw // 2 - (pw // 2) % step_w)
        elif ph > step_h:
            ph = max(step_h, ph // 2 - (ph // 2) % step_h)
        else:
            break
    npt = patches(ph, pw)
    return {"kernel": "direct", "variant": "patch", "threads": ROWS_CHANNELS * seg,
            "patch_h": ph, "patch_w": pw, "segments": seg, "shared_bytes": 0, "splits": 1,
            "grid": (max(1, _cdiv(npt, seg)), max(1, ctiles))}


def depthwise_args(name, dtype, geo):
    """Factory arguments of depthwise kernel ``name`` of :mod:`numbaconv.kernels.cuda.depthwise`
    (or of :mod:`numbaconv.kernels.cuda.depthwise_patch`) for the 22-int geometry ``geo``
    (the row kernels' ``rw`` as :func:`depthwise_rows` picks, the patch kernels' patch as
    :func:`patch_config`)."""
    if name in ("fwd_depthwise_patch", "bwd_d_depthwise_patch"):
        d = name.partition("_depthwise")[0]
        n = (geo[11], geo[12]) if d == "fwd" else (geo[5], geo[6])
        return (dtype, geo, *patch_config(d, (geo[8], geo[9]), (geo[14], geo[15]), n))
    if name == "fwd_depthwise_rows":
        return (dtype, geo, *row_config("fwd", geo[12], geo[15]))
    if name == "bwd_d_depthwise_rows":
        return (dtype, geo, *row_config("bwd_d", geo[6], geo[15]))
    if name == "bwd_w_depthwise_rows":  # one partial per column tile
        from ..kernels.cuda.depthwise import bwd_w_rows_tiles
        rw, nseg = row_config("fwd", geo[12], geo[15])
        return (dtype, geo, rw, nseg, bwd_w_rows_tiles(geo, rw, nseg)[0])
    return (dtype,)


def workspace_bytes(problem, tiles):
    """Device bytes beyond the result: the partial results of a split K (weight gradient,
    and forward/backward data of layers with few output tiles)."""
    if tiles.get("splits", 1) <= 1:
        return 0
    item = np.dtype(problem.compute_dtype).itemsize
    which = {"fwd": 1, "bwd_d": 0, "bwd_w": 2}[problem.direction]
    return tiles["splits"] * math.prod(canonical_shapes(problem)[which]) * item


def gpu_plan(problem, strategy=None):
    """The planner's fields for a device call: ``strategy``, ``variant``, ``tiles``,
    ``threads``, ``workspace_bytes``, ``reason``, ``declined``.

    ``strategy="gemm"`` forces the implicit GEMM, ``"direct"`` the one-element-per-thread
    kernels (depthwise-style, any grouping); ``"winograd"`` declines (ValueError). A label
    of :data:`GPU_ENTRIES` forces exactly that entry: ``"gemm[tf32]"`` (ValueError where
    it declines: no ``precision="tf32"``, not float32), ``"gemm[cuda]"`` (exact float32
    even under ``precision="tf32"``), ``"direct[cuda-depthwise]"``.
    """
    entry = None
    if strategy in GPU_ENTRIES:  # one entry's label: that family, and exactly that variant
        entry = strategy
        strategy = strategy.partition("[")[0]
    if strategy is not None:
        why = accepts(problem, strategy)
        if why is not None:
            raise ValueError(f"strategy: {entry or strategy!r} declines "
                             f"{problem.descriptor()} on the GPU: {why}")
        kernel, reason = strategy, "forced by strategy="
    else:
        kernel = default_kernel(problem)
        reason = ("depthwise: channels across threads" if kernel == "direct"
                  else "implicit GEMM")
        if kernel == "gemm" and accepts(problem, "gemm") is not None:
            kernel, reason = "direct", f"gemm declined ({accepts(problem, 'gemm')})"
    exact = dataclasses.replace(problem, precision="exact")
    tiles = plan_tiles(exact if entry == "gemm[cuda]" else problem, kernel)
    variant = "cuda-depthwise" if kernel == "direct" else "cuda"
    declined = ()
    if entry in ("gemm[tf32-async]", "gemm[tf32]"):
        why = tf32_declines(problem, tiles)
        if why is None and entry == "gemm[tf32-async]":
            why = async_declines(problem, tiles)
        if why is not None:
            raise ValueError(f"strategy: {entry!r} declines {problem.descriptor()} on the "
                             f"GPU: {why}")
    if entry == "gemm[cuda]" and problem.precision == "tf32":
        reason += "; exact float32 (gemm[cuda] forced)"
    elif problem.precision == "tf32":
        why = tf32_declines(problem, tiles)
        if why is None:
            variant, reason = "tf32", (reason + "; precision='tf32': tensor cores (mma.sync "
                                       "m16n8k8, TF32 operands, float32 sums)")
            fed = async_declines(problem, tiles) if entry != "gemm[tf32]" else "forced"
            if fed is None:
                variant, tiles = "tf32-async", async_tiles(problem, tiles)
                reason += ", operands copied to shared memory by cp.async"
            elif entry != "gemm[tf32]":
                declined = (("gemm[tf32-async]", fed),)
                reason += f", operands staged in registers (gemm[tf32-async] declines: {fed})"
        else:
            declined = (("gemm[tf32-async]", why), ("gemm[tf32]", why))
            reason += f"; exact float32 (gemm[tf32] declines: {why})"
            tiles = plan_tiles(exact, kernel)  # (the exact kernels' own tile)
    return {"strategy": kernel, "variant": variant, "tiles": tiles,
            "threads": tiles["threads"], "workspace_bytes": workspace_bytes(problem, tiles),
            "reason": reason, "declined": declined}


#: The GPU's planner entries, best first, as ``Plan.strategy[Plan.variant]`` names them:
#: ``gemm[tf32-async]`` and ``gemm[tf32]`` (``precision="tf32"`` only: the tensor-core
#: GEMMs with operands copied by ``cp.async``, and staged in registers), ``gemm[cuda]``,
#: ``direct[cuda-depthwise]`` (the patch and row kernels' plans carry ``variant: patch`` /
#: ``rows`` in their tiles).
GPU_ENTRIES = ("gemm[tf32-async]", "gemm[tf32]", "gemm[cuda]", "direct[cuda-depthwise]")


def async_declines(problem, tiles):
    """None where the ``gemm[tf32-async]`` entry (:mod:`..kernels.cuda.tf32`) takes
    ``problem`` with the TF32 GEMM's ``tiles``, else why not: channels no multiple of 4 (its
    16-byte copies run along them), a tile it does not take, ``config.CUDA_BLOCK_K`` set
    (its K slice is 16), ``config.CUDA_TF32_ASYNC`` off."""
    if not cfg("CUDA_TF32_ASYNC"):
        return "config.CUDA_TF32_ASYNC is off"
    if cfg("CUDA_BLOCK_K") is not None:
        return "config.CUDA_BLOCK_K is set (its K slices are 16 deep)"
    from ..kernels.cuda import tf32
    p = problem
    bm, bn, tm, tn = (tiles[k] for k in ("block_m", "block_n", "thread_m", "thread_n"))
    why = tf32.reason(p.direction, _geo(p)[0], bm, bn, tm, tn)
    if why is None:
        nst = cfg("CUDA_TF32_STAGES") or tf32.stages(p.direction, bm, bn)
        if tf32.shared_bytes(p.direction, bm, bn, nst) > MAX_STATIC_SHARED:
            why = f"{nst} stages of a {bm}x{bn} tile exceed 48 KiB of shared memory"
    return why


def async_tiles(problem, tiles):
    """``tiles`` of the TF32 GEMM for the ``gemm[tf32-async]`` kernels (where
    :func:`async_declines` is None): K slices of 16, ``loader: "cp.async"``, ``stages``
    (``config.CUDA_TF32_STAGES`` or :func:`..kernels.cuda.tf32.stages`), their shared
    memory and split count."""
    from ..kernels.cuda import tf32
    p = problem
    bm, bn = tiles["block_m"], tiles["block_n"]
    nst = cfg("CUDA_TF32_STAGES") or tf32.stages(p.direction, bm, bn)
    t = dict(tiles, block_k=tf32.BK, loader="cp.async", stages=nst,
             shared_bytes=tf32.shared_bytes(p.direction, bm, bn, nst))
    # the weight gradient's K runs over the flat output pixels, 16 at a time
    return _split_k(t, p, _gemm_mnk(p), _cdiv(p.mb * math.prod(p.osz), tf32.BK))


def _split_k(t, p, mnk, chunks):
    """Set ``t["splits"]`` and ``t["grid"]`` of GEMM tiles ``t`` for ``p`` (``mnk``:
    :func:`_gemm_mnk`): forward and backward data split K (slices of ``block_k``) where
    the grid has fewer than ``CUDA_MIN_BLOCKS`` blocks, into ranges of at least
    ``CUDA_SPLIT_MIN_SLICES`` slices; the weight gradient splits its ``chunks`` (of
    ``block_k`` pixels) towards ``CUDA_TARGET_BLOCKS`` blocks, each split at least
    ``CUDA_SPLIT_MIN_PIXELS`` pixels. Returns ``t``."""
    M, N, z = mnk
    bm, bn, bk = t["block_m"], t["block_n"], t["block_k"]
    base = max(1, _cdiv(M, bm) * _cdiv(N, bn) * z)
    if p.direction == "bwd_w":
        splits = min(_cdiv(cfg("CUDA_TARGET_BLOCKS"), base),
                     chunks // max(1, _cdiv(cfg("CUDA_SPLIT_MIN_PIXELS"), bk)),
                     cfg("CUDA_MAX_SPLITS"), MAX_GRID_YZ // max(1, p.g))
    else:
        if p.direction == "bwd_d":
            taps = math.prod(max(axis_taps(s, d, k)) for s, d, k
                             in zip(p.stride, p.dilation, p.ksz))
            slices = taps * _cdiv(p.ocg, bk)
        else:
            slices = math.prod(p.ksz) * _cdiv(p.icg, bk)
        splits = 1
        if base < cfg("CUDA_MIN_BLOCKS"):
            splits = min(_cdiv(cfg("CUDA_MIN_BLOCKS"), base),
                         slices // cfg("CUDA_SPLIT_MIN_SLICES"), cfg("CUDA_MAX_SPLITS"),
                         MAX_GRID_YZ // max(1, z))
    t["splits"] = splits = max(1, splits)
    t["grid"] = (max(1, _cdiv(M, bm)), max(1, _cdiv(N, bn)), max(1, z * splits))
    return t


def tf32_declines(problem, tiles):
    """None where the TF32 GEMM entry takes ``problem`` with ``tiles``, else why not: it
    needs ``precision="tf32"``, float32 operands, the GEMM kernels (the direct kernels have
    no tensor-core path) and a tile of whole m16n8k8 warp tiles."""
    if problem.precision != "tf32":
        return "precision is not 'tf32'"
    if problem.compute_dtype != "float32":
        return f"TF32 takes float32 operands, not {problem.dtype}"
    if tiles.get("kernel") != "gemm":
        return "the direct kernels (depthwise, few channels) have no tensor-core path"
    from ..kernels.cuda.gemm import tf32_tile_reason
    return tf32_tile_reason("float32", tiles["block_m"], tiles["block_n"], tiles["block_k"],
                            tiles["thread_m"], tiles["thread_n"])


# -- layouts ---------------------------------------------------------------------------------
_LAYOUTS = {}


def _layout(p, which):
    """``(canonical dims, sel, div, identity)`` of operand/result ``which`` (x, dy, w),
    computed once per problem."""
    key = (p, which)
    got = _LAYOUTS.get(key)
    if got is None:
        if len(_LAYOUTS) >= 4096:
            _LAYOUTS.clear()
        got = _LAYOUTS[key] = _layout_of(p, which)
    return got


def _layout_of(p, which):
    nd = p.ndim
    sp = tuple(range(3 - nd, 3))
    if which == "w":
        cdims = (*p.ksz, p.icg, p.oc)
        if p.filter_format == "OIX":
            return cdims, (4, 3, *sp), 1, False
        if p.filter_format == "XIM":
            return cdims, (*sp, 5, 6), max(1, p.ocg), True
        return cdims, (*sp, 3, 4), 1, True
    ch, sizes = (p.ic, p.isz) if which == "x" else (p.oc, p.osz)
    cdims = (p.mb, *sizes, ch)
    spd = tuple(a + 1 for a in sp)
    if p.data_format == "NCX":
        return cdims, (0, 4, *spd), 1, False
    return cdims, (0, *spd, 4), 1, True


def _blocks(n, threads):
    return max(1, min(_cdiv(n, threads), 1 << 16))


class _Buf:
    """A pooled flat device array and the shaped views of it taken so far (a reshape of a
    numba device array costs microseconds of Python; a pooled buffer serves many calls)."""

    __slots__ = ("arr", "key", "nbytes", "views", "_ptr")

    def __init__(self, arr, key):
        self.arr, self.key, self.nbytes, self.views = arr, key, arr.nbytes, {}
        self._ptr = None

    @property
    def ptr(self):
        """The buffer's device address (an int), read once."""
        if self._ptr is None:
            self._ptr = device_pointer(self.arr)
        return self._ptr

    def view(self, shape):
        v = self.views.get(shape)
        if v is None:
            v = self.views[shape] = self.arr.reshape(shape)
        return v


class _Call:
    """One call's device context: numba.cuda, the launch stream ``st`` (0: numba's default)
    and the pooled buffers it took, returned to the pool when the call has queued its
    last kernel (later calls on the same stream run after it, so they may reuse them)."""

    __slots__ = ("cuda", "st", "key", "taken")

    def __init__(self, cuda, st):
        self.cuda, self.st, self.taken = cuda, st, []
        # (the simulator's streams have no handle; its launches run synchronously)
        self.key = stream_handle(st) if isinstance(st, int) or not simulator() \
            else ("sim", id(st))

    def fresh(self, shape, dtype):
        """A new array that the caller keeps (a result). Under numba's own allocator its
        memory is a pooled block (:func:`_result_block`) that goes back to the pool when
        the result and every view of it are gone; under an External Memory Management
        plugin the user installed (RMM, say), and in the simulator, it comes from
        numba's allocator and so from that plugin."""
        if type(shape) is list:
            shape = tuple(shape)
        form = _FORMS.get((shape, dtype))
        if form is None:
            form = _form(shape, dtype)
        if form[2] and _results_pooled(self.cuda):
            b = _take((self.key, form[2], "|u1"), self.cuda, self.st)
            return _result_block(b, form, self.st)
        return self.cuda.device_array(form[0], form[1], stream=self.st)

    def buf(self, n, dtype):
        """A flat scratch buffer (:class:`_Buf`) of ``n`` elements of ``dtype`` (a NumPy
        dtype string such as ``"<f4"``), from the pool where one is free."""
        b = _take((self.key, n, dtype), self.cuda, self.st)
        self.taken.append(b)
        return b

    def work(self, n, dtype):
        """A flat scratch array of ``n`` elements, from the pool where one is free."""
        return self.buf(n, np.dtype(dtype).str).arr

    def done(self):
        for b in self.taken:
            _give_back(b)
        self.taken = []


def _take(key, cuda, st):
    """A free pooled :class:`_Buf` of ``key`` (stream key, elements, dtype string), else a
    new one allocated on stream ``st``."""
    global _POOLED
    free = _POOL.get(key)
    if free:
        b = free.pop()
        _POOLED -= b.nbytes
        return b
    return _Buf(cuda.device_array(key[1], np.dtype(key[2]), stream=st), key)


def _give_back(b):
    """Return :class:`_Buf` ``b`` to the pool (kept while the pool holds at most
    ``CUDA_POOL_BYTES``, else left to numba to free). Also a result block's finalizer,
    which may run whenever the garbage collector does: only list and dict operations."""
    global _POOLED
    if _POOLED + b.nbytes > cfg("CUDA_POOL_BYTES"):
        return
    _POOL.setdefault(b.key, []).append(b)
    _POOLED += b.nbytes


#: Free pooled device buffers (:class:`_Buf`) by (stream handle, elements, dtype), and
#: their bytes.
_POOL = {}
_POOLED = 0
#: Result blocks' memory pointers while a result (or a view of it) lives, by address.
_LIVE = {}


def clear_pool():
    """Drop the pooled device memory (numba frees it once nothing else holds it)."""
    global _POOLED
    _POOL.clear()
    _POOLED = 0


def _form(shape, dtype):
    """``(shape, dtype, bytes, C strides)`` of a result, kept per ``(shape, dtype)``."""
    key = (shape, dtype)
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(int(v) for v in shape)
    strides, step = [], dtype.itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= d
    form = (shape, dtype, math.prod(shape) * dtype.itemsize, tuple(reversed(strides)))
    if len(_FORMS) >= 1024:
        _FORMS.clear()
    _FORMS[key] = form
    return form


_FORMS = {}


@functools.lru_cache(maxsize=None)
def _numba_driver():
    """``(numba.cuda.cudadrv.driver, numba.cuda.cudadrv.devicearray)``, or None (imported
    once)."""
    try:
        from numba.cuda.cudadrv import devicearray, driver
    except ImportError:
        return None
    return driver, devicearray


def _results_pooled(cuda):
    """Whether results come from the pool: numba's own allocator on a real GPU (with an
    External Memory Management plugin the plugin allocates them) and a pool at all."""
    if cfg("CUDA_POOL_BYTES") <= 0 or simulator():
        return False
    mods = _numba_driver()
    if mods is None:
        return False
    driver = mods[0]
    return getattr(driver, "_memory_manager", None) is getattr(
        driver, "NumbaCUDAMemoryManager", False)


def _result_block(b, form, st):
    """A C-contiguous device array of ``form`` (:func:`_form`) on the memory of pooled
    :class:`_Buf` ``b``, bound to stream ``st``; ``b`` goes back to the pool (keyed by
    that stream, whose later launches run after every use of it made on that stream)
    when the array and all its views are gone, as numba frees its own allocations
    (its reference-counted pointer, with :func:`_give_back` as the finalizer).

    A result read on another stream must be waited for on that stream before it is
    dropped (as with PyTorch's caching allocator without ``record_stream``)."""
    driver, devicearray = _numba_driver()
    ptr = b.ptr
    gd = b.arr.gpu_data
    mem = driver.AutoFreePointer(gd.context, gd.device_pointer, b.nbytes,
                                 finalizer=_ResultFree(b, ptr))
    _LIVE[ptr] = mem
    return devicearray.DeviceNDArray(form[0], form[3], form[1], stream=st,
                                     gpu_data=mem.own())


class _ResultFree:
    """The finalizer of a result block's pointer (no reference to the pointer itself)."""

    __slots__ = ("b", "ptr")

    def __init__(self, b, ptr):
        self.b, self.ptr = b, ptr

    def __call__(self):
        _LIVE.pop(self.ptr, None)
        _give_back(self.b)


def _result_which(p):
    return {"fwd": "dy", "bwd_d": "x", "bwd_w": "w"}[p.direction]


def _result_is_canonical(p, out):
    """Whether the canonical result is returned as it is (no scatter kernel, no copy)."""
    identity = _layout(p, _result_which(p))[3]
    return out is None and identity and np.dtype(p.dtype) == np.dtype(p.compute_dtype)


def _to_user(call, r, p, out):
    """The canonical result ``r`` (contiguous) in the user's layout and dtype."""
    cdims, sel, div, identity = _layout(p, _result_which(p))
    shape = p.result_shape
    if _result_is_canonical(p, out):
        # (numba's reshape drops the array's stream: the result is bound to the launch one)
        res = r.reshape(shape)
        return res if isinstance(call.st, int) and call.st == 0 else res.bind(call.st)
    from ..kernels.cuda import layout

    dst = out if out is not None else call.fresh(shape, p.dtype)
    n = math.prod(cdims)
    if n:
        threads = cfg("CUDA_THREADS")
        layout.scatter(len(shape))[_blocks(n, threads), threads, call.st](
            r.reshape(n), dst, cdims, sel, div)
    return dst


def check_out(out, p):
    if out is None:
        return None
    if not is_device_array(out):
        raise TypeError(f"out: expected a device array, got {type(out).__name__}")
    arr = as_device_array(out, "out")
    if np.dtype(arr.dtype) != np.dtype(p.dtype):
        raise TypeError(f"out: expected dtype {p.dtype}, got {arr.dtype}")
    if tuple(arr.shape) != tuple(p.result_shape):
        raise ValueError(f"out: expected shape {tuple(p.result_shape)}, got {tuple(arr.shape)}")
    return arr


def device_out(out):
    """A memoised call's ``out=`` (shape and dtype checked by its first run) as a numba
    device array: itself where it is one, else wrapped zero-copy."""
    if out is None or getattr(out, "__cuda_ndarray__", False) is True:
        return out
    return as_device_array(out, "out")


def check_memory(cuda, p, tiles, ops=None, out=None):
    """MemoryError, before any work, when what the call allocates exceeds free GPU memory:
    the canonical result, the workspace and the copies :func:`_to_canonical` and
    :func:`_to_user` really make (not the operands the caller already holds). ``ops``:
    the call's device operands (without them every operand counts as copied); ``out``:
    the caller's result array, if any."""
    ct = np.dtype(p.compute_dtype)
    copies = 0
    names = {"fwd": ("x", "w"), "bwd_d": ("dy", "w"), "bwd_w": ("x", "dy")}[p.direction]
    for name in () if p.empty else names:
        a = None if ops is None else ops.get(name)
        cdims, _, _, identity = _layout(p, name)
        if not (a is not None and identity and np.dtype(a.dtype) == ct
                and a.is_c_contiguous()):
            copies += math.prod(cdims) * ct.itemsize
    cdims, _, _, identity = _layout(p, _result_which(p))
    n = math.prod(cdims)
    result = n * ct.itemsize
    if n and out is None and not (identity and np.dtype(p.dtype) == ct):
        copies += n * np.dtype(p.dtype).itemsize
    work = 0 if p.empty else workspace_bytes(p, tiles)
    need = result + work + copies
    try:
        free, _total = cuda.current_context().get_memory_info()
    except Exception:  # simulator, or a driver that cannot tell: let the allocator decide
        return
    if need > free:
        raise MemoryError(
            f"numbaconv: {p.op or p.direction} {p.descriptor()} needs {need} bytes "
            f"({need / 2**30:.3g} GiB) of GPU memory (result {result} bytes of shape "
            f"{p.result_shape}, workspace {work} bytes, copies {copies} bytes) but {free} "
            f"bytes are free")


# -- running ---------------------------------------------------------------------------------
_GEOS = {}


def _geo(p):
    """``(geometry tuple of the kernels, canonical result shape)``, computed once per problem."""
    got = _GEOS.get(p)
    if got is None:
        if len(_GEOS) >= 4096:
            _GEOS.clear()
        geo = tuple(int(v) for v in (p.mb, p.g, p.icg, p.ocg, *p.isz, *p.ksz, *p.osz,
                                     *p.stride, *p.dilation, *p.pad_begin))
        xs, ys, ws = canonical_shapes(p)
        got = _GEOS[p] = (geo, {"fwd": ys, "bwd_d": xs, "bwd_w": ws}[p.direction])
    return got


class _Prepared:
    """What a plan's calls launch, derived once per plan and operand layout: the kernel
    objects, grids and blocks, the shapes of the views each kernel takes, the scratch
    sizes. A call (:meth:`launch`) only takes buffers, binds its arrays and launches.

    ``inputs``: per operand of the main kernel, in its argument order, ``(name, view,
    gather)``: ``view`` the shape the kernel takes (None: the array as it is), ``gather``
    None where the operand is used in place, else ``(kernel, blocks, threads, elements,
    cdims, sel, div)`` of the gather kernel that makes its canonical copy. ``main``: the
    main kernel, grid, block and trailing arguments. With ``splits > 1`` the kernel writes
    ``splits`` partial results (``part_view``) that ``reduce`` sums into the result.
    ``final``: the canonical result is the call's result (a fresh array, no scatter);
    else ``scatter`` (kernel, blocks, threads, cdims, sel, div) writes it in the user's
    layout and dtype. ``special``: ``"zero"`` (a result without elements) or ``"empty"``
    (zeros: no operand elements), which take the general path.
    """

    __slots__ = ("plan", "p", "special", "ct", "n", "inputs", "kern", "grid", "block",
                 "extra", "splits", "res_view", "part_view", "reduce", "final", "scatter",
                 "shape", "dtype", "into_out", "nbytes", "fast")

    def __init__(self, plan, ops, dst):
        from ..kernels.cuda import depthwise, depthwise_patch, gemm, layout

        p = self.p = plan.problem
        self.plan = plan
        self.shape, self.dtype = tuple(p.result_shape), p.dtype
        self.into_out, self.fast = False, None
        self.nbytes = {k: int(a.size) * np.dtype(a.dtype).itemsize for k, a in ops.items()}
        self.special = ("zero" if math.prod(p.result_shape) == 0
                        else "empty" if p.empty else None)
        if self.special:
            return
        t = plan.tiles
        if t.get("kernel") not in ("gemm", "direct"):
            t = plan_tiles(p)
        ct = np.dtype(p.compute_dtype)
        self.ct = ct.str
        geo, rs = _geo(p)
        n = self.n = math.prod(rs)
        threads = cfg("CUDA_THREADS")
        splits = self.splits = t["splits"]
        self.grid, self.block = tuple(t["grid"]), t["threads"]
        self.extra = ()
        flat = t["kernel"] == "gemm" or t.get("variant") in ("rows", "patch")
        cp = p.compute_dtype
        if t["kernel"] == "gemm" and plan.variant == "tf32-async":
            from ..kernels.cuda import tf32
            tile = (t["block_m"], t["block_n"], t["thread_m"], t["thread_n"])
            self.kern = {"fwd": tf32.fwd_tf32, "bwd_d": tf32.bwd_d_tf32,
                         "bwd_w": tf32.bwd_w_tf32}[p.direction](*tile, geo, splits,
                                                                  t["stages"])
            names = {"fwd": ("x", "w"), "bwd_d": ("dy", "w"), "bwd_w": ("x", "dy")}[p.direction]
            self.res_view, self.part_view = (n,), (splits * n,)
        elif t["kernel"] == "gemm":
            tile = (t["block_m"], t["block_n"], t["block_k"], t["thread_m"], t["thread_n"])
            self.kern = {"fwd": gemm.fwd_gemm, "bwd_d": gemm.bwd_d_gemm,
                         "bwd_w": gemm.bwd_w_gemm}[p.direction](
                             cp, *tile, geo, splits,
                             *(("tf32",) if plan.variant == "tf32" else ()))
            names = {"fwd": ("x", "w"), "bwd_d": ("dy", "w"), "bwd_w": ("x", "dy")}[p.direction]
            self.res_view, self.part_view = (n,), (splits * n,)
        elif t.get("variant") == "patch":
            self.kern = (depthwise_patch.fwd_depthwise_patch if p.direction == "fwd"
                         else depthwise_patch.bwd_d_depthwise_patch)(
                             cp, geo, t["patch_h"], t["patch_w"], t["segments"])
            names = ("x" if p.direction == "fwd" else "dy", "w")
            self.res_view, self.part_view, splits = (n,), None, 1
        elif t.get("variant") == "rows" and p.direction == "bwd_w":
            self.kern = depthwise.bwd_w_depthwise_rows(cp, geo, t["row_width"], t["segments"],
                                                       splits)
            names = ("x", "dy")
            self.res_view, self.part_view = (n,), (splits * n,)
        elif t.get("variant") == "rows":
            self.kern = (depthwise.fwd_depthwise_rows if p.direction == "fwd"
                         else depthwise.bwd_d_depthwise_rows)(cp, geo, t["row_width"],
                                                              t["segments"])
            names = ("x" if p.direction == "fwd" else "dy", "w")
            self.res_view, self.part_view, splits = (n,), None, 1
        else:
            self.kern = {"fwd": depthwise.fwd_depthwise, "bwd_d": depthwise.bwd_d_depthwise,
                         "bwd_w": depthwise.bwd_w_depthwise}[p.direction](cp)
            names = {"fwd": ("x", "w"), "bwd_d": ("dy", "w"), "bwd_w": ("x", "dy")}[p.direction]
            self.extra = (geo,)
            if p.direction == "bwd_w":
                self.res_view, self.part_view = (1, *rs), (splits, *rs)
            else:
                self.res_view, self.part_view, splits = tuple(rs), None, 1
        self.splits = splits
        self.reduce = None
        if splits > 1:
            rt = threads
            self.reduce = (gemm.reduce_partials(cp), _blocks(n, rt), rt, (splits, n))
        self.inputs = []
        for name in names:
            a = ops[name]
            cdims, sel, div, identity = _layout(p, name)
            m = math.prod(cdims)
            view = (m,) if flat else tuple(cdims)
            if identity and np.dtype(a.dtype) == ct and a.is_c_contiguous():
                self.inputs.append((name, None if tuple(a.shape) == view else view, None))
            else:
                self.inputs.append((name, None if flat else view,
                                    (layout.gather(a.ndim), _blocks(m, threads), threads, m,
                                     cdims, sel, div)))
        self.inputs = tuple(self.inputs)
        self.final = _result_is_canonical(p, dst)
        # out= in the canonical layout and dtype, contiguous: the kernels write into it
        # (unless it overlaps an operand; then through a scratch result and the scatter)
        self.into_out = (dst is not None and _layout(p, _result_which(p))[3]
                         and np.dtype(dst.dtype) == ct and bool(dst.is_c_contiguous()))
        self.scatter = None
        if not self.final:
            cdims, sel, div, _ = _layout(p, _result_which(p))
            self.scatter = (layout.scatter(len(self.shape)), _blocks(n, threads), threads,
                            cdims, sel, div)

    def launch(self, call, ops, dst, rec=None):
        """Queue the plan's kernels on ``call``'s stream for device arrays ``ops`` (by
        name) and ``out`` array ``dst`` (or None); returns the result. ``rec``: a list
        that receives, per launch, ``(kernel, grid, block, args, sources)``, where
        ``sources`` names, per argument, the array it stands for (an operand's name,
        ``("b", i)`` for the call's i-th pooled buffer, ``"res"``, ``"out"``) or None
        (a constant): what :func:`_fast_program` needs to replay the launches."""
        st = call.st
        ct = self.ct

        def go(kern, grid, block, args, srcs):
            kern[grid, block, st](*args)
            if rec is not None:
                rec.append((kern, grid, block, args, srcs))

        args, srcs = [], []
        for name, view, gather in self.inputs:
            a = ops[name]
            if gather is None:
                args.append(a if view is None else a.reshape(view))
                srcs.append(name)
            else:
                kern, blocks, threads, m, cdims, sel, div = gather
                b = call.buf(m, ct)
                tag = ("b", len(call.taken) - 1)
                go(kern, blocks, threads, (a, b.arr, cdims, sel, div),
                   (name, tag, None, None, None))
                args.append(b.arr if view is None else b.view(view))
                srcs.append(tag)
        n = self.n
        direct = self.into_out and not _overlaps(dst, ops, self.nbytes)
        if self.final:
            r = call.fresh(n, ct)
            rv = r if self.res_view == (n,) else r.reshape(self.res_view)
            rtag = "res"
        elif direct:
            r = dst.reshape(n)
            rv = r if self.res_view == (n,) else dst.reshape(self.res_view)
            rtag = "out"
        else:
            b = call.buf(n, ct)
            r, rv = b.arr, b.view(self.res_view)
            rtag = ("b", len(call.taken) - 1)
        tail = (None,) * len(self.extra)
        if self.reduce is None:
            go(self.kern, self.grid, self.block, (*args, rv, *self.extra),
               (*srcs, rtag, *tail))
        else:
            part = call.buf(self.splits * n, ct)
            ptag = ("b", len(call.taken) - 1)
            go(self.kern, self.grid, self.block, (*args, part.view(self.part_view), *self.extra),
               (*srcs, ptag, *tail))
            kern, blocks, threads, view = self.reduce
            go(kern, blocks, threads, (part.view(view), r), (ptag, rtag))
        if self.final:
            # (numba's reshape drops the array's stream: the result is bound to the launch one)
            res = r.reshape(self.shape)
            return res if isinstance(st, int) and st == 0 else res.bind(st)
        if direct:
            return dst
        kern, blocks, threads, cdims, sel, div = self.scatter
        dtag = "out"
        if dst is None:
            dst, dtag = call.fresh(self.shape, self.dtype), "res"
        go(kern, blocks, threads, (r, dst, cdims, sel, div), (rtag, dtag, None, None, None))
        return dst


def device_pointer(a):
    """The device address (an int) of a numba device array or of an object exposing
    ``__cuda_array_interface__``."""
    return _pointer_and_stream(a)[0]


def _overlap(lo, size, addrs, nbytes):
    """Whether ``size`` bytes at device address ``lo`` overlap an operand: ``addrs`` and
    ``nbytes`` their addresses and sizes in bytes, by name."""
    hi = lo + size
    return any(p < hi and lo < p + nbytes[k] for k, p in addrs.items())


def _host_data(a):
    """The NumPy array behind a simulated device array (or a test's stand-in), else None."""
    for attr in ("_ary", "data"):
        v = getattr(a, attr, None)
        if isinstance(v, np.ndarray):
            return v
    return None


def _overlaps(dst, ops, nbytes):
    """Whether ``dst`` (None: no) shares device memory with one of the operands ``ops``
    (their sizes in bytes by name: ``nbytes``)."""
    if dst is None:
        return False
    h = _host_data(dst)
    if h is not None:  # the simulator's arrays (and test stand-ins) hold NumPy arrays
        return any(np.may_share_memory(h, a) for a in map(_host_data, ops.values())
                   if a is not None)
    return _overlap(device_pointer(dst), int(dst.size) * np.dtype(dst.dtype).itemsize,
                    {k: device_pointer(a) for k, a in ops.items()}, nbytes)


class _Recording:
    """What :meth:`_Prepared.launch` did in one call, for :func:`_fast_program`."""

    __slots__ = ("launches", "taken")

    def __init__(self):
        self.launches, self.taken = [], ()


class _FastProgram:
    """A prepared plan's launches, replayed straight through the driver: per launch the
    kernel, its launch configuration, its argument list as numba marshals it (sizes,
    shapes, strides and constants fixed: the memo's key fixes the layouts) and the
    positions of the device addresses that change from call to call. A call fills in
    the addresses of its operands, ``out=``, result and pooled buffers and launches; no
    numba device array is made, no argument is typed again.

    ``steps``: ``(kernel, config, args, slots)``; ``slots``: ``(position, source)``;
    ``bufs``: ``(elements, dtype)`` of the pooled buffers, in the order the steps name
    them (``("b", i)``)."""

    __slots__ = ("steps", "bufs", "launch", "to_stream")

    def __init__(self, steps, bufs, launch, to_stream):
        self.steps, self.bufs, self.launch, self.to_stream = steps, bufs, launch, to_stream


def _fast_program(rec):
    """The :class:`_FastProgram` of the launches ``rec`` recorded (just made, so every
    kernel is compiled for its arguments), or None where one cannot be made: a kernel
    whose overload is not found by its argument types, an argument numba would copy, a
    numba-cuda that marshals arguments otherwise than as checked here."""
    try:
        from cuda.core import LaunchConfig, launch
        from numba.cuda.cudadrv import driver as ndriver
        from numba.cuda.errors import normalize_kernel_dimensions
        to_stream = ndriver._to_core_stream
    except Exception:
        return None
    steps = []
    try:
        for kern, grid, block, args, srcs in rec.launches:
            argtypes = tuple(kern.typeof_pyval(a) for a in args)
            ko = kern.overloads.get(argtypes)
            if ko is None or getattr(ko, "debug", False) or getattr(ko, "cooperative", False):
                return None
            ka, retr, slots = [], [], []
            for t, v, src in zip(ko.argument_types, args, srcs):
                n0 = len(ka)
                ko._prepare_args(t, v, 0, retr, ka)
                if src is not None:
                    # an array: meminfo, parent, size, itemsize, data, shape..., strides...
                    if (type(t).__name__ != "Array" or len(ka) != n0 + 5 + 2 * t.ndim
                            or type(ka[n0 + 4]) is not int or ka[n0 + 4] != device_pointer(v)):
                        return None
                    slots.append((n0 + 4, src))
            if retr:
                return None
            g3, b3 = normalize_kernel_dimensions(grid, block)
            config = LaunchConfig(grid=g3, block=b3, shmem_size=0)
            steps.append((ko._codelibrary.get_cufunc().kernel, config, tuple(ka),
                          tuple(slots)))
    except Exception:
        return None
    bufs = tuple((b.key[1], b.key[2]) for b in rec.taken)
    return _FastProgram(tuple(steps), bufs, launch, to_stream)


#: numba stream objects (external streams) and cuda.core streams by handle, for the fast
#: path's launches and results.
_STREAMS, _CORE_STREAMS = {}, {}


def _numba_stream(cuda, handle):
    s = _STREAMS.get(handle)
    if s is None:
        if len(_STREAMS) >= 64:
            _STREAMS.clear()
        s = _STREAMS[handle] = cuda.external_stream(handle)
    return s


def _pointer_and_stream(a):
    """``(device address, producer stream handle)`` of a device operand."""
    if getattr(a, "__cuda_ndarray__", False) is True:
        s = a.stream
        return int(a.device_ctypes_pointer.value or 0), (0 if not s else stream_handle(s))
    cai = a.__cuda_array_interface__
    return int(cai["data"][0]), cai.get("stream")


def run_fast(pr, ops, out, stream):
    """A memoised call's launches through the prepared :class:`_FastProgram` of ``pr``:
    ``ops`` the caller's device operands by name (numba device arrays or any object with
    ``__cuda_array_interface__``, of the layouts ``pr`` was prepared for), ``out`` the
    caller's ``out=`` (or None), ``stream`` as checked by :func:`check_stream`. Returns
    the result, or None where the call needs the general path (no program yet, operands
    from several streams, ``out=`` overlapping an operand)."""
    prog = pr.fast
    if not prog:
        return None
    addr = {}
    producer = None
    for k, a in ops.items():
        p, h = _pointer_and_stream(a)
        addr[k] = p
        if not _is_default(h):
            if producer is not None and producer != h:
                return None
            producer = h
    if stream is not None:
        h = stream_handle(stream)
        if producer is not None and producer != h:
            return None
        st = stream if _is_numba_stream(stream) else h
    else:
        h = st = producer if producer is not None else 0
    if _is_default(h):
        h = st = 0
    if out is not None:
        p, oh = _pointer_and_stream(out)
        if not _is_default(oh) and oh != (h if stream is not None else producer):
            return None  # (out= from another stream: the general path orders it)
        if pr.into_out and _overlap(p, math.prod(pr.shape) * np.dtype(pr.dtype).itemsize,
                                    addr, pr.nbytes):
            return None
        addr["out"] = p
    cuda = _cuda()
    if isinstance(st, int) and st:
        st = _numba_stream(cuda, st)
    call = _Call(cuda, st)
    res = None
    for i, (n, dt) in enumerate(prog.bufs):
        addr[("b", i)] = call.buf(n, dt).ptr
    if out is None:
        res = call.fresh(pr.shape, pr.dtype)
        addr["res"] = device_pointer(res)
    cs = _CORE_STREAMS.get(h)
    if cs is None:
        if len(_CORE_STREAMS) >= 64:
            _CORE_STREAMS.clear()
        cs = _CORE_STREAMS[h] = prog.to_stream(st)
    launch = prog.launch
    try:
        for kern, config, args, slots in prog.steps:
            a = list(args)
            for i, src in slots:
                a[i] = addr[src]
            launch(cs, config, kern, *a)
    except Exception as exc:
        # a numba-cuda or cuda.core whose launch takes these arguments otherwise: the
        # general path from now on (it repeats any launch made here: same results)
        global FAST_FAILURE
        FAST_FAILURE = f"{type(exc).__name__}: {exc}"
        pr.fast = False
        call.done()
        return None
    call.done()
    return out if out is not None else res


#: Why a replay through the driver failed (then its plan took the general path), or None.
FAST_FAILURE = None


def _general(call, p, dst):
    """The result of an empty problem (zeros) or of one without result elements."""
    if math.prod(p.result_shape) == 0:
        return dst if dst is not None else call.fresh(p.result_shape, p.dtype)
    from ..kernels.cuda import layout

    n = math.prod(canonical_shapes(p)[{"fwd": 1, "bwd_d": 0, "bwd_w": 2}[p.direction]])
    r = call.fresh(n, p.compute_dtype) if _result_is_canonical(p, dst) else \
        call.work(n, p.compute_dtype)
    threads = cfg("CUDA_THREADS")
    layout.fill_zero()[_blocks(n, threads), threads, call.st](r)
    r = r.reshape(_layout(p, _result_which(p))[0])
    return _to_user(call, r, p, dst)


#: Prepared launches by (problem, tiles, variant, operands' dtypes and contiguity, whether
#: out= is given);
#: making one checks the plan's memory need against the free GPU memory (a driver call,
#: once: later calls leave a shortage to the allocator).
_PREPARED = {}


def clear_prepared():
    """Forget the prepared launches (the front end's memo of parsed calls keeps some too)."""
    _PREPARED.clear()


def prepare(plan, ops, dst, cuda=None):
    """The :class:`_Prepared` launches of ``plan`` for device arrays ``ops`` (by name) and
    ``out`` array ``dst`` (or None), made and memory-checked on first use."""
    tiles = plan.tiles
    key = (plan.problem, getattr(tiles, "_items", None) or tuple(sorted(tiles.items())),
           plan.variant, tuple([(k, np.dtype(a.dtype).str, bool(a.is_c_contiguous()))
                                for k, a in ops.items()]), dst is None)
    pr = _PREPARED.get(key)
    if pr is None:
        p = plan.problem
        if tiles.get("kernel") not in ("gemm", "direct"):
            tiles = plan_tiles(p)
        check_memory(cuda or _cuda(p.op or p.direction), p, tiles, ops, dst)
        pr = _Prepared(plan, ops, dst)
        if len(_PREPARED) >= 4096:
            _PREPARED.clear()
        _PREPARED[key] = pr
    return pr


def _launch_stream(cuda, ops, stream):
    """``(launch stream, producer streams to wait for)``: ``stream`` where given; else the
    operands' one stream where they all share one that is not a default stream; else
    numba's default stream. Operands from any other stream are waited for on the device
    (an event), never on the host."""
    if simulator():
        return (stream if stream is not None else 0), []
    prod = {}
    for a in ops:
        s = getattr(a, "stream", 0)
        h = stream_handle(s)
        if not _is_default(h):
            prod.setdefault(h, s)
    if stream is not None:
        st = stream if _is_numba_stream(stream) else (
            0 if _is_default(stream_handle(stream))
            else cuda.external_stream(stream_handle(stream)))
    elif len(prod) == 1:
        st = next(iter(prod.values()))
    else:
        st = 0
    h = stream_handle(st)
    return st, [s for k, s in prod.items() if k != h]


def execute(plan, operands, out=None, stream=None):
    """Run ``plan`` on device ``operands``; returns a numba device array in the user's
    layout and dtype (``out`` itself when given: a device array of the exact shape and dtype).

    Kernels go on ``stream`` (a numba, CuPy or PyTorch stream, or a handle) where given,
    else on the stream that the operands' ``__cuda_array_interface__`` names where they
    share one, else on numba's default stream; operands from other streams are waited for
    on the device. Nothing synchronises the host. The result belongs to that stream.
    """
    p = plan.problem
    cuda = _cuda(p.op or p.direction)
    stream = check_stream(stream)
    ops = {k: as_device_array(v, k) for k, v in operands.items()}
    dst = check_out(out, p)
    return run_prepared(prepare(plan, ops, dst, cuda), ops, dst, stream, cuda)


def run_prepared(pr, ops, dst, stream, cuda=None):
    """Launch the prepared ``pr`` on numba device arrays ``ops`` (by name, the dtypes and
    layouts ``pr`` was prepared for) into ``dst`` (a numba device array of the result's
    shape and dtype, or None) on ``stream`` (checked by :func:`check_stream`): the
    launch stream and the device-side waits on the operands' streams are worked out per
    call; everything else comes from ``pr``."""
    if cuda is None:
        cuda = _cuda(pr.p.op or pr.p.direction)
    arrays = list(ops.values())
    if dst is not None:
        arrays.append(dst)
    st, waits = _launch_stream(cuda, arrays, stream)
    for s in waits:
        ev = cuda.event(timing=False)
        ev.record(stream=s)
        ev.wait(stream=st)
    call = _Call(cuda, st)
    if pr.special:
        res = _general(call, pr.p, dst)
    elif pr.fast is None and not simulator():
        # the first run records its launches; later memoised calls replay them (run_fast)
        rec = _Recording()
        res = pr.launch(call, ops, dst, rec.launches)
        rec.taken = tuple(call.taken)
        if not pr.into_out or res is dst:  # (else out= overlapped an operand: not now)
            pr.fast = _fast_program(rec) or False
    else:
        res = pr.launch(call, ops, dst)
    call.done()
    return res
