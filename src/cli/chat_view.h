// What `moeserve chat` prints for one streamed answer: reasoning (dimmed; on a terminal
// collapsed to one line once the answer starts, unless shown or hidden), the answer text as
// it streams, tool calls once complete. Fed the chunks of an OpenAI chat.completion.chunk
// stream; builds the assistant message kept in the conversation.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::cli {

enum class ReasoningMode { Show, Collapse, Hide };
// "show" | "collapse" | "hide"; false for anything else.
bool parse_reasoning_mode(const std::string& s, ReasoningMode* mode);
const char* reasoning_mode_name(ReasoningMode m);

struct ToolCallView {
  std::string id, name, arguments;
};

class AnswerView {
 public:
  // tty: ANSI styling and the collapse; else plain lines ("[reasoning] ...", "[tool call] ...").
  AnswerView(std::FILE* out, bool tty, ReasoningMode mode) : out_(out), tty_(tty), mode_(mode) {}
  // One chunk (parsed JSON). Returns an error message carried by the stream, or "".
  std::string on_chunk(const nlohmann::json& chunk);
  // The stream ended (or was stopped): closes the reasoning, prints tool calls and a note.
  void finish(bool stopped, const std::string& error);

  const std::string& content() const { return content_; }
  const std::string& reasoning() const { return reasoning_; }
  const std::vector<ToolCallView>& tool_calls() const { return calls_; }
  const std::string& finish_reason() const { return finish_reason_; }
  // {"role":"assistant","content":...,"tool_calls":[...]} (reasoning is not sent back).
  nlohmann::ordered_json message() const;

 private:
  void reasoning_delta(const std::string& text);
  void content_delta(const std::string& text);
  void close_reasoning();
  int terminal_rows_of(const std::string& text) const;

  std::FILE* out_;
  bool tty_;
  ReasoningMode mode_;
  std::string content_, reasoning_, finish_reason_;
  std::vector<ToolCallView> calls_;
  bool reasoning_open_ = false;  // reasoning printed, the answer not started yet
  bool reasoning_closed_ = false;
};

}  // namespace moeserve::cli
