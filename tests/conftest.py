"""Shared fixtures: one seeded random generator for the whole session."""
import numpy as np
import pytest


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
    from numbaconv.strategies import gemm
    monkeypatch.setattr(gemm, "SERIAL_MAX_FLOPS", 0)
