"""The Winograd strategy against the float64 reference: every direction, dtype and tile size,
every pad combination, tile and channel blocks crossed; its declines; ResNet-50 accuracy."""
import itertools

import numpy as np
import pytest

import numbaconv as nc
from numbaconv import planner
from numbaconv import reference as R
from numbaconv.problem import ConvProblem
from numbaconv.strategies import winograd as W


def test_registered_first_for_every_direction():
    # first after the entries that take only problems under SMALL_FLOPS (numpy[depthwise],
    # numpy) or only bfloat16 (gemm[bf16-amx-taps], gemm[bf16-amx], gemm[bf16-regions], backward data only,
    # gemm[bf16-wgrad], weight gradients only, and gemm[bf16-dot])
    from numbaconv.strategies.bf16amx import STRATEGY as BF16AMX, TAPS as BF16AMX_TAPS
    from numbaconv.strategies.bf16dot import STRATEGY as BF16DOT
    from numbaconv.strategies.bf16regions import STRATEGY as BF16REGIONS
    from numbaconv.strategies.bf16wgrad import STRATEGY as BF16WGRAD
    from numbaconv.strategies.numpy_taps import DEPTHWISE as NUMPY_DEPTHWISE, STRATEGY as NUMPY
    for direction in ("fwd", "bwd_d", "bwd_w"):
        first = ([NUMPY_DEPTHWISE, NUMPY, BF16AMX_TAPS, BF16AMX]
                 + [BF16REGIONS] * (direction == "bwd_d") + [BF16WGRAD] * (direction == "bwd_w"))
        assert planner.candidates(direction)[:len(first) + 2] == first + [BF16DOT, W.STRATEGY]


@pytest.fixture(autouse=True)
def small_problems(monkeypatch):
    """Small channel counts and images stay accepted (the thresholds are about speed)."""
    monkeypatch.setattr(W, "MIN_CHANNELS", 16)
    monkeypatch.setattr(W, "MIN_TILES_PER_CHANNEL", 0)


@pytest.fixture
def tile_size(monkeypatch):
    def force(m):
        monkeypatch.setattr(W, "TILE_SIZES", (m,))
    return force


def _run(direction, dtype, x, w, dy, isz, pb, pe, **extra):
    """Result of the forced strategy and its normalised error (docs/contract.md section 10)."""
    st, dl = (1,) * len(pb), (1,) * len(pb)
    ksz = w.shape[:-2]
    xc, wc, dyc = x.astype(dtype), w.astype(dtype), dy.astype(dtype)
    x, w, dy = xc.astype(np.float64), wc.astype(np.float64), dyc.astype(np.float64)
    attrs = dict(strides=st, pads_begin=pb, pads_end=pe, strategy="winograd", **extra)
    if direction == "fwd":
        got = nc.convolution(xc, wc, **attrs)
        ref, ra = R.conv_fwd(x, w, st, dl, pb, pe), R.conv_fwd(abs(x), abs(w), st, dl, pb, pe)
    elif direction == "bwd_d":
        got = nc.convolution_backprop_data(dyc, wc, isz, **attrs)
        ref = R.conv_bwd_data(dy, w, isz, st, dl, pb, pe)
        ra = R.conv_bwd_data(abs(dy), abs(w), isz, st, dl, pb, pe)
    else:
        got = nc.convolution_backprop_filters(xc, ksz, dyc, **attrs)
        ref = R.conv_bwd_filter(x, dy, ksz, st, dl, pb, pe)
        ra = R.conv_bwd_filter(abs(x), abs(dy), ksz, st, dl, pb, pe)
    assert got.dtype == np.dtype(dtype) and got.shape == ref.shape
    return R.normalized_error(got, ref, ra)


def _operands(rng, mb, isz, ic, oc, pb, pe):
    ksz = (1,) * (len(isz) - 2) + (3, 3)
    osz = R.out_size(isz, ksz, (1,) * len(isz), (1,) * len(isz), pb, pe)
    x = rng.standard_normal((mb, *isz, ic))
    w = rng.standard_normal((*ksz, ic, oc))
    dy = rng.standard_normal((mb, *osz, oc))
    return x, w, dy


