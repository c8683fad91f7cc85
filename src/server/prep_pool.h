// Request preparation (JSON parsing, chat-template rendering, tokenisation) on a small pool
// of worker threads instead of the HTTP io threads, so that /health and the streams in
// flight are served while large bodies are prepared. The queue is bounded by count and by
// the bytes of the bodies it holds (a multiple of the body limit), which bounds the memory
// preparation takes: threads x (the parser's overhead per body byte) x the body limit, plus
// the queued bodies themselves.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "server/http_server.h"

namespace moeserve::server {

struct PrepPoolConfig {
  int threads = 2;
  size_t max_queued_bytes = size_t(128) << 20;  // bodies queued or being prepared
  int max_queued = 4096;
};

class PrepPool {
 public:
  using Job = std::function<void(std::shared_ptr<ResponseSink>)>;
  explicit PrepPool(PrepPoolConfig cfg);
  ~PrepPool() { shutdown(); }
  // Runs the jobs already queued, refuses new ones and joins the workers. Call before the
  // HttpServer whose sinks the jobs hold goes away. Idempotent.
  void shutdown();
  // Runs job(s) on a worker. `s` forwards to `sink` on its strand, in call order; posts to
  // `s` made while the job runs (the engine delivering a first token) are run after the
  // job's own calls, as if the job had run on the strand. False (nothing queued) when the
  // queue is full; the caller answers 503. Call on the connection's strand.
  bool submit(size_t bytes, std::shared_ptr<ResponseSink> sink, Job job);
  int queued() const;

 private:
  struct Item {
    size_t bytes;
    std::shared_ptr<ResponseSink> sink;
    Job job;
  };
  void worker();

  PrepPoolConfig cfg_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  size_t bytes_ = 0;  // queued and running
  int count_ = 0;     // queued and running
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace moeserve::server
