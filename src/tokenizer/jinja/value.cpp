// Python semantics of values: str(), repr(), ==, <, truthiness, json.dumps.
#include "tokenizer/jinja/value.h"

#include "core/python_repr.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace moeserve::jinja {

namespace {
// Depth and namespace flag of a container from its direct children.
void set_nesting(Value& v, const Value& child) {
  v.depth = std::max(v.depth, child.depth + 1);
  v.holds_namespace = v.holds_namespace || child.holds_namespace || child.kind == Value::Kind::Namespace;
}
void check_depth(const Value& v) {
  if (v.depth > kMaxValueDepth) fail("value nested deeper than {} levels (the nesting limit)", kMaxValueDepth);
}
}  // namespace

Value Value::make_list(List x, bool tuple) {
  Value v;
  v.kind = Kind::List;
  v.is_tuple = tuple;
  v.depth = 1;
  for (const Value& e : x) set_nesting(v, e);
  check_depth(v);
  v.list = std::make_shared<const List>(std::move(x));
  return v;
}
Value Value::make_dict(Dict x) {
  Value v;
  v.kind = Kind::Dict;
  v.depth = 1;
  for (const auto& kv : x) set_nesting(v, kv.second);
  check_depth(v);
  v.dict = std::make_shared<Dict>(std::move(x));
  return v;
}
Value Value::make_namespace(Dict x) {
  Value v = make_dict(std::move(x));
  v.kind = Kind::Namespace;
  return v;
}
Value Value::function(NativeFn f) {
  Value v;
  v.kind = Kind::Function;
  v.fn = std::make_shared<NativeFn>(std::move(f));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null: return none();
    case T::boolean: return boolean(j.get<bool>());
    case T::number_integer: return integer(j.get<int64_t>());
    case T::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return floating(static_cast<double>(u));
      return integer(static_cast<int64_t>(u));
    }
    case T::number_float: return floating(j.get<double>());
    case T::string: return string(j.get<std::string>());
    case T::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json(e));
      return make_list(std::move(l));
    }
    case T::object: {
      Dict d;
      d.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), from_json(it.value()));
      return make_dict(std::move(d));
    }
    default: fail("chat template input: unsupported JSON value type");
  }
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b;
    case Kind::Int: return i != 0;
    case Kind::Float: return f != 0.0;
    case Kind::String: return !s.empty();
    case Kind::List: return !list->empty();
    case Kind::Dict: return !dict->empty();
    default: return true;
  }
}

const Value* Value::find(const std::string& key) const {
  if (kind != Kind::Dict && kind != Kind::Namespace) return nullptr;
  for (const auto& [k, v] : *dict)
    if (k == key) return &v;
  return nullptr;
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value make_markup(std::string s) {
  Value v = Value::string(std::move(s));
  v.markup = true;
  return v;
}

std::string dict_key(const Value& k) {
  switch (k.kind) {
    case Value::Kind::String: return k.s;
    case Value::Kind::Int: return "\xFFi" + std::to_string(k.i);
    case Value::Kind::Bool: return k.b ? "\xFFi1" : "\xFFi0";  // True == 1 as a dict key
    case Value::Kind::Float: return "\xFF" "f" + py_float_repr(k.f);  // "\xFFf" would be one (invalid) hex escape
    case Value::Kind::None: return "\xFFn";
    default: fail("unhashable type: '{}'", k.type_name());
  }
}

Value key_value(const std::string& k) {
  if (k.empty() || static_cast<unsigned char>(k[0]) != 0xFF) return Value::string(k);
  switch (k.size() > 1 ? k[1] : 'n') {
    case 'i': return Value::integer(std::stoll(k.substr(2)));
    case 'f': return Value::floating(std::stod(k.substr(2)));
    default: return Value::none();
  }
}

const Value* find_key(const Value& d, const Value& key) {
  switch (key.kind) {
    case Value::Kind::String: return d.find(key.s);
    case Value::Kind::Int:
    case Value::Kind::Bool:
    case Value::Kind::Float:
    case Value::Kind::None: return d.find(dict_key(key));
    default: return nullptr;
  }
}

double Value::as_double() const {
  switch (kind) {
    case Kind::Bool: return b ? 1.0 : 0.0;
    case Kind::Int: return static_cast<double>(i);
    case Kind::Float: return f;
    default: fail("expected a number, got {}", type_name());
  }
}

const char* Value::type_name() const {
  switch (kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return is_tuple ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Function: return "function";
  }
  return "?";
}

// ---- UTF-8 ------------------------------------------------------------------------------

std::u32string utf8_decode(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t n = static_cast<utf8proc_ssize_t>(s.size()), pos = 0;
  while (pos < n) {
    utf8proc_int32_t c;
    utf8proc_ssize_t len = utf8proc_iterate(p + pos, n - pos, &c);
    if (len <= 0) {  // invalid byte: keep it as a code point (never crash on bad input)
      c = p[pos];
      len = 1;
    }
    out.push_back(static_cast<char32_t>(c));
    pos += len;
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  utf8proc_uint8_t buf[4];
  utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
  out.append(reinterpret_cast<char*>(buf), static_cast<size_t>(n));
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

bool py_isspace(char32_t c) {
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return true;
  if (c < 0x80) return false;
  return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
         c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// ---- str / repr -------------------------------------------------------------------------

std::string py_float_repr(double d) { return python_float_repr(d); }

static bool py_isprintable(char32_t c) {
  if (c < 0x20 || c == 0x7f) return false;
  if (c < 0x7f) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
  }
}

static std::string repr_string(const std::string& s) {
  bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
  char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!py_isprintable(c)) {
      char buf[16];
      if (c < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      else std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    } else {
      utf8_append(out, c);
    }
  }
  out += q;
  return out;
}

std::string py_repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::String: return repr_string(v.s);
    case Value::Kind::List: {
      std::string out = v.is_tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += py_repr((*v.list)[k]);
      }
      if (v.is_tuple && v.list->size() == 1) out += ",";
      out += v.is_tuple ? ")" : "]";
      return out;
    }
    case Value::Kind::Dict:
    case Value::Kind::Namespace: {
      std::string out = v.kind == Value::Kind::Namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, e] : *v.dict) {
        if (!first) out += ", ";
        first = false;
        out += py_repr(key_value(k)) + ": " + py_repr(e);
      }
      out += v.kind == Value::Kind::Namespace ? "}>" : "}";
      return out;
    }
    default: return py_str(v);
  }
}

