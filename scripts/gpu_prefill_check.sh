#!/usr/bin/env bash
# Prefill-path check on one H200 with prebuilt binaries (moeserve, test_cuda_ops in this
# folder): op tests of the prefill kernels and their neighbours, the 8k microbenchmark
# (old vs new path per op), then bench-model's prefill line and eager profile.
# Usage: cd <pack> && OUT=/dir ./gpu_prefill_check.sh
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
LAYERS=30  # issue 5 figure (fixed: an inherited LAYERS gave 16 once)
start=$(date +%s)
stamp() { echo "[gpu +$(( $(date +%s) - start ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 150 ./test_cuda_ops --gtest_color=no \
  --gtest_filter='*CudaPrefill*:*CudaAttention*:*CudaLinear*:*CudaMoeExperts*:CudaMoe.*:CudaGraph.*:CudaVsCpu.*' \
  > "$OUT/tests.log" 2>&1
echo "tests rc=$?"
grep -E "^\[prefill|FAILED|Failure|PASSED" "$OUT/tests.log" | head -60
stamp tests done
MOESERVE_BENCH=1 timeout 120 ./test_cuda_ops --gtest_color=no --gtest_filter='CudaPrefillBench.*' > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -E "^\[bench\]|Failure|what\(\)|error" "$OUT/bench.log" | head -20
stamp bench done
timeout 300 ./moeserve bench-model --synthetic minimax-m2.5 --layers "$LAYERS" --batch-sizes 1 --contexts 1024 \
  --profile 1 --json "$OUT/bench_model.json" > "$OUT/bench_model.log" 2>&1
echo "bench-model rc=$?"
grep -iE "prefill|roofline|moe|attention|proj|route|lm_head|norm|error" "$OUT/bench_model.log" | cut -c1-200 | head -40
stamp all done
