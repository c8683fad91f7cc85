#!/usr/bin/env bash
# GPU check of the persistent decode-layer kernel (run inside an unpacked .gpubin with
# moeserve, test_cuda_decode_layer, test_cuda_graphs, test_cuda_golden, scripts/):
# its GTest, the graph and golden tests with it on, and bench-model batch-1 decode with and
# without it (MOESERVE_DECODE_MEGA=0). LAYERS / CONTEXTS / BENCH_ENVS override the bench.
set -u
OUT=${OUT:-$PWD/mega_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
# Fixtures: the stored ones plus the generated head_dim-128 FP8 model (takes the kernel at batch 1).
mkdir -p fx/tests/fixtures/golden
for d in tests/fixtures/golden/*/; do ln -sfn "$(realpath "$d")" "fx/tests/fixtures/golden/$(basename "$d")"; done
./moeserve make-tiny fx/tests/fixtures/golden/tiny_d128_fp8 --fp8 --block-size 128 --hidden-size 256 --num-heads 12 \
  --num-kv-heads 2 --head-dim 128 --rotary-dim 64 --intermediate-size 256 > /dev/null
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout ${TEST_TIMEOUT:-120} ./test_cuda_decode_layer --gtest_color=no ${DL_FILTER:+--gtest_filter=$DL_FILTER} > "$OUT/decode_layer.log" 2>&1
  echo "test_cuda_decode_layer rc=$?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|FAILED  \]|Failure|^context|residual|near-tie|Expected|Which is|actual|refused|error" "$OUT/decode_layer.log" | head -70
  # (binaries that are in the pack; the pack size limit keeps some out of a round)
  if [ -x ./test_cuda_graphs ]; then
    MOESERVE_SOURCE_DIR=$PWD/fx timeout 60 ./test_cuda_graphs --gtest_color=no > "$OUT/graphs.log" 2>&1
    echo "test_cuda_graphs rc=$?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|max rel" "$OUT/graphs.log" | head -8
  fi
  if [ -x ./test_cuda_golden ]; then
    MOESERVE_SOURCE_DIR=$PWD/fx timeout 40 ./test_cuda_golden --gtest_color=no > "$OUT/golden.log" 2>&1
    echo "test_cuda_golden rc=$?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure" "$OUT/golden.log" | head -6
  fi
  # The golden fixtures through `moeserve generate` (none of them takes the kernel: head_dim < 128)
  # and the generated head_dim-128 FP8 model (takes it at batch 1) against the kernel-off run.
  BIN=./moeserve OUT="$OUT/golden" timeout 40 scripts/golden_cuda_check.sh > "$OUT/golden_script.log" 2>&1
  echo "golden_cuda_check rc=$?"; tail -7 "$OUT/golden_script.log"
  for m in 1 0; do
    MOESERVE_DECODE_MEGA=$m timeout 30 ./moeserve generate --device cuda --model fx/tests/fixtures/golden/tiny_d128_fp8 \
      --prompt-ids 1,2,3,4,5 --max-tokens 12 --json --dump-logits "$OUT/d128_mega$m.npy" > "$OUT/d128_mega$m.json" 2> "$OUT/d128_mega$m.err"
    echo "d128 generate mega=$m rc=$?"; grep -E "decode_layer" "$OUT/d128_mega$m.err" | head -2
  done
  python3 -c "
import numpy as np, json
a=np.load('$OUT/d128_mega1.npy'); b=np.load('$OUT/d128_mega0.npy')
print('d128 logits mega vs off: max|d|/max|ref| = %.3e' % (abs(a-b).max()/abs(b).max()))
print('d128 ids equal:', json.load(open('$OUT/d128_mega1.json')).get('generated_ids')==json.load(open('$OUT/d128_mega0.json')).get('generated_ids'))
"
fi
LAYERS=${LAYERS:-30}
CONTEXTS=${CONTEXTS:-1024 8192}
for envs in ${BENCH_ENVS:-MOESERVE_DECODE_MEGA=1 MOESERVE_DECODE_MEGA=0}; do
  tag=$(echo "$envs" | tr ',=' '__')
  env $(echo "$envs" | tr ',' ' ') timeout ${BENCH_TIMEOUT:-75} ./moeserve bench-model --synthetic minimax-m2.5 --layers "$LAYERS" \
    --batch-sizes ${BATCHES:-1} --contexts $CONTEXTS --prefill-tokens 0 --json "$OUT/bench_$tag.json" > "$OUT/bench_$tag.log" 2>&1
  echo "bench $envs rc=$?"; grep -E "^batch|^[0-9]" "$OUT/bench_$tag.log" | head -8; grep -iE "error|what\(\)|refus|decode_layer" "$OUT/bench_$tag.log" | head -3
done
