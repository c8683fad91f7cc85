#!/usr/bin/env bash
# Issue 18 items 4 and 5 on one H200, inside the unpacked .gpumasks (scripts/gpu_masks_pack.sh):
#  1. test_cuda_device_masks (grammar masks in the sampling kernel: == host-masked rows, greedy
#     and seeded top-k/top-p, masked and unmasked rows in one batch, all-but-one mask, captured
#     graph replays, the engine's constrained device rows == host sampling) and, when packed
#     (WITH_SAMPLING=1), test_cuda_device_sampling as a regression.
#  2. `moeserve serve --load-format dummy` (MiniMax-M2.5 config cut to $LAYERS layers, padded
#     Qwen3 tokenizer), then `moeserve bench` at max concurrency 64: unconstrained vs every
#     request constrained by records_array.json (structured_outputs.json, compact whitespace),
#     twice each, alternating. The schema asks for at least 64 records, so no output of
#     $OUTLEN tokens completes it: with --ignore-eos both runs generate exactly
#     num_prompts x $OUTLEN tokens and every constrained token is masked.
# Writes tests_*.txt, serve.log, bench_*.json, sample_constrained.json and masks.txt under $OUT.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for f in moeserve test_cuda_device_masks test_cuda_device_sampling model/tokenizer.json; do
  [ -f "$f" ] || [ ! -f "$f.xz" ] || xz -dk "$f.xz"
done
R="$OUT/masks.txt"
cat REVISION > "$R" 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$R"
timeout 240 ./test_cuda_device_masks > "$OUT/tests_device_masks.txt" 2>&1
echo "test_cuda_device_masks: rc $?" | tee -a "$R"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|Which is" "$OUT/tests_device_masks.txt" | head -30 | tee -a "$R"
if [ -f test_cuda_device_sampling ]; then
  timeout 200 ./test_cuda_device_sampling > "$OUT/tests_device_sampling.txt" 2>&1
  echo "test_cuda_device_sampling: rc $?" | tee -a "$R"
  grep -E "^\[  (FAILED|PASSED) |Failure" "$OUT/tests_device_sampling.txt" | head -20 | tee -a "$R"
fi

LAYERS=${LAYERS:-30}; OUTLEN=${OUTLEN:-512}; INLEN=${INLEN:-256}; NPROMPTS=${NPROMPTS:-192}
PORT=8012
./moeserve serve model --load-format dummy --hf-overrides "{\"num_hidden_layers\": $LAYERS}" --device cuda \
  --served-model-name m25 --port $PORT --host 127.0.0.1 --max-model-len 4096 --capture-graphs-at-startup \
  > "$OUT/serve.log" 2>&1 &
SERVE=$!
for i in $(seq 1 600); do
  curl -sf -o /dev/null http://127.0.0.1:$PORT/health && break
  kill -0 $SERVE 2>/dev/null || break
  sleep 1
done
BODY=$(python3 -c 'import json,sys; print(json.dumps({"structured_outputs": {"json": json.load(open(sys.argv[1])), "disable_any_whitespace": True}}))' records_array.json)
# One constrained completion kept for inspection (its text must be a valid JSON prefix).
curl -s http://127.0.0.1:$PORT/v1/completions -H 'Content-Type: application/json' \
  -d "$(python3 -c 'import json,sys; b=json.loads(sys.argv[1]); b.update(model="m25", prompt="Records:", max_tokens=256, temperature=1.0); print(json.dumps(b))' "$BODY")" \
  > "$OUT/sample_constrained.json"
python3 - "$OUT/sample_constrained.json" >> "$R" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r["choices"][0]["text"]
print("sample constrained output:", len(t), "chars, finish", r["choices"][0].get("finish_reason"), "starts", repr(t[:120]))
PY
B() {  # name [extra-body]
  local extra=()
  [ -n "${2:-}" ] && extra=(--extra-body "$2")
  curl -s http://127.0.0.1:$PORT/metrics > "$OUT/metrics_before_$1.txt"
  timeout 300 ./moeserve bench --port $PORT --random-input-len $INLEN --random-output-len $OUTLEN --ignore-eos \
    --disable-tqdm --max-concurrency 64 --num-prompts $NPROMPTS --num-warmups 4 "${extra[@]}" \
    --result-json "$OUT/bench_$1.json" > "$OUT/bench_$1.txt" 2>&1
  echo "bench $1: rc $?" >> "$R"
  curl -s http://127.0.0.1:$PORT/metrics > "$OUT/metrics_after_$1.txt"
}
B plain1; B json1 "$BODY"; B plain2; B json2 "$BODY"
kill -TERM $SERVE; wait $SERVE
python3 - "$OUT" >> "$R" <<'PY'
import json, os, sys
out = sys.argv[1]
def steps(name):
    def read(p):
        d = {}
        for line in open(p):
            if line.startswith("moeserve:engine_"):
                k, v = line.split()[:2]; d[k] = float(v)
        return d
    try:
        a, b = read(f"{out}/metrics_before_{name}.txt"), read(f"{out}/metrics_after_{name}.txt")
    except OSError:
        return ""
    d = {k: b[k] - a.get(k, 0.0) for k in b}
    n = d.get("moeserve:engine_steps_total", 0)
    if not n:
        return ""
    st, ex = (d[f"moeserve:engine_{k}_seconds_total"] / n * 1e3 for k in ("step", "execute"))
    return f"  step {st:.3f} ms, execute {ex:.3f} ms ({int(n)} steps)"
tput = {}
for name in ("plain1", "json1", "plain2", "json2"):
    p = f"{out}/bench_{name}.json"
    if not os.path.exists(p):
        print(name, "no result"); continue
    r = json.load(open(p))
    tput[name] = r.get("output_throughput", 0.0)
    print(f"{name}: completed {r.get('completed')}, output tokens {r.get('total_output_tokens')}, "
          f"output throughput {tput[name]:.1f} tok/s, mean TPOT {r.get('mean_tpot_ms', 0):.2f} ms" + steps(name))
if all(k in tput for k in ("plain1", "json1", "plain2", "json2")):
    p, j = (tput["plain1"] + tput["plain2"]) / 2, (tput["json1"] + tput["json2"]) / 2
    print(f"constrained / unconstrained output throughput: {j / p:.3f} (target >= 0.90)")
PY
tail -3 "$OUT/serve.log" >> "$R"
cat "$R"
