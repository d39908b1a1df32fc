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


def layers(suite="resnet50"):
    """The layers of one suite (or ``"all"``)."""
    s = _suites()
    if suite == "all":
        return tuple(layer for name in SUITES for layer in s[name])
    if suite not in s:
        raise ValueError(f"suite: expected one of {list(SUITES) + ['all']}, got {suite!r}")
    return s[suite]


def layer(name):
    for lay in layers("all"):
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
