#!/usr/bin/env bash
# Issue 17 item 5, inter-token latency while new requests prefill, on one H200: the same
# server as gpu_serve_bench.sh (30 MiniMax-M2.5 layers, dummy weights, the padded stand-in
# tokenizer so each SSE chunk is one token), measured at max concurrency 1 and 64 with random
# 1,024-token prompts and 1,024 output tokens, once per scheduler setting:
#   default       vLLM's H200 defaults: --max-num-batched-tokens 8192, no prefill caps
#   partial1      --max-num-partial-prefills 1: one prompt's chunk per step next to the decodes
#   budget2048    --max-num-batched-tokens 2048 (vLLM's advice for lower ITL)
#   threshold512  --max-num-partial-prefills 2 --long-prefill-token-threshold 512
# (VARIANTS="default partial1" ./gpu_itl_bench.sh runs a subset.) About 90 s per variant.
#   scripts/gpu_serve_pack.sh here, then there:  cd .gpuserve && OUT=/dir ./gpu_itl_bench.sh
# Writes serve_<variant>.log, itl_<variant>_c<C>.json and itl.txt (a summary table) under $OUT.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f moeserve ] || xz -dk moeserve.xz
[ -f model/tokenizer.json ] || xz -dk model/tokenizer.json.xz
declare -A FLAGS=(
  [default]=""
  [partial1]="--max-num-partial-prefills 1"
  [budget2048]="--max-num-batched-tokens 2048"
  [threshold512]="--max-num-partial-prefills 2 --long-prefill-token-threshold 512"
)
VARIANTS=${VARIANTS:-"default partial1 budget2048 threshold512"}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/itl.txt"
{ ./moeserve --version; cat REVISION 2>/dev/null; } >> "$OUT/itl.txt" 2>&1
PORT=8012
for v in $VARIANTS; do
  # shellcheck disable=SC2086
  ./moeserve serve model --load-format dummy --hf-overrides '{"num_hidden_layers": 30}' --device cuda \
    --served-model-name m25 --port $PORT --host 127.0.0.1 --max-model-len 4096 --capture-graphs-at-startup \
    ${FLAGS[$v]} > "$OUT/serve_$v.log" 2>&1 &
  SERVE=$!
  for i in $(seq 1 300); do
    curl -sf -o /dev/null http://127.0.0.1:$PORT/health && break
    kill -0 $SERVE 2>/dev/null || break
    sleep 1
  done
  for c in 1 64; do
    n=$(( c == 1 ? 4 : 2 * c ))
    timeout 150 ./moeserve bench --port $PORT --random-input-len 1024 --random-output-len 1024 --ignore-eos \
      --disable-tqdm --max-concurrency $c --num-prompts $n --percentile-metrics ttft,tpot,itl \
      --metric-percentiles 50,99,99.9,100 --result-json "$OUT/itl_${v}_c$c.json" > "$OUT/bench_${v}_c$c.txt" 2>&1
  done
  kill -TERM $SERVE; wait $SERVE
done
python3 - "$OUT" $VARIANTS >> "$OUT/itl.txt" <<'PY'
import json, os, sys
out, variants = sys.argv[1], sys.argv[2:]
keys = ["mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_itl_ms", "p99_itl_ms", "p99.9_itl_ms", "p100_itl_ms",
        "output_throughput"]
print("| variant | c | " + " | ".join(keys) + " |")
print("|---|---|" + "---|" * len(keys))
for v in variants:
    for c in (1, 64):
        p = os.path.join(out, f"itl_{v}_c{c}.json")
        if not os.path.exists(p):
            print(f"| {v} | {c} | (no result) |")
            continue
        d = json.load(open(p))
        print(f"| {v} | {c} | " + " | ".join(f"{d.get(k, float('nan')):.2f}" for k in keys) + " |")
PY
cat "$OUT/itl.txt"
