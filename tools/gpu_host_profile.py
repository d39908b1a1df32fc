"""Host time of repeated public calls on a real GPU, with and without ``out=``, and a
cProfile breakdown of both (a developer's tool: needs PyTorch with CUDA).

For three ResNet-50 layers (``LAYERS=name:pass,...`` to choose others): the best of 5
rounds of 200 calls, without waiting for the GPU, and whether the memoised calls replay
their launches (``backends.cuda.run_fast``) or why a replay failed.

Usage: ``python tools/gpu_host_profile.py``.

``SUITES=resnet50,...`` instead: the host time per call with ``out=`` (no profile) of
every layer and pass of those suites, all compiled before any is timed, so that no
compilation runs on the host's cores while a row is timed. Several processes side by
side: ``PART=i/n`` takes every n-th row, ``BARRIER=dir`` (shared, empty at the start)
with ``PARTS=n`` makes each wait until all n have compiled, and ``LOCK=path`` times one
process at a time (as ``tools/gpu_check.py``). Prints one line per row and the median,
the largest and the rows above 50 us.
"""
import cProfile
import os
import pstats
import sys

import torch

import numbaconv
from numbaconv import suites
from numbaconv.api import _op
from numbaconv.backends import cuda as backend

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check import _timing_lock, host_us  # noqa: E402

LAYERS = os.environ.get("LAYERS", "res4a_branch2c:fwd,res4a_branch2c:bwd_w,"
                                  "res2a_branch2b:bwd_d")


def every_row(names):
    """Host time with ``out=`` of every layer and pass of the suites ``names`` (see the
    module docstring)."""
    import time
    part, parts = (int(v) for v in os.environ.get("PART", "0/1").split("/"))
    rows = []
    k = 0
    for suite in names:
        for lay in suites.layers(suite):
            x, w, dy = (torch.from_numpy(a).cuda() for a in suites.tensors(lay, "float32"))
            for d in ("fwd", "bwd_d", "bwd_w"):
                k += 1
                if k % parts != part:
                    continue
                c = suites.call(lay, d, arrays=(x, w, dy))
                fn = getattr(numbaconv, c.op)
                r = torch.as_tensor(fn(*c.args, **c.kwargs), device="cuda")  # compiles
                kw = dict(c.kwargs, out=torch.empty_like(r))
                fn(*c.args, **kw)
                rows.append((suite, lay.name, d, fn, c.args, kw))
    torch.cuda.synchronize()
    barrier, n = os.environ.get("BARRIER"), int(os.environ.get("PARTS", "1"))
    if barrier:
        open(os.path.join(barrier, f"done{part}"), "w").close()
        while len(os.listdir(barrier)) < n:
            time.sleep(0.2)
    times = []
    with _timing_lock():
        for suite, name, d, fn, args, kw in rows:
            t = host_us(lambda: fn(*args, **kw), calls=100, warm=10)
            times.append(t)
            print(f"{suite:16s} {name:24s} {d:5s} host {t:6.1f} us", flush=True)
    times.sort()
    if times:
        print(f"rows {len(times)} median {times[len(times) // 2]:.1f} us max {times[-1]:.1f} "
              f"above 50 us: {sum(t > 50 for t in times)}", flush=True)
    return 0


def main():
    if os.environ.get("SUITES"):
        return every_row(os.environ["SUITES"].split(","))
    layers = {lay.name: lay for lay in suites.layers("resnet50")}
    for item in LAYERS.split(","):
        name, d = item.split(":")
        lay = layers[name]
        x, w, dy = (torch.from_numpy(a).cuda() for a in suites.tensors(lay, "float32"))
        c = suites.call(lay, d, arrays=(x, w, dy))
        fn = getattr(numbaconv, c.op)
        r = torch.as_tensor(fn(*c.args, **c.kwargs), device="cuda")
        kw = dict(c.kwargs, out=torch.empty_like(r))
        with_out = host_us(lambda: fn(*c.args, **kw), calls=200, warm=20)
        without = host_us(lambda: fn(*c.args, **c.kwargs), calls=200, warm=20)
        replay = [bool(e[4] and e[4][1].fast) for e in _op._MEMO.values() if e[3]]
        print(f"{name} {d}: host {with_out:.1f} us per call with out=, {without:.1f} us "
              f"without; replaying {replay}; replay failure {backend.FAST_FAILURE}",
              flush=True)
        for label, kwargs in (("with out=", kw), ("without out=", c.kwargs)):
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(500):
                fn(*c.args, **kwargs)
            prof.disable()
            torch.cuda.synchronize()
            print(f"{name} {d} {label}:")
            pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
