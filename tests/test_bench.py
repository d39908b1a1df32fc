"""``numbaconv bench``: arguments, the core loop on tiny layers, outputs, optional peers.

Fast tests only: tiny hand-made layers instead of the suites' real ones, a small sgemm for the
peak, and no assertion on any time (shared machines are noisy, see docs/performance.md).
"""
import argparse
import json
import math
import sys
import time

import numpy as np
import pytest

import numbaconv
from numbaconv import bench, reference
from numbaconv.bench import timing
from numbaconv.planner import STRATEGY_NAMES
from numbaconv.suites import Layer

# Tiny layers covering what the suites exercise: symmetric pads; TF SAME at stride 2
# (asymmetric pads) with groups; 1-D with dilation; 3-D grouped with a stride.
T2D = Layer("tiny", "t2d", 2, 1, 4, 6, (7, 6), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
T2D_SAME = Layer("tiny", "t2d_same_g2", 2, 2, 4, 6, (8, 8), (3, 3), (2, 2), (0, 0), (1, 1),
                 (1, 1))
T1D = Layer("tiny", "t1d_dil", 3, 1, 5, 4, (11,), (3,), (1,), (2,), (2,), (2,))
T3D = Layer("tiny", "t3d_g2", 2, 2, 4, 4, (4, 5, 4), (3, 3, 3), (2, 1, 1), (1, 1, 1),
            (1, 1, 1), (1, 1, 1))
TINY = [T2D, T2D_SAME, T1D, T3D]

ROW_FIELDS = {"suite", "layer", "descriptor", "direction", "dtype", "strategy", "variant",
              "threads", "flops", "ms", "gflops", "peak_pct", "error", "tolerance", "torch_ms",
              "torch_gflops", "ratio", "torch_diff", "note"}


@pytest.fixture(autouse=True)
def small_sgemm(monkeypatch):
    """A 2048^3 sgemm is the real peak; tests only need the code path."""
    monkeypatch.setattr(timing, "SGEMM_N", 128)
    monkeypatch.setattr(timing, "IDLE_PAUSE", 0.0)
    monkeypatch.setattr(timing, "MIN_BLOCK_SECONDS", 0.0)


def parse(argv):
    return bench.add_arguments(argparse.ArgumentParser()).parse_args(argv)


# ------------------------------------------------------------------------- arguments

def test_defaults():
    a = parse([])
    assert a.suite == "resnet50" and a.passes == ["bwd_d", "bwd_w"] and a.dtype == "float32"
    assert a.threads is None and a.strategy is None and a.compare is None
    assert a.repeat is None and not a.quick and a.check and a.layers is None
    assert a.rounds == bench.DEFAULT_ROUNDS == 2
    assert a.json is None and a.plot is None and a.malloc == "steady"


def test_all_options():
    a = parse(["--suite", "mobilenet_v2_dw", "--pass", "fwd", "bwd_w", "--dtype", "float16",
               "--threads", "1", "--strategy", "direct", "--compare", "torch", "--json",
               "o.json", "--plot", "o.png", "--layers", "dw960_7_s1_p1", "--repeat", "3",
               "--quick", "--no-check", "--malloc", "as-is", "--rounds", "4"])
    assert (a.suite, a.passes, a.dtype, a.threads, a.strategy, a.compare) == (
        "mobilenet_v2_dw", ["fwd", "bwd_w"], "float16", 1, "direct", "torch")
    assert (a.json, a.plot, a.layers, a.repeat, a.quick, a.check) == (
        "o.json", "o.png", ["dw960_7_s1_p1"], 3, True, False)
    assert a.malloc == "as-is" and a.rounds == 4


@pytest.mark.parametrize("argv", [["--suite", "vgg"], ["--pass", "bwd"], ["--dtype", "int8"],
                                  ["--strategy", "fft"], ["--compare", "tensorflow"]])
def test_bad_choices_are_rejected(argv, capsys):
    with pytest.raises(SystemExit):
        parse(argv)


def test_cli_registers_bench(capsys):
    from numbaconv import cli
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    assert "--compare" in capsys.readouterr().out


def test_select_layers():
    names = [lay.name for lay in bench.select_layers("resnet50", ["res5b_branch2a", "conv1"])]
    assert names == ["res5b_branch2a", "conv1"]  # the order asked for
    assert len(bench.select_layers("resnet50")) == 23
    with pytest.raises(ValueError, match="res9z.*res5b_branch2b"):
        bench.select_layers("resnet50", ["res9z"])


def test_bad_layer_name_exits_2(capsys):
    assert bench.main(parse(["--layers", "nope"])) == 2
    assert "nope" in capsys.readouterr().err


def test_bad_rounds(capsys):
    assert bench.main(parse(["--rounds", "0"]), layers=[T1D]) == 2
    assert "--rounds: expected a positive count, got 0" in capsys.readouterr().err
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="rounds"):
            bench.run([T1D], ["bwd_w"], repeat=1, rounds=bad, progress=False, echo=False)


