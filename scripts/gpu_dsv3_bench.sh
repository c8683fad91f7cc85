#!/usr/bin/env bash
# Issue #24 item 6 on one H200: bench-model --synthetic deepseek-v3 (DeepSeek-V3's config, random
# FP8 128x128 weights, CUDA graphs, bf16 latent cache) with L layers (the first 3 are dense, so
# L = 5 times 3 dense + 2 MoE layers; 256 experts x 3 x 7168 x 2048 FP8 = 11.3 GB per MoE layer),
# decode at batch 1 / 8 / 64 and contexts 1k / 8k, a 1,024-token prefill. The decode roofline is
# model_decode_bytes (the model's own tensors). Results in $OUT.
#   BIN=build/moeserve OUT=/tmp/dsv3 scripts/gpu_dsv3_bench.sh [LAYERS]
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-build/moeserve}
[ -d "$(dirname "$BIN")/lib" ] && export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")/lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
OUT=${OUT:-/tmp/dsv3_bench}
L=${1:-5}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
timeout 540 "$BIN" bench-model --synthetic deepseek-v3 --layers "$L" --batch-sizes 1 8 64 --contexts 1024 8192 \
  --prefill-tokens 1024 --iters 10 --json "$OUT/dsv3_l$L.json" 2>&1 | tee "$OUT/dsv3_l$L.log" | grep -vE "^\s*$" | tail -25
echo "rc ${PIPESTATUS[0]} in $(( $(date +%s) - t0 )) s"
