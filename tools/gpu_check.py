"""Every suite layer on a real GPU: numbaconv's CUDA backend against PyTorch (cuDNN).

A developer's tool (needs PyTorch with CUDA and a GPU; not part of the library or its
tests). Operands are PyTorch CUDA tensors passed straight to the public generic ops.

* Correctness: normalised error (docs/contract.md section 10) against PyTorch in float64 on the GPU.
* Wall time: best of 5 rounds of CALLS calls then a synchronise, after a warm-up, both
  sides; PyTorch with TF32 off for exact rows (numbaconv computes in true float32),
  cudnn.benchmark on.
* Kernel time (``KT=1``, the default): the GPU time per call of every kernel the call
  launched (CUPTI through torch.profiler), which leaves out the host's launch overhead.
* Host time: the time a call takes to return, without waiting for the GPU (numbaconv with
  its plan cached and a preallocated ``out=``), against PyTorch's.
* The plan of each layer and pass (kernel family, tile, splits, row kernels) is printed.
* Per (suite, pass) the geometric means of the ratios torch/numbaconv (above 1: numbaconv
  faster) of wall time, of wall time with ``out=``, and of kernel time.

* ``PRECISIONS=exact,tf32`` (float32 layers): ``tf32`` rows call numbaconv with
  ``precision="tf32"`` (the ``gemm[tf32]`` tensor-core kernels) and time PyTorch with TF32
  on (``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32``);
  their error bound is ``TF32_TOLERANCE``. ``exact`` rows keep both sides in true float32.

Environment: SUITES, LAYERS (comma-separated names), DTYPES, PASSES, PRECISIONS (default
``exact``), CALLS, TIME=0 (errors only), KT=0 (no kernel time), PLAN=0 (no plans),
LOCK=path (several checks side by side: each compiles on its own, and times its rows only
while it holds this file's lock, so no two processes' timings overlap on the GPU),
CONFIG=NAME=value,... (``numbaconv.config`` settings for this run, integers, e.g.
``CONFIG=CUDA_TF32_ASYNC=0``). Example:
``PRECISIONS=exact,tf32 python tools/gpu_check.py``. Exit status 1 if any error is above
the tolerance.
"""
from collections import defaultdict
import dataclasses
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import numbaconv
from numbaconv import suites
from numbaconv.reference import TF32_TOLERANCE, TOLERANCE

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.benchmark = True
dev = "cuda"
SUITES = os.environ.get("SUITES", "resnet50,mobilenet_v2_dw,resnext3d,conv1d").split(",")
DTYPES = os.environ.get("DTYPES", "float32").split(",")
PASSES = os.environ.get("PASSES", "fwd,bwd_d,bwd_w").split(",")
PRECISIONS = os.environ.get("PRECISIONS", "exact").split(",")
for _item in filter(None, os.environ.get("CONFIG", "").split(",")):
    _name, _, _value = _item.partition("=")
    setattr(numbaconv.config, _name, int(_value))


def torch_tf32(on):
    """PyTorch's TF32 switches (convolutions and matrix products) on or off."""
    torch.backends.cudnn.allow_tf32 = on
    torch.backends.cuda.matmul.allow_tf32 = on
ROUNDS, CALLS = 5, int(os.environ.get("CALLS", "5"))
TIME = os.environ.get("TIME", "1") == "1"


def best(fn):
    fn()
    torch.cuda.synchronize()
    t = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
        t.append((time.perf_counter() - t0) / CALLS)
    return min(t) * 1e3


KT = os.environ.get("KT", "1") == "1"
LOCK = os.environ.get("LOCK")


class _timing_lock:
    """The file lock LOCK names (nothing without LOCK): one process times at a time."""

    def __enter__(self):
        if LOCK:
            import fcntl
            self.f = open(LOCK, "a")
            fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if LOCK:
            self.f.close()  # releases the lock
        return False
PLAN = os.environ.get("PLAN", "1") == "1"


