"""The GEMM strategy: blocked im2col + BLAS GEMMs, for all three directions.

With channels-last data every direction is a sum of GEMMs (JAX's ``conv_general_dilated``
transposes, written for row-major 2-D slabs):

* forward:           Y[rows, K]      = col(x)[rows, taps*C/g] @ W[taps*C/g, K/g]   (per group)
* backward weights:  dW[taps*C/g, K] = sum over slabs of col(x)^T @ dY[slab rows]
* backward data, per stride phase q (input positions q + s*j, taps whose offset
  ``(q + p - t*d)/s`` is exact): dX[q + s*j, C] = col_q(dY)[j, taps_q*K/g] @ W_q^T.
  At stride 1 this is one phase: a forward convolution of dY with the flipped, transposed
  filter (oneDNN's and JAX's derivation); at stride s it is s^nd smaller ones, never a
  scatter-add.

1x1 convolutions at stride 1 without padding need no packing at all: the channels-last
arrays are the GEMM operands (``dX = dY @ W^T``, ``dW = X^T @ dY``). Otherwise columns are
packed slab by slab, each slab bounded by ``config.GEMM_SLAB_BYTES``, so that a large
problem never builds its full im2col matrix. The GEMMs go to NumPy's BLAS, which owns all
cores during the call; packing runs serially between calls, so Numba's and BLAS's thread
pools never fight over the cores (see :mod:`numbaconv.blas`).
"""
import itertools
import math

import numpy as np

from . import Strategy, canonical_shapes, itemsize, small, streams
from .. import config, memory

#: Below this many columns in a GEMM's result (per group), BLAS runs far from its peak and
#: the direct kernels win (measured: N=3 in ResNet's stem backward data).
MIN_N = 8
#: Grouped GEMMs are batched small GEMMs; below this many channels per group they lose.
MIN_GROUP_CHANNELS = 16

R_SMALL_N = "result has {n} column(s) per GEMM (< %d): BLAS far from peak" % MIN_N
R_GROUPS = "{g} groups of {icg}x{ocg} channels: batched small GEMMs (< %d per group)" % (
    MIN_GROUP_CHANNELS)


def _taps(p):
    return list(itertools.product(range(p.ksz[0]), range(p.ksz[1]), range(p.ksz[2])))


