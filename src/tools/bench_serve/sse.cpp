#include "tools/bench_serve/sse.h"

#include <nlohmann/json.hpp>
#include "core/bounded_json.h"

namespace moeserve::bench {

void SseRecorder::feed(std::string_view bytes, double now) {
  buf_.append(bytes.data(), bytes.size());
  // Events are separated by a blank line; accept \r\n line ends too.
  for (;;) {
    size_t end = buf_.find("\n\n");
    size_t sep = 2;
    size_t crlf = buf_.find("\r\n\r\n");
    if (crlf != std::string::npos && (end == std::string::npos || crlf < end)) {
      end = crlf;
      sep = 4;
    }
    if (end == std::string::npos) break;
    std::string event = buf_.substr(0, end);
    buf_.erase(0, end + sep);
    // One event may hold several lines; the data lines are joined with '\n' (SSE spec).
    std::string data;
    bool has_data = false;
    size_t pos = 0;
    while (pos <= event.size()) {
      size_t nl = event.find('\n', pos);
      std::string line = event.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.rfind("data:", 0) == 0) {
        std::string v = line.substr(5);
        if (!v.empty() && v[0] == ' ') v.erase(0, 1);
        if (has_data) data += '\n';
        data += v;
        has_data = true;
      }  // comments (":"), event:, id:, retry: lines are ignored
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
    if (has_data) on_event(data, now);
  }
}

void SseRecorder::on_event(const std::string& data, double now) {
  if (done_) return;
  if (data == "[DONE]") {
    done_ = true;
    return;
  }
  nlohmann::json j = moeserve::parse_json_bounded_or_discarded(data);
  if (j.is_discarded() || !j.is_object()) {
    if (error_.empty()) error_ = "invalid JSON in stream: " + data.substr(0, 200);
    return;
  }
  if (j.contains("error")) {
    // A mid-stream error frame (the HTTP status was already 200): the request failed.
    const auto& e = j["error"];
    error_ = e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>()
                                                                                 : e.dump();
    return;
  }
  const auto choices = j.find("choices");
  if (choices != j.end() && choices->is_array() && !choices->empty()) {
    if (!got_first_) {
      got_first_ = true;
      ttft_ = now - start_;
    } else {
      itl_.push_back(now - last_);
    }
    last_ = now;
    const auto& c0 = (*choices)[0];
    const nlohmann::json* text = nullptr;
    if (chat_) {
      if (c0.contains("delta") && c0["delta"].is_object() && c0["delta"].contains("content"))
        text = &c0["delta"]["content"];
    } else if (c0.contains("text")) {
      text = &c0["text"];
    }
    if (text && text->is_string()) text_ += text->get<std::string>();
  } else if (j.contains("usage") && j["usage"].is_object()) {
    const auto& u = j["usage"];
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
      completion_tokens_ = u["completion_tokens"].get<int64_t>();
    if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer())
      prompt_tokens_ = u["prompt_tokens"].get<int64_t>();
  }
}

void SseRecorder::finish(RequestOutput& out) {
  out.ttft = ttft_;
  out.itl = itl_;
  out.latency = last_ - start_;
  out.generated_text = text_;
  out.output_tokens = completion_tokens_;
  if (prompt_tokens_ >= 0) out.prompt_len = prompt_tokens_;
  if (!error_.empty()) {
    out.success = false;
    out.error = error_;
  } else if (!got_first_) {
    out.success = false;
    out.error = "Never received a valid chunk to calculate TTFT. This response will be marked as failed!";
  } else {
    out.success = true;
  }
}

}  // namespace moeserve::bench
