"""tune=True: candidates timed once, winner cached on disk, bad caches ignored with a warning."""
import json
import os
import warnings

import numpy as np
import pytest

import numbaconv as nc
from numbaconv import config, tune


@pytest.fixture
def tune_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "TUNE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _args():
    x = np.ones((1, 6, 6, 16), np.float32)
    dy = np.ones((1, 6, 6, 16), np.float32)
    return x, [3, 3, 16, 16], dy, 1, "SAME"


def test_tune_times_once_then_uses_cache(tune_dir, monkeypatch):
    p1 = nc.plan("conv2d_backprop_filter", *_args(), tune=True)
    assert "tuned now" in p1.reason
    data = json.loads((tune_dir / "tune.json").read_text())
    (entry,) = data["entries"].values()
    assert entry["strategy"] == p1.strategy + (f"[{p1.variant}]" if p1.variant else "")
    assert set(entry["seconds"]) == {"gemm[patch-t]", "gemm[rows]", "gemm[slabs]", "direct"}

    def no_timing(*a, **k):
        raise AssertionError("a cached problem must not be timed again")

    monkeypatch.setattr(tune, "time_strategy", no_timing)
    p2 = nc.plan("conv2d_backprop_filter", *_args(), tune=True)
    assert p2 is p1  # kept in memory while the file stays as this process saved it
    from numbaconv import planner
    planner.clear_plan_cache()
    p2 = nc.plan("conv2d_backprop_filter", *_args(), tune=True)  # read from the file
    assert (p2.strategy, p2.variant) == (p1.strategy, p1.variant) and "cached" in p2.reason
    # the op itself runs with the tuned plan and gives the right answer
    x, fs, dy, s, pad = _args()
    got = nc.conv2d_backprop_filter(x, fs, dy, s, pad, tune=True)
    ref = nc.conv2d_backprop_filter(x, fs, dy, s, pad, strategy="direct")
    np.testing.assert_allclose(got, ref, rtol=1e-5)


def test_tuned_calls_read_the_file_only_when_it_changed(tune_dir, monkeypatch):
    """A tuned plan is kept in memory with the version of the file it was made under: the
    calls that follow neither time nor read the file; once another process has replaced
    the file (here: a different winner for this problem), the next call plans from it."""
    args = _args()
    first = nc.plan("conv2d_backprop_filter", *args, tune=True)
    reads = []
    real_read = tune._read
    monkeypatch.setattr(tune, "_read", lambda path: (reads.append(path), real_read(path))[1])
    x, fs, dy, s, pad = args
    from numbaconv import planner
    planned = []
    real_plan = planner._plan_cpu
    monkeypatch.setattr(planner, "_plan_cpu", lambda *a: (planned.append(a), real_plan(*a))[1])
    for _ in range(3):  # the op's memoised calls (tuple filter sizes) and plan()
        got = nc.conv2d_backprop_filter(x, tuple(fs), dy, s, pad, tune=True)
        assert nc.plan("conv2d_backprop_filter", *args, tune=True) is first
    assert reads == [] and planned == []
    np.testing.assert_allclose(got, nc.conv2d_backprop_filter(x, fs, dy, s, pad,
                                                               strategy="direct"), rtol=1e-5)
    path = tune_dir / "tune.json"
    data = json.loads(path.read_text())
    (key,) = data["entries"]
    other = next(n for n in data["entries"][key]["seconds"]
                 if n != data["entries"][key]["strategy"])
    data["entries"][key]["strategy"] = other
    tmp = tune_dir / "other-process.json"  # replaced whole, as every writer does
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
    again = nc.plan("conv2d_backprop_filter", *args, tune=True)
    assert reads == [str(path)] and "cached" in again.reason
    assert again.strategy + (f"[{again.variant}]" if again.variant else "") == other


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": "other"}), "[]"])
def test_corrupt_or_foreign_cache_is_ignored_with_warning(tune_dir, content):
    (tune_dir / "tune.json").write_text(content)
    with pytest.warns(RuntimeWarning, match="ignor"):
        p = nc.plan("conv2d_backprop_filter", *_args(), tune=True)
    assert p.strategy in ("gemm", "direct")
    # rewritten as a valid cache
    assert json.loads((tune_dir / "tune.json").read_text())["format"].startswith("numbaconv")


