"""What the GEMM variants share: the guards every GEMM takes, the engine choice (Numba
micro-kernel or BLAS), the 1x1 identity test, taps and stride phases, worker tasks and
their per-worker buffers, and the multiply of either engine.

Each GEMM variant (``strategies/gemm.py``, ``rowgemm.py``, ``igemm.py``, ``col2im.py``) and
Winograd's batched GEMMs import from here; no strategy imports another's internals.
"""
import functools
import itertools
import math

import numpy as np

from . import itemsize, small
from .. import config, memory, runtime

#: Below this many columns in a GEMM's result (per group), BLAS runs far from its peak and
#: the direct kernels win (measured: N=3 in ResNet's stem backward data).
MIN_N = 8
#: Grouped GEMMs are batched small GEMMs; below this many channels per group they lose.
MIN_GROUP_CHANNELS = 16

R_SMALL_N = "result has {n} column(s) per GEMM (< %d): BLAS far from peak" % MIN_N
R_GROUPS = "{g} groups of {icg}x{ocg} channels: batched small GEMMs (< %d per group)" % (
    MIN_GROUP_CHANNELS)


#: Result columns below ``MIN_N`` that a BLAS GEMM still serves (see :func:`narrow_blas`).
R_NARROW_ENGINE = ("result has {n} column(s) per GEMM (< %d): served on the BLAS engine "
                   "only (GEMM_ENGINE={cfg!r})" % MIN_N)


def narrow_blas(p):
    """Whether ``p``'s GEMM has fewer than ``MIN_N`` result columns and still runs best as a
    BLAS GEMM: forward convolutions with few output channels (a segmentation or depth head,
    the last layer of a super-resolution net: ``direct`` vectorises over those few
    channels, far slower than the im2col GEMM) and 1x1 backward data into few
    input channels on the arrays themselves (PointNet's first layer). At these widths the
    GEMM is bound by reading its operands, where BLAS streams; backward data with more
    taps has ``gemm[col2im]``, weight gradients ``direct[narrow]`` and ``gemm[patch-t]``.
    One group only. Measured in docs/performance.md, "Few result columns"."""
    if p.g != 1:
        return False
    return result_columns(p) < MIN_N and (
        p.direction == "fwd" or (p.direction == "bwd_d" and identity(p)))


def narrow_guard(p):
    """:func:`gemm_guard` for the entries that take :func:`narrow_blas` problems (on the
    BLAS engine)."""
    if narrow_blas(p):
        if config.GEMM_ENGINE == "numba":
            return R_NARROW_ENGINE.format(n=result_columns(p), cfg=config.GEMM_ENGINE)
        return None
    return gemm_guard(p)


def result_columns(p):
    """Columns of the result of ``p``'s GEMMs, per group: the channels the result has."""
    return p.icg if p.direction == "bwd_d" else p.ocg


def gemm_guard(p):
    """The reason every GEMM of ``p``'s direction declines it, or None: too few result
    columns, or groups too narrow for batched GEMMs."""
    n = result_columns(p)
    if n < MIN_N:
        return R_SMALL_N.format(n=n)
    if p.g > 1 and min(p.icg, p.ocg) < MIN_GROUP_CHANNELS and not _few_groups_w(p):
        return R_GROUPS.format(g=p.g, icg=p.icg, ocg=p.ocg)
    return None


#: Weight gradients of fewer groups than this (the grouped kernels' vectors of groups
#: would be at least half empty lanes) take per-group GEMMs down to
#: ``FEW_GROUPS_W_MIN_CHANNELS`` channels per group; from this many groups the grouped
#: kernels keep them (docs/performance.md, "Few groups of few channels").
FEW_GROUPS_W = 5
FEW_GROUPS_W_MIN_CHANNELS = 2


def _few_groups_w(p):
    return (p.direction == "bwd_w" and p.g < FEW_GROUPS_W
            and min(p.icg, p.ocg) >= FEW_GROUPS_W_MIN_CHANNELS)


def kernel_taps(p):
    return list(itertools.product(range(p.ksz[0]), range(p.ksz[1]), range(p.ksz[2])))


