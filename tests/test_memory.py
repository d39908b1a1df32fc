"""The pool of large arrays (numbaconv.memory): a block is never handed out again while any
array or view on it lives, and results from it are right and stay right."""
import gc
import threading

import numpy as np
import pytest

import numbaconv as nc
from numbaconv import config, memory
from reference import conv_bwd_data_ref


@pytest.fixture(autouse=True)
def small_pool(monkeypatch):
    """Pool from 1 KiB on, in 4 KiB blocks, so that test-sized arrays use it."""
    monkeypatch.setattr(memory, "MIN_BYTES", 1024)
    monkeypatch.setattr(memory, "GRAIN", 4096)
    monkeypatch.setattr(config, "MEMORY_POOL_BYTES", 1 << 20)
    memory.release()
    yield
    memory.release()


def test_empty_is_an_aligned_writable_c_array():
    a = memory.empty((3, 5, 70), np.float32)
    assert a.shape == (3, 5, 70) and a.dtype == np.float32
    assert a.flags.c_contiguous and a.flags.writeable
    assert a.ctypes.data % memory.ALIGN == 0
    a[...] = 7
    assert memory.zeros((3, 5, 70), np.float64).sum() == 0


def test_block_is_reused_only_when_its_last_view_is_gone():
    a = memory.empty((1000,), np.float64)
    a[:] = 1.5
    v = a[10:20]
    addr = a.ctypes.data
    del a
    gc.collect()
    b = memory.empty((1000,), np.float64)  # the view still holds the first block
    assert not np.shares_memory(b, v)
    b[:] = -1
    assert np.all(v == 1.5)
    del v
    gc.collect()
    c = memory.empty((1000,), np.float64)
    assert c.ctypes.data == addr  # back in the pool, handed out again
    del b, c


def test_small_arrays_and_a_disabled_pool_use_numpy(monkeypatch):
    assert memory.empty((10,), np.float32).flags.owndata  # under MIN_BYTES
    monkeypatch.setattr(config, "MEMORY_POOL_BYTES", 0)
    assert memory.empty((1000,), np.float64).flags.owndata


def test_idle_blocks_stay_under_the_limit(monkeypatch):
    monkeypatch.setattr(config, "MEMORY_POOL_BYTES", 64 * 1024)
    arrays = [memory.empty((n * 1000,), np.uint8) for n in range(2, 20)]
    del arrays
    gc.collect()
    memory.empty((100_000,), np.uint8)
    assert memory.idle_bytes() <= 64 * 1024
    assert memory.release() <= 64 * 1024
    assert memory.idle_bytes() == 0


def test_ascontiguous_copies_only_when_needed():
    a = np.arange(6000, dtype=np.float32).reshape(60, 100)
    assert memory.ascontiguous(a) is a
    t = memory.ascontiguous(a.T, np.float64)
    assert t.dtype == np.float64 and t.flags.c_contiguous
    np.testing.assert_array_equal(t, a.T)


def test_threads_never_share_a_live_block():
    errors = []

    def work(k):
        for i in range(200):
            a = memory.empty((512 + (i % 3) * 256,), np.float64)
            a[:] = k
            b = memory.empty((700,), np.float64)
            b[:] = -k
            if not (np.all(a == k) and np.all(b == -k)):
                errors.append((k, i))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_results_from_the_pool_survive_later_calls(rng):
    """A result is a pooled array; the next call's result must not overwrite it."""
    w = rng.standard_normal((3, 3, 8, 16)).astype(np.float32)
    dys = [rng.standard_normal((2, 9, 9, 16)).astype(np.float32) for _ in range(3)]
    a = dict(strides=(1, 1), pads_begin=(1, 1), pads_end=(1, 1))
    results = [nc.convolution_backprop_data(dy, w, (9, 9), **a) for dy in dys]
    assert all(not r.flags.owndata for r in results)  # they came from the pool
    views = [r[:, 1:] for r in results]
    del results
    gc.collect()
    again = [nc.convolution_backprop_data(dy, w, (9, 9), **a) for dy in dys[::-1]]
    for dy, v in zip(dys, views):
        ref = conv_bwd_data_ref(dy.astype(np.float64), w.astype(np.float64), (9, 9), 1, 1,
                                (1, 1), (1, 1))
        np.testing.assert_allclose(v, ref[:, 1:], rtol=1e-4, atol=1e-4)
    del again


def test_default_limit_is_a_share_of_memory(monkeypatch):
    monkeypatch.setattr(config, "MEMORY_POOL_BYTES", None)
    assert 0 < memory.limit() <= 1 << 30


@pytest.mark.parametrize("nbytes", [4096, 8 << 20])
def test_empty_at_an_offset(nbytes):
    """``offset`` puts an array that many bytes past a 64-byte boundary, small (np.empty)
    and large (the pool) alike; an offset that splits an element is refused."""
    for offset in (0, 16, 32, 48, -16):
        a = memory.empty(nbytes // 4, np.float32, offset=offset)
        assert a.shape == (nbytes // 4,) and a.dtype == np.float32 and a.flags.c_contiguous
        assert a.ctypes.data % 64 == offset % 64
        a[...] = 1.5  # all of it writable
        assert a.sum() == 1.5 * a.size
    with pytest.raises(ValueError, match="offset"):
        memory.empty(16, np.float64, offset=4)


def test_address_is_ctypes_data():
    """The compiled address is NumPy's own, for any dtype, rank and view (a strided view,
    an offset slice, a reversed one: its first element, not its lowest byte)."""
    base = np.arange(4 * 6 * 10, dtype=np.float32).reshape(4, 6, 10)
    for a in (base, base[1:, ::2, 3:], base[::-1], base.view(np.uint16),
              base.astype(np.float16)[2], np.empty(37, np.uint8)[5:],
              np.zeros((2, 3, 4, 5, 6), np.float64), base.astype(">f4")[1:]):
        assert memory.address(a) == a.ctypes.data
