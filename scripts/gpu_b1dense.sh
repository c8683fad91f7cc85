#!/usr/bin/env bash
# b1dense GPU request (one H200): the dense decode kernels' tests (k_gemv_dense.cu,
# k_route_dense.cu) and the old paths' suites, graph capture, then bench-model A/B of the
# switches on the same binary. Run inside the unpacked pack dir; results go to $OUT.
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/b1dense_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
F=${FILTER:-'*CudaLinear*:*CudaNorm*:*CudaRouter*:*CudaAddNorm*:*Dense*'}
t0=$SECONDS
timeout "${OPS_TIMEOUT:-45}" ./test_cuda_ops --gtest_filter="$F" > "$OUT/ops.txt" 2>&1
echo "test_cuda_ops rc=$? ($((SECONDS - t0)) s)"
grep -E "^\[  PASSED|^\[  FAILED|tests? ran|^.*Failure" "$OUT/ops.txt" | head -30
B="./moeserve bench-model --synthetic minimax-m2.5 --layers 10 --batch-sizes ${BATCHES:-1 8} --contexts 1024 --prefill-tokens 0 --iters 20 ${BENCH_EXTRA:-}"
run() {
  local name=$1
  shift
  t0=$SECONDS
  env "$@" timeout "${RUN_TIMEOUT:-25}" $B --json "$OUT/$name.json" > "$OUT/$name.txt" 2>&1
  echo "== $name ($*) rc=$? $((SECONDS - t0)) s: $(grep -E '^[0-9]+ +1024 ' "$OUT/$name.txt" | awk '{printf "B%s %s ms %s | ", $1, $3, $6}')"
}
for cfg in ${CONFIGS:-all old graphs noroute nonorm nodense_o}; do
  case $cfg in
    graphs)
      t0=$SECONDS
      timeout "${GRAPHS_TIMEOUT:-40}" ./test_cuda_graphs > "$OUT/graphs.txt" 2>&1
      echo "test_cuda_graphs rc=$? ($((SECONDS - t0)) s)"
      grep -E "^\[  PASSED|^\[  FAILED|tests? ran" "$OUT/graphs.txt" | head -10 ;;
    all) run all X=1 ;;
    old) run old MOESERVE_GEMV_DENSE_V=0 MOESERVE_GEMV_DENSE_O=0 MOESERVE_ROUTE_V=0 ;;
    noroute) run noroute MOESERVE_ROUTE_V=0 ;;
    nonorm) run nonorm MOESERVE_GEMV_DENSE_NORM=0 ;;
    nodense_o) run nodense_o MOESERVE_GEMV_DENSE_O=0 ;;
    nodense) run nodense MOESERVE_GEMV_DENSE_V=0 ;;
    r16) run r16 MOESERVE_GEMV_DENSE_R=16 ;;
    ncu_all | ncu_old)
      t0=$SECONDS
      envs=X=1
      [ $cfg = ncu_old ] && envs="MOESERVE_GEMV_DENSE_V=0 MOESERVE_ROUTE_V=0"
      env $envs timeout "${NCU_TIMEOUT:-40}" ncu --clock-control none -k 'regex:gemv|route|rms_norm|attn_decode' \
        --launch-count "${NCU_COUNT:-24}" --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
        ./moeserve bench-model --synthetic minimax-m2.5 --layers 3 --batch-sizes 1 --contexts 1024 \
        --prefill-tokens 0 --iters 1 > "$OUT/$cfg.csv" 2> "$OUT/$cfg.err"
      echo "== $cfg rc=$? $((SECONDS - t0)) s"
      grep -E '^"[0-9]' "$OUT/$cfg.csv" | awk -F'","' '{n=$5; gsub(/moeserve::cuda::|\(anonymous namespace\)::|void /, "", n); sub(/\(.*/, "", n); printf "%s %s grid %s %s %s\n", $1, substr(n, 1, 70), $9, $(NF-2), $NF}' | tr -d '"' | head -${NCU_LINES:-60} ;;
    r8) run r8 MOESERVE_GEMV_DENSE_R=8 ;;
    rw4) run rw4 MOESERVE_ROUTE_W=4 ;;
    nocarve) run nocarve MOESERVE_GEMV_DENSE_CARVEOUT=0 ;;
    v1) run v1 MOESERVE_GEMV_DENSE_V=1 ;;
    v2) run v2 MOESERVE_GEMV_DENSE_V=2 ;;
    v8) run v8 MOESERVE_GEMV_DENSE_V=8 ;;
    o1) run o1 MOESERVE_GEMV_DENSE_O=1 ;;
    o1nc) run o1nc MOESERVE_GEMV_DENSE_O=1 MOESERVE_GEMV_DENSE_CARVEOUT=0 ;;
    p1) run p1 MOESERVE_GEMV_DENSE_PIECES=1 ;;
    p2) run p2 MOESERVE_GEMV_DENSE_PIECES=2 ;;
  esac
done
