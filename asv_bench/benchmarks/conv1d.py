"""1-D layers (NWC, float32): a strided stem, a long sequence, dilation 6, WaveNet."""
from . import common

LAYERS = common.as_list(["conv1d:2", "conv1d:8", "conv1d_gemm:3", "wavenet_4"])


class Conv1DGenericOps(common._GenericOps):
    params = [LAYERS, list(common.GENERIC_OPS)]


class Conv1DStrategies(common._Strategies):
    params = [LAYERS, list(common.PASSES), common.STRATEGIES]


class Conv1DPeakMem(common._PeakMem):
    # 512 -> 1024 channels, dilation 6: large dW partials and im2col rows.
    params = [["conv1d_gemm:3"], ["bwd_d", "bwd_w"], common.STRATEGIES]
