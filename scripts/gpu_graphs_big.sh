#!/usr/bin/env bash
# GPU check of the graphs_big work (prebuilt binaries: moeserve, test_cuda_graphs, test_nccl in
# this directory), on a 2 x H200 machine (single-GPU steps use GPU 0). Tiny checkpoints are made
# here with make-tiny under the fixture names the graph tests read (they compare two runs of
# the same weights, no reference logits needed).
#   tests   test_cuda_graphs (incl. CudaDecodeGraphsBig: buckets >= 128 capture the FP8 paths)
#           and test_nccl's NcclGraphs (TP=2 graphs vs padded eager / TP=1, rank-0 sampling)
#   bench   bench-model 16 layers, BATCHES (64 128 256), ctx 1k: MOESERVE_GRAPH_PREFILL_PATHS=0
#           MOESERVE_MOE_GEMV_MAX=128 (before: old kernels in graphs, old threshold) and default (after)
#   serve   generate -tp 2 with graphs vs --enforce-eager (ids), serve -tp 2 (one completion)
#   variant bench with MOESERVE_MOE_GEMV_MAX=128 / 192 (experts above it on the FP8 grouped GEMM)
#   diag    test_nccl TP=2 bf16 scenario with MOESERVE_PDL=0 / MOESERVE_DECODE_FUSION=0
#   tp      bench-model -tp 2 62 layers batch 1 8 64 (GPUs 0,1), graphs and --no-graphs (TPMODES)
# Usage: cd pack && OUT=/dir STEPS="tests bench serve" BUDGET=220 ./gpu_graphs_big.sh
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
STEPS=${STEPS:-tests bench serve}
BUDGET=${BUDGET:-220}
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
left() { echo $(( BUDGET - $(el) )); }
stamp() { echo "[+$(el)s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if ldd ./moeserve | grep -q "libnccl.*not found"; then
  for d in /usr/local/cuda/lib /usr/local/cuda/lib64 /usr/local/cuda-13*/lib /usr/lib/x86_64-linux-gnu; do
    if [ -e "$d/libnccl.so.2" ]; then export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; break; fi
  done
fi
F=tests/fixtures/golden
mkdir -p $F
./moeserve make-tiny --no-tokenizer --vocab-size 1000 $F/tiny_bf16 > /dev/null 2>&1
./moeserve make-tiny --no-tokenizer --vocab-size 1000 --fp8 $F/tiny_fp8_b128 > /dev/null 2>&1
./moeserve make-tiny --no-tokenizer --vocab-size 1000 --fp8 --hidden-size 192 --intermediate-size 160 --head-dim 48 \
  $F/tiny_fp8_partial > /dev/null 2>&1
export MOESERVE_SOURCE_DIR=$PWD
bench16() {  # tag env...
  local tag=$1; shift
  [ "$(left)" -lt 30 ] && { echo "bench $tag skipped (budget)"; return; }
  local t=$(( $(left) < 100 ? $(left) : 100 ))
  env "$@" CUDA_VISIBLE_DEVICES=0 timeout "$t" ./moeserve bench-model --synthetic minimax-m2.5 --layers 16 \
    --batch-sizes ${BATCHES:-64 128 256} --contexts 1024 --prefill-tokens 0 --json "$OUT/bench16_$tag.json" \
    > "$OUT/bench16_$tag.log" 2>&1
  echo "bench16 $tag ($*) rc=$?"; grep -E "^[0-9]+ +1024|rror" "$OUT/bench16_$tag.log" | head -6
  stamp "bench $tag done"
}
for step in $STEPS; do
  case $step in
    tests)
      CUDA_VISIBLE_DEVICES=0 timeout 90 ./test_cuda_graphs --gtest_color=no > "$OUT/test_cuda_graphs.log" 2>&1
      echo "test_cuda_graphs rc=$?"
      grep -E "^\[graphs|^\[  (PASSED|FAILED) |Failure|Expected|Which is|FAILED  \]|rror" "$OUT/test_cuda_graphs.log" | head -40
      stamp tests graphs done
      timeout 90 ./test_nccl --gtest_color=no --gtest_filter='*NcclGraphs*' > "$OUT/test_nccl.log" 2>&1
      echo "test_nccl NcclGraphs rc=$?"
      grep -E "^\[nccl|^\[  (PASSED|FAILED) |Failure|Expected|Which is|FAILED  \]|rror" "$OUT/test_nccl.log" | head -30
      stamp tests nccl done
      if [ -x ./test_cuda_ops ]; then
        CUDA_VISIBLE_DEVICES=0 timeout 120 ./test_cuda_ops --gtest_color=no \
          --gtest_filter='*CudaMoeExperts*:*CudaPrefill*:*CudaGraph*:*CudaRouter*:*CudaLinear*' > "$OUT/test_cuda_ops.log" 2>&1
        echo "test_cuda_ops (MoE, prefill, graph, router, linear) rc=$?"
        grep -E "^\[  (PASSED|FAILED) |Failure|Expected|Which is|FAILED  \]|rror" "$OUT/test_cuda_ops.log" | head -30
        stamp tests ops done
      fi ;;
    diag)  # TP=2 bf16 expert-TP vs TP=1 with PDL off / decode fusions off
      for e in MOESERVE_PDL=0 MOESERVE_DECODE_FUSION=0; do
        env $e timeout 60 ./test_nccl --gtest_color=no --gtest_filter='*NcclGraphs.Tp2GraphsMatchEager/0' > "$OUT/diag_$e.log" 2>&1
        echo "diag $e rc=$?"; grep -E "^\[nccl" "$OUT/diag_$e.log" | head -4
      done
      stamp diag done ;;
    bench)
      bench16 before MOESERVE_GRAPH_PREFILL_PATHS=0 MOESERVE_MOE_GEMV_MAX=128
      bench16 after MOESERVE_GRAPH_PREFILL_PATHS=1 ;;
    variant)  # experts on the FP8 grouped GEMM from 129 / 193 rows (default: GEMV up to 256)
      BATCHES="192 256" bench16 gemv128 MOESERVE_MOE_GEMV_MAX=128
      BATCHES="192" bench16 gemv192 MOESERVE_MOE_GEMV_MAX=192 ;;
    serve)
      [ "$(left)" -lt 40 ] && { echo "serve skipped (budget)"; continue; }
      ./moeserve make-tiny /tmp/tiny > /dev/null 2>&1
      ./moeserve make-tiny --fp8 --num-kv-heads 4 /tmp/tiny8 > /dev/null 2>&1
      for m in /tmp/tiny /tmp/tiny8; do
        ep=""; [ $m = /tmp/tiny8 ] && ep=--enable-expert-parallel
        a=$(timeout 40 ./moeserve generate --model $m --device cuda --prompt-ids 1,2,3,4,5 --max-tokens 12 2>&1 | tail -1)
        b=$(timeout 40 ./moeserve generate --model $m --device cuda -tp 2 $ep --prompt-ids 1,2,3,4,5 --max-tokens 12 2>"$OUT/gen_tp2.log" | tail -1)
        c=$(timeout 40 ./moeserve generate --model $m --device cuda -tp 2 $ep --enforce-eager --prompt-ids 1,2,3,4,5 --max-tokens 12 2>&1 | tail -1)
        echo "generate $m: tp1 [$a] tp2 graphs [$b] tp2 eager [$c]"
        grep -iE "graph" "$OUT/gen_tp2.log" | head -3
      done
      ./moeserve serve /tmp/tiny --served-model-name tiny --device cuda --port 18141 --gpu-memory-utilization 0.2 -tp 2 \
        --max-num-seqs 8 > "$OUT/serve_server.log" 2>&1 &
      spid=$!
      python3 - >> "$OUT/serve.log" 2>&1 <<'PY'
