"""The asv suite in asv_bench/ is discovered whole, passes ``asv check``, imports cheaply.

asv collects only methods named ``time_*``, ``peakmem_*``, ``mem_*``, ``track_*`` and
``timeraw_*`` (pandas once named numba benchmarks ``test_method`` and they silently never
ran), so the counts below are written down by hand and compared with what asv's own
discovery finds, not derived from the benchmark classes.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("asv", reason="asv is not installed (pip install -e .[bench]); the asv "
                                  "suite in asv_bench/ is checked only where asv is")

ASV_BENCH = Path(__file__).resolve().parent.parent / "asv_bench"
BENCHMARKS = ASV_BENCH / "benchmarks"

# Benchmark functions per module: a parameterised method counts once, whatever its grid.
EXPECTED = {
    # Import.timeraw_import_numbaconv, FirstCall.timeraw_import_and_call
    "bench_import": 2,
    # GenericOps.time_op/track_gflops, Strategies.time_strategy,
    # PeakMem.peakmem_strategy/track_workspace_bytes
    "conv1d": 5,
    # as conv1d, plus TFOps.time_op
    "conv3d": 6,
    # GenericOps.time_op/track_gflops, TFOps.time_op, Strategies.time_strategy,
    # RepeatedCall.time_call
    "mobilenet": 5,
    # as conv3d, plus BFloat16.time_op
    "resnet50": 7,
    # ZooGenericOps.time_op/track_gflops
    "zoo": 2,
}
EXPECTED_TOTAL = 27
PREFIXES = ("time_", "peakmem_", "mem_", "track_", "timeraw_")


def _discover(tmp_path):
    """asv's own discovery, in a fresh interpreter as ``asv run`` does it."""
    out = tmp_path / "benchmarks.json"
    proc = subprocess.run([sys.executable, "-m", "asv.benchmark", "discover", str(BENCHMARKS),
                           str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def test_discovers_every_benchmark(tmp_path):
    found = _discover(tmp_path)
    names = [b["name"] for b in found]
    assert len(names) == len(set(names))
    per_module = {}
    for n in names:
        module = n.split(".")[0]
        per_module[module] = per_module.get(module, 0) + 1
    assert per_module == EXPECTED
    assert len(names) == EXPECTED_TOTAL == sum(EXPECTED.values())
    for n in names:
        assert n.rsplit(".", 1)[1].startswith(PREFIXES), n


def test_asv_check_passes():
    proc = subprocess.run([sys.executable, "-m", "asv", "check", "--python=same"],
                          cwd=ASV_BENCH, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No problems found" in proc.stdout, proc.stdout + proc.stderr


def test_config_builds_each_commit_in_its_own_virtualenv():
    from asv.config import Config

    conf = Config.load(str(ASV_BENCH / "asv.conf.json"))
    assert conf.environment_type == "virtualenv"
    assert conf.branches == ["main"]
    # NumPy and Numba pinned to one version each: commits differ, the stack does not
    for pkg in ("numpy", "numba"):
        versions = conf.matrix["req"][pkg]
        assert len(versions) == 1 and versions[0].count(".") == 2, (pkg, versions)
    # a wheel of the checkout (pyproject's package-dir mapping of kernels/ travels in it),
    # installed without dependencies into the matrix's environment
    assert any("pip wheel" in c and "{build_dir}" in c for c in conf.build_command)
    assert any("{wheel_file}" in c and "--no-deps" in c for c in conf.install_command)
    # asv resolves the paths from the directory it runs in: asv_bench/
    assert (ASV_BENCH / conf.repo).resolve() == ASV_BENCH.parent
    assert (ASV_BENCH / conf.benchmark_dir).resolve() == BENCHMARKS
    assert (BENCHMARKS / "__init__.py").is_file()
    for d in (conf.results_dir, conf.html_dir, conf.env_dir):
        assert (ASV_BENCH / d).resolve().parent == ASV_BENCH


def test_importing_the_suite_compiles_nothing():
    """Discovery imports every module: no kernel module may be imported (so none compiled)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import importlib\n"
            "for m in sys.argv[2:]: importlib.import_module('benchmarks.' + m)\n"
            "print(sorted(m for m in sys.modules if 'kernels' in m.split('.')))")
    proc = subprocess.run([sys.executable, "-c", code, str(ASV_BENCH), *EXPECTED],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_zoo_benchmark_layers_are_the_zoos():
    """benchmarks/zoo.py spells its layers out (so that older commits can be timed); they
    must be the zoo's layers of the same names."""
    sys.path.insert(0, str(ASV_BENCH))
    try:
        from benchmarks import zoo
    finally:
        sys.path.remove(str(ASV_BENCH))
    from numbaconv import suites
    fields = ("mb", "g", "ic", "oc", "isz", "ksz", "stride", "pad_begin", "pad_end",
              "dilation")
    for name in zoo.LAYERS:
        got, want = zoo._layer(name), suites.layer(name)
        assert [getattr(got, f) for f in fields] == [getattr(want, f) for f in fields], name
        assert got.descriptor() == want.descriptor()


def test_numba_cache_is_kept_per_environment():
    """In a virtualenv (asv's), importing the benchmarks points Numba's cache inside it."""
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); import benchmarks\n"
            "print(os.environ.get('NUMBA_CACHE_DIR'))")
    env = {k: v for k, v in os.environ.items() if k != "NUMBACONV_ASV_NUMBA_CACHE"}
    proc = subprocess.run([sys.executable, "-c", code, str(ASV_BENCH)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    if sys.prefix != sys.base_prefix:
        assert proc.stdout.strip() == os.path.join(sys.prefix, "numba_cache")
    env["NUMBACONV_ASV_NUMBA_CACHE"] = "/tmp/somewhere"
    proc = subprocess.run([sys.executable, "-c", code, str(ASV_BENCH)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.stdout.strip() == "/tmp/somewhere"