# ------------------------------------------------------------------------- core loop

def test_run_rows():
    rows = bench.run(TINY, ["bwd_d", "bwd_w", "fwd"], "float32", repeat=1, peak=100.0,
                     progress=False, echo=False)
    assert [(r.layer, r.direction) for r in rows] == [
        (lay.name, d) for lay in TINY for d in ("bwd_d", "bwd_w", "fwd")]
    for r, lay in zip(rows, [lay for lay in TINY for _ in range(3)]):
        assert set(vars(r)) == ROW_FIELDS
        assert r.descriptor == lay.descriptor() and r.flops == lay.flops
        assert r.strategy in STRATEGY_NAMES
        assert r.ms > 0 and r.gflops > 0 and r.peak_pct > 0
        assert r.tolerance == reference.TOLERANCE["float32"]
        assert 0 <= r.error <= r.tolerance, r
        assert r.error_ok and r.torch_ok
        assert r.torch_ms is None and r.ratio is None and r.torch_diff is None


@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_run_other_dtypes(dtype):
    rows = bench.run([T2D_SAME], ["bwd_d", "bwd_w"], dtype, repeat=1, progress=False,
                     echo=False)
    for r in rows:
        assert r.dtype == dtype and r.tolerance == reference.TOLERANCE[dtype]
        assert r.error <= r.tolerance, r
        assert r.peak_pct is None  # no peak given


def test_no_check_leaves_error_empty():
    (r,) = bench.run([T1D], ["bwd_w"], repeat=1, check=False, progress=False, echo=False)
    assert r.error is None and r.error_ok and r.ms > 0


def test_error_column_catches_a_wrong_result(monkeypatch, capsys):
    """The check compares the timed call's own result, so a broken kernel shows up."""
    real = numbaconv.convolution_backprop_data
    monkeypatch.setattr(numbaconv, "convolution_backprop_data",
                        lambda *a, **k: real(*a, **k) * np.float32(1.01))
    assert bench.main(parse(["--pass", "bwd_d", "--repeat", "1"]), layers=[T2D]) == 1
    captured = capsys.readouterr()
    assert "ERROR" in captured.out and "above the error tolerance" in captured.err


def test_declined_strategy_is_a_row_with_a_note(monkeypatch, capsys):
    def declines(*args, **kwargs):
        raise ValueError("strategy: 'winograd' declines this problem: not 3x3")
    monkeypatch.setattr(numbaconv, "plan", declines)
    (r,) = bench.run([T1D], ["bwd_d"], repeat=1, strategy="winograd", progress=False)
    assert r.ms is None and r.strategy is None and "skipped" in r.note
    assert "skipped" in capsys.readouterr().out
    assert bench.summarize([r]) == {"bwd_d": {"n": 0, "gflops": None, "torch_gflops": None,
                                              "ratio": None}}


def test_summarize_geometric_means():
    rows = [bench.Row("s", f"l{i}", "d", "bwd_d", "float32", ms=1.0, gflops=g, torch_gflops=t,
                      ratio=q) for i, (g, t, q) in enumerate([(2.0, 1.0, 0.5), (8.0, 4.0, 2.0)])]
    rows.append(bench.Row("s", "l2", "d", "bwd_w", "float32", ms=1.0, gflops=3.0))
    s = bench.summarize(rows)
    assert s["bwd_d"]["n"] == 2 and math.isclose(s["bwd_d"]["gflops"], 4.0)
    assert math.isclose(s["bwd_d"]["torch_gflops"], 2.0)
    assert math.isclose(s["bwd_d"]["ratio"], 1.0)
    assert s["bwd_w"]["n"] == 1 and math.isclose(s["bwd_w"]["gflops"], 3.0)
    assert s["bwd_w"]["torch_gflops"] is None and s["bwd_w"]["ratio"] is None


def test_sgemm_peak():
    gflops, how = bench.sgemm_peak(threads=1, repeat=1)
    assert gflops > 0 and how


# ------------------------------------------------------------------------- main, outputs

