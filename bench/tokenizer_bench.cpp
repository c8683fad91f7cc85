// Tokenizer encode throughput (single thread): encodes every document of a corpus
// (0x1E-separated, see scripts/make_tokenizer_bench_corpus.py) and prints MB/s per pass
// as one JSON line. Compare with bench/tokenizer_bench_hf.py on the same corpus.
//   tokenizer_bench TOKENIZER_JSON CORPUS [PASSES]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tokenizer_bench TOKENIZER_JSON CORPUS [PASSES]\n");
    return 2;
  }
  int passes = argc > 3 ? std::atoi(argv[3]) : 3;
  auto t_load = std::chrono::steady_clock::now();
  auto tok = moeserve::Tokenizer::from_file(argv[1]);
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  std::ifstream f(argv[2], std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "cannot open %s\n", argv[2]);
    return 2;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  std::string raw = ss.str();
  std::vector<std::string_view> docs;
  size_t b = 0;
  for (size_t i = 0; i <= raw.size(); ++i) {
    if (i == raw.size() || raw[i] == '\x1e') {
      docs.emplace_back(raw.data() + b, i - b);
      b = i + 1;
    }
  }
  double first = 0, best = 0;
  size_t ntok = 0;
  for (int p = 0; p < passes; ++p) {
    auto t0 = std::chrono::steady_clock::now();
    ntok = 0;
    for (auto d : docs) ntok += tok->encode(d, false).size();
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double rate = static_cast<double>(raw.size()) / dt / 1e6;
    if (p == 0) first = rate;
    best = std::max(best, rate);
  }
  std::printf("{\"impl\": \"moeserve\", \"bytes\": %zu, \"docs\": %zu, \"tokens\": %zu, \"load_s\": %.3f, "
              "\"mb_per_s_first\": %.2f, \"mb_per_s_best\": %.2f}\n",
              raw.size(), docs.size(), ntok, load_s, first, best);
  return 0;
}
