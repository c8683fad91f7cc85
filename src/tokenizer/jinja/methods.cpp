// Attribute/item access, slicing, iteration, and the Python methods of str, dict and list
// that chat templates call (content.split('</think>'), args.items(), ...).
#include <utf8proc.h>

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/format.h"

namespace moeserve::jinja {

const Value* ArgReader::arg(size_t idx, const char* name) const {
  if (idx < a.pos->size()) return &(*a.pos)[idx];
  if (name)
    for (auto& [k, v] : *a.kw)
      if (k == name) return &v;
  return nullptr;
}

void ArgReader::max_args(size_t n) const {
  if (a.pos->size() > n) fail("{}() takes at most {} positional argument(s) ({} given)", fname, n, a.pos->size());
}

[[noreturn]] void undefined_error(const Value& u) { fail("{}", u.s.empty() ? "value is undefined" : u.s); }

int64_t py_len(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: {
      int64_t n = 0;
      for (unsigned char c : v.s) n += (c & 0xc0) != 0x80;
      return n;
    }
    case Value::Kind::List: return static_cast<int64_t>(v.list->size());
    case Value::Kind::Dict: return static_cast<int64_t>(v.dict->size());
    default: fail("object of type '{}' has no len()", v.type_name());
  }
}

List iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return *v.list;
    case Value::Kind::Dict: {
      List keys;
      for (const auto& [k, e] : *v.dict) keys.push_back(key_value(k));
      return keys;
    }
    case Value::Kind::String: {
      List chars;
      for (char32_t c : utf8_decode(v.s)) {
        std::string one;
        utf8_append(one, c);
        chars.push_back(Value::string(std::move(one)));
      }
      return chars;
    }
    default: fail("'{}' object is not iterable", v.type_name());
  }
}

