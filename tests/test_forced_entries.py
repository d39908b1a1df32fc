"""``strategy=`` names a family (its first accepting entry, best first) or one entry,
``family[variant]``: every entry forced by its label runs (and matches the reference) on a
small problem it accepts; a forced entry that declines, or an unknown label, is a
ValueError saying why."""
import numpy as np
import pytest

import numbaconv as nc
from numbaconv import planner
from numbaconv.strategies import label
from reference import assert_matches, conv_bwd_data_ref, conv_bwd_filter_ref, conv_fwd_ref
from strategy_cases import CASES, call, operands, patch
from strategy_cases import plan as plan_of


def _first_case_per_entry():
    """One float32 strategy case per (label, direction)."""
    seen = {}
    for c in CASES:
        if c.dtype == "float32":
            seen.setdefault((c.label, c.direction), c)
    return seen


ENTRIES = _first_case_per_entry()
#: Entries that accept bfloat16 problems only: their cases are in tests/test_bfloat16.py.
BFLOAT16_ONLY = {"gemm[bf16-amx-taps]", "gemm[bf16-amx]", "gemm[bf16-dot]", "gemm[bf16-regions]", "gemm[bf16-wgrad]"}


def test_labels_are_the_planners_list():
    assert planner.LABELS == tuple(label(s) for s in planner._strategies())
    assert set(planner.STRATEGY_NAMES) == set(planner.FAMILIES) | set(planner.LABELS)


def test_every_entry_has_a_case():
    """Every (entry, direction) the planner has is reached by a strategy case."""
    have = set(ENTRIES)
    for direction in ("fwd", "bwd_d", "bwd_w"):
        for s in planner.candidates(direction):
            if label(s) not in BFLOAT16_ONLY:
                assert (label(s), direction) in have, (label(s), direction)


def _reference(case, ops):
    nd = len(case.isz)
    pb, pe = case.pads or ((0,) * nd, (0,) * nd)
    kw = dict(stride=case.stride or 1, dilation=case.dilation or 1, pads_begin=pb,
              pads_end=pe, groups=case.g)
    if case.direction == "fwd":
        return conv_fwd_ref, (ops["x"], ops["w"]), kw
    if case.direction == "bwd_d":
        return (lambda dy, w, **k: conv_bwd_data_ref(dy, w, case.isz, **k)), \
            (ops["dy"], ops["w"]), kw
    return (lambda x, dy, **k: conv_bwd_filter_ref(x, dy, case.k, **k)), \
        (ops["x"], ops["dy"]), kw


@pytest.mark.parametrize("key", sorted(ENTRIES), ids=[f"{k[0]}-{k[1]}" for k in sorted(ENTRIES)])
def test_forced_entry_runs_and_matches_reference(key, monkeypatch):
    case = ENTRIES[key]
    forced = type(case)(**{**case.__dict__, "strategy": case.label})
    patch(forced, monkeypatch)
    ops = operands(forced)
    p = plan_of(forced, ops)
    assert label(planner.implementation(p)) == case.label and "forced" in p.reason, str(p)
    got = call(forced, ops)
    ref_fn, args, kw = _reference(forced, ops)
    assert_matches(got, np.float32, ref_fn, *args, strategy=p.strategy, **kw)


def test_forced_entry_that_declines_names_itself_and_its_reason():
    x = np.zeros((1, 8, 8, 16), np.float32)
    dy = np.zeros((1, 8, 8, 16), np.float32)
    with pytest.raises(ValueError, match=r"'gemm\[split-k\]' declines .*gemm\[split-k\]: "
                                         r".*3x3 kernel.*not the arrays themselves"):
        nc.plan("convolution_backprop_filters", x, (3, 3), dy, strides=1, pads_begin=1,
                pads_end=1, strategy="gemm[split-k]")
    w = np.zeros((3, 3, 16, 16), np.float32)
    with pytest.raises(ValueError, match=r"direct\[depthwise-rows\]: not depthwise"):
        nc.plan("convolution_backprop_data", dy, w, (8, 8), strides=1, pads_begin=1,
                pads_end=1, strategy="direct[depthwise-rows]")
    # an entry that does not implement the direction
    with pytest.raises(ValueError, match=r"'gemm\[claimed\]' does not implement direction"):
        nc.plan("convolution", x, w, strides=1, pads_begin=1, pads_end=1,
                strategy="gemm[claimed]")


def test_forced_entry_on_the_numba_engine_only(monkeypatch):
    """Split-K and claimed rows exist on the Numba engine only; their reason says so."""
    from numbaconv import config
    monkeypatch.setattr(config, "GEMM_ENGINE", "blas")
    x = np.zeros((2, 8, 8, 16), np.float32)
    with pytest.raises(ValueError, match=r"split-k path runs on the Numba engine; this "
                                         r"problem's engine is blas"):
        nc.plan("convolution_backprop_filters", x, (1, 1), x, strides=1,
                strategy="gemm[split-k]")
    assert nc.plan("convolution_backprop_filters", x, (1, 1), x, strides=1,
                   strategy="gemm").variant == "identity"


def test_family_name_takes_the_first_accepting_entry():
    x = np.zeros((2, 8, 8, 16), np.float32)
    w = np.zeros((3, 3, 16, 16), np.float32)
    p = nc.plan("convolution", x, w, strides=1, pads_begin=1, pads_end=1, strategy="gemm")
    first = next(s for s in planner.candidates("fwd")
                 if s.name == "gemm" and s.accepts(p.problem) is None)
    assert (p.strategy, p.variant) == ("gemm", first.variant)


@pytest.mark.parametrize("bad", ["gemm[nope]", "gemm[]", "direct[rows]", "GEMM[slabs]"])
def test_unknown_label_lists_the_valid_ones(bad):
    x = np.zeros((1, 8, 8, 16), np.float32)
    w = np.zeros((3, 3, 16, 16), np.float32)
    with pytest.raises(ValueError, match=r"gemm\[split-k\].*direct\[depthwise-spans\]"):
        nc.plan("convolution", x, w, strides=1, strategy=bad)
