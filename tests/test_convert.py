"""float16 <-> float32 conversion kernels against NumPy's casts, bit for bit, and the
backend using them for float16 calls."""
import numpy as np
import pytest

import numbaconv as nc
from numbaconv import reference as R
from numbaconv.backends import cpu
from numbaconv.kernels.cpu import convert as C

pytestmark = pytest.mark.skipif(not C.available(), reason="no F16C on this host")


def _same_bits(a, b):
    ia = a.view(np.uint32 if a.dtype == np.float32 else np.uint16)
    ib = b.view(ia.dtype)
    return np.all((ia == ib) | (np.isnan(a) & np.isnan(b)))


@pytest.mark.parametrize("parallel", [False, True])
def test_every_float16_widens_exactly(parallel):
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    assert _same_bits(cpu.to_float32(h, parallel), h.astype(np.float32))


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, C.BLOCK - 1, C.BLOCK + 13, 3 * C.BLOCK + 5])
def test_narrowing_rounds_as_numpy(n, parallel):
    rng = np.random.default_rng(n)
    x = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([65504, 65519.99, 65520, 1e-8, 2.0 ** -25, 2.0 ** -24, 3 * 2.0 ** -26,
                        -0.0, np.inf, -np.inf, np.nan, 6.1e-5, 1.0009765625, 1.00048828125],
                       np.float32)
    x = np.concatenate([special[:n], x[len(special[:n]):]]) if n else x
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    got = cpu.to_float16(x, parallel)
    assert got.dtype == np.float16 and got.shape == x.shape
    assert _same_bits(got, want)


def test_layouts_and_shapes():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 5, 7, 2)).astype(np.float16)
    t = np.moveaxis(a, 1, -1)  # not contiguous
    assert np.array_equal(cpu.to_float32(t), t.astype(np.float32))
    b = rng.standard_normal((4, 9, 6)).astype(np.float32)[:, ::2]
    assert np.array_equal(cpu.to_float16(b), b.astype(np.float16))


@pytest.mark.parametrize("strategy", ["gemm", "direct"])
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
def test_float16_calls_match_the_numpy_cast_path(data_format, strategy, monkeypatch):
    """The backend's fast casts (serial next to BLAS, parallel next to the direct loop
    nests) give the same result as NumPy's, in both layouts."""
    rng = np.random.default_rng(4)
    nxc = data_format == "NXC"
    x = rng.standard_normal((2, 9, 8, 6) if nxc else (2, 6, 9, 8)).astype(np.float16)
    dy = rng.standard_normal((2, 9, 8, 16) if nxc else (2, 16, 9, 8)).astype(np.float16)
    w = rng.standard_normal((3, 3, 6, 16)).astype(np.float16)
    kw = dict(strides=1, pads_begin=1, pads_end=1, data_format=data_format,
              strategy=strategy)
    fast_d = nc.convolution_backprop_data(dy, w, (9, 8), **kw)
    fast_w = nc.convolution_backprop_filters(x, (3, 3), dy, **kw)
    monkeypatch.setattr(cpu, "_fast_half", [None])
    slow_d = nc.convolution_backprop_data(dy, w, (9, 8), **kw)
    slow_w = nc.convolution_backprop_filters(x, (3, 3), dy, **kw)
    for fast, slow in ((fast_d, slow_d), (fast_w, slow_w)):
        assert fast.dtype == np.float16 and fast.shape == slow.shape
        assert np.array_equal(fast.view(np.uint16), slow.view(np.uint16))
    ref = R.conv_bwd_data(np.moveaxis(dy, 1, -1).astype(np.float64) if not nxc else
                          dy.astype(np.float64), w.astype(np.float64), (9, 8), (1, 1),
                          (1, 1), (1, 1), (1, 1), 1)
    got = fast_d if nxc else np.moveaxis(fast_d, 1, -1)
    assert np.abs(got.astype(np.float64) - ref).max() <= 1e-2 * np.abs(ref).max()


def test_conversions_run_in_parallel_only_next_to_numba_parallel_regions():
    """The backend's float16 passes run on every thread for strategies that compute in
    Numba parallel regions alone (direct loop nests, the implicit GEMM), serially next to
    BLAS calls and Python worker threads (whose spinning threads they fought)."""
    import numba
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one thread: every conversion is serial")
    nt = nc.get_num_threads()
    nc.set_num_threads(2)
    try:
        _check_parallel_conversions()
    finally:
        nc.set_num_threads(nt)


def _check_parallel_conversions():
    from numbaconv.planner import implementation
    dy = np.zeros((2, 14, 14, 64), np.float16)
    w = np.zeros((3, 3, 64, 64), np.float16)
    kw = dict(strides=1, pads_begin=1, pads_end=1)
    seen = {}
    for strategy in ("direct", "gemm", "winograd"):
        plan = nc.plan("convolution_backprop_data", dy, w, (14, 14), strategy=strategy, **kw)
        prep = cpu._prepared(plan)
        want = implementation(plan).numba_parallel(plan.problem, plan.tiles)
        assert prep.parallel == want
        seen[strategy, plan.variant] = prep.parallel
    assert seen["direct", ""] is True
    assert seen["winograd", ""] is False
    assert seen.get(("gemm", "implicit"), True) is True
