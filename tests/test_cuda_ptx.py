"""Every CUDA kernel compiles to PTX and assembles within the launch configuration's budget.

For each kernel the backend can launch, for each dtype it can send it, ``numba.cuda.compile_ptx``
builds PTX for sm_80 and sm_90 and ``ptxas -v`` assembles it; the test asserts no errors, no
local-memory spills, registers x threads per block within 65536 (one block per SM at least)
and static shared memory within 48 KiB and within what ``plan_tiles`` reports. Needs NVVM
(a CUDA toolkit) and ptxas, not a GPU; skips with the reason where they are missing or where
the whole run is under the CUDA simulator. ``pytest -s`` prints the usage table.
"""
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tools"))
import sass_mix  # noqa: E402

CCS = ((8, 0), (9, 0))


def _numba_cuda():
    """Whether numba.cuda is the numba-cuda package (its compile_ptx takes launch bounds and
    compiles device functions without a driver), not numba's own older CUDA target."""
    try:
        import inspect

        from numba import cuda
        return "launch_bounds" in inspect.signature(cuda.compile_ptx).parameters
    except Exception:  # pragma: no cover
        return False


NUMBA_CUDA = _numba_cuda()
REGS_PER_SM = 65536


@pytest.fixture(scope="module")
def toolchain():
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        pytest.skip("NUMBA_ENABLE_CUDASIM is set: compile_ptx is not available in the simulator")
    if not sass_mix.tool_candidates("ptxas"):
        pytest.skip("ptxas not found (environment's nvidia/*/bin, PATH, CUDA_HOME, "
                    "/usr/local/cuda)")
    from numba import cuda, types

    try:
        cuda.compile_ptx(lambda a: None, (types.float32[::1],), cc=(8, 0))
    except Exception as exc:
        pytest.skip(f"NVVM not usable by numba.cuda.compile_ptx: {type(exc).__name__}: {exc}")


