// Jinja runtime values, modelled on the Python objects that jinja2 would see when
// transformers renders a chat template: None/bool/int/float/str/list/tuple/dict, plus
// Undefined, namespace() objects (mutable, shared) and callables (macros, globals,
// bound string/dict methods). Lists and dicts are immutable once built (the sandbox is
// ImmutableSandboxedEnvironment), so they are shared by pointer.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace moeserve::jinja {

// Values nest at most this deep (JSON inputs are bounded by the JSON depth limit, values built
// by a template by this check in make_list/make_dict), so str(), repr(), ==, tojson and the
// destructor, which recurse once per level, cannot overflow the stack.
constexpr uint32_t kMaxValueDepth = 2048;

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, like a Python dict

struct CallArgs {
  std::vector<Value>* pos;
  std::vector<std::pair<std::string, Value>>* kw;
  int line;
};
using NativeFn = std::function<Value(CallArgs&)>;

struct Value {
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };
  Kind kind = Kind::Undefined;
  bool is_tuple = false;  // List kind printed as (a, b)
  bool group_tuple = false;  // groupby's (grouper, list) tuple, which also has .grouper/.list
  bool markup = false;    // String that is a markupsafe.Markup (made by |safe, |escape):
                          // `+` with a plain str HTML-escapes the plain side, as Python does
  bool holds_namespace = false;  // a List/Dict with a namespace() object somewhere inside
  uint32_t depth = 0;             // List/Dict/Namespace nesting (0 for scalars), <= kMaxValueDepth
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                     // String payload; for Undefined: the missing name (messages)
  std::shared_ptr<const List> list;  // List
  std::shared_ptr<Dict> dict;        // Dict (never mutated) / Namespace (mutated by `set ns.x`)
  std::shared_ptr<NativeFn> fn;      // Function

  Value() = default;
  static Value undefined(std::string hint = {}) { Value v; v.s = std::move(hint); return v; }
  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::Int; v.i = x; return v; }
  static Value floating(double x) { Value v; v.kind = Kind::Float; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::String; v.s = std::move(x); return v; }
  static Value make_list(List x, bool tuple = false);
  static Value make_dict(Dict x);
  static Value make_namespace(Dict x);
  static Value function(NativeFn f);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_callable() const { return kind == Kind::Function; }

  // Python truthiness (Undefined is falsy).
  bool truthy() const;
  // Looks up a dict/namespace key; nullptr when absent or not a mapping.
  const Value* find(const std::string& key) const;
  // Number as double (Bool/Int/Float).
  double as_double() const;
  // Python type name for error messages ("str", "dict", ...).
  const char* type_name() const;
};

// Dict keys are stored as strings. Other hashable keys (int, bool, float, None; Python
// allows them in dict literals such as {512: 128}) are encoded behind a 0xFF byte, which
// never occurs in UTF-8 text. dict_key() throws for unhashable keys (list, dict).
std::string dict_key(const Value& k);
Value key_value(const std::string& k);
// d[key] for a dict/namespace with any key type; nullptr when absent or not hashable.
const Value* find_key(const Value& d, const Value& key);

// markupsafe.escape: & < > " ' as &amp; &lt; &gt; &#34; &#39;.
std::string html_escape(const std::string& s);
Value make_markup(std::string s);

// Python str(x) and repr(x).
std::string py_str(const Value& v);
std::string py_repr(const Value& v);
std::string py_float_repr(double d);
// Python ==, and < (throws moeserve::Error on unorderable types).
bool py_equal(const Value& a, const Value& b);
bool py_less(const Value& a, const Value& b);

// json.dumps(x, ensure_ascii, indent, separators, sort_keys) with Python's formatting.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;  // indent unit when has_indent
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string py_json_dumps(const Value& v, const JsonDumpOptions& opt);

// UTF-8 helpers (Python str operations work on code points).
std::u32string utf8_decode(const std::string& s);
std::string utf8_encode(const std::u32string& s);
void utf8_append(std::string& out, char32_t c);
bool py_isspace(char32_t c);

}  // namespace moeserve::jinja
