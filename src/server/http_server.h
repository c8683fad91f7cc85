// HTTP/1.1 server on Boost.Beast/Asio: keep-alive, N io threads, a strand per connection,
// request body limit, chunked SSE streaming, client-disconnect detection while a request
// is in flight (a read on the idle socket during the response). Routing and the OpenAI
// semantics live in the Handler (openai_service.h).
#pragma once
#include <boost/asio.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace moeserve::server {

struct HttpRequest {
  std::string method;
  std::string target;  // path and query
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// One in-flight request's response channel. All methods must run on the connection's strand
// (use post()); they are no-ops once the client is gone.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual void send(int status, const std::string& content_type, std::string body) = 0;
  virtual void start_stream(const std::string& content_type) = 0;
  virtual void stream_write(std::string data) = 0;
  virtual void end_stream() = 0;
  virtual void post(std::function<void()> fn) = 0;
  // Called (on the strand) at most once if the client disconnects before the response ends.
  virtual void on_disconnect(std::function<void()> fn) = 0;
  virtual bool disconnected() const = 0;
  // An extra header for this request's response (before send/start_stream). Values with
  // control characters are dropped.
  virtual void add_header(const std::string& name, const std::string& value) { (void)name, (void)value; }
  // Runs `fn` on the strand after `delay` (stream keep-alives). A sink without timers never runs it.
  virtual void post_after(std::chrono::milliseconds delay, std::function<void()> fn) { (void)delay, (void)fn; }
};

class Handler {
 public:
  virtual ~Handler() = default;
  virtual void handle(HttpRequest&& req, std::shared_ptr<ResponseSink> sink) = 0;
};

struct HttpServerConfig {
  std::string host = "0.0.0.0";
  int port = 8000;
  int io_threads = 2;
  size_t max_body_bytes = 32u << 20;
};

class Session;

class HttpServer {
 public:
  HttpServer(HttpServerConfig cfg, Handler& handler);
  ~HttpServer();
  // Binds and starts the io threads; throws moeserve::Error when the address is unusable.
  void start();
  int port() const { return bound_port_; }
  // Stops accepting new connections; closes idle keep-alive connections.
  void stop_accepting();
  // Number of connections with a request in flight.
  int busy_sessions();
  // Closes every connection and stops the io threads.
  void stop();
  boost::asio::io_context& io() { return io_; }

 private:
  friend class Session;
  void do_accept();
  void forget(Session* s);

  HttpServerConfig cfg_;
  Handler& handler_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  int bound_port_ = 0;
  std::atomic<bool> accepting_{false};
  std::mutex mu_;
  std::map<Session*, std::weak_ptr<Session>> sessions_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
};

const char* status_text(int status);

}  // namespace moeserve::server
