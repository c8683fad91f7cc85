#include "dist/in_process.h"

#include <cstring>
#include <exception>
#include <numeric>
#include <thread>

#include "core/error.h"

namespace moeserve {

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(InProcessGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return g_.world_size_; }

  void all_reduce_sum(Tensor& t) override {
    host_check("all_reduce_sum", t);
    reducible("all_reduce_sum", t.dtype);
    const int64_t n = t.numel();
    std::vector<float> sum;
    exchange({"all_reduce_sum", t.data, t.dtype, n}, [&] {
      sum = reduce_block(0, n);
    });
    // Written after the second barrier: nobody reads this rank's buffer any more.
    store(sum, t.data, t.dtype);
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    host_check("all_gather", in);
    host_check("all_gather", out);
    MS_CHECK(out.dtype == in.dtype, "all_gather: rank {} in is {} but out is {}", rank_, dtype_name(in.dtype),
             dtype_name(out.dtype));
    MS_CHECK(out.numel() == in.numel() * world_size(), "all_gather: rank {} out {} must hold {} x {} elements", rank_,
             shape_str(out.shape), world_size(), in.numel());
    exchange({"all_gather", in.data, in.dtype, in.numel()}, [&] {
      const size_t bytes = in.nbytes();
      for (int r = 0; r < world_size(); ++r)
        if (bytes) std::memcpy(static_cast<char*>(out.data) + size_t(r) * bytes, slot(r).data, bytes);
    });
  }

  void reduce_scatter_sum(const Tensor& in, Tensor& out) override {
    host_check("reduce_scatter_sum", in);
    host_check("reduce_scatter_sum", out);
    reducible("reduce_scatter_sum", in.dtype);
    MS_CHECK(out.dtype == in.dtype, "reduce_scatter_sum: rank {} in is {} but out is {}", rank_, dtype_name(in.dtype),
             dtype_name(out.dtype));
    MS_CHECK(in.numel() == out.numel() * world_size(),
             "reduce_scatter_sum: rank {} in {} must hold {} x out {} elements", rank_, shape_str(in.shape),
             world_size(), shape_str(out.shape));
    const int64_t n = out.numel();
    std::vector<float> sum;
    // `in` and `out` may alias (out = block `rank` of in); write after the last barrier.
    exchange({"reduce_scatter_sum", in.data, in.dtype, in.numel()}, [&] { sum = reduce_block(rank_ * n, n); });
    store(sum, out.data, out.dtype);
  }

  void all_to_all(const Tensor& in, Tensor& out) override {
    host_check("all_to_all", in);
    host_check("all_to_all", out);
    MS_CHECK(out.dtype == in.dtype && out.numel() == in.numel(), "all_to_all: rank {} in {} {} but out {} {}", rank_,
             dtype_name(in.dtype), shape_str(in.shape), dtype_name(out.dtype), shape_str(out.shape));
    MS_CHECK(in.numel() % world_size() == 0, "all_to_all: rank {}: {} elements do not split into {} blocks", rank_,
             in.numel(), world_size());
    const size_t block = in.nbytes() / size_t(world_size());
    std::vector<char> tmp(in.nbytes());  // out may alias in
    exchange({"all_to_all", in.data, in.dtype, in.numel()}, [&] {
      for (int r = 0; r < world_size(); ++r)
        if (block)
          std::memcpy(tmp.data() + size_t(r) * block, static_cast<const char*>(slot(r).data) + size_t(rank_) * block,
                      block);
    });
    if (!tmp.empty()) std::memcpy(out.data, tmp.data(), tmp.size());
  }

  void all_to_allv(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                   const std::vector<int64_t>& recv_counts) override {
    host_check("all_to_allv", in);
    host_check("all_to_allv", out);
    const int W = world_size();
    MS_CHECK(out.dtype == in.dtype, "all_to_allv: rank {} in is {} but out is {}", rank_, dtype_name(in.dtype),
             dtype_name(out.dtype));
    MS_CHECK(int(send_counts.size()) == W && int(recv_counts.size()) == W,
             "all_to_allv: rank {} needs {} send and recv counts, got {} and {}", rank_, W, send_counts.size(),
             recv_counts.size());
    int64_t send_total = 0, recv_total = 0;
    for (int r = 0; r < W; ++r) {
      MS_CHECK(send_counts[size_t(r)] >= 0 && recv_counts[size_t(r)] >= 0, "all_to_allv: rank {}: negative count",
               rank_);
      send_total += send_counts[size_t(r)];
      recv_total += recv_counts[size_t(r)];
    }
    MS_CHECK(send_total <= in.numel() && recv_total <= out.numel(),
             "all_to_allv: rank {} sends {} of {} elements and receives {} into {}", rank_, send_total, in.numel(),
             recv_total, out.numel());
    const size_t es = dtype_size(in.dtype);
    std::vector<char> tmp(size_t(recv_total) * es);
    Slot mine{"all_to_allv", in.data, in.dtype, in.numel()};
    mine.send = &send_counts;
    mine.recv = &recv_counts;
    exchange(mine, [&] {
      for (int j = 0; j < W; ++j) {
        // Rank j's offset of its block for this rank = sum of its sends to ranks < rank_.
        const auto& js = *slot(j).send;
        const int64_t off = std::accumulate(js.begin(), js.begin() + rank_, int64_t(0));
        const int64_t dst = std::accumulate(recv_counts.begin(), recv_counts.begin() + j, int64_t(0));
        const size_t bytes = size_t(recv_counts[size_t(j)]) * es;
        if (bytes)
          std::memcpy(tmp.data() + size_t(dst) * es, static_cast<const char*>(slot(j).data) + size_t(off) * es, bytes);
      }
    });
    if (!tmp.empty()) std::memcpy(out.data, tmp.data(), tmp.size());
  }

