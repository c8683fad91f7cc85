// The CPU backend: every op of backend/backend.h in plain fp32 on the host, multithreaded
// with ThreadPool::global(). Weights keep their checkpoint dtype (F32/BF16/F16, or F8_E4M3
// with block scales) and are dequantised exactly, one row at a time, inside each op; sums
// are accumulated in fp32 (norm statistics in double). It is the numerical reference that
// the CUDA backend is tested against. Activations and the KV cache are F32.
#pragma once
#include <memory>

#include "backend/backend.h"

namespace moeserve {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace moeserve
