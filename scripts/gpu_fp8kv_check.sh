#!/usr/bin/env bash
# FP8 KV cache check on the GPU machine, run inside the unpacked .gpubin (scripts/gpu_pack.sh
# packs this script and test_cuda_fp8_kv). Results under $OUT:
#   tests   test_cuda_fp8_kv (CUDA KV writes bit-exact vs the CPU, every attention kernel mode
#           over an e4m3 cache vs the CPU FP8-KV reference, golden fixtures with
#           --kv-cache-dtype fp8 on CUDA vs CPU), then the unchanged bf16 attention suites and
#           test_cuda_golden (the bf16 paths still pass)            -> tests.log
#   bench   bench-model --synthetic minimax-m2.5, decode at 8k / 32k / 64k context, batch 1
#           and 32, bf16 KV then FP8 KV (same layers, same GPU, one run)
#                                          -> bench_kv_auto.json, bench_kv_fp8.json, bench.txt
# Usage: cd .gpubin && OUT=/dir [STEPS="tests bench"] [LAYERS=4] ./gpu_fp8kv_check.sh
# LAYERS: batch 32 at 64k holds 2M tokens: 8.6 GB of bf16 KV per layer (4.3 GB FP8), so the
# default 4 layers fit both caches on one H200; bench-model skips a point that does not fit.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
STEPS=${STEPS:-tests bench}
LAYERS=${LAYERS:-4}
start=$(date +%s)
stamp() { echo "[gpu +$(( $(date +%s) - start ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
for step in $STEPS; do
  case $step in
    tests)
      MOESERVE_SOURCE_DIR=$PWD timeout 300 ./test_cuda_fp8_kv --gtest_color=no > "$OUT/tests.log" 2>&1
      echo "test_cuda_fp8_kv rc=$?" | tee -a "$OUT/tests.log"
      grep -E "^\[fp8-kv\]|^\[  (PASSED|FAILED) |FAILED  \]|Failure|Expected|Which is" "$OUT/tests.log" | head -60
      timeout 120 ./test_cuda_ops --gtest_color=no --gtest_filter='*CudaAttention*:*AttnDecode*' >> "$OUT/tests.log" 2>&1
      echo "test_cuda_ops attention suites (bf16) rc=$?" | tee -a "$OUT/tests.log"
      MOESERVE_SOURCE_DIR=$PWD timeout 120 ./test_cuda_golden --gtest_color=no >> "$OUT/tests.log" 2>&1
      echo "test_cuda_golden (bf16 KV) rc=$?" | tee -a "$OUT/tests.log"
      stamp tests done ;;
    bench)
      for kv in auto fp8; do
        timeout 500 ./moeserve bench-model --synthetic minimax-m2.5 --layers "$LAYERS" --kv-cache-dtype "$kv" \
          --batch-sizes 1 32 --contexts 8192 32768 65536 --prefill-tokens 0 --iters 20 --warmup-ms 300 \
          --json "$OUT/bench_kv_$kv.json" > "$OUT/bench_$kv.txt" 2>&1
        echo "bench-model --kv-cache-dtype $kv rc=$?" | tee -a "$OUT/bench.txt"
        grep -E "^batch|^[0-9]+ +[0-9]+ |skipped|KV cache|error" "$OUT/bench_$kv.txt" | tee -a "$OUT/bench.txt"
      done
      # Side by side: step ms bf16 vs FP8 per (batch, context).
      python3 - "$OUT" <<'PY' | tee -a "$OUT/bench.txt"
import json, sys, os
out = sys.argv[1]
runs = {}
for kv in ("auto", "fp8"):
    p = os.path.join(out, f"bench_kv_{kv}.json")
    if os.path.exists(p):
        runs[kv] = {(d["batch"], d["context"]): d for d in json.load(open(p))["decode"]}
print(f"{'batch':>5} {'context':>7} {'bf16 ms':>9} {'fp8 ms':>9} {'speedup':>8} {'bf16 roof':>9} {'fp8 roof':>9}")
for key in sorted(set(runs.get("auto", {})) | set(runs.get("fp8", {}))):
    a, f = runs.get("auto", {}).get(key), runs.get("fp8", {}).get(key)
    am = a["step_ms"] if a else float("nan"); fm = f["step_ms"] if f else float("nan")
    print(f"{key[0]:>5} {key[1]:>7} {am:>9.3f} {fm:>9.3f} {am / fm:>8.2f} "
          f"{(a or {}).get('roofline_fraction', float('nan')):>9.2f} {(f or {}).get('roofline_fraction', float('nan')):>9.2f}")
PY
      stamp bench done ;;
    *) echo "unknown step $step" ;;
  esac
done
