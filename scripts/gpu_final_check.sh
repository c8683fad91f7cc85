#!/usr/bin/env bash
# The whole GPU verification of one revision in one device call (~4 minutes on 2 x H200; on one
# GPU the two lanes share it and the benchmark runs alone after them). Prebuilt binaries and scripts from
# scripts/gpu_pack.sh in the current directory; FIXTURES = a tests/fixtures/golden directory.
#   GPU 0: test_cuda_ops shards 0,1 of 4 in parallel with the real-shape HF check (seed 1234),
#          then test_cuda_golden + golden_cuda_check.sh, sweep_vs_hf.py --device cuda (100 random
#          tiny checkpoints vs HF, MiniMax-M2 and Qwen3-MoE), test_cuda_graphs, test_cuda_decode_layer
#   GPU 1: test_cuda_ops shards 2,3, then bench-model alone on the GPU (30 layers, batch 1 8 64,
#          ctx 1k and 8k, 8k prefill, profile of batch 1; on one GPU: after both lanes), test_cuda_device_sampling, serve --device cuda
#   both:  test_nccl and serve -tp 2 (+EP) (gpu_multigpu_check.sh nccl serve)
# Usage: cd .gpubin && OUT=/dir [FIXTURES=/repo/tests/fixtures/golden] ./gpu_final_check.sh
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"  # yaml-cpp from gpu_pack.sh
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$(date +%s)
stamp() { echo "[gpu +$(( $(date +%s) - start ))s] $*"; }
NG=$(nvidia-smi -L | wc -l)
G1=$(( NG > 1 ? 1 : 0 ))
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
# Fixtures as a writable copy under ./tests/fixtures/golden (the tests and golden_cuda_check.sh
# read them from there; test_cuda_graphs also uses a generated head_dim-128 FP8 model).
SRC=$PWD
if [ -n "${FIXTURES:-}" ]; then rm -rf tests/fixtures/golden; mkdir -p tests/fixtures; cp -rL "$FIXTURES" tests/fixtures/golden; fi
./moeserve make-tiny $SRC/tests/fixtures/golden/tiny_d128_fp8 --fp8 --block-size 128 --hidden-size 256 --num-heads 12 \
  --num-kv-heads 2 --head-dim 128 --rotary-dim 64 --intermediate-size 256 > /dev/null
