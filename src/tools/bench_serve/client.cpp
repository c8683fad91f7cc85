#include "tools/bench_serve/client.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <deque>
#include <memory>

#include "core/error.h"
#include "tools/bench_serve/sse.h"

namespace moeserve::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

BaseUrl parse_base_url(const std::string& url) {
  const std::string scheme = "http://";
  MS_CHECK(url.rfind(scheme, 0) == 0, "--base-url {}: only http:// URLs are supported", url);
  std::string rest = url.substr(scheme.size());
  BaseUrl b;
  auto slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  if (slash != std::string::npos) b.prefix = rest.substr(slash);
  while (!b.prefix.empty() && b.prefix.back() == '/') b.prefix.pop_back();
  if (!hostport.empty() && hostport[0] == '[') {  // [v6]:port
    auto close = hostport.find(']');
    MS_CHECK(close != std::string::npos, "--base-url {}: unterminated IPv6 address", url);
    b.host = hostport.substr(1, close - 1);
    if (close + 1 < hostport.size()) {
      MS_CHECK(hostport[close + 1] == ':', "--base-url {}: bad port", url);
      b.port = hostport.substr(close + 2);
    }
  } else {
    auto colon = hostport.rfind(':');
    b.host = hostport.substr(0, colon);
    if (colon != std::string::npos) b.port = hostport.substr(colon + 1);
  }
  MS_CHECK(!b.host.empty(), "--base-url {}: no host", url);
  MS_CHECK(!b.port.empty() && b.port.find_first_not_of("0123456789") == std::string::npos && std::stoul(b.port) <= 65535,
           "--base-url {}: bad port '{}'", url, b.port);
  return b;
}

