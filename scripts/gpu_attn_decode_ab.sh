#!/usr/bin/env bash
# Fused decode attention A/B (k_attn_decode2.cu vs k_attn_decode.cu), steps in order:
#   tests        the attention test suites of test_cuda_ops
#   b:<variant>  10-layer bench (batch 1 and 8, ctx 1024 and 8192) with the variant's env
#   ncu:<v>:<ctx> ncu durations of the attention kernels alone (MOESERVE_ATTN_DECODE_V=<v>)
#   cd <pack> && OUT=/dir STEPS="tests b:v1 b:v2 ncu:1:1024 ncu:2:1024" ./gpu_attn_decode_ab.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); stamp() { echo "--- $1 at +$(( $(date +%s) - T0 )) s"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
B="./moeserve bench-model --synthetic minimax-m2.5 --layers 10 --batch-sizes 1 8 --contexts 1024 8192 --prefill-tokens 0 --iters 20"
B1="./moeserve bench-model --synthetic minimax-m2.5 --layers 10 --batch-sizes 1 --contexts 1024 8192 --prefill-tokens 0 --iters 20"
for step in ${STEPS:-tests b:v1 b:v2 ncu:1:1024 ncu:2:1024 ncu:1:8192 ncu:2:8192 b:v2s16 b:v2pull b:skip}; do
  case $step in
  tests)
    timeout ${TEST_T:-45} ./test_cuda_ops --gtest_filter="${TEST_FILTER:-*CudaQkNormRope*}" > "$OUT/tests.log" 2>&1
    echo "tests rc=$?"; grep -E "FAILED|Failure|rel_err|Expected|Which is|variant|version" "$OUT/tests.log" | head -40
    tail -3 "$OUT/tests.log";;
  timing)  # version 2's phase timer and back-to-back call times (diagnostic test)
    MOESERVE_ATTN_TIMING=1 timeout 30 ./test_cuda_ops --gtest_filter='CudaAttnDecodeTiming.*' > "$OUT/timing.log" 2>&1
    echo "timing rc=$?"; grep -E "^ctx|^  " "$OUT/timing.log";;
  b:*|b64:*)
    v=${step#*:}; BB=$B
    [ "${step%%:*}" = b64 ] && BB="./moeserve bench-model --synthetic minimax-m2.5 --layers 10 --batch-sizes 64 --contexts 1024 --prefill-tokens 0 --iters 20" && v=${v}_b64
    case ${v%_b64} in
      v1) E="MOESERVE_ATTN_DECODE_V=1";;
      v2) E="MOESERVE_ATTN_DECODE_V=2";;
      v2pull) E="MOESERVE_ATTN_DECODE_V=2 MOESERVE_ATTN_DECODE_MERGE=pull";;
      v2s16) E="MOESERVE_ATTN_DECODE_V=2 MOESERVE_ATTN_DECODE_SPLITS=16";;
      v2w4) E="MOESERVE_ATTN_DECODE_V=2 MOESERVE_ATTN_DECODE_WARPS=4";;
      v2w4pull) E="MOESERVE_ATTN_DECODE_V=2 MOESERVE_ATTN_DECODE_WARPS=4 MOESERVE_ATTN_DECODE_MERGE=pull";;
      v2w4s16) E="MOESERVE_ATTN_DECODE_V=2 MOESERVE_ATTN_DECODE_WARPS=4 MOESERVE_ATTN_DECODE_SPLITS=16";;
      v2s4) E="MOESERVE_ATTN_DECODE_V=2 MOESERVE_ATTN_DECODE_SPLITS=4";;
      v2pulls4) E="MOESERVE_ATTN_DECODE_V=2 MOESERVE_ATTN_DECODE_SPLITS=4 MOESERVE_ATTN_DECODE_MERGE=pull";;
      off) E="MOESERVE_ATTN_DECODE_MAX=0";;
      skip) E="MOESERVE_OP_REPEAT=attn:0"; BB=$B1;;  # attention skipped (time only)
      v1x2) E="MOESERVE_ATTN_DECODE_V=1 MOESERVE_OP_REPEAT=attn:2"; BB=$B1;;  # attention twice
      v2x2) E="MOESERVE_ATTN_DECODE_V=2 MOESERVE_OP_REPEAT=attn:2"; BB=$B1;;
      *) E="$v";;
    esac
    env $E timeout ${BENCH_T:-30} $BB --json "$OUT/bench_$v.json" > "$OUT/bench_$v.log" 2>&1
    echo "bench $v ($E) rc=$?"; grep -E "^(batch|[0-9]+ +[0-9]+ )|rror" "$OUT/bench_$v.log" | head -12;;
  ncu:*)
    v=${step#ncu:}; ctx=1024
    case $v in *:*) ctx=${v#*:}; v=${v%%:*};; esac
    command -v ncu >/dev/null || { echo "no ncu"; continue; }
    MOESERVE_ATTN_DECODE_V=$v timeout ${NCU_T:-25} ncu --clock-control none --graph-profiling node --csv --page raw --print-units base \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread \
      -k regex:'attn_decode' -c ${NCU_C:-4} \
      ./moeserve bench-model --synthetic minimax-m2.5 --layers 2 --batch-sizes 1 --contexts $ctx --prefill-tokens 0 --iters 1 \
      > "$OUT/ncu_v${v}_$ctx.csv" 2> "$OUT/ncu_v${v}_$ctx.err"
    echo "ncu v$v ctx $ctx rc=$?"
    python3 - "$OUT/ncu_v${v}_$ctx.csv" <<'PY'
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
    ;;
  esac
  stamp "$step"
done
