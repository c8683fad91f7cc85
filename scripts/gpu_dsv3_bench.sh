#!/usr/bin/env bash
# Issue #24 item 6 on one H200: bench-model --synthetic deepseek-v3, kimi-k2.5 (INT4 experts as
# published) or kimi-k2.5-fp8 (FP8 128x128 experts) (the real configs, random weights; CUDA
# graphs, bf16 latent cache)
# with L layers, decode at batch 1 / 8 / 64 and contexts 1k / 8k, and a PREFILL-token prefill
# (default 8,192). The decode roofline is model_decode_bytes (the model's own tensors, the MLA
# latent cache included). Layers that fit with the 8k prefill's workspaces at the default
# --gpu-memory-utilization 0.9: deepseek-v3 12 (3 dense + 9 MoE x 11.5 GB), kimi-k2.5-fp8 7
# (1 dense + 6 MoE x 17 GB), kimi-k2.5 (INT4 experts, 9.5 GB per MoE layer) the same 7 for comparison. PROFILE="1 64": the per-op breakdown too. Results in $OUT:
# <model>_l<L>.json and .log.
#   BIN=build/moeserve OUT=/tmp/dsv3 scripts/gpu_dsv3_bench.sh [MODEL [LAYERS]]
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-build/moeserve}
[ -d "$(dirname "$BIN")/lib" ] && export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")/lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
OUT=${OUT:-/tmp/dsv3_bench}
MODEL=${1:-deepseek-v3}
case "$MODEL" in kimi-k2.5*) L=${2:-7};; *) L=${2:-12};; esac
PREFILL=${PREFILL:-8192}
mkdir -p "$OUT"
t0=$(date +%s)
timeout "${TIMEOUT:-540}" "$BIN" bench-model --synthetic "$MODEL" --layers "$L" --batch-sizes 1 8 64 \
  --contexts 1024 8192 --prefill-tokens "$PREFILL" --iters "${ITERS:-10}" ${PROFILE:+--profile $PROFILE} \
  --json "$OUT/${MODEL}_l$L.json" 2>&1 |
  tee "$OUT/${MODEL}_l$L.log" | grep -vE "^\s*$" | tail -12
echo "rc ${PIPESTATUS[0]} in $(( $(date +%s) - t0 )) s"
