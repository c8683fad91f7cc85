// Hopper (sm_90a) causal prefill attention: availability and dispatch. The kernel is the
// warp-specialised one in k_attn_ws.cu (a cp.async producer warpgroup, two consumer
// warpgroups, FlashAttention-3's schedule). The earlier two-warpgroup kernel of this file
// (and its overlap / mbarrier variants) measured slower and left the tree; its numbers and
// last commit are in docs/bench/cuda_switch_inventory.md.
#include "backend/cuda/attention/attn_wgmma.cuh"
#include "backend/cuda/linear/kernels_fp8.h"

namespace moeserve::cuda {
namespace {

using namespace attn_wg;

// Set per compiled architecture: the host reads it back to learn whether the loaded cubin
// has the wgmma kernels (an sm_80 / PTX-JIT build on a Hopper part does not).
__device__ int g_attn_wgmma_compiled =
#ifdef MS_WGMMA_ATTN
    1;
#else
    0;
#endif

}  // namespace

bool attention_wgmma_available() {
  static int avail = -1;
  if (avail < 0) {
    int dev = 0, major = 0, flag = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major == 9) CUDA_CHECK(cudaMemcpyFromSymbol(&flag, g_attn_wgmma_compiled, sizeof(int)));
    avail = flag == 1 ? 1 : 0;
  }
  return avail == 1;
}

bool attention_wgmma_supported(const AttnParams& p) {
  return !p.kv_fp8 && p.D == kD && p.max_query_len >= kRows && p.splits <= 1 && p.Hkv > 0 && p.Hq % p.Hkv == 0 &&
         p.block_size > 0 && (p.block_size & (p.block_size - 1)) == 0 && attention_wgmma_available();
}

void launch_attention_wgmma(const AttnParams& p, cudaStream_t s) {
  CU_REQUIRE(p.D == kD, "attention_wgmma: head_dim must be 128");
  if (p.T == 0 || p.num_seqs == 0) return;
  launch_attention_ws(p, s);
}

}  // namespace moeserve::cuda
