"""ResNet-50 v1.5 layers (NHWC, float32, mb=8): the project's default suite.

A handful of representative layers, not all 23: the 7x7 stride-2 stem with 3 input channels,
a 3x3 at 56x56, a strided 1x1 projection, a 3x3 at 14x14 and a wide 1x1 at 7x7. The same
layers in bfloat16 (``ResNet50BFloat16``) track the bfloat16 entries, whichever the host
runs: AMX tiles, AVX512_BF16's dot products, or float32 kernels on widened operands.
"""
from . import common

LAYERS = common.as_list(["conv1", "res2a_branch2b", "res3a_branch1", "res4b_branch2b",
                         "res5b_branch2a"])


class ResNet50GenericOps(common._GenericOps):
    params = [LAYERS, list(common.GENERIC_OPS)]


class ResNet50TFOps(common._TFOps):
    params = [LAYERS, ["conv2d", "conv2d_backprop_input", "conv2d_backprop_filter"]]


class ResNet50Strategies(common._Strategies):
    params = [LAYERS, list(common.PASSES), common.STRATEGIES]


class ResNet50PeakMem(common._PeakMem):
    # Big weights (per-thread dW partials) and a big im2col (3x3 over 64 channels at 56x56).
    params = [["res2a_branch2b", "res5b_branch2b"], ["bwd_d", "bwd_w"], common.STRATEGIES]


class ResNet50BFloat16(common._Timed):
    """The backward passes in bfloat16 (``ml_dtypes``), the planner's own choice."""

    params = [LAYERS, ["bwd_d", "bwd_w"]]
    param_names = ["layer", "direction"]

    def setup(self, layer, direction):
        try:
            import ml_dtypes  # noqa: F401  (registers the dtype name)
        except ImportError:  # asv: skip
            raise NotImplementedError("ml_dtypes is not installed (the bfloat16 extra)")
        self.call = common.generic_call(layer, direction, "bfloat16")
        common.warm(("bfloat16", layer, direction), lambda: common.run(self.call))

    def time_op(self, layer, direction):
        common.run(self.call)
