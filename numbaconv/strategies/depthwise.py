"""Direct strategy, depthwise variants: groups == channels, vectorised across channels.

One planner entry per loop nest, best first:

* ``direct[depthwise-rows]``: backward passes, 3x3 at column stride 1 or 2 and column
  dilation 1: the register-blocked row kernels (:mod:`numbaconv.kernels.cpu.depthwise_rows`);
* ``direct[depthwise-unrolled]``: forward 3x3, and backward data 3x3 at stride 1 over
  wide pixels: the nine-term kernels;
* ``direct[depthwise-spans]``: multiplier 1, any geometry (the forward pass on backward
  data's spans);
* ``direct[depthwise]``: every depthwise problem (any channel multiplier).
"""
import math

import numpy as np

from . import canonical_shapes, geo, itemsize, result_dtype, streams
from .. import memory
from .direct import Direct

R_NOT_DEPTHWISE = "not depthwise (groups {g} != channels {ic})"


def _unrolled_3x3(p):
    """The nine-term kernels apply: 3x3 (depth 1), multiplier 1, and for backward data
    stride 1 with no depth padding (every tap then reaches every input pixel)."""
    base = p.ksz == (1, 3, 3) and p.oc == p.ic
    if p.direction == "bwd_d":
        return base and p.stride == (1, 1, 1) and p.pad_begin[0] == 0
    return base


#: Backward data, 3x3 at stride 1: from this many bytes of channels per pixel on, the
#: nine-term per-pixel kernel (dX written once per pixel) beats the span kernel (one row tap
#: at a time, dX read back per row tap) (measured: docs/performance.md, Numbers behind the
#: constants).
UNROLLED_MIN_BYTES = 256


def _rows_3x3(p):
    """The register-blocked row kernels of :mod:`numbaconv.kernels.cpu.depthwise_rows`
    apply: backward passes, 3x3 (depth 1), multiplier 1, column stride 1 or 2, column
    dilation 1 (any row stride, row dilation and padding)."""
    return (p.direction in ("bwd_d", "bwd_w") and p.ksz == (1, 3, 3) and p.oc == p.ic
            and p.dilation[2] == 1 and p.stride[2] in (1, 2))


#: The row kernels prefetch each next row's operands into L2 when the operands they read (dY
#: for backward data, X and dY for backward weights) take at least this fraction of L3: they
#: then come from DRAM; smaller operands stay in L3 across calls and the prefetches only
#: cost issue slots (measured: docs/performance.md, Numbers behind the constants).
PREFETCH_L3_FRACTION = 1 / 3


def _prefetch(p, machine):
    read = (math.prod(p.osz) if p.direction == "bwd_d"
            else math.prod(p.osz) + math.prod(p.isz)) * p.mb * p.ic * itemsize(p)
    if p.dtype == "float16":
        read //= 2
    return read >= machine.l3_bytes * PREFETCH_L3_FRACTION


#: The row kernels align an operand that starts off a vector boundary (``row_head``: a
#: masked head of channels, so that the whole vectors after it are aligned; the plan's
#: ``align``) only where a pixel spans at least this many whole vectors: the head and the
#: rest are one masked pass each over the row. Backward data also only for a dX under
#: ``ALIGN_DX_L3_FRACTION`` of the L3: its pixels' first and last lines are then written by
#: two masked stores each, which cost more than split loads on a store-bound layer
#: (measured: docs/performance.md, Numbers behind the constants).
HEAD_MIN_VECTORS = 8
ALIGN_DX_L3_FRACTION = 0.25
#: The row kernels stream a large dX (non-temporal stores) only where one vector store fills
#: a cache line: a 32-byte store writes half a line, and the line's halves, one row kernel's
#: channel vector apart, reach memory as partial lines. With 256-bit vectors streaming made
#: backward data 1.1-1.6x slower (measured: docs/performance.md, "CPU, AVX2 host").
STREAM_MIN_VECTOR_BYTES = 64
#: Backward data at column stride 1 walks a row's channel vectors outermost (``order``
#: ``"channels"``: the nine filter vectors loaded once per row and vector, beside a block's
#: eight sums in registers) only with at least this many bytes per vector, where the 32
#: vector registers hold them; with 256-bit vectors (16 registers) the blocks of pixels are
#: outermost (``"blocks"``), as at stride 2: the channel-outer walk read each dY row from
#: beyond L1 once per channel vector, and spilled. AVX2 host, same process, ms channels /
#: blocks: xception:middle_dw 1.59 / 1.07, dw192_28_s1_p1 1.22 / 0.51 (18 layers
#: 0.96-2.38x; docs/performance.md, "CPU, AVX2 host").
CHANNELS_OUTER_MIN_VECTOR_BYTES = 64