  void broadcast(Tensor& t, int root) override {
    host_check("broadcast", t);
    MS_CHECK(root >= 0 && root < world_size(), "broadcast: rank {}: root {} outside [0, {})", rank_, root,
             world_size());
    Slot mine{"broadcast", t.data, t.dtype, t.numel()};
    mine.root = root;
    exchange(mine, [&] {
      if (rank_ != root && t.nbytes()) std::memcpy(t.data, slot(root).data, t.nbytes());
    });
  }

  void barrier() override { g_.wait_all(); }
  void abort(const std::string& reason) override { g_.abort(reason); }

 private:
  using Slot = InProcessGroup::Slot;
  const Slot& slot(int r) const { return g_.slots_[size_t(r)]; }

  void host_check(const char* op, const Tensor& t) const {
    MS_CHECK(t.device == Device::CPU && (t.defined() || t.numel() == 0), "{}: rank {} needs a host tensor", op, rank_);
  }
  void reducible(const char* op, DType dt) const {
    MS_CHECK(dt == DType::F32 || dt == DType::BF16, "{}: rank {} got {}, only F32 and BF16 are supported", op, rank_,
             dtype_name(dt));
  }

  // Publish this rank's slot, wait for all, check every rank's slot against rank 0's (the
  // same comparison on every rank, so a mismatch throws everywhere alike), run `body`
  // (which reads other ranks' buffers), wait again so no buffer is reused while read.
  template <typename Body>
  void exchange(const Slot& mine, Body&& body) {
    {
      std::lock_guard<std::mutex> lk(g_.mu_);
      g_.slots_[size_t(rank_)] = mine;
    }
    g_.wait_all();
    // The check gives the same verdict on every rank. On a mismatch every rank waits once more
    // before throwing: a rank that unwound early would free what its slot points to (the
    // all_to_allv counts) while slower ranks are still reading it.
    std::exception_ptr mismatch;
    try {
      check_slots();
    } catch (...) {
      mismatch = std::current_exception();
    }
    if (mismatch) {
      g_.wait_all();
      std::rethrow_exception(mismatch);
    }
    body();
    g_.wait_all();
  }

  void check_slots() {
    std::lock_guard<std::mutex> lk(g_.mu_);
    const Slot& s0 = slot(0);
    for (int r = 1; r < world_size(); ++r) {
      const Slot& s = slot(r);
      MS_CHECK(std::strcmp(s.op, s0.op) == 0, "collective mismatch: rank 0 called {} but rank {} called {}", s0.op, r,
               s.op);
      MS_CHECK(s.dtype == s0.dtype, "{}: rank 0 has dtype {} but rank {} has {}", s0.op, dtype_name(s0.dtype), r,
               dtype_name(s.dtype));
      MS_CHECK(s.root == s0.root, "{}: rank 0 uses root {} but rank {} uses root {}", s0.op, s0.root, r, s.root);
      if (!s0.send)  // all_to_allv blocks may differ in size; their counts are checked below
        MS_CHECK(s.numel == s0.numel, "{}: rank 0 has {} elements but rank {} has {}", s0.op, s0.numel, r, s.numel);
    }
    if (s0.send)
      for (int i = 0; i < world_size(); ++i)
        for (int j = 0; j < world_size(); ++j)
          MS_CHECK((*slot(i).send)[size_t(j)] == (*slot(j).recv)[size_t(i)],
                   "all_to_allv: rank {} sends {} elements to rank {}, which expects {}", i,
                   (*slot(i).send)[size_t(j)], j, (*slot(j).recv)[size_t(i)]);
  }

  // f32 sum over ranks (rank order) of elements [off, off + n) of every rank's buffer.
  std::vector<float> reduce_block(int64_t off, int64_t n) const {
    std::vector<float> sum(static_cast<size_t>(n), 0.f), tmp(static_cast<size_t>(n));
    for (int r = 0; r < world_size(); ++r) {
      const Slot& s = slot(r);
      const char* base = static_cast<const char*>(s.data) + size_t(off) * dtype_size(s.dtype);
      if (s.dtype == DType::F32) {
        const float* src = reinterpret_cast<const float*>(base);
        for (int64_t i = 0; i < n; ++i) sum[size_t(i)] += src[i];
      } else {
        convert_to_f32(s.dtype, base, tmp.data(), size_t(n));
        for (int64_t i = 0; i < n; ++i) sum[size_t(i)] += tmp[size_t(i)];
      }
    }
    return sum;
  }
  static void store(const std::vector<float>& v, void* dst, DType dt) {
    if (v.empty()) return;
    if (dt == DType::F32) {
      std::memcpy(dst, v.data(), v.size() * sizeof(float));
    } else {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < v.size(); ++i) d[i] = f32_to_bf16(v[i]);
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
  std::exception_ptr first = first_root_cause(errors);
  if (first) std::rethrow_exception(first);
}

std::exception_ptr first_root_cause(const std::vector<std::exception_ptr>& errors) {
  // Prefer the root cause over the "aborted" errors it triggered in other ranks.
  std::exception_ptr first;
  for (auto& e : errors) {
    if (!e) continue;
    if (!first) first = e;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      if (std::string(ex.what()).rfind("communicator aborted", 0) != 0) return e;
    } catch (...) {
    }
  }
  return first;
}

}  // namespace moeserve
