"""oneDNN-Graph-style generic names: 1-D to 3-D, groups, asymmetric pads, auto_pad.

Conventions (oneDNN Graph ``Convolution`` / ``ConvolutionBackwardData`` /
``ConvolutionBackwardWeights``, spelled as in its spec):

* ``data_format``: ``"NXC"`` (channels last) or ``"NCX"``; the spatial rank comes from the
  data's rank (3, 4 or 5).
* ``filter_format``: ``"XIO"`` = ``[*X, C/groups, K]`` or ``"OIX"`` = ``[K, C/groups, *X]``.
* ``auto_pad``: ``None``/``"none"`` uses ``pads_begin``/``pads_end``; ``"same_upper"`` (the
  odd padding pixel at the end), ``"same_lower"`` (at the beginning) and ``"valid"``
  override them. The backward ops are the exact adjoints of :func:`convolution` with the same
  attributes, so ``same_upper`` puts the odd pixel at the end for all three.
* ``strides``, ``dilations`` (1 = none), ``pads_begin``, ``pads_end``, ``output_padding``:
  an int or one value per spatial dim.
"""
from ._common import (as_float_array, common_dtype, check_rank, int_or_list, as_int, shape_vector,
                      positive, non_negative, make_problem, split_data_shape, layout_mismatch)
from ._op import op

_AUTO_PAD = {"none": "EXPLICIT", "same_upper": "SAME_UPPER", "same_lower": "SAME_LOWER",
             "valid": "VALID"}


def _fmt(value, name, allowed, default):
    if value is None:
        return default
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {list(allowed)}, got {value!r}")
    v = value.upper()
    if v not in allowed:
        raise ValueError(f"{name}: expected one of {list(allowed)}, got {value!r}")
    return v


def _per_axis(value, name, nd, default):
    if value is None:
        return (default,) * nd
    vals = int_or_list(value, name)
    if len(vals) == 1:
        vals = vals * nd
    if len(vals) != nd:
        raise ValueError(f"{name}: expected an int or {nd} values (one per spatial dim), got "
                         f"{len(vals)}: {list(vals)}")
    return vals


def _attrs(nd, strides, pads_begin, pads_end, dilations, auto_pad, groups):
    if strides is None:
        raise TypeError("strides: required (an int or one value per spatial dim)")
    stride = positive(_per_axis(strides, "strides", nd, 1), "strides")
    dilation = positive(_per_axis(dilations, "dilations", nd, 1), "dilations")
    pb = non_negative(_per_axis(pads_begin, "pads_begin", nd, 0), "pads_begin")
    pe = non_negative(_per_axis(pads_end, "pads_end", nd, 0), "pads_end")
    if auto_pad is None:
        mode = "EXPLICIT"
    elif not isinstance(auto_pad, str):
        raise TypeError(f"auto_pad: expected one of {list(_AUTO_PAD)}, got {auto_pad!r}")
    else:
        mode = _AUTO_PAD.get(auto_pad.lower())
        if mode is None:
            raise ValueError(f"auto_pad: expected one of {list(_AUTO_PAD)}, got {auto_pad!r}")
    g = as_int(groups, "groups")
    if g < 1:
        raise ValueError(f"groups: expected a positive integer, got {g}")
    return stride, dilation, pb, pe, mode, g


def _split_filter(shape, filter_format, nd):
    """``(kernel spatial, C/groups, K)`` of a full filter shape."""
    if filter_format == "XIO":
        return tuple(shape[:nd]), shape[nd], shape[nd + 1]
    return tuple(shape[2:]), shape[1], shape[0]


def _data_rank(arr, name):
    check_rank(arr, name, (3, 4, 5), " (N, C and 1 to 3 spatial dims)")
    return arr.ndim - 2


def _channels(ic, icg_filter, oc, g, x_shape, dfmt):
    """The input's channels against the filter's ``C/groups``; a mismatch names the data's
    layout (often data in the other one)."""
    if ic % g:
        raise ValueError(f"groups: input channels C={ic} are not divisible by groups={g}")
    if icg_filter != ic // g:
        other = "NXC" if dfmt == "NCX" else "NCX"
        detail = f" ({icg_filter} per group, {g} groups)" if g > 1 else ""
        raise layout_mismatch("input", tuple(x_shape), dfmt, dfmt, other, icg_filter * g,
                              lambda c: c == icg_filter * g, detail)


