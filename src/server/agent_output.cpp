#include "server/agent_output.h"

namespace moeserve::server {

namespace {
bool all_space(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\n' && c != '\t' && c != '\r') return false;
  return true;
}
}  // namespace

bool BlockAssembler::has_tool_calls() const {
  for (auto& b : blocks_)
    if (b.kind == BlockKind::ToolCall) return true;
  return false;
}

void BlockAssembler::open(BlockKind kind, BlockListener* l) {
  close(l);
  blocks_.push_back(OutputBlock{kind, {}, {}, {}, false});
  open_ = static_cast<int>(blocks_.size()) - 1;
}

void BlockAssembler::close(BlockListener* l) {
  if (open_ < 0) return;
  blocks_[open_].closed = true;
  if (l) l->block_stop(open_, blocks_[open_]);
  open_ = -1;
  open_tool_ = -1;
}

void BlockAssembler::append(std::string_view piece, BlockListener* l) {
  if (piece.empty()) return;
  blocks_[open_].text.append(piece);
  if (l) l->block_delta(open_, blocks_[open_], piece);
}

void BlockAssembler::push(const ChoiceDelta& d, size_t tokens, BlockListener* l) {
  if (!d.reasoning.empty()) {
    seen_reasoning_ = true;
    pending_ws_.clear();
    if (open_ < 0 || blocks_[open_].kind != BlockKind::Reasoning) {
      open(BlockKind::Reasoning, l);
      if (l) l->block_start(open_, blocks_[open_]);
    }
    append(d.reasoning, l);
  }
  if (!d.text.empty()) {
    bool text_open = open_ >= 0 && blocks_[open_].kind == BlockKind::Text;
    if (!text_open && all_space(pending_ws_ + d.text)) {
      pending_ws_ += d.text;
    } else {
      if (!text_open) {
        open(BlockKind::Text, l);
        if (l) l->block_start(open_, blocks_[open_]);
      }
      std::string piece = pending_ws_ + d.text;
      pending_ws_.clear();
      append(piece, l);
    }
  }
  for (auto& c : d.tool_calls) {
    if (single_tool_call_ && c.index > 0) continue;
    if (c.id || c.name || open_tool_ != c.index) {
      pending_ws_.clear();
      open(BlockKind::ToolCall, l);
      open_tool_ = c.index;
      blocks_[open_].tool_id = c.id.value_or(random_call_id());
      blocks_[open_].tool_name = c.name.value_or("");
      if (l) l->block_start(open_, blocks_[open_]);
    }
    append(c.arguments, l);
  }
  bool content_now = !d.text.empty() || !d.tool_calls.empty();
  if (!seen_content_ && !content_now) tokens_before_content_ += static_cast<int>(tokens);
  if (content_now) seen_content_ = true;
  if (d.finished) {
    pending_ws_.clear();
    close(l);
    reasoning_tokens_ = seen_reasoning_ ? tokens_before_content_ : 0;
  }
}

}  // namespace moeserve::server
