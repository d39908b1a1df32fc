"""The one wrapper every kernel is compiled through.

Caching, fastmath and the threading policy live here so that no kernel module sets them
itself: a kernel module only says ``@kernel(parallel=True)`` or ``@helper``.

* ``cache=True`` by default; Numba raises at decoration time when no cache directory is
  writable (read-only site-packages and no usable HOME): we then warn once and compile in
  memory instead of failing the import.
* ``fastmath`` is :data:`numbaconv.config.FASTMATH` (no ``nnan``/``ninf``).
* ``error_model="numpy"`` drops the division-by-zero checks from index arithmetic.
* ``nogil=True`` so that Python threads can call kernels concurrently.
"""
import threading
import warnings

import numba

from . import config

_cache_ok = None
_cache_lock = threading.Lock()


def _options(parallel, cache):
    return dict(parallel=parallel, fastmath=set(config.FASTMATH), error_model="numpy",
                nogil=True, cache=cache)


def _compile(fn, parallel):
    global _cache_ok
    with _cache_lock:
        want_cache = config.CACHE and _cache_ok is not False
        if want_cache:
            try:
                return numba.njit(**_options(parallel, True))(fn)
            except Exception as exc:  # numba: "cannot cache function ...: no locator available"
                if _cache_ok is None:
                    warnings.warn(
                        f"numbaconv: no writable cache directory for compiled kernels ({exc}); "
                        "kernels are compiled in memory on first use in each process. Set "
                        "NUMBA_CACHE_DIR to a writable directory to keep them.",
                        RuntimeWarning, stacklevel=3)
                _cache_ok = False
        return numba.njit(**_options(parallel, False))(fn)


def kernel(fn=None, *, parallel=True):
    """Decorate a kernel entry point (a parallel loop nest by default)."""
    if fn is None:
        return lambda f: _compile(f, parallel)
    return _compile(fn, parallel)


def helper(fn):
    """Decorate a serial helper inlined into kernels of the same module."""
    return _compile(fn, False)


def cache_enabled():
    """Whether kernels are being cached on disk (None: not decided yet)."""
    return config.CACHE and _cache_ok is not False
