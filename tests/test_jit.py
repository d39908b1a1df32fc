"""The one kernel wrapper: fastmath policy, cache fallback."""
import pathlib
import re
import warnings

import numpy as np
import pytest

from numbaconv import _jit, config

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_fastmath_flags_keep_nan_and_inf():
    assert "nnan" not in config.FASTMATH and "ninf" not in config.FASTMATH
    assert "fast" not in config.FASTMATH
    assert "reassoc" in config.FASTMATH and "contract" in config.FASTMATH


def test_no_kernel_sets_its_own_jit_options():
    # caching, fastmath and threading policy live in numbaconv/_jit.py only
    offenders = []
    for path in list((ROOT / "kernels").rglob("*.py")) + list((ROOT / "numbaconv").rglob("*.py")):
        if path.name == "_jit.py":
            continue
        text = path.read_text()
        if re.search(r"fastmath\s*=|numba\.njit|@njit|from numba import .*njit", text):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_cache_fallback_warns_once_and_compiles(monkeypatch):
    calls = []

    def no_locator(self):
        calls.append("cache")
        raise RuntimeError("cannot cache function: no locator available")

    monkeypatch.setattr(_jit._Dispatcher, "enable_caching", no_locator)
    monkeypatch.setattr(_jit, "_cache_ok", None)

    def f(a):
        return a.sum()

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        k1 = _jit.kernel(f, parallel=False)
        k2 = _jit.kernel(f, parallel=False)
    assert sum("no writable cache directory" in str(w.message) for w in rec) == 1
    assert calls == ["cache"]  # the second kernel does not even try
    assert k1(np.ones(4)) == 4.0 and k2(np.ones(3)) == 3.0
    assert _jit.cache_enabled() is False
    monkeypatch.setattr(_jit, "_cache_ok", None)


def test_nan_and_inf_propagate():
    import numbaconv as nc
    x = np.ones((1, 4, 4, 8), np.float32)
    x[0, 1, 1, 0] = np.nan
    x[0, 3, 3, 1] = np.inf
    w = np.ones((3, 3, 8, 8), np.float32)
    y = nc.conv2d(x, w, 1, "SAME", strategy="direct")
    assert np.isnan(y[0, 0, 0]).all() and np.isnan(y[0, 2, 2]).all()
    dx = nc.conv2d_backprop_input(x.shape, w, y, 1, "SAME", strategy="gemm")
    assert np.isnan(dx).any()


@pytest.mark.parametrize("dt", ["float16", "float32", "float64", "uint16", "int64"])
def test_dtype_name_is_numpys_name(dt):
    # the kernel wrappers name their variants by it on every call
    assert _jit.dtype_name(np.dtype(dt)) == np.dtype(dt).name == dt
    assert _jit.dtype_name(np.zeros(2, dt).dtype) == dt   # an equal dtype object


def test_dtype_name_of_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert _jit.dtype_name(np.dtype(ml_dtypes.bfloat16)) == "bfloat16"


def test_inline_helper_is_typed_in_its_caller_not_compiled_alone():
    # helper(inline=True): Numba inlines the helper's code into the caller, so the helper
    # itself never gets a compiled overload, and the caller computes the same values
    import numba
    if numba.config.DISABLE_JIT:
        pytest.skip("no compilation under NUMBA_DISABLE_JIT")

    @_jit.helper(inline=True)
    def taps(n, out):
        k = 0
        for i in range(n):
            if i % 3 != 1:
                out[k] = i * 7 - 2
                k += 1
        return k

    @_jit.kernel(parallel=False)
    def run(n, out, count):
        count[0] = taps(n, out)

    out = np.full(10, -99, np.int64)
    count = np.zeros(1, np.int64)
    run(10, out, count)
    expect = [i * 7 - 2 for i in range(10) if i % 3 != 1]
    assert count[0] == len(expect)
    assert out[:len(expect)].tolist() == expect
    assert out[len(expect):].tolist() == [-99] * (10 - len(expect))
    assert len(taps.overloads) == 0 and len(run.overloads) == 1


_WARM_SCRIPT = """
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
import numbaconv as nc
from numbaconv import _jit
from reference import conv_bwd_data_ref
from numba.core.caching import FunctionCache
full = []
plain = FunctionCache.load_overload
FunctionCache.load_overload = lambda self, *a: full.append(1) or plain(self, *a)
rng = np.random.default_rng(3)
dy = rng.standard_normal((2, 16, 16, 64)).astype(np.float32)
w = rng.standard_normal((3, 3, 32, 64)).astype(np.float32)
dx = nc.convolution_backprop_data(dy, w, (16, 16), strides=1, pads_begin=1, pads_end=1,
                                  strategy="gemm[implicit]")
ref = conv_bwd_data_ref(dy.astype(np.float64), w.astype(np.float64), (16, 16), stride=1,
                        dilation=1, pads_begin=1, pads_end=1)
print(json.dumps(dict(err=float(np.abs(dx - ref).max() / np.abs(ref).max()),
                      registries="numba.np.linalg" in sys.modules, full=len(full))))
"""


def test_a_warm_cache_loads_kernels_without_numbas_registries(tmp_path):
    """A process whose kernels are all in the disk cache loads them without refreshing
    Numba's target context (which imports every implementation Numba has, and
    ``scipy.linalg``: 0.3-0.5 s of a warm-cache first call), through the light load
    alone, with the same result; the first process, which compiles, refreshes as before."""
    import json
    import os
    import subprocess
    import sys
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), NUMBACONV_CACHE="1",
               NUMBACONV_COMPILE_AHEAD="0")
    env.pop("NUMBA_DISABLE_JIT", None)
    code = _WARM_SCRIPT.format(tests=os.path.dirname(__file__))
    reports = []
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        reports.append(json.loads(run.stdout.strip().splitlines()[-1]))
    cold, warm = reports
    assert cold["registries"] and cold["err"] < 1e-5
    assert not warm["registries"], warm
    assert warm["full"] == 0 and warm["err"] < 1e-5, warm
