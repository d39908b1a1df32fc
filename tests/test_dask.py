"""numbaconv.dask on a real cluster: a ``distributed.LocalCluster`` of two worker processes.

Every op and pass on batch, spatial, channel-group and mixed chunks (uneven chunks, chunks
smaller than the filter's reach, strides 2 and 3 with chunk borders off the stride grid,
dilation, every padding mode) against the NumPy API on the same data, within
docs/contract.md section 10's tolerance (and, for channels-last XIO problems, against the
float64 reference of tests/reference.py too); the weight gradient bit for bit across runs;
the errors; the worker set-up; a worker killed during a computation.

The problems are small: under ``numbaconv.config.SMALL_FLOPS`` the planner runs the
``numpy`` entry, which compiles nothing, in the workers and here.
"""
import os
import signal
import time

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

import numbaconv as nc  # noqa: E402
import numbaconv.dask as ncd  # noqa: E402
from numbaconv.dask import _geometry as geo, _worker  # noqa: E402
from reference import (TOL, conv_bwd_data_ref, conv_bwd_filter_ref, conv_fwd_ref,  # noqa: E402
                       normalized_error, onednn_pads)

# the tests' problems stay under config.SMALL_FLOPS here as in the workers (conftest.py
# turns that rule off for the other test files)
pytestmark = pytest.mark.small_problem_rule

F16, F32, F64 = np.float16, np.float32, np.float64


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("numba-cache"))
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=40)
    cl = distributed.Client(cluster)
    cl.register_plugin(ncd.NumbaconvSetup(strategies=("numpy",), cache_dir=cache))
    cl.test_cache_dir = cache
    yield cl
    cl.close()
    cluster.close()


def _scale(fn, ops):
    """max of the NumPy API's result on |operands| in float64 (docs/contract.md s. 10)."""
    absops = [np.abs(np.asarray(o, F64)) if isinstance(o, np.ndarray) else o for o in ops]
    return float(np.max(np.abs(fn(nc, *absops)))) if absops else 1.0


def check(pairs):
    """``pairs``: ``(fn, numpy operands, dask operands)``; ``fn(module, *operands)`` calls
    the op of ``numbaconv`` or ``numbaconv.dask``. Computes every Dask result in one go and
    compares each with the NumPy API's."""
    lazies = [fn(ncd, *dops) for fn, _, dops in pairs]
    for lazy in lazies:
        assert isinstance(lazy, da.Array)
        assert type(lazy._meta) is np.ndarray
    results = dask.compute(*lazies)
    for (fn, ops, _), lazy, got in zip(pairs, lazies, results):
        want = fn(nc, *ops)
        assert lazy.shape == want.shape and lazy.dtype == want.dtype
        assert got.shape == want.shape and got.dtype == want.dtype
        assert tuple(sum(c) for c in lazy.chunks) == want.shape
        if want.size == 0:
            continue
        scale = _scale(fn, ops)
        err = float(np.max(np.abs(got.astype(F64) - want.astype(F64)))) / scale
        assert err <= TOL[np.dtype(want.dtype)], (fn.__name__, err)
    return results


def _fit(chunks, shape):
    """Chunks for ``shape``: an int as Dask takes it; a tuple of sizes cut at the axis' end,
    the rest of the axis as a last chunk."""
    out = []
    for c, n in zip(chunks, shape):
        if isinstance(c, int):
            out.append(c)
            continue
        sizes, total = [], 0
        for v in c:
            if total + v < n:
                sizes.append(v)
                total += v
        out.append(tuple(sizes) + (n - total,))
    return tuple(out)