def _wide(p, machine):
    """Whether a pixel spans ``HEAD_MIN_VECTORS`` whole vectors."""
    return p.ic * itemsize(p) >= HEAD_MIN_VECTORS * machine.vector_bytes


R_DIRECTION = "{d} is not one of this kernel's directions ({ds})"
R_MULTIPLIER = "channel multiplier {m} (the kernel needs 1)"
R_NOT_ROWS = ("kernel {k}, column stride {s}, column dilation {d}: the row kernels need "
              "3x3 with column stride 1 or 2 and column dilation 1")
R_NOT_UNROLLED = ("kernel {k}, stride {s}, depth pad {pd}: the nine-term kernels need 3x3 "
                  "(backward data also stride 1 and no depth padding)")
R_NARROW = ("{b} bytes of channels per pixel (< %d): the span kernel wins"
            % UNROLLED_MIN_BYTES)
#: The span kernels decline a layer where fewer than this fraction of the output columns
#: read no padding: every span is a border pixel of one tap table, and the general loop
#: nest runs 1.3-2.1x faster (ConvNeXt's 7x7 filters over 7x7 images, docs/performance.md,
#: "Depthwise"); at 3 of 7 columns (5x5 over 7x7) the two are even. Over padded rows
#: (below) there are no border pixels, and the spans take such layers (ConvNeXt's stage 4:
#: backward data 0.70 -> 0.43 ms, forward 0.81 -> 0.57 ms).
SPANS_MIN_INTERIOR = 0.3
R_BORDERS = ("{n} of {ow} output columns read no padding (< {f:.0%}): the spans would all "
             "be border pixels")
#: Backward data and the forward pass (at column stride 1) run over padded rows (the tile
#: ``padded``) from this many column taps: each dY (X) row a thread reads is copied once,
#: between zeros and in blocks of channels, so that every output pixel takes every tap of
#: its stride phase, a phase of a row is one span with no border pixels, and every load
#: is a constant offset from one pointer (see ``depthwise_spans._bwd_d_rows_pad``). Same
#: process, AVX2: backward data against the bordered spans 5x5 1.4-2.0x, 7x7 2.3-2.8x,
#: QuartzNet's 33-87 taps 2-3x, column stride 2 1.1-1.5x; forward against the faster of
#: the general loop nest and the bordered spans 1.4-2.0x. With 3 taps the copy costs more
#: than the borders (ConvTasNet's memory-bound 1-D layers: 2x slower)
#: (docs/performance.md, "Depthwise").
PADDED_MIN_TAPS = 5
#: The forward pass on spans: column stride 1 (a strided span reads its X pixels apart and
#: loses backward data's sliding blocks: 1.5-2x slower than the general loop nest) and,
#: without padded rows (fewer than PADDED_MIN_TAPS column taps), at most this many bytes
#: of channels per pixel (wider, the general loop nest keeps up) (measured:
#: docs/performance.md, Numbers behind the constants).
SPANS_FWD_MAX_BYTES = 1024
R_FWD_STRIDE = ("forward at column stride {s}: strided spans lose their sliding blocks; the "
                "general loop nest is faster")
