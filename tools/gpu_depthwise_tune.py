"""Depthwise forward and backward data on a real GPU: the patch kernels' shapes against the
row kernels and PyTorch (a developer's tool: needs PyTorch with CUDA and a GPU).

For every depthwise layer of the MobileNet-V2 suite (and ``ZOO=name,...`` zoo layers), both
passes: the planner's kernel (``CUDA_DEPTHWISE_PATCH=1``: patch; ``0``: rows) through the
public API with ``out=`` (its kernels only, CUPTI), then each patch shape of ``SHAPES``
launched directly, and PyTorch's kernels on the same channels-last tensors. Every result
is checked against numbaconv's CPU result of the same inputs (float32 tolerance). Prints
one line per layer and pass: milliseconds per kernel and the best shape.

Usage: ``python tools/gpu_depthwise_tune.py`` (env ``LAYERS``: MobileNet-V2 layers, all by
default; ``ZOO``: zoo layers to add; ``SHAPES`` as ``ph x pw x nseg`` triples,
``4x4x8,2x4x8``; ``PART``, ``LOCK``). Each patch kernel compiles in 3-6 s (generated
code, per geometry): eight shapes on every layer take far longer than a device call, so
pick layers and shapes, and split them over ``PART`` processes.
"""
import math
import os
import sys
import time

import numpy as np
import torch

import numbaconv
from numbaconv import config, suites
from numbaconv.backends import cuda as backend
from numbaconv.kernels.cuda import depthwise_patch as dp
from numbaconv.reference import TOLERANCE

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check import _timing_lock, kernel_ms, torch_fn  # noqa: E402

torch.backends.cudnn.allow_tf32 = False
torch.backends.cudnn.benchmark = True
SHAPES = [tuple(map(int, s.split("x"))) for s in os.environ.get(
    "SHAPES", "4x4x8,2x4x8,2x2x8,1x4x8,4x4x4,2x8x4,4x8x4,2x8x8").split(",")]
#: ``i/n``: this process times every n-th layer from the i-th (several processes compile
#: side by side; with ``LOCK=path`` they time one at a time, as tools/gpu_check.py)
PART = tuple(map(int, os.environ.get("PART", "0/1").split("/")))


def main():
    from numba import cuda
    print("device", cuda.get_current_device().name, flush=True)
    lays = list(suites.layers("mobilenet_v2_dw"))
    only = [n for n in os.environ.get("LAYERS", "").split(",") if n]
    if only:
        lays = [lay for lay in lays if lay.name in only]
    zoo = [n for n in os.environ.get("ZOO", "").split(",") if n]
    lays += [lay for lay in suites.layers("zoo") if lay.name in zoo]
    lays = lays[PART[0]::PART[1]]
    totals = {}
    for lay in lays:
        x, w, dy = suites.tensors(lay, "float32")
        X, W, DY = (torch.from_numpy(a).cuda() for a in (x, w, dy))
        for d in ("fwd", "bwd_d"):
            c = suites.call(lay, d, arrays=(x, w, dy))
            want = getattr(numbaconv, c.op)(*c.args, **c.kwargs)
            p = numbaconv.plan(c.op, *c.args, **c.kwargs).problem
            geo = backend._geo(p)[0]
            cdev = suites.call(lay, d, arrays=(X, W, DY))
            fn = getattr(numbaconv, c.op)
            out = torch.empty(tuple(want.shape), device="cuda")
            row = {}
            for flag in (1, 0):
                config.CUDA_DEPTHWISE_PATCH = flag
                call = lambda: fn(*cdev.args, **cdev.kwargs, out=out)  # noqa: E731
                call()
                torch.cuda.synchronize()
                err = float(np.max(np.abs(out.cpu().numpy() - want)) / np.max(np.abs(want)))
                with _timing_lock():
                    t = kernel_ms(call, calls=10)
                tiles = numbaconv.plan(c.op, *cdev.args, **cdev.kwargs).tiles
                name = tiles.get("variant", "?")
                if name == "patch":
                    name += f"({tiles['patch_h']}x{tiles['patch_w']}x{tiles['segments']})"
                row["planner-" + name] = (t, err)
            config.CUDA_DEPTHWISE_PATCH = 1
            # the patch shapes, launched directly on the canonical operands
            src = (X if d == "fwd" else DY).reshape(-1)
            wf = W.reshape(-1)
            res = torch.empty(math.prod(want.shape), device="cuda")
            nres = p.osz if d == "fwd" else p.isz
            ch = p.oc if d == "fwd" else p.ic
            for ph, pw, nseg in SHAPES:
                s = p.stride[1:]
                if d == "bwd_d" and (ph % s[0] or pw % s[1]):
                    continue
                if p.icg != 1 or (d == "bwd_d" and p.ocg != 1):
                    continue
                kern = (dp.fwd_depthwise_patch if d == "fwd" else dp.bwd_d_depthwise_patch)(
                    "float32", geo, ph, pw, nseg)
                npt = p.mb * nres[0] * -(-nres[1] // ph) * -(-nres[2] // pw)
                grid = (-(-npt // nseg), -(-ch // dp.CT))
                a, b, r = (cuda.as_cuda_array(v) for v in (src, wf, res))
                launch = lambda: kern[grid, dp.CT * nseg](a, b, r)  # noqa: E731
                launch()
                torch.cuda.synchronize()
                err = float(np.max(np.abs(res.cpu().numpy().reshape(want.shape) - want))
                            / np.max(np.abs(want)))
                with _timing_lock():
                    row[f"{ph}x{pw}x{nseg}"] = (kernel_ms(launch, calls=10), err)
            tf, _ = torch_fn(lay, d, X, W, DY)
            with _timing_lock():
                tt = kernel_ms(tf, calls=10)
            bad = [k for k, (_, e) in row.items() if not e <= TOLERANCE["float32"]]
            best = min(row, key=lambda k: row[k][0])
            print(f"{lay.name:28s} {d:5s} torch {tt * 1e3:7.1f} us | " + "  ".join(
                f"{k} {v[0] * 1e3:6.1f}" for k, v in row.items())
                + f" | best {best} ratio {tt / row[best][0]:.2f}"
                + (f"  BAD {bad}" if bad else ""), flush=True)
            for k, (t, _) in row.items():
                totals.setdefault((d, k.partition("(")[0]), []).append(math.log(tt / t))
    for (d, k), v in sorted(totals.items()):
        print(f"geomean torch/numbaconv {d:5s} {k:16s} {math.exp(sum(v) / len(v)):.3f} "
              f"({len(v)} layers)")


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"took {time.time() - t0:.0f} s")
