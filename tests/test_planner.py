"""numbaconv.plan(op, *op_args) -> immutable Plan; strategy= and tune= on every op
(docs/contract.md sections 6 and 7)."""
import collections.abc
import math

import numpy as np
import pytest

import numbaconv as nc
from reference import (assert_matches, conv_bwd_data_ref, conv_bwd_filter_ref, conv_fwd_ref,
                       depthwise_to_xio, same_pads_nd, tolerance, normalized_error,
                       xio_to_depthwise)

F32, F64 = np.float32, np.float64
STRATEGIES = ("direct", "gemm", "winograd")


def _problems():
    """(id, op name, args, kwargs, flops, reference fn, reference operands) per op.

    Each problem is tiny; flops = 2*mb*oc*(ic/g)*prod(kernel)*prod(out)."""
    r = np.random.default_rng(3)

    def a(*shape):
        return r.standard_normal(shape).astype(F32)

    out = []
    # conv2d family: NHWC 6x5, C=4, 3x2 filter, K=3, SAME, stride (2,1) -> out (3, 5)
    s, d = (2, 1), (1, 1)
    pb, pe = same_pads_nd((6, 5), (3, 2), s, d)
    x, w, dy = a(2, 6, 5, 4), a(3, 2, 4, 3), a(2, 3, 5, 3)
    fl = 2 * 2 * 3 * 4 * 6 * 15
    tf = dict(strides=[1, 2, 1, 1], padding="SAME")
    fwd = lambda x_, w_: conv_fwd_ref(x_, w_, s, d, pb, pe)  # noqa: E731
    bd = lambda dy_, w_: conv_bwd_data_ref(dy_, w_, (6, 5), s, d, pb, pe)  # noqa: E731
    bf = lambda x_, dy_: conv_bwd_filter_ref(x_, dy_, (3, 2), s, d, pb, pe)  # noqa: E731
    out += [
        ("conv2d", "conv2d", (x, w), tf, fl, fwd, (x, w)),
        ("conv2d_backprop_input", "conv2d_backprop_input", (list(x.shape), w, dy), tf, fl, bd,
         (dy, w)),
        ("conv2d_backprop_input_v2", "conv2d_backprop_input_v2", (x, w, dy), tf, fl, bd, (dy, w)),
        ("conv2d_backprop_filter", "conv2d_backprop_filter", (x, list(w.shape), dy), tf, fl, bf,
         (x, dy)),
        ("conv2d_backprop_filter_v2", "conv2d_backprop_filter_v2", (x, w, dy), tf, fl, bf,
         (x, dy)),
    ]
    # depthwise: C=3, multiplier 2, 3x3, VALID, stride 1 on 5x5 -> out 3x3, oc 6, ic/g 1
    xd, wd, dyd = a(1, 5, 5, 3), a(3, 3, 3, 2), a(1, 3, 3, 6)
    fl = 2 * 1 * 6 * 1 * 9 * 9
    dw_kw = dict(strides=1, padding="VALID")
    out += [
        ("depthwise_conv2d_native", "depthwise_conv2d_native", (xd, wd), dw_kw, fl,
         lambda x_, w_: conv_fwd_ref(x_, depthwise_to_xio(w_), groups=3), (xd, wd)),
        ("depthwise_conv2d_native_backprop_input", "depthwise_conv2d_native_backprop_input",
         (list(xd.shape), wd, dyd), dw_kw, fl,
         lambda dy_, w_: conv_bwd_data_ref(dy_, depthwise_to_xio(w_), (5, 5), groups=3),
         (dyd, wd)),
        ("depthwise_conv2d_native_backprop_filter", "depthwise_conv2d_native_backprop_filter",
         (xd, list(wd.shape), dyd), dw_kw, fl,
         lambda x_, dy_: xio_to_depthwise(conv_bwd_filter_ref(x_, dy_, (3, 3), groups=3), 3),
         (xd, dyd)),
    ]
    # conv3d: 4x4x3, C=2, 2x2x2, K=3, VALID stride 1 -> out 3x3x2
    x3, w3, dy3 = a(1, 4, 4, 3, 2), a(2, 2, 2, 2, 3), a(1, 3, 3, 2, 3)
    fl = 2 * 1 * 3 * 2 * 8 * 18
    k3 = dict(strides=1, padding="VALID")
    out += [
        ("conv3d", "conv3d", (x3, w3), k3, fl, lambda x_, w_: conv_fwd_ref(x_, w_), (x3, w3)),
        ("conv3d_backprop_input_v2", "conv3d_backprop_input_v2", (list(x3.shape), w3, dy3), k3,
         fl, lambda dy_, w_: conv_bwd_data_ref(dy_, w_, (4, 4, 3)), (dy3, w3)),
        ("conv3d_backprop_filter_v2", "conv3d_backprop_filter_v2", (x3, list(w3.shape), dy3), k3,
         fl, lambda x_, dy_: conv_bwd_filter_ref(x_, dy_, (2, 2, 2)), (x3, dy3)),
    ]
    # generic, grouped 1-D: W=7, C=4, g=2, k=3, K=6, stride 2, pads (1, 0) -> out 3
    x1, w1, dy1 = a(2, 7, 4), a(3, 2, 6), a(2, 3, 6)
    fl = 2 * 2 * 6 * 2 * 3 * 3
    g1 = dict(strides=[2], pads_begin=[1], pads_end=[0], groups=2)
    out += [
        ("convolution", "convolution", (x1, w1), g1, fl,
         lambda x_, w_: conv_fwd_ref(x_, w_, 2, 1, 1, 0, 2), (x1, w1)),
        ("convolution_backprop_data", "convolution_backprop_data", (dy1, w1, list(x1.shape)), g1,
         fl, lambda dy_, w_: conv_bwd_data_ref(dy_, w_, (7,), 2, 1, 1, 0, 2), (dy1, w1)),
        ("convolution_backprop_filters", "convolution_backprop_filters",
         (x1, list(w1.shape), dy1), g1, fl,
         lambda x_, dy_: conv_bwd_filter_ref(x_, dy_, (3,), 2, 1, 1, 0, 2), (x1, dy1)),
    ]
    # generic 2-D 3x3 stride 1: a shape on which Winograd may well be chosen
    x2, w2, dy2 = a(1, 6, 6, 4), a(3, 3, 4, 4), a(1, 6, 6, 4)
    fl = 2 * 1 * 4 * 4 * 9 * 36
    g2 = dict(strides=[1, 1], auto_pad="same_upper")
    out += [
        ("convolution-3x3", "convolution", (x2, w2), g2, fl,
         lambda x_, w_: conv_fwd_ref(x_, w_, 1, 1, 1, 1), (x2, w2)),
        ("convolution_backprop_data-3x3", "convolution_backprop_data", (dy2, w2, [6, 6]), g2, fl,
         lambda dy_, w_: conv_bwd_data_ref(dy_, w_, (6, 6), 1, 1, 1, 1), (dy2, w2)),
        ("convolution_backprop_filters-3x3", "convolution_backprop_filters", (x2, [3, 3], dy2),
         g2, fl, lambda x_, dy_: conv_bwd_filter_ref(x_, dy_, (3, 3), 1, 1, 1, 1), (x2, dy2)),
    ]
    return out


