#include "server/anthropic_api.h"

#include <fmt/format.h>

#include <chrono>

#include "core/bounded_json.h"
#include "core/error.h"
#include "server/agent_output.h"
#include "server/api_formatter.h"
#include "server/openai_service.h"
#include "server/protocol.h"

namespace moeserve::server {

namespace {

constexpr const char* kJson = "application/json";

[[noreturn]] void invalid(const std::string& msg) { throw ApiError(400, "invalid_request_error", msg); }

const ojson* opt_field(const ojson& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

const std::string& need_string(const ojson& o, const char* key, const std::string& where) {
  const ojson* v = opt_field(o, key);
  if (!v) invalid(fmt::format("{}.{}: Field required", where, key));
  if (!v->is_string()) invalid(fmt::format("{}.{}: Input should be a valid string", where, key));
  return v->get_ref<const std::string&>();
}

std::string block_type(const ojson& b, const std::string& where) {
  if (!b.is_object()) invalid(fmt::format("{}: Input should be a valid dictionary", where));
  return need_string(b, "type", where);
}

[[noreturn]] void unsupported_media(const std::string& type, const std::string& where) {
  invalid(fmt::format("{}: content block type '{}' is not supported: this model accepts text only", where, type));
}

// Text of a `system` value or of a tool_result's content: a string or a list of text blocks.
std::string text_of(const ojson& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) invalid(fmt::format("{}: Input should be a valid string or list of content blocks", where));
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    std::string w = fmt::format("{}.{}", where, i);
    std::string t = block_type(v[i], w);
    if (t == "image" || t == "document") unsupported_media(t, w);
    if (t != "text") invalid(fmt::format("{}: expected a text block, got '{}'", w, t));
    if (i) out += "\n";
    out += need_string(v[i], "text", w);
  }
  return out;
}

// One Anthropic message -> chat messages (appended to `out`).
void translate_message(const ojson& m, size_t index, ojson& out) {
  std::string where = fmt::format("messages.{}", index);
  if (!m.is_object()) invalid(where + ": Input should be a valid dictionary");
  const std::string& role = need_string(m, "role", where);
  if (role != "user" && role != "assistant" && role != "system")
    invalid(fmt::format("{}.role: Input should be 'user' or 'assistant' (got '{}')", where, role));
  const ojson* content = opt_field(m, "content");
  if (!content) invalid(where + ".content: Field required");
  if (content->is_string()) {
    out.push_back({{"role", role}, {"content", *content}});
    return;
  }
  if (!content->is_array()) invalid(where + ".content: Input should be a valid string or list of content blocks");
  if (role == "system") {
    out.push_back({{"role", "system"}, {"content", text_of(*content, where + ".content")}});
    return;
  }
  if (role == "assistant") {
    std::string text, thinking;
    bool has_text = false, has_thinking = false;
    ojson calls = ojson::array();
    for (size_t i = 0; i < content->size(); ++i) {
      const ojson& b = (*content)[i];
      std::string w = fmt::format("{}.content.{}", where, i);
      std::string t = block_type(b, w);
      if (t == "text") {
        if (has_text) text += "\n";
        text += need_string(b, "text", w);
        has_text = true;
      } else if (t == "thinking") {
        if (has_thinking) thinking += "\n";
        thinking += need_string(b, "thinking", w);
        has_thinking = true;
      } else if (t == "redacted_thinking") {
        // Opaque data from another provider: nothing this model can read.
      } else if (t == "tool_use") {
        const ojson* input = opt_field(b, "input");
        if (input && !input->is_object()) invalid(w + ".input: Input should be a valid dictionary");
        calls.push_back({{"id", need_string(b, "id", w)},
                         {"type", "function"},
                         {"function", {{"name", need_string(b, "name", w)},
                                       {"arguments", input ? *input : ojson::object()}}}});
      } else if (t == "image" || t == "document") {
        unsupported_media(t, w);
      } else {
        invalid(fmt::format("{}: content block type '{}' is not allowed in an assistant message", w, t));
      }
    }
    ojson msg = {{"role", "assistant"}, {"content", text}};
    if (has_thinking) msg["reasoning_content"] = thinking;
    if (!calls.empty()) msg["tool_calls"] = std::move(calls);
    out.push_back(std::move(msg));
    return;
  }
  // user: tool_result blocks become `tool` messages (in order), the rest one user message.
  std::string text;
  bool has_text = false;
  for (size_t i = 0; i < content->size(); ++i) {
    const ojson& b = (*content)[i];
    std::string w = fmt::format("{}.content.{}", where, i);
    std::string t = block_type(b, w);
    if (t == "text") {
      if (has_text) text += "\n";
      text += need_string(b, "text", w);
      has_text = true;
    } else if (t == "tool_result") {
      const std::string& id = need_string(b, "tool_use_id", w);
      std::string result;
      if (const ojson* c = opt_field(b, "content")) result = text_of(*c, w + ".content");
      const ojson* err = opt_field(b, "is_error");
      if (err && !err->is_boolean()) invalid(w + ".is_error: Input should be a valid boolean");
      // The chat format has no error flag: the model reads it from the result text.
      if (err && err->get<bool>()) result = "Error: " + result;
      out.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", result}});
    } else if (t == "image" || t == "document") {
      unsupported_media(t, w);
    } else {
      invalid(fmt::format("{}: content block type '{}' is not allowed in a user message", w, t));
    }
  }
  if (has_text) out.push_back({{"role", "user"}, {"content", text}});
}

ojson translate_tools(const ojson& tools) {
  if (!tools.is_array()) invalid("tools: Input should be a valid list");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    std::string w = fmt::format("tools.{}", i);
    const ojson& t = tools[i];
    if (!t.is_object()) invalid(w + ": Input should be a valid dictionary");
    if (const ojson* type = opt_field(t, "type")) {
      if (!type->is_string() || (type->get<std::string>() != "custom"))
        invalid(fmt::format("{}.type: server tool '{}' is not supported: only custom tools (name, description, "
                            "input_schema) are",
                            w, type->is_string() ? type->get<std::string>() : type->dump()));
    }
    ojson fn = {{"name", need_string(t, "name", w)}};
    if (const ojson* d = opt_field(t, "description")) {
      if (!d->is_string()) invalid(w + ".description: Input should be a valid string");
      fn["description"] = *d;
    }
    const ojson* schema = opt_field(t, "input_schema");
    if (!schema) invalid(w + ".input_schema: Field required");
    if (!schema->is_object()) invalid(w + ".input_schema: Input should be a valid dictionary");
    fn["parameters"] = *schema;
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

}  // namespace

AnthropicTranslation translate_anthropic_request(const ojson& body, bool count_only) {
  if (!body.is_object()) invalid("body: Input should be a valid dictionary");
  AnthropicTranslation tr;
  ojson& c = tr.chat_body;
  c = ojson::object();
  c["model"] = need_string(body, "model", "body");
  if (!count_only) {
    const ojson* mt = opt_field(body, "max_tokens");
    if (!mt) invalid("max_tokens: Field required");
    if (!mt->is_number_integer()) invalid("max_tokens: Input should be a valid integer");
    if (mt->get<int64_t>() < 1) invalid("max_tokens: Input should be greater than or equal to 1");
    c["max_tokens"] = *mt;
  }
  ojson messages = ojson::array();
  if (const ojson* sys = opt_field(body, "system")) {
    std::string s = text_of(*sys, "system");
    messages.push_back({{"role", "system"}, {"content", s}});
  }
  const ojson* msgs = opt_field(body, "messages");
  if (!msgs) invalid("messages: Field required");
  if (!msgs->is_array()) invalid("messages: Input should be a valid list");
  if (msgs->empty()) invalid("messages: at least one message is required");
  for (size_t i = 0; i < msgs->size(); ++i) translate_message((*msgs)[i], i, messages);
  c["messages"] = std::move(messages);

  if (const ojson* s = opt_field(body, "stop_sequences")) {
    if (!s->is_array()) invalid("stop_sequences: Input should be a valid list");
    for (auto& e : *s)
      if (!e.is_string() || e.get_ref<const std::string&>().empty())
        invalid("stop_sequences: each entry must be a non-empty string");
    if (!s->empty()) c["stop"] = *s;
  }
  if (const ojson* t = opt_field(body, "temperature")) {
    if (!t->is_number()) invalid("temperature: Input should be a valid number");
    double v = t->get<double>();
    if (v < 0 || v > 1) invalid(fmt::format("temperature: Input should be between 0 and 1 (got {})", v));
    c["temperature"] = *t;
  }
  if (const ojson* p = opt_field(body, "top_p")) {
    if (!p->is_number()) invalid("top_p: Input should be a valid number");
    double v = p->get<double>();
    if (v <= 0 || v > 1) invalid(fmt::format("top_p: Input should be in (0, 1] (got {})", v));
    c["top_p"] = *p;
  }
  if (const ojson* k = opt_field(body, "top_k")) {
    if (!k->is_number_integer() || k->get<int64_t>() < 0) invalid("top_k: Input should be a non-negative integer");
    c["top_k"] = *k;
  }
  if (const ojson* s = opt_field(body, "stream")) {
    if (!s->is_boolean()) invalid("stream: Input should be a valid boolean");
    tr.stream = s->get<bool>();
    c["stream"] = tr.stream;
  }
  if (const ojson* m = opt_field(body, "metadata")) {
    // Only `user_id` exists (abuse tracking); there is nothing for it to change here.
    if (!m->is_object()) invalid("metadata: Input should be a valid dictionary");
    if (const ojson* u = opt_field(*m, "user_id"); u && !u->is_string())
      invalid("metadata.user_id: Input should be a valid string");
  }
  for (const char* unsupported : {"mcp_servers", "container", "context_management"})
    if (opt_field(body, unsupported)) invalid(fmt::format("{}: not supported by this server", unsupported));

  ojson kwargs = ojson::object();
  if (const ojson* th = opt_field(body, "thinking")) {
    if (!th->is_object()) invalid("thinking: Input should be a valid dictionary");
    std::string type = need_string(*th, "type", "thinking");
    if (type == "enabled") {
      const ojson* b = opt_field(*th, "budget_tokens");
      if (!b) invalid("thinking.enabled.budget_tokens: Field required");
      if (!b->is_number_integer()) invalid("thinking.enabled.budget_tokens: Input should be a valid integer");
      if (b->get<int64_t>() < 1024) invalid("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024");
      if (!count_only && b->get<int64_t>() >= c["max_tokens"].get<int64_t>())
        invalid("`max_tokens` must be greater than `thinking.budget_tokens`");
      // The budget is enforced by the engine (SamplingParams::thinking: the reasoning end
      // token is forced once budget_tokens are spent); templates that read the kwargs see it.
      kwargs["enable_thinking"] = true;
      kwargs["thinking_budget"] = *b;
      c["thinking_token_budget"] = *b;
    } else if (type == "disabled") {
      // Templates with a switch (enable_thinking) skip the section; for those that always open
      // it (MiniMax-M2), a zero budget closes it at the first generated token.
      kwargs["enable_thinking"] = false;
      c["thinking_token_budget"] = 0;
    } else if (type == "adaptive") {
      kwargs["enable_thinking"] = true;
    } else {
      invalid(fmt::format("thinking.type: Input should be 'enabled', 'disabled' or 'adaptive' (got '{}')", type));
    }
  }
  if (const ojson* oc = opt_field(body, "output_config")) {
    if (!oc->is_object()) invalid("output_config: Input should be a valid dictionary");
    if (const ojson* fm = opt_field(*oc, "format")) {
      // {"type": "json_schema", "schema": {...}}: the chat body's response_format (one engine).
      if (!fm->is_object() || !fm->contains("type") || (*fm)["type"] != "json_schema" || !opt_field(*fm, "schema"))
        invalid("output_config.format: expected {\"type\": \"json_schema\", \"schema\": {...}}");
      c["response_format"] = {{"type", "json_schema"},
                                 {"json_schema", {{"name", "output"}, {"schema", (*fm)["schema"]}}}};
    }
    if (const ojson* e = opt_field(*oc, "effort")) {
      if (!e->is_string()) invalid("output_config.effort: Input should be a valid string");
      kwargs["reasoning_effort"] = *e;
    }
  }
  if (!kwargs.empty()) c["chat_template_kwargs"] = std::move(kwargs);

  const ojson* tools = opt_field(body, "tools");
  bool has_tools = tools && tools->is_array() && !tools->empty();
  if (tools) c["tools"] = translate_tools(*tools);
  if (const ojson* tc = opt_field(body, "tool_choice")) {
    if (!tc->is_object()) invalid("tool_choice: Input should be a valid dictionary");
    std::string type = need_string(*tc, "type", "tool_choice");
    if (const ojson* d = opt_field(*tc, "disable_parallel_tool_use")) {
      if (!d->is_boolean()) invalid("tool_choice.disable_parallel_tool_use: Input should be a valid boolean");
      tr.single_tool_call = d->get<bool>();
    }
    if (type == "none") {
      if (has_tools) c["tool_choice"] = "none";
    } else if (type == "auto" || type == "any" || type == "tool") {
      if (!has_tools) invalid(fmt::format("tool_choice.type '{}' requires `tools`", type));
      if (type == "auto") {
        c["tool_choice"] = "auto";
      } else if (type == "any") {
        c["tool_choice"] = "required";
      } else {
        const std::string& name = need_string(*tc, "name", "tool_choice");
        bool found = false;
        for (auto& t : *tools) found = found || (t.contains("name") && t["name"] == name);
        if (!found) invalid(fmt::format("tool_choice.name: tool '{}' is not in `tools`", name));
        c["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
      }
    } else {
      invalid(fmt::format("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none' (got '{}')", type));
    }
  }
  return tr;
}

int anthropic_status(int status) { return status == 429 || status == 503 ? 529 : status; }

ojson anthropic_tool_input(const std::string& arguments) {
  if (arguments.empty()) return ojson::object();
  // Model output: parsed with the nesting limit of request bodies, since dump() recurses once
  // per level (a model writing 200,000 '[' would otherwise overflow the stack).
  ojson input = parse_json_bounded_or_discarded<ojson>(arguments);
  return input.is_object() ? input : ojson::object();
}

std::string anthropic_error_body(int status, const std::string& message) {
  const char* type = "api_error";
  switch (status) {
    case 400: type = "invalid_request_error"; break;
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 529: type = "overloaded_error"; break;
    default: break;
  }
  std::string out = "{\"type\":\"error\",\"error\":{\"type\":\"";
  out += type;
  out += "\",\"message\":";
  append_json_string(out, valid_utf8(message) ? message : "(message contained invalid UTF-8)");
  return out + "}}";
}

namespace {

// The Messages wire format. Blocks come from the shared BlockAssembler, in both modes, so the
// streamed blocks and the non-streaming `content` are the same.
class AnthropicFormatter final : public ApiFormatter, private BlockListener {
 public:
  AnthropicFormatter(bool stream, bool single_tool_call) : stream_(stream), blocks_(single_tool_call) {}
  std::string id_prefix() const override { return "msg_"; }
  void begin(const GenStart& s) override {
    ctx_ = s.ctx;
    prompt_tokens_ = static_cast<int64_t>((*s.prompt_ids)[0].size());
  }
  void on_delta(std::string& out, int, const ChoiceDelta& d, const RequestOutput& ro, const Usage*) override {
    cached_ = std::max<int64_t>(cached_, ro.num_cached_tokens);
    generated_ += static_cast<int64_t>(ro.new_token_ids.size());
    out_ = stream_ ? &out : nullptr;
    if (stream_ && !started_) start_message(out);
    blocks_.push(d, ro.new_token_ids.size(), stream_ ? this : nullptr);
    if (!d.finished) return;
    finish_reason_ = d.finish_reason;
    stop_reason_ = d.stop_reason;
    error_ = ro.error;
    if (!stream_) return;
    if (finish_reason_ == "error" || finish_reason_ == "abort") {
      std::string msg = finish_reason_ == "abort" ? "the request was aborted (server shutting down)"
                                                  : (error_.empty() ? "generation failed" : error_);
      append_sse_event(out, "error", anthropic_error_body(finish_reason_ == "abort" ? 529 : 500, msg));
      return;
    }
    std::string md = "{\"type\":\"message_delta\",\"delta\":{" + stop_fields() + "},\"usage\":" +
                     usage_json(generated_) + "}";
    append_sse_event(out, "message_delta", md);
    append_sse_event(out, "message_stop", "{\"type\":\"message_stop\"}");
  }
  void on_stream_end(std::string&, const Usage&) override {}
  // Periodic pings while the prompt is prefilled or nothing else is sent (as Anthropic's API).
  void keepalive(std::string& out) override {
    if (!started_) start_message(out);
    else append_sse_event(out, "ping", "{\"type\":\"ping\"}");
  }
  std::string response_body(const std::vector<const OutputProcessor*>&, const Usage&) override {
    if (finish_reason_ == "abort") throw ApiError(529, "overloaded_error", "the request was aborted (server shutting down)");
    std::string out = "{\"id\":";
    append_json_string(out, ctx_->id);
    out += ",\"type\":\"message\",\"role\":\"assistant\",\"model\":";
    append_json_string(out, ctx_->model);
    out += ",\"content\":[";
    bool first = true;
    for (auto& b : blocks_.blocks()) {
      if (!first) out += ",";
      first = false;
      out += block_json(b, true);
    }
    out += "]," + stop_fields() + ",\"usage\":" + usage_json(generated_) + "}";
    return out;
  }
  int error_status(int status) const override { return anthropic_status(status); }
  std::string error_json(int status, const std::string&, const std::string& message) const override {
    return anthropic_error_body(anthropic_status(status), message);
  }

 private:
  void start_message(std::string& out) {
    started_ = true;
    std::string m = "{\"type\":\"message_start\",\"message\":{\"id\":";
    append_json_string(m, ctx_->id);
    m += ",\"type\":\"message\",\"role\":\"assistant\",\"model\":";
    append_json_string(m, ctx_->model);
    m += ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":" + usage_json(0) + "}}";
    append_sse_event(out, "message_start", m);
    append_sse_event(out, "ping", "{\"type\":\"ping\"}");
  }
  std::string usage_json(int64_t output_tokens) const {
    // Anthropic counts prompt tokens read from the cache apart from input_tokens
    // (total prompt = input_tokens + cache_read_input_tokens + cache_creation_input_tokens).
    return fmt::format(
        "{{\"input_tokens\":{},\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":{},\"output_tokens\":{}}}",
        prompt_tokens_ - cached_, cached_, output_tokens);
  }
  std::string stop_fields() const {
    std::string r = "null", seq = "null";
    if (finish_reason_ == "tool_calls" || (blocks_.has_tool_calls() && finish_reason_ == "stop")) {
      r = "\"tool_use\"";
    } else if (finish_reason_ == "length") {
      r = "\"max_tokens\"";
    } else if (stop_reason_.is_string()) {
      r = "\"stop_sequence\"";
      seq = json_string(stop_reason_.get<std::string>());
    } else {
      r = "\"end_turn\"";
    }
    return "\"stop_reason\":" + r + ",\"stop_sequence\":" + seq;
  }
  // Final form (content) or the empty form of content_block_start.
  std::string block_json(const OutputBlock& b, bool final) {
    std::string out;
    switch (b.kind) {
      case BlockKind::Reasoning:
        out = "{\"type\":\"thinking\",\"thinking\":" + json_string(final ? b.text : "") + ",\"signature\":" +
              json_string(final ? signature_for(b) : "") + "}";
        break;
      case BlockKind::Text: out = "{\"type\":\"text\",\"text\":" + json_string(final ? b.text : "") + "}"; break;
      case BlockKind::ToolCall: {
        const ojson input = final ? anthropic_tool_input(b.text) : ojson::object();
        out = "{\"type\":\"tool_use\",\"id\":" + json_string(b.tool_id) + ",\"name\":" + json_string(b.tool_name) +
              ",\"input\":" + input.dump() + "}";
        break;
      }
    }
    return out;
  }
  // Anthropic signs thinking blocks so they can be verified when sent back; this server
  // re-renders thinking from its text, so the signature is only an opaque marker.
  std::string signature_for(const OutputBlock&) {
    if (signature_.empty()) signature_ = random_hex(64);
    return signature_;
  }
  void block_start(int index, const OutputBlock& b) override {
    append_sse_event(*out_, "content_block_start",
                     fmt::format("{{\"type\":\"content_block_start\",\"index\":{},\"content_block\":{}}}", index,
                                 block_json(b, false)));
  }
  void block_delta(int index, const OutputBlock& b, std::string_view piece) override {
    std::string delta;
    switch (b.kind) {
      case BlockKind::Reasoning: delta = "{\"type\":\"thinking_delta\",\"thinking\":" + json_string(piece) + "}"; break;
      case BlockKind::Text: delta = "{\"type\":\"text_delta\",\"text\":" + json_string(piece) + "}"; break;
      case BlockKind::ToolCall:
        delta = "{\"type\":\"input_json_delta\",\"partial_json\":" + json_string(piece) + "}";
        break;
    }
    append_sse_event(*out_, "content_block_delta",
                     fmt::format("{{\"type\":\"content_block_delta\",\"index\":{},\"delta\":{}}}", index, delta));
  }
  void block_stop(int index, const OutputBlock& b) override {
    if (b.kind == BlockKind::Reasoning)
      append_sse_event(*out_, "content_block_delta",
                       fmt::format("{{\"type\":\"content_block_delta\",\"index\":{},\"delta\":{{\"type\":"
                                   "\"signature_delta\",\"signature\":{}}}}}",
                                   index, json_string(signature_for(b))));
    append_sse_event(*out_, "content_block_stop",
                     fmt::format("{{\"type\":\"content_block_stop\",\"index\":{}}}", index));
  }

  bool stream_;
  BlockAssembler blocks_;
  const ResponseContext* ctx_ = nullptr;
  std::string* out_ = nullptr;
  bool started_ = false;
  int64_t prompt_tokens_ = 0, cached_ = 0, generated_ = 0;
  std::string finish_reason_, error_, signature_;
  ojson stop_reason_;
};

void messages(OpenAIService& svc, const HttpRequest& http, std::shared_ptr<ResponseSink> sink, bool count_only) {
  auto arrival = std::chrono::steady_clock::now();
  ojson body = parse_json_body(http.body);
  AnthropicTranslation tr = translate_anthropic_request(body, count_only);
  GenRequest r = parse_chat_request(tr.chat_body, svc.limits());
  if (count_only) {
    svc.check_model(r.model);
    auto ids = svc.render_chat_prompt(r, tr.chat_body);
    sink->send(200, kJson, "{\"input_tokens\":" + std::to_string(ids.size()) + "}");
    return;
  }
  // Usage is reported from the formatter's own counts; the chat usage chunk is not used.
  auto fmt = std::make_unique<AnthropicFormatter>(tr.stream, tr.single_tool_call);
  svc.run_generation(http, std::move(sink), tr.chat_body, std::move(r), std::move(fmt), arrival);
}

}  // namespace

void handle_anthropic(OpenAIService& svc, const std::string& path, const HttpRequest& http,
                      std::shared_ptr<ResponseSink> sink) {
  try {
    if (http.method != "POST") {
      sink->send(405, kJson, anthropic_error_body(405, "Method Not Allowed"));
      return;
    }
    messages(svc, http, sink, path == "/v1/messages/count_tokens");
  } catch (const ApiError& e) {
    std::string msg = e.what();
    // Agents (Claude Code) detect an overflowing context by Anthropic's wording.
    if (e.param && *e.param == "input_tokens") msg = "prompt is too long: " + msg;
    int status = anthropic_status(e.status);
    sink->send(status, kJson, anthropic_error_body(status, msg));
  } catch (const Error& e) {
    sink->send(400, kJson, anthropic_error_body(400, e.what()));
  } catch (const std::exception& e) {
    sink->send(500, kJson, anthropic_error_body(500, e.what()));
  }
}

}  // namespace moeserve::server
