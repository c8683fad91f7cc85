// Unit tests of `moeserve bench`'s pure parts: metric math against hand-computed values
// (numpy-style percentiles, TPOT, goodput, peak tokens/s, peak concurrency), the SSE
// recorder, the report/JSON layout, spec-decode scraping, datasets and arrival times.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tools/bench_serve/bench_serve.h"
#include "tools/bench_serve/client.h"
#include "tools/bench_serve/dataset.h"
#include "tools/bench_serve/metrics.h"
#include "tools/bench_serve/report.h"
#include "tools/bench_serve/sse.h"

using namespace moeserve::bench;
namespace fs = std::filesystem;

TEST(BenchPercentile, MatchesNumpyLinear) {
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_NEAR(percentile({4, 1, 3, 2}, 90), 3.7, 1e-12);  // unsorted input: index 2.7
  EXPECT_NEAR(percentile({10, 20, 30, 40, 50}, 99), 49.6, 1e-12);
  EXPECT_DOUBLE_EQ(percentile({10, 20, 30, 40, 50}, 0), 10);
  EXPECT_DOUBLE_EQ(percentile({10, 20, 30, 40, 50}, 100), 50);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 99), 0);  // vLLM: np.percentile(x or 0)
  EXPECT_NEAR(stddev({1, 2, 3, 4}), std::sqrt(1.25), 1e-12);  // population std
  EXPECT_DOUBLE_EQ(mean({}), 0);
}

TEST(BenchParse, Options) {
  EXPECT_EQ(parse_percentiles("50, 90,99.9"), (std::vector<double>{50, 90, 99.9}));
  EXPECT_THROW(parse_percentiles("101"), moeserve::Error);
  EXPECT_THROW(parse_percentiles("x"), moeserve::Error);
  EXPECT_EQ(parse_percentile_metrics("ttft,e2el"), (std::vector<std::string>{"ttft", "e2el"}));
  EXPECT_THROW(parse_percentile_metrics("ttft,foo"), moeserve::Error);
  auto g = parse_goodput({"ttft:500", "tpot:50.5"});
  EXPECT_EQ(g.at("ttft"), 500);
  EXPECT_EQ(g.at("tpot"), 50.5);
  EXPECT_THROW(parse_goodput({"itl:5"}), moeserve::Error);
  EXPECT_THROW(parse_goodput({"ttft:-1"}), moeserve::Error);
  EXPECT_THROW(parse_goodput({"ttft=5"}), moeserve::Error);
  auto u = parse_base_url("http://example.org:81/prefix/");
  EXPECT_EQ(u.host, "example.org");
  EXPECT_EQ(u.port, "81");
  EXPECT_EQ(u.prefix, "/prefix");
  EXPECT_EQ(parse_base_url("http://[::1]:9000").host, "::1");
  EXPECT_EQ(parse_base_url("http://localhost").port, "80");
  EXPECT_THROW(parse_base_url("https://x:1"), moeserve::Error);
  EXPECT_THROW(parse_base_url("http://x:port"), moeserve::Error);
}

namespace {
RequestOutput req(double start, double ttft, std::vector<double> itl, int64_t out, int64_t prompt) {
  RequestOutput o;
  o.success = true;
  o.start_time = start;
  o.ttft = ttft;
  o.itl = itl;
  o.latency = ttft;
  for (double g : itl) o.latency += g;
  o.output_tokens = out;
  o.prompt_len = prompt;
  return o;
}

// Dyadic times so bucket edges are exact. A: 4 tokens, B: 2, C: failed, D: 1 token, E: 2.
std::vector<RequestOutput> example() {
  RequestOutput c;
  c.start_time = 0.25;
  c.error = "HTTP 500";
  return {req(0, 0.125, {0.0625, 0.0625, 0.125}, 4, 10), req(0.5, 0.25, {0.5}, 2, 20), c,
          req(1.25, 0.5, {}, 1, 5), req(0.25, 0.125, {0.125}, 2, 1)};
}

BenchmarkMetrics run(const std::vector<RequestOutput>& outs, std::map<std::string, double> goodput = {}) {
  MetricsInput in;
  in.outputs = &outs;
  in.duration_s = 2.0;
  in.percentiles = {50, 99};
  in.goodput_ms = std::move(goodput);
  return compute_metrics(in);
}
}  // namespace

