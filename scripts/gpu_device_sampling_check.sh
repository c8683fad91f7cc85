#!/usr/bin/env bash
# GPU sampling check, run inside the unpacked .gpubin on the GPU machine (scripts/gpu_pack.sh
# packs it): the CUDA sampling tests, then the server bench on a tiny checkpoint with
# MiniMax-M2's 200,064 vocabulary, GPU sampling vs --host-sampling. Results go to $OUT.
set -u
OUT=${OUT:-/tmp/gpusample_out}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")/.." && pwd)
BIN=$HERE/moeserve
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 90 "$HERE/test_cuda_ops" --gtest_filter='CudaSample.*' > "$OUT/cuda_sample.txt" 2>&1
echo "test_cuda_ops CudaSample.*: rc $?"; tail -3 "$OUT/cuda_sample.txt"
timeout 150 "$HERE/test_cuda_device_sampling" > "$OUT/device_sampling.txt" 2>&1
echo "test_cuda_device_sampling: rc $?"; grep -E "^\[  (FAILED|PASSED) |Failure|Expected|Which is|vocab" "$OUT/device_sampling.txt" | head -40
TINY=/tmp/gpusample_tiny200k
"$BIN" make-tiny "$TINY" --vocab-size 200064 --seed 1 > /dev/null 2>&1 || echo "make-tiny failed"
STREAMS=${STREAMS:-256}
TOKENS=${TOKENS:-128}
run() {  # streams temperature [--host-sampling]
  timeout 150 python3 "$HERE/bench/server_bench.py" --bin "$BIN" --model "$TINY" --device cuda \
    --streams "$1" --tokens "$TOKENS" --temperature "$2" ${3:-} 2> "$OUT/bench_err_$1_$2${3:-}.txt" \
    | tee -a "$OUT/bench.jsonl"
  grep -i error "$OUT/bench_err_$1_$2${3:-}.txt" | head -3
}
for temp in 1.0 0.0; do
  run "$STREAMS" "$temp"
  run "$STREAMS" "$temp" --host-sampling
done
run 32 1.0
run 32 1.0 --host-sampling
