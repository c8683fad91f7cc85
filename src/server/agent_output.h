// Shared by the Anthropic Messages and OpenAI Responses formatters: turns a choice's processed
// deltas (reasoning, content, tool-call deltas from the OutputProcessor) into an ordered list
// of output blocks (Anthropic content blocks / Responses output items) and the start / delta /
// stop events of each, so streaming and non-streaming bodies are built from the same blocks.
//
// Rules: a block opens when its kind changes (reasoning -> text -> tool call k); text made of
// whitespace only (MiniMax-M2 writes "\n\n" between "</think>" and a tool call) is held back
// and dropped unless more text follows in the same block; with `single_tool_call` (Anthropic
// disable_parallel_tool_use, Responses parallel_tool_calls=false) calls after the first are
// dropped. Also counts reasoning tokens (tokens generated before the first content).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "server/output_processor.h"

namespace moeserve::server {

enum class BlockKind { Reasoning, Text, ToolCall };

struct OutputBlock {
  BlockKind kind = BlockKind::Text;
  std::string text;  // reasoning / text, or the tool call's arguments JSON text
  std::string tool_id, tool_name;
  bool closed = false;
};

class BlockListener {
 public:
  virtual ~BlockListener() = default;
  virtual void block_start(int index, const OutputBlock& b) = 0;
  virtual void block_delta(int index, const OutputBlock& b, std::string_view piece) = 0;
  virtual void block_stop(int index, const OutputBlock& b) = 0;
};

class BlockAssembler {
 public:
  explicit BlockAssembler(bool single_tool_call = false) : single_tool_call_(single_tool_call) {}
  // One processed delivery: `tokens` is how many tokens it carried (reasoning-token count).
  // On the final delta the open block is closed.
  void push(const ChoiceDelta& d, size_t tokens, BlockListener* l);
  const std::vector<OutputBlock>& blocks() const { return blocks_; }
  int reasoning_tokens() const { return reasoning_tokens_; }
  bool has_tool_calls() const;

 private:
  void open(BlockKind kind, BlockListener* l);
  void close(BlockListener* l);
  void append(std::string_view piece, BlockListener* l);

  bool single_tool_call_;
  std::vector<OutputBlock> blocks_;
  int open_ = -1;           // index of the open block, -1: none
  int open_tool_ = -1;      // the parser's tool-call index of the open tool block
  std::string pending_ws_;  // whitespace-only text not yet given a block
  bool seen_content_ = false;
  bool seen_reasoning_ = false;
  int tokens_before_content_ = 0;
  int reasoning_tokens_ = 0;
};

// "event: <type>\ndata: <json>\n\n" (Anthropic and Responses streams).
inline void append_sse_event(std::string& out, std::string_view type, const std::string& json) {
  out += "event: ";
  out += type;
  out += "\ndata: ";
  out += json;
  out += "\n\n";
}

}  // namespace moeserve::server
