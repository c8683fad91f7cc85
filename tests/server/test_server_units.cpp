// JSON helpers, request validation, output processing (stop strings), SSE/response
// formatting and metrics exposition.
#include <gtest/gtest.h>

#include "fakes.h"
#include "server/errors.h"
#include "server/metrics.h"
#include "server/output_processor.h"
#include "server/protocol.h"
#include "server/response.h"

using namespace moeserve;
using namespace moeserve::server;
using fakes::FakeFrontend;

TEST(JsonText, PythonDumps) {
  ojson j = ojson::parse(R"({"a": 1, "b": [1.5, true, null], "c": "é\n\u0001", "d": {}, "e": 1e-7, "f": 1e16})");
  EXPECT_EQ(py_json_dumps(j), "{\"a\": 1, \"b\": [1.5, true, null], \"c\": \"é\\n\\u0001\", \"d\": {}, \"e\": 1e-07, \"f\": 1e+16}");
  EXPECT_EQ(py_float_repr(100.0), "100.0");
  EXPECT_EQ(py_float_repr(0.1), "0.1");
  EXPECT_EQ(py_float_repr(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(py_float_repr(0.0001), "0.0001");
  EXPECT_EQ(py_float_repr(-2.5e-5), "-2.5e-05");
}

TEST(JsonText, Utf8) {
  EXPECT_TRUE(valid_utf8("héllo 😀"));
  EXPECT_FALSE(valid_utf8("\xff"));
  EXPECT_FALSE(valid_utf8("\xed\xa0\x80"));  // surrogate
  EXPECT_FALSE(valid_utf8("\xc0\xaf"));      // overlong
  EXPECT_EQ(utf8_complete_prefix("ab\xf0\x9f\x98"), 2u);
}

TEST(Errors, Body) {
  ApiError e = bad_request("bad \"x\"", "max_tokens");
  EXPECT_EQ(error_body(e),
            R"({"error":{"message":"bad \"x\"","type":"BadRequestError","param":"max_tokens","code":400}})");
  EXPECT_EQ(error_body(404, "NotFoundError", "m"), R"({"error":{"message":"m","type":"NotFoundError","param":null,"code":404}})");
}

namespace {
ProtocolLimits limits() {
  ProtocolLimits l;
  l.auto_tool_choice_enabled = true;
  return l;
}
int status_of(const std::string& body, bool chat = true, ProtocolLimits l = limits()) {
  try {
    ojson j = parse_json_body(body);
    if (chat) parse_chat_request(j, l);
    else parse_completion_request(j, l);
  } catch (const ApiError& e) {
    return e.status;
  }
  return 200;
}
}  // namespace

TEST(Protocol, Validation) {
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  EXPECT_EQ(status_of("{" + msgs + "}"), 200);
  EXPECT_EQ(status_of("{" + msgs + R"(,"unknown_field":{"x":1},"store":true,"response_format":{"type":"json_object"}})"), 200);
  EXPECT_EQ(status_of("{" + msgs), 400);                                            // malformed
  EXPECT_EQ(status_of("{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}"), 400);  // invalid UTF-8
  EXPECT_EQ(status_of("{" + msgs + R"(,"max_tokens":-1})"), 400);
  EXPECT_EQ(status_of("{" + msgs + R"(,"max_tokens":"5"})"), 400);
  EXPECT_EQ(status_of("{" + msgs + R"(,"temperature":-0.5})"), 400);
  EXPECT_EQ(status_of("{" + msgs + R"(,"top_p":0})"), 400);
  EXPECT_EQ(status_of("{" + msgs + R"(,"n":0})"), 400);
  EXPECT_EQ(status_of("{" + msgs + R"(,"stream_options":{"include_usage":true}})"), 400);
  EXPECT_EQ(status_of("{" + msgs + R"(,"top_logprobs":3})"), 400);
  EXPECT_EQ(status_of("{" + msgs + R"(,"logprobs":true,"top_logprobs":30})"), 400);
  EXPECT_EQ(status_of("{" + msgs + R"(,"tool_choice":"auto"})"), 400);  // no tools
  EXPECT_EQ(status_of(R"({"messages":"hi"})"), 400);
  EXPECT_EQ(status_of(R"({"messages":[{"content":"x"}]})"), 400);
  EXPECT_EQ(status_of(R"([1,2])"), 400);
  EXPECT_EQ(status_of("{" + msgs + R"(,"tools":[{"type":"function","function":{"name":"f"}}]})", true, ProtocolLimits{}), 400);
  EXPECT_EQ(status_of("{" + msgs + R"(,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none"})",
                      true, ProtocolLimits{}),
            200);
  EXPECT_EQ(status_of(R"({"prompt":"x","max_tokens":3})", false), 200);
  EXPECT_EQ(status_of(R"({"prompt":[[1,2],[3]]})", false), 200);
  EXPECT_EQ(status_of(R"({"prompt":5})", false), 400);
  EXPECT_EQ(status_of(R"({"prompt":"x","suffix":"y"})", false), 400);
  EXPECT_EQ(status_of(R"({"max_tokens":3})", false), 400);
}

