"""Run a list of independent tasks on several cores from Python threads.

The GEMM strategy packs columns in serial Numba kernels (``nogil``) and multiplies them in
BLAS, both of which release the GIL. Rather than packing on one core while the others wait
and then multiplying with every core (measured: ResNet-50's 7x7 stem backward weights spent
9 of 23 ms packing on one of two cores), each worker thread packs and multiplies its own
slabs with a single-threaded BLAS, as oneDNN splits the batch across threads with private
results.

Helpers come from one shared pool. A call never waits for a helper that has not started:
the caller works through the tasks itself and then waits only for tasks already taken, so
concurrent calls from many Python threads cannot deadlock on a busy pool.
"""
import threading
from concurrent.futures import ThreadPoolExecutor

from . import _ahead

_pool = None
_pool_lock = threading.Lock()


def _executor(n):
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers < n:
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="numbaconv")
        return _pool


def run(n_tasks, fn, workers):
    """Call ``fn(task, slot)`` for every ``task`` in ``range(n_tasks)`` on up to ``workers``
    threads (the caller is one of them); ``slot`` in ``range(workers)`` is unique among the
    threads running at once, for per-worker buffers. Re-raises the first exception."""
    workers = max(1, min(int(workers), n_tasks))
    if workers == 1:
        for t in range(n_tasks):
            fn(t, 0)
        return
    lock = threading.Lock()
    done = threading.Event()
    state = {"next": 0, "finished": 0, "error": None, "slots": list(range(workers - 1, 0, -1))}

    def work(slot):
        while True:
            with lock:
                t = state["next"]
                if t >= n_tasks or state["error"] is not None:
                    return
                state["next"] = t + 1
            try:
                fn(t, slot)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                with lock:
                    if state["error"] is None:
                        state["error"] = exc
            with lock:
                state["finished"] += 1
                if state["finished"] == state["next"] and (
                        state["next"] >= n_tasks or state["error"] is not None):
                    done.set()

    session = _ahead.current()  # a first call's compile-ahead helper, for these threads too

    def helper():
        with lock:
            if not state["slots"]:
                return
            slot = state["slots"].pop()
        if session is None:  # every call after a plan's first
            work(slot)
            return
        prev = _ahead.adopt(session)
        try:
            work(slot)
        finally:
            _ahead.adopt(prev)

    pool = _executor(workers - 1)
    for _ in range(workers - 1):
        pool.submit(helper)
    work(0)
    with lock:
        # nothing taken and unfinished: done (covers a caller that took every task itself)
        if state["finished"] == state["next"]:
            done.set()
    done.wait()
    if state["error"] is not None:
        raise state["error"]
