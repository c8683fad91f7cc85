// Filters, tests and globals, following jinja2 3.1 (filters.py / tests.py) and the
// transformers overrides (tojson with json.dumps options, raise_exception, strftime_now).
#include "tokenizer/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <map>

#include "core/debug_flags.h"
#include "core/error.h"

namespace moeserve::jinja {
// jinja2 make_attrgetter: dotted path, integer parts index, item-first lookup.
Value attr_path(const Value& item, const Value& attr) {
  if (attr.kind == Value::Kind::Int) return get_item(item, attr);
  if (!attr.is_string()) fail("attribute must be a string");
  Value cur = item;
  size_t start = 0;
  while (true) {
    size_t dot = attr.s.find('.', start);
    std::string part = attr.s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = numeric ? get_item(cur, Value::integer(std::stoll(part))) : get_item(cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    if (cur.is_undefined()) return cur;
    start = dot + 1;
  }
}

static std::string lower_str(const Value& v) {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  CallArgs ca{&pos, &kw, 0};
  return (*get_attr(v, "lower").fn)(ca).s;
}


// Sort/unique key: strings lower-cased unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(lower_str(v));
  return v;
}

namespace {

using FilterFn = Value (*)(const Value&, ArgReader&);
using TestFn = bool (*)(const Value&, ArgReader&);

const Value& need(ArgReader& r, size_t idx, const char* name) {
  const Value* v = r.arg(idx, name);
  if (!v) fail("{}() missing required argument '{}'", r.fname, name);
  return *v;
}
bool opt_bool(ArgReader& r, size_t idx, const char* name, bool dflt) {
  const Value* v = r.arg(idx, name);
  return v ? v->truthy() : dflt;
}

Value call_method(const Value& obj, const char* name, std::vector<Value> pos = {}) {
  std::vector<std::pair<std::string, Value>> kw;
  CallArgs ca{&pos, &kw, 0};
  Value m = get_attr(obj, name);
  return (*m.fn)(ca);
}


Value f_tojson(const Value& v, ArgReader& r) {
  JsonDumpOptions o;
  o.ensure_ascii = opt_bool(r, 0, "ensure_ascii", false);
  const Value* indent = r.arg(1, "indent");
  if (indent && !indent->is_none()) {
    o.has_indent = true;
    if (indent->is_string()) o.indent = indent->s;
    else if (indent->kind == Value::Kind::Int) o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent->i)), ' ');
    else fail("tojson: indent must be an int or a string");
    o.item_sep = ",";
  }
  const Value* seps = r.arg(2, "separators");
  if (seps && !seps->is_none()) {
    if (!seps->is_list() || seps->list->size() != 2 || !(*seps->list)[0].is_string() || !(*seps->list)[1].is_string())
      fail("tojson: separators must be a pair of strings");
    o.item_sep = (*seps->list)[0].s;
    o.key_sep = (*seps->list)[1].s;
  }
  o.sort_keys = opt_bool(r, 3, "sort_keys", false);
  return Value::string(py_json_dumps(v, o));
}

Value f_default(const Value& v, ArgReader& r) {
  const Value* d = r.arg(0, "default_value");
  bool boolean = opt_bool(r, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !v.truthy())) return d ? *d : Value::string("");
  return v;
}

Value f_length(const Value& v, ArgReader&) { return Value::integer(py_len(v)); }
Value f_string(const Value& v, ArgReader&) { return v.is_string() ? v : Value::string(py_str(v)); }
Value f_safe(const Value& v, ArgReader&) { return v.markup ? v : make_markup(py_str(v)); }
Value f_lower(const Value& v, ArgReader&) { return call_method(Value::string(py_str(v)), "lower"); }
Value f_upper(const Value& v, ArgReader&) { return call_method(Value::string(py_str(v)), "upper"); }
Value f_capitalize(const Value& v, ArgReader&) { return call_method(Value::string(py_str(v)), "capitalize"); }
Value f_trim(const Value& v, ArgReader& r) {
  const Value* chars = r.arg(0, "chars");
  Value out = call_method(Value::string(py_str(v)), "strip", chars ? std::vector<Value>{*chars} : std::vector<Value>{});
  out.markup = v.markup;  // Markup.strip returns Markup
  return out;
}

