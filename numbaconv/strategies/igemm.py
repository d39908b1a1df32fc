"""GEMM strategy, implicit variant: backward data as register tiles of ``dX`` summed over
the taps straight from a zero-padded ``dY`` (no im2col, one store of ``dX`` per chunk of
taps).

The GEMM strategy computes each stride phase of backward data as ``col_q(dY) @ W_q^T``:
it packs the im2col matrix ``col_q(dY)`` (``taps x K`` columns per phase pixel) slab by
slab, then multiplies in BLAS or the Numba GEMM engine. Here the packing is gone: with
``dY`` padded by zeros so that every tap of every phase pixel lands inside, tap ``t``'s
``K``-vector for a pixel is a constant offset from the pixel's own, so one register tile of
``MR`` pixels x ``NR`` channels sums every tap in registers (see
:mod:`numbaconv.kernels.cpu.igemm`). The only copies are the padded ``dY`` (an eighth to a
quarter of ``dX`` at stride 2) and the filter packed per phase into the micro-kernel's
panels.
"""
import functools
import math

import numpy as np

from . import Strategy, itemsize, result_dtype, streams
from ._gemm_common import (MIN_N, UK_MAX_SHORT_K, choose_engine, claims, grouped_identity,
                           group_problem, region_boxes, region_tables, tap_boxes,
                           unpadded, identity, stride_phases)
from .. import config, memory

#: Packed filter bytes per micro-kernel call (``taps * K * NR``): a chunk of taps stays in
#: L2 while every row tile of a block meets it.
CHUNK_BYTES = 256 * 1024
#: Row tiles (``MR`` pixels each) per parallel block: the block's ``dX`` tiles stay in
#: cache across the chunks of taps.
BLOCK_TILES = 16

R_DIRECTION = "the implicit variant is backward data only"
#: Most groups: each group runs as a problem of its own (AlexNet's two), one call of the
#: kernels per group and phase, past which the per-group calls outweigh it and
#: direct[grouped] takes over from 8 groups.
MAX_GROUPS = 4
R_GROUPS = "{g} groups (> %d)" % MAX_GROUPS
R_NARROW = "{c} input channels (< %d): too few GEMM columns" % MIN_N
R_SHORT = ("1x1 at stride 1 without pads over {k} output channels (<= %d): the GEMM "
           "on the arrays themselves (gemm[claimed] or gemm[identity]) stores dX once per "
           "tile too, with no copies" % UK_MAX_SHORT_K)
R_BLAS = "GEMM_ENGINE is 'blas' (the implicit variant runs on the Numba engine)"
#: Channel counts that are not whole vectors are stored through a masked last vector;
#: a 1x1 layer at stride 1 without pads keeps to the GEMMs on the arrays themselves
#: there, which ran as fast or faster (docs/performance.md, "Channels that are not whole
#: vectors").
R_PARTIAL = ("1x1 at stride 1 without pads over {c} input channels (not whole {vl}-lane "
             "vectors): the GEMM on the arrays themselves (gemm[claimed] or "
             "gemm[identity]) is as fast")
#: On hosts with 256-bit vectors a grouped 1x1 layer at stride 1 over fewer than this many
#: dY rows (batch x pixels) is left to gemm[claimed], whose threads claim (group, block of
#: rows) pairs from one counter, where it takes the layer: 2 threads, AVX2 host, 1568 rows
#: (ShuffleNet's stage3_gconv2 and three more shapes of 2-4 groups) 1.17-1.39x, 392 rows
#: 1.09x; at 6272 rows the two were even (0.93-1.18x; docs/performance.md, "CPU, AVX2
#: host"). Not measured with 512-bit vectors, whose claimed panels are 64 columns wide.
GROUPED_1X1_ROWS = 4096
R_GROUPED_1X1 = ("a grouped 1x1 layer over {rows} rows (< %d): gemm[claimed]'s threads "
                 "claim the groups' row blocks from one counter" % GROUPED_1X1_ROWS)


@functools.lru_cache(maxsize=512)
def _pads(p, phases):
    """Per axis ``(lead, extent)`` of the padded ``dY``: every phase pixel ``j`` and tap
    offset ``b`` reads ``dyp[j + b + lead]``, inside ``[0, extent)``; made once per
    problem."""
    out = []
    for a in range(3):
        used = [(grid[a], [off[a] for _, off in taps]) for _, grid, taps in phases
                if taps and grid[a] > 0]
        lead = max([0] + [-min(bs) for _, bs in used])
        top = max([p.osz[a]] + [j + max(bs) for j, bs in used])
        out.append((lead, lead + top))
    return tuple(out)


