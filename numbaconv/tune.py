"""``tune=True``: time the accepted strategies once per problem, cache the winner on disk.

The cache is one JSON file keyed by the CPU (name and features), the numbaconv, Numba and
NumPy versions, the problem's descriptor and dtype, and the thread count. A file that cannot
be parsed, or that was written for another format, is ignored with a warning and rewritten;
an entry is only trusted if it names a strategy that accepts the problem now.
"""
import hashlib
import json
import os
import tempfile
import threading
import time
import warnings

import numpy as np

from . import config

_FORMAT = "numbaconv-tune-1"
_lock = threading.Lock()


def cache_path():
    d = config.TUNE_CACHE_DIR
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "numbaconv")
    return os.path.join(d, "tune.json")


def _host_key(machine, threads):
    import numba
    from . import __version__
    feats = hashlib.sha1(",".join(machine.features).encode()).hexdigest()[:12]
    return (f"{machine.cpu_name}/{feats}/numbaconv-{__version__}/numba-{numba.__version__}/"
            f"numpy-{np.__version__}/t{threads}")


def _load(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        warnings.warn(f"numbaconv: ignoring unreadable tune cache {path}: {exc}",
                      RuntimeWarning, stacklevel=4)
        return {}
    if (not isinstance(data, dict) or data.get("format") != _FORMAT
            or not isinstance(data.get("entries"), dict)):
        warnings.warn(f"numbaconv: ignoring tune cache {path}: not a {_FORMAT} file",
                      RuntimeWarning, stacklevel=4)
        return {}
    return data["entries"]


def _store(path, entries):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"format": _FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:
        warnings.warn(f"numbaconv: could not write tune cache {path}: {exc}", RuntimeWarning,
                      stacklevel=4)


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
    tiles = strategy.tiles(problem, machine)
    strategy.run(problem, tiles, ops)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        strategy.run(problem, tiles, ops)
        best = min(best, time.perf_counter() - t0)
    return best


def tuned_choice(problem, accepted, threads, machine):
    """``(strategy, reason)``: the cached winner, or the fastest after timing each once."""
    key = f"{_host_key(machine, threads)}/{problem.descriptor()}"
    from .strategies import label
    names = {label(s): s for s in accepted}
    path = cache_path()
    with _lock:
        entries = _load(path)
        hit = entries.get(key)
        if isinstance(hit, dict) and hit.get("strategy") in names:
            return names[hit["strategy"]], f"tuned (cached in {path})"
        ops = _random_operands(problem)
        times = {label(s): time_strategy(s, problem, machine, ops) for s in accepted}
        best = min(times, key=times.get)
        entries[key] = {"strategy": best, "seconds": times}
        _store(path, entries)
    shown = ", ".join(f"{n} {t * 1e3:.3g} ms" for n, t in sorted(times.items(), key=lambda kv: kv[1]))
    return names[best], f"tuned now ({shown})"
