"""Static targets of the CUDA kernels, from their machine code, without a GPU.

Each kernel is compiled to PTX for sm_90 (``numba.cuda.compile_ptx``, with the launch
bounds the backend launches it with), assembled by ``ptxas -v`` and disassembled by
``nvdisasm`` (tools/sass_mix.py); the hot loop is the innermost loop with the most
floating-point multiply-adds. Targets (docs/gpu.md):

* float32 GEMM kernels (every tile the planner picks, the three directions, plain and
  grouped geometries): hot loop at least 80% FFMA, every shared-memory load of it 128-bit,
  at most 128 registers (two 256-thread blocks per SM), no spills;
* depthwise row kernels (float32), forward and backward data: at most 1 integer
  instruction per FMA where the multiply-adds are (a loop's, or the straight-line code
  after the kernel's last barrier, which follows the staging of its rows in shared
  memory), no spills; the patch kernels the same over the whole kernel (straight-line
  code: its index arithmetic, bounds tests and stores included); the weight gradient's: at most 1 integer instruction per FMA in its
  hot loop (the loop over output rows of the segments inside the image), at most 128
  registers, no spills.

Needs NVVM (numba.cuda's toolkit), ``ptxas`` and ``nvdisasm`` (``pip install
nvidia-cuda-nvdisasm``), not a GPU; skips with the reason where one is missing or the run
is under the CUDA simulator. ``pytest -s`` prints the figures.
"""
import importlib
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))
import sass_mix  # noqa: E402

ARCH = "sm_90"
MIN_FMA_SHARE = 0.80
MAX_REGISTERS = 128
MAX_INT_PER_FMA_DEPTHWISE = 1.0

#: geometries (the kernels' 22-int ``geo``: mb g icg ocg, id ih iw, kd kh kw, od oh ow,
#: strides, dilations, leading pads): a ResNet-50 3x3 layer, a strided one, a 1x1 with a
#: channel count that is no multiple of the tile, a grouped (ResNeXt-style) 3-D layer
GEOMETRIES = {
    "3x3": (8, 1, 64, 64, 1, 56, 56, 1, 3, 3, 1, 56, 56, 1, 1, 1, 1, 1, 1, 0, 1, 1),
    "3x3s2": (8, 1, 128, 128, 1, 56, 56, 1, 3, 3, 1, 28, 28, 1, 2, 2, 1, 1, 1, 0, 1, 1),
    "1x1c30": (4, 1, 30, 36, 1, 14, 14, 1, 1, 1, 1, 14, 14, 1, 1, 1, 1, 1, 1, 0, 0, 0),
    "g32-3d": (2, 32, 8, 8, 8, 14, 14, 3, 3, 3, 8, 14, 14, 1, 1, 1, 1, 1, 1, 1, 1, 1),
}
#: depthwise geometries: MobileNet 3x3 (stride 1 and 2), a 5x5 with multiplier 2
DEPTHWISE = {
    "dw3x3": (8, 144, 1, 1, 1, 56, 56, 1, 3, 3, 1, 56, 56, 1, 1, 1, 1, 1, 1, 0, 1, 1),
    "dw3x3s2": (8, 96, 1, 1, 1, 112, 112, 1, 3, 3, 1, 56, 56, 1, 2, 2, 1, 1, 1, 0, 0, 0),
    "dw5x5m2": (4, 32, 1, 2, 1, 28, 28, 1, 5, 5, 1, 28, 28, 1, 1, 1, 1, 1, 1, 0, 2, 2),
}


def static_kernels():
    """The kernels held to the static targets: dicts with ``label``, ``module``, ``name``,
    ``args`` (of the factory), ``sig`` (argument types), ``threads``, ``kind``."""
    from numbaconv.backends import cuda as backend

    out = []
    for tile in backend.GEMM_TILES:
        threads = (tile[0] // tile[3]) * (tile[1] // tile[4])
        for gname, geo in GEOMETRIES.items():
            if gname != "3x3" and (tile != backend.GEMM_TILES[0] or gname == "3x3s2"):
                continue  # every tile on one geometry, more geometries on the largest tile
            for name in ("fwd_gemm", "bwd_d_gemm", "bwd_w_gemm"):
                out.append(dict(label=f"{name}[float32,{'x'.join(map(str, tile))},{gname}]",
                                module="gemm", name=name, args=("float32", *tile, geo, 1),
                                sig=("flat", "float32", 3), threads=threads, kind="gemm"))
    for gname, geo in DEPTHWISE.items():
        for name in ("fwd_depthwise_rows", "bwd_d_depthwise_rows", "bwd_w_depthwise_rows"):
            if name.startswith("bwd_d") and geo[3] != 1:
                continue  # backward data with a multiplier: the general kernel
            out.append(dict(label=f"{name}[float32,{gname}]", module="depthwise", name=name,
                            args=depthwise_args(name, "float32", geo),
                            sig=("flat", "float32", 3),
                            threads=backend.ROWS_CHANNELS * depthwise_args(name, "float32", geo)[3],
                            kind="depthwise_w" if name.startswith("bwd_w") else "depthwise"))
        for name in ("fwd_depthwise_patch", "bwd_d_depthwise_patch"):
            if name.startswith("bwd_d") and geo[3] != 1:
                continue
            args = depthwise_args(name, "float32", geo)
            out.append(dict(label=f"{name}[float32,{gname}]", module="depthwise_patch",
                            name=name, args=args, sig=("flat", "float32", 3),
                            threads=backend.ROWS_CHANNELS * args[4], kind="depthwise"))
    return out


def depthwise_args(name, dtype, geo):
    """The factory arguments of depthwise kernel ``name`` for ``geo`` (planner's split)."""
    from numbaconv.backends import cuda as backend
    return backend.depthwise_args(name, dtype, geo)


def kernel_of(k):
    mod = importlib.import_module(f"numbaconv.kernels.cuda.{k['module']}")
    return getattr(mod, k["name"])(*k["args"])


def ptx_of(k, cc=(9, 0)):
    """PTX of table entry ``k`` for compute capability ``cc``, with its launch bounds."""
    from numba import cuda, types

    kernel = kernel_of(k)
    _, dt, n = k["sig"]
    sig = (types.Array(getattr(types, dt), 1, "C"),) * n
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=cc,
                              launch_bounds=kernel.targetoptions.get("launch_bounds"))
    return ptx