@functools.lru_cache(maxsize=512)
def _phase_arrays(p, pads, strides=None):
    """Per stride phase with pixels: ``(q, grid, taps, idx, segs, pg)``, the tap indices,
    their element offsets in the padded dY (and a 0) and the phase's geometry as the
    kernels take them; made once per problem (the kernels only read them). ``strides``
    ``(K', C', k0, c0)``: the rows of the padded dY and of dX hold ``K'`` and ``C'``
    elements, the problem's channels from ``k0`` and ``c0`` on (one group's of the whole
    arrays); default ``(K, C, 0, 0)``."""
    (Ld, Dp), (Lh, Hp), (Lw, Wp) = pads
    K = p.oc
    ka, cs, k0, c0 = strides or (K, p.ic, 0, 0)
    out = []
    for q, grid, taps in stride_phases(p):
        if p.mb * math.prod(grid) == 0:
            continue
        idx = np.array([t for t, _ in taps], np.int64)
        segs = np.array([((b[0] * Hp + b[1]) * Wp + b[2]) * ka for _, b in taps] + [0],
                        np.int64)
        pg = np.array([p.mb, *grid, Dp, Hp, Wp, K, Ld, Lh, Lw, *p.isz, p.ic, *q,
                       *p.stride, ka, cs, k0, c0], np.int64)
        out.append((q, grid, taps, idx, segs, pg))
    return tuple(out)


def _footprint(p):
    """Elements of dY, dX and the padded dY where there is one (see ``streams``)."""
    pads = _pads(p, stride_phases(p))
    dyp = (p.mb * math.prod(e for _, e in pads) * p.oc
           if any(lead for lead, _ in pads) or tuple(e for _, e in pads) != tuple(p.osz)
           else 0)
    return p.mb * (math.prod(p.isz) * p.ic + math.prod(p.osz) * p.oc) + dyp


#: ``gemm[regions]``: channels of dX that fill less than one register tile's width
#: (``NR``) are packed as B rows of their own width in whole vectors, not with zero
#: columns up to ``NR`` (a tap's filter rows then take a quarter of the cache lines at 16
#: channels). Both in one process, 2 threads, Zen 4, ms narrow / full:
#: googlenet:4a_5x5 0.38 / 0.48, yolov3:conv1 45.0 / 54.9, squeezenet:fire2_expand3x3
#: 2.23 / 2.47, wavenet:dilated_d1 2.03 / 2.28; 28 layers 0.98-1.26x, same bits. Not in
#: ``gemm[implicit]``: wavenet:skip_1x1 4.27 / 3.88, vnet:down1 14.9 / 14.6.
NARROW_PANEL = True


