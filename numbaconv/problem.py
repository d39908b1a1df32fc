"""The one canonical, frozen description of a convolution problem.

Every front end (TF-style or oneDNN-Graph-style) translates its conventions into a
:class:`ConvProblem`; everything after it (planner, backends, kernels) sees only this.
Following oneDNN's ``convolution_pd_t``, every dimension is named once and every problem is
3-D: 2-D has depth 1 and 1-D has depth and height 1. Depthwise is ``g == ic`` with a channel
multiplier ``oc // ic``. Padding of every kind (SAME, VALID, EXPLICIT, auto_pad) has become
``pad_begin``/``pad_end`` per axis. Dilation is stored as TF and oneDNN Graph store it
(1 = none).
"""
from dataclasses import dataclass, field
import math
import sys

import numpy as np

DIRECTIONS = ("fwd", "bwd_d", "bwd_w")
DTYPES = ("float16", "float32", "float64", "bfloat16")
#: ``ConvProblem.precision``: ``"exact"`` computes in the compute dtype's own arithmetic;
#: ``"tf32"`` (float32 problems on the GPU, ``precision="tf32"``) lets the GPU's tensor
#: cores multiply operands rounded to TF32 (10 mantissa bits), accumulating in float32.
PRECISIONS = ("exact", "tf32")
#: The user's dtypes computed in float32 and rounded once at the end.
FLOAT32_COMPUTED = ("float16", "bfloat16")


def is_masked(value):
    """Whether ``value`` is a NumPy masked array. ``numpy.ma`` is looked up, not imported
    (8 ms of a first call): where nothing has imported it, no masked array exists."""
    ma = sys.modules.get("numpy.ma")
    return ma is not None and isinstance(value, ma.MaskedArray)


def numpy_dtype(name):
    """The NumPy dtype of a problem's ``dtype`` name; ``"bfloat16"`` is ml_dtypes' type
    (imported here only: a bfloat16 problem comes from bfloat16 arrays, so it is
    installed)."""
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


@dataclass(frozen=True)
class ConvProblem:
    """A convolution problem in canonical form.

    Attributes
    ----------
    direction : {"fwd", "bwd_d", "bwd_w"}
        What is computed: the forward output, the input gradient or the weight gradient.
    mb, g, ic, oc : int
        Batch, groups, total input and output channels.
    isz, ksz, osz : tuple of 3 ints
        Input, kernel and output spatial sizes ``(d, h, w)``.
    stride, dilation, pad_begin, pad_end : tuple of 3 ints
    ndim : int
        The user's spatial rank (1, 2 or 3).
    dtype : str
        The user's dtype; ``float16`` and ``bfloat16`` are computed in ``float32``.
    data_format : {"NXC", "NCX"}
        The user's data layout (channels last or first).
    filter_format : {"XIO", "OIX", "XIM"}
        The user's filter layout; ``XIM`` is TF's depthwise ``[*X, C, multiplier]``.
    op : str
        The public function that built the problem (for messages and traces).
    multiplier : int
        The channel multiplier of an ``XIM`` filter, kept because ``oc // ic`` cannot give
        it back when there are no channels (0 otherwise).
    precision : {"exact", "tf32"}
        What the multiply-adds may round: ``"exact"`` (the default) none beyond the compute
        dtype's own rounding; ``"tf32"`` the operands to TF32 on the GPU's tensor cores
        (an entry that has no TF32 path computes exactly).
    """

    direction: str
    mb: int
    g: int
    ic: int
    oc: int
    isz: tuple
    ksz: tuple
    osz: tuple
    stride: tuple
    dilation: tuple
    pad_begin: tuple
    pad_end: tuple
    ndim: int
    dtype: str
    data_format: str = "NXC"
    filter_format: str = "XIO"
    op: str = field(default="", compare=False)
    multiplier: int = 0
    precision: str = "exact"

    # -- derived sizes -------------------------------------------------------------------
    @property
    def icg(self):
        return self.ic // self.g if self.g else 0

    @property
    def ocg(self):
        return self.oc // self.g if self.g else 0

    @property
    def compute_dtype(self):
        """The dtype the kernels run in: float16 and bfloat16 are computed in float32."""
        return "float32" if self.dtype in FLOAT32_COMPUTED else self.dtype

    @property
    def is_depthwise(self):
        return self.g > 1 and self.g == self.ic

    @property
    def flops(self):
        """Nominal count ``2*mb*oc*(ic/g)*prod(kernel)*prod(out)``, whatever the strategy."""
        return 2 * self.mb * self.oc * self.icg * math.prod(self.ksz) * math.prod(self.osz)

    @property
    def empty(self):
        """True when the result is all zeros without any work (empty batch or channels)."""
        return (self.mb == 0 or self.ic == 0 or self.oc == 0 or math.prod(self.osz) == 0
                or math.prod(self.isz) == 0)

    # -- shapes in the user's layouts --------------------------------------------------------
    def _spatial(self, sizes):
        return tuple(sizes[3 - self.ndim:])

    def _data_shape(self, channels, sizes):
        sp = self._spatial(sizes)
        if self.data_format == "NXC":
            return (self.mb, *sp, channels)
        return (self.mb, channels, *sp)

    @property
    def x_shape(self):
        return self._data_shape(self.ic, self.isz)

    @property
    def y_shape(self):
        return self._data_shape(self.oc, self.osz)

    @property
    def w_shape(self):
        ks = self._spatial(self.ksz)
        if self.filter_format == "XIO":
            return (*ks, self.icg, self.oc)
        if self.filter_format == "OIX":
            return (self.oc, self.icg, *ks)
        return (*ks, self.ic, self.oc // self.ic if self.ic else self.multiplier)  # XIM

    @property
    def result_shape(self):
        return {"fwd": self.y_shape, "bwd_d": self.x_shape, "bwd_w": self.w_shape}[self.direction]

    def descriptor(self):
        """A benchdnn-style self-describing string, e.g. ``mb8ic64ih56oc64oh56kh3ph1``."""
        names = "dhw"
        s = f"{self.direction}:"
        if self.g != 1:
            s += f"g{self.g}"
        s += f"mb{self.mb}ic{self.ic}"
        axes = range(3 - self.ndim, 3)
        s += "".join(f"i{names[a]}{self.isz[a]}" for a in axes)
        s += f"oc{self.oc}"
        s += "".join(f"o{names[a]}{self.osz[a]}" for a in axes)
        s += "".join(f"k{names[a]}{self.ksz[a]}" for a in axes)
        s += "".join(f"s{names[a]}{self.stride[a]}" for a in axes if self.stride[a] != 1)
        s += "".join(f"p{names[a]}{self.pad_begin[a]}" for a in axes if self.pad_begin[a])
        s += "".join(f"P{names[a]}{self.pad_end[a]}" for a in axes
                     if self.pad_end[a] != self.pad_begin[a])
        # benchdnn's d0 is "no dilation": store d-1 as it does.
        s += "".join(f"d{names[a]}{self.dilation[a] - 1}" for a in axes if self.dilation[a] != 1)
        s += f"_{self.dtype}"
        return s if self.precision == "exact" else s + f"_{self.precision}"
