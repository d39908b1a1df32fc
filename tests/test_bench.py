"""``numbaconv bench``: arguments, the core loop on tiny layers, outputs, optional peers.

Fast tests only: tiny hand-made layers instead of the suites' real ones, a small sgemm for the
peak, and no assertion on any time (shared machines are noisy, see docs/performance.md).
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import numbaconv
from numbaconv import bench, reference, suites
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
              "threads", "flops", "ms", "gflops", "peak_pct", "bytes", "roof", "error",
              "tolerance", "torch_ms", "torch_gflops", "ratio", "torch_diff", "torch_layout",
              "note"}


@pytest.fixture(autouse=True)
def small_sgemm(monkeypatch):
    """A 2048^3 sgemm is the real peak; tests only need the code path."""
    monkeypatch.setattr(timing, "SGEMM_N", 128)
    monkeypatch.setattr(timing, "STREAM_BYTES", 1 << 20)
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
    assert a.torch_layout == "faster"


def test_all_options():
    a = parse(["--suite", "mobilenet_v2_dw", "--pass", "fwd", "bwd_w", "--dtype", "float16",
               "--threads", "1", "--strategy", "direct", "--compare", "torch", "--json",
               "o.json", "--plot", "o.png", "--layers", "dw960_7_s1_p1", "--repeat", "3",
               "--quick", "--no-check", "--malloc", "as-is", "--rounds", "4",
               "--torch-layout", "nchw"])
    assert (a.suite, a.passes, a.dtype, a.threads, a.strategy, a.compare) == (
        "mobilenet_v2_dw", ["fwd", "bwd_w"], "float16", 1, "direct", "torch")
    assert (a.json, a.plot, a.layers, a.repeat, a.quick, a.check) == (
        "o.json", "o.png", ["dw960_7_s1_p1"], 3, True, False)
    assert a.malloc == "as-is" and a.rounds == 4 and a.torch_layout == "nchw"


@pytest.mark.parametrize("argv", [["--suite", "vgg"], ["--pass", "bwd"], ["--dtype", "int8"],
                                  ["--strategy", "fft"], ["--compare", "tensorflow"],
                                  ["--torch-layout", "nhwc"]])
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
                     progress=False, echo=False, bandwidth=10.0)
    assert [(r.layer, r.direction) for r in rows] == [
        (lay.name, d) for lay in TINY for d in ("bwd_d", "bwd_w", "fwd")]
    for r, lay in zip(rows, [lay for lay in TINY for _ in range(3)]):
        assert set(vars(r)) == ROW_FIELDS
        assert r.descriptor == lay.descriptor() and r.flops == lay.flops
        assert r.strategy in STRATEGY_NAMES
        assert r.ms > 0 and r.gflops > 0 and r.peak_pct > 0
        assert r.bytes == bench.traffic_bytes(lay, r.direction, 4)
        want = max(lay.flops / 100e9, r.bytes / 10e9) / (r.ms / 1e3)
        assert math.isclose(r.roof, want, rel_tol=1e-9) and 0 < r.roof
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
        assert r.peak_pct is None and r.roof is None  # no peak given
        assert r.bytes == bench.traffic_bytes(T2D_SAME, r.direction, np.dtype(dtype).itemsize)


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
    assert bench.summarize([r]) == {"bwd_d": {"n": 0, "gflops": None, "roof": None,
                                              "torch_gflops": None, "ratio": None}}


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


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_stream_bandwidth_copies_every_chunk(threads, monkeypatch):
    """Every element of the destination is written, whatever the thread count."""
    seen = []
    real = np.copyto
    monkeypatch.setattr(np, "copyto", lambda d, s: (seen.append(d.size), real(d, s)))
    gbs, how = bench.stream_bandwidth(threads=threads, repeat=2, nbytes=4 * 1001)
    assert gbs > 0 and f"{threads} thread(s)" in how
    assert sum(seen) == 3 * 1001 and len(seen) == 3 * threads  # untimed copy + 2 timed


def test_traffic_bytes_counts_operands_and_result_once():
    # T2D: mb 2, 4 -> 6 channels, 7x6 input, 3x3 kernel, pad 1 (output 7x6)
    x, w, y = 2 * 7 * 6 * 4, 3 * 3 * 4 * 6, 2 * 7 * 6 * 6
    for d in ("fwd", "bwd_d", "bwd_w"):
        assert bench.traffic_bytes(T2D, d) == 4 * (x + w + y)
        assert bench.traffic_bytes(T2D, d, 2) == 2 * (x + w + y)
    # grouped: the filter holds ic/g input channels per output channel
    assert bench.traffic_bytes(T2D_SAME, "bwd_w") == 4 * (2 * 64 * 4 + 9 * 2 * 6 + 2 * 16 * 6)


def test_compute_peak_per_dtype(monkeypatch):
    """float16/float32: the sgemm peak; bfloat16: twice it where AVX512_BF16's dot products
    run (else float32's), AMX's micro-kernel rate where AMX runs them; float64: a float64
    matmul, timed."""
    from numbaconv.kernels.cpu import _amx, _host
    assert bench.compute_peak(150.0, "float32")[0] == 150.0
    assert bench.compute_peak(150.0, "float16")[0] == 150.0
    if _amx.host_has_amx() and _amx.request_amx():
        peak, how = bench.compute_peak(150.0, "bfloat16", threads=1)
        assert peak > 150.0 and "AMX" in how
    no_amx = tuple(f for f in _host.FEATURES if f != "amx-tile")
    monkeypatch.setattr(_host, "FEATURES", no_amx + ("avx512bf16",))
    peak, how = bench.compute_peak(150.0, "bfloat16")
    assert peak == 300.0 and "AVX512_BF16" in how
    monkeypatch.setattr(_host, "FEATURES", tuple(f for f in _host.FEATURES
                                                  if f != "avx512bf16"))
    assert bench.compute_peak(150.0, "bfloat16")[0] == 150.0
    peak, how = bench.compute_peak(150.0, "float64", repeat=1, n=64)
    assert peak > 0 and "float64" in how


def test_roof_fraction():
    # compute-bound: 2 GFLOP at 100 GFLOP/s is 20 ms; the bytes would take 1 ms
    assert math.isclose(bench.roof_fraction(2e9, 1e7, 0.04, 100.0, 10.0), 0.5)
    # bandwidth-bound: 1e8 bytes at 10 GB/s is 10 ms
    assert math.isclose(bench.roof_fraction(1e6, 1e8, 0.01, 100.0, 10.0), 1.0)
    assert bench.roof_fraction(1e6, 1e8, 0.01, None, 10.0) is None
    assert bench.roof_fraction(1e6, 1e8, 0.01, 100.0, None) is None


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
    assert m["bandwidth_gbs"] > 0 and "copy" in m["bandwidth_how"]
    assert "bandwidth" in text
    assert m["threads"] == numbaconv.get_num_threads()
    assert len(doc["rows"]) == 6
    header = next(line for line in text.splitlines() if line.startswith("pass "))
    assert " roof " in header
    for r in doc["rows"]:
        assert ROW_FIELDS <= set(r) and r["error_ok"] and r["error"] <= r["tolerance"]
        # the roofline of the measured peak and bandwidth (a 128^3 sgemm here, so a peak
        # far below the machine's: only the formula is checked, not a bound)
        want = max(r["flops"] / (m["sgemm_peak_gflops"] * 1e9),
                   r["bytes"] / (m["bandwidth_gbs"] * 1e9)) / (r["ms"] / 1e3)
        assert r["roof"] > 0 and math.isclose(r["roof"], want, rel_tol=1e-9), r
        assert r["bytes"] > 0
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


def test_torch_layouts():
    """``faster`` times both of PyTorch's memory formats where a layer has two (1-D data
    has one); a named one alone; anything else is refused by name."""
    from numbaconv.bench.torch_peer import torch_layouts
    assert torch_layouts("faster", 2) == torch_layouts("faster", 3) == ("channels-last", "nchw")
    assert torch_layouts("faster", 1) == torch_layouts("channels-last", 1) == ("nchw",)
    assert torch_layouts("channels-last", 2) == ("channels-last",)
    assert torch_layouts("nchw", 3) == ("nchw",)
    with pytest.raises(ValueError, match="torch layout: expected one of"):
        torch_layouts("nhwc", 2)
    with pytest.raises(ValueError, match="torch layout"):
        bench.run([T2D], ["bwd_d"], torch_layout="NHWC", progress=False, echo=False)


class _FakePass:
    """A PyTorch pass that only sleeps: channels-last 20 ms, NCHW 1 ms."""

    def __init__(self, torch, layer, direction, arrays, layout="channels-last"):
        self.layout = layout
        delay = 0.02 if layout == "channels-last" else 0.001
        self.fn = lambda: time.sleep(delay)

    def as_numbaconv(self, result):
        return np.zeros(1)  # a shape that differs: the row says so and compares nothing


class _FakeTorch:
    @staticmethod
    def no_grad():
        import contextlib
        return contextlib.nullcontext()


@pytest.mark.parametrize("choice, layout, low, high", [
    ("faster", "nchw", 0.5, 10.0), ("channels-last", "channels-last", 19.0, 100.0)])
def test_the_faster_torch_layout_counts(monkeypatch, choice, layout, low, high):
    """Under ``faster`` each layout is timed in blocks of its own and the faster one's time
    is the row's; a named layout is timed alone."""
    from numbaconv.bench import runner
    monkeypatch.setattr(runner, "TorchPass", _FakePass)
    monkeypatch.setattr(timing, "MIN_BLOCK_SECONDS", 0.0)
    monkeypatch.setattr(timing, "IDLE_PAUSE", 0.0)
    (row,) = bench.run([T2D], ["bwd_d"], repeat=1, rounds=1, torch=_FakeTorch(),
                       check=False, progress=False, echo=False, torch_layout=choice)
    assert row.torch_layout == layout
    assert low <= row.torch_ms <= high, row.torch_ms
    assert row.ratio == pytest.approx(row.torch_ms / row.ms)
    assert "not compared" in row.note


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
        assert r.torch_layout in (("nchw",) if r.descriptor.startswith("mb3ic5iw")
                                  else ("channels-last", "nchw")), r
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



