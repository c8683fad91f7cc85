#include "server/response.h"

#include <random>

namespace moeserve::server {

std::string random_hex(int n) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s;
  s.reserve(n);
  uint64_t bits = 0;
  for (int i = 0; i < n; ++i) {
    if (i % 16 == 0) bits = rng();
    s.push_back(hex[bits & 15]);
    bits >>= 4;
  }
  return s;
}

void ResponseContext::init_prefix() {
  chunk_prefix = "data: {\"id\":";
  append_json_string(chunk_prefix, id);
  chunk_prefix += chat ? ",\"object\":\"chat.completion.chunk\",\"created\":" : ",\"object\":\"text_completion\",\"created\":";
  chunk_prefix += std::to_string(created);
  chunk_prefix += ",\"model\":";
  append_json_string(chunk_prefix, model);
  chunk_prefix += ",\"choices\":[";
}

void append_usage(std::string& out, const Usage& u, bool with_details_null) {
  out += "{\"prompt_tokens\":" + std::to_string(u.prompt_tokens) +
         ",\"total_tokens\":" + std::to_string(u.prompt_tokens + u.completion_tokens) +
         ",\"completion_tokens\":" + std::to_string(u.completion_tokens);
  out += with_details_null ? ",\"prompt_tokens_details\":null}" : "}";
}

static void close_chunk(std::string& out, const Usage* usage) {
  out += "]";
  if (usage) {
    out += ",\"usage\":";
    append_usage(out, *usage, false);
  }
  out += "}\n\n";
}

static void append_bytes(std::string& out, const std::string& s) {
  out += "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(static_cast<unsigned char>(s[i]));
  }
  out += "]";
}

static std::string token_text(const ResponseContext& ctx, int32_t id) {
  if (ctx.tokens_as_ids) return "token_id:" + std::to_string(id);  // vLLM's return_tokens_as_token_ids
  const Frontend* f = ctx.frontend;
  std::string s = f ? f->decode({id}, false) : std::to_string(id);
  return valid_utf8(s) ? s : std::string("\xEF\xBF\xBD");
}

// {"content":[{"token","logprob","bytes","top_logprobs":[...]}]}
static void append_chat_logprobs(std::string& out, const ResponseContext& f, const std::vector<TokenLogprobOut>& lps) {
  out += "{\"content\":[";
  for (size_t i = 0; i < lps.size(); ++i) {
    if (i) out += ",";
    auto entry = [&](int32_t id, float lp) {
      std::string t = token_text(f, id);
      out += "{\"token\":";
      append_json_string(out, t);
      out += ",\"logprob\":";
      append_logprob(out, lp);
      out += ",\"bytes\":";
      append_bytes(out, t);
    };
    entry(lps[i].token_id, lps[i].logprob);
    out += ",\"top_logprobs\":[";
    for (size_t k = 0; k < lps[i].top.size(); ++k) {
      if (k) out += ",";
      entry(lps[i].top[k].first, lps[i].top[k].second);
      out += "}";
    }
    out += "]}";
  }
  out += "]}";
}

