// Qwen3 reasoning parser (vLLM `qwen3`); semantics in qwen3.h.
#include <algorithm>

#include "server/parsers/qwen3.h"

namespace moeserve::server {

namespace {
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kToolCall = "<tool_call>";
constexpr std::string_view kFunction = "<function";
constexpr std::string_view kTurnStart = "<|im_start|>";

bool ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// After "<tool_call>": does a "<function=" / "<function " tag follow (vLLM's
// `<function[\s=]` after lstrip)? nullopt: not decided yet.
std::optional<bool> function_follows(std::string_view after, bool final) {
  std::string_view rest = py_strip(after);
  // py_strip also strips the end; only the start matters here, so measure from the left.
  size_t lead = rest.empty() ? after.size() : static_cast<size_t>(rest.data() - after.data());
  std::string_view cand = after.substr(lead);
  if (cand.size() > kFunction.size()) return cand.substr(0, kFunction.size()) == kFunction &&
                                             (ascii_space(cand[kFunction.size()]) || cand[kFunction.size()] == '=');
  if (final) return false;
  if (kFunction.substr(0, cand.size()) == cand) return std::nullopt;  // still a prefix of "<function"
  return false;
}
}  // namespace

bool qwen3_reasoning_ended_by_prompt(const ReasoningRequest& req) {
  if (req.chat_template_kwargs && req.chat_template_kwargs->is_object()) {
    auto it = req.chat_template_kwargs->find("enable_thinking");
    if (it != req.chat_template_kwargs->end() && it->is_boolean() && !it->get<bool>()) return true;
  }
  std::string_view p = req.prompt;
  size_t turn = p.rfind(kTurnStart);
  if (turn != std::string_view::npos) p.remove_prefix(turn);
  size_t end = p.rfind(kThinkEnd), start = p.rfind(kThinkStart);
  return end != std::string_view::npos && (start == std::string_view::npos || end > start);
}

Qwen3ReasoningParser::Qwen3ReasoningParser(bool ended_by_prompt)
    : state_(ended_by_prompt ? State::Content : State::Reasoning) {}

void Qwen3ReasoningParser::push(std::string_view text, ReasoningDelta& out) {
  if (state_ == State::Content) {
    out.content.append(text);
    return;
  }
  buf_.append(text);
  step(out, false);
}

void Qwen3ReasoningParser::finish(ReasoningDelta& out) {
  step(out, true);
  if (state_ == State::Content) out.content += buf_;
  else out.reasoning += buf_;  // no "</think>": cut off while thinking
  buf_.clear();
}

void Qwen3ReasoningParser::step(ReasoningDelta& out, bool final) {
  for (;;) {
    switch (state_) {
      case State::Reasoning: {
        size_t s = buf_.find(kThinkStart), e = buf_.find(kThinkEnd), t = buf_.find(kToolCall);
        size_t first = std::min({s, e, t});
        if (first == std::string::npos) {
          size_t keep = final ? 0
                              : std::max({partial_marker_suffix(buf_, kThinkStart), partial_marker_suffix(buf_, kThinkEnd),
                                          partial_marker_suffix(buf_, kToolCall)});
          out.reasoning.append(buf_, 0, buf_.size() - keep);
          buf_.erase(0, buf_.size() - keep);
          return;
        }
        out.reasoning.append(buf_, 0, first);
        if (first == s) {
          buf_.erase(0, s + kThinkStart.size());
        } else if (first == e) {
          buf_.erase(0, e + kThinkEnd.size());
          state_ = State::Content;
        } else {
          buf_.erase(0, t);
          state_ = State::ToolCallCheck;
        }
        break;
      }
      case State::ToolCallCheck: {  // buf_ starts with "<tool_call>"
        std::optional<bool> genuine = function_follows(std::string_view(buf_).substr(kToolCall.size()), final);
        if (!genuine) return;
        if (*genuine) {
          state_ = State::Content;  // the tool parser gets "<tool_call>..." as content
        } else {
          out.reasoning += kToolCall;
          buf_.erase(0, kToolCall.size());
          state_ = State::Reasoning;
        }
        break;
      }
      case State::Content:
        out.content += buf_;
        buf_.clear();
        return;
    }
  }
}

}  // namespace moeserve::server
