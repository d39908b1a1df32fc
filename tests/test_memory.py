"""The pool of large arrays (numbaconv.memory): a block is never handed out again while any
array or view on it lives, and results from it are right and stay right."""
import gc
import threading

import numpy as np
import pytest

import numbaconv as nc
from numbaconv import config, memory
from reference import conv_bwd_data_ref, conv_bwd_filter_ref


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


def test_the_most_recently_returned_block_comes_back_first():
    """Of idle blocks of one size, a request takes the one returned last (still in the
    caches from the call that wrote it), not the oldest: a loop of calls beside idle
    blocks left by larger layers reuses one block instead of cycling through them all."""
    a0, a1, a2 = (memory.empty((1000,), np.float64) for _ in range(3))
    addr = [a.ctypes.data for a in (a0, a1, a2)]
    del a2
    del a0
    del a1  # returned last
    gc.collect()
    b = memory.empty((1000,), np.float64)
    c = memory.empty((1000,), np.float64)
    assert (b.ctypes.data, c.ctypes.data) == (addr[1], addr[0])
    del b  # and again: the block just returned, not the idle one of the same size
    gc.collect()
    assert memory.empty((1000,), np.float64).ctypes.data == addr[1]


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


def test_a_block_serves_the_request_it_was_rounded_up_for():
    """A request under MIN_FILL of its own rounded block (5 KiB in an 8 KiB block) gets
    that block back: before, every such request made a new block."""
    a = memory.empty((5 * 1024,), np.uint8)
    addr = a.ctypes.data
    del a
    gc.collect()
    b = memory.empty((5 * 1024,), np.uint8)
    assert b.ctypes.data == addr


def test_pinned_mmap_threshold_from_the_environment():
    """glibc adjusts its mmap threshold unless a setting pins it (Dask's nanny sets
    MALLOC_TRIM_THRESHOLD_): then it is 128 KiB, or what MALLOC_MMAP_THRESHOLD_ says."""
    assert memory.pinned_mmap_threshold({}) is None
    assert memory.pinned_mmap_threshold({"OMP_NUM_THREADS": "1"}) is None
    assert memory.pinned_mmap_threshold({"MALLOC_TRIM_THRESHOLD_": "65536"}) == 128 << 10
    assert memory.pinned_mmap_threshold({"MALLOC_TOP_PAD_": "0"}) == 128 << 10
    assert memory.pinned_mmap_threshold({"MALLOC_MMAP_THRESHOLD_": "1048576"}) == 1 << 20
    assert memory.pinned_mmap_threshold(
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=65536:glibc.malloc.mmap_threshold=300000"}
    ) == 300000
    assert memory.pinned_mmap_threshold({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}) is None
    assert memory.pinned_mmap_threshold({"MALLOC_TRIM_THRESHOLD_": "1",
                                         "MALLOC_MMAP_THRESHOLD_": "lots"}) == 128 << 10


def test_pool_starts_at_the_pinned_threshold(monkeypatch):
    """Where glibc's threshold is pinned below MIN_BYTES, arrays from it on come from the
    pool (glibc would map each afresh), in blocks of SMALL_GRAIN below GRAIN."""
    monkeypatch.setattr(memory, "MIN_BYTES", 4 << 20)
    monkeypatch.setattr(memory, "GRAIN", 2 << 20)
    monkeypatch.setattr(memory, "_pinned", [None])
    assert memory.min_bytes() == 4 << 20
    assert memory.empty((1 << 20,), np.uint8).flags.owndata  # NumPy's
    monkeypatch.setattr(memory, "_pinned", [128 << 10])
    assert memory.min_bytes() == 128 << 10
    assert memory.empty((1000,), np.uint8).flags.owndata
    a = memory.empty((600 << 10,), np.uint8)
    assert not a.flags.owndata  # the pool's
    addr = a.ctypes.data
    del a
    gc.collect()
    assert memory.idle_bytes() == 640 << 10  # 600 KiB in a block of 10 x 64 KiB
    assert memory.empty((600 << 10,), np.uint8).ctypes.data == addr


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


@pytest.mark.parametrize("entry,k,pad", [("gemm[windows]", 3, 2), ("gemm[split-dw]", 3, 1),
                                          ("gemm[slabs]", 3, 1), ("gemm[split-k]", 1, 0)])
def test_weight_gradients_from_the_pool(entry, k, pad, rng):
    """The GEMM entries' weight gradients come from the pool like every other result (in
    a process whose malloc is pinned, as Dask's workers are, a fresh array faulted in
    every page: i3d:Mixed_5b_3x3's weight gradient 4.1 -> 2.1 ms), and a later call's
    result does not overwrite a live one."""
    x = [rng.standard_normal((1, 4, 5, 64)).astype(np.float32) for _ in range(2)]
    dy = [rng.standard_normal((1, 4 + 2 * pad - k + 1, 5 + 2 * pad - k + 1, 64))
          .astype(np.float32) for _ in range(2)]
    a = dict(strides=(1, 1), pads_begin=(pad, pad), pads_end=(pad, pad), strategy=entry)
    first = nc.convolution_backprop_filters(x[0], (k, k), dy[0], **a)
    base = first
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    assert type(base).__name__ == "_Lease"  # a pool block's lease, not NumPy's memory
    second = nc.convolution_backprop_filters(x[1], (k, k), dy[1], **a)
    for got, xi, di in ((first, x[0], dy[0]), (second, x[1], dy[1])):
        ref = conv_bwd_filter_ref(xi.astype(np.float64), di.astype(np.float64), (k, k), 1, 1,
                                  (pad, pad), (pad, pad))
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)


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


