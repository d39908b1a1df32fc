"""3-D ResNeXt-101 grouped layers (NDHWC, float32, mb=2, 3x3x3, pad 1)."""
from . import common

# 16 and 8 groups, stride 1 and 2, large and small spatial extents.
LAYERS = common.as_list(["conv_3d:1", "conv_3d:3", "conv_3d:6", "conv_3d:8"])


class ResNeXt3DGenericOps(common._GenericOps):
    params = [LAYERS, list(common.GENERIC_OPS)]


class ResNeXt3DTFOps(common._TFOps):
    params = [LAYERS, ["conv3d", "conv3d_backprop_input_v2", "conv3d_backprop_filter_v2"]]


class ResNeXt3DStrategies(common._Strategies):
    params = [LAYERS, list(common.PASSES), common.STRATEGIES]


class ResNeXt3DPeakMem(common._PeakMem):
    # 27 taps: the largest im2col rows of the suites.
    params = [["conv_3d:8"], ["bwd_d", "bwd_w"], common.STRATEGIES]
