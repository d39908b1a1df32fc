"""Pure Numba loop nests (installed as ``numbaconv.kernels``).

Kernels take contiguous canonical arrays and a small int64 geometry vector, validate
nothing and import nothing from the front of the engine.

Canonical layouts (every rank is 3-D: 2-D has depth 1, 1-D depth and height 1):

* ``x`` / ``dx``: ``[mb, id, ih, iw, ic]`` (channels last)
* ``dy`` / ``y``: ``[mb, od, oh, ow, oc]``
* ``w`` / ``dw``: ``[kd, kh, kw, ic/g, oc]`` (XIO); output channel ``gi*ocg + k`` belongs to
  group ``gi``, and reads input channels ``gi*icg .. gi*icg + icg - 1``.

Data arrays are in the compute dtype (float32 or float64), except where a kernel converts
float16 itself (the depthwise row kernels, the grouped copies to group-minor and the
grouped gather tiles' stores): there float16 data comes as its bits, ``uint16`` arrays of
the same layout, computed in float32.

The geometry vector ``geo`` (see :func:`numbaconv.kernels.geometry`) packs
``mb g icg ocg id ih iw kd kh kw od oh ow sd sh sw dd dh dw pd ph pw``; index arithmetic is
int64 throughout.

Each kernel module is self-contained (its loop nests repeat the same index preamble rather
than sharing jitted helpers across files): Numba's on-disk cache checks only the source file
of the function it loads, so a helper changed in another file would leave stale callers in
the cache after an upgrade.
"""
import numpy as np

GEO_FIELDS = ("mb", "g", "icg", "ocg", "id", "ih", "iw", "kd", "kh", "kw", "od", "oh", "ow",
              "sd", "sh", "sw", "dd", "dh", "dw", "pd", "ph", "pw")


def geometry(mb, g, icg, ocg, isz, ksz, osz, stride, dilation, pad_begin):
    """Pack a problem's geometry into the int64 vector every kernel takes."""
    return np.array([mb, g, icg, ocg, *isz, *ksz, *osz, *stride, *dilation, *pad_begin],
                    dtype=np.int64)
