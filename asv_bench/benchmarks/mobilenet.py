"""MobileNet-V2 depthwise 3x3 layers (groups = channels, NHWC, float32, mb=8).

Both padding conventions of a stride-2 layer (symmetric pad 1 and TF SAME, 0 before and 1
after), a wide early layer and the deepest late one.
"""
from . import common

LAYERS = common.as_list(["dw32_112_s1_p1", "dw96_112_s2_p1", "dw96_112_s2_same",
                         "dw960_7_s1_p1"])


class MobileNetGenericOps(common._GenericOps):
    params = [LAYERS, list(common.GENERIC_OPS)]


class MobileNetTFOps(common._TFOps):
    params = [LAYERS, ["depthwise_conv2d_native", "depthwise_conv2d_native_backprop_input",
                       "depthwise_conv2d_native_backprop_filter"]]


class MobileNetStrategies(common._Strategies):
    params = [LAYERS, list(common.PASSES), common.STRATEGIES]


class MobileNetRepeatedCall:
    """A repeated (memoised) TF-style call on a small depthwise layer (batch 1, 7x7x960:
    a kernel of a few microseconds), so that its time is mostly numbaconv's Python around
    the kernel: parsing from the memo, the plan lookup, the bound call on views of the
    caller's arrays (about 20 us, docs/performance.md "Python per call"); params: pass."""

    params = [["bwd_d", "bwd_w"]]
    param_names = ["direction"]
    number = 200
    repeat = (3, 10, 10.0)
    warmup_time = 0.1
    timeout = 120

    def setup(self, direction):
        import numpy as np

        rng = np.random.default_rng(0)
        x = rng.standard_normal((1, 7, 7, 960), dtype=np.float32)
        dy = rng.standard_normal((1, 7, 7, 960), dtype=np.float32)
        w = rng.standard_normal((3, 3, 960, 1), dtype=np.float32)
        strides = [1, 1, 1, 1]
        if direction == "bwd_d":
            self.call = lambda: common.numbaconv.depthwise_conv2d_native_backprop_input(
                [1, 7, 7, 960], w, dy, strides, "SAME")
        else:
            self.call = lambda: common.numbaconv.depthwise_conv2d_native_backprop_filter(
                x, [3, 3, 960, 1], dy, strides, "SAME")
        self.call()  # compiles (or loads) the kernels and fills the memo

    def time_call(self, direction):
        self.call()
