// How `moeserve chat` reaches a model: both transports speak the OpenAI chat/completions
// streaming API (SSE), so the chat loop (chat.cpp) is the same for both.
//  - InProcessTransport hands the request to the OpenAIService of a ServeStack (the same
//    routes, template, parsers and engine `serve` answers with), through a ResponseSink whose
//    "connection" is this process: stopping an answer is the client-disconnect path.
//  - HttpTransport POSTs to a running server (--base-url) with libcurl.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>

namespace moeserve::server {
class OpenAIService;
}

namespace moeserve::cli {

struct StreamResult {
  int status = 0;          // HTTP status (0: the transfer failed; see error)
  std::string error;       // transport error, or the error body of a status != 200
  bool cancelled = false;  // stopped by `cancel`
};

// "data: ..." payloads of an SSE stream, in order (the "[DONE]" sentinel included).
using SseHandler = std::function<void(const std::string& data)>;

class ChatTransport {
 public:
  virtual ~ChatTransport() = default;
  // POSTs `body` (JSON text) to /v1/chat/completions and calls on_data per SSE event until the
  // stream ends, or until `cancel` becomes true (polled every 50 ms in process; over HTTP as
  // often as libcurl calls its progress callback, about once a second when no byte arrives).
  virtual StreamResult stream_chat(const std::string& body, const SseHandler& on_data,
                                   const std::atomic<bool>& cancel) = 0;
  // GET path (e.g. "/v1/models"): status and body.
  virtual StreamResult get(const std::string& path, std::string* body) = 0;
};

std::unique_ptr<ChatTransport> make_in_process_transport(server::OpenAIService& service, std::string api_key);
// base_url: "http://host:port" or ".../v1" (a trailing /v1 is dropped).
std::unique_ptr<ChatTransport> make_http_transport(std::string base_url, std::string api_key);

// Splits SSE bytes into events; calls on_data with each event's data lines joined by "\n".
class SseSplitter {
 public:
  explicit SseSplitter(SseHandler on_data) : on_data_(std::move(on_data)) {}
  void feed(const char* p, size_t n);

 private:
  SseHandler on_data_;
  std::string buf_;
};

}  // namespace moeserve::cli
