"""The Winograd strategy: F(2x2,3x3) and F(4x4,3x3) as batched GEMMs in the transformed domain.

Lavin and Gray (2016), "Fast Algorithms for Convolutional Neural Networks". With the
F(m, 3) matrices ``B^T`` (alpha x alpha), ``G`` (alpha x 3) and ``A^T`` (m x alpha),
``alpha = m + 2``, a 3x3 stride-1 convolution is, per ``m x m`` output tile ``t``::

    Y_t = A^T [ sum_c (G g_ck G^T) * (B^T d_tc B) ] A

so that for each of the alpha^2 transformed positions ``xi`` one GEMM does the channel sum:
``M[xi] = V[xi] @ U[xi]`` with ``V[xi]`` = [tiles, C] (transformed input tiles) and
``U[xi]`` = [C, K] (transformed filters). ``numpy.matmul`` runs the alpha^2 GEMMs of a
``[alpha^2, T, C] x [alpha^2, C, K]`` stack; the tile transforms are the loop nests of
:mod:`numbaconv.kernels.cpu.winograd` (channels innermost).

The three directions, all at stride 1 and dilation 1 (depth kernel 1: depth joins the batch):

* forward: input tiles at origins ``m*t - pad_begin``, output tiles clipped to ``osz``.
* backward data is the forward convolution of ``dy`` with the spatially flipped, transposed
  filter ``w'[r, s, k, c] = w[2-r, 2-s, c, k]`` (JAX's and oneDNN's derivation): since
  ``dx[i] = sum_r dy[i + pad_begin - r] w[r] = sum_r' dy[i + (pad_begin - 2) + r'] w'[r']``,
  the ``dy`` tiles start at ``m*t + pad_begin - 2`` and the output grid is ``dx``'s own size
  (at stride 1 it is exact: ``isz = osz + 2 - pad_begin - pad_end``, nothing is floored);
  reads outside ``dy`` are zero, which covers pads of any size on either side.
* backward weights is F(3x3, m x m), the same bilinear algorithm transposed: from
  ``dw[r] = sum_o x[o + r - pad_begin] dy[o]`` and ``y = A^T[(G g) . (B^T d)]`` one gets
  ``dw = G^T [ sum_tiles (A dy_t A^T) . (B^T x_t B) ]`` G, with ``m x m`` tiles of ``dy``
  (zero beyond ``osz``) and ``alpha x alpha`` tiles of ``x`` at ``m*t - pad_begin``: the GEMM
  per position is ``V[xi]^T @ D[xi]`` = [C, T] x [T, K], the tile index as its reduction.

Weight gradients with groups (at least ``MIN_CHANNELS`` in and out per group): the tile
transforms run over all channels at once, each position's GEMM per group (``[C/g, T] x
[T, K/g]``, views of the transformed tiles), and the product ``[alpha^2, g, C/g, K/g]`` is
transformed back and laid out as XIO. Where gemm[patch-t] takes the layer its register
tiles are faster (AlexNet's conv5, 2 groups of 192 -> 128); where it declines, this entry
beats the im2col GEMMs (conv4, 192 -> 192; measured: docs/performance.md, "The zoo").
Forward and backward data keep one group: per group they ran slower than the implicit
GEMM.
The tiles are processed in blocks of about ``TILE_ROWS``, each a worker task (see
:mod:`numbaconv.workers`): transform the block (serial Numba loop nests), one batched
``matmul`` for it on a one-thread BLAS, inverse-transform it, so the transformed block stays
in the worker's cache and every core transforms. The block count is a multiple of the
workers. Transforms on the calling thread between multithreaded matmuls would leave one
core idle through them; as worker tasks they take about 30% off res2a_branch2b's passes
(docs/performance.md, "Numbers behind the constants", ``TILE_ROWS``).
Transforms are computed and stored in the compute dtype (float32
for float16 inputs), never in float16 (stored in float16, the F(4x4) error grows to
1e-3): float16 images are widened tile by tile as they are transformed, and
float16 results rounded tile by tile as they are written (no whole-array passes).
Measured against the float64 reference on ResNet-50's 3x3 layers, batch 8: F(4x4)
float32 <= 2.7e-6, float64 <= 4.3e-15; F(2x2) float32 <= 1.5e-7.

IEEE specials: the transforms add and subtract inputs, so an Inf in ``x``, ``dy`` or ``w``
may come out as NaN where a direct sum would give Inf (``Inf - Inf``); NaN propagates.
"""
import numpy as np

