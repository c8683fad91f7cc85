#!/usr/bin/env bash
# Every CUDA test binary of a pack (scripts/gpu_pack.sh) on the GPU machine, one timeout per
# binary (a hang costs one binary), with a pass / fail summary; logs in $OUT/<binary>.log.
#   cd .gpubin && OUT=/dir [ONLY="test_cuda_spec test_cuda_ops"] [FILTER_test_cuda_ops='CudaAttnVerify*'] ./gpu_regression.sh
# Binaries that read the source tree (demo model, golden fixtures) get MOESERVE_SOURCE_DIR =
# $SRC (default: the pack folder's parent, i.e. the repository copy on the device).
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export MOESERVE_SOURCE_DIR=${SRC:-$(cd .. && pwd)}
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
for bin in ${ONLY:-$(ls test_cuda_* 2>/dev/null)}; do
  [ -x "$bin" ] || { echo "$bin: missing"; continue; }
  var="FILTER_$bin"; filter=${!var:-*}
  t0=$(date +%s)
  timeout "${TIMEOUT:-240}" "./$bin" --gtest_color=no --gtest_filter="$filter" > "$OUT/$bin.log" 2>&1
  rc=$?
  pass=$(grep -c "^\[       OK \]" "$OUT/$bin.log"); fail=$(grep -c "^\[  FAILED  \].*(" "$OUT/$bin.log")
  skip=$(grep -c "^\[  SKIPPED \]" "$OUT/$bin.log")
  echo "$bin rc=$rc ok=$pass failed=$fail skipped=$skip $(( $(date +%s) - t0 ))s"
  grep "^\[  FAILED  \].*(" "$OUT/$bin.log" | head -20
done
echo "total $(( $(date +%s) - start ))s"
