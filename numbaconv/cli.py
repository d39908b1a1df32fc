"""The ``numbaconv`` command line: info, check, plan, warmup, bench."""
import argparse
import os
import platform
import sys

import numpy as np


def _ahead_status():
    """Whether a first call's helper process may compile part of its kernels, and why not."""
    from . import _ahead, _jit, config
    if not config.COMPILE_AHEAD:
        return "off (NUMBACONV_COMPILE_AHEAD=0)"
    if not _jit.cache_enabled():
        return "off (no disk cache for a helper to fill)"
    if _ahead._cores() < 2:
        return "off (one core)"
    start = "a fork of the caller" if _ahead.forks() else "a new interpreter"
    return (f"on (first calls of slowly compiling entries on two or more threads; the "
            f"helper is {start}, NUMBACONV_COMPILE_AHEAD_START)")


def _info(args):
    import numba
    import numbaconv
    from numbaconv import _jit
    from numbaconv.machine import machine

    m = machine()
    # Run one tiny op so that Numba's threading layer is known (and report it honestly).
    x = np.ones((1, 3, 3, 1), np.float32)
    numbaconv.conv2d(x, np.ones((1, 1, 1, 1), np.float32), 1, "VALID")
    try:
        layer = numba.threading_layer()
    except ValueError:
        layer = "unknown"
    cache_dir = numba.config.CACHE_DIR or "(Numba default: __pycache__ next to the kernels, "\
        "else the user cache dir)"
    rows = [
        ("numbaconv", numbaconv.__version__),
        ("python", platform.python_version()),
        ("numpy", np.__version__),
        ("numba", numba.__version__),
        ("llvmlite", __import__("llvmlite").__version__),
        ("threading layer", f"{layer}" + (" (launches serialised)" if layer == "workqueue"
                                          else "")),
        ("threads", f"{numbaconv.get_num_threads()} of {numba.config.NUMBA_NUM_THREADS}"),
        ("cpu", m.cpu_name),
        ("vector width", f"{m.vector_bytes * 8} bit"),
        ("cpu features", " ".join(f for f in m.features if f.startswith(("avx", "fma", "f16c",
                                                                        "amx")))),
        ("caches", f"L1d {m.l1d_bytes // 1024} KiB, L2 {m.l2_bytes // 1024} KiB, "
                   f"L3 {m.l3_bytes // 1024} KiB"),
        ("kernel cache", ("on" if _jit.cache_enabled() else "off (in-memory compilation)")
         + f", {cache_dir}"),
        ("compile ahead", _ahead_status()),
        ("blas", _blas_status()),
        ("tune cache", __import__("numbaconv.tune", fromlist=["x"]).cache_path()),
        ("cuda", _cuda_status()),
    ]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    return 0


def _blas_status():
    from numbaconv import blas
    n = blas.get_threads()
    core = blas.corename()
    env = os.environ.get("OPENBLAS_CORETYPE")
    return (f"NumPy's OpenBLAS, {core} kernels" + (f" (OPENBLAS_CORETYPE={env})" if env else "")
            + (f", {n} thread(s)" if n else ""))


def _cuda_status():
    try:
        from numba import cuda
    except Exception as exc:  # pragma: no cover
        return f"unusable (numba.cuda import failed: {exc})"
    try:
        if cuda.is_available():
            return f"usable: {cuda.get_current_device().name}"
        return "no usable GPU (device arrays give a clear error; NumPy arrays run on the CPU)"
    except Exception as exc:  # pragma: no cover
        return f"no usable GPU ({exc})"


def _check(args):
    from numbaconv.check import run_check
    return run_check(dtypes=args.dtype, verbose=True)


def _plan(args):
    from numbaconv import suites
    import numbaconv

    for layer in suites.layers(args.suite):
        for direction in args.pass_:
            call = suites.call(layer, direction, args.dtype, shapes_only=True)
            print(numbaconv.plan(call.op, *call.args, strategy=args.strategy, **call.kwargs))
    return 0


def _warmup(args):
    from numbaconv._warmup import warmup
    seconds = warmup(dtypes=args.dtype, verbose=True, processes=args.processes,
                     strategies=args.strategy)
    print(f"warmed up in {seconds:.1f} s")
    return 0


def _bench(args):
    from numbaconv.bench import main as bench_main
    return bench_main(args)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="numbaconv", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="versions, threading layer, threads, CPU, caches, CUDA")
    c = sub.add_parser("check", help="every op on small problems against the reference")
    c.add_argument("--dtype", nargs="+", default=None,
                   choices=["float16", "float32", "float64", "bfloat16"],
                   help="default: all four (bfloat16 where ml_dtypes is installed)")
    w = sub.add_parser("warmup", help="compile (and cache) the kernels ahead of time")
    w.add_argument("--dtype", nargs="+", default=["float32"],
                   choices=["float16", "float32", "float64", "bfloat16"])
    w.add_argument("--processes", type=int, default=None,
                   help="worker processes compiling into the disk cache (default: one per "
                        "core; 1: compile in this process)")
    w.add_argument("--strategy", nargs="+", default=None, metavar="NAME",
                   help="only these planner entries or families (default: every entry)")
    from numbaconv.bench import add_arguments
    b = sub.add_parser("bench", help="time suites of real layers (optionally against PyTorch)")
    add_arguments(b)
    p = sub.add_parser("plan", help="print the plan of every layer of a suite")
    p.add_argument("--suite", default="resnet50")
    p.add_argument("--pass", dest="pass_", nargs="+", default=["bwd_d", "bwd_w"],
                   choices=["fwd", "bwd_d", "bwd_w"])
    p.add_argument("--dtype", default="float32")
    p.add_argument("--strategy", default=None)
    args = parser.parse_args(argv)
    handler = {"info": _info, "check": _check, "warmup": _warmup, "bench": _bench,
               "plan": _plan}[args.cmd]
    return handler(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
