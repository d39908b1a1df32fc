"""Shared fixtures: one seeded random generator for the whole session."""
import os

import numpy as np
import pytest

# The test run keeps every core busy with its own workers: a helper process compiling
# ahead for each first call would only compete with them, in this process and in the
# processes tests start (tests/test_ahead.py turns it on where it tests it).
os.environ["NUMBACONV_COMPILE_AHEAD"] = "0"

#: The files that take longest with an empty kernel cache (worker seconds on a 2-core host,
#: 2026-11-27: test_cuda 172, test_strategies 159, test_readonly 101,
#: test_depthwise_kernels 83, test_winograd 39, test_cuda_ptx 38, the next four 14-24; the
#: other 50 files at most 12 each), longest first. ``--dist loadfile`` with
#: ``--no-loadscope-reorder`` (pyproject.toml) hands files to the workers in collection
#: order: run these first, so that the run ends on short files rather than on one worker's
#: long one. (Without ``--no-loadscope-reorder``, pytest-xdist orders files by their number
#: of tests, and test_cuda's few long tests started last, 110 s after the other worker
#: had finished.)
LONGEST_FILES = ("test_cuda.py", "test_strategies.py", "test_readonly.py",
                 "test_depthwise_kernels.py", "test_winograd.py", "test_cuda_ptx.py",
                 "test_determinism.py", "test_dask.py", "test_threads.py", "test_separate.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order


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


@pytest.fixture(scope="module")
def toolchain():
    """What the SASS checks need (ptxas, nvdisasm, NVVM behind numba.cuda.compile_ptx, and
    numba-cuda's launch bounds), or a skip naming what is missing. tests/test_cuda_ptx.py,
    which needs no nvdisasm, has its own."""
    import inspect
    import sys
    tools = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import sass_mix
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        pytest.skip("NUMBA_ENABLE_CUDASIM is set: compile_ptx is not available in the simulator")
    if not sass_mix.tool_candidates("ptxas"):
        pytest.skip("ptxas not found (environment's nvidia/*/bin, PATH, CUDA_HOME)")
    if not sass_mix.tool_candidates("nvdisasm"):
        pytest.skip("nvdisasm not found: pip install nvidia-cuda-nvdisasm")
    try:
        from numba import cuda, types
        cuda.compile_ptx(lambda a: None, (types.float32[::1],), cc=(9, 0))
    except Exception as exc:
        pytest.skip(f"NVVM not usable by numba.cuda.compile_ptx: {type(exc).__name__}: {exc}")
    if "launch_bounds" not in inspect.signature(cuda.compile_ptx).parameters:
        pytest.skip("numba.cuda is numba's own older CUDA target (no launch bounds, no "
                    "16-byte shared loads): pip install numba-cuda (the cuda12/cuda13 extras)")


@pytest.fixture
def without_patch_t(monkeypatch):
    """gemm[patch-t] declines everything: for tests of the entries after it, on problems it
    would take first."""
    from numbaconv.strategies import patcht
    monkeypatch.setattr(patcht.PatchT, "accepts", lambda self, p: "off for this test")
