"""The CUDA backend's host side with the device mocked: streams, pooled workspaces, one memory
query per plan, plan caching. No GPU and no simulator: ``numba.cuda`` is replaced, inside
:mod:`numbaconv.backends.cuda`, by a recording stand-in whose arrays are NumPy arrays and
whose kernel launches only record their grid, block and stream (the kernel factories are
replaced too), so these tests see exactly what a call asks of the device.

``python tests/test_cuda_host.py`` prints the host time per public call on device arrays
with ``out=`` and the launches mocked (Python overhead only; numba's own launch cost is not
in it); ``--profile`` adds a cProfile breakdown.
"""
import math
import sys
import time
import types

import numpy as np
import pytest

from numbaconv import planner
from numbaconv.backends import cuda as backend
from numbaconv.problem import ConvProblem


class FakeStream:
    def __init__(self, handle):
        self.handle = types.SimpleNamespace(value=handle)

    def synchronize(self):
        raise AssertionError("the host must not wait for a stream")


class FakeArray:
    """A device array stand-in: NumPy data, a stream, numba's array methods the backend uses."""

    __cuda_ndarray__ = True  # (as numba's device arrays: the front ends take it as one)

    def __init__(self, data, stream=0, base=None):
        self.data, self.stream, self.base = data, stream, base  # base: kept alive (views)
        self.shape, self.dtype, self.size = data.shape, data.dtype, data.size
        self.nbytes, self.ndim, self.strides = data.nbytes, data.ndim, data.strides

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self.data.__array_interface__["data"][0], False),
                "strides": None if self.data.flags.c_contiguous else self.data.strides,
                "stream": backend.stream_handle(self.stream) or None}

    def reshape(self, *shape):
        # (numba's reshape drops the stream, as this one does)
        return FakeArray(self.data.reshape(*shape), base=self)

    def bind(self, stream):
        return FakeArray(self.data, stream, base=self)

    def is_c_contiguous(self):
        return self.data.flags.c_contiguous


class ForeignArray:
    """A CuPy- or PyTorch-style device array: only ``__cuda_array_interface__`` (a new dict
    per access, the data pointer and the producer's stream in it)."""

    def __init__(self, data, stream=None):
        self.data, self.stream = data, stream

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.data.shape, "typestr": self.data.dtype.str, "version": 3,
                "data": (self.data.__array_interface__["data"][0], False),
                "strides": None if self.data.flags.c_contiguous else self.data.strides,
                "stream": self.stream}


class FakeCuda:
    """Records allocations, launches, events and memory queries."""

    def __init__(self):
        self.allocs, self.launches, self.waits, self.mem_queries = [], [], [], 0
        self.wraps = 0
        self.devicearray = types.SimpleNamespace(
            is_cuda_ndarray=lambda v: isinstance(v, FakeArray))

    def is_available(self):
        return True

    def device_array(self, shape, dtype, stream=0):
        a = FakeArray(np.empty(shape, dtype), stream)
        self.allocs.append(a)
        return a

    def from_cuda_array_interface(self, desc, owner=None, sync=True):
        """numba's zero-copy wrapper of a foreign device array: the stream its interface
        names (numba's own rule), recorded per wrap."""
        assert sync is False, "the host must not wait for a producer's stream"
        self.wraps += 1
        return FakeArray(owner.data, FakeStream(desc["stream"]) if desc.get("stream") else 0)

    def external_stream(self, handle):
        return FakeStream(handle)

    def event(self, timing=False):
        cuda = self

        class Event:
            def record(self, stream=0):
                self.src = stream

            def wait(self, stream=0):
                cuda.waits.append((backend.stream_handle(self.src),
                                   backend.stream_handle(stream)))
        return Event()

    def current_context(self):
        cuda = self

        class Ctx:
            def get_memory_info(self):
                cuda.mem_queries += 1
                return 1 << 40, 1 << 40
        return Ctx()

    def kernel(self, name):
        return FakeKernel(self, name)


class FakeKernel:
    def __init__(self, cuda, name):
        self.cuda, self.name = cuda, name

    def __getitem__(self, cfg):
        grid, threads, stream = cfg

        def launch(*args):
            # (numba launches on its own streams only: 0 or a numba stream object)
            assert isinstance(stream, FakeStream) or stream == 0, type(stream)
            self.cuda.launches.append((self.name, grid, threads, backend.stream_handle(stream)))
        return launch


