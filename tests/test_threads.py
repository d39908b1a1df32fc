"""Concurrent callers and thread-count control."""
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import pytest

import numbaconv as nc
from numbaconv import reference as R


def _problem(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 7, 6, 8)).astype(np.float32)
    w = rng.standard_normal((3, 3, 8, 16)).astype(np.float32)
    dy = rng.standard_normal((2, 4, 6, 16)).astype(np.float32)
    return x, w, dy


def _call(seed):
    x, w, dy = _problem(seed)
    strategy = ("direct", "gemm")[seed % 2]
    a = dict(strides=(2, 1), pads_begin=(1, 1), pads_end=(1, 1), strategy=strategy)
    return (nc.convolution_backprop_data(dy, w, (7, 6), **a),
            nc.convolution_backprop_filters(x, (3, 3), dy, **a))


def test_sixteen_threads_at_once_give_right_answers():
    seeds = list(range(16))
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(_call, seeds * 2))
    for seed, (dx, dw) in zip(seeds * 2, results):
        x, w, dy = (a.astype(np.float64) for a in _problem(seed))
        args = ((2, 1), (1, 1), (1, 1), (1, 1), 1)
        ref_dx = R.conv_bwd_data(dy, w, (7, 6), *args)
        ref_dw = R.conv_bwd_filter(x, dy, (3, 3), *args)
        assert R.normalized_error(dx, ref_dx, R.conv_bwd_data(abs(dy), abs(w), (7, 6), *args)) < 1e-5
        assert R.normalized_error(dw, ref_dw, R.conv_bwd_filter(abs(x), abs(dy), (3, 3), *args)) < 1e-5


@pytest.mark.parametrize("layer", ["workqueue", "omp"])
def test_threading_layers_survive_concurrent_calls(layer, tmp_path):
    # workqueue aborts the process on concurrent parallel calls unless numbaconv serialises.
    code = textwrap.dedent("""
        import numba, numpy as np, numbaconv as nc
        from concurrent.futures import ThreadPoolExecutor
        x = np.ones((2, 9, 9, 4)); w = np.ones((3, 3, 4, 4))
        ref = nc.conv2d(x, w, 1, "SAME", strategy="direct")
        def f(i):
            return nc.conv2d(x, w, 1, "SAME", strategy="direct")
        with ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(f, range(32)))
        assert all((o == ref).all() for o in outs)
        print("layer", numba.threading_layer())
    """)
    env = dict(os.environ, NUMBA_THREADING_LAYER=layer, NUMBA_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0 and "No threading layer could be loaded" in r.stderr:
        pytest.skip(f"the {layer} threading layer is not available here")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"layer {layer}" in r.stdout


def test_set_num_threads_is_respected_and_validated():
    before = nc.get_num_threads()
    try:
        nc.set_num_threads(1)
        x, w, dy = _problem(0)
        p = nc.plan("convolution_backprop_data", dy, w, (7, 6), strides=(2, 1), pads_begin=1,
                    pads_end=1)
        assert p.threads == 1
        with pytest.raises(ValueError, match="NUMBA_NUM_THREADS"):
            nc.set_num_threads(numba.config.NUMBA_NUM_THREADS + 1)
        with pytest.raises(TypeError):
            nc.set_num_threads("2")
    finally:
        nc.set_num_threads(before)
