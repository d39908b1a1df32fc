"""The CUDA backend (numbaconv.backends.cuda, numbaconv.kernels.cuda) against the NumPy reference.

Without a GPU the kernels run in numba's CUDA simulator, which must be switched on before
numba.cuda is first imported; so every group of cases runs this file as a script in a child
process (``python tests/test_cuda.py GROUP``) with ``NUMBA_ENABLE_CUDASIM=1``, unless a usable
GPU is present, in which case the same cases run on it unchanged. The children start
together (two cores in CI) and each test waits for its own. The tiles are patched tiny (as
STUMPY patches its threads per block) so that the simulator crosses block, tile and K-slice
edges, including thread counts that do not divide the tile; problems are tiny because the
simulator runs every thread in Python.
"""
import os
import subprocess
import sys
import types

import numpy as np
import pytest

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))

# -- the cases (run in the child) ----------------------------------------------------------------
#: (direction, kernel, mb, g, ic, oc, isz, ksz, stride, dilation, pad_begin, pad_end, extra)
_GEOMETRIES = [
    # 2-D, strided, dilated, asymmetric pads
    (2, 1, 3, 4, (5, 5), (3, 3), (2, 2), (1, 2), (1, 0), (0, 2)),
    # groups, 3-D, mixed strides/dilations (stride phases without taps)
    (1, 2, 4, 6, (3, 4, 5), (2, 2, 3), (2, 1, 3), (1, 2, 1), (1, 0, 2), (0, 1, 1)),
    # 1-D, stride 3 dilation 2, large pads
    (2, 1, 5, 3, (6,), (3,), (3,), (2,), (2,), (3,)),
    # 1x1 stride 2 (a plain GEMM that subsamples)
    (2, 1, 6, 5, (4, 4), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)),
]
_DEPTHWISE = [
    (2, 3, 3, 6, (5, 5), (3, 3), (2, 1), (1, 2), (1, 1), (2, 0)),   # multiplier 2
    (1, 4, 4, 4, (3, 4, 4), (2, 3, 2), (1, 2, 2), (2, 1, 1), (0, 1, 1), (1, 1, 0)),
    # stride and dilation sharing a factor (2, 2): odd rows receive no tap at all
    (2, 2, 2, 2, (7, 6), (3, 2), (2, 2), (2, 1), (1, 0), (2, 1)),
]
_WIDE_DEPTHWISE = [
    (1, 2, 2, 2, (3, 70), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    (1, 2, 2, 4, (2, 75), (2, 3), (1, 2), (1, 2), (1, 2), (0, 1)),
]
_TILES = {  # config patches: (BM, BN, BK, TM, TN)
    "small": (4, 4, 2, 2, 2),          # 4 threads
    "odd": (6, 4, 3, 2, 2),            # 6 threads, loads not a multiple of the threads
    # 32 threads in one 8x4 warp tile, 16-byte shared loads (float32), 8 K steps unrolled
    "vec": (32, 16, 8, 4, 4),
    # the cp.async-fed TF32 kernels: a 32x32 tile of two 32x16 warp tiles, their own K
    # slice of 16 (CUDA_BLOCK_K unset)
    "async": (32, 32, None, 4, 4),
}
#: channel counts that are multiples of 4 (the cp.async kernels' 16-byte chunks): strided,
#: dilated, asymmetric pads; groups in 3-D; 1-D with large pads
_ASYNC_GEOMETRIES = [
    (2, 1, 8, 12, (5, 6), (3, 3), (2, 2), (1, 2), (1, 0), (0, 2)),
    (1, 2, 8, 8, (3, 4, 5), (2, 2, 3), (2, 1, 3), (1, 2, 1), (1, 0, 2), (0, 1, 1)),
    (2, 1, 4, 20, (6,), (3,), (3,), (2,), (2,), (3,)),
]


def _groups():
    g = {}
    dirs = ("fwd", "bwd_d", "bwd_w")
    for d in dirs:
        g[f"gemm_{d}"] = [dict(direction=d, kernel="gemm", geo=geo, tiles=t)
                          for geo in _GEOMETRIES for t in ("small", "odd")]
        # split-K: every slice range its own partial, summed in a fixed order
        g[f"gemm_{d}"] += [dict(direction=d, kernel="gemm", geo=geo, tiles="odd", split=True)
                           for geo in _GEOMETRIES[:2]]
        g[f"gemm_{d}"] += [dict(direction=d, kernel="gemm", geo=_GEOMETRIES[1], tiles="vec",
                                dtype="float32"),
                           dict(direction=d, kernel="gemm", geo=_GEOMETRIES[0], tiles="vec",
                                dtype="float64", split=True)]
    # TF32 tensor-core GEMMs (the simulator reads each thread's fragment from shared memory)
    g["gemm_tf32"] = [dict(direction=d, kernel="gemm", geo=geo, tiles="vec", dtype="float32",
                           precision="tf32", split=split)
                      for d in dirs for geo, split in ((_GEOMETRIES[0], False),
                                                       (_GEOMETRIES[1], True))]
    # the cp.async-fed TF32 kernels (kernels.cuda.tf32): every geometry, a split K, and
    # operands misaligned by one element (four 4-byte copies per chunk)
    g["gemm_tf32_async"] = [dict(direction=d, kernel="gemm", geo=geo, tiles="async",
                                 dtype="float32", precision="tf32", loader="cp.async",
                                 split=split, misaligned=mis)
                            for d in dirs
                            for geo, split, mis in ((_ASYNC_GEOMETRIES[0], False, False),
                                                    (_ASYNC_GEOMETRIES[1], True, False),
                                                    (_ASYNC_GEOMETRIES[2], False, True))]
    g["direct"] = [dict(direction=d, kernel="direct", geo=geo, tiles="small")
                   for d in dirs for geo in _DEPTHWISE + _GEOMETRIES[:2]]
    # depthwise forward and backward data: the patch kernels above, the row kernels here
    g["direct_rows"] = [dict(direction=d, kernel="direct", geo=geo, tiles="small", rows=True)
                        for d in ("fwd", "bwd_d") for geo in _DEPTHWISE + _WIDE_DEPTHWISE]
    # depthwise weight gradients on rows wide enough for segments inside the image (the
    # row kernel's loop without bounds tests) and for two column tiles (two partials per
    # split); a column stride and dilation of 2 with multiplier 2
    g["direct_wide"] = [dict(direction="bwd_w", kernel="direct", geo=geo, tiles="small")
                        for geo in _WIDE_DEPTHWISE]
    g["gemm_depthwise"] = [dict(direction=d, kernel="gemm", geo=_DEPTHWISE[0], tiles="odd")
                           for d in dirs]
    lay = []
    for d in dirs:
        lay.append(dict(direction=d, kernel="gemm", geo=_GEOMETRIES[0], tiles="small",
                        data_format="NCX", filter_format="OIX", dtype="float32"))
        lay.append(dict(direction=d, kernel="direct", geo=_DEPTHWISE[0], tiles="small",
                        filter_format="XIM", dtype="float16"))
        lay.append(dict(direction=d, kernel="gemm", geo=_GEOMETRIES[2], tiles="small",
                        dtype="float16", data_format="NCX", out=True))
        lay.append(dict(direction=d, kernel="direct", geo=_GEOMETRIES[3], tiles="small",
                        out=True, strided_out=True))
        lay.append(dict(direction=d, kernel="gemm", geo=_GEOMETRIES[3], tiles="small",
                        empty=True))
    g["layouts"] = lay
    return g


def _user_data(a, fmt):
    return np.ascontiguousarray(np.moveaxis(a, -1, 1) if fmt == "NCX" else a)


def _user_filter(w, fmt, g):
    nd = w.ndim - 2
    if fmt == "OIX":
        return np.ascontiguousarray(np.moveaxis(w, (-1, -2), (0, 1)))
    if fmt == "XIM":
        return np.ascontiguousarray(w.reshape((*w.shape[:nd], g, w.shape[-1] // g)))
    return w


def _canon_result(r, direction, data_format, filter_format, g):
    nd = r.ndim - 2
    if direction == "bwd_w":
        if filter_format == "OIX":
            return np.moveaxis(r, (0, 1), (-1, -2))
        if filter_format == "XIM":
            return r.reshape((*r.shape[:nd], 1, -1))
        return r
    return np.moveaxis(r, 1, -1) if data_format == "NCX" else r


def _run_case(case):
    from numba import cuda
    from numbaconv import config, reference
    from numbaconv.backends import cuda as backend
    from numbaconv.problem import ConvProblem

    bm, bn, bk, tm, tn = _TILES[case["tiles"]]
    config.CUDA_BLOCK_M, config.CUDA_BLOCK_N, config.CUDA_BLOCK_K = bm, bn, bk
    config.CUDA_THREAD_M, config.CUDA_THREAD_N = tm, tn
    config.CUDA_THREADS = 16
    config.CUDA_SPLIT_MIN_PIXELS = 2          # several weight-gradient splits
    # forward/backward data split K only where asked (every layer is "too few blocks")
    config.CUDA_MIN_BLOCKS = 10 ** 6 if case.get("split") else 1
    config.CUDA_SPLIT_MIN_SLICES = 1
    config.CUDA_DEPTHWISE_PATCH = 0 if case.get("rows") else 1
    mb, g, ic, oc, isz, ksz, st, dl, pb, pe = case["geo"]
    if case.get("empty"):
        mb = 0
    direction, dtype = case["direction"], case.get("dtype", "float64")
    dfmt, ffmt = case.get("data_format", "NXC"), case.get("filter_format", "XIO")
    nd = len(isz)
    osz = reference.out_size(isz, ksz, st, dl, pb, pe)
    lift = lambda v, f: (f,) * (3 - nd) + tuple(v)  # noqa: E731
    p = ConvProblem(direction, mb, g, ic, oc, lift(isz, 1), lift(ksz, 1), lift(osz, 1),
                    lift(st, 1), lift(dl, 1), lift(pb, 0), lift(pe, 0), nd, dtype, dfmt, ffmt,
                    op="test")
    rng = np.random.default_rng(len(str(case)))
    x = rng.uniform(-1, 1, (mb, *isz, ic)).astype(dtype)
    w = rng.uniform(-1, 1, (*ksz, ic // g, oc)).astype(dtype)
    dy = rng.uniform(-1, 1, (mb, *osz, oc)).astype(dtype)
    if direction == "fwd":
        f = lambda a, b: reference.conv_fwd(a, b, st, dl, pb, pe, g)  # noqa: E731
        args, ops = (x, w), {"x": _user_data(x, dfmt), "w": _user_filter(w, ffmt, g)}
    elif direction == "bwd_d":
        f = lambda a, b: reference.conv_bwd_data(a, b, isz, st, dl, pb, pe, g)  # noqa: E731
        args, ops = (dy, w), {"dy": _user_data(dy, dfmt), "w": _user_filter(w, ffmt, g)}
    else:
        f = lambda a, b: reference.conv_bwd_filter(a, b, ksz, st, dl, pb, pe, g)  # noqa: E731
        args, ops = (x, dy), {"x": _user_data(x, dfmt), "dy": _user_data(dy, dfmt)}
    ref = f(*args)
    ref_abs = f(*(np.abs(a) for a in args))
    variant = ""
    if case.get("precision") == "tf32":
        import dataclasses
        p = dataclasses.replace(p, precision="tf32")
        variant = "tf32"
    tiles = backend.plan_tiles(p, case["kernel"])
    if variant and backend.tf32_declines(p, tiles) is not None:
        return f"gemm[tf32] declines: {backend.tf32_declines(p, tiles)}"
    if case.get("loader"):
        why = backend.async_declines(p, tiles)
        if why is not None:
            return f"gemm[tf32-async] declines: {why}"
        tiles, variant = backend.async_tiles(p, tiles), "tf32-async"
    plan = types.SimpleNamespace(problem=p, tiles=tiles, variant=variant)
    if case["kernel"] == "direct" and (tiles.get("variant") == "patch") != (
            not case.get("rows") and backend.depthwise_patch(p) is not None):
        return f"expected the {'row' if case.get('rows') else 'patch'} kernel: {tiles}"
    if case.get("split") and direction != "bwd_w" and plan.tiles["splits"] < 2:
        return f"expected a split K, got tiles {plan.tiles}"
    out = None
    if case.get("out"):
        out = cuda.to_device(np.full(p.result_shape, np.nan, dtype))
    if case.get("strided_out"):
        # a non-contiguous out: every other element of a wider device array
        big = cuda.to_device(np.full((*p.result_shape[:-1], 2 * p.result_shape[-1]), np.nan,
                                     dtype))
        # (numba's real device arrays take no Ellipsis in an index; the simulator's do)
        out = big[(slice(None),) * (big.ndim - 1) + (slice(None, None, 2),)]
    dev = {k: cuda.to_device(v) for k, v in ops.items()}
    if case.get("misaligned"):
        # each operand one element into a larger device array: 4-byte aligned only
        for k, v in ops.items():
            big = cuda.to_device(np.concatenate([np.zeros(1, v.dtype), v.ravel()]))
            dev[k] = big[1:].reshape(v.shape)
    res = backend.execute(plan, dev, out=out)
    if out is not None and res is not out:
        return "out= was not returned"
    got = res.copy_to_host()
    if got.dtype != np.dtype(dtype) or got.shape != tuple(p.result_shape):
        return f"got {got.dtype}{got.shape}, expected {dtype}{tuple(p.result_shape)}"
    got = _canon_result(got, direction, dfmt, ffmt, g)
    if case.get("empty"):
        return None if not np.any(got) else "empty problem: result not zero"
    err = reference.normalized_error(got.astype(np.float64), ref, ref_abs)
    tol = reference.TF32_TOLERANCE if variant.startswith("tf32") else reference.TOLERANCE[dtype]
    if not err <= tol:
        return f"error {err:.3g} > {tol:.0e} (tiles {dict(plan.tiles)})"
    return None


#: Run first by every child that may run kernels in the simulator (see tests/_cudasim.py).
_SIM_PRELUDE = "import sys; sys.path.insert(0, 'tests'); import _cudasim; _cudasim.setup()\n"


def _child(group):
    sys.path.insert(0, os.path.dirname(HERE))
    import _cudasim
    _cudasim.setup()
    failures = []
    for case in _groups()[group]:
        why = _run_case(case)
        print(("FAIL " if why else "ok   ") + repr(case) + (f": {why}" if why else ""))
        if why:
            failures.append(why)
    return 1 if failures else 0


# -- the parent (pytest) ---------------------------------------------------------------------
def _env():
    """The children's environment: the simulator unless a usable GPU is present."""
    env = dict(os.environ)
    if "NUMBA_ENABLE_CUDASIM" not in env:
        probe = subprocess.run([sys.executable, "-c",
                                "from numba import cuda; print(cuda.is_available())"],
                               capture_output=True, text=True, env=env, timeout=120)
        env["NUMBA_ENABLE_CUDASIM"] = "0" if probe.stdout.strip() == "True" else "1"
    return env


@pytest.fixture(scope="module")
def children():
    env = _env()
    procs = {name: subprocess.Popen([sys.executable, HERE, name], cwd=ROOT, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
             for name in _groups()}
    yield procs
    for p in procs.values():
        if p.poll() is None:
            p.kill()


@pytest.mark.parametrize("group", sorted(_groups()))
def test_kernels_match_reference(children, group):
    proc = children[group]
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out


_API_CODE = """
import numpy as np
from numba import cuda
import numbaconv
rng = np.random.default_rng(0)
# one image each: the simulator runs every thread in Python
x = rng.standard_normal((1, 7, 6, 8))
w = rng.standard_normal((3, 3, 4, 6))
dy = rng.standard_normal((1, 4, 3, 6))
kw = dict(strides=(2, 2), pads_begin=(1, 0), pads_end=(1, 1), groups=2)
calls = [
    ("convolution", (x, w), kw),
    ("convolution_backprop_data", (dy, w, (7, 6)), kw),
    ("convolution_backprop_filters", (x, (3, 3), dy), kw),
    ("conv2d_backprop_input", ((1, 8, 6, 8), rng.standard_normal((3, 3, 8, 5)),
                               rng.standard_normal((1, 8, 6, 5))), dict(strides=1, padding="SAME")),
]
worst = 0.0
for name, args, kwargs in calls:
    fn = getattr(numbaconv, name)
    dev = tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args)
    got = fn(*dev, **kwargs).copy_to_host()
    want = fn(*args, **kwargs)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    # the memoised call (no parsing, no planning) on new arrays, then into out=, twice
    dev2 = tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args)
    assert np.array_equal(fn(*dev2, **kwargs).copy_to_host(), got), name
    out = cuda.device_array(want.shape, want.dtype)
    for _ in range(2):
        assert fn(*dev2, **kwargs, out=out) is out, name
        assert np.array_equal(out.copy_to_host(), got), name
    worst = max(worst, float(np.max(np.abs(got - want)) / np.max(np.abs(want))))
print(f"worst {worst:.3g}")
"""


def test_public_ops_take_device_arrays():
    """The public ops, called with device arrays (the simulator's without a GPU), match the
    same calls with NumPy arrays: the front ends' parsing of device arrays included; the
    memoised calls that follow (new arrays, ``out=``) give the same bits."""
    r = subprocess.run([sys.executable, "-c", _SIM_PRELUDE + _API_CODE], capture_output=True,
                       text=True,
                       env=_env(), cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    worst = float(r.stdout.split()[-1])
    assert worst < 1e-12, r.stdout


_REPLAY_CODE = """
import numpy as np
from numba import cuda
import numbaconv
from numbaconv.api import _op
from numbaconv.backends import cuda as backend

sim = backend.simulator()


class Foreign:
    # a device array known only by its __cuda_array_interface__ (as CuPy's and PyTorch's
    # are), naming a stream handle or none
    def __init__(self, a, stream=None):
        self.a, self.stream_handle = a, stream

    @property
    def __cuda_array_interface__(self):
        d = dict(self.a.__cuda_array_interface__)
        d["stream"] = self.stream_handle
        return d


def dev(a, stream=None):
    d = cuda.to_device(np.ascontiguousarray(a))
    return d if sim else Foreign(d, stream)


def host(r):
    return (r.a if isinstance(r, Foreign) else r).copy_to_host()


rng = np.random.default_rng(2)
f32 = lambda *s: rng.standard_normal(s).astype(np.float32)
# the simulator runs every thread in Python: one 4x4 image there (half the GEMM's blocks)
mb, hw = (1, 4) if sim else (2, 6)
x, w, dy = f32(mb, hw, hw, 8), f32(3, 3, 8, 8), f32(mb, hw, hw, 8)
wd = f32(3, 3, 8, 1)
cases = [  # (function, host arguments, keywords): canonical, gather + scatter, split, depthwise
    (numbaconv.conv2d, (x, w, 1, "SAME"), {}),
    (numbaconv.conv2d_backprop_input, ((mb, hw, hw, 8), w, dy, 1, "SAME"), {}),
    (numbaconv.conv2d_backprop_filter, (x, (3, 3, 8, 8), dy, 1, "SAME"), {}),
    (numbaconv.conv2d, (f32(2, 4, 5, 5), f32(3, 3, 4, 6), 1, "SAME"), dict(data_format="NCHW")),
    (numbaconv.depthwise_conv2d_native_backprop_filter, (x, (3, 3, 8, 1), dy, [1, 1, 1, 1],
                                                         "SAME"), {}),
    (numbaconv.depthwise_conv2d_native_backprop_input, ((mb, hw, hw, 8), wd, dy, [1, 1, 1, 1],
                                                        "SAME"), {}),
    (numbaconv.conv2d, (x.astype(np.float16), w.astype(np.float16), 1, "SAME"), {}),
]
rounds = 3
if sim:  # (no replay in the simulator, which runs every thread in Python: the general path)
    cases, rounds = [cases[0], cases[3], cases[6]], 2
worst = 0.0
for fn, args, kw in cases:
    want = fn(*args, **kw)
    first = None
    for rnd in range(rounds):  # new operands (new addresses) each round: memoised calls
        d = tuple(dev(a) if isinstance(a, np.ndarray) else a for a in args)
        got = host(fn(*d, **kw))
        first = got if first is None else first
        assert np.array_equal(got, first), (fn.__name__, rnd)
        o = dev(np.zeros(want.shape, want.dtype))
        assert fn(*d, **kw, out=o) is o, fn.__name__
        assert np.array_equal(host(o), first), (fn.__name__, rnd, "out=")
    err = float(np.max(np.abs(first.astype(np.float64) - want)) / np.max(np.abs(want)))
    worst = max(worst, err / (100 if want.dtype == np.float16 else 1))
# out= that is an operand: the result of the operand's values before the call
want = numbaconv.conv2d(x, w, 1, "SAME")
for rnd in range(rounds):
    dx_ = dev(x)
    assert numbaconv.conv2d(dx_, dev(w), 1, "SAME", out=dx_) is dx_
    worst = max(worst, float(np.max(np.abs(host(dx_) - want)) / np.max(np.abs(want))))
if not sim:
    # operands naming a stream: the kernels and the result go on it
    s = cuda.stream()
    h = backend.stream_handle(s)
    for rnd in range(3):
        r = numbaconv.conv2d(dev(x, h), dev(w, h), 1, "SAME")
        assert backend.stream_handle(r.stream) == h, r.stream
        s.synchronize()
        worst = max(worst, float(np.max(np.abs(r.copy_to_host() - want)) / np.max(np.abs(want))))
    # results without out= come from the pool: a dropped result's memory serves the
    # next call on its stream; a view of a result keeps it
    import gc
    xa, wa = cuda.to_device(x), cuda.to_device(w)
    r = numbaconv.conv2d(xa, wa, 1, "SAME")
    a0 = backend.device_pointer(r)
    del r
    gc.collect()
    r = numbaconv.conv2d(xa, wa, 1, "SAME")
    assert backend.device_pointer(r) == a0
    v = r[1:]
    del r
    gc.collect()
    r2 = numbaconv.conv2d(xa, wa, 1, "SAME")
    assert backend.device_pointer(r2) != a0
    cuda.synchronize()
    for got in (v.copy_to_host(), r2.copy_to_host()[1:]):
        worst = max(worst, float(np.max(np.abs(got - want[1:])) / np.max(np.abs(want))))
    replayed = sum(1 for e in _op._MEMO.values() if e[4] is not None and e[4][1].fast)
    assert replayed >= len(cases), replayed  # the memoised calls replayed their launches
print(f"worst {worst:.3g}")
"""


def test_memoised_calls_replay_launches():
    """Memoised device calls (new operands each time; on a GPU foreign arrays known by
    their ``__cuda_array_interface__``; with and without ``out=``; canonical layouts,
    gather and scatter, split-K, depthwise rows, float16) give the bits of the first call
    and the reference's values; ``out=`` is returned as given; an ``out=`` that is an
    operand gets the result of the operand's values; operands naming a stream put the
    kernels and the result on it; a dropped result's memory serves the next call, a
    view of a result keeps it. On a GPU the memoised calls replay their recorded
    launches through the driver (checked); in the simulator they take the general path."""
    r = subprocess.run([sys.executable, "-c", _SIM_PRELUDE + _REPLAY_CODE], capture_output=True,
                       text=True,
                       env=_env(), cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert float(r.stdout.split()[-1]) < 1e-5, r.stdout


_STREAM_CODE = """
import numpy as np
from numba import cuda
import numbaconv
rng = np.random.default_rng(1)
x = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)   # NCHW: gather and scatter run
w = rng.standard_normal((3, 3, 4, 6)).astype(np.float32)
dy = rng.standard_normal((2, 6, 5, 5)).astype(np.float32)
s = cuda.stream()
dx_, dw_, ddy = cuda.to_device(x, stream=s), cuda.to_device(w, stream=s), cuda.to_device(dy, stream=s)
worst = 0.0
calls = [
    (numbaconv.conv2d, (dx_, dw_, 1, "SAME"), (x, w, 1, "SAME")),
    (numbaconv.conv2d_backprop_input, ((2, 4, 5, 5), dw_, ddy, 1, "SAME"),
     ((2, 4, 5, 5), w, dy, 1, "SAME")),
    (numbaconv.conv2d_backprop_filter, (dx_, (3, 3, 4, 6), ddy, 1, "SAME"),
     (x, (3, 3, 4, 6), dy, 1, "SAME")),
]
for fn, dargs, hargs in calls:
    got = fn(*dargs, data_format="NCHW", stream=s)
    assert got.stream is s, (fn.__name__, got.stream)
    s.synchronize()
    want = fn(*hargs, data_format="NCHW")
    worst = max(worst, float(np.max(np.abs(got.copy_to_host() - want)) / np.max(np.abs(want))))
try:
    numbaconv.conv2d(dx_, dw_, 1, "SAME", data_format="NCHW", stream=object())
except TypeError as exc:
    assert str(exc).startswith("stream: "), exc
else:
    raise AssertionError("a bad stream was accepted")
print(f"worst {worst:.3g}")
"""


def test_public_stream_keyword_on_device():
    """``stream=`` through the public ops with device arrays (the simulator's without a
    GPU): the result belongs to the given numba stream and matches the host call; an
    object that is no stream is a TypeError naming ``stream``."""
    r = subprocess.run([sys.executable, "-c", _SIM_PRELUDE + _STREAM_CODE], capture_output=True,
                       text=True,
                       env=_env(), cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert float(r.stdout.split()[-1]) < 1e-5, r.stdout


def test_no_gpu_is_a_clear_error():
    """A device array without a usable GPU: RuntimeError naming the argument, no crash."""
    code = """
import numpy as np
from numba import cuda
from numbaconv.backends import cuda as backend
if cuda.is_available():
    print("GPU")
else:
    class Fake:
        __cuda_array_interface__ = {"shape": (1, 4, 4, 1), "typestr": "<f4", "data": (0, False),
                                    "version": 3, "strides": None}
    try:
        backend.as_device_array(Fake(), "input")
    except RuntimeError as exc:
        assert "input" in str(exc) and "GPU" in str(exc), exc
        print("RuntimeError")
"""
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    if r.stdout.strip() == "GPU":
        pytest.skip("a GPU is present")
    assert r.stdout.strip() == "RuntimeError", r.stdout + r.stderr


def test_simulator_shared_arrays_are_one_per_block_line():
    """The children's fix for the simulator (tests/_cudasim.py): threads of a block that
    ask for the same shared array at the same time get one array. Without it, two
    threads that both miss the simulator's lookup get two (forced here by a slow
    ``np.empty``), and a correct kernel computes a wrong result in the simulator."""
    kernelapi = pytest.importorskip("numba.cuda.simulator.kernelapi")
    import threading
    import time
    sys.path.insert(0, os.path.dirname(HERE))
    import _cudasim

    def arrays(cls, module):
        shared = cls(0)
        got, start = [], threading.Barrier(4)
        slow = lambda *a, **k: (time.sleep(0.02), np.empty(*a, **k))[1]  # noqa: E731

        def thread():
            start.wait()
            got.append(shared.array((4,), np.float32))

        old = module.np
        module.np = types.SimpleNamespace(empty=slow, frombuffer=np.frombuffer)
        try:
            ts = [threading.Thread(target=thread) for _ in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        finally:
            module.np = old
        return len({id(a) for a in got})

    plain = type("Plain", (kernelapi.FakeCUDAShared,), {})
    assert arrays(plain, kernelapi) > 1  # the simulator's own lookup races
    locked = type("Locked", (kernelapi.FakeCUDAShared,), {})
    _cudasim.lock_shared_arrays(locked)
    assert arrays(locked, _cudasim) == 1


_POLL_CODE = """
import types
import numpy as np
import numba.cuda as numba_cuda
from numba import cuda, float32
from numba.cuda.simulator import kernel
assert kernel.BlockManager._polled_by_numbaconv_tests


@cuda.jit
def tree_sum(a, out):  # a block's sum through shared memory: one barrier per level
    s = cuda.shared.array(64, float32)
    i = cuda.threadIdx.x
    s[i] = a[cuda.blockIdx.x * 64 + i]
    cuda.syncthreads()
    step = 32
    while step > 0:
        if i < step:
            s[i] += s[i + step]
        cuda.syncthreads()
        step //= 2
    if i == 0:
        out[cuda.blockIdx.x] = s[0]


@cuda.jit
def fails(a):
    cuda.syncthreads()
    if cuda.threadIdx.x == 5:
        a[a.size + 100] = 1.0  # out of bounds: the simulator raises IndexError
    cuda.syncthreads()


other = types.ModuleType("other")  # device functions of another module: its own globals
exec(chr(10).join(["from numba import cuda", "@cuda.jit(device=True)", "def lane():",
                   "    return cuda.threadIdx.x"]), other.__dict__)


@cuda.jit(device=True)
def twice_lane():
    return 2 * other.lane()


@cuda.jit
def lanes(out):
    out[cuda.blockIdx.x * 32 + cuda.threadIdx.x] = twice_lane()


got = np.zeros(64, np.int64)
lanes[2, 32](got)
assert np.array_equal(got, 2 * np.tile(np.arange(32), 2)), got
assert kernel.FakeCUDAKernel._cheap_calls_by_numbaconv_tests
assert cuda is numba_cuda and other.cuda is numba_cuda  # both modules restored
a = np.arange(192, dtype=np.float32)
out = np.zeros(3, np.float32)
tree_sum[3, 64](a, out)
assert np.array_equal(out, a.reshape(3, 64).sum(axis=1)), out
try:
    fails[2, 32](np.zeros(4, np.float32))
except IndexError:
    print("raised")
"""


def test_simulator_polls_blocks_and_keeps_their_semantics():
    """The children's other fixes (tests/_cudasim.py): device functions, called through
    names found once per module, still see the kernel's thread indices, also from
    another module's device function, and both modules get the real ``cuda`` back; the
    simulator's polling of a block's threads, replaced by one that sleeps between looks,
    still releases every ``syncthreads`` (a tree sum over 64 threads: one barrier per
    level) and still raises the exception of a thread that fails between two barriers."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    r = subprocess.run([sys.executable, "-c", _SIM_PRELUDE + _POLL_CODE], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split()[-1] == "raised", r.stdout


def test_import_needs_no_cuda():
    """Importing numbaconv (and its CUDA backend module) never imports numba.cuda."""
    code = ("import sys, numbaconv, numbaconv.backends.cuda as b\n"
            "t = b.plan_tiles\n"
            "print('numba.cuda' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.stdout.strip() == "False", r.stdout + r.stderr


def test_plan_tiles_defaults():
    from numbaconv.backends import cuda as backend
    from numbaconv.problem import ConvProblem

    p = ConvProblem("bwd_w", 8, 1, 64, 64, (1, 56, 56), (1, 3, 3), (1, 56, 56), (1, 1, 1),
                    (1, 1, 1), (0, 1, 1), (0, 1, 1), 2, "float32")
    t = backend.plan_tiles(p)
    assert t["kernel"] == "gemm" and t["threads"] == 256 and t["splits"] > 1
    assert t["shared_bytes"] <= backend.MAX_STATIC_SHARED
    assert backend.workspace_bytes(p, t) == t["splits"] * 9 * 64 * 64 * 4
    q = ConvProblem("bwd_d", 8, 32, 32, 32, (1, 28, 28), (1, 3, 3), (1, 14, 14), (1, 2, 2),
                    (1, 1, 1), (0, 0, 0), (0, 1, 1), 2, "float32")
    assert backend.plan_tiles(q)["kernel"] == "direct"
    assert backend.plan_tiles(q, "gemm")["phases"] == 4


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
