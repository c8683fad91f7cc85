#include "server/responses_api.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>

#include "core/bounded_json.h"
#include "core/error.h"
#include "server/agent_output.h"
#include "server/api_formatter.h"
#include "server/openai_service.h"
#include "server/protocol.h"

namespace moeserve::server {

namespace {

constexpr const char* kJson = "application/json";

const ojson* opt_field(const ojson& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

const std::string& need_string(const ojson& o, const char* key, const std::string& where) {
  const ojson* v = opt_field(o, key);
  if (!v) throw bad_request(fmt::format("{}.{}: Field required", where, key), where);
  if (!v->is_string()) throw bad_request(fmt::format("{}.{}: Input should be a valid string", where, key), where);
  return v->get_ref<const std::string&>();
}

// The reasoning text travels in `encrypted_content` (requested with include
// "reasoning.encrypted_content", used by clients that run with store=false): base64 of the
// text, since this server keeps no secrets from its own client.
constexpr const char* kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(std::string_view s) {
  std::string out;
  size_t i = 0;
  for (; i + 2 < s.size(); i += 3) {
    uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
    for (int k = 18; k >= 0; k -= 6) out += kB64[(v >> k) & 63];
  }
  if (i < s.size()) {
    uint32_t v = uint8_t(s[i]) << 16;
    if (i + 1 < s.size()) v |= uint8_t(s[i + 1]) << 8;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < s.size() ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view s) {
  std::string out;
  uint32_t v = 0;
  int bits = 0;
  for (char ch : s) {
    if (ch == '=') break;
    const char* p = std::strchr(kB64, ch);
    if (!p || ch == 0) return std::nullopt;
    v = (v << 6) | static_cast<uint32_t>(p - kB64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((v >> bits) & 0xFF);
    }
  }
  if (!valid_utf8(out)) return std::nullopt;
  return out;
}

// A message's content: a string or a list of text parts.
std::string parts_text(const ojson& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw bad_request(where + ": Input should be a valid string or list", where);
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    std::string w = fmt::format("{}.{}", where, i);
    const ojson& p = content[i];
    if (!p.is_object()) throw bad_request(w + ": Input should be a valid dictionary", where);
    const std::string& t = need_string(p, "type", w);
    std::string text;
    if (t == "input_text" || t == "output_text" || t == "text") text = need_string(p, "text", w);
    else if (t == "refusal") text = need_string(p, "refusal", w);
    else
      throw bad_request(fmt::format("{}: content type '{}' is not supported: this model accepts text only", w, t), where);
    if (i) out += "\n";
    out += text;
  }
  return out;
}

std::string reasoning_text(const ojson& item, const std::string& where) {
  std::string out;
  if (const ojson* c = opt_field(item, "content"); c && c->is_array() && !c->empty()) {
    for (size_t i = 0; i < c->size(); ++i) {
      if (i) out += "\n";
      out += need_string((*c)[i], "text", fmt::format("{}.content.{}", where, i));
    }
    return out;
  }
  if (const ojson* e = opt_field(item, "encrypted_content")) {
    auto text = e->is_string() ? base64_decode(e->get<std::string>()) : std::nullopt;
    if (!text) throw bad_request(where + ".encrypted_content: not produced by this server", where);
    return *text;
  }
  if (const ojson* s = opt_field(item, "summary"); s && s->is_array()) {
    for (size_t i = 0; i < s->size(); ++i) {
      if (i) out += "\n";
      out += need_string((*s)[i], "text", fmt::format("{}.summary.{}", where, i));
    }
  }
  return out;
}

}  // namespace

void responses_items_to_messages(const ojson& items, ojson& out) {
  if (!items.is_array()) throw bad_request("input: Input should be a valid string or list of items", "input");
  // One assistant turn may arrive as reasoning + message + function_call items: they form one
  // assistant message, as the chat route receives it.
  ojson pending;
  auto flush = [&] {
    if (!pending.is_null()) out.push_back(std::move(pending));
    pending = nullptr;
  };
  auto assistant = [&]() -> ojson& {
    if (pending.is_null()) pending = {{"role", "assistant"}, {"content", ""}};
    return pending;
  };
  auto has_output = [&] {
    return !pending.is_null() && (!pending["content"].get_ref<const std::string&>().empty() || pending.contains("tool_calls"));
  };
  for (size_t i = 0; i < items.size(); ++i) {
    std::string where = fmt::format("input.{}", i);
    const ojson& it = items[i];
    if (!it.is_object()) throw bad_request(where + ": Input should be a valid dictionary", "input");
    std::string type = opt_field(it, "type") ? need_string(it, "type", where) : "message";
    if (type == "message") {
      std::string role = need_string(it, "role", where);
      const ojson* content = opt_field(it, "content");
      if (!content) throw bad_request(where + ".content: Field required", "input");
      std::string text = parts_text(*content, where + ".content");
      if (role == "assistant") {
        if (has_output()) flush();
        assistant()["content"] = text;
      } else if (role == "user" || role == "system" || role == "developer") {
        flush();
        out.push_back({{"role", role == "developer" ? "system" : role}, {"content", text}});
      } else {
        throw bad_request(fmt::format("{}.role: '{}' is not one of user, assistant, system, developer", where, role),
                          "input");
      }
    } else if (type == "reasoning") {
      std::string text = reasoning_text(it, where);
      if (has_output() || (!pending.is_null() && pending.contains("reasoning_content"))) flush();
      assistant()["reasoning_content"] = text;
    } else if (type == "function_call") {
      ojson call = {{"id", need_string(it, "call_id", where)},
                    {"type", "function"},
                    {"function", {{"name", need_string(it, "name", where)},
                                  {"arguments", need_string(it, "arguments", where)}}}};
      ojson& a = assistant();
      if (!a.contains("tool_calls")) a["tool_calls"] = ojson::array();
      a["tool_calls"].push_back(std::move(call));
    } else if (type == "function_call_output") {
      flush();
      const ojson* o = opt_field(it, "output");
      if (!o) throw bad_request(where + ".output: Field required", "input");
      out.push_back({{"role", "tool"},
                     {"tool_call_id", need_string(it, "call_id", where)},
                     {"content", parts_text(*o, where + ".output")}});
    } else {
      throw bad_request(fmt::format("{}.type: input item type '{}' is not supported by this server (messages, "
                                    "reasoning, function_call and function_call_output are)",
                                    where, type),
                        "input");
    }
  }
  flush();
}

ResponsesTranslation translate_responses_request(const ojson& body, const ojson& previous) {
  if (!body.is_object()) throw bad_request("body: Input should be a valid dictionary");
  ResponsesTranslation tr;
  ojson& c = tr.chat_body;
  ojson& f = tr.response_fields;
  c = ojson::object();
  f = ojson::object();
  if (const ojson* m = opt_field(body, "model")) {
    if (!m->is_string()) throw bad_request("model: Input should be a valid string", "model");
    c["model"] = *m;
  }
  auto refuse_if = [&](const char* key, bool cond, const std::string& why) {
    if (cond) throw bad_request(fmt::format("{}: {}", key, why), key);
  };
  const ojson* bg = opt_field(body, "background");
  refuse_if("background", bg && (!bg->is_boolean() || bg->get<bool>()), "background mode is not supported");
  refuse_if("conversation", opt_field(body, "conversation"), "conversations are not supported; use previous_response_id");
  refuse_if("prompt", opt_field(body, "prompt"), "prompt templates are not supported");
  const ojson* trunc = opt_field(body, "truncation");
  refuse_if("truncation", trunc && *trunc != "disabled", "only 'disabled' is supported");
  const ojson* tlp = opt_field(body, "top_logprobs");
  refuse_if("top_logprobs", tlp && !(tlp->is_number_integer() && tlp->get<int64_t>() == 0), "logprobs are not supported");

  // Messages: instructions, the previous response's conversation, the new input.
  ojson history = previous.is_array() ? previous : ojson::array();
  const ojson* input = opt_field(body, "input");
  if (!input) throw bad_request("input: Field required", "input");
  if (input->is_string()) history.push_back({{"role", "user"}, {"content", *input}});
  else responses_items_to_messages(*input, history);
  ojson messages = ojson::array();
  f["instructions"] = nullptr;
  if (const ojson* ins = opt_field(body, "instructions")) {
    if (!ins->is_string()) throw bad_request("instructions: Input should be a valid string", "instructions");
    messages.push_back({{"role", "system"}, {"content", *ins}});
    f["instructions"] = *ins;
  }
  for (auto& m : history) messages.push_back(m);
  if (messages.empty()) throw bad_request("input: at least one input item is required", "input");
  c["messages"] = std::move(messages);
  tr.history = std::move(history);

  f["max_output_tokens"] = nullptr;
  if (const ojson* mt = opt_field(body, "max_output_tokens")) {
    if (!mt->is_number_integer() || mt->get<int64_t>() < 1)
      throw bad_request("max_output_tokens: Input should be an integer greater than or equal to 1", "max_output_tokens");
    c["max_tokens"] = *mt;
    f["max_output_tokens"] = *mt;
  }
  f["max_tool_calls"] = nullptr;
  if (const ojson* mtc = opt_field(body, "max_tool_calls")) {
    if (!mtc->is_number_integer() || mtc->get<int64_t>() < 1)
      throw bad_request("max_tool_calls: Input should be an integer greater than or equal to 1", "max_tool_calls");
    tr.max_tool_calls = static_cast<int>(std::min<int64_t>(mtc->get<int64_t>(), 1 << 20));
    f["max_tool_calls"] = *mtc;
  }
  bool parallel = true;
  if (const ojson* p = opt_field(body, "parallel_tool_calls")) {
    if (!p->is_boolean()) throw bad_request("parallel_tool_calls: Input should be a valid boolean", "parallel_tool_calls");
    parallel = p->get<bool>();
  }
  if (!parallel) tr.max_tool_calls = 1;
  f["parallel_tool_calls"] = parallel;
  f["previous_response_id"] = body.contains("previous_response_id") ? body["previous_response_id"] : ojson();

  ojson kwargs = ojson::object();
  f["reasoning"] = {{"effort", nullptr}, {"summary", nullptr}};
  if (const ojson* r = opt_field(body, "reasoning")) {
    if (!r->is_object()) throw bad_request("reasoning: Input should be a valid dictionary", "reasoning");
    if (const ojson* e = opt_field(*r, "effort")) {
      static const char* kEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
      bool ok = false;
      for (auto* k : kEfforts) ok = ok || *e == k;
      if (!ok) throw bad_request("reasoning.effort: Input should be none, minimal, low, medium, high or xhigh", "reasoning");
      // As vLLM: effort "none" turns thinking off in templates that can; the rest is passed on.
      // "none" also sets a zero thinking budget, so templates that always open the reasoning
      // section (MiniMax-M2) have it closed at the first token.
      if (*e == "none") {
        kwargs["enable_thinking"] = false;
        c["thinking_token_budget"] = 0;
      } else {
        kwargs["reasoning_effort"] = *e;
      }
      f["reasoning"]["effort"] = *e;
    }
    // `summary`: this server has no summariser; reasoning items carry the full text and an
    // empty summary list.
  }
  if (!kwargs.empty()) c["chat_template_kwargs"] = std::move(kwargs);

  f["text"] = {{"format", {{"type", "text"}}}};
  if (const ojson* t = opt_field(body, "text")) {
    if (!t->is_object()) throw bad_request("text: Input should be a valid dictionary", "text");
    if (const ojson* fm = opt_field(*t, "format")) {
      if (!fm->is_object() || !fm->contains("type")) throw bad_request("text.format: needs a `type`", "text");
      // Structured outputs: the Responses spelling (name / schema / strict beside `type`)
      // becomes the chat body's response_format, enforced by the same grammar engine.
      const ojson& type = (*fm)["type"];
      if (type == "json_schema") {
        const ojson* schema = opt_field(*fm, "schema");
        if (!schema) throw bad_request("text.format: json_schema needs a `schema`", "text");
        const ojson* name = opt_field(*fm, "name");
        if (name && !name->is_string()) throw bad_request("text.format.name: Input should be a valid string", "text");
        ojson js = {{"name", name ? *name : ojson("output")}, {"schema", *schema}};
        if (const ojson* st = opt_field(*fm, "strict")) js["strict"] = *st;
        c["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
      } else if (type == "json_object") {
        c["response_format"] = {{"type", "json_object"}};
      } else if (type != "text") {
        throw bad_request("text.format.type: expected 'text', 'json_schema' or 'json_object'", "text");
      }
      f["text"]["format"] = *fm;
    }
    if (const ojson* v = opt_field(*t, "verbosity"); v && *v != "medium")
      throw bad_request("text.verbosity: only 'medium' is supported", "text");
  }

  if (const ojson* inc = opt_field(body, "include")) {
    if (!inc->is_array()) throw bad_request("include: Input should be a valid list", "include");
    for (auto& e : *inc) {
      if (e == "reasoning.encrypted_content") tr.include_encrypted_reasoning = true;
      else throw bad_request(fmt::format("include: '{}' is not supported", e.is_string() ? e.get<std::string>() : e.dump()),
                             "include");
    }
  }

  f["tools"] = ojson::array();
  bool has_tools = false;
  if (const ojson* tools = opt_field(body, "tools")) {
    if (!tools->is_array()) throw bad_request("tools: Input should be a valid list", "tools");
    ojson out = ojson::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      std::string w = fmt::format("tools.{}", i);
      const ojson& t = (*tools)[i];
      if (!t.is_object()) throw bad_request(w + ": Input should be a valid dictionary", "tools");
      const std::string& type = need_string(t, "type", w);
      if (type != "function")
        throw bad_request(fmt::format("{}.type: tool type '{}' is not supported: only function tools are", w, type),
                          "tools");
      ojson fn = {{"name", need_string(t, "name", w)}};
      for (const char* k : {"description", "parameters", "strict"})
        if (const ojson* v = opt_field(t, k)) fn[k] = *v;
      out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    has_tools = !out.empty();
    if (!out.empty()) c["tools"] = std::move(out);
    f["tools"] = *tools;
  }
  f["tool_choice"] = "auto";
  if (const ojson* tc = opt_field(body, "tool_choice")) {
    if (tc->is_string() && (*tc == "none" || *tc == "auto" || *tc == "required")) {
      if (has_tools) c["tool_choice"] = *tc;
      else if (*tc != "none") throw bad_request("tool_choice: requires `tools`", "tool_choice");
    } else if (tc->is_object() && tc->contains("type") && (*tc)["type"] == "function") {
      const std::string& name = need_string(*tc, "name", "tool_choice");
      bool found = false;
      if (has_tools)
        for (auto& t : c["tools"]) found = found || t["function"]["name"] == name;
      if (!found) throw bad_request(fmt::format("tool_choice: function '{}' is not in `tools`", name), "tool_choice");
      c["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
    } else {
      throw bad_request("tool_choice: only 'none', 'auto', 'required' and {\"type\": \"function\", \"name\": ...} "
                        "are supported",
                        "tool_choice");
    }
    f["tool_choice"] = *tc;
  }

  if (const ojson* t = opt_field(body, "temperature")) {
    if (!t->is_number() || t->get<double>() < 0 || t->get<double>() > 2)
      throw bad_request("temperature: Input should be a number between 0 and 2", "temperature");
    c["temperature"] = *t;
  }
  if (const ojson* p = opt_field(body, "top_p")) c["top_p"] = *p;  // validated by the chat parser
  f["temperature"] = c.contains("temperature") ? c["temperature"] : ojson(1.0);
  f["top_p"] = c.contains("top_p") ? c["top_p"] : ojson(1.0);
  // vLLM's extra sampling fields, validated by the chat parser.
  for (const char* k : {"seed", "stop", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                        "frequency_penalty", "request_id"})
    if (const ojson* v = opt_field(body, k)) c[k] = *v;
  if (const ojson* s = opt_field(body, "stream")) {
    if (!s->is_boolean()) throw bad_request("stream: Input should be a valid boolean", "stream");
    tr.stream = s->get<bool>();
    c["stream"] = tr.stream;
  }
  if (const ojson* s = opt_field(body, "store")) {
    if (!s->is_boolean()) throw bad_request("store: Input should be a valid boolean", "store");
    tr.store = s->get<bool>();
  }
  f["store"] = tr.store;
  f["truncation"] = "disabled";
  f["user"] = body.contains("user") ? body["user"] : ojson();
  f["metadata"] = ojson::object();
  if (const ojson* m = opt_field(body, "metadata")) {
    if (!m->is_object()) throw bad_request("metadata: Input should be a valid dictionary", "metadata");
    for (auto& [k, v] : m->items())
      if (!v.is_string()) throw bad_request(fmt::format("metadata.{}: Input should be a valid string", k), "metadata");
    f["metadata"] = *m;
  }
  return tr;
}

namespace {

// The Response object and its stream events, built from the shared BlockAssembler in both
// modes (so a streamed response's response.completed equals the non-streaming body).
class ResponsesFormatter final : public ApiFormatter, private BlockListener {
 public:
  ResponsesFormatter(ResponsesTranslation tr, ResponseStore* store)
      : tr_(std::move(tr)), store_(tr_.store ? store : nullptr), blocks_(tr_.max_tool_calls == 1) {}
  std::string id_prefix() const override { return "resp_"; }
  void begin(const GenStart& s) override {
    ctx_ = s.ctx;
    prompt_tokens_ = static_cast<int64_t>((*s.prompt_ids)[0].size());
    if (store_) store_->put(StoredResponse{ctx_->id, "in_progress", response_json("in_progress").dump(), {}, false, s.abort});
  }
  void on_delta(std::string& out, int, const ChoiceDelta& d, const RequestOutput& ro, const Usage*) override {
    cached_ = std::max<int64_t>(cached_, ro.num_cached_tokens);
    generated_ += static_cast<int64_t>(ro.new_token_ids.size());
    out_ = tr_.stream ? &out : nullptr;
    if (out_ && !started_) {
      started_ = true;
      ojson r = response_json("in_progress");
      emit("response.created", {{"response", r}});
      emit("response.in_progress", {{"response", r}});
    }
    ChoiceDelta limited = d;
    if (tr_.max_tool_calls > 1) {  // 1 is the assembler's own rule
      std::erase_if(limited.tool_calls, [&](const ToolCallDelta& c) { return c.index >= tr_.max_tool_calls; });
    }
    blocks_.push(limited, ro.new_token_ids.size(), out_ ? this : nullptr);
    if (!d.finished) return;
    std::string status = "completed";
    ojson error, incomplete;
    if (d.finish_reason == "error") {
      status = "failed";
      error = {{"code", "server_error"}, {"message", ro.error.empty() ? "generation failed" : ro.error}};
    } else if (d.finish_reason == "abort") {
      auto stored = store_ ? store_->get(ctx_->id) : std::nullopt;
      if (stored && stored->cancel_requested) {
        status = "cancelled";
      } else {
        status = "failed";
        error = {{"code", "server_error"}, {"message", "the request was aborted (server shutting down)"}};
      }
    } else if (d.finish_reason == "length") {
      status = "incomplete";
      incomplete = {{"reason", "max_output_tokens"}};
    }
    final_ = response_json(status, true);
    final_["error"] = error;
    final_["incomplete_details"] = incomplete;
    save(status);
    if (out_) emit(status == "failed" ? "response.failed" : "response.completed", {{"response", final_}});
  }
  void on_stream_end(std::string&, const Usage&) override {}
  std::string response_body(const std::vector<const OutputProcessor*>&, const Usage&) override { return final_.dump(); }
  std::string error_json(int status, const std::string& type, const std::string& message) const override {
    return error_body(status, type, message);
  }
  void on_cancel() override {  // the client went away: keep what was generated
    if (!store_ || !final_.is_null()) return;
    final_ = response_json("cancelled", true);
    save("cancelled");
  }

 private:
  void save(const std::string& status) {
    if (!store_) return;
    ojson messages = tr_.history;
    responses_items_to_messages(final_["output"], messages);
    store_->put(StoredResponse{ctx_->id, status, final_.dump(), std::move(messages), false, {}});
  }
  const std::string& item_id(size_t i) {
    static const char* kPrefix[] = {"rs_", "msg_", "fc_"};
    while (item_ids_.size() <= i) {
      BlockKind k = blocks_.blocks()[item_ids_.size()].kind;
      item_ids_.push_back(kPrefix[static_cast<int>(k)] + random_hex(32));
    }
    return item_ids_[i];
  }
  ojson part_json(const OutputBlock& b, bool done) const {
    if (b.kind == BlockKind::Reasoning) return {{"type", "reasoning_text"}, {"text", done ? b.text : ""}};
    return {{"type", "output_text"}, {"text", done ? b.text : ""}, {"annotations", ojson::array()},
            {"logprobs", ojson::array()}};
  }
  ojson item_json(size_t i, bool done) {
    const OutputBlock& b = blocks_.blocks()[i];
    const char* status = done ? "completed" : "in_progress";
    switch (b.kind) {
      case BlockKind::Reasoning: {
        ojson it = {{"id", item_id(i)}, {"type", "reasoning"}, {"summary", ojson::array()},
                    {"content", done ? ojson::array({part_json(b, true)}) : ojson::array()}};
        if (tr_.include_encrypted_reasoning) it["encrypted_content"] = done ? base64_encode(b.text) : "";
        it["status"] = status;
        return it;
      }
      case BlockKind::Text:
        return {{"id", item_id(i)}, {"type", "message"}, {"role", "assistant"}, {"status", status},
                {"content", done ? ojson::array({part_json(b, true)}) : ojson::array()}};
      case BlockKind::ToolCall:
        return {{"id", item_id(i)}, {"type", "function_call"}, {"call_id", b.tool_id}, {"name", b.tool_name},
                {"arguments", done ? b.text : ""}, {"status", status}};
    }
    return {};
  }
  ojson response_json(const std::string& status, bool with_output = false) {
    ojson r = {{"id", ctx_->id}, {"object", "response"}, {"created_at", ctx_->created}, {"status", status},
               {"background", false}, {"error", nullptr}, {"incomplete_details", nullptr}, {"model", ctx_->model}};
    for (auto& [k, v] : tr_.response_fields.items()) r[k] = v;
    ojson output = ojson::array();
    if (with_output)
      for (size_t i = 0; i < blocks_.blocks().size(); ++i) output.push_back(item_json(i, true));
    r["output"] = std::move(output);
    if (with_output) {
      r["usage"] = {{"input_tokens", prompt_tokens_},
                    {"input_tokens_details", {{"cached_tokens", cached_}}},
                    {"output_tokens", generated_},
                    {"output_tokens_details", {{"reasoning_tokens", blocks_.reasoning_tokens()}}},
                    {"total_tokens", prompt_tokens_ + generated_}};
    } else {
      r["usage"] = nullptr;
    }
    return r;
  }
  void emit(const char* type, ojson fields) {
    ojson ev = {{"type", type}, {"sequence_number", seq_++}};
    for (auto& [k, v] : fields.items()) ev[k] = std::move(v);
    append_sse_event(*out_, type, ev.dump());
  }
  ojson where(int index) { return {{"item_id", item_id(index)}, {"output_index", index}}; }
  void block_start(int index, const OutputBlock& b) override {
    emit("response.output_item.added", {{"output_index", index}, {"item", item_json(index, false)}});
    if (b.kind == BlockKind::ToolCall) return;
    ojson f = where(index);
    f["content_index"] = 0;
    f["part"] = part_json(b, false);
    emit("response.content_part.added", std::move(f));
  }
  void block_delta(int index, const OutputBlock& b, std::string_view piece) override {
    ojson f = where(index);
    if (b.kind != BlockKind::ToolCall) f["content_index"] = 0;
    f["delta"] = piece;
    if (b.kind == BlockKind::Text) f["logprobs"] = ojson::array();
    emit(b.kind == BlockKind::Reasoning ? "response.reasoning_text.delta"
         : b.kind == BlockKind::Text    ? "response.output_text.delta"
                                        : "response.function_call_arguments.delta",
         std::move(f));
  }
  void block_stop(int index, const OutputBlock& b) override {
    ojson f = where(index);
    if (b.kind == BlockKind::ToolCall) {
      f["name"] = b.tool_name;
      f["arguments"] = b.text;
      emit("response.function_call_arguments.done", std::move(f));
    } else {
      f["content_index"] = 0;
      f["text"] = b.text;
      if (b.kind == BlockKind::Text) f["logprobs"] = ojson::array();
      emit(b.kind == BlockKind::Reasoning ? "response.reasoning_text.done" : "response.output_text.done", f);
      f.erase("text");
      f.erase("logprobs");
      f["part"] = part_json(b, true);
      emit("response.content_part.done", std::move(f));
    }
    emit("response.output_item.done", {{"output_index", index}, {"item", item_json(index, true)}});
  }

  ResponsesTranslation tr_;
  ResponseStore* store_;
  BlockAssembler blocks_;
  const ResponseContext* ctx_ = nullptr;
  std::string* out_ = nullptr;
  bool started_ = false;
  int seq_ = 0;
  int64_t prompt_tokens_ = 0, cached_ = 0, generated_ = 0;
  std::vector<std::string> item_ids_;
  ojson final_;
};

}  // namespace

void ResponsesApi::create(OpenAIService& svc, const HttpRequest& http, std::shared_ptr<ResponseSink> sink) {
  auto arrival = std::chrono::steady_clock::now();
  ojson body = parse_json_body(http.body);
  ojson previous;
  if (body.is_object()) {
    if (const ojson* p = opt_field(body, "previous_response_id")) {
      if (!p->is_string()) throw bad_request("previous_response_id: Input should be a valid string", "previous_response_id");
      auto stored = store_.get(p->get<std::string>());
      if (!stored)
        throw not_found(fmt::format("Previous response with id '{}' not found.", p->get<std::string>()),
                        "previous_response_id");
      if (stored->status == "in_progress")
        throw bad_request(fmt::format("Previous response '{}' is still in progress.", stored->id), "previous_response_id");
      previous = std::move(stored->messages);
    }
  }
  ResponsesTranslation tr = translate_responses_request(body, previous);
  GenRequest r = parse_chat_request(tr.chat_body, svc.limits());
  ojson chat_body = tr.chat_body;
  auto fmt = std::make_unique<ResponsesFormatter>(std::move(tr), &store_);
  svc.run_generation(http, std::move(sink), chat_body, std::move(r), std::move(fmt), arrival);
}

void ResponsesApi::handle(OpenAIService& svc, const std::string& path, const HttpRequest& http,
                          std::shared_ptr<ResponseSink> sink) {
  auto method_not_allowed = [&] { sink->send(405, kJson, "{\"detail\":\"Method Not Allowed\"}"); };
  try {
    if (path == "/v1/responses") {
      if (http.method != "POST") return method_not_allowed();
      return create(svc, http, sink);
    }
    std::string rest = path.substr(std::string("/v1/responses/").size());
    bool cancel = rest.size() > 7 && rest.compare(rest.size() - 7, 7, "/cancel") == 0;
    std::string id = cancel ? rest.substr(0, rest.size() - 7) : rest;
    if (id.empty() || id.find('/') != std::string::npos) {
      sink->send(404, kJson, "{\"detail\":\"Not Found\"}");
      return;
    }
    auto missing = [&] { return not_found(fmt::format("Response with id '{}' not found.", id), "response_id"); };
    if (cancel) {
      if (http.method != "POST") return method_not_allowed();
      auto stored = store_.get(id);
      if (!stored) throw missing();
      if (!store_.cancel(id))
        throw bad_request(fmt::format("Response '{}' is {}: only an in-progress response can be cancelled.", id,
                                      stored->status));
      // The stored Response echoes request fields (tools, text.format, metadata) at the depth
      // they had in the request body, so the body's nesting limit holds for it too.
      ojson r = parse_json_bounded<ojson>(stored->json, "stored response");
      r["status"] = "cancelled";
      sink->send(200, kJson, r.dump());
    } else if (http.method == "GET") {
      if (http.target.find("stream=true") != std::string::npos)
        throw bad_request("stream=true: streaming a stored response is not supported", "stream");
      auto stored = store_.get(id);
      if (!stored) throw missing();
      sink->send(200, kJson, stored->json);
    } else if (http.method == "DELETE") {
      if (!store_.erase(id)) throw missing();
      sink->send(200, kJson, "{\"id\":" + json_string(id) + ",\"object\":\"response\",\"deleted\":true}");
    } else {
      method_not_allowed();
    }
  } catch (const ApiError& e) {
    sink->send(e.status, kJson, error_body(e));
  } catch (const Error& e) {
    sink->send(400, kJson, error_body(400, "BadRequestError", e.what()));
  } catch (const std::exception& e) {
    sink->send(500, kJson, error_body(500, "InternalServerError", e.what()));
  }
}

}  // namespace moeserve::server
