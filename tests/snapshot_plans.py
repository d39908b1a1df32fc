"""Record the planner's choice for every suite layer: ``python tests/snapshot_plans.py OUT``.

``plans``: ``(suite, layer, direction, dtype, engine, threads) -> (strategy, variant,
tiles)``; ``cases``: the same for the small problems of ``tests/strategy_cases.py``; both
planned on the machine model and settings saved beside them (``conditions``), so that
``tests/test_plans_snapshot.py`` can plan again under the same conditions.
"""
import dataclasses
import json
import sys

DTYPES = ("float32", "float16", "float64")
DIRECTIONS = ("fwd", "bwd_d", "bwd_w")
ENGINES = ("auto", "numba", "blas")
THREADS = (1, 2)


def plans():
    """``{key: [strategy, variant, tiles]}`` for every suite layer under the present
    settings (``config.GEMM_ENGINE`` and ``config.THREADS`` set per entry)."""
    import numbaconv
    from numbaconv import config, planner, suites
    out = {}
    saved = config.GEMM_ENGINE, config.THREADS
    try:
        for engine in ENGINES:
            for threads in THREADS:
                config.GEMM_ENGINE, config.THREADS = engine, threads
                planner.clear_plan_cache()
                for suite in suites.SUITES:
                    for layer in suites.layers(suite):
                        for direction in DIRECTIONS:
                            for dtype in DTYPES:
                                call = suites.call(layer, direction, dtype, shapes_only=True)
                                p = numbaconv.plan(call.op, *call.args, **call.kwargs)
                                key = "/".join((suite, layer.name, direction, dtype, engine,
                                                str(threads)))
                                out[key] = [p.strategy, p.variant, dict(p.tiles)]
    finally:
        config.GEMM_ENGINE, config.THREADS = saved
        planner.clear_plan_cache()
    return out


def cases():
    """``{case id: [strategy, variant, tiles]}`` for the small problems of
    ``tests/strategy_cases.py``, each under its own settings, as the tests plan them
    (``SERIAL_MAX_FLOPS`` 0, as ``tests/conftest.py`` sets it)."""
    import pytest
    import strategy_cases as sc
    from numbaconv import planner
    from numbaconv.strategies import _gemm_common as gemm
    out = {}
    for case in sc.CASES:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gemm, "SERIAL_MAX_FLOPS", 0)
            sc.patch(case, mp)
            planner.clear_plan_cache()
            p = sc.plan(case, sc.operands(case))
            out[case.id] = [p.strategy, p.variant, dict(p.tiles)]
    planner.clear_plan_cache()
    return out


def conditions():
    """What the plans depend on besides the problem: the machine model, the vector width
    the kernels were built for, and the size thresholds that tests change."""
    from numbaconv import config
    from numbaconv.machine import machine
    from numbaconv.kernels.cpu import ukernel
    from numbaconv.strategies import _gemm_common as gemm
    return {"machine": dataclasses.asdict(machine()), "vector_bytes": ukernel.VECTOR_BYTES,
            "small_flops": config.SMALL_FLOPS, "serial_max_flops": gemm.SERIAL_MAX_FLOPS}


if __name__ == "__main__":
    data = {"conditions": conditions(), "plans": plans(), "cases": cases()}
    with open(sys.argv[1], "w") as f:
        json.dump(data, f, indent=0, sort_keys=True)
        f.write("\n")
