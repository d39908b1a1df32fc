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

The sharing rule. Numba's on-disk cache checks only the source file of the function it
loads, so jitted code compiled in from another file (a ``@kernel``/``@helper`` function, an
``@intrinsic``) could leave stale callers in the cache. Hence: a kernel module never imports
from another kernel module; it may import plain Python from the shared modules, whose names
start with an underscore and which hold no jitted code: ``cpu/_host.py`` (the host's
vector width and features, probed once; they depend only on the CPU, part of the cache key)
and ``cpu/_ir.py`` (LLVM IR builders run while a kernel compiles), and on the GPU side
``cuda/_ptx.py`` (the typing and inline-PTX code generation behind the CUDA GEMM modules'
intrinsics, each module declaring its own). A jitted helper two modules need is copied
into each. What ``_ir.py`` emits is compiled into its callers:
after editing it in a checkout, clear the cache (an install rewrites every file).
``tests/test_architecture.py`` checks the rule.
"""
import numpy as np

GEO_FIELDS = ("mb", "g", "icg", "ocg", "id", "ih", "iw", "kd", "kh", "kw", "od", "oh", "ow",
              "sd", "sh", "sw", "dd", "dh", "dw", "pd", "ph", "pw")


def geometry(mb, g, icg, ocg, isz, ksz, osz, stride, dilation, pad_begin):
    """Pack a problem's geometry into the int64 vector every kernel takes."""
    return np.array([mb, g, icg, ocg, *isz, *ksz, *osz, *stride, *dilation, *pad_begin],
                    dtype=np.int64)