@pytest.fixture
def fake(monkeypatch):
    """Route the backend's numba.cuda and kernel factories through a FakeCuda."""
    from numbaconv.kernels.cuda import depthwise, depthwise_patch, gemm, layout, tf32

    cuda = FakeCuda()
    monkeypatch.setattr(backend, "_cuda", lambda name="array": cuda)
    monkeypatch.setattr(backend, "simulator", lambda: False)
    for mod, names in ((gemm, ("fwd_gemm", "bwd_d_gemm", "bwd_w_gemm", "reduce_partials")),
                       (tf32, ("fwd_tf32", "bwd_d_tf32", "bwd_w_tf32")),
                       (depthwise, ("fwd_depthwise", "bwd_d_depthwise", "bwd_w_depthwise",
                                    "fwd_depthwise_rows", "bwd_d_depthwise_rows",
                                    "bwd_w_depthwise_rows")),
                       (depthwise_patch, ("fwd_depthwise_patch", "bwd_d_depthwise_patch")),
                       (layout, ("gather", "scatter", "fill_zero"))):
        for n in names:
            monkeypatch.setattr(mod, n, lambda *a, _n=n, **k: cuda.kernel(_n))
    backend.clear_pool()
    backend.clear_prepared()
    planner.clear_plan_cache()  # (the front end's memo keeps prepared launches)
    yield cuda
    backend.clear_pool()


def _problem(direction="fwd", fmt="NXC"):
    return ConvProblem(direction, 8, 1, 64, 64, (1, 14, 14), (1, 3, 3), (1, 14, 14),
                       (1, 1, 1), (1, 1, 1), (0, 1, 1), (0, 1, 1), 2, "float32", fmt, "XIO",
                       op="test")


def _operands(p, stream=0, fmt="NXC"):
    x = np.zeros((8, 14, 14, 64), np.float32)
    w = np.zeros((3, 3, 64, 64), np.float32)
    if fmt == "NCX":
        x = np.ascontiguousarray(np.moveaxis(x, -1, 1))
    return {"x": FakeArray(x, stream), "w": FakeArray(w, stream)}


def test_stream_handle():
    assert backend.stream_handle(None) == 0 and backend.stream_handle(0) == 0
    assert backend.stream_handle(7) == 7
    assert backend.stream_handle(types.SimpleNamespace(cuda_stream=11)) == 11  # PyTorch
    assert backend.stream_handle(types.SimpleNamespace(ptr=12)) == 12          # CuPy
    assert backend.stream_handle(FakeStream(13)) == 13                         # numba
    with pytest.raises(TypeError, match="stream"):
        backend.stream_handle("s")


def test_operands_stream_is_the_launch_stream(fake):
    """Operands that share one stream: every kernel, allocation and the result go on it, and
    nothing waits (on the host or the device)."""
    p = _problem(fmt="NCX")  # NCX: gather and scatter kernels run too
    plan = planner.make_plan(p, device="cuda")
    s = FakeStream(0x5000)
    res = backend.execute(plan, _operands(p, s, "NCX"))
    assert fake.launches and {h for *_, h in fake.launches} == {0x5000}
    assert {backend.stream_handle(a.stream) for a in fake.allocs} == {0x5000}
    assert fake.waits == [] and backend.stream_handle(res.stream) == 0x5000


def test_stream_keyword_and_foreign_streams_wait_on_the_device(fake):
    """stream= wins; an operand from another stream is ordered by an event wait."""
    p = _problem()
    plan = planner.make_plan(p, device="cuda")
    ops = _operands(p)
    ops["x"] = FakeArray(ops["x"].data, FakeStream(0x6000))
    backend.execute(plan, ops, stream=FakeStream(0x7000))
    assert {h for *_, h in fake.launches} == {0x7000}
    assert fake.waits == [(0x6000, 0x7000)]
    fake.launches.clear()
    fake.waits.clear()
    # two foreign streams, no keyword: numba's default stream waits for both
    ops["w"] = FakeArray(ops["w"].data, FakeStream(0x8000))
    backend.execute(plan, ops)
    assert {h for *_, h in fake.launches} == {0}
    assert sorted(fake.waits) == [(0x6000, 0), (0x8000, 0)]


class TorchLikeStream:
    """A PyTorch (or CuPy) stream: an integer handle and a synchronize method, but not a
    stream numba can launch on."""

    def __init__(self, handle):
        self.cuda_stream = handle

    def synchronize(self):
        raise AssertionError("the host must not wait for a stream")


def test_foreign_stream_objects_launch_on_an_external_stream(fake):
    """A PyTorch stream given as stream= goes to numba as an external stream of its
    handle, for the kernels, the allocations and the result."""
    p = _problem(fmt="NCX")
    plan = planner.make_plan(p, device="cuda")
    res = backend.execute(plan, _operands(p, fmt="NCX"), stream=TorchLikeStream(0x5100))
    assert fake.launches and {h for *_, h in fake.launches} == {0x5100}
    assert backend.stream_handle(res.stream) == 0x5100 and fake.waits == []


def test_memory_query_once_per_plan_and_workspaces_pooled(fake):
    """The free-memory query runs on a plan's first call only; the second call of a plan
    allocates only its result (canonical copies and intermediates come from the pool)."""
    p = _problem(fmt="NCX")
    plan = planner.make_plan(p, device="cuda")
    assert planner.make_plan(p, device="cuda") is plan  # GPU plans are cached
    ops = _operands(p, fmt="NCX")
    backend.execute(plan, ops)
    first = len(fake.allocs)
    # x's canonical copy, the partials of a split K, the canonical result, the user's
    assert plan.tiles["splits"] > 1
    assert fake.mem_queries == 1 and first == 4
    backend.execute(plan, ops)
    assert fake.mem_queries == 1
    assert len(fake.allocs) == first + 1  # only the new user result
    assert fake.allocs[-1].shape == tuple(p.result_shape)


