#include "structured/matcher.h"

#include <algorithm>
#include <chrono>
#include <fmt/format.h>
#include <iterator>
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
  // Nodes were made in preorder (sorted insertion), so a subtree is a contiguous id range
  // ending where the last child's subtree ends.
  trie.subtree_end.assign(nodes.size(), 0);
  for (int32_t n = static_cast<int32_t>(nodes.size()) - 1; n >= 0; --n)
    trie.subtree_end[n] = nodes[n].kids.empty() ? n + 1 : trie.subtree_end[nodes[n].kids.back().second];
  trie.parent.assign(nodes.size(), -1);
  trie.depth.assign(nodes.size(), 0);
  for (size_t n = 0; n < nodes.size(); ++n)
    for (auto [b, c] : nodes[n].kids) {
      trie.parent[c] = static_cast<int32_t>(n);
      trie.depth[c] = trie.depth[n] + 1;
    }
  trie.rank_node.assign(trie.tok_ids.size(), 0);
  for (size_t n = 0; n < nodes.size(); ++n)
    for (int32_t k = trie.tok_begin[n]; k < trie.tok_begin[n + 1]; ++k) trie.rank_node[k] = static_cast<int32_t>(n);
  trie.rank_offset.assign(1, 0u);
  for (int32_t id : trie.tok_ids) {
    trie.rank_bytes += token_bytes[id];
    trie.rank_offset.push_back(static_cast<uint32_t>(trie.rank_bytes.size()));
  }
  trie_token_bits.assign(mask_words(), 0u);
  for (int32_t id : trie.tok_ids) trie_token_bits[id >> 5] |= 1u << (id & 31);
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
      rule_of_pos_.resize(pos_.size() + a.size() + 1, static_cast<int32_t>(r));
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
  analyse_rules(g);
  // A grammar whose root derives no string (an empty type list, a rule without alternatives,
  // only endless recursion) is refused here, while compiling (a 400), rather than by the first
  // Matcher on the engine's sampling path.
  if (!root_productive_) throw GrammarError("the grammar matches nothing (no string derives from its root rule)");
}

void CompiledGrammar::analyse_rules(const Grammar& g) {
  // Worklists over "who references whom", so long chains of helper rules stay linear-ish.
  const size_t nr = g.rules.size();
  std::vector<std::vector<int32_t>> users(nr);
  for (size_t r = 0; r < nr; ++r)
    for (auto& a : g.rules[r].alts)
      for (auto& s : a)
        if (s.is_rule()) users[s.rule].push_back(static_cast<int32_t>(r));
  // Productive: some alternative whose symbols all derive a string.
  std::vector<char> productive(nr, 0);
  std::vector<int32_t> work(nr);
  std::iota(work.begin(), work.end(), 0);
  while (!work.empty()) {
    int32_t r = work.back();
    work.pop_back();
    if (productive[r]) continue;
    for (auto& a : g.rules[r].alts) {
      bool ok = std::all_of(a.begin(), a.end(),
                            [&](const Symbol& s) { return s.is_rule() ? productive[s.rule] != 0 : s.bytes.any(); });
      if (ok) {
        productive[r] = 1;
        for (int32_t u : users[r]) work.push_back(u);
        break;
      }
    }
  }
  all_productive_ = std::all_of(productive.begin(), productive.end(), [](char c) { return c != 0; });
  root_productive_ = productive[g.root] != 0;
  // FIRST (bytes) of each rule.
  std::vector<bool> nul = g.nullable();
  std::vector<ByteSet> first(nr);
  work.resize(nr);
  std::iota(work.begin(), work.end(), 0);
  std::vector<char> queued(nr, 1);
  while (!work.empty()) {
    int32_t r = work.back();
    work.pop_back();
    queued[r] = 0;
    ByteSet f;
    for (auto& a : g.rules[r].alts)
      for (auto& s : a) {
        if (!s.is_rule()) { f |= s.bytes; break; }
        f |= first[s.rule];
        if (!nul[s.rule]) break;
      }
    if (f != first[r]) {
      first[r] = f;
      for (int32_t u : users[r])
        if (!queued[u]) { queued[u] = 1; work.push_back(u); }
    }
  }
  // FOLLOW: A in B ::= x A y gets FIRST(y), and FOLLOW(B) when y is nullable (edge B -> A).
  follow_.assign(nr, ByteSet());
  std::vector<std::vector<int32_t>> inherits(nr);  // B -> [A...]
  for (size_t b = 0; b < nr; ++b)
    for (auto& a : g.rules[b].alts) {
      ByteSet rest;
      bool rest_nullable = true;
      for (size_t i = a.size(); i-- > 0;) {
        const Symbol& s = a[i];
        if (s.is_rule()) {
          follow_[s.rule] |= rest;
          if (rest_nullable) inherits[b].push_back(s.rule);
          if (nul[s.rule]) rest |= first[s.rule];
          else { rest = first[s.rule]; rest_nullable = false; }
        } else {
          rest = s.bytes;
          rest_nullable = false;
        }
      }
    }
  work.resize(nr);
  std::iota(work.begin(), work.end(), 0);
  std::fill(queued.begin(), queued.end(), 1);
  while (!work.empty()) {
    int32_t b = work.back();
    work.pop_back();
    queued[b] = 0;
    for (int32_t a : inherits[b]) {
      ByteSet merged = follow_[a] | follow_[b];
      if (merged != follow_[a]) {
        follow_[a] = merged;
        if (!queued[a]) { queued[a] = 1; work.push_back(a); }
      }
    }
  }
}