HttpResponse http_get(const BaseUrl& url, const std::string& path, const std::string& api_key, double timeout_s) {
  try {
    asio::io_context ioc;
    tcp::resolver res(ioc);
    beast::tcp_stream s(ioc);
    s.expires_after(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    s.connect(res.resolve(url.host, url.port));
    http::request<http::empty_body> req{http::verb::get, url.prefix + path, 11};
    req.set(http::field::host, url.host);
    req.set(http::field::connection, "close");
    if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
    http::write(s, req);
    beast::flat_buffer b;
    http::response_parser<http::string_body> p;
    p.body_limit(64u << 20);
    http::read(s, b, p);
    beast::error_code ignored;
    s.socket().shutdown(tcp::socket::shutdown_both, ignored);
    return {static_cast<int>(p.get().result_int()), p.get().body()};
  } catch (const boost::system::system_error& e) {
    fail("GET {}{}: {}", url.str(), path, e.code().message());
  }
}

namespace {

// FIFO counting semaphore for one io thread: release() hands the slot to the oldest waiter.
class Slots {
 public:
  explicit Slots(int limit) : limit_(limit) {}
  asio::awaitable<void> acquire() {
    if (limit_ <= 0 || used_ < limit_) {
      ++used_;
      co_return;
    }
    auto t = std::make_shared<asio::steady_timer>(co_await asio::this_coro::executor, asio::steady_timer::time_point::max());
    waiters_.push_back(t);
    co_await t->async_wait(asio::as_tuple(asio::use_awaitable));  // cancelled by release()
  }
  void release() {
    if (!waiters_.empty()) {
      waiters_.front()->cancel();
      waiters_.pop_front();
    } else {
      --used_;
    }
  }

 private:
  int limit_, used_ = 0;
  std::deque<std::shared_ptr<asio::steady_timer>> waiters_;
};

struct Run {
  const LoadPlan& plan;
  tcp::resolver::results_type endpoints;
  Clock::time_point t0;
  Slots slots;
  std::vector<RequestOutput> outputs;
  size_t done = 0;
  double now() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }
};

asio::awaitable<void> one_request(Run& r, size_t i) {
  const double arrival = r.now();
  co_await r.slots.acquire();
  RequestOutput out;
  out.prompt_len = r.plan.prompt_lens[i];
  const double st = r.now();
  out.start_time = st;
  out.queue_time = st - arrival;
  SseRecorder rec(r.plan.chat, st);
  try {
    beast::tcp_stream stream(co_await asio::this_coro::executor);
    co_await stream.async_connect(r.endpoints, asio::use_awaitable);
    http::request<http::string_body> req{http::verb::post, r.plan.url.prefix + r.plan.endpoint, 11};
    req.set(http::field::host, r.plan.url.host);
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "text/event-stream");
    req.set(http::field::connection, "close");
    if (!r.plan.api_key.empty()) req.set(http::field::authorization, "Bearer " + r.plan.api_key);
    req.body() = r.plan.bodies[i];
    req.prepare_payload();
    co_await http::async_write(stream, req, asio::use_awaitable);

    beast::flat_buffer buf;
    http::response_parser<http::buffer_body> p;
    p.body_limit(boost::none);
    co_await http::async_read_header(stream, buf, p, asio::use_awaitable);
    const int status = static_cast<int>(p.get().result_int());
    std::string error_body;
    char tmp[16384];
    while (!p.is_done()) {
      p.get().body().data = tmp;
      p.get().body().size = sizeof tmp;
      auto [ec, n] = co_await http::async_read_some(stream, buf, p, asio::as_tuple(asio::use_awaitable));
      (void)n;
      const double now = r.now();  // arrival time of everything this read delivered
      const size_t got = sizeof tmp - p.get().body().size;
      if (got > 0) {
        if (status == 200) {
          rec.feed(std::string_view(tmp, got), now);
        } else if (error_body.size() < 4096) {
          error_body.append(tmp, got);
        }
      }
      if (ec == http::error::need_buffer) continue;
      if (ec == http::error::end_of_stream || ec == asio::error::eof) break;
      if (ec) throw boost::system::system_error(ec);
    }
    if (status == 200) {
      rec.finish(out);
    } else {
      out.success = false;
      out.error = fmt::format("HTTP {}: {}", status, error_body.substr(0, 1000));
    }
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  } catch (const boost::system::system_error& e) {
    out.success = false;
    out.error = e.code().message();
  } catch (const std::exception& e) {
    out.success = false;
    out.error = e.what();
  }
  r.slots.release();
  r.outputs[i] = std::move(out);
  ++r.done;
  if (r.plan.on_done) r.plan.on_done(r.done);
}

asio::awaitable<void> dispatch(Run& r) {
  auto ex = co_await asio::this_coro::executor;
  asio::steady_timer timer(ex);
  for (size_t i = 0; i < r.plan.bodies.size(); ++i) {
    const double at = r.plan.arrival_s[i];
    if (at > 0 && at > r.now()) {
      timer.expires_at(r.t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at)));
      co_await timer.async_wait(asio::use_awaitable);
    }
    asio::co_spawn(ex, one_request(r, i), asio::detached);
  }
}

}  // namespace

std::vector<RequestOutput> run_load(const LoadPlan& plan, double* duration_s) {
  MS_CHECK(plan.bodies.size() == plan.prompt_lens.size() && plan.bodies.size() == plan.arrival_s.size(),
           "run_load: bodies, prompt_lens and arrival_s differ in length");
  asio::io_context ioc(1);
  tcp::resolver::results_type eps;
  try {
    eps = tcp::resolver(ioc).resolve(plan.url.host, plan.url.port);
  } catch (const boost::system::system_error& e) {
    fail("cannot resolve {}: {}", plan.url.str(), e.code().message());
  }
  Run r{plan, eps, Clock::now(), Slots(plan.max_concurrency), std::vector<RequestOutput>(plan.bodies.size())};
  r.t0 = Clock::now();
  asio::co_spawn(ioc, dispatch(r), asio::detached);
  ioc.run();
  if (duration_s) *duration_s = r.now();
  return std::move(r.outputs);
}

}  // namespace moeserve::bench
