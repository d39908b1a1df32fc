"""Read-only operands (memory maps, frozen buffers) run on every op and strategy, give the
bits that writable ones give, and are left as they were."""
import numpy as np
import pytest

import numbaconv as nc
from strategy_cases import CASES, IDS, call, check_plan, every_strategy, operands, patch


def _frozen(ops):
    out = {}
    for name, a in ops.items():
        b = a.copy()
        b.flags.writeable = False
        out[name] = b
    return out


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_path_takes_read_only_operands(case, monkeypatch):
    patch(case, monkeypatch)
    ops = operands(case)
    check_plan(case, ops)
    want = call(case, ops)
    frozen = _frozen(ops)
    got = call(case, frozen)
    assert np.array_equal(_bits(got), _bits(want)), case.id
    for name, a in frozen.items():
        assert not a.flags.writeable
        assert np.array_equal(_bits(a), _bits(ops[name])), f"{case.id}: {name} changed"


def _tf_calls(rng, dtype):
    f = lambda *s: rng.standard_normal(s).astype(dtype)  # noqa: E731
    x2, w2, dy2 = f(2, 16, 16, 8), f(3, 3, 8, 8), f(2, 16, 16, 8)
    x3, w3, dy3 = f(2, 4, 8, 8, 8), f(3, 3, 3, 8, 8), f(2, 4, 8, 8, 8)
    xd, wd, dyd = f(2, 10, 10, 16), f(3, 3, 16, 1), f(2, 10, 10, 16)
    s5 = (1, 1, 1, 1, 1)
    return [
        ("conv2d", nc.conv2d, (x2, w2, 1, "SAME")),
        ("conv2d_backprop_input", nc.conv2d_backprop_input, (x2.shape, w2, dy2, 1, "SAME")),
        ("conv2d_backprop_filter", nc.conv2d_backprop_filter, (x2, w2.shape, dy2, 1, "SAME")),
        ("depthwise_conv2d_native", nc.depthwise_conv2d_native, (xd, wd, (1, 1, 1, 1), "SAME")),
        ("depthwise_conv2d_native_backprop_input", nc.depthwise_conv2d_native_backprop_input,
         (xd.shape, wd, dyd, (1, 1, 1, 1), "SAME")),
        ("depthwise_conv2d_native_backprop_filter",
         nc.depthwise_conv2d_native_backprop_filter, (xd, wd.shape, dyd, (1, 1, 1, 1), "SAME")),
        ("conv3d", nc.conv3d, (x3, w3, s5, "SAME")),
        ("conv3d_backprop_input_v2", nc.conv3d_backprop_input_v2, (x3.shape, w3, dy3, s5,
                                                                   "SAME")),
        ("conv3d_backprop_filter_v2", nc.conv3d_backprop_filter_v2, (x3, w3.shape, dy3, s5,
                                                                     "SAME")),
    ]


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("strategy", [None, "gemm", "direct"])
def test_tf_ops_take_read_only_operands(strategy, dtype, monkeypatch):
    """Every TensorFlow-style op with every array argument read-only (2-D backward weights
    of 8 channels plans ``gemm[rows]`` by default)."""
    every_strategy(monkeypatch)
    for name, fn, args in _tf_calls(np.random.default_rng(5), dtype):
        if strategy == "gemm" and name.startswith("depthwise"):
            continue  # the GEMM strategy declines depthwise problems
        want = fn(*args, strategy=strategy)
        frozen = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        for a in frozen:
            if isinstance(a, np.ndarray):
                a.flags.writeable = False
        got = fn(*frozen, strategy=strategy)
        assert np.array_equal(_bits(got), _bits(want)), name
        for a, b in zip(frozen, args):
            if isinstance(a, np.ndarray):
                assert np.array_equal(_bits(a), _bits(b)), name


@pytest.mark.parametrize("nd", [2, 3])
def test_read_only_out_backprop_alone(nd, monkeypatch):
    """Only ``out_backprop`` read-only: 2-D plans ``gemm[rows]``, as does the 3-D default."""
    every_strategy(monkeypatch)
    rng = np.random.default_rng(7)
    if nd == 2:
        fn, shape, k, s = nc.conv2d_backprop_filter, (2, 16, 16, 8), (3, 3, 8, 8), 1
    else:
        fn, shape, k, s = (nc.conv3d_backprop_filter_v2, (2, 4, 8, 8, 8), (3, 3, 3, 8, 8),
                           (1, 1, 1, 1, 1))
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    p = nc.plan(fn, x, k, dy, s, "SAME")
    assert (p.strategy, p.variant) == ("gemm", "rows"), str(p)
    want = fn(x, k, dy, s, "SAME")
    dy.flags.writeable = False
    assert np.array_equal(_bits(fn(x, k, dy, s, "SAME")), _bits(want))


def test_memory_mapped_operands(tmp_path, monkeypatch):
    """The weight gradient from read-only memory maps (``gemm[rows]`` and the 3-D default)."""
    every_strategy(monkeypatch)
    rng = np.random.default_rng(6)
    for shape, fn, k, s in [((2, 16, 16, 8), nc.conv2d_backprop_filter, (3, 3, 8, 8), 1),
                            ((2, 4, 8, 8, 8), nc.conv3d_backprop_filter_v2, (3, 3, 3, 8, 8),
                             (1, 1, 1, 1, 1))]:
        maps = []
        for name in ("x", "dy"):
            path = tmp_path / f"{name}{len(shape)}.npy"
            np.save(path, rng.standard_normal(shape).astype(np.float32))
            maps.append(np.load(path, mmap_mode="r"))
        assert not maps[1].flags.writeable
        want = fn(np.array(maps[0]), k, np.array(maps[1]), s, "SAME")
        got = fn(maps[0], k, maps[1], s, "SAME")
        assert np.array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_read_only_operands_compile_nothing_more(dtype, monkeypatch):
    """A read-only operand runs on the kernels compiled for writable ones: after each op's
    call on writable arrays, the same call on read-only copies compiles nothing."""
    from numba.core import event

    every_strategy(monkeypatch)

    class Compiles(event.Listener):
        def __init__(self):
            self.names = []

        def on_start(self, ev):
            self.names.append(ev.data["dispatcher"].py_func.__qualname__)

        def on_end(self, ev):
            pass

    for name, fn, args in _tf_calls(np.random.default_rng(8), dtype):
        want = fn(*args)
        frozen = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        for a in frozen:
            if isinstance(a, np.ndarray):
                a.flags.writeable = False
        listener = Compiles()
        with event.install_listener("numba:compile", listener):
            got = fn(*frozen)
        assert listener.names == [], f"{name}: compiled {listener.names} for read-only operands"
        assert np.array_equal(_bits(got), _bits(want)), name
