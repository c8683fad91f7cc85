// Kimi-K2 parsers (vLLM `kimi_k2` reasoning and tool calls); semantics in kimi_k2.h.
#include "server/parsers/kimi_k2.h"

#include <algorithm>
#include <array>

namespace moeserve::server {

namespace {
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kSectionBegin = "<|tool_calls_section_begin|>";
constexpr std::string_view kSectionBegin1 = "<|tool_call_section_begin|>";  // singular variant
constexpr std::string_view kSectionEnd = "<|tool_calls_section_end|>";
constexpr std::string_view kSectionEnd1 = "<|tool_call_section_end|>";
constexpr std::string_view kCallBegin = "<|tool_call_begin|>";
constexpr std::string_view kArgBegin = "<|tool_call_argument_begin|>";
constexpr std::string_view kCallEnd = "<|tool_call_end|>";

// Earliest occurrence in `s` of any of `markers`: (position, marker index); npos when none.
struct Hit {
  size_t pos = std::string::npos;
  size_t which = 0;
  size_t len = 0;
};
template <size_t N>
Hit find_first(std::string_view s, const std::array<std::string_view, N>& markers) {
  Hit h;
  for (size_t i = 0; i < N; ++i) {
    const size_t p = s.find(markers[i]);
    if (p < h.pos) h = {p, i, markers[i].size()};
  }
  return h;
}
template <size_t N>
size_t partial_any(std::string_view s, const std::array<std::string_view, N>& markers) {
  size_t k = 0;
  for (auto m : markers) k = std::max(k, partial_marker_suffix(s, m));
  return k;
}
// Bytes at the end of `s` that form an incomplete UTF-8 character.
size_t incomplete_utf8_tail(std::string_view s) {
  for (size_t k = 1; k <= std::min<size_t>(3, s.size()); ++k) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - k]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > k ? k : 0;
  }
  return 0;
}
// vLLM's ID pattern [^<]+:\d+ on the stripped ID.
bool valid_call_id(std::string_view id) {
  if (id.find('<') != std::string_view::npos) return false;
  const size_t colon = id.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == id.size()) return false;
  return std::all_of(id.begin() + colon + 1, id.end(), [](char c) { return c >= '0' && c <= '9'; });
}
// "functions.get_weather:0" -> "get_weather" (vLLM: id.split(":")[0].split(".")[-1]).
std::string call_name(std::string_view id) {
  std::string_view head = id.substr(0, id.find(':'));
  const size_t dot = head.rfind('.');
  return std::string(dot == std::string_view::npos ? head : head.substr(dot + 1));
}
}  // namespace

// ---- reasoning ----

bool kimi_k2_reasoning_ended_by_prompt(const ReasoningRequest& req) {
  if (!req.chat_template_kwargs || !req.chat_template_kwargs->is_object()) return false;
  auto it = req.chat_template_kwargs->find("thinking");
  return it != req.chat_template_kwargs->end() && it->is_boolean() && !it->get<bool>();
}

KimiK2ReasoningParser::KimiK2ReasoningParser(bool ended_by_prompt)
    : state_(ended_by_prompt ? State::Content : State::Start) {}

void KimiK2ReasoningParser::push(std::string_view text, ReasoningDelta& out) {
  if (state_ == State::Content) {
    out.content.append(text);
    return;
  }
  buf_.append(text);
  step(out, false);
}

void KimiK2ReasoningParser::finish(ReasoningDelta& out) {
  step(out, true);
  (state_ == State::Content ? out.content : out.reasoning) += buf_;
  buf_.clear();
}

void KimiK2ReasoningParser::step(ReasoningDelta& out, bool final) {
  if (state_ == State::Start) {
    // Only a "<think>" at the very start is consumed (vLLM: find(start) == 0).
    if (!final && buf_.size() < kThinkStart.size() && kThinkStart.substr(0, buf_.size()) == buf_) return;
    if (buf_.compare(0, kThinkStart.size(), kThinkStart) == 0) buf_.erase(0, kThinkStart.size());
    state_ = State::Reasoning;
  }
  if (state_ == State::Reasoning) {
    static constexpr std::array<std::string_view, 3> kEnds = {kThinkEnd, kSectionBegin, kSectionBegin1};
    const Hit h = find_first(std::string_view(buf_), kEnds);
    if (h.pos == std::string::npos) {
      const size_t keep = final ? 0 : partial_any(buf_, kEnds);
      out.reasoning.append(buf_, 0, buf_.size() - keep);
      buf_.erase(0, buf_.size() - keep);
      return;
    }
    out.reasoning.append(buf_, 0, h.pos);
    // "</think>" is dropped; a section begin stays in the content.
    buf_.erase(0, h.pos + (h.which == 0 ? h.len : 0));
    state_ = State::Content;
  }
  out.content += buf_;
  buf_.clear();
}

