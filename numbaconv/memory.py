"""Large arrays on recycled memory: results and workspaces without a page fault per call.

glibc serves an allocation above its mmap threshold (at most 32 MiB) with a fresh mapping
and returns it to the kernel on free, so every call that makes such an array first-touches
every page of it: the kernel zero-fills each page in a fault before the kernel that writes
the array runs. Measured (Zen 4, 2 threads, one process): the 38.5 MB backward-data
result of MobileNet-V2's 96-channel 112x112 stride-2 depthwise layer took 722 faults and
1.2 ms of a 3.5 ms call; a float64 ResNet-50 res2 result (51 MB) or the group-minor copy of
a float64 ResNeXt-3D input, as many.

:func:`empty` keeps such blocks instead. An array it returns is an ordinary NumPy array
whose ``base`` is a small lease object on one block; NumPy points every view of the array
at that same lease, so the block goes back to the pool only when the last array or view
that uses it is gone (the lease's ``__del__``), never while any of them can still see it.
Idle blocks are kept up to ``config.MEMORY_POOL_BYTES`` (default an eighth of physical
memory, at most 1 GiB; oldest dropped first); 0 turns the pool off, and :func:`release`
frees the idle blocks now.

Smaller arrays come from ``np.empty``: glibc's heap reuses their memory without faults,
because glibc raises its mmap threshold to the largest block freed so far. Not where that
adjustment is off: setting any of ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``,
``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_MMAP_MAX_`` (or their ``GLIBC_TUNABLES``) pins the
threshold, at 128 KiB unless ``MALLOC_MMAP_THRESHOLD_`` says otherwise. Dask's nanny sets
``MALLOC_TRIM_THRESHOLD_=65536`` in every worker process it starts, so there every array of
128 KiB or more was a fresh mapping (measured, Zen 4: res3a_branch2b's weight gradient on 16
samples, one thread: 3354 faults and 18 -> 27 ms per call). In such a process
:func:`min_bytes` is that threshold: the pool serves every array glibc would map afresh.
"""
from collections import deque
import ctypes
import math
import os
import threading

import numpy as np

from . import config, runtime
from ._jit import helper

#: Arrays from this many bytes on come from the pool (below: ``np.empty``), or from glibc's
#: pinned mmap threshold where that is lower (:func:`min_bytes`).
MIN_BYTES = 4 << 20
#: Blocks are sized in multiples of this (a huge page), so that nearby sizes share them.
GRAIN = 2 << 20
#: Blocks under ``GRAIN`` (where :func:`min_bytes` is below it) in multiples of this.
SMALL_GRAIN = 64 << 10
#: glibc's mmap threshold when it is not adjusted (``M_MMAP_THRESHOLD``'s default).
GLIBC_MMAP_THRESHOLD = 128 << 10
#: The glibc settings that turn its adjustment of the mmap threshold off (environment
#: variables, and the same as ``GLIBC_TUNABLES`` names).
_PINNING = {"MALLOC_TRIM_THRESHOLD_": "glibc.malloc.trim_threshold",
            "MALLOC_TOP_PAD_": "glibc.malloc.top_pad",
            "MALLOC_MMAP_THRESHOLD_": "glibc.malloc.mmap_threshold",
            "MALLOC_MMAP_MAX_": "glibc.malloc.mmap_max"}
#: An idle block serves a request when the request is at least this fraction of it.
MIN_FILL = 0.75
ALIGN = 64

_lock = threading.Lock()
_idle = []          # [block], oldest first
_returned = deque()  # blocks whose lease died (appended from __del__, lock-free)


def _give_back(lease):
    """A lease's ``__del__``: its block joins the idle ones (at the next allocation)."""
    try:
        _returned.append(lease._block)
    except Exception:  # interpreter shutdown
        pass


class _Block:
    """``size`` bytes, 64-byte aligned (``mem``), and the ctypes array type of that size
    whose instances lease them out."""

    __slots__ = ("mem", "size", "lease_type")

    def __init__(self, size):
        raw = np.empty(size + ALIGN, np.uint8)
        off = (-raw.ctypes.data) % ALIGN
        self.mem = raw[off:off + size]
        self.size = size
        self.lease_type = type("_Lease", (ctypes.c_char * size,), {"__del__": _give_back})


@helper
def _address(a):
    return a.ctypes.data


_HALF = np.dtype(np.float16)


def address(a):
    """The address of ``a``'s first element, as ``a.ctypes.data`` but compiled: a call
    takes 0.2-0.3 us where ``ctypes.data`` (which builds a ctypes object) takes 1 us, and
    a small layer's call asks twice (an operand's alignment, a placed result's). Numba has
    no float16, bfloat16 or byte-swapped arrays: those ask NumPy."""
    dt = a.dtype
    if dt is _HALF or not dt.isnative or dt.kind == "V":
        return a.ctypes.data
    return _address(a)


def _tunables(environ):
    out = {}
    for item in environ.get("GLIBC_TUNABLES", "").replace(":", ",").split(","):
        name, sep, value = item.partition("=")
        if sep:
            out[name.strip()] = value.strip()
    return out


def pinned_mmap_threshold(environ=None):
    """The bytes from which glibc maps every allocation afresh (and unmaps it on free) in
    this process, where its environment pinned the mmap threshold; ``None`` where glibc
    adjusts it (see the module docstring). Read from ``environ`` (default ``os.environ``),
    which glibc read at the process's start."""
    if environ is None:
        environ = os.environ
    tun = _tunables(environ)
    if not any(env in environ or name in tun for env, name in _PINNING.items()):
        return None
    value = environ.get("MALLOC_MMAP_THRESHOLD_", tun.get("glibc.malloc.mmap_threshold"))
    try:
        return max(int(value), 1) if value is not None else GLIBC_MMAP_THRESHOLD
    except ValueError:
        return GLIBC_MMAP_THRESHOLD


