"""Tunables and flags in one place.

Tests patch these module attributes (``monkeypatch.setattr(config, "...", ...)``);
code reads them at call time, never copies them at import.
"""
import os
import sys

#: The one fastmath flag set of every kernel: reassociation and contraction so that
#: float reductions vectorise, but no ``nnan``/``ninf``, so NaN and Inf still propagate.
FASTMATH = frozenset({"nsz", "arcp", "contract", "afn", "reassoc"})

#: Compile kernels with ``cache=True`` (falls back to in-memory when no cache dir is writable).
CACHE = os.environ.get("NUMBACONV_CACHE", "1") not in ("0", "false", "no")

#: Print the planner's dispatch trace (each declined strategy and its reason).
VERBOSE = os.environ.get("NUMBACONV_VERBOSE", "0") not in ("", "0", "false", "no")

#: Where ``tune=True`` stores its winners. ``None``: a per-user cache directory.
TUNE_CACHE_DIR = os.environ.get("NUMBACONV_TUNE_DIR") or None

#: Column slab of the blocked im2col (bytes); None: twice the L2 of one core (the slab is
#: packed by one core, then read by every BLAS thread). Bounds the GEMM workspace.
GEMM_SLAB_BYTES = None

#: Largest share of physical memory a single call may allocate for result plus workspace.
MAX_MEMORY_FRACTION = 0.9

#: Threads for numbaconv's kernels (0: Numba's current setting). See ``set_num_threads``.
THREADS = 0

#: Packed GEMMs: each worker thread packs and multiplies its own slabs with a one-thread
#: BLAS (True), or slabs are packed on one core and multiplied by BLAS on every core (False).
GEMM_WORKERS = True

#: The GEMM engine: "numba" (numbaconv.kernels.cpu.ukernel, a register-blocked micro-kernel
#: on the operands as they are), "blas" (NumPy's BLAS) or "auto" (per problem, as measured:
#: see ``numbaconv.strategies._gemm_common.choose_engine``).
GEMM_ENGINE = os.environ.get("NUMBACONV_GEMM_ENGINE", "auto")

#: Problems below this many FLOPs run on strategies and engines whose kernels compile in
#: about a second (``Strategy.compile_heavy`` false, the BLAS GEMM engine): such a kernel
#: takes well under a millisecond either way, while a first call on an explicit-SIMD
#: kernel spends 5-15 s compiling it. The smallest suite layer has 4 MFLOP. 0: no limit.
SMALL_FLOPS = 2_000_000

#: Depthwise problems (one channel per group) are small (as ``SMALL_FLOPS``: NumPy, no
#: compile-heavy kernel) only below this many FLOPs: from there on the depthwise row
#: kernels are 3-20x faster per call than NumPy (0.02-0.08 ms against 0.1-0.9 ms from 0.07
#: to 2.7 MFLOP) and compile in about 2 s, once per install. 0: as ``SMALL_FLOPS``
#: (``SMALL_FLOPS = 0`` turns both off).
SMALL_DEPTHWISE_FLOPS = 250_000

#: Fewest GEMM rows per slab (BLAS needs a tall enough slab to reach its speed).
GEMM_MIN_ROWS = 256

#: CUDA implicit GEMM: block tile BM x BN, K slice BK, per-thread register tile TM x TN;
#: ``None`` (the default): per shape, from ``numbaconv.backends.cuda.GEMM_TILES``. Set all
#: five to force one tile.
CUDA_BLOCK_M = None
CUDA_BLOCK_N = None
CUDA_BLOCK_K = None
CUDA_THREAD_M = None
CUDA_THREAD_N = None
#: Forward and backward data on the GPU take the largest tile giving this many blocks.
CUDA_MIN_BLOCKS = 264
#: Threads per block of the element-wise CUDA kernels (depthwise, layout, reduction).
CUDA_THREADS = 256
#: Weight-gradient split: aim at this many blocks, >= this many pixels per split, at most
#: this many splits (partials reduced by a second kernel in a fixed order: no atomics).
CUDA_TARGET_BLOCKS = 1024
CUDA_SPLIT_MIN_PIXELS = 256
CUDA_MAX_SPLITS = 64

#: Idle memory kept for large results and workspaces (:mod:`numbaconv.memory`), in bytes;
#: 0 turns the pool off (every large array is then a fresh mapping, faulted in page by
#: page); ``None``: an eighth of physical memory, at most 1 GiB.
MEMORY_POOL_BYTES = (int(os.environ["NUMBACONV_MEMORY_POOL_BYTES"])
                     if os.environ.get("NUMBACONV_MEMORY_POOL_BYTES") else None)

#: A plan's first call that misses the disk cache compiles its kernels in two processes at
#: once (:mod:`numbaconv._ahead`): a helper process compiles from the last kernel
#: backwards while the call compiles from the first forwards. ``NUMBACONV_COMPILE_AHEAD=0``
#: turns it off.
COMPILE_AHEAD = os.environ.get("NUMBACONV_COMPILE_AHEAD", "1") not in ("0", "false", "no")
#: ... for operands of at most this many bytes (the helper allocates zeros of their shapes).
COMPILE_AHEAD_MAX_BYTES = 1 << 30
#: How the helper starts: ``"fork"`` (Linux: a copy of this process, with everything
#: imported and set up) or ``"spawn"`` (a new interpreter; elsewhere, where ``fork`` without
#: ``exec`` is not safe for every library). ``NUMBACONV_COMPILE_AHEAD_START`` sets it.
COMPILE_AHEAD_START = os.environ.get("NUMBACONV_COMPILE_AHEAD_START",
                                     "fork" if sys.platform.startswith("linux") else "spawn")
