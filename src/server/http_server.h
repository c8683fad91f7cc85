// HTTP/1.1 server on Boost.Beast/Asio: keep-alive, pipelining (answered in order), N io
// threads, a strand per connection, request body limit, chunked SSE streaming, client-
// disconnect detection while a request is in flight, half-closed clients still answered,
// header / body / keep-alive / write timeouts, write backpressure and a cap on concurrent
// connections. Routing and the OpenAI semantics live in the Handler (openai_service.h).
// docs/reliability.md lists the limits and what a client sees when it hits one.
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
  std::map<std::string, std::string> headers;  // lower-case names; values without surrounding whitespace
  std::string body;
  // The request line and header fields exactly as received (for raw_header()).
  std::string raw_head;
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
  // The first field of that name as sent: the bytes after the colon and the optional
  // whitespace that follows it, up to the line end, trailing whitespace kept. For exact
  // comparisons (the API key); nullopt when absent.
  std::optional<std::string> raw_header(const std::string& lower_name) const;
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
  // Write backpressure: true while more response bytes wait for the client than the server
  // buffers per connection. A streaming producer then stops formatting output and registers
  // on_drained(); the server calls it (on the strand, once) when the backlog has gone.
  virtual bool backlogged() const { return false; }
  virtual void on_drained(std::function<void()> fn) { post(std::move(fn)); }
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
  size_t max_header_bytes = 64u << 10;  // request line + fields; larger: 431
  // Seconds. An idle keep-alive connection is closed after keep_alive_timeout (uvicorn's
  // --timeout-keep-alive, 5). A request's header must be complete header_timeout after its
  // first byte (or after the accept), its body body_timeout after the header: else 408 and
  // close (slowloris). A response write that makes no progress for write_timeout closes the
  // connection (the engine request is aborted). <= 0 disables that timeout.
  double keep_alive_timeout = 5;
  double header_timeout = 10;
  double body_timeout = 60;
  double write_timeout = 30;
  // Response bytes buffered per connection before backlogged() turns true.
  size_t write_backlog_bytes = 256u << 10;
  // Connections served at once; 0: from the open-file limit (RLIMIT_NOFILE less a reserve
  // for the process's other files). Up to overflow_connections more are read for one request
  // each: /health and /ping are answered, everything else gets 503; beyond that a new
  // connection is closed at once.
  int max_connections = 0;
  int overflow_connections = 64;
};

class Session;

class HttpServer {
 public:
  HttpServer(HttpServerConfig cfg, Handler& handler);
  ~HttpServer();
  // Binds and starts the io threads; throws moeserve::Error when the address is unusable.
  void start();
  int port() const { return bound_port_; }
  // The connection cap in force (resolved from the fd limit when configured 0).
  int max_connections() const { return max_connections_; }
  // Stops accepting new connections; closes idle keep-alive connections.
  void stop_accepting();
  // Number of connections with a request in flight.
  int busy_sessions();
  // Open connections (served and overflow).
  int open_connections();
  // Closes every connection and stops the io threads.
  void stop();
  boost::asio::io_context& io() { return io_; }

 private:
  friend class Session;
  void do_accept();
  void on_accept(boost::system::error_code ec, boost::asio::ip::tcp::socket socket);
  void forget(Session* s);

  HttpServerConfig cfg_;
  Handler& handler_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer accept_retry_;
  std::vector<std::thread> threads_;
  int bound_port_ = 0;
  int max_connections_ = 0;
  int overflow_ = 0;  // overflow_connections, within the fd limit
  std::atomic<bool> accepting_{false};
  std::mutex mu_;
  std::map<Session*, std::weak_ptr<Session>> sessions_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
};

const char* status_text(int status);

}  // namespace moeserve::server
