"""The worker threads of the packed GEMMs: every task once, errors re-raised, no deadlock."""
import threading

import pytest

from numbaconv import workers


@pytest.mark.parametrize("n_tasks,nw", [(0, 2), (1, 2), (7, 1), (7, 2), (50, 4)])
def test_every_task_runs_once_with_a_private_slot(n_tasks, nw):
    seen, lock, running = [], threading.Lock(), {}

    def fn(t, slot):
        with lock:
            assert slot not in running.values()   # no two threads share a slot at once
            running[threading.get_ident()] = slot
            seen.append(t)
        with lock:
            del running[threading.get_ident()]
        assert 0 <= slot < max(nw, 1)

    workers.run(n_tasks, fn, nw)
    assert sorted(seen) == list(range(n_tasks))


def test_the_first_error_is_raised_in_the_caller():
    def fn(t, slot):
        if t == 3:
            raise ValueError("task 3")

    with pytest.raises(ValueError, match="task 3"):
        workers.run(10, fn, 2)


def test_many_concurrent_callers_finish():
    out = []

    def call(i):
        acc = []
        workers.run(20, lambda t, slot: acc.append(t), 2)
        out.append(sorted(acc) == list(range(20)))

    ts = [threading.Thread(target=call, args=(i,)) for i in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert out == [True] * 16
