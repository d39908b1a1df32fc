"""``sum_partials``: the partial weight gradients of the task-parallel entries (``gemm``'s
reduction slabs, ``gemm[rows]``, ``winograd``) summed on worker threads give the bits of
adding them one after another on one thread, whatever the worker count."""
import numpy as np
import pytest

from numbaconv.strategies import _gemm_common as gc


@pytest.mark.parametrize("nparts", [1, 2, 3, 16])
@pytest.mark.parametrize("shape", [(7, 5), (2304, 256), (36, 64, 60),
                                   (gc.SUM_MIN_ELEMENTS + 3,)])
def test_sum_partials_is_the_serial_sum_bitwise(nparts, shape):
    rng = np.random.default_rng(nparts)
    parts = [(rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape))
             .astype(np.float32) for _ in range(nparts)]
    ref = parts[0].copy()
    for a in parts[1:]:
        ref += a
    for nw in (1, 2, gc.SUM_MIN_WORKERS, 16):
        work = [a.copy() for a in parts]
        got = gc.sum_partials(work, nw)
        assert got is work[0]
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), nw
        for a, b in zip(work[1:], parts[1:]):  # the other partials are read, not written
            assert np.array_equal(a, b)


def test_sum_partials_uses_the_workers_only_where_it_pays(monkeypatch):
    from numbaconv import workers
    calls = []
    real = workers.run
    monkeypatch.setattr(workers, "run",
                        lambda n, fn, nw: (calls.append((n, nw)), real(n, fn, nw)))
    big = [np.ones(gc.SUM_MIN_ELEMENTS * 4, np.float32) for _ in range(3)]
    gc.sum_partials(big, gc.SUM_MIN_WORKERS - 1)  # too few workers: one thread
    gc.sum_partials([np.ones(100, np.float32), np.ones(100, np.float32)], 16)  # too small
    assert calls == []
    np.testing.assert_array_equal(big[0], 3.0)
    gc.sum_partials(big, 8)  # two ranges per worker
    assert calls == [(16, 8)]
    np.testing.assert_array_equal(big[0], 5.0)


def test_sum_partials_refuses_non_contiguous_partials():
    a = np.ones((8, 8), np.float32)
    with pytest.raises(ValueError, match="contiguous"):
        gc.sum_partials([a, a.T], 1)
