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
