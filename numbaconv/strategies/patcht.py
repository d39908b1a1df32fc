"""The GEMM strategy's patch-t variant: the weight gradient as the transposed patch GEMM,
vectors across input channels, for layers with few output channels.

``dW^T[k, (t, c)] = sum over output pixels of dy[pixel, k] * x[pixel shifted by tap t, c]``
(:mod:`numbaconv.kernels.cpu.patcht`): each step broadcasts ``MR`` (12 with AVX-512) output
channels' ``dy`` and multiplies one or two vectors of the input's channels at the tap. Per
tap, each output row's pixels whose tap lies inside the input along w are one segment of
the reduction, and a register tile sums over all the rows of a block. ``x`` and ``dy`` are
read in place, unless the input channels need padding to whole vectors or the output
channels to whole tiles (a copy, zeros past the channels). ``gemm[patch]`` (vectors across
the output channels) wastes lanes below 16 output channels (12 of 16 for DenseNet-BC's
growth layers) and runs one GEMM per output row, too short over 7-28 pixel rows;
``gemm[slabs]`` copies im2col slabs first.
Each thread sums a contiguous share of the output rows into a private partial; the
partials are added once, in a fixed order. On many cores, where those partials would
outweigh the operands, the threads share dW's columns (taps and tiles of output channels)
instead and each sums every output row into its own columns of one dW.
"""
import math

import numpy as np

from . import Strategy, canonical_shapes, geo, itemsize
from ._gemm_common import MIN_N, identity, sum_partials
from .. import config, memory

#: Output channels (of a group) it takes on any layer; beyond them, up to
#: ``WIDE_OUTPUT_CHANNELS`` on output rows shorter than ``LONG_ROW_PIXELS`` (not 1x1), on
#: 1x1 layers and on filters of ``WIDE_FILTER_TAPS`` or more taps (5x5) over at most
#: ``WIDE_INPUT_CHANNELS`` input channels; and up to ``VOLUME_OUTPUT_CHANNELS`` on 3-D
#: filters of ``VOLUME_TAPS`` or more taps with ``VOLUME_POSITIONS`` or more output
#: positions and at most ``VOLUME_WEIGHTS`` weights (each thread's partial dW is zeroed and
#: added once: C3D's conv4b, 7.1M weights over 784 positions, ran 0.87x). Elsewhere (long
#: rows: gemm[patch]'s GEMM per row; 1x1 over many input channels: gemm[split-k]; short
#: reductions into a large dW: gemm[split-dw]) the other
#: GEMMs measured as fast or faster (docs/performance.md, "Weight gradients with few output
#: channels").
MAX_OUTPUT_CHANNELS = 48
WIDE_OUTPUT_CHANNELS = 128
WIDE_INPUT_CHANNELS = 64
WIDE_FILTER_TAPS = 25
VOLUME_OUTPUT_CHANNELS = 512
VOLUME_TAPS = 27
VOLUME_POSITIONS = 768
VOLUME_WEIGHTS = 4 * 1024 * 1024
#: Least input channels (of a group): one whole vector of them (float32, AVX-512) a step.
MIN_INPUT_CHANNELS = 16
#: Most lanes wasted by rounding the input channels to whole vectors and the output
#: channels to whole register tiles (multiply-adds on zeros), as a share of the work.
MAX_WASTE = 0.25
#: One group, at least this many output channels on the 12-row tile (not a multiple of 16),
#: over 1x1 layers or rows of at least ``LONG_ROW_PIXELS``: gemm[split-k]'s one GEMM over
#: every pixel and gemm[patch]'s GEMM per row win (measured: docs/performance.md, "Weight
#: gradients with few output channels"; on the 16-row tile this entry wins there too).
TWELVES_OUTPUTS = 32
LONG_ROW_PIXELS = 32
#: The register tile of a head (``TILES[HEAD_TILE]``, two rows) serves groups of fewer than
#: ``HEAD_OUTPUTS`` output channels over at most ``HEAD_INPUT_CHANNELS`` input channels only,
#: where no GEMM has enough columns and the other entry is ``direct[narrow]``'s loop nest;
#: over more input channels that loop nest, reading each pixel's channels in one run, is
#: faster than several passes, and so it is on a 1x1 head with an odd number of outputs,
#: one pass over ``x`` where the copy of ``dy`` padded to whole tile rows costs more than
#: the tile saves (docs/performance.md, "Weight gradients with few output channels").
HEAD_TILE, HEAD_OUTPUTS, HEAD_INPUT_CHANNELS = 2, MIN_N, 64
#: Bytes of a register tile's ``dy`` (its rows of output channels) per block of output
#: rows: the tile broadcasts from it for every tap and vector of input channels, so it
#: stays in L1 (the block's other output channels wait in L2).
BLOCK_BYTES = 16 * 1024
#: Grouped weight gradients share their groups among the threads (``tiles["group_parts"]``)
#: from this many cores on, instead of splitting the output rows into one partial of every
#: group's dW per thread, zeroed and then summed on the calling thread. On 2 cores both
#: ways measured alike, so 2-core plans keep the rows (docs/performance.md, "Many cores").
GROUP_SPLIT_CORES = 4
#: From ``GROUP_SPLIT_CORES`` cores on, where a partial dW per share of the output rows
#: would take more bytes than ``x`` and ``dy`` together, the threads share each group's
#: columns ``(tap, tile of output channels)`` instead (``tiles["col_parts"]``), so that
#: one dW is written and nothing is summed: I3D's Mixed_4b 3x3x3 weight gradient (784
#: output positions, 2.2 MB of dW) wrote 16 partials of it on 16 cores, 0.10 of PyTorch's
#: speed (docs/performance.md, "Many cores").
COL_SPLIT_SHARE = 1.0
#: On hosts with 256-bit vectors (AVX2) the entry takes at most this many output channels
#: per group and this many groups: beyond them the GEMM entries and ``direct[grouped]``
#: are faster there (measured: docs/performance.md, "CPU, AVX2 host").
NARROW_VECTOR_OUTPUTS, NARROW_VECTOR_GROUPS = 48, 4
#: ... and of a 1x1 layer whose GEMM operands are the arrays themselves, at most this many
#: output channels: from 32 on, one BLAS GEMM on the arrays (``gemm[identity]``) is
#: 1.2-1.8x faster there; at 16 the entry is 1.5x ahead over 32-64 input channels
#: (measured: docs/performance.md, "CPU, AVX2 host").
NARROW_VECTOR_1X1_OUTPUTS = 24

