"""Small problems compile nothing (docs/contract.md section 7, "Small problems";
docs/design.md section 2, "Compile cost").

Below ``config.SMALL_FLOPS`` the planner takes the ``numpy`` entry (per-tap matrix products
in NumPy) and passes over every entry whose kernels take seconds to compile, so that a
first call on a small problem does not pay a large layer's compile time. These tests run
with the rule on (``small_problem_rule``); every other test turns it off to reach every
strategy.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numbaconv as nc
from numbaconv import config, planner

import reference as R

pytestmark = pytest.mark.small_problem_rule


def _cases(dtype):
    r = np.random.default_rng(3)

    def a(*s):
        return r.standard_normal(s).astype(dtype)

    x2, w2, dy2 = a(2, 16, 16, 8), a(3, 3, 8, 8), a(2, 16, 16, 8)
    wd = a(3, 3, 8, 1)
    x3, w3, dy3 = a(1, 6, 8, 8, 4), a(3, 3, 3, 4, 4), a(1, 6, 8, 8, 4)
    x1, w1, dy1 = a(2, 64, 8), a(3, 8, 8), a(2, 64, 8)
    p2, p3, p1 = dict(pads_begin=1, pads_end=1), dict(pads_begin=1, pads_end=1), \
        dict(pads_begin=1, pads_end=1)
    dwx = R.depthwise_to_xio(wd)
    return [
        ("conv2d", (x2, w2, 1, "SAME"), R.conv_fwd_ref, (x2, w2), p2),
        ("conv2d_backprop_input", (x2.shape, w2, dy2, 1, "SAME"), R.conv_bwd_data_ref,
         (dy2, w2, (16, 16)), p2),
        ("conv2d_backprop_filter", (x2, w2.shape, dy2, 1, "SAME"), R.conv_bwd_filter_ref,
         (x2, dy2, (3, 3)), p2),
        ("depthwise_conv2d_native", (x2, wd, 1, "SAME"), R.conv_fwd_ref, (x2, dwx),
         dict(p2, groups=8)),
        ("depthwise_conv2d_native_backprop_input", (x2.shape, wd, dy2, 1, "SAME"),
         R.conv_bwd_data_ref, (dy2, dwx, (16, 16)), dict(p2, groups=8)),
        ("depthwise_conv2d_native_backprop_filter", (x2, wd.shape, dy2, 1, "SAME"),
         R.conv_bwd_filter_ref, (x2, dy2, (3, 3)), dict(p2, groups=8)),
        ("conv3d", (x3, w3, 1, "SAME"), R.conv_fwd_ref, (x3, w3), p3),
        ("conv3d_backprop_input_v2", (x3.shape, w3, dy3, 1, "SAME"), R.conv_bwd_data_ref,
         (dy3, w3, (6, 8, 8)), p3),
        ("conv3d_backprop_filter_v2", (x3, w3.shape, dy3, 1, "SAME"), R.conv_bwd_filter_ref,
         (x3, dy3, (3, 3, 3)), p3),
        ("convolution", (x1, w1), R.conv_fwd_ref, (x1, w1), p1),
        ("convolution_backprop_data", (dy1, w1, (64,)), R.conv_bwd_data_ref,
         (dy1, w1, (64,)), p1),
        ("convolution_backprop_filters", (x1, (3,), dy1), R.conv_bwd_filter_ref,
         (x1, dy1, (3,)), p1),
    ]


def _kwargs(op):
    return dict(strides=1, pads_begin=1, pads_end=1) if op.startswith("convolution") else {}


def _dw_result(op, got, dtype):
    # the depthwise filter gradient comes as [fh, fw, in, multiplier]: compare it as XIO
    return R.depthwise_to_xio(got) if op == "depthwise_conv2d_native_backprop_filter" else got


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("index", range(12), ids=[c[0] for c in _cases("float32")])
def test_small_problems_plan_light_kernels_and_compute_right(index, dtype):
    op, args, ref, ref_args, attrs = _cases(dtype)[index]
    plan = nc.plan(op, *args, **_kwargs(op))
    assert plan.flops < config.SMALL_FLOPS
    # depthwise with multiplier 1 takes numpy[depthwise] (tests/test_numpy_depthwise.py)
    want = "depthwise" if op.startswith("depthwise") else ""
    assert (plan.strategy, plan.variant) == ("numpy", want), str(plan)
    assert not planner.implementation(plan).compile_heavy, str(plan)
    got = getattr(nc, op)(*args, **_kwargs(op))
    got = _dw_result(op, got, dtype)
    R.assert_matches(got, dtype, ref, *ref_args, **attrs)


def test_the_guard_passes_over_heavy_entries_for_small_problems_only():
    from numbaconv.strategies.numpy_taps import STRATEGY as NUMPY
    from numbaconv.strategies.rowgemm import STRATEGY as ROWS
    x = np.ones((2, 16, 16, 8), np.float32)
    small, _ = nc.conv2d_backprop_filter.parse(x, (3, 3, 8, 8), x, 1, "SAME")
    big_x = np.ones((8, 32, 32, 8), np.float32)
    big, _ = nc.conv2d_backprop_filter.parse(big_x, (3, 3, 8, 8), big_x, 1, "SAME")
    assert planner.compile_guard(ROWS, small) == planner.R_SMALL.format(mflop=0.589824,
                                                                         limit=2.0)
    assert planner.compile_guard(ROWS, big) is None
    assert planner.compile_guard(NUMPY, small) is None
    assert planner.compile_guard(NUMPY, big).startswith("not a small problem (9.4 MFLOP")
    plan = nc.plan("conv2d_backprop_filter", big_x, (3, 3, 8, 8), big_x, 1, "SAME")
    assert plan.declined[0][0] == "numpy[depthwise]"
    assert plan.declined[1][0] == "numpy" and "not a small problem" in plan.declined[1][1]


def test_depthwise_problems_are_small_below_their_own_limit(monkeypatch):
    """Depthwise layers leave NumPy at ``config.SMALL_DEPTHWISE_FLOPS`` (0.25 MFLOP): a
    0.45 MFLOP one (8x7x7x64) runs on a compiled depthwise entry, with ``numpy[depthwise]``
    declined as not small, and computes right; a 0.07 MFLOP one stays on NumPy; a dense
    layer of the same size stays small; ``SMALL_DEPTHWISE_FLOPS = 0`` falls back to
    ``SMALL_FLOPS``."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 7, 7, 64)).astype(np.float32)
    w = rng.standard_normal((3, 3, 1, 64)).astype(np.float32)
    kw = dict(strides=1, pads_begin=1, pads_end=1, groups=64)
    plan = nc.plan("convolution_backprop_data", x, w, (7, 7), **kw)
    assert plan.strategy == "direct" and plan.variant.startswith("depthwise"), str(plan)
    assert plan.declined[0] == ("numpy[depthwise]", planner.R_NOT_SMALL.format(
        mflop=0.451584, limit=0.25))
    got = nc.convolution_backprop_data(x, w, (7, 7), **kw)
    want = R.conv_bwd_data_ref(x.astype(np.float64), w.astype(np.float64), (7, 7), 1, 1, 1,
                               1, 64)
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
    tiny = np.ones((2, 16, 16, 8), np.float32)
    assert nc.plan("convolution", tiny, np.ones((3, 3, 1, 8), np.float32), strides=1,
                   pads_begin=1, pads_end=1, groups=8).variant == "depthwise"  # numpy's
    dense = np.ones((8, 7, 7, 8), np.float32)
    assert nc.plan("convolution", dense, np.ones((3, 3, 8, 8), np.float32), strides=1,
                   pads_begin=1, pads_end=1).strategy == "numpy"
    monkeypatch.setattr(config, "SMALL_DEPTHWISE_FLOPS", 0)
    planner.clear_plan_cache()
    assert nc.plan("convolution_backprop_data", x, w, (7, 7), **kw).strategy == "numpy"