def _data(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


# -- geometry: the windows against their definitions ----------------------------------------
def test_windows_match_the_definition_of_the_taps():
    """Every window of every small axis: the rows it names are exactly those the taps
    reach, and the pads it gives make an EXPLICIT call of the right size."""
    for I in range(1, 9):
        for k, d, s in [(1, 1, 3), (2, 1, 2), (3, 2, 1), (3, 1, 3), (2, 3, 2)]:
            dk = (k - 1) * d + 1
            for pb in range(3):
                for pe in range(3):
                    if I + pb + pe < dk:
                        continue
                    O = (I + pb + pe - dk) // s + 1
                    for i0 in range(I):
                        for i1 in range(i0 + 1, I + 1):
                            rows = {o * s - pb + t * d for o in range(O) for t in range(k)}
                            reach = {o for o in range(O) for t in range(k)
                                     if i0 <= o * s - pb + t * d < i1}
                            w = geo.bwd_data_window(i0, i1, O, s, pb, dk)
                            if w is None:
                                assert not reach
                                continue
                            c0, c1, a, b, p0, p1 = w
                            assert reach <= set(range(c0, c1)) and i0 <= a < b <= i1
                            assert {r for r in rows if i0 <= r < i1} <= set(range(a, b))
                            assert geo.explicit_out(b - a, s, dk, p0, p1) == c1 - c0
                            assert min(p0, p1) >= 0
                    for o0 in range(O):
                        for o1 in range(o0 + 1, O + 1):
                            need = {o * s - pb + t * d for o in range(o0, o1)
                                    for t in range(k)} & set(range(I))
                            w = geo.fwd_window(o0, o1, I, s, pb, dk)
                            if w is None:
                                assert not need
                                continue
                            c0, c1, p0, p1 = w
                            assert need <= set(range(c0, c1)) and min(p0, p1) >= 0
                            assert geo.explicit_out(c1 - c0, s, dk, p0, p1) == o1 - o0


# -- the generic ops on every kind of chunks ------------------------------------------------
# (id, n, spatial, C, kernel, K, strides, dilations, pads or auto_pad, groups, dtype,
#  x chunks, dy chunks (None: one chunk per chunk of x, as the forward output has))
GENERIC = [
    ("batch-same-f32", 6, (8, 7), 4, (3, 3), 5, 1, 1, "same_upper", 1, F32,
     (2, 8, 7, 4), (4, 8, 7, 5)),
    ("spatial-uneven-reach-f64", 2, (13, 11), 3, (5, 3), 4, 1, (2, 1), ((3, 0), (1, 4)), 1,
     F64, (2, (5, 4, 4), (6, 3, 2), 3), (1, (3, 6, 4), (4, 4, 6), 4)),
    ("stride2-offgrid-f32", 3, (13, 10), 2, (3, 3), 3, 2, 1, ((1, 2), (0, 1)), 1, F32,
     (3, (3, 4, 6), (1, 5, 4), 2), (1, (2, 3, 2), (3, 3), 3)),
    ("stride3-dil2-lower-f64", 2, (14, 9), 2, (3, 2), 2, 3, 2, "same_lower", 1, F64,
     (2, (2, 5, 7), (4, 5), 2), (2, (1, 2, 2), (2, 1), 2)),
    ("stride3-1x1-valid-f32", 2, (11, 8), 3, (1, 1), 2, (3, 2), 1, "valid", 1, F32,
     (1, (4, 4, 3), (3, 5), 3), (2, (2, 2), (1, 3), 2)),
    ("big-pads-f32", 1, (5, 4), 2, (3, 3), 2, 2, 1, ((6, 5), (4, 7)), 1, F32,
     (1, (2, 3), (1, 3), 2), (1, (3, 2, 2), (4, 3), 2)),
    ("1d-tiny-chunks-f16", 3, (17,), 2, (4,), 3, 2, 1, ((2, 1),), 1, F16,
     (2, (1,) * 17, 2), (3, (2, 3, 1, 2), 3)),
    ("3d-f32", 2, (7, 6, 9), 2, (3, 2, 3), 3, (1, 2, 2), (2, 1, 1), ((2, 2), (1, 0), (0, 2)),
     1, F32, (1, (3, 4), (2, 4), (5, 4), 2), (2, (2, 1, 2), (2, 2), (3, 2), 3)),
    ("groups-channel-chunks-f64", 4, (9, 8), 8, (3, 3), 12, 2, 1, "same_upper", 4, F64,
     (2, (4, 5), (8,), (2, 4, 2)), (4, (3, 2), (4,), (6, 3, 3))),
    ("depthwise-channel-chunks-f16", 2, (10, 9), 4, (3, 3), 8, 1, 2, "same_upper", 4, F16,
     (1, (6, 4), (3, 6), (1, 3)), (2, (5, 5), (9,), (4, 2, 2))),
]


def _generic_kw(case):
    (_, _, sp, _, ks, _, strides, dilations, pads, groups, *_rest) = case
    kw = dict(strides=strides, dilations=dilations, groups=groups)
    if isinstance(pads, str):
        kw["auto_pad"] = pads
    else:
        kw["pads_begin"] = [p[0] for p in pads]
        kw["pads_end"] = [p[1] for p in pads]
    return kw


@pytest.mark.parametrize("case", GENERIC, ids=[c[0] for c in GENERIC])
def test_generic_ops_on_chunks(client, case, rng):
    _, n, sp, c, ks, k, strides, dilations, pads, groups, dtype, xch, dych = case
    kw = _generic_kw(case)
    x = _data(rng, (n, *sp, c), dtype)
    w = _data(rng, (*ks, c // groups, k), dtype)
    y = nc.convolution(x, w, **kw)
    dy = _data(rng, y.shape, dtype)
    X = da.from_array(x, chunks=_fit(xch, x.shape))
    DY = da.from_array(dy, chunks=_fit(dych, dy.shape))

    def fwd(m, x, w):
        return m.convolution(x, w, **kw)

    def bwd_d(m, dy, w):
        return m.convolution_backprop_data(dy, w, sp, **kw)

    def bwd_w(m, x, dy):
        return m.convolution_backprop_filters(x, ks, dy, **kw)

    got_y, got_dx, got_dw = check([(fwd, (x, w), (X, w)), (bwd_d, (dy, w), (DY, w)),
                                   (bwd_w, (x, dy), (X, DY))])
    # and against the independent float64 reference
    nd = len(sp)
    s = (strides,) * nd if isinstance(strides, int) else strides
    dl = (dilations,) * nd if isinstance(dilations, int) else dilations
    if isinstance(pads, str):
        pb, pe = onednn_pads(pads, sp, ks, s, dl, None, None)
    else:
        pb, pe = [p[0] for p in pads], [p[1] for p in pads]
    geom = dict(stride=s, dilation=dl, pads_begin=pb, pads_end=pe, groups=groups)
    tol = TOL[np.dtype(dtype)]
    assert normalized_error(got_y, conv_fwd_ref, x, w, **geom) <= tol
    assert normalized_error(got_dx, conv_bwd_data_ref, dy, w, sp, **geom) <= tol
    assert normalized_error(got_dw, conv_bwd_filter_ref, x, dy, ks, **geom) <= tol


def test_layouts_ncx_oix_and_output_padding(client, rng):
    """Channels-first data, OIX filters, channel-group chunks along axis 1; backward data
    with output_padding and without output_shape."""
    x = _data(rng, (3, 6, 11, 10), F32)
    w = _data(rng, (4, 3, 3, 2), F32)  # OIX, groups 2
    kw = dict(strides=[2, 3], pads_begin=[1, 0], pads_end=[0, 2], dilations=[1, 2], groups=2,
              data_format="NCX", filter_format="OIX")
    y = nc.convolution(x, w, **kw)
    dy = _data(rng, y.shape, F32)
    X = da.from_array(x, chunks=(2, 3, (4, 7), (3, 3, 4)))
    DY = da.from_array(dy, chunks=_fit((3, 2, (2, 4), (1, 2)), dy.shape))
    W = da.from_array(w, chunks=(1, 3, 2, 2))  # a chunked Dask filter is read whole

    def fwd(m, x, w):
        return m.convolution(x, w, **kw)

    def bwd_d(m, dy, w):
        return m.convolution_backprop_data(dy, w, output_padding=[1, 2], **kw)

    def bwd_w(m, x, dy):
        return m.convolution_backprop_filters(x, [4, 3, 3, 2], dy, **kw)

    # output_padding under the dilation: trailing rows that no output row reaches
    dy1 = _data(rng, (2, 9, 3), F32)
    w1 = _data(rng, (2, 2, 3), F32)

    def bwd_d_dilated(m, dy, w):
        return m.convolution_backprop_data(dy, w, strides=1, dilations=3, output_padding=2,
                                           pads_begin=1, pads_end=0)

    check([(fwd, (x, w), (X, W)), (bwd_d, (dy, w), (DY, w)), (bwd_w, (x, dy), (X, DY)),
           (bwd_d_dilated, (dy1, w1), (da.from_array(dy1, chunks=(1, (2, 3, 4), 3)), w1))])


# -- the TF-style names ---------------------------------------------------------------------
def test_tf_style_2d_ops(client, rng):
    x = _data(rng, (4, 12, 9, 3), F32)
    w = _data(rng, (3, 3, 3, 4), F32)
    dy = _data(rng, (4, 6, 5, 4), F32)
    X = da.from_array(x, chunks=(3, (5, 7), (4, 5), 3))
    DY = da.from_array(dy, chunks=(2, (2, 4), (3, 2), 4))
    xc = np.ascontiguousarray(np.moveaxis(x, -1, 1))  # NCHW
    dyc = _data(rng, (4, 4, 5, 4), F64)
    xc64 = xc.astype(F64)
    XC = da.from_array(xc64, chunks=(2, 3, (6, 6), (2, 3, 4)))
    DYC = da.from_array(dyc, chunks=(4, 4, (2, 3), (1, 3)))
    w64 = w.astype(F64)
    expl = [0, 0, 0, 0, 2, 1, 0, 3]
    dm = _data(rng, (3, 3, 3, 2), F32)  # depthwise, multiplier 2
    dyd = _data(rng, (4, 4, 3, 6), F32)
    DYD = da.from_array(dyd, chunks=(4, (3, 1), (2, 1), (4, 2)))
    XD = da.from_array(x, chunks=(2, (8, 4), (5, 4), (2, 1)))

    def conv2d(m, x, w):
        return m.conv2d(x, w, [1, 2, 2, 1], "SAME")

    def conv2d_nchw(m, x, w):
        return m.conv2d(x, w, 3, "EXPLICIT", data_format="NCHW", explicit_paddings=expl)

    def bp_input(m, dy, w):
        return m.conv2d_backprop_input([4, 12, 9, 3], w, dy, 2, "SAME")

    def bp_input_v2(m, dy, w):
        return m.conv2d_backprop_input_v2(np.zeros((4, 12, 9, 3), dy.dtype), w, dy, 2, "SAME")

    def bp_filter(m, x, dy):
        return m.conv2d_backprop_filter(x, [3, 3, 3, 4], dy, 2, "SAME")

    def bp_filter_v2(m, x, dy):
        return m.conv2d_backprop_filter_v2(x, np.zeros((3, 3, 3, 4), x.dtype), dy, 3,
                                           "EXPLICIT", data_format="NCHW",
                                           explicit_paddings=expl)

    def dw_fwd(m, x, w):
        return m.depthwise_conv2d_native(x, w, [1, 3, 2, 1], "VALID", dilations=[1, 1, 2, 1])

    def dw_bp_input(m, dy, w):
        return m.depthwise_conv2d_native_backprop_input([4, 12, 9, 3], w, dy, [1, 3, 2, 1],
                                                        "VALID", dilations=[1, 1, 2, 1])

    def dw_bp_filter(m, x, dy):
        return m.depthwise_conv2d_native_backprop_filter(x, [3, 3, 3, 2], dy, [1, 3, 2, 1],
                                                         "VALID", dilations=[1, 1, 2, 1])

    check([(conv2d, (x, w), (X, w)),
           (conv2d_nchw, (xc64, w64), (XC, w64)),
           (bp_input, (dy, w), (DY, w)),
           (bp_input_v2, (dy, w), (DY, w)),
           (bp_filter, (x, dy), (X, DY)),
           (bp_filter_v2, (xc64, dyc), (XC, DYC)),
           (dw_fwd, (x, dm), (XD, da.from_array(dm, chunks=(2, 3, 3, 1)))),
           (dw_bp_input, (dyd, dm), (DYD, dm)),
           (dw_bp_filter, (x, dyd), (XD, DYD))])


def test_tf_style_3d_ops(client, rng):
    x = _data(rng, (2, 7, 8, 6, 2), F16)
    w = _data(rng, (3, 3, 2, 2, 3), F16)
    pads = [[1, 1], [0, 2], [1, 0]]
    y = nc.conv3d(x, w, [1, 2, 3, 1, 1], pads)
    dy = _data(rng, y.shape, F16)
    X = da.from_array(x, chunks=(1, (3, 4), (5, 3), (2, 2, 2), 2))
    DY = da.from_array(dy, chunks=(2, (2, 2), (1, 2), (4, 2), 3))

    def conv3d(m, x, w):
        return m.conv3d(x, w, [1, 2, 3, 1, 1], pads)

    def bp_input(m, dy, w):
        return m.conv3d_backprop_input_v2([2, 7, 8, 6, 2], w, dy, [1, 2, 3, 1, 1], pads)

    def bp_filter(m, x, dy):
        return m.conv3d_backprop_filter_v2(x, [3, 3, 2, 2, 3], dy, [1, 2, 3, 1, 1], pads)

    check([(conv3d, (x, w), (X, w)), (bp_input, (dy, w), (DY, w)),
           (bp_filter, (x, dy), (X, DY))])


# -- the weight gradient's reduction --------------------------------------------------------
def _bwd_w_case(rng, dtype):
    x = _data(rng, (16, 9, 8, 3), dtype)
    dy = _data(rng, (16, 5, 4, 4), dtype)
    X = da.from_array(x, chunks=(3, (4, 5), 8, 3))
    DY = da.from_array(dy, chunks=(3, (3, 2), 4, 4))
    return x, dy, X, DY


def test_weight_gradient_is_bit_identical_across_runs(client, rng, monkeypatch):
    monkeypatch.setattr(ncd, "SPLIT_EVERY", 3)  # 12 partials: a tree of three levels
    x, dy, X, DY = _bwd_w_case(rng, F32)
    dw = ncd.conv2d_backprop_filter(X, [3, 3, 3, 4], DY, 2, "SAME")
    first = dw.compute()
    second = dw.compute()
    again = ncd.conv2d_backprop_filter(X, [3, 3, 3, 4], DY, 2, "SAME").compute()
    assert first.tobytes() == second.tobytes() == again.tobytes()
    want = nc.conv2d_backprop_filter(x, [3, 3, 3, 4], dy, 2, "SAME")
    assert np.max(np.abs(first - want)) <= 1e-5 * _scale(
        lambda m, x, dy: m.conv2d_backprop_filter(x, [3, 3, 3, 4], dy, 2, "SAME"), (x, dy))


def test_reduction_tree_adds_in_key_order():
    """The tree's shape depends only on the number of partials and SPLIT_EVERY; each node
    adds its operands in key order (values where the order shows in float32)."""
    from numbaconv.dask._graph import sum_tree
    vals = [1e8, 1.0, -1e8, 1.0, 3.0, 0.5, -2.0]
    dsk = {("p", i): np.full(2, v, F32) for i, v in enumerate(vals)}
    depth = sum_tree([("p", i) for i in range(7)], ("out", 0), "node", dsk, 3)
    nodes = [k for k in dsk if k[0] == "node"]
    # 7 -> [3, 3, 1] -> the two nodes and the lone last partial -> the root
    assert depth == 2 and len(nodes) == 2
    got = dask.get(dsk, ("out", 0))
    f = [F32(v) for v in vals]
    want = ((f[0] + f[1]) + f[2]) + ((f[3] + f[4]) + f[5]) + f[6]
    assert got.dtype == F32 and np.all(got == want)
    dsk = {("p", i): np.full(2, v, F32) for i, v in enumerate(vals[4:6])}
    assert sum_tree([("p", 0), ("p", 1)], ("out", 0), "node", dsk, 8, out_dtype=F16) == 1
    got = dask.get(dsk, ("out", 0))
    assert got.dtype == F16 and np.all(got == F16(3.5))


def test_weight_gradient_graph_is_partials_and_the_tree():
    """One task per partial and one per node of the tree, the root the result's own key:
    no separate chunk step and no alias tasks between them."""
    x = np.ones((16, 6, 6, 2), F32)
    dy = np.ones((16, 6, 6, 3), F32)
    X = da.from_array(x, chunks=(4, 6, 6, 2))
    DY = da.from_array(dy, chunks=(4, 6, 6, 3))
    dw = ncd.conv2d_backprop_filter(X, [3, 3, 2, 3], DY, 1, "SAME")
    layer = dict(dw.__dask_graph__().layers[dw.name])
    partials = [k for k in layer if "-partials-" in k[0]]
    assert len(partials) == 4
    assert set(layer) - set(partials) == {(dw.name, 0, 0, 0, 0)}
    assert dw.__dask_keys__() == [[[[(dw.name, 0, 0, 0, 0)]]]]


def test_dask_floor_graph_has_the_weight_gradients_shape(client):
    """The benchmark's floor (Dask's own time per computation) times the weight gradient's
    graph with zeros for partials: the same tasks, and it computes zeros."""
    from numbaconv.dask.bench import floor_graph
    X = da.ones((16, 6, 6, 2), F32, chunks=(4, 6, 6, 2))
    DY = da.ones((16, 6, 6, 3), F32, chunks=(4, 6, 6, 3))
    G = floor_graph(X, DY, (3, 3, 2, 3))
    dw = ncd.conv2d_backprop_filter(X, [3, 3, 2, 3], DY, 1, "SAME")
    floor_layer = dict(G.__dask_graph__().layers[G.name])
    dw_layer = dict(dw.__dask_graph__().layers[dw.name])
    assert len(floor_layer) == len(dw_layer) == 5
    assert G.shape == dw.shape and G.chunks == dw.chunks
    got = client.compute(G).result()
    np.testing.assert_array_equal(got, np.zeros((3, 3, 2, 3), F32))


def test_split_every_is_checked(monkeypatch):
    x, w, dy, X, DY = _arrays()
    for bad in (1, 0, 2.5, True, "8"):
        monkeypatch.setattr(ncd, "SPLIT_EVERY", bad)
        with pytest.raises(ValueError, match=r"^numbaconv\.dask\.SPLIT_EVERY: expected an int "
                                             r">= 2"):
            ncd.conv2d_backprop_filter(X, w.shape, DY, 1, "SAME")


def test_float16_partials_are_float32(client, rng):
    x, dy, X, DY = _bwd_w_case(rng, F16)
    dw = ncd.conv2d_backprop_filter(X, [3, 3, 3, 4], DY, 2, "SAME")
    assert dw.dtype == F16
    graph = dict(dw.__dask_graph__())
    partial_keys = [k for k in graph if isinstance(k, tuple) and "partials" in k[0]]
    assert len(partial_keys) == 12
    part = dask.get(graph, partial_keys[0])  # one partial, computed here
    assert part.dtype == F32
    got = dw.compute()
    want = nc.conv2d_backprop_filter(x, [3, 3, 3, 4], dy, 2, "SAME")
    assert got.dtype == F16
    # each partial and their sum stay in float32: one rounding to float16 at the end, as
    # the NumPy call rounds once
    assert np.max(np.abs(got.astype(F64) - want.astype(F64))
                  / np.spacing(np.abs(want)).astype(F64)) <= 1


# -- laziness, inputs, empties --------------------------------------------------------------
def _boom(block):
    raise AssertionError("computed while building the graph")


def test_building_the_graph_computes_nothing_and_inputs_stay(client, rng):
    x = _data(rng, (2, 6, 6, 2), F32)
    w = _data(rng, (3, 3, 2, 2), F32)
    X = da.from_array(x, chunks=(1, 3, 3, 2)).map_blocks(_boom, dtype=F32)
    y = ncd.conv2d(X, w, 1, "SAME")
    assert y.shape == (2, 6, 6, 2) and y.dtype == F32
    assert ncd.conv2d_backprop_filter(X, [3, 3, 2, 2], y, 1, "SAME").shape == w.shape
    x0, w0 = x.copy(), w.copy()
    ncd.conv2d(da.from_array(x, chunks=(1, 2, 3, 2)), w, 2, "SAME").compute()
    assert np.array_equal(x, x0) and np.array_equal(w, w0)


def test_empty_problem_gives_zeros(client):
    x = da.zeros((0, 5, 5, 2), dtype=F32, chunks=(1, 2, 2, 2))
    w = np.ones((3, 3, 2, 4), F32)
    y = ncd.conv2d(x, w, 1, "SAME")
    assert y.shape == (0, 5, 5, 4) and y.compute().shape == (0, 5, 5, 4)
    dw = ncd.conv2d_backprop_filter(x, [3, 3, 2, 4], da.zeros((0, 5, 5, 4), dtype=F32), 1, "SAME")
    assert np.array_equal(dw.compute(), np.zeros((3, 3, 2, 4), F32))


# -- errors ---------------------------------------------------------------------------------
def _arrays():
    x = np.ones((2, 6, 6, 4), F32)
    w = np.ones((3, 3, 4, 4), F32)
    dy = np.ones((2, 6, 6, 4), F32)
    return x, w, dy, da.from_array(x, chunks=(1, 3, 3, 4)), da.from_array(dy, chunks=3)


class _FakeDevice:
    __cuda_array_interface__ = {"shape": (3, 3, 4, 4), "typestr": "<f4", "version": 3,
                                "data": (0, False)}
    shape = (3, 3, 4, 4)
    dtype = np.dtype(F32)


def test_errors_name_the_argument():
    x, w, dy, X, DY = _arrays()
    with pytest.raises(TypeError, match=r"^input: expected a dask\.array\.Array, got ndarray"):
        ncd.conv2d(x, w, 1, "SAME")
    with pytest.raises(TypeError, match=r"^out_backprop: expected a dask\.array\.Array"):
        ncd.conv2d_backprop_input(x.shape, w, dy, 1, "SAME")
    with pytest.raises(TypeError, match=r"^output_delta: expected a dask\.array\.Array"):
        ncd.convolution_backprop_filters(X, [3, 3], dy, strides=1, auto_pad="same_upper")
    with pytest.raises(TypeError, match=r"^out: not supported on Dask arrays"):
        ncd.conv2d(X, w, 1, "SAME", out=np.empty((2, 6, 6, 4), F32))
    with pytest.raises(ValueError, match=r"^out_backprop: expected shape \(2, 6, 6, 4\)"):
        ncd.conv2d_backprop_filter(X, w.shape, DY[:, :5], 1, "SAME")
    with pytest.raises(TypeError, match=r"^input: expected dtype float16, float32, float64 or bfloat16"):
        ncd.conv2d(X.astype(np.int32), w, 1, "SAME")
    with pytest.raises(TypeError, match=r"^all arrays of one call must share one float dtype"):
        ncd.conv2d(X, w.astype(F64), 1, "SAME")
    with pytest.raises(TypeError, match=r"^filter: a device array"):
        ncd.conv2d(X, _FakeDevice(), 1, "SAME")
    with pytest.raises(ValueError, match=r"^input: the chunk sizes are unknown"):
        ncd.conv2d(X[X[:, 0, 0, 0] > 0], w, 1, "SAME")
    with pytest.raises(ValueError, match=r"^strategy: expected a family"):
        ncd.conv2d(X, w, 1, "SAME", strategy="fastest")
    with pytest.raises(ValueError, match=r"^layer1: filter larger than the padded input"):
        ncd.conv2d(X, np.ones((9, 9, 4, 4), F32), 1, "VALID", name="layer1")


def test_channel_chunks_that_split_a_group_are_refused():
    x, w, dy, X, DY = _arrays()
    Xc = da.from_array(x, chunks=(2, 6, 6, 2))
    with pytest.raises(ValueError, match=r"^input: chunks along the channel axis \(axis 3\): "
                                         r"every output channel reads every input channel"):
        ncd.conv2d(Xc, w, 1, "SAME")
    with pytest.raises(ValueError, match=r"^output_delta: chunks along the channel axis "
                                         r"\(axis 1\): with groups=2 each chunk must hold "
                                         r"whole groups of 2 output channels"):
        ncd.convolution_backprop_data(da.from_array(np.ones((2, 4, 6, 6), F32),
                                                    chunks=(2, (1, 3), 6, 6)),
                                      np.ones((4, 2, 3, 3), F32), strides=1, groups=2,
                                      auto_pad="same_upper", data_format="NCX",
                                      filter_format="OIX")
    with pytest.raises(ValueError, match=r"^input: chunks along the channel axis"):
        ncd.conv2d_backprop_filter(Xc, w.shape, DY, 1, "SAME")


# -- worker set-up --------------------------------------------------------------------------
def _plugin_report(dask_worker):
    return dask_worker.plugins["numbaconv-setup"].report


def test_workers_run_one_thread_each_and_use_the_given_cache(client):
    import numba
    states = client.run(ncd.worker_state)
    assert len(states) == 2
    for st in states.values():
        # the machine's Numba pool has every core; each worker has one Dask thread
        assert st["threads"] == 1
        assert st["cache_dir"] == client.test_cache_dir
        # Dask holds the results: beside them, only a small pool for a call's scratch
        assert st["pool_bytes"] == _worker.WORKER_POOL_BYTES
    reports = client.run(_plugin_report)
    assert {r["pid"] for r in reports.values()} == {s["pid"] for s in states.values()}
    assert all(r["threads"] == 1 and r["warmup_seconds"] > 0 for r in reports.values())
    assert numba.config.NUMBA_NUM_THREADS >= 1


def _pool_in_worker():
    import gc
    from numbaconv import memory
    a = memory.empty((600 << 10,), np.uint8)
    first, pooled = a.ctypes.data, not a.flags.owndata
    del a
    gc.collect()
    again = memory.empty((600 << 10,), np.uint8).ctypes.data
    return dict(min_bytes=memory.min_bytes(), limit=memory.limit(), pooled=pooled,
                reused=again == first, trim=os.environ.get("MALLOC_TRIM_THRESHOLD_"))


def test_workers_pool_what_glibc_would_map_afresh(client):
    """Dask's nanny pins glibc's mmap threshold (MALLOC_TRIM_THRESHOLD_): in its workers the
    pool serves arrays from 128 KiB on, and keeps WORKER_POOL_BYTES of them idle, so that a
    call's scratch is not faulted in afresh on every call."""
    for st in client.run(_pool_in_worker).values():
        assert st["trim"] is not None
        assert st["min_bytes"] == 128 << 10 and st["limit"] == _worker.WORKER_POOL_BYTES
        assert st["pooled"] and st["reused"]


def test_first_task_in_a_worker_process_sets_the_workers_threads(monkeypatch):
    """Without the plugin: the first task of a nanny's child process sets numbaconv's
    threads to the worker's, unless the user set them."""
    import multiprocessing
    from types import SimpleNamespace
    from numbaconv import config
    from numbaconv.dask import _worker
    fake = SimpleNamespace(state=SimpleNamespace(nthreads=1), nthreads=1)
    monkeypatch.setattr(_worker, "_worker", lambda: fake)
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    monkeypatch.setattr(config, "THREADS", 0)
    monkeypatch.setattr(config, "MEMORY_POOL_BYTES", None)
    monkeypatch.setattr(_worker, "_configured", False)
    _worker.configure_worker()
    assert config.THREADS == 1 and config.MEMORY_POOL_BYTES == _worker.WORKER_POOL_BYTES
    monkeypatch.setattr(config, "THREADS", 2)
    monkeypatch.setattr(_worker, "_configured", False)
    _worker.configure_worker()
    assert config.THREADS == 2  # set explicitly: kept
    monkeypatch.setattr(config, "THREADS", 0)
    monkeypatch.setattr(_worker, "_configured", False)
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)
    _worker.configure_worker()
    assert config.THREADS == 0  # the client's own process (processes=False): untouched


def test_plugin_arguments_are_checked():
    with pytest.raises(ValueError, match=r"^threads: expected a positive int"):
        ncd.NumbaconvSetup(threads=0)
    with pytest.raises(TypeError, match=r"^cache_dir: expected a path"):
        ncd.NumbaconvSetup(cache_dir=3)
    with pytest.raises(ValueError, match=r"^pool_bytes: expected a non-negative int"):
        ncd.NumbaconvSetup(pool_bytes=-1)


# -- a worker killed during a computation ---------------------------------------------------
def _slow(block):
    time.sleep(0.25)
    return block


def test_a_worker_killed_mid_computation_still_gives_the_right_result(client, rng):
    x = _data(rng, (16, 10, 9, 3), F32)
    dy = _data(rng, (16, 10, 9, 4), F32)
    X = da.from_array(x, chunks=(2, 5, 9, 3)).map_blocks(_slow, dtype=F32)
    DY = da.from_array(dy, chunks=(2, 5, 9, 4))
    dw = ncd.conv2d_backprop_filter(X, [3, 3, 3, 4], DY, 1, "SAME")
    future = client.compute(dw)
    deadline = time.monotonic() + 30
    while not any(client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.6)  # some blocks done and held by the worker, others running
    assert not future.done()
    pids = client.run(os.getpid)
    victim = sorted(pids)[0]
    os.kill(pids[victim], signal.SIGKILL)
    got = future.result(timeout=120)
    want = nc.conv2d_backprop_filter(x, [3, 3, 3, 4], dy, 1, "SAME")
    scale = _scale(lambda m, x, dy: m.conv2d_backprop_filter(x, [3, 3, 3, 4], dy, 1, "SAME"),
                   (x, dy))
    assert np.max(np.abs(got - want)) / scale <= TOL[np.dtype(F32)]
    # the nanny restarted the worker: two again, set up like the others
    client.wait_for_workers(2, timeout=60)
    assert all(st["threads"] == 1 for st in client.run(ncd.worker_state).values())


# -- the example ----------------------------------------------------------------------------
def test_example_script_on_the_cluster(client):
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "dask_cluster.py"
    spec = importlib.util.spec_from_file_location("dask_cluster", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.batch_weight_gradient(client, batch=8, chunk=3, size=6, channels=3) < 1e-5
    assert example.volume(client, size=9, channels=2) < 1e-5
