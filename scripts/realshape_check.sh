#!/usr/bin/env bash
# Device-only real-shape check of the CUDA backend against Hugging Face transformers (needs a
# GPU with ~80 GB free, PyTorch and transformers >= 5 with MiniMaxM2ForCausalLM; not a ctest).
# Builds a random-weight checkpoint with the real MiniMax-M2.5 shapes (LAYERS layers, FP8
# 128x128 block-scaled, 200,064 vocab) on the GPU, gets HF float32 reference logits, then runs
# `moeserve generate --device cuda` (graphs, --enforce-eager, chunked prefill, fusions off) and
# the teacher-forced batched replay (realshape_replay, GPU-sampled twins) and compares; see
# scripts/realshape_check.py. Report: $OUT/realshape_report.{md,json}. Usage on the GPU machine:
#   BIN=build-cuda/moeserve REPLAY=build-cuda/tests/cuda/realshape_replay OUT=/dir scripts/realshape_check.sh
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-build-cuda/moeserve}
REPLAY=${REPLAY-build-cuda/tests/cuda/realshape_replay}
OUT=${OUT:-$PWD/realshape_out}
CK=${CK:-$PWD/realshape_ckpt}
LAYERS=${LAYERS:-3}
BOUND=${BOUND:-3e-2}
SEED=${SEED:-1234}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
t0=$(date +%s)
python3 "$HERE/realshape_check.py" make --dir "$CK" --layers "$LAYERS" --seed "$SEED" || { rm -rf "$CK"; exit 1; }
echo "make: $(( $(date +%s) - t0 )) s; checkpoint $(du -sh "$CK" | cut -f1)"
cp "$CK/reference.json" "$OUT/"
python3 "$HERE/realshape_check.py" check --dir "$CK" --bin "$BIN" ${REPLAY:+--replay "$REPLAY"} --out "$OUT" \
  --bound "$BOUND" ${ONLY:+--only $ONLY}
rc=$?
echo "total: $(( $(date +%s) - t0 )) s"
[ -n "${KEEP_CKPT:-}" ] || rm -rf "$CK"
exit $rc