# --------------------------------------------------------------------------- memory check
@pytest.fixture
def memory_limit(monkeypatch):
    """The CPU backend's memory check against a pretend machine of ``set(n)`` bytes."""
    from numbaconv import runtime
    monkeypatch.setattr(config, "MAX_MEMORY_FRACTION", 1.0)

    def set_limit(n):
        monkeypatch.setattr(runtime, "phys_memory", lambda: n)
    return set_limit


def _needed(exc_info):
    import re
    m = re.search(r"needs (\d+) bytes", str(exc_info.value))
    assert m, str(exc_info.value)
    return int(m.group(1))


def test_memory_check_counts_the_result_not_the_callers_operands(memory_limit, rng):
    """A weight gradient whose result (16 KiB) fits runs, though result and operands
    together (32.5 KiB) would not: the caller already holds the operands."""
    from reference import conv_bwd_filter_ref
    memory_limit(20000)
    x = rng.standard_normal((1, 1, 1, 64)).astype(np.float32)
    dy = rng.standard_normal((1, 1, 1, 64)).astype(np.float32)
    dw = nc.conv2d_backprop_filter(x, (1, 1, 64, 64), dy, 1, "VALID", strategy="direct")
    ref = conv_bwd_filter_ref(x, dy, (1, 1))
    np.testing.assert_allclose(dw, ref, rtol=1e-5, atol=1e-6)
    # a result of 25600 bytes does not fit: refused before any work, with the numbers
    x, dy = np.ones((1, 1, 1, 80), np.float32), np.ones((1, 1, 1, 80), np.float32)
    with pytest.raises(MemoryError, match=r"needs 25600 bytes.*limit is 20000 bytes") as e:
        nc.conv2d_backprop_filter(x, (1, 1, 80, 80), dy, 1, "VALID", strategy="direct")
    assert "(1, 1, 80, 80)" in str(e.value)


def test_memory_check_counts_the_copies_it_makes(memory_limit):
    """Only the conversions that really happen count: the canonical copy of NCHW data, of a
    strided or byte-swapped operand, and the result's copy into the user's layout (not
    made into ``out=``)."""
    memory_limit(1)
    w = np.ones((3, 3, 8, 4), np.float32)               # XIO, contiguous: used as it is
    y_bytes = 2 * 5 * 5 * 4 * 4                         # the result, 800 bytes
    x_bytes = 2 * 5 * 5 * 8 * 4                         # a copy of the input, 1600 bytes

    def need(x, fmt="NHWC", out=None):
        with pytest.raises(MemoryError) as e:
            nc.conv2d(x, w, 1, "SAME", data_format=fmt, strategy="direct", out=out)
        return _needed(e)

    nhwc = np.ones((2, 5, 5, 8), np.float32)
    assert need(nhwc) == y_bytes
    assert need(np.ones((2, 8, 5, 5), np.float32), "NCHW") == x_bytes + 2 * y_bytes
    assert need(np.ones((2, 8, 5, 5), np.float32), "NCHW",
                out=np.empty((2, 4, 5, 5), np.float32)) == x_bytes + y_bytes
    assert need(np.ones((2, 5, 10, 8), np.float32)[:, :, ::2]) == x_bytes + y_bytes
    assert need(nhwc.astype(">f4")) == x_bytes + y_bytes
    # float16: both operands widened to float32, the float32 result rounded to float16
    half = nc.plan("conv2d", nhwc.astype(np.float16), w.astype(np.float16), 1, "SAME",
                   strategy="direct")
    from numbaconv.backends import cpu
    with pytest.raises(MemoryError) as e:
        cpu.check_memory(half, {"x": nhwc.astype(np.float16), "w": w.astype(np.float16)})
    assert _needed(e) == x_bytes + w.size * 4 + y_bytes + y_bytes // 2


def test_gpu_memory_check_counts_the_result_not_the_callers_operands():
    """The device check, against a pretend GPU with ``free`` bytes: a 16 KiB weight
    gradient fits in 20000 free bytes (its operands are the caller's), not in 16000."""
    from numbaconv.backends import cuda as backend

    class Device:  # a C-contiguous device operand
        def __init__(self, dtype):
            self.dtype = np.dtype(dtype)

        def is_c_contiguous(self):
            return True

    class FakeCuda:
        def __init__(self, free):
            self.free = free

        def current_context(self):
            return self

        def get_memory_info(self):
            return self.free, 1 << 40

    x, dy = np.ones((1, 1, 1, 64), np.float32), np.ones((1, 1, 1, 64), np.float32)
    p = nc.plan("conv2d_backprop_filter", x, (1, 1, 64, 64), dy, 1, "VALID").problem
    tiles = backend.plan_tiles(p, "direct")
    assert backend.workspace_bytes(p, tiles) == 0
    ops = {"x": Device(np.float32), "dy": Device(np.float32)}
    backend.check_memory(FakeCuda(20000), p, tiles, ops)
    backend.check_memory(FakeCuda(16384 + 512), p, tiles)  # operands copied: 512 bytes
    with pytest.raises(MemoryError, match=r"needs 16384 bytes .* 16000 bytes are free"):
        backend.check_memory(FakeCuda(16000), p, tiles, ops)
    # float64 operands of a float32 problem are converted: copies counted
    with pytest.raises(MemoryError, match=r"needs 16896 bytes"):
        backend.check_memory(FakeCuda(16500), p, tiles, {"x": Device(np.float64),
                                                         "dy": Device(np.float64)})
