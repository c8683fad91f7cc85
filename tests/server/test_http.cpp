// The HTTP server and OpenAI routes in-process, against the fake engine and frontend.
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "fakes.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_service.h"

using namespace moeserve;
using namespace moeserve::server;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

struct Reply {
  int status = 0;
  std::string body;
  std::string content_type;
};

struct Fixture {
  fakes::FakeFrontend fe;
  std::unique_ptr<fakes::FakeEngine> engine;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<OpenAIService> svc;
  std::unique_ptr<HttpServer> server;
  explicit Fixture(ServiceConfig cfg = {}, EngineConfig ecfg = {}, size_t max_body = 1 << 20) {
    engine = std::make_unique<fakes::FakeEngine>(ecfg);
    if (cfg.served_model_names.empty()) cfg.served_model_names = {"m"};
    cfg.max_model_len = 4096;
    cfg.reasoning_parser = cfg.reasoning_parser;
    metrics = std::make_unique<Metrics>(MetricsConfig{"m", 4096, 16, 100, true, 0.9});
    svc = std::make_unique<OpenAIService>(cfg, *engine, fe, *metrics);
    HttpServerConfig hc;
    hc.host = "127.0.0.1";
    hc.port = 0;
    hc.max_body_bytes = max_body;
    server = std::make_unique<HttpServer>(hc, *svc);
    server->start();
  }
  ~Fixture() {
    svc->stop_preparation();
    server->stop();
    engine->shutdown(std::chrono::milliseconds(0));
  }
  Reply request(const std::string& method, const std::string& path, const std::string& body = "",
                std::map<std::string, std::string> headers = {}) {
    asio::io_context io;
    beast::tcp_stream s(io);
    s.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), server->port()));
    http::request<http::string_body> req(method == "GET" ? http::verb::get : http::verb::post, path, 11);
    req.set(http::field::host, "localhost");
    req.set(http::field::content_type, "application/json");
    for (auto& [k, v] : headers) req.set(k, v);
    req.body() = body;
    req.prepare_payload();
    http::write(s, req);
    beast::flat_buffer buf;
    http::response_parser<http::string_body> p;
    p.body_limit(64 << 20);
    beast::error_code ec;
    http::read(s, buf, p, ec);
    Reply r;
    if (ec) return r;
    r.status = p.get().result_int();
    r.body = p.get().body();
    r.content_type = std::string(p.get()[http::field::content_type]);
    return r;
  }
};

std::vector<ojson> sse_events(const std::string& body, bool* done) {
  std::vector<ojson> out;
  *done = false;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    std::string data = ev.substr(6);
    if (data == "[DONE]") {
      *done = true;
      EXPECT_EQ(pos, body.size());
    } else {
      out.push_back(ojson::parse(data));
    }
  }
  return out;
}

const std::string kChat = R"({"model":"m","messages":[{"role":"user","content":"hi"}])";

}  // namespace

TEST(Http, BasicRoutes) {
  Fixture f;
  EXPECT_EQ(f.request("GET", "/health").status, 200);
  Reply m = f.request("GET", "/v1/models");
  EXPECT_EQ(m.status, 200);
  EXPECT_EQ(ojson::parse(m.body)["data"][0]["id"], "m");
  EXPECT_EQ(ojson::parse(f.request("GET", "/version").body).count("version"), 1u);
  EXPECT_EQ(f.request("GET", "/nope").status, 404);
  EXPECT_EQ(f.request("GET", "/v1/chat/completions").status, 405);
  Reply met = f.request("GET", "/metrics/");
  EXPECT_EQ(met.status, 200);
  EXPECT_NE(met.body.find("vllm:num_requests_running"), std::string::npos);
  Reply tok = f.request("POST", "/tokenize", R"({"prompt":"ab","return_token_strs":true})");
  EXPECT_EQ(ojson::parse(tok.body)["tokens"], ojson::parse("[97,98]"));
  Reply detok = f.request("POST", "/detokenize", R"({"tokens":[104,105]})");
  EXPECT_EQ(ojson::parse(detok.body)["prompt"], "hi");
}

