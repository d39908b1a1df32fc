"""``precision="tf32"``: the TF32 tensor-core GEMM entry (``gemm[tf32]``).

* The rounding and the algorithm on the CPU: ``tf32_round_py`` (the simulator's twin of
  the ``cvt.rna.tf32.f32`` intrinsic) against values whose rounding is known, and a NumPy
  emulation of the kernels' arithmetic (operands rounded to TF32, ties away from zero;
  products summed in float32 in K order) against the float64 reference within
  ``TF32_TOLERANCE``.
* The fragment layout: the offsets the kernels load their ``mma.sync`` fragments from
  give, for every lane, the matrix elements the PTX ISA assigns to it (m16n8k8, tf32).
* Static: each direction's TF32 kernel compiles to PTX for cc 9.0 (``mma.sync ... tf32``
  and ``cvt.rna.tf32.f32`` in it), ``ptxas`` assembles it within 128 registers and no
  spills, and the SASS holds one HMMA per m16n8k8 step (skips without the toolchain).
* The planner names ``gemm[tf32]``; the front ends refuse ``precision="tf32"`` on NumPy
  operands and on other dtypes than float32.
* On a real GPU only (skipped otherwise): the public ops with ``precision="tf32"`` on
  device arrays against the float64 reference within ``TF32_TOLERANCE``.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from numbaconv import reference as nref
from numbaconv.problem import ConvProblem

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, HERE)
import reference  # noqa: E402  (tests/reference.py)
import sass_mix  # noqa: E402


def _round(v):
    from numbaconv.kernels.cuda.gemm import tf32_round_py
    return tf32_round_py(v)


def test_tf32_round_known_values():
    """10 explicit mantissa bits, round to nearest with ties away from zero (``rna``)."""
    ulp = 2.0 ** -10
    one = np.float32(1)
    assert _round(one) == one
    assert _round(np.float32(1 + ulp)) == np.float32(1 + ulp)
    assert _round(np.float32(1 + ulp / 2)) == np.float32(1 + ulp)          # tie: away
    assert _round(np.float32(-(1 + ulp / 2))) == np.float32(-(1 + ulp))    # (both signs)
    assert _round(np.float32(1 + ulp / 2 - 2 ** -20)) == one               # below the tie
    assert _round(np.float32(1 + 3 * ulp / 2)) == np.float32(1 + 2 * ulp)  # tie: away, not even
    assert np.isinf(_round(np.float32(np.inf))) and np.isnan(_round(np.float32(np.nan)))
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32)
    r = _round(x)
    assert not np.any(r.view(np.uint32) & np.uint32(0x1FFF))  # low 13 bits cleared
    assert np.max(np.abs(r - x) / np.abs(x)) <= 2.0 ** -11


def _emulated_fwd(x, w, stride, pads):
    """The TF32 kernels' arithmetic in NumPy for a forward convolution (NHWC, XIO): the
    operands rounded to TF32, each output a float32 sum over (tap, channel) in K order."""
    xr, wr = _round(x), _round(w)
    n, h, wd, c = x.shape
    kh, kw, _, k = w.shape
    xp = np.zeros((n, h + pads[0] + pads[1], wd + pads[2] + pads[3], c), np.float32)
    xp[:, pads[0]:pads[0] + h, pads[2]:pads[2] + wd] = xr
    oh = (xp.shape[1] - kh) // stride + 1
    ow = (xp.shape[2] - kw) // stride + 1
    acc = np.zeros((n, oh, ow, k), np.float32)
    for th in range(kh):
        for tw in range(kw):
            patch = xp[:, th:th + (oh - 1) * stride + 1:stride, tw:tw + (ow - 1) * stride + 1:stride]
            for ci in range(c):  # one product per K step, summed in float32
                acc += patch[..., ci:ci + 1] * wr[th, tw, ci]
    return acc


@pytest.mark.parametrize("stride", [1, 2])
def test_emulated_tf32_within_tolerance(stride):
    """The emulated TF32 result is within ``TF32_TOLERANCE`` of the float64 reference and,
    being TF32, clearly outside float32's bound (so the bound is not met by accident)."""
    rng = np.random.default_rng(stride)
    x = rng.standard_normal((2, 9, 9, 48)).astype(np.float32)
    w = rng.standard_normal((3, 3, 48, 16)).astype(np.float32)
    got = _emulated_fwd(x, w, stride, (1, 1, 1, 1))
    err = reference.normalized_error(got, reference.conv_fwd_ref, x.astype(np.float64),
                                     w.astype(np.float64), stride=stride, pads_begin=1,
                                     pads_end=1)
    assert err <= nref.TF32_TOLERANCE, err
    assert err > nref.TOLERANCE["float32"], err


