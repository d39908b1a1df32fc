"""docs/contract.md section 9: bad input gets a clear TypeError / ValueError naming the argument, and no input is
ever modified, not even on the way to an error."""
import re

import numpy as np
import pytest

import numbaconv as nc

F16, F32, F64 = np.float16, np.float32, np.float64


def _x(shape=(1, 5, 5, 2), dtype=F32):
    return np.arange(np.prod(shape), dtype=np.float64).reshape(shape).astype(dtype) / 7


# --------------------------------------------------------------------------- TypeError
BAD_DTYPES = [np.int32, np.int64, np.uint8, np.complex64, np.complex128, np.bool_, object]


@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("operand", ["input", "filter"])
def test_conv2d_bad_dtype(operand, dtype):
    x, w = _x(), _x((3, 3, 2, 2))
    if operand == "input":
        x = x.astype(dtype)
    else:
        w = w.astype(dtype)
    with pytest.raises(TypeError):
        nc.conv2d(x, w, 1, "SAME")


@pytest.mark.parametrize("dtype", [np.int32, np.complex128, np.bool_, object],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["conv2d_backprop_input", "conv2d_backprop_filter",
                                "convolution_backprop_data", "convolution_backprop_filters",
                                "convolution"])
def test_gradients_bad_dtype(op, dtype):
    x, w, dy = _x(), _x((3, 3, 2, 2)), _x((1, 5, 5, 2))
    dy = dy.astype(dtype)
    with pytest.raises(TypeError):
        if op == "conv2d_backprop_input":
            nc.conv2d_backprop_input(x.shape, w, dy, 1, "SAME")
        elif op == "conv2d_backprop_filter":
            nc.conv2d_backprop_filter(x, w.shape, dy, 1, "SAME")
        elif op == "convolution_backprop_data":
            nc.convolution_backprop_data(dy, w, x.shape, strides=[1, 1], auto_pad="same_upper")
        elif op == "convolution_backprop_filters":
            nc.convolution_backprop_filters(x, w.shape, dy, strides=[1, 1],
                                            auto_pad="same_upper")
        else:
            nc.convolution(dy, w, strides=[1, 1])


@pytest.mark.parametrize("pair", [(F32, F64), (F16, F32), (F64, F16)],
                         ids=lambda p: f"{np.dtype(p[0]).name}-{np.dtype(p[1]).name}")
def test_mixed_float_dtypes(pair):
    a, b = pair
    x, w, dy = _x(dtype=a), _x((3, 3, 2, 2), dtype=b), _x((1, 5, 5, 2), dtype=b)
    with pytest.raises(TypeError):
        nc.conv2d(x, w, 1, "SAME")
    with pytest.raises(TypeError):
        nc.conv2d_backprop_filter(x, [3, 3, 2, 2], dy, 1, "SAME")
    with pytest.raises(TypeError):
        nc.conv2d_backprop_input(x.shape, _x((3, 3, 2, 2), dtype=a), dy, 1, "SAME")
    with pytest.raises(TypeError):
        nc.convolution_backprop_filters(x, [3, 3], dy, strides=[1, 1], auto_pad="same_upper")


def test_out_dtype_must_match():
    x, w = _x(), _x((3, 3, 2, 2))
    with pytest.raises((TypeError, ValueError), match="out"):
        nc.conv2d(x, w, 1, "SAME", out=np.zeros((1, 5, 5, 2), F64))


@pytest.mark.parametrize("bad", ["abc", None, 3.0], ids=["string", "none", "scalar"])
def test_non_array_operand(bad):
    w = _x((3, 3, 2, 2))
    with pytest.raises(TypeError):
        nc.conv2d(bad, w, 1, "SAME")
    with pytest.raises(TypeError):
        nc.conv2d_backprop_input([1, 5, 5, 2], w, bad, 1, "SAME")
    with pytest.raises(TypeError):
        nc.convolution(bad, w, strides=[1, 1])


