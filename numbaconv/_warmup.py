"""Compile (and cache) kernels ahead of time: ``numbaconv warmup`` / :func:`warmup`."""
import time


def _problems(dt):
    """Small problems that, together, every implementation accepts in every direction:
    ``(x, w, groups, pad, stride[, dilation])``."""
    import numpy as np
    if dt == "bfloat16":
        import ml_dtypes  # noqa: F401  (registers the dtype name)
    w3 = np.ones((3, 3, 64, 64), dt)
    dense4 = (np.ones((1, 24, 24, 64), dt), w3, 1, 1, 1)  # gemm, winograd F(4x4): 36 tiles
    dense2 = (np.ones((1, 12, 12, 64), dt), w3, 1, 1, 1)  # winograd F(2x2): 36 tiles
    narrow = (np.ones((1, 9, 9, 3), dt), np.ones((3, 3, 3, 16), dt), 1, 1, 1)  # per-pixel
    wd = np.ones((3, 3, 1, 16), dt)
    depthwise = (np.ones((1, 9, 9, 16), dt), wd, 16, 1, 1)
    # depthwise at stride 2 (the row kernels are compiled per column stride)
    depthwise2 = (np.ones((1, 10, 10, 16), dt), wd, 16, 1, 2)
    grouped = (np.ones((1, 9, 9, 32), dt), np.ones((3, 3, 4, 32), dt), 8, 1, 1)
    # square groups of one vector of channels (gemm[grouped]: ResNeXt's third stage), 4
    # of them and a fifth (the last block of groups one at a time)
    from numbaconv.kernels.cpu._host import VECTOR_BYTES
    vl = VECTOR_BYTES // (8 if dt == "float64" else 4)
    square = (np.ones((1, 9, 9, 5 * vl), dt), np.ones((3, 3, vl, 5 * vl), dt), 5, 1, 1)
    # 1x1 (48x48: enough pixels that gemm[bf16-dot]'s weight gradient splits its reduction
    # and transposes x and pairs dY inside its GEMM)
    pointwise = (np.ones((2, 48, 48, 64), dt), np.ones((1, 1, 64, 64), dt), 1, 0, 1)
    # a short reduction into a larger dW (the split-dW weight gradient)
    short = (np.ones((1, 6, 6, 256), dt), np.ones((3, 3, 256, 256), dt), 1, 1, 1)
    # few output channels (a head: direct[narrow]'s weight gradient; a growth layer:
    # gemm[patch-t]'s)
    head = (np.ones((1, 9, 9, 16), dt), np.ones((3, 3, 16, 4), dt), 1, 1, 1)
    growth = (np.ones((1, 8, 8, 48), dt), np.ones((3, 3, 48, 12), dt), 1, 1, 1)
    # dilated (gemm[regions]: over row blocks with a filter in L2, and over channel
    # panels with a larger one)
    dilated = (np.ones((1, 13, 13, 64), dt), w3, 1, 4, 1, 4)
    dilated_wide = (np.ones((1, 13, 13, 128), dt), np.ones((3, 3, 128, 256), dt), 1, 4, 1, 4)
    # a long depthwise kernel row (the padded rows' drivers: QuartzNet's 1-D layers, 5x5
    # and 7x7 filters)
    long_row = (np.ones((1, 40, 16), dt), np.ones((17, 1, 16), dt), 16, 8, 1)
    problems = (dense4, dense2, narrow, depthwise, depthwise2, grouped, pointwise, short,
                head, dilated, dilated_wide, long_row, growth, square)
    if dt == "bfloat16":  # 512 pairs of output pixels at stride 2: gemm[bf16-wgrad]
        problems += ((np.ones((1, 64, 64, 32), dt), np.ones((3, 3, 32, 32), dt), 1, 1, 2),)
    return problems


def _calls(dt):
    """Per warm-up problem: its parse function and arguments per direction, its attributes."""
    import numpy as np
    from numbaconv.api import onednn
    calls = []
    for x, w, g, pad, stride, *dil in _problems(dt):
        dil = dil[0] if dil else 1
        k = w.shape[:-2]
        osz = tuple((n + 2 * pad - dil * (kk - 1) - 1) // stride + 1
                    for n, kk in zip(x.shape[1:-1], k))
        dy = np.ones((x.shape[0], *osz, w.shape[-1]), dt)
        calls.append(({"fwd": (onednn.convolution.parse, (x, w)),
                       "bwd_d": (onednn.convolution_backprop_data.parse,
                                 (dy, w, x.shape[1:-1])),
                       "bwd_w": (onednn.convolution_backprop_filters.parse,
                                 (x, w.shape[:-2], dy))},
                      dict(strides=stride, pads_begin=pad, pads_end=pad, groups=g,
                           dilations=dil)))
    return calls


