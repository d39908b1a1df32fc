"""tune=True from several processes at once: every process's winners end up in the one file.

Each worker is a real ``python`` subprocess that tunes its own distinct problems into one
shared NUMBACONV_TUNE_DIR. The workers compile (or load from Numba's cache) all candidate
kernels first, on a problem tuned into a private directory, then wait at a start line so that
their tuning overlaps. Nothing may be lost: the file must hold every worker's entries.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
import numpy as np
import numbaconv as nc
from numbaconv import config, tune

worker, n, warmup_dir, start = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
shared = config.TUNE_CACHE_DIR  # from NUMBACONV_TUNE_DIR


def problem(c, k):
    return (np.ones((1, 5, 5, c), np.float32), [3, 3, c, k], np.ones((1, 5, 5, k), np.float32),
            1, "SAME")


# compile every candidate outside the shared directory, before the start line
config.TUNE_CACHE_DIR = warmup_dir
nc.conv2d_backprop_filter(*problem(1, 8), tune=True)
config.TUNE_CACHE_DIR = shared

# hold each timing a little longer, so that the workers' read-time-write steps overlap the
# way slower real problems do (the kernels themselves still run and are timed)
real_time = tune.time_strategy
def slower(*a, **k):
    t = real_time(*a, **k)
    time.sleep(0.005)
    return t
tune.time_strategy = slower

open(os.path.join(warmup_dir, f"ready-{worker}"), "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(start):
    if time.monotonic() > deadline:
        sys.exit("no start signal")
    time.sleep(0.002)

done = []
for i in range(n):
    x, ws, dy, s, pad = problem(2 + i, 8 + worker)  # distinct per worker and per i; >= 8 outputs
    # so that several strategies accept it
    p = nc.plan("conv2d_backprop_filter", x, ws, dy, s, pad, tune=True)
    assert "tuned now" in p.reason, p.reason
    got = nc.conv2d_backprop_filter(x, ws, dy, s, pad, tune=True)
    ref = nc.conv2d_backprop_filter(x, ws, dy, s, pad, strategy="direct")
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    done.append(p.problem.descriptor())
print("DONE " + json.dumps(done))
"""


def _run_workers(tmp_path, workers, per_worker):
    shared = tmp_path / "shared"
    warmup = tmp_path / "warmup"
    shared.mkdir()
    warmup.mkdir()
    start = warmup / "go"
    env = dict(os.environ, NUMBACONV_TUNE_DIR=str(shared))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(w), str(per_worker),
                               str(warmup), str(start)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for w in range(workers)]
    try:
        deadline = time.monotonic() + 180
        while not all((warmup / f"ready-{w}").exists() for w in range(workers)):
            dead = [p for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                out, err = dead[0].communicate() if dead else ("", "")
                pytest.fail(f"a worker did not reach the start line: {out}\n{err}")
            time.sleep(0.01)
        start.touch()
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    tuned = []
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"worker failed:\n{out}\n{err}"
        (line,) = [ln for ln in out.splitlines() if ln.startswith("DONE ")]
        tuned += json.loads(line[5:])
    return shared, tuned


@pytest.mark.parametrize("workers", [2, 3])
def test_concurrent_tuning_keeps_every_entry(tmp_path, workers):
    per_worker = 12 if workers == 2 else 6
    shared, tuned = _run_workers(tmp_path, workers, per_worker)
    assert len(set(tuned)) == workers * per_worker  # really distinct problems
    data = json.loads((shared / "tune.json").read_text())
    keys = list(data["entries"])
    found = {d for d in tuned if any(k.endswith("/" + d) for k in keys)}
    missing = sorted(set(tuned) - found)
    assert not missing, f"{len(missing)} of {len(tuned)} tuned problems lost: {missing}"
    assert len(keys) == workers * per_worker
    for e in data["entries"].values():
        assert e["strategy"] in e["seconds"]
        assert e["seconds"][e["strategy"]] == min(e["seconds"].values())
    # nothing but the cache and its lock file is left in the directory
    assert {p.name for p in shared.iterdir()} <= {"tune.json", "tune.json.lock"}
