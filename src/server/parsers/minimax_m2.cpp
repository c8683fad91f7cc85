#include "server/parsers/minimax_m2.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include "core/bounded_json.h"

namespace moeserve::server {

namespace {
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kBlockStart = "<minimax:tool_call>";
constexpr std::string_view kBlockEnd = "</minimax:tool_call>";
constexpr std::string_view kInvokeStart = "<invoke name=";
constexpr std::string_view kInvokeEnd = "</invoke>";
constexpr std::string_view kParamStart = "<parameter name=";
constexpr std::string_view kParamEnd = "</parameter>";

std::string lower_ascii(std::string_view s) {
  std::string r(s);
  for (auto& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

// Strips whitespace, then one pair of matching quotes (vLLM _extract_name).
std::string extract_name(std::string_view s) {
  s = py_strip(s);
  if (s.size() >= 2 && ((s.front() == '"' && s.back() == '"') || (s.front() == '\'' && s.back() == '\'')))
    s = s.substr(1, s.size() - 2);
  return std::string(s);
}

// Python int(str): optional sign, digits with single underscores between them.
std::optional<ojson> py_int(std::string_view s) {
  s = py_strip(s);
  bool neg = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) neg = s[0] == '-', s.remove_prefix(1);
  if (s.empty() || s.front() == '_' || s.back() == '_') return std::nullopt;
  std::string digits;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (s[i - 1] == '_') return std::nullopt;
      continue;
    }
    if (s[i] < '0' || s[i] > '9') return std::nullopt;
    digits.push_back(s[i]);
  }
  if (digits.size() > 19) return std::nullopt;  // beyond 64 bits (Python would use a bigint)
  errno = 0;
  unsigned long long u = std::strtoull(digits.c_str(), nullptr, 10);
  if (errno) return std::nullopt;
  if (neg) {
    if (u > 9223372036854775808ull) return std::nullopt;
    return ojson(u == 9223372036854775808ull ? INT64_MIN : -static_cast<int64_t>(u));
  }
  return ojson(static_cast<uint64_t>(u));
}

// Python float(str) restricted to finite decimal literals (inf/nan make vLLM fall through).
std::optional<double> py_float(std::string_view s) {
  s = py_strip(s);
  std::string clean;
  size_t i = 0;
  auto digits = [&](bool required) {
    size_t n = 0;
    while (i < s.size()) {
      if (s[i] >= '0' && s[i] <= '9') clean.push_back(s[i]), ++n, ++i;
      else if (s[i] == '_' && n > 0 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '9') ++i;
      else break;
    }
    return n > 0 || !required;
  };
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) clean.push_back(s[i++]);
  size_t before = clean.size();
  digits(false);
  bool int_part = clean.size() > before;
  bool frac_part = false;
  if (i < s.size() && s[i] == '.') {
    clean.push_back(s[i++]);
    size_t b2 = clean.size();
    digits(false);
    frac_part = clean.size() > b2;
  }
  if (!int_part && !frac_part) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    clean.push_back(s[i++]);
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) clean.push_back(s[i++]);
    if (!digits(true)) return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  double v = std::strtod(clean.c_str(), nullptr);
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<ojson> json_loads(std::string_view s) {
  try {
    return parse_json_bounded<ojson>(s, "tool call arguments");
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void collect_types(const ojson& schema, std::set<std::string>& types) {
  if (!schema.is_object()) return;
  if (auto t = schema.find("type"); t != schema.end()) {
    if (t->is_string()) types.insert(t->get<std::string>());
    else if (t->is_array())
      for (auto& x : *t)
        if (x.is_string()) types.insert(x.get<std::string>());
  }
  if (auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
    for (auto& v : *e) {
      if (v.is_null()) types.insert("null");
      else if (v.is_boolean()) types.insert("boolean");
      else if (v.is_number_integer()) types.insert("integer");
      else if (v.is_number_float()) types.insert("number");
      else if (v.is_string()) types.insert("string");
      else if (v.is_array()) types.insert("array");
      else if (v.is_object()) types.insert("object");
    }
  }
  for (const char* f : {"anyOf", "oneOf", "allOf"}) {
    if (auto c = schema.find(f); c != schema.end() && c->is_array())
      for (auto& sub : *c) {
        std::set<std::string> st;
        collect_types(sub, st);
        if (st.empty()) st.insert("string");
        types.insert(st.begin(), st.end());
      }
  }
}
}  // namespace

// ---- reasoning ----

void MinimaxM2ReasoningParser::push(std::string_view text, ReasoningDelta& out) {
  buf_.append(text);
  if (state_ == State::Start) {
    // Hold back while the output could still begin with "<think>".
    std::string_view b = buf_;
    if (b.size() < kThinkStart.size() && kThinkStart.substr(0, b.size()) == b) return;
    if (b.substr(0, kThinkStart.size()) == kThinkStart) buf_.erase(0, kThinkStart.size());
    state_ = State::Reasoning;
  }
  if (state_ == State::Reasoning) {
    size_t pos = buf_.find(kThinkEnd);
    if (pos == std::string::npos) {
      size_t keep = partial_marker_suffix(buf_, kThinkEnd);
      out.reasoning.append(buf_, 0, buf_.size() - keep);
      buf_.erase(0, buf_.size() - keep);
      return;
    }
    out.reasoning.append(buf_, 0, pos);
    buf_.erase(0, pos + kThinkEnd.size());
    state_ = State::Content;
  }
  out.content += buf_;
  buf_.clear();
}

void MinimaxM2ReasoningParser::finish(ReasoningDelta& out) {
  if (state_ == State::Content) out.content += buf_;
  else out.reasoning += buf_;
  buf_.clear();
}

void MinimaxM2AppendThinkParser::push(std::string_view text, ReasoningDelta& out) {
  if (!started_) {
    out.content += kThinkStart;
    started_ = true;
  }
  out.content.append(text);
}

void MinimaxM2AppendThinkParser::finish(ReasoningDelta& out) {
  if (!started_) {
    out.content += kThinkStart;
    started_ = true;
  }
}

// ---- tools ----

MinimaxM2ToolParser::MinimaxM2ToolParser(const ojson& tools) : tools_(tools) {}

ojson MinimaxM2ToolParser::convert_value(std::string_view value, const ojson* schema) {
  std::string low = lower_ascii(value);
  if (low == "null" || low == "none" || low == "nil") return nullptr;
  std::set<std::string> types;
  if (schema) collect_types(*schema, types);
  if (types.empty()) types.insert("string");
  std::set<std::string> norm;
  for (auto& t : types) norm.insert(lower_ascii(t));
  static const char* priority[] = {"integer", "int", "number", "float", "boolean", "bool", "object",
                                   "array", "string", "str", "text"};
  for (const char* t : priority) {
    if (!norm.count(t)) continue;
    std::string_view ts(t);
    if (ts == "string" || ts == "str" || ts == "text") return std::string(value);
    if (ts == "integer" || ts == "int") {
      if (auto v = py_int(value)) return *v;
    } else if (ts == "number" || ts == "float") {
      if (auto d = py_float(value)) {
        double v = *d;
        if (v == std::trunc(v) && std::fabs(v) < 9.2e18) return ojson(static_cast<int64_t>(v));
        return ojson(v);
      }
    } else if (ts == "boolean" || ts == "bool") {
      std::string b = lower_ascii(py_strip(value));
      if (b == "true" || b == "1" || b == "yes" || b == "on") return true;
      if (b == "false" || b == "0" || b == "no" || b == "off") return false;
    } else {  // object / array
      if (auto v = json_loads(value)) return *v;
    }
  }
  if (auto v = json_loads(value)) return *v;
  return std::string(value);
}

const ojson* MinimaxM2ToolParser::param_schema(const std::string& param) const {
  if (!properties_ || !properties_->is_object()) return nullptr;
  auto it = properties_->find(param);
  if (it == properties_->end() || !it->is_object()) return nullptr;
  return &*it;
}

void MinimaxM2ToolParser::push(std::string_view text, ToolParseDelta& out) {
  buf_.append(text);
  if (state_ != State::Content) raw_tools_.append(text);
  step(out, false);
}

void MinimaxM2ToolParser::finish(ToolParseDelta& out) {
  step(out, true);
  if (state_ == State::Content) {
    out.content += buf_;
    if (!buf_.empty()) emitted_content_ = true;
    buf_.clear();
    return;
  }
  if (state_ == State::InvokeName || state_ == State::Invoke || state_ == State::Param) close_invoke(out);
  buf_.clear();
  if (calls_.empty()) {
    // A tool-call block without any call: the text is plain content (as vLLM answers).
    out.content += raw_tools_;
  }
}

void MinimaxM2ToolParser::close_invoke(ToolParseDelta& out) {
  if (state_ == State::InvokeName) {  // no complete name: nothing was streamed for it
    state_ = State::Block;
    return;
  }
  ToolCallDelta d;
  d.index = static_cast<int>(calls_.size()) - 1;
  d.arguments = num_params_ == 0 ? "{}" : "}";
  calls_.back().arguments += d.arguments;
  out.calls.push_back(std::move(d));
  state_ = State::Block;
}

void MinimaxM2ToolParser::step(ToolParseDelta& out, bool final) {
  (void)final;
  for (;;) {
    switch (state_) {
      case State::Content: {
        size_t pos = buf_.find(kBlockStart);
        if (pos == std::string::npos) {
          size_t keep = partial_marker_suffix(buf_, kBlockStart);
          if (buf_.size() > keep) emitted_content_ = true;
          out.content.append(buf_, 0, buf_.size() - keep);
          buf_.erase(0, buf_.size() - keep);
          return;
        }
        if (pos > 0) emitted_content_ = true;
        out.content.append(buf_, 0, pos);
        buf_.erase(0, pos + kBlockStart.size());
        raw_tools_ = std::string(kBlockStart) + buf_;
        state_ = State::Block;
        break;
      }
      case State::Block: {  // inside a block, between invokes
        size_t inv = buf_.find(kInvokeStart), end = buf_.find(kBlockEnd);
        if (end != std::string::npos && (inv == std::string::npos || end < inv)) {
          buf_.erase(0, end + kBlockEnd.size());
          state_ = State::AfterBlock;
          break;
        }
        if (inv == std::string::npos) {
          size_t keep = std::max(partial_marker_suffix(buf_, kInvokeStart), partial_marker_suffix(buf_, kBlockEnd));
          buf_.erase(0, buf_.size() - keep);
          return;
        }
        buf_.erase(0, inv + kInvokeStart.size());
        state_ = State::InvokeName;
        break;
      }
      case State::InvokeName: {
        // vLLM: name = text up to the first '>' within the invoke.
        size_t gt = buf_.find('>'), iend = buf_.find(kInvokeEnd), bend = buf_.find(kBlockEnd);
        size_t term = std::min(iend, bend);
        if (term != std::string::npos && (gt == std::string::npos || term < gt)) {
          buf_.erase(0, term == iend ? iend + kInvokeEnd.size() : bend);
          state_ = State::Block;  // an invoke without a name is skipped
          break;
        }
        if (gt == std::string::npos) return;
        std::string name = extract_name(std::string_view(buf_).substr(0, gt));
        buf_.erase(0, gt + 1);
        properties_ = nullptr;
        if (tools_.is_array()) {
          for (auto& t : tools_) {
            if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
            auto& f = t["function"];
            if (f.value("name", std::string()) != name) continue;
            if (f.contains("parameters") && f["parameters"].is_object() && f["parameters"].contains("properties"))
              properties_ = &f["parameters"]["properties"];
            break;
          }
        }
        calls_.push_back({random_call_id(), name, ""});
        ToolCallDelta d;
        d.index = static_cast<int>(calls_.size()) - 1;
        d.id = calls_.back().id;
        d.name = name;
        out.calls.push_back(std::move(d));
        num_params_ = 0;
        state_ = State::Invoke;
        break;
      }
      case State::Invoke: {
        size_t p = buf_.find(kParamStart), iend = buf_.find(kInvokeEnd), bend = buf_.find(kBlockEnd);
        size_t first = std::min({p, iend, bend});
        if (first == std::string::npos) {
          size_t keep = std::max({partial_marker_suffix(buf_, kParamStart), partial_marker_suffix(buf_, kInvokeEnd),
                                  partial_marker_suffix(buf_, kBlockEnd)});
          buf_.erase(0, buf_.size() - keep);
          return;
        }
        if (first == p) {
          buf_.erase(0, p + kParamStart.size());
          state_ = State::Param;
        } else if (first == iend) {
          buf_.erase(0, iend + kInvokeEnd.size());
          close_invoke(out);
        } else {
          buf_.erase(0, bend);  // the block end is handled in Block state
          close_invoke(out);
        }
        break;
      }
      case State::Param: {
        size_t pend = buf_.find(kParamEnd), iend = buf_.find(kInvokeEnd), bend = buf_.find(kBlockEnd);
        if (pend == std::string::npos || (iend != std::string::npos && iend < pend) ||
            (bend != std::string::npos && bend < pend)) {
          if (iend == std::string::npos && bend == std::string::npos) return;  // wait for more
          state_ = State::Invoke;  // unterminated parameter: dropped, as vLLM's regex does
          break;
        }
        std::string_view body = std::string_view(buf_).substr(0, pend);
        size_t gt = body.find('>');
        if (gt != std::string::npos && gt > 0) {
          std::string pname = extract_name(body.substr(0, gt));
          std::string_view value = py_strip(body.substr(gt + 1));
          ojson v = convert_value(value, param_schema(pname));
          ToolCallDelta d;
          d.index = static_cast<int>(calls_.size()) - 1;
          d.arguments = num_params_ == 0 ? "{" : ", ";
          append_json_string(d.arguments, pname);
          d.arguments += ": " + py_json_dumps(v);
          calls_.back().arguments += d.arguments;
          out.calls.push_back(std::move(d));
          ++num_params_;
        }
        buf_.erase(0, pend + kParamEnd.size());
        state_ = State::Invoke;
        break;
      }
      case State::AfterBlock: {  // text between blocks is dropped; later blocks still count
        size_t pos = buf_.find(kBlockStart);
        if (pos == std::string::npos) {
          size_t keep = partial_marker_suffix(buf_, kBlockStart);
          buf_.erase(0, buf_.size() - keep);
          return;
        }
        buf_.erase(0, pos + kBlockStart.size());
        state_ = State::Block;
        break;
      }
    }
  }
}

}  // namespace moeserve::server
