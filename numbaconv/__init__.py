"""numbaconv: convolution gradients as Numba loop nests. NumPy in, NumPy out.

Two families of entry points share one engine (front end -> ConvProblem -> planner -> backend
-> kernels): TensorFlow-compatible names (``conv2d_backprop_input``, ...) and
oneDNN-Graph-style generic names (``convolution_backprop_data``, ...). Importing numbaconv
compiles nothing and needs no GPU.
"""
from ._version import __version__

from . import runtime as _runtime

_runtime.select_threading_layer()  # a fork-safe, thread-safe layer unless the user chose one

from .api.tf import (conv2d_backprop_input, conv2d_backprop_input_v2, conv2d_backprop_filter,
                     conv2d_backprop_filter_v2, depthwise_conv2d_native_backprop_input,
                     depthwise_conv2d_native_backprop_filter, conv3d_backprop_input_v2,
                     conv3d_backprop_filter_v2, conv2d, depthwise_conv2d_native, conv3d)
from .api.onednn import convolution, convolution_backprop_data, convolution_backprop_filters
from .api._op import plan
from .planner import Plan
from .problem import ConvProblem


def warmup(dtypes=("float32",), verbose=False, processes=None, strategies=None):
    """Compile (and cache on disk) every strategy's kernels for ``dtypes`` ahead of time,
    on ``processes`` worker processes (default: one per core); ``strategies``: only these
    planner entries or families (default: all).

    Returns the seconds spent. Later processes load the cached kernels instead of compiling.
    """
    from ._warmup import warmup as _warmup
    return _warmup(dtypes=dtypes, verbose=verbose, processes=processes,
                   strategies=strategies)


def set_num_threads(n):
    """Threads used by numbaconv's kernels from now on (all calling threads).

    ``NUMBA_NUM_THREADS`` bounds it (Numba's pool size is fixed at startup).
    """
    import numba
    from . import config
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n: expected an int, got {n!r}")
    if not 1 <= n <= numba.config.NUMBA_NUM_THREADS:
        raise ValueError(f"n: expected 1..{numba.config.NUMBA_NUM_THREADS} "
                         f"(NUMBA_NUM_THREADS), got {n}")
    config.THREADS = n


def get_num_threads():
    """Threads numbaconv's kernels use."""
    return _runtime.threads()


__all__ = [
    "conv2d_backprop_input", "conv2d_backprop_input_v2", "conv2d_backprop_filter",
    "conv2d_backprop_filter_v2", "depthwise_conv2d_native_backprop_input",
    "depthwise_conv2d_native_backprop_filter", "conv3d_backprop_input_v2",
    "conv3d_backprop_filter_v2", "conv2d", "depthwise_conv2d_native", "conv3d",
    "convolution", "convolution_backprop_data", "convolution_backprop_filters",
    "plan", "Plan", "ConvProblem", "warmup", "set_num_threads", "get_num_threads", "__version__",
]