def _wide_problems():
    """Problems with enough channels (8-16) that a GEMM strategy has something to do."""
    r = np.random.default_rng(4)

    def a(*shape):
        return r.standard_normal(shape).astype(F32)

    out = []
    # NCHW conv2d family, 5x5, C=8, K=8, 3x3, SAME, stride 2 -> out 3x3
    s, d = (2, 2), (1, 1)
    pb, pe = same_pads_nd((5, 5), (3, 3), s, d)
    x, w, dy = a(2, 5, 5, 8), a(3, 3, 8, 8), a(2, 3, 3, 8)
    xc, dyc = np.ascontiguousarray(x.transpose(0, 3, 1, 2)), np.ascontiguousarray(
        dy.transpose(0, 3, 1, 2))
    fl = 2 * 2 * 8 * 8 * 9 * 9
    tf = dict(strides=2, padding="SAME", data_format="NCHW")
    out += [
        ("wide-conv2d-nchw", "conv2d", (xc, w), tf, fl,
         lambda x_, w_: conv_fwd_ref(x_, w_, s, d, pb, pe).transpose(0, 3, 1, 2), (x, w)),
        ("wide-conv2d_backprop_input-nchw", "conv2d_backprop_input", (list(xc.shape), w, dyc),
         tf, fl,
         lambda dy_, w_: conv_bwd_data_ref(dy_, w_, (5, 5), s, d, pb, pe).transpose(0, 3, 1, 2),
         (dy, w)),
        ("wide-conv2d_backprop_filter-nchw", "conv2d_backprop_filter", (xc, list(w.shape), dyc),
         tf, fl, lambda x_, dy_: conv_bwd_filter_ref(x_, dy_, (3, 3), s, d, pb, pe), (x, dy)),
    ]
    # grouped 1-D, W=7, C=16, g=2, k=3, K=16, dilation 2, pads (2, 1) -> out 6
    x1, w1, dy1 = a(1, 7, 16), a(3, 8, 16), a(1, 6, 16)
    fl = 2 * 1 * 16 * 8 * 3 * 6
    g1 = dict(strides=[1], dilations=[2], pads_begin=[2], pads_end=[1], groups=2)
    out += [
        ("wide-convolution-1d-g2", "convolution", (x1, w1), g1, fl,
         lambda x_, w_: conv_fwd_ref(x_, w_, 1, 2, 2, 1, 2), (x1, w1)),
        ("wide-convolution_backprop_data-1d-g2", "convolution_backprop_data",
         (dy1, w1, [7]), g1, fl,
         lambda dy_, w_: conv_bwd_data_ref(dy_, w_, (7,), 1, 2, 2, 1, 2), (dy1, w1)),
        ("wide-convolution_backprop_filters-1d-g2", "convolution_backprop_filters",
         (x1, [3], dy1), g1, fl,
         lambda x_, dy_: conv_bwd_filter_ref(x_, dy_, (3,), 1, 2, 2, 1, 2), (x1, dy1)),
    ]
    # 3-D, 4x3x4, C=8, K=8, 2x2x2, stride (2,1,1), VALID -> out 2x2x3
    x3, w3, dy3 = a(1, 4, 3, 4, 8), a(2, 2, 2, 8, 8), a(1, 2, 2, 3, 8)
    fl = 2 * 1 * 8 * 8 * 8 * 12
    k3 = dict(strides=[2, 1, 1], padding="VALID")
    out += [
        ("wide-conv3d", "conv3d", (x3, w3), k3, fl,
         lambda x_, w_: conv_fwd_ref(x_, w_, (2, 1, 1)), (x3, w3)),
        ("wide-conv3d_backprop_input_v2", "conv3d_backprop_input_v2", (list(x3.shape), w3, dy3),
         k3, fl, lambda dy_, w_: conv_bwd_data_ref(dy_, w_, (4, 3, 4), (2, 1, 1)), (dy3, w3)),
        ("wide-conv3d_backprop_filter_v2", "conv3d_backprop_filter_v2",
         (x3, list(w3.shape), dy3), k3, fl,
         lambda x_, dy_: conv_bwd_filter_ref(x_, dy_, (2, 2, 2), (2, 1, 1)), (x3, dy3)),
    ]
    # 2-D 3x3 stride 1, 8 channels, same_upper on 6x6: the classic Winograd shape
    x2, w2, dy2 = a(2, 6, 6, 8), a(3, 3, 8, 8), a(2, 6, 6, 8)
    fl = 2 * 2 * 8 * 8 * 9 * 36
    g2 = dict(strides=[1, 1], auto_pad="same_upper")
    out += [
        ("wide-convolution-3x3", "convolution", (x2, w2), g2, fl,
         lambda x_, w_: conv_fwd_ref(x_, w_, 1, 1, 1, 1), (x2, w2)),
        ("wide-convolution_backprop_data-3x3", "convolution_backprop_data", (dy2, w2, [6, 6]),
         g2, fl, lambda dy_, w_: conv_bwd_data_ref(dy_, w_, (6, 6), 1, 1, 1, 1), (dy2, w2)),
        ("wide-convolution_backprop_filters-3x3", "convolution_backprop_filters",
         (x2, [3, 3], dy2), g2, fl,
         lambda x_, dy_: conv_bwd_filter_ref(x_, dy_, (3, 3), 1, 1, 1, 1), (x2, dy2)),
    ]
    return out


