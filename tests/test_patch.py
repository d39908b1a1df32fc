"""The patch variant of the GEMM strategy (weight gradients as one GEMM per output row, A's
rows taken from the input through a table of offsets,
:func:`numbaconv.kernels.cpu.ukernel.gemm_patch_bwd_w`) against the float64 NumPy
reference: 1-D, 2-D and 3-D, strides, dilation along every axis, pads on either side
(wider than the kernel too, and rows whose every pixel reaches into the padding), output
channels that are and are not whole vectors (one to eight of them), float16/32/64, one
thread; and the planner's choice of it."""
import numpy as np
import pytest

import numbaconv as nc
from numbaconv import config
from numbaconv.strategies import patch
from reference import case_operands, conv_bwd_filter_ref, normalized_error, tolerance



@pytest.fixture(autouse=True)
def wide_vector_planner(monkeypatch):
    """The planner's model of a host with 512-bit vectors, where the entry's rules were
    set and which its wider cases need (with 256-bit vectors it declines more than
    ``NARROW_VECTOR_INPUTS`` input channels: ``test_patch_narrow_vectors``); the kernels
    run at the host's own width either way."""
    import dataclasses

    import numbaconv.machine
    real = numbaconv.machine.machine()
    monkeypatch.setattr(numbaconv.machine, "machine",
                        lambda: dataclasses.replace(real, vector_bytes=64))


