#include "server/json_text.h"

#include "core/python_repr.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace moeserve::server {

static const char* kHex = "0123456789abcdef";

void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  size_t run = 0;  // start of the current run of bytes needing no escape
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(s.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        out += "\\u00";
        out.push_back(kHex[c >> 4]);
        out.push_back(kHex[c & 15]);
    }
  }
  out.append(s.data() + run, s.size() - run);
  out.push_back('"');
}

std::string py_float_repr(double v) {
  // json.dumps spells the non-finite values as JavaScript does.
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return python_float_repr(v);
}

void append_logprob(std::string& out, float v) {
  if (!std::isfinite(v)) {
    out += "-9999.0";
    return;
  }
  out += py_float_repr(static_cast<double>(v));
}

static void dump_py(std::string& out, const ojson& j) {
  switch (j.type()) {
    case ojson::value_t::null: out += "null"; break;
    case ojson::value_t::boolean: out += j.get<bool>() ? "true" : "false"; break;
    case ojson::value_t::number_integer: out += std::to_string(j.get<int64_t>()); break;
    case ojson::value_t::number_unsigned: out += std::to_string(j.get<uint64_t>()); break;
    case ojson::value_t::number_float: out += py_float_repr(j.get<double>()); break;
    case ojson::value_t::string: append_json_string(out, j.get_ref<const std::string&>()); break;
    case ojson::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (auto& e : j) {
        if (!first) out += ", ";
        first = false;
        dump_py(out, e);
      }
      out.push_back(']');
      break;
    }
    case ojson::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        append_json_string(out, it.key());
        out += ": ";
        dump_py(out, it.value());
      }
      out.push_back('}');
      break;
    }
    default: out += "null"; break;
  }
}

std::string py_json_dumps(const ojson& j) {
  std::string out;
  dump_py(out, j);
  return out;
}

// Returns the length of the valid UTF-8 sequence starting at s[i], 0 if invalid,
// -1 if the sequence is cut off by the end of s (valid so far).
static int utf8_seq(std::string_view s, size_t i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  int len;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) len = 3, lo = 0xA0;
  else if (c >= 0xE1 && c <= 0xEC) len = 3;
  else if (c == 0xED) len = 3, hi = 0x9F;  // no surrogates
  else if (c >= 0xEE && c <= 0xEF) len = 3;
  else if (c == 0xF0) len = 4, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else if (c == 0xF4) len = 4, hi = 0x8F;
  else return 0;
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) return -1;
    unsigned char d = static_cast<unsigned char>(s[i + k]);
    unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (d < l || d > h) return 0;
  }
  return len;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    int n = utf8_seq(s, i);
    if (n <= 0) return false;
    i += n;
  }
  return true;
}

size_t utf8_complete_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    int n = utf8_seq(s, i);
    if (n == -1) return i;
    i += n <= 0 ? 1 : n;
  }
  return i;
}

}  // namespace moeserve::server
