#include "dist/in_process.h"

#include <cstring>
#include <exception>
#include <thread>

#include "core/error.h"

namespace moeserve {

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(InProcessGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return g_.world_size_; }

  void all_reduce_sum(Tensor& t) override {
    MS_CHECK(t.device == Device::CPU && (t.defined() || t.numel() == 0),
             "all_reduce_sum: rank {} needs a host tensor", rank_);
    MS_CHECK(t.dtype == DType::F32, "all_reduce_sum: rank {} got {}, only F32 is supported", rank_,
             dtype_name(t.dtype));
    publish(t.data, t.dtype, t.numel());
    g_.wait_all();
    check_same("all_reduce_sum", t.numel());
    // Every rank sums all buffers in rank order into a private buffer (identical results
    // everywhere), then writes its own tensor once nobody reads it any more.
    const int64_t n = t.numel();
    std::vector<float> sum(static_cast<size_t>(n), 0.f);
    for (int r = 0; r < g_.world_size_; ++r) {
      const float* src = static_cast<const float*>(g_.slots_[size_t(r)].data);
      for (int64_t i = 0; i < n; ++i) sum[size_t(i)] += src[i];
    }
    g_.wait_all();
    if (n) std::memcpy(t.data, sum.data(), size_t(n) * sizeof(float));
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    MS_CHECK(in.device == Device::CPU && out.device == Device::CPU, "all_gather: rank {} needs host tensors", rank_);
    MS_CHECK(out.dtype == in.dtype, "all_gather: rank {} in is {} but out is {}", rank_, dtype_name(in.dtype),
             dtype_name(out.dtype));
    MS_CHECK(out.numel() == in.numel() * g_.world_size_,
             "all_gather: rank {} out {} must hold {} x {} elements", rank_, shape_str(out.shape), g_.world_size_,
             in.numel());
    publish(in.data, in.dtype, in.numel());
    g_.wait_all();
    check_same("all_gather", in.numel());
    const size_t bytes = in.nbytes();
    for (int r = 0; r < g_.world_size_; ++r)
      if (bytes) std::memcpy(static_cast<char*>(out.data) + size_t(r) * bytes, g_.slots_[size_t(r)].data, bytes);
    g_.wait_all();
  }

  void barrier() override { g_.wait_all(); }

 private:
  void publish(const void* data, DType dt, int64_t numel) {
    std::lock_guard<std::mutex> lk(g_.mu_);
    g_.slots_[size_t(rank_)] = {data, dt, numel};
  }
  // Runs after the first barrier: every rank sees the same slots, so a mismatch throws on
  // every rank alike.
  void check_same(const char* op, int64_t numel) {
    std::lock_guard<std::mutex> lk(g_.mu_);
    for (int r = 0; r < g_.world_size_; ++r) {
      const auto& s = g_.slots_[size_t(r)];
      MS_CHECK(s.numel == numel && s.dtype == g_.slots_[size_t(rank_)].dtype,
               "{}: rank {} has {} {} elements but rank {} has {} {}", op, r, s.numel, dtype_name(s.dtype), rank_,
               numel, dtype_name(g_.slots_[size_t(rank_)].dtype));
    }
  }
  InProcessGroup& g_;
  const int rank_;
};

InProcessGroup::InProcessGroup(int world_size) : world_size_(world_size) {
  MS_CHECK(world_size >= 1, "InProcessGroup: world size must be >= 1, got {}", world_size);
  slots_.resize(size_t(world_size));
}

std::unique_ptr<Communicator> InProcessGroup::communicator(int rank) {
  MS_CHECK(rank >= 0 && rank < world_size_, "InProcessGroup: rank {} outside [0, {})", rank, world_size_);
  return std::make_unique<InProcessCommunicator>(*this, rank);
}

void InProcessGroup::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = reason;
  }
  cv_.notify_all();
}

void InProcessGroup::wait_all() {
  std::unique_lock<std::mutex> lk(mu_);
  MS_CHECK(!aborted_, "communicator aborted: {}", abort_reason_);
  const uint64_t gen = generation_;
  if (++arrived_ == world_size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lk, [&] { return generation_ != gen || aborted_; });
  MS_CHECK(generation_ != gen, "communicator aborted: {}", abort_reason_);
}

void run_ranks(InProcessGroup& group, const std::function<void(Communicator&)>& fn) {
  const int n = group.world_size();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = group.communicator(r);
        fn(*comm);
      } catch (const std::exception& e) {
        errors[size_t(r)] = std::current_exception();
        group.abort("rank " + std::to_string(r) + " failed: " + e.what());
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
        group.abort("rank " + std::to_string(r) + " failed");
      }
    });
  for (auto& t : threads) t.join();
  // Prefer the root cause over the "aborted" errors it triggered in other ranks.
  std::exception_ptr first;
  for (auto& e : errors) {
    if (!e) continue;
    if (!first) first = e;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      if (std::string(ex.what()).rfind("communicator aborted", 0) != 0) {
        first = e;
        break;
      }
    } catch (...) {
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace moeserve
