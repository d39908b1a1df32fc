"""TensorFlow-compatible names: TF's conventions parsed into a ConvProblem.

Argument names, positional order, defaults and shapes follow ``tf.raw_ops`` and
``tf.compat.v1.nn``. Differences from TensorFlow's CPU kernels, on purpose: dilations are
honoured by every op (also with stride > 1 and in depthwise backprop, where TF's CPU kernels
refuse or ignore them), and grouped filters (filter in-channels = C / groups) are accepted
by the conv2d/conv3d names as TF's GPU kernels accept them.
"""
from collections.abc import Sequence

import numpy as np

from ._common import (as_float_array, common_dtype, check_rank, int_list, int_or_list,
                      shape_vector, positive, non_negative, make_problem, split_data_shape,
                      groups_from_filter, filter_fits, layout_mismatch)
from ._op import op

_FORMATS = {2: {"NHWC": "NXC", "NCHW": "NCX"}, 3: {"NDHWC": "NXC", "NCDHW": "NCX"}}
_DEFAULT_FORMAT = {2: "NHWC", 3: "NDHWC"}


def _data_format(value, nd):
    if value is None:
        value = _DEFAULT_FORMAT[nd]
    if not isinstance(value, str):
        raise TypeError(f"data_format: expected a string such as {_DEFAULT_FORMAT[nd]!r}, "
                        f"got {value!r}")
    fmt = _FORMATS[nd].get(value.upper())
    if fmt is None:
        raise ValueError(f"data_format: expected one of {sorted(_FORMATS[nd])}, got {value!r}")
    return fmt


def _cudnn(value):
    if value is not None and not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"use_cudnn_on_gpu: expected None or a bool, got {value!r} (a TF2-style "
                        "positional call puts data_format here: pass it by keyword)")


def _spatial_attr(value, name, nd, fmt, default):
    """strides / dilations: an int, one per spatial dim, or full rank in data_format order."""
    if value is None:
        return (default,) * nd
    vals = int_or_list(value, name)
    if len(vals) == 1:
        vals = vals * nd
    elif len(vals) == nd + 2:
        outer = (vals[0], vals[-1]) if fmt == "NXC" else (vals[0], vals[1])
        sp = vals[1:-1] if fmt == "NXC" else vals[2:]
        if outer != (1, 1):
            raise ValueError(f"{name}: the batch and channel entries must be 1, got "
                             f"{list(vals)}")
        vals = sp
    elif len(vals) != nd:
        raise ValueError(f"{name}: expected 1, {nd} or {nd + 2} values, got {len(vals)}: "
                         f"{list(vals)}")
    return positive(vals, name)


def _pairs_spatial(pairs, name, nd, fmt):
    """Full-rank (data_format order) or spatial-only (before, after) pairs -> spatial pairs."""
    if len(pairs) == nd + 2:
        outer = (pairs[0], pairs[-1]) if fmt == "NXC" else (pairs[0], pairs[1])
        if any(p != (0, 0) for p in outer):
            raise ValueError(f"{name}: the batch and channel paddings must be zero, got "
                             f"{[list(p) for p in pairs]}")
        pairs = pairs[1:-1] if fmt == "NXC" else pairs[2:]
    elif len(pairs) != nd:
        raise ValueError(f"{name}: expected {nd + 2} (before, after) pairs in data_format "
                         f"order (or {nd} spatial pairs), got {len(pairs)}")
    pb = non_negative(tuple(p[0] for p in pairs), name)
    pe = non_negative(tuple(p[1] for p in pairs), name)
    return pb, pe


