// DeepSeek-V3 / R1 parsers (vLLM `deepseek_r1` reasoning, `deepseek_v3` tool calls); semantics
// in deepseek_v3.h.
#include "server/parsers/deepseek_v3.h"

#include <algorithm>

namespace moeserve::server {

namespace {
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kArgsOpen = "\n```json\n";
constexpr std::string_view kArgsClose = "\n```";
}  // namespace

void DeepSeekR1ReasoningParser::push(std::string_view text, ReasoningDelta& out) {
  if (content_) {
    out.content.append(text);
    return;
  }
  buf_.append(text);
  step(out, false);
}

void DeepSeekR1ReasoningParser::finish(ReasoningDelta& out) {
  step(out, true);
  (content_ ? out.content : out.reasoning) += buf_;
  buf_.clear();
}

void DeepSeekR1ReasoningParser::step(ReasoningDelta& out, bool final) {
  while (!content_) {
    const size_t s = buf_.find(kThinkStart), e = buf_.find(kThinkEnd);
    const size_t first = std::min(s, e);
    if (first == std::string::npos) {
      const size_t keep =
          final ? 0 : std::max(partial_marker_suffix(buf_, kThinkStart), partial_marker_suffix(buf_, kThinkEnd));
      out.reasoning.append(buf_, 0, buf_.size() - keep);
      buf_.erase(0, buf_.size() - keep);
      return;
    }
    out.reasoning.append(buf_, 0, first);
    if (first == s) {
      buf_.erase(0, s + kThinkStart.size());
    } else {
      buf_.erase(0, e + kThinkEnd.size());
      content_ = true;
    }
  }
  out.content += buf_;
  buf_.clear();
}

DeepSeekV3ToolParser::DeepSeekV3ToolParser(const ojson&) {}

void DeepSeekV3ToolParser::push(std::string_view text, ToolParseDelta& out) {
  if (state_ == State::Done) return;
  buf_.append(text);
  step(out, false);
}

void DeepSeekV3ToolParser::finish(ToolParseDelta& out) {
  step(out, true);
  if (state_ == State::Content) out.content += buf_;  // no calls section
  buf_.clear();  // an unfinished call is dropped
}

void DeepSeekV3ToolParser::step(ToolParseDelta& out, bool final) {
  for (;;) {
    if (state_ == State::Done) {
      buf_.clear();
      return;
    }
    if (state_ == State::Content) {
      const size_t at = buf_.find(kCallsBegin);
      if (at == std::string::npos) {
        const size_t keep = final ? 0 : partial_marker_suffix(buf_, kCallsBegin);
        out.content.append(buf_, 0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      out.content.append(buf_, 0, at);
      buf_.erase(0, at + kCallsBegin.size());
      state_ = State::Calls;
      continue;
    }
    // Calls: the next complete call block, or the end of the section.
    const size_t end_all = buf_.find(kCallsEnd), begin = buf_.find(kCallBegin);
    if (end_all != std::string::npos && (begin == std::string::npos || end_all < begin)) {
      state_ = State::Done;
      continue;
    }
    if (begin == std::string::npos) return;  // between calls (or cut off): wait
    const size_t end = buf_.find(kCallEnd, begin);
    if (end == std::string::npos) return;
    const std::string_view block = std::string_view(buf_).substr(begin + kCallBegin.size(), end - begin - kCallBegin.size());
    const size_t sep = block.find(kSep);
    const size_t open = sep == std::string_view::npos ? sep : block.find(kArgsOpen, sep + kSep.size());
    const bool closed = block.size() >= kArgsClose.size() &&
                        block.substr(block.size() - kArgsClose.size()) == kArgsClose;
    if (open != std::string_view::npos && closed && open + kArgsOpen.size() <= block.size() - kArgsClose.size()) {
      ToolCall c;
      c.id = random_call_id();
      c.name = std::string(block.substr(sep + kSep.size(), open - sep - kSep.size()));
      c.arguments = std::string(block.substr(open + kArgsOpen.size(), block.size() - kArgsClose.size() - open -
                                                                        kArgsOpen.size()));
      ToolCallDelta d;
      d.index = int(calls_.size());
      d.id = c.id;
      d.name = c.name;
      d.arguments = c.arguments;
      out.calls.push_back(std::move(d));
      calls_.push_back(std::move(c));
    }
    buf_.erase(0, end + kCallEnd.size());
  }
}

}  // namespace moeserve::server
