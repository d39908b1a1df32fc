"""Small problems that reach every CPU strategy, variant and sub-path the planner can run,
for the tests that call each of them (bitwise determinism, read-only operands).

A case names the plan it must get (``label``: ``strategy[variant]``, and tiles it must
have), so that a change in the planner's routing shows up as a failed case rather than as
a sub-path silently left untested. Where ``strategy=`` cannot reach a sub-path, the case
patches the planner's settings (``config``) or a strategy's thresholds (``consts``: a
module and its attributes).
"""
from dataclasses import dataclass, field

import numpy as np

import numbaconv as nc
from numbaconv import config
from numbaconv.kernels.cpu._host import VECTOR_BYTES

THREADS = 2
#: A tile that must be present, whatever its value.
ANY = object()


@dataclass(frozen=True)
class Case:
    id: str
    direction: str                    # "fwd", "bwd_d", "bwd_w"
    g: int
    ic: int
    oc: int
    mb: int
    isz: tuple
    k: tuple
    stride: tuple = None              # default: 1 per axis
    pads: tuple = None                # (begin, end); default: none
    dilation: tuple = None            # default: 1 per axis
    strategy: str = None
    label: str = ""                   # the plan's strategy[variant]
    tiles: dict = field(default_factory=dict)   # tiles it must have (None: absent)
    config: dict = field(default_factory=dict)
    consts: tuple = ()                # ((module, {attribute: value}), ...)
    dtype: str = "float32"


def _c(id, direction, g, ic, oc, mb, isz, k, **kw):
    return Case(id, direction, g, ic, oc, mb, tuple(isz), tuple(k), **kw)


_SMALL_SLABS = {"GEMM_SLAB_BYTES": 4096, "GEMM_MIN_ROWS": 16}
_BLAS = {"GEMM_ENGINE": "blas"}
_NUMBA = {"GEMM_ENGINE": "numba"}
_GEMM = "numbaconv.strategies.gemm"
_SMALL_RULE = {"SMALL_FLOPS": 2_000_000}
_GGEMM = "numbaconv.strategies.ggemm"
#: float32 lanes of this host's vectors (gemm[grouped]'s groups are one vector)
_VL = VECTOR_BYTES // 4

