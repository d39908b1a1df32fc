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

Each path is its own planner entry, in this best-first order:

* ``gemm[split-k]``: 1x1 backward weights on the Numba engine, the reduction split among
  the threads of one parallel region;
* ``gemm[claimed]``: 1x1 stride-1 backward data on the Numba engine, W^T packed once, the
  threads claiming blocks of dY's rows;
* ``gemm[identity]``: any other 1x1 GEMM on the arrays themselves (no packing);
* ``gemm[per-tap]``: backward data with few rows per stride phase, one GEMM per tap on W's
  own rows;
* ``gemm[split-dw]``: backward weights with a short reduction into a larger dW, packed
  once, dW's rows split among the workers;
* ``gemm[slabs]``: im2col slabs, for every problem the common guards let through.

The engine (``engine=numba|blas`` in the tiles) is chosen per problem by
:func:`._gemm_common.choose_engine`.
"""
import math

import numpy as np

from . import Strategy, canonical_shapes, itemsize, small, streams
from ._gemm_common import (Buffers, Multiply, choose_engine, claims, gemm_guard,
                           grouped_identity, identity, kernel_taps, narrow_guard,
                           numba_engine_tiles, packed_wt_elems, run_tasks, split_m_engine,
                           stride_phases, sum_partials, tap_runs, task_workers)
from .. import config, memory


#: Backward data with at most this many rows per stride phase multiplies tap by tap on W's
#: own rows instead of a transposed copy of W, whose copy costs more than the short GEMMs
#: (measured: docs/performance.md, Numbers behind the constants).
PER_TAP_MAX_ROWS = 512


def _max_phase_taps(p):
    """Taps of backward data's largest stride phase (ceil(k/s) per axis at dilation 1)."""
    return max((len(t) for _, _, t in stride_phases(p)), default=1) or 1