// ---- tool calls ----

KimiK2ToolParser::KimiK2ToolParser(const ojson&) {}

void KimiK2ToolParser::push(std::string_view text, ToolParseDelta& out) {
  buf_.append(text);
  step(out, false);
}

void KimiK2ToolParser::finish(ToolParseDelta& out) {
  step(out, true);
  if (state_ == State::Content) out.content += buf_;
  if (state_ == State::Args) emit_args(out, buf_);  // cut off: keep what the call has
  buf_.clear();
}

// Streams the part of the current call's arguments that cannot change any more: ARGS so far
// (raw_args_ + avail) stripped; a later byte only appends after the last non-space character.
void KimiK2ToolParser::emit_args(ToolParseDelta& out, std::string_view avail) {
  raw_args_.append(avail);
  const std::string_view target = py_strip(raw_args_);
  ToolCall& c = calls_.back();
  // target starts with what was sent (see above); send the rest.
  if (target.size() > c.arguments.size()) {
    ToolCallDelta d;
    d.index = int(calls_.size()) - 1;
    d.arguments = std::string(target.substr(c.arguments.size()));
    c.arguments += d.arguments;
    out.calls.push_back(std::move(d));
  }
}

void KimiK2ToolParser::step(ToolParseDelta& out, bool final) {
  static constexpr std::array<std::string_view, 2> kBegins = {kSectionBegin, kSectionBegin1};
  // Inside a section: what ends the current piece. Index 0..1 section end, 2 call begin, 3 call
  // end, 4 argument begin.
  static constexpr std::array<std::string_view, 5> kInner = {kSectionEnd, kSectionEnd1, kCallBegin, kCallEnd,
                                                             kArgBegin};
  for (;;) {
    if (state_ == State::Content) {
      const Hit h = find_first(std::string_view(buf_), kBegins);
      if (h.pos == std::string::npos) {
        const size_t keep = final ? 0 : partial_any(buf_, kBegins);
        out.content.append(buf_, 0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      out.content.append(buf_, 0, h.pos);
      buf_.erase(0, h.pos + h.len);
      state_ = State::Section;
      continue;
    }
    const Hit h = find_first(std::string_view(buf_), kInner);
    const bool section_end = h.pos != std::string::npos && h.which <= 1;
    if (state_ == State::Args) {
      // Arguments end at the call end, a section end or the next call begin (cut off).
      if (h.pos == std::string::npos || h.which == 4) {
        // (an argument-begin marker inside ARGS is argument text, as in vLLM's regex)
        const size_t upto = h.pos == std::string::npos ? buf_.size() : h.pos + h.len;
        size_t keep = 0;
        if (h.pos == std::string::npos && !final) {
          keep = std::max(partial_any(buf_, kInner), incomplete_utf8_tail(buf_));
        }
        const size_t n = h.pos == std::string::npos ? buf_.size() - keep : upto;
        emit_args(out, std::string_view(buf_).substr(0, n));
        buf_.erase(0, n);
        if (h.pos == std::string::npos) return;
        continue;
      }
      emit_args(out, std::string_view(buf_).substr(0, h.pos));
      raw_args_.clear();
      buf_.erase(0, h.pos + h.len);
      state_ = section_end ? State::Content : h.which == 2 ? State::Id : State::Section;
      continue;
    }
    if (h.pos == std::string::npos) {
      // Section / Skip: the text is dropped, but a partial marker is kept. Id: wait for the end.
      if (state_ != State::Id) buf_.erase(0, buf_.size() - (final ? 0 : partial_any(buf_, kInner)));
      return;
    }
    if (section_end) {
      buf_.erase(0, h.pos + h.len);
      state_ = State::Content;
      continue;
    }
    if (h.which == 2) {  // a call begins (a previous malformed one, if any, is dropped)
      buf_.erase(0, h.pos + h.len);
      state_ = State::Id;
      continue;
    }
    if (state_ == State::Id && h.which == 4) {
      const std::string_view id = py_strip(std::string_view(buf_).substr(0, h.pos));
      if (valid_call_id(id)) {
        ToolCall c;
        c.id = std::string(id);
        c.name = call_name(id);
        ToolCallDelta d;
        d.index = int(calls_.size());
        d.id = c.id;
        d.name = c.name;
        out.calls.push_back(std::move(d));
        calls_.push_back(std::move(c));
        raw_args_.clear();
        state_ = State::Args;
      } else {
        state_ = State::Skip;
      }
      buf_.erase(0, h.pos + h.len);
      continue;
    }
    // A call end (closing a skipped or malformed call), or an argument begin outside a call.
    buf_.erase(0, h.pos + h.len);
    state_ = State::Section;
  }
}

}  // namespace moeserve::server