def _phases(p):
    """Backward-data stride phases: (q, grid, [(tap index, offsets)])."""
    out = []
    for q in itertools.product(*(range(s) for s in p.stride)):
        grid = tuple(-(-(i - qa) // s) for i, qa, s in zip(p.isz, q, p.stride))
        taps = []
        for ti, t in enumerate(_taps(p)):
            num = [qa + pb - ta * d for qa, pb, ta, d in zip(q, p.pad_begin, t, p.dilation)]
            if all(v % s == 0 for v, s in zip(num, p.stride)):
                taps.append((ti, tuple(v // s for v, s in zip(num, p.stride))))
        out.append((q, grid, taps))
    return out


def _runs(boff):
    """``[(t0, L)]``: maximal runs of consecutive taps whose offsets differ only in w, by +1
    from one tap to the next (their columns are one contiguous block: see ``im2col``)."""
    runs = []
    for t in range(len(boff)):
        if runs:
            t0, n = runs[-1]
            if (boff[t, 0] == boff[t0, 0] and boff[t, 1] == boff[t0, 1]
                    and boff[t, 2] == boff[t0, 2] + n):
                runs[-1][1] += 1
                continue
        runs.append([t, 1])
    return np.array(runs, np.int64).reshape(len(runs), 2)


#: Backward data with at most this many rows per stride phase multiplies tap by tap on W's
#: own rows instead of a transposed copy of W (1-D k5 512x512 over 32 pixels: copy 1.68 ms
#: + GEMM vs 1.09 ms per tap with dX's columns split, standalone, 2 threads). Raised from
#: 256 on Zen 4 (2 threads, float32, three alternating suite runs each, ms): ResNet-50
#: res5b_branch2b (392 rows) 11.9-12.6 -> 11.4-12.2, res5a_branch2b 12.0-12.8 ->
#: 11.5-11.6, 1-D conv1d:8 (300 rows) 3.04-3.37 -> 2.77-2.92.
PER_TAP_MAX_ROWS = 512


def _max_phase_taps(p):
    """Taps of backward data's largest stride phase (ceil(k/s) per axis at dilation 1)."""
    return max((len(t) for _, _, t in _phases(p)), default=1) or 1


def _phase_rows(p):
    """GEMM rows of backward data's largest stride phase."""
    return p.mb * math.prod(-(-i // s) for i, s in zip(p.isz, p.stride))


def _is_identity(ntaps, a, boff, grid, src, cn):
    return (ntaps == 1 and all(v == 1 for v in a) and not np.any(boff)
            and tuple(grid) == src.shape[1:4] and cn == src.shape[4])


#: Reduction block of the Numba GEMM engine: an MR x KC tile of A stays in L1.
UK_KC = 256


#: "auto" on AVX-512 hosts picks the Numba engine for backward weights over at least this
#: many GEMM rows (pixels summed over): measured in one process against OpenBLAS, 2 threads,
#: float32, it won every such ResNet-50 layer (stem 15.7 vs 18.1 ms, res2b_branch2a 6.2 vs
#: 10.2 ms, res3a_branch2a 9.9 vs 11.7 ms) and lost the short, wide late layers
#: (res5b_branch2a 5.2 vs 4.6 ms), where OpenBLAS splits the output across threads instead
#: of the reduction. float64 likewise (res2a_branch2a 3.0 vs 4.7 ms, res3a_branch2a 19.9 vs
#: 24.3 ms). Backward data and forward stay on BLAS there, except the short or claimed 1x1
#: backward data below, which the Numba engine wins on AVX-512 as on AVX2 (Zen 4, 2
#: threads, ResNet-50 suite run per engine: res2a_branch1 5.55 -> 4.44 ms, res2a_branch2a
#: 1.36 -> 1.07, res3a_branch2a 9.41 -> 8.93, res3a_branch2c 4.51 -> 4.39, res4b_branch2a
#: stays on BLAS: its 1 MB W^T does not fit; res5a_branch2c lost there, 4.30 -> 4.95).
UK_MIN_ROWS = 16384
#: "auto" on AVX2 hosts (a 6 x 16 register tile instead of 6 x 64) keeps backward weights on
#: BLAS, which won every ResNet-50 GEMM layer in one process (res2a_branch1 7.2 vs 10.0 ms,
#: res4a_branch1 13.1 vs 25.2, res5a_branch2c 5.1 vs 10.8), and picks the Numba engine for
#: 1x1 backward data with at most this many output channels (the GEMM's reduction), where
#: OpenBLAS's packing of the tall dY outweighs a short reduction (res2a_branch2a 2.8 vs 3.3
#: and 1.70 vs 1.80 ms, res2b_branch2a 7.7 vs 9.1 and 6.1 vs 8.1, res3b_branch2a 7.3 vs 7.8;
#: 256 output channels and more: BLAS, res4a_branch2a 13.4 vs 16.5, res5a_branch2c 5.7 vs 9.3).
#: Longer reductions take the Numba engine too where its workers claim row blocks of one
#: packed W^T (``_claims``): res2a_branch1 6.88 -> 6.09 ms, res3a_branch2c 5.33 -> 4.92
#: (PyTorch 5.60, 4.43; same process, best of 10 in 5 rounds); where W^T does not fit,
#: BLAS stays (res4a_branch2a 10.3 either way, res4b_branch2a 5.0).
UK_MAX_SHORT_K = 128


def _claims(p, machine):
    """Whether 1x1 backward data on the Numba engine packs all of W^T once and lets the
    threads claim blocks of dY's rows (``ukernel.gemm_claimed_parallel``): at stride 1, when
    the packed W^T fits half of L2, where every row tile meets all of it."""
    if any(s != 1 for s in p.stride):  # dX's rows are every s-th pixel: not one stride
        return False
    return _packed_wt_elems(p) * itemsize(p) <= machine.l2_bytes // 2


def _packed_wt_elems(p):
    """Elements of 1x1 backward data's W^T as ``ukernel.pack_panels`` packs it: K output
    channels by the input channels padded to whole panels."""
    from ..kernels.cpu import ukernel as uk
    nr = uk.panel(itemsize(p))
    return p.oc * (-(-p.ic // nr) * nr)


def _numba_engine_tiles(p, machine):
    """The Numba engine's tiles: reduction block ``kc`` and a column block ``nc`` whose
    ``kc x nc`` block of B fills half of one core's L2."""
    from ..kernels.cpu import ukernel as uk
    item, panel = itemsize(p), uk.panel(itemsize(p))
    nc = max(panel, machine.l2_bytes // 2 // (UK_KC * item) // panel * panel)
    return {"engine": "numba", "kc": UK_KC, "nc": int(nc)}


def _split_m_engine(engine):
    """Whether a one-group backward weights split over dW's rows (a short reduction into
    a tall dW) runs as one Numba parallel region (``ukernel.gemm_split_m``) rather than
    as tasks on Python worker threads: on AVX-512 hosts unless the BLAS engine is forced.
    Measured (Zen 4, 2 threads, float32, same process, the GEMM alone): conv1d:19's
    2560x30 @ 30x512 0.39 ms (NumPy's BLAS 0.45, PyTorch's mm 0.43), conv1d_gemm:3's
    1536x152 @ 152x1024 2.13 ms (2.51, 2.39); the whole weight gradient on BLAS tasks took
    0.62 and 3.1 ms (PyTorch 0.45, 2.76)."""
    from ..kernels.cpu.ukernel import VECTOR_BYTES
    return engine == "numba" or (VECTOR_BYTES >= 64 and config.GEMM_ENGINE == "auto")


def _engine(p, machine):
    """The GEMM engine for a problem: ``config.GEMM_ENGINE``, "auto" as measured above."""
    e = config.GEMM_ENGINE
    if e in ("numba", "blas"):
        return e
    if small(p):  # the BLAS engine compiles in a second, the Numba engine in 5-10
        return "blas"
    from ..kernels.cpu.ukernel import VECTOR_BYTES
    short_1x1 = (p.direction == "bwd_d" and p.g == 1 and math.prod(p.ksz) == 1
                 and (p.oc <= UK_MAX_SHORT_K or _claims(p, machine)))
    if short_1x1:
        return "numba"
    if VECTOR_BYTES >= 64:
        if p.direction == "bwd_w" and _identity(p):  # split-K in one parallel region
            return "numba"
        rows = p.mb * math.prod(p.osz)
        return "numba" if p.direction == "bwd_w" and rows >= UK_MIN_ROWS else "blas"
    return "blas"


def _identity(p):
    """True when every GEMM operand is the channels-last array itself (no packing): 1x1,
    one group, no leading pad, and the GEMM grid equal to the source's spatial size
    (a trailing pad or a stride would add rows that read only padding)."""
    if p.g != 1 or math.prod(p.ksz) != 1 or any(p.pad_begin):
        return False
    if p.direction == "bwd_d":  # one live phase (q = 0), grid ceil(i/s) rows per axis
        return all(-(-i // s) == o for i, s, o in zip(p.isz, p.stride, p.osz))
    return all(s == 1 for s in p.stride) and p.osz == p.isz


#: 1x1 backward passes on BLAS over at least this many pixels run as worker tasks (one-thread
#: BLAS each: reduction slabs with partial dW's for the weight gradient, row slabs or batch
#: slices for backward data) instead of one GEMM on every BLAS thread, which OpenBLAS
#: splits along the short side (same process, 2 threads, best of >= 10 calls in 0.4 s
#: blocks, 4-5 rounds, ms one GEMM -> tasks): weights res2a_branch1 9.4 -> 8.7,
#: res2a_branch2a 3.3 -> 3.0, res2b_branch2a 9.8 -> 9.1, res3a_branch2a 14.2 -> 14.9 and
#: 15.7 -> 12.5; data res3a_branch1 18.6 -> 15.2, res2a_branch2a 2.85 -> 2.38,
#: res2b_branch2a 11.3 -> 10.8, res3a_branch2a 21.0 -> 20.2, res2a_branch1 8.3 -> 8.2.
#: Shorter reductions lose (weights res5b_branch2a 6.4 -> 8.7).
BLAS_SPLIT_MIN_ROWS = 16384

#: The split-K 1x1 weight gradient prefetches each next reduction block of X and dY into
#: L2 (``ukernel.gemm``'s ``pf``) when X and dY take at least this share of the L3 and a
#: row of X at least ``SPLIT_K_PREFETCH_ROW_BYTES``: ``X^T`` steps one row of X per step
#: of the reduction, and the hardware prefetchers stop at every 4 KiB page, which rows of
#: 1 KiB and more cross every few steps. Same process, 2 threads, float32, ms without /
#: with: res2b_branch2a (256 channels, 32 MB) 5.01-5.30 / 4.42-4.73, res3a_branch2a (256,
#: 39 MB) 8.78-9.40 / 8.50-9.26, res3b_branch2a (512, 16 MB) 4.17 / 3.96; equal for 64- and
#: 128-channel rows (res2a_branch1 5.37 / 5.34, res3a_branch2c 4.54 / 4.52) and for the 4-8
#: MB layers; res2a_branch2a (64 channels, 13 MB, in L3 between calls) 1.01-1.05 /
#: 1.05-1.08, float64 (26 MB) 2.46 / 2.63.
SPLIT_K_PREFETCH_L3_FRACTION = 0.45
SPLIT_K_PREFETCH_ROW_BYTES = 1024


def _blas_threads():
    from ..planner import _threads
    return _threads()


def run_tasks(tasks, nw):
    """Run ``task(slot)`` for every task: on ``nw`` worker threads with a one-thread BLAS
    each, or on the calling thread with every BLAS thread."""
    from .. import blas, workers
    if nw > 1 and len(tasks) > 1:
        with blas.threads(1):
            workers.run(len(tasks), lambda t, slot: tasks[t](slot), nw)
    else:
        with blas.threads(_blas_threads()):
            for t in tasks:
                t(0)


#: Rows of dY a worker claims at a time in 1x1 backward data on the Numba engine (2 threads,
#: 25088x64 @ 64x64, best of 3x3 blocks: 4 tasks 1.31-1.36 ms, blocks of 48 rows 1.28-1.32,
#: 96 1.28-1.31, 192 1.24-1.27).
CLAIM_ROWS = 192

#: Problems below this many FLOPs run on the calling thread alone: handing tasks to the
#: worker pool and waiting for them costs about 80 us (a 3x3 8-channel weight gradient:
#: 250 us on two workers, 170 us on one), more than a second core saves on them.
SERIAL_MAX_FLOPS = 8_000_000


def _workers(p):
    return 1 if p.flops < SERIAL_MAX_FLOPS else _blas_threads()


class Gemm(Strategy):
    name = "gemm"

    def accepts(self, p):
        n = {"fwd": p.ocg, "bwd_d": p.icg, "bwd_w": p.ocg}[p.direction]
        if n < MIN_N:
            return R_SMALL_N.format(n=n)
        if p.g > 1 and min(p.icg, p.ocg) < MIN_GROUP_CHANNELS:
            return R_GROUPS.format(g=p.g, icg=p.icg, ocg=p.ocg)
        return None

    def _packed_channels(self, p):
        return p.ocg if p.direction == "bwd_d" else p.icg

    _identity = staticmethod(_identity)

    def numba_parallel(self, p, tiles):
        # the split reduction and the claimed 1x1 backward data are one Numba parallel
        # region each; the rest are worker tasks
        return bool(tiles.get("claim")) or (tiles.get("engine") == "numba"
                                            and tiles.get("split") == "k")

    def half_operands(self, p, tiles):
        """The split-K weight gradient widens X and dY one reduction block of pixels at a
        time (``ukernel.gemm_split_k_half``); claimed 1x1 backward data widens each
        claimed block of dY's rows and rounds its dX rows (``ukernel.gemm_claimed_half``);
        packed forward and backward weights widen X as they pack its columns
        (``gemm.im2col``), and one group's backward weights dY slab by slab."""
        if tiles.get("split") == "k":
            return frozenset({"x", "dy"})
        if tiles.get("claim"):
            return frozenset({"dy"})
        return frozenset(_half_packed(p, tiles))

    def tiles(self, p, machine):
        """Slab rows and workers; with the Numba engine also its reduction block ``kc``
        and column block ``nc`` (a ``kc x nc`` block of B fills half of one core's L2)."""
        ntaps = math.prod(p.ksz)
        cn = self._packed_channels(p)
        rows = p.mb * math.prod(p.isz if p.direction == "bwd_d" else p.osz)
        engine = _engine(p, machine)
        engine_tiles = (_numba_engine_tiles(p, machine) if engine == "numba"
                        else {"engine": engine})
        workers = _workers(p) if config.GEMM_WORKERS or engine == "numba" else 1
        if self._identity(p):
            if p.direction == "bwd_w" and engine == "numba":
                # dW = X^T @ dY, its reduction split among the threads of one parallel
                # region (``ukernel.gemm_split_k``)
                foot = rows * (p.ic + p.oc) * itemsize(p)
                return {"slab_rows": int(rows), "packed": False, "workers": workers,
                        "split": "k", **engine_tiles,
                        "prefetch": bool(
                            foot >= machine.l3_bytes * SPLIT_K_PREFETCH_L3_FRACTION
                            and p.ic * itemsize(p) >= SPLIT_K_PREFETCH_ROW_BYTES)}
            split = workers > 1 and rows >= BLAS_SPLIT_MIN_ROWS and p.direction != "fwd"
            if engine == "blas" and not split:  # one GEMM on every BLAS thread
                return {"slab_rows": rows, "packed": False, **engine_tiles}
            # two blocks per worker: row slabs (reduction slabs for backward weights), for
            # backward data times column blocks where that moves less: each row slab reads
            # all of B, each column block all of A (late layers: 392 rows, 2048 columns)
            n, col_parts = 2 * workers, 1
            if p.direction == "bwd_d":  # the GEMM's rows: dy's pixels, one live phase
                rows = p.mb * math.prod(p.osz)
            if p.direction == "bwd_d" and engine == "numba" and _claims(p, machine):
                # W^T packed once, row blocks claimed by the workers as they go
                chunk = max(1, min(CLAIM_ROWS, rows // (8 * workers))) if workers > 1 else rows
                return {"slab_rows": int(rows), "packed": False, "workers": workers,
                        "claim": int(chunk),
                        # float16's dX is rounded from a float32 stage, never streamed
                        "stream": p.dtype != "float16" and streams(
                            rows * p.oc + p.oc * p.ic + p.mb * math.prod(p.isz) * p.ic,
                            p, machine),
                        **engine_tiles}
            if p.direction == "bwd_d" and engine == "numba":
                a_size, b_size = rows * p.oc, p.oc * p.ic
                fits = [c for c in range(1, n + 1)
                        if n % c == 0 and p.ic // c >= engine_tiles["nc"] // 8]
                col_parts = min(fits or [1], key=lambda c: (n // c) * b_size + c * a_size)
            tiles = {"slab_rows": int(max(1, -(-rows // (n // col_parts)))), "packed": False,
                     "workers": workers, **engine_tiles}
            if col_parts > 1:
                tiles["col_parts"] = col_parts
            return tiles
        # backward data packs one stride phase at a time: its taps, not the kernel's
        ptaps = _max_phase_taps(p) if p.direction == "bwd_d" else ntaps
        row_bytes = max(ptaps * cn * itemsize(p), 1)
        budget = config.GEMM_SLAB_BYTES or 2 * machine.l2_bytes
        slab = max(config.GEMM_MIN_ROWS, budget // row_bytes)
        if p.direction == "bwd_d" and ntaps > 1 and _phase_rows(p) <= PER_TAP_MAX_ROWS:
            # few rows per phase: the GEMMs stream W once, so W^T's copy would cost as much
            # as they do; one GEMM per tap on W's own rows instead, dX's columns split
            # among the workers (each reads its share of W once)
            parts = max(1, min(workers, p.icg // 8))
            return {"slab_rows": int(max(1, _phase_rows(p))), "packed": True,
                    "workers": workers, "taps": "per-tap", "col_parts": parts,
                    **engine_tiles}
        dw_elems = ntaps * p.icg * p.oc
        if (p.direction == "bwd_w" and workers > 1 and rows * row_bytes <= 4 * budget
                and dw_elems >= rows * ntaps * cn):
            # a short reduction into a larger dW: pack it once and split dW's rows among
            # the workers, as BLAS splits its output; splitting the reduction would give
            # every worker a dW-sized partial to write and add (1-D k5 512x512 over 30
            # pixels: 3.1 ms before, 1.7 ms after; PyTorch 0.8-1.0)
            if p.g == 1 and _split_m_engine(engine) and not small(p):
                # one Numba parallel region over dW's row blocks (``ukernel.gemm_split_m``)
                engine_tiles = _numba_engine_tiles(p, machine)
            return {"slab_rows": int(max(1, rows)), "packed": True, "workers": workers,
                    "split": "dw", **engine_tiles}
        # slabs in a multiple of the workers, so that they finish together
        n = -(-rows // slab)
        n = -(-n // workers) * workers
        return {"slab_rows": int(max(1, min(rows, -(-rows // n)))), "packed": True,
                "workers": workers, **engine_tiles}

    def workspace_bytes(self, p, tiles):
        item = itemsize(p)
        ntaps = math.prod(p.ksz)
        r = tiles["slab_rows"]
        nw = tiles.get("workers", 1)
        numba_engine = tiles.get("engine") == "numba"
        ws = nw * r * ntaps * self._packed_channels(p) * item if tiles["packed"] else 0
        if tiles.get("claim"):  # W^T's panels, and one row tile of scratch per worker
            from ..kernels.cpu import ukernel as uk
            ws = (_packed_wt_elems(p) + nw * uk.claimed_workspace(p.oc, item)) * item
            if np.dtype(p.dtype) == np.float16:  # and a float32 stage of claimed rows each
                ws += nw * uk.claimed_stage(tiles["claim"], p.oc, p.ic) * item
            return ws
        if numba_engine:
            from ..kernels.cpu import ukernel as uk
            ws += nw * uk.workspace(tiles["kc"], item, tiles["nc"]) * item
        if tiles.get("split") == "k":  # a partial dW per thread but the first
            if np.dtype(p.dtype) == np.float16:  # and a float32 stage of kc pixels each
                ws += nw * tiles["kc"] * (p.ic + p.oc) * item
            return ws + (nw - 1) * p.ic * p.oc * item
        if tiles.get("split") == "dw":  # every group's columns packed once; no partials
            if np.dtype(p.dtype) == np.float16 and "result" in _half_packed(p, tiles):
                ws += ntaps * p.icg * p.oc * 2  # the rounded dW beside the float32 one
            return ws + (p.g - 1) * r * ntaps * p.icg * item
        if p.direction == "bwd_w":
            # per worker: the accumulator of every group (and one slab product for BLAS)
            ws += nw * (p.g + (0 if numba_engine else 1)) * ntaps * p.icg * p.ocg * item
            if np.dtype(p.dtype) == np.float16 and "dy" in _half_packed(p, tiles):
                ws += nw * r * p.oc * item  # and a float32 slab of dY
        elif tiles.get("taps") == "per-tap":  # one product per worker (BLAS adds it)
            ws += nw * r * p.icg * item
        else:
            if p.direction == "bwd_d" and numba_engine:  # W_q^T, every group
                ws += ntaps * p.icg * p.oc * item
            if any(s > 1 for s in p.stride) or (p.g > 1 and not numba_engine):
                n = p.icg if p.direction == "bwd_d" else p.ocg
                ws += nw * r * n * item
        return ws

    # -- running ----------------------------------------------------------------------------
    def _col(self, src, grid, a, boff, c0, cn, r0, r1, buf, runs):
        from ..kernels.cpu import gemm as k
        if _is_identity(len(boff), a, boff, grid, src, cn) and src.dtype != np.uint16:
            return src.reshape(-1, cn)[r0:r1]
        need = (r1 - r0) * len(boff) * cn
        if buf.size < need:  # never with the planned tiles; stay correct regardless
            buf = memory.empty(need, buf.dtype)
        col = buf[:need].reshape(r1 - r0, len(boff), cn)
        k.im2col(src, col, np.asarray(grid, np.int64), np.asarray(a, np.int64), boff,
                 runs, np.int64(c0), np.int64(r0))
        return col.reshape(r1 - r0, len(boff) * cn)

    def run(self, p, tiles, ops):
        """Unpacked problems are one GEMM on every core (BLAS threads); packed ones are
        slab tasks, each packed and multiplied by one worker thread with a one-thread BLAS
        (see :mod:`numbaconv.workers`)."""
        R = tiles["slab_rows"]
        ct = np.dtype(p.compute_dtype)
        nw = int(tiles.get("workers", 1))
        if tiles.get("claim"):
            return self._bwd_d_claimed(p, ops, ct, nw, int(tiles["claim"]),
                                       bool(tiles.get("stream")))
        if tiles.get("split") == "k":
            return self._bwd_w_split_k(p, ops, ct, nw, int(tiles["kc"]), int(tiles["nc"]),
                                       bool(tiles.get("prefetch")))
        cols = _Buffers(R * math.prod(p.ksz) * self._packed_channels(p) if tiles["packed"]
                        else 0, ct)
        tasks, finish = self._tasks(p, ops, R, cols, ct, _Multiply(tiles, ct, nw),
                                    int(tiles.get("col_parts", 1)),
                                    tiles.get("taps") == "per-tap")
        run_tasks(tasks, nw)
        return finish()

    def _bwd_d_claimed(self, p, ops, ct, nw, chunk, stream):
        """1x1 backward data at stride 1 (see ``_identity``): ``dX = dY @ W^T`` with W^T
        packed once and every thread of one Numba parallel region claiming blocks of
        ``chunk`` rows of dY until none are left, so that a thread that starts late or
        runs slow takes fewer blocks. Measured against the same claims on Python worker
        threads (Zen 4, 2 threads, float32, same process, ms): res2a_branch2a 1.14 ->
        1.06, res2b_branch2a 4.73 -> 4.48, res2a_branch1 4.35 -> 4.27, res3a_branch2a
        8.71 -> 8.61, res3b_branch2a 4.23 -> 4.15, res3a_branch2c and res4a_branch2c
        equal (3.80, 3.83). ``stream``: dX's whole tiles written with non-temporal stores
        (see :func:`numbaconv.strategies.streams`)."""
        from ..kernels.cpu import ukernel as uk
        dy2 = ops["dy"].reshape(-1, p.oc)
        bp = uk.pack_panels(ops["w"].reshape(p.ic, p.oc).T)
        counter = np.zeros(1, np.int64)
        chunk = max(uk.MR, -(-chunk // uk.MR) * uk.MR)
        work = np.empty((nw, uk.claimed_workspace(p.oc, ct.itemsize)), ct)
        if dy2.dtype == np.uint16:  # float16 bits: widened and rounded block by block
            dx = memory.empty(canonical_shapes(p)[0], np.uint16)
            stage = np.empty((nw, uk.claimed_stage(chunk, p.oc, p.ic)), ct)
            uk.gemm_claimed_half_parallel(dy2, bp, dx.reshape(-1, p.ic), counter, chunk,
                                          work, stage)
            return dx
        dx = memory.empty(canonical_shapes(p)[0], ct)
        uk.gemm_claimed_parallel(dy2.ctypes.data, p.oc, 1, bp, dx.ctypes.data, p.ic,
                                 dy2.shape[0], p.ic, counter, chunk, work, stream)
        return dx

    def _bwd_w_split_k(self, p, ops, ct, nw, kc, nc, prefetch=False):
        """1x1 backward weights at stride 1 (see ``_identity``): ``dW = X^T @ dY`` over every
        pixel, the reduction split into one share per thread inside one Numba parallel
        region. Measured against the slab tasks on Python worker threads (2 threads,
        float32, same process): ResNet-50 res2a_branch2a 1.25 -> 1.01 ms (PyTorch 0.95),
        res2b_branch2a 7.9 -> 5.5, res3b_branch2a 5.1 -> 4.1-4.5 (it was on BLAS);
        every other 1x1 stride-1 layer of the suite at or below its BLAS or task time."""
        from ..kernels.cpu import ukernel as uk
        x2 = np.ascontiguousarray(ops["x"]).reshape(-1, p.ic)
        dy2 = np.ascontiguousarray(ops["dy"]).reshape(-1, p.oc)
        dw = np.empty(canonical_shapes(p)[2], ct)
        parts = np.empty((nw - 1, p.ic, p.oc), ct)
        work = np.empty((nw, uk.workspace(kc, ct.itemsize, nc)), ct)
        if x2.dtype == np.uint16:  # float16 bits: widened one reduction block at a time
            stage = np.empty((nw, kc * (p.ic + p.oc)), ct)
            uk.gemm_split_k_half(x2, dy2, dw.reshape(p.ic, p.oc), parts, kc, nc, work,
                                 stage)
            return dw
        uk.gemm_split_k(x2.ctypes.data, 1, p.ic, dy2.ctypes.data, p.oc, 1,
                        dw.reshape(p.ic, p.oc), parts, x2.shape[0], kc, nc, work, prefetch)
        return dw

    def _tasks(self, p, ops, R, cols, ct, mm, col_parts=1, per_tap=False):
        """``(tasks, finish)``: independent callables ``task(slot)`` and a function that
        returns the result once they have all run."""
        if p.direction == "bwd_d":
            return self._bwd_d(p, ops, R, cols, ct, mm, col_parts, per_tap)
        xs, ys, ws = canonical_shapes(p)
        taps = _taps(p)
        boff = np.array([[t[a] * p.dilation[a] - p.pad_begin[a] for a in range(3)]
                         for t in taps], np.int64).reshape(len(taps), 3)
        runs = _runs(boff)
        x = ops["x"]
        M = p.mb * math.prod(p.osz)
        icg, ocg, g = p.icg, p.ocg, p.g
        slabs = [(gi, r0, min(M, r0 + R)) for gi in range(g) for r0 in range(0, M, R)]

        def col(gi, r0, r1, slot):
            return self._col(x, p.osz, p.stride, boff, gi * icg, icg, r0, r1, cols[slot], runs)

        if p.direction == "fwd":
            W = ops["w"].reshape(len(taps), icg, p.oc)
            Wg = [np.ascontiguousarray(W[:, :, gi * ocg:(gi + 1) * ocg]).reshape(-1, ocg)
                  for gi in range(g)]
            y = memory.empty(ys, ct)
            y2 = y.reshape(M, p.oc)

            def fwd_task(gi, r0, r1):
                def task(slot):
                    c = col(gi, r0, r1, slot)
                    if g == 1 or mm.numba:  # the Numba engine writes the group's columns
                        mm(c, Wg[gi], y2[r0:r1, gi * ocg:(gi + 1) * ocg], slot)
                    else:
                        y2[r0:r1, gi * ocg:(gi + 1) * ocg] = c @ Wg[gi]
                return task

            return [fwd_task(*s) for s in slabs], lambda: y

        dy2 = ops["dy"].reshape(M, p.oc)
        if tiles_split_dw(mm):
            return self._bwd_w_split_dw(p, ops, M, taps, col, dy2, ws, ct, mm)
        from ..kernels.cpu import convert
        half_dy = dy2.dtype == np.uint16  # float16 bits (one group): widened slab by slab
        dbuf = _Buffers(R * p.oc if half_dy else 0, ct)
        # fixed ownership: each group's slabs in ``nruns`` contiguous runs, one task per run
        # summing its slabs in order into its own partial dW (the first slab's product
        # written, later ones added), the partials added in run order: the same bits
        # whichever worker takes a task, and when
        nslabs = -(-M // R)
        nruns = max(1, min(mm.workers, nslabs))
        acc = {}
        prod = _Buffers(0 if mm.numba else len(taps) * icg * ocg, ct)

        def bwd_w_task(gi, run):
            s0, s1 = nslabs * run // nruns, nslabs * (run + 1) // nruns

            def task(slot):
                a = None
                for r0 in range(s0 * R, min(M, s1 * R), R):
                    r1 = min(M, r0 + R)
                    c = col(gi, r0, r1, slot)
                    if half_dy:
                        d = dbuf[slot][: (r1 - r0) * p.oc].reshape(r1 - r0, p.oc)
                        convert.convert(dy2[r0:r1].reshape(-1), d.reshape(-1), True)
                    else:
                        d = dy2[r0:r1, gi * ocg:(gi + 1) * ocg]
                    if mm.numba:  # accumulates in place
                        first = a is None
                        if first:
                            a = np.empty((len(taps) * icg, ocg), ct)
                        mm(c.T, d, a, slot, accumulate=not first)
                    elif a is None:
                        a = c.T @ d
                    else:
                        pr = np.matmul(c.T, d, out=prod[slot].reshape(len(taps) * icg, ocg))
                        np.add(a, pr, out=a)
                acc[gi, run] = a
            return task

        def finish():
            dw = np.empty(ws, ct)
            dW4 = dw.reshape(len(taps) * icg, g, ocg)
            for gi in range(g):
                total = acc[gi, 0]
                for run in range(1, nruns):
                    np.add(total, acc[gi, run], out=total)
                if g == 1:
                    return total.reshape(ws)
                dW4[:, gi] = total
            return dw

        return [bwd_w_task(gi, run) for gi in range(g) for run in range(nruns)], finish

    def _bwd_w_split_dw(self, p, ops, M, taps, col, dy2, ws, ct, mm):
        """Backward weights over one slab: col (every row, every group) packed once, then
        tasks over blocks of dW's rows, each one GEMM written straight into dW."""
        icg, ocg, g = p.icg, p.ocg, p.g
        cols = [col(gi, 0, M, 0).copy() if g > 1 else col(gi, 0, M, 0) for gi in range(g)]
        from ..kernels.cpu import convert
        dw = np.empty(ws, ct)
        if mm.numba and g == 1:
            # cols and dY are in the compute dtype here (float16 X is widened as it is
            # packed, dY by the backend); the float32 dW is rounded by the backend
            return [], lambda: self._split_m(cols[0].T, dy2, dw.reshape(-1, p.oc), mm, ct, ws)
        dW3 = dw.reshape(len(taps) * icg, g, ocg)
        rows = len(taps) * icg
        nb = max(1, min(rows // 8, 2 * mm.workers))
        step = -(-rows // nb)
        step = -(-step // 8) * 8 if rows >= 8 else step
        # float16 (X came as bits; one group): each task rounds its block of dW's rows
        # while it is in cache, and the result is float16 bits
        dwh = np.empty((rows, p.oc), np.uint16) if ops["x"].dtype == np.uint16 else None

        def task_for(gi, b0, b1):
            def task(slot):
                d = dy2[:, gi * ocg:(gi + 1) * ocg]
                out = dW3[b0:b1, gi]
                if mm.numba:
                    mm(cols[gi][:, b0:b1].T, d, out, slot)
                elif g == 1:
                    np.matmul(cols[gi][:, b0:b1].T, d, out=out)
                else:
                    out[...] = cols[gi][:, b0:b1].T @ d
                if dwh is not None:
                    convert.convert(out.reshape(-1), dwh[b0:b1].reshape(-1), False)
            return task

        tasks = [task_for(gi, b0, min(rows, b0 + step)) for gi in range(g)
                 for b0 in range(0, rows, step)]
        if dwh is not None:
            return tasks, lambda: dwh.reshape(ws)
        return tasks, lambda: dw

    @staticmethod
    def _split_m(a, b, c, mm, ct, ws):
        """``c = a @ b`` in one Numba parallel region over ``c``'s row blocks."""
        from ..kernels.cpu import ukernel as uk
        it = ct.itemsize
        work = np.empty((mm.workers, uk.workspace(mm.kc, it, mm.nc)), ct)
        uk.gemm_split_m(a.ctypes.data, a.strides[0] // it, a.strides[1] // it,
                        b.ctypes.data, b.strides[0] // it, b.strides[1] // it, c,
                        a.shape[1], mm.kc, mm.nc, work)
        return c.reshape(ws)

    def _bwd_d(self, p, ops, R, cols, ct, mm, col_parts=1, per_tap=False):
        from ..kernels.cpu import gemm as k
        xs = canonical_shapes(p)[0]
        dy, icg, ocg, g = ops["dy"], p.icg, p.ocg, p.g
        W = ops["w"].reshape(-1, icg, p.oc)
        unit = all(s == 1 for s in p.stride)
        dx = memory.empty(xs, ct)
        dx2 = dx.reshape(-1, p.ic)
        stride = np.asarray(p.stride, np.int64)
        tmp = _Buffers(R * icg, ct)
        tasks = []

        def rowmap(grid, q, r0, r1, c0):
            """Element offsets in dx of phase rows r0..r1 (pixel q + s*j), channel c0."""
            r = np.arange(r0, r1, dtype=np.int64)
            jw = r % grid[2]
            r //= grid[2]
            jh = r % grid[1]
            r //= grid[1]
            jd = r % grid[0]
            n = r // grid[0]
            i_d, i_h, i_w = (q[a] + p.stride[a] * j for a, j in enumerate((jd, jh, jw)))
            return (((n * p.isz[0] + i_d) * p.isz[1] + i_h) * p.isz[2] + i_w) * p.ic + c0

        def phase_task(grid, q, boff, runs, gi, WT, r0, r1, j0=0, j1=None):
            g_arr, q_arr = np.asarray(grid, np.int64), np.asarray(q, np.int64)
            j1 = icg if j1 is None else j1
            B = WT[:, j0:j1]

            def task(slot):
                c = self._col(dy, grid, (1, 1, 1), boff, gi * ocg, ocg, r0, r1, cols[slot],
                              runs)
                if unit and (g == 1 or mm.numba):
                    mm(c, B, dx2[r0:r1, gi * icg + j0:gi * icg + j1], slot)
                elif mm.numba:  # rows straight into every s-th pixel of dx
                    mm.rows(c, B, dx, rowmap(grid, q, r0, r1, gi * icg + j0), slot)
                else:
                    t = mm(c, B, tmp[slot][: (r1 - r0) * (j1 - j0)].reshape(r1 - r0, j1 - j0),
                           slot)
                    k.scatter_phase(t, dx, g_arr, stride, q_arr, np.int64(gi * icg + j0),
                                    np.int64(r0))
            return task

        def per_tap_task(grid, q, boff, runs, gi, idx, r0, r1, j0, j1):
            """dX[rows, j0:j1] = sum over taps of col_t @ W[t, j0:j1, group's K]^T: every
            operand a view (BLAS takes the transposed one as it is)."""
            g_arr, q_arr = np.asarray(grid, np.int64), np.asarray(q, np.int64)
            Bs = [W[ti, j0:j1, gi * ocg:(gi + 1) * ocg].T for ti in idx]
            n_out = (r1 - r0) * (j1 - j0)

            def task(slot):
                c = self._col(dy, grid, (1, 1, 1), boff, gi * ocg, ocg, r0, r1, cols[slot],
                              runs)
                acc = tmp[slot][:n_out].reshape(r1 - r0, j1 - j0)
                prod = ptmp[slot][:n_out].reshape(r1 - r0, j1 - j0)
                for t, B in enumerate(Bs):
                    a = c[:, t * ocg:(t + 1) * ocg]
                    if t == 0:
                        mm(a, B, acc, slot)
                    elif mm.numba:
                        mm(a, B, acc, slot, accumulate=True)
                    else:
                        np.add(acc, mm(a, B, prod, slot), out=acc)
                k.scatter_phase(acc, dx, g_arr, stride, q_arr, np.int64(gi * icg + j0),
                                np.int64(r0))
            return task

        ptmp = _Buffers(R * icg if per_tap else 0, ct)
        for q, grid, taps in _phases(p):
            if 0 in grid:
                continue
            sl = (slice(None), *(slice(qa, None, sa) for qa, sa in zip(q, p.stride)))
            if not taps:  # positions no tap reaches (stride > kernel extent): zero
                nb = max(1, p.mb // 4)  # in tasks, over the batch
                for n0 in range(0, p.mb, nb):
                    tasks.append(lambda slot, sl=(slice(n0, n0 + nb), *sl[1:]):
                                 dx.__setitem__(sl, 0))
                continue
            # taps in offset order, so that w-neighbours form contiguous im2col runs
            taps = sorted(taps, key=lambda t: t[1])
            idx = [ti for ti, _ in taps]
            boff = np.array([off for _, off in taps], np.int64).reshape(len(taps), 3)
            runs = _runs(boff)
            Mq = p.mb * math.prod(grid)
            whole = _is_identity(len(taps), (1, 1, 1), boff, grid, dy, p.oc) and g == 1
            if per_tap and len(idx) > 1:
                step = -(-icg // col_parts)
                for gi in range(g):
                    for r0 in range(0, Mq, R):
                        for j0 in range(0, icg, step):
                            tasks.append(per_tap_task(grid, q, boff, runs, gi, idx, r0,
                                                      min(Mq, r0 + R), j0,
                                                      min(icg, j0 + step)))
                continue
            for gi in range(g):
                # W_q^T: [taps_q*K/g, C/g] so that col_q (taps-major, then K) @ W_q^T -> C,
                # as the transposed view of a [C/g, taps_q*K/g] copy, whose rows are runs of
                # K contiguous weights (an element-wise transposing copy took 3 ms of a 5 ms
                # call for 5 taps of 512x512); one tap needs no copy.
                if len(idx) == 1:  # the transposed view (the Numba engine packs it)
                    WT = W[idx[0], :, gi * ocg:(gi + 1) * ocg].T
                elif mm.numba:  # [taps_q*K/g, C/g] itself, from contiguous 16x16 blocks
                    Wt = np.empty((len(idx), ocg, icg), ct)
                    k.transpose_taps(W, np.asarray(idx, np.int64), np.int64(gi * ocg), Wt)
                    WT = Wt.reshape(-1, icg)
                else:
                    Wc = np.empty((icg, len(idx), ocg), ct)
                    for j, ti in enumerate(idx):
                        Wc[:, j] = W[ti, :, gi * ocg:(gi + 1) * ocg]
                    WT = Wc.reshape(icg, -1).T
                if whole and not unit and not mm.numba:
                    # one tap reading dy as it is (1x1 at stride s, or a stride phase of a
                    # KxK kernel): a GEMM on dy written to every s-th pixel, in tasks over
                    # the batch when there are workers (one task held the other worker idle:
                    # res3a_branch2b's phase took 7.6 ms of a 27 ms call on one thread)
                    nb = max(1, -(-p.mb // (2 * mm.workers))) if mm.workers > 1 else p.mb
                    for n0 in range(0, p.mb, nb):
                        def strided(slot, sl=sl, WT=WT, grid=grid, n0=n0,
                                    n1=min(p.mb, n0 + nb)):
                            part = dy[n0:n1].reshape(-1, p.oc) @ WT
                            dx[(slice(n0, n1), *sl[1:])] = part.reshape(n1 - n0, *grid, icg)
                        tasks.append(strided)
                    continue
                step = -(-icg // col_parts)
                for r0 in range(0, Mq, R):
                    for j0 in range(0, icg, step):
                        tasks.append(phase_task(grid, q, boff, runs, gi, WT, r0,
                                                min(Mq, r0 + R), j0, min(icg, j0 + step)))
        return tasks, lambda: dx


def _half_packed(p, tiles):
    """The operands packed forward and backward weights take as float16 bits: X, widened
    by ``im2col`` as it packs (never the identity: packed problems always pack), and for
    one group's slab tasks dY, widened slab by slab into a float32 buffer per worker, or
    with dW's rows split among the tasks the result, each block rounded by its task."""
    if not tiles.get("packed") or p.direction == "bwd_d":
        return ()
    if p.direction == "bwd_w" and p.g == 1:
        # split "dw": dY is read whole by every task (the backend widens it), and each
        # task rounds its block of dW's rows
        return ("x", "result") if tiles.get("split") == "dw" else ("x", "dy")
    return ("x",)


def tiles_split_dw(mm):
    """Whether backward weights splits dW's rows among the workers (see ``tiles``)."""
    return mm.split_dw


class _Multiply:
    """``mm(a, b, out, slot, accumulate=False)``: ``out = a @ b`` (``out += a @ b``) with the
    plan's engine; returns ``out``. ``mm.numba`` says whether it is the Numba micro-kernel
    (any operand strides, in-place accumulation) or NumPy's BLAS (no accumulation)."""

    def __init__(self, tiles, ct, workers=1):
        self.split_dw = tiles.get("split") == "dw"
        self.workers = workers
        self.numba = tiles.get("engine") == "numba"
        if self.numba:
            from ..kernels.cpu import ukernel
            self.uk = ukernel
            self.kc, self.nc = int(tiles["kc"]), int(tiles["nc"])
            self.work = _Buffers(ukernel.workspace(self.kc, ct.itemsize, self.nc), ct)

    def rows(self, a, b, out, rowmap, slot):
        """Row i of ``a @ b`` to ``out.flat[rowmap[i]:]`` (Numba engine only)."""
        return self.uk.matmul_rows(a, b, out, rowmap, False, self.kc, self.nc, self.work[slot])

    def __call__(self, a, b, out, slot, accumulate=False):
        if self.numba:
            return self.uk.matmul(a, b, out, accumulate, self.kc, self.nc, self.work[slot])
        assert not accumulate
        return np.matmul(a, b, out=out)


class _Buffers:
    """One lazily allocated flat buffer of ``n`` elements per worker slot."""

    def __init__(self, n, dtype):
        self.n, self.dtype = n, dtype
        self.bufs = {}

    def __getitem__(self, slot):
        b = self.bufs.get(slot)
        if b is None:
            b = self.bufs[slot] = memory.empty(self.n, self.dtype)
        return b


STRATEGY = Gemm()