@pytest.mark.parametrize("m", [2, 4])
def test_matrices_compute_the_correlation(m):
    BT, G, AT = W.matrices(m)
    rng = np.random.default_rng(0)
    d, g = rng.standard_normal(m + 2), rng.standard_normal(3)
    y = AT @ ((G @ g) * (BT @ d))
    assert np.allclose(y, [d[i:i + 3] @ g for i in range(m)], rtol=0, atol=1e-13)


# Every pad pair (0..2 at each end, each axis), odd and even sizes, batch 1 and 3, channel
# blocks of 7 (a partial last block) and blocks of 5 tiles (the serial blocked path) in turn.
PADS = list(itertools.product(range(3), repeat=4))


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("direction", ["fwd", "bwd_d", "bwd_w"])
@pytest.mark.parametrize("m", [2, 4])
def test_every_pad_combination_matches_reference(m, direction, dtype, tile_size, monkeypatch):
    tile_size(m)
    rng = np.random.default_rng(7)
    tol = R.WINOGRAD_TOLERANCE[dtype]
    worst = 0.0
    for i, (ph0, ph1, pw0, pw1) in enumerate(PADS):
        monkeypatch.setattr(W, "CHANNEL_BLOCK", 7 if i % 2 else 256)
        monkeypatch.setattr(W, "TILE_ROWS", 5 if i % 3 == 1 else 0)
        isz = (7, 10) if i % 2 else (10, 9)
        mb = 1 if i % 4 < 2 else 3
        pb, pe = (ph0, pw0), (ph1, pw1)
        x, w, dy = _operands(rng, mb, isz, 16, 24, pb, pe)
        err = _run(direction, dtype, x, w, dy, isz, pb, pe)
        assert err <= tol, (pb, pe, isz, mb, err)
        worst = max(worst, err)
    assert worst > 0


@pytest.mark.parametrize("direction", ["fwd", "bwd_d", "bwd_w"])
@pytest.mark.parametrize("m", [2, 4])
def test_float16_converts_tile_by_tile(m, direction, tile_size, monkeypatch):
    """float16 images go into the tile transforms as bits (widened in the patch) and float16
    results come out of them as bits (rounded from the patch), interior and border tiles
    alike: forward and backward data bit for bit float32's result on the widened operands
    rounded once; backward weights (its workers' partials may be added in another order)
    within one rounding; the user's arrays are left alone."""
    monkeypatch.setattr(W, "CHANNEL_BLOCK", 7)   # partial channel blocks
    monkeypatch.setattr(W, "TILE_ROWS", 5)
    tile_size(m)
    rng = np.random.default_rng(5)
    isz, pb, pe = (13, 10), (1, 2), (0, 1)
    x, w, dy = (a.astype(np.float16) for a in _operands(rng, 2, isz, 16, 24, pb, pe))
    saved = x.copy(), w.copy(), dy.copy()
    attrs = dict(strides=(1, 1), pads_begin=pb, pads_end=pe, strategy="winograd")
    call = {"fwd": lambda x, w, dy: nc.convolution(x, w, **attrs),
            "bwd_d": lambda x, w, dy: nc.convolution_backprop_data(dy, w, isz, **attrs),
            "bwd_w": lambda x, w, dy: nc.convolution_backprop_filters(x, w.shape[:2], dy,
                                                                       **attrs)}[direction]
    plan = nc.plan("convolution", x, w, **attrs)
    assert W.STRATEGY.half_operands(plan.problem, plan.tiles) == {"x", "result"}
    got = call(x, w, dy)
    want = call(x.astype(np.float32), w.astype(np.float32), dy.astype(np.float32))
    assert got.dtype == np.float16
    if direction == "bwd_w":
        ulp = np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)
        assert np.all(np.abs(got - want) <= ulp + 1e-5 * np.abs(want).max())
    else:
        np.testing.assert_array_equal(got.view(np.uint16),
                                      want.astype(np.float16).view(np.uint16))
    for a, s in zip((x, w, dy), saved):
        np.testing.assert_array_equal(a, s)