PROBLEMS = _problems() + _wide_problems()
IDS = [p[0] for p in PROBLEMS]


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_plan_attributes(problem):
    _, op, args, kw, flops, _, _ = problem
    p = nc.plan(op, *args, **kw)
    assert p.strategy in STRATEGIES
    assert isinstance(p.tiles, collections.abc.Mapping)
    assert isinstance(p.threads, int) and not isinstance(p.threads, bool) and p.threads >= 1
    assert p.flops == flops
    assert isinstance(p.workspace_bytes, int) and not isinstance(p.workspace_bytes, bool)
    assert p.workspace_bytes >= 0
    text = str(p)
    assert "\n" not in text.strip() and p.strategy in text


@pytest.mark.parametrize("problem", PROBLEMS[:4] + PROBLEMS[11:14], ids=IDS[:4] + IDS[11:14])
def test_plan_by_name_equals_plan_by_function(problem):
    _, op, args, kw, flops, _, _ = problem
    a = nc.plan(op, *args, **kw)
    b = nc.plan(getattr(nc, op), *args, **kw)
    assert (a.strategy, dict(a.tiles), a.threads, a.flops, a.workspace_bytes) == \
        (b.strategy, dict(b.tiles), b.threads, b.flops, b.workspace_bytes)


def test_plan_is_immutable():
    _, op, args, kw, _, _, _ = PROBLEMS[3]
    p = nc.plan(op, *args, **kw)
    for attr, value in (("strategy", "gemm"), ("threads", 99), ("flops", 0),
                        ("workspace_bytes", 1), ("tiles", {})):
        with pytest.raises((AttributeError, TypeError)):
            setattr(p, attr, value)
    assert p.flops == PROBLEMS[3][4]
    with pytest.raises((AttributeError, TypeError)):
        p.tiles["block"] = 1
    with pytest.raises((AttributeError, TypeError)):
        del p.strategy