TEST(Http, ChatNonStreamingAndStreamingAgree) {
  Fixture f;
  Reply r = f.request("POST", "/v1/chat/completions", kChat + R"(,"max_tokens":200})");
  ASSERT_EQ(r.status, 200) << r.body;
  ojson j = ojson::parse(r.body);
  std::string prompt = "user:hi\nassistant:";
  std::string expected(prompt.rbegin(), prompt.rend());
  EXPECT_EQ(j["choices"][0]["message"]["content"], expected);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], prompt.size() + 1);  // + EOS

  Reply s = f.request("POST", "/v1/chat/completions",
                      kChat + R"(,"max_tokens":200,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_EQ(s.status, 200);
  EXPECT_EQ(s.content_type, "text/event-stream; charset=utf-8");
  bool done;
  auto evs = sse_events(s.body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(evs.size(), 3u);
  EXPECT_EQ(evs[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  int finishes = 0;
  for (auto& e : evs) {
    EXPECT_EQ(e["id"], evs[0]["id"]);
    if (e["choices"].empty()) continue;
    auto& d = e["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) ++finishes;
  }
  EXPECT_EQ(text, expected);
  EXPECT_EQ(finishes, 1);
  EXPECT_TRUE(evs.back()["choices"].empty());
  EXPECT_EQ(evs.back()["usage"], j["usage"].contains("prompt_tokens_details")
                                     ? ojson({{"prompt_tokens", prompt.size()},
                                              {"total_tokens", 2 * prompt.size() + 1},
                                              {"completion_tokens", prompt.size() + 1}})
                                     : ojson());
}

TEST(Http, NChoicesStopAndLength) {
  Fixture f;
  Reply r = f.request("POST", "/v1/completions", R"({"prompt":"abcdef","n":2,"max_tokens":4,"stop":["c"],"logprobs":2})");
  ASSERT_EQ(r.status, 200) << r.body;
  ojson j = ojson::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], "fed");
    EXPECT_EQ(j["choices"][i]["finish_reason"], "stop");
    EXPECT_EQ(j["choices"][i]["stop_reason"], "c");
    EXPECT_EQ(j["choices"][i]["logprobs"]["tokens"].size(), 4u);
  }
  Reply l = f.request("POST", "/v1/completions", R"({"prompt":"abcdef","max_tokens":2,"echo":true})");
  ojson lj = ojson::parse(l.body);
  EXPECT_EQ(lj["choices"][0]["text"], "abcdeffe");
  EXPECT_EQ(lj["choices"][0]["finish_reason"], "length");
}

TEST(Http, Errors) {
  ServiceConfig cfg;
  cfg.api_key = "sekret";
  Fixture f(cfg, {}, 4096);
  auto auth = std::map<std::string, std::string>{{"Authorization", "Bearer sekret"}};
  Reply u = f.request("POST", "/v1/chat/completions", kChat + "}");
  EXPECT_EQ(u.status, 401);
  EXPECT_EQ(u.body, R"({"error":"Unauthorized"})");
  EXPECT_EQ(f.request("GET", "/health").status, 200);  // not gated
  Reply nm = f.request("POST", "/v1/chat/completions", R"({"model":"x","messages":[{"role":"user","content":"a"}]})", auth);
  EXPECT_EQ(nm.status, 404);
  EXPECT_EQ(ojson::parse(nm.body)["error"]["message"], "The model `x` does not exist.");
  Reply big = f.request("POST", "/v1/chat/completions", std::string(10000, ' '), auth);
  EXPECT_EQ(big.status, 413);
  Reply bad = f.request("POST", "/v1/chat/completions", "{not json", auth);
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(ojson::parse(bad.body)["error"]["code"], 400);
  Reply ctx = f.request("POST", "/v1/chat/completions", kChat + R"(,"max_tokens":5000})", auth);
  EXPECT_EQ(ctx.status, 400);
  EXPECT_NE(ctx.body.find("maximum context length"), std::string::npos);
  Reply tmpl = f.request("POST", "/v1/chat/completions", R"({"messages":[{"role":"raise","content":"a"}]})", auth);
  EXPECT_EQ(tmpl.status, 400);
}

TEST(Http, QueueFullAnswers429) {
  EngineConfig ecfg;
  ecfg.max_waiting_requests = 0;  // every submission is refused
  Fixture f({}, ecfg);
  Reply r = f.request("POST", "/v1/chat/completions", kChat + "}");
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(ojson::parse(r.body)["error"]["code"], 429);
  EXPECT_EQ(f.request("GET", "/health").status, 200);
}

TEST(Http, DisconnectAbortsRequest) {
  Fixture f;
  f.engine->step_us = 20000;  // slow enough to disconnect mid-stream
  {
    asio::io_context io;
    beast::tcp_stream s(io);
    s.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), f.server->port()));
    http::request<http::string_body> req(http::verb::post, "/v1/chat/completions", 11);
    req.set(http::field::host, "localhost");
    req.body() = kChat + R"(,"stream":true,"ignore_eos":true,"max_tokens":1000})";
    req.prepare_payload();
    http::write(s, req);
    char buf[256];
    s.socket().read_some(asio::buffer(buf));  // headers / first chunk arrived
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(f.engine->stats().num_running, 1);
  }  // socket closed here
  for (int i = 0; i < 200 && f.engine->stats().num_running > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(f.engine->stats().num_running, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Reply met = f.request("GET", "/metrics");
  EXPECT_NE(met.body.find("finished_reason=\"abort\"} 1.0"), std::string::npos);
}

TEST(Http, ConcurrentStreamsAndKeepAlive) {
  Fixture f;
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int t = 0; t < 16; ++t)
    ts.emplace_back([&, t] {
      // Several requests over one keep-alive connection.
      asio::io_context io;
      beast::tcp_stream s(io);
      s.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), f.server->port()));
      for (int k = 0; k < 3; ++k) {
        http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
        req.set(http::field::host, "localhost");
        req.body() = R"({"prompt":"req)" + std::to_string(t) + R"(","stream":true,"max_tokens":50})";
        req.prepare_payload();
        http::write(s, req);
        beast::flat_buffer buf;
        http::response<http::string_body> res;
        http::read(s, buf, res);
        bool done;
        auto evs = sse_events(res.body(), &done);
        std::string text;
        for (auto& e : evs) text += e["choices"][0]["text"].get<std::string>();
        std::string p = "req" + std::to_string(t);
        if (done && text == std::string(p.rbegin(), p.rend())) ok++;
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 48);
}

