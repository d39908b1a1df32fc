"""ResNet-50 v1.5 layers (NHWC, float32, mb=8): the project's default suite.

A handful of representative layers, not all 23: the 7x7 stride-2 stem with 3 input channels,
a 3x3 at 56x56, a strided 1x1 projection, a 3x3 at 14x14 and a wide 1x1 at 7x7.
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
