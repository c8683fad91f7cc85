// moeserve::Tokenizer: loads a Hugging Face tokenizer.json (BPE model) and encodes /
// decodes exactly like HF `tokenizers` (`Tokenizer.encode(text, add_special_tokens)`,
// `Tokenizer.decode(ids, skip_special_tokens)`). Thread-safe: all methods are const and
// may run concurrently. See src/tokenizer/README.md for the pipeline.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moeserve {
namespace tok {
class Model;
}

class Tokenizer {
 public:
  // Throws moeserve::Error on unreadable files, bad JSON, or components that moeserve
  // does not implement (the message names the component).
  static std::shared_ptr<const Tokenizer> from_file(const std::string& tokenizer_json_path);
  // dir/tokenizer.json; without it, dir/tiktoken.model (+ dir/tokenizer_config.json) as Kimi's
  // tokenizer (from_tiktoken).
  static std::shared_ptr<const Tokenizer> from_dir(const std::string& dir);
  // Kimi's tokenization_kimi.py: tiktoken ranks + its pre-tokenizer regex + 256 special ids after
  // the base tokens, named by tokenizer_config.json's added_tokens_decoder (config_path may be
  // empty: all reserved). See tiktoken.cpp.
  static std::shared_ptr<const Tokenizer> from_tiktoken(const std::string& model_path, const std::string& config_path);
  static std::shared_ptr<const Tokenizer> from_json_string(const std::string& json, const std::string& origin);

  // Throws moeserve::Error on invalid UTF-8 (HF's Python API only accepts str, so invalid
  // bytes never reach it; we reject them instead of guessing).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Unknown ids are skipped, as HF does.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;
  size_t vocab_size() const;  // including added tokens (max id + 1)
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;

  ~Tokenizer();
  struct Impl;

 private:
  Tokenizer();
  // The tokenizer.json pipeline with `model` (null: built from j["model"]).
  static std::shared_ptr<Tokenizer> from_parsed(const nlohmann::json& j, std::unique_ptr<tok::Model> model,
                                                const std::string& origin);
  friend class IncrementalDetokenizer;
  std::unique_ptr<Impl> impl_;
};

// Streaming: emits text only when complete UTF-8; concat of deltas == decode(all ids).
// Not thread-safe (one per request stream).
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(std::shared_ptr<const Tokenizer> tok, bool skip_special_tokens);
  std::string push(int32_t id);  // new text since the last call (may be empty)
  std::string finish();          // whatever is left (e.g. trailing incomplete bytes as U+FFFD)

 private:
  std::string decode_range(size_t b, size_t e) const;
  std::shared_ptr<const Tokenizer> tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;  // kept ids (skipped/unknown ids dropped), from `base_`
  size_t prefix_ = 0;         // start of the decode window (context token)
  size_t read_ = 0;           // tokens before this index have been emitted
  std::string prefix_text_;   // decode(ids_[prefix_, read_))
};

}  // namespace moeserve