from . import Strategy, itemsize, result_dtype
from ._gemm_common import Buffers, run_tasks, sum_partials, task_workers
from .. import memory

#: Fewest input and output channels: below them the GEMMs are too thin for BLAS and the
#: transforms cost more than the multiplies they save (measured: docs/performance.md,
#: Numbers behind the constants).
MIN_CHANNELS = 64
#: Fewest tiles per channel of the wider side, in every direction: with fewer, the
#: transformed filters (or, for the weight gradient, the transformed product ``alpha^2*C*K``
#: it accumulates over every tile and transforms back) outweigh the GEMMs (measured:
#: docs/performance.md, Numbers behind the constants).
MIN_TILES_PER_CHANNEL = 1 / 2
#: Smallest tile grid side (output positions; dx positions for backward data) worth tiling.
MIN_IMAGE = 4
#: Tile sides offered; ``tiles`` chooses per shape (see ``choose_m``).
TILE_SIZES = (2, 4)
#: Channel block of the transform loop nests. Their cost is mostly per channel loop (alias
#: checks, loop set-up), so long blocks pay (measured: docs/performance.md, Numbers behind
#: the constants); 256 keeps a tile's scratch (2 x 36 x 256 floats) in L2.
CHANNEL_BLOCK = 256
#: Tiles per block (about; the blocks are equal): each block is transformed, multiplied and
#: transformed back before the next, so that its transformed tiles stay in cache between the
#: transforms and the GEMMs (measured: docs/performance.md, Numbers behind the constants).
#: 0: the whole problem in one block.
TILE_ROWS = 256
#: Backward weights with fewer tiles than this per worker split the work by position
#: instead of by tiles (``tiles["split"] = "positions"``): every block's tiles transformed
#: into one array per operand, then each task one position's product (a block of its C
#: rows) over all the tiles, and each task a block of C rows of the output transform. By
#: tiles, every worker would write an ``alpha^2 x C x K`` partial from a few tiles and the
#: partials' sum would grow with the workers (16 workers over ResNet-50's res3b_branch2b:
#: 16 partials of 2.4 MB, 25 tiles each).
POSITIONS_BELOW_TILES = 64
#: From ``MANY_THREADS`` threads on, backward data with fewer than
#: ``BWD_D_TILES_PER_THREAD`` tiles per thread is left to the GEMM entries: on the 16-core
#: host gemm[implicit] ran ResNet-50's res4b_branch2b (8 tiles per thread) 3.3x and
#: YOLOv3's res4_3x3 (42) 1.7x as fast as this entry's workers (docs/performance.md, "Many
#: cores"); with 98 per thread (res2's 56x56) it was not timed both ways, so it is kept.
MANY_THREADS = 16
BWD_D_TILES_PER_THREAD = 64

R_DEPTH = "kernel depth {kd} != 1"
R_DEPTH_GEOMETRY = "depth stride, dilation or padding (depth joins the batch only without)"
R_KERNEL = "kernel {kh}x{kw}, not 3x3"
R_STRIDE = "stride {s} != 1"
R_DILATION = "dilation {d} != 1"
R_GROUPS = "{g} groups (forward and backward data: only groups == 1)"
R_GROUPED_PATCH_T = ("{g} groups of {c} -> {k} channels that gemm[patch-t] takes: its "
                     "grouped register tiles are faster")
R_CHANNELS = "{ic}->{oc} channels (< {least}): transforms cost more than they save"
R_SMALL = "image {h}x{w} smaller than {least}x{least}: too few tiles"
R_FEW_TILES = "{t} tiles for {c} channels: the transformed filters outweigh the GEMMs"
R_MANY_THREADS = ("backward data, {t} tiles on {n} threads (< %d each): the GEMM entries "
                  "scale further" % BWD_D_TILES_PER_THREAD)

