#!/usr/bin/env bash
# One device run for the decode-path work (branch decode1): CUDA op tests, the CUDA golden
# test, then bench-model A/B over the two switches (env):
#   MOESERVE_PDL=0              programmatic dependent launch off
#   MOESERVE_DECODE_FUSION=0    fused decode ops off (router top-k + norm, MoE direct pairs + combine,
#                               norm + q/k/v in one launch, qk_norm_rope + write_kv, attention
#                               combine, L2 expert prefetch); MOESERVE_DECODE_OFF=a,b single ones
# Run inside the pack dir (scripts/gpu_pack.sh output plus this script): OUT=/dir ./gpu_decode_ab.sh
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
LAYERS=${LAYERS:-30}
start=$(date +%s)
stamp() { echo "[gpu +$(( $(date +%s) - start ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 150 ./test_cuda_ops --gtest_color=no > "$OUT/tests.log" 2>&1
echo "test_cuda_ops rc=$?"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure" "$OUT/tests.log" | sort | uniq -c | head -30
stamp tests
MOESERVE_SOURCE_DIR=$PWD timeout 90 ./test_cuda_golden --gtest_color=no > "$OUT/golden.log" 2>&1
echo "test_cuda_golden rc=$?"
grep -E "^\[  (PASSED|FAILED) |Failure" "$OUT/golden.log" | head -10
stamp golden
bench() {  # name env... -- args
  local name=$1; shift
  env "$@" timeout 100 ./moeserve bench-model --synthetic minimax-m2.5 --layers "$LAYERS" --contexts 1024 \
    --prefill-tokens 0 --iters 20 ${BENCH_ARGS:-} --json "$OUT/bench_$name.json" > "$OUT/bench_$name.log" 2>&1
  echo "bench $name rc=$?"
  grep -E "^[0-9]+ +[0-9]+ |rror" "$OUT/bench_$name.log" | head -6
}
BENCH_ARGS="--batch-sizes 1 8 64 --profile 1" bench on MOESERVE_X=1
stamp on
BENCH_ARGS="--batch-sizes 1 8" bench allon MOESERVE_DECODE_ON=attn,norm_qkv,norm_route
BENCH_ARGS="--batch-sizes 1 64" bench off MOESERVE_PDL=0 MOESERVE_DECODE_FUSION=0
stamp off
# Single switches (10 layers: a per-layer difference shows 10x; "on10" is the reference).
LAYERS=10 BENCH_ARGS="--batch-sizes 1" bench on10 MOESERVE_X=1
LAYERS=10 BENCH_ARGS="--batch-sizes 1" bench nopdl10 MOESERVE_PDL=0
LAYERS=10 BENCH_ARGS="--batch-sizes 1" bench nofusion10 MOESERVE_DECODE_FUSION=0
for f in attn norm_qkv norm_route l2pf; do
  LAYERS=10 BENCH_ARGS="--batch-sizes 1" bench "with_$f" MOESERVE_DECODE_ON=$f
done
for f in router moe qkv qk_kv; do
  LAYERS=10 BENCH_ARGS="--batch-sizes 1" bench "no_$f" MOESERVE_DECODE_OFF=$f
done
stamp done
echo "=== profile (on, batch 1) ==="
sed -n '/^profile/,/^$/p' "$OUT/bench_on.log" | head -30