@pytest.mark.parametrize("direction", ["fwd", "bwd_d", "bwd_w"])
def test_blocks_as_worker_tasks_match_reference(direction, tile_size, monkeypatch):
    # two workers share many blocks: each worker transforms, multiplies and transforms back
    # blocks of its own (backward weights: into its own partial product, added at the end)
    import numba
    from numbaconv import config
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two Numba threads")
    monkeypatch.setattr(config, "THREADS", 2)
    monkeypatch.setattr(W, "TILE_ROWS", 3)
    monkeypatch.setattr(W, "POSITIONS_BELOW_TILES", 0)  # by tiles, with partials
    tile_size(2)
    rng = np.random.default_rng(11)
    isz, pb, pe = (9, 11), (1, 0), (2, 1)
    x, w, dy = _operands(rng, 2, isz, 16, 24, pb, pe)
    args = dict(strides=(1, 1), pads_begin=pb, pads_end=pe)
    plan = {"fwd": lambda: nc.plan("convolution", x, w, **args),
            "bwd_d": lambda: nc.plan("convolution_backprop_data", dy, w, isz, **args),
            "bwd_w": lambda: nc.plan("convolution_backprop_filters", x, w.shape, dy, **args)}
    t = plan[direction]().tiles
    T = W.n_tiles(plan[direction]().problem, 2)
    assert t["workers"] == 2 and -(-T // t["tile_rows"]) >= 4
    assert _run(direction, "float64", x, w, dy, isz, pb, pe) <= 1e-12
    assert _run(direction, "float32", x, w, dy, isz, pb, pe) <= R.WINOGRAD_TOLERANCE["float32"]


@pytest.mark.parametrize("m", [2, 4])
def test_weight_gradient_split_by_position_for_many_workers(m, tile_size, monkeypatch):
    """With few tiles per worker (16 workers), backward weights is split by position (each
    task one position's product over every tile, for a block of C rows; then blocks of C
    rows of the output transform): no partials, every dtype within tolerance, the same
    bits twice."""
    monkeypatch.setattr(W, "task_workers", lambda p: 16)
    monkeypatch.setattr(W, "TILE_ROWS", 5)
    tile_size(m)
    rng = np.random.default_rng(12)
    isz, pb, pe = (14, 13), (1, 0), (1, 1)
    x, w, dy = _operands(rng, 2, isz, 64, 72, pb, pe)
    plan = nc.plan("convolution_backprop_filters", x, w.shape, dy, strides=(1, 1),
                   pads_begin=pb, pads_end=pe, strategy="winograd")
    assert plan.tiles["split"] == "positions" and plan.tiles["m"] == m, plan
    assert _run("bwd_w", "float64", x, w, dy, isz, pb, pe) <= 1e-12
    for dtype in ("float32", "float16"):
        assert _run("bwd_w", dtype, x, w, dy, isz, pb, pe) <= R.WINOGRAD_TOLERANCE[dtype]
    kw = dict(strides=(1, 1), pads_begin=pb, pads_end=pe, strategy="winograd")
    xs, dys = x.astype(np.float32), dy.astype(np.float32)
    first = nc.convolution_backprop_filters(xs, w.shape[:2], dys, **kw)
    assert np.array_equal(first, nc.convolution_backprop_filters(xs, w.shape[:2], dys, **kw))


@pytest.mark.parametrize("direction", ["fwd", "bwd_d", "bwd_w"])
def test_tiny_images_and_pads_beyond_the_kernel(direction, tile_size, monkeypatch):
    # a 1x1 tile grid, tiles overhanging on every side, and pads larger than the kernel
    monkeypatch.setattr(W, "MIN_IMAGE", 1)
    rng = np.random.default_rng(3)
    for m, isz, pb, pe in [(4, (3, 3), (0, 0), (0, 0)), (2, (2, 5), (1, 2), (2, 0)),
                           (4, (5, 4), (3, 0), (1, 4)), (2, (6, 6), (0, 3), (3, 1))]:
        tile_size(m)
        x, w, dy = _operands(rng, 2, isz, 16, 16, pb, pe)
        assert _run(direction, "float64", x, w, dy, isz, pb, pe) <= 1e-12


@pytest.mark.parametrize("direction", ["fwd", "bwd_d", "bwd_w"])
def test_depth_joins_the_batch(direction):
    # 3-D with a depth-1 kernel: every depth slice is an independent 2-D convolution
    rng = np.random.default_rng(4)
    x, w, dy = _operands(rng, 2, (3, 8, 9), 16, 16, (0, 1, 0), (0, 1, 2))
    assert _run(direction, "float64", x, w, dy, (3, 8, 9), (0, 1, 0), (0, 1, 2)) <= 1e-12


def _problem(**kw):
    p = dict(direction="fwd", mb=2, g=1, ic=64, oc=64, isz=(1, 14, 14), ksz=(1, 3, 3),
             osz=(1, 14, 14), stride=(1, 1, 1), dilation=(1, 1, 1), pad_begin=(0, 1, 1),
             pad_end=(0, 1, 1), ndim=2, dtype="float32")
    p.update(kw)
    return ConvProblem(**p)


def test_accepts_and_declines_with_reasons(monkeypatch):
    monkeypatch.setattr(W, "MIN_CHANNELS", 64)
    monkeypatch.setattr(W, "MIN_TILES_PER_CHANNEL", 1 / 2)
    s = W.STRATEGY
    for d in ("fwd", "bwd_d", "bwd_w"):
        assert s.accepts(_problem(direction=d, ic=64, oc=64)) is None
        # ResNet-50 res5b at batch 1: 16 F(2x2) tiles for 512 channels; at batch 8: 128,
        # fewer than half the channels; at batch 16: 256, enough
        res5 = dict(direction=d, ic=512, oc=512, isz=(1, 7, 7), osz=(1, 7, 7))
        assert "16 tiles for 512 channels" in s.accepts(_problem(mb=1, **res5))
        assert "128 tiles for 512 channels" in s.accepts(_problem(mb=8, **res5))
        assert s.accepts(_problem(mb=16, **res5)) is None
        # res4b at batch 8: 128 F(4x4) tiles for 256 channels, just enough
        res4 = dict(direction=d, ic=256, oc=256, isz=(1, 14, 14), osz=(1, 14, 14))
        assert s.accepts(_problem(mb=8, **res4)) is None
    cases = [
        (dict(ksz=(1, 5, 5), osz=(1, 12, 12)), "not 3x3"),
        (dict(ksz=(1, 3, 1)), "not 3x3"),
        (dict(ksz=(3, 3, 3), isz=(3, 14, 14)), "kernel depth 3"),
        (dict(isz=(3, 14, 14), osz=(5, 14, 14), pad_begin=(1, 1, 1), pad_end=(1, 1, 1)),
         "depth stride, dilation or padding"),
        (dict(stride=(1, 2, 2), osz=(1, 7, 7)), "stride 2"),
        (dict(dilation=(1, 2, 2), osz=(1, 12, 12)), "dilation 2"),
        (dict(g=2), "2 groups"),
        (dict(g=64), "64 groups"),
        (dict(ic=8), "8->64 channels"),
        (dict(oc=3), "64->3 channels"),
        (dict(ic=128, oc=32), "128->32 channels"),
        (dict(isz=(1, 3, 14), osz=(1, 3, 14)), "image 3x14"),
        (dict(isz=(1, 3, 14), osz=(1, 3, 14), direction="bwd_w"), "image 3x14"),
    ]
    for kw, reason in cases:
        why = s.accepts(_problem(**kw))
        assert why is not None and reason in why, (kw, why)
    # a forced strategy that declines names itself and its reason
    with pytest.raises(ValueError, match=r"winograd.*stride 2"):
        nc.convolution(np.zeros((1, 8, 8, 16), np.float32), np.zeros((3, 3, 16, 16), np.float32),
                       strides=(2, 2), strategy="winograd")


def test_backward_data_declines_few_tiles_per_thread_on_many_threads(monkeypatch):
    """From MANY_THREADS threads on, backward data with fewer than BWD_D_TILES_PER_THREAD
    tiles per thread goes to the GEMM entries (gemm[implicit] for ResNet-50's res4b_branch2b
    at batch 8: 128 tiles); with more tiles per thread, with fewer threads, and in the
    other directions the entry still takes it."""
    from numbaconv import runtime
    res4 = dict(ic=256, oc=256, isz=(1, 14, 14), osz=(1, 14, 14), mb=8)
    for n, ok in ((2, True), (W.MANY_THREADS - 1, True), (W.MANY_THREADS, False)):
        monkeypatch.setattr(runtime, "threads", lambda n=n: n)
        why = W.STRATEGY.accepts(_problem(direction="bwd_d", **res4))
        assert (why is None) == ok, (n, why)
        assert W.STRATEGY.accepts(_problem(direction="bwd_w", **res4)) is None
        assert W.STRATEGY.accepts(_problem(direction="fwd", **res4)) is None
    assert "128 tiles on 16 threads" in why
    # 56x56 at batch 8: 1568 F(4x4) tiles, 98 per thread
    res2 = dict(ic=64, oc=64, isz=(1, 56, 56), osz=(1, 56, 56), mb=8)
    assert W.STRATEGY.accepts(_problem(direction="bwd_d", **res2)) is None
    planner.clear_plan_cache()
    try:
        dy = np.zeros((8, 14, 14, 256), np.float32)
        plan = nc.plan("convolution_backprop_data", dy, np.zeros((3, 3, 256, 256), np.float32),
                       (14, 14), strides=1, pads_begin=1, pads_end=1)
        # the implicit GEMM (by regions: the padded layer's dY read in place)
        assert (plan.strategy, plan.variant) in (("gemm", "implicit"), ("gemm", "regions"))
        assert "the GEMM entries scale further" in str(plan)
    finally:
        planner.clear_plan_cache()


def test_plan_tiles_and_workspace():
    x = np.zeros((8, 56, 56, 64), np.float32)
    p = nc.plan("conv2d_backprop_filter", x, [3, 3, 64, 64], x, 1, "SAME", strategy="winograd")
    assert p.strategy == "winograd" and p.tiles["m"] in W.TILE_SIZES
    assert isinstance(p.threads, int) and p.workspace_bytes > 0
    a2 = (p.tiles["m"] + 2) ** 2
    rows, T = p.tiles["tile_rows"], W.n_tiles(p.problem, p.tiles["m"])
    # equal blocks of at most TILE_ROWS, in whole rounds of the workers
    nblocks, workers = -(-T // rows), p.tiles["workers"]
    assert 0 < rows <= W.TILE_ROWS and rows * (nblocks - 1) < T
    assert workers == p.threads and nblocks % workers == 0
    assert p.workspace_bytes >= a2 * rows * 128 * 4
    # F(4x4) on large images; F(2x2) when F(4x4) would have few tiles for the channels
    # (res4b at batch 1, res5b at batch 8)
    big = dict(ic=256, oc=256, isz=(1, 14, 14), osz=(1, 14, 14))
    assert W.choose_m(_problem(mb=8, isz=(1, 56, 56), osz=(1, 56, 56))) == 4
    assert W.choose_m(_problem(mb=8, **big)) == 4
    assert W.choose_m(_problem(mb=1, **big)) == 2
    assert W.choose_m(_problem(mb=8, ic=512, oc=512, isz=(1, 7, 7), osz=(1, 7, 7))) == 2



def test_warmup_problems_compile_both_tile_sizes(monkeypatch):
    # numbaconv warmup must reach the Winograd transforms of F(2x2) and F(4x4), in every
    # direction, with the real thresholds
    from numbaconv import _warmup
    monkeypatch.undo()  # the module's own thresholds, not the small_problems fixture's
    assert W.MIN_TILES_PER_CHANNEL > 0
    sizes = set()
    for x, w, g, pad, stride, *dil in _warmup._problems("float32"):
        if (g != 1 or stride != 1 or x.shape[-1] < W.MIN_CHANNELS or w.shape[0] != 3
                or dil and dil[0] != 1):
            continue
        dy = np.ones((x.shape[0], *x.shape[1:-1], w.shape[-1]), np.float32)
        attrs = dict(strides=1, pads_begin=pad, pads_end=pad)
        for fn, args in ((nc.convolution, (x, w)),
                         (nc.convolution_backprop_data, (dy, w, x.shape[1:-1])),
                         (nc.convolution_backprop_filters, (x, w.shape[:-2], dy))):
            problem, _ = fn.parse(*args, **attrs)
            if W.STRATEGY.accepts(problem) is None:
                sizes.add((problem.direction, W.choose_m(problem)))
    assert sizes == {(d, m) for d in ("fwd", "bwd_d", "bwd_w") for m in W.TILE_SIZES}


# ResNet-50's 3x3 stride-1 layers (batch 1 here; the report measures batch 8).
RESNET = [(64, 56), (128, 28), (256, 14), (512, 7)]


@pytest.mark.parametrize("c,s", RESNET, ids=[f"c{c}s{s}" for c, s in RESNET])
def test_resnet50_accuracy(c, s, tile_size):
    rng = np.random.default_rng(c)
    x, w, dy = _operands(rng, 1, (s, s), c, c, (1, 1), (1, 1))
    for m in (2, 4):
        tile_size(m)
        for direction in ("fwd", "bwd_d", "bwd_w"):
            for dtype in ("float32", "float64"):
                err = _run(direction, dtype, x, w, dy, (s, s), (1, 1), (1, 1))
                assert err <= R.WINOGRAD_TOLERANCE[dtype], (m, direction, dtype, err)


@pytest.mark.parametrize("split", ["blocks", "positions"])
@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 2e-5)])
def test_grouped_weight_gradient(split, dtype, tol, monkeypatch):
    """Weight gradients with groups: the transforms over all channels, one GEMM per group
    and position, the product laid out as XIO; against the float64 reference, by tile
    blocks and by positions (every group's rows of the product its own tasks)."""
    monkeypatch.setattr(W, "MIN_CHANNELS", 4)
    monkeypatch.setattr(W, "MIN_TILES_PER_CHANNEL", 0)
    monkeypatch.setattr(W, "POSITIONS_BELOW_TILES", 10 ** 6 if split == "positions" else 0)
    planner.clear_plan_cache()
    rng = np.random.default_rng(11)
    g, icg, ocg = 3, 8, 5
    x = rng.standard_normal((3, 11, 10, g * icg))
    dy = rng.standard_normal((3, 11, 10, g * ocg))
    plan = nc.plan("convolution_backprop_filters", x.astype(dtype), (3, 3), dy.astype(dtype),
                   strides=1, pads_begin=1, pads_end=1, groups=g, strategy="winograd")
    assert (plan.tiles.get("split") == "positions") == (split == "positions"), plan
    got = nc.convolution_backprop_filters(x.astype(dtype), (3, 3), dy.astype(dtype),
                                          strides=1, pads_begin=1, pads_end=1, groups=g,
                                          strategy="winograd")
    one = ((1, 1), (1, 1), (1, 1), (1, 1))
    ref = R.conv_bwd_filter(x, dy, (3, 3), *one, groups=g)
    ra = R.conv_bwd_filter(abs(x), abs(dy), (3, 3), *one, groups=g)
    assert got.dtype == np.dtype(dtype) and got.shape == (3, 3, icg, g * ocg)
    assert R.normalized_error(got, ref, ra) <= tol
    # each group's block is its own: a group's dy alone changes only its outputs
    dy2 = dy.copy()
    dy2[..., ocg:2 * ocg] = 0
    got2 = nc.convolution_backprop_filters(x.astype(dtype), (3, 3), dy2.astype(dtype),
                                           strides=1, pads_begin=1, pads_end=1, groups=g,
                                           strategy="winograd")
    assert np.all(got2[..., ocg:2 * ocg] == 0)
    np.testing.assert_array_equal(got2[..., :ocg], got[..., :ocg])
    planner.clear_plan_cache()