Value f_title(const Value& v, ArgReader&) {
  // jinja2: capitalize each word, words split on whitespace and - ( { [ <
  std::string s = py_str(v), out, word;
  auto flush = [&] {
    if (!word.empty()) out += call_method(Value::string(word), "capitalize").s;
    word.clear();
  };
  for (char32_t c : utf8_decode(s)) {
    if (py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') {
      flush();
      utf8_append(out, c);
    } else {
      utf8_append(word, c);
    }
  }
  flush();
  return Value::string(out);
}

Value f_replace(const Value& v, ArgReader& r) {
  std::vector<Value> args{Value::string(py_str(need(r, 0, "old"))), Value::string(py_str(need(r, 1, "new")))};
  if (const Value* c = r.arg(2, "count"); c && !c->is_none()) args.push_back(*c);
  return call_method(Value::string(py_str(v)), "replace", args);
}

Value f_join(const Value& v, ArgReader& r) {
  const Value* d = r.arg(0, "d");
  const Value* attr = r.arg(1, "attribute");
  std::string sep = d ? py_str(*d) : "", out;
  bool first = true;
  for (const Value& x : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += py_str(attr ? attr_path(x, *attr) : x);
  }
  return Value::string(out);
}

Value f_first(const Value& v, ArgReader&) {
  List l = iterate(v);
  return l.empty() ? Value::undefined("No first item, sequence was empty.") : l.front();
}
Value f_last(const Value& v, ArgReader&) {
  List l = iterate(v);
  return l.empty() ? Value::undefined("No last item, sequence was empty.") : l.back();
}
Value f_list(const Value& v, ArgReader&) { return Value::make_list(iterate(v)); }
Value f_reverse(const Value& v, ArgReader&) {
  if (v.is_string()) {
    std::u32string u = utf8_decode(v.s);
    std::reverse(u.begin(), u.end());
    return Value::string(utf8_encode(u));
  }
  List l = iterate(v);
  std::reverse(l.begin(), l.end());
  return Value::make_list(std::move(l));
}

Value f_items(const Value& v, ArgReader&) {
  if (v.is_undefined()) return Value::make_list({});
  if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
  return call_method(v, "items");
}

Value f_int(const Value& v, ArgReader& r) {
  const Value* d = r.arg(0, "default");
  Value dflt = d ? *d : Value::integer(0);
  switch (v.kind) {
    case Value::Kind::Int: return v;
    case Value::Kind::Bool: return Value::integer(v.b);
    case Value::Kind::Float: return std::isfinite(v.f) ? Value::integer(static_cast<int64_t>(v.f)) : dflt;
    case Value::Kind::String: {
      std::string s;
      for (char c : v.s)
        if (c != '_') s += c;
      try {
        size_t used = 0;
        int64_t x = std::stoll(s, &used, 10);
        std::string rest = s.substr(used);
        if (std::all_of(rest.begin(), rest.end(), ::isspace)) return Value::integer(x);
      } catch (const std::exception&) {
      }
      try {
        size_t used = 0;
        double x = std::stod(s, &used);
        std::string rest = s.substr(used);
        if (std::all_of(rest.begin(), rest.end(), ::isspace) && std::isfinite(x))
          return Value::integer(static_cast<int64_t>(x));
      } catch (const std::exception&) {
      }
      return dflt;
    }
    default: return dflt;
  }
}

Value f_float(const Value& v, ArgReader& r) {
  const Value* d = r.arg(0, "default");
  Value dflt = d ? *d : Value::floating(0.0);
  if (v.is_number()) return Value::floating(v.as_double());
  if (v.is_string()) {
    try {
      size_t used = 0;
      double x = std::stod(v.s, &used);
      std::string rest = v.s.substr(used);
      if (std::all_of(rest.begin(), rest.end(), ::isspace)) return Value::floating(x);
    } catch (const std::exception&) {
    }
  }
  return dflt;
}