def test_pool_is_per_stream(fake):
    p = _problem(fmt="NCX")
    plan = planner.make_plan(p, device="cuda")
    backend.execute(plan, _operands(p, fmt="NCX"))
    n = len(fake.allocs)
    backend.execute(plan, _operands(p, FakeStream(0x9000), "NCX"))
    assert len(fake.allocs) == 2 * n  # nothing reused across streams


@pytest.fixture
def pooled(fake, monkeypatch):
    """Results from the pool, as under numba's own allocator on a GPU: a result's block
    goes back when the stand-in array (and every view of it) is gone."""
    import weakref

    def block(b, form, st):
        shape, dtype = form[0], form[1]
        a = FakeArray(b.arr.data.view(np.uint8).view(dtype).reshape(shape), st)
        weakref.finalize(a, backend._ResultFree(b, id(b)))
        return a
    monkeypatch.setattr(backend, "_results_pooled", lambda cuda: True)
    monkeypatch.setattr(backend, "_result_block", block)
    return fake


@pytest.mark.parametrize("fmt", ["NXC", "NCX"])  # the result as the kernel's, or scattered
def test_results_come_from_the_pool_once_dropped(pooled, fmt):
    """Without out=, a result's memory returns to the pool when the caller drops it, and
    the next call on the same stream takes it (no allocation); a result still held, or a
    call on another stream, gets new memory."""
    import gc

    p = _problem(fmt=fmt)
    plan = planner.make_plan(p, device="cuda")
    ops = _operands(p, fmt=fmt)
    r1 = backend.execute(plan, ops)
    n = len(pooled.allocs)
    addr = r1.data.__array_interface__["data"][0]
    del r1
    gc.collect()
    r2 = backend.execute(plan, ops)
    assert len(pooled.allocs) == n  # the dropped result's block, and the scratch, reused
    assert r2.data.__array_interface__["data"][0] == addr
    view = r2.reshape(-1)  # a view keeps its result's block out of the pool
    del r2
    gc.collect()
    r3 = backend.execute(plan, ops)
    assert len(pooled.allocs) == n + 1
    assert r3.data.__array_interface__["data"][0] != view.data.__array_interface__["data"][0]
    del view, r3
    gc.collect()
    backend.execute(plan, _operands(p, FakeStream(0x9100), fmt))
    assert len(pooled.allocs) > n + 1  # nothing taken across streams


def test_result_block_is_a_numba_array_that_returns_its_block():
    """The result made on a pooled block (numba's own classes, no GPU needed to make one):
    shape, C strides, dtype and the block's address; the block goes back to the pool
    once the result and the arrays sharing its memory are gone, not before."""
    import ctypes
    import gc

    driver = pytest.importorskip("numba.cuda.cudadrv.driver")

    class Flat:  # a pooled block's flat device array: its memory as numba holds it
        __cuda_ndarray__ = True

        def __init__(self, ptr, n):
            self.gpu_data = driver.MemoryPointer(None, ctypes.c_void_p(ptr), n)
            self.nbytes = n

    ptr = 1 << 40
    b = backend._Buf.__new__(backend._Buf)
    b.arr, b.key, b.nbytes, b.views, b._ptr = Flat(ptr, 256), (0, 256, "|u1"), 256, {}, ptr
    backend.clear_pool()
    try:
        r = backend._result_block(b, backend._form((2, 4, 8), "float32"), 0)
        assert (r.shape, r.strides, r.dtype) == ((2, 4, 8), (128, 32, 4), np.float32)
        assert backend.device_pointer(r) == ptr
        v = r.reshape(64)
        del r
        gc.collect()
        assert backend._POOL == {} and ptr in backend._LIVE  # v still holds the block
        assert backend.device_pointer(v) == ptr
        del v
        gc.collect()
        assert backend._POOL == {(0, 256, "|u1"): [b]} and ptr not in backend._LIVE
    finally:
        backend.clear_pool()


def test_results_pooled_only_under_numbas_allocator(monkeypatch):
    """Results come from the pool only on a GPU, with numba's own allocator (an External
    Memory Management plugin allocates them otherwise) and CUDA_POOL_BYTES > 0."""
    from numba.cuda.cudadrv import driver

    from numbaconv import config

    monkeypatch.setattr(backend, "simulator", lambda: False)
    monkeypatch.setattr(driver, "_memory_manager", driver.NumbaCUDAMemoryManager)
    assert backend._results_pooled(None)
    monkeypatch.setattr(config, "CUDA_POOL_BYTES", 0, raising=False)
    assert not backend._results_pooled(None)
    monkeypatch.undo()
    monkeypatch.setattr(backend, "simulator", lambda: False)
    monkeypatch.setattr(driver, "_memory_manager", type("Plugin", (), {}))
    assert not backend._results_pooled(None)
    monkeypatch.setattr(backend, "simulator", lambda: True)
    assert not backend._results_pooled(None)


