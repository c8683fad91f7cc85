#!/usr/bin/env bash
# Builds the CUDA binaries here (the GPU machine lacks utf8proc and GTest, so binaries are
# built on the development machine and run there) and packs them with what the GPU checks
# need into .gpubin/ (git-ignored; carry it to the GPU machine).
#   scripts/gpu_pack.sh            then on the GPU machine:  cd .gpubin && OUT=/dir ./gpu_prebuilt_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda} scripts/build.sh -DMOESERVE_CUDA=ON -DMOESERVE_CUDA_ARCHS="${ARCHS:-90a}"
B=${BUILD_DIR:-build-cuda}
rm -rf .gpubin && mkdir -p .gpubin/tests/fixtures .gpubin/scripts
cp "$B/moeserve" .gpubin/
for t in "$B"/tests/cuda/test_cuda_*; do [ -x "$t" ] && [ -f "$t" ] && cp "$t" .gpubin/; done
if [ -f "$B/tests/dist/test_nccl" ]; then cp "$B/tests/dist/test_nccl" .gpubin/; fi
[ -f "$B/tests/cuda/realshape_replay" ] && cp "$B/tests/cuda/realshape_replay" .gpubin/
# Libraries the GPU image lacks (moeserve links yaml-cpp for --config); the check scripts put
# ./lib on LD_LIBRARY_PATH.
mkdir -p .gpubin/lib && cp -L /usr/lib/x86_64-linux-gnu/libyaml-cpp.so.0.7 .gpubin/lib/
cp scripts/gpu_regression.sh scripts/gpu_throughput_check.sh scripts/gpu_prebuilt_check.sh scripts/gpu_multigpu_check.sh scripts/gpu_final_check.sh scripts/gpu_fp8kv_check.sh .gpubin/
cp scripts/realshape_check.sh scripts/realshape_check.py .gpubin/scripts/
cp scripts/golden_cuda_check.sh scripts/sweep_vs_hf.py scripts/sweep_qwen3_moe.py .gpubin/scripts/
cp scripts/make_golden.py scripts/golden_qwen3_moe.py scripts/golden_deepseek_v3.py .gpubin/scripts/
# NOPACK_FIXTURES=1: leave the fixtures out (the device call carries the repo, which has them).
[ -n "${NOPACK_FIXTURES:-}" ] || cp -r tests/fixtures/golden .gpubin/tests/fixtures/
# STRIP=1: strip the binaries (smaller transfers).
[ -z "${STRIP:-}" ] || strip --strip-unneeded .gpubin/moeserve .gpubin/test_* .gpubin/realshape_replay 2>/dev/null || true
du -sh .gpubin
# XZ=1: also write .gpubin.tar.xz (the binaries share the CUDA backend's fatbin: ~155 MB of
# stripped binaries pack to ~8 MB with a large dictionary), for the device tool's 64 MiB limit.
# On the GPU machine: mkdir -p /tmp/p && tar xJf .gpubin.tar.xz -C /tmp/p
[ -z "${XZ:-}" ] || tar cf - -C .gpubin . | xz -T2 -6 --lzma2=dict=256MiB > .gpubin.tar.xz
