// Whole-step graph capture behind a backend-neutral interface, so the executor's decode path
// (model_executor.cpp) has no device types. make_graph_runner() returns a runner over the
// backend's GraphCapture capability (backend/capabilities.h) and null when the backend has
// none (the CPU backend); tests may supply their own runner
// (ExecutorOptions::graph_runner_factory).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "backend/backend.h"

namespace moeserve {

class GraphRunner {
 public:
  virtual ~GraphRunner() = default;
  virtual bool has(int key) const = 0;
  // Records `body` as the graph for `key` without running it. The body may only touch
  // buffers whose addresses stay fixed (the step workspace, the metadata buffer, the KV pool).
  virtual void capture(int key, const std::function<void()>& body) = 0;
  virtual void replay(int key) = 0;
  virtual void clear() = 0;
  virtual int size() const = 0;
  // Changes when the backend reallocated a workspace that captured graphs may point at.
  virtual uint64_t backend_generation() const { return 0; }
};

// Null when `backend` cannot capture graphs (the CPU backend).
std::unique_ptr<GraphRunner> make_graph_runner(Backend& backend);
// Device memory in use (bytes), or -1 when the backend does not report it.
int64_t backend_memory_used(Backend& backend);

}  // namespace moeserve