TEST(Http, AnthropicStreamGetsKeepalivePings) {
  ServiceConfig cfg;
  cfg.stream_keepalive_ms = 30;
  Fixture f(cfg);
  f.engine->step_us = 100000;  // 100 ms per token: idle gaps between events
  Reply r = f.request("POST", "/v1/messages",
                      R"({"model":"m","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"hi"}]})");
  ASSERT_EQ(r.status, 200);
  std::vector<std::string> events;
  for (size_t pos = 0; (pos = r.body.find("event: ", pos)) != std::string::npos; pos += 7)
    events.push_back(r.body.substr(pos + 7, r.body.find('\n', pos) - pos - 7));
  ASSERT_GE(events.size(), 4u) << r.body;
  EXPECT_EQ(events[0], "message_start");
  EXPECT_EQ(events.back(), "message_stop");
  EXPECT_GE(std::count(events.begin(), events.end(), "ping"), 4) << r.body;  // ~3 idle gaps of 100 ms
  // Chat streams are unchanged (no keep-alive bytes).
  Reply c = f.request("POST", "/v1/chat/completions",
                      R"({"model":"m","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(c.body.find("ping"), std::string::npos);
  EXPECT_EQ(c.body.find("\n:"), std::string::npos);  // no SSE comments either
  EXPECT_EQ(c.body.find("data: [DONE]"), c.body.size() - 14);
}