std::string py_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.b ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.i);
    case Value::Kind::Float: return py_float_repr(v.f);
    case Value::Kind::String: return v.s;
    case Value::Kind::Function: return "<function>";
    default: return py_repr(v);
  }
}

// ---- comparisons ------------------------------------------------------------------------

bool py_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind != K::Float && b.kind != K::Float) {
      int64_t x = a.kind == K::Bool ? a.b : a.i, y = b.kind == K::Bool ? b.b : b.i;
      return x == y;
    }
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::Undefined:
    case K::None: return true;
    case K::String: return a.s == b.s;
    case K::List:
      if (a.is_tuple != b.is_tuple || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!py_equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case K::Dict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, e] : *a.dict) {
        const Value* o = b.find(k);
        if (!o || !py_equal(e, *o)) return false;
      }
      return true;
    case K::Namespace: return a.dict == b.dict;
    case K::Function: return a.fn == b.fn;
    default: return false;
  }
}

bool py_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Kind::Int && b.kind == Value::Kind::Int) return a.i < b.i;
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;
  if (a.is_list() && b.is_list() && a.is_tuple == b.is_tuple) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      const Value &x = (*a.list)[k], &y = (*b.list)[k];
      if (!py_equal(x, y)) return py_less(x, y);
    }
    return a.list->size() < b.list->size();
  }
  fail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

// ---- json.dumps -------------------------------------------------------------------------

static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char buf[16];
        if (c < 0x20 || (ensure_ascii && c > 0x7e)) {
          if (c >= 0x10000) {
            char32_t u = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + static_cast<unsigned>(u >> 10),
                          0xdc00 + static_cast<unsigned>(u & 0x3ff));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          }
          out += buf;
        } else {
          utf8_append(out, c);
        }
      }
    }
  }
  out += '"';
}

static void json_dump(std::string& out, const Value& v, const JsonDumpOptions& opt, int level) {
  using K = Value::Kind;
  auto newline = [&](int lvl) {
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += opt.indent;
  };
  switch (v.kind) {
    case K::None: out += "null"; return;
    case K::Bool: out += v.b ? "true" : "false"; return;
    case K::Int: out += std::to_string(v.i); return;
    case K::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += py_float_repr(v.f);
      return;
    case K::String: json_string(out, v.s, opt.ensure_ascii); return;
    case K::List: {
      if (v.list->empty()) { out += "[]"; return; }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += opt.item_sep;
        if (opt.has_indent) newline(level + 1);
        json_dump(out, (*v.list)[k], opt, level + 1);
      }
      if (opt.has_indent) newline(level);
      out += ']';
      return;
    }
    case K::Dict: {
      if (v.dict->empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& e : *v.dict) items.push_back(&e);
      if (opt.sort_keys)  // Python compares the keys themselves (ints numerically)
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return py_less(key_value(a->first), key_value(b->first)); });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += opt.item_sep;
        if (opt.has_indent) newline(level + 1);
        Value key = key_value(items[k]->first);  // json.dumps writes 512 as "512", None as "null"
        json_string(out, key.is_string() ? key.s : key.is_none() ? "null" : key.kind == K::Bool ? (key.b ? "true" : "false") : py_str(key), opt.ensure_ascii);
        out += opt.key_sep;
        json_dump(out, items[k]->second, opt, level + 1);
      }
      if (opt.has_indent) newline(level);
      out += '}';
      return;
    }
    default: fail("Object of type {} is not JSON serializable", v.type_name());
  }
}

std::string py_json_dumps(const Value& v, const JsonDumpOptions& opt) {
  std::string out;
  json_dump(out, v, opt, 0);
  return out;
}

}  // namespace moeserve::jinja
