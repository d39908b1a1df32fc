"""Compile (and cache) kernels ahead of time: ``numbaconv warmup`` / :func:`warmup`."""
import time


def _problems(dt):
    """Small problems that, together, every implementation accepts in every direction."""
    import numpy as np
    w3 = np.ones((3, 3, 64, 64), dt)
    dense4 = (np.ones((1, 24, 24, 64), dt), w3, 1)   # gemm, winograd F(4x4): 36 tiles
    dense2 = (np.ones((1, 12, 12, 64), dt), w3, 1)   # winograd F(2x2): 36 tiles (F(4x4): 9)
    narrow = (np.ones((1, 9, 9, 3), dt), np.ones((3, 3, 3, 16), dt), 1)      # per-pixel direct
    depthwise = (np.ones((1, 9, 9, 16), dt), np.ones((3, 3, 1, 16), dt), 16)
    grouped = (np.ones((1, 9, 9, 32), dt), np.ones((3, 3, 4, 32), dt), 8)
    return dense4, dense2, narrow, depthwise, grouped


def warmup(dtypes=("float32",), verbose=False):
    """Compile every implementation's kernels for ``dtypes`` by running small problems.

    With the on-disk cache enabled, later processes load them instead of compiling.
    Returns the seconds spent.
    """
    import numpy as np
    from numbaconv.api import onednn
    from numbaconv.backends import cpu
    from numbaconv.machine import machine
    from numbaconv.planner import _build, candidates
    from numbaconv.runtime import threads
    from numbaconv.strategies import label

    t0 = time.perf_counter()
    for dt in dtypes:
        for x, w, g in _problems(dt):
            attrs = dict(strides=1, pads_begin=1, pads_end=1, groups=g)
            dy = np.ones((1, *x.shape[1:-1], w.shape[-1]), dt)
            calls = {"fwd": (onednn.convolution, (x, w)),
                     "bwd_d": (onednn.convolution_backprop_data, (dy, w, x.shape[1:-1])),
                     "bwd_w": (onednn.convolution_backprop_filters, (x, w.shape[:-2], dy))}
            for direction, (fn, args) in calls.items():
                problem, operands = fn.parse(*args, **attrs)
                for s in candidates(direction):
                    if s.accepts(problem) is not None:
                        continue
                    plan = _build(problem, s, "warmup", (), threads(), machine())
                    cpu.execute(plan, operands)
                    if verbose:
                        print(f"warm {direction:<6} {label(s):<18} {dt:<8} "
                              f"{problem.descriptor():<48} {time.perf_counter() - t0:6.2f} s")
    return time.perf_counter() - t0
