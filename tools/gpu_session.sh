#!/bin/bash
# One device session's checks in one command (a developer's tool; run it in the
# repository root on a machine with an NVIDIA GPU and PyTorch with CUDA):
#   OUT=results bash tools/gpu_session.sh
# 1. host time per call and its profile (tools/gpu_host_profile.py);
# 2. the GPU tests (tests/test_cuda.py, tests/test_cuda_tf32.py), and beside them the
#    depthwise kernels' shapes (tools/gpu_depthwise_tune.py);
# 3. tools/gpu_check.py over the suites, one process per suite and pass so that their
#    kernels compile side by side, timed one at a time under a lock (LOCK=).
#    The TF32 rows run twice, the planner's choice (gemm[tf32-async] where it applies) and
#    the register-staged gemm[tf32] (CONFIG=CUDA_TF32_ASYNC=0), side by side.
# Each step has its own time limit (PROF_S, TEST_S, TUNE_S, CHECK_S seconds; TF32=0 leaves
# out the TF32 suite). Results go to $OUT in a few files (a device tool may bring back
# only a handful): env.txt, host.txt, tests.txt, tune.txt, checks.txt (every check's
# output) and summary.txt (the geometric means and error counts of each check).
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-gpu_results}
mkdir -p "$OUT"
RAW=$(mktemp -d)
# the source tree as the installed package has it (numbaconv.kernels is kernels/)
[ -e numbaconv/kernels ] || ln -s ../kernels numbaconv/kernels
# NumPy 2.5 dropped numpy.row_stack, which the numba 0.68 / numba-cuda 0.30 stack of
# some images still calls: restore it as numpy.vstack for these runs only (a
# sitecustomize on PYTHONPATH, which shadows the environment's own, if it has one)
SHIM=$(mktemp -d)
echo "import numpy as _n; hasattr(_n, 'row_stack') or setattr(_n, 'row_stack', _n.vstack)" \
    > "$SHIM/sitecustomize.py"
export PYTHONPATH=$PWD:$SHIM PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  git log -1 --format=%h 2>/dev/null
  python3 -c "import numba, torch, numpy; print('numba', numba.__version__, 'torch',
torch.__version__, 'numpy', numpy.__version__, 'cudnn', torch.backends.cudnn.version())"
} > "$OUT/env.txt" 2>&1
timeout "${PROF_S:-60}" python3 tools/gpu_host_profile.py > "$OUT/host.txt" 2>&1
# the GPU tests beside the depthwise shapes' timings (the tests' kernels are tiny)
( timeout "${TEST_S:-150}" python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_cuda.py \
    tests/test_cuda_tf32.py > "$OUT/tests.txt" 2>&1
  echo "tests rc $?" >> "$OUT/tests.txt" ) &
TLOCK=$(mktemp)
for i in 0 1 2; do  # (three processes compile side by side, time one at a time)
  LOCK=$TLOCK PART=$i/3 LAYERS=${TUNE_LAYERS:-dw32_112_s1_p1,dw96_112_s2_same,dw576_14_s1_p1} \
      ZOO=${ZOO:-mobilenet_v3:bneck4_dw5_s2,efficientnet_b0:mb5_dw5,convnext_t:stage2_dw7} \
      SHAPES=${SHAPES:-4x4x8,2x8x4,2x2x8} timeout "${TUNE_S:-180}" \
      python3 tools/gpu_depthwise_tune.py > "$RAW/depthwise_tune$i.txt" 2>&1 &
done
wait
LOCK=$(mktemp)
for d in fwd bwd_d bwd_w; do
  LOCK=$LOCK SUITES=resnet50 PASSES=$d timeout "${CHECK_S:-300}" python3 tools/gpu_check.py \
      > "$RAW/check_resnet50_$d.txt" 2>&1 &
done
LOCK=$LOCK SUITES=mobilenet_v2_dw timeout "${CHECK_S:-300}" python3 tools/gpu_check.py \
    > "$RAW/check_mobilenet_v2_dw.txt" 2>&1 &
LOCK=$LOCK SUITES=resnext3d,conv1d timeout "${CHECK_S:-300}" python3 tools/gpu_check.py \
    > "$RAW/check_resnext3d_conv1d.txt" 2>&1 &
if [ "${TF32:-1}" = 1 ]; then
  LOCK=$LOCK SUITES=resnet50 PRECISIONS=tf32 timeout "${CHECK_S:-300}" python3 \
      tools/gpu_check.py > "$RAW/check_resnet50_tf32.txt" 2>&1 &
  LOCK=$LOCK CONFIG=CUDA_TF32_ASYNC=0 SUITES=resnet50 PRECISIONS=tf32 \
      timeout "${CHECK_S:-300}" python3 tools/gpu_check.py \
      > "$RAW/check_resnet50_tf32_register_staged.txt" 2>&1 &
fi
wait
for f in "$RAW"/depthwise_tune*.txt; do echo "== $(basename "$f")"; cat "$f"; done \
    > "$OUT/tune.txt"
for f in "$RAW"/check_*.txt; do echo "== $(basename "$f")"; cat "$f"; done > "$OUT/checks.txt"
for f in "$RAW"/check_*.txt; do echo "== $(basename "$f")"; grep "geomean\|^bad" "$f"; done \
    > "$OUT/summary.txt"
cat "$OUT/summary.txt"
