#!/usr/bin/env bash
# Regenerates the kernel selectors' tables from the binary (no GPU needed):
# tests/fixtures/dispatch/<model>.<profile>.txt (`bench-model --explain-dispatch`) and the
# generated op table of src/backend/cuda/README.md (`--explain-dispatch --markdown`).
# test_explain_dispatch (label unit) fails until they are regenerated after a dispatch change.
#   scripts/gen_dispatch_tables.sh [path/to/moeserve]   (default: build-cuda/moeserve, else build/moeserve)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build-cuda/moeserve}
[ -x "$BIN" ] || BIN=build/moeserve
mkdir -p tests/fixtures/dispatch
for m in minimax-m2.5 kimi-k2.5 deepseek-v3; do
  for p in h200 sm120; do
    "$BIN" bench-model --explain-dispatch --synthetic "$m" --device-profile "$p" > "tests/fixtures/dispatch/$m.$p.txt"
  done
done
"$BIN" bench-model --explain-dispatch --markdown > /tmp/explain_dispatch_section.$$
python3 - /tmp/explain_dispatch_section.$$ src/backend/cuda/README.md <<'PY'
import sys
section = open(sys.argv[1]).read()
path = sys.argv[2]
text = open(path).read()
begin = section.splitlines()[0]
end = section.rstrip("\n").splitlines()[-1]
placeholder = "GENERATED_SECTION_PLACEHOLDER\n"
if placeholder in text:
    text = text.replace(placeholder, section)
else:
    a, b = text.index(begin), text.index(end) + len(end) + 1
    text = text[:a] + section + text[b:]
open(path, "w").write(text)
PY
rm -f /tmp/explain_dispatch_section.$$
echo "wrote tests/fixtures/dispatch/*.txt and src/backend/cuda/README.md's generated section"