def test_tuning_a_small_problem_times_no_heavy_entry(monkeypatch):
    from numbaconv import tune
    seen = []

    def choice(problem, accepted, threads, machine):
        seen.extend(accepted)
        return accepted[0], "tuned (test)"
    monkeypatch.setattr(tune, "tuned_choice", choice)
    x = np.ones((2, 16, 16, 8), np.float32)
    nc.plan("conv2d_backprop_filter", x, (3, 3, 8, 8), x, 1, "SAME", tune=True)
    assert seen and not any(s.compile_heavy for s in seen)


def test_a_forced_strategy_is_not_passed_over(monkeypatch):
    x = np.ones((2, 16, 16, 8), np.float32)
    plan = nc.plan("conv2d_backprop_filter", x, (3, 3, 8, 8), x, 1, "SAME", strategy="gemm")
    assert (plan.strategy, plan.variant) == ("gemm", "rows")
    big_x = np.ones((8, 32, 32, 8), np.float32)
    plan = nc.plan("conv2d_backprop_filter", big_x, (3, 3, 8, 8), big_x, 1, "SAME",
                   strategy="numpy")
    assert plan.strategy == "numpy"


def test_the_rule_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(config, "SMALL_FLOPS", 0)
    planner.clear_plan_cache()
    x = np.ones((2, 16, 16, 8), np.float32)
    plan = nc.plan("conv2d_backprop_filter", x, (3, 3, 8, 8), x, 1, "SAME")
    assert (plan.strategy, plan.variant) == ("gemm", "rows")


def test_suite_layers_are_not_small():
    from numbaconv import suites
    for name in suites.SUITES:
        for layer in suites.layers(name):
            for direction in ("fwd", "bwd_d", "bwd_w"):
                c = suites.call(layer, direction, shapes_only=True)
                assert nc.plan(c.op, *c.args, **c.kwargs).flops >= config.SMALL_FLOPS


def test_a_first_call_on_a_small_problem_compiles_no_heavy_kernel():
    # which kernels a fresh process compiles or loads (none), not how long it takes
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import numbaconv as nc
        x = np.ones((2, 16, 16, 8), np.float32)
        w = np.ones((3, 3, 8, 8), np.float32)
        nc.conv2d(x, w, 1, "SAME")
        nc.conv2d_backprop_input(x.shape, w, x, 1, "SAME")
        nc.conv2d_backprop_filter(x, w.shape, x, 1, "SAME")
        nc.depthwise_conv2d_native_backprop_input(x.shape, w[:, :, :, :1], x, 1, "SAME")
        from numba.core.registry import CPUDispatcher
        used = sorted(f"{name}.{k}" for name, mod in list(sys.modules.items())
                      if name.startswith("numbaconv.kernels.cpu.")
                      for k, v in vars(mod).items()
                      if isinstance(v, CPUDispatcher) and v.signatures)
        print(used)
    """)
    env = dict(os.environ)
    env.pop("NUMBACONV_GEMM_ENGINE", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    loaded = r.stdout.strip().splitlines()[-1]
    assert loaded == "[]", loaded
