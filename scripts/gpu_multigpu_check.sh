#!/usr/bin/env bash
# Multi-GPU check of prebuilt binaries (packed by scripts/gpu_pack.sh plus test_nccl):
#   nccl    ctest-equivalent of `ctest -L multigpu`: test_nccl (collectives, golden TP/EP on NCCL)
#   dist    dist-check: all GPUs in one process, then 2 processes over the TCP rendezvous (--nnodes 2)
#   serve   serve -tp 2 on make-tiny (bf16) and -tp 2 --enable-expert-parallel on make-tiny --fp8,
#           one completion each; generate at tp 1 / 2 / 2+EP; the FP8 block-split refusal message
#   tput    bench-model -tp 2 at batch 64/128/256 on TPUT_LAYERS layers (KV room)
#   bench   bench-model -tp 2 (with and without EP; small all-reduces on NCCL or, when its test
#           passed, the one-shot p2p kernel: MOESERVE_P2P_ALLREDUCE=1) on synthetic M2.5, LAYERS layers
# Usage: cd .gpubin && OUT=/dir STEPS="nccl dist serve bench" LAYERS=62 ./gpu_multigpu_check.sh
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
STEPS=${STEPS:-nccl dist serve bench}
LAYERS=${LAYERS:-62}
start=$(date +%s)
stamp() { echo "[gpu +$(( $(date +%s) - start ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
# libnccl.so.2: found through the binary's RPATH (CUDA toolkit lib) or the loader; else look around.
if ldd ./moeserve | grep -q "libnccl.*not found"; then
  for d in /usr/local/cuda/lib /usr/local/cuda/lib64 /usr/local/cuda-13*/lib /usr/lib/x86_64-linux-gnu \
           $(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) + '/lib')" 2>/dev/null); do
    if [ -e "$d/libnccl.so.2" ]; then export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; break; fi
  done
