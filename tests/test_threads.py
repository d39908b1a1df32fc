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


def _run(code, layer=None):
    env = dict(os.environ)
    env.pop("NUMBA_THREADING_LAYER", None)
    env.pop("NUMBACONV_THREADING_LAYER", None)
    if layer is not None:
        env["NUMBA_THREADING_LAYER"] = layer
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("layer", ["workqueue", "omp", "tbb", None])
def test_threading_layers_survive_concurrent_calls(layer):
    # workqueue aborts the process ("Concurrent access has been detected") when two threads
    # enter parallel code at once, float16 conversions included, unless numbaconv serialises
    # every parallel section.
    r = _run("""
        import numba, numpy as np, numbaconv as nc
        from concurrent.futures import ThreadPoolExecutor
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2, 8, 8, 16)).astype(np.float16)
        w = rng.standard_normal((3, 3, 16, 16)).astype(np.float16)
        dy = rng.standard_normal((2, 8, 8, 16)).astype(np.float16)
        calls = [lambda: nc.conv2d(x, w, 1, "SAME", strategy="direct"),
                 lambda: nc.conv2d_backprop_filter(x, (3, 3, 16, 16), dy, 1, "SAME"),
                 lambda: nc.conv2d_backprop_input(x.shape, w, dy, 1, "SAME",
                                                  strategy="direct")]
        refs = [c() for c in calls]
        with ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(lambda i: (i % 3, calls[i % 3]()), range(48)))
        assert all(np.array_equal(o, refs[i]) for i, o in outs)
        print("layer", numba.threading_layer())
    """, layer)
    if r.returncode != 0 and "No threading layer could be loaded" in r.stderr:
        pytest.skip(f"the {layer} threading layer is not available here")
    assert r.returncode == 0, r.stderr[-2000:]
    if layer is not None:
        assert f"layer {layer}" in r.stdout


def test_default_layer_is_fork_safe_and_forked_children_compute():
    # GNU OpenMP (Numba's default where TBB cannot be loaded) kills a forked child that runs
    # parallel code; numbaconv selects a fork-safe layer unless the user chose one.
    r = _run("""
        import os, multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        import numba, numpy as np, numbaconv as nc
        from numbaconv import reference as R
        rng = np.random.default_rng(1)
        x = rng.standard_normal((2, 16, 16, 8)).astype(np.float32)
        dy = rng.standard_normal((2, 16, 16, 8)).astype(np.float32)
        def f(i):
            return nc.conv2d_backprop_filter(x, (3, 3, 8, 8), dy, 1, "SAME")
        ref = f(0)
        print("layer", numba.threading_layer())
        assert numba.threading_layer() in ("tbb", "workqueue"), numba.threading_layer()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if np.array_equal(f(0), ref) else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        ctx = mp.get_context("fork")
        with ctx.Pool(2) as pool:
            outs = pool.map(f, range(4))
        with ProcessPoolExecutor(2, mp_context=ctx) as ex:
            outs += list(ex.map(f, range(3)))
        assert all(np.array_equal(o, ref) for o in outs)
        expect = R.conv_bwd_filter(x.astype(np.float64), dy.astype(np.float64), (3, 3),
                                   (1, 1), (1, 1), (1, 1), (1, 1), 1)
        assert np.allclose(ref, expect, rtol=1e-4, atol=1e-4)
        print("forked children ok")
    """)
    assert r.returncode == 0, r.stdout[-1000:] + r.stderr[-2000:]
    assert "forked children ok" in r.stdout


def test_the_users_threading_layer_is_kept():
    r = _run("""
        import numba, numpy as np, numbaconv as nc
        from numbaconv import runtime
        print(runtime.SELECTION)
        nc.conv2d(np.ones((1, 5, 5, 2)), np.ones((3, 3, 2, 2)), 1, "SAME", strategy="direct")
        print("layer", numba.threading_layer())
    """, "workqueue")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "chosen by the user" in r.stdout and "layer workqueue" in r.stdout


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


def _amx_host():
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return False
    from numbaconv.kernels.cpu import _amx
    from numbaconv.strategies.bf16dot import host_has_bf16
    return host_has_bf16() and _amx.request_amx()


@pytest.mark.skipif(not _amx_host(), reason="no AMX tiles with bfloat16 products here")
@pytest.mark.parametrize("layer", ["workqueue", None])
def test_amx_entries_under_concurrent_calls_and_fork(layer):
    """AMX's tiles are configured per thread for each block of work: eight threads calling
    the two AMX entries at once get the same bits as one, under the workqueue layer and the
    default one, and a child forked after them (AMX's permission is the process's, and
    inherited) computes the same bits too."""
    r = _run("""
        import os, numpy as np, ml_dtypes, numbaconv as nc
        from concurrent.futures import ThreadPoolExecutor
        bf = ml_dtypes.bfloat16
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2, 16, 16, 64)).astype(bf)
        w = rng.standard_normal((3, 3, 64, 64)).astype(bf)
        dy = rng.standard_normal((2, 16, 16, 64)).astype(bf)
        kw = dict(strides=1, pads_begin=1, pads_end=1)
        calls = [lambda: nc.convolution_backprop_data(dy, w, (16, 16), **kw),
                 lambda: nc.convolution_backprop_filters(x, (1, 1), dy, strides=1)]
        assert [nc.plan("convolution_backprop_data", dy, w, (16, 16), **kw).variant,
                nc.plan("convolution_backprop_filters", x, (1, 1), dy, strides=1).variant] \\
            == ["bf16-amx-taps", "bf16-amx"]
        refs = [c().view(np.uint16) for c in calls]
        with ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(lambda i: (i % 2, calls[i % 2]()), range(32)))
        assert all(np.array_equal(o.view(np.uint16), refs[i]) for i, o in outs)
        pid = os.fork()
        if pid == 0:
            ok = all(np.array_equal(c().view(np.uint16), r) for c, r in zip(calls, refs))
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0, status
        print("ok")
    """, layer)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ok" in r.stdout
