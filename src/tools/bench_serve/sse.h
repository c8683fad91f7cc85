// Streaming-response recorder for `moeserve bench`: takes the response body bytes of one
// OpenAI streaming request as they arrive (split anywhere), cuts them into SSE events and
// records the timings of vllm bench serve (see metrics.h): the first event whose JSON has
// a non-empty `choices` sets TTFT (text may still be empty, e.g. a role-only chat delta),
// every later one appends an ITL gap and moves the end (E2EL); a `choices: []` event with
// `usage` gives the token counts and does not move the end. `: comment` lines (pings) are
// skipped; `data: [DONE]` ends the stream. Pure (no I/O), so it is unit-tested directly.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "tools/bench_serve/metrics.h"

namespace moeserve::bench {

class SseRecorder {
 public:
  // chat: read choices[0].delta.content; else choices[0].text (/v1/completions).
  // start: the send time, on the same clock as the `now` values given to feed().
  SseRecorder(bool chat, double start) : chat_(chat), start_(start), last_(start) {}
  // Bytes received at time `now` (seconds).
  void feed(std::string_view bytes, double now);
  // Fills out: success needs at least one token-bearing event and no error event.
  // Keeps out.prompt_len when the server sent no usage.
  void finish(RequestOutput& out);

 private:
  void on_event(const std::string& data, double now);
  bool chat_;
  double start_, last_;
  std::string buf_;
  bool got_first_ = false, done_ = false;
  double ttft_ = 0;
  std::vector<double> itl_;
  std::string text_, error_;
  int64_t completion_tokens_ = 0, prompt_tokens_ = -1;
};

}  // namespace moeserve::bench
