"""Parsing helpers shared by both front ends: arrays, integer attributes, windows.

Like TensorFlow's ``conv_grad_shape_utils``, one routine (:func:`window`) resolves every
spatial axis of every op, forward or backward, 1-D to 3-D, into one record; the front ends
differ only in how they spell their arguments.
"""
from collections.abc import Sequence
import numbers

import numpy as np

from ..problem import is_masked

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def is_float_dtype(dt):
    """Whether ``dt`` is an operand dtype: float16/32/64 in either byte order, or the
    ``ml_dtypes`` bfloat16 (recognised by name, so that numbaconv never imports
    ml_dtypes: a bfloat16 array exists only where it is installed)."""
    return dt.newbyteorder("=") in FLOAT_DTYPES or dt.name == "bfloat16"


# -- arrays -------------------------------------------------------------------------------------
def refuse_masked(value, name):
    """TypeError for a masked array: the kernels would read its data and drop its mask."""
    if is_masked(value):
        raise TypeError(f"{name}: masked arrays are not supported; pass np.ma.filled(a, 0) "
                        f"or a.data")


def as_float_array(value, name):
    """``value`` as an ndarray of float16/32/64 or bfloat16 (never copied when already
    one)."""
    refuse_masked(value, name)
    if isinstance(value, np.ndarray):
        arr = value
    else:
        if value is None or isinstance(value, (str, bytes, dict, set)):
            raise TypeError(f"{name}: expected a float array, got {type(value).__name__}")
        if (hasattr(value, "__cuda_array_interface__")
                or getattr(value, "__cuda_ndarray__", False) is True):
            from ..backends import cuda as _cuda
            return _cuda.as_device_array(value, name)  # numba device array (.shape/.dtype)
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise TypeError(f"{name}: expected a float array, got an object NumPy cannot "
                            f"convert to one ({exc})") from None
        if not is_float_dtype(arr.dtype):
            raise TypeError(f"{name}: converted from a {type(value).__name__} to "
                            f"{arr.dtype}, not a float dtype; {_fix(name)}")
    if not is_float_dtype(arr.dtype):  # either byte order is fine
        raise TypeError(f"{name}: expected dtype float16, float32, float64 or bfloat16, got "
                        f"{arr.dtype}; {_fix(name)}")
    return arr


def _fix(name, dtype=None):
    if dtype is not None:
        module = "ml_dtypes" if dtype == "bfloat16" else "np"
        return f"pass np.asarray({name}, dtype={module}.{dtype})"
    return (f"pass np.asarray({name}, dtype=np.float32) (or the dtype of the other "
            f"operands)")


def shape_of(value, name):
    """The shape of an array argument whose values are not used (TF's V2 ops)."""
    return as_float_array(value, name).shape


def common_dtype(sources=None, **arrays):
    """The one dtype all float operands of a call share (TypeError when they differ).

    ``sources``: the caller's values of the operands, by name; the message names those
    that NumPy converted from something other than an array (a nested list becomes
    float64), and how to pass them in the others' dtype.
    """
    first = next(iter(arrays.values())).dtype
    if all(a.dtype == first for a in arrays.values()):  # the common case, without names
        return np.dtype(first).name
    dtypes = {k: np.dtype(a.dtype).name for k, a in arrays.items()}
    if len(set(dtypes.values())) > 1:
        converted = {k: type(v).__name__ for k, v in (sources or {}).items()
                     if k in arrays and isinstance(arrays[k], np.ndarray)
                     and not isinstance(v, np.ndarray)}
        got = ", ".join(f"{k}={d}" + (f" (converted from a {converted[k]})"
                                      if k in converted else "")
                        for k, d in dtypes.items())
        msg = f"all arrays of one call must share one float dtype, got {got}"
        kept = {d for k, d in dtypes.items() if k not in converted}
        if converted and len(kept) == 1:
            msg += "; " + " and ".join(_fix(k, next(iter(kept))) for k in converted)
        raise TypeError(msg)
    return next(iter(dtypes.values()))


def check_rank(arr, name, ranks, what=""):
    ranks = (ranks,) if isinstance(ranks, int) else tuple(ranks)
    if arr.ndim not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise ValueError(f"{name}: expected a rank-{want} array{what}, got rank {arr.ndim} "
                         f"with shape {tuple(arr.shape)}")


