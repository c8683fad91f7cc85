#!/usr/bin/env bash
# Fused decode attention A/B (k_attn_decode2.cu vs k_attn_decode.cu): the attention test
# suites, 10-layer batch-1/8 bench at ctx 1024 and 8192 with MOESERVE_ATTN_DECODE_V=1 / 2 (and
# 16 splits), and ncu durations of the attention kernels alone.
#   cd <pack> && OUT=/dir ./gpu_attn_decode_ab.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); stamp() { echo "--- $1 at +$(( $(date +%s) - T0 )) s"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout ${TEST_T:-45} ./test_cuda_ops --gtest_filter='CudaQkNormRope*:*QkNormRopeAttention*' > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|rel_err|Expected|Which is|variant" "$OUT/tests.log" | head -40
tail -3 "$OUT/tests.log"
stamp tests
B="./moeserve bench-model --synthetic minimax-m2.5 --layers 10 --batch-sizes 1 8 --contexts 1024 8192 --prefill-tokens 0 --iters 20"
for v in ${VARIANTS:-v1 v2 v2s16}; do
  case $v in
    v1) E="MOESERVE_ATTN_DECODE_V=1";;
    v2) E="MOESERVE_ATTN_DECODE_V=2";;
    v2s16) E="MOESERVE_ATTN_DECODE_V=2 MOESERVE_ATTN_DECODE_SPLITS=16";;
    off) E="MOESERVE_ATTN_DECODE_MAX=0";;
  esac
  env $E timeout ${BENCH_T:-30} $B --json "$OUT/bench_$v.json" > "$OUT/bench_$v.log" 2>&1
  echo "bench $v rc=$?"; grep -E "^(batch|[0-9]+ +[0-9]+ )|rror" "$OUT/bench_$v.log" | head -12
  stamp "bench $v"
done
if command -v ncu >/dev/null; then
  for v in ${NCU_VARIANTS:-1 2}; do
    MOESERVE_ATTN_DECODE_V=$v timeout ${NCU_T:-25} ncu --clock-control none --graph-profiling node --csv --page raw --print-units base \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__cluster_dim_x,launch__registers_per_thread \
      -k regex:'attn_decode' -c 12 \
      ./moeserve bench-model --synthetic minimax-m2.5 --layers 2 --batch-sizes 1 --contexts 1024 8192 --prefill-tokens 0 --iters 1 \
      > "$OUT/ncu_v$v.csv" 2> "$OUT/ncu_v$v.err"
    echo "ncu v$v rc=$?"
    python3 - "$OUT/ncu_v$v.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 4]
if not rows: print("ncu: no rows"); sys.exit()
h = rows[0]; data = [r for r in rows[1:] if r[0] != ""]
c = lambda n: h.index(n) if n in h else None
ki, ti, rb, gs = c("Kernel Name"), c("gpu__time_duration.sum"), c("dram__bytes_read.sum"), c("launch__grid_size")
for r in data:
    try: t = float(r[ti].replace(',', '')); b = float(r[rb].replace(',', ''))
    except Exception: continue
    print(f"{r[ki][-40:]} | {t/1e3:.2f} us | {b/1e6:.2f} MB | {b/t if t else 0:.0f} GB/s | grid {r[gs]}")
PY
    stamp "ncu v$v"
  done
fi
