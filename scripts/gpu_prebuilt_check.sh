#!/usr/bin/env bash
# One device run of prebuilt CUDA binaries packed by scripts/gpu_pack.sh. Steps (STEPS):
#   tests   op tests against the CPU backend, one timeout per suite (a hang costs one suite),
#           and test_cuda_device_sampling (engine-seam device sampling on a tiny model)
#   golden  CUDA golden gtest + golden_cuda_check.sh (`generate --device cuda` vs HF references)
#   graphs  decode-step CUDA graphs through the executor vs --enforce-eager (test_cuda_graphs)
#   hf      scripts/make_golden.py --check (regenerates the HF references with the machine's transformers)
#   serve   `serve --device cuda` on make-tiny, one completion and one chat request
#   bench   bench-model --synthetic minimax-m2.5 (LAYERS, BATCHES, CONTEXTS, PROFILE)
#   multigpu  test_nccl (ctest -L multigpu: skips below 2 GPUs); with >= 2 GPUs also
#           gpu_multigpu_check.sh's nccl + dist + serve steps (TP=2 / TP=2+EP serving)
# Usage on the GPU machine: cd .gpubin && OUT=/dir STEPS="tests golden bench" LAYERS=30 ./gpu_prebuilt_check.sh
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"  # yaml-cpp from gpu_pack.sh
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
STEPS=${STEPS:-tests golden serve multigpu bench}
LAYERS=${LAYERS:-30}
start=$(date +%s)
stamp() { echo "[gpu +$(( $(date +%s) - start ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
for step in $STEPS; do
  case $step in
    tests)
      for suite in 'CudaOps.*' '*CudaNorm*' '*CudaQkNormRope*' '*CudaLinear*' '*CudaPrefill*' '*CudaAttention*' 'CudaMoe.*' \
                   '*CudaMoeExperts*' 'CudaSample.*' 'CudaGraph.*' 'CudaVsCpu.*' \
                   '*CudaRouter*' '*CudaAddNorm*'; do
        timeout 90 ./test_cuda_ops --gtest_color=no --gtest_filter="$suite" >> "$OUT/tests.log" 2>&1
        echo "suite $suite rc=$?" | tee -a "$OUT/tests.log"
      done
      # Device sampling through MiniMaxM2Executor (tiny model) and the kernel at a 200k vocab.
      timeout 120 ./test_cuda_device_sampling --gtest_color=no >> "$OUT/tests.log" 2>&1
      echo "suite test_cuda_device_sampling rc=$?" | tee -a "$OUT/tests.log"
      grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure" "$OUT/tests.log" | sort | uniq -c | head -30
      stamp tests done ;;
    golden)
      MOESERVE_SOURCE_DIR=$PWD timeout 120 ./test_cuda_golden --gtest_color=no > "$OUT/golden_gtest.log" 2>&1
      echo "test_cuda_golden rc=$?"
      grep -E "golden cuda\]|^\[  (PASSED|FAILED) |Failure|Expected|Which is" "$OUT/golden_gtest.log" | head -40
      BIN=$PWD/moeserve OUT=/tmp/golden_script timeout 120 ./scripts/golden_cuda_check.sh > "$OUT/golden_script.log" 2>&1
      echo "golden_cuda_check rc=$?"; tail -8 "$OUT/golden_script.log"
      stamp golden done ;;
    graphs)
      MOESERVE_SOURCE_DIR=$PWD timeout 120 ./test_cuda_graphs --gtest_color=no > "$OUT/graphs_gtest.log" 2>&1
      echo "test_cuda_graphs rc=$?"
      grep -E "^\[graphs|^\[  (PASSED|FAILED) |Failure|Expected|Which is|cuda graph: captured" "$OUT/graphs_gtest.log" | head -40
      stamp graphs done ;;
    hf)
      timeout 200 python3 scripts/make_golden.py --check > "$OUT/make_golden_check.log" 2>&1
      echo "make_golden --check rc=$?"; grep CHECK "$OUT/make_golden_check.log"
      stamp hf done ;;
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
# Concurrent greedy requests (decode batches of several sequences: padded graph buckets) vs
# the same prompts one at a time.
import concurrent.futures as cf
prompts = ["the quick brown fox %d" % i for i in range(12)]
one = lambda p: post("/v1/completions", {"model": "tiny", "prompt": p, "max_tokens": 24, "temperature": 0})["choices"][0]["text"]
seq = [one(p) for p in prompts]
with cf.ThreadPoolExecutor(12) as ex:
    par = list(ex.map(one, prompts))
print("concurrent == sequential (greedy): %d of %d" % (sum(a == b for a, b in zip(seq, par)), len(prompts)))
PY
      kill $spid; wait $spid 2>/dev/null
      grep -iE "kv|cuda|graph|error|completion|chat|concurrent|bucket|workspace" "$OUT/serve.log" | cut -c1-400 | head -40
      stamp serve done ;;
    multigpu)
      if [ -x ./test_nccl ]; then
        ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
        if [ "$ngpu" -ge 2 ] && [ -x ./gpu_multigpu_check.sh ]; then
          OUT="$OUT/multigpu" STEPS="nccl dist serve" ./gpu_multigpu_check.sh 2>&1 | tail -40
        else
          MOESERVE_SOURCE_DIR=$PWD timeout 60 ./test_nccl --gtest_color=no > "$OUT/test_nccl.log" 2>&1
          echo "test_nccl ($ngpu GPU) rc=$?"; grep -E "^\[  (PASSED|SKIPPED|FAILED) +\] [0-9]+ test" "$OUT/test_nccl.log"
        fi
      fi
      stamp multigpu done ;;
    bench)
      timeout "${BENCH_TIMEOUT:-240}" ./moeserve bench-model --synthetic minimax-m2.5 --layers "$LAYERS" \
        --batch-sizes ${BATCHES:-1 8 64} --contexts ${CONTEXTS:-1024} --profile ${PROFILE:-1 64} \
        --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
      echo "rc=$?" >> "$OUT/bench.txt"
      grep -v "^\s*$" "$OUT/bench.txt" | grep -v '^ *"\|^ *[]{}[]' | tail -70
      stamp bench done ;;
  esac
done
stamp done