def test_main_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(parse(["--pass", "bwd_d", "bwd_w", "fwd", "--quick", "--json", str(out)]),
                    layers=[T2D, T1D])
    assert rc == 0
    text = capsys.readouterr().out
    assert 'n"t2d"' in text and "geometric means" in text and "sgemm peak" in text
    doc = json.loads(out.read_text())
    m = doc["machine"]
    for key in ("cpu", "threads", "numbaconv", "numba", "torch", "sgemm_peak_gflops",
                "allocator"):
        assert key in m
    assert "malloc:" in text
    assert m["numbaconv"] == numbaconv.__version__ and m["sgemm_peak_gflops"] > 0
    assert m["threads"] == numbaconv.get_num_threads()
    assert len(doc["rows"]) == 6
    for r in doc["rows"]:
        assert ROW_FIELDS <= set(r) and r["error_ok"] and r["error"] <= r["tolerance"]
    assert set(doc["summary"]) == {"bwd_d", "bwd_w", "fwd"}
    assert doc["options"]["repeat"] == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_steady_allocator_sets_glibc_thresholds():
    import ctypes
    try:
        ctypes.CDLL(None).gnu_get_libc_version
    except AttributeError:
        pytest.skip("not glibc")
    note = bench.steady_allocator()
    assert note is not None and note.startswith("glibc") and "32 MiB" in note


def test_threads_option(monkeypatch, capsys):
    from numbaconv import config
    monkeypatch.setattr(config, "THREADS", 0)  # restored after the test
    assert bench.main(parse(["--threads", "1", "--pass", "bwd_w", "--repeat", "1"]),
                      layers=[T1D]) == 0
    assert "1 thread(s)" in capsys.readouterr().out


def test_bad_threads_exits_2(monkeypatch, capsys):
    from numbaconv import config
    monkeypatch.setattr(config, "THREADS", 0)
    assert bench.main(parse(["--threads", "100000"]), layers=[T1D]) == 2
    assert "n: expected" in capsys.readouterr().err


def test_compare_torch_without_torch(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    rc = bench.main(parse(["--compare", "torch", "--pass", "bwd_d", "--repeat", "1"]),
                    layers=[T2D])
    captured = capsys.readouterr()
    assert rc == 0
    assert "pip install torch==2.13.0" in captured.err
    assert 'n"t2d"' in captured.out and "torch ms" not in captured.out


def test_plot_without_matplotlib(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    png = tmp_path / "b.png"
    assert bench.main(parse(["--plot", str(png), "--pass", "bwd_w", "--repeat", "1"]),
                      layers=[T1D]) == 0
    assert "pip install matplotlib" in capsys.readouterr().err
    assert not png.exists()


# ------------------------------------------------------------------------- optional peers

def test_compare_torch():
    torch = pytest.importorskip("torch", reason="PyTorch is optional (--compare torch)")
    rows = bench.run(TINY, ["bwd_d", "bwd_w", "fwd"], repeat=1, torch=torch, progress=False,
                     echo=False)
    for r in rows:
        assert r.note == "", r
        assert r.torch_ms > 0 and r.torch_gflops > 0 and r.ratio > 0
        # Same data and layout conversions: PyTorch must agree to float32 rounding.
        assert r.torch_diff < 1e-5, r


def test_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is optional (--plot)")
    rows = [bench.Row("s", f"l{i}", "d", d, "float32", ms=1.0, gflops=1.0 + i,
                      torch_gflops=2.0 if i else None)
            for i, d in enumerate(["bwd_d", "bwd_d", "bwd_w"])]
    png = tmp_path / "b.png"
    bench.plot(png, rows, peak=10.0)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_blocks_last_long_enough_for_fast_calls(monkeypatch):
    """A fast call is timed more than ``repeat`` times, until its block has lasted
    MIN_BLOCK_SECONDS; a slow one exactly ``repeat`` times."""
    calls = []
    monkeypatch.setattr(timing, "MIN_BLOCK_SECONDS", 0.05)
    timing.blocked([lambda: calls.append(1)], repeat=3, rounds=1)
    assert len(calls) > 4
    slow = []
    timing.blocked([lambda: (slow.append(1), time.sleep(0.03))], repeat=3, rounds=1)
    assert len(slow) == 4  # the untimed call and three timed ones (0.09 s > 0.05 s)


def test_rounds_alternate_the_contenders(monkeypatch):
    """Each round gives every contender one block (an untimed call, then timed ones), in
    order; the best call of all rounds counts."""
    monkeypatch.setattr(timing, "MIN_BLOCK_SECONDS", 0.0)
    monkeypatch.setattr(timing, "IDLE_PAUSE", 0.0)
    order = []
    naps = iter([0.0, 0.02, 0.02, 0.0, 0.001, 0.02, 0.0, 0.02, 0.02])

    def a():
        order.append("a")
        time.sleep(next(naps))

    best = timing.blocked([a, lambda: order.append("b")], repeat=2, rounds=3)
    assert "".join(order) == "aaabbb" * 3
    assert 0.001 <= best[0] < 0.015  # a's best timed call: the 0.001 s one of round 2

