"""Random problems through the default plan and every planner entry that accepts them,
each result against the float64 reference (a developer's tool: the audit to run on a host
of a new kind, whose vector width, caches and core count select other tiles and rules):

    python3 tools/fuzz_entries.py [FIRST_SEED] [SECONDS] [SIZE]

Problem ``FIRST_SEED + i`` (default 0) is drawn from its own seed until ``SECONDS``
(default 600) have passed: 1-3 spatial dims, 1-16 groups or depthwise, channels per group
that are and are not whole vectors, kernels of 1-7 taps, strides and dilations of 1-3,
asymmetric pads, batch 1-4, float32 or float64; spatial sizes up to ``SIZE`` times
(default 1) 200 / 30 / 10 pixels per axis in 1-D / 2-D / 3-D, so that ``SIZE`` 3 or more
reaches the compiled kernels' tiles on the default plan too (smaller problems run on the
``numpy`` entries unless forced). Every forward, backward-data and weight-gradient call
is checked by the normalised error of docs/contract.md section 10 against the tolerance
of ``tests/reference.py``. Prints one line per failure (its seed reproduces it) and a
summary; exit status 1 if any failed. ``direct`` (the plain loop nest) is left out.
"""
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import numbaconv as nc  # noqa: E402
from numbaconv import planner  # noqa: E402
from reference import (conv_bwd_data_ref, conv_bwd_filter_ref, conv_fwd_ref,  # noqa: E402
                       normalized_error, out_shape, tolerance)


def draw(seed, size):
    """One problem: ``(x, w, dy, attrs, description)``, or None where it has no output."""
    r = np.random.default_rng(seed)
    nd = int(r.choice([1, 2, 2, 2, 3]))
    if r.random() < 0.15:  # depthwise
        g, cg, kg = int(r.choice([8, 16, 24, 40, 64])), 1, 1
    else:
        g = int(r.choice([1, 1, 1, 2, 3, 4, 8, 16]))
        cg = int(r.choice([1, 2, 3, 5, 8, 12, 16, 17, 24, 32, 40]))
        kg = int(r.choice([1, 2, 4, 7, 8, 12, 16, 24, 33, 48]))
    k = tuple(int(r.choice([1, 1, 2, 3, 3, 5, 7])) for _ in range(nd))
    s = tuple(int(r.choice([1, 1, 1, 2, 3])) for _ in range(nd))
    d = tuple(int(r.choice([1, 1, 1, 2, 3])) for _ in range(nd))
    pb = tuple(int(r.integers(0, 4)) for _ in range(nd))
    pe = tuple(int(r.integers(0, 4)) for _ in range(nd))
    most = int({1: 200, 2: 30, 3: 10}[nd] * size)
    xs = tuple(max(int(r.integers(1, most)), (kk - 1) * dd + 1 - a - b)
               for kk, dd, a, b in zip(k, d, pb, pe))
    mb = int(r.integers(1, 5))
    dt = np.float32 if r.random() < 0.8 else np.float64
    o = out_shape(xs, k, s, d, pb, pe)
    if min(o) < 1:
        return None
    x = r.standard_normal((mb, *xs, cg * g)).astype(dt)
    w = r.standard_normal((*k, cg, kg * g)).astype(dt)
    dy = r.standard_normal((mb, *o, kg * g)).astype(dt)
    attrs = dict(strides=list(s), dilations=list(d), pads_begin=list(pb),
                 pads_end=list(pe), groups=g)
    what = (f"seed={seed} mb={mb} x={xs} C={cg * g} K={kg * g} groups={g} k={k} "
            f"stride={s} dilation={d} pads={pb}/{pe} {np.dtype(dt).name}")
    return x, w, dy, attrs, what


def main(argv):
    first = int(argv[0]) if argv else 0
    seconds = float(argv[1]) if len(argv) > 1 else 600.0
    size = float(argv[2]) if len(argv) > 2 else 1.0
    entries = [s for s in planner.STRATEGY_NAMES if s != "direct"]
    t0, checked, failed, seed = time.perf_counter(), 0, 0, first
    while time.perf_counter() - t0 < seconds:
        problem = draw(seed, size)
        seed += 1
        if problem is None:
            continue
        x, w, dy, attrs, what = problem
        geom = dict(stride=attrs["strides"], dilation=attrs["dilations"],
                    pads_begin=attrs["pads_begin"], pads_end=attrs["pads_end"],
                    groups=attrs["groups"])
        k, xs = w.shape[:-2], x.shape[1:-1]
        passes = {"fwd": ("convolution", (x, w), conv_fwd_ref, (x, w)),
                  "bwd_d": ("convolution_backprop_data", (dy, w, list(xs)),
                            conv_bwd_data_ref, (dy, w, xs)),
                  "bwd_w": ("convolution_backprop_filters", (x, list(k), dy),
                            conv_bwd_filter_ref, (x, dy, k))}
        for direction, (op, args, ref, ref_args) in passes.items():
            fn, seen = getattr(nc, op), set()
            for entry in [None, *entries]:
                label = "default plan"
                try:
                    if entry is None:
                        strategy = nc.plan(op, *args, **attrs).strategy
                    else:
                        try:
                            plan = nc.plan(op, *args, strategy=entry, **attrs)
                        except ValueError:
                            continue  # declines this problem
                        label = plan.strategy + (f"[{plan.variant}]" if plan.variant else "")
                        if label in seen or label == "direct":
                            continue
                        seen.add(label)
                        strategy = plan.strategy
                    got = fn(*args, **attrs) if entry is None else fn(*args, strategy=label,
                                                                      **attrs)
                    checked += 1
                    err = normalized_error(got, ref, *ref_args, **geom)
                    tol = tolerance(x.dtype, strategy)
                    if not err <= tol:
                        failed += 1
                        print(f"FAIL {direction} {label}: error {err:.2e} > {tol:.0e}; {what}",
                              flush=True)
                except Exception as exc:  # noqa: BLE001  (report every kind of failure)
                    failed += 1
                    print(f"ERROR {direction} {label}: {type(exc).__name__}: {exc}; {what}",
                          flush=True)
    print(f"seeds {first}..{seed - 1}: {checked} results checked, {failed} failed, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