def _padding(padding, explicit_paddings, nd, fmt, takes_explicit=True):
    """SAME / VALID / EXPLICIT (+ explicit_paddings) / list of pairs -> (mode, pb, pe)."""
    ep = ()
    if explicit_paddings is not None:
        ep = int_list(explicit_paddings, "explicit_paddings")
    if isinstance(padding, str):
        mode = padding.upper()
        if mode in ("SAME", "VALID"):
            if ep:
                raise ValueError(f"explicit_paddings: must be empty unless padding is "
                                 f"'EXPLICIT', got padding={padding!r} and "
                                 f"explicit_paddings={list(ep)}")
            return ("SAME_UPPER" if mode == "SAME" else "VALID"), None, None
        if mode == "EXPLICIT":
            if not takes_explicit:
                raise ValueError("padding: 'EXPLICIT' needs explicit_paddings, which this op "
                                 "does not take; pass padding as a list of (before, after) "
                                 "pairs instead")
            if len(ep) != 2 * (nd + 2):
                raise ValueError(f"explicit_paddings: expected {2 * (nd + 2)} values (a "
                                 f"(before, after) pair per dimension in data_format order) "
                                 f"for padding='EXPLICIT', got {len(ep)}: {list(ep)}")
            pairs = [(ep[2 * i], ep[2 * i + 1]) for i in range(nd + 2)]
            return ("EXPLICIT", *_pairs_spatial(pairs, "explicit_paddings", nd, fmt))
        raise ValueError(f"padding: expected 'SAME', 'VALID', 'EXPLICIT' or a list of "
                         f"(before, after) pairs, got {padding!r}")
    if isinstance(padding, np.ndarray):
        padding = padding.tolist()
    if isinstance(padding, Sequence) and not isinstance(padding, bytes):
        if ep:
            raise ValueError("explicit_paddings: must be empty when padding is a list of pairs")
        pairs = []
        for p in padding:
            pair = int_list(p, "padding")
            if len(pair) != 2:
                raise ValueError(f"padding: expected (before, after) pairs, got {list(pair)}")
            pairs.append(pair)
        return ("EXPLICIT", *_pairs_spatial(pairs, "padding", nd, fmt))
    raise TypeError(f"padding: expected 'SAME', 'VALID', 'EXPLICIT' or a list of "
                    f"(before, after) pairs, got {padding!r}")


def _check_layout(x_shape, fin, fout, fmt, data_format, nd, depthwise, x_name):
    """Data whose channels do not suit the filter, with groups inferred (``C / fin``): a
    ValueError naming the layout and the mismatch (often data in the other layout), not
    the groups the caller never passed."""
    _, ic, _ = split_data_shape(x_shape, fmt)
    if filter_fits(ic, fin, fout, depthwise):
        return
    user = (data_format or _DEFAULT_FORMAT[nd]).upper()
    other = next(k for k, v in _FORMATS[nd].items() if v != fmt)
    detail = "" if depthwise or fin == 0 else (
        f" (or a multiple of {fin} for a grouped filter, the groups dividing its {fout} "
        f"output channels)")
    raise layout_mismatch(x_name, tuple(x_shape), fmt, user, other, fin,
                          lambda c: filter_fits(c, fin, fout, depthwise), detail)


def _tf_problem(opname, direction, nd, *, x_shape, w_shape, dy_shape, strides, padding,
                explicit_paddings, data_format, dilations, dtype, depthwise,
                takes_explicit=True, x_name="input"):
    fmt = _data_format(data_format, nd)
    stride = _spatial_attr(strides, "strides", nd, fmt, 1)
    dilation = _spatial_attr(dilations, "dilations", nd, fmt, 1)
    mode, pb, pe = _padding(padding, explicit_paddings, nd, fmt, takes_explicit)
    mb, ic, isz = split_data_shape(x_shape, fmt)
    ksz, fin, fout = tuple(w_shape[:nd]), w_shape[nd], w_shape[nd + 1]
    _check_layout(x_shape, fin, fout, fmt, data_format, nd, depthwise, x_name)
    g = groups_from_filter(ic, fin, depthwise, "filter")
    oc = ic * fout if depthwise else fout
    return make_problem(
        op=opname, direction=direction, nd=nd, data_format=fmt,
        filter_format="XIM" if depthwise else "XIO", dtype=dtype, mb=mb, ic=ic, oc=oc, g=g,
        isz=isz, ksz=ksz, stride=stride, dilation=dilation, mode=mode, pad_begin=pb,
        pad_end=pe, dy_shape=dy_shape, dy_name="out_backprop",
        multiplier=fout if depthwise else 0)


def _need_strides(strides):
    if strides is None:
        raise TypeError("strides: required (an int, one per spatial dim, or a full-rank list)")


def _input_sizes(input_sizes, nd, data_format, dy, w, depthwise):
    """Full input shape from ``input_sizes`` (full shape, or spatial dims only as TF allows:
    batch then comes from ``out_backprop`` and channels from ``filter``)."""
    sizes = shape_vector(input_sizes, "input_sizes", (nd, nd + 2))
    if len(sizes) == nd + 2:
        return sizes
    fmt = _data_format(data_format, nd)
    mb, c = dy.shape[0], w.shape[nd]
    return (mb, *sizes, c) if fmt == "NXC" else (mb, c, *sizes)


