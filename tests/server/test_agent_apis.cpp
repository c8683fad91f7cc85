// The Anthropic Messages and OpenAI Responses translations: token-identical rendering against
// the equivalent chat-completions messages through the real MiniMax-M2 chat template and the
// built-in tiny tokenizer, request validation, the output block assembler and the response store.
#include <gtest/gtest.h>

#include <string>

#include "server/agent_output.h"
#include "server/anthropic_api.h"
#include "server/errors.h"
#include "server/protocol.h"
#include "server/responses_api.h"
#include "server/responses_store.h"
#include "server/tokenizer_frontend.h"

namespace moeserve::server {
namespace {

const std::string kTinyTokenizer = std::string(MOESERVE_TEST_SHARED_DATA) + "/../../../assets/tiny-tokenizer";
const std::string kM25Template = std::string(MOESERVE_TEST_SHARED_DATA) + "/chat-templates/minimax-m2.5.jinja";

ProtocolLimits limits() { return ProtocolLimits{20, true}; }

std::vector<int32_t> render_ids(const TokenizerFrontend& f, const ojson& chat_body) {
  GenRequest r = parse_chat_request(chat_body, limits());
  ChatRenderInputs in{r.messages, r.tools, r.add_generation_prompt, r.continue_final_message, r.chat_template_kwargs};
  return f.encode(f.render_chat(in), false);
}

std::string render_text(const TokenizerFrontend& f, const ojson& chat_body) {
  GenRequest r = parse_chat_request(chat_body, limits());
  ChatRenderInputs in{r.messages, r.tools, r.add_generation_prompt, r.continue_final_message, r.chat_template_kwargs};
  return f.render_chat(in);
}

const ojson kOpenAITools = ojson::parse(R"([{"type":"function","function":{"name":"get_weather",
  "description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"},
  "days":{"type":"integer"}},"required":["city"]}}},{"type":"function","function":{"name":"get_time",
  "parameters":{"type":"object","properties":{"tz":{"type":"string"}}}}}])");

// Two tool rounds with interleaved thinking, then a final answer and a new user turn.
const ojson kChatMessages = ojson::parse(R"([
  {"role":"system","content":"You are terse."},
  {"role":"user","content":"Weather in Paris and the time there?"},
  {"role":"assistant","content":"Let me check.","reasoning_content":"I need two tools.",
   "tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\", \"days\": 2}"}},
                 {"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{\"tz\": \"CET\"}"}}]},
  {"role":"tool","tool_call_id":"call_1","content":"sunny, 22C"},
  {"role":"tool","tool_call_id":"call_2","content":"Error: unknown tz"},
  {"role":"assistant","content":"","reasoning_content":"The time failed; retry with Europe/Paris.",
   "tool_calls":[{"id":"call_3","type":"function","function":{"name":"get_time","arguments":"{\"tz\": \"Europe/Paris\"}"}}]},
  {"role":"tool","tool_call_id":"call_3","content":"14:05"}
])");

