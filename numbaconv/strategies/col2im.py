"""GEMM strategy, col2im variant: backward data for few input channels and many taps.

The stride-phase GEMMs of :mod:`.gemm` have as many columns as the layer has input
channels; with 3 (ResNet's 7x7 stem) that GEMM runs far from peak and the GEMM strategy
declines. This variant multiplies the other way round and scatters after (Caffe's and
oneDNN's col2im): per block of output rows,

    col[rows, taps*C] = dY[rows, K] @ W^T[K, taps*C]        (147 columns for the stem)

and ``col2im_add`` adds every column into the input pixel its tap reads. Blocks hold a
few output rows of one image (their ``col`` fits in L2), so the full im2col matrix is
never built.

Parallelism without atomics or partial copies: a task owns whole images (several per GEMM
where their ``col`` fits: 1-D layers), or one band of input rows of one image (every image
whole when the batch alone keeps the workers busy), zeroes it, and computes every output
row whose window reaches the band, keeping only the contributions that land inside it.
Bands of one image recompute the few output rows their windows share; the result is the
same, in the same order of additions, whatever the bands.
"""
import math

import numpy as np

from . import Strategy, canonical_shapes, itemsize
from ._gemm_common import MIN_N, UK_KC, Buffers, Multiply, run_tasks, task_workers
from .. import config, memory

#: Fewest GEMM columns (taps * input channels) worth a GEMM.
MIN_COLUMNS = 16
#: Fewest output channels (the GEMM's reduction).
MIN_REDUCTION = 8

R_DIRECTION = "col2im is backward data only"
R_GROUPS = "grouped ({g} groups): the grouped and phase-GEMM strategies' case"
R_WIDE = "{icg} input channels per group (>= %d): the phase GEMMs apply" % MIN_N
R_NARROW = "taps x input channels = {n} (< %d): too few GEMM columns" % MIN_COLUMNS
R_SHORT = "{oc} output channels (< %d): too short a reduction" % MIN_REDUCTION


def _engine():
    """"auto" picks BLAS: measured on the stem (2 threads, float32, batch 8), OpenBLAS
    ran its 147-column GEMMs faster than the Numba micro-kernel."""
    e = config.GEMM_ENGINE
    return e if e in ("numba", "blas") else "blas"