@op
def convolution(input, filter, *, strides, pads_begin=None, pads_end=None, dilations=None,
                auto_pad=None, groups=1, data_format="NXC", filter_format="XIO", out=None,
                strategy=None, tune=False, stream=None, precision=None):
    """The forward convolution (oneDNN Graph ``Convolution``), 1-D to 3-D.

    Examples
    --------
    >>> import numpy as np, numbaconv
    >>> x = np.arange(5.0).reshape(1, 5, 1); w = np.ones((2, 1, 1))
    >>> numbaconv.convolution(x, w, strides=1)[0, :, 0]
    array([1., 3., 5., 7.])
    """
    x = as_float_array(input, "input")
    w = as_float_array(filter, "filter")
    dtype = common_dtype(dict(input=input, filter=filter), input=x, filter=w)
    nd = _data_rank(x, "input")
    check_rank(w, "filter", nd + 2, f" (the input has {nd} spatial dims)")
    dfmt = _fmt(data_format, "data_format", ("NXC", "NCX"), "NXC")
    ffmt = _fmt(filter_format, "filter_format", ("XIO", "OIX"), "XIO")
    stride, dilation, pb, pe, mode, g = _attrs(nd, strides, pads_begin, pads_end, dilations,
                                               auto_pad, groups)
    mb, ic, isz = split_data_shape(x.shape, dfmt)
    ksz, icg, oc = _split_filter(w.shape, ffmt, nd)
    _channels(ic, icg, oc, g, x.shape, dfmt)
    problem = make_problem(op="convolution", direction="fwd", nd=nd, data_format=dfmt,
                           filter_format=ffmt, dtype=dtype, mb=mb, ic=ic, oc=oc, g=g, isz=isz,
                           ksz=ksz, stride=stride, dilation=dilation, mode=mode, pad_begin=pb,
                           pad_end=pe)
    return problem, {"x": x, "w": w}


@op
def convolution_backprop_data(output_delta, filter, output_shape=None, *, strides,
                              pads_begin=None, pads_end=None, dilations=None, auto_pad=None,
                              output_padding=None, groups=1, data_format="NXC",
                              filter_format="XIO", out=None, strategy=None, tune=False,
                              stream=None, precision=None):
    """Gradient of :func:`convolution` with respect to its input (``ConvolutionBackwardData``).

    ``output_shape`` is the full input shape in ``data_format`` or its spatial dims only.
    When omitted, each spatial size is ``(o-1)*s + (k-1)*d + 1 - pad_begin - pad_end +
    output_padding`` (``o*s + output_padding`` under ``auto_pad="same_*"``). The window is
    resolved on the size without ``output_padding``; the extra trailing positions receive the
    contributions that padding would otherwise crop (as PyTorch's ``output_padding``).
    ``output_padding`` must be smaller than the stride or the dilation of its axis.

    Examples
    --------
    >>> import numpy as np, numbaconv
    >>> dy = np.ones((1, 4, 1)); w = np.ones((2, 1, 1))
    >>> numbaconv.convolution_backprop_data(dy, w, strides=1)[0, :, 0]
    array([1., 2., 2., 2., 1.])
    """
    dy = as_float_array(output_delta, "output_delta")
    w = as_float_array(filter, "filter")
    dtype = common_dtype(dict(output_delta=output_delta, filter=filter), output_delta=dy,
                         filter=w)
    nd = _data_rank(dy, "output_delta")
    check_rank(w, "filter", nd + 2, f" (output_delta has {nd} spatial dims)")
    dfmt = _fmt(data_format, "data_format", ("NXC", "NCX"), "NXC")
    ffmt = _fmt(filter_format, "filter_format", ("XIO", "OIX"), "XIO")
    stride, dilation, pb, pe, mode, g = _attrs(nd, strides, pads_begin, pads_end, dilations,
                                               auto_pad, groups)
    opad = non_negative(_per_axis(output_padding, "output_padding", nd, 0), "output_padding")
    for a in range(nd):
        if opad[a] and not (opad[a] < stride[a] or opad[a] < dilation[a]):
            raise ValueError(f"output_padding: must be smaller than the stride or the dilation "
                             f"of its axis, got {list(opad)} with strides {list(stride)} and "
                             f"dilations {list(dilation)}")
    mb, oc, osz = split_data_shape(dy.shape, dfmt)
    ksz, icg, oc_w = _split_filter(w.shape, ffmt, nd)
    if oc_w != oc:
        raise ValueError(f"filter: expected K = {oc} output channels (from output_delta), got "
                         f"{oc_w}")
    ic = icg * g
    if output_shape is None:
        if mode in ("SAME_UPPER", "SAME_LOWER"):
            base = tuple(o * s for o, s in zip(osz, stride))
        else:
            p0 = (0,) * nd if mode == "VALID" else pb
            p1 = (0,) * nd if mode == "VALID" else pe
            base = tuple((o - 1) * s + (k - 1) * d + 1 - b - e
                         for o, s, k, d, b, e in zip(osz, stride, ksz, dilation, p0, p1))
            if any(v < 0 for v in base):
                raise ValueError(f"output_shape: the computed input size {list(base)} is "
                                 f"negative: pads {list(p0)}+{list(p1)} exceed the dilated "
                                 "filter; pass output_shape")
        isz = tuple(b + p for b, p in zip(base, opad))
    else:
        sizes = shape_vector(output_shape, "output_shape", (nd, nd + 2))
        if len(sizes) == nd + 2:
            mb_o, ic_o, isz = split_data_shape(sizes, dfmt)
            if mb_o != mb:
                raise ValueError(f"output_shape: batch {mb_o} differs from output_delta's "
                                 f"batch {mb}")
            if ic_o != ic:
                raise ValueError(f"output_shape: expected C = {ic} channels (filter C/groups "
                                 f"{icg} x groups {g}), got {ic_o}")
        else:
            isz = sizes
        base = tuple(i - p for i, p in zip(isz, opad))
        if any(v < 0 for v in base):
            raise ValueError(f"output_padding: {list(opad)} exceeds output_shape {list(isz)}")
    problem = make_problem(op="convolution_backprop_data", direction="bwd_d", nd=nd,
                           data_format=dfmt, filter_format=ffmt, dtype=dtype, mb=mb, ic=ic,
                           oc=oc, g=g, isz=isz, ksz=ksz, stride=stride, dilation=dilation,
                           mode=mode, pad_begin=pb, pad_end=pe, base_isz=base,
                           dy_shape=dy.shape, dy_name="output_delta")
    return problem, {"dy": dy, "w": w}


