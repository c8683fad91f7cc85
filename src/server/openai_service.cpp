#include "server/openai_service.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <mutex>

#include "core/error.h"
#include "core/log.h"
#include "server/anthropic_api.h"
#include "server/api_formatter.h"
#include "server/request_fields.h"
#include "server/response.h"
#include "server/responses_api.h"
#include "server/tokenize_request.h"
#include "server/web_ui.h"

namespace moeserve::server {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kJson = "application/json";

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Compares all of both strings whatever they hold (no early exit, no branch on the bytes),
// so the time taken says nothing about where a guessed key differs.
bool const_time_equal(const std::string& a, const std::string& b) {
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() != b.size();
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | (x ^ y);
  }
  return diff == 0;
}

ChatRenderInputs chat_render_inputs(const GenRequest& r) {
  ChatRenderInputs in;
  in.messages = r.messages;
  in.tools = r.tools;
  in.add_generation_prompt = r.add_generation_prompt;
  in.continue_final_message = r.continue_final_message;
  in.extra = r.chat_template_kwargs;
  // vLLM passes `documents` to the template; chat_template_kwargs override it.
  if (!r.documents.is_null() && !in.extra.contains("documents")) in.extra["documents"] = r.documents;
  return in;
}

// The chat/completions wire format (response.h).
class OpenAIFormatter final : public ApiFormatter {
 public:
  explicit OpenAIFormatter(const GenRequest& r) : chat_(r.chat), stream_(r.stream), echo_(r.echo),
                                                  include_usage_(r.include_usage) {}
  std::string id_prefix() const override { return chat_ ? "chatcmpl-" : "cmpl-"; }
  void begin(const GenStart& s) override {
    ctx_ = s.ctx;
    echo_text_ = s.echo_text;
    n_ = s.n;
    size_t total = s.prompt_ids->size() * static_cast<size_t>(s.n);
    started_.assign(total, false);
    text_offset_.assign(total, 0);
  }
  void on_delta(std::string& out, int index, const ChoiceDelta& d, const RequestOutput& ro,
                const Usage* u) override {
    if (!stream_) return;
    if (!started_[index]) {
      started_[index] = true;
      const std::string& echo = (*echo_text_)[index / n_];
      if (chat_) append_chat_role_chunk(out, *ctx_, index, u);
      if (echo_ && !echo.empty()) {  // chat: the echoed last message
        ChoiceDelta e;
        e.text = echo;
        append_delta_chunk(out, *ctx_, index, e, text_offset_[index], u);
      }
    }
    if (d.empty() && d.logprobs.empty()) return;
    if (d.finished && d.finish_reason == "error")
      append_error_chunk(out, 500, "InternalServerError", ro.error.empty() ? "generation failed" : ro.error);
    else
      append_delta_chunk(out, *ctx_, index, d, text_offset_[index], u);
  }
  void on_stream_end(std::string& out, const Usage& u) override {
    if (include_usage_) append_usage_chunk(out, *ctx_, u);
    out += kSseDone;
  }
  std::string response_body(const std::vector<const OutputProcessor*>& procs, const Usage& u) override {
    std::vector<std::string> echo;
    if (echo_)
      for (size_t k = 0; k < procs.size(); ++k) echo.push_back((*echo_text_)[k / n_]);
    if (chat_) return chat_response_json(*ctx_, procs, u, echo);
    return completion_response_json(*ctx_, procs, echo, u);
  }
  std::string error_json(int status, const std::string& type, const std::string& message) const override {
    return error_body(status, type, message);
  }

 private:
  bool chat_, stream_, echo_, include_usage_;
  const ResponseContext* ctx_ = nullptr;
  const std::vector<std::string>* echo_text_ = nullptr;
  int n_ = 1;
  std::vector<bool> started_;
  std::vector<int64_t> text_offset_;  // completions logprobs' running character offset
};

