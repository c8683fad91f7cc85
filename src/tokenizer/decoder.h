// Decoders (`decoder`): ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence;
// and post-processors (`post_processor`): TemplateProcessing (single sequence),
// ByteLevel (ids unchanged), RobertaProcessing, BertProcessing, Sequence.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace moeserve::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // HF decode_chain: tokens in, tokens out; the final text is their concatenation.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // True for a ByteFallback decoder anywhere in the chain: a run of <0xXX> tokens is
  // validated as a whole, so streaming must not cut inside such a run.
  virtual bool groups_byte_tokens() const { return false; }
};
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j);

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Adds the special tokens of a single sequence (called only with add_special_tokens).
  virtual void process(std::vector<int32_t>& ids) const = 0;
};
std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j);

}  // namespace moeserve::tok