R_FWD_WIDE = ("forward over {b} bytes of channels per pixel (> %d): the general loop nest "
              "keeps up" % SPANS_FWD_MAX_BYTES)


class DepthwiseDirect(Direct):
    """The general loop nests of :mod:`numbaconv.kernels.cpu.depthwise` (any channel
    multiplier); the variants below take the geometries their kernels suit."""

    variant = "depthwise"
    compile_heavy = True
    #: Which loop nest runs: ``rows_3x3``, ``unrolled_3x3``, ``spans`` or ``general``.
    kernel = "general"

    def accepts(self, p):
        if not (p.g == p.ic and p.g > 1):
            return R_NOT_DEPTHWISE.format(g=p.g, ic=p.ic)
        if p.direction not in self.directions:
            return R_DIRECTION.format(d=p.direction, ds=", ".join(self.directions))
        return None

    def tiles(self, p, machine):
        t = super().tiles(p, machine)
        t.pop("accumulate", None)  # the generic direct kernels' choice; not used here
        return t


    def half_operands(self, p, tiles):
        """The row kernels load float16 data and store a float16 dX themselves (the
        filter, the partial dW and the result dW stay float32: 9 x C elements)."""
        if self.kernel != "rows_3x3":
            return frozenset()
        return frozenset(("dy", "result") if p.direction == "bwd_d" else ("x", "dy"))

    def bind(self, p, tiles):
        """The row kernels bound to the plan: shapes, geometry and flags derived once, so
        that a call is an address, an allocation and the kernel (a 7x7 or 14x14 layer's
        kernel takes 50-90 us; the Python of a call took 20-30 more)."""
        if self.kernel != "rows_3x3" or p.direction == "fwd":
            return super().bind(p, tiles)
        from ..kernels.cpu import depthwise_rows as kr

        xs, ys, ws = canonical_shapes(p)
        ct = np.dtype(p.compute_dtype)
        g = geo(p)
        prefetch = bool(tiles.get("prefetch"))
        align = bool(tiles.get("align"))
        row_head, C, cit = kr.row_head, p.ic, ct.itemsize
        empty, address = memory.empty, memory.address
        # the row drivers are compiled apart from the parallel kernels (see _jit.separate):
        # their address tables, for the data's dtype and column stride, taken once per plan
        half = p.dtype == "float16"
        if p.direction == "bwd_d":
            kern = kr.bwd_d_rows_kernel
            fns = kr.d_tables(p.stride[2], "float16" if half else ct.name,
                              tiles.get("order") == "blocks")
            chunks = tiles["chunks"]
            stream = bool(tiles.get("stream"))

            def call(ops):
                # float16 bits in, float16 bits out (see half_operands); dX placed as dY
                # is and the filter copied to match (in the kernel), so that the vectors
                # past dY's head channels are all aligned
                dy = ops["dy"]
                rt = result_dtype(dy, ct)
                if align:
                    off = address(dy) % 64
                    head = row_head(off, C, dy.itemsize, cit)
                    dx = empty(xs, rt, offset=off if head else None)
                else:
                    head = 0
                    dx = empty(xs, rt)
                kern(*fns, dy, ops["w"], dx, g, chunks, prefetch, stream, head, align)
                return dx
            return call

        kern = kr.bwd_w_rows_kernel
        fns = kr.w_tables(p.stride[2], "float16" if half else ct.name)
        part_shape = (tiles["chunks"], *ws)

        def call(ops):
            # the input's head channels (it is read three times as often as dY), and the
            # partial dW's vectors placed to match
            x = ops["x"]
            head = row_head(address(x) % 64, C, x.itemsize, cit) if align else 0
            part = empty(part_shape, ct, offset=-head * cit)
            dw = np.empty(ws, ct)
            kern(*fns, x, ops["dy"], part, dw, g, prefetch, head)
            return dw
        return call

    def run(self, p, tiles, ops):
        from ..kernels.cpu import depthwise as k, depthwise_spans as ks
        from ..kernels.cpu.direct import reduce_partials

        xs, ys, ws = canonical_shapes(p)
        ct = p.compute_dtype
        g = geo(p)
        if p.direction == "fwd":
            if self.kernel == "unrolled_3x3":
                y = memory.empty(ys, ct)
                k.fwd_depthwise_3x3(ops["x"], ops["w"], y, g)
            elif self.kernel == "spans":
                y = memory.empty(ys, ct)
                ks.fwd_depthwise_m1(ops["x"], ops["w"], y, g, tiles["chunks"],
                                    bool(tiles.get("padded")))
            else:
                y = memory.zeros(ys, ct)
                k.fwd_depthwise(ops["x"], ops["w"], y, g)
            return y
        if p.direction == "bwd_d":
            if self.kernel == "rows_3x3":
                dx = self.bind(p, tiles)(ops)
            elif self.kernel == "spans":
                dx = memory.empty(xs, ct)
                ks.bwd_d_depthwise_m1(ops["dy"], ops["w"], dx, g, tiles["chunks"],
                                      bool(tiles.get("padded")))
            elif self.kernel == "unrolled_3x3":
                dx = memory.empty(xs, ct)
                k.bwd_d_depthwise_3x3(ops["dy"], ops["w"], dx, g)
            else:
                dx = memory.zeros(xs, ct)
                k.bwd_d_depthwise(ops["dy"], ops["w"], dx, g)
            return dx
        chunks = tiles["chunks"]
        if self.kernel == "rows_3x3":
            return self.bind(p, tiles)(ops)
        if self.kernel == "spans":
            # per-thread partials, zeroed and reduced inside the kernel (one launch)
            dw = np.empty(ws, ct)
            ks.bwd_w_depthwise_m1(ops["x"], ops["dy"], np.empty((chunks, *ws), ct), dw, g)
            return dw
        part = np.zeros((chunks, *ws), ct)
        k.bwd_w_depthwise(ops["x"], ops["dy"], part, g)
        if chunks == 1:
            return part[0]
        dw = np.empty(ws, ct)
        reduce_partials(part.reshape(chunks, -1), dw.reshape(-1))
        return dw