#: gemm entries whose kernels share nothing with the other gemm entries', by the group name
#: they take (the entries of one kernel module share its helpers: one group).
_OWN_MODULES = {"gemm[patch-t]": "patcht", "gemm[implicit]": "igemm", "gemm[regions]": "igemm",
                "gemm[grouped]": "ggemm"}


def _group(name):
    if name in _OWN_MODULES:
        return _OWN_MODULES[name]
    return "gemm" if name.startswith("gemm[") else name


def _tasks(dtypes):
    """``(dtype, problem index, direction, label)`` of every implementation that accepts one
    of the warm-up problems, grouped by ``(label, dtype)``: a group's kernels share helpers,
    so one process compiles them together. The ``gemm`` entries of one dtype form one
    group: most of them call the shared GEMM micro-kernel (``ukernel._gemm``), which two
    processes would otherwise both compile; those whose kernel modules are their own
    (:data:`_OWN_MODULES`) are groups of their own, so that the pool can spread them."""
    from numbaconv.planner import candidates
    from numbaconv.strategies import label

    groups = {}
    for dt in dtypes:
        for i, (fns, attrs) in enumerate(_calls(dt)):
            for direction, (parse, args) in fns.items():
                problem, _ = parse(*args, **attrs)
                for s in candidates(direction):
                    if s.accepts(problem) is None:
                        name = label(s)
                        key = (_group(name), dt)
                        groups.setdefault(key, []).append((dt, i, direction, name))
    return list(groups.values())


def _run_group(group):
    """Run every task of one group in this process; ``[(task, seconds)]``."""
    from numbaconv import config
    from numbaconv.backends import cpu
    from numbaconv.machine import machine
    from numbaconv.planner import _build, candidates
    from numbaconv.runtime import threads
    from numbaconv.strategies import label

    done = []
    calls = {}
    # warm-up spreads whole groups over processes itself: no helper per first call
    ahead, config.COMPILE_AHEAD = config.COMPILE_AHEAD, False
    try:
        for task in group:
            dt, i, direction, name = task
            if dt not in calls:
                calls[dt] = _calls(dt)
            fns, attrs = calls[dt][i]
            parse, args = fns[direction]
            problem, operands = parse(*args, **attrs)
            s = next(c for c in candidates(direction) if label(c) == name)
            t0 = time.perf_counter()
            plan = _build(problem, s, "warmup", (), threads(), machine())
            cpu.execute(plan, operands)
            done.append((task, time.perf_counter() - t0))
    finally:
        config.COMPILE_AHEAD = ahead
    return done


def _processes(n_groups):
    import os
    from numbaconv import _jit
    if not _jit.cache_enabled():  # nothing a child compiles would reach this process
        return 1
    return max(1, min(n_groups, os.cpu_count() or 1))


def warmup(dtypes=("float32",), verbose=False, processes=None, strategies=None):
    """Compile every implementation's kernels for ``dtypes`` by running small problems.

    ``strategies``: only these entries (labels such as ``"gemm[rows]"``) or families
    (``"gemm"``); default every entry. With the on-disk cache enabled, the work is spread
    over ``processes`` worker processes (default: one per core), which fill the cache; this
    and later processes then load the kernels instead of compiling them. Without a disk
    cache everything is compiled here. Returns the seconds spent.
    """
    t0 = time.perf_counter()
    groups = _tasks(dtypes)
    if strategies is not None:
        from numbaconv.planner import STRATEGY_NAMES
        wanted = set(strategies)
        unknown = sorted(wanted - set(STRATEGY_NAMES))
        if unknown:
            raise ValueError(f"strategies: unknown {unknown}; expected names from "
                             f"{list(STRATEGY_NAMES)}")
        groups = [[t for t in g if t[3] in wanted or t[3].split("[")[0] in wanted]
                  for g in groups]
        groups = [g for g in groups if g]
    # the groups whose kernels take longest to compile first (the merged gemm group, then
    # the heavy families), so that the pool ends even
    heavy = ("depthwise", "grouped", "rows", "implicit", "winograd", "split", "claimed")
    groups.sort(key=lambda g: (len({t[3] for t in g}) == 1,
                               not any(h in t[3] for t in g for h in heavy)))
    n = _processes(len(groups)) if processes is None else max(1, int(processes))

    def report(results):
        if verbose:
            for (dt, i, direction, name), sec in results:
                print(f"warm {direction:<6} {name:<24} {dt:<8} problem {i}  {sec:6.2f} s  "
                      f"(total {time.perf_counter() - t0:6.2f} s)", flush=True)

    if n == 1:
        for g in groups:
            report(_run_group(g))
        return time.perf_counter() - t0
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from numbaconv.backends.ahead import without_linalg
    ctx = multiprocessing.get_context("spawn")  # a clean interpreter, whatever the parent
    # the workers run no code of their caller's: Numba may do without scipy.linalg there
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx,
                             initializer=without_linalg) as pool:
        for results in pool.map(_run_group, groups):
            report(results)
    return time.perf_counter() - t0