CASES = [
    # -- GEMM: forward --------------------------------------------------------------------
    _c("gemm-fwd-slabs-blas", "fwd", 1, 16, 16, 2, (12, 12), (3, 3), pads=((1, 1), (1, 1)),
       strategy="gemm", label="gemm[slabs]", tiles={"engine": "blas"},
       config={**_SMALL_SLABS, **_BLAS}),
    _c("gemm-fwd-slabs-numba", "fwd", 1, 16, 16, 2, (12, 12), (3, 3), pads=((1, 1), (1, 1)),
       strategy="gemm", label="gemm[slabs]", tiles={"engine": "numba"},
       config={**_SMALL_SLABS, **_NUMBA}),
    _c("gemm-fwd-groups", "fwd", 2, 32, 32, 2, (10, 10), (3, 3), pads=((1, 1), (1, 1)),
       strategy="gemm", label="gemm[slabs]", config=_SMALL_SLABS),
    _c("gemm-fwd-identity", "fwd", 1, 32, 32, 2, (12, 12), (1, 1), strategy="gemm",
       label="gemm[identity]"),
    # -- GEMM: backward weights -----------------------------------------------------------
    _c("gemm-bwdw-slabs-blas", "bwd_w", 1, 32, 16, 2, (12, 12), (3, 3),
       pads=((1, 1), (1, 1)), strategy="gemm", label="gemm[slabs]",
       tiles={"engine": "blas"},
       config={**_SMALL_SLABS, **_BLAS}),
    _c("gemm-bwdw-slabs-numba", "bwd_w", 1, 32, 16, 2, (12, 12), (3, 3),
       pads=((1, 1), (1, 1)), strategy="gemm[slabs]", label="gemm[slabs]",
       tiles={"engine": "numba"},
       config={**_SMALL_SLABS, **_NUMBA}),
    _c("gemm-bwdw-slabs-groups", "bwd_w", 2, 32, 32, 2, (10, 10), (3, 3),
       pads=((1, 1), (1, 1)), strategy="gemm[slabs]", label="gemm[slabs]",
       config={**_SMALL_SLABS, **_BLAS}),
    _c("gemm-bwdw-slabs-3d", "bwd_w", 1, 24, 16, 2, (4, 6, 6), (3, 3, 3),
       pads=((1, 1, 1), (1, 1, 1)), strategy="gemm[slabs]", label="gemm[slabs]",
       config={**_SMALL_SLABS, **_BLAS}),
    # a reduction too short for a run per worker (288 rows, 2 workers): dW's rows in
    # blocks of input channels, each task packing its own; two slabs per run
    _c("gemm-bwdw-slabs-dw-blocks-blas", "bwd_w", 1, 32, 16, 2, (12, 12), (3, 3),
       pads=((1, 1), (1, 1)), strategy="gemm[slabs]", label="gemm[slabs]",
       tiles={"engine": "blas", "col_parts": 2},
       config={"GEMM_SLAB_BYTES": 4096, **_BLAS}),
    _c("gemm-bwdw-slabs-dw-blocks-numba", "bwd_w", 1, 32, 16, 2, (12, 12), (3, 3),
       pads=((1, 1), (1, 1)), strategy="gemm[slabs]", label="gemm[slabs]",
       tiles={"engine": "numba", "col_parts": 2},
       config={"GEMM_SLAB_BYTES": 4096, **_NUMBA}),
    _c("gemm-bwdw-slabs-dw-blocks-groups", "bwd_w", 2, 32, 32, 2, (10, 10), (3, 3),
       pads=((1, 1), (1, 1)), strategy="gemm[slabs]", label="gemm[slabs]",
       tiles={"col_parts": 2}),
    _c("gemm-bwdw-split-k", "bwd_w", 1, 32, 32, 4, (16, 16), (1, 1),
       strategy="gemm[split-k]", label="gemm[split-k]", config=_NUMBA),
    # grouped 1x1 (ShuffleNet's): one split-K GEMM per group on column slices, auto engine
    _c("gemm-bwdw-split-k-grouped", "bwd_w", 3, 60, 48, 2, (9, 10), (1, 1),
       strategy="gemm[split-k]", label="gemm[split-k]", tiles={"engine": "numba"},
       config=_NUMBA),
    # output channels short of whole vectors (40; 20 per group): dW's rows padded
    _c("gemm-bwdw-split-k-odd", "bwd_w", 1, 24, 40, 2, (9, 10), (1, 1),
       strategy="gemm[split-k]", label="gemm[split-k]", tiles={"engine": "numba"},
       config=_NUMBA),
    # 10 output channels over 32 input channels: dW^T = dY^T @ X, then transposed
    _c("gemm-bwdw-split-k-transposed", "bwd_w", 1, 32, 10, 3, (9, 10), (1, 1),
       strategy="gemm[split-k]", label="gemm[split-k]",
       tiles={"engine": "numba", "transposed": True}, config=_NUMBA),
    _c("gemm-bwdw-split-k-grouped-odd", "bwd_w", 3, 30, 60, 2, (7, 9), (1, 1),
       strategy="gemm[split-k]", label="gemm[split-k]", tiles={"engine": "numba"},
       config=_NUMBA),
    _c("gemm-bwdw-identity-tasks", "bwd_w", 1, 32, 32, 4, (16, 16), (1, 1),
       strategy="gemm", label="gemm[identity]",
       config=_BLAS, consts=((_GEMM, {"BLAS_SPLIT_MIN_ROWS": 0}),)),
    _c("gemm-bwdw-split-dw-numba", "bwd_w", 1, 32, 64, 1, (16,), (5,),
       strategy="gemm[split-dw]", label="gemm[split-dw]", tiles={"engine": "numba"}, config=_NUMBA),
    _c("gemm-bwdw-split-dw-blas", "bwd_w", 1, 32, 64, 1, (16,), (5,), strategy="gemm",
       label="gemm[split-dw]", tiles={"engine": "blas"}, config=_BLAS),
    _c("gemm-bwdw-split-dw-groups", "bwd_w", 2, 32, 64, 1, (16,), (5,),
       strategy="gemm[split-dw]", label="gemm[split-dw]", config=_BLAS),
    # -- GEMM: backward data --------------------------------------------------------------
    _c("gemm-bwdd-claimed", "bwd_d", 1, 16, 32, 4, (16, 16), (1, 1), strategy="gemm",
       label="gemm[claimed]", tiles={"claim": ANY}, config=_NUMBA),
    # grouped 1x1 (ShuffleNet's): every group's GEMM on column slices, in one claimed loop,
    # auto engine
    _c("gemm-bwdd-claimed-grouped", "bwd_d", 3, 48, 51, 4, (12, 13), (1, 1),
       label="gemm[claimed]", tiles={"claim": ANY, "engine": "numba"}),
    _c("gemm-bwdd-identity-s2-numba", "bwd_d", 1, 32, 64, 2, (16, 16), (1, 1),
       stride=(2, 2), strategy="gemm", label="gemm[identity]",
       tiles={"engine": "numba", "claim": None}, config=_NUMBA),
    _c("gemm-bwdd-identity-s2-blas", "bwd_d", 1, 32, 64, 2, (16, 16), (1, 1),
       stride=(2, 2), strategy="gemm", label="gemm[identity]",
       tiles={"engine": "blas"}, config=_BLAS),
    _c("gemm-bwdd-identity-tasks", "bwd_d", 1, 32, 32, 4, (16, 16), (1, 1),
       strategy="gemm", label="gemm[identity]", tiles={"engine": "blas"},
       config=_BLAS, consts=((_GEMM, {"BLAS_SPLIT_MIN_ROWS": 0}),)),
    _c("gemm-bwdd-per-tap-blas", "bwd_d", 1, 24, 16, 2, (8, 8), (3, 3),
       pads=((1, 1), (1, 1)), strategy="gemm[per-tap]", label="gemm[per-tap]",
       tiles={"engine": "blas"}, config=_BLAS),
    _c("gemm-bwdd-per-tap-numba", "bwd_d", 1, 24, 16, 2, (8, 8), (3, 3),
       pads=((1, 1), (1, 1)), strategy="gemm[per-tap]", label="gemm[per-tap]",
       tiles={"engine": "numba"}, config=_NUMBA),
    _c("gemm-bwdd-phases-blas", "bwd_d", 1, 24, 16, 4, (24, 24), (3, 3), stride=(2, 2),
       pads=((1, 1), (0, 0)), strategy="gemm", label="gemm[slabs]",
       tiles={"engine": "blas"},
       config={**_SMALL_SLABS, **_BLAS}),
    _c("gemm-bwdd-phases-numba", "bwd_d", 1, 24, 16, 4, (24, 24), (3, 3), stride=(2, 2),
       pads=((1, 1), (0, 0)), strategy="gemm[slabs]", label="gemm[slabs]",
       tiles={"engine": "numba"},
       config={**_SMALL_SLABS, **_NUMBA}),
    _c("gemm-bwdd-empty-phases", "bwd_d", 2, 32, 32, 2, (51, 51), (2, 2), stride=(3, 3),
       strategy="gemm[slabs]", label="gemm[slabs]",
       config=_SMALL_SLABS),
    # -- GEMM variants: rows, implicit, col2im --------------------------------------------
    _c("rows-bwdw-2d", "bwd_w", 1, 8, 8, 2, (16, 16), (3, 3), pads=((1, 1), (1, 1)),
       label="gemm[rows]"),
    _c("rows-bwdw-3d", "bwd_w", 1, 8, 16, 2, (6, 8, 8), (3, 3, 3),
       pads=((1, 1, 1), (1, 1, 1)), label="gemm[rows]"),
    _c("rows-bwdw-1d", "bwd_w", 1, 8, 32, 4, (64,), (7,), stride=(2,), pads=((3,), (3,)),
       label="gemm[rows]"),
    # -- GEMM: patch rows through a table: stems (few input channels; one and two vectors
    # of output channels, the last row of dY copied, pixels at both ends of a row,
    # dilation along w), and a layer with more channels and long rows ------------------
    _c("patch-bwdw-2d", "bwd_w", 1, 3, 24, 2, (17, 19), (3, 3), stride=(2, 2),
       pads=((1, 1), (1, 1)), label="gemm[patch]"),
    _c("patch-bwdw-3d", "bwd_w", 1, 1, 16, 1, (5, 9, 10), (3, 3, 3),
       pads=((1, 1, 1), (1, 1, 1)), label="gemm[patch]"),
    _c("patch-bwdw-1d", "bwd_w", 1, 2, 13, 3, (40,), (5,), dilation=(2,), pads=((4,), (3,)),
       label="gemm[patch]"),
    _c("patch-bwdw-wide", "bwd_w", 1, 16, 20, 2, (6, 40), (3, 3), pads=((1, 1), (1, 1)),
       strategy="gemm[patch]", label="gemm[patch]"),
    # no padding along w: the input rows read in place (the cases above copy them padded)
    _c("patch-bwdw-valid-w", "bwd_w", 1, 3, 20, 2, (7, 23), (3, 3), stride=(1, 2),
       pads=((1, 1), (0, 0)), label="gemm[patch]"),
    # -- GEMM: the transposed patch GEMM, vectors across input channels (few outputs; the
    # second case's 24 channels are copied to whole vectors, its 20 outputs padded) ------
    _c("patch-t-bwdw-2d", "bwd_w", 1, 48, 12, 4, (8, 8), (3, 3), pads=((1, 1), (1, 1)),
       label="gemm[patch-t]"),
    _c("patch-t-bwdw-padded", "bwd_w", 1, 24, 20, 2, (7, 9), (3, 3), stride=(2, 1),
       pads=((1, 0), (0, 1)), label="gemm[patch-t]", strategy="gemm[patch-t]",
       consts=(("numbaconv.strategies.patcht", {"MAX_WASTE": 0.5}),)),
    # a head (3 outputs over 16 inputs): the two-row register tile
    _c("patch-t-bwdw-head", "bwd_w", 1, 16, 3, 2, (9, 8), (3, 3), stride=(2, 1),
       pads=((1, 1), (1, 0)), dilation=(1, 2), label="gemm[patch-t]",
       tiles={"tile": 2, "chunks": ANY, "block_rows": ANY}),
    # -- GEMM: per tap over the valid window (a dilated layer with wide pads) -------------
    _c("windows-bwdw", "bwd_w", 1, 64, 144, 2, (9, 9), (3, 3), pads=((6, 6), (6, 6)),
       dilation=(6, 6), label="gemm[windows]", tiles={"pad_share": ANY}),
    _c("implicit-bwdd-blocks", "bwd_d", 1, 16, 16, 2, (12, 12), (3, 3),
       pads=((1, 1), (1, 1)), label="gemm[implicit]"),
    _c("implicit-bwdd-s2", "bwd_d", 1, 32, 16, 2, (13, 13), (3, 3), stride=(2, 2),
       pads=((1, 1), (1, 1)), label="gemm[implicit]"),
    _c("implicit-bwdd-panels", "bwd_d", 1, 128, 128, 1, (6, 6), (3, 3),
       pads=((1, 1), (1, 1)), strategy="gemm[implicit]", label="gemm[implicit]"),
    # -- GEMM: regions of the phase grid, each over the taps that reach inside dY ----------
    _c("regions-bwdd-blocks", "bwd_d", 1, 16, 16, 2, (13, 13), (3, 3), dilation=(4, 4),
       pads=((4, 4), (4, 4)), label="gemm[regions]"),
    _c("regions-bwdd-panels", "bwd_d", 1, 128, 128, 1, (13, 11), (3, 3), dilation=(5, 3),
       pads=((5, 3), (5, 3)), label="gemm[regions]"),
    _c("regions-bwdd-3d-s2", "bwd_d", 1, 16, 32, 1, (7, 9, 8), (3, 3, 3), stride=(1, 2, 2),
       dilation=(2, 2, 3), pads=((2, 2, 3), (2, 2, 3)), label="gemm[regions]"),
    # two groups (AlexNet's): each group's problem on the whole arrays' rows, stride 2;
    # three groups over channel panels (a large filter over few pixels); four groups by
    # regions (dilated: no padded dY)
    _c("implicit-bwdd-grouped", "bwd_d", 2, 32, 48, 2, (13, 13), (3, 3), stride=(2, 2),
       pads=((1, 1), (1, 1)), label="gemm[implicit]"),
    _c("implicit-bwdd-grouped-panels", "bwd_d", 3, 384, 384, 1, (5, 6), (3, 3),
       pads=((1, 1), (1, 1)), strategy="gemm[implicit]", label="gemm[implicit]"),
    _c("regions-bwdd-grouped", "bwd_d", 4, 64, 32, 2, (11, 12), (3, 3), dilation=(3, 4),
       pads=((3, 4), (3, 4)), strategy="gemm[regions]", label="gemm[regions]"),
    # padded layers whose regions are exact, however few products they skip: dY read in
    # place, no zero-padded copy (one group planned so; two groups forced)
    _c("regions-bwdd-in-place", "bwd_d", 1, 16, 32, 2, (24, 24), (3, 3),
       pads=((1, 1), (1, 1)), label="gemm[regions]"),
    _c("regions-bwdd-in-place-grouped", "bwd_d", 2, 32, 64, 2, (20, 19), (3, 3),
       pads=((1, 1), (1, 1)), strategy="gemm[regions]", label="gemm[regions]"),
    _c("col2im-images", "bwd_d", 1, 3, 16, 4, (12, 12), (3, 3), pads=((1, 1), (1, 1)),
       label="gemm[col2im]", tiles={"bands": None}),
    _c("col2im-bands", "bwd_d", 1, 3, 16, 1, (16, 16), (5, 5), pads=((2, 2), (2, 2)),
       label="gemm[col2im]", tiles={"images": None}, config=_SMALL_SLABS),
    _c("col2im-numba", "bwd_d", 1, 3, 16, 1, (16, 16), (5, 5), pads=((2, 2), (2, 2)),
       label="gemm[col2im]", tiles={"engine": "numba"}, config={**_SMALL_SLABS, **_NUMBA}),
    # -- Winograd -------------------------------------------------------------------------
    _c("winograd-fwd-f2", "fwd", 1, 64, 64, 1, (16, 16), (3, 3), pads=((1, 1), (1, 1)),
       strategy="winograd", label="winograd", tiles={"m": 2}),
    _c("winograd-bwdd-f2", "bwd_d", 1, 64, 64, 1, (16, 16), (3, 3), pads=((1, 1), (1, 1)),
       strategy="winograd", label="winograd", tiles={"m": 2}),
    _c("winograd-bwdw-f2", "bwd_w", 1, 64, 64, 1, (16, 16), (3, 3), pads=((1, 1), (1, 1)),
       strategy="winograd", label="winograd", tiles={"m": 2, "split": None},
       consts=(("numbaconv.strategies.winograd", {"TILE_ROWS": 8,
                                                  "POSITIONS_BELOW_TILES": 0}),)),
    _c("winograd-bwdw-f4", "bwd_w", 1, 64, 64, 2, (24, 24), (3, 3), pads=((1, 1), (1, 1)),
       strategy="winograd", label="winograd", tiles={"m": 4, "split": None},
       consts=(("numbaconv.strategies.winograd", {"TILE_ROWS": 8,
                                                  "POSITIONS_BELOW_TILES": 0}),)),
    # few tiles per worker (64 and 72 over 2): split by position, no partials
    _c("winograd-bwdw-positions-f2", "bwd_w", 1, 64, 64, 1, (16, 16), (3, 3),
       pads=((1, 1), (1, 1)), strategy="winograd", label="winograd",
       tiles={"m": 2, "split": "positions"},
       consts=(("numbaconv.strategies.winograd", {"TILE_ROWS": 8}),)),
    _c("winograd-bwdw-positions-f4", "bwd_w", 1, 64, 80, 2, (24, 24), (3, 3),
       pads=((1, 1), (1, 0)), strategy="winograd", label="winograd",
       tiles={"m": 4, "split": "positions"},
       consts=(("numbaconv.strategies.winograd", {"TILE_ROWS": 8}),)),
    # -- direct and its grouped and depthwise variants ------------------------------------
    _c("direct-fwd", "fwd", 1, 8, 8, 2, (8, 8), (3, 3), pads=((1, 1), (1, 1)),
       strategy="direct", label="direct"),
    _c("direct-bwdd-per-pixel", "bwd_d", 1, 8, 8, 2, (8, 8), (3, 3), stride=(2, 2),
       pads=((1, 1), (1, 1)), strategy="direct", label="direct",
       tiles={"accumulate": "per-pixel"}),
    _c("direct-bwdd-per-tap", "bwd_d", 1, 16, 8, 2, (8, 8), (3, 3), pads=((1, 1), (1, 1)),
       strategy="direct", label="direct", tiles={"accumulate": "per-tap"}),
    _c("direct-bwdw", "bwd_w", 1, 8, 8, 2, (5, 8, 8), (3, 3, 3),
       pads=((1, 1, 1), (1, 1, 1)), strategy="direct", label="direct"),
    _c("narrow-bwdw", "bwd_w", 1, 80, 3, 2, (9, 8), (3, 3), stride=(2, 1),
       pads=((1, 1), (1, 0)), dilation=(1, 2), label="direct[narrow]", tiles={"chunks": ANY}),
    _c("narrow-bwdw-3d-1x1", "bwd_w", 1, 12, 2, 2, (3, 4, 5), (1, 1, 1),
       label="direct[narrow]"),
    _c("grouped-fwd", "fwd", 8, 16, 16, 2, (8, 8), (3, 3), pads=((1, 1), (1, 1)),
       label="direct[grouped]"),
    _c("grouped-bwdd", "bwd_d", 8, 16, 16, 2, (8, 8), (3, 3), stride=(2, 2),
       pads=((1, 1), (1, 1)), label="direct[grouped]"),
    # gemm[grouped]: square groups of one vector (this host's lanes), 5 groups (a block of
    # 4 and one left over on 64-byte-vector hosts), taken on any host for the test
    _c("ggemm-bwdd", "bwd_d", 5, 5 * _VL, 5 * _VL, 2, (7, 9), (3, 3), pads=((1, 1), (1, 1)),
       label="gemm[grouped]", consts=((_GGEMM, {"VECTOR_BYTES_MEASURED": (16, 32, 64)}),)),
    _c("ggemm-bwdd-strided", "bwd_d", 3, 3 * _VL, 3 * _VL, 2, (8, 9), (3, 3), stride=(2, 2),
       pads=((1, 1), (1, 1)), label="gemm[grouped]",
       consts=((_GGEMM, {"VECTOR_BYTES_MEASURED": (16, 32, 64)}),)),
    _c("grouped-bwdw", "bwd_w", 8, 16, 16, 2, (4, 8, 8), (3, 3, 3),
       pads=((1, 1, 1), (1, 1, 1)), label="direct[grouped]"),
    _c("depthwise-fwd-3x3", "fwd", 32, 32, 32, 2, (10, 10), (3, 3), pads=((1, 1), (1, 1)),
       label="direct[depthwise-unrolled]"),
    _c("depthwise-fwd-m2", "fwd", 16, 16, 32, 2, (10, 10), (5, 5), pads=((2, 2), (2, 2)),
       label="direct[depthwise]"),
    _c("depthwise-fwd-spans", "fwd", 32, 32, 32, 2, (10, 12), (5, 5), pads=((2, 2), (2, 1)),
       label="direct[depthwise-spans]"),
    _c("depthwise-bwdd-rows", "bwd_d", 32, 32, 32, 2, (10, 10), (3, 3),
       pads=((1, 1), (1, 1)), label="direct[depthwise-rows]"),
    _c("depthwise-bwdd-unrolled", "bwd_d", 64, 64, 64, 2, (10, 10), (3, 3),
       pads=((2, 2), (2, 2)), dilation=(1, 2), label="direct[depthwise-unrolled]",
       tiles={}),
    _c("depthwise-bwdd-spans", "bwd_d", 32, 32, 32, 2, (10, 10), (5, 5), stride=(2, 2),
       pads=((2, 2), (2, 2)), label="direct[depthwise-spans]"),
    _c("depthwise-bwdd-m2", "bwd_d", 16, 16, 32, 2, (10, 10), (3, 3),
       pads=((1, 1), (1, 1)), label="direct[depthwise]"),
    _c("depthwise-bwdw-rows", "bwd_w", 32, 32, 32, 2, (12, 12), (3, 3),
       pads=((1, 1), (1, 1)), label="direct[depthwise-rows]"),
    _c("depthwise-bwdw-spans", "bwd_w", 32, 32, 32, 2, (12, 12), (5, 5),
       pads=((2, 2), (2, 2)), label="direct[depthwise-spans]"),
    _c("depthwise-bwdw-m2", "bwd_w", 16, 16, 32, 2, (10, 10), (3, 3),
       pads=((1, 1), (1, 1)), label="direct[depthwise]"),
    # -- numpy: small problems, with the planner's small-problem rule on ------------------
    _c("numpy-fwd", "fwd", 2, 8, 8, 2, (9, 7), (3, 3), stride=(2, 1),
       pads=((1, 0), (2, 1)), label="numpy", config=_SMALL_RULE),
    _c("numpy-bwdd", "bwd_d", 1, 8, 4, 2, (11,), (3,), stride=(2,), dilation=(2,),
       pads=((2,), (1,)), label="numpy", config=_SMALL_RULE),
    _c("numpy-bwdw", "bwd_w", 1, 4, 4, 1, (4, 5, 6), (3, 3, 3),
       pads=((1, 1, 1), (1, 1, 1)), label="numpy", config=_SMALL_RULE),
    _c("numpy-bwdw-depthwise-m2", "bwd_w", 8, 8, 16, 2, (8, 8), (3, 3),
       pads=((1, 1), (1, 1)), label="numpy", config=_SMALL_RULE),
    # (multiplier 1: numpy[depthwise] since it exists; the snapshot's plan was numpy)
    _c("numpy-bwdw-depthwise", "bwd_w", 8, 8, 8, 2, (8, 8), (3, 3),
       pads=((1, 1), (1, 1)), label="numpy[depthwise]", config=_SMALL_RULE),
    # -- numpy[depthwise]: small depthwise problems with multiplier 1 ----------------------
    _c("numpy-depthwise-fwd", "fwd", 8, 8, 8, 2, (9, 7), (3, 3), stride=(2, 1),
       pads=((1, 0), (2, 1)), label="numpy[depthwise]", config=_SMALL_RULE),
    _c("numpy-depthwise-bwdd", "bwd_d", 6, 6, 6, 2, (11,), (5,), stride=(2,), dilation=(2,),
       pads=((4,), (3,)), label="numpy[depthwise]", config=_SMALL_RULE),
    _c("numpy-depthwise-bwdw-3d", "bwd_w", 4, 4, 4, 1, (4, 5, 6), (3, 3, 3),
       pads=((1, 1, 1), (1, 1, 1)), label="numpy[depthwise]", config=_SMALL_RULE),
]

