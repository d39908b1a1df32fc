"""Shared inputs and benchmark bases for the topic modules (resnet50.py, mobilenet.py, ...).

Importing this module (and so discovering the suite) compiles nothing: arrays are built and
kernels compiled in ``setup``, once per process (asv re-runs ``setup`` before every sample,
so the warm-up is remembered in :data:`_WARM` and the arrays in an ``lru_cache``).

The bases are underscored so that asv does not collect them here; each topic module
subclasses them with its own ``params``. A parameter combination that does not apply (a
strategy that does not implement a direction, or declines a layer) raises
``NotImplementedError`` in ``setup``, which asv reports as skipped.
"""
import dataclasses
import functools
import math
import time

import numbaconv
from numbaconv import planner, suites

DTYPE = "float32"  # the suites' dtype (numbaconv.suites)
PASSES = suites.PASSES  # ("bwd_d", "bwd_w", "fwd")
GENERIC_OPS = tuple(suites.OPS[d] for d in PASSES)
_PASS_OF_OP = {op: d for d, op in suites.OPS.items()}


def strategy_names():
    """Every strategy some direction offers, in the planner's best-first order."""
    names = []
    for d in PASSES:
        for s in planner.candidates(d):
            if s.name not in names:
                names.append(s.name)
    return names


STRATEGIES = strategy_names()


@functools.lru_cache(maxsize=None)
def arrays(layer_name, dtype=DTYPE):
    """Seeded ``(x, w, dy)`` of a suite layer, built once per process."""
    return suites.tensors(suites.layer(layer_name), dtype, seed=0)


def generic_call(layer_name, direction, dtype=DTYPE):
    """The generic-op :class:`numbaconv.suites.Call` of one pass of a layer."""
    lay = suites.layer(layer_name)
    return suites.call(lay, direction, dtype, arrays=arrays(layer_name, dtype))


# TF op -> pass; depthwise ops take the filter as [kh, kw, C, multiplier].
TF_OPS = {
    "conv2d": "fwd", "conv2d_backprop_input": "bwd_d", "conv2d_backprop_filter": "bwd_w",
    "depthwise_conv2d_native": "fwd", "depthwise_conv2d_native_backprop_input": "bwd_d",
    "depthwise_conv2d_native_backprop_filter": "bwd_w",
    "conv3d": "fwd", "conv3d_backprop_input_v2": "bwd_d", "conv3d_backprop_filter_v2": "bwd_w",
}


