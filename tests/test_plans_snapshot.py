"""Naming every kernel choice as a planner entry changed no plan: every suite layer (in
every dtype, direction, engine setting and thread count) and every strategy case plans the
kernel and tiles it did before, under its new label.

``tests/data/plans_snapshot.json`` was recorded by ``tests/snapshot_plans.py`` while the
GEMM strategy's sub-paths and the depthwise kernels were still tiles of one entry each; it
is planned again here on the machine model, vector width and thresholds saved with it.
"""
import json
import os

import pytest

import snapshot_plans
from numbaconv import config
from numbaconv.strategies import _gemm_common

SNAPSHOT = os.path.join(os.path.dirname(__file__), "data", "plans_snapshot.json")
#: Tiles that became part of the label (``gemm[split-k]`` for ``split="k"``, ...).
MOVED = ("packed", "split", "taps", "kernel", "unrolled_3x3")
_DEPTHWISE = {"rows_3x3": "depthwise-rows", "unrolled_3x3": "depthwise-unrolled",
              "spans": "depthwise-spans", "general": "depthwise"}


def new_label(strategy, variant, tiles):
    """The label today of an entry recorded as ``(strategy, variant, tiles)``."""
    if strategy == "gemm" and not variant:
        if tiles.get("split") == "k":
            return "gemm[split-k]"
        if "claim" in tiles:
            return "gemm[claimed]"
        if tiles.get("taps") == "per-tap":
            return "gemm[per-tap]"
        if tiles.get("split") == "dw":
            return "gemm[split-dw]"
        return "gemm[slabs]" if tiles.get("packed") else "gemm[identity]"
    if (strategy, variant) == ("direct", "depthwise"):
        kernel = tiles.get("kernel") or ("unrolled_3x3" if tiles.get("unrolled_3x3")
                                         else "general")
        return f"direct[{_DEPTHWISE[kernel]}]"
    return f"{strategy}[{variant}]" if variant else strategy


@pytest.fixture(scope="module")
def snapshot():
    with open(SNAPSHOT) as f:
        return json.load(f)


@pytest.fixture
def recorded_conditions(snapshot, monkeypatch):
    """The host model, thresholds and thread counts the snapshot was planned under."""
    import numba

    import numbaconv.machine
    from numbaconv.kernels.cpu import ukernel
    cond = snapshot["conditions"]
    if ukernel.VECTOR_BYTES != cond["vector_bytes"]:
        pytest.skip(f"recorded for {cond['vector_bytes']}-byte vectors, the host has "
                    f"{ukernel.VECTOR_BYTES}")
    if numba.config.NUMBA_NUM_THREADS < max(snapshot_plans.THREADS):
        pytest.skip("fewer Numba threads than the snapshot's thread counts")
    m = numbaconv.machine.Machine(**{**cond["machine"],
                                     "features": tuple(cond["machine"]["features"])})
    monkeypatch.setattr(numbaconv.machine, "machine", lambda: m)
    monkeypatch.setattr(config, "SMALL_FLOPS", cond["small_flops"])
    monkeypatch.setattr(_gemm_common, "SERIAL_MAX_FLOPS", cond["serial_max_flops"])


def _compare(old, new):
    wrong = []
    for key, (strategy, variant, tiles) in old.items():
        n_strategy, n_variant, n_tiles = new[key]
        want = (new_label(strategy, variant, tiles),
                {k: v for k, v in tiles.items() if k not in MOVED})
        got = (f"{n_strategy}[{n_variant}]" if n_variant else n_strategy, n_tiles)
        if got != want:
            wrong.append(f"{key}: was {want}, now {got}")
    assert not wrong, f"{len(wrong)} of {len(old)} plans changed:\n" + "\n".join(wrong[:20])


def test_suite_plans_unchanged(snapshot, recorded_conditions):
    _compare(snapshot["plans"], snapshot_plans.plans())


def test_strategy_case_plans_unchanged(snapshot, recorded_conditions):
    _compare(snapshot["cases"], snapshot_plans.cases())


def test_every_recorded_label_is_an_entry(snapshot):
    from numbaconv.planner import LABELS
    for old in ("plans", "cases"):
        for strategy, variant, tiles in snapshot[old].values():
            assert new_label(strategy, variant, tiles) in LABELS
