#!/usr/bin/env bash
# The demo model's full run on one GPU (scripts/train_demo.py prepare + train), as one command.
# DOCS: where python3.11-doc was unpacked (dpkg -x), OUT: output folder; further arguments go to
# `train_demo.py train` (e.g. --steps N to repeat a run with the step count it recorded). The
# shipped tokenizer is kept (prepare --tokenizer), so token ids stay those of the fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."
DOCS=${1:?usage: train_demo_gpu.sh DOCS OUT [train args]}
OUT=${2:?usage: train_demo_gpu.sh DOCS OUT [train args]}
shift 2
export PYTHONUNBUFFERED=1
BUILD=$(mktemp -d)
python3 scripts/train_demo.py prepare --docs "$DOCS" --build "$BUILD" --tokenizer assets/demo-model
python3 scripts/train_demo.py train --build "$BUILD" --out "$OUT" "$@"
