#include "dist/collective_check.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "dist/nccl_communicator.h"

namespace moeserve {
namespace {

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) {
    MS_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)) == cudaSuccess, "check_collectives: cudaMalloc");
  }
  ~DevBuf() { cudaFree(p); }
  Tensor t(DType dt, Shape s) const { return Tensor::view(p, dt, std::move(s), Device::CUDA); }
};

void h2d(void* dst, const void* src, size_t n, cudaStream_t s) {
  MS_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s) == cudaSuccess, "h2d");
}
template <typename T>
std::vector<T> d2h(const void* src, size_t count, cudaStream_t s) {
  std::vector<T> v(count);
  MS_CHECK(cudaMemcpyAsync(v.data(), src, count * sizeof(T), cudaMemcpyDeviceToHost, s) == cudaSuccess, "d2h");
  MS_CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
  return v;
}

// Small integers: every sum of W of them is exact in f32 and bf16.
float val(int rank, int64_t i) { return float((rank * 7 + i * 3) % 13) - 6.f; }

}  // namespace

CollectiveCheckResult check_collectives(Communicator& c, cudaStream_t s, size_t bench_bytes) {
  CollectiveCheckResult res;
  const int W = c.world_size(), R = c.rank();
  auto expect = [&](bool ok, const std::string& what) {
    ++res.checks;
    if (!ok) res.failures.push_back("rank " + std::to_string(R) + ": " + what);
  };
  const int64_t n = 1000;  // per-rank block
  DevBuf a(size_t(W * n) * 4), b(size_t(W * n) * 4);
  // all_reduce F32
  {
    std::vector<float> h(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) h[size_t(i)] = val(R, i);
    h2d(a.p, h.data(), h.size() * 4, s);
    Tensor t = a.t(DType::F32, {n});
    c.all_reduce_sum(t);
    auto got = d2h<float>(a.p, size_t(n), s);
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) {
      float e = 0;
      for (int r = 0; r < W; ++r) e += val(r, i);
      ok &= got[size_t(i)] == e;
    }
    expect(ok, "all_reduce_sum F32");
  }
  // all_reduce BF16
  {
    std::vector<uint16_t> h(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) h[size_t(i)] = f32_to_bf16(val(R, i));
    h2d(a.p, h.data(), h.size() * 2, s);
    Tensor t = a.t(DType::BF16, {n});
    c.all_reduce_sum(t);
    auto got = d2h<uint16_t>(a.p, size_t(n), s);
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) {
      float e = 0;
      for (int r = 0; r < W; ++r) e += val(r, i);
      ok &= bf16_to_f32(got[size_t(i)]) == e;
    }
    expect(ok, "all_reduce_sum BF16");
  }
  // all_gather I32
  {
    std::vector<int32_t> h(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) h[size_t(i)] = int32_t(R * 100000 + i);
    h2d(a.p, h.data(), h.size() * 4, s);
    Tensor out = b.t(DType::I32, {W, n});
    c.all_gather(a.t(DType::I32, {n}), out);
    auto got = d2h<int32_t>(b.p, size_t(W * n), s);
    bool ok = true;
    for (int r = 0; r < W; ++r)
      for (int64_t i = 0; i < n; ++i) ok &= got[size_t(r * n + i)] == r * 100000 + i;
    expect(ok, "all_gather I32");
  }
  // reduce_scatter F32
  {
    std::vector<float> h(static_cast<size_t>(W * n));
    for (int64_t i = 0; i < W * n; ++i) h[size_t(i)] = val(R, i);
    h2d(a.p, h.data(), h.size() * 4, s);
    Tensor out = b.t(DType::F32, {n});
    c.reduce_scatter_sum(a.t(DType::F32, {W * n}), out);
    auto got = d2h<float>(b.p, size_t(n), s);
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) {
      float e = 0;
      for (int r = 0; r < W; ++r) e += val(r, R * n + i);
      ok &= got[size_t(i)] == e;
    }
    expect(ok, "reduce_scatter_sum F32");
  }
  // all_to_all I32: block j of rank i = 1e6 i + 1e3 j + k
  {
    std::vector<int32_t> h(static_cast<size_t>(W * n));
    for (int j = 0; j < W; ++j)
      for (int64_t k = 0; k < n; ++k) h[size_t(j * n + k)] = int32_t(1000000 * R + 1000 * j + k % 1000);
    h2d(a.p, h.data(), h.size() * 4, s);
    Tensor out = b.t(DType::I32, {W * n});
    c.all_to_all(a.t(DType::I32, {W * n}), out);
    auto got = d2h<int32_t>(b.p, size_t(W * n), s);
    bool ok = true;
    for (int j = 0; j < W; ++j)
      for (int64_t k = 0; k < n; ++k) ok &= got[size_t(j * n + k)] == int32_t(1000000 * j + 1000 * R + k % 1000);
    expect(ok, "all_to_all I32");
  }
  // all_to_allv: rank i sends (i + 2j) % 3 * 100 elements to rank j (some blocks empty)
  {
    auto cnt = [](int i, int j) { return int64_t((i + 2 * j) % 3) * 100; };
    std::vector<int64_t> send(static_cast<size_t>(W)), recv(static_cast<size_t>(W));
    std::vector<int32_t> h;
    for (int j = 0; j < W; ++j) {
      send[size_t(j)] = cnt(R, j);
      recv[size_t(j)] = cnt(j, R);
      for (int64_t k = 0; k < cnt(R, j); ++k) h.push_back(int32_t(1000000 * R + 1000 * j + k));
    }
    if (!h.empty()) h2d(a.p, h.data(), h.size() * 4, s);
    Tensor out = b.t(DType::I32, {W * n});
    c.all_to_allv(a.t(DType::I32, {W * n}), send, out, recv);
    auto got = d2h<int32_t>(b.p, size_t(W * n), s);
    bool ok = true;
    int64_t p = 0;
    for (int j = 0; j < W; ++j)
      for (int64_t k = 0; k < cnt(j, R); ++k) ok &= got[size_t(p++)] == int32_t(1000000 * j + 1000 * R + k);
    expect(ok, "all_to_allv I32");
  }
  // broadcast from the last rank
  {
    std::vector<int32_t> h(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) h[size_t(i)] = int32_t(R * 7 + i);
    h2d(a.p, h.data(), h.size() * 4, s);
    Tensor t = a.t(DType::I32, {n});
    c.broadcast(t, W - 1);
    auto got = d2h<int32_t>(a.p, size_t(n), s);
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) ok &= got[size_t(i)] == int32_t((W - 1) * 7 + i);
    expect(ok, "broadcast");
  }
  c.barrier();
  ++res.checks;
  // Timing: mean all-reduce latency, small (a decode step's hidden state: 3072 BF16) and large.
  auto time_ar = [&](size_t bytes) {
    DevBuf buf(bytes);
    Tensor t = buf.t(DType::BF16, {int64_t(bytes / 2)});
    for (int i = 0; i < 5; ++i) c.all_reduce_sum(t);
    c.barrier();
    const int iters = 50;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) c.all_reduce_sum(t);
    MS_CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
  };
  res.small_all_reduce_us = time_ar(3072 * 2);
  if (bench_bytes) res.all_reduce_us = time_ar(bench_bytes);
  return res;
}

CollectiveCheckResult check_nccl_collectives(const NcclRank& r, size_t bench_bytes) {
  MS_CHECK(!r.stream, "check_nccl_collectives: rank {} makes its own stream (pass none)", r.rank);
  MS_CHECK(cudaSetDevice(r.device) == cudaSuccess, "cudaSetDevice {}", r.device);
  cudaStream_t s;
  MS_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } guard{s};
  NcclCommunicator c(r.id, r.world, r.rank, r.device, s, r.p2p);  // destroyed before the stream
  return check_collectives(c, s, bench_bytes);
}

}  // namespace moeserve
