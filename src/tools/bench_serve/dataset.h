// `moeserve bench` workloads, seeded (--seed, default 0):
// - random: per request, input length uniform in [floor(L_in(1-r)), ceil(L_in(1+r))] (L_in minus
//   the tokenizer's special tokens) and output length in [max(1, floor(L_out(1-r))), ceil(L_out(1+r))]
//   (r = --random-range-ratio, 0 = fixed lengths, as vLLM's RandomDataset); the prompt is a run of
//   consecutive non-special token ids from a random offset, decoded, then re-encoded and
//   truncated/extended until it encodes to the target length. Without a tokenizer the prompt is
//   L_in random words (roughly one token each; input counts then come from the server's usage).
// - sharegpt: a ShareGPT JSON file; conversations with >= 2 turns, shuffled with the seed; the
//   first turn is the prompt, the second's token count the output length (or --sharegpt-output-len);
//   pairs with prompt < 4, output < 4, prompt > 1024 or prompt + output > 2048 tokens are skipped.
// - jsonl: one {"prompt": str, "output_len": int} object a line, used in order (cycled when the
//   file has fewer lines than --num-prompts).
// The random generator is std::mt19937_64, not numpy's, so prompts differ from vLLM's for the
// same seed; the length distributions are the same.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moeserve {
class Tokenizer;
}

namespace moeserve::bench {

struct SampleRequest {
  std::string prompt;
  int64_t prompt_len = 0;  // tokens (tokenizer count; word count without a tokenizer)
  int64_t expected_output_len = 0;
};

struct DatasetOptions {
  std::string name = "random";  // random | sharegpt | jsonl
  std::string path;             // sharegpt / jsonl file
  int64_t num_prompts = 1000;
  int64_t random_input_len = 1024;
  int64_t random_output_len = 128;
  double random_range_ratio = 0.0;
  std::optional<int64_t> sharegpt_output_len;
  uint64_t seed = 0;
};

// tok may be null (word-based fallback). `note` receives a one-line remark to print (e.g. the
// fallback in use, or how many ShareGPT pairs were skipped). Throws moeserve::Error on bad input.
std::vector<SampleRequest> sample_requests(const DatasetOptions& opts, const Tokenizer* tok, std::string* note);

}  // namespace moeserve::bench
