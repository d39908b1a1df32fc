"""``numpy[depthwise]``: small depthwise problems (multiplier 1) as one elementwise product
per tap in NumPy, against the float64 reference, in every direction, rank and dtype."""
import numpy as np
import pytest

import numbaconv as nc
from numbaconv import config, planner
from numbaconv.strategies.numpy_taps import DEPTHWISE, R_NOT_DEPTHWISE

import reference as R

LABEL = "numpy[depthwise]"

# (x spatial, kernel, stride, dilation, pads_begin, pads_end): 1-D, 2-D, 3-D; strides,
# dilations, asymmetric (SAME-like and causal) pads, a kernel wider than the input's pad.
GEOMETRIES = [
    ((7, 6), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    ((8, 9), (5, 5), (2, 2), (1, 1), (1, 2), (2, 1)),
    ((9, 7), (3, 1), (1, 2), (2, 1), (2, 0), (2, 1)),
    ((17,), (4,), (1,), (3,), (9,), (0,)),
    ((5, 6, 4), (3, 3, 3), (2, 1, 1), (1, 1, 2), (1, 1, 2), (0, 1, 2)),
    ((6, 6), (7, 7), (1, 1), (1, 1), (3, 3), (3, 3)),
]


def _data(geo, c, dtype, mb=2, seed=0):
    isz, ksz, s, d, pb, pe = geo
    osz = tuple(R.out_size(i, k, ss, dd, b, e) for i, k, ss, dd, b, e in
                zip(isz, ksz, s, d, pb, pe))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((mb, *isz, c)).astype(dtype)
    w = rng.standard_normal((*ksz, 1, c)).astype(dtype)
    dy = rng.standard_normal((mb, *osz, c)).astype(dtype)
    attrs = dict(strides=s, dilations=d, pads_begin=pb, pads_end=pe, groups=c)
    return x, w, dy, attrs


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("geo", GEOMETRIES, ids=lambda g: "x".join(map(str, g[0])) + "k"
                         + "x".join(map(str, g[1])))
def test_every_direction_against_the_reference(geo, dtype):
    x, w, dy, attrs = _data(geo, 5, dtype)
    isz, ksz = geo[0], geo[1]
    geo_ref = dict(stride=attrs["strides"], dilation=attrs["dilations"],
                   pads_begin=attrs["pads_begin"], pads_end=attrs["pads_end"], groups=5)
    y = nc.convolution(x, w, strategy=LABEL, **attrs)
    dx = nc.convolution_backprop_data(dy, w, isz, strategy=LABEL, **attrs)
    dw = nc.convolution_backprop_filters(x, ksz, dy, strategy=LABEL, **attrs)
    for got, ref, ops in ((y, R.conv_fwd_ref, (x, w)),
                          (dx, R.conv_bwd_data_ref, (dy, w, isz)),
                          (dw, R.conv_bwd_filter_ref, (x, dy, ksz))):
        assert got.dtype == np.dtype(dtype)
        err = R.normalized_error(got, ref, *ops, **geo_ref)
        assert err <= R.TOL[np.dtype(dtype)], (ref.__name__, err)


def test_bitwise_reproducible_and_thread_independent():
    x, w, dy, attrs = _data(GEOMETRIES[1], 24, "float32", mb=3, seed=1)
    old = nc.get_num_threads()
    runs = []
    try:
        for threads in (1, old, 1):
            nc.set_num_threads(threads)
            runs.append((nc.convolution_backprop_filters(x, (5, 5), dy, strategy=LABEL,
                                                         **attrs),
                         nc.convolution_backprop_data(dy, w, (8, 9), strategy=LABEL,
                                                      **attrs),
                         nc.convolution(x, w, strategy=LABEL, **attrs)))
    finally:
        nc.set_num_threads(old)
    for first, later in zip(runs[0], runs[1]):
        assert np.array_equal(first, later)
    for first, later in zip(runs[0], runs[2]):
        assert np.array_equal(first, later)


def test_declines_everything_but_multiplier_one_depthwise():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 6, 6, 4)).astype(np.float32)
    cases = [((3, 3, 1, 8), 4), ((3, 3, 2, 4), 2), ((3, 3, 4, 4), 1)]  # multiplier 2, g2, dense
    for wshape, g in cases:
        problem, _ = nc.convolution.parse(x, np.ones(wshape, np.float32), strides=1,
                                          pads_begin=1, pads_end=1, groups=g)
        assert DEPTHWISE.accepts(problem) == R_NOT_DEPTHWISE.format(
            g=g, ic=4, oc=wshape[-1]), wshape
        with pytest.raises(ValueError, match="not depthwise with multiplier 1"):
            nc.convolution(x, np.ones(wshape, np.float32), strides=1, pads_begin=1,
                           pads_end=1, groups=g, strategy=LABEL)


@pytest.mark.small_problem_rule
def test_the_planner_takes_it_for_small_depthwise_problems_only():
    x, w, dy, attrs = _data(GEOMETRIES[0], 16, "float32")
    for op, args in (("convolution", (x, w)),
                     ("convolution_backprop_data", (dy, w, (7, 6))),
                     ("convolution_backprop_filters", (x, (3, 3), dy))):
        plan = nc.plan(op, *args, **attrs)
        assert plan.flops < config.SMALL_FLOPS
        assert (plan.strategy, plan.variant) == ("numpy", "depthwise"), str(plan)
    big = np.ones((8, 56, 56, 144), np.float32)
    plan = nc.plan("convolution_backprop_data", big, np.ones((3, 3, 1, 144), np.float32),
                   (56, 56), strides=1, pads_begin=1, pads_end=1, groups=144)
    assert plan.strategy == "direct" and "numpy[depthwise]" in str(plan)
    assert plan.declined[0][0] == LABEL and "not a small problem" in plan.declined[0][1]
    assert LABEL in planner.LABELS and planner.LABELS.index(LABEL) == 0


@pytest.mark.parametrize("geo", GEOMETRIES[:4], ids=lambda g: "x".join(map(str, g[0])))
def test_bfloat16_against_the_reference(geo):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    x, w, dy, attrs = _data(geo, 6, "float32")
    x, w, dy = (a.astype(bf16) for a in (x, w, dy))
    isz, ksz = geo[0], geo[1]
    geo_ref = dict(stride=attrs["strides"], dilation=attrs["dilations"],
                   pads_begin=attrs["pads_begin"], pads_end=attrs["pads_end"], groups=6)
    as64 = [a.astype(np.float64) for a in (x, w, dy)]
    x64, w64, dy64 = as64
    for got, ref, ops in (
            (nc.convolution(x, w, strategy=LABEL, **attrs), R.conv_fwd_ref, (x64, w64)),
            (nc.convolution_backprop_data(dy, w, isz, strategy=LABEL, **attrs),
             R.conv_bwd_data_ref, (dy64, w64, isz)),
            (nc.convolution_backprop_filters(x, ksz, dy, strategy=LABEL, **attrs),
             R.conv_bwd_filter_ref, (x64, dy64, ksz))):
        assert got.dtype == bf16
        err = R.normalized_error(got.astype(np.float64), ref, *ops, **geo_ref)
        assert err <= R.TOL_BF16, (ref.__name__, err)
