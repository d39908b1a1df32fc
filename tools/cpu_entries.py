"""Time every planner entry that accepts a layer's pass, forced, side by side in one process
(a developer's tool: which entry a many-core host should plan, measured rather than guessed):

    THREADS=16 python3 tools/cpu_entries.py zoo:alexnet:conv4:bwd_w resnet50:res4b_branch2b:bwd_d

Each argument is ``SUITE:LAYER:PASS`` (a zoo layer's name holds a colon itself). Per layer:
the planner's choice, then each accepting entry's best time over ``ROUNDS`` rounds of timed
blocks of at least ``BLOCK_S`` seconds (entries alternating within a round), after a
warm-up call that compiles it. ``ENTRIES`` (comma-separated labels) limits the entries
tried; ``SKIP`` (default ``direct``: the plain loop nest, far slower on any layer worth
timing) leaves entries out; ``COMPILE_ONLY=1`` makes one call of each and times nothing (to fill the kernel
cache beside other processes first). ``CONSTS`` sets planner constants first, e.g.
``CONSTS=numbaconv.strategies.patcht:WIDE_OUTPUT_CHANNELS=256`` (``;`` between several), to
time an entry on layers that its measured limits leave to others. ``DTYPE`` (default
``float32``) times another dtype, e.g. ``bfloat16``.
"""
import ast
import importlib
import os
import sys
import time

import ml_dtypes  # noqa: F401  (registers the bfloat16 dtype name)
import numba

import numbaconv as nc
from numbaconv import planner, suites


def _block(fn, seconds):
    fn()
    best, t0 = float("inf"), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv):
    threads = int(os.environ.get("THREADS", numba.config.NUMBA_NUM_THREADS))
    nc.set_num_threads(threads)
    rounds, seconds = int(os.environ.get("ROUNDS", 3)), float(os.environ.get("BLOCK_S", 0.2))
    only = [e for e in os.environ.get("ENTRIES", "").split(",") if e]
    compile_only = os.environ.get("COMPILE_ONLY") == "1"
    skip = set(os.environ.get("SKIP", "direct").split(","))
    dtype = os.environ.get("DTYPE", "float32")
    for item in filter(None, os.environ.get("CONSTS", "").split(";")):
        module, assign = item.split(":", 1)
        attr, value = assign.split("=", 1)
        setattr(importlib.import_module(module), attr, ast.literal_eval(value))
    names = planner.STRATEGY_NAMES  # families too (winograd has no variants)
    for arg in argv:
        suite, rest = arg.split(":", 1)
        name, direction = rest.rsplit(":", 1)
        try:
            layer = suites.layer(name)
        except KeyError:
            print(f"{arg}: no layer {name!r} in the suites", flush=True)
            continue
        c = suites.call(layer, direction, dtype)
        fn = getattr(nc, c.op)
        auto = nc.plan(c.op, *c.args, **c.kwargs)
        runs, seen = [], set()
        for entry in only or names:
            try:
                plan = nc.plan(c.op, *c.args, strategy=entry, **c.kwargs)
            except ValueError:
                continue  # declines this problem
            got = f"{plan.strategy}[{plan.variant}]" if plan.variant else plan.strategy
            if got in seen or got in skip or got.startswith("numpy"):
                continue  # (a family forced: one of its entries, timed under its label)
            seen.add(got)
            kw = dict(c.kwargs, strategy=got)
            runs.append((got, plan, lambda kw=kw: fn(*c.args, **kw)))
        if compile_only:
            for _, _, run in runs:
                run()
            continue
        best = {e: float("inf") for e, _, _ in runs}
        for _ in range(rounds):
            for entry, _, run in runs:
                best[entry] = min(best[entry], _block(run, seconds))
        chosen = f"{auto.strategy}[{auto.variant}]" if auto.variant else auto.strategy
        print(f"{suite}:{name} {direction} {threads} threads, planned {chosen}", flush=True)
        for entry, plan, _ in sorted(runs, key=lambda r: best[r[0]]):
            print(f"  {entry:26s} {best[entry] * 1e3:9.3f} ms  {dict(plan.tiles)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