namespace {

std::string strip_impl(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string u = utf8_decode(s);
  std::u32string set;
  bool use_set = chars && !chars->is_none() && !chars->is_undefined();
  if (use_set) {
    if (!chars->is_string()) fail("strip arg must be None or str");
    set = utf8_decode(chars->s);
  }
  auto strip_it = [&](char32_t c) { return use_set ? set.find(c) != std::u32string::npos : py_isspace(c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return utf8_encode(u.substr(b, e - b));
}

Value split_impl(const std::string& s, const Value* sep, const Value* maxsplit_v, bool from_right) {
  int64_t maxsplit = maxsplit_v && maxsplit_v->is_number() ? maxsplit_v->i : -1;
  List out;
  if (!sep || sep->is_none()) {  // whitespace split, runs collapse, no empty strings
    std::u32string u = utf8_decode(s);
    std::vector<std::u32string> parts;
    if (!from_right) {
      size_t k = 0;
      while (k < u.size()) {
        while (k < u.size() && py_isspace(u[k])) ++k;
        if (k >= u.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          size_t e = u.size();
          while (e > k && py_isspace(u[e - 1])) --e;
          parts.push_back(u.substr(k, e - k));
          break;
        }
        size_t b = k;
        while (k < u.size() && !py_isspace(u[k])) ++k;
        parts.push_back(u.substr(b, k - b));
      }
    } else {
      size_t k = u.size();
      while (k > 0) {
        while (k > 0 && py_isspace(u[k - 1])) --k;
        if (k == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          size_t b = 0;
          while (b < k && py_isspace(u[b])) ++b;
          parts.push_back(u.substr(b, k - b));
          break;
        }
        size_t e = k;
        while (k > 0 && !py_isspace(u[k - 1])) --k;
        parts.push_back(u.substr(k, e - k));
      }
      std::reverse(parts.begin(), parts.end());
    }
    for (auto& p : parts) out.push_back(Value::string(utf8_encode(p)));
    return Value::make_list(std::move(out));
  }
  if (!sep->is_string()) fail("must be str or None, not {}", sep->type_name());
  const std::string& d = sep->s;
  if (d.empty()) fail("empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    while (true) {
      size_t hit = s.find(d, start);
      if (hit == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
        parts.push_back(s.substr(start));
        break;
      }
      parts.push_back(s.substr(start, hit - start));
      start = hit + d.size();
    }
  } else {
    size_t end = s.size();
    while (true) {
      size_t hit = end >= d.size() ? s.rfind(d, end - d.size()) : std::string::npos;
      if (hit == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
        parts.push_back(s.substr(0, end));
        break;
      }
      parts.push_back(s.substr(hit + d.size(), end - hit - d.size()));
      end = hit;
    }
    std::reverse(parts.begin(), parts.end());
  }
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return Value::make_list(std::move(out));
}

std::string map_case(const std::string& s, int mode) {  // 0 lower, 1 upper
  std::string out;
  for (char32_t c : utf8_decode(s)) {
    auto cp = static_cast<utf8proc_int32_t>(c);
    utf8_append(out, static_cast<char32_t>(mode ? utf8proc_toupper(cp) : utf8proc_tolower(cp)));
  }
  return out;
}

bool is_cased_letter(char32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

std::string replace_impl(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every character
    std::u32string u = utf8_decode(s);
    int64_t n = 0;
    for (size_t k = 0; k <= u.size(); ++k) {
      if (count < 0 || n < count) out += to, ++n;
      if (k < u.size()) utf8_append(out, u[k]);
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t hit = s.find(from, start);
    if (hit == std::string::npos) break;
    out.append(s, start, hit - start);
    out += to;
    start = hit + from.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

bool prefix_match(const std::string& s, const Value& arg, bool suffix) {
  auto one = [&](const Value& p) {
    if (!p.is_string()) fail("startswith/endswith first arg must be str or a tuple of str, not {}", p.type_name());
    if (p.s.size() > s.size()) return false;
    return suffix ? s.compare(s.size() - p.s.size(), p.s.size(), p.s) == 0 : s.compare(0, p.s.size(), p.s) == 0;
  };
  if (arg.is_list()) {
    for (const Value& p : *arg.list)
      if (one(p)) return true;
    return false;
  }
  return one(arg);
}

// Less common str methods: center/ljust/rjust/zfill, swapcase, partition/rpartition,
// splitlines, removeprefix/removesuffix, expandtabs, istitle.
Value str_method_more(const std::string& s, const std::string& name, ArgReader& r) {
  std::u32string u = utf8_decode(s);
  if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
    const Value* w = r.arg(0, nullptr);
    if (!w || w->kind != Value::Kind::Int) fail("{}() argument 1 must be int", name);
    char32_t fill = U' ';
    if (const Value* fc = r.arg(1, nullptr)) {
      std::u32string f = fc->is_string() ? utf8_decode(fc->s) : std::u32string();
      if (f.size() != 1) fail("The fill character must be exactly one character long");
      fill = f[0];
    }
    int64_t marg = w->i - static_cast<int64_t>(u.size());
    if (marg <= 0) return Value::string(s);
    int64_t left = name == "ljust" ? 0 : name == "center" ? marg / 2 + (marg & w->i & 1) : marg;
    if (name == "zfill") {
      std::u32string out = u;
      size_t at = !u.empty() && (u[0] == U'+' || u[0] == U'-') ? 1 : 0;
      out.insert(at, static_cast<size_t>(marg), U'0');
      return Value::string(utf8_encode(out));
    }
    std::u32string out(static_cast<size_t>(left), fill);
    out += u;
    out.append(static_cast<size_t>(marg - left), fill);
    return Value::string(utf8_encode(out));
  }
  if (name == "swapcase") {
    std::string out;
    for (char32_t c : u) {
      auto cp = static_cast<utf8proc_int32_t>(c);
      auto cat = utf8proc_category(cp);
      utf8_append(out, static_cast<char32_t>(cat == UTF8PROC_CATEGORY_LU ? utf8proc_tolower(cp)
                                               : cat == UTF8PROC_CATEGORY_LL ? utf8proc_toupper(cp) : cp));
    }
    return Value::string(out);
  }
  if (name == "partition" || name == "rpartition") {
    const Value* sep = r.arg(0, nullptr);
    if (!sep || !sep->is_string()) fail("must be str");
    if (sep->s.empty()) fail("empty separator");
    size_t p = name == "partition" ? s.find(sep->s) : s.rfind(sep->s);
    if (p == std::string::npos)
      return name == "partition" ? Value::make_list({Value::string(s), Value::string(""), Value::string("")}, true)
                                 : Value::make_list({Value::string(""), Value::string(""), Value::string(s)}, true);
    return Value::make_list({Value::string(s.substr(0, p)), *sep, Value::string(s.substr(p + sep->s.size()))}, true);
  }
  if (name == "splitlines") {
    bool keep = r.arg(0, "keepends") && r.arg(0, "keepends")->truthy();
    List out;
    std::u32string cur;
    for (size_t k = 0; k < u.size(); ++k) {
      char32_t c = u[k];
      bool brk = c == U'\n' || c == U'\r' || c == U'\v' || c == U'\f' || (c >= 0x1c && c <= 0x1e) || c == 0x85 ||
                 c == 0x2028 || c == 0x2029;
      if (!brk) { cur += c; continue; }
      std::u32string end(1, c);
      if (c == U'\r' && k + 1 < u.size() && u[k + 1] == U'\n') end += u[++k];
      out.push_back(Value::string(utf8_encode(keep ? cur + end : cur)));
      cur.clear();
    }
    if (!cur.empty()) out.push_back(Value::string(utf8_encode(cur)));
    return Value::make_list(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const Value* a = r.arg(0, nullptr);
    if (!a || !a->is_string()) fail("{}() argument must be str", name);
    if (name == "removeprefix") return Value::string(s.rfind(a->s, 0) == 0 ? s.substr(a->s.size()) : s);
    bool ends = s.size() >= a->s.size() && s.compare(s.size() - a->s.size(), a->s.size(), a->s) == 0;
    return Value::string(ends && !a->s.empty() ? s.substr(0, s.size() - a->s.size()) : s);
  }
  if (name == "expandtabs") {
    const Value* ts = r.arg(0, "tabsize");
    int64_t tab = ts ? ts->i : 8, col = 0;
    std::u32string out;
    for (char32_t c : u) {
      if (c == U'\t') {
        int64_t n = tab > 0 ? tab - col % tab : 0;
        out.append(static_cast<size_t>(n), U' ');
        col += n;
      } else {
        out += c;
        col = c == U'\n' || c == U'\r' ? 0 : col + 1;
      }
    }
    return Value::string(utf8_encode(out));
  }
  if (name == "istitle") {
    bool prev_cased = false, any = false;
    for (char32_t c : u) {
      auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
      if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT) {
        if (prev_cased) return Value::boolean(false);
        prev_cased = any = true;
      } else if (cat == UTF8PROC_CATEGORY_LL) {
        if (!prev_cased) return Value::boolean(false);
        prev_cased = any = true;
      } else {
        prev_cased = false;
      }
    }
    return Value::boolean(any);
  }
  fail("'str' object has no attribute '{}'", name);
}

Value str_method(const std::string& s, const std::string& name, CallArgs& ca) {
  ArgReader r{ca, name.c_str()};
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Value::string(strip_impl(s, r.arg(0, "chars"), name != "rstrip", name != "lstrip"));
  if (name == "split" || name == "rsplit") return split_impl(s, r.arg(0, "sep"), r.arg(1, "maxsplit"), name == "rsplit");
  if (name == "startswith" || name == "endswith") {
    const Value* p = r.arg(0, nullptr);
    if (!p) fail("{}() takes at least 1 argument", name);
    return Value::boolean(prefix_match(s, *p, name == "endswith"));
  }
  if (name == "upper") return Value::string(map_case(s, 1));
  if (name == "lower") return Value::string(map_case(s, 0));
  if (name == "title" || name == "capitalize") {
    std::string out;
    bool prev_cased = false, first = true;
    for (char32_t c : utf8_decode(s)) {
      auto cp = static_cast<utf8proc_int32_t>(c);
      bool up = name == "title" ? !prev_cased : first;
      utf8_append(out, static_cast<char32_t>(up ? utf8proc_totitle(cp) : utf8proc_tolower(cp)));
      prev_cased = is_cased_letter(c);
      first = false;
    }
    return Value::string(out);
  }
  if (name == "replace") {
    const Value *a = r.arg(0, nullptr), *b = r.arg(1, nullptr), *c = r.arg(2, "count");
    if (!a || !b || !a->is_string() || !b->is_string()) fail("replace() arguments must be str");
    return Value::string(replace_impl(s, a->s, b->s, c && c->is_number() ? c->i : -1));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    const Value* a = r.arg(0, nullptr);
    if (!a || !a->is_string()) fail("{}() argument must be str", name);
    if (name == "count") {
      if (a->s.empty()) return Value::integer(py_len(Value::string(s)) + 1);
      int64_t n = 0;
      for (size_t p = s.find(a->s); p != std::string::npos; p = s.find(a->s, p + a->s.size())) ++n;
      return Value::integer(n);
    }
    size_t p = (name == "find" || name == "index") ? s.find(a->s) : s.rfind(a->s);
    if (p == std::string::npos) {
      if (name == "index" || name == "rindex") fail("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(py_len(Value::string(s.substr(0, p))));
  }
  if (name == "join") {
    const Value* a = r.arg(0, nullptr);
    if (!a) fail("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& x : iterate(*a)) {
      if (!x.is_string()) fail("sequence item: expected str instance, {} found", x.type_name());
      if (!first) out += s;
      first = false;
      out += x.s;
    }
    return Value::string(out);
  }
  if (name == "format") return Value::string(py_str_format(s, ca));
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
      name == "islower") {
    std::u32string u = utf8_decode(s);
    if (u.empty()) return Value::boolean(false);
    bool any_cased = false;
    for (char32_t c : u) {
      auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
      bool letter = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
      bool digit = cat == UTF8PROC_CATEGORY_ND;
      if (name == "isdigit" && !digit) return Value::boolean(false);
      if (name == "isalpha" && !letter) return Value::boolean(false);
      if (name == "isalnum" && !letter && !digit && cat != UTF8PROC_CATEGORY_NL && cat != UTF8PROC_CATEGORY_NO)
        return Value::boolean(false);
      if (name == "isspace" && !py_isspace(c)) return Value::boolean(false);
      if (name == "isupper" && cat == UTF8PROC_CATEGORY_LL) return Value::boolean(false);
      if (name == "islower" && (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT)) return Value::boolean(false);
      any_cased |= is_cased_letter(c);
    }
    if (name == "isupper" || name == "islower") return Value::boolean(any_cased);
    return Value::boolean(true);
  }
  return str_method_more(s, name, r);
}

Value dict_method(const Value& d, const std::string& name, CallArgs& ca) {
  ArgReader r{ca, name.c_str()};
  if (name == "items") {
    List out;
    for (const auto& [k, v] : *d.dict) out.push_back(Value::make_list({key_value(k), v}, true));
    return Value::make_list(std::move(out));
  }
  if (name == "keys") return Value::make_list(iterate(d));
  if (name == "values") {
    List out;
    for (const auto& [k, v] : *d.dict) out.push_back(v);
    return Value::make_list(std::move(out));
  }
  if (name == "get") {
    const Value* key = r.arg(0, nullptr);
    if (!key) fail("get expected at least 1 argument, got 0");
    const Value* dflt = r.arg(1, nullptr);
    if (const Value* v = find_key(d, *key)) return *v;
    return dflt ? *dflt : Value::none();
  }
  if (name == "copy") return Value::make_dict(*d.dict);
  fail("'dict' object has no attribute '{}'", name);
}

Value list_method(const Value& l, const std::string& name, CallArgs& ca) {
  ArgReader r{ca, name.c_str()};
  const Value* x = r.arg(0, nullptr);
  if (!x) fail("{}() takes exactly one argument (0 given)", name);
  int64_t n = 0, idx = -1;
  for (size_t k = 0; k < l.list->size(); ++k)
    if (py_equal((*l.list)[k], *x)) {
      if (idx < 0) idx = static_cast<int64_t>(k);
      ++n;
    }
  if (name == "count") return Value::integer(n);
  if (idx < 0) fail("value is not in list");
  return Value::integer(idx);
}

bool is_one_of(const std::string& n, std::initializer_list<const char*> names) {
  for (const char* x : names)
    if (n == x) return true;
  return false;
}

Value bind_method(Value self, std::string name, Value (*impl)(const Value&, const std::string&, CallArgs&)) {
  return Value::function([self = std::move(self), name = std::move(name), impl](CallArgs& a) { return impl(self, name, a); });
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Value::Kind::Undefined: undefined_error(obj);
    case Value::Kind::String:
      if (is_one_of(name, {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper", "lower",
                           "title", "capitalize", "replace", "find", "rfind", "index", "rindex", "count", "join",
                           "format", "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", "center", "ljust",
                           "rjust", "zfill", "swapcase", "partition", "rpartition", "splitlines", "removeprefix",
                           "removesuffix", "expandtabs", "istitle"}))
        return bind_method(obj, name, [](const Value& self, const std::string& n, CallArgs& a) { return str_method(self.s, n, a); });
      break;
    case Value::Kind::Dict:
      if (is_one_of(name, {"items", "keys", "values", "get", "copy"})) return bind_method(obj, name, dict_method);
      if (is_one_of(name, {"update", "pop", "popitem", "setdefault", "clear"}))
        return Value::undefined(fmt::format("access to attribute '{}' of 'dict' object is unsafe.", name));
      if (const Value* v = obj.find(name)) return *v;
      break;
    case Value::Kind::Namespace:
      if (const Value* v = obj.find(name)) return *v;
      break;
    case Value::Kind::List:
      if (obj.group_tuple && (name == "grouper" || name == "list")) return (*obj.list)[name == "grouper" ? 0 : 1];
      if (is_one_of(name, {"index", "count"})) return bind_method(obj, name, list_method);
      if (is_one_of(name, {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"}))
        return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, obj.type_name()));
      break;
    default: break;
  }
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", obj.type_name(), name));
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if ((obj.is_dict() || obj.kind == Value::Kind::Namespace) && key.is_string()) {
    if (const Value* v = obj.find(key.s)) return *v;
    if (obj.is_dict()) return get_attr(obj, key.s);
  }
  if (obj.is_dict() && !key.is_string()) {
    if (const Value* v = find_key(obj, key)) return *v;
    return Value::undefined(fmt::format("dict object has no element {}", py_repr(key)));
  }
  if ((obj.is_list() || obj.is_string()) && (key.kind == Value::Kind::Int || key.kind == Value::Kind::Bool)) {
    int64_t idx = key.kind == Value::Kind::Bool ? key.b : key.i;
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.list->size());
      if (idx < 0) idx += n;
      if (idx >= 0 && idx < n) return (*obj.list)[static_cast<size_t>(idx)];
    } else {
      std::u32string u = utf8_decode(obj.s);
      int64_t n = static_cast<int64_t>(u.size());
      if (idx < 0) idx += n;
      if (idx >= 0 && idx < n) return Value::string(utf8_encode(u.substr(static_cast<size_t>(idx), 1)));
    }
    return Value::undefined(fmt::format("{} object has no element {}", obj.type_name(), idx));
  }
  if (key.is_string() && obj.kind != Value::Kind::Dict) return get_attr(obj, key.s);
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", obj.type_name(), py_str(key)));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) undefined_error(obj);
  auto as_opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (v.kind == Value::Kind::Int) return v.i;
    if (v.kind == Value::Kind::Bool) return v.b;
    fail("slice {} must be an integer or None", what);
  };
  std::optional<int64_t> a = as_opt(start, "start"), b = as_opt(stop, "stop"), c = as_opt(step, "step");
  int64_t st = c.value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  auto take = [&](int64_t n, auto&& emit) {
    auto norm = [&](std::optional<int64_t> x, int64_t dflt) {
      if (!x) return dflt;
      int64_t v = *x < 0 ? *x + n : *x;
      if (st > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    int64_t from = norm(a, st > 0 ? 0 : n - 1), to = norm(b, st > 0 ? n : -1);
    for (int64_t k = from; st > 0 ? k < to : k > to; k += st) emit(static_cast<size_t>(k));
  };
  if (obj.is_list()) {
    List out;
    take(static_cast<int64_t>(obj.list->size()), [&](size_t k) { out.push_back((*obj.list)[k]); });
    return Value::make_list(std::move(out), obj.is_tuple);
  }
  if (obj.is_string()) {
    std::u32string u = utf8_decode(obj.s), out;
    take(static_cast<int64_t>(u.size()), [&](size_t k) { out.push_back(u[k]); });
    return Value::string(utf8_encode(out));
  }
  fail("'{}' object is not subscriptable", obj.type_name());
}

}  // namespace moeserve::jinja
