"""The register-blocked GEMM micro-kernel (``numbaconv.kernels.cpu.ukernel``) against
float64 NumPy products: edge tiles in rows and columns, reduction and column blocks,
transposed and strided operands, accumulation, row maps, and its argument checks."""
import numpy as np
import pytest

from numbaconv.kernels.cpu import ukernel as uk


def _ref(A, B):
    return A.astype(np.float64) @ B.astype(np.float64)


def _close(got, want, dtype):
    tol = 1e-5 if dtype == np.float32 else 1e-12
    scale = max(1.0, float(np.abs(want).max()))
    assert np.abs(got - want).max() <= tol * scale * 10


SHAPES = [(1, 1, 1), (5, 3, 7), (6, 16, 16), (13, 300, 70), (25, 257, 129), (7, 1, 200),
          (100, 530, 1030), (12, 64, 65)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("M,K,N", SHAPES)
def test_matmul_matches_numpy(M, K, N, dtype):
    rng = np.random.default_rng(M * 1000 + K + N)
    A = rng.standard_normal((M, K)).astype(dtype)
    B = rng.standard_normal((K, N)).astype(dtype)
    C = np.full((M, N), np.nan, dtype)  # beta 0 must not read C
    # small blocks: every reduction and column block boundary is crossed
    uk.matmul(A, B, C, kc=64, nc=uk.panel(C.itemsize))
    _close(C, _ref(A, B), dtype)
    C0 = rng.standard_normal((M, N)).astype(dtype)
    C = C0.copy()
    uk.matmul(A, B, C, accumulate=True)
    _close(C, C0 + _ref(A, B), dtype)


def _tail_widths(dtype):
    """Column counts ending a quarter and a half of a vector past 0-3 whole vectors (the
    micro-kernel's narrow last vector) on this host, and one that ends elsewhere."""
    vl = uk.lanes(np.dtype(dtype).itemsize)
    return [n * vl + vl // 4 for n in range(4)] + [n * vl + vl // 2 for n in range(4)] + \
        [vl + 3 * vl // 4 if vl >= 4 else vl + 1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_narrow_last_vector_stores_exactly_its_columns(dtype):
    """Tiles whose last vector is a quarter or a half wide run the narrow micro-kernels
    (whole row tiles store straight into C): exact products, nothing written past the
    columns (NaN there stays NaN), in the blocked driver (also accumulating, and with
    columns past the panel) and in the claimed-rows driver."""
    rng = np.random.default_rng(7)
    nr = uk.panel(np.dtype(dtype).itemsize)
    for N in _tail_widths(dtype) + [nr + w for w in _tail_widths(dtype)[:2]]:
        for M in (12, 13):
            A = rng.standard_normal((M, 37)).astype(dtype)
            B = rng.standard_normal((37, N)).astype(dtype)
            out = np.full((M, N + 5), np.nan, dtype)
            C = out[:, :N]
            uk.matmul(A, B, C)
            _close(C, _ref(A, B), dtype)
            assert np.isnan(out[:, N:]).all(), (M, N)
            C0 = rng.standard_normal((M, N)).astype(dtype)
            C[...] = C0
            uk.matmul(A, B, C, accumulate=True)
            _close(C, C0 + _ref(A, B), dtype)
            assert np.isnan(out[:, N:]).all(), (M, N)
            out[:, :N] = np.nan
            uk.matmul_claimed(A, uk.pack_panels(B), C, np.zeros(1, np.int64), 6)
            _close(C, _ref(A, B), dtype)
            assert np.isnan(out[:, N:]).all(), (M, N)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("nv", [1, 2])
def test_claimed_tall_tiles_for_two_vectors(nv, dtype):
    """Two vectors of columns: the claimed blocks run the taller tile (``PATCH_MR[2]``)
    over their whole tall tiles and 6-row tiles over the rest (one vector: 6-row tiles
    only); exact, C's rows past N untouched, for blocks of several tall tiles plus a
    remainder and a block shorter than one tall tile."""
    vl = uk.lanes(np.dtype(dtype).itemsize)
    N = nv * vl
    rng = np.random.default_rng(nv)
    for M, chunk in ((100, 48), (13, 12), (200, 200)):
        A = rng.standard_normal((M, 29)).astype(dtype)
        B = rng.standard_normal((29, N)).astype(dtype)
        out = np.full((M, N + 3), np.nan, dtype)
        C = out[:, :N]
        uk.matmul_claimed(A, uk.pack_panels(B), C, np.zeros(1, np.int64), chunk)
        _close(C, _ref(A, B), dtype)
        assert np.isnan(out[:, N:]).all(), (M, N)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transposed_and_strided_operands(dtype):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((301, 45)).astype(dtype)
    D = rng.standard_normal((301, 90)).astype(dtype)
    # A = X^T (unit row stride), B = every other column block of D's rows (ldb = 90)
    out = np.zeros((45, 90), dtype)
    view = out[:, 10:43]
    uk.matmul(X.T, D[:, 5:38], view)
    _close(view, _ref(X.T, D[:, 5:38]), dtype)
    assert not out[:, :10].any() and not out[:, 43:].any()  # nothing outside C written


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("K,N", [(70, 37), (300, 129), (5, 16)])
def test_transposed_b_is_packed_without_a_copy(K, N, dtype):
    """B = W^T (unit row stride, columns ``ldw`` apart): backward data's 1x1 weights."""
    rng = np.random.default_rng(K + N)
    A = rng.standard_normal((29, K)).astype(dtype)
    W = rng.standard_normal((N + 3, K + 2)).astype(dtype)
    B = W[3:, 2:].T
    C = np.full((29, N), np.nan, dtype)
    uk.matmul(A, B, C, kc=64, nc=uk.panel(C.itemsize))
    _close(C, _ref(A, B), dtype)
    uk.matmul(A, B, C, accumulate=True)
    _close(C, 2 * _ref(A, B), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_rows_writes_only_its_rows(dtype):
    rng = np.random.default_rng(1)
    A = rng.standard_normal((37, 70)).astype(dtype)
    B = rng.standard_normal((70, 21)).astype(dtype)
    out = np.zeros((40, 50), dtype)
    rows = np.array([(i + 2) * 50 + 3 for i in range(37)][::-1], np.int64)
    uk.matmul_rows(A, B, out, rows, kc=32, nc=uk.panel(out.itemsize))
    want = np.zeros((40, 50))
    want[2:39, 3:24] = _ref(A, B)[::-1]
    _close(out, want, dtype)
    uk.matmul_rows(A, B, out, rows, accumulate=True)
    _close(out, 2 * want, dtype)
    with pytest.raises(ValueError, match="outside"):
        uk.matmul_rows(A, B, out, rows + 50 * 3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("M,K,N", [(1, 1, 1), (5, 3, 7), (100, 64, 64), (301, 70, 37),
                                   (250, 128, 257)])
def test_matmul_claimed_threads_share_the_rows(M, K, N, dtype):
    """Two threads claim row blocks from one counter: C complete and exact, nothing past
    it written, and the counter run past M (every block claimed once)."""
    import threading
    rng = np.random.default_rng(M + K + N)
    A = rng.standard_normal((M, K)).astype(dtype)
    W = rng.standard_normal((N, K + 1)).astype(dtype)
    B = W[:, 1:].T  # backward data's W^T: a transposed view
    Bp = uk.pack_panels(B)
    assert Bp.shape == (-(-N // uk.panel(A.itemsize)), K, uk.panel(A.itemsize))
    out = np.full((M, N + 3), np.nan, dtype)
    C = out[:, :N]
    counter = np.zeros(1, np.int64)
    threads = [threading.Thread(target=uk.matmul_claimed, args=(A, Bp, C, counter, 12))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _close(C, _ref(A, B), dtype)
    assert np.isnan(out[:, N:]).all()
    assert M <= counter[0] < M + 3 * 12  # claims of 12 rows: each thread overshoots once


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("K,M,N,shares", [(1, 1, 1, 2), (2, 5, 70, 3), (37, 5, 70, 2),
                                          (600, 64, 64, 2), (301, 13, 129, 1)])
def test_gemm_split_k_sums_the_shares(K, M, N, shares, dtype):
    """``C = X^T @ dY`` with the reduction split into shares (more shares than rows leaves
    some empty): share 0 written into C (pre-filled with NaN: never read), the others into
    partials added to it."""
    rng = np.random.default_rng(K + M + N)
    X = rng.standard_normal((K, M)).astype(dtype)
    dY = rng.standard_normal((K, N)).astype(dtype)
    C = np.full((M, N), np.nan, dtype)
    parts = np.full((shares - 1, M, N), np.nan, dtype)
    kc, nc = 64, uk.panel(C.itemsize)
    work = np.empty((shares, uk.workspace(kc, C.itemsize, nc)), dtype)
    uk.gemm_split_k(X.ctypes.data, 1, M, dY.ctypes.data, N, 1, C, parts, K, kc, nc, work)
    _close(C, _ref(X.T, dY), dtype)
    # without the prefetches of each next reduction block: the same sums, bit for bit
    plain = np.full((M, N), np.nan, dtype)
    uk.gemm_split_k(X.ctypes.data, 1, M, dY.ctypes.data, N, 1, plain, parts, K, kc, nc, work,
                    False)
    np.testing.assert_array_equal(plain, C)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("K,M,N,shares", [(1, 1, 1, 2), (30, 2560, 70, 2), (37, 5, 70, 3),
                                          (300, 61, 129, 2), (7, 13, 64, 4)])
def test_gemm_split_m_splits_the_rows(K, M, N, shares, dtype):
    """``C = X^T @ dY`` with C's rows split into shares of whole row tiles (more shares
    than tiles leaves some empty; reductions longer than ``kc`` take several blocks); C
    pre-filled with NaN, so every element must be written."""
    rng = np.random.default_rng(K + M + N)
    X = rng.standard_normal((K, M)).astype(dtype)
    dY = rng.standard_normal((K, N)).astype(dtype)
    C = np.full((M, N), np.nan, dtype)
    kc, nc = 64, uk.panel(C.itemsize)
    work = np.empty((shares, uk.workspace(kc, C.itemsize, nc)), dtype)
    uk.gemm_split_m(X.ctypes.data, 1, M, dY.ctypes.data, N, 1, C, K, kc, nc, work)
    _close(C, _ref(X.T, dY), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("g,M,K,N,chunk", [(3, 50, 17, 16, 12), (2, 7, 5, 70, 6),
                                           (4, 13, 33, 3, 18)])
def test_claimed_groups_every_product_in_one_loop(g, M, K, N, chunk, dtype):
    """A grouped 1x1 layer's products (column slices of A and C, one B each) from one
    counter: every block of every product exact, nothing between the slices written."""
    rng = np.random.default_rng(g * M + K)
    A = rng.standard_normal((M, g * K + 2)).astype(dtype)     # 2 columns no product reads
    W = rng.standard_normal((N, g * K)).astype(dtype)
    B = W.reshape(N, g, K).transpose(1, 2, 0)                  # B_i = W[:, i*K:(i+1)*K]^T
    bps = uk.pack_group_panels(B)
    nr = uk.panel(A.itemsize)
    assert bps.shape == (g, -(-N // nr), K, nr) and bps.flags.c_contiguous
    for i in range(g):
        np.testing.assert_array_equal(bps[i], uk.pack_panels(B[i]))
    out = np.full((M, g * (N + 1)), np.nan, dtype)             # a gap column after each C_i
    counter = np.zeros(1, np.int64)
    work = np.empty((2, uk.claimed_workspace(K, A.itemsize)), dtype)
    ch = -(-chunk // uk.MR) * uk.MR
    uk.gemm_claimed_groups(A.ctypes.data, A.shape[1], 1, bps, out.ctypes.data, out.shape[1],
                           M, N, K, N + 1, counter, ch, work)
    for i in range(g):
        _close(out[:, i * (N + 1):i * (N + 1) + N], _ref(A[:, i * K:(i + 1) * K], B[i]),
               dtype)
        assert np.isnan(out[:, i * (N + 1) + N]).all()
    assert counter[0] >= g * -(-M // ch)                       # every block claimed


def test_matmul_claimed_argument_checks():
    A = np.ones((4, 3), np.float32)
    Bp = uk.pack_panels(np.ones((3, 5), np.float32))
    with pytest.raises(ValueError, match="panels"):
        uk.matmul_claimed(A, np.ones((3, 5), np.float32), np.empty((4, 5), np.float32),
                          np.zeros(1, np.int64), 6)
    with pytest.raises(ValueError, match="counter"):
        uk.matmul_claimed(A, Bp, np.empty((4, 5), np.float32), np.zeros(1, np.int32), 6)
    with pytest.raises(ValueError, match="unit column stride"):
        uk.matmul_claimed(A, Bp, np.empty((5, 4), np.float32).T, np.zeros(1, np.int64), 6)
    C = np.full((4, 5), np.nan, np.float32)
    uk.matmul_claimed(np.ones((4, 0), np.float32), uk.pack_panels(np.ones((0, 5), np.float32)),
                      C, np.zeros(1, np.int64), 6)
    assert not C.any()


def test_argument_checks():
    A = np.ones((4, 3), np.float32)
    B = np.ones((3, 5), np.float32)
    with pytest.raises(ValueError, match="float32 or float64"):
        uk.matmul(A.astype(np.float16), B.astype(np.float16), np.empty((4, 5), np.float16))
    with pytest.raises(ValueError):
        uk.matmul(A, np.ones((4, 5), np.float32), np.empty((4, 5), np.float32))
    with pytest.raises(ValueError, match="non-negative"):
        uk.matmul(A, B[:, ::-1], np.empty((4, 5), np.float32))
    with pytest.raises(ValueError, match="unit column stride"):
        uk.matmul(A, B, np.empty((5, 4), np.float32).T)
    C = np.empty((4, 5), np.float32)
    C.flags.writeable = False
    with pytest.raises(ValueError):
        uk.matmul(A, B, C)
    assert not uk.matmul(np.ones((4, 0), np.float32), np.ones((0, 5), np.float32),
                         np.ones((4, 5), np.float32)).any()


def test_transpose_taps():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((5, 37, 70)).astype(np.float32)
    idx = np.array([4, 0, 2], np.int64)
    out = np.empty((3, 30, 37), np.float32)
    from numbaconv.kernels.cpu import gemm
    gemm.transpose_taps(w, idx, np.int64(17), out)
    np.testing.assert_array_equal(out, w[idx][:, :, 17:47].transpose(0, 2, 1))


def test_micro_kernel_uses_full_vectors_and_fma(tmp_path):
    """The reduction loop is vector FMAs on registers of the host's width (zmm with
    AVX-512), not scalar code: checked in the generated assembly, compiled afresh in a
    subprocess (Numba does not inspect code loaded from its cache)."""
    import os
    import subprocess
    import sys
    code = (
        "import re, numpy as np\n"
        "from numbaconv.kernels.cpu import ukernel as uk\n"
        "uk.matmul(np.ones((12, 64), np.float32), np.ones((64, 64), np.float32),\n"
        "          np.empty((12, 64), np.float32))\n"
        "d = uk._gemm.dispatcher\n"
        "asm = d.inspect_asm(d.signatures[0])\n"
        "reg = {64: 'zmm', 32: 'ymm'}.get(uk.VECTOR_BYTES, 'xmm')\n"
        "fma = re.findall(r'vfmadd\\w*ps\\s[^\\n]*%' + reg, asm)\n"
        "print(len(fma))\n")
    env = dict(os.environ, NUMBACONV_CACHE="0", NUMBA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # every micro-kernel (1..NV vectors across, MR rows) unrolls MR*nv FMAs per step
    assert int(out.stdout.split()[-1]) >= uk.MR * uk.NV


@pytest.mark.parametrize("mb,hw,ic,oc", [(2, 7, 64, 64), (1, 5, 96, 40), (3, 9, 512, 1040),
                                         (2, 30, 16, 24), (1, 1, 8, 8)])
def test_split_k_weight_gradient_float16_widens_in_the_kernel(mb, hw, ic, oc):
    """The split-K 1x1 weight gradient takes float16 X and dY as bits and widens one
    reduction block at a time: bit for bit float32's result on the widened operands,
    rounded once (several blocks and a partial one, a share with one pixel, B rows wide
    enough to be packed); the user's arrays are left alone."""
    import numbaconv as nc
    from numbaconv import planner
    rng = np.random.default_rng(3)
    x = rng.standard_normal((mb, hw, hw, ic)).astype(np.float16)
    dy = rng.standard_normal((mb, hw, hw, oc)).astype(np.float16)
    kw = dict(strides=1, pads_begin=0, pads_end=0, strategy="gemm[split-k]")
    try:
        plan = nc.plan("convolution_backprop_filters", x, (1, 1), dy, **kw)
    except ValueError:
        pytest.skip("the split-K weight gradient is the Numba engine's (AVX-512 hosts)")
    assert planner.implementation(plan).half_operands(plan.problem, plan.tiles) == {"x", "dy"}
    saved = x.copy(), dy.copy()
    got = nc.convolution_backprop_filters(x, (1, 1), dy, **kw)
    want = nc.convolution_backprop_filters(x.astype(np.float32), (1, 1),
                                           dy.astype(np.float32), **kw).astype(np.float16)
    assert got.dtype == np.float16 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(x, saved[0])
    np.testing.assert_array_equal(dy, saved[1])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mb,hw,ic,oc", [(3, 9, 32, 10), (2, 30, 64, 40), (1, 7, 96, 9)])
def test_split_k_weight_gradient_transposed(mb, hw, ic, oc, dtype, monkeypatch):
    """Output channels short of whole vectors over whole vectors of input channels:
    ``dW^T = dY^T @ X``, transposed into dW. Against the float64 reference, and bit for
    bit the untransposed GEMM's result (each element sums the same pixels in the same
    order)."""
    import numbaconv as nc
    from numbaconv import planner
    from numbaconv.strategies import gemm
    from reference import conv_bwd_filter_ref
    rng = np.random.default_rng(ic + oc)
    x = rng.standard_normal((mb, hw, hw, ic)).astype(dtype)
    dy = rng.standard_normal((mb, hw, hw, oc)).astype(dtype)
    kw = dict(strides=1, pads_begin=0, pads_end=0, strategy="gemm[split-k]")
    try:
        plan = nc.plan("convolution_backprop_filters", x, (1, 1), dy, **kw)
    except ValueError:
        pytest.skip("the split-K weight gradient is the Numba engine's (AVX-512 hosts)")
    assert plan.tiles["transposed"] == gemm.split_k_transposed(plan.problem)
    if not plan.tiles["transposed"]:
        pytest.skip(f"{oc} output channels fill whole vectors on this host")
    saved = x.copy(), dy.copy()
    got = nc.convolution_backprop_filters(x, (1, 1), dy, **kw)
    want = conv_bwd_filter_ref(x, dy, (1, 1))
    assert got.shape == want.shape == (1, 1, ic, oc)
    _close(got, want, np.dtype(dtype))
    monkeypatch.setattr(gemm, "split_k_transposed", lambda p: False)
    planner.clear_plan_cache()
    try:
        plain = nc.convolution_backprop_filters(x, (1, 1), dy, **kw)
    finally:
        planner.clear_plan_cache()
    np.testing.assert_array_equal(got, plain)
    np.testing.assert_array_equal(x, saved[0])
    np.testing.assert_array_equal(dy, saved[1])


@pytest.mark.parametrize("M,K,N", [(1, 1, 1), (37, 13, 70), (100, 64, 64), (301, 70, 257)])
def test_matmul_claimed_half_rounds_each_block(M, K, N):
    """float16 A and C as bits, widened and rounded one claimed block at a time by two
    threads: bit for bit the float32 product on the widened A, rounded once; the counter
    run past M; A left alone."""
    import threading
    rng = np.random.default_rng(M + K + N)
    A = rng.standard_normal((M, K)).astype(np.float16)
    saved = A.copy()
    B = rng.standard_normal((N, K)).astype(np.float32).T  # W^T: a transposed view
    Bp = uk.pack_panels(B)
    want = np.empty((M, N), np.float32)
    uk.matmul_claimed(A.astype(np.float32), Bp, want, np.zeros(1, np.int64), 12)
    C = np.full((M, N), np.nan, np.float16)
    counter = np.zeros(1, np.int64)
    threads = [threading.Thread(target=uk.matmul_claimed_half, args=(A, Bp, C, counter, 12))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.testing.assert_array_equal(C.view(np.uint16), want.astype(np.float16).view(np.uint16))
    _close(want, _ref(A.astype(np.float32), B), np.float32)
    np.testing.assert_array_equal(A, saved)
    assert M <= counter[0] < M + 3 * 12


@pytest.mark.parametrize("nw", [1, 2, 3])
@pytest.mark.parametrize("M,K,N", [(1, 1, 1), (37, 13, 70), (301, 70, 257)])
def test_gemm_claimed_parallel_in_one_region(M, K, N, nw):
    """The claims made by the threads of one Numba parallel region (``nw`` scratch rows,
    more than the threads included): C as the two-thread Python claims make it, bit for bit,
    in float32, float64 and float16 (bits in, bits out); the counter run past M."""
    rng = np.random.default_rng(M * N + nw)
    for dtype in (np.float32, np.float64):
        A = rng.standard_normal((M, K)).astype(dtype)
        B = rng.standard_normal((N, K)).astype(dtype).T
        Bp = uk.pack_panels(B)
        want = np.empty((M, N), dtype)
        uk.matmul_claimed(A, Bp, want, np.zeros(1, np.int64), 12)
        C = np.full((M, N), np.nan, dtype)
        counter = np.zeros(1, np.int64)
        work = np.full((nw, uk.claimed_workspace(K, A.itemsize)), np.nan, dtype)
        uk.gemm_claimed_parallel(A.ctypes.data, K, 1, Bp, C.ctypes.data, N, M, N, counter,
                                 12, work, False)
        np.testing.assert_array_equal(C, want)
        _close(C, _ref(A, B), dtype)
        assert M <= counter[0] < M + (nw + 1) * 12
    A = rng.standard_normal((M, K)).astype(np.float16)
    B = rng.standard_normal((N, K)).astype(np.float32).T
    Bp = uk.pack_panels(B)
    want = np.empty((M, N), np.float32)
    uk.matmul_claimed(A.astype(np.float32), Bp, want, np.zeros(1, np.int64), 12)
    C = np.full((M, N), np.nan, np.float16)
    work = np.empty((nw, uk.claimed_workspace(K, 4)), np.float32)
    stage = np.empty((nw, uk.claimed_stage(12, K, N)), np.float32)
    uk.gemm_claimed_half_parallel(A.view(np.uint16), Bp, C.view(np.uint16),
                                  np.zeros(1, np.int64), 12, work, stage)
    np.testing.assert_array_equal(C.view(np.uint16), want.astype(np.float16).view(np.uint16))


def _aligned(shape, dtype, offset=0):
    """An array on a 64-byte boundary (plus ``offset`` elements)."""
    n = int(np.prod(shape))
    raw = np.empty(n + 64 + offset, dtype)
    skip = (-raw.ctypes.data % 64) // raw.itemsize
    return raw[skip + offset: skip + offset + n].reshape(shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("M,K,N", [(37, 13, 64), (301, 70, 257), (96, 64, 128)])
def test_gemm_claimed_parallel_streams_whole_tiles(M, K, N, dtype):
    """Streamed (non-temporal) stores of C's whole tiles give the plain stores' C, bit for
    bit, where C's rows start on vector boundaries, and are declined (plain stores, the
    same C) where they do not: a C one element off the boundary, or rows an odd number of
    elements apart."""
    rng = np.random.default_rng(M + N)
    A = rng.standard_normal((M, K)).astype(dtype)
    B = rng.standard_normal((K, N)).astype(dtype)
    Bp = uk.pack_panels(B)
    work = np.empty((2, uk.claimed_workspace(K, A.itemsize)), dtype)
    want = np.empty((M, N), dtype)
    uk.matmul_claimed(A, Bp, want, np.zeros(1, np.int64), 12)
    for offset, ldc in ((0, N + (-N) % 16), (1, N + (-N) % 16), (0, N + 1)):
        out = _aligned((M, ldc), dtype, offset)
        out[...] = np.nan
        uk.gemm_claimed_parallel(A.ctypes.data, K, 1, Bp, out.ctypes.data, ldc, M, N,
                                 np.zeros(1, np.int64), 12, work, True)
        np.testing.assert_array_equal(out[:, :N], want, err_msg=f"offset {offset}, ldc {ldc}")
        assert np.isnan(out[:, N:]).all()


def test_matmul_claimed_half_argument_checks():
    A = np.ones((4, 3), np.float16)
    Bp = uk.pack_panels(np.ones((3, 5), np.float32))
    with pytest.raises(ValueError, match="float16"):
        uk.matmul_claimed_half(A.astype(np.float32), Bp, np.empty((4, 5), np.float32),
                               np.zeros(1, np.int64), 6)
    with pytest.raises(ValueError, match="C-contiguous"):
        uk.matmul_claimed_half(A, Bp, np.empty((5, 4), np.float16).T, np.zeros(1, np.int64), 6)
    with pytest.raises(ValueError, match="panels"):
        uk.matmul_claimed_half(A, uk.pack_panels(np.ones((3, 5))), np.empty((4, 5), np.float16),
                               np.zeros(1, np.int64), 6)
    with pytest.raises(ValueError, match="counter"):
        uk.matmul_claimed_half(A, Bp, np.empty((4, 5), np.float16), np.zeros(1, np.int32), 6)
    C = np.full((4, 5), np.nan, np.float16)
    uk.matmul_claimed_half(np.ones((4, 0), np.float16),
                           uk.pack_panels(np.ones((0, 5), np.float32)), C,
                           np.zeros(1, np.int64), 6)
    assert not C.any()


@pytest.mark.parametrize("layout", ["NXC", "NCX"])
def test_claimed_backward_data_float16_converts_in_the_kernel(layout, monkeypatch):
    """1x1 stride-1 backward data on the Numba engine with workers claiming row blocks:
    float16 dY goes in as bits and dX comes out as bits, bit for bit float32's result on
    the widened operands rounded once; the user's arrays are left alone."""
    import numbaconv as nc
    from numbaconv import config
    from numbaconv import planner
    monkeypatch.setattr(config, "GEMM_ENGINE", "numba")
    rng = np.random.default_rng(4)
    dy = rng.standard_normal((2, 41, 40, 100)).astype(np.float16)
    w = rng.standard_normal((1, 1, 72, 100)).astype(np.float16)
    if layout == "NCX":
        dy = np.ascontiguousarray(dy.transpose(0, 3, 1, 2))
    kw = dict(strides=1, pads_begin=0, pads_end=0, data_format=layout, strategy="gemm")
    plan = nc.plan("convolution_backprop_data", dy, w, (41, 40), **kw)
    assert plan.variant == "claimed" and plan.tiles.get("claim"), plan
    assert planner.implementation(plan).half_operands(plan.problem, plan.tiles) == {"dy"}
    saved = dy.copy(), w.copy()
    got = nc.convolution_backprop_data(dy, w, (41, 40), **kw)
    want = nc.convolution_backprop_data(dy.astype(np.float32), w.astype(np.float32), (41, 40),
                                        **kw).astype(np.float16)
    assert got.dtype == np.float16 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(dy, saved[0])
    np.testing.assert_array_equal(w, saved[1])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("x_shape,k,stride,pad,oc", [
    ((4, 600, 32), (2,), (1,), (0,), 32),          # WaveNet-like: pieces of kc, a partial
    ((3, 37, 5), (7,), (2,), (3,), 64),            # a 1-D stem: padded along w, strided
    ((2, 40, 44, 3), (7, 7), (2, 2), (3, 3), 64),  # a 2-D stem: tap rows along h
])
def test_rows_weight_gradient_float16_widens_in_the_kernel(x_shape, k, stride, pad, oc,
                                                            threads):
    """The rows variant takes float16 X and dY as bits and widens them ``kc`` output pixels
    at a time (the GEMM's own reduction blocks): bit for bit float32's result on the
    widened operands, rounded once; the user's arrays are left alone."""
    import numba
    import numbaconv as nc
    rng = np.random.default_rng(11)
    x = rng.standard_normal(x_shape).astype(np.float16)
    w = np.zeros((*k, x_shape[-1], oc), np.float16)
    kw = dict(strides=stride, pads_begin=pad, pads_end=pad)
    dy = rng.standard_normal(nc.convolution(x, w, **kw).shape).astype(np.float16)
    before = nc.get_num_threads()
    nc.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        # forced: stems and long rows plan gemm[patch] (tests/test_patch.py)
        kw["strategy"] = "gemm[rows]"
        plan = nc.plan("convolution_backprop_filters", x, k, dy, **kw)
        assert plan.variant == "rows", plan
        if x.size > 1000:  # enough work for every thread's share and stage
            assert plan.tiles["workers"] == nc.get_num_threads()
        saved = x.copy(), dy.copy()
        x32, dy32 = x.astype(np.float32), dy.astype(np.float32)
        got = nc.convolution_backprop_filters(x, k, dy, **kw)
        want = nc.convolution_backprop_filters(x32, k, dy32, **kw)
    finally:
        nc.set_num_threads(before)
    assert got.dtype == np.float16 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint16), want.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(x, saved[0])
    np.testing.assert_array_equal(dy, saved[1])