def test_cached_entry_naming_a_declining_strategy_is_not_trusted(tune_dir):
    nc.plan("conv2d_backprop_filter", *_args(), tune=True)
    path = tune_dir / "tune.json"
    data = json.loads(path.read_text())
    for e in data["entries"].values():
        e["strategy"] = "winograd"  # not an accepted candidate here
    path.write_text(json.dumps(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = nc.plan("conv2d_backprop_filter", *_args(), tune=True)
    assert p.strategy in ("gemm", "direct") and "tuned now" in p.reason


def test_tune_must_be_bool():
    with pytest.raises(TypeError, match="tune"):
        nc.plan("conv2d_backprop_filter", *_args(), tune="yes")


# --- any content of the file, any failure to write it: the call still succeeds, with one
# warning naming the file, and no temporary file is left behind ---------------------------

def _random_args(rng):
    x = rng.standard_normal((1, 6, 6, 16)).astype(np.float32)
    dy = rng.standard_normal((1, 6, 6, 16)).astype(np.float32)
    return x, [3, 3, 16, 16], dy, 1, "SAME"


def _tuned_call_warns_once(args, path):
    """Run the tuned op; check its result against the untuned one and return the single
    RuntimeWarning it issued (which must name ``path`` and point at this file)."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        got = nc.conv2d_backprop_filter(*args, tune=True)
    ref = nc.conv2d_backprop_filter(*args)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    runtime = [w for w in rec if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1, [str(w.message) for w in runtime]
    (w,) = runtime
    msg = str(w.message)
    assert str(path) in msg and "NUMBACONV_TUNE_DIR" in msg, msg
    assert w.filename == __file__  # attributed to the caller, not to numbaconv's internals
    return msg


def _no_temp_files(d):
    left = sorted(p.name for p in d.iterdir() if p.name not in ("tune.json", "tune.json.lock"))
    assert not left, left


def _valid_entry_key(tune_dir, rng):
    """Tune once into a clean cache; return the (key, entry) written."""
    x, fs, dy, s, pad = _random_args(rng)
    nc.conv2d_backprop_filter(x[:, :5], fs, dy[:, :5], s, pad, tune=True)
    data = json.loads((tune_dir / "tune.json").read_text())
    (item,) = data["entries"].items()
    return item


@pytest.mark.parametrize("bad", [["gemm"], {"name": "gemm"}, None, 3, ""],
                         ids=["list", "dict", "null", "int", "empty-string"])
def test_malformed_strategy_entry_is_dropped_alone(tune_dir, rng, bad):
    other_key, other = _valid_entry_key(tune_dir, rng)
    args = _random_args(rng)
    nc.plan("conv2d_backprop_filter", *args, tune=True)
    path = tune_dir / "tune.json"
    data = json.loads(path.read_text())
    key = next(k for k in data["entries"] if k != other_key)
    data["entries"][key]["strategy"] = bad
    path.write_text(json.dumps(data))
    if isinstance(bad, str):  # well-formed, names no candidate: retuned without a warning
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert "tuned now" in nc.plan("conv2d_backprop_filter", *args, tune=True).reason
        return
    msg = _tuned_call_warns_once(args, path)
    assert "1 malformed entry" in msg and "strategy" in msg, msg
    after = json.loads(path.read_text())["entries"]
    assert after[other_key] == other  # the well-formed entry is kept
    # the bad one was retuned and replaced by a well-formed winner
    assert after[key]["strategy"] in after[key]["seconds"]
    _no_temp_files(tune_dir)


@pytest.mark.parametrize("entry", [
    "gemm", [], {"strategy": "gemm"}, {"strategy": "gemm", "seconds": []},
    {"strategy": "gemm", "seconds": {"gemm": "fast"}},
    {"strategy": "gemm", "seconds": {"gemm": True}},
    {"strategy": "gemm", "seconds": {"gemm": -1.0}},
    {"strategy": "gemm", "seconds": {"gemm": None}},
])
def test_every_malformed_entry_shape_warns_once(tune_dir, rng, entry):
    path = tune_dir / "tune.json"
    args = _random_args(rng)
    nc.plan("conv2d_backprop_filter", *args, tune=True)
    data = json.loads(path.read_text())
    (key,) = data["entries"]
    data["entries"] = {key: entry, key + "-second": entry}  # two bad entries, one warning
    path.write_text(json.dumps(data))
    msg = _tuned_call_warns_once(args, path)
    assert "2 malformed entries" in msg, msg
    assert set(json.loads(path.read_text())["entries"]) == {key}
    _no_temp_files(tune_dir)


@pytest.mark.parametrize("content", [
    b"[" * 100000,                      # RecursionError inside json
    b"{" + b'"a":{' * 50000,            # deep objects, unterminated
    bytes(range(256)) * 40,             # binary garbage, not UTF-8
    b"\xef\xbb\xbf{}",                  # a UTF-8 byte-order mark
    b"", b"null", b"1e999999", b'"numbaconv-tune-1"',
    b'{"format": "numbaconv-tune-1", "entries": []}',
    b'{"format": "numbaconv-tune-1", "entries": null}',
    b'{"format": ["numbaconv-tune-1"], "entries": {}}',
], ids=["deep-lists", "deep-objects", "binary", "bom", "empty", "null", "huge-number",
        "string", "entries-list", "entries-null", "format-list"])
def test_any_file_content_is_ignored_with_one_warning(tune_dir, rng, content):
    path = tune_dir / "tune.json"
    path.write_bytes(content)
    msg = _tuned_call_warns_once(_random_args(rng), path)
    assert "ignored" in msg, msg
    data = json.loads(path.read_text())  # rewritten as a valid cache holding the new winner
    assert data["format"] == tune._FORMAT and len(data["entries"]) == 1
    _no_temp_files(tune_dir)


def test_failed_replace_leaves_no_temp_file(tune_dir, rng, monkeypatch):
    path = tune_dir / "tune.json"
    path.write_text("{broken")
    before = path.read_bytes()

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tune.os, "replace", failing_replace)
    msg = _tuned_call_warns_once(_random_args(rng), path)
    # both what was wrong with the file and the failed save, in the one warning
    assert "not valid JSON" in msg and "not saved" in msg and "No space left" in msg, msg
    assert path.read_bytes() == before
    _no_temp_files(tune_dir)


def test_failed_serialisation_leaves_no_temp_file(tune_dir, rng, monkeypatch):
    def failing_dump(obj, f, **kw):
        f.write('{"format": "numbaconv-tu')
        raise ValueError("boom")

    monkeypatch.setattr(tune.json, "dump", failing_dump)
    path = tune_dir / "tune.json"
    msg = _tuned_call_warns_once(_random_args(rng), path)
    assert "not saved" in msg and "boom" in msg, msg
    assert not path.exists()
    _no_temp_files(tune_dir)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="permissions do not bind root")
def test_read_only_directory(tune_dir, rng):
    path = tune_dir / "tune.json"
    tune_dir.chmod(0o555)
    try:
        msg = _tuned_call_warns_once(_random_args(rng), path)
    finally:
        tune_dir.chmod(0o755)
    assert "not saved" in msg, msg
    assert list(tune_dir.iterdir()) == []


def test_directory_that_cannot_be_created(tmp_path, monkeypatch, rng):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setattr(config, "TUNE_CACHE_DIR", str(blocker / "sub"))
    msg = _tuned_call_warns_once(_random_args(rng), blocker / "sub" / "tune.json")
    assert "not saved" in msg, msg
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]


def test_cache_path_is_a_directory(tune_dir, rng):
    path = tune_dir / "tune.json"
    path.mkdir()
    msg = _tuned_call_warns_once(_random_args(rng), path)
    assert "cannot read" in msg and "not saved" in msg, msg
    assert path.is_dir() and list(path.iterdir()) == []
    _no_temp_files(tune_dir)


@pytest.mark.skipif(tune.fcntl is None, reason="flock only")
def test_lock_held_elsewhere_times_out_without_saving(tune_dir, rng, monkeypatch):
    import fcntl
    monkeypatch.setattr(tune, "LOCK_TIMEOUT", 0.2)
    with open(tune_dir / "tune.json.lock", "w") as holder:  # its own open file: a rival lock
        fcntl.flock(holder, fcntl.LOCK_EX)
        msg = _tuned_call_warns_once(_random_args(rng), tune_dir / "tune.json")
    assert "held by another process" in msg, msg
    assert not (tune_dir / "tune.json").exists()
    # once released, the next tuning saves normally
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nc.plan("conv2d_backprop_filter", *_random_args(rng), tune=True)
    assert len(json.loads((tune_dir / "tune.json").read_text())["entries"]) == 1


def test_exclusive_create_lock_fallback(tune_dir, rng, monkeypatch):
    """Without fcntl and msvcrt the lock is an O_EXCL-created file, removed after saving; a
    stale one makes saving give up after the timeout, with the warning."""
    monkeypatch.setattr(tune, "fcntl", None)
    monkeypatch.setattr(tune, "msvcrt", None)
    monkeypatch.setattr(tune, "LOCK_TIMEOUT", 0.2)
    lock = tune_dir / "tune.json.lock"
    lock.write_text("")
    msg = _tuned_call_warns_once(_random_args(rng), tune_dir / "tune.json")
    assert "held by another process" in msg and "delete it" in msg, msg
    assert not (tune_dir / "tune.json").exists() and lock.exists()
    lock.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = nc.plan("conv2d_backprop_filter", *_random_args(rng), tune=True)
    assert "tuned now" in p.reason
    assert len(json.loads((tune_dir / "tune.json").read_text())["entries"]) == 1
    assert [q.name for q in tune_dir.iterdir()] == ["tune.json"]


def test_save_merges_with_what_another_process_wrote_meanwhile(tune_dir, rng, monkeypatch):
    """The read before timing is stale by the time of the save: the save re-reads."""
    path = tune_dir / "tune.json"
    real = tune.time_strategy
    foreign = {"strategy": "direct", "seconds": {"direct": 1.0}}

    def and_meanwhile(*a, **k):
        data = json.loads(path.read_text()) if path.exists() else {
            "format": tune._FORMAT, "entries": {}}
        data["entries"]["other-host/other-problem"] = foreign
        path.write_text(json.dumps(data))
        return real(*a, **k)

    monkeypatch.setattr(tune, "time_strategy", and_meanwhile)
    nc.plan("conv2d_backprop_filter", *_random_args(rng), tune=True)
    entries = json.loads(path.read_text())["entries"]
    assert entries.pop("other-host/other-problem") == foreign and len(entries) == 1
