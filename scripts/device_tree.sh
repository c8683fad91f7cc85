#!/usr/bin/env bash
# The device tool copies the working tree (tracked files + carried paths, 64 MiB in all); the
# demo model and the shared tokenizer fixtures make the tracked files alone larger than that.
#   scripts/device_tree.sh slim      moves the large tracked folders the GPU checks do not read
#                                    to $STASH (default /tmp/moeserve-device-stash)
#   scripts/device_tree.sh restore   puts them back (git status must then be clean of them)
# KEEP="tests/fixtures/shared-data/tokenizers/qwen3" keeps a folder a GPU script needs; with
# KEEP="assets/demo-model" its FP8 copy and loss plot still move (test_cuda_spec reads the bf16
# model and eagle3/ only).
set -euo pipefail
cd "$(dirname "$0")/.."
STASH=${STASH:-/tmp/moeserve-device-stash}
BIG=(assets/demo-model wip tests/fixtures/shared-data/tokenizers/qwen3 tests/fixtures/shared-data/tokenizers/deepseek-v3
     docs/bench assets/demo-model/fp8 assets/demo-model/loss.png tests/fixtures/golden)
case "${1:-}" in
  slim)
    [ ! -f "$STASH/MANIFEST" ] || { echo "$STASH holds an earlier slim: run restore first" >&2; exit 1; }
    rm -rf "$STASH"; mkdir -p "$STASH"
    for d in "${BIG[@]}"; do
      case " ${KEEP:-} " in *" $d "*) continue;; esac
      [ -e "$d" ] || continue
      mkdir -p "$STASH/$(dirname "$d")"; mv "$d" "$STASH/$d"; echo "$d" >> "$STASH/MANIFEST"; echo "moved $d"
    done;;
  restore)
    # Exactly what slim moved, last first (a folder kept with KEEP may hold moved children).
    [ -f "$STASH/MANIFEST" ] || { echo "nothing to restore ($STASH/MANIFEST missing)"; exit 0; }
    tac "$STASH/MANIFEST" | while read -r d; do
      [ -e "$STASH/$d" ] || { echo "missing in the stash: $d" >&2; continue; }
      mkdir -p "$(dirname "$d")"; rm -rf "$d"; mv "$STASH/$d" "$d"; echo "restored $d"
    done
    rm -f "$STASH/MANIFEST";;
  *) echo "usage: $0 slim|restore" >&2; exit 2;;
esac
