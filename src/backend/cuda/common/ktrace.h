// Kernel timeline trace inside CUDA graphs (diagnostic build only: -DMOESERVE_KTRACE=ON).
//
// Every PDL kernel's pdl_wait() records, for thread 0 of each block, the global timer before
// and after griddepcontrol.wait (block resident + its pre-wait work issued; predecessor grid
// complete), the clock, the SM, the grid launch id and the launch shape. launch_pdl() notes the
// host-side launch order (kernel name, grid, block) while notes are on, so the k-th traced grid
// in time order can be named. bench-model writes both files when MOESERVE_KTRACE_OUT is set.
// Without MOESERVE_KTRACE nothing here is compiled into the kernels.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace moeserve::cuda {

struct KTraceRec {
  uint64_t gridid;          // %gridid: unique per grid launch (graph replays included)
  uint64_t t_enter, t_exit; // %globaltimer (ns) before / after griddepcontrol.wait
  uint64_t c_enter, c_exit; // clock64 of the same points (per SM)
  uint32_t block, smid;     // linear block index, SM
  uint32_t nblocks, nthreads;
  uint64_t pad;
};
struct KTraceBuf {
  unsigned int count, cap;
  unsigned int pad[2];
  KTraceRec rec[1];  // [cap]
};

#ifdef MOESERVE_KTRACE
// Host side (ktrace.cpp).
void ktrace_register(void (*set_ptr)(KTraceBuf*));  // one per translation unit with kernels
bool ktrace_enable(unsigned int cap);                 // allocates the buffer, points every unit at it
void ktrace_reset();                                  // count = 0, launch notes cleared
void ktrace_notes(bool on);
void ktrace_note_launch(const void* func, dim3 grid, dim3 block);
// Writes PATH.csv (records) and PATH.launches.csv (noted launches). Returns false on error.
bool ktrace_dump(const std::string& path);

#ifdef __CUDACC__
namespace {
__device__ KTraceBuf* g_ktrace_buf;
void ktrace_set_this_unit(KTraceBuf* p) { cudaMemcpyToSymbol(g_ktrace_buf, &p, sizeof(p)); }
[[maybe_unused]] const bool g_ktrace_registered = (ktrace_register(&ktrace_set_this_unit), true);

__device__ __forceinline__ uint64_t ktrace_now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void ktrace_record(uint64_t t_enter) {
  const uint64_t t_exit = ktrace_now();
  KTraceBuf* b = g_ktrace_buf;
  if (!b || threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0) return;
  const unsigned int i = atomicAdd(&b->count, 1u);
  if (i >= b->cap) return;
  KTraceRec r{};
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(r.gridid));
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r.smid));
  r.t_enter = t_enter;
  r.t_exit = t_exit;
  r.c_exit = clock64();
  r.c_enter = r.c_exit;  // (the enter clock is not kept: the global timer is what is compared)
  r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  r.nblocks = gridDim.x * gridDim.y * gridDim.z;
  r.nthreads = blockDim.x * blockDim.y * blockDim.z;
  b->rec[i] = r;
}
}  // namespace
#endif
#endif

}  // namespace moeserve::cuda
