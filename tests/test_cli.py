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
    # the test run turns compiling ahead off (tests/conftest.py), and info says so
    ahead = [line for line in out.splitlines() if line.startswith("compile ahead")][0]
    assert "off (NUMBACONV_COMPILE_AHEAD=0)" in ahead


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
    # two light entries in float32 (the whole warm-up compiles every kernel for minutes;
    # test_warmup_covers_every_strategy_entry checks that it reaches every entry)
    assert cli.main(["warmup", "--dtype", "float32", "--processes", "1",
                     "--strategy", "numpy", "gemm[col2im]"]) == 0
    out = capsys.readouterr().out
    assert "warmed up in" in out
    lines = [line for line in out.splitlines() if line.startswith("warm ")]
    # the family name "numpy" takes both of its entries
    assert {line.split()[2] for line in lines} == {"numpy[depthwise]", "numpy",
                                                   "gemm[col2im]"}, out
    assert {line.split()[1] for line in lines} == {"fwd", "bwd_d", "bwd_w"}, out


def test_warmup_on_worker_processes_fills_the_disk_cache(tmp_path):
    # a fresh cache directory, one light entry, two spawned workers: the kernels they
    # compiled are on disk afterwards
    code = ("import numbaconv\n"
            "numbaconv.warmup(['float64'], processes=2, strategies=['gemm[col2im]'])\n")
    env = dict(__import__("os").environ, NUMBA_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert any(p.suffix == ".nbc" for p in tmp_path.rglob("*")), list(tmp_path.rglob("*"))


def test_warmup_rejects_unknown_names():
    import numbaconv
    with pytest.raises(ValueError, match="strategies: unknown"):
        numbaconv.warmup(strategies=["gemm[nope]"])


def test_warmup_covers_every_strategy_entry():
    # on two threads or more (gemm[split-dw] shares dW's rows among workers)
    import numba
    import numbaconv as nc
    from numbaconv import _warmup, planner
    from numbaconv.strategies import label
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("gemm[split-dw] needs two threads")
    from numbaconv.strategies.bf16dot import host_has_bf16
    dtypes = ["float32"]
    try:  # the gemm[bf16-*] entries take bfloat16 problems only, on hosts with AVX512_BF16
        import ml_dtypes  # noqa: F401
        dtypes.append("bfloat16")
    except ImportError:
        pass
    before = nc.get_num_threads()
    nc.set_num_threads(2)
    try:
        warmed = {t[3] for group in _warmup._tasks(dtypes) for t in group}
    finally:
        nc.set_num_threads(before)
    entries = {label(s) for d in ("fwd", "bwd_d", "bwd_w") for s in planner.candidates(d)}
    if "bfloat16" not in dtypes or not host_has_bf16():
        for name in ("gemm[bf16-dot]", "gemm[bf16-regions]", "gemm[bf16-wgrad]"):
            entries.discard(name)
    from numbaconv.kernels.cpu import _amx
    if "bfloat16" not in dtypes or not host_has_bf16() or not _amx.request_amx():
        entries.discard("gemm[bf16-amx]")
        entries.discard("gemm[bf16-amx-taps]")
    from numbaconv.kernels.cpu import ukernel
    if ukernel.VECTOR_BYTES < 64:  # the auto engine keeps weight gradients on BLAS there
        entries.discard("gemm[split-k]")
        # and gemm[grouped] takes nothing there (measured on AVX-512 hosts only)
        entries.discard("gemm[grouped]")
    assert warmed == entries


def test_console_script_entry_point():
    r = subprocess.run([sys.executable, "-m", "numbaconv.cli", "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "bench" in r.stdout


def test_info_says_how_the_compile_ahead_helper_starts(monkeypatch):
    from numbaconv import _ahead, _jit, config
    monkeypatch.setattr(config, "COMPILE_AHEAD", True)
    monkeypatch.setattr(_jit, "cache_enabled", lambda: True)
    monkeypatch.setattr(_ahead, "_cores", lambda: 2)
    monkeypatch.setattr(config, "COMPILE_AHEAD_START", "spawn")
    assert "the helper is a new interpreter" in cli._ahead_status()
    monkeypatch.setattr(config, "COMPILE_AHEAD_START", "fork")
    import os
    want = "a fork of the caller" if hasattr(os, "fork") else "a new interpreter"
    assert f"the helper is {want}" in cli._ahead_status()
