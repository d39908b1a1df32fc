"""Compiling ahead (``numbaconv._ahead``): a plan's first call with an empty disk cache
shares its compiling with a helper process."""
import os
import pickle
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

import numbaconv
from numbaconv import _ahead, config


@pytest.mark.parametrize("make", [
    lambda: np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    lambda: np.asfortranarray(np.ones((3, 5), np.float64)),
    lambda: np.ones((4, 6), np.float32)[:, ::2],
    lambda: np.ones((2, 2), np.uint16),
    lambda: np.float16(1) * np.ones((3, 2), np.float16),
], ids=["C", "F", "strided", "bits", "float16"])
@pytest.mark.parametrize("writeable", [True, False])
def test_the_helper_rebuilds_operands_of_the_same_types(make, writeable):
    """The helper's zeros have the caller's dtype, shape, layout and writability: what a
    kernel's compiled signature depends on."""
    a = make()
    a.flags.writeable = writeable
    z = _ahead._zeros(pickle.loads(pickle.dumps(_ahead._spec(a))))
    assert (z.dtype, z.shape, z.flags.writeable) == (a.dtype, a.shape, a.flags.writeable)
    assert (z.flags.c_contiguous, z.flags.f_contiguous) == (
        a.flags.c_contiguous, a.flags.f_contiguous)
    assert not np.any(z)
    assert _ahead._zeros(_ahead._spec(7)) == 7


def test_bfloat16_operands_are_rebuilt_by_name():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.ones((2, 3), ml_dtypes.bfloat16)
    z = _ahead._zeros(pickle.loads(pickle.dumps(_ahead._spec(a))))
    assert z.dtype == a.dtype and z.shape == a.shape


def test_a_plan_survives_pickling():
    x = np.ones((2, 9, 9, 8), np.float32)
    w = np.ones((3, 3, 8, 16), np.float32)
    p = numbaconv.plan("conv2d", x, w, 1, "SAME")
    q = pickle.loads(pickle.dumps(p))
    assert q == p and dict(q.tiles) == dict(p.tiles) and hash(q.tiles) == hash(p.tiles)


def _plan(threads):
    return types.SimpleNamespace(threads=threads)


def test_when_a_helper_may_start(monkeypatch):
    ops = {"x": np.zeros(10, np.float32)}
    monkeypatch.setattr(_ahead, "_cores", lambda: 2)
    monkeypatch.setattr(_ahead, "_busy", lambda cores: False)
    monkeypatch.setattr(config, "COMPILE_AHEAD", True)
    assert _ahead.enabled(_plan(2), ops, True)
    assert not _ahead.enabled(_plan(1), ops, True)      # one thread: one core to use
    assert not _ahead.enabled(_plan(2), ops, False)     # no disk cache to share kernels
    monkeypatch.setattr(config, "COMPILE_AHEAD_MAX_BYTES", 39)
    assert not _ahead.enabled(_plan(2), ops, True)      # operands too large to copy
    monkeypatch.setattr(config, "COMPILE_AHEAD_MAX_BYTES", 40)
    assert _ahead.enabled(_plan(2), ops, True)
    monkeypatch.setattr(_ahead, "_cores", lambda: 1)
    assert not _ahead.enabled(_plan(2), ops, True)      # no second core
    monkeypatch.setattr(_ahead, "_cores", lambda: 2)
    monkeypatch.setattr(_ahead, "_busy", lambda cores: True)
    assert not _ahead.enabled(_plan(2), ops, True)      # other processes use the cores
    monkeypatch.setattr(_ahead, "_busy", lambda cores: False)
    monkeypatch.setattr(config, "COMPILE_AHEAD", False)
    assert not _ahead.enabled(_plan(2), ops, True)      # turned off
    monkeypatch.setattr(config, "COMPILE_AHEAD", True)
    monkeypatch.setenv(_ahead._CHILD_ENV, "1")
    assert not _ahead.enabled(_plan(2), ops, True)      # a helper starts no helper


