"""Worker set-up: numbaconv's threads follow the worker's threads, kernels warm once per
worker process, the Numba cache directory is the one the cluster was given, and the idle
blocks numbaconv keeps beside Dask's own memory are few (``WORKER_POOL_BYTES``).

Dask sets the BLAS thread variables of its worker processes (``OMP_NUM_THREADS=1`` and
friends) but not Numba's: without a limit, every worker process of a machine would run its
kernels on all of the machine's cores at once. A worker process therefore runs numbaconv's
kernels on as many threads as the worker has (``Worker.state.nthreads``), at most Numba's
pool size. This happens on the first numbaconv task a worker process runs, unless
``numbaconv.set_num_threads`` was called there; :class:`NumbaconvSetup` does it when the
worker starts, with an explicit count if given, and warms the kernels.
"""
import multiprocessing
import os

_configured = False

#: Idle bytes numbaconv's pool of recycled blocks (:mod:`numbaconv.memory`) keeps in a
#: worker process unless ``pool_bytes=`` or ``NUMBACONV_MEMORY_POOL_BYTES`` says otherwise:
#: enough for the scratch arrays of a call on a block (res3a_branch2b's weight gradient on
#: 16 samples: 14 MB), few beside Dask's memory, which does not see them. Without a pool a
#: worker process re-faults that scratch on every call: Dask's nanny sets
#: ``MALLOC_TRIM_THRESHOLD_``, which pins glibc's mmap threshold at 128 KiB, so every
#: array from 128 KiB on is a fresh mapping (measured: 3354 faults, +40% per call).
WORKER_POOL_BYTES = 64 << 20


def _worker():
    try:
        from distributed import get_worker
        return get_worker()
    except (ImportError, ValueError):
        return None


def worker_threads(worker):
    """The numbaconv thread count for ``worker``: its Dask threads, at most Numba's pool."""
    import numba
    n = getattr(getattr(worker, "state", None), "nthreads", None) or worker.nthreads
    return max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))


def configure_worker():
    """Run by every numbaconv task: the first one in a worker process that is a child of
    its nanny (not the client's own process) sets numbaconv's threads to the worker's,
    unless they were set explicitly."""
    global _configured
    if _configured:
        return
    _configured = True
    from .. import config
    if multiprocessing.parent_process() is None:
        return
    worker = _worker()
    if worker is None:
        return
    if not config.THREADS:
        config.THREADS = worker_threads(worker)
    _worker_pool()


def _worker_pool():
    """A small pool of idle blocks in a worker unless one was asked for
    (``NUMBACONV_MEMORY_POOL_BYTES``): Dask holds the results, and idle blocks are memory it
    does not manage, on top of its own limit, in every worker of the machine; a call's
    scratch arrays (``WORKER_POOL_BYTES``) are worth keeping."""
    from .. import config
    if config.MEMORY_POOL_BYTES is None:
        config.MEMORY_POOL_BYTES = WORKER_POOL_BYTES


def _set_cache_dir(path):
    """Point Numba's kernel cache at ``path`` in this process (before kernels compile)."""
    import numba
    os.makedirs(path, exist_ok=True)
    os.environ["NUMBA_CACHE_DIR"] = path
    numba.config.CACHE_DIR = path


def _plugin_base():
    try:
        from distributed import WorkerPlugin
    except ImportError:  # pragma: no cover - the dask extra installs distributed
        return object
    return WorkerPlugin


class NumbaconvSetup(_plugin_base()):
    """A ``distributed`` worker plugin: numbaconv's threads, kernel cache and warm-up.

    Register it once per cluster (``client.register_plugin(NumbaconvSetup())``); every
    worker process, including those started later or restarted after a failure, runs
    :meth:`setup` once.

    In each worker the pool of idle blocks (``numbaconv.memory``) keeps at most
    ``WORKER_POOL_BYTES`` (64 MiB) unless ``pool_bytes=`` or
    ``NUMBACONV_MEMORY_POOL_BYTES`` sets it: enough for a call's scratch arrays, which a
    worker process would otherwise fault in afresh on every call, and little beside the
    memory Dask's memory manager sees and limits.

    Parameters
    ----------
    threads : int, optional
        numbaconv's kernel threads in each worker process (default: the worker's threads,
        at most ``NUMBA_NUM_THREADS``).
    warmup : bool
        Compile (or load from the disk cache) the kernels before the first task.
    dtypes : tuple of str
        The dtypes to warm.
    strategies : tuple of str, optional
        Warm only these planner entries or families (``numbaconv.warmup``'s
        ``strategies=``); default all of them. Problems under
        ``numbaconv.config.SMALL_FLOPS`` run on the ``numpy`` entry, which compiles nothing.
    cache_dir : str, optional
        ``NUMBA_CACHE_DIR`` for the workers; default: what their environment says. Workers
        that share one directory compile each kernel once between them.
    pool_bytes : int, optional
        Idle bytes numbaconv's pool keeps in each worker (default: ``WORKER_POOL_BYTES``,
        or ``NUMBACONV_MEMORY_POOL_BYTES`` where set; 0 turns it off).
    """

    name = "numbaconv-setup"

    def __init__(self, threads=None, warmup=True, dtypes=("float32",), strategies=None,
                 cache_dir=None, pool_bytes=None):
        if pool_bytes is not None and (isinstance(pool_bytes, bool)
                                       or not isinstance(pool_bytes, int) or pool_bytes < 0):
            raise ValueError(f"pool_bytes: expected a non-negative int or None, got "
                             f"{pool_bytes!r}")
        self.pool_bytes = pool_bytes
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or threads < 1):
            raise ValueError(f"threads: expected a positive int or None, got {threads!r}")
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir: expected a path, got {cache_dir!r}")
        self.threads = threads
        self.warmup = bool(warmup)
        self.dtypes = tuple(dtypes)
        self.strategies = None if strategies is None else tuple(strategies)
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.report = None

    def setup(self, worker):
        global _configured
        import numba
        import numbaconv
        from .. import config
        if self.cache_dir is not None:
            _set_cache_dir(self.cache_dir)
        n = self.threads or worker_threads(worker)
        config.THREADS = max(1, min(n, numba.config.NUMBA_NUM_THREADS))
        if self.pool_bytes is not None:
            config.MEMORY_POOL_BYTES = self.pool_bytes
        else:
            _worker_pool()
        _configured = True
        seconds = 0.0
        if self.warmup:
            # in this process: a warm-up's own pool of processes would compete with the
            # other workers of the machine for its cores
            seconds = numbaconv.warmup(dtypes=self.dtypes, strategies=self.strategies,
                                       processes=1)
        self.report = dict(threads=config.THREADS, warmup_seconds=seconds,
                           pool_bytes=config.MEMORY_POOL_BYTES,
                           cache_dir=numba.config.CACHE_DIR or None, pid=os.getpid())


def worker_state():
    """What a worker process runs numbaconv with (for ``client.run``): its threads, Numba's
    cache directory and pool size, and the process id."""
    import numba
    import numbaconv
    from .. import config
    return dict(threads=numbaconv.get_num_threads(), cache_dir=numba.config.CACHE_DIR or None,
                pool_bytes=config.MEMORY_POOL_BYTES,
                numba_threads=numba.config.NUMBA_NUM_THREADS, pid=os.getpid())
