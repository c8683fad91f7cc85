// The structured-output compiler (src/structured: JSON Schema, regex, choice list, EBNF
// grammar -> Grammar -> CompiledGrammar over a small byte vocabulary) and a few matcher steps.
//
// Input: byte 0 = the kind (byte % 5: JSON schema with any whitespace, JSON schema compact,
// regex, choices (one per line), EBNF grammar); the rest is the source text, optionally
// followed by a NUL byte and a "document" whose bytes are fed to the matcher as tokens
// (token id = byte value, fuzz_vocab.h).
//
// Invariants: compiling either succeeds or throws GrammarError (the server's 400); any other
// exception escapes and is a crash (a 500). Over the document (at most kMaxSteps tokens):
// the fast token mask equals the reference mask (a plain trie walk), is_allowed agrees with
// the mask, accept_token succeeds exactly for allowed tokens, and rollback returns to the
// same position. The matcher may refuse a pathological grammar with moeserve::Error (its
// parse state outgrew CompiledGrammar::kMaxNodes; the request fails with a 400). Time is
// bounded by the compiler's own limits (GrammarLimits, JsonSchemaOptions::max_depth) and
// libFuzzer's -max_len (4096 by default) and -timeout.
#include "fuzz_common.h"
#include "fuzz_vocab.h"
#include "core/error.h"
#include "structured/constraint.h"
#include "structured/grammar.h"
#include "structured/matcher.h"

#include <memory>
#include <string>
#include <vector>

using namespace moeserve;
using namespace moeserve::structured;

namespace {

constexpr size_t kMaxSteps = 48;

ConstraintSpec spec_of(uint8_t kind, const std::string& text) {
  ConstraintSpec s;
  s.origin = "fuzz";
  switch (kind % 5) {
    case 0: s.kind = ConstraintKind::JsonSchema; s.text = text; break;
    case 1: s.kind = ConstraintKind::JsonSchema; s.text = text; s.any_whitespace = false; break;
    case 2: s.kind = ConstraintKind::Regex; s.text = text; break;
    case 3: {
      s.kind = ConstraintKind::Choice;
      size_t b = 0;
      while (b <= text.size()) {
        size_t e = text.find('\n', b);
        if (e == std::string::npos) e = text.size();
        s.choices.push_back(text.substr(b, e - b));
        b = e + 1;
      }
      break;
    }
    default: s.kind = ConstraintKind::Grammar; s.text = text; break;
  }
  return s;
}

bool bit(const std::vector<uint32_t>& mask, int32_t id) { return (mask[id / 32] >> (id % 32)) & 1u; }

void run_matcher(const std::shared_ptr<CompiledGrammar>& g, const std::string& doc) {
  Matcher m(g);
  const int words = m.mask_words();
  std::vector<uint32_t> fast(words), ref(words);
  size_t steps = 0;
  for (unsigned char c : doc) {
    if (steps++ >= kMaxSteps || m.terminated()) break;
    m.fill_mask(fast);
    m.fill_mask_reference(ref);
    FUZZ_ASSERT(fast == ref, "the token mask differs from the reference mask");
    const int32_t id = c;  // the single-byte token of c
    const bool allowed = bit(fast, id);
    FUZZ_ASSERT(m.is_allowed(id) == allowed, "is_allowed disagrees with the token mask");
    const auto before = m.position();
    const bool ok = m.accept_token(id);
    FUZZ_ASSERT(ok == allowed, "accept_token disagrees with the token mask");
    if (!ok) {
      FUZZ_ASSERT(m.position() == before, "a refused token moved the matcher");
      break;
    }
    if (steps % 7 == 0) {  // a speculative-decoding style rollback of the last token, then redo it
      m.rollback(1);
      FUZZ_ASSERT(m.position() == before, "rollback did not return to the previous position");
      FUZZ_ASSERT(m.accept_token(id), "a token accepted once was refused after a rollback");
    }
  }
  (void)m.accepting();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in{data, size};
  const uint8_t kind = in.byte();
  std::string text = in.rest();
  std::string doc;
  if (size_t z = text.find('\0'); z != std::string::npos) {
    doc = text.substr(z + 1);
    text.resize(z);
  }
  const ConstraintSpec spec = spec_of(kind, text);
  std::shared_ptr<CompiledGrammar> g;
  try {
    Grammar grammar = build_grammar(spec);
    g = std::make_shared<CompiledGrammar>(grammar, fuzz::small_vocab());
  } catch (const GrammarError&) {
    return 0;  // the documented compile error (a 400)
  }
  // Anything else thrown while compiling escapes: a crash.
  try {
    run_matcher(g, doc);
  } catch (const GrammarError&) {
    FUZZ_ASSERT(false, "the matcher threw a GrammarError after a successful compile");
  } catch (const Error&) {
    // The parse-state limit of a pathological grammar (the request fails with a clear error).
  }
  return 0;
}