TEST(BenchMetrics, HandComputed) {
  auto outs = example();
  auto m = run(outs);
  EXPECT_EQ(m.completed, 4);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 36);
  EXPECT_EQ(m.total_output, 9);
  EXPECT_EQ(m.output_lens, (std::vector<int64_t>{4, 2, 0, 1, 2}));
  EXPECT_DOUBLE_EQ(m.request_throughput, 2.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 4.5);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 22.5);
  // TTFT {0.125, 0.25, 0.5, 0.125}
  EXPECT_NEAR(m.ttft.mean_ms, 250, 1e-9);
  EXPECT_NEAR(m.ttft.median_ms, 187.5, 1e-9);
  EXPECT_NEAR(m.ttft.percentiles_ms[1].second, 492.5, 1e-9);  // index 2.97 between 250 and 500
  // TPOT: A 0.25/3, B 0.5/1, E 0.125/1; D (1 token) has none
  EXPECT_NEAR(m.tpot.mean_ms, (250.0 / 3 + 500 + 125) / 3, 1e-9);
  EXPECT_NEAR(m.tpot.median_ms, 125, 1e-9);
  // ITL {62.5, 62.5, 125, 500, 125}
  EXPECT_NEAR(m.itl.mean_ms, 175, 1e-9);
  EXPECT_NEAR(m.itl.median_ms, 125, 1e-9);
  // E2EL {375, 750, 500, 250}
  EXPECT_NEAR(m.e2el.mean_ms, 468.75, 1e-9);
  EXPECT_NEAR(m.e2el.median_ms, 437.5, 1e-9);
  EXPECT_NEAR(m.e2el.std_ms, std::sqrt((93.75 * 93.75 + 281.25 * 281.25 + 31.25 * 31.25 + 218.75 * 218.75) / 4), 1e-9);
  // Tokens at 0.125 .1875 .25 .375 (A), .75 1.25 (B), 1.75 (D), .375 .5 (E): 7 in [0, 1).
  EXPECT_EQ(m.max_output_tokens_per_s, 7);
  // A [0, .375) overlaps E [.25, .5); E ends as B starts, B ends as D starts (half-open).
  EXPECT_EQ(m.max_concurrent_requests, 2);
}

TEST(BenchMetrics, Goodput) {
  auto outs = example();
  EXPECT_DOUBLE_EQ(run(outs, {{"ttft", 200}, {"tpot", 100}}).request_goodput, 0.5);  // A only
  EXPECT_DOUBLE_EQ(run(outs, {{"e2el", 400}}).request_goodput, 1.0);                 // A, E
  EXPECT_DOUBLE_EQ(run(outs, {{"tpot", 0}}).request_goodput, 0.5);  // D: 1 token counts as TPOT 0
  EXPECT_DOUBLE_EQ(run(outs, {{"ttft", 500}, {"e2el", 750}}).request_goodput, 2.0);  // bounds inclusive
}

TEST(BenchMetrics, OutputLengthWithoutUsage) {
  std::vector<RequestOutput> outs = {req(0, 0.1, {0.1, 0.1}, 0, 3)};
  outs[0].generated_text = "abcde";
  EXPECT_EQ(run(outs).total_output, 3);  // no tokenizer: token-bearing chunks
  MetricsInput in;
  in.outputs = &outs;
  in.duration_s = 1;
  in.count_tokens = [](const std::string& t) { return static_cast<int64_t>(t.size()); };
  EXPECT_EQ(compute_metrics(in).total_output, 5);
  EXPECT_NEAR(compute_metrics(in).tpot.mean_ms, 200.0 / 4, 1e-9);
}

TEST(BenchMetrics, AllFailed) {
  std::vector<RequestOutput> outs(3);
  auto m = run(outs);
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 3);
  EXPECT_EQ(m.ttft.mean_ms, 0);
  EXPECT_EQ(m.max_output_tokens_per_s, 0);
}