// The state of one generation API request (n choices, maybe several prompts). Lives until
// every choice has finished and the response is written. The wire format is the formatter's.
struct GenCall : std::enable_shared_from_this<GenCall> {
  struct Choice {
    std::string engine_id;
    std::unique_ptr<OutputProcessor> proc;
    int prompt_index = 0;
    bool submitted = false;
    bool done = false;
    Clock::time_point last_token{};
    double ttft = -1;
    std::string error;  // the engine's message when it failed this choice
  };

  OpenAIService& svc;
  std::shared_ptr<ResponseSink> sink;
  GenRequest req;
  std::unique_ptr<ApiFormatter> fmt;
  ResponseContext ctx;
  Clock::time_point arrival;
  std::vector<Choice> choices;
  std::vector<std::vector<int32_t>> prompt_ids;
  std::vector<std::string> echo_text;  // per prompt
  int num_done = 0;
  bool finished = false;
  bool cancelled = false;

  std::mutex mu;  // guards `queue` and `posted` (engine thread vs strand)
  std::deque<std::pair<int, RequestOutput>> queue;
  bool posted = false;
  Clock::time_point last_write{};  // streaming: the last bytes written

  GenCall(OpenAIService& s, std::shared_ptr<ResponseSink> k) : svc(s), sink(std::move(k)) {
    svc.active_counter()++;
  }
  ~GenCall() { svc.active_counter()--; }

  Usage usage() const {
    Usage u;
    for (auto& p : prompt_ids) u.prompt_tokens += static_cast<int64_t>(p.size());
    for (auto& c : choices) u.completion_tokens += c.proc->num_generated_tokens();
    return u;
  }

  // Engine thread: queue and post; nothing else.
  void deliver(int index, RequestOutput&& out) {
    bool need_post;
    {
      std::lock_guard lk(mu);
      queue.emplace_back(index, std::move(out));
      need_post = !posted;
      posted = true;
    }
    if (need_post) sink->post([self = shared_from_this()] { self->drain(); });
  }

  void abort_engine_requests() {  // strand
    for (auto& c : choices)
      if (c.submitted && !c.done) svc.engine().abort(c.engine_id);
    // A drain paused by backpressure resumes to consume the aborts.
    sink->post([self = shared_from_this()] { self->drain(); });
  }

  void cancel() {  // client went away
    cancelled = true;
    fmt->on_cancel();
    abort_engine_requests();
  }

  // Strand: every `every`, an idle stream gets the formatter's keep-alive bytes.
  void schedule_keepalive(std::chrono::milliseconds every) {
    sink->post_after(every, [weak = weak_from_this(), every] {
      auto self = weak.lock();
      if (!self || self->finished || self->cancelled || self->sink->disconnected()) return;
      if (Clock::now() - self->last_write >= every) {
        std::string out;
        self->fmt->keepalive(out);
        if (!out.empty()) {
          self->sink->stream_write(std::move(out));
          self->last_write = Clock::now();
        }
      }
      self->schedule_keepalive(every);
    });
  }

  void drain() {
    if (req.stream && !cancelled && sink->backlogged()) {
      // The client is not reading: keep the outputs (token ids, not SSE text) queued until the
      // socket drains; `posted` stays set, so deliveries do not post further drains. The
      // server's write timeout closes a connection that never drains (cancel() then runs).
      sink->on_drained([self = shared_from_this()] { self->drain(); });
      return;
    }
    std::deque<std::pair<int, RequestOutput>> batch;
    {
      std::lock_guard lk(mu);
      batch.swap(queue);
      posted = false;
    }
    std::string out;
    Usage running;
    bool continuous = req.stream && req.continuous_usage_stats;
    for (auto& [index, ro] : batch) {
      Choice& c = choices[index];
      if (c.done) continue;
      auto now = Clock::now();
      if (!ro.new_token_ids.empty()) {
        if (c.ttft < 0) {
          c.ttft = seconds(now - arrival);
          svc.metrics().observe_ttft(c.ttft);
        } else {
          // A speculative step delivers several tokens at once: the interval is split over them.
          svc.metrics().observe_itl(seconds(now - c.last_token), int(ro.new_token_ids.size()));
        }
        c.last_token = now;
      }
      ChoiceDelta d = c.proc->process(ro);
      if (c.proc->stop_matched() && !ro.finished) svc.engine().abort(c.engine_id);
      if (!cancelled) {
        if (continuous) running = usage();
        fmt->on_delta(out, index, d, ro, continuous ? &running : nullptr);
      }
      if (d.finished) finish_choice(c, ro);
    }
    if (req.stream && !out.empty()) {
      sink->stream_write(std::move(out));
      last_write = Clock::now();
    }
    if (num_done == static_cast<int>(choices.size()) && !finished) complete();
  }

