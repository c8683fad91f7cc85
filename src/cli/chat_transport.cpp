#include "cli/chat_transport.h"

#include <curl/curl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "server/http_server.h"
#include "server/openai_service.h"

namespace moeserve::cli {

void SseSplitter::feed(const char* p, size_t n) {
  buf_.append(p, n);
  for (;;) {
    // Events end with a blank line (the server writes "\n\n"; "\r\n\r\n" is accepted too).
    size_t cut = buf_.find("\n\n");
    size_t skip = 2;
    const size_t crlf = buf_.find("\r\n\r\n");
    if (crlf != std::string::npos && (cut == std::string::npos || crlf < cut)) cut = crlf, skip = 4;
    if (cut == std::string::npos) return;
    const std::string event = buf_.substr(0, cut);
    buf_.erase(0, cut + skip);
    std::string data;
    bool any = false;
    size_t pos = 0;
    while (pos <= event.size()) {
      size_t end = event.find('\n', pos);
      if (end == std::string::npos) end = event.size();
      std::string line = event.substr(pos, end - pos);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.rfind("data:", 0) == 0) {
        std::string v = line.substr(5);
        if (!v.empty() && v[0] == ' ') v.erase(0, 1);
        data += (any ? "\n" : "") + v;
        any = true;
      }
      pos = end + 1;
    }
    if (any) on_data_(data);
  }
}

namespace {

// A serial executor: the "strand" of the in-process connection (ResponseSink's contract:
// its methods and posted functions run one at a time).
class Strand {
 public:
  Strand() : thread_([this] { run(); }) {}
  ~Strand() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void post(std::function<void()> fn) {
    {
      std::lock_guard lk(mu_);
      if (stop_) return;
      q_.push_back(std::move(fn));
    }
    cv_.notify_all();
  }

 private:
  void run() {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [this] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;
      auto fn = std::move(q_.front());
      q_.pop_front();
      lk.unlock();
      fn();
      lk.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  bool stop_ = false;
  std::thread thread_;
};

// The response of one in-process request: what the service writes is queued for the chat
// loop; disconnect() is the client going away (the service then aborts the engine request).
class QueueSink : public server::ResponseSink, public std::enable_shared_from_this<QueueSink> {
 public:
  explicit QueueSink(Strand& strand) : strand_(strand) {}
  void send(int status, const std::string&, std::string body) override {
    std::lock_guard lk(mu_);
    status_ = status;
    body_ = std::move(body);
    done_ = true;
    cv_.notify_all();
  }
  void start_stream(const std::string&) override {
    std::lock_guard lk(mu_);
    status_ = 200;
    cv_.notify_all();
  }
  void stream_write(std::string data) override {
    std::lock_guard lk(mu_);
    chunks_.push_back(std::move(data));
    cv_.notify_all();
  }
  void end_stream() override {
    std::lock_guard lk(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void post(std::function<void()> fn) override { strand_.post(std::move(fn)); }
  void on_disconnect(std::function<void()> fn) override {
    std::lock_guard lk(mu_);
    if (gone_) strand_.post(std::move(fn));
    else on_gone_ = std::move(fn);
  }
  bool disconnected() const override { return gone_.load(); }
  void disconnect() {
    std::lock_guard lk(mu_);
    if (gone_.exchange(true)) return;
    if (on_gone_) strand_.post(std::move(on_gone_));
  }

  // Waits up to `wait` for output; moves what arrived into `out`. True once the response ended.
  bool take(std::deque<std::string>& out, std::chrono::milliseconds wait, int* status, std::string* body) {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, wait, [this] { return done_ || !chunks_.empty(); });
    while (!chunks_.empty()) {
      out.push_back(std::move(chunks_.front()));
      chunks_.pop_front();
    }
    *status = status_;
    *body = body_;
    return done_;
  }

 private:
  Strand& strand_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> chunks_;
  int status_ = 0;
  std::string body_;
  bool done_ = false;
  std::atomic<bool> gone_{false};
  std::function<void()> on_gone_;
};

class InProcessTransport : public ChatTransport {
 public:
  InProcessTransport(server::OpenAIService& service, std::string api_key)
      : service_(service), api_key_(std::move(api_key)) {}

  StreamResult stream_chat(const std::string& body, const SseHandler& on_data,
                           const std::atomic<bool>& cancel) override {
    auto sink = std::make_shared<QueueSink>(strand_);
    service_.handle(request("POST", "/v1/chat/completions", body), sink);
    SseSplitter sse(on_data);
    StreamResult r;
    std::deque<std::string> chunks;
    std::string err_body;
    for (;;) {
      const bool done = sink->take(chunks, std::chrono::milliseconds(50), &r.status, &err_body);
      for (auto& c : chunks) sse.feed(c.data(), c.size());
      chunks.clear();
      if (done) break;
      if (cancel.load()) {
        sink->disconnect();
        r.cancelled = true;
        break;
      }
    }
    if (r.status != 200) r.error = err_body;
    return r;
  }

