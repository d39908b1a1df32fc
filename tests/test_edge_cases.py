"""Edge cases of every op against the NumPy reference: empty problems (no batch, a zero
spatial size, no input or output channels), for the forward op and both gradients, 1-D to
3-D, under the TF and the oneDNN names, depthwise too."""
import numpy as np
import pytest

import numbaconv as nc
from reference import (conv_bwd_data_ref, conv_bwd_filter_ref, conv_fwd_ref, depthwise_to_xio,
                       xio_to_depthwise)

F32, F64 = np.float32, np.float64


# --------------------------------------------------------------------------- empty problems
def _sizes(family, nd, zero):
    """Channels-last ``(N, spatial, C, K, kernel)`` of a GEMM-sized problem with one size zero
    (``K`` is the depthwise multiplier for the depthwise family)."""
    n, sp, c, k = 2, [9] * nd if nd < 3 else [5] * 3, 8, 16 if family != "depthwise" else 2
    if zero == "batch":
        n = 0
    elif zero == "width":
        sp[-1] = 0
    elif zero == "in_channels":
        c = 0
    elif zero == "out_channels":
        k = 0
    return n, tuple(sp), c, k, (3,) * nd


def _call(family, direction, nd, x, w, dy, dtype):
    """Run one op on channels-last ``x``/``w``/``dy`` (SAME padding, stride 1)."""
    if family == "onednn":
        kw = dict(strides=1, auto_pad="same_upper")
        if direction == "fwd":
            return nc.convolution(x, w, **kw), nc.plan("convolution", x, w, **kw)
        if direction == "bwd_d":
            return (nc.convolution_backprop_data(dy, w, list(x.shape), **kw),
                    nc.plan("convolution_backprop_data", dy, w, list(x.shape), **kw))
        return (nc.convolution_backprop_filters(x, list(w.shape), dy, **kw),
                nc.plan("convolution_backprop_filters", x, list(w.shape), dy, **kw))
    if family == "depthwise":
        names = ("depthwise_conv2d_native", "depthwise_conv2d_native_backprop_input",
                 "depthwise_conv2d_native_backprop_filter")
    elif family == "tf_v2":
        names = ("conv2d", "conv2d_backprop_input_v2", "conv2d_backprop_filter_v2")
    elif nd == 2:
        names = ("conv2d", "conv2d_backprop_input", "conv2d_backprop_filter")
    else:
        names = ("conv3d", "conv3d_backprop_input_v2", "conv3d_backprop_filter_v2")
    fn = dict(zip(("fwd", "bwd_d", "bwd_w"), names))[direction]
    if direction == "fwd":
        args = (x, w)
    elif direction == "bwd_d":
        args = (x if family == "tf_v2" else list(x.shape), w, dy)
    else:
        args = (x, w if family == "tf_v2" else list(w.shape), dy)
    strides = [1] * (nd + 2)
    return getattr(nc, fn)(*args, strides, "SAME"), nc.plan(fn, *args, strides, "SAME")


CASES = [(fam, nd) for fam, nds in (("onednn", (1, 2, 3)), ("tf", (2, 3)), ("tf_v2", (2,)),
                                     ("depthwise", (2,))) for nd in nds]