Value f_abs(const Value& v, ArgReader&) {
  if (v.kind == Value::Kind::Float) return Value::floating(std::fabs(v.f));
  if (v.kind == Value::Kind::Int) return Value::integer(v.i < 0 ? -v.i : v.i);
  if (v.kind == Value::Kind::Bool) return Value::integer(v.b);
  fail("bad operand type for abs(): '{}'", v.type_name());
}

Value f_round(const Value& v, ArgReader& r) {
  const Value* p = r.arg(0, "precision");
  const Value* m = r.arg(1, "method");
  int64_t prec = p ? p->i : 0;
  std::string method = m ? m->s : "common";
  double x = v.as_double(), scale = std::pow(10.0, static_cast<double>(prec));
  if (method == "common" && (v.kind == Value::Kind::Int || v.kind == Value::Kind::Bool) && prec >= 0)
    return Value::integer(v.kind == Value::Kind::Bool ? v.b : v.i);  // Python round(int, n) is the int
  if (method == "common") return Value::floating(std::nearbyint(x * scale) / scale);
  if (method == "ceil") return Value::floating(std::ceil(x * scale) / scale);
  if (method == "floor") return Value::floating(std::floor(x * scale) / scale);
  fail("method must be common, ceil or floor");
}

Value f_indent(const Value& v, ArgReader& r) {
  const Value* w = r.arg(0, "width");
  bool first = opt_bool(r, 1, "first", false), blank = opt_bool(r, 2, "blank", false);
  std::string ind = !w ? "    " : w->is_string() ? w->s : std::string(static_cast<size_t>(std::max<int64_t>(0, w->i)), ' ');
  std::string s = py_str(v) + "\n";
  std::vector<std::string> lines;  // str.splitlines on \n, \r\n, \r
  size_t b = 0;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '\n' || s[k] == '\r') {
      lines.push_back(s.substr(b, k - b));
      if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
      b = k + 1;
    }
  }
  if (b < s.size()) lines.push_back(s.substr(b));
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k == 0) {
      out = lines[0];
      continue;
    }
    out += "\n";
    if (blank || !lines[k].empty()) out += ind;
    out += lines[k];
  }
  if (first) out = ind + out;
  return Value::string(out);
}

Value f_escape(const Value& v, ArgReader&) { return v.markup ? v : make_markup(html_escape(py_str(v))); }

Value f_unique(const Value& v, ArgReader& r) {
  bool cs = opt_bool(r, 0, "case_sensitive", false);
  const Value* attr = r.arg(1, "attribute");
  List out, seen;
  for (const Value& x : iterate(v)) {
    Value key = sort_key(attr ? attr_path(x, *attr) : x, cs);
    bool dup = std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, key); });
    if (!dup) seen.push_back(key), out.push_back(x);
  }
  return Value::make_list(std::move(out));
}

