#!/usr/bin/env bash
# Packs what scripts/gpu_masks_check.sh needs into .gpumasks/ (git-ignored; carry it): the
# CUDA moeserve binary and the GPU mask tests of ./build (or $BUILD_DIR; scripts/build.sh
# builds archs 80;90a), yaml-cpp, the MiniMax-M2.5 config with Qwen3's tokenizer padded to its
# vocab_size (as gpu_serve_pack.sh: a real byte-level BPE vocabulary for the grammar masks)
# and the benchmark's JSON schema (bench/schemas/records_array.json).
#   scripts/gpu_masks_pack.sh here, then there:  cd .gpumasks && OUT=/dir ./gpu_masks_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
CFG=${M25_CONFIG:-../shared/data/models/minimax-m2.5/config.json}
[ -f "$CFG" ] || CFG=/work/shared/data/models/minimax-m2.5/config.json
rm -rf .gpumasks && mkdir -p .gpumasks/lib .gpumasks/model
# WITH_SAMPLING=1: also test_cuda_device_sampling (the unmasked sampling regression); off by
# default to stay well inside the device call's 64 MiB.
BINS=(moeserve tests/cuda/test_cuda_device_masks)
[ -z "${WITH_SAMPLING:-}" ] || BINS+=(tests/cuda/test_cuda_device_sampling)
for b in "${BINS[@]}"; do cp "$B/$b" .gpumasks/; done
for b in .gpumasks/moeserve .gpumasks/test_cuda_*; do strip --strip-unneeded "$b"; xz -T2 -6 "$b"; done
cp -L /usr/lib/x86_64-linux-gnu/libyaml-cpp.so.0.7 .gpumasks/lib/
cp "$CFG" .gpumasks/model/config.json
TOK=tests/fixtures/shared-data/tokenizers/qwen3
VOCAB=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$CFG")
python3 scripts/pad_tokenizer.py "$TOK/tokenizer.json" "$VOCAB" .gpumasks/model/tokenizer.json
cp "$TOK/tokenizer_config.json" .gpumasks/model/
xz -T2 -6 .gpumasks/model/tokenizer.json
cp bench/schemas/records_array.json scripts/gpu_masks_check.sh .gpumasks/
{ git rev-parse HEAD; git status --porcelain --untracked-files=no | grep -q . && echo '(uncommitted changes)'; } > .gpumasks/REVISION || true
du -sh .gpumasks
