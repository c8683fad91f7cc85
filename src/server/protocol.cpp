#include "server/protocol.h"
#include "server/structured_request.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>

#include "core/bounded_json.h"
#include "server/request_fields.h"

namespace moeserve::server {

namespace {

// Field readers (field, get_bool, get_int, get_num, get_str, type_error): server/request_fields.h.

constexpr float kMinTemperature = 0.01f;
constexpr double kMinRepetitionPenalty = 1e-3, kMaxRepetitionPenalty = 1e3;

int clamp_int(int64_t v) { return static_cast<int>(std::clamp<int64_t>(v, INT32_MIN, INT32_MAX)); }

// Python's int(str) for logit_bias keys: optional blanks around, optional sign, decimal
// digits with single underscores between them.
std::optional<int64_t> parse_token_key(const std::string& k) {
  size_t b = 0, e = k.size();
  while (b < e && std::isspace(static_cast<unsigned char>(k[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(k[e - 1]))) --e;
  bool neg = false;
  if (b < e && (k[b] == '+' || k[b] == '-')) neg = k[b++] == '-';
  if (b == e || !std::isdigit(static_cast<unsigned char>(k[b])) || !std::isdigit(static_cast<unsigned char>(k[e - 1])))
    return std::nullopt;
  int64_t v = 0;
  for (size_t i = b; i < e; ++i) {
    if (k[i] == '_' && k[i - 1] != '_') continue;
    if (!std::isdigit(static_cast<unsigned char>(k[i]))) return std::nullopt;
    if (v > (INT64_MAX - 9) / 10) return neg ? INT64_MIN : INT64_MAX;  // out of any vocabulary
    v = v * 10 + (k[i] - '0');
  }
  return neg ? -v : v;
}

// logit_bias, allowed_token_ids, bad_words (vLLM's protocol types and SamplingParams rules).
void parse_logits_processor_fields(const ojson& body, GenRequest& r) {
  if (const ojson* lb = field(body, "logit_bias")) {
    if (!lb->is_object()) type_error("logit_bias", "a valid dictionary", *lb);
    std::map<int64_t, float> bias;  // a repeated id ("5", "05"): the later value wins, as a dict
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string field_name = "logit_bias." + it.key();
      std::optional<int64_t> id = parse_token_key(it.key());
      if (!id)
        throw bad_request(fmt::format("1 validation error: body.logit_bias: key '{}' is not a token id (an integer "
                                      "in a string)",
                                      it.key()),
                          "logit_bias");
      if (!it.value().is_number()) type_error(field_name, "a valid number", it.value());
      const double v = it.value().get<double>();
      if (!std::isfinite(v))
        throw bad_request(fmt::format("1 validation error: body.{}: Input should be a finite number", field_name),
                          "logit_bias");
      bias[*id] = static_cast<float>(std::clamp(v, -100.0, 100.0));  // OpenAI's range, as vLLM clamps
    }
    r.logit_bias.assign(bias.begin(), bias.end());
  }
  if (const ojson* a = field(body, "allowed_token_ids")) {
    if (!a->is_array()) type_error("allowed_token_ids", "a valid list", *a);
    std::vector<int64_t> ids;
    for (auto& e : *a) {
      if (!e.is_number_integer()) type_error("allowed_token_ids", "a list of integers", e);
      ids.push_back(e.is_number_unsigned() && e.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : e.get<int64_t>());
    }
    if (ids.empty()) throw bad_request("allowed_token_ids is not None and empty!", "allowed_token_ids");
    r.allowed_token_ids = std::move(ids);
  }
  if (const ojson* bw = field(body, "bad_words")) {
    if (!bw->is_array()) type_error("bad_words", "a valid list", *bw);
    for (auto& e : *bw) {
      if (!e.is_string()) type_error("bad_words", "a list of strings", e);
      r.bad_words.push_back(e.get<std::string>());
    }
  }
}

// vLLM's check_logprobs for prompt_logprobs, then its max_logprobs check. -1 (the whole
// vocabulary in vLLM) is refused: vLLM itself refuses it unless --max-logprobs >= the
// vocabulary size, which moeserve does not allow.
void check_prompt_logprobs(const ojson& body, GenRequest& r, int max_logprobs) {
  auto pl = get_int(body, "prompt_logprobs");
  if (!pl) return;
  if (r.stream && (*pl > 0 || *pl == -1))
    throw bad_request("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs");
  if (*pl < -1) throw bad_request("`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs");
  if (*pl == -1)
    throw bad_request(fmt::format("prompt_logprobs=-1 (the whole vocabulary) is not supported by moeserve: it exceeds "
                                  "the max allowed {} (--max-logprobs); ask for at most {}",
                                  max_logprobs, max_logprobs),
                      "prompt_logprobs");
  if (*pl > max_logprobs)
    throw bad_request(
        fmt::format("Requested prompt logprobs of {}, which is greater than max allowed: {}", *pl, max_logprobs),
        "prompt_logprobs");
  if (!r.stream) r.prompt_logprobs = static_cast<int>(*pl);
}

[[noreturn]] void not_supported(const std::string& field, const std::string& why) {
  throw bad_request(fmt::format("{} is not supported yet by moeserve: {}", field, why), field);
}

// The audit of vLLM's request fields that moeserve does not implement: each is refused
// (400 naming it) unless it has its default value. Fields vLLM accepts and ignores are not
// listed and stay accepted, as are unknown fields (vLLM logs and ignores them).
void refuse_unimplemented(const ojson& body, bool chat) {
  if (auto b = get_bool(body, "use_beam_search"); b && *b) not_supported("use_beam_search", "beam search is not implemented");
  if (auto b = get_int(body, "best_of"); b && *b > 1)
    not_supported("best_of", "only best_of 1 (n independent samples) is implemented; use n");
  if (const ojson* lp = field(body, "length_penalty"); lp && !lp->is_number())
    type_error("length_penalty", "a valid number", *lp);  // only read by beam search, as in vLLM
  if (auto pr = get_int(body, "priority"); pr && *pr != 0)
    throw bad_request(fmt::format("Got priority {} but Priority scheduling is not enabled.", *pr), "priority");
  if (const ojson* lp = field(body, "logits_processors"); lp && !(lp->is_array() && lp->empty()))
    throw bad_request("The `logits_processors` argument is not supported by this server. See "
                      "--logits-processor-pattern engine argument for more information.",
                      "logits_processors");
  for (const char* dict : {"kv_transfer_params", "vllm_xargs", "mm_processor_kwargs"})
    if (const ojson* v = field(body, dict); v && !v->is_object()) type_error(dict, "a valid dictionary", *v);
  if (chat) {
    if (field(body, "chat_template"))
      throw bad_request("Chat template is passed with request, but --trust-request-chat-template is not set. "
                        "Refused request with untrusted chat template.",
                        "chat_template");
  } else {
    if (field(body, "prompt_embeds")) not_supported("prompt_embeds", "prompts are text or token ids");
  }
}

// Fields shared by chat and completions.
void parse_common(const ojson& body, GenRequest& r, const ProtocolLimits& limits) {
  if (auto m = get_str(body, "model")) r.model = *m;
  r.stream = get_bool(body, "stream").value_or(false);
  if (const ojson* so = field(body, "stream_options")) {
    if (!so->is_object()) type_error("stream_options", "a valid dictionary", *so);
    if (!r.stream) throw bad_request("Stream options can only be defined when `stream=True`.", "stream_options");
    r.include_usage = get_bool(*so, "include_usage", "stream_options").value_or(true);
    r.continuous_usage_stats = get_bool(*so, "continuous_usage_stats", "stream_options").value_or(false);
  }
  if (auto n = get_int(body, "n")) {
    if (*n < 1) throw bad_request(fmt::format("n must be at least 1, got {}.", *n), "n");
    if (*n > 128) throw bad_request(fmt::format("n must be at most 128, got {}.", *n), "n");
    r.n = static_cast<int>(*n);
  }
  auto mct = get_int(body, "max_completion_tokens");
  auto mt = get_int(body, "max_tokens");
  r.max_tokens = mct ? mct : mt;
  if (r.max_tokens && *r.max_tokens < 1)
    throw bad_request(fmt::format("max_tokens must be at least 1, got {}.", *r.max_tokens), "max_tokens");
  if (auto v = get_int(body, "min_tokens")) {
    if (*v < 0) throw bad_request(fmt::format("min_tokens must be greater than or equal to 0, got {}.", *v), "min_tokens");
    if (r.max_tokens && *v > *r.max_tokens)
      throw bad_request(fmt::format("min_tokens must be less than or equal to max_tokens={}, got {}.", *r.max_tokens, *v),
                        "min_tokens");
    r.min_tokens = clamp_int(*v);
  }
  if (auto b = get_int(body, "thinking_token_budget")) {
    if (*b < 0)
      throw bad_request(fmt::format("thinking_token_budget must be greater than or equal to 0, got {}.", *b),
                        "thinking_token_budget");
    r.thinking_token_budget = *b;
  }
  if (auto t = get_num(body, "temperature")) {
    if (*t < 0) throw bad_request(fmt::format("temperature must be non-negative, got {}.", *t), "temperature");
    r.temperature = static_cast<float>(*t);
  }
  if (auto p = get_num(body, "top_p")) {
    if (!(*p > 0 && *p <= 1)) throw bad_request(fmt::format("top_p must be in (0, 1], got {}.", *p), "top_p");
    r.top_p = static_cast<float>(*p);
  }
  if (auto k = get_int(body, "top_k")) {
    if (*k < -1) throw bad_request(fmt::format("top_k must be 0 (disable), or at least 1, got {}.", *k), "top_k");
    r.top_k = *k <= 0 ? 0 : clamp_int(*k);
  }
  if (auto p = get_num(body, "min_p")) {
    if (!(*p >= 0 && *p <= 1)) throw bad_request(fmt::format("min_p must be in [0, 1], got {}.", *p), "min_p");
    r.min_p = static_cast<float>(*p);
  }
  for (const char* pen : {"presence_penalty", "frequency_penalty"}) {
    if (auto p = get_num(body, pen)) {
      if (!(*p >= -2 && *p <= 2)) throw bad_request(fmt::format("{} must be in [-2, 2], got {}.", pen, *p), pen);
      (std::string(pen) == "presence_penalty" ? r.presence_penalty : r.frequency_penalty) = static_cast<float>(*p);
    }
  }
  if (auto p = get_num(body, "repetition_penalty")) {
    if (!(*p > 0)) throw bad_request(fmt::format("repetition_penalty must be greater than zero, got {}.", *p),
                                     "repetition_penalty");
    // vLLM only asks for > 0; a tiny penalty divides a logit into +inf (1e-38 used to crash
    // the sampler), so the range is bounded where l / r and l * r stay finite for any logit
    // a model produces.
    if (*p < kMinRepetitionPenalty || *p > kMaxRepetitionPenalty)
      throw bad_request(fmt::format("repetition_penalty must be in [{}, {}], got {}.", kMinRepetitionPenalty,
                                    kMaxRepetitionPenalty, *p),
                        "repetition_penalty");
    r.repetition_penalty = static_cast<float>(*p);
  }
  r.seed = get_int(body, "seed");
  if (const ojson* s = field(body, "stop")) {
    if (s->is_string()) {
      r.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (auto& e : *s) {
        if (!e.is_string()) type_error("stop", "a valid string or list of strings", e);
        r.stop.push_back(e.get<std::string>());
      }
    } else {
      type_error("stop", "a valid string or list of strings", *s);
    }
    for (auto& st : r.stop)
      if (st.empty()) throw bad_request("stop cannot contain an empty string.", "stop");
  }
  if (const ojson* s = field(body, "stop_token_ids")) {
    if (!s->is_array()) type_error("stop_token_ids", "a valid list", *s);
    for (auto& e : *s) {
      if (!e.is_number_integer()) type_error("stop_token_ids", "a list of integers", e);
      // An id outside int32 can never be generated; dropping it keeps it from wrapping onto
      // a real token (it would then stop, or mask it under min_tokens).
      if (e.is_number_unsigned() ? e.get<uint64_t>() <= uint64_t(INT32_MAX)
                                 : (e.get<int64_t>() >= 0 && e.get<int64_t>() <= INT32_MAX))
        r.stop_token_ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
    }
  }
  r.include_stop_str_in_output = get_bool(body, "include_stop_str_in_output").value_or(false);
  r.skip_special_tokens = get_bool(body, "skip_special_tokens").value_or(true);
  r.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  parse_structured_fields(body, r);  // response_format, structured_outputs, guided_*
  parse_logits_processor_fields(body, r);
  r.spaces_between_special_tokens = get_bool(body, "spaces_between_special_tokens").value_or(true);
  r.return_tokens_as_token_ids = get_bool(body, "return_tokens_as_token_ids").value_or(false);
  if (auto k = get_int(body, "truncate_prompt_tokens")) {
    if (*k < 1 && *k != -1)
      throw bad_request(fmt::format("truncate_prompt_tokens must be at least 1, or -1 (the model's length), got {}.", *k),
                        "truncate_prompt_tokens");
    r.truncate_prompt_tokens = *k;
  }
  if (const ojson* cs = field(body, "cache_salt")) {
    if (!cs->is_string() || cs->get<std::string>().empty())
      throw bad_request("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt");
    r.cache_salt = cs->get<std::string>();
  }
  check_prompt_logprobs(body, r, limits.max_logprobs);
  refuse_unimplemented(body, r.chat);
}

ojson flatten_content(const ojson& content, size_t msg_index) {
  if (content.is_null() || content.is_string()) return content;
  if (!content.is_array())
    throw bad_request(fmt::format("messages[{}].content: Input should be a valid string or list", msg_index),
                      "messages");
  std::string text;
  bool first = true;
  for (auto& part : content) {
    if (part.is_string()) {  // lenient: bare strings
      if (!first) text += "\n";
      text += part.get<std::string>();
      first = false;
      continue;
    }
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw bad_request(fmt::format("messages[{}].content: each part needs a string `type`", msg_index), "messages");
    std::string type = part["type"].get<std::string>();
    if (type == "text" || type == "input_text" || type == "output_text") {
      if (!part.contains("text") || !part["text"].is_string())
        throw bad_request(fmt::format("messages[{}].content: a text part needs a string `text`", msg_index), "messages");
      if (!first) text += "\n";
      text += part["text"].get<std::string>();
      first = false;
    } else {
      throw bad_request(fmt::format("messages[{}].content: content part type '{}' is not supported by this model",
                                    msg_index, type),
                        "messages");
    }
  }
  return text;
}

ojson normalise_messages(const ojson& msgs) {
  if (!msgs.is_array()) type_error("messages", "a valid list", msgs);
  if (msgs.empty()) throw bad_request("messages must contain at least one message", "messages");
  ojson out = ojson::array();
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ojson& m = msgs[i];
    if (!m.is_object()) type_error(fmt::format("messages.{}", i), "a valid dictionary", m);
    if (!m.contains("role") || !m["role"].is_string())
      throw bad_request(fmt::format("messages[{}]: field `role` is required and must be a string", i), "messages");
    ojson nm = m;
    if (m.contains("content")) nm["content"] = flatten_content(m["content"], i);
    // Assistant tool calls: templates want `arguments` as an object (vLLM parses the string).
    if (nm.contains("tool_calls") && nm["tool_calls"].is_array()) {
      for (auto& tc : nm["tool_calls"]) {
        if (tc.is_object() && tc.contains("function") && tc["function"].is_object()) {
          auto& f = tc["function"];
          if (f.contains("arguments") && f["arguments"].is_string()) {
            try {
              f["arguments"] = parse_json_bounded<ojson>(f["arguments"].get<std::string>(), "tool call arguments");
            } catch (const std::exception&) {
              // leave the string as is
            }
          }
        }
      }
    }
    // Accept either reasoning field name; the templates read `reasoning_content`.
    if (nm.contains("reasoning") && !nm.contains("reasoning_content")) nm["reasoning_content"] = nm["reasoning"];
    out.push_back(std::move(nm));
  }
  return out;
}

}  // namespace

SamplingDefaults SamplingDefaults::from_json(const ojson& g) {
  SamplingDefaults d;
  if (!g.is_object()) return d;
  auto f = [&](const char* k, std::optional<float>& dst) {
    if (g.contains(k) && g[k].is_number()) dst = g[k].get<float>();
  };
  f("temperature", d.temperature);
  f("top_p", d.top_p);
  f("min_p", d.min_p);
  f("repetition_penalty", d.repetition_penalty);
  if (g.contains("top_k") && g["top_k"].is_number_integer()) d.top_k = g["top_k"].get<int>();
  if (g.contains("max_new_tokens") && g["max_new_tokens"].is_number_integer())
    d.max_new_tokens = g["max_new_tokens"].get<int>();
  return d;
}

ojson parse_json_body(std::string_view body) {
  return parse_request_object(body);
}

GenRequest parse_chat_request(const ojson& body, const ProtocolLimits& limits) {
  if (!body.is_object()) type_error("body", "a valid dictionary", body);
  GenRequest r;
  r.chat = true;
  parse_common(body, r, limits);
  const ojson* msgs = field(body, "messages");
  if (!msgs) throw bad_request("1 validation error: body.messages: Field required", "messages");
  r.messages = normalise_messages(*msgs);

  bool logprobs = get_bool(body, "logprobs").value_or(false);
  auto top = get_int(body, "top_logprobs");
  if (top) {
    if (*top < 0) throw bad_request("`top_logprobs` must be a positive value.", "top_logprobs");
    if (*top > 0 && !logprobs) throw bad_request("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs");
    if (*top > limits.max_logprobs)
      throw bad_request(fmt::format("Requested sample logprobs of {}, which is greater than max allowed: {}", *top,
                                    limits.max_logprobs),
                        "top_logprobs");
  }
  r.num_logprobs = logprobs ? static_cast<int>(top.value_or(0)) : -1;

  if (const ojson* t = field(body, "tools")) {
    if (!t->is_array()) type_error("tools", "a valid list", *t);
    for (size_t i = 0; i < t->size(); ++i) {
      const ojson& tool = (*t)[i];
      if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object() ||
          !tool["function"].contains("name") || !tool["function"]["name"].is_string())
        throw bad_request(fmt::format("tools[{}]: expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", i),
                          "tools");
    }
    r.tools = *t;
  }
  bool has_tools = r.tools.is_array() && !r.tools.empty();
  const ojson* tc = field(body, "tool_choice");
  if (!tc) {
    r.tool_choice = has_tools ? ToolChoice::Auto : ToolChoice::None;
  } else if (tc->is_string()) {
    std::string s = tc->get<std::string>();
    if (s == "none") r.tool_choice = ToolChoice::None;
    else if (s == "auto") r.tool_choice = ToolChoice::Auto;
    else if (s == "required") r.tool_choice = ToolChoice::Required;
    else throw bad_request(fmt::format("Invalid value for `tool_choice`: '{}'", s), "tool_choice");
  } else if (tc->is_object()) {
    if (!tc->contains("function") || !(*tc)["function"].is_object() || !(*tc)["function"].contains("name") ||
        !(*tc)["function"]["name"].is_string())
      throw bad_request("`tool_choice` must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                        "\"function\": {\"name\": ...}}",
                        "tool_choice");
    r.tool_choice = ToolChoice::Named;
    r.named_tool = (*tc)["function"]["name"].get<std::string>();
  } else {
    type_error("tool_choice", "a string or an object", *tc);
  }
  if (tc && r.tool_choice != ToolChoice::None && !r.tools.is_array())
    throw bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice");
  if (r.tool_choice == ToolChoice::Required && !has_tools) r.tool_choice = ToolChoice::None;
  if (r.tool_choice == ToolChoice::Named) {
    bool found = false;
    for (auto& t : r.tools) found = found || t["function"]["name"].get<std::string>() == r.named_tool;
    if (!found)
      throw bad_request(fmt::format("Tool '{}' has not been passed in `tools`.", r.named_tool), "tool_choice");
  }
  if (r.tool_choice == ToolChoice::Auto && !limits.auto_tool_choice_enabled)
    throw bad_request("\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set",
                      "tool_choice");

