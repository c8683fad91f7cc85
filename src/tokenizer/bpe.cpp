#include "tokenizer/bpe.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <queue>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace moeserve::tok {

Bpe::Bpe(const nlohmann::json& m) {
  vocab_.load(m.at("vocab"), "BPE");
  const StringIdMap& vocab = vocab_.map;

  auto str_or_null = [&](const char* k) -> std::optional<std::string> {
    if (!m.contains(k) || m[k].is_null()) return std::nullopt;
    return m[k].get<std::string>();
  };
  unk_token_ = str_or_null("unk_token");
  if (auto p = str_or_null("continuing_subword_prefix"); p && !p->empty()) prefix_ = *p, has_prefix_ = true;
  if (auto s = str_or_null("end_of_word_suffix"); s && !s->empty()) suffix_ = *s, has_suffix_ = true;
  fuse_unk_ = m.value("fuse_unk", false);
  byte_fallback_ = m.value("byte_fallback", false);
  ignore_merges_ = m.value("ignore_merges", false);

  const auto& merges = m.at("merges");
  MS_CHECK(merges.is_array(), "model.merges must be an array");
  merges_.reserve(merges.size() * 2);
  int32_t rank = 0;
  for (const auto& e : merges) {
    std::string a, b;
    if (e.is_string()) {
      // Legacy "a b" form: split on the first space.
      auto s = e.get<std::string>();
      auto sp = s.find(' ');
      MS_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
               "model.merges[{}] '{}' must be two tokens separated by one space", rank, s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      MS_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(),
               "model.merges[{}] must be \"a b\" or [\"a\", \"b\"], got {}", rank, e.dump());
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    }
    auto ia = vocab.find(a), ib = vocab.find(b);
    MS_CHECK(ia != vocab.end() && ib != vocab.end(), "model.merges[{}] ('{}' '{}') uses a token missing from the vocab", rank, a, b);
    std::string merged = a + (has_prefix_ && b.compare(0, prefix_.size(), prefix_) == 0 ? b.substr(prefix_.size()) : b);
    auto in = vocab.find(merged);
    MS_CHECK(in != vocab.end(), "model.merges[{}]: result '{}' is missing from the vocab", rank, merged);
    uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    merges_[key] = Merge{rank, in->second};  // a later duplicate wins, as in HF's HashMap collect
    ++rank;
  }

  byte_tokens_.assign(256, -1);
  single_byte_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(fmt::format("<0x{:02X}>", b));
    if (it != vocab.end()) byte_tokens_[b] = it->second;
    if (b < 0x80) {
      auto it2 = vocab.find(std::string(1, static_cast<char>(b)));
      if (it2 != vocab.end()) single_byte_[b] = it2->second;
    }
  }
  if (unk_token_) {
    MS_CHECK(vocab.count(*unk_token_), "model.unk_token '{}' is not in the vocab", *unk_token_);
  }
}

const Bpe::Merge* Bpe::find_merge(int32_t a, int32_t b) const {
  auto it = merges_.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
  return it == merges_.end() ? nullptr : &it->second;
}

void Bpe::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  // Initial symbols: one per character (prefix on non-first, suffix on the last),
  // byte-fallback tokens or unk for characters missing from the vocab.
  struct Sym {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Sym> syms;
  syms.reserve(w.size());
  auto add = [&](int32_t id) {
    int32_t n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, n + 1, true});
  };
  int32_t unk_pending = -1;  // unk waiting to be added (HF fuses runs of unknowns)
  int32_t unk_id = unk_token_ ? vocab_.map.find(*unk_token_)->second : -1;
  std::string buf;
  size_t i = 0;
  while (i < w.size()) {
    size_t b = i;
    auto lead = static_cast<unsigned char>(w[i]);
    i += utf8_len_of_lead(lead);
    bool first = b == 0, last = i >= w.size();
    int32_t id = -1;
    std::string_view s = w.substr(b, i - b);
    if (!has_prefix_ && !has_suffix_) {
      if (lead < 0x80) id = single_byte_[lead];
      else if (auto it = vocab_.map.find(s); it != vocab_.map.end()) id = it->second;
    } else {
      buf.clear();
      if (!first && has_prefix_) buf += prefix_;
      buf += s;
      if (last && has_suffix_) buf += suffix_;
      if (auto it = vocab_.map.find(buf); it != vocab_.map.end()) id = it->second;
      s = buf;
    }
    if (id >= 0) {
      if (unk_pending >= 0) add(unk_pending), unk_pending = -1;
      add(id);
      continue;
    }
    if (byte_fallback_) {
      bool ok = true;
      for (unsigned char c : s) ok = ok && byte_tokens_[c] >= 0;
      if (ok) {
        // HF does not flush a pending unk here; the order below mirrors it.
        for (unsigned char c : s) add(byte_tokens_[c]);
        continue;
      }
    }
    if (unk_id >= 0) {
      if (unk_pending >= 0 && !fuse_unk_) add(unk_pending);
      unk_pending = unk_id;
    }
  }
  if (unk_pending >= 0) add(unk_pending);
  if (syms.empty()) return;
  syms.back().next = -1;

  // Merge loop: min-heap of (rank, pos); stale entries are detected by re-checking the
  // pair at `pos` (same test as HF: the merge of the current pair must give new_id).
  struct Cand {
    int32_t rank, pos, new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Cand> heap;
  heap.reserve(syms.size() * 2);
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q(std::greater<Cand>(), std::move(heap));
  for (size_t k = 0; k + 1 < syms.size(); ++k)
    if (auto* m = find_merge(syms[k].id, syms[k + 1].id)) q.push({m->rank, static_cast<int32_t>(k), m->new_id});
  while (!q.empty()) {
    Cand top = q.top();
    q.pop();
    Sym& cur = syms[static_cast<size_t>(top.pos)];
    if (!cur.alive || cur.next < 0) continue;
    Sym& right = syms[static_cast<size_t>(cur.next)];
    auto* m = find_merge(cur.id, right.id);
    if (!m || m->new_id != top.new_id) continue;
    cur.id = top.new_id;
    right.alive = false;
    cur.next = right.next;
    if (cur.next >= 0) syms[static_cast<size_t>(cur.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (auto* pm = find_merge(syms[static_cast<size_t>(cur.prev)].id, cur.id)) q.push({pm->rank, cur.prev, pm->new_id});
    }
    if (cur.next >= 0) {
      if (auto* nm = find_merge(cur.id, syms[static_cast<size_t>(cur.next)].id)) q.push({nm->rank, top.pos, nm->new_id});
    }
  }
  for (auto& s : syms)
    if (s.alive) out.push_back(s.id);
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.map.find(word); it != vocab_.map.end()) {
      out.push_back(it->second);
      return;
    }
  }
  bool cacheable = word.size() <= WordCache::kMaxWordLen;
  if (cacheable && cache_.get(word, out)) return;
  size_t start = out.size();
  merge_word(word, out);
  if (cacheable) cache_.put(word, out.data() + start, out.size() - start);
}

}  // namespace moeserve::tok