# --------------------------------------------------------------------------- ValueError
def test_wrong_rank_input():
    w = _x((3, 3, 2, 2))
    with pytest.raises(ValueError, match="input"):
        nc.conv2d(_x((5, 5, 2)), w, 1, "SAME")
    with pytest.raises(ValueError, match="input"):
        nc.conv3d(_x(), _x((2, 2, 2, 2, 2)), 1, "SAME")
    with pytest.raises(ValueError, match="input"):
        nc.convolution(_x((5, 2)), _x((3, 2, 2)), strides=[1])
    with pytest.raises(ValueError, match="input"):
        nc.convolution(_x((1, 3, 3, 3, 3, 2)), _x((2, 2, 2, 2, 2, 2)), strides=[1, 1, 1, 1])


def test_wrong_rank_filter():
    with pytest.raises(ValueError, match="filter"):
        nc.conv2d(_x(), _x((3, 3, 2)), 1, "SAME")
    with pytest.raises(ValueError, match="filter"):
        nc.convolution(_x(), _x((3, 2, 2)), strides=[1, 1])
    with pytest.raises(ValueError, match="filter"):
        nc.depthwise_conv2d_native(_x(), _x((3, 3, 2, 1, 1)), 1, "SAME")


def test_wrong_rank_out_backprop():
    with pytest.raises(ValueError, match="out_backprop"):
        nc.conv2d_backprop_filter(_x(), [3, 3, 2, 2], _x((5, 5, 2)), 1, "SAME")
    with pytest.raises(ValueError, match="output_delta"):
        nc.convolution_backprop_filters(_x(), [3, 3], _x((1, 5, 5, 5, 2)), strides=[1, 1])


def test_wrong_length_sizes():
    with pytest.raises(ValueError, match="input_sizes"):
        nc.conv2d_backprop_input([1, 5, 5], _x((3, 3, 2, 2)), _x(), 1, "SAME")
    with pytest.raises(ValueError, match="filter_sizes"):
        nc.conv2d_backprop_filter(_x(), [3, 3, 2], _x(), 1, "SAME")
    with pytest.raises(ValueError, match="filters_shape"):
        nc.convolution_backprop_filters(_x(), [3, 3, 2], _x(), strides=[1, 1],
                                        auto_pad="same_upper")
    with pytest.raises(ValueError, match="output_shape"):
        nc.convolution_backprop_data(_x(), _x((3, 3, 2, 2)), [5, 5, 2], strides=[1, 1],
                                     auto_pad="same_upper")


@pytest.mark.parametrize("value", [0, -1, [1, 0], [1, 2, -2, 1]],
                         ids=["zero", "negative", "spatial-zero", "full-negative"])
def test_non_positive_strides(value):
    with pytest.raises(ValueError, match="strides"):
        nc.conv2d(_x(), _x((3, 3, 2, 2)), value, "SAME")
    with pytest.raises(ValueError, match="strides"):
        nc.conv2d_backprop_filter(_x(), [3, 3, 2, 2], _x(), value, "SAME")


@pytest.mark.parametrize("value", [0, -1, [2, 0]], ids=["zero", "negative", "spatial-zero"])
def test_non_positive_dilations(value):
    with pytest.raises(ValueError, match="dilations"):
        nc.conv2d(_x(), _x((3, 3, 2, 2)), 1, "SAME", dilations=value)
    with pytest.raises(ValueError, match="dilations"):
        nc.conv2d_backprop_input([1, 5, 5, 2], _x((3, 3, 2, 2)), _x(), 1, "SAME",
                                 dilations=value)


def test_generic_non_positive_strides_and_dilations():
    with pytest.raises(ValueError, match="strides"):
        nc.convolution(_x(), _x((3, 3, 2, 2)), strides=[0, 1])
    with pytest.raises(ValueError, match="dilations"):
        nc.convolution_backprop_filters(_x(), [3, 3], _x((1, 3, 3, 2)), strides=[1, 1],
                                        dilations=[1, 0])
    with pytest.raises(ValueError, match="strides"):
        nc.convolution_backprop_data(_x((1, 3, 3, 2)), _x((3, 3, 2, 2)), [1, 5, 5, 2],
                                     strides=[-1, 1])


