"""Three fixes for numba's CUDA simulator, applied in the children that run kernels in it
(:func:`setup`).

The simulator gives the threads of a block one array per ``cuda.shared.array`` source line,
looked up in a dict and created on a miss (``FakeCUDAShared.array``: get, then ``np.empty``,
then set). Its threads are Python threads, so two of them can both miss and each work on
an array of its own: a tile loaded by one thread is then not seen by the others, and a
kernel that is correct on a GPU gives a wrong result, rarely and at random (the split-K
backward-data GEMM, for one). :func:`lock_shared_arrays` makes the lookup
and the creation one step under a lock.

The simulator runs each block's threads as Python threads (256 for the GEMM tiles), and
the launching thread polls them without pause until they finish, holding the interpreter
lock for the rest of each switch interval: the block's threads start and run slowly
(one test's launches: 51 s of CPU). :func:`yielding_poll` polls every ``POLL_SECONDS``
and sleeps in between (37 s). And every call of a device function swaps the ``cuda``
module in its globals for the kernel's fake one and back, finding it by scanning all of
the function's module globals (a module of kernels holds hundreds): the TF32 kernels'
simulated multiply calls two device functions per product, and the scans took most of
their 40 s. :func:`cheap_device_calls` finds those names once per module. Nothing changes
on a GPU or in numbaconv itself.
"""
import importlib
import sys
import threading
import time

import numpy as np


#: How often the launching thread looks at a simulated block's threads.
POLL_SECONDS = 0.0005


def setup():
    """The three fixes (no-op off the simulator)."""
    lock_shared_arrays()
    yielding_poll()
    cheap_device_calls()


def cheap_device_calls(cls=None):
    """Replace the simulator's call of a device function by one that swaps the same names
    (no-op off the simulator; ``cls``: patch this class instead, a test's copy): the names
    of the function's globals bound to the ``cuda`` module or to a fake one are found on the
    module's first call and kept; a call then swaps those that hold the real module, as
    the simulator's ``swapped_cuda_module`` does, and restores them after."""
    kernel, cls = _to_patch(cls, "numba.cuda.simulator.kernel", "FakeCUDAKernel",
                            "_cheap_calls_by_numbaconv_tests")
    if cls is None:
        return
    from numba import cuda
    from numba.cuda.simulator.kernelapi import FakeCUDAModule
    names = {}  # id(globals dict) -> (the dict, its names of a cuda module)
    original = cls.__call__

    def call(self, *args):
        if not self._device:
            return original(self, *args)
        g = self.fn.__globals__
        hit = names.get(id(g))
        if hit is None or hit[0] is not g:
            hit = names[id(g)] = (g, [k for k, v in g.items()
                                      if v is cuda or isinstance(v, FakeCUDAModule)])
        real = [k for k in hit[1] if g[k] is cuda]
        if not real:  # (inside a kernel of this module: already swapped)
            return self.fn(*args)
        fake = kernel._get_kernel_context()
        for k in real:
            g[k] = fake
        try:
            return self.fn(*args)
        finally:
            for k in real:
                g[k] = cuda

    cls.__call__ = call
    cls._cheap_calls_by_numbaconv_tests = True


def _to_patch(cls, module_name, class_name, flag):
    """``(module, class)`` for a fix to patch: the simulator's module and ``cls``, or its
    ``class_name`` there; ``(None, None)`` off the simulator (unless ``cls`` is given), where
    the simulator is laid out differently, or where the class carries ``flag`` (patched)."""
    from numba import config
    if cls is None and not config.ENABLE_CUDASIM:
        return None, None
    try:
        module = importlib.import_module(module_name)
    except ImportError:  # pragma: no cover (a simulator laid out differently)
        return None, None
    cls = getattr(module, class_name) if cls is None else cls
    return (None, None) if getattr(cls, flag, False) else (module, cls)


def yielding_poll(cls=None):
    """Replace the simulator's polling of a block's threads by one that sleeps between
    looks (no-op off the simulator); ``cls``: patch this class instead (a test's copy).
    What it does is the simulator's: start a thread per point of the block; whenever
    every live thread waits in ``syncthreads``, release them all; when one has raised,
    abort the others and raise its exception."""
    kernel, cls = _to_patch(cls, "numba.cuda.simulator.kernel", "BlockManager",
                            "_polled_by_numbaconv_tests")
    if cls is None:
        return

    def release(threads):
        for t in threads:
            t.syncthreads_blocked = False
            t.syncthreads_event.set()

    def run(self, grid_point, *args):
        def body():
            self._f(*args)

        threads = [kernel.BlockThread(body, self, grid_point, point, self._debug)
                   for point in np.ndindex(*self._block_dim)]
        for t in threads:
            t.start()
        live = threads
        while live:
            time.sleep(POLL_SECONDS)
            failed = next((t for t in threads if t.exception), None)
            if failed is not None:
                for t in threads:
                    t.abort = True
                release(threads)
                raise failed.exception[0].with_traceback(failed.exception[1])
            live = [t for t in live if t.is_alive()]
            if live and all(t.syncthreads_blocked for t in live):
                release(live)

    cls.run = run
    cls._polled_by_numbaconv_tests = True


def lock_shared_arrays(cls=None):
    """Replace the simulator's shared-array lookup by a locked one (no-op off the
    simulator); ``cls``: patch this class instead (a test's copy)."""
    _, cls = _to_patch(cls, "numba.cuda.simulator.kernelapi", "FakeCUDAShared",
                       "_locked_by_numbaconv_tests")
    if cls is None:
        return
    from numba.core import types
    from numba.np import numpy_support
    lock = threading.Lock()

    def array(self, shape, dtype):
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        if shape == 0:  # dynamic shared memory: one buffer for every request
            count = self._dynshared_size // dtype.itemsize
            return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
        # keyed by the caller's file and line, as the simulator's own lookup is
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                res = np.empty(shape, dtype)
                self._allocations[caller] = res
        return res

    cls.array = array
    cls._locked_by_numbaconv_tests = True
