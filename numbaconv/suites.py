"""Benchmark suites: layer shapes from real networks.

Sources: oneDNN's benchdnn input files (``tests/benchdnn/inputs/conv/``:
``shapes_resnet_50_v1_5``, ``shapes_3d_resnext101``, ``shapes_1d``) and XNNPACK's
``bench/dwconv.h`` for MobileNet-V2.

* ``resnet50``: the 23 distinct convolution layers of ResNet-50 v1.5 (benchdnn's names,
  ``conv1``, ``res2a_branch1`` ...), NHWC, batch 8.
* ``mobilenet_v2_dw``: MobileNet-V2's 10 depthwise 3x3 shapes, NHWC, batch 8; the stride-2
  ones both with pad 1 and with TensorFlow's SAME (14 layers).
* ``resnext3d``: 6 grouped 3x3x3 layers of the 3-D ResNeXt-101, NDHWC, batch 2.
* ``conv1d``: 6 1-D layers under benchdnn's names (``conv1d:N``, ``conv1d_gemm:3`` and
  WaveNet's ``wavenet_4``), NWC, batch per layer.

Each :class:`Layer` is one convolution layer in canonical generic form (channels last, XIO),
named by a benchdnn-style descriptor. :func:`call` turns a layer and a pass into a call of
the generic ops (``convolution``, ``convolution_backprop_data``,
``convolution_backprop_filters``) with seeded random data.
"""
from dataclasses import dataclass
import functools
import math

import numpy as np

PASSES = ("bwd_d", "bwd_w", "fwd")
OPS = {"fwd": "convolution", "bwd_d": "convolution_backprop_data",
       "bwd_w": "convolution_backprop_filters"}


@dataclass(frozen=True)
class Layer:
    suite: str
    name: str
    mb: int
    g: int
    ic: int
    oc: int
    isz: tuple
    ksz: tuple
    stride: tuple
    pad_begin: tuple
    pad_end: tuple
    dilation: tuple

    @property
    def nd(self):
        return len(self.isz)

    @property
    def osz(self):
        return tuple((i + b + e - (k - 1) * d - 1) // s + 1 for i, k, s, d, b, e in
                     zip(self.isz, self.ksz, self.stride, self.dilation, self.pad_begin,
                         self.pad_end))

    @property
    def flops(self):
        return 2 * self.mb * self.oc * (self.ic // self.g) * math.prod(self.ksz) * math.prod(
            self.osz)

    @property
    def symmetric(self):
        return self.pad_begin == self.pad_end

    def descriptor(self):
        """benchdnn-style: ``g..mb..ic..ih..oc..oh..kh..sh..ph..n"name"``."""
        ax = "dhw"[3 - self.nd:]
        s = (f"g{self.g}" if self.g != 1 else "") + f"mb{self.mb}ic{self.ic}"
        s += "".join(f"i{a}{v}" for a, v in zip(ax, self.isz)) + f"oc{self.oc}"
        s += "".join(f"o{a}{v}" for a, v in zip(ax, self.osz))
        s += "".join(f"k{a}{v}" for a, v in zip(ax, self.ksz))
        s += "".join(f"s{a}{v}" for a, v in zip(ax, self.stride) if v != 1)
        s += "".join(f"p{a}{v}" for a, v in zip(ax, self.pad_begin) if v)
        s += "".join(f"P{a}{e}" for a, b, e in zip(ax, self.pad_begin, self.pad_end) if e != b)
        s += "".join(f"d{a}{v - 1}" for a, v in zip(ax, self.dilation) if v != 1)
        return s + f'n"{self.name}"'


def _layer(suite, name, mb, g, ic, oc, isz, osz, k, s, pb, d=1, nd=2):
    isz = (isz,) * nd if isinstance(isz, int) else tuple(isz)
    osz = (osz,) * nd if isinstance(osz, int) else tuple(osz)
    ks, st, dl, p0 = (k,) * nd, (s,) * nd, (d,) * nd, (pb,) * nd if isinstance(pb, int) else pb
    # pad_end: symmetric when that gives the listed output, else what it takes (benchdnn).
    pe = []
    for i, o, kk, ss, dd, b in zip(isz, osz, ks, st, dl, p0):
        if (i + 2 * b - (kk - 1) * dd - 1) // ss + 1 == o:
            pe.append(b)
        else:
            pe.append((o - 1) * ss + (kk - 1) * dd + 1 - i - b)
    return Layer(suite, name, mb, g, ic, oc, isz, ks, st, tuple(p0), tuple(pe), dl)


