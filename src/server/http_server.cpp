#include "server/http_server.h"

#include "server/anthropic_api.h"

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

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
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

std::optional<std::string> HttpRequest::raw_header(const std::string& lower_name) const {
  size_t pos = raw_head.find("\r\n");  // skip the request line
  while (pos != std::string::npos && pos + 2 < raw_head.size()) {
    size_t start = pos + 2;
    size_t end = raw_head.find("\r\n", start);
    if (end == std::string::npos) end = raw_head.size();
    size_t colon = raw_head.find(':', start);
    if (colon != std::string::npos && colon < end && colon - start == lower_name.size()) {
      bool same = true;
      for (size_t i = 0; i < lower_name.size() && same; ++i)
        same = std::tolower(static_cast<unsigned char>(raw_head[start + i])) == lower_name[i];
      if (same) {
        size_t v = colon + 1;
        while (v < end && (raw_head[v] == ' ' || raw_head[v] == '\t')) ++v;
        return raw_head.substr(v, end - v);
      }
    }
    pos = end;
  }
  return std::nullopt;
}

namespace {

using Clock = std::chrono::steady_clock;

Clock::duration secs(double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); }

}  // namespace

class Session : public std::enable_shared_from_this<Session>, public ResponseSink {
 public:
  // The sink one request's handler holds. A connection serves its requests one after the
  // other (pipelining in order), so a call that arrives after its request's response ended
  // (a late error, a timer of a finished stream) must not become the next request's
  // response: calls of a request that is no longer the current one are dropped, and it
  // reads as disconnected so its producer stops.
  class RequestSink final : public ResponseSink {
   public:
    RequestSink(std::shared_ptr<Session> s, uint64_t seq) : s_(std::move(s)), seq_(seq) {}
    void send(int status, const std::string& content_type, std::string body) override {
      if (live()) s_->send(status, content_type, std::move(body));
    }
    void start_stream(const std::string& content_type) override {
      if (live()) s_->start_stream(content_type);
    }
    void stream_write(std::string data) override {
      if (live()) s_->stream_write(std::move(data));
    }
    void end_stream() override {
      if (live()) s_->end_stream();
    }
    void post(std::function<void()> fn) override { s_->post(std::move(fn)); }
    void on_disconnect(std::function<void()> fn) override {
      if (live()) s_->on_disconnect(std::move(fn));
    }
    bool disconnected() const override { return !live() || s_->disconnected(); }
    void add_header(const std::string& name, const std::string& value) override {
      if (live()) s_->add_header(name, value);
    }
    void post_after(std::chrono::milliseconds delay, std::function<void()> fn) override {
      s_->post_after(delay, std::move(fn));
    }
    bool backlogged() const override { return live() && s_->backlogged(); }
    void on_drained(std::function<void()> fn) override {
      if (live()) s_->on_drained(std::move(fn));
      else s_->post(std::move(fn));
    }

   private:
    bool live() const { return s_->request_seq_ == seq_; }
    std::shared_ptr<Session> s_;
    uint64_t seq_;
  };

  Session(HttpServer& server, tcp::socket&& socket, bool overflow)
      : server_(server), cfg_(server.cfg_), socket_(std::move(socket)), read_timer_(socket_.get_executor()),
        write_timer_(socket_.get_executor()), overflow_(overflow) {
    // The socket was accepted on its own strand (see do_accept): its executor is the
    // connection's strand, so every handler of this session is serialised.
    boost::system::error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
  }

  void start() {
    asio::dispatch(socket_.get_executor(), [self = shared_from_this()] {
      // A connection that never sends a complete header is a slowloris too; an overflow
      // connection gets little time.
      self->arm_read_timer(self->overflow_ ? std::min(2.0, self->cfg_.header_timeout) : self->cfg_.header_timeout,
                           ReadPhase::Header);
      self->pump();
    });
  }

