#include "backend/factory.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#ifdef MOESERVE_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace moeserve {

std::unique_ptr<Backend> make_backend(const std::string& device, int index) {
  if (device == "cpu") return make_cpu_backend();
  if (device == "cuda") {
#ifdef MOESERVE_WITH_CUDA
    return make_cuda_backend(index);
#else
    (void)index;
    fail("--device cuda: this build has no CUDA backend (configure with -DMOESERVE_CUDA=ON)");
#endif
  }
  fail("device '{}': expected cpu or cuda", device);
}

BackendDeviceInfo backend_device_info(const std::string& device, int index) {
  if (device == "cpu") return {"cpu", 0};
#ifdef MOESERVE_WITH_CUDA
  if (device == "cuda") {
    const CudaDeviceInfo d = cuda_device_info(index);
    return {d.name, d.total_bytes};
  }
#endif
  (void)index;
  fail("device '{}': not available in this build", device);
}

int backend_device_count(const std::string& device) {
  if (device == "cpu") return 1;
#ifdef MOESERVE_WITH_CUDA
  if (device == "cuda") return cuda_device_count();
#endif
  return 0;
}

}  // namespace moeserve