def host_us(fn, calls=50, warm=1):
    """Host time per call (us), best of ``ROUNDS`` rounds of ``calls`` calls after ``warm``
    untimed ones: the calls return without waiting for the GPU."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
        torch.cuda.synchronize()
    return best * 1e6


def kernel_ms(fn, calls=3):
    """GPU kernel time per call (CUPTI, all kernels the call launched), ms."""
    from torch.profiler import profile, ProfilerActivity
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    tot = 0.0
    for ev in prof.key_averages():
        tot += getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0)
    return tot / calls / 1e3


def torch_fn(lay, d, x, w, dy):
    """x, dy channels-last torch tensors (N, *S, C); w XIO. Returns fn -> result in numbaconv layout."""
    nd = lay.nd
    xt = x.movedim(-1, 1)
    dyt = dy.movedim(-1, 1)
    wt = w.permute(nd + 1, nd, *range(nd))
    crop = None
    if lay.symmetric:
        padding = list(lay.pad_begin)
    else:
        pads = [v for b, e in zip(reversed(lay.pad_begin), reversed(lay.pad_end)) for v in (b, e)]
        xt = F.pad(xt, pads)
        padding = [0] * nd
        crop = tuple(slice(b, b + i) for b, i in zip(lay.pad_begin, lay.isz))
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    bw = torch.ops.aten.convolution_backward
    st, dil, g = list(lay.stride), list(lay.dilation), lay.g
    if d == "fwd":
        f = lambda: conv(xt, wt, None, st, padding, dil, g)
    elif d == "bwd_d":
        f = lambda: bw(dyt, xt, wt, None, st, padding, dil, False, [0] * nd, g, [True, False, False])[0]
    else:
        f = lambda: bw(dyt, xt, wt, None, st, padding, dil, False, [0] * nd, g, [False, True, False])[1]

    def out(r):
        if d == "bwd_w":
            return r.permute(*range(2, nd + 2), 1, 0)
        r = r.movedim(1, -1)
        if d == "bwd_d" and crop is not None:
            r = r[(slice(None), *crop)]
        return r
    return f, out


def _geomeans(label, rows):
    """Print the geometric mean ratio per (suite, pass, dtype)."""
    groups = defaultdict(list)
    for key_suite, d, dt, r in rows:
        groups[(key_suite, d, dt)].append(math.log(r))  # dt: dtype, "+tf32" for tf32 rows
    for k, v in groups.items():
        print(label, *k, f"{math.exp(sum(v) / len(v)):.3f}")


def main():
    from numba import cuda
    import numba
    print("numba", numba.__version__, "device", cuda.get_current_device().name, flush=True)
    print("torch", torch.__version__, flush=True)
    bad = 0
    rows = []
    krows = []
    orows = []
    for suite in SUITES:
        for lay in suites.layers(suite):
            if os.environ.get("LAYERS") and lay.name not in os.environ["LAYERS"].split(","):
                continue
            x, w, dy = suites.tensors(lay, "float32")
            for dt in DTYPES:
                X, W, DY = (torch.from_numpy(a).to(dev).to(getattr(torch, dt)) for a in (x, w, dy))
                X64, W64, DY64 = (a.to(torch.float64) for a in (X, W, DY))
                for d, prec in [(d, p) for d in PASSES for p in PRECISIONS
                                if p == "exact" or dt == "float32"]:
                    c = suites.call(lay, d, arrays=(X, W, DY))
                    if prec == "tf32":
                        c = dataclasses.replace(c, kwargs=dict(c.kwargs, precision="tf32"))
                    torch_tf32(prec == "tf32")  # PyTorch at the same precision
                    tag = dt if prec == "exact" else dt + "+tf32"
                    tol = TOLERANCE[dt] if prec == "exact" else TF32_TOLERANCE
                    fn = getattr(numbaconv, c.op)
                    try:
                        got = fn(*c.args, **c.kwargs)
                    except Exception as exc:
                        print(f"{suite:16s} {lay.name:24s} {d:5s} {tag:12s} ERROR {type(exc).__name__}: {exc}", flush=True)
                        bad += 1
                        continue
                    got = torch.as_tensor(got, device=dev).to(torch.float64)
                    f64, out = torch_fn(lay, d, X64, W64, DY64)
                    ref = out(f64())
                    fa, _ = torch_fn(lay, d, X64.abs(), W64.abs(), DY64.abs())
                    ref_abs = out(fa())
                    err = ((got - ref).abs().max() / ref_abs.abs().max().clamp_min(1e-300)).item()
                    ok = err <= tol
                    bad += not ok
                    line = f"{suite:16s} {lay.name:24s} {d:5s} {tag:12s} err {err:9.2e} {'ok ' if ok else 'BAD'}"
                    if PLAN:
                        print("    plan:", numbaconv.plan(c.op, *c.args, **c.kwargs), flush=True)
                    if TIME:
                        with _timing_lock():
                            tf, _ = torch_fn(lay, d, X, W, DY)
                            out = torch.empty(tuple(got.shape), device=dev,
                                              dtype=getattr(torch, dt))
                            kw_out = dict(c.kwargs, out=out)
                            tn = best(lambda: fn(*c.args, **c.kwargs))
                            to = best(lambda: fn(*c.args, **kw_out))
                            tt = best(tf)
                            hn = host_us(lambda: fn(*c.args, **kw_out))
                            ht = host_us(tf)
                            line += (f"  wall nc {tn:8.3f} ms (out= {to:8.3f})  torch {tt:8.3f} ms"
                                     f"  ratio {tt / tn:6.3f} (out= {tt / to:6.3f})"
                                     f"  host nc {hn:7.1f} us  torch {ht:7.1f} us")
                            rows.append((suite, d, tag, tt / tn))
                            orows.append((suite, d, tag, tt / to))
                            # the memoised calls above replayed the first call's
                            # launches: the same bits
                            again = torch.as_tensor(fn(*c.args, **c.kwargs), device=dev)
                            if not torch.equal(again.to(torch.float64), got):
                                line += "  REPLAY DIFFERS"
                                bad += 1
                            if KT:
                                kn = kernel_ms(lambda: fn(*c.args, **c.kwargs))
                                kt = kernel_ms(tf)
                                line += f"  kernels nc {kn:8.3f} torch {kt:8.3f} ratio {kt / kn:6.3f}"
                                krows.append((suite, d, tag, kt / kn))
                    print(line, flush=True)
    _geomeans("wall geomean", rows)
    _geomeans("wall geomean with out=", orows)
    _geomeans("kernel geomean", krows)
    print("bad", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
