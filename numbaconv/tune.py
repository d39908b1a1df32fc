"""``tune=True``: time the accepted strategies once per problem, cache the winner on disk.

The cache is one JSON file (``tune.json`` in NUMBACONV_TUNE_DIR, or a per-user cache
directory) keyed by the CPU (name and features), the numbaconv, Numba and NumPy versions, the
problem's descriptor and dtype, and the thread count. An entry is only trusted if it names a
strategy that accepts the problem now.

Several processes may tune into the same file at once and nothing they tune is lost. Reading
takes no lock: the file is only ever replaced whole (written to a temporary file in the same
directory, then ``os.replace``), so a reader sees one complete version. Saving a new winner
takes an exclusive lock on ``tune.json.lock`` next to the cache (``fcntl.flock``;
``msvcrt.locking`` on Windows; an ``O_EXCL``-created lock file where neither exists), re-reads
the file under that lock, adds the new entry to what is there now and replaces the file. The
lock is waited for at most :data:`LOCK_TIMEOUT` seconds; after that the winner is not saved
(it is still used) and a warning says so. Within one process a thread lock serialises tuning.

Whatever the file holds, a call never fails because of it: a file that cannot be read or
parsed, or that was written for another format, is ignored; an entry of the wrong shape is
dropped on its own while the others are kept; a cache that cannot be written is left as it
is, with no temporary file left behind. Each call issues at most one ``RuntimeWarning``,
naming the file and everything that was wrong with it; the next save rewrites the file
without what was ignored.
"""
import contextlib
import hashlib
import json
import math
import os
import sys
import tempfile
import threading
import time
import warnings

import numpy as np

from . import config

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
try:
    import msvcrt
except ImportError:  # POSIX
    msvcrt = None

_FORMAT = "numbaconv-tune-1"
_lock = threading.Lock()

#: Seconds a save waits for another process's lock on the cache before giving up on saving.
LOCK_TIMEOUT = 10.0

_ADVICE = ("Delete the file or set NUMBACONV_TUNE_DIR to another, writable "
           "directory.")


def cache_path():
    d = config.TUNE_CACHE_DIR
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "numbaconv")
    return os.path.join(d, "tune.json")


def cache_stamp():
    """The version of the cache file as it is now: its path, inode, size and modification
    time (the file is only ever replaced whole, so every save gives it a new inode), or
    the path alone where it cannot be looked at. The planner keeps a process's tuned plans
    while this stays the same (:func:`numbaconv.planner.make_plan`): a call with
    ``tune=True`` then costs a ``stat`` instead of reading and parsing the file."""
    path = cache_path()
    try:
        st = os.stat(path)
    except OSError:
        return (path,)
    return (path, st.st_ino, st.st_size, st.st_mtime_ns)


def _host_key(machine, threads):
    import numba
    from ._version import __version__
    feats = hashlib.sha1(",".join(machine.features).encode()).hexdigest()[:12]
    return (f"{machine.cpu_name}/{feats}/numbaconv-{__version__}/numba-{numba.__version__}/"
            f"numpy-{np.__version__}/t{threads}")


def _warn(path, problems):
    """One RuntimeWarning for everything wrong with the cache at ``path`` in this call,
    attributed to the first caller outside numbaconv."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    level, frame = 1, sys._getframe(0)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"numbaconv: tune cache {path}: {'; '.join(problems)}. {_ADVICE}",
                  RuntimeWarning, stacklevel=level)


def _short(exc):
    text = str(exc)
    if len(text) > 160:
        text = text[:160] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _kind(value):
    return "null" if value is None else type(value).__name__


def _entry_problem(entry):
    """What is wrong with one entry's shape (None: nothing)."""
    if not isinstance(entry, dict):
        return f"a {_kind(entry)}, not an object"
    strategy = entry.get("strategy")
    if not isinstance(strategy, str):
        return f"strategy is a {_kind(strategy)}, not a string"
    seconds = entry.get("seconds")
    if not isinstance(seconds, dict):
        return f"seconds is a {_kind(seconds)}, not an object"
    for name, t in seconds.items():
        if (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)
                or t < 0):
            return f"seconds[{name!r}] is {t!r}, not a time"
    return None