TEST(BenchSse, ChatStreamTimings) {
  SseRecorder r(/*chat=*/true, 1.0);
  r.feed("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n", 1.125);
  r.feed(": ping\n\n", 1.15);  // comment: no event
  r.feed("data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\ndata: {\"choi", 1.25);
  r.feed("ces\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n", 1.5);
  r.feed("data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n", 1.625);
  r.feed("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n", 1.75);
  RequestOutput o;
  o.prompt_len = 99;
  r.finish(o);
  EXPECT_TRUE(o.success) << o.error;
  EXPECT_DOUBLE_EQ(o.ttft, 0.125);
  EXPECT_EQ(o.itl, (std::vector<double>{0.125, 0.25, 0.125}));
  EXPECT_DOUBLE_EQ(o.latency, 0.625);  // the usage chunk does not move the end
  EXPECT_EQ(o.generated_text, "Hello");
  EXPECT_EQ(o.output_tokens, 3);
  EXPECT_EQ(o.prompt_len, 7);
}

TEST(BenchSse, CompletionsByteByByteAndCrlf) {
  const std::string s =
      "data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\ndata: {\"choices\":[{\"text\":\"b\"}]}\r\n\r\n"
      "data: {\"choices\":[],\"usage\":{\"completion_tokens\":2}}\r\n\r\ndata: [DONE]\r\n\r\n";
  SseRecorder r(false, 0);
  for (size_t i = 0; i < s.size(); ++i) r.feed(s.substr(i, 1), static_cast<double>(i));
  RequestOutput o;
  o.prompt_len = 5;
  r.finish(o);
  EXPECT_TRUE(o.success);
  EXPECT_EQ(o.generated_text, "ab");
  EXPECT_EQ(o.itl.size(), 1u);
  EXPECT_EQ(o.output_tokens, 2);
  EXPECT_EQ(o.prompt_len, 5);  // no prompt_tokens in usage: kept
}

TEST(BenchSse, Failures) {
  SseRecorder e(false, 0);
  e.feed("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"error\":{\"message\":\"boom\",\"code\":500}}\n\n", 1);
  RequestOutput o;
  e.finish(o);
  EXPECT_FALSE(o.success);
  EXPECT_EQ(o.error, "boom");
  SseRecorder none(true, 0);
  none.feed("data: [DONE]\n\n", 1);
  RequestOutput o2;
  none.finish(o2);
  EXPECT_FALSE(o2.success);
  EXPECT_NE(o2.error.find("Never received"), std::string::npos);
}

TEST(BenchReport, VllmLayout) {
  auto outs = example();
  auto m = run(outs, {{"ttft", 200}});
  RunInfo info;
  info.backend = "openai";
  info.request_rate = INFINITY;
  info.duration_s = 2.0;
  info.percentile_metrics = {"ttft", "tpot", "itl"};
  info.percentiles = {50, 99};
  info.goodput = true;
  std::string s = format_report(info, m, std::nullopt);
  EXPECT_EQ(s.rfind("============ Serving Benchmark Result ============\n", 0), 0u);
  EXPECT_NE(s.find("Successful requests:                     4         \n"), std::string::npos);
  EXPECT_NE(s.find("Benchmark duration (s):                  2.00      \n"), std::string::npos);
  EXPECT_NE(s.find("Request goodput (req/s):                 1.00      \n"), std::string::npos);
  EXPECT_NE(s.find("Peak concurrent requests:                2.00      \n"), std::string::npos);
  EXPECT_NE(s.find("-----Time per Output Token (excl. 1st token)------\n"), std::string::npos);
  EXPECT_NE(s.find("P99 TTFT (ms):                           492.50    \n"), std::string::npos);
  EXPECT_EQ(s.find("Request rate configured"), std::string::npos);  // infinite rate: not printed
  EXPECT_EQ(s.find("E2EL"), std::string::npos);                     // not selected
  EXPECT_EQ(s.substr(s.size() - 51), std::string(50, '=') + "\n");
  auto j = result_json(info, m, outs, std::nullopt);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["completed"], 4);
  EXPECT_EQ(j["total_output_tokens"], 9);
  EXPECT_DOUBLE_EQ(j["p99_ttft_ms"].get<double>(), 492.5);
  EXPECT_DOUBLE_EQ(j["median_itl_ms"].get<double>(), 125);
  EXPECT_EQ(j["ttfts"].size(), 5u);
  EXPECT_EQ(j["itls"][0].size(), 3u);
  EXPECT_EQ(j["errors"][2], "HTTP 500");
  EXPECT_FALSE(j.contains("mean_e2el_ms"));
  EXPECT_EQ(percentile_word(99.9), "99.9");
  EXPECT_EQ(percentile_word(50), "50");
}