size_t CompiledGrammar::memory_bytes() const {
  size_t dense = 0;
  for (auto& st : states_) dense += st.next ? 256 * sizeof(int32_t) : 0;
  return pos_.size() * sizeof(Pos) + nodes_.size() * 28 + states_.size() * 96 + dense +
         masks_.size() * size_t(vocab_->mask_words()) * 4 + class_bytes_;
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
  bool accept = false, ctx = false;
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
    } else if (parent == kCtx) {
      ctx = true;
    } else if (parent < 0) {
      accept = true;
    } else {
      work.push_back(parent);
    }
  }
  std::sort(ready.begin(), ready.end());
  if (ready.empty() && !accept && !ctx) return -1;
  auto& ids = state_ids_[(accept ? 1 : 0) + (ctx ? 2 : 0)];
  auto it = ids.find(ready);
  if (it != ids.end()) return it->second;
  State st;
  st.accept = accept;
  st.ctx = ctx;
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

void CompiledGrammar::compute_mask_full_locked(int32_t state, std::span<uint32_t> mask) {
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

const CompiledGrammar::PosClass* CompiledGrammar::position_class_locked(const std::vector<int32_t>& key) {
  if (auto it = classes_.find(key); it != classes_.end()) return it->second.get();
  if (class_bytes_ >= kMaxClassBytes) return nullptr;
  const auto& t = vocab_->trie;
  // The key's frames on the sentinel (or on the real bottom when the key ends in -1).
  const bool to_root = key.back() == -1;
  const size_t nf = key.size() - (to_root ? 1 : 0);
  int32_t seed = to_root ? -1 : kCtx;
  for (size_t i = nf; i-- > 0;) seed = node(key[i], seed);
  static const ByteSet kNone;
  const ByteSet& follow = to_root ? kNone : follow_[rule_of_pos_[key[nf - 1]]];
  // Walk the trie from position `pos` over the stack sentinel. A frame is (trie node, local
  // state or -1, whether a path already left the rule with a byte FOLLOW allows, i.e. the
  // subtree's tokens need the real stack unless a local path accepts them).
  struct Frame {
    int32_t tn, st;
    bool unc;
  };
  std::vector<Frame> stack{{0, make_state({seed}), false}};
  std::vector<int32_t> accepted, uncertain;
  auto all_in_subtree = [&](int32_t c, std::vector<int32_t>& out) {
    for (int32_t k = t.tok_begin[c]; k < t.tok_begin[t.subtree_end[c]]; ++k) out.push_back(k);
  };
  while (!stack.empty()) {
    Frame f = stack.back();
    stack.pop_back();
    const bool ctx = states_[f.st].ctx;
    const ByteSet first = states_[f.st].first;  // a copy: step_locked may grow states_
    for (int32_t e = t.child_begin[f.tn]; e < t.child_begin[f.tn + 1]; ++e) {
      const uint8_t b = t.child_byte[e];
      const int32_t c = t.child_node[e];
      const bool unc = f.unc || (ctx && follow.test(b));
      const int32_t ns = first.test(b) ? step_locked(f.st, b) : -1;
      if (ns < 0) {
        if (unc) all_in_subtree(c, uncertain);
        continue;
      }
      // Ends here: a scan-ready local node (or the real end) means accepted under any stack;
      // having only completed the frames is accepted when no rule can dead-end after them.
      const bool ok = !states_[ns].nodes.empty() || states_[ns].accept || all_productive_;
      for (int32_t k = t.tok_begin[c]; k < t.tok_begin[c + 1]; ++k) (ok ? accepted : uncertain).push_back(k);
      if (t.child_begin[c] != t.child_begin[c + 1]) stack.push_back({c, ns, unc});
    }
  }
  auto pc = std::make_unique<PosClass>();
  std::sort(uncertain.begin(), uncertain.end());
  pc->uncertain = std::move(uncertain);
  const size_t n_trie = t.tok_ids.size();
  const size_t rejected = n_trie - accepted.size() - pc->uncertain.size();
  const size_t bitset_words = static_cast<size_t>(vocab_->mask_words());
  if (accepted.size() <= bitset_words && accepted.size() <= rejected) {
    pc->kind = PosClass::kList;
    for (int32_t k : accepted) pc->ids.push_back(t.tok_ids[k]);
  } else if (rejected <= bitset_words) {
    pc->kind = PosClass::kRejectedList;
    std::vector<char> keep(n_trie, 0);
    for (int32_t k : accepted) keep[k] = 1;
    for (int32_t k : pc->uncertain) keep[k] = 1;
    for (size_t k = 0; k < n_trie; ++k)
      if (!keep[k]) pc->ids.push_back(t.tok_ids[k]);
  } else {
    pc->kind = PosClass::kBits;
    pc->bits.assign(bitset_words, 0u);
    for (int32_t k : accepted) {
      int32_t id = t.tok_ids[k];
      pc->bits[id >> 5] |= 1u << (id & 31);
    }
  }
  class_bytes_ += pc->bytes();
  return classes_.emplace(key, std::move(pc)).first->second.get();
}

std::vector<std::vector<int32_t>> CompiledGrammar::class_keys_locked(int32_t state) {
  std::vector<std::vector<int32_t>> keys;
  for (int32_t n : states_[state].nodes) {
    std::vector<int32_t> key;
    int32_t cur = n;
    for (int f = 0; f <= kClassFrames && cur >= 0; ++f) {
      key.push_back(nodes_[cur].first);
      cur = nodes_[cur].second;
    }
    if (cur == -1) key.push_back(-1);
    keys.push_back(std::move(key));
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

size_t CompiledGrammar::warm_classes(size_t max_classes, size_t max_states, double budget_ms) {
  const auto t0 = std::chrono::steady_clock::now();
  auto over = [&] {
    return stop_warmup_.load(std::memory_order_relaxed) ||
           std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() > budget_ms;
  };
  // One unit of work per lock hold; a fill_mask waiting for the lock goes first.
  auto locked = [&](auto&& fn) {
    while (mask_waiting_.load(std::memory_order_relaxed) > 0 && !over()) std::this_thread::yield();
    std::lock_guard<std::mutex> lock(mu_);
    return fn();
  };
  const int32_t start = initial_state();
  std::vector<int32_t> queue{start};
  std::unordered_map<int32_t, char> seen{{start, 1}};
  size_t built = 0;
  for (size_t qi = 0; qi < queue.size() && qi < max_states && built < max_classes && !over(); ++qi) {
    const int32_t st = queue[qi];
    const auto keys = locked([&] { return class_keys_locked(st); });
    for (const auto& key : keys) {
      if (built >= max_classes || over()) break;
      const int r = locked([&] {
        if (classes_.count(key)) return 0;
        if (class_bytes_ >= kWarmClassBytes) return -1;
        return position_class_locked(key) ? 1 : -1;
      });
      if (r < 0) return built;  // over kWarmClassBytes / kMaxClassBytes
      built += size_t(r);
    }
    locked([&] {
      for (int b = 0; b < 256; ++b) {
        if (!states_[st].first.test(uint8_t(b))) continue;
        const int32_t ns = step_locked(st, uint8_t(b));
        if (ns >= 0 && seen.emplace(ns, 1).second) queue.push_back(ns);
      }
      return 0;
    });
  }
  return built;
}

void CompiledGrammar::start_warmup() {
  if (warmup_.joinable()) return;
  warmup_ = std::thread([this] {
    try {
      warm_classes(kWarmClasses, kWarmStates, kWarmBudgetMs);
    } catch (const std::exception&) {
      // (A state-space limit: the request that reaches it reports it.)
    }
  });
}

void CompiledGrammar::wait_warmup() {
  if (warmup_.joinable()) warmup_.join();
}

CompiledGrammar::~CompiledGrammar() {
  stop_warmup_ = true;
  if (warmup_.joinable()) warmup_.join();
}

void CompiledGrammar::compute_mask_locked(int32_t state, std::span<uint32_t> mask) {
  const auto& t = vocab_->trie;
  // The classes of the state's distinct class keys: a node's position and the positions of
  // its next kClassFrames stack frames (ended by -1 when the stack's bottom is reached).
  std::vector<const PosClass*> classes;
  {
    std::vector<std::vector<int32_t>> keys = class_keys_locked(state);
    // A class costs about one trie walk to build, like this state's full walk: build it when
    // its key is met the second time (it will pay back), until then walk in full.
    bool all = true;
    for (auto& key : keys) {
      auto it = classes_.find(key);
      if (it != classes_.end()) {
        classes.push_back(it->second.get());
        continue;
      }
      if (++key_uses_[key] < 2) {
        all = false;
        continue;
      }
      const PosClass* pc = position_class_locked(key);
      if (!pc) return compute_mask_full_locked(state, mask);
      classes.push_back(pc);
    }
    if (!all) return compute_mask_full_locked(state, mask);
  }
  std::fill(mask.begin(), mask.end(), 0u);
  for (const PosClass* pc : classes) {
    switch (pc->kind) {
      case PosClass::kList:
        for (int32_t id : pc->ids) mask[id >> 5] |= 1u << (id & 31);
        break;
      case PosClass::kBits:
        for (size_t w = 0; w < mask.size(); ++w) mask[w] |= pc->bits[w];
        break;
      case PosClass::kRejectedList: {
        // accepted = trie tokens - rejected - uncertain; OR'd word by word through a scratch.
        thread_local std::vector<uint32_t> acc;
        acc = vocab_->trie_token_bits;
        for (int32_t id : pc->ids) acc[id >> 5] &= ~(1u << (id & 31));
        for (int32_t k : pc->uncertain) acc[t.tok_ids[k] >> 5] &= ~(1u << (t.tok_ids[k] & 31));
        for (size_t w = 0; w < mask.size(); ++w) mask[w] |= acc[w];
        break;
      }
    }
  }
  // The uncertain tokens of all positions, in byte order, minus those already accepted.
  std::vector<int32_t> cand;
  if (classes.size() == 1) {
    cand = classes[0]->uncertain;
  } else {
    for (const PosClass* pc : classes) {
      std::vector<int32_t> merged;
      merged.reserve(cand.size() + pc->uncertain.size());
      std::set_union(cand.begin(), cand.end(), pc->uncertain.begin(), pc->uncertain.end(), std::back_inserter(merged));
      cand.swap(merged);
    }
  }
  // Run them through the real automaton in byte order: consecutive tokens reuse the states of
  // their common prefix, and when a prefix dies every later candidate inside that prefix's
  // trie subtree is skipped with one binary search.
  walk_states_.assign(1, state);
  std::string_view prev;
  size_t valid = 0;  // walk_states_[0..valid] are the states after prev's first bytes
  for (size_t ci = 0; ci < cand.size();) {
    const int32_t k = cand[ci];
    const int32_t id = t.tok_ids[k];
    if ((mask[id >> 5] >> (id & 31)) & 1u) {
      ++ci;
      continue;
    }
    ++uncertain_checked_;
    std::string_view b(t.rank_bytes.data() + t.rank_offset[k], t.rank_offset[k + 1] - t.rank_offset[k]);
    size_t d = 0;
    const size_t lim = std::min({prev.size(), b.size(), valid});
    while (d < lim && prev[d] == b[d]) ++d;
    prev = b;
    int32_t st = walk_states_[d];
    walk_states_.resize(d + 1);
    for (; d < b.size(); ++d) {
      st = step_locked(st, static_cast<uint8_t>(b[d]));
      if (st < 0) break;
      walk_states_.push_back(st);
    }
    valid = walk_states_.size() - 1;
    if (st >= 0) {
      mask[id >> 5] |= 1u << (id & 31);
      ++ci;
      continue;
    }
    // b[0..d] is dead: skip the subtree of the trie node at depth d + 1 on b's path.
    int32_t dn = t.rank_node[k];
    while (t.depth[dn] > static_cast<int32_t>(d) + 1) dn = t.parent[dn];
    const int32_t end_rank = t.tok_begin[t.subtree_end[dn]];
    ci = static_cast<size_t>(std::lower_bound(cand.begin() + ci + 1, cand.end(), end_rank) - cand.begin());
  }
  if (states_[state].accept)
    for (int32_t id : vocab_->stop_ids)
      if (id >= 0 && id < vocab_->mask_size) mask[id >> 5] |= 1u << (id & 31);
}

void CompiledGrammar::fill_mask_reference(int32_t state, std::span<uint32_t> mask) {
  MS_CHECK(static_cast<int32_t>(mask.size()) == vocab_->mask_words(), "mask has {} words, expected {}", mask.size(),
           vocab_->mask_words());
  std::lock_guard<std::mutex> lock(mu_);
  compute_mask_full_locked(state, mask);
}

void CompiledGrammar::clear_mask_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  masks_.clear();
  for (auto& st : states_) st.mask_slot = -1;
}

CompiledGrammar::Stats CompiledGrammar::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.states = states_.size();
  s.position_classes = classes_.size();
  s.class_bytes = class_bytes_;
  s.cached_masks = masks_.size();
  s.uncertain_checked = uncertain_checked_;
  return s;
}

void CompiledGrammar::fill_mask(int32_t state, std::span<uint32_t> mask) {
  MS_CHECK(static_cast<int32_t>(mask.size()) == vocab_->mask_words(), "mask has {} words, expected {}", mask.size(),
           vocab_->mask_words());
  // The warm-up thread lets a waiting mask have the lock first.
  struct Waiting {
    std::atomic<int>& n;
    explicit Waiting(std::atomic<int>& c) : n(c) { n.fetch_add(1, std::memory_order_relaxed); }
    ~Waiting() { n.fetch_sub(1, std::memory_order_relaxed); }
  } waiting(mask_waiting_);
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

void Matcher::fill_mask_reference(std::span<uint32_t> mask) {
  if (terminated_) {
    std::fill(mask.begin(), mask.end(), 0u);
    return;
  }
  g_->fill_mask_reference(history_.back(), mask);
}

void Matcher::rollback(int num_tokens) {
  MS_CHECK(num_tokens >= 0 && num_tokens < static_cast<int>(history_.size()), "cannot roll back {} tokens of {}",
           num_tokens, history_.size() - 1);
  if (num_tokens > 0) terminated_ = false;
  history_.resize(history_.size() - num_tokens);
}

bool Matcher::accepting() { return terminated_ || g_->accepting(history_.back()); }

}  // namespace moeserve::structured