def _read(path):
    """``(entries, problem)``: the file's well-formed entries and, when anything in it had to
    be ignored, a description of what (None: nothing). Never raises."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return {}, None
    except Exception as exc:  # a directory, no permission, an I/O error...
        return {}, f"ignored it, cannot read it ({_short(exc)})"
    try:
        data = json.loads(raw.decode("utf-8"))
    except Exception as exc:  # bad UTF-8, bad JSON, RecursionError on deep nesting
        return {}, f"ignored it, not valid JSON ({_short(exc)})"
    if (not isinstance(data, dict) or data.get("format") != _FORMAT
            or not isinstance(data.get("entries"), dict)):
        return {}, f"ignored it, not a {_FORMAT} file"
    entries, bad = {}, []
    for key, entry in data["entries"].items():
        why = _entry_problem(entry)
        if why is None:
            entries[key] = entry
        else:
            bad.append((key, why))
    if not bad:
        return entries, None
    key, why = bad[0]
    shown = key if len(key) <= 100 else key[:100] + "..."
    return entries, (f"ignored {len(bad)} malformed entr{'y' if len(bad) == 1 else 'ies'} of "
                     f"{len(bad) + len(entries)} (first: {shown!r}: {why})")


@contextlib.contextmanager
def _file_lock(lock_path, timeout):
    """Hold an exclusive inter-process lock on ``lock_path``; yields False (not holding it)
    when another process held it for ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    if fcntl is None and msvcrt is None:
        while True:  # O_EXCL: the lock is the file's existence
            try:
                fd = os.open(lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                break
            except FileExistsError:
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(pause)
                pause = min(2 * pause, 0.05)
        try:
            yield True
        finally:
            os.close(fd)
            os.unlink(lock_path)
        return
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        while True:
            try:
                if fcntl is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                else:
                    os.lseek(fd, 0, os.SEEK_SET)
                    msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                break
            except OSError:  # held by another process (BlockingIOError, or EACCES)
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(pause)
                pause = min(2 * pause, 0.05)
        try:
            yield True
        finally:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
            else:
                os.lseek(fd, 0, os.SEEK_SET)
                msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
    finally:
        os.close(fd)


def _write(path, entries):
    """Replace ``path`` whole by ``entries``, through a temporary file in its directory that
    is removed again on any failure."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tune.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"format": _FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


#: How a failed save's problem starts, and what a tuned plan's reason then says: the
#: planner does not keep such a plan in memory, so that the next call tunes and saves again.
_SAVE_FAILED = "tuned result not saved"
NOT_SAVED = ", not saved"


def _save(path, key, entry):
    """Merge ``{key: entry}`` into the file as it is now, under the inter-process lock.
    Returns the problems met (a list, empty when all went well). Never raises."""
    lock_path = path + ".lock"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with _file_lock(lock_path, LOCK_TIMEOUT) as locked:
            if not locked:
                return [f"{_SAVE_FAILED}: {lock_path} was held by another process for "
                        f"{LOCK_TIMEOUT:g} s (delete it if no other process is tuning)"]
            entries, problem = _read(path)
            entries[key] = entry
            _write(path, entries)
    except Exception as exc:
        return [f"{_SAVE_FAILED} ({_short(exc)})"]
    return [problem] if problem else []


def _random_operands(problem):
    from .strategies import canonical_shapes
    xs, ys, ws = canonical_shapes(problem)
    rng = np.random.default_rng(0)
    ct = problem.compute_dtype
    mk = lambda s: rng.standard_normal(s).astype(ct)  # noqa: E731
    return {"fwd": {"x": mk(xs), "w": mk(ws)}, "bwd_d": {"dy": mk(ys), "w": mk(ws)},
            "bwd_w": {"x": mk(xs), "dy": mk(ys)}}[problem.direction]


def time_strategy(strategy, problem, machine, ops, repeat=3):
    """Best-of-``repeat`` seconds of one strategy after a warm-up (compile) run."""
    from .runtime import run_parallel
    tiles = strategy.tiles(problem, machine)
    run_parallel(strategy.run, problem, tiles, ops)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        run_parallel(strategy.run, problem, tiles, ops)
        best = min(best, time.perf_counter() - t0)
    return best


def tuned_choice(problem, accepted, threads, machine):
    """``(strategy, reason)``: the cached winner, or the fastest after timing each once."""
    key = f"{_host_key(machine, threads)}/{problem.descriptor()}"
    from .strategies import label
    names = {label(s): s for s in accepted}
    path = cache_path()
    with _lock:
        entries, problem_found = _read(path)
        problems = [problem_found] if problem_found else []
        hit = entries.get(key)
        if hit is not None and hit["strategy"] in names:
            if problems:
                _warn(path, problems)
            return names[hit["strategy"]], f"tuned (cached in {path})"
        ops = _random_operands(problem)
        times = {label(s): time_strategy(s, problem, machine, ops) for s in accepted}
        best = min(times, key=times.get)
        failed = _save(path, key, {"strategy": best, "seconds": times})
        saved = not any(p.startswith(_SAVE_FAILED) for p in failed)
        problems += [p for p in failed if p not in problems]
        if problems:
            _warn(path, problems)
    shown = ", ".join(f"{n} {t * 1e3:.3g} ms" for n, t in sorted(times.items(), key=lambda kv: kv[1]))
    return names[best], f"tuned now{'' if saved else NOT_SAVED} ({shown})"
