#!/usr/bin/env bash
# README run command: installs the runtime dependencies (no test tools, no pip), builds only
# the `moeserve` binary (CPU, no tests, no benchmarks; build-run/) and serves the built-in demo
# model (assets/demo-model: a small trained MiniMax-M2-architecture model, see its README) on
# CPU at http://127.0.0.1:${PORT:-8000} (OpenAI-compatible API), with MiniMax-M2's tool-call
# and reasoning parsers. Extra arguments go to `moeserve serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --runtime
B=${BUILD_DIR:-build-run}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOESERVE_CUDA=OFF -DMOESERVE_TESTS=OFF \
  -DMOESERVE_BENCH=OFF -DMOESERVE_TEST_BACKENDS=OFF
cmake --build "$B" --target moeserve -j "${JOBS:-$(nproc)}"
exec "./$B/moeserve" serve assets/demo-model --served-model-name moeserve-demo --device cpu \
  --host 127.0.0.1 --port "${PORT:-8000}" --enable-auto-tool-choice --tool-call-parser minimax_m2 \
  --reasoning-parser minimax_m2_append_think "$@"
