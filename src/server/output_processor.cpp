#include "server/output_processor.h"

#include <algorithm>

namespace moeserve::server {

OutputProcessor::OutputProcessor(const Frontend& frontend, ChoiceSettings settings)
    : frontend_(frontend), s_(std::move(settings)) {
  detok_ = frontend_.incremental(s_.skip_special_tokens);
  if (!s_.reasoning_parser.empty()) reasoning_ = make_reasoning_parser(s_.reasoning_parser, s_.reasoning_ended_by_prompt);
  if (!s_.tool_parser.empty()) tools_ = make_tool_parser(s_.tool_parser, s_.tools);
}

size_t OutputProcessor::stop_holdback(std::string_view s) const {
  size_t keep = 0;
  for (auto& st : s_.stop) keep = std::max(keep, partial_marker_suffix(s, st));
  return keep;
}

// Passes decided text through the reasoning and tool parsers into the delta.
void OutputProcessor::route_text(const std::string& text, bool final, ChoiceDelta& d) {
  ReasoningDelta rd;
  if (reasoning_) {
    if (!text.empty()) reasoning_->push(text, rd);
    if (final) reasoning_->finish(rd);
  } else {
    rd.content = text;
  }
  if (s_.include_reasoning) {
    d.reasoning += rd.reasoning;
    all_reasoning_ += rd.reasoning;
  }
  if (tools_) {
    ToolParseDelta td;
    if (!rd.content.empty()) tools_->push(rd.content, td);
    if (final) tools_->finish(td);
    d.text += td.content;
    all_text_ += td.content;
    for (auto& c : td.calls) d.tool_calls.push_back(std::move(c));
  } else {
    d.text += rd.content;
    all_text_ += rd.content;
  }
}

ChoiceDelta OutputProcessor::process(const RequestOutput& out) {
  ChoiceDelta d;
  if (finished_) return d;
  std::string decided;
  if (s_.prompt_logprobs && !out.prompt_logprobs.empty()) prompt_logprobs_ = out.prompt_logprobs;
  size_t n = out.new_token_ids.size();
  for (size_t i = 0; i < n && !finished_; ++i) {
    int32_t tok = out.new_token_ids[i];
    ++num_tokens_;
    token_ids_.push_back(tok);
    if (s_.num_logprobs >= 0 && i < out.logprobs.size()) {
      const TokenLogprob& lp = out.logprobs[i];
      TokenLogprobOut o{tok, lp.logprob, {}};
      for (size_t k = 0; k < lp.top.size() && static_cast<int>(k) < s_.num_logprobs; ++k) o.top.push_back(lp.top[k]);
      d.logprobs.push_back(o);
    }
    // The token that ended generation (EOS or a stop token id) is not part of the text.
    bool is_stop_token = out.finished && i + 1 == n && out.stop_token_id && *out.stop_token_id == tok;
    if (is_stop_token && !s_.include_stop_str_in_output) continue;
    unsent_ += detok_->push(tok);
    // vLLM's detokenizer checks stop strings only past min_tokens (the holdback below still
    // keeps a possible stop-string prefix, so a match across that boundary is found).
    if (s_.stop.empty() || num_tokens_ <= s_.min_tokens) continue;
    // Earliest stop-string match in the unsent text.
    size_t best = std::string::npos;
    const std::string* which = nullptr;
    for (auto& st : s_.stop) {
      size_t p = unsent_.find(st);
      if (p != std::string::npos && p < best) best = p, which = &st;
    }
    if (which) {
      size_t cut = s_.include_stop_str_in_output ? best + which->size() : best;
      decided += unsent_.substr(0, cut);
      unsent_.clear();
      finished_ = stop_matched_ = true;
      finish_reason_ = "stop";
      stop_reason_ = *which;
    }
  }
  if (!finished_ && out.finished) {
    unsent_ += detok_->finish();
    decided += unsent_;
    unsent_.clear();
    finished_ = true;
    switch (out.finish_reason) {
      case FinishReason::Length: finish_reason_ = "length"; break;
      case FinishReason::Abort: finish_reason_ = "abort"; break;
      case FinishReason::Error: finish_reason_ = "error"; break;
      default: finish_reason_ = "stop"; break;
    }
    stop_reason_ = nullptr;
    if (out.stop_token_id &&
        std::find(s_.stop_token_ids.begin(), s_.stop_token_ids.end(), *out.stop_token_id) != s_.stop_token_ids.end())
      stop_reason_ = *out.stop_token_id;
  } else if (!finished_) {
    size_t keep = stop_holdback(unsent_);
    decided += unsent_.substr(0, unsent_.size() - keep);
    unsent_.erase(0, unsent_.size() - keep);
  }
  route_text(decided, finished_, d);
  for (auto& lp : d.logprobs) all_logprobs_.push_back(lp);
  if (finished_) {
    d.finished = true;
    if (has_tool_calls() && (finish_reason_ == "stop" || finish_reason_ == "length")) finish_reason_ = "tool_calls";
    d.finish_reason = finish_reason_;
    d.stop_reason = stop_reason_;
  }
  return d;
}

}  // namespace moeserve::server
