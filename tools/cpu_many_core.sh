#!/bin/bash
# The CPU bench at a many-core host's full thread count, against PyTorch at the same count
# (a developer's tool; run it in the repository root, e.g. on the GPU machine's host):
#   OUT=results bash tools/cpu_many_core.sh
# 1. `numbaconv warmup` (float32, one process per core), then every timed layer once
#    (`bench --quick`, the layers shared among one process per core), so that compile time
#    stays out of the timed runs and they reach every layer within their limits;
# 2. `numbaconv bench --compare torch --threads N` over ResNet-50 and the zoo layers of
#    ZOO_LAYERS (a sample of every class, timed in two halves), each with its own time
#    limit (WARM_S, PRE_S, R50_S, ZOO_S seconds; N = THREADS, default every core).
# 3. ENTRY_ROWS (SUITE:LAYER:PASS words), if set: every entry that accepts each of them,
#    forced and timed side by side at N threads (tools/cpu_entries.py; ENTRY_S seconds),
#    its kernels compiled in step 1.
# SIDE_CMD, if set, runs beside step 1 (e.g. the GPU tests on the GPU machine, under a
# `timeout` of its own); the timed runs wait for it to end, as they need the cores to
# themselves (a process group killed from here did not reach pytest's workers there).
# TBB is a dependency of numbaconv that an image running the source tree may lack: wheels
# of `tbb` and `tcmlib` in .whl/ (pip download, as for any package carried to such a
# machine) are unpacked and put on the loader's path. Results go to $OUT: info.txt,
# warmup.txt, resnet50.txt / resnet50.json, zoo.txt / zoo1.json / zoo2.json, entries.txt.
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-cpu_results}
mkdir -p "$OUT"
[ -e numbaconv/kernels ] || ln -s ../kernels numbaconv/kernels
if ls .whl/tbb-*.whl > /dev/null 2>&1; then
    T=$(mktemp -d)
    python3 -c "import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]" \
        "$T" .whl/tbb-*.whl .whl/tcmlib-*.whl 2> /dev/null
    for d in "$T"/*.data/data/lib; do LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH; done
    export LD_LIBRARY_PATH
fi
# NumPy 2.5 dropped numpy.row_stack, which some numba 0.68 images still call
SHIM=$(mktemp -d)
echo "import numpy as _n; hasattr(_n, 'row_stack') or setattr(_n, 'row_stack', _n.vstack)" \
    > "$SHIM/sitecustomize.py"
export PYTHONPATH=$PWD:$SHIM PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
N=${THREADS:-$(nproc)}
NC="python3 -m numbaconv.cli"
ZOO_LAYERS=${ZOO_LAYERS:-"alexnet:conv2 alexnet:conv4 vgg16:conv3_2 googlenet:4a_5x5
inception_v3:Mixed_5b_5x5_2 inception_v3:Mixed_6b_7x7_2 resnext50:layer2_conv2
resnext50:layer3_0_conv2 resnext50:layer4_conv2 densenet121:block2_3x3 densenet121:transition2
densenet_bc100:block1_3x3 squeezenet:fire6_expand3x3 shufflenet:stage2_gconv2
shufflenet:stage3_0_dw xception:middle_dw xception:middle_pw mobilenet_v3:bneck5_dw5
mobilenet_v3:bneck5_project efficientnet_b0:mb5_dw5 convnext_t:stage2_dw7 convnext_t:stage3_pw1
unet:enc3_conv2 unet:head erfnet:nb128_3x1_d4 deeplab_v3:aspp_d12 ssd300:conv9_2 yolov3:res4_3x3
centernet:heatmap_1x1 edsr:body c3d:conv3a c3d:conv5a i3d:Mixed_4b_3x3 r2plus1d:layer2_0_spatial
unet3d:enc3_conv1 vnet:stage5_5x5x5 wavenet:dilated_d16 quartznet:b3_dw51 convtasnet:block_dw3_d8
hifigan:res1_k7_d5 wav2vec2:conv1 pointnet:mlp2_3"}
SIDE=
if [ -n "$SIDE_CMD" ]; then bash -c "$SIDE_CMD" & SIDE=$!; fi
{ nproc; lscpu | grep -i "model name\|^cpu(s)\|l3"; git log -1 --format=%h 2> /dev/null
  $NC info; } > "$OUT/info.txt" 2>&1
timeout "${WARM_S:-60}" $NC warmup --processes "$N" > "$OUT/warmup.txt" 2>&1
echo "warmup rc $?" >> "$OUT/warmup.txt"
# every timed layer once, N processes side by side: their kernels compile into the cache
R50_LAYERS=$(python3 -c "from numbaconv import suites; print(' '.join(l.name for l in suites.layers('resnet50')))")
# shellcheck disable=SC2206
ALL=($(for l in $R50_LAYERS; do echo "resnet50=$l"; done) $(for l in $ZOO_LAYERS; do echo "zoo=$l"; done)
     $(for r in $ENTRY_ROWS; do echo "entries=$r"; done))
PRE=$(date +%s)
END=$(( PRE + ${PRE_S:-150} ))
PIDS=()
for ((i = 0; i < N; i++)); do
  ( for ((j = i; j < ${#ALL[@]}; j += N)); do
      left=$(( END - $(date +%s) )); [ $left -gt 0 ] || break
      suite=${ALL[j]%%=*}; layer=${ALL[j]#*=}
      if [ "$suite" = entries ]; then
        THREADS=$N COMPILE_ONLY=1 timeout $left python3 tools/cpu_entries.py "$layer" \
            > /dev/null 2>&1
        continue
      fi
      timeout $left $NC bench --suite "$suite" --layers "$layer" --threads "$N" --quick \
          --no-check > /dev/null 2>&1
    done ) &
  PIDS+=($!)
done
wait "${PIDS[@]}"
echo "compile pre-pass $(( $(date +%s) - PRE )) s" >> "$OUT/warmup.txt"
if [ -n "$SIDE" ]; then
  wait "$SIDE"
  echo "side command ended $(( $(date +%s) - PRE )) s after the pre-pass began" >> "$OUT/warmup.txt"
fi
timeout "${R50_S:-120}" $NC bench --suite resnet50 --compare torch --threads "$N" --rounds 2 \
    --no-check --json "$OUT/resnet50.json" > "$OUT/resnet50.txt" 2>&1
echo "resnet50 rc $?" >> "$OUT/resnet50.txt"
# shellcheck disable=SC2206
Z=($ZOO_LAYERS)
H=$(( (${#Z[@]} + 1) / 2 ))
: > "$OUT/zoo.txt"
for part in 1 2; do
  if [ $part = 1 ]; then L=("${Z[@]:0:H}"); else L=("${Z[@]:H}"); fi
  timeout "${ZOO_S:-90}" $NC bench --suite zoo --layers "${L[@]}" --compare torch --threads "$N" \
      --rounds 2 --no-check --json "$OUT/zoo$part.json" >> "$OUT/zoo.txt" 2>&1
  echo "zoo part $part rc $?" >> "$OUT/zoo.txt"
done
if [ -n "$ENTRY_ROWS" ]; then
  # shellcheck disable=SC2086
  THREADS=$N timeout "${ENTRY_S:-120}" python3 tools/cpu_entries.py $ENTRY_ROWS \
      > "$OUT/entries.txt" 2>&1
  echo "entries rc $?" >> "$OUT/entries.txt"
fi
tail -n 25 "$OUT"/resnet50.txt "$OUT"/zoo.txt
