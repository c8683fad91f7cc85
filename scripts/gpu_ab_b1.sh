#!/usr/bin/env bash
# Batch-1 A/B round on one GPU: selected GTests, then traced 10-layer steps (kernel timeline,
# diagnostic build) and plain 30-layer bench-model runs for each variant given as
# "tag:ENV=V,ENV=V" arguments (tag "default" for none). Results packed into $OUT/ab.tgz.
#   BIN=dir-with-moeserve,moeserve_kt,test_cuda_ops  GTEST_FILTER=...  OUT=... gpu_ab_b1.sh v1 v2 ...
set -u
BIN=${BIN:-$PWD}
R=${OUT:?}/ab
mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$R/gpu.txt" 2>&1
if [ -n "${GTEST_FILTER:-}" ] && [ -x "$BIN/test_cuda_ops" ]; then
  (cd "${FIXDIR:-$BIN}" && "$BIN/test_cuda_ops" --gtest_filter="$GTEST_FILTER" > "$R/gtest.log" 2>&1)
  echo "gtest rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$R/gtest.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$R/gtest.log" | head -20
fi
envs() { local spec=${1#*:}; [ "$spec" = "$1" ] && spec=""; echo "${spec//,/ }"; }
if [ -x "$BIN/moeserve_kt" ]; then
  for v in "$@"; do
    tag=${v%%:*}
    env $(envs "$v") MOESERVE_KTRACE_OUT="$R/kt_$tag" "$BIN/moeserve_kt" bench-model --synthetic minimax-m2.5 \
      --layers 10 --batch-sizes 1 --contexts 1024 --iters 20 > "$R/kt_$tag.log" 2>&1
    python3 "$BIN/ktrace_timeline.py" "$R/kt_${tag}_b1_c1024" 12 > "$R/kt_$tag.timeline.txt" 2>&1
    echo "trace $tag: $(grep -E '^1 ' "$R/kt_$tag.log")"
    sed -n '/^kernel/,$p' "$R/kt_$tag.timeline.txt"
  done
fi
if [ -x "$BIN/moeserve" ] && [ -n "${BENCH:-1}" ]; then
  for rep in 1 2; do
    for v in "$@"; do
      tag=${v%%:*}
      env $(envs "$v") "$BIN/moeserve" bench-model --synthetic minimax-m2.5 --layers 30 --batch-sizes ${BATCHES:-1 64} \
        --contexts 1024 --iters 20 --json "$R/b30_${tag}_$rep.json" > "$R/b30_${tag}_$rep.log" 2>&1
      echo "bench30 $tag rep $rep: $(grep -E '^(1|8|64) ' "$R/b30_${tag}_$rep.log" | tr -s ' ' | tr '\n' '|')"
    done
  done
fi
tar czf "$OUT/ab.tgz" -C "$OUT" ab && rm -rf "$R"