// A JSON schema sent as a string (guided_json, structured_outputs.json,
// response_format.json_schema.schema) is a second document from outside: it is parsed with
// the same nesting limit as the body. Parsed without one, 200,000 levels built a DOM whose
// recursive dump() overflowed the stack (SIGSEGV on the preparation worker; ASan:
// stack-overflow in nlohmann's serializer).
TEST(Protocol, SchemaStringNestingIsBounded) {
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const std::string ok = std::string(8, '[') + std::string(8, ']');
  for (const std::string field : {R"("guided_json":)", R"("structured_outputs":{"json":)",
                                  R"("response_format":{"type":"json_schema","json_schema":{"schema":)"}) {
    const std::string close = field.find('{') == std::string::npos ? "" : field.find("json_schema") != std::string::npos ? "}}" : "}";
    EXPECT_EQ(status_of("{" + msgs + "," + field + "\"" + ok + "\"" + close + "}"), 200) << field;
    try {
      parse_chat_request(parse_json_body("{" + msgs + "," + field + "\"" + deep + "\"" + close + "}"), limits());
      ADD_FAILURE() << field << ": accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << field;
      EXPECT_NE(std::string(e.what()).find("512"), std::string::npos) << field << ": " << e.what();
    }
  }
}

TEST(Protocol, ContextLengthWording) {
  GenRequest r = parse_chat_request(ojson::parse(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":100})"), limits());
  try {
    make_sampling_params(r, {}, 50, 128, 0);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(std::string(e.what()),
              "'max_tokens' or 'max_completion_tokens' is too large: 100. This model's maximum context length is 128 "
              "tokens and your request has 50 input tokens (100 > 128 - 50).");
  }
  try {
    make_sampling_params(r, {}, 200, 128, 0);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("maximum context length is 128 tokens"), std::string::npos);
  }
  GenRequest d = parse_chat_request(ojson::parse(R"({"messages":[{"role":"user","content":"x"}],"seed":7})"), limits());
  SamplingParams p = make_sampling_params(d, SamplingDefaults::from_json(ojson::parse(R"({"top_k":40,"top_p":0.95})")), 28,
                                          128, 2);
  EXPECT_EQ(p.max_tokens, 100);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_EQ(*p.seed, 9u);
}

namespace {
// Feeds `text` (as byte tokens) in deliveries of the given sizes; returns the streamed text.
struct ProcRun {
  std::string streamed;
  std::string final_text;
  std::string finish_reason;
  ojson stop_reason;
  int tokens = 0;
};
ProcRun run_proc(const FakeFrontend& fe, const std::string& text, const std::vector<size_t>& sizes, ChoiceSettings cs,
             bool eos_at_end = true) {
  OutputProcessor p(fe, cs);
  std::vector<int32_t> ids = fe.encode(text, false);
  if (eos_at_end) ids.push_back(FakeFrontend::kEos);
  ProcRun r;
  size_t pos = 0, k = 0;
  while (pos < ids.size() && !p.finished()) {
    size_t n = std::min(sizes[k++ % sizes.size()], ids.size() - pos);
    RequestOutput o;
    o.new_token_ids.assign(ids.begin() + pos, ids.begin() + pos + n);
    pos += n;
    if (pos == ids.size()) {
      o.finished = true;
      o.finish_reason = eos_at_end ? FinishReason::Stop : FinishReason::Length;
      if (eos_at_end) o.stop_token_id = FakeFrontend::kEos;
    }
    ChoiceDelta d = p.process(o);
    r.streamed += d.text;
  }
  r.final_text = p.text();
  r.finish_reason = p.finish_reason();
  r.stop_reason = p.stop_reason();
  r.tokens = p.num_generated_tokens();
  return r;
}
}  // namespace