Value f_sort(const Value& v, ArgReader& r) {
  bool rev = opt_bool(r, 0, "reverse", false), cs = opt_bool(r, 1, "case_sensitive", false);
  const Value* attr = r.arg(2, "attribute");
  List l = iterate(v);
  if (attr && attr->is_string()) {
    // jinja2 splits "a,b" and compares key lists; Undefined parts compare equal to each other.
    std::vector<Value> parts;
    for (size_t start = 0;;) {
      size_t comma = attr->s.find(',', start);
      parts.push_back(Value::string(attr->s.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    auto key = [&](const Value& x) {
      List k;
      for (const Value& p : parts) k.push_back(sort_key(attr_path(x, p), cs));
      return Value::make_list(std::move(k));
    };
    std::stable_sort(l.begin(), l.end(), [&](const Value& a, const Value& b) {
      Value ka = key(a), kb = key(b);
      return rev ? py_less(kb, ka) : py_less(ka, kb);
    });
    return Value::make_list(std::move(l));
  }
  std::stable_sort(l.begin(), l.end(), [&](const Value& a, const Value& b) {
    Value ka = sort_key(attr ? attr_path(a, *attr) : a, cs), kb = sort_key(attr ? attr_path(b, *attr) : b, cs);
    return rev ? py_less(kb, ka) : py_less(ka, kb);
  });
  return Value::make_list(std::move(l));
}

Value f_dictsort(const Value& v, ArgReader& r) {
  bool cs = opt_bool(r, 0, "case_sensitive", false);
  const Value* by = r.arg(1, "by");
  bool rev = opt_bool(r, 2, "reverse", false);
  int pos = by && by->is_string() && by->s == "value" ? 1 : 0;
  List items = *f_items(v, r).list;
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    Value ka = sort_key((*a.list)[pos], cs), kb = sort_key((*b.list)[pos], cs);
    return rev ? py_less(kb, ka) : py_less(ka, kb);
  });
  return Value::make_list(std::move(items));
}

Value f_sum(const Value& v, ArgReader& r) {
  const Value* attr = r.arg(0, "attribute");
  const Value* start = r.arg(1, "start");
  Value acc = start ? *start : Value::integer(0);
  for (const Value& x : iterate(v)) {
    Value y = attr ? attr_path(x, *attr) : x;
    if (acc.is_list() && y.is_list() && acc.is_tuple == y.is_tuple) {  // sum(lists, start=[]) concatenates
      List cat = *acc.list;
      cat.insert(cat.end(), y.list->begin(), y.list->end());
      acc = Value::make_list(std::move(cat), acc.is_tuple);
      continue;
    }
    if (!acc.is_number() || !y.is_number())
      fail("unsupported operand type(s) for +: '{}' and '{}'", acc.type_name(), y.type_name());
    if (acc.kind != Value::Kind::Float && y.kind != Value::Kind::Float)
      acc = Value::integer((acc.kind == Value::Kind::Bool ? acc.b : acc.i) + (y.kind == Value::Kind::Bool ? y.b : y.i));
    else
      acc = Value::floating(acc.as_double() + y.as_double());
  }
  return acc;
}

Value min_max(const Value& v, ArgReader& r, bool want_max) {
  bool cs = opt_bool(r, 0, "case_sensitive", false);
  const Value* attr = r.arg(1, "attribute");
  List l = iterate(v);
  if (l.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const Value* best = &l[0];
  for (const Value& x : l) {
    Value kx = sort_key(attr ? attr_path(x, *attr) : x, cs), kb = sort_key(attr ? attr_path(*best, *attr) : *best, cs);
    if (want_max ? py_less(kb, kx) : py_less(kx, kb)) best = &x;
  }
  return *best;
}
Value f_min(const Value& v, ArgReader& r) { return min_max(v, r, false); }
Value f_max(const Value& v, ArgReader& r) { return min_max(v, r, true); }

Value f_attr(const Value& v, ArgReader& r) {
  std::string name = py_str(need(r, 0, "name"));
  Value out = get_attr(v, name);
  // getattr(dict, name) sees methods only: an item found by get_attr is not an attribute.
  if (v.is_dict() && !out.is_callable() && v.find(name))
    return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
  return out;
}

// Remaining positional/keyword arguments from index `from` on, for map/select.
CallArgs rest_args(ArgReader& r, size_t from, std::vector<Value>& pos, std::vector<std::pair<std::string, Value>>& kw,
                   bool keep_kw) {
  for (size_t k = from; k < r.a.pos->size(); ++k) pos.push_back((*r.a.pos)[k]);
  if (keep_kw) kw = *r.a.kw;
  return CallArgs{&pos, &kw, r.a.line};
}

Value f_map(const Value& v, ArgReader& r) {
  List out;
  if (!v.truthy()) return Value::make_list({});  // jinja2: `if value:` guards the loop (None maps to nothing)
  const Value* attr = nullptr;
  const Value* dflt = nullptr;
  for (auto& [k, x] : *r.a.kw) {
    if (k == "attribute") attr = &x;
    else if (k == "default") dflt = &x;
  }
  if (attr) {
    for (const Value& x : iterate(v)) {
      Value y = attr_path(x, *attr);
      out.push_back(y.is_undefined() && dflt ? *dflt : y);
    }
    return Value::make_list(std::move(out));
  }
  const Value& fname = need(r, 0, "filter");
  if (!fname.is_string()) fail("map: filter name must be a string");
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  CallArgs ca = rest_args(r, 1, pos, kw, true);
  for (const Value& x : iterate(v)) out.push_back(apply_filter(fname.s, x, ca));
  return Value::make_list(std::move(out));
}

Value select_impl(const Value& v, ArgReader& r, bool by_attr, bool keep_true) {
  if (!v.truthy()) return Value::make_list({});  // as jinja2: falsy input (None too) selects nothing
  size_t idx = 0;
  const Value* attr = by_attr ? &need(r, idx++, "attribute") : nullptr;
  const Value* test = r.arg(idx++, nullptr);
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  CallArgs ca = rest_args(r, idx, pos, kw, false);
  List out;
  for (const Value& x : iterate(v)) {
    Value y = attr ? attr_path(x, *attr) : x;
    bool ok = test ? apply_test(py_str(*test), y, ca) : y.truthy();
    if (ok == keep_true) out.push_back(x);
  }
  return Value::make_list(std::move(out));
}
Value f_select(const Value& v, ArgReader& r) { return select_impl(v, r, false, true); }
Value f_reject(const Value& v, ArgReader& r) { return select_impl(v, r, false, false); }
Value f_selectattr(const Value& v, ArgReader& r) { return select_impl(v, r, true, true); }
Value f_rejectattr(const Value& v, ArgReader& r) { return select_impl(v, r, true, false); }

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> m = {
      {"tojson", f_tojson},   {"default", f_default},       {"d", f_default},         {"length", f_length},
      {"count", f_length},    {"string", f_string},         {"safe", f_safe},         {"lower", f_lower},
      {"upper", f_upper},     {"capitalize", f_capitalize}, {"trim", f_trim},         {"title", f_title},
      {"replace", f_replace}, {"join", f_join},             {"first", f_first},       {"last", f_last},
      {"list", f_list},       {"reverse", f_reverse},       {"items", f_items},       {"int", f_int},
      {"float", f_float},     {"abs", f_abs},               {"round", f_round},       {"indent", f_indent},
      {"escape", f_escape},   {"e", f_escape},              {"unique", f_unique},     {"sort", f_sort},
      {"dictsort", f_dictsort}, {"sum", f_sum},             {"min", f_min},           {"max", f_max},
      {"attr", f_attr},       {"map", f_map},               {"select", f_select},     {"reject", f_reject},
      {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr},
      {"wordcount", f_wordcount}, {"center", f_center},    {"truncate", f_truncate}, {"batch", f_batch},
      {"slice", f_slice},     {"groupby", f_groupby},       {"format", f_format},
  };
  return m;
}

// ---- tests ------------------------------------------------------------------------------

bool t_defined(const Value& v, ArgReader&) { return !v.is_undefined(); }
bool t_undefined(const Value& v, ArgReader&) { return v.is_undefined(); }
bool t_none(const Value& v, ArgReader&) { return v.is_none(); }
bool t_boolean(const Value& v, ArgReader&) { return v.kind == Value::Kind::Bool; }
bool t_true(const Value& v, ArgReader&) { return v.kind == Value::Kind::Bool && v.b; }
bool t_false(const Value& v, ArgReader&) { return v.kind == Value::Kind::Bool && !v.b; }
bool t_integer(const Value& v, ArgReader&) { return v.kind == Value::Kind::Int; }
bool t_float(const Value& v, ArgReader&) { return v.kind == Value::Kind::Float; }
bool t_number(const Value& v, ArgReader&) { return v.is_number(); }
bool t_string(const Value& v, ArgReader&) { return v.is_string(); }
bool t_mapping(const Value& v, ArgReader&) { return v.is_dict(); }
bool t_sequence(const Value& v, ArgReader&) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_iterable(const Value& v, ArgReader&) { return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict(); }
bool t_callable(const Value& v, ArgReader&) { return v.is_callable(); }
bool t_odd(const Value& v, ArgReader&) {
  if (v.kind != Value::Kind::Int) fail("odd test needs an integer");
  return v.i % 2 != 0;
}
bool t_even(const Value& v, ArgReader&) {
  if (v.kind != Value::Kind::Int) fail("even test needs an integer");
  return v.i % 2 == 0;
}
bool t_divisibleby(const Value& v, ArgReader& r) {
  const Value& n = need(r, 0, "num");
  if (v.kind != Value::Kind::Int || n.kind != Value::Kind::Int || n.i == 0) fail("divisibleby needs non-zero integers");
  return v.i % n.i == 0;
}
bool t_eq(const Value& v, ArgReader& r) { return py_equal(v, need(r, 0, "other")); }
bool t_ne(const Value& v, ArgReader& r) { return !py_equal(v, need(r, 0, "other")); }
bool t_lt(const Value& v, ArgReader& r) { return py_less(v, need(r, 0, "other")); }
bool t_gt(const Value& v, ArgReader& r) { return py_less(need(r, 0, "other"), v); }
bool t_le(const Value& v, ArgReader& r) { return !py_less(need(r, 0, "other"), v); }
bool t_ge(const Value& v, ArgReader& r) { return !py_less(v, need(r, 0, "other")); }
bool t_in(const Value& v, ArgReader& r) {
  const Value& seq = need(r, 0, "seq");
  if (seq.is_string()) {
    if (!v.is_string()) fail("'in <string>' requires string as left operand");
    return seq.s.find(v.s) != std::string::npos;
  }
  if (seq.is_dict()) return find_key(seq, v) != nullptr;
  for (const Value& x : iterate(seq))
    if (py_equal(x, v)) return true;
  return false;
}
bool t_sameas(const Value& v, ArgReader& r) {
  const Value& o = need(r, 0, "other");
  if (v.kind != o.kind) return false;
  switch (v.kind) {
    case Value::Kind::None:
    case Value::Kind::Undefined: return true;
    case Value::Kind::Bool: return v.b == o.b;
    case Value::Kind::List: return v.list == o.list;
    case Value::Kind::Dict:
    case Value::Kind::Namespace: return v.dict == o.dict;
    default: return py_equal(v, o);
  }
}
bool t_lower(const Value& v, ArgReader&) { return v.is_string() && lower_str(v) == v.s; }
bool t_upper(const Value& v, ArgReader&) { return v.is_string() && call_method(v, "upper").s == v.s; }
bool t_escaped(const Value& v, ArgReader&) { return v.markup; }
bool t_filter(const Value& v, ArgReader&) { return v.is_string() && has_filter(v.s); }
bool t_test(const Value& v, ArgReader&) { return v.is_string() && has_test(v.s); }

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> m = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none},         {"boolean", t_boolean},
      {"true", t_true},       {"false", t_false},         {"integer", t_integer},   {"float", t_float},
      {"number", t_number},   {"string", t_string},       {"mapping", t_mapping},   {"sequence", t_sequence},
      {"iterable", t_iterable}, {"callable", t_callable}, {"odd", t_odd},           {"even", t_even},
      {"divisibleby", t_divisibleby}, {"eq", t_eq},       {"equalto", t_eq},        {"==", t_eq},
      {"ne", t_ne},           {"!=", t_ne},               {"lt", t_lt},             {"lessthan", t_lt},
      {"<", t_lt},            {"gt", t_gt},               {"greaterthan", t_gt},    {">", t_gt},
      {"le", t_le},           {"<=", t_le},               {"ge", t_ge},             {">=", t_ge},
      {"in", t_in},           {"sameas", t_sameas},       {"lower", t_lower},       {"upper", t_upper},
      {"escaped", t_escaped}, {"filter", t_filter},       {"test", t_test},
  };
  return m;
}