def tf_call(layer_name, op, dtype=DTYPE):
    """The TF-style call of ``op`` on a layer: explicit (before, after) pads per axis."""
    lay = suites.layer(layer_name)
    x, w, dy = arrays(layer_name, dtype)
    if op.startswith("depthwise"):
        # XIO [kh, kw, 1, C*m] -> TF [kh, kw, C, m] (output channel c*m + k reads channel c)
        w = w.reshape(*lay.ksz, lay.ic, lay.oc // lay.ic)
    pads = [list(p) for p in zip(lay.pad_begin, lay.pad_end)]
    kw = {"dilations": list(lay.dilation)}
    strides = list(lay.stride)
    direction = TF_OPS[op]
    if direction == "fwd":
        return suites.Call(op, (x, w, strides, pads), kw)
    if direction == "bwd_d":
        return suites.Call(op, ([lay.mb, *lay.isz, lay.ic], w, dy, strides, pads), kw)
    return suites.Call(op, (x, list(w.shape), dy, strides, pads), kw)


def tiny(layer_name):
    """A small layer of the same rank and grouping as ``layer_name``: it runs the same
    compiled kernels (same array ranks and dtype), so it can warm them cheaply."""
    lay = suites.layer(layer_name)
    g = min(lay.g, 2)
    if lay.g == lay.ic == lay.oc:  # depthwise stays depthwise
        ic = oc = g
    else:
        ic = min(lay.ic // lay.g, 16) * g
        oc = min(lay.oc // lay.g, 16) * g
    isz = tuple(max(min(i, 12), (k - 1) * d + 1)
                for i, k, d in zip(lay.isz, lay.ksz, lay.dilation))
    return dataclasses.replace(lay, name=lay.name + "_tiny", mb=1, g=g, ic=ic, oc=oc, isz=isz)


_WARM = set()


def warm(key, fn):
    """Call ``fn()`` once per process for ``key`` (compilation, cache loading)."""
    if key not in _WARM:
        fn()
        _WARM.add(key)


def run(c, **extra):
    return getattr(numbaconv, c.op)(*c.args, **c.kwargs, **extra)


def check_strategy(c, direction, strategy):
    """NotImplementedError (asv: skip) unless ``strategy`` runs this call."""
    if strategy not in [s.name for s in planner.candidates(direction)]:
        raise NotImplementedError(f"{strategy} does not implement {direction}")
    try:
        return numbaconv.plan(c.op, *c.args, strategy=strategy, **c.kwargs)
    except ValueError as exc:  # the forced strategy declines this layer
        raise NotImplementedError(str(exc)) from None


class _Timed:
    """Timing defaults for big layers: setup warms the kernels, so no asv warm-up; few
    samples, as one call is 1 ms to 1 s and the grid has many combinations."""

    number = 1
    repeat = (1, 5, 10.0)
    warmup_time = 0.0
    timeout = 300


class _GenericOps(_Timed):
    """The three generic ops with the planner's own choice of strategy; params: layers x
    op names (from ``GENERIC_OPS``)."""

    param_names = ["layer", "op"]

    def setup(self, layer, op):
        self.call = generic_call(layer, _PASS_OF_OP[op])
        warm(("generic", layer, op), lambda: run(self.call))

    def time_op(self, layer, op):
        run(self.call)

    def track_gflops(self, layer, op):
        """GFLOP/s of the default dispatch (best of 3 calls)."""
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            run(self.call)
            best = min(best, time.perf_counter() - t0)
        return round(suites.layer(layer).flops / best / 1e9, 3)

    track_gflops.unit = "GFLOP/s"


class _TFOps(_Timed):
    """TF-style names (strides/dilations per axis, explicit pad pairs); params: layers x
    TF op names."""

    param_names = ["layer", "op"]

    def setup(self, layer, op):
        self.call = tf_call(layer, op)
        warm(("tf", layer, op), lambda: run(self.call))

    def time_op(self, layer, op):
        run(self.call)


class _Strategies(_Timed):
    """Each strategy forced on each pass; params: layers x passes x ``STRATEGIES``."""

    param_names = ["layer", "direction", "strategy"]

    def setup(self, layer, direction, strategy):
        self.call = generic_call(layer, direction)
        check_strategy(self.call, direction, strategy)
        warm(("strategy", layer, direction, strategy),
             lambda: run(self.call, strategy=strategy))

    def time_strategy(self, layer, direction, strategy):
        run(self.call, strategy=strategy)


class _PeakMem:
    """Memory of one call with a forced strategy; params: layers x passes x strategies.

    ``peakmem_`` is the process's peak RSS, setup included, so setup warms the kernels on
    :func:`tiny` (same compiled code, negligible arrays) rather than on the layer itself.
    ``track_workspace_bytes`` is the plan's own account of its scratch (per-thread partials,
    im2col slabs): exact, so a change in it is a change in the strategy, not noise.
    """

    param_names = ["layer", "direction", "strategy"]
    timeout = 300

    def setup(self, layer, direction, strategy):
        self.call = generic_call(layer, direction)
        self.plan = check_strategy(self.call, direction, strategy)
        small = tiny(layer)
        c = suites.call(small, direction, DTYPE)
        try:
            numbaconv.plan(c.op, *c.args, strategy=strategy, **c.kwargs)
        except ValueError:  # the strategy declines the tiny twin: warm on the real layer
            c = self.call
        warm(("tiny", layer, direction, strategy), lambda: run(c, strategy=strategy))

    def peakmem_strategy(self, layer, direction, strategy):
        run(self.call, strategy=strategy)

    def track_workspace_bytes(self, layer, direction, strategy):
        return self.plan.workspace_bytes

    track_workspace_bytes.unit = "bytes"


def as_list(names):
    """Validate layer names at import (a typo fails discovery, not a benchmark)."""
    for n in names:
        suites.layer(n)
    return list(names)