  // Closes the connection if no request is in flight (graceful shutdown).
  void close_if_idle() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      if (!self->in_flight_) self->close();
    });
  }
  // Closes the connection on its strand, then calls `done` (there).
  void force_close(std::function<void()> done) {
    asio::post(socket_.get_executor(), [self = shared_from_this(), done = std::move(done)] {
      self->close();
      done();
    });
  }
  bool in_flight() const { return in_flight_.load(); }

  // ---- ResponseSink ----
  void send(int status, const std::string& content_type, std::string body) override {
    if (closed_ || !in_flight_ || response_done_) return;
    std::string out = head(status, content_type);
    out += "content-length: " + std::to_string(body.size()) + "\r\n\r\n";
    if (!head_only_) out += body;
    response_done_ = true;
    enqueue(std::move(out));
  }
  void start_stream(const std::string& content_type) override {
    if (closed_ || !in_flight_ || response_done_) return;
    std::string out = head(200, content_type);
    streaming_ = true;
    out += "cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n";
    enqueue(std::move(out));
  }
  void stream_write(std::string data) override {
    if (closed_ || !in_flight_ || response_done_ || data.empty()) return;
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
    if (closed_ || !in_flight_ || response_done_) return;
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
  bool backlogged() const override { return pending_.size() + inflight_.size() > cfg_.write_backlog_bytes; }
  void on_drained(std::function<void()> fn) override {
    if (!backlogged()) return post(std::move(fn));
    on_drained_ = std::move(fn);
  }

 private:
  enum class ReadPhase { Idle, Header, Body };

  std::string head(int status, const std::string& content_type) {
    std::string h = "HTTP/1.1 " + std::to_string(status) + " " + status_text(status) + "\r\n";
    h += "server: moeserve\r\ncontent-type: " + content_type + "\r\n";
    h += extra_headers_;
    extra_headers_.clear();
    if (!keep_alive_) h += "connection: close\r\n";
    return h;
  }

  // ---- reading: one reader per connection; requests are parsed from buffer_ one at a
  // time, the next only after the previous response has been written (pipelining in order).
  void pump() {
    if (closed_) return;
    if (!in_flight_ && !lingering_) parse();
    if (closed_) return;
    // Keep a read pending (it notices a client that goes away) unless enough unparsed
    // bytes are buffered: then the client waits (TCP flow control) for us.
    if (!reading_ && !peer_eof_ && buffer_.size() < cfg_.max_header_bytes + kReadChunk) {
      reading_ = true;
      // Into read_buf_, never into buffer_.prepare(): parse() may consume buffer_ while this
      // read is pending (a request that arrived before the previous response's write
      // completed), and consuming everything rewinds the flat_buffer, so a region prepared
      // earlier would be committed from the wrong place (the bytes received lost, stale ones
      // parsed instead: wrong bodies, or 408s waiting for bytes that had arrived).
      socket_.async_read_some(asio::buffer(read_buf_), [self = shared_from_this()](beast::error_code ec, size_t n) {
        self->on_read(ec, n);
      });
    }
  }

  void on_read(beast::error_code ec, size_t n) {
    reading_ = false;
    if (closed_) return;
    if (lingering_) {  // discarding what a client sends after our final response
      if (ec) return close();
      buffer_.consume(buffer_.size());
      return pump();
    }
    if (ec == asio::error::eof) {
      // A FIN while a stream is being written and no further request has been sent: the
      // client is gone (it stopped reading the stream); abort. Any other FIN is a half-close
      // (shutdown(SHUT_WR) after the requests): every request already sent, pipelined ones
      // included, is answered, then the connection closes. When the FIN is read says nothing
      // about when it was sent (pipelined requests and their FIN arrive together and the FIN
      // may be read while an answer is written), so only an open stream with nothing behind
      // it counts as gone. A client that vanished otherwise is noticed when a write draws
      // its reset.
      if (in_flight_ && streaming_ && buffer_.size() == 0) return close();
      peer_eof_ = true;
      watch_for_reset();
      return pump();
    }
    if (ec) return close();
    buffer_.commit(asio::buffer_copy(buffer_.prepare(n), asio::buffer(read_buf_.data(), n)));
    pump();
  }

  // After a FIN the client may be gone entirely: our next write then draws a reset, which
  // this wait sees at once (one token of a stream, instead of waiting for a second write
  // to fail) and which aborts the engine request in flight. Armed once (a FIN comes once);
  // it stays pending across the pipelined requests answered after the FIN.
  void watch_for_reset() {
    socket_.async_wait(tcp::socket::wait_error, [self = shared_from_this()](beast::error_code ec) {
      if (!ec && !self->closed_ && self->in_flight_) self->close();
    });
  }

  void parse() {
    while (!in_flight_ && !closed_) {
      if (!parser_) {
        if (buffer_.size() == 0) {
          if (peer_eof_) return graceful_close();
          if (phase_ != ReadPhase::Idle && phase_ != ReadPhase::Header)
            arm_read_timer(cfg_.keep_alive_timeout, ReadPhase::Idle);
          return;
        }
        parser_.emplace();
        parser_->body_limit(cfg_.max_body_bytes);
        parser_->header_limit(static_cast<uint32_t>(cfg_.max_header_bytes));
        // The header timer runs from the accept for the first request, else from here (the
        // first byte after an idle wait, or a pipelined request already buffered).
        if (phase_ != ReadPhase::Header) arm_read_timer(cfg_.header_timeout, ReadPhase::Header);
      }
      beast::error_code ec;
      if (!parser_->is_header_done()) {
        size_t n = parser_->put(buffer_.data(), ec);
        if (!ec && parser_->is_header_done()) {
          auto d = buffer_.data();
          raw_head_.assign(static_cast<const char*>(d.data()), n);
          buffer_.consume(n);
          if (!header_done()) return;
          parser_->eager(true);  // the body as far as it has arrived, in one put()
          continue;
        }
        buffer_.consume(n);
      } else if (!parser_->is_done()) {
        // put() makes no progress (and reports nothing) on an empty buffer in the body.
        if (buffer_.size() == 0) {
          ec = http::error::need_more;
        } else {
          size_t n = parser_->put(buffer_.data(), ec);
          buffer_.consume(n);
        }
      }
      if (ec == http::error::need_more) {
        if (!peer_eof_) return;
        parser_->put_eof(ec);  // a body delimited by the close is complete; anything else is not
        if (!ec && parser_->is_done()) continue;
        return fail(400, "Incomplete HTTP request before the client closed its side");
      }
      if (ec == http::error::body_limit)
        return fail(413, "Request body too large (limit " + std::to_string(cfg_.max_body_bytes) + " bytes)");
      if (ec == http::error::header_limit)
        return fail(431, "Request header too large (limit " + std::to_string(cfg_.max_header_bytes) + " bytes)");
      if (ec) return fail(400, "Malformed HTTP request: " + ec.message());
      if (parser_->is_done()) dispatch();
    }
  }

  // The header has arrived: checks that need no body. False when the request was answered.
  bool header_done() {
    auto& msg = parser_->get();
    if (msg.version() >= 11 && msg.count(http::field::host) != 1) {
      fail(400, msg.count(http::field::host) == 0 ? "Missing Host header (required by HTTP/1.1)"
                                                  : "More than one Host header");
      return false;
    }
    if (overflow_ && !is_probe(msg.target())) {
      // Over the connection cap: only the probes are served.
      keep_alive_ = false;
      in_flight_ = true;
      add_header("retry-after", "1");
      send(503, "application/json",
           error_body(503, "ServiceUnavailableError",
                      "Too many open connections (limit " + std::to_string(server_.max_connections_) + "). Retry later."));
      return false;
    }
    if (!parser_->is_done()) {
      arm_read_timer(cfg_.body_timeout, ReadPhase::Body);
      auto expect = msg[http::field::expect];
      if (beast::iequals(expect, "100-continue")) enqueue("HTTP/1.1 100 Continue\r\n\r\n");
    }
    return true;
  }

  static bool is_probe(beast::string_view target) {
    auto path = target.substr(0, target.find('?'));
    return path == "/health" || path == "/ping";
  }

  void dispatch() {
    cancel_read_timer();
    auto msg = parser_->release();
    parser_.reset();
    HttpRequest req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    for (auto& f : msg) {
      std::string name(f.name_string());
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req.headers.emplace(name, std::string(f.value()));
    }
    req.body = std::move(msg.body());
    req.raw_head = std::move(raw_head_);
    raw_head_.clear();
    head_only_ = msg.method() == http::verb::head;
    keep_alive_ = msg.keep_alive() && server_.accepting_ && !overflow_;
    in_flight_ = true;
    response_done_ = false;
    on_disconnect_ = nullptr;
    ++request_seq_;
    try {
      server_.handler_.handle(std::move(req), std::make_shared<RequestSink>(shared_from_this(), request_seq_));
    } catch (const ApiError& e) {
      send(e.status, "application/json", error_body(e));
    } catch (const std::exception& e) {
      send(500, "application/json", error_body(500, "InternalServerError", e.what()));
    }
  }

  // Malformed, too large or too slow: answer once, then close.
  void fail(int status, const std::string& message) {
    // A too-large body on an Anthropic route answers in Anthropic's error shape.
    const bool anthropic_413 =
        status == 413 && parser_ && std::string_view(parser_->get().target()).rfind("/v1/messages", 0) == 0;
    parser_.reset();
    cancel_read_timer();
    keep_alive_ = false;
    in_flight_ = true;
    response_done_ = false;
    send(status, "application/json",
         anthropic_413 ? anthropic_error_body(413, message)
                       : error_body(status, status == 408 ? "RequestTimeoutError" : "BadRequestError", message));
  }

  // ---- timers
  void arm_read_timer(double seconds, ReadPhase phase) {
    phase_ = phase;
    ++read_timer_gen_;
    if (seconds <= 0) {
      read_timer_.cancel();
      return;
    }
    read_timer_.expires_after(secs(seconds));
    read_timer_.async_wait([self = shared_from_this(), gen = read_timer_gen_](beast::error_code ec) {
      if (ec || gen != self->read_timer_gen_ || self->closed_) return;
      self->on_read_timeout();
    });
  }
  void cancel_read_timer() {
    ++read_timer_gen_;
    phase_ = ReadPhase::Body;  // anything but Idle/Header: the next parse() rearms
    read_timer_.cancel();
  }

  void on_read_timeout() {
    if (lingering_) return close();
    if (in_flight_) return;
    // Nothing of a request arrived (an idle keep-alive connection, or one that never sent a
    // byte): close without an answer, as servers do.
    if (!parser_ && buffer_.size() == 0) return close();
    // Slowloris: the header or body did not arrive in time.
    spdlog::debug("http: closing a connection whose request {} did not arrive in time",
                  phase_ == ReadPhase::Body ? "body" : "header");
    buffer_.consume(buffer_.size());
    fail(408, phase_ == ReadPhase::Body ? "Request body not received in time" : "Request header not received in time");
  }

  // ---- writing
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
    if (cfg_.write_timeout > 0) {
      write_timer_.expires_after(secs(cfg_.write_timeout));
      write_timer_.async_wait([self = shared_from_this(), gen = ++write_gen_](beast::error_code ec) {
        if (ec || gen != self->write_gen_ || self->closed_) return;
        spdlog::warn("http: a client has not read its response for {} s; closing the connection", self->cfg_.write_timeout);
        self->close();
      });
    }
    asio::async_write(socket_, asio::buffer(inflight_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_written(ec);
    });
  }

  void on_written(beast::error_code ec) {
    writing_ = false;
    ++write_gen_;
    write_timer_.cancel();
    inflight_.clear();
    // A large response (a /tokenize of a 32 MiB body, a long non-streamed completion) would
    // otherwise keep its buffer for as long as the connection stays open: keep at most
    // kKeepWriteBuffer of capacity per connection (the flush swaps it with pending_).
    if (inflight_.capacity() > kKeepWriteBuffer) std::string().swap(inflight_);
    if (ec || closed_) return close();
    if (on_drained_ && !backlogged()) {
      auto fn = std::move(on_drained_);
      on_drained_ = nullptr;
      post(std::move(fn));
    }
    if (!pending_.empty()) return flush();
    if (response_done_) finish_response();
  }

  void finish_response() {
    in_flight_ = false;
    response_done_ = false;
    streaming_ = false;
    on_disconnect_ = nullptr;
    on_drained_ = nullptr;
    head_only_ = false;
    if (!keep_alive_) return graceful_close();
    phase_ = ReadPhase::Body;  // parse() arms the keep-alive or header timer
    pump();
  }

  // After the last response: FIN our side, then discard what the client still sends for a
  // moment, so an unread request body does not turn the close into a reset that could
  // destroy the response in the client's receive buffer.
  void graceful_close() {
    if (closed_) return;
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (peer_eof_ || ec) return close();
    lingering_ = true;
    arm_read_timer(2, ReadPhase::Idle);
    pump();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ec;
    socket_.close(ec);
    read_timer_.cancel();
    write_timer_.cancel();
    on_drained_ = nullptr;
    if (in_flight_ && on_disconnect_) {
      auto fn = std::move(on_disconnect_);
      on_disconnect_ = nullptr;
      fn();
    }
    server_.forget(this);
  }

  static constexpr size_t kReadChunk = 16u << 10;
  static constexpr size_t kKeepWriteBuffer = 64u << 10;

  HttpServer& server_;
  const HttpServerConfig& cfg_;
  tcp::socket socket_;
  asio::steady_timer read_timer_, write_timer_;
  uint64_t read_timer_gen_ = 0, write_gen_ = 0;
  ReadPhase phase_ = ReadPhase::Header;
  const bool overflow_;
  beast::flat_buffer buffer_;  // received, not yet parsed
  std::array<char, kReadChunk> read_buf_{};  // the pending read's target (see pump)
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string raw_head_;
  std::string pending_, inflight_;
  bool reading_ = false;
  bool writing_ = false;
  bool peer_eof_ = false;
  bool lingering_ = false;
  bool keep_alive_ = true;
  bool head_only_ = false;
  std::string extra_headers_;  // for the current response
  bool response_done_ = false;
  bool streaming_ = false;  // start_stream() called for the current request
  std::atomic<bool> closed_{false};
  std::atomic<bool> in_flight_{false};
  std::function<void()> on_disconnect_;
  std::function<void()> on_drained_;
  uint64_t request_seq_ = 0;  // the request now served on this connection (RequestSink)
};