  void finish_choice(Choice& c, const RequestOutput& ro) {
    c.done = true;
    c.error = ro.error;
    ++num_done;
    FinishedRequestStats st;
    st.finished_reason = c.proc->finish_reason();
    st.prompt_tokens = ro.num_prompt_tokens > 0 ? ro.num_prompt_tokens
                                                : static_cast<int>(prompt_ids[c.prompt_index].size());
    st.generation_tokens = c.proc->num_generated_tokens();
    st.e2e_seconds = seconds(Clock::now() - arrival);
    st.ttft_seconds = c.ttft;
    set_phase_times(st, ro);
    svc.metrics().observe_finished(st);
  }

  void complete() {
    finished = true;
    int max_gen = 0;
    for (auto& c : choices) max_gen = std::max(max_gen, c.proc->num_generated_tokens());
    svc.metrics().observe_request_params(req.n, static_cast<int>(req.max_tokens.value_or(0)), max_gen);
    if (cancelled || sink->disconnected()) return;
    Usage u = usage();
    if (req.stream) {
      std::string out;
      fmt->on_stream_end(out, u);
      sink->stream_write(std::move(out));
      sink->end_stream();
      return;
    }
    for (auto& c : choices) {
      if (c.proc->finish_reason() == "error") {
        // The engine's reason (e.g. the sampler's "no token can be sampled ..."), as vLLM's
        // GenerationError is a 500.
        sink->send(fmt->error_status(500), kJson,
                   fmt->error_json(500, "InternalServerError", c.error.empty() ? "generation failed" : c.error));
        return;
      }
    }
    std::vector<const OutputProcessor*> procs;
    for (auto& c : choices) procs.push_back(c.proc.get());
    try {
      sink->send(200, kJson, fmt->response_body(procs, u));
    } catch (const ApiError& e) {  // a finish the API reports as an error (e.g. abort)
      sink->send(fmt->error_status(e.status), kJson, fmt->error_json(e.status, e.type, e.what()));
    }
  }
};

}  // namespace

OpenAIService::OpenAIService(ServiceConfig cfg, Engine& engine, const Frontend& frontend, Metrics& metrics)
    : cfg_(std::move(cfg)),
      engine_(engine),
      frontend_(frontend),
      metrics_(metrics),
      prep_(PrepPoolConfig{cfg_.prep_threads, cfg_.max_body_bytes * size_t(std::max(1, cfg_.prep_queue_bodies)), 4096}) {
  MS_CHECK(!cfg_.served_model_names.empty(), "no served model name");
  limits_.max_logprobs = cfg_.max_logprobs;
  limits_.auto_tool_choice_enabled = cfg_.enable_auto_tool_choice && !cfg_.tool_parser.empty();
  created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  responses_ = std::make_unique<ResponsesApi>();
}

OpenAIService::~OpenAIService() = default;

const StructuredContext& OpenAIService::structured_context() {
  std::call_once(structured_once_, [&] {
    std::vector<std::string> bytes;
    std::vector<bool> special;
    if (frontend_.token_bytes(bytes, special))
      structured_ctx_.vocab = make_token_vocab(std::move(bytes), std::move(special), engine_.config().eos_token_ids,
                                               std::max(engine_.executor_info().vocab_size, frontend_.vocab_size()));
    structured_ctx_.cache = &grammar_cache_;
    structured_ctx_.tool_parser = cfg_.tool_parser;
    // With a reasoning parser the constraint starts after the reasoning section ends (vLLM):
    // at the "</think>" token, when the tokenizer has it as one token.
    if (int32_t end = reasoning_markers().end_token; end >= 0) structured_ctx_.start_after = {end};
  });
  return structured_ctx_;
}