def _kernels():
    """(label, factory, args, signature builder, threads per block, shared bytes assumed)."""
    from numbaconv.backends import cuda as backend

    ew = backend.DEFAULTS["CUDA_THREADS"]
    out = []
    for dt in ("float32", "float64"):
        item = 4 if dt == "float32" else 8
        # every tile the planner can pick for this dtype (see backends.cuda.gemm_tile)
        for tile in backend.GEMM_TILES:
            if item == 8 and tile[3] * tile[4] > 32:
                continue
            gemm_threads = (tile[0] // tile[3]) * (tile[1] // tile[4])
            vw = 16 // item
            smem = 2 * tile[2] * (tile[0] + vw + tile[1] + vw) * item
            tag = "x".join(map(str, tile))
            for name in ("fwd_gemm", "bwd_d_gemm", "bwd_w_gemm"):
                # one architecture (sm_80): compiling these takes seconds each; float32 on
                # sm_90 is tests/test_cuda_sass.py
                out.append((f"{name}[{dt},{tag},3d-g]", "gemm", name,
                            (dt, *tile, GEOMETRY, 1), ("flat", dt), gemm_threads, smem,
                            CCS[:1]))
        for name, last in (("fwd_depthwise", 5), ("bwd_d_depthwise", 5),
                           ("bwd_w_depthwise", 6)):
            out.append((f"{name}[{dt}]", "depthwise", name, (dt,), ("geo", dt, 5, 5, last),
                        ew, 0))
        # the depthwise row kernels (specialised per geometry, like the GEMMs)
        from numbaconv.kernels.cuda import depthwise as dwk
        for gname, geo in ROW_GEOMETRIES.items():
            for name in ("fwd_depthwise_rows", "bwd_d_depthwise_rows"):
                if name.startswith("bwd_d") and geo[3] != 1:
                    continue
                args = backend.depthwise_args(name, dt, geo)
                rw, nseg = args[2], args[3]
                span = (dwk.fwd_rows_span(geo, rw, nseg) if name.startswith("fwd")
                        else dwk.bwd_d_rows_span(geo, rw, nseg)[1])
                smem = geo[7] * geo[8] * span * dwk.CT * item
                out.append((f"{name}[{dt},{gname}]", "depthwise", name, args, ("flat", dt),
                            dwk.CT * nseg, smem))
            # the weight gradient's row kernel: shared memory for the sum of its segments
            args = backend.depthwise_args("bwd_w_depthwise_rows", dt, geo)
            out.append((f"bwd_w_depthwise_rows[{dt},{gname}]", "depthwise",
                        "bwd_w_depthwise_rows", args, ("flat", dt), dwk.CT * args[3],
                        args[3] * dwk.CT * item))
        out.append((f"reduce_partials[{dt}]", "gemm", "reduce_partials", (dt,),
                    ("reduce", dt), ew, 0))
        out.append((f"fill_zero[{dt}]", "layout", "fill_zero", (), ("fill", dt), ew, 0))
    for user in ("float16", "float32", "float64"):
        ct = "float64" if user == "float64" else "float32"
        for nd in (3, 4, 5):
            for layout in ("A", "C"):
                for name in ("gather", "scatter"):
                    out.append((f"{name}{nd}[{user}->{ct},{layout}]", "layout", name, (nd,),
                                (name, user, ct, nd, layout), ew, 0))
    return out


#: GEMM kernels are specialised per geometry (mb g icg ocg, id ih iw, kd kh kw, od oh ow,
#: strides, dilations, leading pads): here a 3-D grouped one with channel counts that are
#: no multiple of the tile
GEOMETRY = (2, 4, 6, 10, 6, 7, 7, 3, 3, 3, 6, 7, 7, 1, 1, 1, 1, 1, 1, 1, 1, 1)
#: depthwise row kernels: a 2-D stride-2 layer, a 3-D one with channel multiplier 2
ROW_GEOMETRIES = {
    "2d-s2": (2, 8, 1, 1, 1, 9, 9, 1, 3, 3, 1, 5, 5, 1, 2, 2, 1, 1, 1, 0, 1, 1),
    "3d-m2": (2, 4, 1, 2, 4, 6, 6, 3, 3, 3, 4, 6, 6, 1, 1, 1, 1, 1, 1, 1, 1, 1),
}


def _signature(spec):
    from numba import types

    if spec[0] == "flat":
        T = getattr(types, spec[1])
        return (types.Array(T, 1, "C"),) * 3

    if spec[0] == "geo":
        _, dt, a, b, c = spec
        T = getattr(types, dt)
        return (types.Array(T, a, "C"), types.Array(T, b, "C"), types.Array(T, c, "C"),
                types.UniTuple(types.int64, 22))
    if spec[0] == "reduce":
        T = getattr(types, spec[1])
        return (types.Array(T, 2, "C"), types.Array(T, 1, "C"))
    if spec[0] == "fill":
        return (types.Array(getattr(types, spec[1]), 1, "C"),)
    name, user, ct, nd, layout = spec
    u = types.Array(getattr(types, user), nd, layout)
    c = types.Array(getattr(types, ct), 1, "C")
    pair = (u, c) if name == "gather" else (c, u)
    return (*pair, types.UniTuple(types.int64, 5), types.UniTuple(types.int64, nd),
            types.int64)


_USAGE = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _labels():
    try:
        return [k[0] for k in _kernels()]
    except Exception:  # pragma: no cover - collection must not fail
        return []


@pytest.mark.parametrize("label", _labels())
def test_kernel_assembles_within_budget(toolchain, label):
    import importlib

    from numba import cuda

    spec = {k[0]: k for k in _kernels()}[label]
    _, module, name, args, sig, threads, shared = spec[:7]
    if name.endswith("_gemm") and not NUMBA_CUDA:
        pytest.skip("numba's own CUDA target compiles the GEMM kernels' device functions only "
                    "with a CUDA driver: pip install numba-cuda (the cuda12/cuda13 extras)")
    ccs = spec[7] if len(spec) > 7 else CCS
    mod = importlib.import_module(f"numbaconv.kernels.cuda.{module}")
    kernel = getattr(mod, name)(*args)
    from numba.cuda.cudadrv.error import CudaSupportError
    for cc in ccs:
        bounds = kernel.targetoptions.get("launch_bounds")
        try:
            ptx, _ = cuda.compile_ptx(kernel.py_func, _signature(sig), cc=cc,
                                      **({"launch_bounds": bounds} if bounds else {}))
        except CudaSupportError as exc:  # numba's own CUDA target: device functions
            if NUMBA_CUDA:
                raise
            pytest.skip("numba's own CUDA target compiles this kernel's device functions "
                        "only with a CUDA driver: pip install numba-cuda (the cuda12/cuda13 "
                        f"extras) ({str(exc).splitlines()[0]})")
        try:
            log = sass_mix.assemble(ptx, f"sm_{cc[0]}{cc[1]}", nvdisasm=False)[0]["log"]
        except RuntimeError as exc:
            pytest.fail(str(exc))
        used = _USAGE.search(log)
        spill = _SPILL.search(log)
        assert used and spill, log
        regs, smem = int(used.group(1)), int(used.group(2) or 0)
        print(f"{label} sm_{cc[0]}{cc[1]}: {regs} registers x {threads} threads, "
              f"{smem} B shared, spills {spill.group(1)}/{spill.group(2)} B")
        assert spill.group(1) == "0" and spill.group(2) == "0", log
        assert regs * threads <= REGS_PER_SM, f"{regs} registers x {threads} threads: {log}"
        assert smem <= 48 * 1024 and smem <= shared, log