static int64_t utf8_chars(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// {"text_offset":[],"token_logprobs":[],"tokens":[],"top_logprobs":[{tok: lp}]}
static void append_completion_logprobs(std::string& out, const ResponseContext& f, const std::vector<TokenLogprobOut>& lps,
                                       int64_t& offset) {
  std::vector<std::string> toks;
  for (auto& lp : lps) toks.push_back(token_text(f, lp.token_id));
  out += "{\"text_offset\":[";
  for (size_t i = 0; i < lps.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(offset);
    offset += utf8_chars(toks[i]);
  }
  out += "],\"token_logprobs\":[";
  for (size_t i = 0; i < lps.size(); ++i) {
    if (i) out += ",";
    append_logprob(out, lps[i].logprob);
  }
  out += "],\"tokens\":[";
  for (size_t i = 0; i < lps.size(); ++i) {
    if (i) out += ",";
    append_json_string(out, toks[i]);
  }
  out += "],\"top_logprobs\":[";
  for (size_t i = 0; i < lps.size(); ++i) {
    if (i) out += ",";
    // The sampled token first, then the alternatives; one entry per distinct string.
    std::vector<std::string> seen;
    out += "{";
    auto add = [&](const std::string& t, float lp) {
      for (auto& s : seen)
        if (s == t) return;
      if (!seen.empty()) out += ",";
      seen.push_back(t);
      append_json_string(out, t);
      out += ":";
      append_logprob(out, lp);
    };
    add(toks[i], lps[i].logprob);
    for (auto& [id, lp] : lps[i].top) add(token_text(f, id), lp);
    out += "}";
  }
  out += "]}";
}

void append_chat_role_chunk(std::string& out, const ResponseContext& ctx, int index, const Usage* usage) {
  out += ctx.chunk_prefix;
  out += "{\"index\":" + std::to_string(index) +
         ",\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}";
  close_chunk(out, usage);
}

static void append_stop_reason(std::string& out, const ojson& sr) {
  if (sr.is_string()) append_json_string(out, sr.get_ref<const std::string&>());
  else if (sr.is_number_integer()) out += std::to_string(sr.get<int64_t>());
  else out += "null";
}

void append_delta_chunk(std::string& out, const ResponseContext& ctx, int index, const ChoiceDelta& d,
                        int64_t& text_offset, const Usage* usage) {
  out += ctx.chunk_prefix;
  out += "{\"index\":" + std::to_string(index);
  if (ctx.chat) {
    out += ",\"delta\":{";
    bool any = false;
    auto sep = [&] {
      if (any) out += ",";
      any = true;
    };
    if (!d.reasoning.empty()) {
      sep();
      out += "\"reasoning\":";
      append_json_string(out, d.reasoning);
      out += ",\"reasoning_content\":";
      append_json_string(out, d.reasoning);
    }
    if (!d.text.empty()) {
      sep();
      out += "\"content\":";
      append_json_string(out, d.text);
    }
    if (!d.tool_calls.empty()) {
      sep();
      out += "\"tool_calls\":[";
      for (size_t i = 0; i < d.tool_calls.size(); ++i) {
        auto& c = d.tool_calls[i];
        if (i) out += ",";
        out += "{\"index\":" + std::to_string(c.index);
        if (c.id) {
          out += ",\"id\":";
          append_json_string(out, *c.id);
          out += ",\"type\":\"function\"";
        }
        out += ",\"function\":{";
        if (c.name) {
          out += "\"name\":";
          append_json_string(out, *c.name);
          out += ",";
        }
        out += "\"arguments\":";
        append_json_string(out, c.arguments);
        out += "}}";
      }
      out += "]";
    }
    out += "},\"logprobs\":";
    if (!d.logprobs.empty()) append_chat_logprobs(out, ctx, d.logprobs);
    else out += "null";
  } else {
    out += ",\"text\":";
    append_json_string(out, d.text);
    out += ",\"logprobs\":";
    if (!d.logprobs.empty()) append_completion_logprobs(out, ctx, d.logprobs, text_offset);
    else out += "null";
  }
  if (d.finished) {
    out += ",\"finish_reason\":";
    append_json_string(out, d.finish_reason);
    out += ",\"stop_reason\":";
    append_stop_reason(out, d.stop_reason);
  } else {
    out += ctx.chat ? ",\"finish_reason\":null" : ",\"finish_reason\":null,\"stop_reason\":null";
  }
  out += "}";
  close_chunk(out, usage);
}

void append_usage_chunk(std::string& out, const ResponseContext& ctx, const Usage& u) {
  out += ctx.chunk_prefix;
  out += "],\"usage\":";
  append_usage(out, u, false);
  out += "}\n\n";
}

void append_error_chunk(std::string& out, int status, const std::string& type, const std::string& message) {
  out += "data: {\"error\":{\"message\":";
  append_json_string(out, message);
  out += ",\"type\":";
  append_json_string(out, type);
  out += ",\"param\":null,\"code\":" + std::to_string(status) + "}}\n\n";
}

static void append_head(std::string& out, const ResponseContext& ctx, const char* object) {
  out += "{\"id\":";
  append_json_string(out, ctx.id);
  out += ",\"object\":\"";
  out += object;
  out += "\",\"created\":" + std::to_string(ctx.created) + ",\"model\":";
  append_json_string(out, ctx.model);
  out += ",\"choices\":[";
}

std::string chat_response_json(const ResponseContext& ctx, const std::vector<const OutputProcessor*>& choices,
                               const Usage& u, const std::vector<std::string>& echo_prefix) {
  std::string out;
  append_head(out, ctx, "chat.completion");
  for (size_t i = 0; i < choices.size(); ++i) {
    const OutputProcessor& p = *choices[i];
    if (i) out += ",";
    out += "{\"index\":" + std::to_string(i) + ",\"message\":{\"role\":\"assistant\",\"content\":";
    // With tool calls or a reasoning split, an empty content is reported as null (vLLM).
    const std::string echo = i < echo_prefix.size() ? echo_prefix[i] : std::string();
    bool null_content = echo.empty() && p.text().empty() && (p.has_tool_calls() || p.reports_reasoning());
    if (null_content) out += "null";
    else append_json_string(out, echo + p.text());
    out += ",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,\"tool_calls\":[";
    if (auto* calls = p.tool_calls()) {
      for (size_t k = 0; k < calls->size(); ++k) {
        auto& c = (*calls)[k];
        if (k) out += ",";
        out += "{\"id\":";
        append_json_string(out, c.id);
        out += ",\"type\":\"function\",\"function\":{\"name\":";
        append_json_string(out, c.name);
        out += ",\"arguments\":";
        append_json_string(out, c.arguments);
        out += "}}";
      }
    }
    out += "],\"reasoning\":";
    std::string reasoning;
    if (p.reports_reasoning() && !p.reasoning().empty()) append_json_string(reasoning, p.reasoning());
    else reasoning = "null";
    out += reasoning + ",\"reasoning_content\":" + reasoning;
    out += "},\"logprobs\":";
    if (!p.all_logprobs().empty()) append_chat_logprobs(out, ctx, p.all_logprobs());
    else out += "null";
    out += ",\"finish_reason\":";
    append_json_string(out, p.finish_reason());
    out += ",\"stop_reason\":";
    append_stop_reason(out, p.stop_reason());
    out += "}";
  }
  out += "],\"usage\":";
  append_usage(out, u, true);
  out += ",\"prompt_logprobs\":null,\"kv_transfer_params\":null}";
  return out;
}

std::string completion_response_json(const ResponseContext& ctx, const std::vector<const OutputProcessor*>& choices,
                                     const std::vector<std::string>& echo_prefix, const Usage& u) {
  std::string out;
  append_head(out, ctx, "text_completion");
  for (size_t i = 0; i < choices.size(); ++i) {
    const OutputProcessor& p = *choices[i];
    if (i) out += ",";
    out += "{\"index\":" + std::to_string(i) + ",\"text\":";
    std::string text = (i < echo_prefix.size() ? echo_prefix[i] : std::string()) + p.text();
    append_json_string(out, text);
    out += ",\"logprobs\":";
    int64_t offset = 0;
    if (!p.all_logprobs().empty()) append_completion_logprobs(out, ctx, p.all_logprobs(), offset);
    else out += "null";
    out += ",\"finish_reason\":";
    append_json_string(out, p.finish_reason());
    out += ",\"stop_reason\":";
    append_stop_reason(out, p.stop_reason());
    out += ",\"prompt_logprobs\":null}";
  }
  out += "],\"usage\":";
  append_usage(out, u, true);
  out += ",\"kv_transfer_params\":null}";
  return out;
}

}  // namespace moeserve::server
