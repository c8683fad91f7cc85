#include "server/http_server.h"

#include "server/anthropic_api.h"

#include <algorithm>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "server/errors.h"

namespace moeserve::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

const char* status_text(int s) {
  switch (s) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

class Session : public std::enable_shared_from_this<Session>, public ResponseSink {
 public:
  Session(HttpServer& server, tcp::socket&& socket)
      : server_(server), socket_(std::move(socket)) {
    // The socket was accepted on its own strand (see do_accept): its executor is the
    // connection's strand, so every handler of this session is serialised.
    boost::system::error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
  }

  void start() {
    asio::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  // Closes the connection if no request is in flight (graceful shutdown).
  void close_if_idle() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      if (!self->in_flight_) self->close();
    });
  }
  void force_close() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->close(); });
  }
  bool in_flight() const { return in_flight_.load(); }

  // ---- ResponseSink ----
  void send(int status, const std::string& content_type, std::string body) override {
    if (closed_ || !in_flight_) return;
    std::string out = head(status, content_type);
    out += "content-length: " + std::to_string(body.size()) + "\r\n\r\n";
    out += body;
    response_done_ = true;
    enqueue(std::move(out));
  }
  void start_stream(const std::string& content_type) override {
    if (closed_ || !in_flight_) return;
    std::string out = head(200, content_type);
    out += "cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n";
    enqueue(std::move(out));
  }
  void stream_write(std::string data) override {
    if (closed_ || !in_flight_ || data.empty()) return;
    char hex[20];
    int n = std::snprintf(hex, sizeof hex, "%zx\r\n", data.size());
    std::string out;
    out.reserve(data.size() + n + 2);
    out.append(hex, n);
    out += data;
    out += "\r\n";
    enqueue(std::move(out));
  }
  void end_stream() override {
    if (closed_ || !in_flight_) return;
    response_done_ = true;
    enqueue("0\r\n\r\n");
  }
  void post(std::function<void()> fn) override { asio::post(socket_.get_executor(), std::move(fn)); }
  void on_disconnect(std::function<void()> fn) override { on_disconnect_ = std::move(fn); }
  void post_after(std::chrono::milliseconds delay, std::function<void()> fn) override {
    auto timer = std::make_shared<asio::steady_timer>(socket_.get_executor(), delay);
    timer->async_wait([timer, fn = std::move(fn)](const beast::error_code& ec) {
      if (!ec) fn();
    });
  }
  bool disconnected() const override { return closed_; }
  void add_header(const std::string& name, const std::string& value) override {
    auto ok = [](const std::string& s) {
      return std::all_of(s.begin(), s.end(), [](unsigned char c) { return c >= 0x20 && c != 0x7f; });
    };
    if (!name.empty() && ok(name) && ok(value) && name.find(':') == std::string::npos)
      extra_headers_ += name + ": " + value + "\r\n";
  }

 private:
  std::string head(int status, const std::string& content_type) {
    std::string h = "HTTP/1.1 " + std::to_string(status) + " " + status_text(status) + "\r\n";
    h += "server: moeserve\r\ncontent-type: " + content_type + "\r\n";
    h += extra_headers_;
    extra_headers_.clear();
    if (!keep_alive_) h += "connection: close\r\n";
    return h;
  }

  void read_request() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(server_.cfg_.max_body_bytes);
    parser_->header_limit(64 * 1024);
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset || closed_) {
      close();
      return;
    }
    if (ec) {
      // Malformed HTTP or a body over the limit: answer once, then close.
      keep_alive_ = false;
      in_flight_ = true;
      if (ec == http::error::body_limit) {
        std::string msg = "Request body too large (limit " + std::to_string(server_.cfg_.max_body_bytes) + " bytes)";
        // Anthropic routes answer in Anthropic's error shape.
        bool anthropic = std::string_view(parser_->get().target()).rfind("/v1/messages", 0) == 0;
        send(413, "application/json", anthropic ? anthropic_error_body(413, msg) : error_body(413, "BadRequestError", msg));
      }
      else
        send(400, "application/json", error_body(400, "BadRequestError", "Malformed HTTP request: " + ec.message()));
      return;
    }
    auto msg = parser_->release();
    HttpRequest req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    for (auto& f : msg) {
      std::string name(f.name_string());
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req.headers[name] = std::string(f.value());
    }
    req.body = std::move(msg.body());
    keep_alive_ = msg.keep_alive() && server_.accepting_;
    in_flight_ = true;
    response_done_ = false;
    on_disconnect_ = nullptr;
    watch();
    try {
      server_.handler_.handle(std::move(req), shared_from_this());
    } catch (const ApiError& e) {
      send(e.status, "application/json", error_body(e));
    } catch (const std::exception& e) {
      send(500, "application/json", error_body(500, "InternalServerError", e.what()));
    }
  }

  // While a request is in flight, a pending read notices a client that goes away.
  void watch() {
    if (watching_ || closed_) return;
    watching_ = true;
    socket_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->watching_ = false;
      if (ec || n == 0) {
        self->close();
        return;
      }
      self->buffer_.commit(n);  // pipelined bytes of the next request
      if (!self->in_flight_) self->read_request();
      // else: no further watch; a second request before the response ends is read afterwards
    });
  }

  void enqueue(std::string data) {
    if (pending_.empty()) pending_ = std::move(data);
    else pending_ += data;
    if (!writing_) flush();
  }

  void flush() {
    if (pending_.empty() || closed_) return;
    writing_ = true;
    inflight_.swap(pending_);
    pending_.clear();
    asio::async_write(socket_, asio::buffer(inflight_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->writing_ = false;
      self->inflight_.clear();
      if (ec) {
        self->close();
        return;
      }
      if (!self->pending_.empty()) {
        self->flush();
        return;
      }
      if (self->response_done_) self->finish_response();
    });
  }

  void finish_response() {
    in_flight_ = false;
    response_done_ = false;
    on_disconnect_ = nullptr;
    if (!keep_alive_) {
      boost::system::error_code ec;
      socket_.shutdown(tcp::socket::shutdown_send, ec);
      close();
      return;
    }
    if (!watching_) read_request();  // else the watch's completion resumes reading
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ec;
    socket_.close(ec);
    if (in_flight_ && on_disconnect_) {
      auto fn = std::move(on_disconnect_);
      on_disconnect_ = nullptr;
      fn();
    }
    server_.forget(this);
  }

  HttpServer& server_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string pending_, inflight_;
  bool writing_ = false;
  bool watching_ = false;
  bool keep_alive_ = true;
  std::string extra_headers_;  // for the current response
  bool response_done_ = false;
  bool closed_ = false;
  std::atomic<bool> in_flight_{false};
  std::function<void()> on_disconnect_;
};