_pinned = []


def min_bytes():
    """Arrays from this many bytes on come from the pool: ``MIN_BYTES``, or glibc's pinned
    mmap threshold where that is lower."""
    if not _pinned:
        _pinned.append(pinned_mmap_threshold())
    t = _pinned[0]
    return MIN_BYTES if t is None else min(MIN_BYTES, t)


def _block_size(size):
    grain = GRAIN if size >= GRAIN else min(SMALL_GRAIN, GRAIN)
    return -(-size // grain) * grain


def limit():
    """The idle bytes the pool keeps (``config.MEMORY_POOL_BYTES`` or its default)."""
    v = config.MEMORY_POOL_BYTES
    if v is None:
        phys = runtime.phys_memory()
        return min(1 << 30, phys // 8) if phys else 1 << 30
    return int(v)


def _drain():
    """Blocks whose leases died join the idle list, which is then trimmed to the limit."""
    while _returned:
        _idle.append(_returned.popleft())
    _trim(limit())


def _trim(limit):
    total = sum(b.size for b in _idle)
    while _idle and total > limit:
        total -= _idle.pop(0).size


def _take(size):
    # a block serves a request it is the rounded size of (a 2.4 MB request makes a 4 MiB
    # block: under MIN_FILL of it, the request could never have its own block back), or
    # one that fills MIN_FILL of it
    # (of equal sizes the most recently returned: a loop of calls reuses the block its
    # last call wrote, still in the caches, instead of cycling through every idle block
    # of that size, oldest first: measured 2x slower on sub-millisecond layers)
    own = _block_size(size)
    with _lock:
        _drain()
        best = None
        for i in range(len(_idle) - 1, -1, -1):
            b = _idle[i]
            if size <= b.size and (size >= MIN_FILL * b.size or b.size == own) and (
                    best is None or b.size < _idle[best].size):
                best = i
        if best is not None:
            return _idle.pop(best)
        _trim(max(0, limit() - own))
    return _Block(own)


def empty(shape, dtype, offset=None):
    """``np.empty(shape, dtype)``, C order; from the pool (64-byte aligned) when large.
    ``offset`` (bytes, a multiple of the item size): start that far past a 64-byte
    boundary instead, large or small (a result placed as its operand is, so that the
    kernels' vectors of both meet the same boundaries)."""
    dtype = np.dtype(dtype)
    if type(shape) is not tuple:
        shape = tuple(int(s) for s in (shape if isinstance(shape, list) else (shape,)))
    n = math.prod(shape)
    nbytes = n * dtype.itemsize
    if offset is not None:
        offset = int(offset) % ALIGN
        if offset % dtype.itemsize:
            raise ValueError(f"memory.empty: offset {offset} is not a multiple of "
                             f"{dtype.itemsize}")
    if nbytes < min_bytes() or limit() <= 0:
        if offset is None:
            return np.empty(shape, dtype)
        raw = np.empty(nbytes + ALIGN, np.uint8)
        start = (offset - address(raw)) % ALIGN
        return raw[start:start + nbytes].view(dtype).reshape(shape)
    block = _take(nbytes + (ALIGN if offset else 0))
    lease = block.lease_type.from_buffer(block.mem)
    lease._block = block
    return np.frombuffer(lease, dtype, n, offset=offset or 0).reshape(shape)


def zeros(shape, dtype):
    """``np.zeros(shape, dtype)`` (see :func:`empty`)."""
    a = empty(shape, dtype)
    a.fill(0)
    return a


def release():
    """Free the idle blocks now; returns the bytes freed. Blocks still in use by arrays go
    back to the pool when those arrays are gone."""
    with _lock:
        _drain()
        freed = sum(b.size for b in _idle)
        _idle.clear()
    return freed


def idle_bytes():
    """Bytes held by idle blocks."""
    with _lock:
        _drain()
        return sum(b.size for b in _idle)


def ascontiguous(a, dtype=None):
    """``np.ascontiguousarray(a, dtype)``: ``a`` itself where it already is C-contiguous in
    ``dtype``, else a copy (see :func:`empty`)."""
    a = np.asarray(a)
    dtype = a.dtype if dtype is None else np.dtype(dtype)
    if a.dtype == dtype and a.flags.c_contiguous:
        return a
    out = empty(a.shape, dtype)
    np.copyto(out, a, casting="unsafe")
    return out


class _Alias:
    """An ``__array_interface__`` over another array's memory that NumPy takes as
    writable; it holds the array, so the memory lives as long as the alias."""

    def __init__(self, a):
        iface = dict(a.__array_interface__)
        iface["data"] = (iface["data"][0], False)
        self.__array_interface__ = iface
        self.base = a


def kernel_view(a):
    """``a`` where it is writable, else a writable view of the same memory (no copy).

    Numba types a read-only array apart from a writable one and compiles every kernel a
    second time for it, though no kernel writes an operand. Operands reach the kernels
    through this, so a memory map or a frozen buffer runs on the kernels already compiled
    (or cached) for writable arrays. Nothing writes through the view: every kernel takes
    its operands as inputs only (``tests/test_readonly.py`` checks their bits after every
    path)."""
    if a.flags.writeable:
        return a
    return np.asarray(_Alias(a)).view(a.dtype)