def test_split_k_plan_launches_a_reduction(fake, monkeypatch):
    """A layer with few output tiles splits K; the partials are summed by reduce_partials
    on the same stream."""
    from numbaconv import config
    monkeypatch.setattr(config, "CUDA_MIN_BLOCKS", 10 ** 6, raising=False)
    p = ConvProblem("fwd", 1, 1, 256, 64, (1, 7, 7), (1, 3, 3), (1, 7, 7), (1, 1, 1),
                    (1, 1, 1), (0, 1, 1), (0, 1, 1), 2, "float32", op="test")
    plan = planner.make_plan(p, device="cuda")
    assert plan.tiles["splits"] > 1
    backend.execute(plan, _operands_for(p))
    names = [n for n, *_ in fake.launches]
    assert names == ["fwd_gemm", "reduce_partials"]
    assert plan.workspace_bytes == plan.tiles["splits"] * math.prod(p.result_shape) * 4


def _operands_for(p):
    x = np.zeros((p.mb, *p.isz[1:], p.ic), np.float32)
    w = np.zeros((*p.ksz[1:], p.icg, p.oc), np.float32)
    return {"x": FakeArray(x), "w": FakeArray(w)}


# -- stream= on the public front ends ----------------------------------------------------------
def _public_calls(rng=np.random.default_rng(0)):
    """(op, args, kwargs) of TF-style and oneDNN-style calls on device arrays (FakeArray),
    every direction, a dense and a depthwise layer, both data layouts."""
    import numbaconv

    def dev(*shape):
        return FakeArray(rng.standard_normal(shape).astype(np.float32))
    x, w, dy = dev(2, 6, 6, 8), dev(3, 3, 8, 16), dev(2, 6, 6, 16)
    xc, dyc = dev(2, 8, 6, 6), dev(2, 16, 6, 6)
    wd, dyd = dev(3, 3, 8, 1), dev(2, 6, 6, 8)
    return [
        (numbaconv.conv2d, (x, w, 1, "SAME"), {}),
        (numbaconv.conv2d_backprop_input, ((2, 6, 6, 8), w, dy, 1, "SAME"), {}),
        (numbaconv.conv2d_backprop_filter, (x, (3, 3, 8, 16), dy, 1, "SAME"), {}),
        (numbaconv.depthwise_conv2d_native_backprop_filter, (x, (3, 3, 8, 1), dyd, 1, "SAME"),
         {}),
        (numbaconv.depthwise_conv2d_native, (x, wd, 1, "SAME"), {}),
        (numbaconv.convolution, (xc, w), dict(strides=1, pads_begin=1, pads_end=1,
                                              data_format="NCX")),
        (numbaconv.convolution_backprop_data, (dyc, w, (6, 6)),
         dict(strides=1, pads_begin=1, pads_end=1, data_format="NCX")),
        (numbaconv.convolution_backprop_filters, (xc, (3, 3), dyc),
         dict(strides=1, pads_begin=1, pads_end=1, data_format="NCX")),
    ]


STREAMS = {
    "numba": lambda h: FakeStream(h),
    "torch": lambda h: types.SimpleNamespace(cuda_stream=h),
    "cupy": lambda h: types.SimpleNamespace(ptr=h),
    "handle": lambda h: h,
}


@pytest.mark.parametrize("kind", sorted(STREAMS))
def test_public_stream_keyword_reaches_every_launch(fake, kind):
    """``stream=`` of every front end reaches the backend: each kernel of the call (gather,
    main, split-K reduction, scatter) is launched on it, every allocation is made on it,
    and the result belongs to it, whichever way the stream is spelled."""
    for i, (fn, args, kwargs) in enumerate(_public_calls()):
        fake.launches.clear()
        fake.allocs.clear()
        h = 0x5100 + i
        res = fn(*args, **kwargs, stream=STREAMS[kind](h))
        assert fake.launches, fn.__name__
        assert {s for *_, s in fake.launches} == {h}, (fn.__name__, fake.launches)
        assert {backend.stream_handle(a.stream) for a in fake.allocs} <= {h}, fn.__name__
        assert backend.stream_handle(res.stream) == h, fn.__name__
        assert fake.waits == []


def test_public_stream_keyword_orders_foreign_operands(fake):
    """An operand on another stream than ``stream=`` is waited for on the device."""
    import numbaconv

    x = FakeArray(np.zeros((2, 6, 6, 8), np.float32), FakeStream(0x6100))
    w = FakeArray(np.zeros((3, 3, 8, 16), np.float32))
    numbaconv.conv2d(x, w, 1, "SAME", stream=FakeStream(0x7100))
    assert {s for *_, s in fake.launches} == {0x7100}
    assert fake.waits == [(0x6100, 0x7100)]