def _labels():
    try:
        return [k["label"] for k in static_kernels()]
    except Exception:  # pragma: no cover - collection must not fail without numba.cuda
        return []


@pytest.mark.parametrize("label", _labels())
def test_static_targets(toolchain, label):
    k = {e["label"]: e for e in static_kernels()}[label]
    f = sass_mix.figures(ptx_of(k), ARCH)
    print(sass_mix.line(label, f, k["threads"]))
    assert f["spill_stores"] == 0 and f["spill_loads"] == 0, f["log"]
    assert f["registers"] * k["threads"] <= 65536, f["log"]
    h = f["hot"]
    assert h is not None, "no loop with a multiply-add"
    if k["kind"] == "gemm":
        assert f["registers"] <= MAX_REGISTERS, f["log"]
        assert h["fma_share"] >= MIN_FMA_SHARE, sass_mix.line(label, f)
        assert h["lds"] > 0 and h["lds128"] == h["lds"], sass_mix.line(label, f)
    elif k["kind"] == "depthwise_w":
        # the hot loop: one output row of a segment inside the image (the image's first and
        # last segments take a loop with a bounds test per column, printed for the record)
        assert f["registers"] <= MAX_REGISTERS, f["log"]
        assert h["region"] == "loop", sass_mix.line(label, f)
        assert h["int_per_fma"] <= MAX_INT_PER_FMA_DEPTHWISE, sass_mix.line(label, f)
        for s, e, body in sass_mix.loops(f["sass"]):
            m = sass_mix.mix(body)
            if m["fma"] and (s, e) != (h["start"], h["end"]):
                print(f"  {label}: the other loop with FMAs (edge segments): {m['n']} instr, "
                      f"{m['fma']} FMA, int/FMA {m['integer'] / m['fma']:.2f}")
    else:
        # a row kernel's multiply-adds are straight-line code after its staging barrier; a
        # patch kernel is straight-line code without a barrier (the whole kernel counts)
        part = h if h["region"] == "loop" or (h["region"] == "kernel" and k["module"] ==
                                              "depthwise_patch") else h["after_barrier"]
        assert part is not None, sass_mix.line(label, f)
        assert part["int_per_fma"] <= MAX_INT_PER_FMA_DEPTHWISE, sass_mix.line(label, f)


_SASS = """
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   MOV R2, RZ ;
.L_x_0:
        /*0020*/                   LDS.128 R4, [R0] ;
        /*0030*/                   LDS.128 R8, [R0+0x10] ;
        /*0040*/                   LDS R12, [R0+0x20] ;
        /*0050*/                   FFMA R2, R4, R8, R2 ;
        /*0060*/                   FFMA R3, R5, R9, R3 ;
        /*0070*/                   FFMA R2, R6, R10, R2 ;
        /*0080*/                   IADD3 R0, R0, 0x30, RZ ;
        /*0090*/                   ISETP.NE.AND P0, PT, R0, R13, PT ;
        /*00a0*/               @P0 BRA `(.L_x_0) ;
.L_x_1:
        /*00b0*/                   LDG.E R4, desc[UR4][R14.64] ;
        /*00c0*/                   FFMA R2, R4, R4, R2 ;
        /*00d0*/                   IMAD R14, R14, 0x4, RZ ;
        /*00e0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00f0*/               @P1 BRA `(.L_x_0) ;
        /*0100*/                   @!P2 BRA `(.L_x_2) ;
        /*0110*/                   EXIT ;
.L_x_2:
        /*0120*/                   BRA `(.L_x_2);
"""


def test_analyser_on_known_sass():
    """The loop finder and instruction mix on a listing whose answer is known (no toolchain
    needed): the inner loop 0x20-0xa0 holds 3 of the 4 FFMAs, 2 of its 3 shared loads are
    128-bit, 2 integer instructions; the loop around it (0x20-0xf0) adds a global load, a
    barrier, an FFMA and an IMAD; the self-branch at 0x120 holds no FMA."""
    lps = {(s, e): sass_mix.mix(b) for s, e, b in sass_mix.loops(_SASS)}
    assert set(lps) == {(0x20, 0xa0), (0x20, 0xf0), (0x120, 0x120)}
    h = sass_mix.hot_loop(_SASS)
    assert (h["start"], h["end"], h["n"], h["fma"]) == (0x20, 0xa0, 9, 3)
    assert (h["lds"], h["lds128"], h["integer"], h["ldg"]) == (3, 2, 2, 0)
    o = h["outer"]
    assert (o["start"], o["end"], o["n"], o["fma"], o["ldg"], o["bar"]) == (0x20, 0xf0, 14, 4, 1, 1)
    assert o["integer"] == 3
