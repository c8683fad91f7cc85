// Median CUDA-event time of a callable's work on one stream (bench-model and the bench tests).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

namespace moeserve::cuda {

class EventTimer {
 public:
  explicit EventTimer(cudaStream_t s) : s_(s) {
    cudaEventCreate(&a_);
    cudaEventCreate(&b_);
  }
  ~EventTimer() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  // Runs f `reps` times, each between two events; returns the median in ms.
  template <typename F>
  double median_ms(int reps, F&& f) {
    std::vector<float> t;
    for (int i = 0; i < reps; ++i) {
      cudaEventRecord(a_, s_);
      f();
      cudaEventRecord(b_, s_);
      cudaEventSynchronize(b_);
      float ms = 0;
      cudaEventElapsedTime(&ms, a_, b_);
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t.empty() ? 0.0 : t[t.size() / 2];
  }

 private:
  cudaStream_t s_;
  cudaEvent_t a_{}, b_{};
};

}  // namespace moeserve::cuda
