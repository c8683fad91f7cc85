#include "structured/matcher.h"

#include <algorithm>
#include <fmt/format.h>
#include <numeric>

namespace moeserve::structured {

namespace {
uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}
}  // namespace

bool byte_level_decode(std::string_view token, std::string& out) {
  // GPT-2 bytes_to_unicode: printable bytes map to themselves, the other 68 to U+0100.. in order.
  static const auto table = [] {
    std::unordered_map<uint32_t, uint8_t> m;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      m[printable ? uint32_t(b) : uint32_t(256 + n++)] = uint8_t(b);
    }
    return m;
  }();
  out.clear();
  size_t i = 0;
  while (i < token.size()) {
    uint32_t cp;
    try {
      cp = decode_utf8(token, i);
    } catch (const GrammarError&) {
      return false;
    }
    auto it = table.find(cp);
    if (it == table.end()) return false;
    out.push_back(char(it->second));
  }
  return true;
}

void TokenVocab::build() {
  if (mask_size < static_cast<int32_t>(token_bytes.size())) mask_size = static_cast<int32_t>(token_bytes.size());
  special.resize(token_bytes.size(), false);
  std::vector<int32_t> order;
  for (int32_t i = 0; i < static_cast<int32_t>(token_bytes.size()); ++i)
    if (!special[i] && !token_bytes[i].empty()) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return token_bytes[a] != token_bytes[b] ? token_bytes[a] < token_bytes[b] : a < b;
  });
  // Build a pointer trie first (children sorted because insertion is in sorted order).
  struct N {
    std::vector<std::pair<uint8_t, int32_t>> kids;
    std::vector<int32_t> toks;
  };
  std::vector<N> nodes(1);
  for (int32_t id : order) {
    int32_t cur = 0;
    for (unsigned char c : token_bytes[id]) {
      auto& k = nodes[cur].kids;
      if (k.empty() || k.back().first != c) {
        int32_t nn = static_cast<int32_t>(nodes.size());
        nodes[cur].kids.push_back({c, nn});
        nodes.emplace_back();
        cur = nn;
      } else {
        cur = k.back().second;
      }
    }
    nodes[cur].toks.push_back(id);
  }
  trie = Trie{};
  trie.child_begin.reserve(nodes.size() + 1);
  trie.tok_begin.reserve(nodes.size() + 1);
  for (auto& n : nodes) {
    trie.child_begin.push_back(static_cast<int32_t>(trie.child_byte.size()));
    trie.tok_begin.push_back(static_cast<int32_t>(trie.tok_ids.size()));
    for (auto [b, c] : n.kids) {
      trie.child_byte.push_back(b);
      trie.child_node.push_back(c);
    }
    trie.tok_ids.insert(trie.tok_ids.end(), n.toks.begin(), n.toks.end());
  }
  trie.child_begin.push_back(static_cast<int32_t>(trie.child_byte.size()));
  trie.tok_begin.push_back(static_cast<int32_t>(trie.tok_ids.size()));
  uint64_t h = mix(0, static_cast<uint64_t>(mask_size));
  for (size_t i = 0; i < token_bytes.size(); ++i) {
    h = mix(h, std::hash<std::string>()(token_bytes[i]));
    h = mix(h, special[i]);
  }
  for (int32_t s : stop_ids) h = mix(h, static_cast<uint64_t>(s) + 7);
  fingerprint = h;
}

size_t CompiledGrammar::VecHash::operator()(const std::vector<int32_t>& v) const {
  uint64_t h = v.size();
  for (int32_t x : v) h = mix(h, static_cast<uint64_t>(x));
  return h;
}

CompiledGrammar::CompiledGrammar(const Grammar& g, std::shared_ptr<const TokenVocab> vocab) : vocab_(std::move(vocab)) {
  MS_CHECK(g.root >= 0 && g.root < static_cast<int32_t>(g.rules.size()), "grammar has no root rule");
  g.check_no_left_recursion();
  root_ = g.root;
  alt_starts_.resize(g.rules.size());
  std::unordered_map<std::string, int32_t> set_ids;
  for (size_t r = 0; r < g.rules.size(); ++r) {
    for (auto& a : g.rules[r].alts) {
      alt_starts_[r].push_back(static_cast<int32_t>(pos_.size()));
      for (auto& s : a) {
        if (s.is_rule()) {
          pos_.push_back({kRule, s.rule});
        } else {
          std::string key = s.bytes.to_string();
          auto [it, fresh] = set_ids.emplace(key, static_cast<int32_t>(sets_.size()));
          if (fresh) sets_.push_back(s.bytes);
          pos_.push_back({kBytes, it->second});
        }
      }
      pos_.push_back({kEnd, 0});
    }
  }
}