HttpServer::HttpServer(HttpServerConfig cfg, Handler& handler)
    : cfg_(std::move(cfg)), handler_(handler), acceptor_(io_), accept_retry_(io_) {}

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
  // The cap keeps the served and overflow connections inside the open-file limit, with a
  // quarter of it (at most 256) left for the rest of the process (weights, logs, the hub,
  // the engine) and at most an eighth for the overflow connections.
  rlimit rl{};
  long fd_limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? long(rl.rlim_cur) : 1 << 20;
  overflow_ = int(std::min<long>(cfg_.overflow_connections, fd_limit / 8));
  long fit = std::max(1L, fd_limit - std::min(256L, fd_limit / 4) - overflow_);
  max_connections_ = cfg_.max_connections > 0 ? int(std::min<long>(cfg_.max_connections, fit)) : int(std::min(fit, 1L << 20));
  if (cfg_.max_connections > max_connections_)
    spdlog::warn("--max-connections {}: the open-file limit ({}) allows {}", cfg_.max_connections, fd_limit, max_connections_);
  accepting_ = true;
  work_.emplace(io_.get_executor());
  do_accept();
  for (int i = 0; i < std::max(1, cfg_.io_threads); ++i) threads_.emplace_back([this] { io_.run(); });
}

void HttpServer::do_accept() {
  acceptor_.async_accept(asio::make_strand(io_),
                         [this](beast::error_code ec, tcp::socket socket) { on_accept(ec, std::move(socket)); });
}