class DepthwiseRows(DepthwiseDirect):
    """3x3 at column stride 1 or 2, column dilation 1, multiplier 1, backward passes: the
    filter in registers for a whole row (it replaced the nine-term kernel's two-pixel form
    for backward data: 8x14x14x576 0.254 -> 0.152 ms, 8x28x28x192 0.322 -> 0.174 ms in one
    process)."""

    variant = "depthwise-rows"
    directions = ("bwd_d", "bwd_w")
    kernel = "rows_3x3"

    def accepts(self, p):
        why = super().accepts(p)
        if why:
            return why
        if p.oc != p.ic:
            return R_MULTIPLIER.format(m=p.oc // p.ic)
        if not _rows_3x3(p):
            return R_NOT_ROWS.format(k="x".join(map(str, p.ksz)), s=p.stride[2],
                                     d=p.dilation[2])
        return None

    def tiles(self, p, machine):
        t = super().tiles(p, machine)
        t["prefetch"] = _prefetch(p, machine)
        if p.direction == "bwd_w":
            t["align"] = _wide(p, machine)
            return t
        t["chunks"] = max(1, min(machine.cores, t["rows"]))  # dX rows per thread
        # a large dX streamed past the caches, where a vector store fills a cache line
        # (float16 dX and 256-bit vectors: half lines, not streamed)
        t["stream"] = (p.dtype != "float16"
                       and machine.vector_bytes >= STREAM_MIN_VECTOR_BYTES and streams(
                           p.mb * (math.prod(p.isz) + math.prod(p.osz)) * p.ic, p, machine))
        dx_bytes = p.mb * math.prod(p.isz) * p.ic * itemsize(p)
        t["align"] = (_wide(p, machine)
                      and dx_bytes < machine.l3_bytes * ALIGN_DX_L3_FRACTION)
        if p.stride[2] == 1:  # (at stride 2 the blocks are always outermost)
            t["order"] = ("channels" if machine.vector_bytes >= CHANNELS_OUTER_MIN_VECTOR_BYTES
                          else "blocks")
        return t


class DepthwiseUnrolled(DepthwiseDirect):
    """The nine-term 3x3 kernels: forward, and backward data at stride 1 from
    ``UNROLLED_MIN_BYTES`` of channels per pixel on (with column dilation: the row
    kernels take the rest)."""

    variant = "depthwise-unrolled"
    directions = ("fwd", "bwd_d")
    kernel = "unrolled_3x3"

    def accepts(self, p):
        why = super().accepts(p)
        if why:
            return why
        if not _unrolled_3x3(p):
            if p.oc != p.ic:
                return R_MULTIPLIER.format(m=p.oc // p.ic)
            return R_NOT_UNROLLED.format(k="x".join(map(str, p.ksz)), s=p.stride,
                                         pd=p.pad_begin[0])
        if p.direction == "bwd_d" and p.ic * itemsize(p) < UNROLLED_MIN_BYTES:
            return R_NARROW.format(b=p.ic * itemsize(p))
        return None


class DepthwiseSpans(DepthwiseDirect):
    """Multiplier 1, any geometry: spans of pixels that one table of taps reaches, over
    vectors of channels, one contiguous range of rows per thread (the forward pass on
    backward data's spans)."""

    variant = "depthwise-spans"
    directions = ("fwd", "bwd_d", "bwd_w")
    kernel = "spans"

    def accepts(self, p):
        why = super().accepts(p)
        if why:
            return why
        if p.oc != p.ic:
            return R_MULTIPLIER.format(m=p.oc // p.ic)
        if p.direction == "fwd" and p.stride[-1] != 1:
            return R_FWD_STRIDE.format(s=p.stride[-1])
        if p.direction in ("fwd", "bwd_d") and padded(p):
            return None  # no border pixels, no sliding block
        n, ow = interior_columns(p), p.osz[-1]
        if n < SPANS_MIN_INTERIOR * ow:
            return R_BORDERS.format(n=n, ow=ow, f=SPANS_MIN_INTERIOR)
        if p.direction == "fwd" and p.ic * itemsize(p) > SPANS_FWD_MAX_BYTES:
            return R_FWD_WIDE.format(b=p.ic * itemsize(p))
        return None

    def tiles(self, p, machine):
        t = super().tiles(p, machine)
        if p.direction in ("fwd", "bwd_d"):  # one contiguous range of rows per thread
            t["chunks"] = max(1, min(machine.cores, t["rows"]))
            t["padded"] = padded(p)
        return t

    def workspace_bytes(self, p, tiles):
        """Over padded rows, each thread's buffer rows and packed filter."""
        if not tiles.get("padded"):
            return super().workspace_bytes(p, tiles)
        from ..kernels.cpu import depthwise_spans as ks
        return tiles["chunks"] * ks.padded_bytes(geo(p), p.direction, itemsize(p))


def padded(p):
    """Whether backward data or the forward pass of ``p`` runs the span kernels over padded
    rows (the tile ``padded``): at least ``PADDED_MIN_TAPS`` column taps (the forward
    pass also column stride 1)."""
    return p.ksz[-1] >= PADDED_MIN_TAPS and (p.direction != "fwd" or p.stride[-1] == 1)


def interior_columns(p):
    """How many output columns of ``p`` read no padding (every tap inside the input)."""
    iw, kw, sw, dw, pw, ow = p.isz[-1], p.ksz[-1], p.stride[-1], p.dilation[-1], \
        p.pad_begin[-1], p.osz[-1]
    lo = -(-pw // sw)
    hi = min(ow - 1, (iw - 1 + pw - (kw - 1) * dw) // sw)
    return max(0, hi - lo + 1)


#: Best first (see the module's docstring).
STRATEGIES = (DepthwiseRows(), DepthwiseUnrolled(), DepthwiseSpans(), DepthwiseDirect())