_RESNET50 = [  # name ic oc in out k stride pad
    ("conv1", 3, 64, 224, 112, 7, 2, 3),
    ("res2a_branch1", 64, 256, 56, 56, 1, 1, 0),
    ("res2a_branch2a", 64, 64, 56, 56, 1, 1, 0),
    ("res2a_branch2b", 64, 64, 56, 56, 3, 1, 1),
    ("res2b_branch2a", 256, 64, 56, 56, 1, 1, 0),
    ("res3a_branch1", 256, 512, 56, 28, 1, 2, 0),
    ("res3a_branch2a", 256, 128, 56, 56, 1, 1, 0),
    ("res3a_branch2b", 128, 128, 56, 28, 3, 2, 1),
    ("res3a_branch2c", 128, 512, 28, 28, 1, 1, 0),
    ("res3b_branch2a", 512, 128, 28, 28, 1, 1, 0),
    ("res3b_branch2b", 128, 128, 28, 28, 3, 1, 1),
    ("res4a_branch1", 512, 1024, 28, 14, 1, 2, 0),
    ("res4a_branch2a", 512, 256, 28, 28, 1, 1, 0),
    ("res4a_branch2b", 256, 256, 28, 14, 3, 2, 1),
    ("res4a_branch2c", 256, 1024, 14, 14, 1, 1, 0),
    ("res4b_branch2a", 1024, 256, 14, 14, 1, 1, 0),
    ("res4b_branch2b", 256, 256, 14, 14, 3, 1, 1),
    ("res5a_branch1", 1024, 2048, 14, 7, 1, 2, 0),
    ("res5a_branch2a", 1024, 512, 14, 14, 1, 1, 0),
    ("res5a_branch2b", 512, 512, 14, 7, 3, 2, 1),
    ("res5a_branch2c", 512, 2048, 7, 7, 1, 1, 0),
    ("res5b_branch2a", 2048, 512, 7, 7, 1, 1, 0),
    ("res5b_branch2b", 512, 512, 7, 7, 3, 1, 1),
]

_MOBILENET = [(32, 112, 112, 1), (96, 112, 56, 2), (144, 56, 56, 1), (144, 56, 28, 2),
              (192, 28, 28, 1), (192, 28, 14, 2), (384, 14, 14, 1), (576, 14, 14, 1),
              (576, 14, 7, 2), (960, 7, 7, 1)]

_RESNEXT3D = [("conv_3d:1", 16, 64, 64, (8, 56, 56), (8, 56, 56), 1),
              ("conv_3d:3", 16, 128, 128, (8, 56, 56), (4, 28, 28), 2),
              ("conv_3d:4", 16, 128, 256, (4, 28, 28), (4, 28, 28), 1),
              ("conv_3d:6", 16, 256, 512, (2, 14, 14), (2, 14, 14), 1),
              ("conv_3d:8", 8, 64, 64, (8, 56, 56), (8, 56, 56), 1),
              ("conv_3d:12", 8, 256, 256, (4, 28, 28), (2, 14, 14), 2)]

_CONV1D = [("conv1d:2", 50, 3, 64, 224, 112, 7, 2, 3, 1),
           ("conv1d:3", 50, 256, 512, 56, 28, 1, 2, 0, 1),
           ("conv1d:8", 1, 512, 512, 300, 298, 3, 1, 0, 1),
           ("conv1d:19", 1, 512, 512, 32, 30, 5, 1, 1, 1),
           ("conv1d_gemm:3", 8, 512, 1024, 19, 19, 3, 1, 6, 6),
           ("wavenet_4", 8, 32, 32, 10543, 10542, 2, 1, 0, 1)]


# ----------------------------------------------------------------------------- the zoo
#: Networks of the ``zoo`` suite: key (the prefix of each layer's name) -> (network, source,
#: spatial rank, batch). docs/zoo.md describes each and the choices made (input size, batch).
NETWORKS = {
    "alexnet": ("AlexNet", "Krizhevsky, Sutskever, Hinton 2012 (two-GPU layout, groups 2)", 2, 8),
    "vgg16": ("VGG-16", "Simonyan, Zisserman 2014, configuration D", 2, 2),
    "googlenet": ("GoogLeNet (Inception-v1)", "Szegedy et al. 2014, Table 1", 2, 8),
    "inception_v3": ("Inception-v3", "Szegedy et al. 2015; torchvision inception_v3", 2, 8),
    "resnext50": ("ResNeXt-50 32x4d", "Xie et al. 2016; torchvision resnext50_32x4d", 2, 8),
    "densenet121": ("DenseNet-121", "Huang et al. 2017; torchvision densenet121", 2, 8),
    "densenet_bc100": ("DenseNet-BC-100, k=12, CIFAR", "Huang et al. 2017, Table 2", 2, 64),
    "squeezenet": ("SqueezeNet 1.1", "Iandola et al. 2016; torchvision squeezenet1_1", 2, 8),
    "shufflenet": ("ShuffleNet, g=3", "Zhang et al. 2017, Table 1 (g = 3)", 2, 8),
    "xception": ("Xception", "Chollet 2017, Figure 5", 2, 8),
    "mobilenet_v3": ("MobileNetV3-Large", "Howard et al. 2019, Table 1", 2, 8),
    "efficientnet_b0": ("EfficientNet-B0", "Tan, Le 2019, Table 1", 2, 8),
    "convnext_t": ("ConvNeXt-T", "Liu et al. 2022", 2, 8),
    "unet": ("U-Net (padded 3x3)", "Ronneberger, Fischer, Brox 2015", 2, 2),
    "erfnet": ("ERFNet", "Romera et al. 2017, Table 1", 2, 4),
    "deeplab_v3": ("DeepLabv3 (ResNet-101, output stride 16)", "Chen et al. 2017", 2, 1),
    "ssd300": ("SSD300 (VGG-16)", "Liu et al. 2016", 2, 4),
    "yolov3": ("YOLOv3 (Darknet-53)", "Redmon, Farhadi 2018", 2, 4),
    "centernet": ("CenterNet heads", "Zhou, Wang, Kraehenbuehl 2019 (Objects as Points)", 2, 2),
    "edsr": ("EDSR-baseline x2", "Lim et al. 2017", 2, 16),
    "c3d": ("C3D", "Tran et al. 2015", 3, 1),
    "i3d": ("I3D (inflated Inception-v1)", "Carreira, Zisserman 2017", 3, 1),
    "r2plus1d": ("R(2+1)D-18", "Tran et al. 2018; torchvision r2plus1d_18", 3, 1),
    "unet3d": ("3D U-Net", "Cicek et al. 2016", 3, 1),
    "vnet": ("V-Net", "Milletari, Navab, Ahmadi 2016", 3, 1),
    "wavenet": ("WaveNet", "van den Oord et al. 2016", 1, 2),
    "quartznet": ("QuartzNet 5x5", "Kriman et al. 2019, Table 1", 1, 8),
    "convtasnet": ("Conv-TasNet", "Luo, Mesgarani 2019", 1, 4),
    "hifigan": ("HiFi-GAN V1 generator", "Kong, Kim, Bae 2020", 1, 4),
    "wav2vec2": ("wav2vec 2.0 feature encoder", "Baevski et al. 2020", 1, 4),
    "pointnet": ("PointNet (shared MLPs as 1-D 1x1)", "Qi et al. 2017", 1, 8),
}

