// The CUDA device sampler for MiniMaxM2Executor (ExecutorOptions::device_sampler): maps the
// engine's DeviceSampling rows onto CudaBackend::sample (k_sample.cu). Header-only so the
// model library does not link the CUDA backend; include it only where MOESERVE_WITH_CUDA is
// defined (serve, GPU tests).
#pragma once
#include <functional>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "engine/executor.h"

namespace moeserve {

inline std::function<void(const Tensor&, const std::vector<DeviceSampling>&, Tensor&)> cuda_device_sampler(
    CudaBackend* backend) {
  return [backend](const Tensor& logits, const std::vector<DeviceSampling>& rows, Tensor& out_ids) {
    std::vector<GpuSamplingParams> p(rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      p[i] = GpuSamplingParams{rows[i].temperature, rows[i].top_k, rows[i].top_p, rows[i].seed};
    backend->sample(logits, p, out_ids);
  };
}

}  // namespace moeserve