# Lavin's F(2,3) and F(4,3) (points 0, +-1, +-2 and infinity), as exact rationals.
_MATRICES = {
    2: dict(
        BT=[[1, 0, -1, 0],
            [0, 1, 1, 0],
            [0, -1, 1, 0],
            [0, 1, 0, -1]],
        G=[[1, 0, 0],
           [1 / 2, 1 / 2, 1 / 2],
           [1 / 2, -1 / 2, 1 / 2],
           [0, 0, 1]],
        AT=[[1, 1, 1, 0],
            [0, 1, -1, -1]]),
    4: dict(
        BT=[[4, 0, -5, 0, 1, 0],
            [0, -4, -4, 1, 1, 0],
            [0, 4, -4, -1, 1, 0],
            [0, -2, -1, 2, 1, 0],
            [0, 2, -1, -2, 1, 0],
            [0, 4, 0, -5, 0, 1]],
        G=[[1 / 4, 0, 0],
           [-1 / 6, -1 / 6, -1 / 6],
           [-1 / 6, 1 / 6, -1 / 6],
           [1 / 24, 1 / 12, 1 / 6],
           [1 / 24, -1 / 12, 1 / 6],
           [0, 0, 1]],
        AT=[[1, 1, 1, 1, 1, 0],
            [0, 1, -1, 2, -2, 0],
            [0, 1, 1, 4, 4, 0],
            [0, 1, -1, 8, -8, 1]]),
}


def matrices(m, dtype="float64"):
    """``(BT, G, AT)`` of F(m, 3) as C-contiguous arrays of ``dtype``."""
    d = _MATRICES[m]
    return tuple(np.array(d[k], np.float64).astype(dtype) for k in ("BT", "G", "AT"))


def grid(p):
    """The spatial size tiled: the output's, or dx's for backward data (h, w)."""
    return tuple(p.isz[1:]) if p.direction == "bwd_d" else tuple(p.osz[1:])


