"""Representative layers of the zoo (``numbaconv bench --suite zoo``, docs/zoo.md): one per
class where numbaconv's kernels differ (NHWC/NDHWC/NWC, float32, the planner's choice).

The layers are spelled out here rather than looked up in ``numbaconv.suites`` so that the
module imports, and times the same problems, on commits older than the zoo: ``asv
continuous main HEAD`` and ``asv run`` over a range of commits need no zoo in the commit
under test, only ``suites.Layer`` and ``suites.call``.
"""
import functools
import math
import time

from numbaconv import suites

from . import common

#: name -> (mb, g, ic, oc, input, kernel, stride, pad before, pad after, dilation), each
#: size a tuple per axis (as ``suites.Layer``).
LAYERS = {
    # few output channels: the weight gradient reduces over 131072 pixels into 256 x 2
    "centernet:wh_1x1": (2, 1, 256, 2, (128, 128), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1)),
    # DenseNet growth layer: 3x3 with 32 output channels
    "densenet121:block2_3x3": (8, 1, 128, 32, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1),
                               (1, 1)),
    # DenseNet-BC growth layer: 48 -> 12 over 8x8 rows (gemm[patch-t]'s transposed GEMM)
    "densenet_bc100:block3_3x3": (64, 1, 48, 12, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1),
                                  (1, 1)),
    # 32 groups of 16 channels (ResNeXt-50)
    "resnext50:layer3_conv2": (8, 32, 512, 512, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1),
                               (1, 1)),
    # groups 2 at 13x13 (AlexNet)
    "alexnet:conv4": (8, 2, 384, 384, (13, 13), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    # factorised 1x7 (Inception-v3)
    "inception_v3:Mixed_6b_7x7_2": (8, 1, 128, 128, (17, 17), (1, 7), (1, 1), (0, 3), (0, 3),
                                    (1, 1)),
    # dilated factorised 3x1, dilation 4 (ERFNet)
    "erfnet:nb128_3x1_d4": (4, 1, 128, 128, (64, 128), (3, 1), (1, 1), (4, 0), (4, 0),
                            (4, 1)),
    # depthwise 5x5 (EfficientNet-B0)
    "efficientnet_b0:mb5_dw5": (8, 240, 240, 240, (28, 28), (5, 5), (1, 1), (2, 2), (2, 2),
                                (1, 1)),
    # dense 3x3x3 over 256 -> 512 channels (C3D)
    "c3d:conv4a": (1, 1, 256, 512, (4, 14, 14), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1),
                   (1, 1, 1)),
    # long depthwise 1-D kernel (QuartzNet)
    "quartznet:b3_dw51": (8, 512, 512, 512, (800,), (51,), (1,), (25,), (25,), (1,)),
    # one-channel 1-D stem, kernel 16 stride 8 (Conv-TasNet)
    "convtasnet:encoder": (4, 1, 1, 512, (32000,), (16,), (8,), (0,), (0,), (1,)),
}


@functools.lru_cache(maxsize=None)
def _layer(name):
    mb, g, ic, oc, isz, ksz, st, pb, pe, dl = LAYERS[name]
    return suites.Layer("zoo", name, mb, g, ic, oc, isz, ksz, st, pb, pe, dl)


@functools.lru_cache(maxsize=None)
def _arrays(name):
    return suites.tensors(_layer(name), common.DTYPE, seed=0)


class ZooGenericOps(common._Timed):
    """The three generic ops on each representative zoo layer, planner's choice."""

    params = [list(LAYERS), list(common.GENERIC_OPS)]
    param_names = ["layer", "op"]

    def setup(self, layer, op):
        direction = {v: k for k, v in suites.OPS.items()}[op]
        self.call = suites.call(_layer(layer), direction, common.DTYPE, arrays=_arrays(layer))
        common.warm(("zoo", layer, op), lambda: common.run(self.call))

    def time_op(self, layer, op):
        common.run(self.call)

    def track_gflops(self, layer, op):
        """GFLOP/s of the default dispatch (best of 3 calls)."""
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            common.run(self.call)
            best = min(best, time.perf_counter() - t0)
        return round(_layer(layer).flops / best / 1e9, 3)

    track_gflops.unit = "GFLOP/s"
