// Encode/decode with the tiny model's tokenizer (assets/tiny-tokenizer, a byte-level BPE with
// MiniMax-M2's pre-tokenizer and added tokens): the input is the text. For valid UTF-8 the
// incremental detokenizer's deltas must concatenate to decode().
#include "fuzz_common.h"
#include "server/json_text.h"
#include "tokenizer/tokenizer.h"

#include <exception>

using namespace moeserve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tok = Tokenizer::from_file(MOESERVE_SOURCE_DIR "/assets/tiny-tokenizer/tokenizer.json");
  fuzz::Input in{data, size};
  const uint8_t flags = in.byte();
  // Longer texts add little coverage and cost much time (the seeds are whole corpora).
  const std::string text = in.rest().substr(0, 2048);
  try {
    const bool special = flags & 1;
    auto ids = tok->encode(text, special);
    const std::string back = tok->decode(ids, false);
    IncrementalDetokenizer inc(tok, false);
    std::string streamed;
    for (int32_t id : ids) streamed += inc.push(id);
    streamed += inc.finish();
    if (server::valid_utf8(text)) FUZZ_ASSERT(streamed == back, "incremental detokenizer deltas differ from decode()");
    // Out-of-range and arbitrary ids: an error or text, never a crash.
    std::vector<int32_t> wild;
    for (unsigned char c : text.substr(0, 64)) wild.push_back(static_cast<int32_t>(c) * 37 - 500);
    try {
      (void)tok->decode(wild, flags & 2);
    } catch (const std::exception&) {
    }
  } catch (const std::exception&) {
  }
  return 0;
}
