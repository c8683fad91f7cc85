#!/usr/bin/env bash
# Nsight Compute readings of the batch-1 decode kernels (device machine, Firecracker runtime:
# ncu reads the hardware counters there; --clock-control none leaves the clocks alone).
# ncu serialises the kernels, so each runs ALONE (no PDL overlap): these are per-kernel
# efficiencies (DRAM throughput, bytes, achieved occupancy, warp stall reasons), not the
# in-graph timeline (that is scripts/gpu_ab_b1.sh with the -DMOESERVE_KTRACE=ON build).
#   BIN=dir-with-moeserve OUT=... COUNT=12 scripts/gpu_ncu_b1.sh     -> $OUT/ncu/ncu.txt
set -u
BIN=${BIN:-$PWD}
R=${OUT:?}/ncu
mkdir -p "$R"
ncu --clock-control none -k 'regex:gemv_tc_kernel|gemv_dense_kernel|route_norm_decode|attn_decode2' \
  --launch-count "${COUNT:-12}" --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section Occupancy --section LaunchStats --section SchedulerStats \
  "$BIN/moeserve" bench-model --synthetic minimax-m2.5 --layers 3 --batch-sizes 1 --contexts 1024 --iters 1 \
  --prefill-tokens 0 > "$R/ncu.txt" 2>&1
echo "ncu rc=$? $(grep -c 'Section: GPU Speed Of Light' "$R/ncu.txt") kernels profiled"
grep -E '^  [a-z_].*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|No Eligible|Issued Warp' "$R/ncu.txt" | head -120
# SASS_DETAIL=1: also the gate/up GEMV's warp stall sampling by SASS line (SourceCounters) and
# its SASS (cuobjdump), into $OUT/ncu/gateup_source.txt and gateup_sass.txt.
if [ -n "${SASS_DETAIL:-}" ]; then
  ncu --clock-control none --kernel-name-base demangled -k 'regex:gemv_tc_kernel<\(int\)1, \(int\)4' --launch-count 1 \
    --section SourceCounters --section WarpStateStats --print-details all \
    "$BIN/moeserve" bench-model --synthetic minimax-m2.5 --layers 3 --batch-sizes 1 --contexts 1024 --iters 1 \
    --prefill-tokens 0 > "$R/gateup_source.txt" 2>&1
  echo "ncu source rc=$?"
  # SASS from the object file (GEMV_OBJ=.../k_gemv_tc.cu.o, carried from the build; the stripped
  # executable's fatbin holds every kernel): the gate/up kernel's function only.
  if [ -n "${GEMV_OBJ:-}" ]; then
    cuobjdump -sass "$GEMV_OBJ" | awk '/Function : .*gemv_tc_kernelILi1ELi4ELb0ELi1E/{p=1} /Function : /{if(!/gemv_tc_kernelILi1ELi4ELb0ELi1E/)p=0} p' \
      > "$R/gateup_sass.txt" 2>&1
    echo "sass: $(wc -l < "$R/gateup_sass.txt") lines"
  fi
fi
