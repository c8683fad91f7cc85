#include "structured/constraint.h"

#include "structured/json_schema.h"
#include "structured/regex.h"

namespace moeserve::structured {

uint64_t ConstraintSpec::hash() const {
  uint64_t h = 1469598103934665603ull;
  auto add = [&](std::string_view s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
  };
  add(std::to_string(static_cast<int>(kind)));
  add(any_whitespace ? "ws" : "compact");
  add(text);
  for (auto& c : choices) add(c);
  return h;
}

Grammar build_grammar(const ConstraintSpec& spec) {
  JsonSchemaOptions o;
  o.any_whitespace = spec.any_whitespace;
  switch (spec.kind) {
    case ConstraintKind::JsonSchema: return grammar_from_json_schema_text(spec.text, o);
    case ConstraintKind::JsonObject: return grammar_for_any_json_object(o);
    case ConstraintKind::Regex: return grammar_from_regex(spec.text);
    case ConstraintKind::Choice: return grammar_from_choices(spec.choices);
    case ConstraintKind::Grammar: return parse_ebnf(spec.text);
    case ConstraintKind::ToolCalls: throw GrammarError("a tool-call constraint needs its parser's grammar builder");
  }
  throw GrammarError("unknown constraint kind");
}

std::shared_ptr<CompiledGrammar> GrammarCache::get(const ConstraintSpec& spec,
                                                   const std::shared_ptr<const TokenVocab>& vocab,
                                                   const std::function<Grammar()>& build) {
  const uint64_t key = spec.hash() ^ (vocab->fingerprint * 0x9e3779b97f4a7c15ull);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      if (it->second->second->memory_bytes() < max_bytes_) {
        lru_.splice(lru_.begin(), lru_, it->second);
        ++hits_;
        return it->second->second;
      }
      lru_.erase(it->second);
      index_.erase(it);
    }
    ++misses_;
  }
  // Compile outside the lock (errors propagate to the caller: a 400).
  auto compiled = std::make_shared<CompiledGrammar>(build ? build() : build_grammar(spec), vocab);
  compiled->initial_state();  // "matches nothing" surfaces here, at compile time
  // Token classes for the states near the start, built on a worker thread while the request
  // waits for its prefill: the first document's masks then come from classes, not trie walks.
  if (warmup_) compiled->start_warmup();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second->second;
  lru_.emplace_front(key, compiled);
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return compiled;
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

}  // namespace moeserve::structured
