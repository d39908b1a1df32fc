"""Timing: the sgemm peak and each dtype's compute peak that define 100 %, and the blocks in which
each contender is timed."""
from contextlib import nullcontext
import math
import time

import numpy as np

#: Size of the square float32 matmul whose best time defines "100 %" (NumPy's sgemm at
#: 2048^3 is the practical peak; docs/performance.md). Tests shrink it.
SGEMM_N = 2048
SGEMM_REPEAT = 3


def sgemm_peak(threads=None, repeat=SGEMM_REPEAT, n=None, dtype=np.float32):
    """Best GFLOP/s of numpy float32 ``n x n x n`` matmuls: the practical 100 %
    (``dtype``: another one's matmul, as :func:`compute_peak` times float64's).

    Parameters
    ----------
    threads : int, optional
        Limit NumPy's BLAS to this many threads (needs ``threadpoolctl``; without it the
        BLAS runs with its default thread count, which the second result says).
    repeat : int
        Timed matmuls after one warm-up; the best counts.
    n : int, optional
        Matrix size (default :data:`SGEMM_N`).

    Returns
    -------
    (float, str)
        GFLOP/s and how the BLAS threads were set.
    """
    n = n or SGEMM_N
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=dtype)
    b = rng.standard_normal((n, n), dtype=dtype)
    limit, how = nullcontext(), "BLAS default threads (install threadpoolctl to match --threads)"
    if threads is not None:
        try:
            from threadpoolctl import threadpool_limits
            limit, how = threadpool_limits(limits=threads, user_api="blas"), \
                f"{threads} BLAS thread(s)"
        except ImportError:
            pass
    best = math.inf
    with limit:
        a @ b  # warm-up: BLAS thread start-up and page faults of the result
        for _ in range(max(repeat, 1)):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best / 1e9, how


def compute_peak(sgemm, dtype, threads=None, repeat=SGEMM_REPEAT, n=None):
    """The compute roof of a run in ``dtype`` (GFLOP/s, how it was found), from the
    measured sgemm peak: float16 and float32 compute in float32 (the sgemm peak itself);
    float64 is NumPy's float64 matmul, timed as the sgemm is; bfloat16 on a host with
    AVX512_BF16 is twice the sgemm peak (``vdpbf16ps`` does two multiply-adds per float32
    lane where an FMA does one, at the FMA's rate), on a host with AMX the rate of
    ``gemm[bf16-amx]``'s micro-kernel on operands in L1 (``bf16dot.amx_peak``), elsewhere
    computed in float32."""
    if dtype == "float64":
        peak, how = sgemm_peak(threads, repeat, n, np.float64)
        return peak, f"numpy float64 matmul, {how}"
    if dtype == "bfloat16":
        from ..strategies.bf16dot import host_has_bf16
        if host_has_bf16():
            from ..kernels.cpu import _amx
            if _amx.host_has_amx() and _amx.request_amx():
                from ..kernels.cpu.bf16dot import amx_peak
                from ..runtime import threads as default_threads
                peak = amx_peak(threads or default_threads())
                return peak, "AMX tiles: gemm[bf16-amx]'s micro-kernel on operands in L1"
            return 2.0 * sgemm, "twice the sgemm peak: AVX512_BF16 dot products"
    return sgemm, "the sgemm peak"


#: Bytes of each of the two arrays of the streaming copy that measures the memory bandwidth:
#: far larger than the last-level cache (tests shrink it).
STREAM_BYTES = 256 << 20
STREAM_REPEAT = 5