def _phase_rows(p):
    """GEMM rows of backward data's largest stride phase."""
    return p.mb * math.prod(-(-i // s) for i, s in zip(p.isz, p.stride))


def _is_identity(ntaps, a, boff, grid, src, cn):
    return (ntaps == 1 and all(v == 1 for v in a) and not np.any(boff)
            and tuple(grid) == src.shape[1:4] and cn == src.shape[4])


#: 1x1 backward passes on BLAS over at least this many pixels run as worker tasks
#: (one-thread BLAS each: reduction slabs with partial dW's for the weight gradient, row
#: slabs or batch slices for backward data) instead of one GEMM on every BLAS thread, which
#: OpenBLAS splits along the short side; shorter reductions lose (measured:
#: docs/performance.md, Numbers behind the constants).
BLAS_SPLIT_MIN_ROWS = 16384

#: The split-K 1x1 weight gradient prefetches each next reduction block of X and dY into L2
#: (``ukernel.gemm``'s ``pf``) when X and dY take at least this share of the L3 and a row of
#: X at least ``SPLIT_K_PREFETCH_ROW_BYTES``: ``X^T`` steps one row of X per step of the
#: reduction, and the hardware prefetchers stop at every 4 KiB page, which rows of 1 KiB and
#: more cross every few steps (measured: docs/performance.md, Numbers behind the constants).
SPLIT_K_PREFETCH_L3_FRACTION = 0.45
SPLIT_K_PREFETCH_ROW_BYTES = 1024


#: Rows of dY a worker claims at a time in 1x1 backward data on the Numba engine
#: (measured: docs/performance.md, Numbers behind the constants).
CLAIM_ROWS = 192


R_NOT_IDENTITY = ("{k} kernel, {g} group(s), leading pads {pb}, stride {s}: the GEMM "
                  "operands are not the arrays themselves (1x1, one group, no leading pad, "
                  "the GEMM grid equal to the array's)")
R_NUMBA_ONLY = ("the {v} path runs on the Numba engine; this problem's engine is {e} "
                "(GEMM_ENGINE={cfg!r})")
R_BWD_W = "backward weights only"
R_BWD_D = "backward data only"
R_STRIDE = "stride {s}: dX's rows are not one stride apart"
R_WT_L2 = ("the packed W^T ({kib} KiB) does not fit half of L2 ({half} KiB): every row "
           "tile would read it from memory")
R_ONE_TAP = "one tap: nothing to sum tap by tap"
R_PHASE_ROWS = ("{rows} rows per stride phase (> %d): a transposed copy of W costs less "
                "than streaming W once per tap" % PER_TAP_MAX_ROWS)
R_ONE_WORKER = "one worker: no rows of dW to share out"
R_LONG_REDUCTION = ("a long reduction ({rows} rows x {row_bytes} B > 4 x the {budget} B "
                    "slab budget): slabs of it")
R_SMALL_DW = ("dW ({dw} elements) smaller than the packed columns ({cols}): slabs split "
              "the reduction")


def _not_identity(p):
    """Why ``p``'s GEMMs need packed operands, or None (see ``identity``)."""
    if identity(p):
        return None
    return R_NOT_IDENTITY.format(k="x".join(map(str, p.ksz)), g=p.g, pb=p.pad_begin,
                                 s=p.stride)


def _engine_setup(p, machine):
    """``(engine, engine tiles, workers)`` of ``p``."""
    engine = choose_engine(p, machine)
    engine_tiles = (numba_engine_tiles(p, machine) if engine == "numba"
                    else {"engine": engine})
    workers = task_workers(p) if config.GEMM_WORKERS or engine == "numba" else 1
    return engine, engine_tiles, workers


def _numba_only(p, variant):
    """The reason a Numba-engine-only path declines ``p``, or None."""
    from ..machine import machine
    e = choose_engine(p, machine())
    if e != "numba":
        return R_NUMBA_ONLY.format(v=variant, e=e, cfg=config.GEMM_ENGINE)
    return None


class _Gemm(Strategy):
    """What this module's variants share: the guards of every GEMM, the packing of
    columns (``_col``) and the worker tasks that multiply them (``_tasks``)."""

    name = "gemm"
    #: Whether the GEMM operands are packed columns (im2col) rather than the arrays.
    packed = True
    #: Backward data: one GEMM per tap on W's own rows (no transposed copy of W).
    per_tap = False
    #: Backward weights: dW's rows split among the workers (the columns packed once).
    split_dw = False

    def accepts(self, p):
        return gemm_guard(p)

    def _packed_channels(self, p):
        return p.ocg if p.direction == "bwd_d" else p.icg

    def _slot_columns(self, p, tiles):
        """Packed columns per row of one worker's buffer: a weight gradient whose dW rows
        are split into ``col_parts`` blocks packs one block's input channels per task."""
        c = self._packed_channels(p)
        if p.direction == "bwd_w":
            c = -(-c // int(tiles.get("col_parts", 1)))
        return math.prod(p.ksz) * c

    def half_operands(self, p, tiles):
        """Packed forward and backward weights widen X as they pack its columns
        (``gemm.im2col``; never the identity: it packs nothing); one group's backward
        weights also dY, slab by slab into a float32 buffer per worker, or with dW's rows
        split among the tasks the result, each block rounded by its task."""
        if not self.packed or p.direction == "bwd_d":
            return frozenset()
        if p.direction == "bwd_w" and p.g == 1:
            # split dW: dY is read whole by every task (the backend widens it)
            return frozenset(("x", "result") if self.split_dw else ("x", "dy"))
        return frozenset(("x",))

    def _slab_budget(self, p, machine):
        """``(rows, bytes per row, budget)`` of the packed GEMMs: backward data packs one
        stride phase at a time (its taps, not the kernel's)."""
        ntaps = math.prod(p.ksz)
        rows = p.mb * math.prod(p.isz if p.direction == "bwd_d" else p.osz)
        ptaps = _max_phase_taps(p) if p.direction == "bwd_d" else ntaps
        row_bytes = max(ptaps * self._packed_channels(p) * itemsize(p), 1)
        return rows, row_bytes, config.GEMM_SLAB_BYTES or 2 * machine.l2_bytes

    def workspace_bytes(self, p, tiles):
        item = itemsize(p)
        ntaps = math.prod(p.ksz)
        r = tiles["slab_rows"]
        nw = tiles.get("workers", 1)
        numba_engine = tiles.get("engine") == "numba"
        ws = nw * r * self._slot_columns(p, tiles) * item if self.packed else 0
        if numba_engine:
            from ..kernels.cpu import ukernel as uk
            ws += nw * uk.workspace(tiles["kc"], item, tiles["nc"]) * item
        if self.split_dw:  # every group's columns packed once; no partials
            if np.dtype(p.dtype) == np.float16 and "result" in self.half_operands(p, tiles):
                ws += ntaps * p.icg * p.oc * 2  # the rounded dW beside the float32 one
            return ws + (p.g - 1) * r * ntaps * p.icg * item
        if p.direction == "bwd_w":
            # per worker: the accumulator of every group (and one slab product for BLAS)
            ws += nw * (p.g + (0 if numba_engine else 1)) * ntaps * p.icg * p.ocg * item
            if np.dtype(p.dtype) == np.float16 and "dy" in self.half_operands(p, tiles):
                ws += nw * r * p.oc * item  # and a float32 slab of dY
        elif self.per_tap:  # one product per worker (BLAS adds it)
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
        cols = Buffers(R * self._slot_columns(p, tiles) if self.packed else 0, ct)
        tasks, finish = self._tasks(p, ops, R, cols, ct, Multiply(tiles, ct, nw),
                                    int(tiles.get("col_parts", 1)), self.per_tap)
        run_tasks(tasks, nw)
        return finish()

    def _bwd_d_claimed(self, p, ops, ct, nw, chunk, stream):
        """1x1 backward data at stride 1 (see ``identity``; with groups, one such GEMM per
        group on column slices of dY and dX, all in one parallel loop): ``dX = dY @ W^T`` with W^T
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
        bp = packed_wt(ops["w"].reshape(p.ic, p.oc)) if p.g == 1 else None
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
        if p.g == 1:
            uk.gemm_claimed_parallel(dy2.ctypes.data, p.oc, 1, bp, dx.ctypes.data, p.ic,
                                     dy2.shape[0], p.ic, counter, chunk, work, stream)
            return dx
        # groups: every group's GEMM on column slices of dY and dX, their row blocks
        # claimed from one counter in one parallel loop
        bps = uk.pack_group_panels(ops["w"].reshape(p.icg, p.g, p.ocg).transpose(1, 2, 0))
        uk.gemm_claimed_groups(dy2.ctypes.data, p.oc, 1, bps, dx.ctypes.data, p.ic,
                               dy2.shape[0], p.icg, p.ocg, p.icg, counter, chunk, work)
        return dx

    def _bwd_w_split_k(self, p, ops, ct, nw, kc, nc, prefetch=False, transposed=False):
        """1x1 backward weights at stride 1 (see ``identity``): ``dW = X^T @ dY`` over every
        pixel, the reduction split into one share per thread inside one Numba parallel
        region. Measured against the slab tasks on Python worker threads (2 threads,
        float32, same process): ResNet-50 res2a_branch2a 1.25 -> 1.01 ms (PyTorch 0.95),
        res2b_branch2a 7.9 -> 5.5, res3b_branch2a 5.1 -> 4.1-4.5 (it was on BLAS);
        every other 1x1 stride-1 layer of the suite at or below its BLAS or task time.
        ``transposed``: ``dW^T = dY^T @ X`` instead, then transposed into dW (one group,
        output channels short of whole vectors, input channels whole: see
        :func:`split_k_transposed`)."""
        from ..kernels.cpu import ukernel as uk
        x2 = np.ascontiguousarray(ops["x"]).reshape(-1, p.ic)
        dy2 = np.ascontiguousarray(ops["dy"]).reshape(-1, p.oc)
        dw = memory.empty(canonical_shapes(p)[2], ct)
        # dW's rows (and the partials') padded to whole vectors where the output channels
        # are not: a last panel of partial vectors stores its tiles whole (ukernel.ROOM)
        vl = uk.lanes(ct.itemsize)
        icg, ocg = p.icg, p.ocg
        ocp = -(-ocg // vl) * vl
        half = x2.dtype == np.uint16
        plain = p.g == 1 and (ocp == ocg or half)
        parts = np.empty((nw - 1, p.ic, p.oc) if plain else (0, 1, 1), ct)
        work = np.empty((nw, uk.workspace(kc, ct.itemsize, nc)), ct)
        if half:  # float16 or bfloat16 bits: widened one reduction block at a time
            stage = np.empty((nw, kc * (p.ic + p.oc)), ct)
            uk.gemm_split_k_half(x2, dy2, dw.reshape(p.ic, p.oc), parts, kc, nc, work,
                                 stage, p.dtype == "bfloat16")
            return dw
        if transposed and p.g == 1 and not half:
            dwt = np.empty((p.oc, p.ic), ct)
            tparts = np.empty((nw - 1, p.oc, p.ic), ct)
            uk.gemm_split_k(dy2.ctypes.data, 1, p.oc, x2.ctypes.data, p.ic, 1, dwt, tparts,
                            x2.shape[0], kc, nc, work, prefetch)
            dw.reshape(p.ic, p.oc)[...] = dwt.T
            return dw
        if plain:
            uk.gemm_split_k(x2.ctypes.data, 1, p.ic, dy2.ctypes.data, p.oc, 1,
                            dw.reshape(p.ic, p.oc), parts, x2.shape[0], kc, nc, work,
                            prefetch)
            return dw
        # groups (1x1 at stride 1): each group's GEMM on column slices of x and dY, into
        # padded rows
        it = ct.itemsize
        dwg = np.empty((icg, ocp), ct)
        gparts = np.empty((nw - 1, icg, ocp), ct)
        d2 = dw.reshape(icg, p.oc)
        for gi in range(p.g):
            uk.gemm_split_k(x2.ctypes.data + gi * icg * it, 1, p.ic,
                            dy2.ctypes.data + gi * ocg * it, p.oc, 1, dwg, gparts,
                            x2.shape[0], kc, nc, work, prefetch, ocg)
            d2[:, gi * ocg:(gi + 1) * ocg] = dwg[:, :ocg]
        return dw

    def _tasks(self, p, ops, R, cols, ct, mm, col_parts=1, per_tap=False):
        """``(tasks, finish)``: independent callables ``task(slot)`` and a function that
        returns the result once they have all run."""
        if p.direction == "bwd_d":
            return self._bwd_d(p, ops, R, cols, ct, mm, col_parts, per_tap)
        xs, ys, ws = canonical_shapes(p)
        taps = kernel_taps(p)
        boff = np.array([[t[a] * p.dilation[a] - p.pad_begin[a] for a in range(3)]
                         for t in taps], np.int64).reshape(len(taps), 3)
        runs = tap_runs(boff)
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
        if self.split_dw:
            return self._bwd_w_split_dw(p, ops, M, taps, col, dy2, ws, ct, mm)
        from ..kernels.cpu import convert
        half_dy = dy2.dtype == np.uint16  # float16 bits (one group): widened slab by slab
        dbuf = Buffers(R * p.oc if half_dy else 0, ct)
        # fixed ownership: each group's slabs in ``nruns`` contiguous runs and its input
        # channels in ``col_parts`` blocks (dW's rows; one block unless the reduction is
        # too short for every worker to take a run of it), one task per run and block
        # summing its slabs in order into its own partial (the first slab's product
        # written, later ones added), the partials added in run order: the same bits
        # whichever worker takes a task, and when
        nslabs = -(-M // R)
        nruns = max(1, min(mm.workers // col_parts, nslabs))
        bounds = [icg * b // col_parts for b in range(col_parts + 1)]
        acc = {}
        prod = Buffers(0 if mm.numba else len(taps) * -(-icg // col_parts) * ocg, ct)

        def bwd_w_task(gi, run, b):
            s0, s1 = nslabs * run // nruns, nslabs * (run + 1) // nruns
            c0, cn = gi * icg + bounds[b], bounds[b + 1] - bounds[b]
            rows = len(taps) * cn

            def task(slot):
                a = None
                for r0 in range(s0 * R, min(M, s1 * R), R):
                    r1 = min(M, r0 + R)
                    c = self._col(x, p.osz, p.stride, boff, c0, cn, r0, r1, cols[slot], runs)
                    if half_dy:
                        d = dbuf[slot][: (r1 - r0) * p.oc].reshape(r1 - r0, p.oc)
                        convert.convert(dy2[r0:r1].reshape(-1), d.reshape(-1), True)
                    else:
                        d = dy2[r0:r1, gi * ocg:(gi + 1) * ocg]
                    if mm.numba:  # accumulates in place
                        first = a is None
                        if first:
                            a = np.empty((rows, ocg), ct)
                        mm(c.T, d, a, slot, accumulate=not first)
                    elif a is None:
                        a = c.T @ d
                    else:
                        pr = np.matmul(c.T, d, out=prod[slot][: rows * ocg].reshape(rows, ocg))
                        np.add(a, pr, out=a)
                acc[gi, run, b] = a
            return task

        def finish():
            if g == 1 and col_parts == 1:
                return sum_partials([acc[0, run, 0] for run in range(nruns)],
                                    mm.workers).reshape(ws)
            dw = memory.empty(ws, ct)
            dW5 = dw.reshape(len(taps), icg, g, ocg)
            for gi in range(g):
                for b in range(col_parts):
                    total = sum_partials([acc[gi, run, b] for run in range(nruns)],
                                         mm.workers)
                    dW5[:, bounds[b]:bounds[b + 1], gi] = total.reshape(len(taps), -1, ocg)
            return dw

        return [bwd_w_task(gi, run, b) for gi in range(g) for run in range(nruns)
                for b in range(col_parts)], finish

    def _bwd_w_split_dw(self, p, ops, M, taps, col, dy2, ws, ct, mm):
        """Backward weights over one slab: col (every row, every group) packed once, then
        tasks over blocks of dW's rows, each one GEMM written straight into dW."""
        icg, ocg, g = p.icg, p.ocg, p.g
        cols = [col(gi, 0, M, 0).copy() if g > 1 else col(gi, 0, M, 0) for gi in range(g)]
        from ..kernels.cpu import convert
        dw = memory.empty(ws, ct)
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
        tmp = Buffers(R * icg, ct)
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

        ptmp = Buffers(R * icg if per_tap else 0, ct)
        for q, grid, taps in stride_phases(p):
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
            runs = tap_runs(boff)
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


def split_k_transposed(p):
    """Whether ``gemm[split-k]`` computes ``dW^T = dY^T @ X`` (then transposed, a pass
    over dW alone) instead of ``dW = X^T @ dY``: one group, float32 or float64, output
    channels short of whole vectors by at least an eighth of the lanes they take and input
    channels whole vectors, so that the register tiles' columns (the GEMM's N) are all
    used. Both orders in one process, 2 threads, Zen 4, ms new / before:
    efficientnet_b0:mb5_project (240 -> 40) 0.64 / 0.80, pointnet:seg_out (128 -> 50) 1.27
    / 1.67; with one lane short, yolov3:head13_out (1024 -> 255) lost, 2.55 / 1.73."""
    from ..kernels.cpu import ukernel as uk
    if p.g != 1 or p.dtype not in ("float32", "float64"):
        return False
    vl = uk.lanes(itemsize(p))
    ocp = -(-p.oc // vl) * vl
    return bool((ocp - p.oc) * 8 >= ocp and p.ic % vl == 0)


#: Filters of at least this many elements are packed for 1x1 backward data by register
#: transposes in parallel (:func:`packed_wt`); smaller ones by NumPy, whose copy starts
#: faster (240 x 80: 0.011 ms against 0.015).
PACK_IN_REGISTERS_FROM = 1 << 16


def packed_wt(w2):
    """``ukernel.pack_panels(w2.T)``: 1x1 backward data's ``W^T`` as the claimed GEMM's B
    panels, ``[panels, K, NR]``. In float32 and float64, from
    :data:`PACK_IN_REGISTERS_FROM` elements on, by the implicit GEMM's filter packing
    (square blocks transposed in registers, in parallel over panels), where NumPy's
    transposing copy ran at 2-3 GB/s (2 threads, Zen 4, ms NumPy / registers):
    densenet121's 992 x 128 filter 0.104 / 0.038, 512 x 2048 3.30 / 0.30."""
    from ..kernels.cpu import igemm
    from ..kernels.cpu import ukernel as uk
    if w2.dtype not in (np.float32, np.float64) or w2.size < PACK_IN_REGISTERS_FROM:
        return uk.pack_panels(w2.T)
    C, K = w2.shape
    nr = uk.panel(w2.itemsize)
    out = np.empty((max(1, -(-C // nr)), 1, K, nr), w2.dtype)
    igemm.pack_filter(np.ascontiguousarray(w2).reshape(1, C, K), np.zeros(1, np.int64), out)
    return out.reshape(out.shape[0], K, nr)


class GemmSplitK(_Gemm):
    """1x1 backward weights at stride 1 (see ``identity``): ``dW = X^T @ dY`` over every
    pixel, the reduction split into one share per thread inside one Numba parallel region
    (``ukernel.gemm_split_k``); with groups, one such region per group on column slices
    of x and dY (ShuffleNet's grouped 1x1 layers)."""

    variant = "split-k"
    directions = ("bwd_w",)
    packed = False
    compile_heavy = True

    def accepts(self, p):
        if p.direction != "bwd_w":
            return R_BWD_W
        why = gemm_guard(p) or (None if grouped_identity(p) else _not_identity(p))
        if why:
            return why
        return _numba_only(p, self.variant)

    def tiles(self, p, machine):
        _, engine_tiles, workers = _engine_setup(p, machine)
        rows = p.mb * math.prod(p.osz)
        foot = rows * (p.ic + p.oc) * itemsize(p)
        return {"slab_rows": int(rows), "workers": workers, **engine_tiles,
                "prefetch": bool(foot >= machine.l3_bytes * SPLIT_K_PREFETCH_L3_FRACTION
                                 and p.ic * itemsize(p) >= SPLIT_K_PREFETCH_ROW_BYTES),
                "transposed": split_k_transposed(p)}

    def workspace_bytes(self, p, tiles):
        from ..kernels.cpu import ukernel as uk
        item, nw = itemsize(p), tiles.get("workers", 1)
        ws = nw * uk.workspace(tiles["kc"], item, tiles["nc"]) * item
        if np.dtype(p.dtype) == np.float16 and p.g == 1:  # a float32 stage of kc pixels
            ws += nw * tiles["kc"] * (p.ic + p.oc) * item
        # a partial dW per thread but the first (with groups or output channels short of
        # whole vectors, one group's rows padded to vectors, and its dW)
        ocp = -(-p.ocg // uk.lanes(item)) * uk.lanes(item)
        return ws + (nw - 1 + (p.g > 1 or ocp > p.ocg)) * p.icg * ocp * item

    def numba_parallel(self, p, tiles):
        return True

    def half_operands(self, p, tiles):
        """X and dY widened one reduction block of pixels at a time
        (``ukernel.gemm_split_k_half``); with groups, float32 operands (the backend
        converts)."""
        return frozenset({"x", "dy"}) if p.g == 1 else frozenset()

    def bf16_operands(self, p, tiles):
        """As :meth:`half_operands`, bfloat16 bits widened the same way."""
        return self.half_operands(p, tiles)

    def run(self, p, tiles, ops):
        return self._bwd_w_split_k(p, ops, np.dtype(p.compute_dtype),
                                   int(tiles.get("workers", 1)), int(tiles["kc"]),
                                   int(tiles["nc"]), bool(tiles.get("prefetch")),
                                   bool(tiles.get("transposed")))


class GemmClaimed(_Gemm):
    """1x1 backward data at stride 1: W^T packed once, the threads of one Numba parallel
    region claiming blocks of dY's rows (``ukernel.gemm_claimed_parallel``), when the
    packed W^T fits half of L2, where every row tile meets all of it."""

    variant = "claimed"
    directions = ("bwd_d",)
    packed = False
    compile_heavy = True

    def accepts(self, p):
        from ..machine import machine
        if p.direction != "bwd_d":
            return R_BWD_D
        why = gemm_guard(p) or (None if grouped_identity(p) else _not_identity(p))
        if why:
            return why
        if any(s != 1 for s in p.stride):
            return R_STRIDE.format(s=p.stride)
        if not claims(p, machine()):
            return R_WT_L2.format(kib=packed_wt_elems(p) * itemsize(p) // 1024,
                                  half=machine().l2_bytes // 2 // 1024)
        return _numba_only(p, self.variant)

    def tiles(self, p, machine):
        _, engine_tiles, workers = _engine_setup(p, machine)
        rows = p.mb * math.prod(p.osz)
        chunk = max(1, min(CLAIM_ROWS, rows // (8 * workers))) if workers > 1 else rows
        return {"slab_rows": int(rows), "workers": workers, "claim": int(chunk),
                # float16's dX is rounded from a float32 stage, never streamed; a group's
                # rows of dX need not start on a vector boundary
                "stream": p.dtype != "float16" and p.g == 1 and streams(
                    rows * p.oc + p.oc * p.ic + p.mb * math.prod(p.isz) * p.ic, p, machine),
                **engine_tiles}

    def workspace_bytes(self, p, tiles):
        """W^T's panels, and one row tile of scratch per worker."""
        from ..kernels.cpu import ukernel as uk
        item, nw = itemsize(p), tiles.get("workers", 1)
        ws = (packed_wt_elems(p) + nw * uk.claimed_workspace(p.oc, item)) * item
        if np.dtype(p.dtype) == np.float16:  # and a float32 stage of claimed rows each
            ws += nw * uk.claimed_stage(tiles["claim"], p.oc, p.ic) * item
        return ws

    def numba_parallel(self, p, tiles):
        return True

    def half_operands(self, p, tiles):
        """Each claimed block of dY's rows widened, its dX rows rounded
        (``ukernel.gemm_claimed_half``); with groups, float32 operands (the backend
        converts)."""
        return frozenset({"dy"}) if p.g == 1 else frozenset()

    def run(self, p, tiles, ops):
        return self._bwd_d_claimed(p, ops, np.dtype(p.compute_dtype),
                                   int(tiles.get("workers", 1)), int(tiles["claim"]),
                                   bool(tiles.get("stream")))


class GemmIdentity(_Gemm):
    """1x1 GEMMs on the channels-last arrays themselves: one GEMM on every BLAS thread, or
    worker tasks over row slabs (reduction slabs for backward weights; for backward data
    on the Numba engine also column blocks)."""

    variant = "identity"
    packed = False

    def accepts(self, p):
        return narrow_guard(p) or _not_identity(p)

    def tiles(self, p, machine):
        engine, engine_tiles, workers = _engine_setup(p, machine)
        rows = p.mb * math.prod(p.isz if p.direction == "bwd_d" else p.osz)
        split = workers > 1 and rows >= BLAS_SPLIT_MIN_ROWS and p.direction != "fwd"
        if engine == "blas" and not split:  # one GEMM on every BLAS thread
            return {"slab_rows": rows, **engine_tiles}
        # two blocks per worker: row slabs (reduction slabs for backward weights), for
        # backward data times column blocks where that moves less: each row slab reads
        # all of B, each column block all of A (late layers: 392 rows, 2048 columns)
        n, col_parts = 2 * workers, 1
        if p.direction == "bwd_d":  # the GEMM's rows: dy's pixels, one live phase
            rows = p.mb * math.prod(p.osz)
        if p.direction == "bwd_d" and engine == "numba":
            a_size, b_size = rows * p.oc, p.oc * p.ic
            fits = [c for c in range(1, n + 1)
                    if n % c == 0 and p.ic // c >= engine_tiles["nc"] // 8]
            col_parts = min(fits or [1], key=lambda c: (n // c) * b_size + c * a_size)
        tiles = {"slab_rows": int(max(1, -(-rows // (n // col_parts)))),
                 "workers": workers, **engine_tiles}
        if col_parts > 1:
            tiles["col_parts"] = col_parts
        return tiles


class GemmPerTap(_Gemm):
    """Backward data with few rows per stride phase: the GEMMs stream W once, so W^T's
    copy would cost as much as they do; one GEMM per tap on W's own rows instead, dX's
    columns split among the workers (each reads its share of W once)."""

    variant = "per-tap"
    directions = ("bwd_d",)
    per_tap = True

    def accepts(self, p):
        if p.direction != "bwd_d":
            return R_BWD_D
        why = gemm_guard(p)
        if why:
            return why
        if math.prod(p.ksz) == 1:
            return R_ONE_TAP
        if _phase_rows(p) > PER_TAP_MAX_ROWS:
            return R_PHASE_ROWS.format(rows=_phase_rows(p))
        return None

    def tiles(self, p, machine):
        _, engine_tiles, workers = _engine_setup(p, machine)
        parts = max(1, min(workers, p.icg // 8))
        return {"slab_rows": int(max(1, _phase_rows(p))), "workers": workers,
                "col_parts": parts, **engine_tiles}


class GemmSplitDw(_Gemm):
    """Backward weights with a short reduction into a larger dW: the columns packed once,
    dW's rows split among the workers, as BLAS splits its output; splitting the reduction
    would give every worker a dW-sized partial to write and add (1-D k5 512x512 over 30
    pixels: 3.1 ms with the reduction split, 1.7 ms with dW's rows split). One group on
    AVX-512 hosts (``split_m_engine``): one Numba parallel region over dW's row blocks
    (``ukernel.gemm_split_m``)."""

    variant = "split-dw"
    directions = ("bwd_w",)
    split_dw = True

    def accepts(self, p):
        from ..machine import machine
        if p.direction != "bwd_w":
            return R_BWD_W
        why = gemm_guard(p)
        if why:
            return why
        m = machine()
        if _engine_setup(p, m)[2] < 2:
            return R_ONE_WORKER
        rows, row_bytes, budget = self._slab_budget(p, m)
        if rows * row_bytes > 4 * budget:
            return R_LONG_REDUCTION.format(rows=rows, row_bytes=row_bytes, budget=budget)
        dw, cols = math.prod(p.ksz) * p.icg * p.oc, rows * math.prod(p.ksz) * p.icg
        if dw < cols:
            return R_SMALL_DW.format(dw=dw, cols=cols)
        return None

    def tiles(self, p, machine):
        engine, engine_tiles, workers = _engine_setup(p, machine)
        if p.g == 1 and split_m_engine(engine) and not small(p):
            engine_tiles = numba_engine_tiles(p, machine)
        rows = p.mb * math.prod(p.osz)
        return {"slab_rows": int(max(1, rows)), "workers": workers, **engine_tiles}


class GemmSlabs(_Gemm):
    """im2col slabs: columns packed slab by slab, each within the slab budget, the slabs
    in a multiple of the workers so that they finish together."""

    variant = "slabs"

    def accepts(self, p):
        return narrow_guard(p)

    def tiles(self, p, machine):
        _, engine_tiles, workers = _engine_setup(p, machine)
        rows, row_bytes, budget = self._slab_budget(p, machine)
        parts = dw_row_parts(p, rows, workers) if p.direction == "bwd_w" else 1
        slab = max(config.GEMM_MIN_ROWS, budget * parts // row_bytes)
        n = -(-rows // slab)
        n = -(-n // (workers // parts)) * (workers // parts)
        tiles = {"slab_rows": int(max(1, min(rows, -(-rows // n)))), "workers": workers,
                 **engine_tiles}
        if parts > 1:
            tiles["col_parts"] = parts
        return tiles


def dw_row_parts(p, rows, workers):
    """Blocks of dW's rows (input channels) that a packed weight gradient's tasks split,
    besides runs of its reduction: one while every worker can take a run of at least
    ``config.GEMM_MIN_ROWS`` rows. Beyond that (many workers, few pixels) splitting the
    reduction further would give each worker a dW-sized partial of a short GEMM, and the
    partials' sum grows with the workers (16 workers over ResNet-50's res4a_branch2b: 16
    partials of 2.4 MB from 98 rows each); instead the runs are the largest divisor of
    ``workers`` that leaves each at least that many rows, and the blocks take the rest
    (at least 8 channels each), so that runs x blocks tasks keep every worker busy."""
    if workers < 2 or rows // workers >= config.GEMM_MIN_ROWS:
        return 1
    most_runs = max(1, rows // config.GEMM_MIN_ROWS)
    nruns = max(d for d in range(1, workers + 1) if workers % d == 0 and d <= most_runs)
    return max(1, min(workers // nruns, p.icg // 8))


#: Best first (see the module's docstring).
STRATEGIES = (GemmSplitK(), GemmClaimed(), GemmIdentity(), GemmPerTap(), GemmSplitDw(),
              GemmSlabs())