size_t CompiledGrammar::memory_bytes() const {
  size_t dense = 0;
  for (auto& st : states_) dense += st.next ? 256 * sizeof(int32_t) : 0;
  return pos_.size() * sizeof(Pos) + nodes_.size() * 28 + states_.size() * 96 + dense +
         masks_.size() * size_t(vocab_->mask_words()) * 4;
}

int32_t CompiledGrammar::node(int32_t pos, int32_t parent) {
  uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
  auto [it, fresh] = node_ids_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (fresh) {
    if (nodes_.size() >= kMaxNodes)
      throw Error("structured output: the grammar's parse state grew beyond its limit (nesting too deep)");
    nodes_.push_back({pos, parent});
  }
  return it->second;
}

int32_t CompiledGrammar::make_state(std::vector<int32_t> seeds) {
  // Epsilon closure: expand rule calls (push a return frame; a call in tail position returns
  // straight to the caller's parent) and completed alternatives (pop to the return frame).
  std::vector<int32_t> ready;
  bool accept = false;
  std::vector<int32_t>& work = seeds;
  if (++stamp_ == 0) {  // wrapped: clear the stamps
    std::fill(seen_stamp_.begin(), seen_stamp_.end(), 0u);
    stamp_ = 1;
  }
  while (!work.empty()) {
    int32_t n = work.back();
    work.pop_back();
    if (seen_stamp_.size() < nodes_.size()) seen_stamp_.resize(nodes_.size() * 2, 0u);
    if (seen_stamp_[n] == stamp_) continue;
    seen_stamp_[n] = stamp_;
    auto [p, parent] = nodes_[n];
    const Pos& at = pos_[p];
    if (at.kind == kBytes) {
      ready.push_back(n);
    } else if (at.kind == kRule) {
      int32_t ret = pos_[p + 1].kind == kEnd ? parent : node(p + 1, parent);
      for (int32_t a : alt_starts_[at.arg]) work.push_back(node(a, ret));
    } else if (parent < 0) {
      accept = true;
    } else {
      work.push_back(parent);
    }
  }
  std::sort(ready.begin(), ready.end());
  if (ready.empty() && !accept) return -1;
  auto& ids = state_ids_[accept ? 1 : 0];
  auto it = ids.find(ready);
  if (it != ids.end()) return it->second;
  State st;
  st.accept = accept;
  for (int32_t n : ready) st.first |= sets_[pos_[nodes_[n].first].arg];
  st.nodes = ready;
  int32_t id = static_cast<int32_t>(states_.size());
  states_.push_back(std::move(st));
  ids.emplace(std::move(ready), id);
  return id;
}

int32_t CompiledGrammar::initial_state() {
  std::lock_guard<std::mutex> lock(mu_);
  if (initial_ < 0) {
    std::vector<int32_t> seeds;
    for (int32_t a : alt_starts_[root_]) seeds.push_back(node(a, -1));
    initial_ = make_state(std::move(seeds));
    if (initial_ < 0) throw GrammarError("the grammar matches nothing");
  }
  return initial_;
}

int32_t CompiledGrammar::step_locked(int32_t state, uint8_t byte) {
  if (!states_[state].first.test(byte)) return -1;
  if (!states_[state].next) {
    states_[state].next.reset(new int32_t[256]);
    std::fill(states_[state].next.get(), states_[state].next.get() + 256, -2);
  }
  if (int32_t known = states_[state].next[byte]; known != -2) return known;
  std::vector<int32_t> seeds;
  for (int32_t n : states_[state].nodes) {
    auto [p, parent] = nodes_[n];
    if (sets_[pos_[p].arg].test(byte)) seeds.push_back(node(p + 1, parent));
  }
  int32_t next = seeds.empty() ? -1 : make_state(std::move(seeds));
  states_[state].next[byte] = next;  // states_ may have grown: index again
  return next;
}

int32_t CompiledGrammar::step(int32_t state, uint8_t byte) {
  std::lock_guard<std::mutex> lock(mu_);
  return step_locked(state, byte);
}

int32_t CompiledGrammar::step_bytes(int32_t state, std::string_view bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (unsigned char c : bytes) {
    state = step_locked(state, c);
    if (state < 0) return -1;
  }
  return state;
}

