#include "server/protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/bounded_json.h"
#include "server/request_fields.h"

namespace moeserve::server {

namespace {

// Field readers (field, get_bool, get_int, get_num, get_str, type_error): server/request_fields.h.

int clamp_int(int64_t v) { return static_cast<int>(std::clamp<int64_t>(v, INT32_MIN, INT32_MAX)); }

// Fields shared by chat and completions.
void parse_common(const ojson& body, GenRequest& r) {
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
    r.stop_token_ids = *get_token_ids(body, "stop_token_ids", 0);
  }
  r.include_stop_str_in_output = get_bool(body, "include_stop_str_in_output").value_or(false);
  r.skip_special_tokens = get_bool(body, "skip_special_tokens").value_or(true);
  r.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  // response_format: constrained decoding is not implemented; the field is accepted and ignored.
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
  parse_common(body, r);
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
  return r;
}

GenRequest parse_completion_request(const ojson& body, const ProtocolLimits& limits) {
  if (!body.is_object()) type_error("body", "a valid dictionary", body);
  GenRequest r;
  r.chat = false;
  parse_common(body, r);
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
  return p;
}

}  // namespace moeserve::server
