"""A fix for numba's CUDA simulator, applied in the children that run kernels in it.

The simulator gives the threads of a block one array per ``cuda.shared.array`` source line,
looked up in a dict and created on a miss (``FakeCUDAShared.array``: get, then ``np.empty``,
then set). Its threads are Python threads, so two of them can both miss and each work on
an array of its own: a tile loaded by one thread is then not seen by the others, and a
kernel that is correct on a GPU gives a wrong result, rarely and at random (the split-K
backward-data GEMM, for one). :func:`lock_shared_arrays` makes the lookup
and the creation one step under a lock. Nothing changes on a GPU or in numbaconv itself.
"""
import sys
import threading
import traceback

import numpy as np


def lock_shared_arrays(cls=None):
    """Replace the simulator's shared-array lookup by a locked one (no-op off the
    simulator); ``cls``: patch this class instead (a test's copy)."""
    from numba import config
    if cls is None and not config.ENABLE_CUDASIM:
        return
    try:
        from numba.cuda.simulator import kernelapi
        from numba.np import numpy_support
        from numba.core import types
    except ImportError:  # pragma: no cover (a simulator laid out differently)
        return
    cls = kernelapi.FakeCUDAShared if cls is None else cls
    if getattr(cls, "_locked_by_numbaconv_tests", False):
        return
    lock = threading.Lock()

    def array(self, shape, dtype):
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        if shape == 0:  # dynamic shared memory: one buffer for every request
            count = self._dynshared_size // dtype.itemsize
            return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
        # keyed by the caller's file and line, as the simulator's own lookup is
        caller = traceback.extract_stack(sys._getframe())[-2][0:2]
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                res = np.empty(shape, dtype)
                self._allocations[caller] = res
        return res

    cls.array = array
    cls._locked_by_numbaconv_tests = True