bool CompiledGrammar::accepting(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  return states_[state].accept;
}

bool CompiledGrammar::has_continuation(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  return !states_[state].nodes.empty();
}

void CompiledGrammar::compute_mask_locked(int32_t state, std::span<uint32_t> mask) {
  std::fill(mask.begin(), mask.end(), 0u);
  const auto& t = vocab_->trie;
  // Depth-first walk of the trie; each frame is (trie node, grammar state after its bytes).
  std::vector<std::pair<int32_t, int32_t>> stack{{0, state}};
  while (!stack.empty()) {
    auto [tn, st] = stack.back();
    stack.pop_back();
    const ByteSet first = states_[st].first;  // a copy: step_locked may grow states_
    for (int32_t e = t.child_begin[tn]; e < t.child_begin[tn + 1]; ++e) {
      uint8_t b = t.child_byte[e];
      if (!first.test(b)) continue;
      int32_t ns = step_locked(st, b);
      if (ns < 0) continue;
      int32_t c = t.child_node[e];
      for (int32_t k = t.tok_begin[c]; k < t.tok_begin[c + 1]; ++k) {
        int32_t id = t.tok_ids[k];
        mask[id >> 5] |= 1u << (id & 31);
      }
      if (t.child_begin[c] != t.child_begin[c + 1]) stack.push_back({c, ns});
    }
  }
  if (states_[state].accept)
    for (int32_t id : vocab_->stop_ids)
      if (id >= 0 && id < vocab_->mask_size) mask[id >> 5] |= 1u << (id & 31);
}

void CompiledGrammar::fill_mask(int32_t state, std::span<uint32_t> mask) {
  MS_CHECK(static_cast<int32_t>(mask.size()) == vocab_->mask_words(), "mask has {} words, expected {}", mask.size(),
           vocab_->mask_words());
  std::lock_guard<std::mutex> lock(mu_);
  State& st = states_[state];
  if (st.mask_slot >= 0) {
    std::copy(masks_[st.mask_slot].begin(), masks_[st.mask_slot].end(), mask.begin());
    return;
  }
  compute_mask_locked(state, mask);
  if (masks_.size() < kMaxCachedMasks) {
    states_[state].mask_slot = static_cast<int32_t>(masks_.size());
    masks_.emplace_back(mask.begin(), mask.end());
  }
}

Matcher::Matcher(std::shared_ptr<CompiledGrammar> g) : g_(std::move(g)) { history_.push_back(g_->initial_state()); }

bool Matcher::accept_token(int32_t id) {
  if (terminated_) return false;
  const TokenVocab& v = g_->vocab();
  int32_t cur = history_.back();
  if (std::find(v.stop_ids.begin(), v.stop_ids.end(), id) != v.stop_ids.end()) {
    if (!g_->accepting(cur)) return false;
    terminated_ = true;
    history_.push_back(cur);
    return true;
  }
  if (id < 0 || id >= static_cast<int32_t>(v.token_bytes.size()) || v.special[id] || v.token_bytes[id].empty())
    return false;
  int32_t next = g_->step_bytes(cur, v.token_bytes[id]);
  if (next < 0) return false;
  history_.push_back(next);
  return true;
}

bool Matcher::is_allowed(int32_t id) {
  if (terminated_) return false;
  const TokenVocab& v = g_->vocab();
  int32_t cur = history_.back();
  if (std::find(v.stop_ids.begin(), v.stop_ids.end(), id) != v.stop_ids.end()) return g_->accepting(cur);
  if (id < 0 || id >= static_cast<int32_t>(v.token_bytes.size()) || v.special[id] || v.token_bytes[id].empty())
    return false;
  return g_->step_bytes(cur, v.token_bytes[id]) >= 0;
}

void Matcher::fill_mask(std::span<uint32_t> mask) {
  if (terminated_) {
    std::fill(mask.begin(), mask.end(), 0u);
    return;
  }
  g_->fill_mask(history_.back(), mask);
}

void Matcher::rollback(int num_tokens) {
  MS_CHECK(num_tokens >= 0 && num_tokens < static_cast<int>(history_.size()), "cannot roll back {} tokens of {}",
           num_tokens, history_.size() - 1);
  if (num_tokens > 0) terminated_ = false;
  history_.resize(history_.size() - num_tokens);
}

bool Matcher::accepting() { return terminated_ || g_->accepting(history_.back()); }

}  // namespace moeserve::structured