HttpServer::HttpServer(HttpServerConfig cfg, Handler& handler)
    : cfg_(std::move(cfg)), handler_(handler), acceptor_(io_) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(cfg_.host == "localhost" ? "127.0.0.1" : cfg_.host, ec);
  MS_CHECK(!ec, "--host {}: not an IP address ({})", cfg_.host, ec.message());
  tcp::endpoint ep(addr, static_cast<unsigned short>(cfg_.port));
  acceptor_.open(ep.protocol(), ec);
  MS_CHECK(!ec, "cannot open socket: {}", ec.message());
  acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  acceptor_.bind(ep, ec);
  MS_CHECK(!ec, "cannot bind {}:{}: {}", cfg_.host, cfg_.port, ec.message());
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  MS_CHECK(!ec, "cannot listen on {}:{}: {}", cfg_.host, cfg_.port, ec.message());
  bound_port_ = acceptor_.local_endpoint().port();
  accepting_ = true;
  work_.emplace(io_.get_executor());
  do_accept();
  for (int i = 0; i < std::max(1, cfg_.io_threads); ++i) threads_.emplace_back([this] { io_.run(); });
}

void HttpServer::do_accept() {
  acceptor_.async_accept(asio::make_strand(io_), [this](beast::error_code ec, tcp::socket socket) {
    if (!accepting_) return;
    if (!ec) {
      auto s = std::make_shared<Session>(*this, std::move(socket));
      {
        std::lock_guard lk(mu_);
        sessions_[s.get()] = s;
      }
      s->start();
    }
    do_accept();
  });
}

void HttpServer::forget(Session* s) {
  std::lock_guard lk(mu_);
  sessions_.erase(s);
}

void HttpServer::stop_accepting() {
  if (!accepting_.exchange(false)) return;
  asio::post(io_, [this] {
    boost::system::error_code ec;
    acceptor_.close(ec);
  });
  std::lock_guard lk(mu_);
  for (auto& [p, w] : sessions_)
    if (auto s = w.lock()) s->close_if_idle();
}

int HttpServer::busy_sessions() {
  std::lock_guard lk(mu_);
  int n = 0;
  for (auto& [p, w] : sessions_)
    if (auto s = w.lock(); s && s->in_flight()) ++n;
  return n;
}

void HttpServer::stop() {
  if (threads_.empty()) return;
  stop_accepting();
  {
    std::lock_guard lk(mu_);
    for (auto& [p, w] : sessions_)
      if (auto s = w.lock()) s->force_close();
  }
  work_.reset();
  // Let the posted closes run, then stop.
  asio::post(io_, [this] { io_.stop(); });
  for (auto& t : threads_) t.join();
  threads_.clear();
}

}  // namespace moeserve::server