def n_tiles(p, m):
    h, w = grid(p)
    return p.mb * p.isz[0] * -(-h // m) * -(-w // m)


def choose_m(p):
    """The tile side: F(4x4) unless its tiles are few for the channels, else the fewest
    transformed-domain multiplies.

    The GEMM work is ``alpha^2 * tiles``; F(4x4) does fewer multiplies unless its tiles
    overhang the image much more than F(2x2)'s. But its transformed filters are
    ``36*C*K`` against ``16*C*K``: when the GEMMs have fewer rows (tiles) than half the
    channels, that traffic decides (measured, float32: ResNet-50 res4b 14x14x256 runs
    F(2x2) faster at batch 1 (49 vs 16 tiles) and ties at batch 8; res5b 7x7x512 runs
    F(2x2) faster at batch 8; res2a and res3b run F(4x4) 1.4-1.7x faster).
    """
    h, w = grid(p)
    sizes = [m for m in TILE_SIZES
             if m == min(TILE_SIZES) or 2 * n_tiles(p, m) >= max(p.ic, p.oc)]
    cost = {m: (m + 2) ** 2 * -(-h // m) * -(-w // m) for m in sizes}
    return min(sizes, key=lambda m: (cost[m], -m))


class Winograd(Strategy):
    name = "winograd"
    compile_heavy = True

    def accepts(self, p):
        if p.ksz[0] != 1:
            return R_DEPTH.format(kd=p.ksz[0])
        if p.stride[0] != 1 or p.dilation[0] != 1 or p.pad_begin[0] or p.pad_end[0]:
            return R_DEPTH_GEOMETRY
        if tuple(p.ksz[1:]) != (3, 3):
            return R_KERNEL.format(kh=p.ksz[1], kw=p.ksz[2])
        if any(s != 1 for s in p.stride):
            return R_STRIDE.format(s=max(p.stride))
        if any(d != 1 for d in p.dilation):
            return R_DILATION.format(d=max(p.dilation))
        if p.g != 1 and p.direction != "bwd_w":
            return R_GROUPS.format(g=p.g)
        if min(p.icg, p.ocg) < MIN_CHANNELS:  # a group's own GEMMs
            return R_CHANNELS.format(ic=p.icg, oc=p.ocg, least=MIN_CHANNELS)
        if p.g > 1:
            from .patcht import STRATEGY as PATCH_T
            if PATCH_T.accepts(p) is None:
                return R_GROUPED_PATCH_T.format(g=p.g, c=p.icg, k=p.ocg)
        h, w = grid(p)
        if min(h, w) < MIN_IMAGE:
            return R_SMALL.format(h=h, w=w, least=MIN_IMAGE)
        t = n_tiles(p, choose_m(p))
        if t < MIN_TILES_PER_CHANNEL * max(p.icg, p.ocg):
            return R_FEW_TILES.format(t=t, c=max(p.icg, p.ocg))
        if p.direction == "bwd_d":
            from .. import runtime
            n = runtime.threads()
            if n >= MANY_THREADS and t < BWD_D_TILES_PER_THREAD * n:
                return R_MANY_THREADS.format(t=t, n=n)
        return None

    def tiles(self, p, machine):
        from ..runtime import threads as _threads
        m = choose_m(p)
        T = n_tiles(p, m)
        workers = task_workers(p)
        nblocks = -(-T // TILE_ROWS) if TILE_ROWS else 1
        if workers > 1:  # whole rounds of blocks: the workers end together
            nblocks = -(-nblocks // workers) * workers
        rows = -(-T // nblocks)
        tiles = {"m": m, "tile_rows": rows, "threads": _threads(), "workers": workers}
        if p.direction == "bwd_w" and workers > 1 and T // workers < POSITIONS_BELOW_TILES:
            tiles["split"] = "positions"
        return tiles

    def workspace_bytes(self, p, tiles):
        """The transformed buffers: one block of tiles of each operand, and the transformed
        filters (forward, backward data) or the accumulated product (backward weights),
        with the intermediate of their 3x3 <-> alpha x alpha transform."""
        m, rows = tiles["m"], tiles["tile_rows"]
        alpha = m + 2
        ck = p.icg * p.oc  # the filters' (and the product's) elements: a block per group
        nw = min(int(tiles.get("workers", 1)), -(-n_tiles(p, m) // rows))
        n = nw * alpha * alpha * rows * (p.ic + p.oc) + alpha * alpha * ck + 3 * alpha * ck
        if p.direction == "bwd_w" and tiles.get("split") == "positions":
            # every tile of both operands transformed (and a row of slack each), and the
            # product; no partials
            T = n_tiles(p, m)
            return (alpha * alpha * T * (p.ic + p.oc) + T * (p.ic + p.oc)
                    + 2 * alpha * alpha * ck) * itemsize(p)
        if p.direction == "bwd_w":
            # a partial product per worker beyond the first, and one block's product each
            n += (nw - 1) * alpha * alpha * ck
            if rows < n_tiles(p, m):
                n += nw * alpha * alpha * ck
        return n * itemsize(p)

    def half_operands(self, p, tiles):
        """The tile transforms widen float16 images tile by tile into their float32 patch
        (``winograd.to_tiles``) and round each inverse-transformed tile into a float16
        result (``winograd.from_tiles``); the filters are the backend's (transformed once,
        in float32)."""
        return frozenset({"fwd": ("x", "result"), "bwd_d": ("dy", "result"),
                          "bwd_w": ("x", "dy")}[p.direction])

    # -- running ----------------------------------------------------------------------------
    def run(self, p, tiles, ops):
        """Blocks of tiles as worker tasks: each task transforms its block, multiplies it
        with a one-thread BLAS and transforms it back (backward weights: each task a fixed
        run of blocks, their products added to its own partial), so the serial transform
        loop nests run on every core."""
        from ..kernels.cpu import winograd as k
        from .. import blas
        from ..runtime import threads as _threads

        ct = np.dtype(p.compute_dtype)
        m = int(tiles["m"])
        alpha, a2 = m + 2, (m + 2) ** 2
        G = matrices(m, ct)[1]
        nb = p.mb * p.isz[0]                       # depth joins the batch (kd == 1)
        (H, W), (OH, OW) = p.isz[1:], p.osz[1:]
        C, K = p.ic, p.oc
        gh, gw = grid(p)
        th, tw = -(-gh // m), -(-gw // m)
        T = nb * th * tw
        rows = int(min(tiles["tile_rows"], T)) or T
        blocks = [(t0, min(T, t0 + rows)) for t0 in range(0, T, rows)]
        nw = max(1, min(int(tiles.get("workers", 1)), len(blocks)))
        # BLAS calls outside the tasks on one thread next to worker tasks: OpenBLAS's idle
        # threads spin after a call and would take a worker's core (res3b_branch2b: 7.8 ms
        # with the filter transform on two BLAS threads, 12.7 ms with the tasks after it)
        outside = 1 if nw > 1 else _threads()
        cb = np.int64(min(CHANNEL_BLOCK, max(C, K)))
        i64 = np.int64

        def fwd_tiles(src, kind, out, oh, ow, t0, t1):
            k.to_tiles(src, out, i64(m), i64(kind), i64(oh), i64(ow), i64(th), i64(tw), i64(t0),
                       i64(t1), cb)

        def inv_tiles(src, dst, t0, t1):
            k.from_tiles(src, dst, i64(m), i64(th), i64(tw), i64(t0), i64(t1), cb)

        if p.direction == "bwd_w":
            x = ops["x"].reshape(nb, H, W, C)
            dy = ops["dy"].reshape(nb, OH, OW, K)
            if tiles.get("split") == "positions":
                return self._bwd_w_positions(p, x, dy, fwd_tiles, blocks,
                                             int(tiles.get("workers", 1)), m, G, ct, T)
            vbuf, dbuf = Buffers(a2 * rows * C, ct), Buffers(a2 * rows * K, ct)
            # groups: the transforms run over all channels, each group's GEMM over its own
            # (the product [a2, g, C/g, K/g], block-diagonal in C x K)
            ng, Cg, Kg = p.g, p.icg, p.ocg
            # fixed ownership: the blocks in ``nw`` contiguous runs, one task per run adding
            # its blocks' products in order into its own partial, the partials added in
            # run order (the same bits whichever worker takes a task, and when)
            acc = {}
            prod = Buffers(a2 * Cg * K, ct)

            def bwd_w_task(run):
                def task(slot):
                    for t0, t1 in blocks[len(blocks) * run // nw:len(blocks) * (run + 1) // nw]:
                        nt = t1 - t0
                        V = vbuf[slot][: a2 * nt * C].reshape(a2, nt, C)
                        D = dbuf[slot][: a2 * nt * K].reshape(a2, nt, K)
                        fwd_tiles(x, 0, V, -p.pad_begin[1], -p.pad_begin[2], t0, t1)
                        fwd_tiles(dy, 1, D, 0, 0, t0, t1)
                        # the tile index is the GEMM's reduction: [C, tiles] x [tiles, K]
                        # per group (views: V^T's rows and D's columns split by group)
                        VT = V.transpose(0, 2, 1).reshape(a2, ng, Cg, nt)
                        Dg = D.reshape(a2, nt, ng, Kg).transpose(0, 2, 1, 3)
                        if run not in acc:  # from the pool, as every scratch array
                            acc[run] = np.matmul(VT, Dg,
                                                 out=memory.empty((a2, ng, Cg, Kg), ct))
                        else:
                            a = acc[run]
                            np.add(a, np.matmul(VT, Dg,
                                                out=prod[slot].reshape(a2, ng, Cg, Kg)),
                                   out=a)
                return task

            run_tasks([bwd_w_task(run) for run in range(nw)], nw)
            total = sum_partials([acc[run] for run in range(nw)], nw)
            # dw = G^T M G per (c, k)
            GT = np.ascontiguousarray(G.T)
            n = Cg * K
            with blas.threads(outside):
                t = np.matmul(GT, total.reshape(alpha, alpha * n),
                              out=memory.empty((3, alpha * n), ct)).reshape(3, alpha, n)
                dw = np.matmul(GT, t, out=memory.empty((3, 3, n), ct))
            return _group_columns(dw, ng, Cg, Kg)

        if p.direction == "fwd":
            src = ops["x"].reshape(nb, H, W, C)
            # float16 bits in, float16 bits out (see half_operands)
            dst = memory.empty((p.mb, *p.osz, K), result_dtype(src, ct))
            Gw = G
            off = (-p.pad_begin[1], -p.pad_begin[2])
            cin, cout = C, K
        else:
            src = ops["dy"].reshape(nb, OH, OW, K)
            dst = memory.empty((p.mb, *p.isz, C), result_dtype(src, ct))
            Gw = np.ascontiguousarray(G[:, ::-1])   # the flip r -> 2 - r folded into G
            off = (p.pad_begin[1] - 2, p.pad_begin[2] - 2)
            cin, cout = K, C
        # U[a, b] = Gw w Gw^T over (r, s), per (c, k)
        with blas.threads(outside):
            t = np.matmul(Gw, ops["w"].reshape(3, 3 * C * K)).reshape(alpha, 3, C * K)
            U = np.matmul(Gw, t).reshape(a2, C, K)
        if p.direction == "bwd_d":
            U = U.transpose(0, 2, 1)               # [a2, K, C]: a transposed BLAS operand
        dst4 = dst.reshape(nb, gh, gw, cout)
        vbuf, mbuf = Buffers(a2 * rows * cin, ct), Buffers(a2 * rows * cout, ct)

        def block_task(t0, t1):
            def task(slot):
                V = vbuf[slot][: a2 * (t1 - t0) * cin].reshape(a2, t1 - t0, cin)
                M = mbuf[slot][: a2 * (t1 - t0) * cout].reshape(a2, t1 - t0, cout)
                fwd_tiles(src, 0, V, off[0], off[1], t0, t1)
                np.matmul(V, U, out=M)
                inv_tiles(M, dst4, t0, t1)
            return task

        run_tasks([block_task(t0, t1) for t0, t1 in blocks], nw)
        return dst

    @staticmethod
    def _bwd_w_positions(p, x, dy, fwd_tiles, blocks, nw, m, G, ct, T):
        """Backward weights split by position (see ``POSITIONS_BELOW_TILES``): the blocks'
        tiles transformed into ``V [a2, T, C]`` and ``D [a2, T, K]`` (block ``b`` writes
        through a view that starts at its first tile; the slack past the end keeps the
        view inside the buffer), ``M[xi] = V[xi]^T D[xi]`` over all the tiles per position
        and block of C rows, then ``dw = G^T M G`` per block of C rows: every task writes
        its own part of one result, so no partials are summed."""
        C, K = p.ic, p.oc
        ng, Cg, Kg = p.g, p.icg, p.ocg
        alpha = m + 2
        a2 = alpha * alpha
        vflat = memory.empty(a2 * T * C + T * C, ct)
        dflat = memory.empty(a2 * T * K + T * K, ct)

        def transform_task(t0, t1):
            def task(slot):
                fwd_tiles(x, 0, vflat[t0 * C:t0 * C + a2 * T * C].reshape(a2, T, C),
                          -p.pad_begin[1], -p.pad_begin[2], t0, t1)
                fwd_tiles(dy, 1, dflat[t0 * K:t0 * K + a2 * T * K].reshape(a2, T, K),
                          0, 0, t0, t1)
            return task

        run_tasks([transform_task(t0, t1) for t0, t1 in blocks], nw)
        V = vflat[:a2 * T * C].reshape(a2, T, C)
        D = dflat[:a2 * T * K].reshape(a2, T, K)
        # the product per group: rows g*Cg .. of M are group g's [Cg, Kg] (with one group
        # the plain [C, K])
        M = memory.empty((a2, C, Kg), ct)
        # positions x groups x blocks of a group's C rows: at least two tasks per worker
        parts = max(1, min(Cg // 16, -(-2 * nw // (a2 * ng))))
        cuts = [Cg * i // parts for i in range(parts + 1)]

        def product_task(xi, g, c0, c1):
            def task(slot):
                r0 = g * Cg
                np.matmul(V[xi, :, r0 + c0:r0 + c1].T, D[xi, :, g * Kg:(g + 1) * Kg],
                          out=M[xi, r0 + c0:r0 + c1])
            return task

        run_tasks([product_task(xi, g, cuts[i], cuts[i + 1]) for xi in range(a2)
                   for g in range(ng) for i in range(parts)], nw)
        # dw[r, s, c, k] = sum_a,b G^T[r, a] M[a, b, c, k] G^T[s, b], per block of C rows
        GT = np.ascontiguousarray(G.T)
        M4 = M.reshape(alpha, alpha, C, Kg)
        dw = memory.empty((3, 3, C, Kg), ct)
        nblk = max(1, min(C // 8, 2 * nw))
        ccuts = [C * i // nblk for i in range(nblk + 1)]

        def inverse_task(c0, c1):
            def task(slot):
                t = np.tensordot(GT, M4[:, :, c0:c1], axes=(1, 0))      # [r, b, c, k]
                dw[:, :, c0:c1] = np.tensordot(t, GT, axes=(1, 1)).transpose(0, 3, 1, 2)
            return task

        run_tasks([inverse_task(ccuts[i], ccuts[i + 1]) for i in range(nblk)], nw)
        return _group_columns(dw, ng, Cg, Kg)


def _group_columns(dw, ng, Cg, Kg):
    """The weight gradient ``[1, 3, 3, Cg, g*Kg]`` (XIO, a group's outputs side by side)
    from one in group-major order, ``[3, 3, g*Cg*Kg]`` (group g's ``[Cg, Kg]`` block
    after group g-1's); with one group a view."""
    if ng == 1:
        return dw.reshape(1, 3, 3, Cg, Kg)
    out = memory.empty((1, 3, 3, Cg, ng * Kg), dw.dtype)
    out.reshape(3, 3, Cg, ng, Kg)[...] = dw.reshape(3, 3, ng, Cg, Kg).transpose(0, 1, 3, 2, 4)
    return out


STRATEGY = Winograd()
