"""The machine the numbers are measured on: its allocator's state and its description."""
import os
import platform
import sys

import numpy as np

#: glibc's ``mallopt`` parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def steady_allocator():
    """Put glibc's malloc in the state a long-running process reaches; returns a note
    (``None`` where this is not glibc).

    glibc serves allocations above its mmap threshold with fresh mappings, faulted in and
    zero-filled page by page, and raises the threshold (to at most 32 MiB, the trim
    threshold to twice that) each time such a block is freed. So a library's time for a
    10-30 MB result depended on what the process had freed before: PyTorch's wavenet_4
    backward data took 7.5-11.5 ms in a fresh process (3000 page faults per call) and
    2.5-2.8 ms once the threshold had risen, as it had in a full bench run when earlier
    layers happened to free larger blocks. Fixing both thresholds at their adapted values
    makes every row independent of the rows before it, for both libraries alike (blocks
    over 32 MiB are still fresh mappings: numbaconv recycles its own, see
    :mod:`numbaconv.memory`)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        version = libc.gnu_get_libc_version().decode()
        ok = (libc.mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1
              and libc.mallopt(M_TRIM_THRESHOLD, 64 << 20) == 1)
    except (OSError, AttributeError):
        return None
    return f"glibc {version}: mmap threshold 32 MiB, trim threshold 64 MiB" if ok else None


def machine_info(threads, peak=None, peak_how="", torch=None, allocator=None):
    """What the numbers were measured on, for the JSON file."""
    import numba
    import numbaconv
    from ..machine import machine

    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel function has run yet
        layer = None
    info = {
        "cpu": machine().cpu_name,
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "threads": threads,
        "threading_layer": layer,
        "python": platform.python_version(),
        "numbaconv": numbaconv.__version__,
        "numba": numba.__version__,
        "numpy": np.__version__,
        "torch": torch.__version__ if torch is not None else None,
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "sgemm_peak_gflops": peak,
        "sgemm_peak_how": peak_how,
        "allocator": allocator,
    }
    return info


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None