const SamplingParams::ThinkingBudget& OpenAIService::reasoning_markers() {
  std::call_once(reasoning_markers_once_, [&] {
    if (cfg_.reasoning_parser.empty()) return;
    // Each marker only when the tokenizer has it as one token (-1 otherwise).
    std::vector<int32_t> start = frontend_.encode("<think>", false), end = frontend_.encode("</think>", false);
    if (start.size() == 1) reasoning_markers_.start_token = start[0];
    if (end.size() == 1) reasoning_markers_.end_token = end[0];
  });
  return reasoning_markers_;
}

void OpenAIService::check_model(const std::string& model) const {
  if (model.empty()) return;
  for (auto& n : cfg_.served_model_names)
    if (n == model) return;
  throw not_found(fmt::format("The model `{}` does not exist.", model), "model");
}

std::string OpenAIService::models_json() const {
  std::string out = "{\"object\":\"list\",\"data\":[";
  for (size_t i = 0; i < cfg_.served_model_names.size(); ++i) {
    if (i) out += ",";
    out += "{\"id\":" + json_string(cfg_.served_model_names[i]) + ",\"object\":\"model\",\"created\":" +
           // "vllm", not "moeserve": clients (routers, IDE agents) detect a vLLM server by
           // owned_by == "vllm" and then read max_model_len.
           std::to_string(created_) + ",\"owned_by\":\"vllm\",\"root\":" + json_string(cfg_.model_root) +
           ",\"parent\":null,\"max_model_len\":" + std::to_string(cfg_.max_model_len) + ",\"permission\":[]}";
  }
  return out + "]}";
}

void OpenAIService::handle(HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
  std::string path = req.target.substr(0, req.target.find('?'));
  if (path.size() > 1 && path.back() == '/') path.pop_back();  // /metrics/ == /metrics
  if (cfg_.enable_request_id_headers) {
    // vLLM's middleware: the client's X-Request-Id, else a fresh one, on every response.
    std::string rid = req.header("x-request-id");
    sink->add_header("x-request-id", rid.empty() ? random_hex(32) : rid);
  }
  const bool anthropic = path == "/v1/messages" || path == "/v1/messages/count_tokens";
  if (!cfg_.api_key.empty() && path.rfind("/v1", 0) == 0 && req.method != "OPTIONS") {
    // Exactly "Bearer KEY" as sent (no whitespace trimmed after the key, no case folding), or
    // the key alone in x-api-key (Anthropic clients).
    auto auth = req.raw_header("authorization");
    auto x_api_key = req.raw_header("x-api-key");
    if (!(auth && const_time_equal(*auth, "Bearer " + cfg_.api_key)) &&
        !(x_api_key && const_time_equal(*x_api_key, cfg_.api_key))) {
      sink->send(401, kJson, anthropic ? anthropic_error_body(401, "invalid x-api-key") : "{\"error\":\"Unauthorized\"}");
      return;
    }
  }
  if (req.method == "POST" && path != "/ping") {
    const size_t bytes = req.body.size();
    auto shared = std::make_shared<HttpRequest>(std::move(req));
    bool queued = prep_.submit(bytes, sink, [this, shared, path](std::shared_ptr<ResponseSink> s) {
      route(*shared, path, std::move(s));
    });
    if (!queued) {
      sink->add_header("retry-after", "1");
      sink->send(503, kJson,
                 error_body(503, "ServiceUnavailableError",
                            "The server is overloaded: too many request bodies are waiting to be prepared. Retry later."));
    }
    return;
  }
  route(req, path, sink);
}