_SCRIPT = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import numbaconv
    from numba.core import event
    from numbaconv import _ahead, config
    sys.path.insert(0, {tests!r})
    from reference import conv_bwd_data_ref

    config.COMPILE_AHEAD = True
    config.COMPILE_AHEAD_START = {start!r}
    _ahead._busy = lambda cores: False  # the test run's other workers keep the cores busy
    _ahead._cores = lambda: 2
    numbaconv.set_num_threads(2)
    sessions, compiled = [], []
    close = _ahead.Session.close
    _ahead.Session.close = lambda s: (sessions.append(s), close(s))[1]

    class Compiles(event.Listener):  # what this process compiles rather than loads
        def on_start(self, ev):
            compiled.append(ev.data["dispatcher"].py_func.__name__)
        def on_end(self, ev):
            pass
    event.register("numba:compile", Compiles())

    rng = np.random.default_rng(0)
    report = {{}}

    # 1. a helper that cannot start: the call compiles everything itself
    real, real_fork = sys.executable, _ahead._fork
    sys.executable = "/nonexistent/python"
    def no_fork():
        raise OSError("no fork here")
    _ahead._fork = no_fork
    w = rng.standard_normal((3, 3, 8, 1)).astype(np.float32)
    dy = rng.standard_normal((2, 12, 12, 8)).astype(np.float32)
    dx = numbaconv.depthwise_conv2d_native_backprop_input(
        [2, 12, 12, 8], w, dy, 1, "SAME", strategy="direct[depthwise]")
    ref = conv_bwd_data_ref(dy.astype(np.float64), w.reshape(3, 3, 1, 8).astype(np.float64),
                            (12, 12), pads_begin=1, pads_end=1, groups=8)
    report["broken"] = dict(err=float(np.abs(dx - ref).max() / np.abs(ref).max()),
                            proc=sessions[-1].proc is not None, tried=sessions[-1].tried)
    sys.executable, _ahead._fork = real, real_fork

    # 2. a helper that runs; this process holds back until it has finished, so that
    # every kernel comes from the helper through the disk cache
    before = _ahead.Session.before_compile
    def patient(self, disp, sig):
        before(self, disp, sig)
        if self.proc is not None and self.compiled:
            self.proc.wait(600)
            self.reader.join(600)
    _ahead.Session.before_compile = patient
    w = rng.standard_normal((1, 1, 64, 48)).astype(np.float32)
    dy = rng.standard_normal((2, 16, 16, 48)).astype(np.float32)
    n0 = len(compiled)
    dx = numbaconv.conv2d_backprop_input((2, 16, 16, 64), w, dy, 1, "VALID",
                                         strategy="gemm[claimed]")
    ref = conv_bwd_data_ref(dy.astype(np.float64), w.astype(np.float64), (16, 16))
    s = sessions[-1]
    report["helped"] = dict(
        err=float(np.abs(dx - ref).max() / np.abs(ref).max()),
        proc=s.proc is not None, exited=s.proc is not None and s.proc.poll() is not None,
        found=s.found, here=s.compiled, states=sorted(set(s.state.values())),
        compiled_here=compiled[n0:])
    print(json.dumps(report))
""")


@pytest.mark.parametrize("start", ["fork", "spawn"] if hasattr(os, "fork") else ["spawn"])
def test_a_first_call_shares_its_compiling_with_a_helper(tmp_path, start):
    """With an empty cache: a helper that cannot start changes nothing; one that runs
    (a fork of the caller, or a new interpreter) finds every kernel the call needs
    (walking the plan without running it), compiles them into the disk cache, and the
    call loads them from there with the same result."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), NUMBACONV_CACHE="1",
               NUMBACONV_COMPILE_AHEAD="1")
    env.pop("NUMBA_DISABLE_JIT", None)
    code = _SCRIPT.format(tests=os.path.dirname(__file__), start=start)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    import json
    report = json.loads(run.stdout.strip().splitlines()[-1])
    broken, helped = report["broken"], report["helped"]
    assert broken["tried"] and not broken["proc"] and broken["err"] < 1e-5
    assert helped["proc"] and helped["exited"] and helped["err"] < 1e-5
    here = helped["here"]
    assert len(here) >= 2, here                    # the claimed GEMM: its block, its kernel
    assert set(here) <= set(helped["found"]), (here, helped["found"])
    assert helped["states"] == ["D"]               # the helper compiled all it found
    # this process waited for the helper: every kernel came from it through the cache
    names = {k.split("(")[0].rsplit(".", 1)[1] for k in here}
    assert not names & set(helped["compiled_here"]), helped["compiled_here"]