def _filter_sizes(filter_sizes, nd, data_format, x, dy, depthwise):
    """Full filter shape from ``filter_sizes`` (full, or spatial only: in-channels from
    ``input``, out-channels (or multiplier) from ``out_backprop``)."""
    sizes = shape_vector(filter_sizes, "filter_sizes", (nd, nd + 2))
    if len(sizes) == nd + 2:
        return sizes
    fmt = _data_format(data_format, nd)
    _, c, _ = split_data_shape(x.shape, fmt)
    _, k, _ = split_data_shape(dy.shape, fmt)
    if depthwise:
        return (*sizes, c, k // c if c else 0)
    return (*sizes, c, k)


# -- the generic TF-style builders ------------------------------------------------------------
def _backprop_input(opname, nd, depthwise, input_sizes, filter, out_backprop, strides, padding,
                    data_format, dilations, explicit_paddings, takes_explicit=True, v2=None):
    _need_strides(strides)
    w = as_float_array(filter, "filter")
    dy = as_float_array(out_backprop, "out_backprop")
    arrays = {"filter": w, "out_backprop": dy}
    if v2 is not None:
        arrays["input"] = as_float_array(v2, "input")
    dtype = common_dtype(dict(filter=filter, out_backprop=out_backprop, input=v2), **arrays)
    check_rank(w, "filter", nd + 2)
    check_rank(dy, "out_backprop", nd + 2)
    if v2 is not None:
        check_rank(arrays["input"], "input", nd + 2)
        x_shape = arrays["input"].shape
    else:
        x_shape = _input_sizes(input_sizes, nd, data_format, dy, w, depthwise)
    problem = _tf_problem(opname, "bwd_d", nd, x_shape=x_shape, w_shape=w.shape,
                          dy_shape=dy.shape, strides=strides, padding=padding,
                          explicit_paddings=explicit_paddings, data_format=data_format,
                          dilations=dilations, dtype=dtype, depthwise=depthwise,
                          takes_explicit=takes_explicit,
                          x_name="input" if v2 is not None else "input_sizes")
    return problem, {"dy": dy, "w": w}


def _backprop_filter(opname, nd, depthwise, input, filter_sizes, out_backprop, strides, padding,
                     data_format, dilations, explicit_paddings, takes_explicit=True, v2=None):
    _need_strides(strides)
    x = as_float_array(input, "input")
    dy = as_float_array(out_backprop, "out_backprop")
    arrays = {"input": x, "out_backprop": dy}
    if v2 is not None:
        arrays["filter"] = as_float_array(v2, "filter")
    dtype = common_dtype(dict(input=input, out_backprop=out_backprop, filter=v2), **arrays)
    check_rank(x, "input", nd + 2)
    check_rank(dy, "out_backprop", nd + 2)
    if v2 is not None:
        check_rank(arrays["filter"], "filter", nd + 2)
        w_shape = arrays["filter"].shape
    else:
        w_shape = _filter_sizes(filter_sizes, nd, data_format, x, dy, depthwise)
    problem = _tf_problem(opname, "bwd_w", nd, x_shape=x.shape, w_shape=w_shape,
                          dy_shape=dy.shape, strides=strides, padding=padding,
                          explicit_paddings=explicit_paddings, data_format=data_format,
                          dilations=dilations, dtype=dtype, depthwise=depthwise,
                          takes_explicit=takes_explicit)
    return problem, {"x": x, "dy": dy}


def _forward(opname, nd, depthwise, input, filter, strides, padding, data_format, dilations,
             explicit_paddings, takes_explicit=True):
    _need_strides(strides)
    x = as_float_array(input, "input")
    w = as_float_array(filter, "filter")
    dtype = common_dtype(dict(input=input, filter=filter), input=x, filter=w)
    check_rank(x, "input", nd + 2)
    check_rank(w, "filter", nd + 2)
    problem = _tf_problem(opname, "fwd", nd, x_shape=x.shape, w_shape=w.shape, dy_shape=None,
                          strides=strides, padding=padding, explicit_paddings=explicit_paddings,
                          data_format=data_format, dilations=dilations, dtype=dtype,
                          depthwise=depthwise, takes_explicit=takes_explicit)
    return problem, {"x": x, "w": w}


# -- the public TF-style ops --------------------------------------------------------------------
@op
def conv2d_backprop_input(input_sizes, filter, out_backprop, strides, padding,
                          use_cudnn_on_gpu=None, data_format="NHWC", dilations=None,
                          explicit_paddings=None, name=None, *, out=None, strategy=None,
                          tune=False, stream=None, precision=None):
    """Gradient of ``conv2d`` with respect to its input (TF ``Conv2DBackpropInput``).

    Parameters
    ----------
    input_sizes : sequence or 1-D int array
        The input's shape ``[N, H, W, C]`` (in ``data_format`` order), or ``[H, W]`` only
        (batch from ``out_backprop``, channels from ``filter``).
    filter : array ``[fh, fw, C/groups, K]``
    out_backprop : array, the forward output's gradient ``[N, oh, ow, K]``
    strides, dilations : int, one per spatial dim, or full rank in ``data_format`` order
    padding : ``"SAME"``, ``"VALID"``, ``"EXPLICIT"`` or a list of (before, after) pairs
    use_cudnn_on_gpu : None or bool, ignored
    data_format : ``"NHWC"`` or ``"NCHW"``
    explicit_paddings : 8 ints with ``padding="EXPLICIT"``
    name : optional label for errors
    out : optional preallocated result; strategy, tune : see :func:`numbaconv.plan`
    stream : device calls only: the CUDA stream (numba, CuPy, PyTorch or a handle) the
        call's kernels go on; refused for NumPy arrays (docs/contract.md section 11)
    precision : None or ``"tf32"``: device float32 calls only, tensor cores with TF32
        operands and float32 sums

    Returns
    -------
    ndarray of shape ``input_sizes`` and the operands' dtype.

    Examples
    --------
    >>> import numpy as np, numbaconv
    >>> dy = np.ones((1, 2, 2, 1), np.float32); w = np.ones((3, 3, 1, 1), np.float32)
    >>> numbaconv.conv2d_backprop_input([1, 4, 4, 1], w, dy, 2, "SAME")[0, :, :, 0]
    array([[1., 1., 2., 1.],
           [1., 1., 2., 1.],
           [2., 2., 4., 2.],
           [1., 1., 2., 1.]], dtype=float32)
    """
    _cudnn(use_cudnn_on_gpu)
    return _backprop_input("conv2d_backprop_input", 2, False, input_sizes, filter, out_backprop,
                           strides, padding, data_format, dilations, explicit_paddings)


@op
def conv2d_backprop_input_v2(input, filter, out_backprop, strides, padding,
                             use_cudnn_on_gpu=None, data_format="NHWC", dilations=None,
                             explicit_paddings=None, name=None, *, out=None, strategy=None,
                             tune=False, stream=None, precision=None):
    """TF ``Conv2DBackpropInputV2``: as :func:`conv2d_backprop_input`, but the input's shape
    is taken from ``input`` (its values are not used)."""
    _cudnn(use_cudnn_on_gpu)
    return _backprop_input("conv2d_backprop_input_v2", 2, False, None, filter, out_backprop,
                           strides, padding, data_format, dilations, explicit_paddings,
                           v2=input)


@op
def conv2d_backprop_filter(input, filter_sizes, out_backprop, strides, padding,
                           use_cudnn_on_gpu=None, data_format="NHWC", dilations=None,
                           explicit_paddings=None, name=None, *, out=None, strategy=None,
                           tune=False, stream=None, precision=None):
    """Gradient of ``conv2d`` with respect to its filter (TF ``Conv2DBackpropFilter``).

    ``filter_sizes`` is the filter's shape ``[fh, fw, C/groups, K]`` (or ``[fh, fw]``: then
    ``C/groups = C`` and ``K`` from ``out_backprop``). Other arguments as in
    :func:`conv2d_backprop_input`. Returns an array of shape ``filter_sizes``.

    Examples
    --------
    >>> import numpy as np, numbaconv
    >>> x = np.ones((1, 3, 3, 1)); dy = np.ones((1, 3, 3, 1))
    >>> numbaconv.conv2d_backprop_filter(x, [2, 2, 1, 1], dy, 1, "SAME")[:, :, 0, 0]
    array([[9., 6.],
           [6., 4.]])
    """
    _cudnn(use_cudnn_on_gpu)
    return _backprop_filter("conv2d_backprop_filter", 2, False, input, filter_sizes,
                            out_backprop, strides, padding, data_format, dilations,
                            explicit_paddings)


@op
def conv2d_backprop_filter_v2(input, filter, out_backprop, strides, padding,
                              use_cudnn_on_gpu=None, data_format="NHWC", dilations=None,
                              explicit_paddings=None, name=None, *, out=None, strategy=None,
                              tune=False, stream=None, precision=None):
    """TF ``Conv2DBackpropFilterV2``: the filter's shape is taken from ``filter`` (its values
    are not used)."""
    _cudnn(use_cudnn_on_gpu)
    return _backprop_filter("conv2d_backprop_filter_v2", 2, False, input, None, out_backprop,
                            strides, padding, data_format, dilations, explicit_paddings,
                            v2=filter)


@op
def depthwise_conv2d_native_backprop_input(input_sizes, filter, out_backprop, strides, padding,
                                           data_format="NHWC", dilations=None,
                                           explicit_paddings=None, name=None, *, out=None,
                                           strategy=None, tune=False, stream=None, precision=None):
    """TF ``DepthwiseConv2dNativeBackpropInput``. ``filter`` is ``[fh, fw, C, multiplier]``;
    output channel ``c * multiplier + m`` reads input channel ``c``. Dilations are honoured."""
    return _backprop_input("depthwise_conv2d_native_backprop_input", 2, True, input_sizes,
                           filter, out_backprop, strides, padding, data_format, dilations,
                           explicit_paddings)


@op
def depthwise_conv2d_native_backprop_filter(input, filter_sizes, out_backprop, strides, padding,
                                            data_format="NHWC", dilations=None,
                                            explicit_paddings=None, name=None, *, out=None,
                                            strategy=None, tune=False, stream=None, precision=None):
    """TF ``DepthwiseConv2dNativeBackpropFilter``; returns ``[fh, fw, C, multiplier]``."""
    return _backprop_filter("depthwise_conv2d_native_backprop_filter", 2, True, input,
                            filter_sizes, out_backprop, strides, padding, data_format,
                            dilations, explicit_paddings)


@op
def conv3d_backprop_input_v2(input_sizes, filter, out_backprop, strides, padding,
                             data_format="NDHWC", dilations=None, name=None, *, out=None,
                             strategy=None, tune=False, stream=None, precision=None):
    """TF ``Conv3DBackpropInputV2``. ``input_sizes`` is ``[N, D, H, W, C]`` (or the 3
    spatial dims), ``filter`` ``[fd, fh, fw, C/groups, K]``. ``padding`` is SAME, VALID or a
    list of (before, after) pairs."""
    return _backprop_input("conv3d_backprop_input_v2", 3, False, input_sizes, filter,
                           out_backprop, strides, padding, data_format, dilations, None,
                           takes_explicit=False)


@op
def conv3d_backprop_filter_v2(input, filter_sizes, out_backprop, strides, padding,
                              data_format="NDHWC", dilations=None, name=None, *, out=None,
                              strategy=None, tune=False, stream=None, precision=None):
    """TF ``Conv3DBackpropFilterV2``; returns an array of shape ``filter_sizes``."""
    return _backprop_filter("conv3d_backprop_filter_v2", 3, False, input, filter_sizes,
                            out_backprop, strides, padding, data_format, dilations, None,
                            takes_explicit=False)


@op
def conv2d(input, filter, strides, padding, use_cudnn_on_gpu=None, data_format="NHWC",
           dilations=None, explicit_paddings=None, name=None, *, out=None, strategy=None,
           tune=False, stream=None, precision=None):
    """The forward 2-D convolution (TF ``Conv2D``), ``filter`` ``[fh, fw, C/groups, K]``.

    Examples
    --------
    >>> import numpy as np, numbaconv
    >>> x = np.arange(9.0).reshape(1, 3, 3, 1); w = np.ones((2, 2, 1, 1))
    >>> numbaconv.conv2d(x, w, 1, "VALID")[0, :, :, 0]
    array([[ 8., 12.],
           [20., 24.]])
    """
    _cudnn(use_cudnn_on_gpu)
    return _forward("conv2d", 2, False, input, filter, strides, padding, data_format, dilations,
                    explicit_paddings)


@op
def depthwise_conv2d_native(input, filter, strides, padding, data_format="NHWC", dilations=None,
                            explicit_paddings=None, name=None, *, out=None, strategy=None,
                            tune=False, stream=None, precision=None):
    """The forward depthwise convolution (TF ``DepthwiseConv2dNative``)."""
    return _forward("depthwise_conv2d_native", 2, True, input, filter, strides, padding,
                    data_format, dilations, explicit_paddings)


@op
def conv3d(input, filter, strides, padding, data_format="NDHWC", dilations=None, name=None, *,
           out=None, strategy=None, tune=False, stream=None, precision=None):
    """The forward 3-D convolution (TF ``Conv3D``)."""
    return _forward("conv3d", 3, False, input, filter, strides, padding, data_format, dilations,
                    None, takes_explicit=False)
