#!/usr/bin/env bash
# A/B of the prefill experts' tile shape (device machine, prebuilt binaries in BIN): the GTests of
# the grouped GEMMs and the prefill experts op, then 30-layer bench-model runs of the default
# (128-row tables, 128 x 256 tiles) and MOESERVE_FP8_WGMMA_TILE=256x128 (256-row tables, 256 x
# 128 tiles) interleaved, then ncu per-kernel times and DRAM bytes of one 8k prefill with each.
#   BIN=dir OUT=dir REPS=2 scripts/gpu_prefill_tall_ab.sh
set -u
BIN=${BIN:?}; OUT=${OUT:?}; mkdir -p "$OUT"
R=$(cd "$(dirname "$0")/.." && pwd)
timeout 200 "$BIN/test_cuda_ops" --gtest_color=no --gtest_filter='*CudaFp8GroupedGemm*:*CudaPrefillExperts*' \
  > "$OUT/gtest.log" 2>&1
echo "gtest rc=$? $(grep -cE '^\[       OK \]' "$OUT/gtest.log") OK"; grep -E "FAILED|256x128|mode=10" "$OUT/gtest.log" | head -30
for rep in $(seq "${REPS:-2}"); do
  for v in default tall; do
    env_v=""; [ $v = tall ] && env_v="MOESERVE_FP8_WGMMA_TILE=256x128"
    env $env_v timeout 150 "$BIN/moeserve" bench-model --synthetic minimax-m2.5 --layers 30 --batch-sizes 1 \
      --contexts 1024 --iters 5 --profile 1 --json "$OUT/bench_${v}_$rep.json" > "$OUT/bench_${v}_$rep.log" 2>&1
    echo "$v rep $rep: $(grep -E '^prefill 8192' "$OUT/bench_${v}_$rep.log") | $(grep -E 'moe_experts' "$OUT/bench_${v}_$rep.log" | tail -1)"
  done
done
for v in default tall; do
  env_v=""; [ $v = tall ] && env_v="MOESERVE_FP8_WGMMA_TILE=256x128"
  env $env_v BIN=$BIN OUT=$OUT/ncu_$v LAYERS=2 "$R/scripts/gpu_ncu_prefill.sh" > /dev/null 2>&1
  echo "ncu $v:"; grep -E "gemm_fp8_wgmma|combine|quant_vec" "$OUT/ncu_$v/ncu_prefill/summary.txt" | tail -5
done