def test_plan_for_forced_direct_reports_direct():
    for _, op, args, kw, flops, _, _ in PROBLEMS:
        p = nc.plan(op, *args, strategy="direct", **kw)
        assert p.strategy == "direct" and p.flops == flops


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_every_op_accepts_strategy_direct_and_tune_false(problem):
    _, op, args, kw, _, ref, operands = problem
    got = getattr(nc, op)(*args, strategy="direct", tune=False, **kw)
    assert_matches(got, F32, ref, *operands, strategy="direct")


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_default_strategy_is_correct(problem):
    _, op, args, kw, _, ref, operands = problem
    strategy = nc.plan(op, *args, **kw).strategy
    got = getattr(nc, op)(*args, **kw)
    assert_matches(got, F32, ref, *operands, strategy=strategy)


@pytest.mark.parametrize("strategy", ["gemm", "winograd"])
@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_forced_strategy_runs_or_declines_by_name(problem, strategy):
    """A forced strategy runs (and is correct) or raises ValueError naming itself."""
    _, op, args, kw, _, ref, operands = problem
    try:
        p = nc.plan(op, *args, strategy=strategy, **kw)
    except ValueError as e:
        assert strategy in str(e)
        with pytest.raises(ValueError, match=strategy):
            getattr(nc, op)(*args, strategy=strategy, **kw)
        return
    assert p.strategy == strategy
    got = getattr(nc, op)(*args, strategy=strategy, **kw)
    assert_matches(got, F32, ref, *operands, strategy=strategy)


