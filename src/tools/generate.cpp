#include "tools/generate.h"

#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "core/error.h"

namespace moeserve {

GenerateResult generate(ModelExecutor& exec, const GenerateOptions& o) {
  const ExecutorInfo info = exec.info();
  MS_CHECK(!o.prompt_ids.empty(), "generate: empty prompt");
  MS_CHECK(o.max_tokens >= 0, "generate: max_tokens must be >= 0");
  const int total = int(o.prompt_ids.size()) + o.max_tokens;
  MS_CHECK(total <= info.max_model_len, "generate: prompt + max_tokens = {} exceeds max_model_len {}", total,
           info.max_model_len);
  const int blocks = (total + info.block_size - 1) / info.block_size;
  MS_CHECK(blocks <= info.num_kv_blocks, "generate: {} tokens need {} KV blocks, the pool has {}", total, blocks,
           info.num_kv_blocks);
  for (int32_t t : o.prompt_ids)
    MS_CHECK(t >= 0 && t < info.vocab_size, "generate: prompt token id {} out of range [0, {})", t, info.vocab_size);
  SequenceStep step;
  step.seq_id = 0;
  for (int b = 0; b < blocks; ++b) step.block_table.push_back(b);  // contiguous
  GenerateResult res;
  res.vocab_size = info.vocab_size;
  // The engine seeds a request's generator with its seed and draws through sample_token.
  std::mt19937_64 rng(o.seed);
  SamplingParams sp;
  sp.temperature = o.temperature;
  sp.seed = o.seed;
  // Prefill (optionally chunked), then decode.
  std::vector<int32_t> seq = o.prompt_ids;
  const int chunk = o.prefill_chunk > 0 ? o.prefill_chunk : int(seq.size());
  StepResult r;
  for (size_t s = 0; s < o.prompt_ids.size(); s += chunk) {
    const size_t e = std::min(o.prompt_ids.size(), s + size_t(chunk));
    step.tokens.assign(o.prompt_ids.begin() + s, o.prompt_ids.begin() + e);
    step.start_pos = int32_t(s);
    step.need_logits = e == o.prompt_ids.size();
    StepBatch batch{{step}};
    r = exec.execute(batch);
  }
  for (int k = 0; k < o.max_tokens; ++k) {
    MS_CHECK(int(r.logits.size()) == info.vocab_size, "executor returned {} logits, expected {}", r.logits.size(),
             info.vocab_size);
    const int32_t tok = sample_token(std::span<const float>(r.logits), sp, rng);
    res.generated_ids.push_back(tok);
    if (o.keep_logits) res.logits.insert(res.logits.end(), r.logits.begin(), r.logits.end());
    seq.push_back(tok);
    if (k + 1 == o.max_tokens) break;
    step.tokens = {tok};
    step.start_pos = int32_t(seq.size()) - 1;
    step.need_logits = true;
    StepBatch batch{{step}};
    r = exec.execute(batch);
  }
  return res;
}

void write_npy_f32(const std::string& path, const float* data, int64_t rows, int64_t cols) {
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, cols);
  // Magic (6) + version (2) + header length (2) + header, padded with spaces and a
  // newline so the data starts at a multiple of 64 bytes.
  const size_t pad = 64 - (10 + header.size() + 1) % 64;
  header += std::string(pad % 64, ' ') + "\n";
  std::ofstream f(path, std::ios::binary);
  MS_CHECK(f.good(), "cannot write {}", path);
  const char magic[] = "\x93NUMPY\x01\x00";
  f.write(magic, 8);
  const uint16_t hl = uint16_t(header.size());
  const char hlb[2] = {char(hl & 0xff), char(hl >> 8)};
  f.write(hlb, 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(reinterpret_cast<const char*>(data), std::streamsize(rows * cols * sizeof(float)));
  MS_CHECK(f.good(), "error writing {}", path);
}

std::vector<float> read_npy_f32(const std::string& path, int64_t* rows, int64_t* cols) {
  std::ifstream f(path, std::ios::binary);
  MS_CHECK(f.good(), "cannot open {}", path);
  char magic[10];
  f.read(magic, 10);
  MS_CHECK(f.good() && std::memcmp(magic, "\x93NUMPY", 6) == 0, "{}: not a .npy file", path);
  size_t hl = 0;
  if (magic[6] == 1) {
    hl = uint8_t(magic[8]) | (size_t(uint8_t(magic[9])) << 8);
  } else {
    char more[2];
    f.read(more, 2);
    hl = uint8_t(magic[8]) | (size_t(uint8_t(magic[9])) << 8) | (size_t(uint8_t(more[0])) << 16) |
         (size_t(uint8_t(more[1])) << 24);
  }
  std::string header(hl, '\0');
  f.read(header.data(), std::streamsize(hl));
  MS_CHECK(header.find("'<f4'") != std::string::npos, "{}: expected dtype <f4", path);
  MS_CHECK(header.find("'fortran_order': False") != std::string::npos, "{}: expected C order", path);
  const size_t s = header.find("'shape': (");
  MS_CHECK(s != std::string::npos, "{}: no shape in header", path);
  long long r = 0, c = 1;
  int n = std::sscanf(header.c_str() + s + 10, "%lld, %lld", &r, &c);
  MS_CHECK(n >= 1, "{}: bad shape in header", path);
  *rows = r;
  *cols = n == 2 ? c : 1;
  std::vector<float> v(size_t(r * (*cols)));
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  MS_CHECK(f.good(), "{}: truncated data", path);
  return v;
}

}  // namespace moeserve