TEST(OutputProcessor, StopStringsAcrossTokenBoundaries) {
  FakeFrontend fe;
  ChoiceSettings cs;
  cs.stop = {"STOP", "xyz"};
  std::string text = "hello wor STO ST STOP after";
  for (size_t a = 1; a <= 6; ++a)
    for (size_t b = 1; b <= 6; ++b) {
      ProcRun r = run_proc(fe, text, {a, b}, cs);
      EXPECT_EQ(r.streamed, "hello wor STO ST ") << a << "," << b;
      EXPECT_EQ(r.final_text, r.streamed);
      EXPECT_EQ(r.finish_reason, "stop");
      EXPECT_EQ(r.stop_reason, "STOP");
      EXPECT_EQ(r.tokens, 21);  // up to and including the token completing "STOP"
    }
  cs.include_stop_str_in_output = true;
  EXPECT_EQ(run_proc(fe, text, {3}, cs).streamed, "hello wor STO ST STOP");
  // A held prefix that never completes is released at the end.
  cs.include_stop_str_in_output = false;
  ProcRun tail = run_proc(fe, "abc xy", {1}, cs);
  EXPECT_EQ(tail.streamed, "abc xy");
  EXPECT_EQ(tail.stop_reason, nullptr);
}

TEST(OutputProcessor, Utf8AndLength) {
  FakeFrontend fe;
  ProcRun r = run_proc(fe, "é😀", {1}, ChoiceSettings{}, false);
  EXPECT_EQ(r.streamed, "é😀");
  EXPECT_EQ(r.finish_reason, "length");
}

TEST(OutputProcessor, ReasoningAndTools) {
  FakeFrontend fe;
  ChoiceSettings cs;
  cs.reasoning_parser = "minimax_m2";
  cs.tool_parser = "minimax_m2";
  std::string text = "think</think>\n\nok<minimax:tool_call><invoke name=\"f\"><parameter name=\"a\">1</parameter></invoke></minimax:tool_call>";
  OutputProcessor p(fe, cs);
  RequestOutput o;
  o.new_token_ids = fe.encode(text, false);
  o.new_token_ids.push_back(FakeFrontend::kEos);
  o.finished = true;
  o.finish_reason = FinishReason::Stop;
  o.stop_token_id = FakeFrontend::kEos;
  ChoiceDelta d = p.process(o);
  EXPECT_EQ(d.reasoning, "think");
  EXPECT_EQ(d.text, "\n\nok");
  EXPECT_EQ(d.finish_reason, "tool_calls");
  ASSERT_EQ(p.tool_calls()->size(), 1u);
  EXPECT_EQ((*p.tool_calls())[0].arguments, "{\"a\": \"1\"}");
}

TEST(Response, SseChunks) {
  FakeFrontend fe;
  ResponseContext ctx{"chatcmpl-1", 1735000000, "m", true, &fe, ""};
  ctx.init_prefix();
  std::string out;
  append_chat_role_chunk(out, ctx, 0, nullptr);
  EXPECT_EQ(out,
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1735000000,\"model\":\"m\","
            "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
            "\"finish_reason\":null}]}\n\n");
  ChoiceDelta d;
  d.text = "Hi\n";
  d.finished = true;
  d.finish_reason = "stop";
  d.stop_reason = "END";
  out.clear();
  int64_t off = 0;
  append_delta_chunk(out, ctx, 1, d, off, nullptr);
  ojson j = ojson::parse(out.substr(6));
  EXPECT_EQ(j["choices"][0]["delta"]["content"], "Hi\n");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["stop_reason"], "END");
  out.clear();
  append_usage_chunk(out, ctx, Usage{5, 7});
  j = ojson::parse(out.substr(6));
  EXPECT_TRUE(j["choices"].empty());
  EXPECT_EQ(j["usage"]["total_tokens"], 12);
  // Completion chunk with logprobs.
  ResponseContext cctx{"cmpl-1", 1, "m", false, &fe, ""};
  cctx.init_prefix();
  ChoiceDelta c;
  c.text = "ab";
  c.logprobs = {{'a', -0.5f, {{'b', -1.0f}}}, {'b', -0.25f, {}}};
  out.clear();
  append_delta_chunk(out, cctx, 0, c, off, nullptr);
  j = ojson::parse(out.substr(6));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"], ojson::parse(R"(["a","b"])"));
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], ojson::parse("[0,1]"));
  EXPECT_DOUBLE_EQ(j["choices"][0]["logprobs"]["top_logprobs"][0]["b"].get<double>(), -1.0);
}

