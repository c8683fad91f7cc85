#include "server/prep_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "core/log.h"
#include "server/errors.h"

namespace moeserve::server {

namespace {

// The sink a prepared request's handler sees on the worker. Until the job returns every call
// is recorded (posts apart) and then replayed on the strand in one closure, followed by the
// posts that arrived meanwhile; afterwards calls go straight to the session's sink (they
// then come from the strand, as ResponseSink requires).
class DeferredSink : public ResponseSink {
 public:
  explicit DeferredSink(std::shared_ptr<ResponseSink> real) : real_(std::move(real)) {}

  void send(int status, const std::string& content_type, std::string body) override {
    run([status, content_type, body = std::move(body)](ResponseSink& s) mutable {
      s.send(status, content_type, std::move(body));
    });
  }
  void start_stream(const std::string& content_type) override {
    run([content_type](ResponseSink& s) { s.start_stream(content_type); });
  }
  void stream_write(std::string data) override {
    run([data = std::move(data)](ResponseSink& s) mutable { s.stream_write(std::move(data)); });
  }
  void end_stream() override {
    run([](ResponseSink& s) { s.end_stream(); });
  }
  void add_header(const std::string& name, const std::string& value) override {
    run([name, value](ResponseSink& s) { s.add_header(name, value); });
  }
  void on_disconnect(std::function<void()> fn) override {
    // A client gone before the replay never calls the session's hook: call it then.
    run([fn = std::move(fn)](ResponseSink& s) mutable {
      if (s.disconnected()) fn();
      else s.on_disconnect(std::move(fn));
    });
  }
  void on_drained(std::function<void()> fn) override {
    run([fn = std::move(fn)](ResponseSink& s) mutable { s.on_drained(std::move(fn)); });
  }
  void post_after(std::chrono::milliseconds delay, std::function<void()> fn) override {
    run([delay, fn = std::move(fn)](ResponseSink& s) mutable { s.post_after(delay, std::move(fn)); });
  }
  bool backlogged() const override {
    std::lock_guard lk(mu_);
    return direct_ && real_->backlogged();
  }
  bool disconnected() const override { return real_->disconnected(); }
  void post(std::function<void()> fn) override {
    std::lock_guard lk(mu_);
    if (direct_) real_->post(std::move(fn));
    else posts_.push_back(std::move(fn));
  }

  // The job has returned: replay on the strand. Posted under the lock so that a post()
  // arriving now lands behind the replay on the strand's queue.
  void release() {
    std::lock_guard lk(mu_);
    direct_ = true;
    real_->post([real = real_, ops = std::move(ops_), posts = std::move(posts_)]() mutable {
      for (auto& op : ops) op(*real);
      for (auto& fn : posts) fn();
    });
  }

 private:
  void run(std::function<void(ResponseSink&)> op) {
    std::unique_lock lk(mu_);
    if (!direct_) {
      ops_.push_back(std::move(op));
      return;
    }
    lk.unlock();
    op(*real_);
  }

  std::shared_ptr<ResponseSink> real_;
  mutable std::mutex mu_;
  bool direct_ = false;
  std::vector<std::function<void(ResponseSink&)>> ops_;
  std::vector<std::function<void()>> posts_;
};

}  // namespace

PrepPool::PrepPool(PrepPoolConfig cfg) : cfg_(cfg) {
  fix_mmap_threshold(cfg_.mmap_threshold_bytes);
  for (int i = 0; i < std::max(1, cfg_.threads); ++i) threads_.emplace_back([this] { worker(); });
}

void PrepPool::shutdown() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

bool PrepPool::submit(size_t bytes, std::shared_ptr<ResponseSink> sink, Job job) {
  {
    std::lock_guard lk(mu_);
    // One request always fits, however large (the body limit bounds it).
    if (stop_ || count_ >= cfg_.max_queued || (count_ > 0 && bytes_ + bytes > cfg_.max_queued_bytes)) return false;
    bytes_ += bytes;
    ++count_;
    queue_.push_back(Item{bytes, std::move(sink), std::move(job)});
  }
  cv_.notify_one();
  return true;
}

int PrepPool::queued() const {
  std::lock_guard lk(mu_);
  return count_;
}

void PrepPool::worker() {
  for (;;) {
    Item item;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    auto deferred = std::make_shared<DeferredSink>(item.sink);
    if (!item.sink->disconnected()) {
      try {
        item.job(deferred);
      } catch (const ApiError& e) {
        deferred->send(e.status, "application/json", error_body(e));
      } catch (const std::exception& e) {
        spdlog::error("request preparation failed: {}", e.what());
        deferred->send(500, "application/json", error_body(500, "InternalServerError", e.what()));
      }
    }
    deferred->release();
    const size_t bytes = item.bytes;
    item = Item{};  // free the body before the accounting says so
    {
      std::lock_guard lk(mu_);
      bytes_ -= bytes;
      --count_;
    }
    // A large body's preparation took tens of times its size in small heap blocks (JSON
    // trees, message copies, template values) from this thread's malloc arena; freed, glibc
    // keeps those pages (fragmented arenas), so RSS stayed at the peak of the largest bodies
    // ever prepared (2.5 GB after 32 MiB bodies, 190 MB idle). Return them to the system.
    // After the accounting: the trim can take most of a second under load, and the queue's
    // byte bound must not turn the next body away meanwhile (the freed memory is reusable
    // by the next preparation whether or not it has gone back to the system yet).
    if (bytes >= cfg_.trim_after_bytes) release_free_memory();
  }
}

namespace {
std::atomic<bool> g_trimming{false}, g_trim_again{false};
}  // namespace

void release_free_memory() {
#ifdef __GLIBC__
  // One trim at a time: a thread that finds one running asks it to go round once more (its
  // own frees may lie in an arena the running trim has passed) instead of queueing on the
  // arena locks behind it.
  g_trim_again = true;
  if (g_trimming.exchange(true)) return;
  const auto t0 = std::chrono::steady_clock::now();
  while (g_trim_again.exchange(false)) malloc_trim(0);
  g_trimming = false;
  spdlog::debug("prep pool: malloc_trim took {:.1f} ms",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
#endif
}

void fix_mmap_threshold(size_t bytes) {
#ifdef __GLIBC__
  static std::once_flag once;
  if (bytes > 0) std::call_once(once, [bytes] { mallopt(M_MMAP_THRESHOLD, static_cast<int>(bytes)); });
#else
  (void)bytes;
#endif
}

}  // namespace moeserve::server