// ---- globals ----------------------------------------------------------------------------

Value g_range(CallArgs& a) {
  std::vector<int64_t> n;
  for (const Value& v : *a.pos) {
    if (v.kind != Value::Kind::Int && v.kind != Value::Kind::Bool) fail("range() arguments must be integers");
    n.push_back(v.kind == Value::Kind::Bool ? v.b : v.i);
  }
  int64_t start = 0, stop = 0, step = 1;
  if (n.size() == 1) stop = n[0];
  else if (n.size() == 2) start = n[0], stop = n[1];
  else if (n.size() == 3) start = n[0], stop = n[1], step = n[2];
  else fail("range expected 1 to 3 arguments, got {}", n.size());
  if (step == 0) fail("range() arg 3 must not be zero");
  List out;
  for (int64_t k = start; step > 0 ? k < stop : k > stop;) {
    if (out.size() >= 100000) fail("range too big, a sandboxed template may not create more than 100000 items");
    out.push_back(Value::integer(k));
    if (__builtin_add_overflow(k, step, &k)) break;  // past INT64_MAX/MIN: past `stop` too
  }
  return Value::make_list(std::move(out));
}

Dict collect_kwargs(CallArgs& a, bool allow_mapping_positional) {
  Dict d;
  auto put = [&](const std::string& k, const Value& v) {
    for (auto& [dk, dv] : d)
      if (dk == k) {
        dv = v;
        return;
      }
    d.emplace_back(k, v);
  };
  for (const Value& p : *a.pos) {
    if (!allow_mapping_positional || !p.is_dict()) fail("expected keyword arguments");
    for (const auto& [k, v] : *p.dict) put(k, v);
  }
  for (auto& [k, v] : *a.kw) put(k, v);
  return d;
}

