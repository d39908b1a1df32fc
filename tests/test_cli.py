"""The command line: info, check, plan, warmup."""
import subprocess
import sys

import pytest

from numbaconv import cli


def test_info_reports_threading_cache_and_blas(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for key in ("numbaconv", "numba", "threading layer", "threads", "cpu features",
                "kernel cache", "blas", "cuda"):
        assert key in out
    layer = [line for line in out.splitlines() if line.startswith("threading layer")][0]
    assert any(name in layer for name in ("omp", "tbb", "workqueue"))


def test_check_passes_and_prints_a_table(capsys):
    assert cli.main(["check", "--dtype", "float32", "float64"]) == 0
    out = capsys.readouterr().out
    assert "conv2d_backprop_input" in out and "convolution_backprop_filters" in out
    assert " NO" not in out
    assert out.strip().splitlines()[-1].startswith("30/30")


def test_plan_command_explains_every_layer(capsys):
    assert cli.main(["plan", "--suite", "conv1d", "--pass", "bwd_d"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 6
    assert all("bwd_d:" in line and "GFLOP" in line for line in lines)


def test_warmup_command(capsys):
    # float32, whose kernels the rest of the suite compiles anyway; worker processes fill
    # the disk cache (where there is one) that this process then loads from
    assert cli.main(["warmup", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "warmed up in" in out
    for name in ("winograd", "gemm[rows]", "direct[grouped]", "direct"):
        assert f" {name} " in out, out


def test_warmup_covers_every_strategy_entry():
    # on two threads or more (gemm[split-dw] shares dW's rows among workers)
    import numba
    import numbaconv as nc
    from numbaconv import _warmup, planner
    from numbaconv.strategies import label
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("gemm[split-dw] needs two threads")
    before = nc.get_num_threads()
    nc.set_num_threads(2)
    try:
        warmed = {t[3] for group in _warmup._tasks(["float32"]) for t in group}
    finally:
        nc.set_num_threads(before)
    entries = {label(s) for d in ("fwd", "bwd_d", "bwd_w") for s in planner.candidates(d)}
    assert warmed == entries


def test_console_script_entry_point():
    r = subprocess.run([sys.executable, "-m", "numbaconv.cli", "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "bench" in r.stdout
