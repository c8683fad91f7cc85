// What a request asks for (ConstraintSpec), compiled once per (spec, vocabulary) and cached
// (GrammarCache), and the engine-facing constraint carried by SamplingParams.
#pragma once
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "structured/matcher.h"

namespace moeserve::structured {

enum class ConstraintKind { JsonSchema, JsonObject, Regex, Choice, Grammar, ToolCalls };

struct ConstraintSpec {
  ConstraintKind kind = ConstraintKind::JsonObject;
  std::string text;                  // schema JSON / regex / EBNF (ToolCalls: the grammar EBNF)
  std::vector<std::string> choices;  // Choice
  bool any_whitespace = true;
  // The request field it came from, for error messages ("response_format", "structured_outputs.json", ...).
  std::string origin;
  uint64_t hash() const;
};

// Compiles a spec to a Grammar (GrammarError on invalid input).
Grammar build_grammar(const ConstraintSpec& spec);

// The engine's view: the compiled grammar, and where the constraint starts. With a reasoning
// parser the constraint starts after the reasoning section ends: after any of
// `start_after_tokens` appears in the output (empty: from the first generated token).
struct StructuredConstraint {
  std::shared_ptr<CompiledGrammar> grammar;
  std::vector<int32_t> start_after_tokens;
};

// LRU cache of compiled grammars keyed by the spec hash and the vocabulary fingerprint.
// Thread-safe. A grammar whose lazy tables grew past `max_grammar_bytes` is replaced by a
// fresh compile for new requests (running ones keep theirs).
class GrammarCache {
 public:
  explicit GrammarCache(size_t capacity = 256, size_t max_grammar_bytes = size_t(1) << 30)
      : capacity_(capacity), max_bytes_(max_grammar_bytes) {}
  // `build` (optional) makes the Grammar instead of build_grammar(spec): forced tool calls,
  // whose grammar comes from the tool parser's family (spec.text then identifies it).
  std::shared_ptr<CompiledGrammar> get(const ConstraintSpec& spec, const std::shared_ptr<const TokenVocab>& vocab,
                                       const std::function<Grammar()>& build = {});
  size_t size() const;
  // Whether a newly compiled grammar starts its class warm-up (CompiledGrammar::start_warmup)
  // on a background thread; default on. The mask benchmark's "cold" pass turns it off.
  void set_warmup(bool on) { warmup_ = on; }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

 private:
  using Entry = std::pair<uint64_t, std::shared_ptr<CompiledGrammar>>;
  size_t capacity_, max_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;
  std::unordered_map<uint64_t, std::list<Entry>::iterator> index_;
  uint64_t hits_ = 0, misses_ = 0;
  bool warmup_ = true;
};

}  // namespace moeserve::structured