def stream_bandwidth(threads=None, repeat=STREAM_REPEAT, nbytes=None):
    """Best GB/s of a streaming copy between two float32 arrays of ``nbytes`` each.

    The copy is split into ``threads`` contiguous chunks, each copied by ``np.copyto`` on its
    own Python thread (NumPy releases the GIL while it copies), so that as many cores pull
    memory as run the kernels. Bytes are counted as STREAM counts its ``copy``: one read and
    one write per element (a write-allocating cache moves a third stream it does not count).

    Parameters
    ----------
    threads : int, optional
        Copying threads (default: Numba's thread count).
    repeat : int
        Timed copies after one untimed copy (page faults); the best counts.
    nbytes : int, optional
        Size of each array (default :data:`STREAM_BYTES`).

    Returns
    -------
    (float, str)
        GB/s (1e9 bytes) and how it was measured.
    """
    from concurrent.futures import ThreadPoolExecutor

    if threads is None:
        import numba
        threads = numba.get_num_threads()
    threads = max(int(threads), 1)
    n = (nbytes or STREAM_BYTES) // 4
    src = np.ones(n, np.float32)
    dst = np.empty_like(src)
    bounds = np.linspace(0, n, threads + 1).astype(np.int64)
    chunks = [(dst[a:b], src[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    best = math.inf
    with ThreadPoolExecutor(threads) as pool:
        def copy():
            for f in [pool.submit(np.copyto, d, s_) for d, s_ in chunks]:
                f.result()
        copy()  # page faults of both arrays
        for _ in range(max(repeat, 1)):
            t0 = time.perf_counter()
            copy()
            best = min(best, time.perf_counter() - t0)
    return 2.0 * 4 * n / best / 1e9, (f"numpy copy of {4 * n >> 20} MiB on {threads} "
                                        f"thread(s), read + write counted")


def traffic_bytes(layer, direction, itemsize=4):
    """The least bytes a pass moves: both operands read once, the result written once."""
    x = layer.mb * math.prod(layer.isz) * layer.ic
    w = math.prod(layer.ksz) * (layer.ic // layer.g) * layer.oc
    y = layer.mb * math.prod(layer.osz) * layer.oc
    return (x + w + y) * itemsize


def roof_fraction(flops, nbytes, seconds, peak_gflops, bandwidth_gbs):
    """The fraction of the roofline a measured time reaches: the time at the roof,
    ``max(flops / peak, bytes / bandwidth)``, over the measured time (1: at the roof).
    ``None`` without a peak or a bandwidth."""
    if not peak_gflops or not bandwidth_gbs or not seconds:
        return None
    return max(flops / (peak_gflops * 1e9), nbytes / (bandwidth_gbs * 1e9)) / seconds


#: Seconds of rest before each contender's block: OpenBLAS workers busy-wait for about
#: 2^28 cycles after a call and OpenMP workers spin too; resting lets them go to sleep.
IDLE_PAUSE = 0.3


#: Each contender's timed calls in a block last at least this long (more calls than
#: ``repeat`` for fast layers): after the idle pause a virtual CPU comes back slowly
#: (measured: docs/performance.md, Numbers behind the constants).
MIN_BLOCK_SECONDS = 0.25
#: ... but never more calls than this per block.
MAX_BLOCK_CALLS = 400


def blocked(fns, repeat, rounds=2):
    """Best ``time.perf_counter`` seconds of each function: ``rounds`` rounds in which each
    function gets an untimed call and then timed calls in a row: ``repeat`` of them, and
    more until the block has lasted ``MIN_BLOCK_SECONDS`` (at most ``MAX_BLOCK_CALLS``).

    Timing each contender in a block of its own, after an untimed call, keeps one library's
    idle worker threads (OpenMP and OpenBLAS pools spin for a while after each parallel
    call) from landing in the other's timed calls: measured here, alternating call by call
    slowed both sides by up to 1.6x. Two rounds spread a noisy neighbour over both.
    """
    best = [math.inf] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            if len(fns) > 1:
                time.sleep(IDLE_PAUSE)
            fn()
            start, calls = time.perf_counter(), 0
            while calls < max(repeat, 1) or (time.perf_counter() - start < MIN_BLOCK_SECONDS
                                             and calls < MAX_BLOCK_CALLS):
                t0 = time.perf_counter()
                fn()
                best[i] = min(best[i], time.perf_counter() - t0)
                calls += 1
    return best
