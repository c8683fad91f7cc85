// The seam between the shared generation pipeline and the wire formats of the three generation
// APIs (OpenAI chat/completions, Anthropic Messages, OpenAI Responses).
//
// The pipeline (OpenAIService::run_generation, openai_service.cpp) owns everything but the
// bytes: chat-template rendering, tokenization, sampling parameters, engine submission, the
// per-choice OutputProcessor (detokenizer, stop strings, reasoning and tool parsers), metrics,
// request ids and aborts on client disconnect. A formatter only turns the processed deltas
// into its API's stream events and final body, so a fix in the pipeline reaches all APIs.
//
// Threads: every method runs on the connection's strand (io thread), except `GenStart::abort`,
// which may be called from any thread.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/output_processor.h"
#include "server/response.h"

namespace moeserve::server {

struct GenStart {
  const ResponseContext* ctx = nullptr;
  const std::vector<std::vector<int32_t>>* prompt_ids = nullptr;  // one per prompt
  const std::vector<std::string>* echo_text = nullptr;            // completions echo, per prompt
  int n = 1;                                                      // choices per prompt
  // Aborts every engine request of the call (the choices then finish with "abort" and the
  // response completes as usual). Thread-safe; a no-op once the call is gone.
  std::function<void()> abort;
};

class ApiFormatter {
 public:
  virtual ~ApiFormatter() = default;
  // Response id prefix: "chatcmpl-", "cmpl-", "msg_", "resp_".
  virtual std::string id_prefix() const = 0;
  // After validation and before submission.
  virtual void begin(const GenStart& start) = 0;
  // Every processed delivery of choice `index`, streaming or not (formatters that build their
  // final body from the deltas accumulate here). Streaming bytes are appended to `out`;
  // `running` is the running usage when the API asked for it on every chunk.
  virtual void on_delta(std::string& out, int index, const ChoiceDelta& d, const RequestOutput& ro,
                        const Usage* running) = 0;
  // Streaming: the closing bytes once every choice finished.
  virtual void on_stream_end(std::string& out, const Usage& u) = 0;
  // Non-streaming: the 200 body once every choice finished without error.
  virtual std::string response_body(const std::vector<const OutputProcessor*>& choices, const Usage& u) = 0;
  // An error answered instead of a 200 (generation failure, engine refusal): this API's
  // status code and body for the pipeline's (status, OpenAI type, message).
  virtual int error_status(int status) const { return status; }
  virtual std::string error_json(int status, const std::string& type, const std::string& message) const = 0;
  // The client went away (no further output is written).
  virtual void on_cancel() {}
  // Streaming: bytes that keep an idle stream alive (ServiceConfig::stream_keepalive_ms);
  // nothing by default.
  virtual void keepalive(std::string& out) { (void)out; }
};

}  // namespace moeserve::server