@pytest.mark.parametrize("bad", ["s", 1.5, True, object(), -3])
def test_public_bad_stream_names_stream(fake, bad):
    """A stream the backend cannot launch on is a TypeError/ValueError naming ``stream``,
    raised before any kernel is launched or memory allocated."""
    fn, args, kwargs = _public_calls()[0]
    with pytest.raises((TypeError, ValueError), match="^stream: "):
        fn(*args, **kwargs, stream=bad)
    assert fake.launches == [] and fake.allocs == []


def test_every_public_op_takes_stream_and_precision():
    import inspect

    from numbaconv.api import _op
    assert len(_op.REGISTRY) >= 14
    for name, fn in _op.REGISTRY.items():
        params = inspect.signature(fn).parameters
        for key in ("stream", "precision"):
            assert key in params and params[key].default is None, (name, key)
            assert params[key].kind == params[key].KEYWORD_ONLY, (name, key)


@pytest.mark.parametrize("stream", [0, 7, FakeStream(9), types.SimpleNamespace(ptr=3)])
def test_numpy_call_with_stream_is_refused(stream):
    """NumPy operands run on the host, where a stream means nothing: ``stream=`` (anything
    but None) is a ValueError naming ``stream``, on both front ends, memoised calls too."""
    import numbaconv

    x = np.ones((1, 5, 5, 2), np.float32)
    w = np.ones((3, 3, 2, 4), np.float32)
    want = numbaconv.conv2d(x, w, 1, "SAME")  # (memoises the call's parse)
    with pytest.raises(ValueError, match="^stream: .*NumPy arrays"):
        numbaconv.conv2d(x, w, 1, "SAME", stream=stream)
    with pytest.raises(ValueError, match="^lbl: stream: "):
        numbaconv.conv2d(x, w, 1, "SAME", name="lbl", stream=stream)
    with pytest.raises(ValueError, match="^stream: "):
        numbaconv.convolution(x, w, strides=1, stream=stream)
    np.testing.assert_array_equal(numbaconv.conv2d(x, w, 1, "SAME", stream=None), want)


# -- the memoised device call ------------------------------------------------------------------
@pytest.fixture
def counts(monkeypatch):
    """Count the planner's plans, the TF front end's problem parses and the backend's
    preparations made by public calls."""
    from numbaconv.api import tf

    n = {"plan": 0, "parse": 0, "prepare": 0}

    def counted(key, fn):
        def wrapper(*a, **k):
            n[key] += 1
            return fn(*a, **k)
        return wrapper
    monkeypatch.setattr(planner, "make_plan", counted("plan", planner.make_plan))
    monkeypatch.setattr(tf, "make_problem", counted("parse", tf.make_problem))
    monkeypatch.setattr(backend, "prepare", counted("prepare", backend.prepare))
    return n


def _dev(*shape, stream=0):
    return FakeArray(np.zeros(shape, np.float32), stream)


def _layer_calls():
    """(function, args, kwargs) of the public calls the memo tests repeat, with out=."""
    import numbaconv

    x, w, dy = _dev(2, 6, 6, 8), _dev(3, 3, 8, 16), _dev(2, 6, 6, 16)
    return [
        (numbaconv.conv2d, (x, w, 1, "SAME"), dict(out=_dev(2, 6, 6, 16))),
        (numbaconv.conv2d_backprop_input, ((2, 6, 6, 8), w, dy, 1, "SAME"),
         dict(out=_dev(2, 6, 6, 8))),
        (numbaconv.conv2d_backprop_filter, (x, (3, 3, 8, 16), dy, 1, "SAME"),
         dict(out=_dev(3, 3, 8, 16))),
        (numbaconv.depthwise_conv2d_native_backprop_filter,
         (x, (3, 3, 8, 1), _dev(2, 6, 6, 8), 1, "SAME"), dict(out=_dev(3, 3, 8, 1))),
        (numbaconv.convolution, (_dev(2, 8, 6, 6), w),
         dict(strides=1, pads_begin=1, pads_end=1, data_format="NCX",
              out=_dev(2, 16, 6, 6))),
    ]


def test_memoised_device_call_neither_parses_nor_plans(fake, counts):
    """A device call repeated with equal shapes, dtypes and layouts (new arrays, new out=)
    is neither parsed, planned nor prepared again, queries no memory, and still launches
    every kernel of the first call into the out= it was given."""
    for fn, args, kwargs in _layer_calls():
        fake.launches.clear()
        res = fn(*args, **kwargs)
        assert res is kwargs["out"]
        first = list(fake.launches)
        seen = dict(counts)
        queries = fake.mem_queries
        assert seen["prepare"] >= 1 and queries >= 1
        for _ in range(3):
            fake.launches.clear()
            new = {k: (FakeArray(v.data.copy()) if isinstance(v, FakeArray) else v)
                   for k, v in kwargs.items()}
            args2 = tuple(FakeArray(a.data.copy()) if isinstance(a, FakeArray) else a
                          for a in args)
            assert fn(*args2, **new) is new["out"], fn.__name__
            assert fake.launches == first, fn.__name__
        assert counts == seen, (fn.__name__, counts, seen)
        assert fake.mem_queries == queries, fn.__name__