@functools.lru_cache(maxsize=512)
def stride_phases(p):
    """Backward-data stride phases: ``((q, grid, ((tap index, offsets), ...)), ...)``; made
    once per problem (a plan's every call asks for them)."""
    out = []
    for q in itertools.product(*(range(s) for s in p.stride)):
        grid = tuple(-(-(i - qa) // s) for i, qa, s in zip(p.isz, q, p.stride))
        taps = []
        for ti, t in enumerate(kernel_taps(p)):
            num = [qa + pb - ta * d for qa, pb, ta, d in zip(q, p.pad_begin, t, p.dilation)]
            if all(v % s == 0 for v, s in zip(num, p.stride)):
                taps.append((ti, tuple(v // s for v, s in zip(num, p.stride))))
        out.append((q, grid, tuple(taps)))
    return tuple(out)


def tap_runs(boff):
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


#: Reduction block of the Numba GEMM engine: an MR x KC tile of A stays in L1.
UK_KC = 256


#: "auto" picks the Numba engine for 1x1 backward data with at most this many output
#: channels (the GEMM's reduction), where OpenBLAS's packing of the tall dY outweighs a
#: short reduction, and for longer reductions where the workers claim row blocks of one
#: packed W^T that fits (``claims``). On AVX2 hosts (a 6 x 16 register tile instead of
#: 6 x 64) it keeps backward weights on BLAS, and the short reductions too where W^T
#: does not fit (``claims`` false: few pixels, many input channels), where OpenBLAS ran
#: 1.3-2.0x faster (measured: docs/performance.md, Numbers behind the constants).
UK_MAX_SHORT_K = 128


def claims(p, machine):
    """Whether 1x1 backward data on the Numba engine packs all of W^T once and lets the
    threads claim blocks of dY's rows (``ukernel.gemm_claimed_parallel``): at stride 1, when
    the packed W^T fits half of L2, where every row tile meets all of it."""
    if any(s != 1 for s in p.stride):  # dX's rows are every s-th pixel: not one stride
        return False
    return packed_wt_elems(p) * itemsize(p) <= machine.l2_bytes // 2


def packed_wt_elems(p):
    """Elements of 1x1 backward data's W^T as ``ukernel.pack_panels`` packs it: K output
    channels by the input channels padded to whole panels (one group's, packed one group
    at a time)."""
    from ..kernels.cpu import ukernel as uk
    nr = uk.panel(itemsize(p))
    return p.ocg * (-(-p.icg // nr) * nr)


def numba_engine_tiles(p, machine):
    """The Numba engine's tiles: reduction block ``kc`` and a column block ``nc`` whose
    ``kc x nc`` block of B fills half of one core's L2."""
    from ..kernels.cpu import ukernel as uk
    item, panel = itemsize(p), uk.panel(itemsize(p))
    nc = max(panel, machine.l2_bytes // 2 // (UK_KC * item) // panel * panel)
    return {"engine": "numba", "kc": UK_KC, "nc": int(nc)}


def split_m_engine(engine):
    """Whether a one-group backward weights split over dW's rows (a short reduction into
    a tall dW) runs as one Numba parallel region (``ukernel.gemm_split_m``) rather than
    as tasks on Python worker threads: on AVX-512 hosts unless the BLAS engine is forced.
    Measured (Zen 4, 2 threads, float32, same process, the GEMM alone): conv1d:19's
    2560x30 @ 30x512 0.39 ms (NumPy's BLAS 0.45, PyTorch's mm 0.43), conv1d_gemm:3's
    1536x152 @ 152x1024 2.13 ms (2.51, 2.39); the whole weight gradient on BLAS tasks took
    0.62 and 3.1 ms (PyTorch 0.45, 2.76)."""
    from ..kernels.cpu.ukernel import VECTOR_BYTES
    return engine == "numba" or (VECTOR_BYTES >= 64 and config.GEMM_ENGINE == "auto")


def choose_engine(p, machine):
    """The GEMM engine for a problem: ``config.GEMM_ENGINE``, "auto" as measured above."""
    e = config.GEMM_ENGINE
    if e in ("numba", "blas"):
        return e
    if small(p):  # the BLAS engine compiles in a second, the Numba engine in 5-10
        return "blas"
    if narrow_blas(p):  # a few result columns: BLAS streams the operands
        return "blas"
    from ..kernels.cpu.ukernel import VECTOR_BYTES
    if p.direction == "bwd_d" and (p.g == 1 or grouped_identity(p)) and math.prod(p.ksz) == 1:
        if claims(p, machine) or (p.ocg <= UK_MAX_SHORT_K and VECTOR_BYTES >= 64):
            return "numba"
    if VECTOR_BYTES >= 64 and p.direction == "bwd_w":
        # every weight gradient (1x1 at stride 1: split-K in one parallel region, per
        # group): faster than OpenBLAS on most of the suites' and the zoo's, short
        # reductions too; backward data and forward stay on BLAS there, but for the short
        # or claimed 1x1 backward data above (docs/performance.md, Numbers behind the
        # constants)
        return "numba"
    if p.direction == "bwd_w" and grouped_identity(p):
        # grouped 1x1 weight gradients at any vector width: one parallel region of per-group
        # split-K GEMMs beat each group's small BLAS GEMMs over im2col copies also with
        # 256-bit vectors, where dense 1x1 ones stay on BLAS (measured: docs/performance.md,
        # "CPU, AVX2 host")
        return "numba"
    return "blas"


def identity(p):
    """True when every GEMM operand is the channels-last array itself (no packing): 1x1,
    one group, no leading pad, and the GEMM grid equal to the source's spatial size
    (a trailing pad or a stride would add rows that read only padding)."""
    if p.g != 1 or math.prod(p.ksz) != 1 or any(p.pad_begin):
        return False
    if p.direction == "bwd_d":  # one live phase (q = 0), grid ceil(i/s) rows per axis
        return all(-(-i // s) == o for i, s, o in zip(p.isz, p.stride, p.osz))
    return all(s == 1 for s in p.stride) and p.osz == p.isz


def grouped_identity(p):
    """1x1 at stride 1 without pads over several groups: each group's GEMM operands are
    column slices of the channels-last arrays themselves (rows ``C`` or ``K`` apart)."""
    return (p.g > 1 and math.prod(p.ksz) == 1 and not any(p.pad_begin)
            and all(s == 1 for s in p.stride) and p.osz == p.isz)


def blas_threads():
    return runtime.threads()


def run_tasks(tasks, nw):
    """Run ``task(slot)`` for every task: on ``nw`` worker threads with a one-thread BLAS
    each, or on the calling thread with every BLAS thread."""
    from .. import blas, workers
    if nw > 1 and len(tasks) > 1:
        with blas.threads(1):
            workers.run(len(tasks), lambda t, slot: tasks[t](slot), nw)
    else:
        with blas.threads(blas_threads()):
            for t in tasks:
                t(0)


#: Partial results are summed on worker threads (:func:`sum_partials`) from this many
#: workers on, and only where they hold at least ``SUM_MIN_ELEMENTS`` elements each: on two
#: cores the pool's dispatch costs more than a second thread saves (docs/performance.md,
#: "Many cores").
SUM_MIN_WORKERS, SUM_MIN_ELEMENTS = 4, 1 << 16


def sum_partials(parts, nw):
    """``parts[0] + parts[1] + ...`` elementwise, added left to right into ``parts[0]``
    (returned): the same bits as adding them one after another on one thread. With ``nw``
    of at least ``SUM_MIN_WORKERS`` workers and large partials, the workers add contiguous
    element ranges (two per worker), each range's partials in order: summed on one thread,
    the partials of a weight gradient cost ``len(parts) - 1`` passes over ``|dW|`` at one
    core's bandwidth while the other cores wait. ``parts``: C-contiguous arrays of one
    shape."""
    total = parts[0]
    if len(parts) == 1:
        return total
    flat = [a.reshape(-1) for a in parts]
    if any(not np.shares_memory(f, a) for f, a in zip(flat, parts)):
        raise ValueError("sum_partials: the partials must be contiguous arrays")
    out = flat[0]
    n = out.size
    if nw < SUM_MIN_WORKERS or n < SUM_MIN_ELEMENTS:
        for f in flat[1:]:
            np.add(out, f, out=out)
        return total
    nchunks = min(2 * nw, -(-n // (SUM_MIN_ELEMENTS // 4)))
    step = -(-n // nchunks)

    def add(t, slot):
        o = out[t * step:(t + 1) * step]
        for f in flat[1:]:
            np.add(o, f[t * step:(t + 1) * step], out=o)

    from .. import workers
    workers.run(nchunks, add, nw)
    return total


#: Problems below this many FLOPs run on the calling thread alone: handing tasks to the
#: worker pool costs about 80 us, more than a second core saves on them (measured:
#: docs/performance.md, Numbers behind the constants).
SERIAL_MAX_FLOPS = 8_000_000


def task_workers(p):
    """Worker threads for ``p``'s tasks: one below ``SERIAL_MAX_FLOPS``."""
    return 1 if p.flops < SERIAL_MAX_FLOPS else blas_threads()


class Multiply:
    """``mm(a, b, out, slot, accumulate=False)``: ``out = a @ b`` (``out += a @ b``) with the
    plan's engine; returns ``out``. ``mm.numba`` says whether it is the Numba micro-kernel
    (any operand strides, in-place accumulation) or NumPy's BLAS (no accumulation)."""

    def __init__(self, tiles, ct, workers=1):
        self.workers = workers
        self.numba = tiles.get("engine") == "numba"
        if self.numba:
            from ..kernels.cpu import ukernel
            self.uk = ukernel
            self.kc, self.nc = int(tiles["kc"]), int(tiles["nc"])
            self.work = Buffers(ukernel.workspace(self.kc, ct.itemsize, self.nc), ct)

    def rows(self, a, b, out, rowmap, slot):
        """Row i of ``a @ b`` to ``out.flat[rowmap[i]:]`` (Numba engine only)."""
        return self.uk.matmul_rows(a, b, out, rowmap, False, self.kc, self.nc, self.work[slot])

    def __call__(self, a, b, out, slot, accumulate=False):
        if self.numba:
            return self.uk.matmul(a, b, out, accumulate, self.kc, self.nc, self.work[slot])
        assert not accumulate
        return np.matmul(a, b, out=out)


class Buffers:
    """One lazily allocated flat buffer of ``n`` elements per worker slot."""

    def __init__(self, n, dtype):
        self.n, self.dtype = n, dtype
        self.bufs = {}

    def __getitem__(self, slot):
        b = self.bufs.get(slot)
        if b is None:
            b = self.bufs[slot] = memory.empty(self.n, self.dtype)
        return b


# -- backward data by regions of the stride phases' grids (gemm[regions], gemm[grouped])

def group_problem(p):
    """``p`` itself with one group; else the problem of one of its groups (one group of
    ``icg`` input and ``ocg`` output channels, the rest equal)."""
    if p.g == 1:
        return p
    import dataclasses
    return dataclasses.replace(p, g=1, ic=p.icg, oc=p.ocg)


def region_boxes(p, grid, taps, exact):
    """A stride phase's grid cut into boxes (``gemm[regions]`` picks between the two kinds,
    ``igemm._regions``), exact or by whole rows: ``([(lo, hi, positions)], skipped)``;
    ``positions``: the indices into ``taps`` of the taps a box sums; ``skipped``: the
    fraction of the phase's multiply-adds the boxes skip, counted in whole row tiles.
    Exact: within each box every tap reaches inside dY for every pixel or for none."""
    from ..kernels.cpu import igemm
    MR = igemm.MR
    cuts = []
    for a in range(3):
        c = {0, grid[a]}
        if exact or a < 2:
            for _, b in taps:
                for v in (-b[a], p.osz[a] - b[a]):
                    if 0 < v < grid[a]:
                        c.add(v)
        c = sorted(c)
        cuts.append([(u, v) for u, v in zip(c, c[1:]) if v > u])
    out, kept = [], 0
    for box in itertools.product(*cuts):
        lo = tuple(u for u, _ in box)
        hi = tuple(v for _, v in box)
        pos = [i for i, (_, b) in enumerate(taps)
               if all(0 <= lo[a] + b[a] and hi[a] - 1 + b[a] < p.osz[a] for a in range(2))
               and (0 <= lo[2] + b[2] and hi[2] - 1 + b[2] < p.osz[2] if exact
                    else lo[2] + b[2] < p.osz[2] and hi[2] - 1 + b[2] >= 0)]
        out.append((lo, hi, pos))
        px = p.mb * math.prod(v - u for u, v in zip(lo, hi))
        kept += -(-px // MR) * len(pos)
    total = -(-p.mb * math.prod(grid) // MR) * len(taps)
    return out, (1 - kept / total) if total else 0.0


def tap_boxes(p, grid, taps):
    """A stride phase's grid as one box per tap, overlapping: ``([(lo, hi, positions)],
    skipped)`` as :func:`region_boxes` gives them, the first box the whole grid with no
    taps (it stores the zeros that the tap boxes then add to), each following one the
    pixels whose dY pixel for tap ``i`` lies inside, with ``positions`` ``[i]``. Every
    product a tile of these boxes does is with dY itself, in row tiles over the tap's
    whole box: where the partial tiles of small exact boxes waste most of what they skip
    (a 5x5x5 filter over 4x8x8), these lose only one partial tile per tap. The boxes
    overlap, so only a scheme that gives each thread its own columns of dX can run them
    (``gemm[regions]``' panels)."""
    from ..kernels.cpu import igemm
    MR = igemm.MR
    out = [((0, 0, 0), tuple(grid), [])]
    kept = 0
    for i, (_, b) in enumerate(taps):
        lo = tuple(max(0, -b[a]) for a in range(3))
        hi = tuple(min(grid[a], p.osz[a] - b[a]) for a in range(3))
        if any(v <= u for u, v in zip(lo, hi)):
            continue  # the tap reaches inside dY for no pixel of this phase
        out.append((lo, hi, [i]))
        kept += -(-p.mb * math.prod(v - u for u, v in zip(lo, hi)) // MR)
    total = -(-p.mb * math.prod(grid) // MR) * len(taps)
    return out, (1 - kept / total) if total else 0.0


def unpadded(p):
    """dY itself as the frame of :func:`region_tables`: no leading pads, its own extents."""
    return tuple((0, n) for n in p.osz)


def region_tables(p, q, frame, strides, regions, taps, width, block_tiles, nr):
    """The region kernels' tables for the boxes ``regions`` of phase ``q`` (as
    :func:`region_boxes` makes them): ``offs [tiles, 2, MR]`` (A and C row offsets, region
    after region; a region's last tile padded with its first row's A and C rows ``(r*MR +
    i) * width`` of the scratch), ``rtab [R, 4]`` (tiles and entries per region), ``pairs
    [E, 2]`` (a tap's A offset in ``frame``, the padded dY or dY itself, and its rows'
    element offset ``position * K * nr`` in a packed panel), ``epos [E]`` (the positions),
    ``items [I, 3]`` (``(region, t0, t1)`` blocks of about ``block_tiles`` tiles times taps
    of work) and the flat indices in ``offs`` of the padded C rows. Where the boxes are
    exact a region's taps reach inside dY for every one of its pixels, so its reads never
    need the padding. ``strides`` ``(K', C', k0, c0)``: the rows of ``frame`` and of dX
    hold ``K'`` and ``C'`` elements, the problem's channels from ``k0`` and ``c0`` on."""
    from ..kernels.cpu import igemm
    MR = igemm.MR
    (Ld, Dp), (Lh, Hp), (Lw, Wp) = frame
    ka, cs, k0, c0 = strides
    segs = [((b[0] * Hp + b[1]) * Wp + b[2]) * ka for _, b in taps]
    ID, IH, IW = p.isz
    K = p.oc
    offs, rtab, pairs, epos, items, padded = [], [], [], [], [], []
    t = 0
    for r, (lo, hi, pos) in enumerate(regions):
        n, jd, jh, jw = (v.ravel().astype(np.int64) for v in np.meshgrid(
            np.arange(p.mb), *(np.arange(u, v) for u, v in zip(lo, hi)), indexing="ij"))
        a = (((n * Dp + jd + Ld) * Hp + jh + Lh) * Wp + jw + Lw) * ka + k0
        c = (((n * ID + q[0] + p.stride[0] * jd) * IH + q[1] + p.stride[1] * jh) * IW
             + q[2] + p.stride[2] * jw) * cs + c0
        nt = -(-len(a) // MR)
        pad = nt * MR - len(a)
        if pad:
            a = np.concatenate([a, np.full(pad, a[0], np.int64)])
            c = np.concatenate([c, (r * MR + np.arange(MR - pad, MR)) * width])
            # (flat indices in offs of the padded C rows)
            padded += [((t + nt - 1) * 2 + 1) * MR + i for i in range(MR - pad, MR)]
        offs.append(np.stack([a.reshape(nt, MR), c.reshape(nt, MR)], axis=1))
        rtab.append((t, t + nt, len(pairs), len(pos)))
        pairs += [(int(segs[i]), i * K * nr) for i in pos]
        epos += list(pos)
        # blocks of about equal work (block_tiles tiles of taps), so that the parallel
        # loop's equal shares of items are equal shares of the work
        step = max(1, block_tiles // max(1, len(pos)))
        for t0 in range(t, t + nt, step):
            items.append((r, t0, min(t + nt, t0 + step)))
        t += nt
    return (np.ascontiguousarray(np.concatenate(offs), np.int64),
            np.array(rtab, np.int64).reshape(-1, 4), np.array(pairs, np.int64).reshape(-1, 2),
            np.array(epos, np.int64), np.array(items, np.int64).reshape(-1, 3),
            np.array(padded, np.int64))