#: float16 operands take other kernels on the paths that reduce over threads or widen
#: their operands as they go: the same problems in float16.
_HALF = ("gemm-bwdw-slabs-blas", "gemm-bwdw-slabs-numba", "gemm-bwdw-slabs-dw-blocks-blas",
         "gemm-bwdw-slabs-dw-blocks-numba", "gemm-bwdw-split-k",
         "gemm-bwdd-claimed", "gemm-bwdd-claimed-grouped", "gemm-bwdw-split-k-grouped",
         "gemm-bwdw-split-k-odd", "rows-bwdw-2d", "patch-bwdw-2d", "patch-t-bwdw-2d", "patch-t-bwdw-head", "windows-bwdw", "implicit-bwdd-blocks", "implicit-bwdd-panels",
         "implicit-bwdd-grouped",
         "col2im-images", "winograd-bwdw-f2", "winograd-bwdw-positions-f4", "grouped-bwdw", "depthwise-bwdw-rows",
         "depthwise-bwdd-rows")
CASES += [Case(**{**c.__dict__, "id": c.id + "-f16", "dtype": "float16"})
          for c in CASES if c.id in _HALF]
IDS = [c.id for c in CASES]


def every_strategy(monkeypatch):
    """``THREADS`` threads, and every strategy open to small problems (the planner keeps
    problems under ``config.SMALL_FLOPS`` off the ones that take long to compile)."""
    monkeypatch.setattr(config, "THREADS", THREADS)
    if hasattr(config, "SMALL_FLOPS"):
        monkeypatch.setattr(config, "SMALL_FLOPS", 0)