# ------------------------------------------------------------------------- the zoo

ZOO_DOC = Path(__file__).resolve().parent.parent / "docs" / "zoo.md"


def test_zoo_suite_option():
    assert parse(["--suite", "zoo"]).suite == "zoo"


def test_zoo_size_and_names():
    zoo = suites.layers("zoo")
    names = [lay.name for lay in zoo]
    assert len(zoo) >= 150 and len(set(names)) == len(names)
    nets = {n.split(":", 1)[0] for n in names}
    assert nets == set(suites.NETWORKS) and len(nets) >= 15
    for lay in zoo:
        net = lay.name.split(":", 1)[0]
        assert lay.suite == "zoo" and lay.nd == suites.NETWORKS[net][2], lay
        assert suites.layer(lay.name) is lay
    # the four suites and "all" are what they were
    assert [len(suites.layers(s)) for s in suites.SUITES] == [23, 14, 6, 6]
    assert len(suites.layers("all")) == 49
    assert not set(names) & {lay.name for lay in suites.layers("all")}
    assert bench.select_layers("zoo", ["alexnet:conv2"])[0].g == 2


def test_zoo_covers_the_classes():
    zoo = suites.layers("zoo")

    def count(pred):
        return sum(1 for lay in zoo if pred(lay))
    assert count(lambda l: l.nd == 1) >= 20 and count(lambda l: l.nd == 3) >= 20
    assert count(lambda l: l.g == l.ic == l.oc and l.g > 1) >= 30           # depthwise
    assert count(lambda l: 1 < l.g < l.ic) >= 8                           # grouped
    assert count(lambda l: l.g == 2) >= 3                                 # AlexNet-style
    assert count(lambda l: max(l.dilation) > 1) >= 15                     # dilated
    assert count(lambda l: max(l.stride) > 1) >= 30                       # strided
    assert count(lambda l: len(set(l.ksz)) > 1 and 1 in l.ksz and max(l.ksz) > 1) >= 15
    assert count(lambda l: min(l.ic, l.oc) <= 4) >= 15                    # stems, heads
    assert count(lambda l: l.oc <= 32 and l.ic >= 64 and l.g == 1) >= 8   # few-output dW
    assert count(lambda l: not l.symmetric) >= 4                          # causal pads


def test_zoo_layers_parse_and_plan():
    """Every zoo layer is a valid problem in every pass: the generic op parses it and the
    planner plans it (planning compiles nothing), with the layer's own FLOPs."""
    from numbaconv.planner import LABELS
    for lay in suites.layers("zoo"):
        assert all(o > 0 for o in lay.osz), lay
        for d in suites.PASSES:
            c = suites.call(lay, d, shapes_only=True)
            p = numbaconv.plan(c.op, *c.args, **c.kwargs)
            assert p.flops == lay.flops, (lay.name, d)
            assert (f"{p.strategy}[{p.variant}]" if p.variant else p.strategy) in LABELS
            assert p.problem.osz[3 - lay.nd:] == lay.osz and p.problem.g == lay.g


def test_zoo_doc_names_every_network_and_source():
    text = ZOO_DOC.read_text()
    for key, (network, source, nd, mb) in suites.NETWORKS.items():
        assert f"`{key}`" in text, key
        assert network in text, network
        assert source.split(";")[0].split(",")[0] in text, source