@pytest.mark.parametrize("zero", ["batch", "width", "in_channels", "out_channels"])
@pytest.mark.parametrize("direction", ["fwd", "bwd_d", "bwd_w"])
@pytest.mark.parametrize("family,nd", CASES, ids=[f"{f}-{n}d" for f, n in CASES])
def test_empty_problems_give_zeros_of_the_right_shape(family, nd, direction, zero):
    dtype = F64 if zero == "in_channels" else F32
    n, sp, c, k, ks = _sizes(family, nd, zero)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, *sp, c)).astype(dtype)
    y_shape = (n, *sp, c * k if family == "depthwise" else k)   # SAME, stride 1
    dy = rng.standard_normal(y_shape).astype(dtype)
    if family == "depthwise":
        w = rng.standard_normal((*ks, c, k)).astype(dtype)
        wx, groups = depthwise_to_xio(w), max(c, 1)
    else:
        w = wx = rng.standard_normal((*ks, c, k)).astype(dtype)
        groups = 1
    pads = [s // 2 for s in ks]
    geo = dict(stride=1, dilation=1, pads_begin=pads, pads_end=pads, groups=groups)
    got, plan = _call(family, direction, nd, x, w, dy, dtype)
    assert got.dtype == dtype
    # the reference takes no zero-sized input (nor depthwise without channels)
    by_ref = c > 0 and all(sp)
    if direction == "fwd":
        assert got.shape == y_shape
        ref = conv_fwd_ref(x, wx, **geo) if by_ref else np.zeros(y_shape)
    elif direction == "bwd_d":
        assert got.shape == x.shape
        ref = conv_bwd_data_ref(dy, wx, sp, **geo) if by_ref else np.zeros(x.shape)
    else:
        assert got.shape == w.shape
        ref = conv_bwd_filter_ref(x, dy, ks, **geo) if by_ref else np.zeros(w.shape)
        if family == "depthwise" and by_ref:
            ref = xio_to_depthwise(ref, c)
    assert np.array_equal(got, ref.astype(dtype))
    assert not got.any()
    assert plan.problem.empty and plan.workspace_bytes == 0 and "empty" in plan.reason


@pytest.mark.parametrize("strategy", [None, "direct", "gemm", "winograd"])
def test_empty_problem_plans_with_any_strategy(strategy):
    """A forced strategy has nothing to run on an empty problem: the plan says so."""
    x = np.zeros((0, 9, 9, 8), F32)
    w = np.zeros((3, 3, 8, 16), F32)
    p = nc.plan("conv2d", x, w, 1, "SAME", strategy=strategy)
    assert p.problem.empty and "empty" in p.reason
    out = np.full((0, 9, 9, 16), np.nan, F32)
    assert nc.conv2d(x, w, 1, "SAME", out=out, strategy=strategy) is out


def test_zero_width_input_with_padding_gives_zero_outputs():
    """An input of width 0 padded to width 2: every output reads only padding."""
    x = np.zeros((2, 9, 0, 8), F32)
    w = np.ones((3, 1, 8, 16), F32)
    out = np.full((2, 9, 2, 16), np.nan, F32)
    y = nc.convolution(x, w, strides=1, pads_begin=[1, 1], pads_end=[1, 1], out=out)
    assert y is out
    assert np.array_equal(y, conv_fwd_ref(x, w, 1, 1, [1, 1], [1, 1]).astype(F32))
    dw = nc.convolution_backprop_filters(x, [3, 1], np.ones((2, 9, 2, 16), F32), strides=1,
                                         pads_begin=[1, 1], pads_end=[1, 1])
    assert dw.shape == (3, 1, 8, 16) and not dw.any()


# --------------------------------------------------------------------------- direct in blocks
# (C, K, input spatial, kernel, stride, dilation, pads_begin, pads_end): backward data
# accumulates per pixel for C <= 8 and per tap above
DIRECT_CASES = [
    (3, 16, (9, 8), (3, 3), (2, 1), (1, 2), (1, 0), (2, 1)),
    (12, 8, (7, 9), (3, 2), (1, 2), (2, 1), (1, 1), (1, 0)),
    (4, 6, (4, 5, 5), (3, 1, 2), (1, 2, 1), (1, 1, 2), (1, 0, 1), (1, 0, 0)),
]


@pytest.mark.parametrize("direction", ["fwd", "bwd_d", "bwd_w"])
@pytest.mark.parametrize("case", DIRECT_CASES, ids=["per-pixel", "per-tap", "3d"])
def test_direct_in_row_blocks_is_the_single_call(case, direction, monkeypatch):
    """A direct call split into row blocks (each its own kernel launch, so that Python sees
    signals between them) gives the single launch's result bit for bit, and the
    reference's values."""
    from numbaconv.kernels.cpu import direct as K
    from numbaconv.strategies import direct as D
    from reference import assert_matches

    c, k, isz, ks, st, dl, pb, pe = case
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, *isz, c)).astype(F32)
    w = rng.standard_normal((*ks, c, k)).astype(F32)
    geo = dict(stride=st, dilation=dl, pads_begin=pb, pads_end=pe)
    dy = rng.standard_normal(conv_fwd_ref(x, w, **geo).shape).astype(F32)
    attrs = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe, strategy="direct")
    launches = []
    for name in ("fwd_direct", "bwd_d_direct", "bwd_d_direct_acc", "bwd_w_direct"):
        kern = getattr(K, name)
        monkeypatch.setattr(K, name, lambda *a, _k=kern: launches.append(1) or _k(*a))

    def call():
        launches.clear()
        if direction == "fwd":
            args = ("convolution", x, w)
        elif direction == "bwd_d":
            args = ("convolution_backprop_data", dy, w, isz)
        else:
            args = ("convolution_backprop_filters", x, ks, dy)
        plan = nc.plan(*args, **attrs)
        assert (plan.strategy, plan.variant) == ("direct", "")
        return getattr(nc, args[0])(*args[1:], **attrs), len(launches)

    single, n = call()
    assert n == 1
    monkeypatch.setattr(D, "BLOCK_FLOPS", 1)  # a row per block
    blocked, n = call()
    assert n > 1
    assert np.array_equal(blocked, single)
    if direction == "fwd":
        assert_matches(blocked, F32, conv_fwd_ref, x, w, **geo)
    elif direction == "bwd_d":
        assert_matches(blocked, F32, conv_bwd_data_ref, dy, w, isz, **geo)
    else:
        assert_matches(blocked, F32, conv_bwd_filter_ref, x, dy, ks, **geo)


_LONG_DIRECT_CALLS = """
import faulthandler, signal, sys
# Ctrl-C as a terminal delivers it, whatever this process inherited from the test run's
# worker (a worker process of the run may ignore or block SIGINT, and children inherit
# both: seen as a child that never saw the signal)
print("SIGINT:", signal.getsignal(signal.SIGINT),
      signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []), file=sys.stderr)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
import numpy as np, numbaconv as nc
w = np.ones((7, 7, 128, 128), np.float32)
nc.conv2d(np.ones((1, 8, 8, 128), np.float32), w, 1, "SAME", strategy="direct")  # compiled
x = np.ones((2, 224, 224, 128), np.float32)  # 160 GFLOP a call: half a minute or so
print("started", flush=True)
faulthandler.dump_traceback_later(8, exit=True)  # where it is, should SIGINT not end it
while True:
    nc.conv2d(x, w, 1, "SAME", strategy="direct")
"""


def test_ctrl_c_interrupts_a_long_direct_call():
    """SIGINT during a long direct call raises KeyboardInterrupt after the current row block,
    not when the whole call ends."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", _LONG_DIRECT_CALLS], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started", proc.stderr.read()
        time.sleep(1.0)  # inside the first long call
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=30)
        waited = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "KeyboardInterrupt" in err, err
    assert waited < 10
    inherited = err.splitlines()[0]
    if inherited != "SIGINT: <built-in function default_int_handler> False":
        import warnings
        warnings.warn(f"the test run's worker passed on a changed SIGINT ({inherited}, "
                      f"signal.getsignal here: {signal.getsignal(signal.SIGINT)})")
