"""Every strategy, forced, against the float64 reference, with tiles patched small so that
slab and phase edges are crossed."""
import numpy as np
import pytest

import numbaconv as nc
from numbaconv import config
from numbaconv import reference as R
from numbaconv.planner import candidates
from numbaconv import planner
from numbaconv.strategies import _gemm_common as GC, gemm as G

# (groups, ic, oc, input spatial, kernel, stride, dilation, pads_begin, pads_end)
CASES = [
    (1, 16, 24, (9, 8), (3, 3), (2, 1), (1, 2), (1, 0), (2, 1)),
    (1, 16, 16, (8, 8), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
    (1, 16, 16, (8, 7), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)),
    (1, 8, 16, (7, 6), (1, 1), (2, 3), (1, 1), (1, 0), (0, 1)),
    (2, 32, 32, (7, 9), (3, 2), (2, 3), (2, 1), (1, 1), (1, 0)),
    (1, 12, 8, (11,), (3,), (3,), (2,), (2,), (0,)),
    (1, 8, 8, (4, 5, 5), (3, 1, 2), (1, 2, 1), (1, 1, 2), (1, 0, 1), (1, 0, 0)),
    (16, 32, 32, (6, 6), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    (1, 3, 16, (12, 12), (7, 7), (2, 2), (1, 1), (3, 3), (2, 2)),
    (6, 6, 6, (9, 8), (3, 3), (2, 1), (1, 2), (0, 1), (1, 1)),        # depthwise
    (5, 5, 10, (7, 6), (3, 2), (1, 2), (2, 1), (1, 0), (2, 1)),       # depthwise, multiplier 2
    (4, 4, 4, (5, 6, 7), (2, 3, 3), (2, 1, 2), (1, 1, 1), (1, 1, 0), (0, 1, 1)),  # 3-D depthwise
    (8, 8, 8, (9, 10), (3, 3), (1, 1), (2, 1), (2, 0), (1, 2)),      # depthwise 3x3 unrolled
    (4, 4, 4, (3, 6, 7), (1, 3, 3), (1, 1, 1), (1, 1, 2), (1, 1, 0), (0, 1, 1)),  # 3-D, kd=1
    (8, 16, 24, (6, 7), (3, 3), (2, 1), (1, 2), (1, 1), (0, 1)),      # small groups
    (8, 24, 16, (4, 5, 5), (3, 3, 3), (1, 2, 1), (1, 1, 1), (1, 1, 1), (1, 0, 1)),  # 3-D groups
]
IDS = [f"g{c[0]}ic{c[1]}oc{c[2]}i{'x'.join(map(str, c[3]))}k{'x'.join(map(str, c[4]))}"
       f"s{'x'.join(map(str, c[5]))}" for c in CASES]


@pytest.fixture(autouse=True)
def small_slabs(monkeypatch):
    # Tiny slabs: many slabs per problem, a partial last one, and packed columns everywhere.
    monkeypatch.setattr(config, "GEMM_SLAB_BYTES", 512)
    monkeypatch.setattr(config, "GEMM_MIN_ROWS", 7)


def _bwd_w_plan(case, strategy):
    """Zero operands of a weight-gradient case (batch 2), the plan ``strategy`` makes for
    it, and the call's keyword arguments."""
    g, ic, oc, isz, k, st, dl, pb, pe = case
    x = np.zeros((2, *isz, ic), np.float32)
    kw = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe, groups=g,
              strategy=strategy)
    dy = nc.convolution(x, np.zeros((*k, ic // g, oc), np.float32),
                        **{a: v for a, v in kw.items() if a != "strategy"})
    return x, dy, nc.plan("convolution_backprop_filters", x, k, dy, **kw), kw


def _run(direction, case, dtype, strategy, rng):
    g, ic, oc, isz, k, st, dl, pb, pe = case
    x = rng.standard_normal((2, *isz, ic))
    w = rng.standard_normal((*k, ic // g, oc))
    ref_args = (st, dl, pb, pe, g)
    y = R.conv_fwd(x, w, *ref_args)
    dy = rng.standard_normal(y.shape)
    attrs = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe, groups=g,
                 strategy=strategy)
    xc, wc, dyc = x.astype(dtype), w.astype(dtype), dy.astype(dtype)
    x, w, dy = xc.astype(np.float64), wc.astype(np.float64), dyc.astype(np.float64)
    if direction == "fwd":
        got = nc.convolution(xc, wc, **attrs)
        ref, ra = R.conv_fwd(x, w, *ref_args), R.conv_fwd(abs(x), abs(w), *ref_args)
    elif direction == "bwd_d":
        got = nc.convolution_backprop_data(dyc, wc, isz, **attrs)
        ref = R.conv_bwd_data(dy, w, isz, *ref_args)
        ra = R.conv_bwd_data(abs(dy), abs(w), isz, *ref_args)
    else:
        got = nc.convolution_backprop_filters(xc, k, dyc, **attrs)
        ref = R.conv_bwd_filter(x, dy, k, *ref_args)
        ra = R.conv_bwd_filter(abs(x), abs(dy), k, *ref_args)
    assert got.dtype == np.dtype(dtype)
    assert got.shape == ref.shape
    return R.normalized_error(got, ref, ra)



@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("direction", ["fwd", "bwd_d", "bwd_w"])
@pytest.mark.parametrize("strategy", ["direct", "gemm", "gemm-numba", "gemm-blas"])
def test_forced_strategy_matches_reference(case, direction, strategy, monkeypatch):
    """``gemm-numba`` / ``gemm-blas``: the GEMM strategy with its engine forced."""
    rng = np.random.default_rng(1)
    dtype = "float64"
    if strategy.startswith("gemm-"):
        strategy, engine = strategy.split("-")
        monkeypatch.setattr(config, "GEMM_ENGINE", engine)
    try:
        err = _run(direction, case, dtype, strategy, rng)
    except ValueError as exc:
        # A strategy may decline; then the message names it and gives its reason.
        assert strategy in str(exc) and "declines" in str(exc)
        assert strategy != "direct"
        return
    assert err <= R.TOLERANCE[dtype]


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("engine", ["numba", "blas"])
@pytest.mark.parametrize("per_tap", [True, False])
def test_gemm_backward_data_w_per_tap_or_copied(case, engine, per_tap, monkeypatch):
    """Backward data with few rows per phase multiplies tap by tap on views of W (these
    small problems do); larger ones multiply once by a transposed copy of W."""
    monkeypatch.setattr(config, "GEMM_ENGINE", engine)
    monkeypatch.setattr(G, "PER_TAP_MAX_ROWS", G.PER_TAP_MAX_ROWS if per_tap else 0)
    g, ic, oc, isz, k, st, dl, pb, pe = case
    dy = np.zeros((2, *R.conv_fwd(np.zeros((1, *isz, ic)), np.zeros((*k, ic // g, oc)),
                                  st, dl, pb, pe, g).shape[1:]), np.float32)
    try:
        plan = nc.plan("convolution_backprop_data", dy, np.zeros((*k, ic // g, oc), np.float32),
                       isz, strides=st, dilations=dl, pads_begin=pb, pads_end=pe, groups=g,
                       strategy="gemm")
    except ValueError:
        return  # declined: test_forced_strategy_matches_reference covers the reason
    if plan.variant in ("col2im", "implicit", "regions", "grouped"):
        return  # not a phase GEMM
    many_taps = int(np.prod(k)) > 1
    assert (plan.variant == "per-tap") == (per_tap and many_taps), str(plan)
    err = _run("bwd_d", case, "float64", "gemm", np.random.default_rng(3))
    assert err <= R.TOLERANCE["float64"]


@pytest.mark.parametrize("engine", ["numba", "blas"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("direction", ["fwd", "bwd_d", "bwd_w"])
def test_gemm_low_precision(dtype, direction, engine, monkeypatch):
    monkeypatch.setattr(config, "GEMM_ENGINE", engine)
    rng = np.random.default_rng(2)
    for case in (CASES[0], CASES[1], CASES[2]):  # KxK with phases, 1x1, 1x1 strided
        err = _run(direction, case, dtype, "gemm", rng)
        assert err <= R.TOLERANCE[dtype]


@pytest.mark.parametrize("engine", ["numba", "blas"])
@pytest.mark.parametrize("direction", ["fwd", "bwd_w"])
def test_gemm_packed_float16_widens_as_it_packs(direction, engine, monkeypatch,
                                                without_patch_t):
    """Packed forward and backward weights take float16 X (and one group's dY) as bits,
    widened by im2col and slab by slab: within one float16 rounding of float32's result on
    the widened operands (the slab tasks' partial sums may be added in another order);
    the user's arrays are left alone."""
    monkeypatch.setattr(config, "GEMM_ENGINE", engine)
    rng = np.random.default_rng(8)
    ran = 0
    for case in CASES:
        g, ic, oc, isz, k, st, dl, pb, pe = case
        x = rng.standard_normal((2, *isz, ic)).astype(np.float16)
        w = rng.standard_normal((*k, ic // g, oc)).astype(np.float16)
        attrs = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe, groups=g,
                     strategy="gemm")
        if GC.gemm_guard(nc.plan("convolution", x, w, **{**attrs, "strategy": None})
                         .problem) is not None:
            continue
        dy = rng.standard_normal(nc.convolution(x, w, **attrs).shape).astype(np.float16)
        if direction == "fwd":
            args, fn = (x, w), nc.convolution
            plan = nc.plan("convolution", x, w, **attrs)
        else:
            args, fn = (x, k, dy), nc.convolution_backprop_filters
            plan = nc.plan("convolution_backprop_filters", x, k, dy, **attrs)
        if plan.variant not in ("slabs", "split-dw"):
            continue
        half = planner.implementation(plan).half_operands(plan.problem, plan.tiles)
        assert "x" in half
        split_dw = plan.variant == "split-dw"
        assert ("dy" in half) == (direction == "bwd_w" and g == 1 and not split_dw)
        assert ("result" in half) == (direction == "bwd_w" and g == 1 and split_dw)
        saved = [a.copy() for a in args if isinstance(a, np.ndarray)]
        got = fn(*args, **attrs).astype(np.float64)
        want = fn(*[a.astype(np.float32) if isinstance(a, np.ndarray) else a for a in args],
                  **attrs)
        # one float16 rounding, plus float32's summation order near zero
        ulp = np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)
        assert np.all(np.abs(got - want) <= ulp + 1e-5 * np.abs(want).max()), case
        for a, s in zip([a for a in args if isinstance(a, np.ndarray)], saved):
            np.testing.assert_array_equal(a, s)
        ran += 1
    assert ran >= 3


@pytest.mark.parametrize("direction", ["fwd", "bwd_d", "bwd_w"])
def test_gemm_numba_engine_unpacked_blocks(direction, monkeypatch):
    """1x1 problems on the Numba engine with the planner's own tiles (row slabs, column
    blocks for backward data, reduction slabs with per-worker partials for backward
    weights), large enough to cross the micro-kernel's reduction and column blocks."""
    monkeypatch.setattr(config, "GEMM_ENGINE", "numba")
    monkeypatch.setattr(config, "GEMM_SLAB_BYTES", None)
    rng = np.random.default_rng(4)
    for case in [(1, 300, 40, (5, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
                 (1, 72, 520, (6, 6), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))]:
        err = _run(direction, case, "float32", "gemm", rng)
        assert err <= R.TOLERANCE["float32"]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_gemm_numba_1x1_backward_data_claims_rows(dtype, monkeypatch):
    """1x1 backward data at stride 1 on the Numba engine: W^T packed once and the rows of
    dY claimed by the threads in blocks (several blocks per thread, a last partial one;
    float16 widened and rounded block by block)."""
    monkeypatch.setattr(config, "GEMM_ENGINE", "numba")
    case = (1, 72, 100, (41, 40), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    g, ic, oc, isz, k, st, dl, pb, pe = case
    dy = np.zeros((2, *isz, oc), np.float32)
    plan = nc.plan("convolution_backprop_data", dy, np.zeros((1, 1, ic, oc), np.float32),
                   isz, strides=st, dilations=dl, pads_begin=pb, pads_end=pe,
                   strategy="gemm")
    assert plan.variant == "claimed" and plan.tiles.get("claim"), plan
    if nc.get_num_threads() > 1:
        assert plan.tiles["claim"] < 2 * 41 * 40 // 4, plan
    err = _run("bwd_d", case, dtype, "gemm", np.random.default_rng(6))
    assert err <= R.TOLERANCE[dtype]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_gemm_numba_1x1_weight_gradient_splits_the_reduction(dtype, threads, monkeypatch):
    """1x1 backward weights at stride 1 on the Numba engine: X^T @ dY with the pixels split
    into one share per thread, the partials summed into dW (14 MFLOP: above the serial
    threshold)."""
    import numba
    monkeypatch.setattr(config, "GEMM_ENGINE", "numba")
    case = (1, 72, 100, (23, 21), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    g, ic, oc, isz, k, st, dl, pb, pe = case
    before = nc.get_num_threads()
    nc.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        x = np.zeros((2, *isz, ic), np.float32)
        plan = nc.plan("convolution_backprop_filters", x, k, np.zeros((2, *isz, oc), np.float32),
                       strides=st, dilations=dl, pads_begin=pb, pads_end=pe, strategy="gemm")
        assert plan.variant == "split-k", plan
        assert plan.tiles["workers"] == nc.get_num_threads()
        err = _run("bwd_w", case, dtype, "gemm", np.random.default_rng(7))
    finally:
        nc.set_num_threads(before)
    assert err <= R.TOLERANCE[dtype]


@pytest.mark.parametrize("engine", ["blas", "numba", "auto"])
def test_gemm_short_reduction_splits_dw(engine, monkeypatch):
    """A reduction over few pixels into a larger dW: columns packed once, dW's rows split
    among the workers (no per-worker partials), for one group and for several; one group
    on the Numba engine (by default on AVX-512) is one parallel region over dW's rows
    (``ukernel.gemm_split_m``), in every dtype."""
    from numbaconv.kernels.cpu import ukernel
    monkeypatch.setattr(config, "GEMM_ENGINE", engine)
    monkeypatch.setattr(config, "GEMM_SLAB_BYTES", None)
    rng = np.random.default_rng(5)
    for case in [(1, 40, 50, (9,), (3,), (1,), (1,), (1,), (0,)),
                 (2, 40, 48, (4, 5), (3, 3), (1, 2), (1, 1), (1, 0), (0, 1))]:
        g = case[0]
        plan = _bwd_w_plan(case, "gemm[split-dw]")[2]
        if nc.get_num_threads() > 1:
            assert plan.variant == "split-dw", plan
            if engine == "auto" and g == 1:
                assert plan.tiles["engine"] == (
                    "numba" if ukernel.VECTOR_BYTES >= 64 else "blas"), plan
        for dtype in ("float32", "float16", "float64") if g == 1 else ("float32",):
            err = _run("bwd_w", case, dtype, "gemm", rng)
            assert err <= R.TOLERANCE[dtype], dtype


@pytest.mark.parametrize("vector_bytes", [64, 32])
def test_gemm_engine_auto_choice(vector_bytes, monkeypatch, without_patch_t):
    """"auto", as measured per host: on both the Numba engine for 1x1 backward data whose
    packed W^T fits half of L2; with AVX-512 also for 1x1 backward data with a short
    reduction (few output channels) whatever W^T's size and for every weight gradient
    (1x1 at stride 1: split-K in one parallel region), short reductions too; grouped 1x1
    weight gradients on it at any width; BLAS elsewhere."""
    from numbaconv.kernels.cpu import ukernel
    from numbaconv.strategies import igemm
    monkeypatch.setattr(ukernel, "VECTOR_BYTES", vector_bytes)
    monkeypatch.setattr(config, "GEMM_ENGINE", "auto")
    # the GEMM strategy's own engine choice: its implicit variant (ahead of it for the
    # longer 1x1 reductions below) stands aside
    monkeypatch.setattr(igemm.ImplicitGemm, "accepts", lambda self, p: "set aside")
    x = np.zeros((8, 56, 56, 64), np.float32)
    dy = np.zeros((8, 56, 56, 64), np.float32)
    w = np.zeros((1, 1, 64, 64), np.float32)
    kw = dict(strides=1, pads_begin=0, pads_end=0, strategy="gemm")
    tall = nc.plan("convolution_backprop_filters", x, (1, 1), dy, **kw)
    short = nc.plan("convolution_backprop_filters", x[:, :7, :7], (3, 3), dy[:, :5, :5], **kw)
    short1 = nc.plan("convolution_backprop_filters", x[:, :7, :7], (1, 1), dy[:, :7, :7],
                     **kw)
    data = nc.plan("convolution_backprop_data", dy, w, (56, 56), **kw)
    dy_wide = np.zeros((8, 28, 28, 256), np.float32)
    # a longer reduction whose packed W^T fits half of L2 (the workers claim rows of it),
    # and one whose W^T does not
    wide = nc.plan("convolution_backprop_data", dy_wide, np.zeros((1, 1, 64, 256), np.float32),
                   (28, 28), **kw)
    huge = nc.plan("convolution_backprop_data", dy_wide, np.zeros((1, 1, 4096, 256), np.float32),
                   (28, 28), **kw)
    # a short reduction (64 output channels) into many input channels over few pixels:
    # W^T (4 MiB) does not fit half of L2 (hosts here have 1-2 MiB)
    short_wide = nc.plan("convolution_backprop_data", dy[:, :7, :7],
                         np.zeros((1, 1, 16384, 64), np.float32), (7, 7), **kw)
    # a grouped 1x1 weight gradient (ShuffleNet's gconv): per-group split-K at any width
    grouped = nc.plan("convolution_backprop_filters", x[:, :14, :14, :48], (1, 1),
                      np.zeros((8, 14, 14, 96), np.float32), groups=3, **kw)
    engines = [p.tiles["engine"] for p in (tall, short, short1, data, wide, huge, short_wide,
                                           grouped)]
    if vector_bytes == 64:
        assert engines == ["numba", "numba", "numba", "numba", "numba", "blas", "numba",
                           "numba"]
        assert tall.variant == short1.variant == "split-k"
    else:
        assert engines == ["blas", "blas", "blas", "numba", "numba", "blas", "blas", "numba"]
    assert grouped.variant == "split-k"
    assert wide.variant == "claimed" and huge.variant != "claimed"
    monkeypatch.setattr(config, "GEMM_ENGINE", "blas")
    assert nc.plan("convolution_backprop_data", dy, w, (56, 56), **kw).tiles["engine"] == "blas"
    monkeypatch.setattr(config, "GEMM_ENGINE", "numba")
    assert nc.plan("convolution_backprop_filters", x, (1, 1), dy, **kw).tiles["engine"] == "numba"


def test_direct_is_last_and_accepts_everything():
    for direction in ("fwd", "bwd_d", "bwd_w"):
        names = [s.name for s in candidates(direction)]
        assert names[-1] == "direct"
        assert "gemm" in names


def test_gemm_declines_with_reason():
    x = np.zeros((1, 8, 8, 3), np.float32)
    dy = np.zeros((1, 8, 8, 16), np.float32)
    w = np.zeros((1, 2, 3, 16), np.float32)
    # 3 input channels: the phase GEMMs decline (3 columns), and so does col2im (2 taps x 3
    # channels); a 3x3 kernel would give col2im 27 columns (tests/test_col2im.py), a 1x1
    # kernel gemm[identity] (test_narrow_results_run_as_blas_gemms)
    with pytest.raises(ValueError, match=r"gemm.*declines.*gemm\[slabs\]: result has 3 column"):
        nc.conv2d_backprop_input(x.shape, w, dy, 1, "SAME", strategy="gemm")
    # depthwise: batched 1x1-channel GEMMs are declined
    with pytest.raises(ValueError, match=r"gemm.*declines.*(groups|column)"):
        nc.depthwise_conv2d_native_backprop_filter(
            np.zeros((1, 8, 8, 16), np.float32), [3, 3, 16, 1],
            np.zeros((1, 8, 8, 16), np.float32), 1, "SAME", strategy="gemm")


@pytest.mark.parametrize("groups,variant", [(6, "depthwise"), (3, "grouped")])
@pytest.mark.parametrize("direction", ["fwd", "bwd_d", "bwd_w"])
def test_direct_variants_and_generic_direct_agree(direction, groups, variant, monkeypatch):
    """Depthwise and small-group problems run their variants of direct; the generic loop
    nest gives the same numbers."""
    from numbaconv.backends import cpu
    from numbaconv.strategies import grouped
    from numbaconv.strategies.direct import DIRECT

    monkeypatch.setattr(grouped, "MIN_GROUPS", 2)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 7, 6, 6))
    w = rng.standard_normal((3, 3, 6 // groups, 12))
    dy = rng.standard_normal((2, 4, 6, 12))
    attrs = dict(strides=(2, 1), pads_begin=1, pads_end=1, groups=groups, strategy="direct")
    call = {"fwd": ("convolution", (x, w)), "bwd_d": ("convolution_backprop_data", (dy, w, (7, 6))),
            "bwd_w": ("convolution_backprop_filters", (x, (3, 3), dy))}[direction]
    plan = nc.plan(call[0], *call[1], **attrs)
    assert (plan.strategy, plan.variant) == ("direct", variant)
    got = getattr(nc, call[0])(*call[1], **attrs)
    p = plan.problem
    ops = cpu.canonical_operands(p, dict(zip({"fwd": ("x", "w"), "bwd_d": ("dy", "w"),
                                               "bwd_w": ("x", "dy")}[direction],
                                              [a for a in call[1] if isinstance(a, np.ndarray)])))
    generic = DIRECT.run(p, DIRECT.tiles(p, __import__("numbaconv.machine").machine.machine()),
                         ops)
    np.testing.assert_allclose(cpu._to_user(generic, p), got, rtol=1e-12, atol=1e-12)


def test_gemm_tap_runs():
    from numbaconv.strategies._gemm_common import tap_runs as _runs
    # 2x3 taps at dilation 1: two rows of three w-neighbours
    boff = np.array([[0, h - 1, w - 1] for h in range(2) for w in range(3)], np.int64)
    assert _runs(boff).tolist() == [[0, 3], [3, 3]]
    # dilation 2 in w: no neighbours; a gap or a new row ends a run
    boff = np.array([[0, 0, 0], [0, 0, 2], [0, 0, 3], [0, 1, 4], [1, 1, 5]], np.int64)
    assert _runs(boff).tolist() == [[0, 1], [1, 2], [3, 1], [4, 1]]


def test_gemm_tiny_problems_stay_on_the_calling_thread(monkeypatch, without_patch_t):
    monkeypatch.setattr(GC, "SERIAL_MAX_FLOPS", 8_000_000)
    x = np.zeros((1, 8, 8, 16), np.float32)
    dy = np.zeros((1, 8, 8, 16), np.float32)
    tiny = nc.plan("convolution_backprop_filters", x, (3, 3), dy, strides=1, pads_begin=1,
                   pads_end=1, strategy="gemm")
    assert tiny.flops < GC.SERIAL_MAX_FLOPS and tiny.tiles["workers"] == 1
    big = np.zeros((8, 32, 32, 16), np.float32)
    plan = nc.plan("convolution_backprop_filters", big, (3, 3), big, strides=1, pads_begin=1,
                   pads_end=1, strategy="gemm")
    assert plan.flops >= GC.SERIAL_MAX_FLOPS and plan.tiles["workers"] == nc.get_num_threads()
    err = _run("bwd_w", CASES[0], "float64", "gemm", np.random.default_rng(8))
    assert err <= R.TOLERANCE["float64"]


@pytest.mark.parametrize("strides", [1, 2])
def test_gemm_blas_1x1_backward_passes_split_among_workers(strides, monkeypatch):
    """Long 1x1 problems on BLAS go to the workers: reduction slabs with partial dW's for
    the weight gradient, row slabs (batch slices at stride 2) for backward data."""
    monkeypatch.setattr(config, "GEMM_ENGINE", "blas")
    monkeypatch.setattr(config, "GEMM_SLAB_BYTES", None)
    monkeypatch.setattr(G, "BLAS_SPLIT_MIN_ROWS", 64)
    s = (strides, strides)
    case = (1, 24, 40, (9, 11), (1, 1), s, (1, 1), (0, 0), (0, 0))
    x = np.zeros((2, 9, 11, 24), np.float32)
    dy = np.zeros((2, *(-(-v // strides) for v in (9, 11)), 40), np.float32)
    w = np.zeros((1, 1, 24, 40), np.float32)
    plans = [nc.plan("convolution_backprop_filters", x, (1, 1), dy, strides=s,
                     strategy="gemm"),
             nc.plan("convolution_backprop_data", dy, w, (9, 11), strides=s, strategy="gemm")]
    if nc.get_num_threads() > 1:
        for plan in plans:  # (a strided weight gradient packs its subsampled x anyway)
            unpacked = strides == 1 or plan.problem.direction == "bwd_d"
            assert plan.tiles.get("workers", 1) > 1, str(plan)
            assert (plan.variant == "identity") is unpacked, str(plan)
    for direction in ("bwd_w", "bwd_d"):
        for dtype in ("float64", "float32"):
            err = _run(direction, case, dtype, "gemm", np.random.default_rng(9))
            assert err <= R.TOLERANCE[dtype], (direction, dtype)


@pytest.mark.parametrize("engine", ["blas", "numba"])
def test_gemm_backward_data_single_tap_phase_split_over_the_batch(engine, monkeypatch):
    """A 3x3 stride-2 kernel's phase (0, 0) has one tap reading dy as it is: one GEMM per
    batch slice, on every worker, written to every second pixel."""
    monkeypatch.setattr(config, "GEMM_ENGINE", engine)
    monkeypatch.setattr(G, "PER_TAP_MAX_ROWS", 0)
    case = (1, 16, 24, (9, 10), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1))
    rng = np.random.default_rng(11)
    for mb in (1, 3, 5):
        g, ic, oc, isz, k, st, dl, pb, pe = case
        x = rng.standard_normal((mb, *isz, ic))
        w = rng.standard_normal((*k, ic, oc))
        dy = rng.standard_normal(R.conv_fwd(x, w, st, dl, pb, pe, g).shape)
        got = nc.convolution_backprop_data(dy, w, isz, strides=st, dilations=dl,
                                           pads_begin=pb, pads_end=pe, strategy="gemm")
        ref = R.conv_bwd_data(dy, w, isz, st, dl, pb, pe, g)
        ra = R.conv_bwd_data(abs(dy), abs(w), isz, st, dl, pb, pe, g)
        assert R.normalized_error(got, ref, ra) <= R.TOLERANCE["float64"], mb


def test_grouped_vector_width(monkeypatch):
    """The grouped variant's vectors across groups: half a 512-bit register where that
    holds the groups in fewer lanes (8 groups in float32, 4 in float64), else the full
    width, in every direction and float type; hosts with narrower registers always take
    the full width."""
    from numbaconv.kernels.cpu import grouped as k
    from numbaconv.strategies import grouped

    def vectors(g, dtype, direction="bwd_d"):
        p = nc.problem.ConvProblem(direction, 2, g, 8 * g, 8 * g, (4, 6, 6), (3, 3, 3),
                                   (4, 6, 6), (1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1), 3,
                                   dtype)
        return grouped._vectors(p)

    monkeypatch.setattr(k, "VECTOR_BYTES", 64)
    monkeypatch.setattr(k, "HALF_BYTES", 32)
    assert vectors(8, "float32") == (1, 8)
    assert vectors(16, "float32") == (1, 16)
    assert vectors(24, "float32") == (3, 8)     # 24 lanes, not 32
    assert vectors(40, "float32") == (5, 8)     # 40, not 48
    assert vectors(48, "float32") == (3, 16)
    assert vectors(4, "float64") == (1, 4)
    assert vectors(8, "float64") == (1, 8)
    assert vectors(8, "float64", "fwd") == (1, 8)
    assert vectors(8, "float64", "bwd_w") == (1, 8)
    assert vectors(12, "float64") == (3, 4)     # 12 lanes, not 16
    assert vectors(4, "float64", "bwd_w") == (1, 4)
    monkeypatch.setattr(k, "VECTOR_BYTES", 32)
    monkeypatch.setattr(k, "HALF_BYTES", 16)
    assert vectors(8, "float32") == (1, 8)
    assert vectors(4, "float32") == (1, 8)


def test_grouped_takes_strided_weight_gradient_of_wide_groups():
    """Strided backward weights with 32 channels per group stays off the packed GEMMs
    (ResNeXt-3D conv_3d:12: the grouped variant, with half-width vectors, 2.9-3.0 ms
    against GEMM's 4.3-4.5); gemm[patch-t], which reads such groups in place, goes first
    (docs/performance.md, "Weight gradients with few output channels")."""
    x = np.zeros((1, 4, 8, 8, 256), np.float32)
    dy = np.zeros((1, 2, 4, 4, 256), np.float32)
    plan = nc.plan("convolution_backprop_filters", x, (3, 3, 3), dy, strides=2,
                   pads_begin=1, pads_end=1, groups=8)
    from numbaconv.machine import machine
    # (256-bit vectors: gemm[patch-t] takes at most 4 groups, patcht.NARROW_VECTOR_GROUPS)
    want = ("gemm", "patch-t") if machine().vector_bytes >= 64 else ("direct", "grouped")
    assert (plan.strategy, plan.variant) == want, plan
    plan = nc.plan("convolution_backprop_filters", x, (3, 3, 3), dy, strides=2,
                   pads_begin=1, pads_end=1, groups=8, strategy="direct")
    assert (plan.strategy, plan.variant) == ("direct", "grouped"), plan


# (ic, oc, input spatial, kernel, stride, dilation, pads_begin, pads_end): forward passes
# into fewer than 8 output channels (1x1 heads, 3x3 output layers, strided, dilated,
# 1-D and 3-D) and 1x1 backward data into fewer than 8 input channels (PointNet's first
# layer): BLAS GEMMs with a few result columns.
NARROW_GEMM_CASES = [
    ("fwd", (64, 2, (9, 10), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), "identity"),
    ("fwd", (16, 3, (9, 8), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "slabs"),
    ("fwd", (12, 1, (10, 9), (3, 3), (2, 1), (1, 2), (1, 0), (2, 1)), "slabs"),
    ("fwd", (8, 7, (23,), (5,), (1,), (1,), (2,), (2,)), "slabs"),
    ("fwd", (6, 4, (4, 5, 6), (3, 1, 2), (1, 2, 1), (1, 1, 1), (1, 0, 1), (1, 0, 0)), "slabs"),
    ("bwd_d", (3, 64, (41,), (1,), (1,), (1,), (0,), (0,)), "identity"),
    ("bwd_d", (2, 16, (7, 9), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), "identity"),
]


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("direction,case,variant", NARROW_GEMM_CASES,
                         ids=[f"{d}-ic{c[0]}oc{c[1]}k{'x'.join(map(str, c[3]))}"
                              for d, c, _ in NARROW_GEMM_CASES])
def test_narrow_results_run_as_blas_gemms(direction, case, variant, dtype, monkeypatch):
    """A forward pass into a few output channels, and 1x1 backward data into a few input
    channels, plan a BLAS GEMM (``direct`` vectorised over those few channels is far
    slower; docs/performance.md, "Few result columns") and match the float64 reference;
    with the Numba engine forced the GEMMs decline with that reason and ``direct`` runs."""
    ic, oc, isz, k, st, dl, pb, pe = case
    x = np.zeros((2, *isz, ic), np.float32)
    w = np.zeros((*k, ic, oc), np.float32)
    kw = dict(strides=st, dilations=dl, pads_begin=pb, pads_end=pe)
    dy = np.zeros(nc.convolution(x, w, **kw).shape, np.float32)
    args = ("convolution", x, w) if direction == "fwd" else (
        "convolution_backprop_data", dy, w, isz)
    plan = nc.plan(*args, **kw)
    assert (plan.strategy, plan.variant, plan.tiles["engine"]) == ("gemm", variant, "blas"), \
        str(plan)
    err = _run(direction, (1, *case), dtype, f"gemm[{variant}]", np.random.default_rng(3))
    assert err <= R.TOLERANCE[dtype]
    monkeypatch.setattr(config, "GEMM_ENGINE", "numba")
    with pytest.raises(ValueError, match=r"column\(s\) per GEMM \(< 8\): served on the BLAS"):
        nc.plan(*args, strategy=f"gemm[{variant}]", **kw)
    assert nc.plan(*args, **kw).strategy == "direct"


# (ic, oc, input spatial, kernel, stride, dilation, pads_begin, pads_end): few output
# channels, the heads direct[narrow] takes (1-D, 2-D, 3-D; strides, dilations, pads).
NARROW_CASES = [
    (64, 2, (9, 10), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
    (16, 3, (9, 8), (3, 3), (2, 1), (1, 2), (1, 0), (2, 1)),
    (8, 1, (23,), (7,), (1,), (1,), (3,), (3,)),
    (5, 5, (4, 5, 6), (3, 1, 2), (1, 2, 1), (2, 1, 1), (1, 0, 1), (1, 0, 0)),
    (24, 7, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
]


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("case", NARROW_CASES, ids=[f"ic{c[0]}oc{c[1]}k{'x'.join(map(str, c[3]))}"
                                                    for c in NARROW_CASES])
def test_narrow_weight_gradient_matches_reference(case, dtype):
    """direct[narrow] (few output channels, channels of the input innermost) against the
    float64 reference (bfloat16: tests/test_bfloat16.py over the strategy cases). The
    planner takes it for these heads, or gemm[patch-t]'s two-row tile where that takes
    them (a few outputs over 16 to 64 inputs: tests/test_patcht.py)."""
    ic, oc, isz, k, st, dl, pb, pe = case
    plan = nc.plan("convolution_backprop_filters", np.zeros((2, *isz, ic), np.float32), k,
                   np.zeros((2, *R.conv_fwd(np.zeros((1, *isz, ic)), np.zeros((*k, ic, oc)),
                                            st, dl, pb, pe, 1).shape[1:]), np.float32),
                   strides=st, dilations=dl, pads_begin=pb, pads_end=pe, groups=1)
    from numbaconv.strategies import patcht
    head = patcht.STRATEGY.accepts(plan.problem) is None
    assert (plan.strategy, plan.variant) == (("gemm", "patch-t") if head
                                             else ("direct", "narrow")), str(plan)
    from numbaconv.kernels.cpu import ukernel
    # (hosts with 256-bit vectors have whole vectors of 7 or 8 outputs: any tile)
    assert not head or plan.tiles["tile"] == patcht.HEAD_TILE or ukernel.VECTOR_BYTES < 64
    err = _run("bwd_w", (1, *case), dtype, "direct[narrow]", np.random.default_rng(5))
    assert err <= R.TOLERANCE[dtype]


def test_narrow_bits_do_not_depend_on_threads_or_blocks(monkeypatch):
    """One partial per core and a fixed order of adding them: the same bits on 1 or 2
    threads, and when the call runs as several launches over row blocks."""
    from numbaconv.strategies import direct as D
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 11, 12, 40)).astype(np.float32)
    dy = rng.standard_normal((3, 11, 12, 3)).astype(np.float32)
    kw = dict(strides=1, pads_begin=(1, 1), pads_end=(1, 1), strategy="direct[narrow]")
    before = nc.get_num_threads()
    try:
        runs = []
        import numba
        for t in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            nc.set_num_threads(t)
            runs.append(nc.convolution_backprop_filters(x, (3, 3), dy, **kw))
        monkeypatch.setattr(D, "BLOCK_FLOPS", 1e4)
        runs.append(nc.convolution_backprop_filters(x, (3, 3), dy, **kw))
    finally:
        nc.set_num_threads(before)
    for r in runs[1:]:
        assert np.array_equal(r, runs[0])


@pytest.mark.parametrize("shape, why", [
    ((1, 16, 8, (6, 6), (3, 3)), "output channels"),        # enough GEMM columns
    ((2, 16, 4, (6, 6), (3, 3)), "groups"),
    ((1, 2, 4, (6, 6), (3, 3)), "input channels"),          # fewer inputs than outputs
    ((1, 512, 4, (6, 6), (3, 3)), "L1"),                    # partial dW too large
])
def test_narrow_declines_with_a_reason(shape, why):
    g, ic, oc, isz, k = shape
    with pytest.raises(ValueError, match=r"direct\[narrow\].*" + why):
        nc.plan("convolution_backprop_filters", np.zeros((2, *isz, ic), np.float32), k,
                np.zeros((2, 4, 4, oc), np.float32), strides=1, groups=g,
                strategy="direct[narrow]")


@pytest.mark.parametrize("engine", ["blas", "numba"])
def test_gemm_slabs_many_workers_split_dw_rows(engine, monkeypatch):
    """With more workers than the reduction has runs of ``GEMM_MIN_ROWS`` rows (16 workers
    over 338-672 rows, runs of at least 64), a packed weight gradient splits dW's rows into
    blocks of input channels besides the reduction (``dw_row_parts``; two slabs per run):
    every block and group lands in its place, in every dtype, and two calls give the same
    bits."""
    from numbaconv.strategies import gemm
    monkeypatch.setattr(config, "GEMM_ENGINE", engine)
    monkeypatch.setattr(config, "GEMM_MIN_ROWS", 64)
    monkeypatch.setattr(config, "GEMM_SLAB_BYTES", 4096)
    monkeypatch.setattr(gemm, "task_workers", lambda p: 16)
    rng = np.random.default_rng(11)
    for case, parts in [((1, 64, 48, (13, 13), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), 4),
                        ((2, 64, 96, (13, 13), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), 4),
                        ((1, 96, 64, (28, 28), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)), 4),
                        ((1, 20, 16, (6, 7, 8), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1),
                          (1, 1, 1)), 2)]:
        x, dy, plan, kw = _bwd_w_plan(case, "gemm[slabs]")
        assert plan.tiles["workers"] == 16 and plan.tiles["col_parts"] == parts, plan
        for dtype in ("float32", "float16", "float64"):
            err = _run("bwd_w", case, dtype, "gemm[slabs]", rng)
            assert err <= R.TOLERANCE[dtype], (case, dtype)
        xs = rng.standard_normal(x.shape).astype(np.float32)
        dys = rng.standard_normal(dy.shape).astype(np.float32)
        k = case[4]
        first = nc.convolution_backprop_filters(xs, k, dys, **kw)
        assert np.array_equal(first, nc.convolution_backprop_filters(xs, k, dys, **kw))
