#!/usr/bin/env bash
# README run command: installs the runtime dependencies (no test tools, no pip), builds only
# the `moeserve` binary (CPU, no tests, no benchmarks; build-run/), creates the built-in tiny
# model and serves it on CPU at http://127.0.0.1:${PORT:-8000} (OpenAI-compatible API).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --runtime
B=${BUILD_DIR:-build-run}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOESERVE_CUDA=OFF -DMOESERVE_TESTS=OFF \
  -DMOESERVE_BENCH=OFF -DMOESERVE_TEST_BACKENDS=OFF
cmake --build "$B" --target moeserve -j "${JOBS:-$(nproc)}"
TINY=${TINY_DIR:-$B/tiny-model}
"./$B/moeserve" make-tiny "$TINY"
exec "./$B/moeserve" serve "$TINY" --served-model-name tiny-minimax-m2 --device cpu \
  --host 127.0.0.1 --port "${PORT:-8000}" "$@"