void OpenAIService::route(const HttpRequest& req, const std::string& path, std::shared_ptr<ResponseSink> sink) {
  bool is_get = req.method == "GET" || req.method == "HEAD";
  bool is_post = req.method == "POST";
  const bool anthropic = path == "/v1/messages" || path == "/v1/messages/count_tokens";
  // The client's X-Request-Id names an internal error in the log (the engine id is not known yet).
  const std::string rid = req.header("x-request-id").empty() ? "(none sent)" : req.header("x-request-id");
  try {
    auto method_not_allowed = [&] { sink->send(405, kJson, "{\"detail\":\"Method Not Allowed\"}"); };
    if (path == "/health" || path == "/ping") {
      if (!is_get && !(is_post && path == "/ping")) return method_not_allowed();
      sink->send(draining_ ? 503 : 200, kJson, "");
    } else if (path == "/" && cfg_.web_ui) {
      // The chat page (web_ui.h): no API key needed for the page itself, only for /v1.
      if (!is_get) return method_not_allowed();
      sink->add_header("Content-Security-Policy", kWebUiCsp);
      sink->add_header("X-Content-Type-Options", "nosniff");
      sink->add_header("Cache-Control", "no-cache");
      sink->send(200, "text/html; charset=utf-8", std::string(web_ui_page()));
    } else if (path == "/version") {
      if (!is_get) return method_not_allowed();
      sink->send(200, kJson, "{\"version\":" + json_string(cfg_.version) + "}");
    } else if (path == "/v1/models") {
      if (!is_get) return method_not_allowed();
      sink->send(200, kJson, models_json());
    } else if (path == "/metrics") {
      if (!is_get) return method_not_allowed();
      sink->send(200, "text/plain; version=0.0.4; charset=utf-8", metrics_.render(engine_.stats()));
    } else if (path == "/tokenize") {
      if (!is_post) return method_not_allowed();
      tokenize(req, *sink);
    } else if (path == "/detokenize") {
      if (!is_post) return method_not_allowed();
      detokenize(req, *sink);
    } else if (path == "/v1/chat/completions" || path == "/v1/completions") {
      if (!is_post) return method_not_allowed();
      generate(req, sink, path == "/v1/chat/completions");
    } else if (anthropic) {
      handle_anthropic(*this, path, req, sink);
    } else if (path == "/v1/responses" || path.rfind("/v1/responses/", 0) == 0) {
      responses_->handle(*this, path, req, sink);
    } else {
      sink->send(404, kJson, "{\"detail\":\"Not Found\"}");
    }
  } catch (const ApiError& e) {
    sink->send(e.status, kJson, error_body(e));
  } catch (const Error& e) {
    // Template errors and invalid requests rejected by the engine.
    sink->send(400, kJson, error_body(400, "BadRequestError", e.what()));
  } catch (const std::exception& e) {
    // Bad input never gets here (every field is validated, request_fields.h): this is a
    // fault of the server, logged with the request id so it can be found.
    spdlog::error("internal error on {} {} (request id {}): {}", req.method, path, rid, e.what());
    sink->send(500, kJson, error_body(500, "InternalServerError", "internal server error (request id " + rid + ")"));
  }
}

void OpenAIService::generate(const HttpRequest& http, std::shared_ptr<ResponseSink> sink, bool chat) {
  auto arrival = Clock::now();
  if (draining_) throw ApiError(503, "ServiceUnavailableError", "The server is shutting down.");
  ojson body = parse_json_body(http.body);
  GenRequest r = chat ? parse_chat_request(body, limits_) : parse_completion_request(body, limits_);
  // --enable-force-include-usage: every stream ends with a usage chunk, as if asked for.
  if (cfg_.force_include_usage && r.stream) r.include_usage = true;
  auto fmt = std::make_unique<OpenAIFormatter>(r);
  run_generation(http, std::move(sink), body, std::move(r), std::move(fmt), arrival);
}

std::vector<int32_t> OpenAIService::render_chat_prompt(const GenRequest& r, const ojson& body) const {
  bool add_special = body.is_object() && body.contains("add_special_tokens") && body["add_special_tokens"].is_boolean() &&
                     body["add_special_tokens"].get<bool>();
  return frontend_.encode(frontend_.render_chat(chat_render_inputs(r)), add_special);
}

