// The device sampler of an executor (ExecutorOptions::device_sampler) over the backend's
// DeviceSampler capability (backend/capabilities.h): maps the engine's DeviceSampling rows
// onto it. Empty when the backend has none (the executor then reports no device sampling).
#pragma once
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "engine/executor.h"

namespace moeserve {

using DeviceSamplerFn = std::function<void(const Tensor&, const std::vector<DeviceSampling>&, Tensor&)>;

inline DeviceSamplerFn backend_device_sampler(Backend& backend) {
  DeviceSampler* s = backend.device_sampler();
  if (!s) return {};
  return [s](const Tensor& logits, const std::vector<DeviceSampling>& rows, Tensor& out_ids) {
    std::vector<DeviceSampleRow> p(rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      p[i] = DeviceSampleRow{rows[i].temperature, rows[i].top_k, rows[i].top_p, rows[i].seed};
    s->sample(logits, p, out_ids);
  };
}

}  // namespace moeserve