def test_memoised_device_call_takes_each_calls_stream(fake, counts):
    """The stream is no part of the memo's key: each call's ``stream=`` (or its operands'
    stream) orders its own launches and waits."""
    fn, args, kwargs = _layer_calls()[2]
    fn(*args, **kwargs)
    fn(*args, **kwargs, stream=FakeStream(0x5100))  # (a call with stream=: its own entry)
    seen = dict(counts)
    for h in (0x5200, 0x5300):
        fake.launches.clear()
        fn(*args, **kwargs, stream=FakeStream(h))
        assert {s for *_, s in fake.launches} == {h}
    for h in (0x5400, 0x5500):  # operands from a stream: the launches follow it
        fake.launches.clear()
        x, dy = FakeArray(args[0].data, FakeStream(h)), FakeArray(args[2].data, FakeStream(h))
        out = FakeArray(kwargs["out"].data, FakeStream(h))
        fn(x, args[1], dy, *args[3:], out=out)
        assert {s for *_, s in fake.launches} == {h} and fake.waits == []
    fake.launches.clear()
    x = FakeArray(args[0].data, FakeStream(0x5600))  # one foreign operand: a device wait
    fn(x, *args[1:], **kwargs, stream=7)
    assert {s for *_, s in fake.launches} == {7} and fake.waits == [(0x5600, 7)]
    with pytest.raises(TypeError, match="^stream: "):  # a bad stream still names stream
        fn(*args, **kwargs, stream="s")
    assert counts == seen


def test_device_memo_misses_on_other_strides_shapes_and_out(fake, counts):
    """Other strides (a transposed view), another shape or another out= shape or dtype is
    another key: parsed and planned again, with its own gather and errors."""
    import numbaconv

    x, w = _dev(2, 6, 6, 8), _dev(3, 3, 8, 16)
    out = _dev(2, 6, 6, 16)
    numbaconv.conv2d(x, w, 1, "SAME", out=out)
    assert counts["parse"] == 1
    fake.launches.clear()
    xt = FakeArray(np.zeros((2, 8, 6, 6), np.float32).transpose(0, 2, 3, 1))  # NHWC view
    numbaconv.conv2d(xt, w, 1, "SAME", out=out)
    assert counts["parse"] == 2 and counts["prepare"] == 2
    assert [n for n, *_ in fake.launches][0] == "gather"  # the strided x gets its copy
    numbaconv.conv2d(_dev(4, 6, 6, 8), w, 1, "SAME", out=_dev(4, 6, 6, 16))
    assert counts["parse"] == 3 and counts["plan"] == 3
    with pytest.raises(ValueError, match="^out: expected shape"):
        numbaconv.conv2d(x, w, 1, "SAME", out=_dev(2, 6, 6, 15))
    with pytest.raises(TypeError, match="^out: expected dtype float32"):
        numbaconv.conv2d(x, w, 1, "SAME", out=FakeArray(np.zeros((2, 6, 6, 16))))
    with pytest.raises(TypeError, match="^out: expected a device array"):
        numbaconv.conv2d(x, w, 1, "SAME", out=np.zeros((2, 6, 6, 16), np.float32))
    fake.launches.clear()
    assert numbaconv.conv2d(x, w, 1, "SAME") is not out  # without out=: a fresh result
    assert fake.allocs[-1].shape in ((2 * 6 * 6 * 16,), (2, 6, 6, 16))


def test_memoised_foreign_arrays_are_wrapped_per_call(fake, counts):
    """CuPy/PyTorch-style operands (``__cuda_array_interface__`` only) are memoised by their
    interface's shape, type and strides, not their pointer or stream: each call wraps
    its own arrays (zero-copy, no host wait) and launches on the stream they name."""
    import numbaconv

    w = np.zeros((3, 3, 8, 16), np.float32)
    for i, h in enumerate((0x6200, 0x6300, 0x6400)):
        fake.launches.clear()
        x = ForeignArray(np.zeros((2, 6, 6, 8), np.float32), h)
        numbaconv.conv2d(x, ForeignArray(w.copy(), h), 1, "SAME",
                         out=ForeignArray(np.zeros((2, 6, 6, 16), np.float32), h))
        assert {s for *_, s in fake.launches} == {h} and fake.waits == []
        assert fake.wraps == 3 * (i + 1)  # x, w and out, once per call
    assert counts["parse"] == 1 and counts["plan"] == 1 and counts["prepare"] == 1
    with pytest.raises(TypeError, match="^all arrays of one call"):
        numbaconv.conv2d(ForeignArray(np.zeros((2, 6, 6, 8), np.float32)), w, 1, "SAME")


def test_device_array_whose_interface_raises_is_parsed_as_before(fake):
    """An array whose ``__cuda_array_interface__`` raises (a PyTorch tensor that requires
    grad) is not memoised: the parser meets its error, each time."""
    import numbaconv

    class Grad:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")

    for _ in range(2):
        with pytest.raises(RuntimeError, match="requires grad"):
            numbaconv.conv2d(Grad(), _dev(3, 3, 8, 16), 1, "SAME")