@pytest.mark.parametrize("strategy", ["gemm", "winograd"])
def test_forced_strategy_float64_keeps_float64_tolerance(strategy):
    r = np.random.default_rng(5)
    x, w = r.standard_normal((1, 6, 6, 4)), r.standard_normal((3, 3, 4, 4))
    try:
        got = nc.convolution(x, w, strides=[1, 1], auto_pad="same_upper", strategy=strategy)
    except ValueError as e:
        assert strategy in str(e)
        return
    err = normalized_error(got, lambda a, b: conv_fwd_ref(a, b, 1, 1, 1, 1), x, w)
    assert err <= tolerance(F64, strategy)


@pytest.mark.parametrize("bad", ["fastest", "Direct", "fft", ""])
def test_unknown_strategy_is_value_error(bad):
    _, op, args, kw, _, _, _ = PROBLEMS[0]
    with pytest.raises(ValueError):
        nc.plan(op, *args, strategy=bad, **kw)
    with pytest.raises(ValueError):
        getattr(nc, op)(*args, strategy=bad, **kw)


def test_unknown_op_name():
    with pytest.raises((ValueError, TypeError)):
        nc.plan("conv4d", np.ones((1, 3, 3, 1), F32), np.ones((1, 1, 1, 1), F32))


def test_strategy_and_tune_are_keyword_only():
    x, w = np.ones((1, 4, 4, 1), F32), np.ones((2, 2, 1, 1), F32)
    with pytest.raises(TypeError):
        # one positional argument too many for convolution(input, filter, *, ...)
        nc.convolution(x, w, [1, 1])


def test_tune_true_with_forced_direct(tmp_path, monkeypatch):
    """tune=True is accepted (with a single candidate nothing needs timing)."""
    # keep any tuning cache out of the user's home directory; the variable is a guess
    # that costs nothing when the library stores its cache elsewhere
    monkeypatch.setenv("NUMBACONV_TUNE_DIR", str(tmp_path))
    if hasattr(nc, "config") and hasattr(nc.config, "TUNE_CACHE_DIR"):
        monkeypatch.setattr(nc.config, "TUNE_CACHE_DIR", str(tmp_path))
    _, op, args, kw, _, ref, operands = PROBLEMS[3]
    got = getattr(nc, op)(*args, strategy="direct", tune=True, **kw)
    assert_matches(got, F32, ref, *operands, strategy="direct")
    p = nc.plan(op, *args, strategy="direct", tune=True, **kw)
    assert p.strategy == "direct"
    assert not math.isnan(p.flops)


def test_plans_are_cached_per_problem_and_settings(monkeypatch, without_patch_t):
    """A repeated call reuses its plan; anything the plan depends on makes a new one."""
    from numbaconv import config, planner
    x = np.zeros((2, 9, 9, 16), np.float32)
    dy = np.zeros((2, 9, 9, 64), np.float32)
    args = ("conv2d_backprop_filter", x, [1, 1, 16, 64], dy, 1, "SAME")
    first = nc.plan(*args)
    assert nc.plan(*args) is first
    assert nc.plan(*args, strategy="direct") is not first
    monkeypatch.setattr(config, "GEMM_ENGINE", "numba" if first.tiles.get("engine") == "blas"
                        else "blas")
    other = nc.plan(*args)
    assert other is not first and other.tiles["engine"] != first.tiles["engine"]
    monkeypatch.setattr(config, "VERBOSE", True)  # the trace is printed: planned afresh
    assert nc.plan(*args) is not other
    monkeypatch.setattr(config, "VERBOSE", False)
    planner.clear_plan_cache()
    assert nc.plan(*args) is not other