fi
ldd ./moeserve | grep -E "nccl|cudart" | tee "$OUT/ldd.txt"
echo "NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-unset (moeserve sets 0)}"
serve_one() {  # dir port extra-flags...
  local dir=$1 port=$2; shift 2
  ./moeserve serve "$dir" --served-model-name tiny --device cuda --port "$port" --gpu-memory-utilization 0.2 "$@" \
    >> "$OUT/serve.log" 2>&1 &
  local spid=$!
  PORT=$port python3 - >> "$OUT/serve.log" 2>&1 <<'PY'
import json, os, time, urllib.request
base = "http://127.0.0.1:" + os.environ["PORT"]
for _ in range(240):
    try:
        urllib.request.urlopen(base + "/health", timeout=1); break
    except Exception:
        time.sleep(0.25)
req = urllib.request.Request(base + "/v1/completions", json.dumps(
    {"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0}).encode(),
    {"Content-Type": "application/json"})
r = json.loads(urllib.request.urlopen(req, timeout=60).read())
print("COMPLETION", os.environ["PORT"], json.dumps(r["choices"][0]), r["usage"])
PY
  echo "serve $* client rc=$?" | tee -a "$OUT/serve.log"
  kill $spid; wait $spid 2>/dev/null
}
for step in $STEPS; do
  case $step in
    nccl)
      MOESERVE_SOURCE_DIR=$PWD timeout 120 ./test_nccl --gtest_color=no --gtest_filter='-*P2p*' > "$OUT/test_nccl.log" 2>&1
      echo "test_nccl (NCCL) rc=$?"
      grep -E "^\[nccl|^\[  (PASSED|FAILED) |Failure|Expected|Which is|FAILED  \]" "$OUT/test_nccl.log" | head -40
      timeout 60 ./test_nccl --gtest_color=no --gtest_filter='*P2p*' > "$OUT/test_p2p.log" 2>&1
      echo "test_nccl (p2p all-reduce) rc=$?"
      grep -E "^\[p2p|^\[  (PASSED|FAILED) |Failure|Expected|Which is" "$OUT/test_p2p.log" | head -20
      stamp nccl done ;;
    dist)
      timeout 60 ./moeserve dist-check > "$OUT/dist_check.log" 2>&1; echo "dist-check (1 process) rc=$?"
      CUDA_VISIBLE_DEVICES=0 timeout 60 ./moeserve dist-check --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 \
        --master-port 29611 > "$OUT/dist_node0.log" 2>&1 &
      p0=$!
      CUDA_VISIBLE_DEVICES=1 timeout 60 ./moeserve dist-check --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 \
        --master-port 29611 > "$OUT/dist_node1.log" 2>&1
      r1=$?; wait $p0; r0=$?
      echo "dist-check 2 processes (TCP rendezvous) rc=$r0,$r1"
      cat "$OUT/dist_check.log" "$OUT/dist_node0.log" "$OUT/dist_node1.log" | grep -E '^\{|FAIL|rror' | head -12
      stamp dist done ;;
    serve)
      ./moeserve make-tiny /tmp/tiny > /dev/null 2>&1
      ./moeserve make-tiny --fp8 --num-kv-heads 4 /tmp/tiny8 > /dev/null 2>&1  # 2 KV heads of 64 per rank = one 128 block
      for tp in "--tensor-parallel-size 1" "-tp 2" "-tp 2 --enable-expert-parallel"; do
        echo "generate bf16 $tp: $(timeout 60 ./moeserve generate --model /tmp/tiny --device cuda $tp \
          --prompt-ids 1,2,3,4,5 --max-tokens 12 2>&1 | tail -1)"
        echo "generate fp8  $tp: $(timeout 60 ./moeserve generate --model /tmp/tiny8 --device cuda $tp \
          --prompt-ids 1,2,3,4,5 --max-tokens 12 2>&1 | tail -1)"
      done
      echo "refusal: $(./moeserve generate --model /tmp/tiny --device cuda -tp 4 --prompt-ids 1 2>&1 | tail -1)"
      serve_one /tmp/tiny 18131 -tp 2
      serve_one /tmp/tiny8 18132 -tp 2 --enable-expert-parallel
      grep -E "COMPLETION|client rc|tensor-parallel|rror" "$OUT/serve.log" | cut -c1-400 | head -12
      stamp serve done ;;
    bench)
      p2p_ok=0; grep -q "^\[  PASSED  \] 1 test" "$OUT/test_p2p.log" 2>/dev/null && p2p_ok=1
      for cfg in "nccl:" "p2p:" "p2p:--enable-expert-parallel" "nccl:--enable-expert-parallel"; do
        ar=${cfg%%:*}; ep=${cfg#*:}
        if [ "$ar" = p2p ] && [ $p2p_ok = 0 ]; then echo "bench $cfg skipped (p2p test did not pass)"; continue; fi
        tag=tp2${ep:+_ep}_$ar
        MOESERVE_P2P_ALLREDUCE=$([ "$ar" = p2p ] && echo 1 || echo 0) timeout 150 ./moeserve bench-model \
          --synthetic minimax-m2.5 -tp 2 $ep --layers "$LAYERS" --batch-sizes 1 8 64 --contexts 1024 --iters 10 \
          --json "$OUT/bench_$tag.json" > "$OUT/bench_$tag.log" 2>&1
        echo "bench $tag rc=$?"; grep -E "^TP=|^batch|^[0-9]+ |rror" "$OUT/bench_$tag.log" | head -8
        stamp bench $tag done
      done ;;
    tput)  # batches 64-256: the KV of 256 x 1k does not fit next to 62 layers, so TPUT_LAYERS
      for ep in "" "--enable-expert-parallel"; do
        tag=tp2${ep:+_ep}_tput
        timeout 150 ./moeserve bench-model --synthetic minimax-m2.5 -tp 2 $ep --layers "${TPUT_LAYERS:-24}" \
          --batch-sizes 64 128 256 --contexts 1024 --iters 5 --json "$OUT/bench_$tag.json" > "$OUT/bench_$tag.log" 2>&1
        echo "bench $tag rc=$?"; grep -E "^TP=|^batch|^[0-9]+ |rror" "$OUT/bench_$tag.log" | head -8
        stamp bench $tag done
      done ;;
  esac
done
