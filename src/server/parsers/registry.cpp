// Parser registry: one line per parser name. Static registration objects would be dropped
// by the static-library linker, so the table is explicit.
#include <algorithm>
#include <functional>
#include <map>
#include <random>

#include "core/error.h"
#include "server/parsers/deepseek_v3.h"
#include "server/parsers/kimi_k2.h"
#include "server/parsers/minimax_m2.h"
#include "server/parsers/parser.h"
#include "server/parsers/qwen3.h"

namespace moeserve::server {

namespace {
using RFactory = std::function<std::unique_ptr<ReasoningParser>(bool ended_by_prompt)>;
using TFactory = std::function<std::unique_ptr<ToolParser>(const ojson&)>;
struct ReasoningEntry {
  RFactory make;
  bool (*ended_by_prompt)(const ReasoningRequest&) = nullptr;  // null: never
};

const std::map<std::string, ReasoningEntry>& reasoning_table() {
  static const std::map<std::string, ReasoningEntry> t = {
      {"deepseek_r1", {[](bool) { return std::make_unique<DeepSeekR1ReasoningParser>(); }}},
      {"kimi_k2", {[](bool ended) { return std::make_unique<KimiK2ReasoningParser>(ended); },
                   kimi_k2_reasoning_ended_by_prompt}},
      {"minimax_m2", {[](bool) { return std::make_unique<MinimaxM2ReasoningParser>(); }}},
      {"minimax_m2_append_think", {[](bool) { return std::make_unique<MinimaxM2AppendThinkParser>(); }}},
      {"qwen3", {[](bool ended) { return std::make_unique<Qwen3ReasoningParser>(ended); },
                 qwen3_reasoning_ended_by_prompt}},
  };
  return t;
}
const std::map<std::string, TFactory>& tool_table() {
  static const std::map<std::string, TFactory> t = {
      {"minimax_m2", [](const ojson& tools) { return std::make_unique<MinimaxM2ToolParser>(tools); }},
      {"hermes", [](const ojson& tools) { return std::make_unique<HermesToolParser>(tools); }},
      {"deepseek_v3", [](const ojson& tools) { return std::make_unique<DeepSeekV3ToolParser>(tools); }},
      {"kimi_k2", [](const ojson& tools) { return std::make_unique<KimiK2ToolParser>(tools); }},
  };
  return t;
}
using GFactory = std::function<structured::Grammar(const ToolCallGrammarRequest&)>;
const std::map<std::string, GFactory>& tool_grammar_table() {
  static const std::map<std::string, GFactory> t = {
      {"minimax_m2", minimax_m2_tool_call_grammar},
      {"hermes", hermes_tool_call_grammar},
  };
  return t;
}
}  // namespace

std::vector<std::pair<std::string, const ojson*>> callable_tools(const ToolCallGrammarRequest& req) {
  std::vector<std::pair<std::string, const ojson*>> out;
  for (auto& tool : req.tools) {
    if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object()) continue;
    const ojson& fn = tool["function"];
    std::string name = fn.value("name", "");
    if (name.empty()) continue;
    if (!req.names.empty() && std::find(req.names.begin(), req.names.end(), name) == req.names.end()) continue;
    out.emplace_back(std::move(name), &fn);
  }
  return out;
}

void add_leading_whitespace(structured::Grammar& g, structured::Alt& alt) {
  structured::ByteSet lead;
  lead.set(' ');
  lead.set('\n');
  g.repeat(structured::Alt{structured::Symbol::set(lead)}, 0, 8, "lead", alt);
}

bool has_tool_call_grammar(const std::string& name) { return tool_grammar_table().count(name) > 0; }
structured::Grammar tool_call_grammar(const std::string& name, const ToolCallGrammarRequest& req) {
  auto it = tool_grammar_table().find(name);
  MS_CHECK(it != tool_grammar_table().end(), "tool-call parser '{}' has no tool-call grammar", name);
  return it->second(req);
}

std::unique_ptr<ReasoningParser> make_reasoning_parser(const std::string& name, bool ended_by_prompt) {
  auto it = reasoning_table().find(name);
  MS_CHECK(it != reasoning_table().end(), "unknown reasoning parser '{}'", name);
  return it->second.make(ended_by_prompt);
}
bool reasoning_ended_by_prompt(const std::string& name, const ReasoningRequest& req) {
  auto it = reasoning_table().find(name);
  MS_CHECK(it != reasoning_table().end(), "unknown reasoning parser '{}'", name);
  return it->second.ended_by_prompt && it->second.ended_by_prompt(req);
}
std::unique_ptr<ToolParser> make_tool_parser(const std::string& name, const ojson& tools) {
  auto it = tool_table().find(name);
  MS_CHECK(it != tool_table().end(), "unknown tool-call parser '{}'", name);
  return it->second(tools);
}
bool has_reasoning_parser(const std::string& name) { return reasoning_table().count(name) > 0; }
bool has_tool_parser(const std::string& name) { return tool_table().count(name) > 0; }
std::vector<std::string> reasoning_parser_names() {
  std::vector<std::string> v;
  for (auto& [k, _] : reasoning_table()) v.push_back(k);
  return v;
}
std::vector<std::string> tool_parser_names() {
  std::vector<std::string> v;
  for (auto& [k, _] : tool_table()) v.push_back(k);
  return v;
}

size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  size_t maxk = std::min(text.size(), marker.size() - 1);
  for (size_t k = maxk; k > 0; --k) {
    if (text.substr(text.size() - k) == marker.substr(0, k)) return k;
  }
  return 0;
}

// Python's str.isspace() set, UTF-8 encoded.
static size_t ws_len_at(std::string_view s, size_t i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
  static const char* multi[] = {"\xc2\x85", "\xc2\xa0", "\xe1\x9a\x80", "\xe2\x80\xa8", "\xe2\x80\xa9",
                                "\xe2\x80\xaf", "\xe2\x81\x9f", "\xe3\x80\x80"};
  for (const char* m : multi) {
    std::string_view mv(m);
    if (s.substr(i, mv.size()) == mv) return mv.size();
  }
  if (c == 0xe2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80) {
    unsigned char d = static_cast<unsigned char>(s[i + 2]);
    if (d >= 0x80 && d <= 0x8a) return 3;  // U+2000..U+200A
  }
  return 0;
}

std::string_view py_strip(std::string_view s) {
  size_t b = 0;
  while (b < s.size()) {
    size_t n = ws_len_at(s, b);
    if (!n) break;
    b += n;
  }
  size_t e = s.size();
  while (e > b) {
    // Walk back to the start of the last UTF-8 character.
    size_t k = e - 1;
    while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    size_t n = ws_len_at(s, k);
    if (n == 0 || k + n != e) break;
    e = k;
  }
  return s.substr(b, e - b);
}

std::string random_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = "call_";
  uint64_t a = rng(), b = rng();
  for (int i = 0; i < 16; ++i) id.push_back(hex[(a >> (i * 4)) & 15]);
  for (int i = 0; i < 8; ++i) id.push_back(hex[(b >> (i * 4)) & 15]);
  return id;
}

}  // namespace moeserve::server