def patch(case, monkeypatch):
    """Apply the case's settings (and :func:`every_strategy`), undone by ``monkeypatch``."""
    import importlib
    every_strategy(monkeypatch)
    for name, value in case.config.items():
        monkeypatch.setattr(config, name, value)
    for module, attrs in case.consts:
        mod = importlib.import_module(module)
        for name, value in attrs.items():
            monkeypatch.setattr(mod, name, value)


def _attrs(case):
    nd = len(case.isz)
    pb, pe = case.pads or ((0,) * nd, (0,) * nd)
    return dict(strides=case.stride or (1,) * nd, dilations=case.dilation or (1,) * nd,
                pads_begin=pb, pads_end=pe, groups=case.g, strategy=case.strategy)


def _out_size(case):
    nd = len(case.isz)
    pb, pe = case.pads or ((0,) * nd, (0,) * nd)
    st = case.stride or (1,) * nd
    dl = case.dilation or (1,) * nd
    return tuple((i + b + e - (k - 1) * d - 1) // s + 1
                 for i, k, s, d, b, e in zip(case.isz, case.k, st, dl, pb, pe))


def operands(case, seed=0):
    """The case's operands (the op's arguments, in order) as fresh arrays."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((case.mb, *case.isz, case.ic)).astype(case.dtype)
    w = rng.standard_normal((*case.k, case.ic // case.g, case.oc)).astype(case.dtype)
    dy = rng.standard_normal((case.mb, *_out_size(case), case.oc)).astype(case.dtype)
    return {"fwd": {"x": x, "w": w}, "bwd_d": {"dy": dy, "w": w},
            "bwd_w": {"x": x, "dy": dy}}[case.direction]


def call(case, ops):
    a = _attrs(case)
    if case.direction == "fwd":
        return nc.convolution(ops["x"], ops["w"], **a)
    if case.direction == "bwd_d":
        return nc.convolution_backprop_data(ops["dy"], ops["w"], case.isz, **a)
    return nc.convolution_backprop_filters(ops["x"], case.k, ops["dy"], **a)


def plan(case, ops):
    a = _attrs(case)
    s = a.pop("strategy")
    if case.direction == "fwd":
        return nc.plan("convolution", ops["x"], ops["w"], strategy=s, **a)
    if case.direction == "bwd_d":
        return nc.plan("convolution_backprop_data", ops["dy"], ops["w"], case.isz,
                       strategy=s, **a)
    return nc.plan("convolution_backprop_filters", ops["x"], case.k, ops["dy"], strategy=s,
                   **a)


def check_plan(case, ops):
    """The case reaches the path it names, on ``THREADS`` threads."""
    p = plan(case, ops)
    label = p.strategy + (f"[{p.variant}]" if p.variant else "")
    assert label == case.label, f"{case.id} planned {p}"
    for key, want in case.tiles.items():
        ok = key in p.tiles if want is ANY else p.tiles.get(key) == want
        assert ok, f"{case.id}: tiles[{key!r}] != {want!r}: {p}"
    assert p.threads == THREADS, str(p)
    return p
