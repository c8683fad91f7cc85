// Programmatic dependent launch (PDL, sm_90+) for the decode-path kernels.
//
// A kernel launched with launch_pdl() may start while its predecessor on the stream is still
// running (its blocks become resident once every block of the predecessor has called
// pdl_trigger() or exited). The invariant every such kernel keeps:
//   * pdl_wait() (griddepcontrol.wait: returns once all predecessor grids have COMPLETED and
//     their memory is visible) before ANY global access that touches activations, metadata,
//     workspaces or outputs -- reads (RAW) and writes (WAR: the predecessor may still read
//     the buffer) alike -- and before every return, so grid completion stays transitive
//     (a chain A -> B -> C: C's wait covers A because B's blocks all waited for A);
//   * only weights (never written during a step) are read before pdl_wait(): GEMVs issue their
//     first weight loads there, so the weight stream overlaps the predecessor's tail (one
//     documented exception: k_attn_decode.cu also reads step metadata and K/V of earlier
//     positions, which no kernel of the step writes);
//   * pdl_trigger() right after pdl_wait(), so the successor is scheduled one kernel ahead
//     (its blocks take SM slots only once all of ours are resident: no starvation).
// Kernels launched plainly (GEMM, prefill attention, sampling) still run after their
// predecessor completes. Works under stream capture (programmatic graph edges). Before
// sm_90 the attribute is not set and the device calls compile to nothing.
// MOESERVE_PDL=0 (core/debug_flags.h) turns it off (debugging).
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/ktrace.h"

namespace moeserve::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#ifdef MOESERVE_KTRACE
  const uint64_t kt_t0 = ktrace_now();
  asm volatile("griddepcontrol.wait;" ::: "memory");
  ktrace_record(kt_t0);
#else
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Both, in the order the invariant asks for.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_trigger();
}

// True when the code is sm_90+ and MOESERVE_PDL is not 0 (debug registry).
bool pdl_enabled();

template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
#ifdef MOESERVE_KTRACE
  ktrace_note_launch(reinterpret_cast<const void*>(kernel), grid, block);
#endif
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace moeserve::cuda