TEST(Metrics, EnginePhaseHistogramsAndIterationTokens) {
  Metrics m({"m", 1000, 16, 100, true, 0.9});
  using namespace std::chrono_literals;
  RequestOutput o;
  const auto t0 = std::chrono::steady_clock::now();
  o.queued_time = t0;
  o.scheduled_time = t0 + 200ms;
  o.first_token_time = t0 + 900ms;
  o.last_token_time = t0 + 3900ms;
  FinishedRequestStats st{"length", 10, 7, 4.0, 1.0, 1, 7, 7};
  set_phase_times(st, o);
  EXPECT_NEAR(st.queue_seconds, 0.2, 1e-9);
  EXPECT_NEAR(st.prefill_seconds, 0.7, 1e-9);
  EXPECT_NEAR(st.decode_seconds, 3.0, 1e-9);
  EXPECT_NEAR(st.inference_seconds, 3.7, 1e-9);
  m.observe_finished(st);
  // Aborted while waiting: no phase was reached, nothing is observed.
  FinishedRequestStats aborted{"abort", 5, 0, 0.1, -1, 1, 7, 0};
  RequestOutput never;
  never.queued_time = t0;
  set_phase_times(aborted, never);
  EXPECT_LT(aborted.queue_seconds, 0);
  m.observe_finished(aborted);
  m.observe_request_params(2, 7, 7);
  EngineStats es;
  es.num_preemptions = 3;
  es.iteration_tokens[0] = 5;   // 1 token
  es.iteration_tokens[3] = 2;   // (16, 32]
  es.iteration_tokens[13] = 1;  // > 16384
  es.iteration_tokens_sum = 5 + 2 * 20 + 20000;
  const std::string t = m.render(es);
  auto has = [&](const std::string& line) { return t.find(line + "\n") != std::string::npos; };
  const std::string L = "model_name=\"m\",engine=\"0\"";
  EXPECT_TRUE(has("# TYPE vllm:request_queue_time_seconds histogram"));
  EXPECT_TRUE(has("vllm:request_queue_time_seconds_bucket{" + L + ",le=\"0.3\"} 1.0"));
  EXPECT_TRUE(has("vllm:request_queue_time_seconds_count{" + L + "} 1.0"));
  EXPECT_TRUE(has("vllm:request_prefill_time_seconds_bucket{" + L + ",le=\"0.5\"} 0.0"));
  EXPECT_TRUE(has("vllm:request_prefill_time_seconds_bucket{" + L + ",le=\"0.8\"} 1.0"));
  EXPECT_TRUE(has("vllm:request_decode_time_seconds_bucket{" + L + ",le=\"2.5\"} 0.0"));
  EXPECT_TRUE(has("vllm:request_decode_time_seconds_bucket{" + L + ",le=\"5.0\"} 1.0"));
  EXPECT_TRUE(has("vllm:request_decode_time_seconds_sum{" + L + "} 3.0"));
  EXPECT_TRUE(has("vllm:request_inference_time_seconds_bucket{" + L + ",le=\"5.0\"} 1.0"));
  EXPECT_TRUE(has("vllm:request_inference_time_seconds_bucket{" + L + ",le=\"+Inf\"} 1.0"));
  EXPECT_TRUE(has("# TYPE vllm:request_prompt_tokens histogram"));
  EXPECT_TRUE(has("vllm:request_prompt_tokens_count{" + L + "} 2.0"));
  EXPECT_TRUE(has("vllm:request_prompt_tokens_bucket{" + L + ",le=\"5.0\"} 1.0"));
  EXPECT_TRUE(has("vllm:request_generation_tokens_bucket{" + L + ",le=\"1.0\"} 1.0"));
  EXPECT_TRUE(has("vllm:request_generation_tokens_bucket{" + L + ",le=\"10.0\"} 2.0"));
  EXPECT_TRUE(has("vllm:request_params_n_bucket{" + L + ",le=\"2.0\"} 1.0"));
  EXPECT_TRUE(has("vllm:request_params_n_bucket{" + L + ",le=\"1.0\"} 0.0"));
  EXPECT_TRUE(has("vllm:request_params_max_tokens_bucket{" + L + ",le=\"10.0\"} 1.0"));
  EXPECT_TRUE(has("# TYPE vllm:num_preemptions counter"));
  EXPECT_TRUE(has("vllm:num_preemptions_total{" + L + "} 3.0"));
  EXPECT_TRUE(has("# TYPE vllm:iteration_tokens_total histogram"));
  EXPECT_TRUE(has("vllm:iteration_tokens_total_bucket{" + L + ",le=\"1.0\"} 5.0"));
  EXPECT_TRUE(has("vllm:iteration_tokens_total_bucket{" + L + ",le=\"16.0\"} 5.0"));
  EXPECT_TRUE(has("vllm:iteration_tokens_total_bucket{" + L + ",le=\"32.0\"} 7.0"));
  EXPECT_TRUE(has("vllm:iteration_tokens_total_bucket{" + L + ",le=\"16384.0\"} 7.0"));
  EXPECT_TRUE(has("vllm:iteration_tokens_total_bucket{" + L + ",le=\"+Inf\"} 8.0"));
  EXPECT_TRUE(has("vllm:iteration_tokens_total_count{" + L + "} 8.0"));
  EXPECT_TRUE(has("vllm:iteration_tokens_total_sum{" + L + "} 20045.0"));
  // Buckets: e2e's 21 bounds for the phases, 13 for iteration tokens, each plus +Inf.
  auto count = [&](const std::string& prefix) {
    size_t n = 0;
    for (size_t pos = t.find(prefix); pos != std::string::npos; pos = t.find(prefix, pos + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("vllm:request_queue_time_seconds_bucket{"), 22u);
  EXPECT_EQ(count("vllm:e2e_request_latency_seconds_bucket{"), 22u);
  EXPECT_EQ(count("vllm:iteration_tokens_total_bucket{"), 14u);
}

TEST(Metrics, Exposition) {
  Metrics m({"my-model", 1000, 16, 100, true, 0.9});
  m.observe_ttft(0.03);
  m.observe_finished({"stop", 10, 5, 0.4, 0.03, 1, 16, 5});
  m.observe_finished({"tool_calls", 3, 1, 0.2, 0.01, 1, 16, 1});
  EngineStats es;
  es.num_running = 2;
  es.kv_cache_usage = 0.25;
  std::string t = m.render(es);
  EXPECT_NE(t.find("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"my-model\",engine=\"0\"} 2.0\n"),
            std::string::npos);
  EXPECT_NE(t.find("vllm:kv_cache_usage_perc{model_name=\"my-model\",engine=\"0\"} 0.25"), std::string::npos);
  EXPECT_NE(t.find("vllm:prompt_tokens_total{model_name=\"my-model\",engine=\"0\"} 13.0"), std::string::npos);
  EXPECT_NE(t.find("vllm:request_success_total{model_name=\"my-model\",engine=\"0\",finished_reason=\"stop\"} 2.0"),
            std::string::npos);
  EXPECT_NE(t.find("vllm:time_to_first_token_seconds_bucket{model_name=\"my-model\",engine=\"0\",le=\"0.04\"} 1.0"),
            std::string::npos);
  EXPECT_NE(t.find("vllm:time_to_first_token_seconds_bucket{model_name=\"my-model\",engine=\"0\",le=\"0.02\"} 0.0"),
            std::string::npos);
  EXPECT_NE(t.find("vllm:e2e_request_latency_seconds_count{model_name=\"my-model\",engine=\"0\"} 2.0"), std::string::npos);
  EXPECT_NE(t.find("le=\"+Inf\""), std::string::npos);
  EXPECT_EQ(buckets_1_2_5(100), (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
  // Every non-comment line is `name{labels} value`.
  size_t pos = 0;
  while (pos < t.size()) {
    size_t nl = t.find('\n', pos);
    std::string line = t.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.empty() || line[0] == '#') continue;
    EXPECT_NE(line.find("} "), std::string::npos) << line;
    EXPECT_TRUE(line.rfind("vllm:", 0) == 0 || line.rfind("moeserve:engine_", 0) == 0) << line;
  }
  EXPECT_NE(t.find("moeserve:engine_steps_total{model_name=\"my-model\",engine=\"0\"} "), std::string::npos);
  EXPECT_NE(t.find("moeserve:engine_execute_seconds_total{"), std::string::npos);
}
