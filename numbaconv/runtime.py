"""Process-wide runtime facts: the threads kernels use, physical memory, Numba's threading
layer and the lock around parallel code.

This module depends on nothing else in numbaconv but :mod:`numbaconv.config`, so that any
module may import it.

**The threading layer.** Numba picks its threading layer once per process, at the first
parallel launch. Its default on Linux is GNU OpenMP when TBB cannot be loaded, and GNU
OpenMP cannot survive ``fork()``: a child that runs parallel code after its parent did is
terminated ("fork() called from a process already using GNU OpenMP, this is unsafe"), so
``multiprocessing``'s default 'fork' pools hang and ``ProcessPoolExecutor`` breaks. At
import, numbaconv therefore asks Numba for TBB (thread-safe and fork-safe), making the
``tbb`` package's ``libtbb`` loadable where pip put it (``<prefix>/lib``, not on the
loader's path in a virtual environment). Where TBB cannot be loaded it asks for Numba's
``forksafe`` layer (``workqueue`` on Linux). Nothing is changed where the user chose a
layer (``NUMBA_THREADING_LAYER``, or ``numba.config.THREADING_LAYER`` set before
importing numbaconv), where parallel code has already run in this process, or where
``NUMBACONV_THREADING_LAYER=numba`` asks to leave Numba's default alone.

**Concurrent callers.** The ``workqueue`` layer aborts the process when two Python threads
enter parallel code at once. :func:`run_parallel` serialises every section that runs
Numba parallel code (conversions included) while the layer is unknown (before the first
launch) or is ``workqueue``; under ``tbb`` and ``omp`` sections run concurrently.
"""
import contextlib
import ctypes
import functools
import os
import sys
import threading

from . import config

#: What :func:`select_threading_layer` did: ``None`` (not run yet), or a short sentence.
SELECTION = None

_lock = threading.RLock()
_layer = None


def threads():
    """Threads numbaconv's kernels use: ``config.THREADS``, else the calling thread's Numba
    setting, at most Numba's pool size."""
    import numba
    n = config.THREADS if config.THREADS else numba.get_num_threads()
    return int(min(n, numba.config.NUMBA_NUM_THREADS))


@functools.lru_cache(maxsize=None)
def phys_memory():
    """The machine's physical memory in bytes, or None (asked once: two sysconf calls per
    launch were a few microseconds of every call)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return None


def _libtbb_candidates():
    """Paths where the ``tbb`` wheel may have put ``libtbb.so.12``."""
    seen = []
    try:
        from importlib import metadata
        for f in metadata.files("tbb") or ():
            if f.name == "libtbb.so.12":
                seen.append(str(f.locate()))
    except Exception:  # noqa: BLE001 - no tbb distribution, or unreadable metadata
        pass
    for prefix in (sys.prefix, sys.base_prefix):
        seen.append(os.path.join(prefix, "lib", "libtbb.so.12"))
    return [p for p in dict.fromkeys(seen) if os.path.exists(p)]


def _tbb_loadable():
    """Whether Numba's TBB pool can be loaded (preloading pip's ``libtbb`` if needed)."""
    try:
        from numba.np.ufunc import tbbpool  # noqa: F401
        return True
    except ImportError:
        pass
    for path in _libtbb_candidates():
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            from numba.np.ufunc import tbbpool  # noqa: F401,F811
            return True
        except (OSError, ImportError):
            continue
    return False


def select_threading_layer():
    """Choose a fork-safe, thread-safe threading layer unless the user chose one (see the
    module docstring). Returns :data:`SELECTION`. Cheap; runs once per process."""
    global SELECTION
    if SELECTION is not None:
        return SELECTION
    import numba
    from numba.np.ufunc import parallel

    chosen = str(numba.config.THREADING_LAYER).lower()
    if chosen in ("tbb", "safe", "threadsafe") and sys.platform.startswith("linux"):
        _tbb_loadable()  # the user's choice needs libtbb: make pip's loadable
    if os.environ.get("NUMBACONV_THREADING_LAYER", "").lower() == "numba":
        SELECTION = "left to Numba (NUMBACONV_THREADING_LAYER=numba)"
    elif os.environ.get("NUMBA_THREADING_LAYER"):
        SELECTION = f"chosen by the user (NUMBA_THREADING_LAYER={numba.config.THREADING_LAYER})"
    elif chosen != "default":
        SELECTION = f"chosen by the user (numba.config.THREADING_LAYER={numba.config.THREADING_LAYER})"
    elif getattr(parallel, "_is_initialized", False):
        SELECTION = "already started before numbaconv was imported"
    elif not sys.platform.startswith("linux"):
        # Numba's OpenMP outside Linux is not GNU OpenMP: fork-safe already.
        SELECTION = "Numba's default (fork-safe on this platform)"
    elif _tbb_loadable():
        numba.config.THREADING_LAYER = "tbb"
        SELECTION = "tbb (thread-safe and fork-safe)"
    else:
        numba.config.THREADING_LAYER = "forksafe"
        SELECTION = ("forksafe (TBB could not be loaded: install the 'tbb' package for "
                     "concurrent parallel calls; they are serialised meanwhile)")
    return SELECTION


def threading_layer():
    """Numba's threading layer once parallel code has run in this process, else ``None``."""
    return _layer


def _note_layer():
    global _layer
    import numba
    try:
        _layer = numba.threading_layer()
    except ValueError:  # no parallel region ran yet
        pass


def run_parallel(fn, *args):
    """``fn(*args)``, where ``fn`` runs Numba parallel regions (see the module docstring)."""
    if _layer is not None and _layer != "workqueue":
        return fn(*args)
    with _lock:
        try:
            return fn(*args)
        finally:
            if _layer is None:
                _note_layer()


@contextlib.contextmanager
def parallel_section():
    """The context-manager form of :func:`run_parallel`."""
    if _layer is not None and _layer != "workqueue":
        yield
        return
    with _lock:
        try:
            yield
        finally:
            if _layer is None:
                _note_layer()