# One row per layer: (layer, ic, oc, input size, kernel, options). Sizes and kernels are an
# int (the same on every axis) or a tuple per axis. Options: s stride, d dilation, p pad
# before (default: ((k - 1) * d) // 2, PyTorch's "same" for odd kernels), pe pad after
# (default: p), g groups ("dw": depthwise), mb batch (default: the network's).
_ZOO = {
    "alexnet": [
        ("conv1", 3, 96, 227, 11, dict(s=4, p=0)),
        ("conv2", 96, 256, 27, 5, dict(g=2)),
        ("conv3", 256, 384, 13, 3, {}),
        ("conv4", 384, 384, 13, 3, dict(g=2)),
        ("conv5", 384, 256, 13, 3, dict(g=2)),
    ],
    "vgg16": [
        ("conv1_1", 3, 64, 224, 3, {}),
        ("conv1_2", 64, 64, 224, 3, {}),
        ("conv2_1", 64, 128, 112, 3, {}),
        ("conv2_2", 128, 128, 112, 3, {}),
        ("conv3_1", 128, 256, 56, 3, {}),
        ("conv3_2", 256, 256, 56, 3, {}),
        ("conv4_1", 256, 512, 28, 3, {}),
        ("conv4_2", 512, 512, 28, 3, {}),
        ("conv5_1", 512, 512, 14, 3, {}),
    ],
    "googlenet": [
        ("conv1", 3, 64, 224, 7, dict(s=2)),
        ("conv2_reduce", 64, 64, 56, 1, {}),
        ("conv2", 64, 192, 56, 3, {}),
        ("3a_3x3_reduce", 192, 96, 28, 1, {}),
        ("3a_3x3", 96, 128, 28, 3, {}),
        ("3a_5x5_reduce", 192, 16, 28, 1, {}),
        ("3a_5x5", 16, 32, 28, 5, {}),
        ("4a_3x3", 96, 208, 14, 3, {}),
        ("4a_5x5", 16, 48, 14, 5, {}),
        ("5b_3x3", 192, 384, 7, 3, {}),
        ("5b_5x5", 48, 128, 7, 5, {}),
    ],
    "inception_v3": [
        ("Conv2d_1a_3x3", 3, 32, 299, 3, dict(s=2, p=0)),
        ("Conv2d_2a_3x3", 32, 32, 149, 3, dict(p=0)),
        ("Conv2d_2b_3x3", 32, 64, 147, 3, {}),
        ("Conv2d_3b_1x1", 64, 80, 73, 1, {}),
        ("Conv2d_4a_3x3", 80, 192, 73, 3, dict(p=0)),
        ("Mixed_5b_5x5_2", 48, 64, 35, 5, {}),
        ("Mixed_5b_3x3dbl_2", 64, 96, 35, 3, {}),
        ("Mixed_5b_pool", 192, 32, 35, 1, {}),
        ("Mixed_6a_3x3", 288, 384, 35, 3, dict(s=2, p=0)),
        ("Mixed_6b_7x7_1", 768, 128, 17, 1, {}),
        ("Mixed_6b_7x7_2", 128, 128, 17, (1, 7), {}),
        ("Mixed_6b_7x7_3", 128, 192, 17, (7, 1), {}),
        ("Mixed_6c_7x7_2", 160, 160, 17, (1, 7), {}),
        ("Mixed_6c_7x7_3", 160, 192, 17, (7, 1), {}),
        ("Mixed_6e_7x7dbl_2", 192, 192, 17, (7, 1), {}),
        ("Mixed_6e_7x7dbl_3", 192, 192, 17, (1, 7), {}),
        ("Mixed_7a_3x3_2", 192, 320, 17, 3, dict(s=2, p=0)),
        ("Mixed_7b_3x3_2a", 384, 384, 8, (1, 3), {}),
        ("Mixed_7b_3x3_2b", 384, 384, 8, (3, 1), {}),
        ("Mixed_7b_3x3dbl_2", 448, 384, 8, 3, {}),
        ("Mixed_7c_1x1", 2048, 320, 8, 1, {}),
    ],
    "resnext50": [
        ("layer1_conv1", 64, 128, 56, 1, {}),
        ("layer1_conv2", 128, 128, 56, 3, dict(g=32)),
        ("layer1_conv3", 128, 256, 56, 1, {}),
        ("layer2_0_conv2", 256, 256, 56, 3, dict(s=2, g=32)),
        ("layer2_conv2", 256, 256, 28, 3, dict(g=32)),
        ("layer3_0_conv2", 512, 512, 28, 3, dict(s=2, g=32)),
        ("layer3_conv2", 512, 512, 14, 3, dict(g=32)),
        ("layer3_conv3", 512, 1024, 14, 1, {}),
        ("layer4_0_conv2", 1024, 1024, 14, 3, dict(s=2, g=32)),
        ("layer4_conv2", 1024, 1024, 7, 3, dict(g=32)),
        ("layer4_conv1", 2048, 1024, 7, 1, {}),
    ],
    "densenet121": [
        ("conv0", 3, 64, 224, 7, dict(s=2)),
        ("block1_1x1_in64", 64, 128, 56, 1, {}),
        ("block1_1x1_in224", 224, 128, 56, 1, {}),
        ("block1_3x3", 128, 32, 56, 3, {}),
        ("transition1", 256, 128, 56, 1, {}),
        ("block2_1x1_in480", 480, 128, 28, 1, {}),
        ("block2_3x3", 128, 32, 28, 3, {}),
        ("transition2", 512, 256, 28, 1, {}),
        ("block3_1x1_in992", 992, 128, 14, 1, {}),
        ("block3_3x3", 128, 32, 14, 3, {}),
        ("transition3", 1024, 512, 14, 1, {}),
        ("block4_1x1_in992", 992, 128, 7, 1, {}),
        ("block4_3x3", 128, 32, 7, 3, {}),
    ],
    "densenet_bc100": [
        ("conv0", 3, 24, 32, 3, {}),
        ("block1_1x1_in120", 120, 48, 32, 1, {}),
        ("block1_3x3", 48, 12, 32, 3, {}),
        ("block2_3x3", 48, 12, 16, 3, {}),
        ("block3_3x3", 48, 12, 8, 3, {}),
    ],
    "squeezenet": [
        ("conv1", 3, 64, 224, 3, dict(s=2, p=0)),
        ("fire2_squeeze", 64, 16, 55, 1, {}),
        ("fire2_expand1x1", 16, 64, 55, 1, {}),
        ("fire2_expand3x3", 16, 64, 55, 3, {}),
        ("fire4_expand3x3", 32, 128, 27, 3, {}),
        ("fire6_squeeze", 256, 48, 13, 1, {}),
        ("fire6_expand3x3", 48, 192, 13, 3, {}),
        ("fire9_expand3x3", 64, 256, 13, 3, {}),
        ("conv10", 512, 1000, 13, 1, {}),
    ],
    "shufflenet": [
        ("stage2_gconv1", 240, 60, 28, 1, dict(g=3)),
        ("stage2_dw", 60, 60, 28, 3, dict(g="dw")),
        ("stage2_gconv2", 60, 240, 28, 1, dict(g=3)),
        ("stage3_0_dw", 120, 120, 28, 3, dict(s=2, g="dw")),
        ("stage3_gconv1", 480, 120, 14, 1, dict(g=3)),
        ("stage3_gconv2", 120, 480, 14, 1, dict(g=3)),
        ("stage4_gconv1", 960, 240, 7, 1, dict(g=3)),
        ("stage4_dw", 240, 240, 7, 3, dict(g="dw")),
    ],
    "xception": [
        ("conv1", 3, 32, 299, 3, dict(s=2, p=0)),
        ("conv2", 32, 64, 149, 3, dict(p=0)),
        ("block1_sep1_dw", 64, 64, 147, 3, dict(g="dw")),
        ("block1_sep1_pw", 64, 128, 147, 1, {}),
        ("middle_dw", 728, 728, 19, 3, dict(g="dw")),
        ("middle_pw", 728, 728, 19, 1, {}),
        ("exit_pw", 1536, 2048, 10, 1, {}),
    ],
    "mobilenet_v3": [
        ("stem", 3, 16, 224, 3, dict(s=2)),
        ("bneck1_dw3", 16, 16, 112, 3, dict(g="dw")),
        ("bneck2_expand", 16, 64, 112, 1, {}),
        ("bneck2_dw3_s2", 64, 64, 112, 3, dict(s=2, g="dw")),
        ("bneck3_dw3", 72, 72, 56, 3, dict(g="dw")),
        ("bneck4_dw5_s2", 72, 72, 56, 5, dict(s=2, g="dw")),
        ("bneck5_dw5", 120, 120, 28, 5, dict(g="dw")),
        ("bneck5_project", 120, 40, 28, 1, {}),
        ("bneck7_dw3_s2", 240, 240, 28, 3, dict(s=2, g="dw")),
        ("bneck8_dw3", 200, 200, 14, 3, dict(g="dw")),
        ("bneck11_dw3", 480, 480, 14, 3, dict(g="dw")),
        ("bneck13_dw5_s2", 672, 672, 14, 5, dict(s=2, g="dw")),
        ("bneck14_dw5", 960, 960, 7, 5, dict(g="dw")),
        ("bneck14_project", 960, 160, 7, 1, {}),
        ("last_conv", 160, 960, 7, 1, {}),
    ],
    "efficientnet_b0": [
        ("stem", 3, 32, 224, 3, dict(s=2)),
        ("mb1_dw3", 32, 32, 112, 3, dict(g="dw")),
        ("mb1_project", 32, 16, 112, 1, {}),
        ("mb2_expand", 16, 96, 112, 1, {}),
        ("mb2_dw3_s2", 96, 96, 112, 3, dict(s=2, g="dw")),
        ("mb3_dw3", 144, 144, 56, 3, dict(g="dw")),
        ("mb4_dw5_s2", 144, 144, 56, 5, dict(s=2, g="dw")),
        ("mb5_expand", 40, 240, 28, 1, {}),
        ("mb5_dw5", 240, 240, 28, 5, dict(g="dw")),
        ("mb5_project", 240, 40, 28, 1, {}),
        ("mb6_dw3_s2", 240, 240, 28, 3, dict(s=2, g="dw")),
        ("mb7_dw3", 480, 480, 14, 3, dict(g="dw")),
        ("mb9_dw5", 480, 480, 14, 5, dict(g="dw")),
        ("mb10_dw5", 672, 672, 14, 5, dict(g="dw")),
        ("mb12_dw5_s2", 672, 672, 14, 5, dict(s=2, g="dw")),
        ("mb13_dw5", 1152, 1152, 7, 5, dict(g="dw")),
        ("mb16_dw3", 1152, 1152, 7, 3, dict(g="dw")),
        ("mb16_project", 1152, 320, 7, 1, {}),
        ("head", 320, 1280, 7, 1, {}),
    ],
    "convnext_t": [
        ("stem", 3, 96, 224, 4, dict(s=4, p=0)),
        ("stage1_dw7", 96, 96, 56, 7, dict(g="dw")),
        ("stage1_pw1", 96, 384, 56, 1, {}),
        ("stage1_pw2", 384, 96, 56, 1, {}),
        ("down1", 96, 192, 56, 2, dict(s=2, p=0)),
        ("stage2_dw7", 192, 192, 28, 7, dict(g="dw")),
        ("down2", 192, 384, 28, 2, dict(s=2, p=0)),
        ("stage3_dw7", 384, 384, 14, 7, dict(g="dw")),
        ("stage3_pw1", 384, 1536, 14, 1, {}),
        ("down3", 384, 768, 14, 2, dict(s=2, p=0)),
        ("stage4_dw7", 768, 768, 7, 7, dict(g="dw")),
        ("stage4_pw2", 3072, 768, 7, 1, {}),
    ],
    "unet": [
        ("enc1_conv1", 1, 64, 256, 3, {}),
        ("enc1_conv2", 64, 64, 256, 3, {}),
        ("enc2_conv1", 64, 128, 128, 3, {}),
        ("enc3_conv2", 256, 256, 64, 3, {}),
        ("enc4_conv1", 256, 512, 32, 3, {}),
        ("bottleneck_conv2", 1024, 1024, 16, 3, {}),
        ("up4_as_conv", 512, 1024, 32, 2, dict(s=2, p=0)),
        ("up1_as_conv", 64, 128, 256, 2, dict(s=2, p=0)),
        ("head", 64, 2, 256, 1, {}),
    ],
    "erfnet": [
        ("down1", 3, 13, (512, 1024), 3, dict(s=2)),
        ("down2", 16, 48, (256, 512), 3, dict(s=2)),
        ("nb64_3x1", 64, 64, (128, 256), (3, 1), {}),
        ("nb64_1x3", 64, 64, (128, 256), (1, 3), {}),
        ("down3", 64, 64, (128, 256), 3, dict(s=2)),
        ("nb128_3x1", 128, 128, (64, 128), (3, 1), {}),
        ("nb128_3x1_d2", 128, 128, (64, 128), (3, 1), dict(d=(2, 1))),
        ("nb128_1x3_d2", 128, 128, (64, 128), (1, 3), dict(d=(1, 2))),
        ("nb128_3x1_d4", 128, 128, (64, 128), (3, 1), dict(d=(4, 1))),
        ("nb128_1x3_d8", 128, 128, (64, 128), (1, 3), dict(d=(1, 8))),
        ("nb128_3x1_d16", 128, 128, (64, 128), (3, 1), dict(d=(16, 1))),
        ("nb128_1x3_d16", 128, 128, (64, 128), (1, 3), dict(d=(1, 16))),
    ],
    "deeplab_v3": [
        ("layer4_conv2_d2", 512, 512, 33, 3, dict(d=2)),
        ("aspp_1x1", 2048, 256, 33, 1, {}),
        ("aspp_d6", 2048, 256, 33, 3, dict(d=6)),
        ("aspp_d12", 2048, 256, 33, 3, dict(d=12)),
        ("aspp_d18", 2048, 256, 33, 3, dict(d=18)),
        ("project", 1280, 256, 33, 1, {}),
        ("head_3x3", 256, 256, 33, 3, {}),
        ("classifier", 256, 21, 33, 1, {}),
    ],
    "ssd300": [
        ("fc6_d6", 512, 1024, 19, 3, dict(d=6, mb=2)),
        ("fc7", 1024, 1024, 19, 1, {}),
        ("conv8_2", 256, 512, 19, 3, dict(s=2)),
        ("conv9_2", 128, 256, 10, 3, dict(s=2)),
        ("conv10_2", 128, 256, 5, 3, dict(p=0)),
        ("conv4_3_loc", 512, 16, 38, 3, {}),
        ("conv4_3_conf", 512, 84, 38, 3, {}),
        ("fc7_loc", 1024, 24, 19, 3, {}),
        ("fc7_conf", 1024, 126, 19, 3, {}),
        ("conv9_2_loc", 256, 24, 5, 3, {}),
    ],
    "yolov3": [
        ("conv0", 3, 32, 416, 3, {}),
        ("conv1", 32, 64, 416, 3, dict(s=2)),
        ("res1_1x1", 64, 32, 208, 1, {}),
        ("res1_3x3", 32, 64, 208, 3, {}),
        ("res4_3x3", 256, 512, 26, 3, {}),
        ("head13_3x3", 512, 1024, 13, 3, {}),
        ("head13_out", 1024, 255, 13, 1, {}),
        ("head26_out", 512, 255, 26, 1, {}),
        ("head52_out", 256, 255, 52, 1, {}),
    ],
    "centernet": [
        ("head_3x3", 64, 256, 128, 3, {}),
        ("heatmap_1x1", 256, 80, 128, 1, {}),
        ("wh_1x1", 256, 2, 128, 1, {}),
    ],
    "edsr": [
        ("head", 3, 64, 48, 3, {}),
        ("body", 64, 64, 48, 3, {}),
        ("upsample", 64, 256, 48, 3, {}),
        ("tail", 64, 3, 96, 3, {}),
    ],
    "c3d": [
        ("conv1a", 3, 64, (16, 112, 112), 3, {}),
        ("conv2a", 64, 128, (16, 56, 56), 3, {}),
        ("conv3a", 128, 256, (8, 28, 28), 3, {}),
        ("conv3b", 256, 256, (8, 28, 28), 3, {}),
        ("conv4a", 256, 512, (4, 14, 14), 3, {}),
        ("conv4b", 512, 512, (4, 14, 14), 3, {}),
        ("conv5a", 512, 512, (2, 7, 7), 3, {}),
    ],
    "i3d": [
        ("Conv3d_1a_7x7", 3, 64, (16, 224, 224), 7, dict(s=2)),
        ("Conv3d_2b_1x1", 64, 64, (8, 56, 56), 1, {}),
        ("Conv3d_2c_3x3", 64, 192, (8, 56, 56), 3, {}),
        ("Mixed_3b_3x3", 96, 128, (8, 28, 28), 3, {}),
        ("Mixed_3b_3x3b", 16, 32, (8, 28, 28), 3, {}),
        ("Mixed_4b_3x3", 96, 208, (4, 14, 14), 3, {}),
        ("Mixed_5b_3x3", 160, 320, (2, 7, 7), 3, {}),
        ("Mixed_5b_1x1", 832, 256, (2, 7, 7), 1, {}),
    ],
    "r2plus1d": [
        ("stem_spatial", 3, 45, (16, 112, 112), (1, 7, 7), dict(s=(1, 2, 2))),
        ("stem_temporal", 45, 64, (16, 56, 56), (3, 1, 1), {}),
        ("layer1_spatial", 64, 144, (16, 56, 56), (1, 3, 3), {}),
        ("layer1_temporal", 144, 64, (16, 56, 56), (3, 1, 1), {}),
        ("layer2_0_spatial", 64, 230, (16, 56, 56), (1, 3, 3), dict(s=(1, 2, 2))),
        ("layer2_0_temporal", 230, 128, (16, 28, 28), (3, 1, 1), dict(s=(2, 1, 1))),
        ("layer3_spatial", 256, 576, (4, 14, 14), (1, 3, 3), {}),
        ("layer3_temporal", 576, 256, (4, 14, 14), (3, 1, 1), {}),
    ],
    "unet3d": [
        ("enc1_conv1", 3, 32, 64, 3, {}),
        ("enc2_conv1", 64, 64, 32, 3, {}),
        ("enc2_conv2", 64, 128, 32, 3, {}),
        ("enc3_conv1", 128, 128, 16, 3, {}),
        ("enc3_conv2", 128, 256, 16, 3, {}),
        ("enc4_conv2", 256, 512, 8, 3, {}),
        ("head", 64, 3, 64, 1, {}),
    ],
    "vnet": [
        ("in_5x5x5", 1, 16, (64, 128, 128), 5, {}),
        ("down1", 16, 32, (64, 128, 128), 2, dict(s=2, p=0)),
        ("stage4_5x5x5", 128, 128, (8, 16, 16), 5, {}),
        ("stage5_5x5x5", 256, 256, (4, 8, 8), 5, {}),
        ("head", 32, 2, (64, 128, 128), 1, {}),
    ],
    "wavenet": [
        ("dilated_d1", 32, 64, 16000, 2, dict(d=1, p=1, pe=0)),
        ("dilated_d16", 32, 64, 16000, 2, dict(d=16, p=16, pe=0)),
        ("dilated_d128", 32, 64, 16000, 2, dict(d=128, p=128, pe=0)),
        ("dilated_d512", 32, 64, 16000, 2, dict(d=512, p=512, pe=0)),
        ("residual_1x1", 32, 32, 16000, 1, {}),
        ("skip_1x1", 32, 256, 16000, 1, {}),
        ("out_1x1", 256, 256, 16000, 1, {}),
    ],
    "quartznet": [
        ("c1_dw33_s2", 64, 64, 1600, 33, dict(s=2, g="dw")),
        ("c1_pw", 64, 256, 800, 1, {}),
        ("b1_dw33", 256, 256, 800, 33, dict(g="dw")),
        ("b1_pw", 256, 256, 800, 1, {}),
        ("b2_dw39", 256, 256, 800, 39, dict(g="dw")),
        ("b3_pw_in", 256, 512, 800, 1, {}),
        ("b3_dw51", 512, 512, 800, 51, dict(g="dw")),
        ("b4_dw63", 512, 512, 800, 63, dict(g="dw")),
        ("b5_dw75", 512, 512, 800, 75, dict(g="dw")),
        ("b5_pw", 512, 512, 800, 1, {}),
        ("c2_dw87_d2", 512, 512, 800, 87, dict(d=2, g="dw")),
        ("c3_pw", 512, 1024, 800, 1, {}),
        ("c4_out", 1024, 29, 800, 1, {}),
    ],
    "convtasnet": [
        ("encoder", 1, 512, 32000, 16, dict(s=8, p=0)),
        ("bottleneck", 512, 128, 3999, 1, {}),
        ("block_in_1x1", 128, 512, 3999, 1, {}),
        ("block_dw3_d1", 512, 512, 3999, 3, dict(g="dw")),
        ("block_dw3_d8", 512, 512, 3999, 3, dict(d=8, g="dw")),
        ("block_dw3_d128", 512, 512, 3999, 3, dict(d=128, g="dw")),
        ("block_out_1x1", 512, 128, 3999, 1, {}),
        ("mask", 128, 1024, 3999, 1, {}),
    ],
    "hifigan": [
        ("conv_pre", 80, 512, 32, 7, {}),
        ("ups1_as_conv", 256, 512, 256, 16, dict(s=8, p=4)),
        ("res1_k3_d3", 256, 256, 256, 3, dict(d=3)),
        ("res1_k7_d5", 256, 256, 256, 7, dict(d=5)),
        ("res1_k11_d5", 256, 256, 256, 11, dict(d=5)),
        ("ups2_as_conv", 128, 256, 2048, 16, dict(s=8, p=4)),
        ("res2_k3_d1", 128, 128, 2048, 3, {}),
        ("res2_k11_d5", 128, 128, 2048, 11, dict(d=5)),
        ("res4_k7_d3", 32, 32, 8192, 7, dict(d=3)),
        ("conv_post", 32, 1, 8192, 7, {}),
    ],
    "wav2vec2": [
        ("conv0", 1, 512, 16000, 10, dict(s=5, p=0)),
        ("conv1", 512, 512, 3199, 3, dict(s=2, p=0)),
        ("conv6", 512, 512, 99, 2, dict(s=2, p=0)),
    ],
    "pointnet": [
        ("mlp1_1", 3, 64, 2048, 1, {}),
        ("mlp1_2", 64, 64, 2048, 1, {}),
        ("mlp2_2", 64, 128, 2048, 1, {}),
        ("mlp2_3", 128, 1024, 2048, 1, {}),
        ("seg_out", 128, 50, 2048, 1, {}),
    ],
}