@pytest.mark.parametrize("tile", [(128, 128, 8, 8, 8), (128, 128, 16, 8, 8), (128, 64, 8, 8, 4),
                                  (64, 64, 16, 4, 4), (64, 32, 16, 4, 4), (256, 128, 8, 16, 8)],
                         ids=lambda t: "x".join(map(str, t)))
def test_fragment_offsets_match_the_ptx_layout(tile):
    """For every lane, m16/n8 tile and register, the shared-memory element the TF32 kernel
    loads an A or B fragment from is the one the PTX ISA assigns (m16n8k8 .tf32: a_r =
    A[g + 8*(r%2), t + 4*(r//2)], b_r = B[t + 4*r, g]) up to the kernel's relabelling of
    A's rows within the warp tile, and the epilogue writes accumulator c_r = C[g +
    8*(r//2), 2t + r%2] to the row that relabelling gives C (A's row in shared memory) and
    B's column: rows and columns are each covered exactly once per warp tile."""
    from numbaconv.kernels.cuda.gemm import scheme
    bm, bn, bk, tm, tn = tile
    sc = scheme("float32", bm, bn, bk, tm, tn, "tf32")
    offsets = sc["offsets"].py_func
    PA, PB = sc["pa"], sc["pb"]
    MI, NI, WM, WN = tm // 2, tn // 2, 8 * tm, 4 * tn
    assert PA % 2 == 0 and PB % 4 == 0  # LDS.64 and 16-byte stores stay aligned
    rows = {}
    for tid in range((bm // tm) * (bn // tn)):
        lane, warp = tid % 32, tid // 32
        g, t = lane // 4, lane % 4
        ao, bo, row0, col0 = offsets(tid)
        wm0, wn0 = (warp // (bn // WN)) * WM, (warp % (bn // WN)) * WN
        for i in range(MI):
            for r, off in enumerate(sc["a_frag"]):  # As[k][m]: element (m, k) at k*PA + m
                k, m = divmod(ao + off + sc["a_tile"][i], PA)
                assert k == t + 4 * (r // 2), (tid, i, r)
                logical = 16 * i + 8 * (r % 2) + g
                # the row the epilogue writes for accumulator row a = 2*i + r%2
                a = 2 * i + r % 2
                out = (a // sc["ega"]) * sc["esa"] + (a % sc["ega"]) * sc["eha"] + row0
                assert m == out, (tid, i, r)
                assert rows.setdefault((warp, logical), m) == m  # one place per warp row
                assert wm0 <= m < wm0 + WM
        for j in range(NI):
            for r, off in enumerate(sc["b_frag"]):  # Bs[k][n]
                k, n = divmod(bo + off + j * sc["b_step"], PB)
                assert (k, n) == (t + 4 * r, wn0 + 8 * j + g), (tid, j, r)
            for e in range(2):  # accumulator columns 2*j + e: C columns 8*j + 2t + e
                b = 2 * j + e
                col = (b // sc["egb"]) * sc["esb"] + (b % sc["egb"]) * sc["ehb"] + col0
                assert col == wn0 + 8 * j + 2 * t + e, tid
    for warp in range((bm // tm) * (bn // tn) // 32):
        placed = sorted(rows[(warp, q)] for q in range(WM))
        wm0 = (warp // (bn // WN)) * WM
        assert placed == list(range(wm0, wm0 + WM)), warp  # a permutation of the rows


def test_planner_names_the_tf32_entry(monkeypatch, request):
    from numbaconv.backends import cuda as backend
    from numbaconv import planner
    from numbaconv.kernels.cuda import _ptx
    import dataclasses

    # the cp.async kernels need numba-cuda's target (the simulator's counts as one)
    monkeypatch.setattr(_ptx, "VECTOR", True)
    planner.clear_plan_cache()
    request.addfinalizer(planner.clear_plan_cache)  # (plans made under the patch)

    p = ConvProblem("fwd", 8, 1, 64, 64, (1, 14, 14), (1, 3, 3), (1, 14, 14), (1, 1, 1),
                    (1, 1, 1), (0, 1, 1), (0, 1, 1), 2, "float32")
    q = dataclasses.replace(p, precision="tf32")
    exact, tf32 = planner.make_plan(p, device="cuda"), planner.make_plan(q, device="cuda")
    assert (exact.strategy, exact.variant) == ("gemm", "cuda")
    # 64 channels: the cp.async-fed kernels; 6 input channels: the register-staged ones,
    # and the plan says why the other declined
    assert (tf32.strategy, tf32.variant) == ("gemm", "tf32-async")
    assert "gemm[tf32-async]" in str(tf32) and "tensor cores" in tf32.reason
    assert tf32.tiles["loader"] == "cp.async" and tf32.tiles["block_k"] == 16
    q6 = dataclasses.replace(q, ic=6)
    r = planner.make_plan(q6, device="cuda")
    assert r.variant == "tf32" and "gemm[tf32]" in str(r) and "loader" not in r.tiles
    assert r.declined == (("gemm[tf32-async]", "input channels per group (6) are no "
                           "multiple of 4 (16-byte chunks)"),)
    assert q.descriptor().endswith("_float32_tf32")
    # depthwise: no tensor-core path, exact float32, and the plan says why
    d = ConvProblem("bwd_w", 8, 32, 32, 32, (1, 14, 14), (1, 3, 3), (1, 14, 14), (1, 1, 1),
                    (1, 1, 1), (0, 1, 1), (0, 1, 1), 2, "float32", precision="tf32")
    dp = planner.make_plan(d, device="cuda")
    assert dp.variant == "cuda-depthwise"
    assert [e for e, _ in dp.declined] == ["gemm[tf32-async]", "gemm[tf32]"]
    assert "no tensor-core path" in dp.reason
    assert backend.tf32_declines(p, exact.tiles) == "precision is not 'tf32'"


def test_tf32_tiles(monkeypatch):
    """``precision="tf32"``: the 128-row tiles' K slice is the direction's
    ``TF32_BLOCK_K`` (16 for backward data), which ``CUDA_TF32_BLOCK_K`` overrides; exact
    float32, and ``gemm[cuda]`` forced under ``precision="tf32"``, keep the planner's
    exact tile (whose K slice the FFMA kernels' registers are sized for)."""
    from numbaconv import config, planner
    from numbaconv.backends import cuda as backend

    def problem(direction, precision):
        return ConvProblem(direction, 32, 1, 256, 256, (1, 28, 28), (1, 3, 3), (1, 28, 28),
                           (1, 1, 1), (1, 1, 1), (0, 1, 1), (0, 1, 1), 2, "float32",
                           precision=precision)

    for d in ("fwd", "bwd_d", "bwd_w"):
        exact = backend.gemm_tile(problem(d, "exact"))
        assert exact[0] == 128 and exact[2] == 8, exact
        tf32 = backend.gemm_tile(problem(d, "tf32"))
        assert tf32 == exact[:2] + (backend.TF32_BLOCK_K[d],) + exact[3:]
        forced = planner.make_plan(problem(d, "tf32"), device="cuda", strategy="gemm[cuda]")
        assert forced.variant == "cuda"
        assert tuple(forced.tiles[k] for k in ("block_m", "block_n", "block_k", "thread_m",
                                               "thread_n")) == exact
    assert backend.TF32_BLOCK_K["bwd_d"] == 16
    monkeypatch.setattr(config, "CUDA_TF32_BLOCK_K", 16, raising=False)
    assert backend.gemm_tile(problem("fwd", "tf32"))[2] == 16
    assert backend.gemm_tile(problem("fwd", "exact"))[2] == 8


def test_front_ends_refuse_tf32_where_it_cannot_run():
    import numbaconv

    x = np.ones((1, 5, 5, 2), np.float32)
    w = np.ones((3, 3, 2, 4), np.float32)
    with pytest.raises(ValueError, match="^precision: 'tf32' runs on the GPU"):
        numbaconv.conv2d(x, w, 1, "SAME", precision="tf32")
    with pytest.raises(ValueError, match="^precision: 'tf32' runs on the GPU"):
        numbaconv.convolution_backprop_filters(x, (3, 3), np.ones((1, 5, 5, 4), np.float32),
                                               strides=1, pads_begin=1, pads_end=1,
                                               precision="TF32")
    with pytest.raises(ValueError, match="^precision: expected"):
        numbaconv.conv2d(x, w, 1, "SAME", precision="tf16")
    with pytest.raises(TypeError, match="^precision: expected"):
        numbaconv.conv2d(x, w, 1, "SAME", precision=32)
    # "exact" (and None) is float32 as always, on the host too
    np.testing.assert_array_equal(numbaconv.conv2d(x, w, 1, "SAME", precision="exact"),
                                  numbaconv.conv2d(x, w, 1, "SAME"))


def test_device_tf32_refuses_other_dtypes():
    """On device operands, ``precision="tf32"`` with float64 is a ValueError naming
    ``precision`` (checked before any device work)."""
    from numbaconv.api._op import device_options

    p = ConvProblem("fwd", 1, 1, 2, 4, (1, 5, 5), (1, 3, 3), (1, 5, 5), (1, 1, 1), (1, 1, 1),
                    (0, 1, 1), (0, 1, 1), 2, "float64")
    with pytest.raises(ValueError, match="^precision: 'tf32' applies to float32"):
        device_options(p, True, None, "tf32")
    assert device_options(p, True, None, None) is p


# -- static: PTX, ptxas, SASS ---------------------------------------------------------------
GEO = (8, 1, 64, 64, 1, 56, 56, 1, 3, 3, 1, 56, 56, 1, 1, 1, 1, 1, 1, 0, 1, 1)


def _tiles():
    """The planner's tiles, the 128-row tiles with the deeper TF32 slice (backward
    data's, or ``CUDA_TF32_BLOCK_K=16``), and a configured 256x128 tile (warp tiles of
    eight m16 tiles: 128 accumulators per thread, one block per SM)."""
    from numbaconv.backends import cuda as backend
    return backend.GEMM_TILES + ((128, 128, 16, 8, 8), (128, 64, 16, 8, 4),
                                 (256, 128, 8, 16, 8))


@pytest.mark.parametrize("name", ["fwd_gemm", "bwd_d_gemm", "bwd_w_gemm"])
@pytest.mark.parametrize("tile", _tiles(), ids=lambda t: "x".join(map(str, t)))
def test_tf32_kernels_assemble_with_hmma(toolchain, name, tile):
    import collections

    from numba import cuda, types
    from numbaconv.kernels.cuda import gemm

    kernel = getattr(gemm, name)("float32", *tile, GEO, 1, "tf32")
    sig = (types.Array(types.float32, 1, "C"),) * 3
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0),
                              launch_bounds=kernel.targetoptions.get("launch_bounds"))
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx
    assert "cvt.rna.tf32.f32" in ptx
    f = sass_mix.figures(ptx, "sm_90")
    ops = collections.Counter(sass_mix.opcode(t).split(".")[0]
                              for _, t in sass_mix.parse(f["sass"])[0])
    bm, bn, bk, tm, tn = tile
    per_slice = (tm // 2) * (tn // 2) * (bk // 8)
    full = collections.Counter(sass_mix.opcode(t) for _, t in sass_mix.parse(f["sass"])[0])
    # A's fragments two registers per shared load: 2 per m16 tile and k8 step
    assert full["LDS.64"] >= 2 * (tm // 2) * (bk // 8), full
    print(f"{name}[tf32,{'x'.join(map(str, tile))}]: {f['registers']} registers, spills "
          f"{f['spill_stores']}/{f['spill_loads']}, {ops['HMMA']} HMMA ({per_slice} per "
          f"K slice), {ops['FFMA']} FFMA")
    assert f["spill_stores"] == 0 and f["spill_loads"] == 0, f["log"]
    threads, blocks = gemm.launch_bounds((bm // tm) * (bn // tn), "float32", "tf32", bk,
                                         tm * tn)
    assert f["registers"] <= min(255, 65536 // (threads * blocks)), f["log"]
    assert ops["HMMA"] >= per_slice and ops["HMMA"] % per_slice == 0, ops
    assert ops["FFMA"] == 0, ops  # every multiply-add on the tensor cores


@pytest.mark.parametrize("name", ["fwd_tf32", "bwd_d_tf32", "bwd_w_tf32"])
@pytest.mark.parametrize("tile", [t for t in _tiles()[:4]], ids=lambda t: "x".join(map(str, t)))
def test_async_kernels_assemble(toolchain, name, tile):
    """The ``gemm[tf32-async]`` kernels (kernels.cuda.tf32) on the planner's tiles: one
    HMMA per m16n8k8 step, copies as ``LDGSTS`` (16-byte ones on the aligned path), the
    K-contiguous operands' fragments by ``LDSM`` (ldmatrix), no FFMA, no spills, at most
    128 registers (two 256-thread blocks per SM)."""
    import collections

    from numba import cuda, types
    from numbaconv.kernels.cuda import tf32

    bm, bn, bk, tm, tn = tile
    kernel = getattr(tf32, name)(bm, bn, tm, tn, GEO, 1)
    sig = (types.Array(types.float32, 1, "C"),) * 3
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0),
                              launch_bounds=kernel.targetoptions.get("launch_bounds"))
    assert "cp.async.cg.shared.global" in ptx and "mma.sync.aligned.m16n8k8" in ptx
    f = sass_mix.figures(ptx, "sm_90")
    ops = collections.Counter(sass_mix.opcode(t) for _, t in sass_mix.parse(f["sass"])[0])
    base = collections.Counter(k.split(".")[0] for k in ops.elements())
    a_kc, b_kc = tf32.K_CONTIGUOUS[name[:-5]]
    per_slice = (tm // 2) * (tn // 2) * (tf32.BK // 8)
    print(f"{name}[{'x'.join(map(str, tile))}]: {f['registers']} registers, spills "
          f"{f['spill_stores']}/{f['spill_loads']}, {base['HMMA']} HMMA ({per_slice} per "
          f"slice), {base['LDSM']} LDSM, {base['LDGSTS']} LDGSTS")
    assert f["spill_stores"] == 0 and f["spill_loads"] == 0, f["log"]
    assert f["registers"] <= 128, f["log"]
    assert base["HMMA"] == per_slice, base
    assert ops["LDGSTS.E.BYPASS.128"] >= (bm + bn) * 4 // ((bm // tm) * (bn // tn)), ops
    assert base["LDSM"] == (tm // 2) * 2 * a_kc + (tn // 4) * 2 * b_kc, base
    assert base["FFMA"] == 0, base


# -- on a real GPU only ---------------------------------------------------------------------
_GPU_CODE = """
import numpy as np
from numba import cuda
import numbaconv
from numbaconv.reference import TF32_TOLERANCE, normalized_error
rng = np.random.default_rng(0)
x = rng.standard_normal((4, 20, 20, 96)).astype(np.float32)
w = rng.standard_normal((3, 3, 96, 64)).astype(np.float32)
dy = rng.standard_normal((4, 10, 10, 64)).astype(np.float32)
kw = dict(strides=2, pads_begin=1, pads_end=0)
calls = [("convolution", (x, w)), ("convolution_backprop_data", (dy, w, (20, 20))),
         ("convolution_backprop_filters", (x, (3, 3), dy))]
worst = 0.0
for (name, args), (strategy, variant) in [(c, e) for c in calls for e in
                                          ((None, "tf32-async"), ("gemm[tf32]", "tf32"))]:
    fn = getattr(numbaconv, name)
    dev = tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args)
    p = numbaconv.plan(name, *dev, **kw, precision="tf32", strategy=strategy)
    assert (p.strategy, p.variant) == ("gemm", variant), str(p)
    got = fn(*dev, **kw, precision="tf32", strategy=strategy).copy_to_host().astype(np.float64)
    a64 = tuple(a.astype(np.float64) if isinstance(a, np.ndarray) else a for a in args)
    ref = fn(*a64, **kw)
    ref_abs = fn(*(np.abs(a) if isinstance(a, np.ndarray) else a for a in a64), **kw)
    err = normalized_error(got, ref, ref_abs)
    print(name, variant, err)
    assert err <= TF32_TOLERANCE, (name, variant, err)
    worst = max(worst, err)
print(f"worst {worst:.3g}")
"""


def _gpu_present():
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    r = subprocess.run([sys.executable, "-c",
                        "from numba import cuda; print(cuda.is_available())"],
                       capture_output=True, text=True, env=env, timeout=120)
    return r.stdout.strip() == "True", env


def test_tf32_on_a_gpu_within_tolerance():
    ok, env = _gpu_present()
    if not ok:
        pytest.skip("no usable CUDA GPU: the TF32 kernels' device results are checked on a "
                    "GPU only (the simulator cannot run mma.sync)")
    r = subprocess.run([sys.executable, "-c", _GPU_CODE], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
