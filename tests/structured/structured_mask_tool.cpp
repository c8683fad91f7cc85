// Drives the structured-output matcher from JSON on stdin, for the pytest oracle comparison
// with xgrammar (tests/structured/test_vs_xgrammar.py) and the mask benchmark
// (bench/structured_masks.py). Input:
//   {"vocab_hex": ["61", ...], "special": [ids], "stop_ids": [ids], "mask_size": N,
//    "spec": {"kind": "json_schema"|"regex"|"grammar"|"choice"|"json_object", "text": "...",
//             "choices": [...], "any_whitespace": true},
//    "prefixes": [[ids...], ...], "repeat": 1}
// Output: {"compile_ms": x, ("warmup_ms": x with "warmup": true,) "results": [{"accepted": k (tokens accepted), "mask": "hex words"
// or null when a token was rejected, "mask_us": t}], "mask_us_cold": [...], "mask_us_warm": [...]}
// Errors: {"error": "..."} and exit code 2.
#include <chrono>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "structured/constraint.h"

using namespace moeserve::structured;
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

static std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(char(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

// Mask words as hex, word by word (8 digits each, most significant first).
static std::string hex_mask(const std::vector<uint32_t>& mask) {
  static const char* hx = "0123456789abcdef";
  std::string s;
  s.reserve(mask.size() * 8);
  for (uint32_t w : mask)
    for (int k = 7; k >= 0; --k) s.push_back(hx[(w >> (4 * k)) & 15]);
  return s;
}

int main() {
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  json out;
  try {
    json job = json::parse(input);
    auto vocab = std::make_shared<TokenVocab>();
    for (auto& h : job["vocab_hex"]) vocab->token_bytes.push_back(unhex(h.get<std::string>()));
    vocab->special.assign(vocab->token_bytes.size(), false);
    for (auto& s : job.value("special", json::array())) vocab->special[s.get<int>()] = true;
    for (auto& s : job.value("stop_ids", json::array())) vocab->stop_ids.push_back(s.get<int>());
    vocab->mask_size = job.value("mask_size", 0);
    vocab->build();
    const json& sp = job["spec"];
    ConstraintSpec spec;
    std::string kind = sp["kind"];
    spec.kind = kind == "json_schema"  ? ConstraintKind::JsonSchema
                : kind == "regex"      ? ConstraintKind::Regex
                : kind == "grammar"    ? ConstraintKind::Grammar
                : kind == "choice"     ? ConstraintKind::Choice
                                       : ConstraintKind::JsonObject;
    spec.text = sp.value("text", "");
    for (auto& c : sp.value("choices", json::array())) spec.choices.push_back(c.get<std::string>());
    spec.any_whitespace = sp.value("any_whitespace", true);
    auto t0 = Clock::now();
    GrammarCache cache;
    // "warmup": the class warm-up runs after compiling (as in the server) and the cold pass
    // starts once it has finished ("warmup_ms": its wall time); off: the cold pass races nothing.
    const bool warmup = job.value("warmup", false);
    cache.set_warmup(warmup);
    auto g = cache.get(spec, vocab);
    out["compile_ms"] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (warmup) {
      auto w0 = Clock::now();
      g->wait_warmup();
      out["warmup_ms"] = std::chrono::duration<double, std::milli>(Clock::now() - w0).count();
      const auto ws = g->stats();
      out["warmup_stats"] = {{"states", ws.states}, {"position_classes", ws.position_classes}};
    }
    int repeat = job.value("repeat", 1);
    bool want_masks = job.value("masks", true);
    bool all_steps = job.value("all_steps", false);  // masks before every token too
    std::vector<uint32_t> mask(vocab->mask_words());
    json results = json::array();
    json cold = json::array(), warm = json::array(), fresh = json::array();
    // Passes: 0 cold (fresh grammar), 1..repeat-1 warm (same grammar), then with "fresh_pass"
    // two more, each after dropping the per-state mask cache (classes and transitions kept):
    // the first builds the classes of keys met a second time, the second (reported) uses them.
    const bool fresh_pass = job.value("fresh_pass", false);
    for (int rep = 0; rep < repeat + (fresh_pass ? 2 : 0); ++rep) {
      if (rep >= repeat) g->clear_mask_cache();
      for (auto& prefix : job["prefixes"]) {
        Matcher m(g);
        json step_masks = json::array();
        int accepted = 0;
        bool ok = true;
        // Per-token mask time: the mask before each token of the prefix, then after the last.
        double total_us = 0;
        int n_masks = 0;
        for (auto& t : prefix) {
          auto a = Clock::now();
          m.fill_mask(mask);
          total_us += std::chrono::duration<double, std::micro>(Clock::now() - a).count();
          ++n_masks;
          if (all_steps && rep == 0) step_masks.push_back(hex_mask(mask));
          if (!m.accept_token(t.get<int>())) { ok = false; break; }
          ++accepted;
        }
        json r;
        r["accepted"] = accepted;
        if (ok) {
          auto a = Clock::now();
          m.fill_mask(mask);
          total_us += std::chrono::duration<double, std::micro>(Clock::now() - a).count();
          ++n_masks;
          if (want_masks) r["mask"] = hex_mask(mask);

          r["accepting"] = m.accepting();
        } else {
          r["mask"] = nullptr;
        }
        if (all_steps) r["step_masks"] = std::move(step_masks);  // before each accepted token
        r["mask_us_per_token"] = n_masks ? total_us / n_masks : 0.0;
        if (rep == 0) cold.push_back(r["mask_us_per_token"]);
        else if (rep < repeat) warm.push_back(r["mask_us_per_token"]);
        else if (rep == repeat + 1) fresh.push_back(r["mask_us_per_token"]);
        if (rep == 0) results.push_back(std::move(r));
      }
    }
    auto st = g->stats();
    out["stats"] = {{"states", st.states}, {"position_classes", st.position_classes},
                    {"class_bytes", st.class_bytes}, {"cached_masks", st.cached_masks},
                    {"uncertain_checked", st.uncertain_checked}};
    out["results"] = std::move(results);
    out["mask_us_cold"] = cold;
    out["mask_us_warm"] = warm;
    out["mask_us_fresh"] = fresh;
  } catch (const std::exception& e) {
    std::cout << json{{"error", e.what()}}.dump() << "\n";
    return 2;
  }
  std::cout << out.dump() << "\n";
  return 0;
}
