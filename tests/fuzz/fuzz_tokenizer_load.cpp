// tokenizer.json loading: the input is the file; when it loads, a fixed text is encoded,
// decoded and streamed through the incremental detokenizer.
#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"

#include <exception>

using namespace moeserve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto tok = Tokenizer::from_json_string(std::string(fuzz::as_text(data, size)), "fuzz tokenizer.json");
    for (bool special : {false, true}) {
      auto ids = tok->encode("Hello, world! 123 héllo\n\tthe <think>x</think> 日本語", special);
      (void)tok->decode(ids, special);
      IncrementalDetokenizer inc(tok, special);
      for (int32_t id : ids) (void)inc.push(id);
      (void)inc.finish();
    }
  } catch (const std::exception&) {
  }
  return 0;
}
