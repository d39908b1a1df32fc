"""Shared fixtures: one seeded random generator for the whole session."""
import numpy as np
import pytest


@pytest.fixture(scope="session")
def rng():
    return np.random.default_rng(20240611)
