// HBM streaming microbenchmark for the batch-1 decode GEMVs: how long one kernel takes to read
// B bytes of weights on its own (launch, ramp and tail included) with
//   contig: each warp load instruction reads 512 contiguous bytes (the block's share in order);
//   tc:     k_gemv_tc.cu's expert gate/up pattern (a lane reads 16 bytes of rows g and g + 8 at
//           column q * 16 + 64 s of a 128-column chunk: 64-byte pieces of 8 rows per instruction,
//           the block's 4 warps on adjacent chunks);
//   rows4:  a lane reads 16 bytes at row lane / 8, column (lane % 8) * 16: 128-byte pieces of 4 rows;
// each with 16 x 16-byte loads in flight per lane (as the GEMV), 4 warps per block, one block per
// 16 rows x K of two matrices (the gate/up grid: 768 blocks for top-8 at M2.5 widths). Sizes
// scale the row count; the fit time = a + bytes / bw gives the fixed cost per kernel. Launches
// rotate over 4 copies of the weights (302 MB), so nothing is served from the 60 MB L2.
// Build: nvcc -O3 -std=c++17 -arch=sm_90a bench/hbm_stream_bench.cu -o hbm_stream_bench
// Run:   ./hbm_stream_bench            (prints one line per pattern and size, then the fits)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CK(x)                                                                           \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

constexpr int K = 3072;       // bytes per row (FP8 columns)
constexpr int kChunk = 128;   // columns per chunk
constexpr int kWarps = 4;

__device__ __forceinline__ uint4 ld256(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Block b reads rows [16 b, 16 b + 16) of two matrices W1, W3 (each rows x K bytes).
template <int PATTERN>
__global__ void __launch_bounds__(128) stream_kernel(const uint8_t* w1, const uint8_t* w3, int rows, uint32_t* sink) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int64_t base = int64_t(blockIdx.x) * 16 * K;  // the block's 16 rows
  const int nchunks = K / kChunk;
  uint32_t acc = 0;
  for (int c = warp; c < nchunks; c += 2 * kWarps) {
    uint4 v[2][8];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int cc = c + u * kWarps;
      if (cc >= nchunks) break;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint8_t* w = (i & 4) ? w3 : w1;
        int64_t off;
        if (PATTERN == 0) {
          // contiguous: the chunk's 2 x 2 KB of the two matrices as 512-byte runs per instruction
          const int part = i & 3;  // 4 x 512 B = 2 KB per matrix and chunk
          off = base + int64_t(cc) * 2048 + part * 512 + lane * 16;
        } else if (PATTERN == 1) {
          const int s = i & 1, h = (i >> 1) & 1;
          off = base + int64_t(g + 8 * h) * K + cc * kChunk + s * 64 + q * 16;
        } else {
          const int r = (i & 3) * 4 + (lane >> 3);
          off = base + int64_t(r) * K + cc * kChunk + (lane & 7) * 16;
        }
        v[u][i] = ld256(w + off);
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc ^= v[u][i].x ^ v[u][i].y ^ v[u][i].z ^ v[u][i].w;
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the loads
  (void)rows;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const int max_rows = 8 * 1536;  // top-8 experts x I rows (gate/up: 2 matrices)
  uint8_t *w1, *w3;
  uint32_t* sink;
  // kCopies regions of 2 x 37.7 MB, used in turn, so that no launch finds its bytes in the
  // 60 MB L2 from the launch before.
  constexpr int kCopies = 4;
  const size_t region = size_t(max_rows) * K;
  CK(cudaMalloc(&w1, region * kCopies));
  CK(cudaMalloc(&w3, region * kCopies));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(w1, 1, region * kCopies));
  CK(cudaMemset(w3, 2, region * kCopies));
  int turn = 0;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const char* names[3] = {"contig", "tc", "rows4"};
  const int row_counts[5] = {1024, 2048, 3072, 6144, 12288};  // 6, 12.6, 18.9, 37.7, 75.5 MB
  std::printf("GPU %s, %d SMs\n", prop.name, sms);
  std::printf("%-7s %8s %8s %10s %10s\n", "pattern", "blocks", "MB", "us", "TB/s");
  for (int pat = 0; pat < 3; ++pat) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int rc : row_counts) {
      const int blocks = rc / 16;
      const double bytes = 2.0 * rc * K;
      auto launch = [&] {
        const size_t off = region * (turn++ % kCopies);
        if (pat == 0) stream_kernel<0><<<blocks, 128>>>(w1 + off, w3 + off, rc, sink);
        if (pat == 1) stream_kernel<1><<<blocks, 128>>>(w1 + off, w3 + off, rc, sink);
        if (pat == 2) stream_kernel<2><<<blocks, 128>>>(w1 + off, w3 + off, rc, sink);
      };
      // Each timed launch alone: an event pair around one launch, after a sync; median of 31.
      std::vector<float> t;
      for (int it = 0; it < 41; ++it) {
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(e0));
        launch();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 10) t.push_back(ms * 1000.f);
      }
      std::sort(t.begin(), t.end());
      const double us = t[t.size() / 2];
      // Back to back: 20 launches between one event pair (launch latency overlapped, as in a
      // stream or graph without PDL).
      CK(cudaDeviceSynchronize());
      CK(cudaEventRecord(e0));
      for (int it = 0; it < 20; ++it) launch();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms20 = 0;
      CK(cudaEventElapsedTime(&ms20, e0, e1));
      const double us_b2b = ms20 * 1000.0 / 20;
      std::printf("%-7s %8d %8.1f %10.2f %10.2f   back-to-back %8.2f us %8.2f TB/s\n", names[pat], blocks,
                  bytes / 1e6, us, bytes / us / 1e6, us_b2b, bytes / us_b2b / 1e6);
      sx += bytes / 1e6, sy += us, sxx += (bytes / 1e6) * (bytes / 1e6), sxy += (bytes / 1e6) * us;
    }
    const double n = 5, slope = (n * sxy - sx * sy) / (n * sxx - sx * sx), icpt = (sy - slope * sx) / n;
    std::printf("fit %-7s alone: %.2f us + bytes / %.2f TB/s\n", names[pat], icpt, 1.0 / slope);
  }
  return 0;
}
