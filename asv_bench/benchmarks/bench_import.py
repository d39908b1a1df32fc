"""Import and first-call cost, each sample in a fresh interpreter (asv ``timeraw_``).

``timeraw_`` methods return the code to time (optionally with untimed setup code); asv runs
it with ``python -c`` in a new process, so nothing imported or compiled here leaks in.
"""
from . import common

# Small problems (under the planner's small-problem limit): the first call's cost is
# compilation (or loading the disk cache), not arithmetic. Setup code (untimed) builds the
# arrays with NumPy only, and points Numba at the cache the case needs.
_ARRAYS = """
import os
import tempfile
import numpy as np
{env}
rng = np.random.default_rng(0)
def a(*shape):
    return rng.standard_normal(shape).astype(np.float32)
x2, w2, dy2 = a(2, 16, 16, 8), a(3, 3, 8, 8), a(2, 16, 16, 8)
wd = a(3, 3, 8, 1)
x3, w3, dy3 = a(1, 6, 8, 8, 4), a(3, 3, 3, 4, 4), a(1, 6, 8, 8, 4)
x1, w1, dy1 = a(2, 64, 8), a(3, 8, 8), a(2, 64, 8)
attrs = dict(strides=1, pads_begin=1, pads_end=1)
"""
#: One small call per public op (the _v2 variants share their op's kernels).
_CALLS = {
    "conv2d": "numbaconv.conv2d(x2, w2, 1, 'SAME')",
    "conv2d_backprop_input": "numbaconv.conv2d_backprop_input(x2.shape, w2, dy2, 1, 'SAME')",
    "conv2d_backprop_filter": "numbaconv.conv2d_backprop_filter(x2, w2.shape, dy2, 1, 'SAME')",
    "depthwise_conv2d_native": "numbaconv.depthwise_conv2d_native(x2, wd, 1, 'SAME')",
    "depthwise_conv2d_native_backprop_input":
        "numbaconv.depthwise_conv2d_native_backprop_input(x2.shape, wd, dy2, 1, 'SAME')",
    "depthwise_conv2d_native_backprop_filter":
        "numbaconv.depthwise_conv2d_native_backprop_filter(x2, wd.shape, dy2, 1, 'SAME')",
    "conv3d": "numbaconv.conv3d(x3, w3, 1, 'SAME')",
    "conv3d_backprop_input_v2":
        "numbaconv.conv3d_backprop_input_v2(x3.shape, w3, dy3, 1, 'SAME')",
    "conv3d_backprop_filter_v2":
        "numbaconv.conv3d_backprop_filter_v2(x3, w3.shape, dy3, 1, 'SAME')",
    "convolution": "numbaconv.convolution(x1, w1, **attrs)",
    "convolution_backprop_data": "numbaconv.convolution_backprop_data(dy1, w1, [64], **attrs)",
    "convolution_backprop_filters":
        "numbaconv.convolution_backprop_filters(x1, [3], dy1, **attrs)",
}
# "empty": a new, empty Numba cache directory (a fresh install: compile and write the
# cache); "disk": kernels loaded from the on-disk cache (filled in setup).
_ENV = {"disk": "os.environ['NUMBACONV_CACHE'] = '1'",
        "empty": "import atexit, shutil\n"
                 "os.environ['NUMBA_CACHE_DIR'] = tempfile.mkdtemp(prefix='numbaconv-asv-')\n"
                 "atexit.register(shutil.rmtree, os.environ['NUMBA_CACHE_DIR'], True)"}


class _Raw:
    number = 1
    repeat = (1, 3, 30.0)
    warmup_time = 0.0
    timeout = 300


class Import(_Raw):
    def timeraw_import_numbaconv(self):
        """``import numbaconv``: must stay cheap (no compilation, no numba.cuda)."""
        return "import numbaconv"


class FirstCall(_Raw):
    params = [list(_CALLS), list(_ENV)]
    param_names = ["op", "kernel_cache"]

    def setup(self, op, kernel_cache):
        if kernel_cache == "disk":  # fill the disk cache with this very call, once
            def fill():
                ns = {}
                exec(_ARRAYS.format(env=_ENV["disk"]), ns)
                exec("import numbaconv\n" + _CALLS[op], ns)
            common.warm(("first_call", op), fill)

    def timeraw_import_and_call(self, op, kernel_cache):
        """``import numbaconv`` and the first call of ``op`` on a small layer."""
        return "import numbaconv\n" + _CALLS[op], _ARRAYS.format(env=_ENV[kernel_cache])