def test_grouped_layers_take_the_weight_gradient_only(monkeypatch):
    """Groups: backward weights only, at least MIN_CHANNELS per group, and not where
    gemm[patch-t] takes the layer (AlexNet's conv5: 2 groups of 192 -> 128); AlexNet's
    conv4 (192 -> 192), which gemm[patch-t] declines, is this entry's."""
    monkeypatch.setattr(W, "MIN_CHANNELS", 64)
    monkeypatch.setattr(W, "MIN_TILES_PER_CHANNEL", 1 / 2)
    s = W.STRATEGY
    conv4 = dict(mb=8, g=2, ic=384, oc=384, isz=(1, 13, 13), osz=(1, 13, 13))
    conv5 = dict(conv4, oc=256)
    from numbaconv.strategies import patcht
    if patcht.STRATEGY.accepts(_problem(direction="bwd_w", **conv4)) is None:
        pytest.skip("gemm[patch-t] takes conv4 on this host's vectors")
    assert s.accepts(_problem(direction="bwd_w", **conv4)) is None
    for d in ("fwd", "bwd_d"):
        assert "2 groups" in s.accepts(_problem(direction=d, **conv4))
    narrow = s.accepts(_problem(direction="bwd_w", **dict(conv4, ic=64, oc=64)))
    assert "32->32 channels" in narrow, narrow
    why5 = s.accepts(_problem(direction="bwd_w", **conv5))
    if patcht.STRATEGY.accepts(_problem(direction="bwd_w", **conv5)) is None:
        assert "gemm[patch-t]" in why5, why5
    else:
        assert why5 is None