# -- integers -----------------------------------------------------------------------------------
def _is_int(v):
    t = type(v)
    if t is int:  # fast path: ABC instance checks cost a microsecond each, per attribute
        return True
    if t is bool:
        return False
    return isinstance(v, (numbers.Integral, np.integer)) and not isinstance(v, (bool, np.bool_))


def as_int(value, name):
    if not _is_int(value):
        raise TypeError(f"{name}: expected an integer, got {value!r}")
    return int(value)


def int_list(value, name):
    """A sequence or 1-D integer array of ints, as a tuple (TypeError otherwise)."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise ValueError(f"{name}: expected a 1-D integer vector, got shape {value.shape}")
        if value.dtype.kind not in "iu":
            raise TypeError(f"{name}: expected integers, got an array of dtype {value.dtype}")
        return tuple(int(v) for v in value)
    if type(value) not in (list, tuple) and (isinstance(value, (str, bytes))
                                             or not isinstance(value, Sequence)):
        raise TypeError(f"{name}: expected a sequence of integers, got {value!r}")
    out = []
    for v in value:
        if not _is_int(v):
            raise TypeError(f"{name}: expected integers, got {v!r} in {list(value)!r}")
        out.append(int(v))
    return tuple(out)


def int_or_list(value, name):
    """An int or a sequence of ints, as a tuple."""
    if _is_int(value):
        return (int(value),)
    return int_list(value, name)


def shape_vector(value, name, lengths):
    """A shape argument (``input_sizes``, ``filter_sizes``, ...): non-negative ints."""
    dims = int_list(value, name)
    if len(dims) not in lengths:
        want = " or ".join(str(n) for n in lengths)
        raise ValueError(f"{name}: expected {want} values, got {len(dims)}: {list(dims)}")
    if any(d < 0 for d in dims):
        raise ValueError(f"{name}: sizes must be non-negative, got {list(dims)}")
    return _bounded(dims, name)


#: Largest size, stride, dilation or padding accepted: kernels index in int64, and every
#: product of two such values must stay far from 2^63.
MAX_DIM = 2 ** 40


def _bounded(values, name):
    if any(v > MAX_DIM for v in values):
        raise ValueError(f"{name}: values above 2^40 are not supported, got {list(values)}")
    return tuple(values)


def positive(values, name):
    if any(v < 1 for v in values):
        raise ValueError(f"{name}: every value must be a positive integer, got {list(values)}")
    return _bounded(values, name)


def non_negative(values, name):
    if any(v < 0 for v in values):
        raise ValueError(f"{name}: padding must be non-negative, got {list(values)}")
    return _bounded(values, name)


def lift3(values, fill):
    """Spatial values of rank 1-3 lifted to 3-D (leading unit axes)."""
    return (fill,) * (3 - len(values)) + tuple(values)


# -- the window of one spatial axis -------------------------------------------------------------
def window(in_size, k, stride, dilation, mode, pad_begin=0, pad_end=0, axis=""):
    """Resolve one spatial axis: ``(out_size, pad_begin, pad_end)``.

    ``mode`` is ``"SAME_UPPER"`` (TF's SAME: the odd pixel at the end), ``"SAME_LOWER"``,
    ``"VALID"`` or ``"EXPLICIT"`` (use the given pads). SAME gives ``ceil(in/stride)`` outputs
    and a total pad of ``max((out-1)*stride + (k-1)*dilation + 1 - in, 0)``; otherwise
    ``out = (in + pads - (k-1)*dilation - 1) // stride + 1``, which needs the dilated filter
    to fit in the padded input.
    """
    dk = (k - 1) * dilation + 1
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        out = -(-in_size // stride)
        total = max((out - 1) * stride + dk - in_size, 0) if out > 0 else 0
        small = total // 2
        if mode == "SAME_UPPER":
            return out, small, total - small
        return out, total - small, small
    if mode == "VALID":
        pad_begin = pad_end = 0
    padded = in_size + pad_begin + pad_end
    if padded < dk:
        raise ValueError(
            f"filter larger than the padded input along spatial axis {axis}: dilated filter "
            f"size {dk} (kernel {k}, dilation {dilation}) but padded input size {padded} "
            f"(input {in_size}, pads {pad_begin}+{pad_end})")
    return (padded - dk) // stride + 1, pad_begin, pad_end


def check_shape(got, expected, name, what):
    if tuple(got) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)} ({what}), "
                         f"got {tuple(got)}")


# -- channels and the canonical problem --------------------------------------------------------
def groups_from_filter(ic, fin, depthwise, name):
    """Groups implied by a filter's in-channel count (TF: ``C / filter_in``)."""
    if depthwise:
        if fin != ic:
            raise ValueError(f"{name}: depthwise filter in-channels must equal the input's "
                             f"channels {ic}, got {fin}")
        return max(ic, 1)
    if fin == 0:
        if ic != 0:
            raise ValueError(f"{name}: filter in-channels is 0 but the input has {ic} channels")
        return 1
    if ic % fin != 0:
        raise ValueError(f"{name}: filter in-channels {fin} must divide the input's channels "
                         f"{ic} (groups = channels / filter in-channels)")
    return ic // fin


def filter_fits(c, fin, fout, depthwise):
    """Whether ``c`` input channels suit a filter of ``fin`` in- and ``fout`` out-channels
    (or multiplier) with groups inferred as TF infers them (``c / fin``)."""
    if depthwise:
        return c == fin
    if fin == 0:
        return c == 0
    return c > 0 and c % fin == 0 and fout % (c // fin) == 0


def layout_mismatch(name, shape, fmt, user_fmt, other_fmt, want, fits, detail=""):
    """The ValueError for data whose channel count (axis 1 for ``NCX``, the last for
    ``NXC``) does not suit the filter: it names the argument, the axis and the layout, and
    asks whether the data is in ``other_fmt`` where the other axis would suit (``fits``)."""
    axis, other = (1, len(shape) - 1) if fmt == "NCX" else (len(shape) - 1, 1)
    msg = (f"{name}: {shape[axis]} channels along axis {axis} (data_format={user_fmt!r}) "
           f"but the filter expects {want} input channels{detail}")
    if fits(shape[other]):
        msg += (f"; is the data {other_fmt}? (its axis {other} has {shape[other]}: pass "
                f"data_format={other_fmt!r})")
    return ValueError(msg)


def check_groups(ic, oc, g):
    if g < 1:
        raise ValueError(f"groups: expected a positive integer, got {g}")
    if ic % g:
        raise ValueError(f"groups: input channels C={ic} are not divisible by groups={g}")
    if oc % g:
        raise ValueError(f"groups: output channels K={oc} are not divisible by groups={g}")


def make_problem(*, op, direction, nd, data_format, filter_format, dtype, mb, ic, oc, g,
                 isz, ksz, stride, dilation, mode, pad_begin=None, pad_end=None,
                 base_isz=None, dy_shape=None, dy_name="out_backprop", multiplier=0):
    """Resolve every axis with :func:`window` and freeze the :class:`ConvProblem`.

    ``base_isz`` (backward data with ``output_padding``) is the input size the window is
    resolved on; the problem's input is ``isz``, larger by the output padding.
    ``dy_shape``, when given, must equal the forward output shape. ``multiplier``: a TF
    depthwise filter's channel multiplier.
    """
    from ..problem import ConvProblem

    check_groups(ic, oc, g)
    if any(k < 1 for k in ksz):
        raise ValueError(f"filter: spatial sizes must be positive, got {list(ksz)}")
    pad_begin = pad_begin or (0,) * nd
    pad_end = pad_end or (0,) * nd
    base = isz if base_isz is None else base_isz
    osz, pb, pe = [], [], []
    for a in range(nd):
        o, b, e = window(base[a], ksz[a], stride[a], dilation[a], mode, pad_begin[a],
                         pad_end[a], axis=a)
        osz.append(o)
        pb.append(b)
        pe.append(e)
    problem = ConvProblem(
        direction=direction, mb=mb, g=g, ic=ic, oc=oc, isz=lift3(isz, 1), ksz=lift3(ksz, 1),
        osz=lift3(osz, 1), stride=lift3(stride, 1), dilation=lift3(dilation, 1),
        pad_begin=lift3(pb, 0), pad_end=lift3(pe, 0), ndim=nd, dtype=dtype,
        data_format=data_format, filter_format=filter_format, op=op, multiplier=multiplier)
    if dy_shape is not None:
        check_shape(dy_shape, problem.y_shape, dy_name, "the forward output shape")
    return problem


def split_data_shape(shape, data_format):
    """``(N, C, spatial)`` of a data shape in ``NXC`` or ``NCX`` order."""
    shape = tuple(shape)  # (the CUDA simulator's shapes refuse negative indices)
    if data_format == "NXC":
        return shape[0], shape[-1], tuple(shape[1:-1])
    return shape[0], shape[1], tuple(shape[2:])
