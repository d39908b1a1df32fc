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
