#!/usr/bin/env bash
# Issue 17 item 5: where the c=1 serving overhead over bench-model's forward goes. Serves the
# 30-layer dummy MiniMax-M2.5 (as gpu_serve_bench.sh) three times with different sampling
# defaults (--generation-config): greedy, temperature 1 (vLLM's default without a
# generation_config.json), and MiniMax-M2.x's own generation_config (T 1, top_p 0.95, top_k 40),
# and prints TPOT at concurrency 1 with the engine's per-step figures (moeserve:engine_*).
#   scripts/gpu_serve_pack.sh here, then there:  cd .gpuserve && OUT=/dir ./gpu_sampling_overhead.sh [BINARY [TAG]]
# (an A/B: run it once per binary, with a tag for each).
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f moeserve ] || xz -dk moeserve.xz
BIN=${1:-./moeserve}; TAG=${2:-}
[ -f model/tokenizer.json ] || xz -dk model/tokenizer.json.xz
PORT=8012
mkdir -p gen/greedy gen/t1 gen/m2
echo '{"temperature": 0.0}' > gen/greedy/generation_config.json
echo '{"temperature": 1.0}' > gen/t1/generation_config.json
echo '{"temperature": 1.0, "top_p": 0.95, "top_k": 40}' > gen/m2/generation_config.json
for g in greedy t1 m2; do
  "$BIN" serve model --load-format dummy --hf-overrides '{"num_hidden_layers": 30}' --device cuda \
    --served-model-name m25 --port $PORT --host 127.0.0.1 --max-model-len 4096 --capture-graphs-at-startup \
    --generation-config gen/$g > "$OUT/${TAG}serve_$g.log" 2>&1 &
  SERVE=$!
  for i in $(seq 1 300); do curl -sf -o /dev/null http://127.0.0.1:$PORT/health && break; sleep 1; done
  curl -s http://127.0.0.1:$PORT/metrics > "$OUT/${TAG}m_before_$g.txt"
  timeout 120 "$BIN" bench --port $PORT --random-input-len 1024 --random-output-len 1024 --ignore-eos \
    --disable-tqdm --max-concurrency 1 --num-prompts 3 --result-json "$OUT/${TAG}bench_$g.json" > "$OUT/${TAG}bench_$g.txt" 2>&1
  curl -s http://127.0.0.1:$PORT/metrics > "$OUT/${TAG}m_after_$g.txt"
  # Batch 64 (the throughput regime): 64 streams of 256 tokens.
  timeout 120 "$BIN" bench --port $PORT --random-input-len 1024 --random-output-len 256 --ignore-eos \
    --disable-tqdm --max-concurrency 64 --num-prompts 64 > "$OUT/${TAG}bench64_$g.txt" 2>&1
  echo "$TAG$g c=64: TPOT $(awk '/^Mean TPOT/ {print $NF}' "$OUT/${TAG}bench64_$g.txt") ms" | tee -a "$OUT/summary.txt"
  kill -TERM $SERVE; wait $SERVE
  python3 - "$g" "$OUT/${TAG}m_before_$g.txt" "$OUT/${TAG}m_after_$g.txt" "$OUT/${TAG}bench_$g.txt" "$TAG" <<'PY' | tee -a "$OUT/summary.txt"
import sys
def read(p):
    d = {}
    for line in open(p):
        if line.startswith("moeserve:engine_"):
            k, v = line.split()[:2]; d[k.split("{")[0]] = float(v)
    return d
a, b = read(sys.argv[2]), read(sys.argv[3])
d = {k: b[k] - a.get(k, 0.0) for k in b}
n = d.get("moeserve:engine_steps_total", 0) or 1
st, ex, gap = (d["moeserve:engine_%s_seconds_total" % k] / n * 1e3 for k in ("step", "execute", "loop_gap"))
tpot = [l.split()[-1] for l in open(sys.argv[4]) if l.startswith("Mean TPOT")]
print(f"{sys.argv[5]}{sys.argv[1]}: TPOT {tpot[0] if tpot else '?'} ms; per step: {int(n)} steps, step {st:.4f}, execute {ex:.4f}, host in step {st-ex:.4f}, loop gap {gap:.4f} ms")
PY
done
