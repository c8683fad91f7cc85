#include "dist/p2p_allreduce.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "core/error.h"
#include "core/log.h"

namespace moeserve {
namespace {

constexpr int kMaxWorld = 8;

struct Args {
  void* bufs[kMaxWorld];
  unsigned* flags[kMaxWorld];
  unsigned* epoch;
  void* data;
  int world, rank, n;
  size_t max_bytes;
};

template <typename T>
__device__ float to_f(T v);
template <>
__device__ float to_f<float>(float v) { return v; }
template <>
__device__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ T from_f(float v);
template <>
__device__ float from_f<float>(float v) { return v; }
template <>
__device__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

// Sums 16-byte words: 8 bf16 or 4 f32 lanes, in f32, rank order.
template <typename T>
__device__ uint4 sum_words(const uint4* w, int world) {
  constexpr int L = 16 / sizeof(T);
  float acc[L];
#pragma unroll
  for (int j = 0; j < L; ++j) acc[j] = 0.f;
  for (int p = 0; p < world; ++p) {
    const T* v = reinterpret_cast<const T*>(&w[p]);
#pragma unroll
    for (int j = 0; j < L; ++j) acc[j] += to_f<T>(v[j]);
  }
  uint4 out;
  T* o = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int j = 0; j < L; ++j) o[j] = from_f<T>(acc[j]);
  return out;
}

// One block. `vec`: data and size are 16-byte aligned, so every thread moves whole 16-byte
// words and issues its loads from all peers before summing (remote NVLink reads overlap
// instead of queueing one after another).
template <typename T>
__global__ void one_shot_all_reduce(Args a, bool vec) {
  __shared__ unsigned epoch;
  if (threadIdx.x == 0) epoch = *reinterpret_cast<volatile unsigned*>(a.epoch) + 1;
  __syncthreads();
  const unsigned e = epoch;
  const size_t off = (e & 1) * a.max_bytes;
  T* data = static_cast<T*>(a.data);
  T* mine = reinterpret_cast<T*>(static_cast<char*>(a.bufs[a.rank]) + off);
  const int nw = vec ? int(a.n * sizeof(T) / 16) : 0;
  if (vec) {
    for (int i = threadIdx.x; i < nw; i += blockDim.x) reinterpret_cast<uint4*>(mine)[i] = reinterpret_cast<const uint4*>(data)[i];
  } else {
    for (int i = threadIdx.x; i < a.n; i += blockDim.x) mine[i] = data[i];
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x < a.world) {
    // Announce: my slot in peer p's flags. Then wait for peer p's slot in mine.
    reinterpret_cast<volatile unsigned*>(a.flags[threadIdx.x])[a.rank] = e;
    volatile unsigned* f = reinterpret_cast<volatile unsigned*>(a.flags[a.rank]) + threadIdx.x;
    while (int(*f - e) < 0) {
    }
  }
  __syncthreads();
  __threadfence_system();
  if (vec) {
    for (int i = threadIdx.x; i < nw; i += blockDim.x) {
      uint4 w[kMaxWorld];
      for (int p = 0; p < a.world; ++p)
        w[p] = __ldcv(reinterpret_cast<const uint4*>(static_cast<const char*>(a.bufs[p]) + off) + i);
      reinterpret_cast<uint4*>(data)[i] = sum_words<T>(w, a.world);
    }
  } else {
    for (int i = threadIdx.x; i < a.n; i += blockDim.x) {
      float acc = 0.f;
      for (int p = 0; p < a.world; ++p) {
        const char* base = static_cast<const char*>(a.bufs[p]) + off;
        T v;
        if constexpr (sizeof(T) == 2) {
          v = __ushort_as_bfloat16(__ldcv(reinterpret_cast<const unsigned short*>(base) + i));
        } else {
          v = __ldcv(reinterpret_cast<const float*>(base) + i);
        }
        acc += to_f<T>(v);
      }
      data[i] = from_f<T>(acc);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) *a.epoch = e;
}

void check(cudaError_t e, const char* what) { MS_CHECK(e == cudaSuccess, "p2p all-reduce: {}: {}", what, cudaGetErrorString(e)); }

}  // namespace

std::shared_ptr<P2pAllReduce> P2pAllReduce::create(const std::vector<int>& devices, size_t max_bytes) {
  const int W = int(devices.size());
  if (W < 2 || W > kMaxWorld) return nullptr;
  for (int i = 0; i < W; ++i)
    for (int j = 0; j < W; ++j) {
      if (i == j) continue;
      int ok = 0;
      if (cudaDeviceCanAccessPeer(&ok, devices[size_t(i)], devices[size_t(j)]) != cudaSuccess || !ok) {
        spdlog::info("p2p all-reduce: GPU {} cannot access GPU {}; small all-reduces stay on NCCL", devices[size_t(i)],
                     devices[size_t(j)]);
        return nullptr;
      }
    }
  int prev = 0;
  cudaGetDevice(&prev);
  std::shared_ptr<P2pAllReduce> g(new P2pAllReduce());
  g->devices_ = devices;
  g->max_bytes_ = (max_bytes + 255) / 256 * 256;
  for (int i = 0; i < W; ++i) {
    check(cudaSetDevice(devices[size_t(i)]), "cudaSetDevice");
    for (int j = 0; j < W; ++j) {
      if (i == j) continue;
      cudaError_t e = cudaDeviceEnablePeerAccess(devices[size_t(j)], 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
      else check(e, "cudaDeviceEnablePeerAccess");
    }
    void* b = nullptr;
    unsigned *f = nullptr, *ep = nullptr;
    check(cudaMalloc(&b, 2 * g->max_bytes_), "cudaMalloc");
    check(cudaMalloc(&f, sizeof(unsigned) * W), "cudaMalloc");
    check(cudaMalloc(&ep, sizeof(unsigned)), "cudaMalloc");
    check(cudaMemset(f, 0, sizeof(unsigned) * W), "cudaMemset");
    check(cudaMemset(ep, 0, sizeof(unsigned)), "cudaMemset");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    g->bufs_.push_back(b);
    g->flags_.push_back(f);
    g->epochs_.push_back(ep);
  }
  cudaSetDevice(prev);
  return g;
}

P2pAllReduce::~P2pAllReduce() {
  int prev = 0;
  cudaGetDevice(&prev);
  for (size_t i = 0; i < bufs_.size(); ++i) {
    cudaSetDevice(devices_[i]);
    cudaFree(bufs_[i]);
    cudaFree(flags_[i]);
    cudaFree(epochs_[i]);
  }
  cudaSetDevice(prev);
}

bool P2pAllReduce::accepts(const Tensor& t) const {
  return t.device == Device::CUDA && (t.dtype == DType::F32 || t.dtype == DType::BF16) && t.nbytes() <= max_bytes_ &&
         t.numel() > 0;
}

void P2pAllReduce::all_reduce(int rank, Tensor& t, cudaStream_t stream) {
  MS_CHECK(rank >= 0 && rank < world() && accepts(t), "p2p all-reduce: rank {} cannot take {} {}", rank,
           dtype_name(t.dtype), shape_str(t.shape));
  Args a{};
  for (int p = 0; p < world(); ++p) a.bufs[p] = bufs_[size_t(p)], a.flags[p] = flags_[size_t(p)];
  a.epoch = epochs_[size_t(rank)];
  a.data = t.data;
  a.world = world(), a.rank = rank, a.n = int(t.numel());
  a.max_bytes = max_bytes_;
  const bool vec = t.nbytes() % 16 == 0 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  const int threads = 1024;
  if (t.dtype == DType::F32)
    one_shot_all_reduce<float><<<1, threads, 0, stream>>>(a, vec);
  else
    one_shot_all_reduce<__nv_bfloat16><<<1, threads, 0, stream>>>(a, vec);
  check(cudaGetLastError(), "launch");
}

}  // namespace moeserve