TEST(BenchSpecDecode, ScrapeAndDelta) {
  const std::string before =
      "# HELP vllm:spec_decode_num_drafts_total x\n"
      "vllm:spec_decode_num_drafts_total{model_name=\"m\",engine=\"0\"} 10\n"
      "vllm:spec_decode_num_draft_tokens_total{model_name=\"m\",engine=\"0\"} 30\n"
      "vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\",engine=\"0\"} 12\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"0\"} 8\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"1\"} 4\n"
      "vllm:spec_decode_num_drafts_created{model_name=\"m\"} 99\n";  // not a _total: ignored
  const std::string after =
      "vllm:spec_decode_num_drafts_total{model_name=\"m\",engine=\"0\"} 110\n"
      "vllm:spec_decode_num_draft_tokens_total{model_name=\"m\",engine=\"0\"} 330\n"
      "vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\",engine=\"0\"} 162\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"0\"} 88\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"1\"} 54\n";
  auto b = parse_spec_decode_metrics(before);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->num_drafts, 10);
  EXPECT_EQ(b->accepted_per_pos.at(1), 4);
  auto s = spec_decode_delta(b, parse_spec_decode_metrics(after));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->num_drafts, 100);
  EXPECT_EQ(s->draft_tokens, 300);
  EXPECT_EQ(s->accepted_tokens, 150);
  EXPECT_DOUBLE_EQ(s->acceptance_rate, 50.0);
  EXPECT_DOUBLE_EQ(s->acceptance_length, 2.5);
  EXPECT_EQ(s->per_position_acceptance_rates, (std::vector<double>{0.8, 0.5}));
  EXPECT_FALSE(parse_spec_decode_metrics("vllm:num_requests_running 1\n"));
  EXPECT_FALSE(spec_decode_delta(b, b));  // no new draft tokens
  EXPECT_FALSE(spec_decode_delta(std::nullopt, b));
}

TEST(BenchArrivals, RateAndBurstiness) {
  auto inf = arrival_times(5, INFINITY, 1.0, 0);
  EXPECT_EQ(inf, std::vector<double>(5, 0.0));
  auto t = arrival_times(200, 10.0, 1.0, 0);
  EXPECT_NEAR(t.back(), 20.0, 1e-9);  // rescaled to n / rate
  for (size_t i = 1; i < t.size(); ++i) EXPECT_GE(t[i], t[i - 1]);
  EXPECT_EQ(t, arrival_times(200, 10.0, 1.0, 0));
  EXPECT_NE(t, arrival_times(200, 10.0, 1.0, 1));
  auto even = arrival_times(4, 2.0, INFINITY, 0);
  EXPECT_NEAR(even[0], 0.5, 1e-12);
  EXPECT_NEAR(even[3], 2.0, 1e-12);
  // Burstier arrivals (shape 0.2) spread gaps more than Poisson (coefficient of variation 1/sqrt(k)).
  auto cv = [](const std::vector<double>& a) {
    std::vector<double> g = {a[0]};
    for (size_t i = 1; i < a.size(); ++i) g.push_back(a[i] - a[i - 1]);
    return stddev(g) / mean(g);
  };
  EXPECT_GT(cv(arrival_times(2000, 10, 0.2, 0)), 1.5);
  EXPECT_LT(cv(arrival_times(2000, 10, 8.0, 0)), 0.6);
  EXPECT_THROW(arrival_times(3, 1.0, 0.0, 0), moeserve::Error);
}

TEST(BenchDataset, RandomWithoutTokenizer) {
  DatasetOptions o;
  o.num_prompts = 20;
  o.random_input_len = 30;
  o.random_output_len = 10;
  std::string note;
  auto a = sample_requests(o, nullptr, &note);
  ASSERT_EQ(a.size(), 20u);
  EXPECT_NE(note.find("no tokenizer"), std::string::npos);
  for (const auto& s : a) {
    EXPECT_EQ(s.prompt_len, 30);
    EXPECT_EQ(s.expected_output_len, 10);
  }
  o.random_range_ratio = 0.5;
  auto b = sample_requests(o, nullptr, nullptr);
  bool varied = false;
  for (const auto& s : b) {
    EXPECT_GE(s.prompt_len, 15);
    EXPECT_LE(s.prompt_len, 45);
    EXPECT_GE(s.expected_output_len, 5);
    EXPECT_LE(s.expected_output_len, 15);
    varied |= s.expected_output_len != 10;
  }
  EXPECT_TRUE(varied);
  auto c = sample_requests(o, nullptr, nullptr);
  EXPECT_EQ(b[3].prompt, c[3].prompt);  // seeded
  o.seed = 1;
  EXPECT_NE(sample_requests(o, nullptr, nullptr)[3].prompt, b[3].prompt);
  o.random_range_ratio = 1.0;
  EXPECT_THROW(sample_requests(o, nullptr, nullptr), moeserve::Error);
}

