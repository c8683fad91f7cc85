// Golden fixtures with FP8 KV scales (tests of --kv-cache-dtype fp8 on CPU and CUDA): a copy of
// a fixture with per-layer k_scale / v_scale tensors in a third shard, and the calibrated scales
// an FP8 checkpoint would ship (amax / 448 per layer, from an f32-cache run).
#pragma once
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "golden_fixture.h"
#include "io/safetensors.h"
#include "runtime/model_executor.h"
#include "tools/generate.h"

namespace moeserve::test {

namespace fs = std::filesystem;

// A copy of a fixture with per-layer KV scales in a third shard (both vLLM spellings).
inline fs::path fixture_with_scales(const std::string& name, const std::vector<std::pair<float, float>>& scales,
                             bool output_scale_names) {
  const fs::path src = golden_fixture(name);
  static int serial = 0;  // unique per call and process (ctest may run cases in parallel)
  const fs::path dst = fs::temp_directory_path() / ("moeserve_kvscale_" + name + "_" + std::to_string(::getpid()) +
                                                    "_" + std::to_string(serial++) + (output_scale_names ? "o" : "s"));
  fs::remove_all(dst);
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src)) fs::copy(e.path(), dst / e.path().filename());
  std::vector<NamedTensor> ts;
  std::vector<std::vector<float>> keep(scales.size() * 2);
  nlohmann::json idx;
  std::ifstream(dst / "model.safetensors.index.json") >> idx;
  for (size_t l = 0; l < scales.size(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    keep[2 * l] = {scales[l].first};
    keep[2 * l + 1] = {scales[l].second};
    const std::string kn = p + (output_scale_names ? "k_proj.output_scale" : "k_scale");
    const std::string vn = p + (output_scale_names ? "v_proj.output_scale" : "v_scale");
    ts.push_back({kn, Tensor::view(keep[2 * l].data(), DType::F32, Shape{})});
    ts.push_back({vn, Tensor::view(keep[2 * l + 1].data(), DType::F32, Shape{})});
    idx["weight_map"][kn] = "kv_scales.safetensors";
    idx["weight_map"][vn] = "kv_scales.safetensors";
  }
  write_safetensors((dst / "kv_scales.safetensors").string(), ts);
  std::ofstream(dst / "model.safetensors.index.json") << idx.dump();
  return dst;
}

// Calibrated scales, as an FP8 checkpoint ships them (llm-compressor / vLLM's calibration:
// scale = amax / 448 per layer): amax of the K and V the f32 cache held after a greedy run.
inline std::vector<std::pair<float, float>> calibrated_scales(const fs::path& dir, const GenerateOptions& g) {
  ExecutorOptions eo;
  eo.model_dir = dir.string();
  eo.num_kv_blocks = 64;
  auto exec = make_cpu_executor(eo);
  (void)generate(*exec, g);
  std::vector<std::pair<float, float>> out;
  for (const auto& l : exec->kv_cache()) {
    float ka = 0.f, va = 0.f;
    for (int64_t i = 0; i < l.k.numel(); ++i) ka = std::max(ka, std::fabs(l.k.ptr<float>()[i]));
    for (int64_t i = 0; l.v.defined() && i < l.v.numel(); ++i) va = std::max(va, std::fabs(l.v.ptr<float>()[i]));
    out.push_back({ka > 0 ? ka / 448.f : 1.f, va > 0 ? va / 448.f : 1.f});
  }
  return out;
}

// Teacher forcing through an executor: step 0 prefills the prompt, step k decodes the
// reference's token k-1, so every step's logits compare with the reference row of the same
// context (a free-running greedy loop would compare different contexts after the first flip,
// and the tiny random models' top-2 margins are small). Returns [steps, V].
inline std::vector<float> teacher_forced(ModelExecutor& exec, const GoldenRef& g, int block_size = 16) {
  SequenceStep s;
  s.seq_id = 1;
  const int total = int(g.prompt.size() + g.generated.size());
  for (int b = 0; b < (total + block_size - 1) / block_size; ++b) s.block_table.push_back(63 - b);
  std::vector<float> out;
  for (size_t k = 0; k < g.generated.size(); ++k) {
    s.tokens = k == 0 ? g.prompt : std::vector<int32_t>{g.generated[k - 1]};
    s.start_pos = k == 0 ? 0 : int32_t(g.prompt.size() + k - 1);
    StepBatch batch;
    batch.seqs.push_back(s);
    const StepResult r = exec.execute(batch);
    out.insert(out.end(), r.logits.begin(), r.logits.end());
  }
  return out;
}

// Steps whose argmax differs from the reference's although the reference's top-2 margin is
// at least 2 * bound * max|ref| (an error within the bound cannot swap them): must be none.
inline int hard_flips(const std::vector<float>& got, const std::vector<float>& ref, int64_t V, double bound) {
  double den = 0;
  for (float x : ref) den = std::max(den, double(std::fabs(x)));
  int flips = 0;
  for (size_t k = 0; k * V < ref.size(); ++k) {
    const float* a = got.data() + k * V;
    const float* b = ref.data() + k * V;
    const int64_t ia = std::max_element(a, a + V) - a, ib = std::max_element(b, b + V) - b;
    std::vector<float> sorted(b, b + V);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (ia != ib && double(sorted[0] - sorted[1]) >= 2 * bound * den) ++flips;
  }
  return flips;
}

}  // namespace moeserve::test