def _oh_range(ih0, ih1, p):
    """Output rows whose windows reach input rows ``[ih0, ih1)``: ``[lo, hi)``."""
    s, d, pb, k = p.stride[1], p.dilation[1], p.pad_begin[1], p.ksz[1]
    # ih = oh*s - pb + kh*d  with  ih0 <= ih < ih1  for some kh in [0, k)
    lo = max(0, -(-(ih0 + pb - (k - 1) * d) // s))
    hi = min(p.osz[1], (ih1 - 1 + pb) // s + 1)
    return lo, max(lo, hi)


class Col2imGemm(Strategy):
    name = "gemm"
    variant = "col2im"
    directions = ("bwd_d",)

    def accepts(self, p):
        if p.direction != "bwd_d":
            return R_DIRECTION
        if p.g != 1:
            return R_GROUPS.format(g=p.g)
        if p.icg >= MIN_N:
            return R_WIDE.format(icg=p.icg)
        n = math.prod(p.ksz) * p.ic
        if n < MIN_COLUMNS:
            return R_NARROW.format(n=n)
        if p.oc < MIN_REDUCTION:
            return R_SHORT.format(oc=p.oc)
        return None

    def tiles(self, p, machine):
        """The blocks' size: the ``col`` of one block within the GEMM strategy's slab
        budget (twice one core's L2; the stem took 26-28 ms at 14 or 28 output rows per
        block, 30 ms at 7, 28-33 at 4): whole images per block where one fits (1-D
        layers: one GEMM over several images instead of a call per image), else output
        rows. Input row bands per image when the batch alone cannot keep every worker
        busy. Workers and engine."""
        item = itemsize(p)
        ncol = math.prod(p.ksz) * p.ic
        workers = task_workers(p)
        budget = config.GEMM_SLAB_BYTES or 2 * machine.l2_bytes
        image_bytes = math.prod(p.osz) * ncol * item
        t = {"workers": workers, "engine": _engine()}
        if image_bytes <= budget:
            # whole images, at least two blocks per worker where the batch allows
            t["images"] = int(max(1, min(budget // image_bytes, -(-p.mb // (2 * workers)))))
        else:
            row_bytes = max(1, p.osz[2] * ncol * item)
            t["block_rows"] = int(max(1, min(p.osz[1], budget // row_bytes)))
            t["bands"] = 1 if p.mb >= 2 * workers else int(
                max(1, min(p.isz[1], -(-2 * workers // p.mb))))
        if t["engine"] == "numba":
            from ..kernels.cpu import ukernel as uk
            panel = uk.panel(item)
            nc = max(panel, machine.l2_bytes // 2 // (UK_KC * item) // panel * panel)
            t.update(kc=UK_KC, nc=int(nc))
        return t

    def _block_rows(self, p, tiles):
        """GEMM rows of the largest block."""
        if "images" in tiles:
            return tiles["images"] * math.prod(p.osz)
        return tiles["block_rows"] * p.osz[2]

    def workspace_bytes(self, p, tiles):
        item = itemsize(p)
        ncol = math.prod(p.ksz) * p.ic
        ws = tiles["workers"] * self._block_rows(p, tiles) * ncol * item
        ws += ncol * p.oc * item  # W^T
        if np.dtype(p.dtype) == np.float16:  # dX in float32 beside the result, dY blocks
            ws += math.prod(p.x_shape) * item
            ws += tiles["workers"] * self._block_rows(p, tiles) * p.oc * item
        if tiles["engine"] == "numba":
            from ..kernels.cpu import ukernel as uk
            ws += tiles["workers"] * uk.workspace(tiles["kc"], item, tiles["nc"]) * item
        return ws

    def half_operands(self, p, tiles):
        """Each block widens its rows of dY into a per-worker float32 buffer before its
        GEMM, and each task rounds the dX rows it owns once they are complete (in cache)."""
        return frozenset({"dy", "result"})

    def run(self, p, tiles, ops):
        from ..kernels.cpu import col2im as k
        from ..kernels.cpu import convert

        ct = np.dtype(p.compute_dtype)
        xs = canonical_shapes(p)[0]
        ncol = math.prod(p.ksz) * p.ic
        # W^T: [K, taps*C], columns tap-major then channel, as col2im_add reads them
        WT = np.ascontiguousarray(ops["w"].reshape(ncol, p.oc).T)
        dy = ops["dy"]
        dx = memory.empty(xs, ct)
        # float16 bits in and out: dY widened block by block, dX rounded task by task
        half = dy.dtype == np.uint16
        dxh = memory.empty(xs, np.uint16) if half else None
        abuf = Buffers(self._block_rows(p, tiles) * p.oc if half else 0, ct)
        OD, OH, OW = p.osz
        H = p.isz[1]
        nw = int(tiles["workers"])
        mm = Multiply(tiles, ct, nw)
        cols = Buffers(self._block_rows(p, tiles) * ncol, ct)
        geom = [np.asarray(v, np.int64) for v in (p.ksz, p.stride, p.dilation, p.pad_begin)]
        i64 = np.int64

        def block(slot, n0, nn, od0, nd, oh0, nr, ih0, ih1):
            a = dy[n0:n0 + nn, od0:od0 + nd, oh0:oh0 + nr].reshape(-1, p.oc)
            if half:  # (whole images, or rows of one depth of one image: contiguous)
                h = abuf[slot][:a.size].reshape(a.shape)
                convert.convert(a.reshape(-1), h.reshape(-1), True)
                a = h
            col = cols[slot][:a.shape[0] * ncol].reshape(a.shape[0], ncol)
            mm(a, WT, col, slot)
            k.col2im_add(col, dx, i64(n0), i64(nn), i64(od0), i64(nd), i64(oh0), i64(nr),
                         i64(ih0), i64(ih1), *geom)

        def round_rows(n0, nn, ih0, ih1):
            """dX's rows [ih0, ih1) of images n0 .. n0 + nn, every depth, into dxh."""
            if ih0 == 0 and ih1 == H:  # whole images: one contiguous block
                convert.convert(dx[n0:n0 + nn].reshape(-1), dxh[n0:n0 + nn].reshape(-1),
                                False)
                return
            for n in range(n0, n0 + nn):
                for d in range(p.isz[0]):
                    convert.convert(dx[n, d, ih0:ih1].reshape(-1),
                                    dxh[n, d, ih0:ih1].reshape(-1), False)

        def images_task(n0, nn):
            def task(slot):
                k.zero_rows(dx, i64(n0), i64(nn), i64(0), i64(H))
                block(slot, n0, nn, 0, OD, 0, OH, 0, H)
                if half:
                    round_rows(n0, nn, 0, H)
            return task

        def band_task(n, ih0, ih1, R):
            lo, hi = _oh_range(ih0, ih1, p)

            def task(slot):
                k.zero_rows(dx, i64(n), i64(1), i64(ih0), i64(ih1))
                for od in range(OD):
                    for oh0 in range(lo, hi, R):
                        block(slot, n, 1, od, 1, oh0, min(R, hi - oh0), ih0, ih1)
                if half:
                    round_rows(n, 1, ih0, ih1)
            return task

        if "images" in tiles:
            ni = int(tiles["images"])
            tasks = [images_task(n0, min(ni, p.mb - n0)) for n0 in range(0, p.mb, ni)]
        else:
            step = -(-H // int(tiles["bands"]))
            tasks = [band_task(n, ih0, min(H, ih0 + step), int(tiles["block_rows"]))
                     for n in range(p.mb) for ih0 in range(0, H, step)]
        run_tasks(tasks, nw)
        return dxh if half else dx


STRATEGY = Col2imGemm()