TEST(BenchDataset, RandomWithTokenizer) {
  const char* shared = std::getenv("MOESERVE_SHARED_DATA");
  fs::path dir = fs::path(shared ? shared : MOESERVE_TEST_SHARED_DATA) / "tokenizers/qwen3";
  if (!fs::exists(dir / "tokenizer.json")) GTEST_SKIP() << "no qwen3 tokenizer in shared data";
  auto tok = moeserve::Tokenizer::from_dir(dir.string());
  DatasetOptions o;
  o.num_prompts = 8;
  o.random_input_len = 64;
  o.random_output_len = 4;
  auto reqs = sample_requests(o, tok.get(), nullptr);
  int64_t off = 0;
  for (const auto& s : reqs) {
    EXPECT_EQ(static_cast<int64_t>(tok->encode(s.prompt, false).size()), s.prompt_len);  // counts are real
    off += std::llabs(s.prompt_len - 64);
    for (int32_t id : tok->encode(s.prompt, false)) EXPECT_FALSE(tok->is_special(id));
  }
  EXPECT_LE(off, 8);  // decode/re-encode keeps lengths (almost) exact
}

TEST(BenchDataset, JsonlAndShareGpt) {
  fs::path tmp = fs::temp_directory_path() / ("bench_ds_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  {
    std::ofstream f(tmp / "a.jsonl");
    f << "{\"prompt\": \"one two three\", \"output_len\": 5}\n\n{\"prompt\": \"four\", \"output_len\": 2}\n";
  }
  DatasetOptions o;
  o.name = "jsonl";
  o.path = (tmp / "a.jsonl").string();
  o.num_prompts = 3;
  auto r = sample_requests(o, nullptr, nullptr);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].prompt_len, 3);
  EXPECT_EQ(r[1].expected_output_len, 2);
  EXPECT_EQ(r[2].prompt, "one two three");  // cycled
  {
    std::ofstream f(tmp / "bad.jsonl");
    f << "{\"prompt\": \"x\"}\n";
  }
  o.path = (tmp / "bad.jsonl").string();
  EXPECT_THROW(sample_requests(o, nullptr, nullptr), moeserve::Error);
  {
    std::ofstream f(tmp / "sg.json");
    f << R"([{"conversations":[{"from":"human","value":"a b c d e"},{"from":"gpt","value":"f g h i j k"}]},
             {"conversations":[{"from":"human","value":"too short"},{"from":"gpt","value":"q r s t u"}]},
             {"conversations":[{"from":"human","value":"only one turn here ok"}]},
             {"conversations":[{"from":"human","value":"p q r s"},{"from":"gpt","value":"x y z w"}]}])";
  }
  o.name = "sharegpt";
  o.path = (tmp / "sg.json").string();
  o.num_prompts = 10;
  std::string note;
  auto s = sample_requests(o, nullptr, &note);
  ASSERT_EQ(s.size(), 2u);  // 2-word prompt filtered, 1-turn conversation dropped
  for (const auto& x : s) EXPECT_TRUE((x.prompt_len == 5 && x.expected_output_len == 6) || (x.prompt_len == 4 && x.expected_output_len == 4));
  EXPECT_NE(note.find("1 skipped"), std::string::npos);
  o.sharegpt_output_len = 3;
  for (const auto& x : sample_requests(o, nullptr, nullptr)) EXPECT_EQ(x.expected_output_len, 3);
  o.path = (tmp / "missing.json").string();
  EXPECT_THROW(sample_requests(o, nullptr, nullptr), moeserve::Error);
  fs::remove_all(tmp);
}
