"""Bitwise reproducibility: the same inputs on the same thread count and host give the same
bits on every call, on every strategy and sub-path the planner can run (which thread runs
which piece of work, and when, must not change which partial it is summed into nor the
order of the sums)."""
import numpy as np
import pytest

import numbaconv as nc
from numbaconv import config
from strategy_cases import (CASES, IDS, THREADS, call, check_plan, every_strategy, operands,
                            patch)

CALLS = 5


def _same_bits(results):
    first = results[0].view(np.uint8)
    return [i for i, r in enumerate(results[1:], 1) if not np.array_equal(r.view(np.uint8),
                                                                           first)]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_path_is_bitwise_reproducible(case, monkeypatch):
    patch(case, monkeypatch)
    ops = operands(case)
    check_plan(case, ops)
    results = [call(case, ops) for _ in range(CALLS)]
    assert not _same_bits(results), f"{case.id}: calls {_same_bits(results)} differ from the first"


@pytest.mark.parametrize("threads", [1, THREADS])
def test_gemm_weight_gradient_resnet_size(threads, monkeypatch):
    """A ResNet-size 3x3 weight gradient on the GEMM strategy's slab tasks (many slabs per
    worker: the worker that takes a slab changes from call to call)."""
    monkeypatch.setattr(config, "THREADS", threads)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 28, 28, 64), dtype=np.float32)
    dy = rng.standard_normal((8, 28, 28, 64), dtype=np.float32)
    results = [nc.conv2d_backprop_filter(x, (3, 3, 64, 64), dy, 1, "SAME", strategy="gemm")
               for _ in range(CALLS)]
    assert not _same_bits(results)


def test_conv3d_weight_gradient_default(monkeypatch):
    every_strategy(monkeypatch)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 6, 10, 10, 32), dtype=np.float32)
    dy = rng.standard_normal((2, 6, 10, 10, 32), dtype=np.float32)
    args = (x, (3, 3, 3, 32, 32), dy, (1, 1, 1, 1, 1), "SAME")
    assert nc.plan("conv3d_backprop_filter_v2", *args).strategy == "gemm"
    results = [nc.conv3d_backprop_filter_v2(*args) for _ in range(CALLS)]
    assert not _same_bits(results)


_CROSS_PROCESS = """
import hashlib, numpy as np
import numbaconv as nc
from numbaconv import config
config.SMALL_FLOPS = 0
rng = np.random.default_rng(0)
x = rng.standard_normal((2, 24, 24, 64)).astype(np.float32)
w = rng.standard_normal((3, 3, 64, 64)).astype(np.float32)
dy = rng.standard_normal((2, 24, 24, 64)).astype(np.float32)
a = dict(strides=1, pads_begin=1, pads_end=1, strategy="winograd")
out = []
for m in (2, 4):
    from numbaconv.strategies import winograd
    winograd.TILE_SIZES = (m,)
    nc.planner.clear_plan_cache()
    for r in (nc.convolution(x, w, **a), nc.convolution_backprop_data(dy, w, (24, 24), **a),
              nc.convolution_backprop_filters(x, (3, 3), dy, **a)):
        out.append(hashlib.md5(r.tobytes()).hexdigest())
# each (transform, tile size) chain is a copy of one template with its own name; a copy
# that Numba could not key deterministically (a closure over a dispatcher) would compile
# again in every process
from numbaconv.kernels.cpu import winograd as k
ks = [d for c in k._CHAINS.values() for d in c if d.signatures]
hits = sum(len(d.stats.cache_hits) for d in ks)
misses = sum(len(d.stats.cache_misses) for d in ks)
print(" ".join(out), len(ks), hits, misses)
"""


def test_a_kernel_loaded_from_the_cache_gives_the_bits_of_one_compiled_here(tmp_path):
    """Contract section 8 across processes: the Winograd transforms (every pass, both tile
    sizes) compiled in one process and loaded from the disk cache in the next give the same
    bits (with ``reassoc`` they did not: docs/design.md, "Compile once"); every transform
    chain the first process compiled (and stored), the second loads."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), NUMBACONV_CACHE="1")
    runs = [subprocess.run([sys.executable, "-c", _CROSS_PROCESS], env=env, text=True,
                           capture_output=True, timeout=600) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    first, second = (r.stdout.split() for r in runs)
    assert len(first) == 9 and first[:6] == second[:6]
    chains = int(first[6])
    assert chains >= 6 and second[6] == first[6]
    assert first[7:] == ["0", str(chains)]    # compiled (and stored) in the first process
    assert second[7:] == [str(chains), "0"]   # loaded in the second
