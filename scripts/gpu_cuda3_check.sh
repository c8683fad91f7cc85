#!/usr/bin/env bash
# One device run of prebuilt CUDA binaries (moeserve, test_cuda_ops, test_cuda_golden from
# build-cuda, copied with this script into a folder BIN together with tests/fixtures/golden):
# op tests (one timeout per suite), the CUDA golden gtest, then bench-model at 30 layers
# (decode batch 1/8/64 at 1k, 8k prefill) with a per-op profile at batch 1 and 64.
# Usage on the GPU machine: cd BIN && OUT=/dir STEPS="tests golden bench" ./gpu_cuda3_check.sh
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
STEPS=${STEPS:-tests golden bench}
LAYERS=${LAYERS:-30}
start=$(date +%s)
stamp() { echo "[gpu +$(( $(date +%s) - start ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
for step in $STEPS; do
  case $step in
    tests)
      for suite in 'CudaOps.*' '*CudaNorm*' '*CudaQkNormRope*' '*CudaLinear*' '*CudaAttention*' 'CudaMoe.*' \
                   '*CudaMoeExperts*' 'CudaSample.*' 'CudaGraph.*' 'CudaVsCpu.*'; do
        timeout 90 ./test_cuda_ops --gtest_color=no --gtest_filter="$suite" >> "$OUT/tests.log" 2>&1
        echo "suite $suite rc=$?" | tee -a "$OUT/tests.log"
      done
      grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure" "$OUT/tests.log" | sort | uniq -c | head -30
      stamp tests done ;;
    golden)
      MOESERVE_SOURCE_DIR=$PWD timeout 120 ./test_cuda_golden --gtest_color=no > "$OUT/golden_gtest.log" 2>&1
      echo "test_cuda_golden rc=$?"
      grep -E "golden cuda\]|^\[  (PASSED|FAILED) |Failure|Expected|Which is" "$OUT/golden_gtest.log" | head -40
      stamp golden done ;;
    bench)
      timeout ${BENCH_TIMEOUT:-240} ./moeserve bench-model --synthetic minimax-m2.5 --layers "$LAYERS" --batch-sizes ${BATCHES:-1 8 64} \
        --contexts 1024 --profile ${PROFILE:-1 64} --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
      echo "rc=$?" >> "$OUT/bench.txt"
      grep -v "^\s*$" "$OUT/bench.txt" | grep -v '^ *"\|^ *[]{}[]' | tail -70
      stamp bench done ;;
  esac
done
stamp done
