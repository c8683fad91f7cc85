// Backends by name, so code above the backend (runtime, CLI) never includes a device header:
// "cpu" (always built) or "cuda" (when the build has the CUDA backend).
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace moeserve {

// Throws naming the device when this build has no such backend or the index is out of range.
std::unique_ptr<Backend> make_backend(const std::string& device, int index = 0);
// Devices of that kind this process can use (cpu: 1; cuda: 0 when not built or none visible).
int backend_device_count(const std::string& device);

struct BackendDeviceInfo {
  std::string name;
  size_t total_bytes = 0;  // device memory (0 for cpu)
};
// Name and memory of device `index` of that kind (logs, batch defaults); throws when absent.
BackendDeviceInfo backend_device_info(const std::string& device, int index);

}  // namespace moeserve