def test_batch_or_channel_stride_not_one():
    with pytest.raises(ValueError, match="strides"):
        nc.conv2d(_x(), _x((3, 3, 2, 2)), [2, 1, 1, 1], "SAME")
    with pytest.raises(ValueError, match="dilations"):
        nc.conv2d(_x(), _x((3, 3, 2, 2)), [1, 1, 1, 1], "SAME", dilations=[1, 1, 1, 2])


def test_wrong_length_strides():
    with pytest.raises(ValueError, match="strides"):
        nc.conv2d(_x(), _x((3, 3, 2, 2)), [1, 1, 1], "SAME")
    with pytest.raises(ValueError, match="strides"):
        nc.convolution(_x(), _x((3, 3, 2, 2)), strides=[1, 1, 1])


def test_negative_padding():
    with pytest.raises(ValueError, match="padding|explicit_paddings"):
        nc.conv2d(_x(), _x((3, 3, 2, 2)), 1, "EXPLICIT",
                  explicit_paddings=[0, 0, -1, 1, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="padding"):
        nc.conv2d(_x(), _x((3, 3, 2, 2)), 1, [[0, 0], [1, -1], [0, 0], [0, 0]])
    with pytest.raises(ValueError, match="pads_begin"):
        nc.convolution(_x(), _x((3, 3, 2, 2)), strides=[1, 1], pads_begin=[-1, 0],
                       pads_end=[0, 0])
    with pytest.raises(ValueError, match="pads_end"):
        nc.convolution_backprop_filters(_x(), [3, 3], _x((1, 3, 3, 2)), strides=[1, 1],
                                        pads_begin=[1, 1], pads_end=[0, -1])


def test_explicit_paddings_nonzero_batch_or_channel():
    with pytest.raises(ValueError, match="explicit_paddings"):
        nc.conv2d(_x(), _x((3, 3, 2, 2)), 1, "EXPLICIT",
                  explicit_paddings=[1, 0, 1, 1, 1, 1, 0, 0])


@pytest.mark.parametrize("op,kw,argname", [
    ("conv2d", dict(padding="FULL"), "padding"),
    ("conv2d", dict(padding="same "), "padding"),
    ("conv2d", dict(data_format="NWHC"), "data_format"),
    ("conv2d", dict(data_format="NCDHW"), "data_format"),
    ("conv3d", dict(data_format="NHWC"), "data_format"),
    ("convolution", dict(data_format="NHWC"), "data_format"),
    ("convolution", dict(filter_format="IOX"), "filter_format"),
    ("convolution", dict(auto_pad="same"), "auto_pad"),
    ("convolution", dict(auto_pad="SAME_UPPER_X"), "auto_pad"),
], ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={x}" for k, x in v.items()))
def test_unknown_strings(op, kw, argname):
    if op == "conv2d":
        args = dict(strides=1, padding="SAME", data_format="NHWC")
        args.update(kw)
        call = lambda: nc.conv2d(_x(), _x((3, 3, 2, 2)), **args)  # noqa: E731
    elif op == "conv3d":
        args = dict(strides=1, padding="SAME")
        args.update(kw)
        call = lambda: nc.conv3d(_x((1, 3, 3, 3, 2)), _x((2, 2, 2, 2, 2)), **args)  # noqa: E731
    else:
        args = dict(strides=[1, 1])
        args.update(kw)
        call = lambda: nc.convolution(_x(), _x((3, 3, 2, 2)), **args)  # noqa: E731
    with pytest.raises(ValueError, match=argname):
        call()


def test_unknown_strings_in_gradients():
    dy = _x((1, 3, 3, 2))
    with pytest.raises(ValueError, match="padding"):
        nc.conv2d_backprop_filter(_x(), [3, 3, 2, 2], dy, 1, "VALIDD")
    with pytest.raises(ValueError, match="data_format"):
        nc.depthwise_conv2d_native_backprop_input([1, 5, 5, 2], _x((3, 3, 2, 1)), dy, 1, "VALID",
                                                  data_format="HWNC")
    with pytest.raises(ValueError, match="auto_pad"):
        nc.convolution_backprop_data(dy, _x((3, 3, 2, 2)), [5, 5], strides=[1, 1],
                                     auto_pad="full")
    with pytest.raises(ValueError, match="filter_format"):
        nc.convolution_backprop_filters(_x(), [3, 3], dy, strides=[1, 1], filter_format="XOI")


def test_explicit_paddings_wrong_length():
    with pytest.raises(ValueError, match="explicit_paddings"):
        nc.conv2d(_x(), _x((3, 3, 2, 2)), 1, "EXPLICIT", explicit_paddings=[1, 1, 1, 1])
    with pytest.raises(ValueError, match="explicit_paddings"):
        nc.conv2d_backprop_input([1, 5, 5, 2], _x((3, 3, 2, 2)), _x(), 1, "EXPLICIT",
                                 explicit_paddings=[0, 0, 1, 1, 1, 1, 0, 0, 0, 0])


def test_explicit_padding_without_explicit_paddings():
    with pytest.raises(ValueError, match="explicit_paddings"):
        nc.conv2d(_x(), _x((3, 3, 2, 2)), 1, "EXPLICIT")


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_explicit_paddings_with_other_padding(padding):
    with pytest.raises(ValueError, match="explicit_paddings"):
        nc.conv2d(_x(), _x((3, 3, 2, 2)), 1, padding,
                  explicit_paddings=[0, 0, 1, 1, 1, 1, 0, 0])
    with pytest.raises(ValueError, match="explicit_paddings"):
        nc.depthwise_conv2d_native_backprop_filter(_x(), [3, 3, 2, 1], _x((1, 5, 5, 2)), 1,
                                                   padding,
                                                   explicit_paddings=[0, 0, 1, 1, 1, 1, 0, 0])


def test_channel_counts_disagree():
    # input has 3 channels, filter reads 2 per group: 3 is not a multiple of 2
    with pytest.raises(ValueError, match="(?i)channel|filter|input"):
        nc.conv2d(_x((1, 5, 5, 3)), _x((3, 3, 2, 2)), 1, "SAME")
    with pytest.raises(ValueError, match="(?i)channel|filter|input"):
        nc.convolution(_x((1, 5, 5, 4)), _x((3, 3, 3, 2)), strides=[1, 1])
    # filter's K differs from output_delta's channels
    with pytest.raises(ValueError, match="(?i)channel|output_delta|filter"):
        nc.convolution_backprop_data(_x((1, 3, 3, 5)), _x((3, 3, 2, 4)), [1, 5, 5, 2],
                                     strides=[1, 1])
    with pytest.raises(ValueError, match="(?i)channel|out_backprop|filter"):
        nc.conv2d_backprop_input([1, 5, 5, 2], _x((3, 3, 2, 4)), _x((1, 5, 5, 3)), 1, "SAME")
    with pytest.raises(ValueError, match="(?i)channel|out_backprop|filter"):
        nc.conv2d_backprop_filter(_x((1, 5, 5, 2)), [3, 3, 2, 4], _x((1, 5, 5, 3)), 1, "SAME")
    with pytest.raises(ValueError, match="(?i)channel|input|filter"):
        nc.depthwise_conv2d_native(_x((1, 5, 5, 3)), _x((3, 3, 2, 1)), 1, "SAME")
    with pytest.raises(ValueError, match="(?i)channel|out_backprop|filter"):
        nc.depthwise_conv2d_native_backprop_input([1, 5, 5, 2], _x((3, 3, 2, 2)),
                                                  _x((1, 5, 5, 2)), 1, "SAME")


def test_channels_not_divisible_by_groups():
    with pytest.raises(ValueError, match="groups"):
        nc.convolution(_x((1, 5, 5, 3)), _x((3, 3, 1, 4)), strides=[1, 1], groups=2)
    with pytest.raises(ValueError, match="groups"):
        nc.convolution(_x((1, 5, 5, 4)), _x((3, 3, 2, 3)), strides=[1, 1], groups=2)
    with pytest.raises(ValueError, match="groups"):
        nc.convolution_backprop_filters(_x((1, 5, 5, 4)), [3, 3], _x((1, 3, 3, 3)),
                                        strides=[1, 1], groups=2)
    with pytest.raises(ValueError, match="groups"):
        nc.convolution_backprop_data(_x((1, 3, 3, 3)), _x((3, 3, 2, 3)), [1, 5, 5, 4],
                                     strides=[1, 1], groups=2)


@pytest.mark.parametrize("groups", [0, -2])
def test_non_positive_groups(groups):
    with pytest.raises(ValueError, match="groups"):
        nc.convolution(_x((1, 5, 5, 4)), _x((3, 3, 2, 4)), strides=[1, 1], groups=groups)


def _ints(msg):
    return [int(v) for v in re.findall(r"-?\d+", msg)]


def _contains_run(seq, run):
    run = list(run)
    return any(seq[i:i + len(run)] == run for i in range(len(seq) - len(run) + 1))


@pytest.mark.parametrize("op", ["conv2d_backprop_input", "conv2d_backprop_filter",
                                "depthwise_conv2d_native_backprop_filter",
                                "conv3d_backprop_input_v2"])
def test_out_backprop_wrong_shape_names_expected(op):
    if op == "conv2d_backprop_input":
        expected = (2, 3, 3, 4)          # 5x5, k=3, VALID, stride 1
        call = lambda dy: nc.conv2d_backprop_input([2, 5, 5, 2], _x((3, 3, 2, 4)), dy,  # noqa
                                                   1, "VALID")
    elif op == "conv2d_backprop_filter":
        expected = (2, 4, 3, 3)          # NCHW, 5x6, SAME, stride 2
        call = lambda dy: nc.conv2d_backprop_filter(_x((2, 2, 5, 6)), [3, 3, 2, 4], dy,  # noqa
                                                    2, "SAME", data_format="NCHW")
    elif op == "depthwise_conv2d_native_backprop_filter":
        expected = (1, 3, 3, 6)          # 7x7, k=2, stride 2, VALID, multiplier 2
        call = lambda dy: nc.depthwise_conv2d_native_backprop_filter(  # noqa
            _x((1, 7, 7, 3)), [2, 2, 3, 2], dy, 2, "VALID")
    else:
        expected = (1, 3, 2, 5, 5)       # 3x4x5 SAME stride (1,2,1), K = 5
        call = lambda dy: nc.conv3d_backprop_input_v2([1, 3, 4, 5, 2], _x((2, 2, 2, 2, 5)),  # noqa
                                                      dy, [1, 2, 1], "SAME")
    wrong = list(expected)
    wrong[1] += 1
    with pytest.raises(ValueError, match="out_backprop") as info:
        call(_x(tuple(wrong)))
    msg = str(info.value)
    assert _contains_run(_ints(msg), expected), msg


def test_input_sizes_batch_disagrees_with_out_backprop():
    expected = (3, 5, 5, 2)            # batch 3 from input_sizes, SAME, stride 1
    with pytest.raises(ValueError, match="out_backprop") as info:
        nc.conv2d_backprop_input([3, 5, 5, 2], _x((3, 3, 2, 2)), _x((2, 5, 5, 2)), 1, "SAME")
    assert _contains_run(_ints(str(info.value)), expected), str(info.value)


def test_padding_pairs_wrong_count():
    with pytest.raises(ValueError, match="padding"):
        nc.conv2d(_x(), _x((3, 3, 2, 2)), 1, [[0, 0], [1, 1], [1, 1]])
    with pytest.raises(ValueError, match="padding"):
        nc.conv2d(_x(), _x((3, 3, 2, 2)), 1, [[0, 0], [1, 1, 1], [1, 1], [0, 0]])


def test_output_delta_wrong_shape_names_expected():
    expected = (1, 4, 3, 3)             # NCX, 6x6, k=3, stride 2, pads (1,1)/(0,1)
    wrong = (1, 4, 3, 2)
    with pytest.raises(ValueError, match="output_delta") as info:
        nc.convolution_backprop_filters(_x((1, 2, 6, 6)), [3, 3], _x(wrong), strides=[2, 2],
                                        pads_begin=[1, 1], pads_end=[0, 1], data_format="NCX")
    assert _contains_run(_ints(str(info.value)), expected), str(info.value)
    with pytest.raises(ValueError, match="output_delta") as info:
        nc.convolution_backprop_data(_x(wrong), _x((4, 2, 3, 3)), [1, 2, 6, 6], strides=[2, 2],
                                     pads_begin=[1, 1], pads_end=[0, 1], data_format="NCX",
                                     filter_format="OIX")
    assert _contains_run(_ints(str(info.value)), expected), str(info.value)


def test_filter_larger_than_padded_input():
    with pytest.raises(ValueError, match="(?i)filter"):
        nc.conv2d(_x((1, 3, 3, 2)), _x((4, 4, 2, 2)), 1, "VALID")
    with pytest.raises(ValueError, match="(?i)filter"):
        # dilation 2 makes a 3-tap filter 5 wide; the input is 4 wide with no padding
        nc.convolution(_x((1, 4, 2)), _x((3, 2, 2)), strides=[1], dilations=[2])
    with pytest.raises(ValueError, match="(?i)filter"):
        nc.convolution_backprop_filters(_x((1, 3, 3, 2)), [3, 5], _x((1, 1, 1, 2)),
                                        strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 1])


@pytest.mark.parametrize("output_padding,strides,dilations", [
    ([2, 0], [2, 2], [1, 1]),       # equal to the stride, larger than the dilation
    ([0, 3], [2, 2], [1, 1]),
    ([1, 0], [1, 1], [1, 1]),       # stride 1, dilation 1: nothing allowed
    ([-1, 0], [2, 2], [1, 1]),      # negative
])
def test_output_padding_too_large(output_padding, strides, dilations):
    with pytest.raises(ValueError, match="output_padding"):
        nc.convolution_backprop_data(_x((1, 2, 2, 2)), _x((3, 3, 2, 2)), strides=strides,
                                     dilations=dilations, output_padding=output_padding)


# --------------------------------------------------------------------------- out=
def test_out_wrong_shape():
    x, w = _x(), _x((3, 3, 2, 2))
    with pytest.raises(ValueError, match="out"):
        nc.conv2d(x, w, 1, "SAME", out=np.zeros((1, 5, 5, 3), F32))
    with pytest.raises(ValueError, match="out"):
        nc.conv2d_backprop_filter(x, [3, 3, 2, 2], _x(), 1, "SAME", out=np.zeros((3, 3, 2), F32))
    with pytest.raises(ValueError, match="out"):
        nc.convolution_backprop_data(_x(), w, [1, 5, 5, 2], strides=[1, 1], auto_pad="same_upper",
                                     out=np.zeros((1, 5, 5, 2, 1), F32))


def test_out_wrong_dtype():
    x, w = _x(), _x((3, 3, 2, 2))
    with pytest.raises((TypeError, ValueError), match="out"):
        nc.conv2d_backprop_input([1, 5, 5, 2], w, _x(), 1, "SAME", out=np.zeros((1, 5, 5, 2), F16))
    with pytest.raises((TypeError, ValueError), match="out"):
        nc.convolution(x, w, strides=[1, 1], out=np.zeros((1, 3, 3, 2), np.int32))


# --------------------------------------------------------------------------- no mutation
ERROR_CALLS = [
    ("bad-padding", lambda x, w, dy: nc.conv2d(x, w, 1, "BOGUS")),
    ("bad-strides", lambda x, w, dy: nc.conv2d_backprop_filter(x, [3, 3, 2, 2], dy, 0, "SAME")),
    ("dy-shape", lambda x, w, dy: nc.conv2d_backprop_input(x.shape, w, dy[:, :4], 1, "SAME")),
    ("groups", lambda x, w, dy: nc.convolution(x, w, strides=[1, 1], groups=3)),
    ("out-shape", lambda x, w, dy: nc.convolution_backprop_filters(
        x, [3, 3], dy, strides=[1, 1], auto_pad="same_upper", out=np.zeros((3, 3, 2), F32))),
    ("mixed-dtype", lambda x, w, dy: nc.conv2d_backprop_filter(
        x, [3, 3, 2, 2], dy.astype(F64), 1, "SAME")),
    ("output-padding", lambda x, w, dy: nc.convolution_backprop_data(
        dy, w, strides=[1, 1], output_padding=[1, 1])),
]


@pytest.mark.parametrize("name,call", ERROR_CALLS, ids=[n for n, _ in ERROR_CALLS])
def test_errors_do_not_mutate_inputs(name, call, rng):
    x = rng.standard_normal((1, 5, 5, 2)).astype(F32)
    w = rng.standard_normal((3, 3, 2, 2)).astype(F32)
    dy = rng.standard_normal((1, 5, 5, 2)).astype(F32)
    copies = [a.copy() for a in (x, w, dy)]
    with pytest.raises((TypeError, ValueError)):
        call(x, w, dy)
    for a, c in zip((x, w, dy), copies):
        assert np.array_equal(a, c)


# --------------------------------------------------------------------------- masked arrays
MASKED_CALLS = [
    ("input", lambda x, w, dy, m: nc.conv2d(m(x), w, 1, "SAME")),
    ("filter", lambda x, w, dy, m: nc.conv2d(x, m(w), 1, "SAME")),
    ("out_backprop", lambda x, w, dy, m: nc.conv2d_backprop_input(x.shape, w, m(dy), 1,
                                                                  "SAME")),
    ("input", lambda x, w, dy, m: nc.conv2d_backprop_input_v2(m(x), w, dy, 1, "SAME")),
    ("filter", lambda x, w, dy, m: nc.conv2d_backprop_filter_v2(x, m(w), dy, 1, "SAME")),
    ("input", lambda x, w, dy, m: nc.convolution(m(x), w, strides=1)),
    ("output_delta", lambda x, w, dy, m: nc.convolution_backprop_filters(
        x, [3, 3], m(dy), strides=1, auto_pad="same_upper")),
    ("out", lambda x, w, dy, m: nc.conv2d(x, w, 1, "SAME", out=m(np.empty_like(dy)))),
]


@pytest.mark.parametrize("name,call", MASKED_CALLS,
                         ids=[f"{i}-{n}" for i, (n, _) in enumerate(MASKED_CALLS)])
def test_masked_arrays_are_refused(name, call):
    """A mask would be dropped without a word: refused, naming the argument and the fix."""
    x, w, dy = _x(), _x((3, 3, 2, 2)), _x((1, 5, 5, 2))

    def masked(a):
        return np.ma.masked_array(a, mask=np.zeros(a.shape, bool))

    with pytest.raises(TypeError, match=rf"^{name}: masked arrays are not supported; pass "
                                        r"np\.ma\.filled\(a, 0\) or a\.data"):
        call(x, w, dy, masked)


# --------------------------------------------------------------------------- wrong layout
LAYOUT_CALLS = [
    # NHWC data read as NCHW: 8 "channels" where the filter reads 4 (groups=2 would follow,
    # and K=5 is not divisible by it)
    ("input", 8, 1, "NCHW", 4, "NHWC",
     lambda: nc.conv2d(_x((1, 8, 8, 4)), _x((3, 3, 4, 5)), 1, "SAME", data_format="NCHW")),
    ("input", 5, 1, "NCHW", 8, "NHWC",
     lambda: nc.conv2d(_x((2, 5, 5, 8)), _x((3, 3, 8, 16)), 1, "SAME", data_format="NCHW")),
    # NCHW data read as NHWC (the default)
    ("input", 5, 3, "NHWC", 8, "NCHW",
     lambda: nc.conv2d(_x((2, 8, 5, 5)), _x((3, 3, 8, 16)), 1, "SAME")),
    ("input", 5, 3, "NHWC", 8, "NCHW",
     lambda: nc.conv2d_backprop_filter(_x((2, 8, 5, 5)), [3, 3, 8, 16], _x((2, 8, 5, 16)), 1,
                                       "SAME")),
    ("input_sizes", 5, 3, "NHWC", 8, "NCHW",
     lambda: nc.conv2d_backprop_input([2, 8, 5, 5], _x((3, 3, 8, 16)), _x((2, 8, 5, 16)), 1,
                                      "SAME")),
    ("input", 6, 1, "NCDHW", 4, "NDHWC",
     lambda: nc.conv3d(_x((1, 6, 6, 6, 4)), _x((3, 3, 3, 4, 5)), [1] * 5, "SAME",
                       data_format="NCDHW")),
    ("input", 6, 1, "NCHW", 3, "NHWC",
     lambda: nc.depthwise_conv2d_native(_x((1, 6, 6, 3)), _x((3, 3, 3, 2)), [1] * 4, "SAME",
                                        data_format="NCHW")),
    ("input", 6, 1, "NCX", 3, "NXC",
     lambda: nc.convolution(_x((1, 6, 6, 3)), _x((3, 3, 3, 2)), strides=1, data_format="NCX")),
]


@pytest.mark.parametrize("name,got,axis,fmt,want,other,call", LAYOUT_CALLS,
                         ids=[f"{i}-{c[0]}-{c[3]}" for i, c in enumerate(LAYOUT_CALLS)])
def test_data_in_the_other_layout_is_named(name, got, axis, fmt, want, other, call):
    """Data in the other layout: the message names the layout and the channel mismatch, not
    a groups count the caller never passed."""
    with pytest.raises(ValueError) as e:
        call()
    msg = str(e.value)
    assert msg.startswith(f"{name}: {got} channels along axis {axis} (data_format='{fmt}') "
                          f"but the filter expects {want} input channels"), msg
    assert f"is the data {other}?" in msg, msg
    assert "groups=" not in msg, msg


def test_channel_mismatch_without_a_layout_hint():
    """No other layout fits either: the mismatch alone, without a guess."""
    with pytest.raises(ValueError, match=r"^input: 3 channels along axis 3 \(data_format="
                                         r"'NHWC'\) but the filter expects 2 input channels")\
            as e:
        nc.conv2d(_x((1, 5, 5, 3)), _x((3, 3, 2, 2)), 1, "SAME")
    assert "is the data" not in str(e.value)


# --------------------------------------------------------------------------- converted lists
def test_list_operand_converted_to_float64_is_named():
    """NumPy makes a nested list of floats float64: the dtype clash says so, and how to
    pass it in the other operands' dtype."""
    x = _x().tolist()
    w = _x((3, 3, 2, 2))
    with pytest.raises(TypeError, match=r"input=float64 \(converted from a list\), "
                                        r"filter=float32.*np\.asarray\(input, "
                                        r"dtype=np\.float32\)"):
        nc.conv2d(x, w, 1, "SAME")
    dy = _x((1, 5, 5, 2), F64).tolist()
    with pytest.raises(TypeError, match=r"output_delta=float64 \(converted from a list\).*"
                                        r"np\.asarray\(output_delta, dtype=np\.float16\)"):
        nc.convolution_backprop_filters(_x(dtype=F16), [3, 3], dy, strides=1,
                                        auto_pad="same_upper")
    # the same list with float64 operands is fine
    np.testing.assert_array_equal(nc.conv2d(x, w.astype(F64), 1, "SAME"),
                                  nc.conv2d(np.asarray(x), w.astype(F64), 1, "SAME"))


def test_integer_operands_say_how_to_convert():
    w = _x((3, 3, 2, 2))
    with pytest.raises(TypeError, match=r"^input: converted from a list to int64, not a float "
                                        r"dtype; pass np\.asarray\(input, dtype=np\.float32\)"):
        nc.conv2d([[[[1, 2]] * 5] * 5], w, 1, "SAME")
    with pytest.raises(TypeError, match=r"^filter: expected dtype float16, float32, float64 or "
                                        r"bfloat16, "
                                        r"got int32; pass np\.asarray\(filter, "
                                        r"dtype=np\.float32\)"):
        nc.conv2d(_x(), w.astype(np.int32), 1, "SAME")
