#!/usr/bin/env bash
# Issue 17 item 5 on one H200: `moeserve serve --load-format dummy` with the full-size
# MiniMax-M2.5 config cut to 30 layers (--hf-overrides), then `moeserve bench` (random
# 1,024-token prompts, 1,024 output tokens, --ignore-eos) at max concurrency 1, 16, 64, 256,
# and bench-model's decode step at batch 1 and 64 for the forward pass alone.
#   scripts/gpu_serve_pack.sh here, then there:  cd .gpuserve && OUT=/dir ./gpu_serve_bench.sh [C ...]
# Writes serve.log, bench_c*.json, bench_model.json and bench.txt under $OUT.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f moeserve ] || xz -dk moeserve.xz
# Stand-in tokenizer (Qwen3's padded to the model's vocab_size by gpu_serve_pack.sh): dummy
# weights need no MiniMax one, and every generated id detokenizes to text (one token per chunk).
[ -f model/tokenizer.json ] || xz -dk model/tokenizer.json.xz
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/bench.txt"
PORT=8011
./moeserve serve model --load-format dummy --hf-overrides '{"num_hidden_layers": 30}' --device cuda \
  --served-model-name m25 --port $PORT --host 127.0.0.1 --max-model-len 4096 --capture-graphs-at-startup \
  > "$OUT/serve.log" 2>&1 &
SERVE=$!
for i in $(seq 1 600); do
  curl -sf -o /dev/null http://127.0.0.1:$PORT/health && break
  kill -0 $SERVE 2>/dev/null || break
  [ "$i" = 5 ] && curl -s -w ' %{http_code}\n' http://127.0.0.1:$PORT/v1/models >> "$OUT/bench.txt"  # 503 while loading
  sleep 1
done
curl -s http://127.0.0.1:$PORT/v1/models >> "$OUT/bench.txt"; echo >> "$OUT/bench.txt"
B() { ./moeserve bench --port $PORT --random-input-len 1024 --random-output-len 1024 --ignore-eos --disable-tqdm "$@"; }
for c in ${@:-1 16 64 256}; do  # concurrencies: the arguments, else all four
  n=$(( c == 1 ? 4 : c <= 64 ? 2 * c : c ))
  echo "=== concurrency $c, $n prompts" >> "$OUT/bench.txt"
  curl -s http://127.0.0.1:$PORT/metrics > "$OUT/metrics_before_c$c.txt"
  timeout 200 bash -c "$(declare -f B); PORT=$PORT; B --max-concurrency $c --num-prompts $n --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99,99.9,100 --result-json $OUT/bench_c$c.json" >> "$OUT/bench.txt" 2>&1
  curl -s http://127.0.0.1:$PORT/metrics > "$OUT/metrics_after_c$c.txt"
  # Engine thread time per step over the run (moeserve:engine_* counters): where the serving
  # overhead over the forward pass goes.
  python3 - "$OUT/metrics_before_c$c.txt" "$OUT/metrics_after_c$c.txt" >> "$OUT/bench.txt" <<'PY'
import sys
def read(p):
    d = {}
    for line in open(p):
        if line.startswith("moeserve:engine_"):
            k, v = line.split()[:2]; d[k.split("{")[0]] = float(v)
    return d
a, b = read(sys.argv[1]), read(sys.argv[2])
d = {k: b[k] - a.get(k, 0.0) for k in b}
n = d.get("moeserve:engine_steps_total", 0)
if n:
    st, ex, gap = (d["moeserve:engine_%s_seconds_total" % k] / n * 1e3 for k in ("step", "execute", "loop_gap"))
    print(f"engine per step: {int(n)} steps, step {st:.4f} ms, execute {ex:.4f} ms, host in step {st-ex:.4f} ms, loop gap {gap:.4f} ms")
PY
done
kill -TERM $SERVE; wait $SERVE
echo "=== bench-model" >> "$OUT/bench.txt"
timeout 120 ./moeserve bench-model --synthetic minimax-m2.5 --layers 30 --batch-sizes 1 64 --contexts 1024 2048 \
  --prefill-tokens 1024 --iters 20 --json "$OUT/bench_model.json" >> "$OUT/bench.txt" 2>&1
tail -5 "$OUT/serve.log" >> "$OUT/bench.txt"