  r.add_generation_prompt = get_bool(body, "add_generation_prompt").value_or(true);
  r.continue_final_message = get_bool(body, "continue_final_message").value_or(false);
  if (r.add_generation_prompt && r.continue_final_message)
    throw bad_request("Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
  if (const ojson* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object()) type_error("chat_template_kwargs", "a valid dictionary", *k);
    r.chat_template_kwargs = *k;
  }
  if (const ojson* d = field(body, "documents")) {
    if (!d->is_array()) type_error("documents", "a valid list", *d);
    for (auto& doc : *d)
      if (!doc.is_object()) type_error("documents", "a list of dictionaries", doc);
    r.documents = *d;
  }
  r.include_reasoning = get_bool(body, "include_reasoning").value_or(true);
  r.echo = get_bool(body, "echo").value_or(false);  // the last message, see openai_service.cpp
  if (const ojson* e = field(body, "reasoning_effort")) {
    if (!e->is_string()) type_error("reasoning_effort", "a valid string", *e);
    // As vLLM (build_chat_params): passed to the chat template, chat_template_kwargs win.
    if (!r.chat_template_kwargs.is_object()) r.chat_template_kwargs = ojson::object();
    if (!r.chat_template_kwargs.contains("reasoning_effort")) r.chat_template_kwargs["reasoning_effort"] = *e;
  }
  return r;
}

