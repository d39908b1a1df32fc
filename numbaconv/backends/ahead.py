"""The helper process of compiling ahead (see :mod:`numbaconv._ahead`): walk a plan's first
call on zero operands, recording its compile units, then compile them from the last one
backwards into the disk cache, reporting each start and end as a JSON line on stdout."""
import json
import os
import pickle
import sys

from .. import _ahead, config
from . import cpu
from .._ahead import _zeros


def _say(tag, payload):
    sys.stdout.write(json.dumps([tag, payload]) + "\n")
    sys.stdout.flush()


def without_linalg():
    """Keep Numba from importing ``scipy.linalg`` in this process. Numba imports it (0.3 s
    where SciPy is installed) when it first sets up its registries, only to offer
    ``np.dot`` and ``np.linalg`` in jitted code, which no kernel uses; the helper's start-up
    is on the first call's critical path, so it does without; so do the warm-up's worker
    processes. (The caller's process is left as it is: its own jitted code may use
    them.)"""
    sys.modules.setdefault("scipy.linalg", None)


def main():
    """The helper process: ``python -c "from numbaconv.backends.ahead import main; main()"
    FILE`` (not ``-m``, which would make this module ``__main__``, a second copy of it)."""
    without_linalg()
    path = sys.argv[1]
    with open(path, "rb") as f:
        plan, spec, cfg = pickle.load(f)
    os.unlink(path)
    for k, v in cfg.items():
        setattr(config, k, v)
    _ahead.work(cpu.execute, plan, {k: _zeros(s) for k, s in spec.items()}, _say)