import json, time, urllib.request, concurrent.futures as cf
base = "http://127.0.0.1:18141"
for _ in range(240):
    try:
        urllib.request.urlopen(base + "/health", timeout=1); break
    except Exception:
        time.sleep(0.25)
def one(i, temp):
    req = urllib.request.Request(base + "/v1/completions", json.dumps(
        {"model": "tiny", "prompt": "hello world %d" % i, "max_tokens": 16, "temperature": temp, "seed": i}).encode(),
        {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=60).read())
r = one(0, 0)
print("COMPLETION", json.dumps(r["choices"][0]), r["usage"])
with cf.ThreadPoolExecutor(6) as ex:
    rs = list(ex.map(lambda i: one(i, 0.8 if i % 2 else 0), range(6)))
print("CONCURRENT", [x["usage"]["completion_tokens"] for x in rs])
PY
      echo "serve -tp 2 client rc=$?"
      kill $spid; wait $spid 2>/dev/null
      cat "$OUT/serve_server.log" >> "$OUT/serve.log"
      grep -E "COMPLETION|CONCURRENT|graph|device sampl|rror" "$OUT/serve.log" | cut -c1-300 | head -12
      stamp serve done ;;
    tp)  # TPMODES: "graphs" and/or "eager" (--no-graphs: the eager rank step the executor ran before)
      for mode in ${TPMODES:-graphs eager}; do
        [ "$(left)" -lt 60 ] && { echo "tp bench $mode skipped (budget)"; continue; }
        flag=""; [ $mode = eager ] && flag=--no-graphs
        timeout $(( $(left) < 150 ? $(left) : 150 )) ./moeserve bench-model --synthetic minimax-m2.5 -tp 2 --layers ${TPLAYERS:-62} \
          --batch-sizes 1 8 64 --contexts 1024 --iters 10 $flag --json "$OUT/bench_tp2_$mode.json" > "$OUT/bench_tp2_$mode.log" 2>&1
        echo "bench tp2 $mode rc=$?"; grep -E "^TP=|^batch|^[0-9]+ |rror" "$OUT/bench_tp2_$mode.log" | head -8
        stamp tp $mode done
      done ;;
  esac
done
stamp all done
