#!/usr/bin/env bash
# Draft heads on the GPU machine (from a build tree with CUDA, or adapt BUILD to an unpacked
# .gpubin): the CUDA speculative tests (n-gram and the demo model's MTP / EAGLE-3 heads, greedy
# equal to plain decoding up to near-ties), then scripts/spec_bench.sh on cuda (spec off / mtp /
# eagle3 at concurrency 1, 8, 32). Results go to $OUT.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/spec_heads_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
MOESERVE_SOURCE_DIR=$PWD timeout 300 "$BUILD/tests/cuda/test_cuda_spec" > "$OUT/cuda_spec.txt" 2>&1
echo "test_cuda_spec: rc $?"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|on CUDA|drafts" "$OUT/cuda_spec.txt" | head -20
PYTHON=${PYTHON:-python3} timeout 1800 scripts/spec_bench.sh "$BUILD/moeserve" cuda "$OUT/bench" | tee "$OUT/bench.txt"
