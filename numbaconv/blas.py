"""The BLAS behind the GEMM strategy: NumPy's own (its bundled OpenBLAS), thread-controlled.

The GEMMs of the GEMM strategy run in ``numpy.matmul`` on C-contiguous operands, so no
operand is copied (NumPy passes transposed views to BLAS with transpose flags). NumPy's
OpenBLAS owns all cores during a call; numbaconv's packing kernels run serially between
calls (a Numba parallel region right before or after a multithreaded BLAS call makes the two
thread pools' spinning workers fight for the cores: measured 40x slower on 2 cores).

``set_threads`` sets the OpenBLAS thread count so that ``numbaconv.set_num_threads`` and the
plan's ``threads`` hold for BLAS too, by calling OpenBLAS's own entry point through ctypes
(best effort: a BLAS without it keeps its default).

OpenBLAS picks its kernels at load time; ``OPENBLAS_CORETYPE`` in the environment overrides
that choice (on this project's reference machine it is set to ``Haswell``, AVX2 kernels), and
``corename()`` reports what is in use (``numbaconv info`` prints it).
"""
import contextlib
import ctypes
import glob
import os
import threading

import numpy as np

_lock = threading.Lock()
_lib = []


def _openblas():
    """ctypes handle of NumPy's bundled OpenBLAS, or None."""
    with _lock:
        if not _lib:
            handle = None
            libdir = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
            for path in sorted(glob.glob(os.path.join(libdir, "*openblas*.so*"))):
                try:
                    handle = ctypes.CDLL(path)
                    break
                except OSError:
                    continue
            _lib.append(handle)
        return _lib[0]


def _symbol(*names):
    lib = _openblas()
    for name in names:
        fn = getattr(lib, name, None) if lib is not None else None
        if fn is not None:
            return fn
    return None


def corename():
    """OpenBLAS's kernel set (e.g. ``Haswell``, ``SkylakeX``), or ``"unknown"``."""
    fn = _symbol("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
                 "openblas_get_corename64_", "openblas_get_corename")
    if fn is None:
        return "unknown"
    fn.restype = ctypes.c_char_p
    return fn().decode()


def get_threads():
    fn = _symbol("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
                 "openblas_get_num_threads64_", "openblas_get_num_threads")
    return int(fn()) if fn is not None else None


def set_threads(n):
    """Use ``n`` OpenBLAS threads from now on; False if this BLAS has no such entry point."""
    fn = _symbol("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                 "openblas_set_num_threads64_", "openblas_set_num_threads")
    if fn is None:
        return False
    if get_threads() != n:
        fn(ctypes.c_int(int(n)))
    return True


@contextlib.contextmanager
def threads(n):
    """Run the block with ``n`` OpenBLAS threads, then restore the caller's setting."""
    before = get_threads()
    changed = before is not None and before != n and set_threads(n)
    try:
        yield
    finally:
        if changed:
            set_threads(before)
