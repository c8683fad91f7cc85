// Optional backend capabilities: what a device backend can do beyond the op interface, asked
// for through Backend (graph_capture(), memory_info(), device_sampler(), reserve_workspaces(),
// device_queue()) so the runtime never names a backend type. A backend without one returns null / false and
// the runtime does without it (eager steps, host sampling, no memory-based KV sizing).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace moeserve {

// A recorded sequence of device work, replayed as one unit (a CUDA graph).
class CapturedGraph {
 public:
  virtual ~CapturedGraph() = default;
  virtual void replay() = 0;
};

// Whole-step capture: begin_capture(), run ops (recorded, not run), end_capture().
class GraphCapture {
 public:
  virtual ~GraphCapture() = default;
  virtual void begin_capture() = 0;
  virtual std::unique_ptr<CapturedGraph> end_capture() = 0;
  // Changes when the backend reallocated a workspace that captured graphs may point at.
  virtual uint64_t workspace_generation() const = 0;
};

// One logits row's sampling parameters for a device sampler (the engine's DeviceSampling).
struct DeviceSampleRow {
  float temperature = 0.f;  // 0: greedy
  int top_k = 0;            // 0: off
  float top_p = 1.f;
  uint64_t seed = 0;
  int32_t mask_row = -1;  // row of DeviceMasks applied to this row (-1: none)
};

// Allowed-token bitsets of the masked rows, packed in host memory: [num_rows, words_per_row]
// uint32, words_per_row = ceil(V / 32); bit t%32 of word t/32 set = token t allowed.
struct DeviceMasks {
  const uint32_t* words = nullptr;
  int num_rows = 0;
  int words_per_row = 0;
};

// Samples one token per row of device logits [R, V] into out_ids [R] I32 (device). A row with
// mask_row >= 0 samples as if its disallowed logits were -inf.
class DeviceSampler {
 public:
  virtual ~DeviceSampler() = default;
  virtual void sample(const Tensor& logits, const std::vector<DeviceSampleRow>& rows, const DeviceMasks& masks,
                      Tensor& out_ids) = 0;
};

// The in-order device queue a backend enqueues its ops on, for a library that enqueues its own
// device work in order with them (each rank's NCCL communicator, dist/nccl.h): the device
// index and the device API's queue handle (CUDA: the cudaStream_t), opaque above the backend
// so nothing there includes a device header.
struct DeviceQueue {
  int device = 0;
  void* native = nullptr;
};

// Upper bounds of one step, for a backend's own workspaces (sized before the KV pool).
struct BackendWorkspaceDims {
  int max_tokens = 0;
  int hidden = 0;
  int intermediate = 0;  // local expert intermediate size
  int top_k = 0;
  int num_local_experts = 0;
  int num_q_heads = 0;  // local
  int head_dim = 0;
  bool fp8 = false;  // FP8 block-scaled weights (sizes the FP8-activation buffers too)
};

}  // namespace moeserve