def test_parsed_calls_are_memoised_but_operands_are_the_callers(monkeypatch):
    """A repeated call with equal arguments skips parsing (the memo), yet computes on its
    own arrays; shape arguments given as integer arrays are keyed by value, and another
    dtype is another key."""
    from numbaconv.api import _op
    rng = np.random.default_rng(0)
    calls = []  # one per parse: every lookup that missed

    class Memo(dict):
        def get(self, key, default=None):
            hit = super().get(key, default)
            if hit is None:
                calls.append(key)
            return hit

    monkeypatch.setattr(_op, "_MEMO", Memo())
    w = rng.standard_normal((3, 3, 4, 5)).astype(np.float32)
    forms = [([2, 7, 6, 4], 1), ([2, 7, 6, 4], 1), (np.array([2, 7, 6, 4], np.int32), 1),
             (np.array([2, 8, 6, 4], np.int32), 2), (np.array([2, 8, 6, 4], np.int32), 2)]
    for sizes, stride in forms:
        dy = rng.standard_normal((2, (int(sizes[1]) - 3) // stride + 1, 4, 5)).astype(
            np.float32)
        before = dy.copy()
        got = nc.conv2d_backprop_input(sizes, w, dy, [1, stride, 1, 1], "VALID")
        want = conv_bwd_data_ref(dy, w, (int(sizes[1]), 6), stride=(stride, 1))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(dy, before)
    # list, list (memo), int32 array (a new key), other sizes, the same again (memo)
    assert len(calls) == 3, calls
    dy16 = rng.standard_normal((2, 5, 4, 5)).astype(np.float16)
    got = nc.conv2d_backprop_input([2, 7, 6, 4], w.astype(np.float16), dy16, [1, 1, 1, 1],
                                   "VALID")
    assert got.dtype == np.float16 and len(calls) == 4
    want = conv_bwd_data_ref(dy16, w.astype(np.float16), (7, 6))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    # a bad argument after memoised calls still fails as parsing says
    with pytest.raises(ValueError):
        nc.conv2d_backprop_input([2, 7, 6, 4], w, np.zeros((2, 5, 4, 6), np.float32),
                                 [1, 1, 1, 1], "VALID")


def test_memoised_calls_follow_threads_settings_and_the_memory_limit(monkeypatch):
    """A memoised call keeps its plan only while the thread count and the planner's settings
    are those it was made for; clear_plan_cache() drops it; a bad tune= still fails; a
    lower memory limit is checked again."""
    from numbaconv import config, planner
    from numbaconv.backends import cpu
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 9, 8, 6)).astype(np.float32)
    dy = rng.standard_normal((2, 9, 8, 16)).astype(np.float32)
    ran = []
    run = cpu.execute
    monkeypatch.setattr(cpu, "execute", lambda plan, *a, **k: ran.append(plan) or run(plan, *a, **k))
    want = conv_bwd_filter_ref(x, dy, (3, 3), pads_begin=1, pads_end=1)

    def call(**kw):
        got = nc.conv2d_backprop_filter(x, [3, 3, 6, 16], dy, 1, "SAME", **kw)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        return ran[-1]

    threads = nc.get_num_threads()
    first = call()
    assert call() is first and first.threads == threads
    monkeypatch.setattr(config, "THREADS", 1)
    one = call()
    assert one.threads == 1 and call() is one
    monkeypatch.setattr(config, "THREADS", threads)
    assert call() is first
    monkeypatch.setattr(config, "GEMM_MIN_ROWS", config.GEMM_MIN_ROWS + 1)
    again = call()
    assert again is not first and call() is again
    planner.clear_plan_cache()
    assert call() is not again
    assert call(strategy="direct").strategy == "direct"
    with pytest.raises(TypeError, match="tune"):
        call(tune=0.0)
    monkeypatch.setattr(config, "MAX_MEMORY_FRACTION", 1e-12)
    with pytest.raises(MemoryError):
        call()