def test_memoised_device_call_follows_cuda_settings(fake, counts, monkeypatch):
    """A changed ``config.CUDA_*`` tunable re-plans a memoised call (tests shrink tiles at
    run time)."""
    from numbaconv import config

    fn, args, kwargs = _layer_calls()[0]
    fn(*args, **kwargs)
    fn(*args, **kwargs)
    assert counts["plan"] == 1
    monkeypatch.setattr(config, "CUDA_THREADS", 128, raising=False)
    fn(*args, **kwargs)
    assert counts["plan"] == 2 and counts["parse"] == 1



# -- strategy= labels on the GPU ---------------------------------------------------------------
def test_gpu_entry_labels_force_that_entry(fake):
    """``strategy=`` takes the GPU's entry labels as the CPU's: ``gemm[tf32]`` (declining
    with its reason where it cannot run), ``gemm[cuda]`` (exact even under
    ``precision="tf32"``), ``direct[cuda-depthwise]``; a CPU label on the GPU and a GPU
    label on the CPU are ValueErrors naming strategy."""
    import dataclasses

    import numbaconv

    p = _problem()
    tf32 = dataclasses.replace(p, precision="tf32")
    plan = planner.make_plan(tf32, strategy="gemm[tf32]", device="cuda")
    assert (plan.strategy, plan.variant) == ("gemm", "tf32")
    assert planner.make_plan(tf32, strategy="gemm[cuda]", device="cuda").variant == "cuda"
    assert planner.make_plan(p, strategy="gemm[cuda]", device="cuda").variant == "cuda"
    d = planner.make_plan(p, strategy="direct[cuda-depthwise]", device="cuda")
    assert (d.strategy, d.variant) == ("direct", "cuda-depthwise")
    with pytest.raises(ValueError, match=r"^strategy: 'gemm\[tf32\]' declines .*precision"):
        planner.make_plan(p, strategy="gemm[tf32]", device="cuda")
    with pytest.raises(ValueError, match=r"^strategy: 'gemm\[slabs\]' is a CPU entry"):
        planner.make_plan(p, strategy="gemm[slabs]", device="cuda")
    with pytest.raises(ValueError, match=r"^strategy: 'gemm\[tf32\]' is a GPU entry"):
        planner.make_plan(p, strategy="gemm[tf32]", device="cpu")
    # through a public call, memoised: the label reaches the plan
    x, w = _dev(2, 6, 6, 8), _dev(3, 3, 8, 16)
    for _ in range(2):
        got = numbaconv.plan("conv2d", x, w, 1, "SAME", strategy="gemm[tf32]",
                             precision="tf32")
        assert got.variant == "tf32"
        fake.launches.clear()
        numbaconv.conv2d(x, w, 1, "SAME", strategy="gemm[tf32]", precision="tf32")
        assert [n for n, *_ in fake.launches][0] == "fwd_gemm"
    with pytest.raises(ValueError, match=r"^strategy: 'gemm\[tf32\]' declines"):
        numbaconv.conv2d(x, w, 1, "SAME", strategy="gemm[tf32]")


def test_tf32_async_entry(fake, monkeypatch, request):
    """``precision="tf32"`` plans ``gemm[tf32-async]`` (kernels.cuda.tf32) where its
    16-byte copies can run along the channels, else ``gemm[tf32]`` with the reason;
    ``strategy="gemm[tf32-async]"`` forces it (a ValueError naming it where it declines),
    ``strategy="gemm[tf32]"`` the register-staged kernels, ``config.CUDA_TF32_ASYNC = 0``
    turns it off; each plan launches its own kernels."""
    import dataclasses

    import numbaconv
    from numbaconv import config
    from numbaconv.kernels.cuda import _ptx

    tf32 = dataclasses.replace(_problem(), precision="tf32")
    # numba's own CUDA target (no aligned shared arrays, no launch bounds) cannot build them
    monkeypatch.setattr(_ptx, "VECTOR", False)
    plan = planner.make_plan(tf32, device="cuda")
    assert plan.variant == "tf32" and "numba-cuda" in plan.declined[0][1]
    monkeypatch.setattr(_ptx, "VECTOR", True)  # (numba-cuda's; the kernels are faked here)
    planner.clear_plan_cache()
    request.addfinalizer(planner.clear_plan_cache)  # (plans made under the patch)
    for strategy in (None, "gemm[tf32-async]"):
        plan = planner.make_plan(tf32, strategy=strategy, device="cuda")
        assert (plan.strategy, plan.variant) == ("gemm", "tf32-async"), strategy
        assert plan.tiles["loader"] == "cp.async" and plan.tiles["stages"] in (2, 3)
    assert planner.make_plan(tf32, strategy="gemm[tf32]", device="cuda").variant == "tf32"
    odd = dataclasses.replace(tf32, ic=6)
    plan = planner.make_plan(odd, device="cuda")
    assert plan.variant == "tf32" and plan.declined[0][0] == "gemm[tf32-async]"
    with pytest.raises(ValueError, match=r"^strategy: 'gemm\[tf32-async\]' declines .*"
                                         r"\(6\) are no multiple of 4"):
        planner.make_plan(odd, strategy="gemm[tf32-async]", device="cuda")
    with pytest.raises(ValueError, match=r"^strategy: 'gemm\[tf32-async\]' declines .*precision"):
        planner.make_plan(_problem(), strategy="gemm[tf32-async]", device="cuda")
    monkeypatch.setattr(config, "CUDA_TF32_ASYNC", 0, raising=False)
    plan = planner.make_plan(tf32, device="cuda")
    assert plan.variant == "tf32" and "CUDA_TF32_ASYNC" in plan.declined[0][1]
    monkeypatch.setattr(config, "CUDA_TF32_ASYNC", 1, raising=False)
    x, w = _dev(2, 6, 6, 8), _dev(3, 3, 8, 16)
    for strategy, kernel in ((None, "fwd_tf32"), ("gemm[tf32]", "fwd_gemm")):
        fake.launches.clear()
        numbaconv.conv2d(x, w, 1, "SAME", strategy=strategy, precision="tf32")
        assert [n for n, *_ in fake.launches][0] == kernel, strategy