Value g_namespace(CallArgs& a) { return Value::make_namespace(collect_kwargs(a, true)); }
Value g_dict(CallArgs& a) { return Value::make_dict(collect_kwargs(a, true)); }

Value g_raise_exception(CallArgs& a) {
  fail("{}", a.pos->empty() ? std::string("raise_exception() called") : py_str((*a.pos)[0]));
}

Value g_strftime_now(CallArgs& a) {
  if (a.pos->empty() || !(*a.pos)[0].is_string()) fail("strftime_now(format) needs a format string");
  // MOESERVE_TEST_NOW (Unix seconds) pins "now" so tests can compare against Python.
  std::time_t t = std::time(nullptr);
  if (const auto fixed = debug_flags().test_now) t = static_cast<std::time_t>(*fixed);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[512];
  size_t n = std::strftime(buf, sizeof buf, (*a.pos)[0].s.c_str(), &tm);
  return Value::string(std::string(buf, n));
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) != 0; }
bool has_test(const std::string& name) { return tests().count(name) != 0; }

Value apply_filter(const std::string& name, const Value& value, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) fail("No filter named '{}'.", name);
  ArgReader r{args, name.c_str()};
  return it->second(value, r);
}

bool apply_test(const std::string& name, const Value& value, CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) fail("No test named '{}'.", name);
  ArgReader r{args, name.c_str()};
  return it->second(value, r);
}

Value make_global(const std::string& name) {
  if (name == "range") return Value::function(g_range);
  if (name == "namespace") return Value::function(g_namespace);
  if (name == "dict") return Value::function(g_dict);
  if (name == "raise_exception") return Value::function(g_raise_exception);
  if (name == "strftime_now") return Value::function(g_strftime_now);
  return Value::undefined();
}

}  // namespace moeserve::jinja
