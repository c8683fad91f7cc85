#!/usr/bin/env bash
# Final device check for branch decode_b1 (one H200, < 3 min): the 30-layer bench (as issue 5
# measures it, then with a 300 ms warm-up per graph while nvidia-smi samples the SM clock),
# 10-layer A/B of the new paths, then the golden script, test_cuda_golden, test_cuda_graphs
# (with a generated head_dim-128 fixture) and test_cuda_ops.
#   cd <pack> && OUT=/dir ./gpu_decode_b1_final.sh
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
start=$(date +%s)
stamp() { echo "[gpu +$(( $(date +%s) - start ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw --format=csv,noheader -lms 50 > "$OUT/clocks.csv" 2>&1 &
smi=$!
B="./moeserve bench-model --synthetic minimax-m2.5 --contexts 1024 --prefill-tokens 0"
timeout 40 $B --layers 30 --batch-sizes 1 8 64 --iters 20 --json "$OUT/bench30.json" > "$OUT/bench30.log" 2>&1
echo "bench30 rc=$?"; grep -E "^(batch|[0-9]+ +[0-9]+ )" "$OUT/bench30.log"
echo "--- bench30 --warmup-ms 300 (SM clock samples in clocks.csv)"
timeout 40 $B --layers 30 --batch-sizes 1 8 64 --iters 20 --warmup-ms 300 --json "$OUT/bench30_warm.json" > "$OUT/bench30_warm.log" 2>&1
echo "bench30_warm rc=$?"; grep -E "^(batch|[0-9]+ +[0-9]+ )" "$OUT/bench30_warm.log"
kill "$smi" 2>/dev/null
awk -F', ' '{gsub(/ MHz/,"",$2); n++; s+=$2; if ($2>mx) mx=$2; if (mn==""||$2<mn) mn=$2} END {printf "SM clock samples %d: min %s max %s mean %.0f MHz\n", n, mn, mx, s/n}' "$OUT/clocks.csv"
stamp bench
ab() {  # name batch env...
  local name=$1 batch=$2; shift 2
  env "$@" timeout 20 $B --layers 10 --batch-sizes "$batch" --iters 30 > "$OUT/ab_$name.log" 2>&1
  printf "ab %-12s %s\n" "$name" "$(grep -E '^[0-9]+ +[0-9]+ ' "$OUT/ab_$name.log" | awk '{printf "B=%s %s ms; ", $1, $3}')"
}
ab base 1 MOESERVE_X=1
ab before 1 MOESERVE_ROUTE_OLD=1 MOESERVE_ATTN_DECODE_MAX=0 MOESERVE_GEMV_LD=0
ab ld0 1 MOESERVE_GEMV_LD=0
ab no_route 1 MOESERVE_OP_REPEAT=route:0
ab no_attn 1 MOESERVE_OP_REPEAT=attn:0
ab no_experts 1 MOESERVE_OP_REPEAT=experts:0
ab b64_base 64 MOESERVE_X=1
ab b64_before 64 MOESERVE_ATTN_DECODE_MAX=0 MOESERVE_GEMV_LD=0
ab b64_ld0 64 MOESERVE_GEMV_LD=0
stamp ab
BIN=./moeserve OUT="$OUT/golden" timeout 40 scripts/golden_cuda_check.sh > "$OUT/golden_script.log" 2>&1
echo "golden_cuda_check rc=$?"; cat "$OUT/golden_script.log" | tail -6
MOESERVE_SOURCE_DIR=$PWD timeout 40 ./test_cuda_golden --gtest_color=no ${GOLDEN_FILTER:+--gtest_filter=$GOLDEN_FILTER} > "$OUT/golden.log" 2>&1
echo "test_cuda_golden rc=$?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|golden cuda" "$OUT/golden.log" | head -8
./moeserve make-tiny tests/fixtures/golden/tiny_d128_fp8 --fp8 --block-size 128 --hidden-size 256 --num-heads 12 \
  --num-kv-heads 2 --head-dim 128 --rotary-dim 64 --intermediate-size 256 > /dev/null
MOESERVE_SOURCE_DIR=$PWD timeout 30 ./test_cuda_graphs --gtest_color=no > "$OUT/graphs.log" 2>&1
echo "test_cuda_graphs rc=$?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|max rel" "$OUT/graphs.log" | head -6
stamp golden+graphs
timeout 100 ./test_cuda_ops --gtest_color=no > "$OUT/tests.log" 2>&1
echo "test_cuda_ops rc=$?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/tests.log" | sort | uniq -c | head -20
grep -cE "^\[       OK \]" "$OUT/tests.log" | sed 's/^/tests OK: /'
stamp done