def test_parse_memo_keys():
    from numbaconv.api._op import _NO_KEY, _value_key
    a = np.zeros((2, 3), np.float32)
    assert _value_key(a) == _value_key(np.ones((2, 3), np.float32))
    assert _value_key(a) != _value_key(a.T.copy().T)  # other strides
    assert _value_key(a) != _value_key(a.astype(">f4"))
    assert _value_key(True) != _value_key(1) and _value_key(1) != _value_key(1.0)
    assert _value_key(np.int64(3)) != _value_key(3)
    assert _value_key(np.array([1, 2])) != _value_key(np.array([1, 3]))
    assert _value_key([1, 2]) != _value_key((1, 2))
    for v in (np.zeros(40, np.int64), np.zeros(3, bool), {"a": 1}, object(), [[[1]]]):
        assert _value_key(v) is _NO_KEY


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("channels", [16, 160])
def test_calls_on_views_of_the_callers_arrays(dtype, channels):
    """Channels-last calls run the bound plan on views of the caller's C-contiguous arrays
    (float16 ones as their bits, or widened): the result has the user's shape and dtype,
    shares no memory with any operand, leaves them unchanged, and equals the reference; a
    strided operand and NCHW data take the converting path to the same numbers; ``out=``
    receives it. 160 channels run the depthwise row kernels with their aligned head."""
    rng = np.random.default_rng(3)
    c = channels
    x = rng.standard_normal((2, 9, 8, c)).astype(dtype)
    dy = rng.standard_normal((2, 9, 8, c)).astype(dtype)
    w = rng.standard_normal((3, 3, c, 1)).astype(dtype)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == "float16" else dict(rtol=1e-4, atol=1e-4)
    want_w = conv_bwd_filter_ref(x, dy, (3, 3), pads_begin=1, pads_end=1, groups=c)
    want_d = conv_bwd_data_ref(dy, w.reshape(3, 3, 1, c), (9, 8), pads_begin=1, pads_end=1,
                               groups=c)
    before = [a.copy() for a in (x, dy, w)]
    for _ in range(2):  # the second call is memoised: the bound plan itself
        gw = nc.depthwise_conv2d_native_backprop_filter(x, [3, 3, c, 1], dy,
                                                        [1, 1, 1, 1], "SAME")
        gd = nc.depthwise_conv2d_native_backprop_input([2, 9, 8, c], w, dy, [1, 1, 1, 1],
                                                       "SAME")
        assert gw.shape == (3, 3, c, 1) and gd.shape == x.shape
        assert gw.dtype == dtype and gd.dtype == dtype
        np.testing.assert_allclose(gw.reshape(3, 3, 1, c), want_w, **tol)
        np.testing.assert_allclose(gd, want_d, **tol)
        for r in (gw, gd):
            assert r.flags.c_contiguous and r.flags.writeable
            assert not any(np.shares_memory(r, a) for a in (x, dy, w))
    for a, b in zip((x, dy, w), before):
        np.testing.assert_array_equal(a, b)
    # the same problem on a strided dY (a copy first) and in NCHW (converted)
    wide = np.zeros((2, 9, 8, 2 * c), dtype)
    wide[..., ::2] = dy
    got = nc.depthwise_conv2d_native_backprop_input([2, 9, 8, c], w, wide[..., ::2],
                                                    [1, 1, 1, 1], "SAME")
    np.testing.assert_array_equal(got, gd)
    got = nc.depthwise_conv2d_native_backprop_filter(
        np.moveaxis(x, -1, 1), [3, 3, c, 1], np.moveaxis(dy, -1, 1), [1, 1, 1, 1], "SAME",
        data_format="NCHW")
    np.testing.assert_allclose(got, gw, **tol)
    out = np.full((3, 3, c, 1), np.nan, dtype)
    assert nc.depthwise_conv2d_native_backprop_filter(x, [3, 3, c, 1], dy, [1, 1, 1, 1],
                                                      "SAME", out=out) is out
    np.testing.assert_array_equal(out, gw)


