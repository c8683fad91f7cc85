#!/usr/bin/env bash
# One device run of prebuilt CUDA binaries (build-cuda, copied with this script into a
# folder BIN together with tests/fixtures/golden and scripts/golden_cuda_check.sh):
#   op tests (one timeout per suite, so a hang costs one suite), CUDA golden gtest and script,
#   a `serve --device cuda` smoke request, bench-model with a per-op profile.
# Usage on the GPU machine: cd BIN && OUT=/dir LAYERS=16 STEPS="tests golden serve bench" ./gpu_cuda2_check.sh
set -uo pipefail
cd "$(dirname "$0")"
FINAL=${OUT:-$PWD/out}; mkdir -p "$FINAL"
# Everything is written under a work folder and returned as one archive (few files come back).
OUT=/tmp/cuda2_gpu_out; rm -rf "$OUT"; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
STEPS=${STEPS:-tests golden serve bench}
LAYERS=${LAYERS:-16}
start=$(date +%s)
stamp() { echo "[gpu +$(( $(date +%s) - start ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
for step in $STEPS; do
  case $step in
    tests)
      for suite in 'CudaOps.*' '*CudaNorm*' '*CudaQkNormRope*' '*CudaLinear*' '*CudaAttention*' 'CudaMoe.*' \
                   '*CudaMoeExperts*' 'CudaSample.*' 'CudaGraph.*' 'CudaVsCpu.*'; do
        timeout 90 ./test_cuda_ops --gtest_color=no --gtest_filter="$suite" >> "$OUT/tests.log" 2>&1
        echo "suite $suite rc=$?" | tee -a "$OUT/tests.log"
      done
      grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure" "$OUT/tests.log" | sort | uniq -c | head -30
      stamp tests done ;;
    golden)
      MOESERVE_SOURCE_DIR=$PWD timeout 120 ./test_cuda_golden --gtest_color=no > "$OUT/golden_gtest.log" 2>&1
      echo "test_cuda_golden rc=$?"
      grep -E "golden cuda\]|^\[  (PASSED|FAILED) |Failure|Expected|Which is" "$OUT/golden_gtest.log" | head -40
      [ -x ./moeserve ] && BIN=./moeserve OUT=/tmp/golden_script timeout 120 ./golden_cuda_check.sh > "$OUT/golden_script.log" 2>&1
      echo "golden_cuda_check rc=$?"; cat "$OUT/golden_script.log" | tail -8
      stamp golden done ;;
    serve)
      ./moeserve make-tiny /tmp/tiny > "$OUT/serve.log" 2>&1
      ./moeserve serve /tmp/tiny --served-model-name tiny --device cuda --port 18123 --gpu-memory-utilization 0.1 \
        >> "$OUT/serve.log" 2>&1 &
      spid=$!
      python3 - >> "$OUT/serve.log" 2>&1 <<'PY'
import json, time, urllib.request
base = "http://127.0.0.1:18123"
for _ in range(120):
    try:
        urllib.request.urlopen(base + "/health", timeout=1); break
    except Exception:
        time.sleep(0.5)
def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=60).read())
print("completion:", post("/v1/completions", {"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0}))
print("chat:", post("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                             "max_tokens": 8, "temperature": 0.7, "seed": 1}))
PY
      kill $spid; wait $spid 2>/dev/null
      grep -iE "kv|cuda|error|completion|chat" "$OUT/serve.log" | cut -c1-400 | head -10
      stamp serve done ;;
    bench)
      timeout 240 ./moeserve bench-model --synthetic minimax-m2.5 --layers "$LAYERS" --profile 1 64 \
        --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1; echo "rc=$?" >> "$OUT/bench.txt"
      cat "$OUT/bench.txt" | grep -v "^\s*$" | grep -v '^ *"' | tail -60
      # As many layers as fit with the KV of batch 64 at 1k: the figures compared with the targets.
      timeout 200 ./moeserve bench-model --synthetic minimax-m2.5 --layers "${BIG_LAYERS:-30}" --batch-sizes 1 8 64 \
        --contexts 1024 --json "$OUT/bench_big.json" > "$OUT/bench_big.txt" 2>&1; echo "rc=$?" >> "$OUT/bench_big.txt"
      grep -v "^\s*$" "$OUT/bench_big.txt" | tail -12
      # Same decode batches with the GEMV path for linears up to 64 rows (instead of 8).
      timeout 120 ./moeserve bench-model --synthetic minimax-m2.5 --layers 4 --batch-sizes 16 32 64 \
        --contexts 1024 --prefill-tokens 0 --linear-gemv-max-tokens 64 --profile 64 \
        --json "$OUT/bench_gemv64.json" > "$OUT/bench_gemv64.txt" 2>&1; echo "rc=$?" >> "$OUT/bench_gemv64.txt"
      grep -v '^ *"\|^ *[]{}[]' "$OUT/bench_gemv64.txt" | tail -30
      stamp bench done ;;
  esac
done
stamp done
tar czf "$FINAL/all.tgz" -C "$OUT" . && ls -la "$FINAL"