def test_busy_counts_this_process_s_own_recent_helper(monkeypatch):
    """A minute's load average of the number of cores means busy; a helper of this process
    that ran in the last minute counts one core of it."""
    import time
    monkeypatch.setattr(_ahead.os, "getloadavg", lambda: (2.2, 1.0, 1.0))
    monkeypatch.setattr(_ahead, "_last_helper", None)
    assert _ahead._busy(2)
    assert not _ahead._busy(4)
    monkeypatch.setattr(_ahead, "_last_helper", time.monotonic() - 5)
    assert not _ahead._busy(2)           # 2.2 less this process's own helper
    monkeypatch.setattr(_ahead.os, "getloadavg", lambda: (3.1, 1.0, 1.0))
    assert _ahead._busy(2)
    monkeypatch.setattr(_ahead, "_last_helper", time.monotonic() - 120)
    monkeypatch.setattr(_ahead.os, "getloadavg", lambda: (2.2, 1.0, 1.0))
    assert _ahead._busy(2)               # that helper ran more than a minute ago


def test_the_helper_sets_up_numba_without_scipy_linalg(tmp_path):
    """The helper process keeps Numba from importing ``scipy.linalg`` (0.3 s of its
    start-up), and Numba compiles as before (that the helper's kernels are right:
    :func:`test_a_first_call_shares_its_compiling_with_a_helper`)."""
    pytest.importorskip("scipy.linalg")
    code = textwrap.dedent("""
        import sys
        import numba
        import numpy as np
        from numbaconv.backends import ahead
        ahead.without_linalg()
        total = numba.njit(lambda a: (a * a).sum())(np.arange(5.0))
        print(sys.modules.get("scipy.linalg") is None, total)
    """)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NUMBA_DISABLE_JIT", None)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["True", "30.0"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_helper_is_stopped_and_reaped():
    """The forked helper's handle: running until stopped, then SIGKILL and reaped (a
    handler for SIGTERM the child inherited cannot keep it alive)."""
    import signal
    import time
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: ignore SIGTERM, wait to be killed
        try:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(w)
    helper = _ahead._Forked(pid, r)
    assert helper.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        helper.wait(0.05)
    helper.terminate()
    assert helper.wait(10) == -signal.SIGKILL
    assert helper.poll() == -signal.SIGKILL
    helper.stdout.close()


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/stat"), reason="no /proc")
def test_a_forked_helper_that_uses_no_cpu_counts_as_stalled(monkeypatch):
    """A forked helper stuck on a lock it inherited would use no CPU: after
    ``STALL_SECONDS`` without any, the call stops waiting for it; a busy one is not."""
    import time
    monkeypatch.setattr(_ahead._Forked, "STALL_SECONDS", 0.3)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: sleep (no CPU), as a deadlocked helper would
        try:
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(w)
    helper = _ahead._Forked(pid, r)
    try:
        assert not helper.stalled()          # first reading
        time.sleep(0.5)
        assert helper.stalled()
    finally:
        helper.terminate()
        helper.wait(10)
        helper.stdout.close()
    busy = _ahead._Forked(os.getpid(), os.open(os.devnull, os.O_RDONLY))
    busy.STALL_SECONDS = 0.3
    busy.stalled()
    t = time.monotonic()
    while time.monotonic() - t < 0.5:       # this process uses CPU all along
        pass
    assert not busy.stalled()
    busy.stdout.close()