@op
def convolution_backprop_filters(input, filters_shape, output_delta, *, strides, pads_begin=None,
                                 pads_end=None, dilations=None, auto_pad=None, groups=1,
                                 data_format="NXC", filter_format="XIO", out=None,
                                 strategy=None, tune=False, stream=None, precision=None):
    """Gradient of :func:`convolution` with respect to its filter
    (``ConvolutionBackwardWeights``). ``filters_shape`` is the spatial kernel shape or the full
    filter shape in ``filter_format``; the result has the full filter shape.

    Examples
    --------
    >>> import numpy as np, numbaconv
    >>> x = np.arange(5.0).reshape(1, 5, 1); dy = np.ones((1, 4, 1))
    >>> numbaconv.convolution_backprop_filters(x, [2], dy, strides=1)[:, 0, 0]
    array([ 6., 10.])
    """
    x = as_float_array(input, "input")
    dy = as_float_array(output_delta, "output_delta")
    dtype = common_dtype(dict(input=input, output_delta=output_delta), input=x,
                         output_delta=dy)
    nd = _data_rank(x, "input")
    check_rank(dy, "output_delta", nd + 2, f" (the input has {nd} spatial dims)")
    dfmt = _fmt(data_format, "data_format", ("NXC", "NCX"), "NXC")
    ffmt = _fmt(filter_format, "filter_format", ("XIO", "OIX"), "XIO")
    stride, dilation, pb, pe, mode, g = _attrs(nd, strides, pads_begin, pads_end, dilations,
                                               auto_pad, groups)
    mb, ic, isz = split_data_shape(x.shape, dfmt)
    _, oc, _ = split_data_shape(dy.shape, dfmt)
    sizes = shape_vector(filters_shape, "filters_shape", (nd, nd + 2))
    if len(sizes) == nd + 2:
        ksz, icg, oc_w = _split_filter(sizes, ffmt, nd)
        _channels(ic, icg, oc_w, g, x.shape, dfmt)
        if oc_w != oc:
            raise ValueError(f"filters_shape: expected K = {oc} output channels (from "
                             f"output_delta), got {oc_w}")
    else:
        ksz = sizes
    problem = make_problem(op="convolution_backprop_filters", direction="bwd_w", nd=nd,
                           data_format=dfmt, filter_format=ffmt, dtype=dtype, mb=mb, ic=ic,
                           oc=oc, g=g, isz=isz, ksz=ksz, stride=stride, dilation=dilation,
                           mode=mode, pad_begin=pb, pad_end=pe, dy_shape=dy.shape,
                           dy_name="output_delta")
    return problem, {"x": x, "dy": dy}
