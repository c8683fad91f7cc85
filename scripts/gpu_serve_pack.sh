#!/usr/bin/env bash
# Packs what scripts/gpu_serve_bench.sh needs into .gpuserve/ (git-ignored; carry it): the
# CUDA moeserve binary of ./build (or $BUILD_DIR), the libraries the GPU image lacks
# (yaml-cpp), and a model folder with the MiniMax-M2.5 config and a stand-in tokenizer:
# Qwen3's padded to the config's vocab_size (scripts/pad_tokenizer.py), so every id the random
# weights generate detokenizes to text and each SSE chunk carries one token (honest ITL).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
CFG=${M25_CONFIG:-../shared/data/models/minimax-m2.5/config.json}
[ -f "$CFG" ] || CFG=/work/shared/data/models/minimax-m2.5/config.json
rm -rf .gpuserve && mkdir -p .gpuserve/lib .gpuserve/model
cp "$B/moeserve" scripts/gpu_serve_bench.sh .gpuserve/
strip --strip-unneeded .gpuserve/moeserve
# The device call carries the whole repo (64 MiB in all): ship the binary compressed and take
# the tokenizer from the repo's fixtures there.
xz -T2 -6 .gpuserve/moeserve
cp -L /usr/lib/x86_64-linux-gnu/libyaml-cpp.so.0.7 .gpuserve/lib/
cp "$CFG" .gpuserve/model/config.json
TOK=tests/fixtures/shared-data/tokenizers/qwen3
VOCAB=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$CFG")
python3 scripts/pad_tokenizer.py "$TOK/tokenizer.json" "$VOCAB" .gpuserve/model/tokenizer.json
cp "$TOK/tokenizer_config.json" .gpuserve/model/
xz -T2 -6 .gpuserve/model/tokenizer.json
cp scripts/gpu_itl_bench.sh .gpuserve/
# The revision the binary was built from (benchmarks state it).
{ git rev-parse HEAD; git status --porcelain --untracked-files=no | grep -q . && echo '(uncommitted changes)'; } > .gpuserve/REVISION || true
du -sh .gpuserve
