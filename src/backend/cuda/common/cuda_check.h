// CUDA_CHECK / CU_REQUIRE: throw moeserve::Error naming the failing call, file and line.
// Free of fmt so that .cu files (nvcc cannot evaluate fmt's consteval format checks) can
// use them; the throwing functions live in cuda_backend.cpp.
#pragma once
#include <cuda_runtime.h>

#include <string>

namespace moeserve::cuda {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* file, int line, const char* expr);
[[noreturn]] void throw_error(const std::string& msg);
}  // namespace moeserve::cuda

#define CUDA_CHECK(expr)                                                             \
  do {                                                                               \
    cudaError_t err_ = (expr);                                                       \
    if (err_ != cudaSuccess) ::moeserve::cuda::throw_cuda_error(err_, __FILE__, __LINE__, #expr); \
  } while (0)

// Checks the launch configuration of the kernel just launched (no synchronisation).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// CU_REQUIRE(cond, std::string message expression)
#define CU_REQUIRE(cond, msg)                            \
  do {                                                   \
    if (!(cond)) ::moeserve::cuda::throw_error(msg);     \
  } while (0)
