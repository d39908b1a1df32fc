"""Compile (and cache) kernels ahead of time: ``numbaconv warmup`` / :func:`warmup`."""
import time


def warmup(dtypes=("float32",), verbose=False):
    """Compile every strategy's kernels for ``dtypes`` by running tiny problems.

    With the on-disk cache enabled, later processes load them instead of compiling.
    Returns the seconds spent.
    """
    import numpy as np
    import numbaconv as nc
    from numbaconv.planner import candidates

    t0 = time.perf_counter()
    for dt in dtypes:
        x = np.ones((2, 6, 6, 4), dt)
        w = np.ones((3, 3, 4, 4), dt)
        dy = np.ones((2, 6, 6, 4), dt)
        for direction in ("fwd", "bwd_d", "bwd_w"):
            for s in candidates(direction):
                kw = dict(strategy=s.name)
                try:
                    if direction == "fwd":
                        nc.conv2d(x, w, 1, "SAME", **kw)
                    elif direction == "bwd_d":
                        nc.conv2d_backprop_input(x.shape, w, dy, 1, "SAME", **kw)
                    else:
                        nc.conv2d_backprop_filter(x, w.shape, dy, 1, "SAME", **kw)
                except ValueError:
                    pass  # the strategy declines this tiny problem
                if verbose:
                    print(f"warm {direction:<6} {s.name:<9} {dt:<8} "
                          f"{time.perf_counter() - t0:6.2f} s")
    return time.perf_counter() - t0