GenRequest parse_completion_request(const ojson& body, const ProtocolLimits& limits) {
  if (!body.is_object()) type_error("body", "a valid dictionary", body);
  GenRequest r;
  r.chat = false;
  parse_common(body, r, limits);
  if (!r.max_tokens && !body.contains("max_tokens")) r.max_tokens = 16;  // CompletionRequest default
  const ojson* p = field(body, "prompt");
  if (!p) throw bad_request("Either prompt or prompt_embeds must be provided and non-empty.", "prompt");
  auto ids_of = [](const ojson& arr) {
    std::vector<int32_t> ids;
    for (auto& e : arr) {
      if (!e.is_number_integer()) type_error("prompt", "a string, a list of strings or a list of token ids", e);
      int64_t v = e.get<int64_t>();
      if (v < 0 || v > INT32_MAX) throw bad_request(fmt::format("Token id {} is out of vocabulary", v), "prompt");
      ids.push_back(static_cast<int32_t>(v));
    }
    return ids;
  };
  if (p->is_string()) {
    r.prompts.push_back({p->get<std::string>(), {}});
  } else if (p->is_array()) {
    if (p->empty()) throw bad_request("Either prompt or prompt_embeds must be provided and non-empty.", "prompt");
    if ((*p)[0].is_number_integer()) {
      r.prompts.push_back({std::nullopt, ids_of(*p)});
    } else {
      for (auto& e : *p) {
        if (e.is_string()) r.prompts.push_back({e.get<std::string>(), {}});
        else if (e.is_array()) r.prompts.push_back({std::nullopt, ids_of(e)});
        else type_error("prompt", "a string, a list of strings or a list of token ids", e);
      }
    }
  } else {
    type_error("prompt", "a string, a list of strings or a list of token ids", *p);
  }
  if (r.prompts.size() * static_cast<size_t>(r.n) > 1024)
    throw bad_request("Too many completions requested (prompts x n > 1024)", "prompt");
  if (auto lp = get_int(body, "logprobs")) {
    if (*lp < 0) throw bad_request("`logprobs` must be a positive value.", "logprobs");
    if (*lp > limits.max_logprobs)
      throw bad_request(fmt::format("Requested sample logprobs of {}, which is greater than max allowed: {}", *lp,
                                    limits.max_logprobs),
                        "logprobs");
    r.num_logprobs = static_cast<int>(*lp);
  }
  r.echo = get_bool(body, "echo").value_or(false);
  if (field(body, "suffix")) throw bad_request("suffix is not currently supported", "suffix");
  r.add_special_tokens = get_bool(body, "add_special_tokens").value_or(true);
  return r;
}

