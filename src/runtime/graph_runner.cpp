#include "runtime/graph_runner.h"

#include <chrono>
#include <map>

#include "core/error.h"
#include "core/log.h"

namespace moeserve {
namespace {

// Graphs over a backend's GraphCapture capability, keyed by batch-size bucket.
class CapabilityGraphRunner final : public GraphRunner {
 public:
  CapabilityGraphRunner(Backend& b, GraphCapture& cap) : b_(b), cap_(cap) {}
  bool has(int key) const override { return graphs_.count(key) > 0; }
  void capture(int key, const std::function<void()>& body) override {
    const auto t0 = std::chrono::steady_clock::now();
    size_t free0 = 0, free1 = 0, total = 0;
    b_.synchronize();
    b_.memory_info(&free0, &total);
    cap_.begin_capture();
    try {
      body();
    } catch (...) {
      try {
        cap_.end_capture();  // leave the stream out of capture mode
      } catch (...) {
      }
      throw;
    }
    graphs_[key] = cap_.end_capture();
    b_.memory_info(&free1, &total);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    spdlog::info("{} graph: captured bucket {} in {:.1f} ms ({:+.1f} MiB device memory; {} graphs)", b_.name(), key,
                 ms, (double(free0) - double(free1)) / 1048576.0, graphs_.size());
  }
  void replay(int key) override { graphs_.at(key)->replay(); }
  void clear() override { graphs_.clear(); }
  int size() const override { return int(graphs_.size()); }
  uint64_t backend_generation() const override { return cap_.workspace_generation(); }

 private:
  Backend& b_;
  GraphCapture& cap_;
  std::map<int, std::unique_ptr<CapturedGraph>> graphs_;
};

}  // namespace

std::unique_ptr<GraphRunner> make_graph_runner(Backend& backend) {
  if (GraphCapture* cap = backend.graph_capture()) return std::make_unique<CapabilityGraphRunner>(backend, *cap);
  return nullptr;
}

int64_t backend_memory_used(Backend& backend) {
  size_t free_b = 0, total_b = 0;
  if (!backend.memory_info(&free_b, &total_b)) return -1;
  return int64_t(total_b - free_b);
}

}  // namespace moeserve
