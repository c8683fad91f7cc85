#!/usr/bin/env bash
# Runs GPU checks with binaries built on the development machine (the GPU machine lacks
# some build dependencies, e.g. utf8proc). Build them with
#   BUILD_DIR=build-cuda scripts/build.sh -DMOESERVE_CUDA=ON -DMOESERVE_CUDA_ARCHS=90a
# and copy moeserve plus the test binaries into .gpubin/. Usage on the GPU machine:
#   OUT=/dir STEPS="tests bench golden" scripts/gpu_prebuilt_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
BIN=${BIN:-.gpubin}
STEPS=${STEPS:-tests bench}
LAYERS=${LAYERS:-4}
start=$(date +%s)
stamp() { echo "[gpu +$(( $(date +%s) - start ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/gpu.txt"
git rev-parse HEAD > "$OUT/revision.txt" 2>/dev/null
for step in $STEPS; do
  case $step in
    tests)
      for t in "$BIN"/test_*; do
        stamp "$t"
        timeout 300 "$t" --gtest_color=no > "$OUT/$(basename "$t").log" 2>&1; echo "rc=$?" >> "$OUT/$(basename "$t").log"
        grep -E "^\[  (PASSED|FAILED|SKIPPED) |rc=|Failure|rel|err" "$OUT/$(basename "$t").log" | grep -v "^\[       OK" | head -40
      done ;;
    bench)
      stamp bench-model
      timeout 300 "$BIN/moeserve" bench-model --synthetic minimax-m2.5 --layers "$LAYERS" \
        --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1; echo "rc=$?" >> "$OUT/bench.txt"
      tail -40 "$OUT/bench.txt" ;;
    golden)
      stamp golden
      timeout 300 python3 scripts/make_golden.py --out "$OUT/golden" > "$OUT/golden.log" 2>&1; echo "rc=$?" >> "$OUT/golden.log"
      tail -20 "$OUT/golden.log" ;;
  esac
done
stamp done
