"""Hostile input: wrong types, ranks, shapes, strings, negative and huge numbers, NaN sizes
and mismatched operands at every public function. Only the TypeError / ValueError /
MemoryError of docs/contract.md section 9 may come out, and no input is ever modified."""
import inspect

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import numbaconv as nc

OPS = [nc.conv2d_backprop_input, nc.conv2d_backprop_input_v2, nc.conv2d_backprop_filter,
       nc.conv2d_backprop_filter_v2, nc.depthwise_conv2d_native_backprop_input,
       nc.depthwise_conv2d_native_backprop_filter, nc.conv3d_backprop_input_v2,
       nc.conv3d_backprop_filter_v2, nc.conv2d, nc.depthwise_conv2d_native, nc.conv3d,
       nc.convolution, nc.convolution_backprop_data, nc.convolution_backprop_filters]

HUGE = 2 ** 62

junk = st.one_of(
    st.none(), st.booleans(), st.sampled_from([-1, 0, 1, 2, 3, HUGE, -HUGE, 2 ** 70]),
    st.sampled_from([float("nan"), float("inf"), 1.5, -0.0]),
    st.sampled_from(["SAME", "VALID", "EXPLICIT", "same_upper", "NHWC", "NCHW", "NXC", "OIX",
                     "bogus", ""]),
    st.lists(st.sampled_from([-1, 0, 1, 2, 3, HUGE]), max_size=6),
    st.lists(st.lists(st.sampled_from([0, 1, -1]), min_size=2, max_size=2), max_size=5),
    st.sampled_from([[1.0, float("nan")], [2, "a"], {"a": 1}, object(), b"NHWC", 1j]),
    st.builds(lambda shape, dt: np.ones(shape, dt),
              st.lists(st.integers(0, 4), min_size=0, max_size=6),
              st.sampled_from([np.float16, np.float32, np.float64, np.int32, np.bool_,
                               np.complex64, object])),
)


def _plausible(name, rank):
    """A value that is valid on its own, so that junk elsewhere is what gets tested."""
    data = np.ones((1,) + (4,) * rank + (2,), np.float32)
    filt = np.ones((2,) * rank + (2, 2), np.float32)
    return {
        "input": data, "out_backprop": data, "output_delta": data, "filter": filt,
        "input_sizes": list(data.shape), "filter_sizes": list(filt.shape),
        "filters_shape": [2] * rank, "strides": 1, "padding": "SAME",
        "output_shape": None, "groups": 1,
    }.get(name, inspect._empty)


@pytest.mark.parametrize("op", OPS, ids=lambda f: f.__name__)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_only_spec_errors(op, data):
    sig = inspect.signature(op)
    rank = 3 if "3d" in op.__name__ else (1 if op.__name__.startswith("convolution") else 2)
    kwargs = {}
    for name, param in sig.parameters.items():
        if name in ("name",):
            continue
        use_junk = data.draw(st.booleans(), label=f"junk {name}")
        if use_junk:
            kwargs[name] = data.draw(junk, label=name)
        else:
            value = _plausible(name, rank)
            if value is inspect._empty:
                continue  # keep the default
            kwargs[name] = value
    arrays = {k: v.copy() for k, v in kwargs.items() if isinstance(v, np.ndarray)}
    try:
        op(**kwargs)
    except (TypeError, ValueError, MemoryError) as exc:
        assert str(exc), "errors must carry a message"
    for k, before in arrays.items():
        after = kwargs[k]
        assert after.dtype == before.dtype and after.shape == before.shape
        if before.dtype != object:
            np.testing.assert_array_equal(after, before, err_msg=f"{k} was modified")


def test_huge_problem_is_a_memory_error_before_any_work():
    # A 2^40-pixel input gradient from a 1x1 output: 8 TiB of result, refused up front.
    w = np.ones((1, 1, 2, 2), np.float32)
    dy = np.ones((1, 1, 1, 2), np.float32)
    with pytest.raises(MemoryError, match=r"GiB.*1048576"):
        nc.conv2d_backprop_input([1, 2 ** 20, 2 ** 20, 2], w, dy, 2 ** 20, "VALID")
    p = nc.plan("conv2d_backprop_input", [1, 2 ** 20, 2 ** 20, 2], w, dy, 2 ** 20, "VALID")
    assert p.problem.isz == (1, 2 ** 20, 2 ** 20)


def test_plan_states_workspace_and_memory_check():
    from numbaconv.backends import cpu
    x = np.zeros((2, 30, 30, 16), np.float32)
    dy = np.zeros((2, 28, 28, 16), np.float32)
    for strategy in ("direct", "gemm"):
        p = nc.plan("conv2d_backprop_filter", x, [3, 3, 16, 16], dy, 1, "VALID",
                    strategy=strategy)
        assert isinstance(p.workspace_bytes, int) and p.workspace_bytes >= 0
        assert str(p.workspace_bytes) in str(p)
        cpu.check_memory(p)  # a problem that fits passes the check


def test_non_native_byte_order_is_a_float_dtype():
    x = np.arange(32, dtype=">f4").reshape(1, 4, 4, 2)
    w = np.ones((3, 3, 2, 2), ">f4")
    y = nc.conv2d(x, w, 1, "SAME")
    ref = nc.conv2d(x.astype("<f4"), w.astype("<f4"), 1, "SAME")
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, ref)
    with pytest.raises(TypeError, match="float16, float32, float64 or bfloat16"):
        nc.conv2d(x.astype(np.longdouble), w.astype(np.longdouble), 1, "SAME")


@pytest.mark.parametrize("dtype", [">f2", ">f4", ">f8"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_big_endian_out_receives_the_result(dtype, fmt):
    """``out=`` in the other byte order is written with the right values, as big-endian
    operands are read."""
    from reference import conv_bwd_filter_ref, conv_fwd_ref, to_channels_first
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 5, 3)).astype(dtype)
    w = rng.standard_normal((3, 3, 3, 4)).astype(dtype)
    xl = np.ascontiguousarray(to_channels_first(x)) if fmt == "NCHW" else x
    out = np.full((2, 4, 5, 5) if fmt == "NCHW" else (2, 5, 5, 4), np.nan, dtype)
    got = nc.conv2d(xl, w, 1, "SAME", data_format=fmt, out=out)
    assert got is out and got.dtype == np.dtype(dtype)
    ref = conv_fwd_ref(x, w, 1, 1, 1, 1)
    if fmt == "NCHW":
        ref = to_channels_first(ref)
    np.testing.assert_allclose(got, ref, rtol=5e-3 if dtype == ">f2" else 1e-5, atol=5e-3)
    # the same values as a native-order result
    np.testing.assert_array_equal(got, nc.conv2d(xl, w, 1, "SAME", data_format=fmt))
    dy = rng.standard_normal((2, 5, 5, 4)).astype(dtype)
    dyl = np.ascontiguousarray(to_channels_first(dy)) if fmt == "NCHW" else dy
    dw = np.full((3, 3, 3, 4), np.nan, dtype)
    assert nc.conv2d_backprop_filter(xl, [3, 3, 3, 4], dyl, 1, "SAME", data_format=fmt,
                                     out=dw) is dw
    np.testing.assert_allclose(dw, conv_bwd_filter_ref(x, dy, (3, 3), 1, 1, 1, 1),
                               rtol=5e-3 if dtype == ">f2" else 1e-5,
                               atol=2e-2 if dtype == ">f2" else 1e-5)