void HttpServer::on_accept(boost::system::error_code ec, tcp::socket socket) {
  if (!accepting_) return;
  if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space || ec.value() == ENFILE ||
      ec.value() == ENOMEM) {
    // Out of descriptors: retry shortly instead of spinning; connections that close free some.
    spdlog::warn("http: accept failed ({}); retrying in 50 ms", ec.message());
    accept_retry_.expires_after(std::chrono::milliseconds(50));
    accept_retry_.async_wait([this](beast::error_code e) {
      if (!e && accepting_) do_accept();
    });
    return;
  }
  if (!ec) {
    std::shared_ptr<Session> s;
    {
      std::lock_guard lk(mu_);
      int open = static_cast<int>(sessions_.size());
      if (open < max_connections_ + overflow_) {
        s = std::make_shared<Session>(*this, std::move(socket), open >= max_connections_);
        sessions_[s.get()] = s;
      }
    }
    if (s) s->start();
    else {
      boost::system::error_code e;
      socket.close(e);  // beyond the overflow reserve too: no descriptor to spare
    }
  }
  do_accept();
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
    accept_retry_.cancel();
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

int HttpServer::open_connections() {
  std::lock_guard lk(mu_);
  return static_cast<int>(sessions_.size());
}

void HttpServer::stop() {
  if (threads_.empty()) return;
  stop_accepting();
  // Close every connection, and wait until each close has run before the io threads stop: a
  // request in flight gets its on_disconnect there (its engine requests are aborted), which
  // also drops the request's state, and that state holds the connection. Posting the stop
  // behind the closes is not enough: a close queued on a strand busy at this moment is
  // re-posted behind the stop and never ran (the Session and its GenCall leaked in a cycle).
  // Sessions accepted meanwhile are closed by the next round (close() forgets a session).
  struct Pending {
    std::mutex mu;
    std::condition_variable cv;
    size_t left = 0;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    std::vector<std::shared_ptr<Session>> open;
    {
      std::lock_guard lk(mu_);
      for (auto& [p, w] : sessions_)
        if (auto s = w.lock()) open.push_back(std::move(s));
    }
    if (open.empty()) break;
    auto pending = std::make_shared<Pending>();
    pending->left = open.size();
    for (auto& s : open)
      s->force_close([pending] {
        std::lock_guard lk(pending->mu);
        if (--pending->left == 0) pending->cv.notify_all();
      });
    open.clear();
    std::unique_lock lk(pending->mu);
    if (!pending->cv.wait_until(lk, deadline, [&] { return pending->left == 0; })) {
      spdlog::warn("http: {} connection(s) not closed within 10 s of stop", pending->left);
      break;
    }
  }
  work_.reset();
  asio::post(io_, [this] { io_.stop(); });
  for (auto& t : threads_) t.join();
  threads_.clear();
}

}  // namespace moeserve::server
