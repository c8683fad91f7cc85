#!/usr/bin/env bash
# Speculative decoding on the demo model with `moeserve bench`: spec off, n-gram, MTP (k=3) and
# EAGLE-3 (k=3), each with k chosen per step (serve's default, engine/spec_policy.h) and pinned to 3
# (`*_pinned`: --no-speculative-adaptive, vLLM's behaviour), at concurrency 1, 8 and 32, on the held-out prompt set of the acceptance test
# (tests/fixtures/spec_acceptance/prompts.json, decoded to text, 96 output tokens, EOS ignored).
# Usage: scripts/spec_bench.sh [BIN] [DEVICE] [OUT_DIR]   (defaults: build/moeserve cpu /tmp/spec_bench)
# MODES="off mtp mtp_pinned" runs a subset (default: off and every head, adaptive and pinned;
# ngram / ngram_pinned: n-gram prompt lookup, k=3, lookup up to 4). LOG_LEVEL=debug shows the
# per-step choices of k in OUT_DIR/serve_MODE.log.
# On the GPU machine: scripts/spec_bench.sh build/moeserve cuda /tmp/spec_bench_cuda
# Prints one line per run: method, concurrency, output tok/s, median TPOT, mean acceptance
# length and per-position acceptance (from /metrics, as vLLM's bench reports them).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/moeserve}
DEVICE=${2:-cpu}
OUT=${3:-/tmp/spec_bench}
PY=${PYTHON:-.venv/bin/python}
PORT=${PORT:-18731}
# Sampling of every request (default greedy; EXTRA='{}' uses the model's generation_config.json).
EXTRA=${EXTRA:-'{"temperature": 0}'}
mkdir -p "$OUT"
"$PY" - "$OUT/prompts.jsonl" <<'PYEOF'
import json, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file("assets/demo-model/tokenizer.json")
d = json.load(open("tests/fixtures/spec_acceptance/prompts.json"))
with open(sys.argv[1], "w") as fh:
    for ids in d["prompts"]:
        fh.write(json.dumps({"prompt": tok.decode(ids, skip_special_tokens=False), "output_len": 96}) + "\n")
PYEOF
declare -A SPEC=(
  [off]=""
  [ngram]='{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'
  [mtp]='{"method": "mtp", "num_speculative_tokens": 3}'
  [eagle3]='{"method": "eagle3", "model": "assets/demo-model/eagle3", "num_speculative_tokens": 3}'
)
for m in ${MODES:-off ngram ngram_pinned mtp mtp_pinned eagle3 eagle3_pinned}; do
  args=(serve assets/demo-model --device "$DEVICE" --port "$PORT" --max-num-seqs 32 --no-enable-prefix-caching
        --log-level "${LOG_LEVEL:-info}")
  [ -n "${SPEC[${m%_pinned}]}" ] && args+=(--speculative-config "${SPEC[${m%_pinned}]}")
  [ "$m" != "${m%_pinned}" ] && args+=(--no-speculative-adaptive)
  "$BIN" "${args[@]}" > "$OUT/serve_$m.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null && break; sleep 1; done
  for c in 1 8 32; do
    n=$(( c < 8 ? 8 : 32 ))
    "$BIN" bench --port "$PORT" --endpoint /v1/completions --dataset-name jsonl --dataset-path "$OUT/prompts.jsonl" \
      --num-prompts "$n" --max-concurrency "$c" --ignore-eos --extra-body "$EXTRA" --disable-tqdm --result-json "$OUT/${m}_c$c.json" \
      > "$OUT/bench_${m}_c$c.txt" 2>&1 || { echo "bench $m c=$c failed"; cat "$OUT/bench_${m}_c$c.txt"; }
    "$PY" - "$OUT/${m}_c$c.json" "$m" "$c" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
acc = r.get("spec_decode_acceptance_length")
pos = r.get("spec_decode_per_position_acceptance_rates")
print(f"{sys.argv[2]:13s} c={sys.argv[3]:>2s}  output {r['output_throughput']:8.1f} tok/s  median TPOT "
      f"{r['median_tpot_ms']:8.2f} ms  acceptance length {acc if acc is None else round(acc, 3)}  per position "
      f"{pos if pos is None else [round(x, 3) for x in pos]}")
PYEOF
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
done
