// Pre-tokenizers of tokenizer.json (`pre_tokenizer`): Split (regex or string, every
// behaviour, invert), ByteLevel (with/without its GPT-2 regex, add_prefix_space), Digits,
// Metaspace, Whitespace, WhitespaceSplit, Punctuation, CharDelimiterSplit, BertPreTokenizer,
// UnicodeScripts, Sequence. Each works on a list of pieces, like HF's PreTokenizedString without offsets.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace moeserve::tok {

struct Piece {
  std::string text;
  // True when the piece starts at offset 0 of the original input (Metaspace
  // prepend_scheme "first" prepends only there).
  bool at_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their sub-pieces (empty pieces are dropped, as HF does).
  virtual void apply(std::vector<Piece>& pieces) const = 0;
};

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j);

}  // namespace moeserve::tok
