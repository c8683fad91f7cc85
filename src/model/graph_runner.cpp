#include "model/graph_runner.h"

#include <chrono>
#include <map>

#include "core/error.h"
#include "core/log.h"

#ifdef MOESERVE_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace moeserve {

#ifdef MOESERVE_WITH_CUDA
namespace {

class CudaGraphRunner final : public GraphRunner {
 public:
  explicit CudaGraphRunner(CudaBackend& b) : b_(b) {}
  bool has(int key) const override { return graphs_.count(key) > 0; }
  void capture(int key, const std::function<void()>& body) override {
    const auto t0 = std::chrono::steady_clock::now();
    size_t free0 = 0, free1 = 0, total = 0;
    b_.synchronize();
    b_.mem_info(&free0, &total);
    b_.begin_capture();
    try {
      body();
    } catch (...) {
      try {
        b_.end_capture();  // leave the stream out of capture mode
      } catch (...) {
      }
      throw;
    }
    graphs_[key] = b_.end_capture();
    b_.mem_info(&free1, &total);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    spdlog::info("cuda graph: captured bucket {} in {:.1f} ms ({:+.1f} MiB device memory; {} graphs)", key, ms,
                 (double(free0) - double(free1)) / 1048576.0, graphs_.size());
  }
  void replay(int key) override { graphs_.at(key).replay(b_.stream()); }
  void clear() override { graphs_.clear(); }
  int size() const override { return int(graphs_.size()); }
  uint64_t backend_generation() const override { return b_.workspace_generation(); }

 private:
  CudaBackend& b_;
  std::map<int, CudaGraph> graphs_;
};

}  // namespace
#endif

std::unique_ptr<GraphRunner> make_graph_runner(Backend& backend) {
#ifdef MOESERVE_WITH_CUDA
  if (auto* cb = dynamic_cast<CudaBackend*>(&backend)) return std::make_unique<CudaGraphRunner>(*cb);
#endif
  (void)backend;
  return nullptr;
}

void reserve_backend_workspaces(Backend& backend, const BackendWorkspaceDims& d) {
#ifdef MOESERVE_WITH_CUDA
  if (auto* cb = dynamic_cast<CudaBackend*>(&backend)) {
    WorkspacePlan p;
    p.max_tokens = d.max_tokens;
    p.hidden = d.hidden;
    p.intermediate = d.intermediate;
    p.top_k = d.top_k;
    p.num_local_experts = d.num_local_experts;
    p.num_q_heads = d.num_q_heads;
    p.head_dim = d.head_dim;
    p.fp8 = d.fp8;
    cb->reserve(p);
  }
#endif
  (void)backend;
  (void)d;
}

int64_t backend_memory_used(Backend& backend) {
#ifdef MOESERVE_WITH_CUDA
  if (auto* cb = dynamic_cast<CudaBackend*>(&backend)) {
    size_t free_b = 0, total_b = 0;
    cb->mem_info(&free_b, &total_b);
    return int64_t(total_b - free_b);
  }
#endif
  (void)backend;
  return -1;
}

}  // namespace moeserve