void OpenAIService::run_generation(const HttpRequest& http, std::shared_ptr<ResponseSink> sink, const ojson& body,
                                   GenRequest&& request, std::unique_ptr<ApiFormatter> fmt,
                                   std::chrono::steady_clock::time_point arrival) {
  if (draining_) throw ApiError(503, "ServiceUnavailableError", "The server is shutting down.");
  auto call = std::make_shared<GenCall>(*this, sink);
  call->arrival = arrival;
  call->fmt = std::move(fmt);
  GenRequest& r = call->req;
  r = std::move(request);
  const bool chat = r.chat;
  check_model(r.model);
  const int vocab_size = engine_.executor_info().vocab_size > 0 ? engine_.executor_info().vocab_size
                                                                 : frontend_.vocab_size();
  check_token_ids(r, vocab_size);
  // Text prompt -> ids with truncate_prompt_tokens applied (special tokens the tokenizer adds
  // around the text are kept, as HF's truncation keeps them).
  auto encode_prompt = [&](const std::string& text, bool add_special) {
    std::vector<int32_t> ids = frontend_.encode(text, add_special);
    if (!r.truncate_prompt_tokens) return ids;
    size_t prefix = 0, suffix = 0;
    if (add_special) {
      const std::vector<int32_t> plain = frontend_.encode(text, false);
      if (plain.size() <= ids.size()) {
        while (prefix < plain.size() && prefix < ids.size() - plain.size() && ids[prefix] != plain[0]) ++prefix;
        if (std::equal(plain.begin(), plain.end(), ids.begin() + prefix)) suffix = ids.size() - plain.size() - prefix;
        else prefix = 0;
      }
    }
    truncate_prompt(ids, *r.truncate_prompt_tokens, cfg_.max_model_len, prefix, suffix);
    return ids;
  };

  // Prompts -> token ids.
  bool reasoning_ended = false;
  if (chat) {
    bool add_special = get_bool(body, "add_special_tokens").value_or(false);
    const std::string prompt_text = frontend_.render_chat(chat_render_inputs(r));
    call->prompt_ids.push_back(encode_prompt(prompt_text, add_special));
    // Some families' templates end the reasoning section in the prompt (Qwen3 with
    // enable_thinking false): the whole output is then content.
    if (!cfg_.reasoning_parser.empty())
      reasoning_ended = reasoning_ended_by_prompt(cfg_.reasoning_parser, {prompt_text, &r.chat_template_kwargs});
    // vLLM's chat echo: the last message's content is prepended to the reply when it has the
    // reply's role (assistant with add_generation_prompt, else the last message's own role).
    std::string echo;
    if (r.echo && !r.messages.empty()) {
      const ojson& last = r.messages.back();
      const std::string role = r.add_generation_prompt ? "assistant" : last["role"].get<std::string>();
      if (last["role"] == role && last.contains("content") && last["content"].is_string())
        echo = last["content"].get<std::string>();
    }
    call->echo_text.push_back(std::move(echo));
  } else {
    int vocab = frontend_.vocab_size();
    for (auto& p : r.prompts) {
      if (p.text) {
        call->prompt_ids.push_back(encode_prompt(*p.text, r.add_special_tokens));
        call->echo_text.push_back(r.echo ? *p.text : std::string());
      } else {
        for (int32_t id : p.ids)
          if (vocab > 0 && id >= vocab) throw bad_request(fmt::format("Token id {} is out of vocabulary", id), "prompt");
        call->prompt_ids.push_back(p.ids);
        if (r.truncate_prompt_tokens) truncate_prompt(call->prompt_ids.back(), *r.truncate_prompt_tokens, cfg_.max_model_len);
        call->echo_text.push_back(r.echo ? frontend_.decode(call->prompt_ids.back(), r.skip_special_tokens)
                                         : std::string());
      }
    }
  }
  for (auto& ids : call->prompt_ids)
    if (ids.empty()) throw bad_request("The decoder prompt cannot be empty", "prompt");

  // Structured outputs / forced tool calls: compiled (or taken from the cache) before anything
  // is submitted, so an invalid schema, regex or grammar is a 400.
  // The constraint waits for the end of the reasoning, unless the prompt already ended it.
  StructuredContext sctx = structured_context();
  if (reasoning_ended) sctx.start_after.clear();
  auto constraint = make_structured_constraint(r, sctx);

  // Validate every prompt before submitting anything.
  const std::vector<std::vector<int32_t>> bad_words =
      bad_words_token_ids(r.bad_words, [&](const std::string& w) { return frontend_.encode(w, false); }, vocab_size);
  SamplingParams::ThinkingBudget thinking;
  if (r.thinking_token_budget) {
    thinking = reasoning_markers();
    if (thinking.start_token < 0 || thinking.end_token < 0)
      throw bad_request(cfg_.reasoning_parser.empty()
                            ? "a thinking budget (thinking_token_budget, Anthropic's thinking, reasoning effort \"none\") needs a "
                              "reasoning parser: start the server with --reasoning-parser"
                            : "thinking_token_budget needs the reasoning markers <think> and </think> to be single "
                              "tokens of this model's tokenizer",
                        "thinking_token_budget");
    thinking.max_tokens = static_cast<int>(std::min<int64_t>(*r.thinking_token_budget, INT32_MAX));
  }
  std::vector<std::vector<SamplingParams>> params(call->prompt_ids.size());
  for (size_t p = 0; p < call->prompt_ids.size(); ++p)
    for (int i = 0; i < r.n; ++i) {
      params[p].push_back(make_sampling_params(r, cfg_.defaults, static_cast<int>(call->prompt_ids[p].size()),
                                               cfg_.max_model_len, i));
      params[p].back().structured = constraint;
      params[p].back().bad_words_token_ids = bad_words;
      params[p].back().thinking = thinking;
    }

  ResponseContext& ctx = call->ctx;
  // As vLLM: the X-Request-Id header, else the body's `request_id`, else a random id. Engine
  // ids get a random suffix, so a client reusing an id cannot collide with a live request.
  std::string base_id = http.header("x-request-id");
  if (base_id.empty()) base_id = get_str(body, "request_id").value_or("");
  const bool client_id = !base_id.empty();
  ctx.id = call->fmt->id_prefix() + (client_id ? base_id : random_hex(32));
  ctx.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  ctx.model = r.model.empty() ? cfg_.served_model_names[0] : r.model;
  ctx.chat = chat;
  ctx.frontend = &frontend_;
  ctx.tokens_as_ids = r.return_tokens_as_token_ids;
  ctx.init_prefix();

  ChoiceSettings cs;
  cs.stop = r.stop;
  cs.stop_token_ids = r.stop_token_ids;
  cs.include_stop_str_in_output = r.include_stop_str_in_output;
  cs.skip_special_tokens = r.skip_special_tokens;
  cs.num_logprobs = r.num_logprobs;
  cs.prompt_logprobs = r.prompt_logprobs.has_value();
  cs.min_tokens = r.min_tokens;
  cs.include_reasoning = r.include_reasoning;
  if (chat) {
    cs.reasoning_parser = cfg_.reasoning_parser;
    cs.reasoning_ended_by_prompt = reasoning_ended;
    // tool_choice none: tools are rendered but never parsed. required/named: the output is
    // constrained to the tool parser family's call syntax (make_structured_constraint).
    if (r.tool_choice != ToolChoice::None && !cfg_.tool_parser.empty()) {
      cs.tool_parser = cfg_.tool_parser;
      cs.tools = r.tools;
    }
  }
  size_t total = call->prompt_ids.size() * r.n;
  call->choices.resize(total);
  for (size_t k = 0; k < total; ++k) {
    auto& c = call->choices[k];
    c.prompt_index = static_cast<int>(k / r.n);
    c.engine_id = client_id ? fmt::format("{}-{}-{}", ctx.id, k, random_hex(8)) : fmt::format("{}-{}", ctx.id, k);
    c.proc = std::make_unique<OutputProcessor>(frontend_, cs);
  }

  GenStart start;
  start.ctx = &ctx;
  start.prompt_ids = &call->prompt_ids;
  start.echo_text = &call->echo_text;
  start.n = r.n;
  start.abort = [weak = std::weak_ptr<GenCall>(call), sink] {
    sink->post([weak] {
      if (auto c = weak.lock()) c->abort_engine_requests();
    });
  };
  call->fmt->begin(start);

  // From here on the response belongs to the call; a disconnect aborts its engine requests.
  sink->on_disconnect([call] { call->cancel(); });
  for (size_t k = 0; k < total; ++k) {
    auto& c = call->choices[k];
    Request er;
    er.id = c.engine_id;
    er.prompt_ids = call->prompt_ids[c.prompt_index];
    er.params = params[c.prompt_index][k % r.n];
    er.prefix_cache_root = prefix_cache_root(r.cache_salt);
    er.arrival = arrival;
    int index = static_cast<int>(k);
    // Engine thread: hold the call alive until its last delivery is queued.
    er.on_output = [call, index](RequestOutput&& out) { call->deliver(index, std::move(out)); };
    bool ok;
    std::string err;
    try {
      ok = engine_.submit(std::move(er));
    } catch (const Error& e) {
      ok = false;
      err = e.what();
    }
    if (!ok) {
      for (size_t j = 0; j < k; ++j) engine_.abort(call->choices[j].engine_id);
      // The already-submitted choices deliver aborts into a call nobody answers from.
      call->cancelled = true;
      call->fmt->on_cancel();
      int status = err.empty() ? 429 : 400;
      std::string type = err.empty() ? "RateLimitError" : "BadRequestError";
      std::string msg = err.empty() ? "The server is overloaded: the engine's waiting queue is full. Retry later." : err;
      sink->send(call->fmt->error_status(status), kJson, call->fmt->error_json(status, type, msg));
      return;
    }
    c.submitted = true;
  }
  // Deliveries are posted to this strand, so none is processed before the headers go out.
  if (r.stream) {
    sink->start_stream("text/event-stream; charset=utf-8");
    call->last_write = Clock::now();
    if (cfg_.stream_keepalive_ms > 0) call->schedule_keepalive(std::chrono::milliseconds(cfg_.stream_keepalive_ms));
  }
}

