#!/usr/bin/env bash
# Issue 23 item 3 figures on one H200, from a pack (scripts/gpu_pack.sh):
#   attn    the decode attention kernels at batch 64-256, contexts 1k-32k (CudaAttnVerify.Bench*)
#   bench   bench-model --synthetic minimax-m2.5, LAYERS (8: KV of 256 x 8k fits), batch 1-256,
#           contexts 1k / 8k, bf16 KV (with the eager profile at PROFILE) and FP8 KV
# Usage on the GPU machine: cd <pack> && OUT=/dir STEPS="attn bench" ./gpu_throughput_check.sh
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
LAYERS=${LAYERS:-8}
for step in ${STEPS:-attn bench}; do
  case $step in
    attn)
      MOESERVE_BENCH=1 timeout 200 ./test_cuda_ops --gtest_color=no \
        --gtest_filter='CudaAttnVerify.BenchThroughputRegime:CudaAttnVerify.BenchAgainstGeneric' > "$OUT/attn_bench.log" 2>&1
      echo "attn bench rc=$?"; grep -h "verify-tput\|verify-bench" "$OUT/attn_bench.log" ;;
    bench)
      for kv in auto fp8; do
        prof=""; [ "$kv" = auto ] && prof="--profile ${PROFILE:-256}"
        timeout "${TIMEOUT:-280}" ./moeserve bench-model --synthetic minimax-m2.5 --layers "$LAYERS" \
          --batch-sizes 1 64 128 256 --contexts 1024 8192 --prefill-tokens 0 --iters 5 --kv-cache-dtype $kv $prof \
          --json "$OUT/bench_l${LAYERS}_$kv.json" > "$OUT/bench_l${LAYERS}_$kv.log" 2>&1
        echo "bench-model kv $kv rc=$?"; grep -vE "^\s*$|\[info\]" "$OUT/bench_l${LAYERS}_$kv.log" | tail -30
      done ;;
  esac
done