def _install_fake():
    """Route the backend through a FakeCuda outside pytest (the fixture's work, by hand)."""
    from numbaconv.kernels.cuda import depthwise, depthwise_patch, gemm, layout, tf32
    cuda = FakeCuda()
    backend._cuda = lambda name="array": cuda
    backend.simulator = lambda: False
    for mod, names in ((gemm, ("fwd_gemm", "bwd_d_gemm", "bwd_w_gemm", "reduce_partials")),
                       (tf32, ("fwd_tf32", "bwd_d_tf32", "bwd_w_tf32")),
                       (depthwise, ("fwd_depthwise", "bwd_d_depthwise", "bwd_w_depthwise",
                                    "fwd_depthwise_rows", "bwd_d_depthwise_rows",
                                    "bwd_w_depthwise_rows")),
                       (depthwise_patch, ("fwd_depthwise_patch", "bwd_d_depthwise_patch")),
                       (layout, ("gather", "scatter", "fill_zero"))):
        for n in names:
            setattr(mod, n, lambda *a, _n=n, **k: cuda.kernel(_n))
    return cuda


def _host_calls():
    """(label, function, args, kwargs) of public device calls with ``out=`` preallocated: a
    ResNet-style 3x3 layer (14x14x64 -> 64, batch 8) in every direction, and a depthwise
    weight gradient."""
    import numbaconv

    def dev(*shape):
        return FakeArray(np.zeros(shape, np.float32))
    x, w, dy = dev(8, 14, 14, 64), dev(3, 3, 64, 64), dev(8, 14, 14, 64)
    wd, dyd = dev(3, 3, 64, 1), dev(8, 14, 14, 64)
    return [
        ("conv2d", numbaconv.conv2d, (x, w, 1, "SAME"), dict(out=dev(8, 14, 14, 64))),
        ("conv2d_backprop_input", numbaconv.conv2d_backprop_input,
         ((8, 14, 14, 64), w, dy, 1, "SAME"), dict(out=dev(8, 14, 14, 64))),
        ("conv2d_backprop_filter", numbaconv.conv2d_backprop_filter,
         (x, (3, 3, 64, 64), dy, 1, "SAME"), dict(out=dev(3, 3, 64, 64))),
        ("depthwise_conv2d_native_backprop_filter",
         numbaconv.depthwise_conv2d_native_backprop_filter,
         (x, (3, 3, 64, 1), dyd, 1, "SAME"), dict(out=dev(3, 3, 64, 1))),
    ]


def main(argv=None):  # pragma: no cover - a measurement, not a test
    """Host time per public call on device arrays with ``out=`` and the launches mocked
    (front end + plan + execute; numba's own launch cost is not in it). ``--profile``
    prints a cProfile breakdown of the first op's calls."""
    import cProfile
    import pstats

    argv = sys.argv[1:] if argv is None else argv
    cuda = _install_fake()
    n = 2000
    for label, fn, args, kwargs in _host_calls():
        fn(*args, **kwargs)  # the first call plans (and, on a GPU, compiles)
        launches = len(cuda.launches)
        fn(*args, **kwargs)
        per_call = len(cuda.launches) - launches
        best = float("inf")
        for _ in range(5):  # best round: the machine may be shared
            t0 = time.perf_counter()
            for _ in range(n):
                fn(*args, **kwargs)
            best = min(best, (time.perf_counter() - t0) / n)
        print(f"{label}: {best * 1e6:.1f} us per call (best of 5 rounds of {n}; "
              f"{per_call} mocked launch(es) per call)")
        if "--profile" in argv:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(n):
                fn(*args, **kwargs)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(14)
        cuda.launches.clear()
        cuda.allocs.clear()


if __name__ == "__main__":
    sys.exit(main())
