"""Import and first-call cost, each sample in a fresh interpreter (asv ``timeraw_``).

``timeraw_`` methods return the code to time (optionally with untimed setup code); asv runs
it with ``python -c`` in a new process, so nothing imported or compiled here leaks in.
"""
from . import common

# A small 3x3 layer: the first call's cost is compilation (or loading the disk cache), not
# arithmetic. Setup code (untimed) builds the arrays with NumPy only.
_ARRAYS = """
import os
import numpy as np
{env}
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 16, 16, 16), dtype=np.float32)
w = rng.standard_normal((3, 3, 16, 16), dtype=np.float32)
dy = rng.standard_normal((1, 16, 16, 16), dtype=np.float32)
attrs = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1])
"""
_CALLS = {
    "convolution": "numbaconv.convolution(x, w, **attrs)",
    "convolution_backprop_data": "numbaconv.convolution_backprop_data(dy, w, [16, 16], **attrs)",
    "convolution_backprop_filters":
        "numbaconv.convolution_backprop_filters(x, [3, 3], dy, **attrs)",
}
# "disk": kernels loaded from Numba's on-disk cache (filled in setup); "none": compiled.
_ENV = {"disk": "os.environ['NUMBACONV_CACHE'] = '1'",
        "none": "os.environ['NUMBACONV_CACHE'] = '0'"}


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
    params = [list(common.GENERIC_OPS), list(_ENV)]
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
