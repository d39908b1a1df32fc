"""``gemm[bf16-regions]``: bfloat16 backward data summed tap by tap straight from dY, on
AVX512_BF16's dot products, region by region (no im2col).

Each stride phase of dX (its pixels ``q + s*j``) is cut into regions within which every
tap reaches inside dY for every pixel or for none (:func:`region_boxes`, exact), and a
register tile of a region's pixels sums only the region's taps, reading each tap's pairs
of dY channels where they lie (:mod:`numbaconv.kernels.cpu.bf16regions`). Against
``gemm[bf16-dot]``, which builds an im2col matrix of dY and multiplies it in one GEMM,
the matrix's trip through memory (``taps`` times dY's bytes, written then read) and the
products with the padding that its border rows hold are gone: ResNet-50's 3x3 layers
(docs/performance.md, "bfloat16"). One group, an even number of dY channels (pairs are
32-bit words of dY).
"""
import functools
import math

import numpy as np

from . import Strategy, canonical_shapes
from ._gemm_common import identity, region_boxes, region_tables, stride_phases, unpadded
from .bf16dot import MIN_DATA_CHANNELS, R_NARROW_D, _bits, _packed_filter_t, dot_guards
from .. import memory
from ..machine import machine

#: Row tiles times taps of work per parallel item (as ``gemm[regions]``'s blocks): the
#: item's dY rows stay in L2 across the channel panels.
BLOCK_TILES = 16
#: Most bytes of one channel panel of a phase's packed filter (``taps * K/2 * 64`` words),
#: as a fraction of L2: every tile reads all of it, from L2 while the thread's run of
#: iterations stays on that panel; larger filters run as ``gemm[bf16-dot]``, whose GEMM
#: blocks the reduction. ResNet-50's largest (res5b_branch2b, 576 KiB) ran 4.17 ms here
#: against 5.60 there (docs/performance.md, "bfloat16").
PANEL_L2_FRACTION = 1.0

R_DIRECTION = "the regions variant is backward data only"
R_ODD = "{k} dY channels (odd): the kernel reads pairs of channels as 32-bit words"
R_IDENTITY = ("1x1 at stride 1 without pads: gemm[bf16-dot] multiplies dY itself into dX "
              "itself, with no im2col either")
R_PANEL = ("{kb:.0f} KiB of packed filter per 64-channel panel (> {most:.0f} KiB of L2): "
           "every tile would read it from beyond L2; gemm[bf16-dot] blocks the reduction")


@functools.lru_cache(maxsize=256)
def _phases(p):
    """Per stride phase with pixels: ``(q, grid, taps, boxes)``, ``boxes`` its exact
    regions (:func:`region_boxes`: along every axis each tap reaches inside dY for all of
    a box's pixels or for none of them; ``[]`` for a phase no tap reaches)."""
    out = []
    for q, grid, taps in stride_phases(p):
        if p.mb * math.prod(grid) == 0:
            continue
        out.append((q, grid, taps, region_boxes(p, grid, taps, True)[0] if taps else []))
    return out


#: The tables of recent problems (Python work, tens of microseconds per region; a layer's
#: calls share them), by (problem, threads).
_TABLES = {}


def _tables(p, threads):
    key = (p, threads)
    got = _TABLES.get(key)
    if got is None:
        from ..kernels.cpu import bf16regions as k
        npan = -(-p.ic // k.NR)
        got = []
        for q, grid, taps, boxes in _phases(p):
            if not taps:
                got.append((q, grid, None))
                continue
            total = -(-p.mb * math.prod(grid) // k.MR) * len(taps)
            share = max(1, min(BLOCK_TILES * len(taps), total // (4 * threads)))
            offs, rtab, pairs, _, items, padded = region_tables(
                p, q, unpadded(p), (p.oc, p.ic, 0, 0), boxes, taps, npan * k.NR, share, k.NR)
            offs[:, 0, :] //= 2  # dY's element offsets as word offsets (K even)
            pairs = pairs // 2   # both: A's words, B's words (panels of K/2 x NR words)
            idx = np.array([t for t, _ in taps], np.int64)
            got.append((q, grid, (offs, rtab, pairs, items, padded, idx)))
        if len(_TABLES) >= 256:
            _TABLES.clear()
        _TABLES[key] = got
    return got


class Bf16Regions(Strategy):
    name = "gemm"
    variant = "bf16-regions"
    compile_heavy = True
    directions = ("bwd_d",)

    def accepts(self, p):
        if p.direction != "bwd_d":
            return R_DIRECTION
        why = dot_guards(p)
        if why is not None:
            return why
        if p.ic < MIN_DATA_CHANNELS:
            return R_NARROW_D.format(c=p.ic)
        if p.oc % 2:
            return R_ODD.format(k=p.oc)
        if identity(p) and all(v == 1 for v in p.stride):
            return R_IDENTITY
        phases = _phases(p)
        panel = max([len(t) for _, _, t, _ in phases] + [0]) * p.oc // 2 * 64 * 4
        if panel > PANEL_L2_FRACTION * machine().l2_bytes:
            return R_PANEL.format(kb=panel / 1024,
                                  most=PANEL_L2_FRACTION * machine().l2_bytes / 1024)
        return None

    def tiles(self, p, machine):
        from ..runtime import threads
        return {"block_tiles": BLOCK_TILES, "threads": max(1, threads())}

    def bf16_operands(self, p, tiles):
        return frozenset({"dy", "w"})

    def numba_parallel(self, p, tiles):
        return True

    def workspace_bytes(self, p, tiles):
        from ..kernels.cpu import bf16regions as k
        npan = -(-p.ic // k.NR)
        phases = _phases(p)
        ntaps = max([len(t) for _, _, t, _ in phases] + [0])
        regions = max([len(b or ()) for *_, b in phases] + [0])
        return npan * ntaps * (p.oc // 2) * k.NR * 4 + regions * k.MR * npan * k.NR * 2

    def run(self, p, tiles, ops):
        from ..kernels.cpu import bf16regions as k
        xs, _, _ = canonical_shapes(p)
        dy = np.ascontiguousarray(_bits(ops["dy"]))
        w3 = _bits(ops["w"]).reshape(-1, p.ic, p.oc)
        dx = memory.empty((p.mb, *p.isz, p.ic), np.uint16)
        npan = -(-p.ic // k.NR)
        dy32 = dy.reshape(-1).view(np.uint32)
        for q, grid, tab in _tables(p, int(tiles["threads"])):
            if tab is None:  # no tap reaches this phase
                dx[(slice(None), *(slice(qa, None, s) for qa, s in zip(q, p.stride)))] = 0
                continue
            offs, rtab, pairs, items, padded, idx = tab
            bp = _packed_filter_t(w3, idx).reshape(npan, len(idx), p.oc // 2, k.NR)
            scratch = np.empty(len(rtab) * k.MR * npan * k.NR, np.uint16)
            offs = offs.copy()  # the padded rows' dX offsets: into this call's scratch
            offs.reshape(-1)[padded] += (scratch.ctypes.data - dx.ctypes.data) // 2
            k.bwd_d_regions(dy32, bp, dx, offs, items, rtab, pairs, np.int64(p.ic))
        return dx.reshape(xs)


STRATEGY = Bf16Regions()
