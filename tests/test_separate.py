"""Helpers compiled apart from the kernels that call them (``numbaconv._jit.separate``),
and callees compiled for their arguments' plain types (``numbaconv._jit._Dispatcher``)."""
import os
import subprocess
import sys

import numpy as np
import pytest
from numba import prange
from numba.core.errors import TypingError

from numbaconv._jit import helper, kernel, par_for, separate, specialise


@separate("void({T}[:, ::1], {T}[::1], int64, int64)", f32="float32", f64="float64")
def _row_sums(a, out, r0, r1):
    for r in range(r0, r1):
        acc = 0.0
        for j in range(a.shape[1]):
            acc += a[r, j]
        out[r] = acc


@kernel
def _row_sums_parallel(fns, a, out, n):
    rows = a.shape[0]
    for c in prange(n):
        _row_sums(fns, a, out, rows * c // n, rows * (c + 1) // n)


@kernel(parallel=False)
def _row_sums_serial(fns, a, out):
    _row_sums(fns, a, out, 0, a.shape[0])


@kernel(parallel=False)
def _row_sums_of_ints(fns, a, out):
    _row_sums(fns, a, out, 0, a.shape[0])


@pytest.mark.parametrize("dtype, name", [(np.float32, "f32"), (np.float64, "f64")])
def test_kernels_call_the_variant_of_their_arguments(dtype, name):
    a = np.random.default_rng(0).standard_normal((37, 9)).astype(dtype)
    for n in (1, 3, 5):
        out = np.full(37, np.nan, dtype)
        _row_sums_parallel(_row_sums.table(name), a, out, n)
        np.testing.assert_allclose(out, a.astype(np.float64).sum(1), rtol=1e-5)
    # a read-only operand fits the variant declared writable (one data model)
    a.flags.writeable = False
    out = np.zeros(37, dtype)
    _row_sums_serial(_row_sums.table(name), a, out)
    np.testing.assert_allclose(out, a.astype(np.float64).sum(1), rtol=1e-5)


def test_a_variant_not_compiled_raises_instead_of_calling_nowhere():
    a = np.ones((4, 3), np.float64)
    empty = np.zeros(2, np.int64)  # no address filled in
    with pytest.raises(RuntimeError, match=r"_row_sums: variant 'f64' is not compiled"):
        _row_sums_serial(empty, a, np.zeros(4))


def test_arguments_that_fit_no_variant_are_a_typing_error():
    with pytest.raises(TypingError, match=r"_row_sums: no variant of \['f32', 'f64'\]"):
        _row_sums_of_ints(_row_sums.table("f64"), np.ones((4, 3), np.int64),
                          np.zeros(4, np.int64))
    with pytest.raises(ValueError, match=r"_row_sums: no variant 'f16'; its variants are "
                                         r"\['f32', 'f64'\]"):
        _row_sums.table("f16")


def _cache_stats_in_two_processes(code, cache_dir):
    """Run ``code`` (which defines ``ds``, a list of dispatchers) in two fresh processes
    sharing the disk cache ``cache_dir``; per process, the cache hits and misses of ``ds``."""
    code += ("print(sum(len(d.stats.cache_hits) for d in ds),"
             " sum(len(d.stats.cache_misses) for d in ds))\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir), NUMBACONV_CACHE="1",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, cwd=root, timeout=300) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    return [r.stdout.split() for r in runs]


def test_the_kernel_and_its_helper_load_from_the_disk_cache(tmp_path):
    code = (
        "import numpy as np, tests.test_separate as t\n"
        "a = np.arange(12.0).reshape(4, 3); out = np.zeros(4)\n"
        "t._row_sums_parallel(t._row_sums.table('f64'), a, out, 2)\n"
        "assert out.tolist() == [3.0, 12.0, 21.0, 30.0], out\n"
        "ds = [t._row_sums.dispatcher, t._row_sums_parallel]\n")
    first, second = _cache_stats_in_two_processes(code, tmp_path)
    assert first == ["0", "2"]    # both compiled (and stored)
    assert second == ["2", "0"]   # both loaded


@helper
def _count(n, step):
    s = 0
    for i in range(0, n, step):
        s += i
    return s


@kernel(parallel=False)
def _calls_with_a_literal(n):
    k = 0            # seen first as the literal 0, then as int64
    t = _count(n, 1)
    for i in range(3):
        t += _count(n, k + 1)
        k += 1
    return t + _count(5, 1)


def test_a_callee_is_compiled_once_for_literal_and_plain_arguments():
    from numbaconv import _jit
    # the caller compiled here, not loaded from a disk cache that an earlier run filled
    # (a loaded caller has the callee inside and never asks for it)
    caller = _jit._njit(_calls_with_a_literal.py_func, False, False)
    assert caller(10) == 45 + 45 + 20 + 18 + 10
    assert len(_count.signatures) == 1, _count.signatures


_SCALE = 0


def _scaled(a, out):
    for i in range(a.shape[0]):
        out[i] = a[i] * 3.0 if _SCALE == 3 else a[i] * 5.0


_scaled_3 = separate(f64="void(float64[::1], float64[::1])")(specialise(_scaled, "3",
                                                                       _SCALE=3))
_scaled_5 = separate(f64="void(float64[::1], float64[::1])")(specialise(_scaled, "5",
                                                                       _SCALE=5))


@kernel(parallel=False)
def _scale_by(fns3, fns5, k, a, out):
    if k == 3:
        _scaled_3(fns3, a, out)
    else:
        _scaled_5(fns5, a, out)


def test_specialised_copies_compile_their_own_branch_and_load_from_the_cache(tmp_path):
    a = np.arange(4.0)
    out = np.zeros(4)
    _scale_by(_scaled_3.table("f64"), _scaled_5.table(), 3, a, out)
    assert out.tolist() == [0.0, 3.0, 6.0, 9.0]
    _scale_by(_scaled_3.table(), _scaled_5.table("f64"), 5, a, out)
    assert out.tolist() == [0.0, 5.0, 10.0, 15.0]
    assert _scaled_3.dispatcher.py_func.__qualname__ == "_scaled_3"
    code = (
        "import numpy as np, tests.test_separate as t\n"
        "out = np.zeros(2)\n"
        "t._scale_by(t._scaled_3.table('f64'), t._scaled_5.table(), 3, np.ones(2), out)\n"
        "assert out.tolist() == [3.0, 3.0], out\n"
        "ds = [t._scaled_3.dispatcher, t._scale_by]\n")
    first, second = _cache_stats_in_two_processes(code, tmp_path)
    assert first == ["0", "2"]
    assert second == ["2", "0"]


# -- par_for: one shared parallel loop for every kernel -----------------------------------
@separate("void({T}[:, ::1], {T}[::1], int64[::1], int64)", f32="float32", f64="float64")
def _one_row(a, out, seen, r):
    acc = 0.0
    for j in range(a.shape[1]):
        acc += a[r, j]
    out[r] = acc
    seen[r] += 1


@kernel(parallel=False)
def _rows_par_for(fns, a, out, seen):
    par_for(_one_row, fns, a.shape[0], a, out, seen)


def _from_a_kernel(name, rows, a, out, seen):
    _rows_par_for(_one_row.table(name), a, out, seen)


def _from_python(name, rows, a, out, seen):
    _one_row.run(name, rows, a, out, seen)


@pytest.mark.parametrize("call", [_from_a_kernel, _from_python])
@pytest.mark.parametrize("dtype, name", [(np.float32, "f32"), (np.float64, "f64")])
@pytest.mark.parametrize("rows", [0, 1, 2, 7, 64])
def test_par_for_runs_every_index_once_with_the_variant_of_its_arguments(call, dtype, name,
                                                                          rows):
    """From a serial kernel (``par_for``) and from Python (``Separate.run``)."""
    import numba
    a = np.random.default_rng(rows).standard_normal((rows, 5)).astype(dtype)
    for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        numba.set_num_threads(threads)
        try:
            out = np.full(rows, np.nan, dtype)
            seen = np.zeros(rows, np.int64)
            call(name, rows, a, out, seen)
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        assert seen.tolist() == [1] * rows
        np.testing.assert_allclose(out, a.astype(np.float64).sum(1), rtol=1e-5)


@separate("void(int64[::1], int64)", i64="int64")
def _fails_at_three(seen, r):
    if r == 3:
        raise ValueError("three")
    seen[r] = 1


@kernel(parallel=False)
def _failing_par_for(fns, seen):
    par_for(_fails_at_three, fns, seen.shape[0], seen)


def test_par_for_raises_when_an_iteration_raised():
    seen = np.zeros(8, np.int64)
    with pytest.raises(RuntimeError, match="_fails_at_three: a parallel iteration raised"):
        _failing_par_for(_fails_at_three.table("i64"), seen)
    assert seen[3] == 0 and seen.sum() == 7   # the others ran


def test_par_for_without_a_compiled_variant_or_launcher_raises():
    a = np.ones((4, 3))
    none = np.zeros(3, np.int64)
    with pytest.raises(RuntimeError, match=r"_one_row: variant 'f64' is not compiled"):
        _rows_par_for(none, a, np.zeros(4), np.zeros(4, np.int64))
    no_launcher = _one_row.table("f64").copy()
    no_launcher[-1] = 0
    with pytest.raises(RuntimeError, match="_one_row: the parallel launcher is not compiled"):
        _rows_par_for(no_launcher, a, np.zeros(4), np.zeros(4, np.int64))


@kernel(parallel=False)
def _par_for_of_a_helper(fns, n):
    par_for(_count, fns, n, 1)


def test_par_for_of_anything_but_a_separate_helper_is_a_typing_error():
    with pytest.raises(TypingError, match="is not a separate helper"):
        _par_for_of_a_helper(_one_row.table("f64"), 3)
    with pytest.raises(TypingError, match=r"par_for\(_one_row\): no variant"):
        _rows_par_for(_one_row.table("f64"), np.ones((2, 2), np.int64),
                      np.zeros(2), np.zeros(2, np.int64))


# -- Separate.run: the same loop called from Python, no kernel to compile ---------------
@separate("void({T}[:, :], {T}[::1], int64, boolean, float64, float32, int32, int64)",
          f32="float32")
def _strided_row(a, out, k, neg, scale, shift, off, r):
    acc = 0.0
    for j in range(a.shape[1]):
        acc += a[r, j]
    out[r] = (-acc if neg else acc) * scale + shift + off + k


def test_run_passes_strided_arrays_and_every_scalar_kind():
    """A view with other strides (declared ``[:, :]``), a boolean, floats of both widths,
    a narrower integer and a negative one reach the helper as they are."""
    big = np.random.default_rng(1).standard_normal((9, 12)).astype(np.float32)
    a = big[::2, 1::3]                       # 5 x 4, neither C nor F contiguous
    out = np.zeros(5, np.float32)
    _strided_row.run("f32", 5, a, out, -7, True, 0.5, np.float32(0.25), np.int32(3))
    want = -a.astype(np.float64).sum(1) * 0.5 + 0.25 + 3 - 7
    np.testing.assert_allclose(out, want, rtol=1e-5)
    _strided_row.run("f32", 5, a, out, 2, False, 2.0, 0.0, 0)
    np.testing.assert_allclose(out, a.astype(np.float64).sum(1) * 2 + 2, rtol=1e-5)


def test_run_raises_when_an_iteration_raised():
    seen = np.zeros(8, np.int64)
    with pytest.raises(RuntimeError, match="_fails_at_three: a parallel iteration raised"):
        _fails_at_three.run("i64", 8, seen)
    assert seen[3] == 0 and seen.sum() == 7   # the others ran


def test_run_refuses_arguments_that_do_not_fit_the_variant():
    a = np.ones((4, 3))
    with pytest.raises(ValueError, match=r"_one_row: no variant 'f16'"):
        _one_row.run("f16", 4, a, np.zeros(4), np.zeros(4, np.int64))
    with pytest.raises(TypeError, match=r"_one_row: argument 0 must be a C-contiguous 2-d "
                                        r"float32 array, got ndarray float64"):
        _one_row.run("f32", 4, a, np.zeros(4), np.zeros(4, np.int64))
    with pytest.raises(TypeError, match=r"argument 0 must be a C-contiguous"):
        _one_row.run("f64", 2, a[:, ::2], np.zeros(4), np.zeros(4, np.int64))
    with pytest.raises(TypeError, match=r"argument 2 must be a C-contiguous 1-d int64"):
        _one_row.run("f64", 4, a, np.zeros(4), [0, 0, 0, 0])
    with pytest.raises(TypeError, match=r"3 arguments besides the index, got 2"):
        _one_row.run("f64", 4, a, np.zeros(4))
    with pytest.raises(TypeError, match=r"_fails_at_three: argument 0 must be"):
        _fails_at_three.run("i64", 1, 2.5)
    with pytest.raises(TypeError, match=r"_strided_row: argument 2 must be an integer"):
        _strided_row.run("f32", 1, np.ones((1, 1), np.float32), np.zeros(1, np.float32),
                         1.5, True, 1.0, 0.0, 0)


@separate("void(int64[::1], int64)", i64="int64")
def _walked(seen, r):  # run only by the test below: not compiled before its walk
    seen[r] += 1


def test_run_in_the_helper_s_walk_records_and_runs_nothing():
    from numbaconv import _ahead
    seen = np.zeros(4, np.int64)
    _ahead.start_walk()
    try:
        _walked.run("i64", 4, seen)
    finally:
        found = _ahead.end_walk()
    assert seen.sum() == 0
    assert any("._walked(" in key for _, _, key in found), [k for _, _, k in found]
    _walked.run("i64", 4, seen)                 # outside the walk it runs
    assert seen.tolist() == [1, 1, 1, 1]


def test_run_passes_arrays_as_records_where_numpy_objects_differ(monkeypatch):
    """Where NumPy's array objects would not have the field offsets the trampolines read,
    each array goes as a record of its own with the same fields: same results."""
    from numbaconv import _jit
    monkeypatch.setattr(_jit, "_layout", [False])
    big = np.random.default_rng(2).standard_normal((9, 12)).astype(np.float32)
    a = big[1::2, ::3]
    out = np.zeros(4, np.float32)
    _strided_row.run("f32", 4, a, out, 1, False, 1.0, 0.0, 0)
    np.testing.assert_allclose(out, a.astype(np.float64).sum(1) + 1, rtol=1e-5)
    seen = np.zeros(9, np.int64)
    _one_row.run("f64", 9, big.astype(np.float64), np.zeros(9), seen)
    assert seen.tolist() == [1] * 9


def test_numpy_array_objects_have_the_layout_the_trampolines_read():
    from numbaconv import _jit
    _jit._layout.clear()
    assert _jit._array_layout()
