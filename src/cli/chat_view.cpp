#include "cli/chat_view.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <sstream>

namespace moeserve::cli {
namespace {
constexpr const char* kDim = "\033[2m";
constexpr const char* kCyan = "\033[36m";
constexpr const char* kYellow = "\033[33m";
constexpr const char* kReset = "\033[0m";
constexpr const char* kReasoningPrefix = "thinking: ";

int count_words(const std::string& s) {
  std::istringstream in(s);
  int n = 0;
  for (std::string w; in >> w;) ++n;
  return n;
}
}  // namespace

bool parse_reasoning_mode(const std::string& s, ReasoningMode* mode) {
  if (s == "show") *mode = ReasoningMode::Show;
  else if (s == "collapse") *mode = ReasoningMode::Collapse;
  else if (s == "hide") *mode = ReasoningMode::Hide;
  else return false;
  return true;
}

const char* reasoning_mode_name(ReasoningMode m) {
  return m == ReasoningMode::Show ? "show" : m == ReasoningMode::Collapse ? "collapse" : "hide";
}

std::string AnswerView::on_chunk(const nlohmann::json& chunk) {
  if (chunk.contains("error")) {
    const auto& e = chunk["error"];
    return e.is_object() ? e.value("message", e.dump()) : e.dump();
  }
  if (!chunk.contains("choices") || !chunk["choices"].is_array()) return "";
  for (const auto& c : chunk["choices"]) {
    if (!c.is_object()) continue;
    if (c.contains("finish_reason") && c["finish_reason"].is_string()) finish_reason_ = c["finish_reason"];
    if (!c.contains("delta") || !c["delta"].is_object()) continue;
    const auto& d = c["delta"];
    if (d.contains("reasoning_content") && d["reasoning_content"].is_string())
      reasoning_delta(d["reasoning_content"].get<std::string>());
    if (d.contains("content") && d["content"].is_string()) content_delta(d["content"].get<std::string>());
    if (d.contains("tool_calls") && d["tool_calls"].is_array()) {
      for (const auto& tc : d["tool_calls"]) {
        const size_t i = tc.contains("index") && tc["index"].is_number_unsigned() ? tc["index"].get<size_t>() : 0;
        if (i >= 128) continue;
        if (calls_.size() <= i) calls_.resize(i + 1);
        ToolCallView& v = calls_[i];
        if (tc.contains("id") && tc["id"].is_string()) v.id = tc["id"];
        if (tc.contains("function") && tc["function"].is_object()) {
          const auto& f = tc["function"];
          if (f.contains("name") && f["name"].is_string()) v.name += f["name"].get<std::string>();
          if (f.contains("arguments") && f["arguments"].is_string()) v.arguments += f["arguments"].get<std::string>();
        }
      }
    }
  }
  return "";
}

void AnswerView::reasoning_delta(const std::string& text) {
  if (text.empty()) return;
  reasoning_ += text;
  if (mode_ == ReasoningMode::Hide || reasoning_closed_) return;
  if (!reasoning_open_) {
    reasoning_open_ = true;
    std::fputs(tty_ ? kDim : "[reasoning] ", out_);
    if (tty_) std::fputs(kReasoningPrefix, out_);
  }
  std::fputs(text.c_str(), out_);
  std::fflush(out_);
}

// Rows the reasoning took on the terminal (for the collapse): each line wraps at the width.
int AnswerView::terminal_rows_of(const std::string& text) const {
  winsize ws{};
  if (ioctl(fileno(out_), TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0) return -1;
  int rows = 0;
  size_t pos = 0;
  for (;;) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    int cols = 0;  // code points (UTF-8 lead bytes); wide characters count one: an estimate
    for (size_t i = pos; i < end; ++i) cols += (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80;
    rows += cols == 0 ? 1 : (cols + ws.ws_col - 1) / ws.ws_col;
    if (end == text.size()) break;
    pos = end + 1;
  }
  return rows >= ws.ws_row ? -1 : rows;  // scrolled off the top: cannot be erased
}

void AnswerView::close_reasoning() {
  if (reasoning_closed_ || reasoning_.empty()) return;
  reasoning_closed_ = true;
  const std::string summary =
      "(reasoning: " + std::to_string(count_words(reasoning_)) + " words; /thoughts shows it)";
  if (mode_ == ReasoningMode::Hide) {
    std::fprintf(out_, "%s%s%s\n", tty_ ? kDim : "", summary.c_str(), tty_ ? kReset : "");
    return;
  }
  if (!reasoning_open_) return;
  reasoning_open_ = false;
  if (!tty_) {
    std::fputs("\n", out_);
    return;
  }
  std::fputs(kReset, out_);
  std::fputs("\n", out_);
  if (mode_ == ReasoningMode::Collapse) {
    const int rows = terminal_rows_of(kReasoningPrefix + reasoning_);
    // Up to the first reasoning row, erase to the end of the screen, one summary line instead.
    if (rows > 0) std::fprintf(out_, "\033[%dA\r\033[J%s%s%s\n", rows, kDim, summary.c_str(), kReset);
  }
  std::fflush(out_);
}

void AnswerView::content_delta(const std::string& text) {
  if (text.empty()) return;
  if (content_.empty()) {
    // Models often open the answer with blank lines after the reasoning.
    const size_t b = text.find_first_not_of("\r\n");
    if (b == std::string::npos) return;
    close_reasoning();
    content_ = text.substr(b);
    std::fputs(content_.c_str(), out_);
  } else {
    close_reasoning();
    content_ += text;
    std::fputs(text.c_str(), out_);
  }
  std::fflush(out_);
}

void AnswerView::finish(bool stopped, const std::string& error) {
  close_reasoning();
  if (!content_.empty() && content_.back() != '\n') std::fputs("\n", out_);
  for (const auto& c : calls_) {
    if (tty_) std::fprintf(out_, "%s-> tool call %s(%s)%s\n", kCyan, c.name.c_str(), c.arguments.c_str(), kReset);
    else std::fprintf(out_, "[tool call] %s %s\n", c.name.c_str(), c.arguments.c_str());
  }
  if (!calls_.empty() && !stopped && error.empty())
    std::fprintf(out_, "%s(send the result with /tool TEXT)%s\n", tty_ ? kDim : "", tty_ ? kReset : "");
  auto note = [&](const std::string& s) {
    if (tty_) std::fprintf(out_, "%s[%s]%s\n", kYellow, s.c_str(), kReset);
    else std::fprintf(out_, "[%s]\n", s.c_str());
  };
  if (stopped) note("stopped");
  else if (!error.empty()) note("error: " + error);
  else if (finish_reason_ == "length") note("max_tokens reached");
  std::fflush(out_);
}

nlohmann::ordered_json AnswerView::message() const {
  nlohmann::ordered_json m = {{"role", "assistant"}, {"content", content_}};
  if (!calls_.empty()) {
    m["tool_calls"] = nlohmann::ordered_json::array();
    for (const auto& c : calls_)
      m["tool_calls"].push_back(
          {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return m;
}

}  // namespace moeserve::cli
