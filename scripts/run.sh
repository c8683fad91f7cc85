#!/usr/bin/env bash
# README run command: installs dependencies, builds, creates the built-in tiny model and
# serves it on CPU at http://127.0.0.1:${PORT:-8000} (OpenAI-compatible API).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
TINY=${TINY_DIR:-build/tiny-model}
./build/moeserve make-tiny "$TINY"
exec ./build/moeserve serve "$TINY" --served-model-name tiny-minimax-m2 --device cpu \
  --host 127.0.0.1 --port "${PORT:-8000}" "$@"