def test_first_accepting_entry_ends_the_search_with_the_same_plan(monkeypatch):
    """The default planning path stops at the first entry that accepts (the entries after
    it are neither asked nor imported); the full path (every entry asked, as under
    ``NUMBACONV_VERBOSE``) makes the same plan, with the same reasons of the entries ahead,
    for small and large problems of every direction."""
    from numbaconv import config, planner, suites
    calls = [suites.call(suites.layer(name), direction, "float32", shapes_only=True)
             for name in ("res2a_branch2b", "res3a_branch1", "dw144_56_s1_p1",
                          "vnet:stage5_5x5x5", "pointnet:seg_out")
             for direction in ("fwd", "bwd_d", "bwd_w")]
    x, w, dy = np.ones((1, 6, 6, 4)), np.ones((3, 3, 4, 4)), np.ones((1, 6, 6, 4))
    small = [("conv2d", (x, w, 1, "SAME"), {}),
             ("conv2d_backprop_filter", (x, w.shape, dy, 1, "SAME"), {})]
    for op, args, kwargs in [(c.op, c.args, c.kwargs) for c in calls] + small:
        planner.clear_plan_cache()
        monkeypatch.setattr(config, "VERBOSE", False)
        fast = nc.plan(op, *args, **kwargs)
        monkeypatch.setattr(config, "VERBOSE", True)
        planner.clear_plan_cache()
        full = nc.plan(op, *args, **kwargs)
        assert fast == full, (op, fast, full)
        assert fast.declined == full.declined
    planner.clear_plan_cache()


def _last_line_of(code):
    """The last line ``code`` prints, run in a fresh interpreter."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return out.strip().splitlines()[-1]


def test_a_small_problem_imports_no_compiled_entry():
    """A small problem runs on the ``numpy`` entries at the head of the list: its first
    call imports no other strategy's module and no kernel module."""
    code = ("import sys, numpy as np, numbaconv\n"
            "x, w = np.ones((2, 16, 16, 8), np.float32), np.ones((3, 3, 8, 8), np.float32)\n"
            "numbaconv.conv2d_backprop_filter(x, w.shape, x, 1, 'SAME')\n"
            "numbaconv.conv2d_backprop_input(x.shape, w, x, 1, 'SAME')\n"
            "print(sorted(m for m in sys.modules if m.startswith(('numbaconv.strategies.',"
            " 'numbaconv.kernels.cpu.'))))")
    mods = eval(_last_line_of(code))
    assert "numbaconv.strategies.numpy_taps" in mods
    heavy = [m for m in mods if m.split(".")[-1] in ("gemm", "igemm", "winograd", "ukernel",
                                                     "depthwise", "grouped", "patcht")]
    assert not heavy, mods


def test_entries_resolved_once_under_concurrent_planning():
    """Threads planning at once in a fresh process (each reaching further down the list,
    so importing modules as they go) resolve every entry once, in order."""
    code = ("import threading, numpy as np, numbaconv\n"
            "from numbaconv import planner\n"
            "shapes = [(1, 6, 6, 4), (2, 56, 56, 64), (8, 28, 28, 96)]\n"
            "def go(i):\n"
            "    x = np.ones(shapes[i % 3], np.float32)\n"
            "    w = (3, 3, x.shape[-1], 64 if i % 2 else 8)\n"
            "    numbaconv.plan('conv2d_backprop_filter', x, w,\n"
            "                   np.ones((*x.shape[:-1], w[-1]), np.float32), 1, 'SAME')\n"
            "ts = [threading.Thread(target=go, args=(i,)) for i in range(12)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
            "print([planner.label(s) for s in planner._strategies()] == list(planner.LABELS))")
    assert _last_line_of(code) == "True"