shard() {  # gpu index
  CUDA_VISIBLE_DEVICES=$1 GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$2 timeout 200 ./test_cuda_ops --gtest_color=no \
    > "$OUT/ops_shard$2.log" 2>&1
  echo "test_cuda_ops shard $2/4 rc=$? ($(grep -cE '^\[       OK \]' "$OUT/ops_shard$2.log") OK)"
}
# The model benchmark runs alone on its GPU: on a one-GPU machine after both lanes.
bench() {
  CUDA_VISIBLE_DEVICES=$G1 timeout 150 ./moeserve bench-model --synthetic minimax-m2.5 --layers 30 --batch-sizes 1 8 64 \
    --contexts 1024 8192 --profile 1 --json "$OUT/bench30.json" > "$OUT/bench30.log" 2>&1
  echo "bench-model rc=$?"
}
lane0() {
  shard 0 0 & shard 0 1 &
  if [ -x scripts/realshape_check.sh ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 150 env BIN=$PWD/moeserve REPLAY=$PWD/realshape_replay OUT="$OUT/realshape" \
      CK=/tmp/final_ck LAYERS=3 SEED=1234 scripts/realshape_check.sh > "$OUT/realshape.log" 2>&1
    echo "realshape rc=$?"; rm -rf /tmp/final_ck
  fi
  wait
  CUDA_VISIBLE_DEVICES=0 MOESERVE_SOURCE_DIR=$SRC timeout 60 ./test_cuda_golden --gtest_color=no > "$OUT/golden_gtest.log" 2>&1
  echo "test_cuda_golden rc=$?"
  CUDA_VISIBLE_DEVICES=0 BIN=$PWD/moeserve OUT=/tmp/final_golden timeout 60 scripts/golden_cuda_check.sh \
    > "$OUT/golden_script.log" 2>&1
  echo "golden_cuda_check rc=$?"
  # Randomised tiny checkpoints (odd shapes, dtypes, FP8 block sizes, rope spellings) vs HF
  # transformers on --device cuda (scripts/sweep_vs_hf.py; needs torch + transformers here).
  if [ -f scripts/sweep_vs_hf.py ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 scripts/sweep_vs_hf.py --bin "$PWD/moeserve" --device cuda \
      --cases "${SWEEP_CASES:-100}" --seed 1 2>&1 | grep -v "Loading weights" > "$OUT/sweep_cuda.log"
    echo "sweep_vs_hf --device cuda rc=${PIPESTATUS[0]}"
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 scripts/sweep_vs_hf.py --arch qwen3_moe --bin "$PWD/moeserve" --device cuda \
      --cases "${SWEEP_CASES:-100}" --seed 1 2>&1 | grep -v "Loading weights" > "$OUT/sweep_qwen3_cuda.log"
    echo "sweep_vs_hf --arch qwen3_moe --device cuda rc=${PIPESTATUS[0]}"
  fi
  CUDA_VISIBLE_DEVICES=0 MOESERVE_SOURCE_DIR=$SRC timeout 60 ./test_cuda_graphs --gtest_color=no > "$OUT/graphs.log" 2>&1
  echo "test_cuda_graphs rc=$?"
  if [ -x ./test_cuda_decode_layer ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 60 ./test_cuda_decode_layer --gtest_color=no > "$OUT/decode_layer.log" 2>&1
    echo "test_cuda_decode_layer rc=$?"
  fi
}
lane1() {
  shard $G1 2 & shard $G1 3 & wait
  [ "$NG" -ge 2 ] && bench
  CUDA_VISIBLE_DEVICES=$G1 timeout 60 ./test_cuda_device_sampling --gtest_color=no > "$OUT/device_sampling.log" 2>&1
  echo "test_cuda_device_sampling rc=$?"
  CUDA_VISIBLE_DEVICES=$G1 OUT="$OUT/serve" STEPS=serve timeout 60 ./gpu_prebuilt_check.sh > "$OUT/serve_step.log" 2>&1
  echo "serve step rc=$?"
}
lane0 > "$OUT/lane0.txt" 2>&1 &
lane1 > "$OUT/lane1.txt" 2>&1 &
wait
stamp lanes done
cat "$OUT/lane0.txt" "$OUT/lane1.txt"
[ "$NG" -lt 2 ] && bench
if [ "$NG" -ge 2 ]; then
  OUT="$OUT/multi" STEPS="nccl serve" timeout 90 ./gpu_multigpu_check.sh > "$OUT/multi.log" 2>&1
  echo "multigpu rc=$?"; grep -E "PASSED|FAILED|rc=|answered|refus" "$OUT/multi.log" | head -20
fi
stamp multi done
echo "--- summary"
cat "$OUT"/ops_shard*.log | grep -E "^\[  FAILED  \] [A-Za-z]" | sort -u | head -20
grep -E "^\[  (PASSED|FAILED) " "$OUT"/ops_shard*.log
grep -E "^\[  (PASSED|FAILED) |golden cuda\] .*: " "$OUT/golden_gtest.log" | head -8
tail -6 "$OUT/golden_script.log"
grep -E "FAIL|excused|ill-conditioned|failed" "$OUT/sweep_cuda.log" 2>/dev/null | head -12
grep -E "^\[graphs|^\[  (PASSED|FAILED) " "$OUT/graphs.log" | head -12
grep -E "^\[  (PASSED|FAILED) " "$OUT/device_sampling.log"
grep -E "^\[  (PASSED|FAILED) " "$OUT/decode_layer.log" 2>/dev/null
grep -E "^(batch|[0-9]+ +[0-9]+ )|prefill 8192|roofline:|copy|profile|^  [a-z_]+ " "$OUT/bench30.log" | head -40
grep -E "rows|bound|PASS|FAIL|ok" "$OUT/realshape.log" 2>/dev/null | tail -8
grep -E "completion|chat|concurrent" "$OUT/serve/serve.log" 2>/dev/null | cut -c1-200 | head -4
stamp done
