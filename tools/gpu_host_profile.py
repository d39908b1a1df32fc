"""Host time of repeated public calls on a real GPU, with and without ``out=``, and a
cProfile breakdown of both (a developer's tool: needs PyTorch with CUDA).

For three ResNet-50 layers (``LAYERS=name:pass,...`` to choose others): the best of 5
rounds of 200 calls, without waiting for the GPU, and whether the memoised calls replay
their launches (``backends.cuda.run_fast``) or why a replay failed.

Usage: ``python tools/gpu_host_profile.py``.
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
from gpu_check import host_us  # noqa: E402

LAYERS = os.environ.get("LAYERS", "res4a_branch2c:fwd,res4a_branch2c:bwd_w,"
                                  "res2a_branch2b:bwd_d")


def main():
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
