// What the server needs from the served model's tokenizer and chat template. The real
// implementation (tokenizer_frontend.cpp) wraps tokenizer/Tokenizer and ChatTemplate; tests
// use small fakes. Every method is const and thread-safe: io threads call them concurrently.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/json_text.h"

namespace moeserve::server {

class IncrementalDecoder {
 public:
  virtual ~IncrementalDecoder() = default;
  // Text that became final with this token (complete UTF-8 only; may be empty).
  virtual std::string push(int32_t token_id) = 0;
  // Whatever is still held at the end (e.g. an incomplete UTF-8 tail, as U+FFFD).
  virtual std::string finish() = 0;
};

struct ChatRenderInputs {
  ojson messages;  // normalised OpenAI messages (content flattened to strings)
  ojson tools;     // null or the request's tools array
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  ojson extra;  // chat_template_kwargs (object)
};

class Frontend {
 public:
  virtual ~Frontend() = default;
  virtual std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const = 0;
  virtual std::unique_ptr<IncrementalDecoder> incremental(bool skip_special_tokens) const = 0;
  // Throws moeserve::Error (template error, missing template): the server answers 400.
  virtual std::string render_chat(const ChatRenderInputs& in) const = 0;
  virtual int vocab_size() const = 0;
  virtual std::vector<int32_t> eos_token_ids() const = 0;
  // Structured outputs: every token id's bytes (byte-level BPE decoded) and whether it is a
  // special token. false: not available (structured-output requests are then a 400).
  virtual bool token_bytes(std::vector<std::string>& bytes, std::vector<bool>& special) const {
    (void)bytes;
    (void)special;
    return false;
  }
};

}  // namespace moeserve::server
