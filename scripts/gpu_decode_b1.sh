#!/usr/bin/env bash
# Device run for the batch-1 decode work (branch decode_b1): optional tests, the 30-layer
# bench, 10-layer batch-1 A/B variants (env switches) and an ncu kernel listing of decode steps.
#   cd <pack> && OUT=/dir STEPS="tests bench ab ncu" ./gpu_decode_b1.sh
# AB: list of name=ENV=VAL[,ENV2=VAL2] entries (10 layers, batch 1 unless AB_BATCH).
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
STEPS=${STEPS:-"bench ab ncu"}
BUDGET=${BUDGET:-220}
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
stamp() { echo "[gpu +$(el)s] $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
if has tests; then
  timeout 100 ./test_cuda_ops --gtest_color=no ${OPS_FILTER:+--gtest_filter=$OPS_FILTER} > "$OUT/tests.log" 2>&1
  echo "test_cuda_ops rc=$?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure" "$OUT/tests.log" | sort | uniq -c | head -20
  # head_dim-128 fixture (the fused decode attention path) for the graphs-vs-eager test
  [ -f tests/fixtures/golden/tiny_d128_fp8/config.json ] || ./moeserve make-tiny tests/fixtures/golden/tiny_d128_fp8 --fp8 \
    --block-size 128 --hidden-size 256 --num-heads 12 --num-kv-heads 2 --head-dim 128 --rotary-dim 64 --intermediate-size 256 > /dev/null
  MOESERVE_SOURCE_DIR=$PWD timeout 60 ./test_cuda_graphs --gtest_color=no > "$OUT/graphs.log" 2>&1
  echo "test_cuda_graphs rc=$?"; grep -E "^\[  (PASSED|FAILED) |Failure|rel" "$OUT/graphs.log" | head -8
  MOESERVE_SOURCE_DIR=$PWD timeout 60 ./test_cuda_golden --gtest_color=no > "$OUT/golden.log" 2>&1
  echo "test_cuda_golden rc=$?"; grep -E "^\[  (PASSED|FAILED) |Failure" "$OUT/golden.log" | head -6
  if [ -x scripts/golden_cuda_check.sh ] && has golden; then
    timeout 60 scripts/golden_cuda_check.sh > "$OUT/golden_script.log" 2>&1; echo "golden script rc=$?"; tail -8 "$OUT/golden_script.log"
  fi
  stamp tests
fi
if has bench; then
  timeout 90 ./moeserve bench-model --synthetic minimax-m2.5 --layers 30 --batch-sizes ${BENCH_BATCHES:-1 8 64} --contexts 1024 \
    --prefill-tokens 0 --iters 20 ${BENCH_EXTRA:-} --json "$OUT/bench30.json" > "$OUT/bench30.log" 2>&1
  echo "bench30 rc=$?"; grep -E "^(batch|[0-9]+ +[0-9]+ )|rror|^profile|^  " "$OUT/bench30.log" | head -40
  stamp bench
fi
if has ncu && command -v ncu >/dev/null; then
    # One batch-1 decode graph (node profiling: each kernel alone, so no PDL overlap).
  timeout ${NCU_T:-60} ncu --clock-control none --graph-profiling node --csv --page raw --print-units base \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
    -k regex:'gemv|attention|attn|route|norm|rope|combine|embed|kv_kernel' \
    ./moeserve bench-model --synthetic minimax-m2.5 --layers 2 --batch-sizes 1 --contexts 1024 --prefill-tokens 0 --iters 1 \
    > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
  echo "ncu rc=$?"
  python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
if not rows: print("ncu: no rows"); sys.exit()
h = rows[0]; data = rows[2:] if len(rows) > 2 and rows[1][0] == "" else rows[1:]
def col(name): return h.index(name) if name in h else None
ki, ti, rb, wb, gs, bs, rg = (col(x) for x in ["Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum", "launch__grid_size", "launch__block_size", "launch__registers_per_thread"])
tail = data[-int(__import__('os').environ.get('NCU_TAIL', '40')):]
print("kernel | us | DRAM read MB | GB/s | grid | block | regs")
for r in tail:
    try:
        t = float(r[ti].replace(',', '')); b = float(r[rb].replace(',', ''))
    except Exception: continue
    # base units: nanoseconds and bytes
    print(f"{r[ki][:60]} | {t/1e3:.1f} | {b/1e6:.2f} | {b/t if t else 0:.0f} | {r[gs]} | {r[bs]} | {r[rg]}")
PY
  stamp ncu
fi
if has ab; then
  for entry in ${AB:-base=MOESERVE_X=1}; do
    [ "$(el)" -gt "$BUDGET" ] && { echo "ab: out of time before $entry"; break; }
    name=${entry%%=*}; envs=${entry#*=}
    batch=${AB_BATCH:-1}; [[ $name == b64_* ]] && batch=64; [[ $name == b8_* ]] && batch=8
    env ${envs//,/ } timeout 40 ./moeserve bench-model --synthetic minimax-m2.5 --layers 10 --batch-sizes $batch \
      --contexts 1024 --prefill-tokens 0 --iters 30 > "$OUT/ab_$name.log" 2>&1
    printf "ab %-14s %s\n" "$name" "$(grep -E '^[0-9]+ +[0-9]+ ' "$OUT/ab_$name.log" | awk '{printf "B=%s %s ms; ", $1, $3}')"
  done
  stamp ab
fi