  StreamResult get(const std::string& path, std::string* body) override {
    auto sink = std::make_shared<QueueSink>(strand_);
    service_.handle(request("GET", path, ""), sink);
    StreamResult r;
    std::deque<std::string> chunks;
    while (!sink->take(chunks, std::chrono::milliseconds(100), &r.status, body)) {
    }
    return r;
  }

 private:
  server::HttpRequest request(const std::string& method, const std::string& target, const std::string& body) const {
    server::HttpRequest h;
    h.method = method;
    h.target = target;
    h.body = body;
    h.headers["content-type"] = "application/json";
    h.raw_head = method + " " + target + " HTTP/1.1\r\nContent-Type: application/json";
    if (!api_key_.empty()) {
      h.headers["authorization"] = "Bearer " + api_key_;
      h.raw_head += "\r\nAuthorization: Bearer " + api_key_;
    }
    h.raw_head += "\r\n";
    return h;
  }
  server::OpenAIService& service_;
  std::string api_key_;
  Strand strand_;  // last: joined first, while the service is still alive
};

struct CurlCtx {
  const std::atomic<bool>* cancel = nullptr;
  SseSplitter* sse = nullptr;
  std::string body;  // non-200 bodies (bounded)
  long status = 0;
  CURL* curl = nullptr;
};

size_t on_curl_data(char* p, size_t size, size_t n, void* user) {
  auto* c = static_cast<CurlCtx*>(user);
  const size_t bytes = size * n;
  if (c->status == 0) curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &c->status);
  if (c->status == 200 && c->sse) c->sse->feed(p, bytes);
  else if (c->body.size() < (1u << 20)) c->body.append(p, bytes);
  return bytes;
}

int on_curl_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* c = static_cast<CurlCtx*>(user);
  return c->cancel && c->cancel->load() ? 1 : 0;  // non-zero: abort the transfer
}

class HttpTransport : public ChatTransport {
 public:
  HttpTransport(std::string base, std::string key) : base_(std::move(base)), key_(std::move(key)) {
    while (!base_.empty() && base_.back() == '/') base_.pop_back();
    if (base_.size() >= 3 && base_.compare(base_.size() - 3, 3, "/v1") == 0) base_.resize(base_.size() - 3);
    MS_CHECK(base_.rfind("http://", 0) == 0 || base_.rfind("https://", 0) == 0,
             "--base-url {}: expected http://HOST:PORT or https://...", base_);
    curl_global_init(CURL_GLOBAL_DEFAULT);
  }

  StreamResult stream_chat(const std::string& body, const SseHandler& on_data,
                           const std::atomic<bool>& cancel) override {
    SseSplitter sse(on_data);
    return perform("/v1/chat/completions", &body, &sse, &cancel, nullptr);
  }
  StreamResult get(const std::string& path, std::string* body) override {
    return perform(path, nullptr, nullptr, nullptr, body);
  }

 private:
  StreamResult perform(const std::string& path, const std::string* post, SseSplitter* sse,
                       const std::atomic<bool>* cancel, std::string* body_out) {
    CURL* curl = curl_easy_init();
    MS_CHECK(curl, "libcurl: cannot create a handle");
    CurlCtx ctx;
    ctx.cancel = cancel;
    ctx.sse = sse;
    ctx.curl = curl;
    const std::string url = base_ + path;
    curl_slist* hdrs = nullptr;
    hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
    hdrs = curl_slist_append(hdrs, sse ? "Accept: text/event-stream" : "Accept: application/json");
    if (!key_.empty()) hdrs = curl_slist_append(hdrs, ("Authorization: Bearer " + key_).c_str());
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hdrs);
    if (post) {
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, post->data());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(post->size()));
    }
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_curl_data);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &ctx);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_curl_progress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &ctx);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // SIGINT is the chat loop's (Ctrl-C stops an answer)
    const CURLcode rc = curl_easy_perform(curl);
    StreamResult r;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &ctx.status);
    r.status = int(ctx.status);
    if (rc == CURLE_ABORTED_BY_CALLBACK) {
      r.cancelled = true;
    } else if (rc != CURLE_OK) {
      r.status = 0;
      r.error = std::string(curl_easy_strerror(rc)) + " (" + url + ")";
    } else if (r.status != 200 || !sse) {
      if (body_out) *body_out = ctx.body;
      if (r.status != 200) r.error = ctx.body;
    }
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(curl);
    return r;
  }
  std::string base_, key_;
};

}  // namespace

std::unique_ptr<ChatTransport> make_in_process_transport(server::OpenAIService& service, std::string api_key) {
  return std::make_unique<InProcessTransport>(service, std::move(api_key));
}

std::unique_ptr<ChatTransport> make_http_transport(std::string base_url, std::string api_key) {
  return std::make_unique<HttpTransport>(std::move(base_url), std::move(api_key));
}

}  // namespace moeserve::cli
