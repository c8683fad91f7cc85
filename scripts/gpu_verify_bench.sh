#!/usr/bin/env bash
# Issue #22 item 8 (second half), one H200: the time of a speculative verify step (every
# sequence 1 + k query tokens, k = 1..4) against the plain decode step (k = 0) at batch 1, 8, 32
# and contexts 1k, 8k, 32k, 64k, 128k on MiniMax-M2.5 shapes (bench-model --synthetic, random
# FP8 weights, bf16 KV, CUDA graphs), the distinct experts per layer each step read, and the
# tokens/s speedup at accept lengths 2.2 / 2.5 / 3.0 (draft cost excluded). Results in $OUT.
#   BIN=build/moeserve OUT=/tmp/vb scripts/gpu_verify_bench.sh [router] [overlap] [corrected] [layers30]
# (no argument: all four; each part is one bench-model run, expected about a minute or two
# (75 rows of a few ms each, weights and KV made on the GPU), each capped at 560 s).
#
# Layers: 5. KV of one sequence at 128k context: 8 KV heads x 128 x 2 (K, V) x 2 bytes = 4 KiB
# per token per layer, 131076 tokens (+ k) = 537 MB per layer; batch 32: 17.2 GB per layer.
# Weights: ~3.68 GB per layer (256 experts x 3 x 1536 x 3072 FP8 + attention + router) + 2.46 GB
# embedding / lm_head. 30 layers would need 515 GB of KV at batch 32 x 128k (141 GB card); 5
# layers need 86 GB KV + 21 GB weights, inside the 0.9 x 141 - 2 GB budget (6 would leave ~5%
# headroom). The whole-model figures are the est_*_total_layers fields (per-layer time x 62 +
# the lm_head's time at the measured copy bandwidth); part `layers30` cross-checks that
# extrapolation with 30 layers where the KV fits (batch 1 to 128k, batch 8 to 8k, batch 32 at 1k).
#
# Routing: `router` = the router on random weights (near-uniform, independent per token: ~30.5
# distinct experts of 256 for 4 tokens); `overlap` = --routing-overlap 0.30, the demo model's
# measured overlap of consecutive generated tokens (0.303, bench-model --measure-routing-overlap,
# docs/benchmarks.md); `corrected` = 0.10, the demo's excess over chance mapped to 256 experts
# top-8: 8/256 + 0.071 x (1 - 8/256). The demo has 8 experts top-2 (chance overlap 0.25), so
# 0.30 on M2.5's 256 top-8 (chance 0.031) is an upper-bound-ish proxy, 0.10 a middle one.
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-build/moeserve}
# A scripts/gpu_pack.sh pack (BIN=.gpubin/moeserve) brings the libraries the GPU image lacks in lib/.
[ -d "$(dirname "$BIN")/lib" ] && export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")/lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
OUT=${OUT:-/tmp/verify_bench}
LAYERS=${LAYERS:-5}
mkdir -p "$OUT"
PARTS=${*:-router overlap corrected layers30}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
common=(bench-model --synthetic minimax-m2.5 --prefill-tokens 0 --iters 10 --warmup-ms 200)
run() {  # name, extra args...
  local name=$1; shift
  local t0=$(date +%s)
  timeout 560 "$BIN" "${common[@]}" "$@" --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "$name: rc $? in $(( $(date +%s) - t0 )) s"
  grep -E "^(batch|[0-9]+ +[0-9]+ +[0-9]+ )" "$OUT/$name.log"
  grep -iE "error|skipped" "$OUT/$name.log" | head -5
}
for p in $PARTS; do
  case $p in
    router) run router --layers "$LAYERS" --batch-sizes 1 8 32 --contexts 1024 8192 32768 65536 131072 \
              --verify-tokens 0 1 2 3 4 ;;
    overlap) run overlap030 --layers "$LAYERS" --batch-sizes 1 8 32 --contexts 1024 8192 32768 65536 131072 \
               --verify-tokens 0 1 2 3 4 --routing-overlap 0.30 ;;
    corrected) run overlap010 --layers "$LAYERS" --batch-sizes 1 8 32 --contexts 1024 8192 32768 65536 131072 \
                 --verify-tokens 0 1 2 3 4 --routing-overlap 0.10 ;;
    layers30) run layers30 --layers 30 --batch-sizes 1 8 32 --contexts 1024 8192 65536 131072 --verify-tokens 0 3 ;;
    *) echo "unknown part $p (router overlap corrected layers30)"; exit 2 ;;
  esac
done
# The EAGLE-3 summary (k = 3) of every part that ran: measured and whole-model estimates.
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
for name in ["router", "overlap030", "overlap010", "layers30"]:
    p = os.path.join(out, name + ".json")
    if not os.path.exists(p):
        continue
    v = json.load(open(p)).get("verify", {})
    print(f"\n{name} ({v.get('routing', {}).get('mode')} {v.get('routing', {}).get('overlap', '')}): k=3 verify vs decode")
    print("batch | context | decode ms | verify ms | ratio | x@2.2 | x@2.5 | x@3.0 | est 62-layer x@2.5")
    for e in v.get("eagle3_k3", []):
        s = e["speedup_at_accept_len"]
        est = e.get("est_speedup_at_accept_len_total_layers", {}).get("2.5")
        print(f"{e['batch']} | {e['context']} | {e['decode_ms']:.3f} | {e['verify_ms']:.3f} | {e['ratio']:.3f} | "
              f"{s['2.2']:.3f} | {s['2.5']:.3f} | {s['3.0']:.3f} | {est if est is None else round(est, 3)}")
PY
