// Less common jinja2 filters: wordcount, center, truncate, batch, slice, groupby, format.
#include <algorithm>

#include <utf8proc.h>

#include "core/error.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/format.h"

namespace moeserve::jinja {

Value f_wordcount(const Value& v, ArgReader&) {
  // len(re.findall(r"\w+", s)): runs of letters, numbers and '_'.
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : utf8_decode(py_str(v))) {
    auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    bool w = c == U'_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
             (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

Value f_center(const Value& v, ArgReader& r) {
  const Value* w = r.arg(0, "width");
  std::vector<Value> pos{w ? *w : Value::integer(80)};
  std::vector<std::pair<std::string, Value>> kw;
  CallArgs ca{&pos, &kw, r.a.line};
  return (*get_attr(Value::string(py_str(v)), "center").fn)(ca);
}

Value f_truncate(const Value& v, ArgReader& r) {
  const Value *len = r.arg(0, "length"), *kill = r.arg(1, "killwords"), *end = r.arg(2, "end"), *lee = r.arg(3, "leeway");
  std::u32string s = utf8_decode(py_str(v));
  int64_t length = len ? len->i : 255, leeway = lee && !lee->is_none() ? lee->i : 5;
  std::u32string e = utf8_decode(end ? py_str(*end) : "...");
  if (length < static_cast<int64_t>(e.size())) fail("expected length >= {}, got {}", e.size(), length);
  if (leeway < 0) fail("expected leeway >= 0, got {}", leeway);
  if (static_cast<int64_t>(s.size()) <= length + leeway) return Value::string(utf8_encode(s));
  std::u32string head = s.substr(0, static_cast<size_t>(length) - e.size());
  if (!(kill && kill->truthy())) {
    size_t sp = head.rfind(U' ');
    if (sp != std::u32string::npos) head.resize(sp);
  }
  return Value::string(utf8_encode(head + e));
}

Value f_batch(const Value& v, ArgReader& r) {
  const Value* n = r.arg(0, "linecount");
  const Value* fill = r.arg(1, "fill_with");
  if (!n || n->kind != Value::Kind::Int || n->i <= 0) fail("batch() needs a positive line count");
  List out, cur;
  for (const Value& x : iterate(v)) {
    if (static_cast<int64_t>(cur.size()) == n->i) out.push_back(Value::make_list(std::move(cur))), cur.clear();
    cur.push_back(x);
  }
  if (!cur.empty()) {
    if (fill && !fill->is_none())
      while (static_cast<int64_t>(cur.size()) < n->i) cur.push_back(*fill);
    out.push_back(Value::make_list(std::move(cur)));
  }
  return Value::make_list(std::move(out));
}

Value f_slice(const Value& v, ArgReader& r) {
  const Value* n = r.arg(0, "slices");
  const Value* fill = r.arg(1, "fill_with");
  if (!n || n->kind != Value::Kind::Int || n->i <= 0) fail("slice() needs a positive number of slices");
  List seq = iterate(v), out;
  int64_t len = static_cast<int64_t>(seq.size()), per = len / n->i, extra = len % n->i, offset = 0;
  for (int64_t k = 0; k < n->i; ++k) {
    int64_t start = offset + k * per;
    if (k < extra) ++offset;
    int64_t stop = offset + (k + 1) * per;
    List part(seq.begin() + start, seq.begin() + stop);
    if (fill && !fill->is_none() && k >= extra) part.push_back(*fill);
    out.push_back(Value::make_list(std::move(part)));
  }
  return Value::make_list(std::move(out));
}

Value f_groupby(const Value& v, ArgReader& r) {
  const Value* attr = r.arg(0, "attribute");
  if (!attr) fail("groupby() missing required argument 'attribute'");
  const Value* dflt = r.arg(1, "default");
  const Value* csv = r.arg(2, "case_sensitive");
  bool cs = csv && csv->truthy();
  auto raw = [&](const Value& x) {
    Value k = attr_path(x, *attr);
    return k.is_undefined() && dflt ? *dflt : k;
  };
  List items = iterate(v);
  std::stable_sort(items.begin(), items.end(),
                   [&](const Value& a, const Value& b) { return py_less(sort_key(raw(a), cs), sort_key(raw(b), cs)); });
  List out;
  List group;
  Value key;
  auto flush = [&] {
    if (group.empty()) return;
    Value g = Value::make_list({raw(group.front()), Value::make_list(std::move(group))}, true);
    g.group_tuple = true;  // prints as a tuple, unpacks as (grouper, list), has .grouper/.list
    out.push_back(std::move(g));
    group.clear();
  };
  for (const Value& x : items) {
    Value k = sort_key(raw(x), cs);
    if (!group.empty() && !py_equal(k, key)) flush();
    key = k;
    group.push_back(x);
  }
  flush();
  return Value::make_list(std::move(out));
}

Value f_format(const Value& v, ArgReader& r) {
  // `"%s-%s" | format(a, b)` is `value % args` (or `% kwargs`).
  if (!r.a.pos->empty() && !r.a.kw->empty()) fail("can't handle positional and keyword arguments at the same time");
  if (!r.a.kw->empty()) {
    Dict d(r.a.kw->begin(), r.a.kw->end());
    return Value::string(py_percent_format(py_str(v), Value::make_dict(std::move(d))));
  }
  return Value::string(py_percent_format(py_str(v), Value::make_list(*r.a.pos, true)));
}

}  // namespace moeserve::jinja