# (mb, ic, oc, input spatial, kernel, stride, dilation, pads_begin, pads_end)
CASES = [
    # an RGB 3x3 stem at stride 2 (27 patch rows; one vector of output channels)
    (2, 3, 16, (19, 21), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
    # 7x7 at stride 2, asymmetric pads, 17 output channels (a vector and one lane)
    (2, 3, 17, (11, 13), (7, 7), (2, 2), (1, 1), (3, 2), (2, 3)),
    # one channel, dilation along h and w, pads wider than the kernel along h
    (1, 1, 8, (6, 10), (3, 4), (1, 3), (2, 2), (4, 1), (3, 0)),
    # 3-D, stride and dilation along d, one output pixel per row along w
    (2, 4, 12, (5, 4, 3), (3, 2, 3), (2, 1, 1), (2, 1, 1), (1, 0, 0), (1, 1, 0)),
    # 1-D, every output pixel reaches into the padding (no pixel for the register tiles)
    (1, 2, 9, (4,), (5,), (1,), (1,), (4,), (4,)),
    # ConvNeXt-like patchify 4x4 at stride 4, 96 output channels (four vectors, then two)
    (2, 3, 96, (20, 21), (4, 4), (4, 4), (1, 1), (0, 0), (0, 0)),
    # a (2+1)-D spatial stem: 1x7x7 over a clip, 45 output channels (three vectors)
    (2, 3, 45, (3, 15, 16), (1, 7, 7), (1, 2, 2), (1, 1, 1), (0, 3, 3), (0, 3, 3)),
    # 128 output channels (two passes of four vectors), more rows than threads
    (3, 3, 128, (8, 30), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    # not a stem: 24 input channels over long rows (216 patch rows), 20 output channels
    (2, 24, 20, (5, 41), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    # WaveNet-like: 2 taps dilated by 16, 32 channels
    (2, 32, 64, (300,), (2,), (1,), (16,), (0,), (0,)),
    # 1x1 over 16 channels, 40 output channels (three vectors)
    (2, 16, 40, (6, 30), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
]
IDS = [f"mb{c[0]}ic{c[1]}oc{c[2]}i{'x'.join(map(str, c[3]))}k{'x'.join(map(str, c[4]))}"
       f"s{'x'.join(map(str, c[5]))}" for c in CASES]


def _run(case, dtype, seed=0, strategy=None):
    mb, ic, oc, isz, k, st, dl, pb, pe = case
    x, w, dy, geom, attrs = case_operands(case, dtype, seed)
    x0, dy0 = x.copy(), dy.copy()
    plan = nc.plan("convolution_backprop_filters", x, k, dy, strategy=strategy, **attrs)
    assert (plan.strategy, plan.variant) == ("gemm", "patch"), plan
    got = nc.convolution_backprop_filters(x, k, dy, strategy=strategy, **attrs)
    assert got.dtype == np.dtype(dtype) and got.shape == w.shape
    assert np.array_equal(x, x0) and np.array_equal(dy, dy0)  # inputs untouched
    return normalized_error(got, conv_bwd_filter_ref, x, dy, k, **geom)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_patch_variant_matches_reference(case, dtype):
    assert _run(case, dtype, strategy="gemm[patch]") <= tolerance(dtype)


def test_patch_variant_float16():
    assert _run(CASES[1], "float16", strategy="gemm[patch]") <= tolerance("float16")


def test_patch_variant_one_thread():
    nt = nc.get_num_threads()
    try:
        nc.set_num_threads(1)
        assert _run(CASES[6], "float32", seed=3, strategy="gemm[patch]") <= tolerance("float32")
    finally:
        nc.set_num_threads(nt)


def test_patch_variant_is_the_default_for_a_stem(monkeypatch):
    """Above the small-problem limit the planner takes it unforced for a stem."""
    monkeypatch.setattr(config, "SMALL_FLOPS", 0)
    assert _run(CASES[0], "float32") <= tolerance("float32")


def test_patch_variant_ignores_what_lies_past_the_output_channels():
    """dY's rows are read in place, a whole vector a pixel: the lanes past K belong to the
    next pixel; huge values there must not reach the result."""
    mb, ic, oc, isz, k = 2, 3, 13, (9, 12), (3, 3)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((mb, *isz, ic)).astype(np.float32)
    dy = rng.standard_normal((mb, *isz, oc)).astype(np.float32)
    dy[..., 0] *= 1e30  # channel 0 is what the previous pixel's last vector runs into
    attrs = dict(strides=1, pads_begin=1, pads_end=1)
    got = nc.convolution_backprop_filters(x, k, dy, strategy="gemm[patch]", **attrs)
    want = conv_bwd_filter_ref(x.astype(np.float64), dy.astype(np.float64), k, stride=(1, 1),
                               dilation=(1, 1), pads_begin=(1, 1), pads_end=(1, 1))
    assert np.all(np.isfinite(got))
    rest = np.abs(got[..., 1:] - want[..., 1:]).max() / np.abs(want[..., 1:]).max()
    assert rest <= tolerance("float32")


def test_patch_variant_choice(without_patch_t):
    """Stems (at most 4 input channels) with 8-128 output channels take the patch variant
    whatever their rows; more input channels take it over long rows with short ends, and
    1x1 layers up to 32 input channels; fewer or more output channels, wider 1x1 layers,
    groups and the other directions do not, each with its reason."""
    def plan(ic, oc, k=(7,), n=300, dl=(1,), groups=1, op="convolution_backprop_filters"):
        x = np.zeros((8, n, ic), np.float32)
        dy = np.zeros((8, n - (k[0] - 1) * dl[0], oc), np.float32)
        attrs = dict(strides=1, dilations=dl, pads_begin=0, pads_end=0, groups=groups)
        if op == "convolution_backprop_filters":
            return nc.plan(op, x, k, dy, **attrs)
        w = np.zeros((*k, ic // groups, oc), np.float32)
        return nc.plan(op, dy, w, (n,), **attrs)

    assert plan(3, 64).variant == "patch"
    assert plan(1, 8).variant == "patch"
    assert plan(patch.MAX_STEM_CHANNELS, patch.MAX_OUTPUT_CHANNELS).variant == "patch"
    assert plan(patch.MAX_STEM_CHANNELS, 16, k=(3,), n=8).variant == "patch"  # short rows
    assert plan(32, 64, k=(3,)).variant == "patch"
    short = plan(32, 64, k=(3,), n=patch.MIN_ROW_PIXELS + 1)
    assert short.variant != "patch" and "short GEMMs" in str(short)
    ends = plan(32, 64, k=(2,), dl=(40,))        # 40 of 260 pixels at the ends
    assert ends.variant != "patch" and "at its ends" in str(ends)
    few = plan(3, 4)
    assert few.variant != "patch" and "4 output channels" in str(few)
    wide = plan(1, patch.MAX_OUTPUT_CHANNELS + 1)
    assert wide.variant != "patch" and "full-width GEMM" in str(wide)
    assert plan(patch.MAX_POINTWISE_CHANNELS, 64, k=(1,)).variant == "patch"
    one = plan(patch.MAX_POINTWISE_CHANNELS + 1, 64, k=(1,))
    assert one.variant != "patch" and "1x1 over" in str(one)
    assert plan(4, 64, groups=2).variant != "patch"
    assert plan(3, 64, op="convolution_backprop_data").variant != "patch"


def test_patch_variant_declines_the_blas_engine(monkeypatch):
    monkeypatch.setattr(config, "GEMM_ENGINE", "blas")
    x, dy = np.zeros((8, 300, 3), np.float32), np.zeros((8, 294, 64), np.float32)
    plan = nc.plan("convolution_backprop_filters", x, (7,), dy, strides=1, pads_begin=0,
                   pads_end=0)
    assert plan.variant != "patch" and "GEMM_ENGINE" in str(plan)


def test_patch_narrow_vectors(monkeypatch):
    """With 256-bit vectors the entry takes at most NARROW_VECTOR_INPUTS input channels
    (stems, narrow inputs); wider layers decline with the reason."""
    import dataclasses

    import numbaconv.machine
    real = numbaconv.machine.machine()
    monkeypatch.setattr(numbaconv.machine, "machine",
                        lambda: dataclasses.replace(real, vector_bytes=32))

    def why(ic, oc=64):
        p = nc.problem.ConvProblem("bwd_w", 8, 1, ic, oc, (1, 1, 300), (1, 1, 3),
                                   (1, 1, 298), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0),
                                   1, "float32")
        return patch.STRATEGY.accepts(p)

    assert why(3) is None and why(patch.NARROW_VECTOR_INPUTS) is None
    wide = why(patch.NARROW_VECTOR_INPUTS + 1)
    assert "256-bit vectors" in wide and "17 input channels" in wide