def _axes(v, nd):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd


def _zoo_layer(net, name, ic, oc, isz, k, opts):
    nd, mb = NETWORKS[net][2], NETWORKS[net][3]
    isz, ks = _axes(isz, nd), _axes(k, nd)
    st, dl = _axes(opts.get("s", 1), nd), _axes(opts.get("d", 1), nd)
    pb = _axes(opts["p"], nd) if "p" in opts else tuple(
        (kk - 1) * dd // 2 for kk, dd in zip(ks, dl))
    pe = _axes(opts["pe"], nd) if "pe" in opts else pb
    g = opts.get("g", 1)
    if g == "dw":
        g = ic
    return Layer("zoo", f"{net}:{name}", opts.get("mb", mb), g, ic, oc, isz, ks, st, pb, pe,
                 dl)


def zoo():
    """The ``zoo`` suite: layers of the public networks of :data:`NETWORKS`, named
    ``network:layer``."""
    return tuple(_zoo_layer(net, *row) for net, rows in _ZOO.items() for row in rows)



@functools.lru_cache(maxsize=None)
def _suites():
    s = {}
    s["resnet50"] = tuple(_layer("resnet50", n, 8, 1, ic, oc, i, o, k, st, p)
                          for n, ic, oc, i, o, k, st, p in _RESNET50)
    mb = []
    for c, i, o, st in _MOBILENET:
        mb.append(_layer("mobilenet_v2_dw", f"dw{c}_{i}_s{st}_p1", 8, c, c, c, i, o, 3, st, 1))
        if st == 2:  # TF SAME on an even input: 0 before, 1 after
            mb.append(_layer("mobilenet_v2_dw", f"dw{c}_{i}_s{st}_same", 8, c, c, c, i, o, 3,
                             st, 0))
    s["mobilenet_v2_dw"] = tuple(mb)
    s["resnext3d"] = tuple(_layer("resnext3d", n, 2, g, ic, oc, i, o, 3, st, 1, nd=3)
                           for n, g, ic, oc, i, o, st in _RESNEXT3D)
    s["conv1d"] = tuple(_layer("conv1d", n, mb_, 1, ic, oc, i, o, k, st, p, d, nd=1)
                        for n, mb_, ic, oc, i, o, k, st, p, d in _CONV1D)
    return s


SUITES = ("resnet50", "mobilenet_v2_dw", "resnext3d", "conv1d")
#: Suites outside ``"all"`` (which stays the four above): ``zoo``.
EXTRA_SUITES = ("zoo",)


def layers(suite="resnet50"):
    """The layers of one suite (``SUITES``, ``"zoo"``, or ``"all"``: the four of ``SUITES``)."""
    s = _suites()
    if suite == "all":
        return tuple(layer for name in SUITES for layer in s[name])
    if suite == "zoo":
        return _zoo_layers()
    if suite not in s:
        raise ValueError(f"suite: expected one of {list(SUITES) + list(EXTRA_SUITES) + ['all']}"
                         f", got {suite!r}")
    return s[suite]


@functools.lru_cache(maxsize=None)
def _zoo_layers():
    return zoo()


def layer(name):
    """The layer of any suite, the zoo's included, with this name."""
    for lay in layers("all") + _zoo_layers():
        if lay.name == name:
            return lay
    raise KeyError(name)


@dataclass(frozen=True)
class Call:
    op: str
    args: tuple
    kwargs: dict


def tensors(layer, dtype="float32", seed=0):
    """Seeded channels-last ``x``, XIO ``w`` and ``dy`` for a layer."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((layer.mb, *layer.isz, layer.ic), dtype=np.float32).astype(dtype)
    w = rng.standard_normal((*layer.ksz, layer.ic // layer.g, layer.oc),
                            dtype=np.float32).astype(dtype)
    dy = rng.standard_normal((layer.mb, *layer.osz, layer.oc), dtype=np.float32).astype(dtype)
    return x, w, dy


def call(layer, direction, dtype="float32", shapes_only=False, seed=0, arrays=None):
    """The generic-op call that computes ``direction`` of ``layer``."""
    if arrays is None:
        if shapes_only:
            x = np.empty((layer.mb, *layer.isz, layer.ic), dtype)
            w = np.empty((*layer.ksz, layer.ic // layer.g, layer.oc), dtype)
            dy = np.empty((layer.mb, *layer.osz, layer.oc), dtype)
        else:
            x, w, dy = tensors(layer, dtype, seed)
    else:
        x, w, dy = arrays
    attrs = dict(strides=layer.stride, pads_begin=layer.pad_begin, pads_end=layer.pad_end,
                 dilations=layer.dilation, groups=layer.g)
    if direction == "fwd":
        return Call("convolution", (x, w), attrs)
    if direction == "bwd_d":
        return Call("convolution_backprop_data", (dy, w, layer.isz), attrs)
    if direction == "bwd_w":
        return Call("convolution_backprop_filters", (x, layer.ksz, dy), attrs)
    raise ValueError(f"pass: expected one of {list(PASSES)}, got {direction!r}")