R_DIRECTION = "the patch-t variant is backward weights only"
R_NARROW_1X1 = ("a 1x1 layer into {k} output channels (> {most}) with 256-bit vectors: one "
                "BLAS GEMM on the arrays themselves (gemm[identity]) is faster")
R_DEPTHWISE = "depthwise (groups == channels): one channel per group"
R_NARROW_VECTORS = ("{k} output channels in each of {g} group(s) with 256-bit vectors: the "
                    "GEMM entries take more than {most} per group, direct[grouped] more than "
                    "{groups} groups, faster")
R_GROUP_VECTORS = ("{g} groups of {c} input and {k} output channels: not whole vectors and "
                   "tile rows (a group's channels are read in place)")
R_WIDE = ("{k} output channels (> {most} {why}): the GEMMs with vectors across them are as "
          "fast")
R_FEW_C = "{c} input channels (< %d): less than a vector of them" % MIN_INPUT_CHANNELS
R_WASTE = ("{c} input and {k} output channels padded to {cp} x {kp}: {w:.0%} of the "
           "multiply-adds on zeros (> " + f"{MAX_WASTE:.0%})")
R_TWELVES = ("{k} output channels (>= %d) in tiles of {mr} rows over {what}: gemm[split-k]'s "
             "and gemm[patch]'s GEMMs win" % TWELVES_OUTPUTS)
R_BLAS = "GEMM_ENGINE is 'blas' (the patch-t variant runs on the Numba engine)"


def _kernels():
    from ..kernels.cpu import patcht
    return patcht