SamplingParams make_sampling_params(const GenRequest& r, const SamplingDefaults& d, int prompt_len, int max_model_len,
                                    int choice_index) {
  if (prompt_len >= max_model_len)
    throw bad_request(fmt::format("This model's maximum context length is {} tokens. However, your request has {} input "
                                  "tokens. Please reduce the length of the input messages.",
                                  max_model_len, prompt_len),
                      "input_tokens");
  if (r.max_tokens && *r.max_tokens > max_model_len - prompt_len)
    throw bad_request(fmt::format("'max_tokens' or 'max_completion_tokens' is too large: {}. This model's maximum "
                                  "context length is {} tokens and your request has {} input tokens ({} > {} - {}).",
                                  *r.max_tokens, max_model_len, prompt_len, *r.max_tokens, max_model_len, prompt_len),
                      "max_tokens");
  SamplingParams p;
  p.temperature = r.temperature.value_or(d.temperature.value_or(1.0f));
  // vLLM (SamplingParams.__post_init__): 0 < T < 0.01 is raised to 0.01 ("may cause numerical
  // errors"); only T = 0 is greedy.
  if (p.temperature > 0 && p.temperature < kMinTemperature) p.temperature = kMinTemperature;
  p.top_p = r.top_p.value_or(d.top_p.value_or(1.0f));
  p.top_k = r.top_k.value_or(d.top_k.value_or(0));
  p.min_p = r.min_p.value_or(d.min_p.value_or(0.0f));
  p.repetition_penalty = r.repetition_penalty.value_or(d.repetition_penalty.value_or(1.0f));
  p.presence_penalty = r.presence_penalty;
  p.frequency_penalty = r.frequency_penalty;
  if (r.seed) p.seed = static_cast<uint64_t>(*r.seed) + static_cast<uint64_t>(choice_index);  // vLLM: seed + index
  int64_t room = max_model_len - prompt_len;
  int64_t mt = r.max_tokens.value_or(room);
  if (!r.max_tokens && d.max_new_tokens) mt = std::min<int64_t>(mt, *d.max_new_tokens);
  p.max_tokens = static_cast<int>(std::min(mt, room));
  p.min_tokens = std::min(r.min_tokens, p.max_tokens);
  p.stop_token_ids = r.stop_token_ids;
  p.ignore_eos = r.ignore_eos;
  p.logprobs = r.num_logprobs;
  p.prompt_logprobs = r.prompt_logprobs;
  // Ids were checked against the vocabulary (check_token_ids), so they fit in int32.
  for (const auto& [id, b] : r.logit_bias) p.logit_bias.emplace_back(static_cast<int32_t>(id), b);
  if (r.allowed_token_ids)
    for (int64_t id : *r.allowed_token_ids) p.allowed_token_ids.push_back(static_cast<int32_t>(id));
  return p;
}