const ojson kAnthropicBody = ojson::parse(R"({"model":"m","max_tokens":100,"system":[{"type":"text","text":"You are terse."}],
  "tools":[{"name":"get_weather","description":"Weather of a city","input_schema":{"type":"object","properties":
    {"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}},
    {"name":"get_time","input_schema":{"type":"object","properties":{"tz":{"type":"string"}}}}],
  "messages":[
  {"role":"user","content":"Weather in Paris and the time there?"},
  {"role":"assistant","content":[{"type":"thinking","thinking":"I need two tools.","signature":"abc"},
    {"type":"text","text":"Let me check."},
    {"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris","days":2}},
    {"type":"tool_use","id":"call_2","name":"get_time","input":{"tz":"CET"}}]},
  {"role":"user","content":[{"type":"tool_result","tool_use_id":"call_1","content":"sunny, 22C"},
    {"type":"tool_result","tool_use_id":"call_2","content":[{"type":"text","text":"unknown tz"}],"is_error":true}]},
  {"role":"assistant","content":[{"type":"thinking","thinking":"The time failed; retry with Europe/Paris.","signature":"x"},
    {"type":"tool_use","id":"call_3","name":"get_time","input":{"tz":"Europe/Paris"}}]},
  {"role":"user","content":[{"type":"tool_result","tool_use_id":"call_3","content":"14:05"}]}]})");

const ojson kResponsesBody = ojson::parse(R"({"model":"m","instructions":"You are terse.",
  "tools":[{"type":"function","name":"get_weather","description":"Weather of a city","parameters":{"type":"object",
    "properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}},
    {"type":"function","name":"get_time","parameters":{"type":"object","properties":{"tz":{"type":"string"}}}}],
  "input":[
  {"role":"user","content":"Weather in Paris and the time there?"},
  {"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"I need two tools."}]},
  {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Let me check."}]},
  {"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\": \"Paris\", \"days\": 2}"},
  {"type":"function_call","call_id":"call_2","name":"get_time","arguments":"{\"tz\": \"CET\"}"},
  {"type":"function_call_output","call_id":"call_1","output":"sunny, 22C"},
  {"type":"function_call_output","call_id":"call_2","output":"Error: unknown tz"},
  {"type":"reasoning","id":"rs_2","summary":[],"encrypted_content":"VGhlIHRpbWUgZmFpbGVkOyByZXRyeSB3aXRoIEV1cm9wZS9QYXJpcy4="},
  {"type":"function_call","call_id":"call_3","name":"get_time","arguments":"{\"tz\": \"Europe/Paris\"}"},
  {"type":"function_call_output","call_id":"call_3","output":"14:05"}]})");

class AgentRender : public ::testing::Test {
 protected:
  AgentRender() : f_(kTinyTokenizer, kM25Template) {}
  ojson chat_body() const {
    return {{"model", "m"}, {"max_tokens", 100}, {"messages", kChatMessages}, {"tools", kOpenAITools}};
  }
  TokenizerFrontend f_;
};

TEST_F(AgentRender, AnthropicBlocksRenderAsChatMessages) {
  AnthropicTranslation tr = translate_anthropic_request(kAnthropicBody, false);
  auto want = render_ids(f_, chat_body());
  EXPECT_EQ(render_ids(f_, tr.chat_body), want);
  // Interleaved thinking: both assistant turns after the last user message keep their thinking.
  std::string text = render_text(f_, tr.chat_body);
  EXPECT_NE(text.find("<think>\nI need two tools.\n</think>"), std::string::npos) << text;
  EXPECT_NE(text.find("<think>\nThe time failed; retry with Europe/Paris.\n</think>"), std::string::npos);
  EXPECT_NE(text.find("<parameter name=\"days\">2</parameter>"), std::string::npos);
  EXPECT_NE(text.find("<response>Error: unknown tz</response>"), std::string::npos);
}

TEST_F(AgentRender, ThinkingDroppedBeforeLastUserTurnAsInChat) {
  ojson a = kAnthropicBody;
  a["messages"].push_back({{"role", "assistant"}, {"content", "It is sunny; 14:05."}});
  a["messages"].push_back({{"role", "user"}, {"content", "Thanks! And tomorrow?"}});
  ojson c = chat_body();
  c["messages"].push_back({{"role", "assistant"}, {"content", "It is sunny; 14:05."}});
  c["messages"].push_back({{"role", "user"}, {"content", "Thanks! And tomorrow?"}});
  auto ids = render_ids(f_, translate_anthropic_request(a, false).chat_body);
  EXPECT_EQ(ids, render_ids(f_, c));
  EXPECT_EQ(render_text(f_, c).find("I need two tools."), std::string::npos);
}

TEST_F(AgentRender, ResponsesItemsRenderAsChatMessages) {
  ResponsesTranslation tr = translate_responses_request(kResponsesBody, ojson());
  EXPECT_EQ(render_ids(f_, tr.chat_body), render_ids(f_, chat_body()));
  // The history (for previous_response_id) excludes the instructions.
  EXPECT_EQ(tr.history.size(), kChatMessages.size() - 1);
}

TEST_F(AgentRender, PreviousResponseChainEqualsFullInput) {
  // Turn 1's stored conversation + turn 2's new items == the whole conversation as input.
  ojson first = kResponsesBody;
  first["input"] = ojson::array({kResponsesBody["input"][0]});
  ResponsesTranslation t1 = translate_responses_request(first, ojson());
  ojson stored = t1.history;
  ojson out_items = ojson::array();
  for (size_t i = 1; i <= 4; ++i) out_items.push_back(kResponsesBody["input"][i]);
  responses_items_to_messages(out_items, stored);
  ojson second = kResponsesBody;
  second["input"] = ojson::array();
  for (size_t i = 5; i < kResponsesBody["input"].size(); ++i) second["input"].push_back(kResponsesBody["input"][i]);
  ResponsesTranslation t2 = translate_responses_request(second, stored);
  EXPECT_EQ(render_ids(f_, t2.chat_body), render_ids(f_, chat_body()));
}

TEST_F(AgentRender, CountTokensNeedsNoMaxTokens) {
  ojson a = kAnthropicBody;
  a.erase("max_tokens");
  EXPECT_THROW(translate_anthropic_request(a, false), ApiError);
  EXPECT_EQ(render_ids(f_, translate_anthropic_request(a, true).chat_body), render_ids(f_, chat_body()));
}

std::string anthropic_error(const ojson& body) {
  try {
    translate_anthropic_request(body, false);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    return e.what();
  }
  return "";
}

TEST(AnthropicTranslate, Errors) {
  ojson ok = {{"model", "m"}, {"max_tokens", 10}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  EXPECT_EQ(anthropic_error(ok), "");
  ojson b = ok;
  b.erase("max_tokens");
  EXPECT_EQ(anthropic_error(b), "max_tokens: Field required");
  b = ok;
  b["messages"][0]["content"] = {{{"type", "image"}, {"source", {{"type", "base64"}, {"data", "x"}}}}};
  EXPECT_NE(anthropic_error(b).find("not supported: this model accepts text only"), std::string::npos);
  b = ok;
  b["messages"][0]["content"] = {{{"type", "tool_use"}, {"id", "x"}, {"name", "f"}, {"input", ojson::object()}}};
  EXPECT_NE(anthropic_error(b).find("'tool_use' is not allowed in a user message"), std::string::npos);
  b = ok;
  b["tools"] = {{{"name", "f"}, {"input_schema", {{"type", "object"}}}}};
  b["tool_choice"] = {{"type", "tool"}, {"name", "g"}};
  EXPECT_EQ(anthropic_error(b), "tool_choice.name: tool 'g' is not in `tools`");
  b["tool_choice"] = {{"type", "any"}};
  EXPECT_EQ(anthropic_error(b), "");
  EXPECT_EQ(translate_anthropic_request(b, false).chat_body["tool_choice"], "required");
  b["tools"] = {{{"type", "web_search_20250305"}, {"name", "web_search"}}};
  EXPECT_NE(anthropic_error(b).find("server tool 'web_search_20250305' is not supported"), std::string::npos);
  b = ok;
  b["thinking"] = {{"type", "enabled"}, {"budget_tokens", 2048}};
  EXPECT_EQ(anthropic_error(b), "`max_tokens` must be greater than `thinking.budget_tokens`");
  b["max_tokens"] = 4096;
  EXPECT_EQ(translate_anthropic_request(b, false).chat_body["chat_template_kwargs"]["enable_thinking"], true);
  b = ok;
  b["temperature"] = 1.5;
  EXPECT_NE(anthropic_error(b).find("between 0 and 1"), std::string::npos);
  b = ok;
  b["output_config"] = {{"format", {{"type", "json_schema"}}}};  // no schema
  EXPECT_NE(anthropic_error(b).find("output_config.format: expected"), std::string::npos);
  // A wrongly typed format type is the same 400, not nlohmann's type_error (a 500; fuzz_requests).
  b["output_config"] = {{"format", {{"type", 1}, {"schema", {{"type", "object"}}}}}};
  EXPECT_NE(anthropic_error(b).find("output_config.format: expected"), std::string::npos);
  b = ok;
  b["output_config"] = {{"format", {{"type", "json_schema"}, {"schema", {{"type", "object"}}}}}};
  EXPECT_EQ(translate_anthropic_request(b, false).chat_body["response_format"]["json_schema"]["schema"]["type"],
            "object");
}

// Tool-call arguments are model output: a tool_use block's input is parsed with the JSON
// nesting limit (200,000 levels once reached nlohmann's recursive dump() and overflowed the
// stack), and anything that is not a JSON object becomes {}.
TEST(AnthropicTranslate, ToolInputFromArguments) {
  EXPECT_EQ(anthropic_tool_input(R"({"city": "Paris", "days": [1, 2]})").dump(), R"({"city":"Paris","days":[1,2]})");
  EXPECT_EQ(anthropic_tool_input("").dump(), "{}");
  EXPECT_EQ(anthropic_tool_input("[1, 2]").dump(), "{}");
  EXPECT_EQ(anthropic_tool_input("{\"a\": ").dump(), "{}");
  EXPECT_EQ(anthropic_tool_input(R"({"a": 1e400})").dump(), "{}");
  const std::string ok = "{\"a\":" + std::string(500, '[') + std::string(500, ']') + "}";
  EXPECT_EQ(anthropic_tool_input(ok).dump(), ok);
  const std::string deep = "{\"a\":" + std::string(200000, '[') + std::string(200000, ']') + "}";
  EXPECT_EQ(anthropic_tool_input(deep).dump(), "{}");
}

TEST(AnthropicTranslate, ErrorBodyShape) {
  EXPECT_EQ(anthropic_error_body(400, "bad"),
            R"({"type":"error","error":{"type":"invalid_request_error","message":"bad"}})");
  EXPECT_EQ(anthropic_status(429), 529);
  EXPECT_EQ(anthropic_status(503), 529);
  EXPECT_NE(anthropic_error_body(529, "x").find("overloaded_error"), std::string::npos);
  EXPECT_NE(anthropic_error_body(404, "x").find("not_found_error"), std::string::npos);
}

TEST(ResponsesTranslate, Refusals) {
  auto err = [](ojson b) -> std::string {
    try {
      translate_responses_request(b, ojson());
    } catch (const ApiError& e) {
      return e.what();
    }
    return "";
  };
  ojson ok = {{"model", "m"}, {"input", "hi"}};
  EXPECT_EQ(err(ok), "");
  ojson b = ok;
  b["tools"] = {{{"type", "web_search"}}};
  EXPECT_NE(err(b).find("only function tools"), std::string::npos);
  b = ok;
  b["text"] = {{"format", {{"type", "json_schema"}, {"name", "x"}}}};  // no schema
  EXPECT_NE(err(b).find("json_schema needs a `schema`"), std::string::npos);
  b = ok;
  b["text"] = {{"format", {{"type", "xml"}}}};
  EXPECT_NE(err(b).find("expected 'text', 'json_schema' or 'json_object'"), std::string::npos);
  b = ok;
  b["background"] = true;
  EXPECT_NE(err(b).find("background mode is not supported"), std::string::npos);
  b = ok;
  b["input"] = {{{"role", "user"}, {"content", {{{"type", "input_image"}, {"image_url", "x"}}}}}};
  EXPECT_NE(err(b).find("accepts text only"), std::string::npos);
  b = ok;
  b["tools"] = {{{"type", "function"}, {"name", "f"}}};
  b["tool_choice"] = {{"type", "function"}, {"name", "g"}};
  EXPECT_NE(err(b).find("'g' is not in `tools`"), std::string::npos);
  b["tool_choice"] = "required";
  EXPECT_EQ(translate_responses_request(b, ojson()).chat_body["tool_choice"], "required");
  b = ok;
  b["parallel_tool_calls"] = false;
  EXPECT_EQ(translate_responses_request(b, ojson()).max_tool_calls, 1);
  // Wrongly typed fields are 400s naming the field, not nlohmann's type_error (a 500; found
  // by fuzz_requests, inputs in tests/fuzz/regressions/fuzz_requests/).
  b = ok;
  b["text"] = {{"format", {{"type", "json_schema"}, {"name", 1}, {"schema", {{"type", "object"}}}}}};
  EXPECT_EQ(err(b), "text.format.name: Input should be a valid string");
  b["text"]["format"].erase("name");
  EXPECT_EQ(translate_responses_request(b, ojson()).chat_body["response_format"]["json_schema"]["name"], "output");
  b = ok;
  b["tools"] = {{{"type", "function"}, {"name", "f"}}};
  b["tool_choice"] = {{"type", 1}, {"name", "f"}};
  EXPECT_NE(err(b).find("tool_choice: only 'none', 'auto', 'required'"), std::string::npos);
}

struct Recorder : BlockListener {
  std::string log;
  void block_start(int i, const OutputBlock& b) override { log += "start" + std::to_string(i) + ":" + std::to_string(int(b.kind)) + " "; }
  void block_delta(int i, const OutputBlock&, std::string_view p) override { log += "d" + std::to_string(i) + "[" + std::string(p) + "] "; }
  void block_stop(int i, const OutputBlock&) override { log += "stop" + std::to_string(i) + " "; }
};

TEST(BlockAssembler, KindsWhitespaceAndReasoningTokens) {
  BlockAssembler a;
  Recorder r;
  ChoiceDelta d;
  d.reasoning = "think";
  a.push(d, 1, &r);
  a.push(ChoiceDelta{}, 1, &r);  // "</think>": neither reasoning nor content
  d = {};
  d.text = "\n\n";  // dropped: only whitespace before a tool call
  a.push(d, 1, &r);
  d = {};
  d.tool_calls.push_back({0, "call_a", "f", "{\"x\": 1"});
  a.push(d, 1, &r);
  d = {};
  d.tool_calls.push_back({0, std::nullopt, std::nullopt, "}"});
  d.tool_calls.push_back({1, "call_b", "g", "{}"});
  d.finished = true;
  a.push(d, 2, &r);
  EXPECT_EQ(r.log, "start0:0 d0[think] stop0 start1:2 d1[{\"x\": 1] d1[}] stop1 start2:2 d2[{}] stop2 ");
  ASSERT_EQ(a.blocks().size(), 3u);
  EXPECT_EQ(a.blocks()[1].text, "{\"x\": 1}");
  EXPECT_EQ(a.blocks()[2].tool_id, "call_b");
  EXPECT_EQ(a.reasoning_tokens(), 2);

  BlockAssembler single(true);
  single.push(d, 1, nullptr);
  EXPECT_EQ(single.blocks().size(), 1u);  // the first call only

  BlockAssembler text;
  d = {};
  d.text = "\n\n";
  text.push(d, 1, nullptr);
  d.text = "Hello";
  d.finished = true;
  text.push(d, 1, nullptr);
  ASSERT_EQ(text.blocks().size(), 1u);
  EXPECT_EQ(text.blocks()[0].text, "\n\nHello");  // whitespace followed by text is kept
  EXPECT_EQ(text.reasoning_tokens(), 0);
}

TEST(ResponseStore, LruCapsAndCancel) {
  ResponseStore s(ResponseStoreLimits{3, 1u << 20});
  for (int i = 0; i < 3; ++i) s.put(StoredResponse{"r" + std::to_string(i), "completed", "{}", ojson::array(), false, {}});
  ASSERT_TRUE(s.get("r0"));  // r0 is now the most recent; r1 the least
  s.put(StoredResponse{"r3", "completed", "{}", ojson::array(), false, {}});
  EXPECT_FALSE(s.get("r1"));
  EXPECT_TRUE(s.get("r0") && s.get("r2") && s.get("r3"));
  EXPECT_EQ(s.size(), 3u);

  int cancelled = 0;
  s.put(StoredResponse{"live", "in_progress", "{}", ojson::array(), false, [&] { ++cancelled; }});
  for (int i = 0; i < 5; ++i) s.put(StoredResponse{"n" + std::to_string(i), "completed", "{}", ojson::array(), false, {}});
  ASSERT_TRUE(s.get("live"));  // never evicted while in flight
  EXPECT_FALSE(s.cancel("n0"));
  EXPECT_TRUE(s.cancel("live"));
  EXPECT_EQ(cancelled, 1);
  EXPECT_TRUE(s.get("live")->cancel_requested);
  s.put(StoredResponse{"live", "cancelled", "{}", ojson::array(), false, {}});
  EXPECT_TRUE(s.get("live")->cancel_requested);  // kept across the final put
  EXPECT_TRUE(s.erase("live"));
  EXPECT_FALSE(s.get("live"));

  ResponseStore bytes(ResponseStoreLimits{100, 2000});
  for (int i = 0; i < 10; ++i)
    bytes.put(StoredResponse{"b" + std::to_string(i), "completed", std::string(500, 'x'), ojson::array(), false, {}});
  EXPECT_LE(bytes.bytes(), 2000u);
  EXPECT_EQ(bytes.size(), 3u);
  EXPECT_TRUE(bytes.get("b9"));
  EXPECT_FALSE(bytes.get("b0"));
}

}  // namespace
}  // namespace moeserve::server
