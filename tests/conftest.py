"""Shared fixtures: one seeded random generator for the whole session."""
import os

import numpy as np
import pytest

# The test run keeps every core busy with its own workers: a helper process compiling
# ahead for each first call would only compete with them, in this process and in the
# processes tests start (tests/test_ahead.py turns it on where it tests it).
os.environ["NUMBACONV_COMPILE_AHEAD"] = "0"


@pytest.fixture(scope="session")
def rng():
    return np.random.default_rng(20240611)


@pytest.fixture(autouse=True)
def fresh_plans():
    """Tests patch strategies' methods and tiles: no plan survives from one test to the
    next (numbaconv caches plans per problem and settings)."""
    from numbaconv import planner
    planner.clear_plan_cache()
    yield
    planner.clear_plan_cache()


@pytest.fixture(autouse=True)
def parallel_even_when_tiny(monkeypatch):
    """The GEMM and Winograd strategies run problems under 8 MFLOP on the calling thread
    alone; the tests' problems are that small, and must still cross the worker-pool code
    paths."""
    from numbaconv.strategies import _gemm_common
    monkeypatch.setattr(_gemm_common, "SERIAL_MAX_FLOPS", 0)


@pytest.fixture(autouse=True)
def every_strategy_even_when_small(monkeypatch, request):
    """The planner keeps problems under ``config.SMALL_FLOPS`` off the strategies whose
    kernels take seconds to compile; the tests' problems are that small, and must still
    reach every strategy. Tests of that rule itself are marked ``small_problem_rule``."""
    if request.node.get_closest_marker("small_problem_rule") is None:
        from numbaconv import config
        monkeypatch.setattr(config, "SMALL_FLOPS", 0)


@pytest.fixture(autouse=True)
def no_compile_helpers(monkeypatch):
    """No helper process compiling ahead (see the top of this file)."""
    from numbaconv import config
    monkeypatch.setattr(config, "COMPILE_AHEAD", False)
