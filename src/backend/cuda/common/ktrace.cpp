// Host side of the kernel timeline trace (see ktrace.h). Only built with MOESERVE_KTRACE.
#include "backend/cuda/common/ktrace.h"

#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "backend/cuda/common/cuda_check.h"

namespace moeserve::cuda {
namespace {
struct Launch {
  const void* func;
  dim3 grid, block;
};
struct State {
  std::mutex mu;
  std::vector<void (*)(KTraceBuf*)> setters;
  KTraceBuf* buf = nullptr;
  unsigned int cap = 0;
  bool notes = false;
  std::vector<Launch> launches;
};
State& state() {
  static State s;
  return s;
}
std::string demangled(const void* func) {
  const char* name = nullptr;
  if (cudaFuncGetName(&name, func) != cudaSuccess || !name) return "?";
  int st = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &st);
  std::string out = st == 0 && d ? d : name;
  std::free(d);
  for (char& c : out)
    if (c == ',') c = ';';  // CSV
  return out;
}
}  // namespace

void ktrace_register(void (*set_ptr)(KTraceBuf*)) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.setters.push_back(set_ptr);
}

bool ktrace_enable(unsigned int cap) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.buf) {
    CUDA_CHECK(cudaMalloc(&s.buf, sizeof(KTraceBuf) + size_t(cap) * sizeof(KTraceRec)));
    CUDA_CHECK(cudaMemset(s.buf, 0, sizeof(KTraceBuf)));
    CUDA_CHECK(cudaMemcpy(&s.buf->cap, &cap, sizeof(cap), cudaMemcpyHostToDevice));
    s.cap = cap;
    for (auto* f : s.setters) f(s.buf);
  }
  return true;
}

void ktrace_reset() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.buf) CUDA_CHECK(cudaMemset(&s.buf->count, 0, sizeof(unsigned int)));
}

void ktrace_notes(bool on) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (on) s.launches.clear();
  s.notes = on;
}

void ktrace_note_launch(const void* func, dim3 grid, dim3 block) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.notes) s.launches.push_back({func, grid, block});
}

bool ktrace_dump(const std::string& path) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.buf) return false;
  CUDA_CHECK(cudaDeviceSynchronize());
  unsigned int count = 0;
  CUDA_CHECK(cudaMemcpy(&count, &s.buf->count, sizeof(count), cudaMemcpyDeviceToHost));
  const unsigned int n = count < s.cap ? count : s.cap;
  std::vector<KTraceRec> rec(n);
  if (n) CUDA_CHECK(cudaMemcpy(rec.data(), s.buf->rec, n * sizeof(KTraceRec), cudaMemcpyDeviceToHost));
  FILE* f = std::fopen((path + ".csv").c_str(), "w");
  if (!f) return false;
  std::fprintf(f, "gridid,block,smid,nblocks,nthreads,t_enter,t_exit,clock\n");
  for (const auto& r : rec)
    std::fprintf(f, "%llu,%u,%u,%u,%u,%llu,%llu,%llu\n", (unsigned long long)r.gridid, r.block, r.smid, r.nblocks,
                 r.nthreads, (unsigned long long)r.t_enter, (unsigned long long)r.t_exit,
                 (unsigned long long)r.c_exit);
  std::fclose(f);
  f = std::fopen((path + ".launches.csv").c_str(), "w");
  if (!f) return false;
  std::fprintf(f, "index,nblocks,nthreads,name\n");
  for (size_t i = 0; i < s.launches.size(); ++i) {
    const Launch& l = s.launches[i];
    std::fprintf(f, "%zu,%u,%u,%s\n", i, l.grid.x * l.grid.y * l.grid.z, l.block.x * l.block.y * l.block.z,
                 demangled(l.func).c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "ktrace: %u records (%u dropped), %zu launches -> %s.csv\n", n, count - n,
               s.launches.size(), path.c_str());
  return true;
}

}  // namespace moeserve::cuda