void OpenAIService::tokenize(const HttpRequest& http, ResponseSink& sink) {
  TokenizeRequest t = parse_tokenize_request(parse_json_body(http.body), ProtocolLimits{cfg_.max_logprobs, true});
  if (t.model) check_model(*t.model);
  const bool return_strs = t.return_token_strs;
  std::vector<int32_t> ids;
  if (t.chat) {
    const GenRequest& r = *t.chat;
    ChatRenderInputs in{r.messages, r.tools, r.add_generation_prompt, r.continue_final_message, r.chat_template_kwargs};
    ids = frontend_.encode(frontend_.render_chat(in), t.add_special_tokens);
  } else {
    ids = frontend_.encode(*t.prompt, t.add_special_tokens);
  }
  std::string out = "{\"count\":" + std::to_string(ids.size()) + ",\"max_model_len\":" +
                    std::to_string(cfg_.max_model_len) + ",\"tokens\":[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  out += "],\"token_strs\":";
  if (return_strs) {
    out += "[";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ",";
      std::string t = frontend_.decode({ids[i]}, false);
      append_json_string(out, valid_utf8(t) ? t : "\xEF\xBF\xBD");
    }
    out += "]";
  } else {
    out += "null";
  }
  sink.send(200, kJson, out + "}");
}

void OpenAIService::detokenize(const HttpRequest& http, ResponseSink& sink) {
  DetokenizeRequest d = parse_detokenize_request(parse_json_body(http.body), frontend_.vocab_size());
  if (d.model) check_model(*d.model);
  const std::vector<int32_t>& ids = d.tokens;
  std::string text = frontend_.decode(ids, false);
  if (!valid_utf8(text)) text = "\xEF\xBF\xBD";
  sink.send(200, kJson, "{\"prompt\":" + json_string(text) + "}");
}

}  // namespace moeserve::server