def _most_outputs(p):
    """``(most output channels of a group it takes for p, why)``: see
    :data:`MAX_OUTPUT_CHANNELS`."""
    taps = math.prod(p.ksz)
    positions = p.mb * math.prod(p.osz)
    if (p.ksz[0] > 1 and taps >= VOLUME_TAPS and positions >= VOLUME_POSITIONS
            and taps * p.icg * p.ocg <= VOLUME_WEIGHTS):
        return VOLUME_OUTPUT_CHANNELS, f"for a 3-D filter over {positions} output positions"
    if p.osz[2] < LONG_ROW_PIXELS and taps > 1:
        return WIDE_OUTPUT_CHANNELS, f"over rows of {p.osz[2]} pixels"
    if p.icg <= WIDE_INPUT_CHANNELS and (taps == 1 or taps >= WIDE_FILTER_TAPS):
        return WIDE_OUTPUT_CHANNELS, f"for {taps} tap(s) over {p.icg} input channels"
    return MAX_OUTPUT_CHANNELS, (f"for {taps} tap(s) over {p.icg} input channels on rows of "
                                 f"{p.osz[2]} pixels")


def tile_shape(p):
    """``(index into TILES, Kp)``: the register tile that pads the output channels of a
    group least (the first of equals; the head tile only where :data:`HEAD_OUTPUTS` and
    :data:`HEAD_INPUT_CHANNELS` allow it), and those channels rounded to its rows."""
    best = None
    for i, (mr, _) in enumerate(_kernels().TILES):
        if i == HEAD_TILE and (p.ocg >= HEAD_OUTPUTS or p.icg > HEAD_INPUT_CHANNELS
                               or (p.ocg % mr and math.prod(p.ksz) == 1)):
            continue
        kp = -(-p.ocg // mr) * mr
        if best is None or kp < best[1]:
            best = (i, kp)
    return best


def padded(p, shape=None):
    """``(Cp, Kp)``: a group's input channels in whole vectors, its output channels in
    whole rows of the register tile ``shape`` (default :func:`tile_shape`'s)."""
    k = _kernels()
    vl = k.lanes(itemsize(p))
    mr = k.TILES[tile_shape(p)[0] if shape is None else shape][0]
    return -(-p.icg // vl) * vl, -(-p.ocg // mr) * mr


class PatchT(Strategy):
    name = "gemm"
    variant = "patch-t"
    compile_heavy = True
    directions = ("bwd_w",)

    def accepts(self, p):
        if p.direction != "bwd_w":
            return R_DIRECTION
        if p.g > 1 and p.g == p.ic:
            return R_DEPTHWISE
        from ..machine import machine
        if machine().vector_bytes < 64 and (p.ocg > NARROW_VECTOR_OUTPUTS
                                            or p.g > NARROW_VECTOR_GROUPS):
            return R_NARROW_VECTORS.format(k=p.ocg, g=p.g, most=NARROW_VECTOR_OUTPUTS,
                                           groups=NARROW_VECTOR_GROUPS)
        if (machine().vector_bytes < 64 and identity(p)
                and p.oc > NARROW_VECTOR_1X1_OUTPUTS):
            return R_NARROW_1X1.format(k=p.oc, most=NARROW_VECTOR_1X1_OUTPUTS)
        most, why = _most_outputs(p)
        if p.ocg > most:
            return R_WIDE.format(k=p.ocg, most=most, why=why)
        if p.icg < MIN_INPUT_CHANNELS:
            return R_FEW_C.format(c=p.icg)
        cp, kp = padded(p)
        if p.g > 1 and (cp, kp) != (p.icg, p.ocg):
            return R_GROUP_VECTORS.format(g=p.g, c=p.icg, k=p.ocg)
        if p.g == 1 and tile_shape(p)[0] == 0 and p.oc >= TWELVES_OUTPUTS:
            mr = _kernels().TILES[0][0]
            if math.prod(p.ksz) == 1:
                return R_TWELVES.format(k=p.oc, mr=mr, what="a 1x1 layer")
            if p.osz[2] >= LONG_ROW_PIXELS:
                return R_TWELVES.format(
                    k=p.oc, mr=mr, what=f"rows of {p.osz[2]} pixels (>= {LONG_ROW_PIXELS})")
        waste = 1 - p.icg * p.ocg / (cp * kp)
        if waste > MAX_WASTE:
            return R_WASTE.format(c=p.icg, k=p.ocg, cp=cp, kp=kp, w=waste)
        if config.GEMM_ENGINE == "blas":
            return R_BLAS
        return None

    def tiles(self, p, machine):
        rows = p.mb * p.osz[0] * p.osz[1]
        shape = tile_shape(p)[0]
        # a tile's rows of dY (its output channels) over the block
        per_row = p.osz[2] * _kernels().TILES[shape][0] * itemsize(p)
        # from GROUP_SPLIT_CORES cores on, groups are shared out before rows: a share of
        # the rows writes a partial of every group's dW, a part of the groups only its
        # own rows of one
        cores = machine.cores
        gparts = max(1, min(p.g, cores)) if cores >= GROUP_SPLIT_CORES else 1
        chunks = max(1, min(cores // gparts, rows))
        cparts = 1
        if cores >= GROUP_SPLIT_CORES and chunks > 1:
            cp, kp = padded(p, shape)
            units = math.prod(p.ksz) * (kp // _kernels().TILES[shape][0])
            dw_bytes = p.g * kp * math.prod(p.ksz) * cp * itemsize(p)
            operand_bytes = (p.mb * itemsize(p)
                             * (math.prod(p.isz) * p.ic + math.prod(p.osz) * p.oc))
            if chunks * dw_bytes > COL_SPLIT_SHARE * operand_bytes:
                cparts = min(chunks, units)
                chunks = max(1, chunks // cparts)
        tiles = {"chunks": chunks, "block_rows": max(1, BLOCK_BYTES // per_row),
                 "tile": shape}
        if gparts > 1:
            tiles["group_parts"] = gparts
        if cparts > 1:
            tiles["col_parts"] = cparts
        return tiles

    def workspace_bytes(self, p, tiles):
        cp, kp = padded(p, tiles["tile"])
        n = tiles["chunks"] * p.g * kp * math.prod(p.ksz) * cp
        if cp != p.icg:  # the padded copies (one group only)
            n += p.mb * math.prod(p.isz) * cp
        if kp != p.ocg:
            n += p.mb * math.prod(p.osz) * kp
        return n * itemsize(p)

    def run(self, p, tiles, ops):
        k = _kernels()
        ct = np.dtype(p.compute_dtype)
        cp, kp = padded(p, tiles["tile"])
        x, dy = ops["x"], ops["dy"]  # canonical: [mb, d, h, w, C]
        if x.dtype == np.uint16:  # float16 bits (half_operands), widened by the kernel
            x = np.ascontiguousarray(x)
        elif cp == p.icg:
            x = np.ascontiguousarray(x, ct)
        else:  # channels to whole vectors
            xp = memory.empty((*x.shape[:4], cp), ct)
            xp[..., p.ic:] = 0
            xp[..., :p.ic] = x
            x = xp
        if kp == p.ocg:
            dy = np.ascontiguousarray(dy, ct)
        else:  # output channels to whole register tiles
            dyp = memory.empty((*dy.shape[:4], kp), ct)
            dyp[..., p.oc:] = 0
            dyp[..., :p.oc] = dy
            dy = dyp
        taps = math.prod(p.ksz)
        chunks = int(tiles["chunks"])
        rb = int(tiles["block_rows"])
        part = np.zeros((chunks, p.g, kp, taps * cp), ct)
        gparts = int(tiles.get("group_parts", 1))
        cparts = int(tiles.get("col_parts", 1))
        segs = np.empty((chunks * gparts * cparts, 3 * rb), np.int64)
        # with one dW^T, each item writes its part of the result as it ends
        out = memory.empty((taps, p.icg, p.g, p.ocg), ct) if chunks == 1 else None
        k.bwd_w(x, dy, part, geo(p), np.int64(rb), np.int64(tiles["tile"]), segs, gparts,
                cparts, out)
        if out is not None:
            return out.reshape(canonical_shapes(p)[2])
        # in a fixed order (the same bits for the same inputs); on the workers from
        # SUM_MIN_WORKERS threads on
        acc = sum_partials(list(part), chunks * gparts * cparts)
        # [g, Kp, taps, Cp] -> [taps, icg, g, ocg]
        dw = acc[:, :p.ocg].reshape(p.g, p.ocg, taps, cp)[..., :p.icg].transpose(2, 3, 0, 1)
        return np.ascontiguousarray(dw).reshape(canonical_shapes(p)[2])

    def half_operands(self, p, tiles):
        """x as float16 bits, widened as the kernel loads it, where it is read in place
        (its channels in whole vectors; else the padded copy is float32). dY is widened
        first: the kernel broadcasts its values one by one."""
        return frozenset({"x"}) if padded(p)[0] == p.icg else frozenset()

    def numba_parallel(self, p, tiles):
        return True


STRATEGY = PatchT()