def _panel_nr(p, item, full=False):
    """The packed filter's panel width for ``p`` (one group's problem): ``NR``, or, where
    dX's channels fill less than one panel and not ``full`` (float16 and
    ``gemm[implicit]`` keep ``NR``), those channels in whole vectors."""
    from ..kernels.cpu import igemm
    nr = igemm.panel(item)
    if p.ic < nr and not full and NARROW_PANEL:
        vl = igemm.lanes(item)
        nr = -(-p.ic // vl) * vl
    return nr


#: Backward data runs over regions of each stride phase's grid, each summing only the
#: taps that reach inside dY (:func:`~numbaconv.kernels.cpu.igemm.bwd_d_regions`),
#: where that skips at least this fraction of the phase's multiply-adds, counted in whole
#: row tiles (each region's last tile is partial): dilated layers (DeepLab's ASPP at
#: dilation 18 over 33x33 reads padding in 60% of them), not small images with a 3x3
#: filter, whose many one-pixel regions leave their tiles mostly empty.
MIN_SKIPPED = 0.1


#: Per-tap boxes (:func:`~numbaconv.strategies._gemm_common.tap_boxes`) are taken where
#: they skip at least this much more of a phase's products than the better of the other
#: two kinds: each tile then adds to dX once per tap instead of once per chunk of taps,
#: and the grid's zeros are stored first.
TAP_BOXES_MARGIN = 0.05


@functools.lru_cache(maxsize=1024)
def _regions(p, grid, taps, panels=False):
    """The phase grid split into boxes, each with the taps it sums: ``([(lo, hi,
    positions)], skipped, kind)`` (``lo``/``hi``: per axis, of the phase grid;
    ``positions``: the indices into ``taps`` of the taps the box sums; ``skipped``: the
    fraction of the phase's multiply-adds the boxes skip, counted in whole row tiles of
    ``MR`` pixels, negative where their partial tiles cost more than that). ``kind``:

    * ``"exact"``: within each box every tap reaches inside dY for every pixel or for none
      (the boxes then read dY itself);
    * ``"rows"``: the boxes span whole rows along w, and a box sums the taps that reach
      inside along depth and height and for some of its pixels along w (reading the
      padded dY's zeros for the others): over small images the exact boxes are a pixel or
      two each and leave their row tiles mostly empty;
    * ``"taps"`` (only where the phase runs in parallel over channel panels, ``panels``:
      the boxes overlap): a box per tap over the pixels it reaches inside dY for, after
      a box of the whole grid that stores zeros; exact too. A 5x5x5 filter over 4x8x8
      (V-Net's last stage): exact 0.05 of the products skipped, rows 0.24, taps 0.49.

    The one that skips the most (per-tap boxes by ``TAP_BOXES_MARGIN`` more)."""
    exact = region_boxes(p, grid, taps, True)
    rows = region_boxes(p, grid, taps, False)
    best = (*exact, "exact") if exact[1] >= rows[1] else (*rows, "rows")
    if panels:
        per_tap = tap_boxes(p, grid, taps)
        if per_tap[1] >= best[1] + TAP_BOXES_MARGIN:
            return (*per_tap, "taps")
    return best


def _phase_panels(p, ntaps, threads, above):
    """Whether a phase of ``ntaps`` taps of ``p`` (one group's problem) runs in parallel
    over channel panels (:func:`_by_panels`, the kernels' panel width); ``above`` None:
    not considered."""
    if above is None:
        return False
    item = itemsize(p)
    nr = _panel_nr(p, item)
    npan = _panel_count(p.ic, nr, igemm_lanes(p), threads)
    return _by_panels(ntaps, p.oc, npan, nr, item, threads, above)


#: The panel-parallel mode may split a layer's channels into one panel more than full
#: register tiles take, so that the panels share out evenly over the threads, where each
#: panel keeps at least this many vectors (:func:`_panel_count`).
EVEN_PANELS_MIN_VECTORS = 3


def _panel_count(C, nr, vl, threads):
    """Panels of ``C`` channels for the panel-parallel mode (:func:`_by_panels`):
    ``ceil(C / nr)``, or one more where that makes a multiple of ``threads`` panels of one
    width, whole vectors, at least :data:`EVEN_PANELS_MIN_VECTORS` of them (their width:
    :func:`_panel_width`). Same process, 2 threads, Zen 4, ms even / before: 192 channels
    as four panels of 48 instead of row blocks that each read the whole packed filter
    from L3 (or three panels, one thread taking two): googlenet:5b_3x3 2.10 / 2.40,
    inception_v3:Mixed_7a_3x3_2 2.86 / 3.46, alexnet:conv4 and conv5 (192 channels a
    group) 7.52 / 8.77 and 5.05 / 5.88. Two panels of 2 vectors for 64 channels lost
    (i3d:Conv3d_2c_3x3 75.0 / 67.5, c3d:conv2a 102 / 95), and so did uneven panels (48
    channels as 32 + 16: alexnet:conv2 20.4 / 15.5, inception_v3:Mixed_5b_5x5_2 8.6 /
    6.5)."""
    npan = -(-C // nr)
    if npan % threads == 0 or (npan + 1) % threads:
        return npan
    width = _panel_width(C, nr, npan + 1, vl)
    if width * (npan + 1) == C and width >= EVEN_PANELS_MIN_VECTORS * vl:
        return npan + 1
    return npan


#: The region tables of recent problems, by (problem, phase, block tiles): building them
#: is Python work (tens of microseconds per region), a layer's calls share them.
_TABLES = {}


def _phase_regions(p, q, grid, taps, frame, strides, width, block_tiles, nr, threads,
                   panels):
    """The :func:`region_tables` of phase ``q`` and whether its regions overlap (per-tap
    boxes, ``panels`` only) where its regions skip at least ``MIN_SKIPPED`` of its
    products, else None; made once per problem and ``frame`` (the
    padded dY's ``pads``, or dY itself: ``(0, extent)`` per axis). The padded rows' C
    offsets are scratch rows counted from 0: the caller adds the scratch's offset from
    ``dx`` at the tables' last entry. ``strides``: see :func:`_phase_arrays`."""
    key = (p, q, frame, strides, block_tiles, nr, threads, panels)
    if key not in _TABLES:
        from ..kernels.cpu import igemm
        regions, skipped, kind = (_regions(p, grid, taps, panels) if taps
                                  else ([], 0.0, "exact"))
        tables = None
        in_place = frame == unpadded(p)  # dY itself: every phase by regions (exact)
        if (skipped >= MIN_SKIPPED or in_place) and (kind != "rows" or not in_place):
            total = -(-p.mb * math.prod(grid) // igemm.MR) * len(taps)
            work = round((1 - skipped) * total)  # the regions' tiles times taps
            # items of at most block_tiles full tiles' work, at least 4 per thread
            share = max(1, min(block_tiles * len(taps), work // (4 * threads)))
            tables = (region_tables(p, q, frame, strides, regions, taps, width, share, nr),
                      kind == "taps")
        if len(_TABLES) >= 256:
            _TABLES.clear()
        _TABLES[key] = tables
    return _TABLES[key]


@functools.lru_cache(maxsize=512)
def _reads_dy(p, threads=1, above=None):
    """Whether every stride phase of ``p`` with pixels can run by exact regions (see
    :func:`_regions`; per-tap boxes where the phase runs by panels, ``above`` not None:
    see :func:`_phase_panels`), whose tables then address dY itself (no zero-padded copy),
    however few products they skip."""
    for _, grid, taps in stride_phases(p):
        if p.mb * math.prod(grid) == 0:
            continue
        if not taps:
            return False
        panels = _phase_panels(p, len(taps), threads, above)
        if _regions(p, grid, taps, panels)[2] == "rows":
            return False
    return True


def _padded(pads, osz):
    """Whether the frame ``pads`` (:func:`_pads`) differs from dY's own extents ``osz``:
    ``gemm[implicit]`` then copies dY into it with zeros around."""
    return any(lead for lead, _ in pads) or tuple(e for _, e in pads) != tuple(osz)


def _needs_padding(p):
    """Whether ``gemm[implicit]`` copies dY into a zero-padded frame for ``p``."""
    return _padded(_pads(p, stride_phases(p)), p.osz)


def _blocks(pixels, block_tiles, threads):
    """Parallel blocks for a phase of ``pixels``: about ``block_tiles`` row tiles each, a
    whole number per thread where there are enough tiles."""
    from ..kernels.cpu import igemm
    ntiles = -(-pixels // igemm.MR)
    n = -(-ntiles // max(1, int(block_tiles)))
    n = -(-n // threads) * threads
    return max(1, min(n, ntiles))


def _by_panels(ntaps, K, npan, nr, item, threads, above):
    """Whether a phase runs in parallel over channel panels, each packing its own filter
    chunks (:func:`~numbaconv.kernels.cpu.igemm.bwd_d_phase_panels`), rather than over row
    blocks after one packing pass: when the phase's packed filter is larger than
    ``above`` bytes (half of L2: the row blocks would each read it from memory) and the
    panels share out evenly over the threads."""
    return npan % threads == 0 and ntaps * K * npan * nr * item > above


def igemm_lanes(p):
    """Lanes of the kernels' vectors for ``p``'s compute dtype."""
    from ..kernels.cpu import igemm
    return igemm.lanes(itemsize(p))


def _panel_width(C, nr, npan, vl):
    """Channels per panel of the panel-parallel mode: ``C`` shared as evenly as whole
    vectors of ``vl`` lanes allow over the same ``npan`` panels, rather than
    ``npan - 1`` full register tiles of ``nr`` and a remainder (80 channels over two
    threads: panels of 48 and 32 channels instead of 64 and 16; a thread's time goes with
    its panel's vectors)."""
    return min(nr, vl * -(-C // (npan * vl)))


class ImplicitGemm(Strategy):
    name = "gemm"
    variant = "implicit"
    compile_heavy = True
    directions = ("bwd_d",)
    #: Whether phases that skip enough products run region by region (gemm[regions]).
    regions = False

    def accepts(self, p):
        if p.direction != "bwd_d":
            return R_DIRECTION
        if p.g > MAX_GROUPS:
            return R_GROUPS.format(g=p.g)
        rows = p.mb * math.prod(p.osz)
        if rows < GROUPED_1X1_ROWS and grouped_identity(p):
            from ..machine import machine
            m = machine()
            if (m.vector_bytes < 64 and claims(p, m)
                    and choose_engine(p, m) == "numba"):
                return R_GROUPED_1X1.format(rows=rows)
        p = group_problem(p)  # with groups: each group's own problem
        if p.ic < MIN_N:
            return R_NARROW.format(c=p.ic)
        if identity(p) and p.ic % igemm_lanes(p):
            return R_PARTIAL.format(c=p.ic, vl=igemm_lanes(p))
        if identity(p) and p.oc <= UK_MAX_SHORT_K:
            return R_SHORT.format(k=p.oc)
        if config.GEMM_ENGINE == "blas":
            return R_BLAS
        return None

    def tiles(self, p, machine):
        from ..kernels.cpu import igemm
        from ..runtime import threads as _threads
        p = group_problem(p)
        nr = igemm.panel(itemsize(p))
        chunk = max(1, CHUNK_BYTES // (p.oc * nr * itemsize(p)))
        return {"chunk": int(chunk), "block_tiles": BLOCK_TILES,
                "panels_above": int(machine.l2_bytes // 2), "threads": _threads(),
                # dX streamed past the caches (row-block phases whose taps fit one chunk;
                # whole vectors only: a partial last vector is stored masked)
                "stream": (p.dtype != "float16" and p.ic % igemm_lanes(p) == 0
                           and streams(_footprint(p), p, machine))}

    def workspace_bytes(self, p, tiles):
        from ..kernels.cpu import igemm
        if p.g > 1:  # a group's problem on all channels of the padded dY, its filter
            q = group_problem(p)
            pads = _pads(q, stride_phases(q))
            return (self.workspace_bytes(q, tiles) + itemsize(p) * (
                p.mb * math.prod(e for _, e in pads) * (p.oc - q.oc)
                + math.prod(p.ksz) * q.ic * q.oc))
        item = itemsize(p)
        nr = igemm.panel(item)
        phases = stride_phases(p)
        pads = _pads(p, phases)
        dyp = p.mb * math.prod(e for _, e in pads) * p.oc
        npan = -(-p.ic // nr)
        packed = max(len(t) for _, _, t in phases) * p.oc * npan * nr
        threads = max(1, int(tiles.get("threads", 1)))
        blocks = max(_blocks(p.mb * math.prod(g), tiles["block_tiles"], threads)
                     for _, g, _ in phases)
        scratch = blocks * igemm.MR * npan * nr
        if np.dtype(p.dtype) == np.float16:  # float32 blocks per thread (see run)
            scratch = threads * max(int(tiles["block_tiles"]) * npan,
                                    max(-(-p.mb * math.prod(g) // igemm.MR)
                                        for _, g, _ in phases)) * igemm.MR * nr
        return (dyp + packed + scratch) * item

    def half_operands(self, p, tiles):
        """dY is widened as it is padded, and dX is rounded from float32 scratch that stays
        in cache: each thread's block of row tiles, or each channel panel's columns of every
        row, as it is finished. The filter is widened by the backend: widening it inside
        the packing's 16 x 16 transposes doubled their time (3 x 512 x 1024: 0.48 -> 1.04
        ms, against 0.06-0.1 ms for the backend's pass). With groups, float32 operands
        (the backend converts)."""
        return frozenset({"dy", "result"}) if p.g == 1 else frozenset()

    def run(self, p, tiles, ops):
        from ..kernels.cpu import igemm
        ct = np.dtype(p.compute_dtype)
        q = group_problem(p)  # with groups, each group's problem, run on the whole arrays
        pads = _pads(q, stride_phases(q))
        (Ld, Dp), (Lh, Hp), (Lw, Wp) = pads
        dy = ops["dy"]
        padded = _padded(pads, p.osz)
        half_out = dy.dtype == np.uint16
        frame = pads
        if (padded and self.regions and not half_out and dy.dtype == ct
                and _reads_dy(q, *_panel_args(tiles))):
            # every phase by exact regions, whose taps read inside dY only: no padded copy
            padded, frame = False, unpadded(p)
        if not padded and dy.dtype == ct:
            dyp = np.ascontiguousarray(dy)
        else:  # float16 bits are widened on the way
            dyp = memory.empty((p.mb, Dp, Hp, Wp, p.oc), ct)  # pad_dy writes all of it
            igemm.pad_dy(np.ascontiguousarray(dy), dyp, np.array([Ld, Lh, Lw], np.int64))
        w = np.ascontiguousarray(ops["w"], ct).reshape(math.prod(p.ksz), q.ic, p.oc)
        dx = memory.empty((p.mb, *p.isz, p.ic), result_dtype(dy, ct), offset=0)  # aligned
        for gi in range(p.g):
            # group gi: dY's channels from gi * K on, dX's from gi * C on (rows of the
            # whole arrays), its own filter
            wg = w if p.g == 1 else np.ascontiguousarray(w[..., gi * q.oc:(gi + 1) * q.oc])
            self._phases(q, tiles, dyp, frame, pads, wg, dx,
                         (p.oc, p.ic, gi * q.oc, gi * q.ic), half_out)
        return dx

    def _phases(self, p, tiles, dyp, frame, pads, w, dx, strides, half_out):
        """Every stride phase of one group's problem ``p``: ``dyp`` (padded as ``pads``
        says, or dY itself where ``frame`` is dY's own) and ``dx`` hold all groups'
        channels, ``strides`` ``(K', C', k0, c0)``: their rows' lengths and this group's
        first channels; ``w [T, C, K]``: this group's filter."""
        from ..kernels.cpu import igemm
        ct = np.dtype(p.compute_dtype)
        C, K = p.ic, p.oc
        nr = _panel_nr(p, ct.itemsize, half_out or not self.regions)
        npan = -(-C // nr)
        vl = igemm.lanes(ct.itemsize)
        threads = max(1, int(tiles.get("threads", 1)))
        chunk = np.int64(tiles["chunk"])
        bt = max(1, int(tiles["block_tiles"]))
        # the panel-parallel mode's panels (where a phase runs by panels): as even as whole
        # vectors allow
        ppan = npan if half_out else _panel_count(C, nr, vl, threads)
        nrp = _panel_width(C, nr, ppan, vl)
        for q, grid, taps, idx, segs, pg in _phase_arrays(p, pads, strides):
            P = p.mb * math.prod(grid)
            tables = None
            panels = _by_panels(len(taps), K, ppan, nr, ct.itemsize, threads,
                                int(tiles["panels_above"]))
            # a row of scratch (and of the padded rows' C offsets) spans every panel
            cols = max(npan * nr, ppan * nrp) if panels else npan * nr
            if self.regions and not half_out:
                # (the tables' filter offsets are in the panel's width)
                tables = _phase_regions(p, q, grid, taps, frame, strides, cols, bt,
                                        nrp if panels else nr, threads, panels)
            if tables is not None:
                # only the taps that reach inside dY, region by region
                (offs, rtab, pairs, epos, items, padded), overlap = tables
                work = memory.empty((len(rtab), igemm.MR * cols), ct, offset=0)
                offs = offs.copy()  # the padded rows' C offsets: into this call's scratch
                offs.reshape(-1)[padded] += (work.ctypes.data - dx.ctypes.data) // ct.itemsize
                if panels:
                    igemm.bwd_d_regions_panels(dyp, w, idx, dx, offs, rtab, pairs, epos, chunk,
                                               np.int64(nrp), work, overlap)
                else:
                    bp = np.empty((npan, len(taps), K, nr), ct)
                    igemm.pack_filter(w, idx, bp)
                    igemm.bwd_d_regions(dyp, bp, dx, offs, items, rtab, pairs, epos, chunk,
                                        np.int64(C), work)
                continue
            if panels:
                if half_out:  # per thread: one panel's columns of every row in float32
                    ntl = -(-P // igemm.MR)
                    work = np.empty((threads, ntl * igemm.MR * nr), ct)
                    igemm.bwd_d_phase_panels_half(dyp, w, idx, dx, segs, pg, chunk,
                                                  np.int64(nr), work)
                    continue
                work = np.empty((1, igemm.MR * ppan * nrp), ct)
                igemm.bwd_d_phase_panels(dyp, w, idx, dx, segs, pg, chunk, np.int64(nrp),
                                         work)
                continue
            bp = np.empty((npan, len(taps), K, nr), ct)
            if len(taps):
                igemm.pack_filter(w, idx, bp)
            if half_out:  # per thread: a block of float32 row tiles, rounded when done
                btiles = max(1, min(bt, -(-P // (igemm.MR * threads))))
                work = np.empty((threads, btiles * igemm.MR * npan * nr), ct)
                igemm.bwd_d_phase_half(dyp, bp, dx, segs, pg, chunk, np.int64(threads), work)
                continue
            nblocks = _blocks(P, bt, threads)
            work = memory.empty((nblocks, igemm.MR * npan * nr), ct, offset=0)
            igemm.bwd_d_phase(dyp, bp, dx, segs, pg, chunk, np.int64(nblocks), work,
                              bool(tiles.get("stream")))

    def numba_parallel(self, p, tiles):
        return True


R_NO_SKIP = ("every tap reaches inside dY for all but {skip:.0%} of the products "
             "(< {limit:.0%}, counted in whole row tiles), and {why}")
R_NO_COPY = "dY needs no zero-padded copy"
R_NOT_EXACT = "the regions do not cover dY exactly (dY would be copied with padding anyway)"
R_WIDENED = "{dtype}: dY is widened into a padded copy anyway"
R_HALF = "float16: the region kernels have no float16 path (gemm[implicit] has)"


def _skipped(p, threads=1, above=None):
    """The largest fraction of a stride phase's products that :func:`_regions` skips
    (``threads``, ``above``: see :func:`_phase_panels`)."""
    p = group_problem(p)
    return max([_regions(p, grid, taps, _phase_panels(p, len(taps), threads, above))[1]
                for _, grid, taps in stride_phases(p) if taps] or [0.0])


def _panel_args(tiles):
    """``(threads, above)`` of a plan's tiles, for :func:`_phase_panels`."""
    return max(1, int(tiles.get("threads", 1))), int(tiles["panels_above"])


class ImplicitRegions(ImplicitGemm):
    """``gemm[implicit]`` whose stride phases run over regions of their grid, each summing
    only the taps that reach inside dY for all of its pixels
    (:func:`~numbaconv.kernels.cpu.igemm.bwd_d_regions`): dilated layers, whose
    border pixels read the padding for some taps, and large filters over small images.
    The same micro-kernel, each tap's filter rows found through a table. Where every
    phase's regions are exact the tables address dY itself: no zero-padded copy of dY,
    which is why padded layers come here even when they skip few products (a 3x3 layer
    with pads of 1, WaveNet's causal rows; measured: docs/performance.md, "The zoo").
    Otherwise dY is copied with padding and a phase that skips less than
    ``MIN_SKIPPED`` of its products runs as in ``gemm[implicit]``."""

    variant = "regions"
    regions = True

    def accepts(self, p):
        why = super().accepts(p)
        if why is not None:
            return why
        if np.dtype(p.dtype) == np.float16:
            return R_HALF
        skip = _skipped(p)
        if skip < MIN_SKIPPED:
            # still worth it where it reads dY in place instead of a padded copy
            q = group_problem(p)
            if not _needs_padding(q):
                why = R_NO_COPY
            elif p.dtype != p.compute_dtype:
                why = R_WIDENED.format(dtype=p.dtype)
            elif not _reads_dy(q):
                why = R_NOT_EXACT
            else:
                return None
            return R_NO_SKIP.format(skip=max(0.0, skip), limit=MIN_SKIPPED, why=why)
        return None

    def tiles(self, p, machine):
        t = super().tiles(p, machine)
        t["skipped"] = round(_skipped(p, *_panel_args(t)), 2)
        return t

    def workspace_bytes(self, p, tiles):
        from ..kernels.cpu import igemm
        q = group_problem(p)
        nr = igemm.panel(itemsize(p))
        regions = max(len(_regions(q, grid, taps, panels)[0])
                      for _, grid, taps in stride_phases(q)
                      for panels in (False, "panels_above" in tiles
                                     and _phase_panels(q, len(taps), *_panel_args(tiles))))
        return (super().workspace_bytes(p, tiles)
                + regions * igemm.MR * -(-q.ic // nr) * nr * itemsize(p))


STRATEGY = ImplicitGemm()
REGIONS = ImplicitRegions()