uint64_t prefix_cache_root(const std::string& salt) {
  if (salt.empty()) return 0;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then a splitmix finaliser
  for (unsigned char c : salt) h = (h ^ c) * 0x100000001b3ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return (h ^ (h >> 31)) | (uint64_t(1) << 63);
}

void check_token_ids(const GenRequest& r, int vocab) {
  std::vector<int64_t> bad;
  for (const auto& [id, b] : r.logit_bias)
    if (id < 0 || id >= vocab) bad.push_back(id);
  if (!bad.empty())
    throw bad_request(fmt::format("token_id(s) [{}] in logit_bias contain out-of-vocab token ids. Vocabulary size: {}",
                                  fmt::join(bad, ", "), vocab),
                      "logit_bias");
  if (r.allowed_token_ids)
    for (int64_t id : *r.allowed_token_ids)
      if (id < 0 || id >= vocab)
        throw bad_request("allowed_token_ids contains out-of-vocab token id!", "allowed_token_ids");
}

std::vector<std::vector<int32_t>> bad_words_token_ids(
    const std::vector<std::string>& words, const std::function<std::vector<int32_t>(const std::string&)>& encode,
    int vocab) {
  std::vector<std::vector<int32_t>> out;
  for (const std::string& w : words) {
    size_t b = 0;
    while (b < w.size() && std::isspace(static_cast<unsigned char>(w[b]))) ++b;
    const std::string word = w.substr(b);
    std::vector<int32_t> plain = encode(word);
    // A word that encodes to nothing can never be generated (vLLM fails on it with an
    // IndexError); it masks nothing.
    if (plain.empty()) continue;
    std::vector<int32_t> spaced = encode(" " + word);
    const bool keep_spaced = !spaced.empty() && spaced[0] != plain[0] && spaced.size() == plain.size();
    out.push_back(std::move(plain));
    if (keep_spaced) out.push_back(std::move(spaced));
  }
  std::vector<int32_t> invalid;
  for (const auto& ids : out)
    for (int32_t t : ids)
      if (t < 0 || t >= vocab) invalid.push_back(t);
  if (!invalid.empty())
    throw bad_request(fmt::format("The model vocabulary size is {}, but the following tokens were specified as bad: "
                                  "[{}]. All token id values should be integers satisfying: 0 <= token_id <= {}.",
                                  vocab, fmt::join(invalid, ", "), vocab - 1),
                      "bad_words");
  return out;
}

void truncate_prompt(std::vector<int32_t>& ids, int64_t k, int max_model_len, size_t prefix, size_t suffix) {
  if (k > max_model_len)
    throw bad_request(fmt::format("truncate_prompt_tokens value ({}) is greater than max_model_len ({}). Please, select "
                                  "a smaller truncation size.",
                                  k, max_model_len),
                      "truncate_prompt_tokens");
  if (k < 0) k = max_model_len;
  if (int64_t(ids.size()) <= k) return;
  if (prefix + suffix >= size_t(k)) prefix = suffix = 0;  // no room for the content: plain left truncation
  const size_t content = size_t(k) - prefix - suffix;
  // Keep ids[0, prefix), the last `content` ids before the suffix, and the suffix.
  std::vector<int32_t> out(ids.begin(), ids.begin() + prefix);
  out.insert(out.end(), ids.end() - suffix - content, ids.end());
  ids = std::move(out);
}

}  // namespace moeserve::server
