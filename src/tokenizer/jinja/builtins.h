// Built-in filters, tests, globals and Python methods (str/dict/list) of the Jinja engine.
#pragma once
#include <string>

#include "tokenizer/jinja/value.h"

namespace moeserve::jinja {

// Positional + keyword argument access for builtins: arg(i, "name") returns the i-th
// positional or the keyword `name`, or nullptr.
struct ArgReader {
  CallArgs& a;
  const char* fname;
  const Value* arg(size_t idx, const char* name) const;
  size_t npos() const { return a.pos->size(); }
  void max_args(size_t n) const;  // errors on too many positionals / unknown keywords handled loosely
};

// jinja2 make_attrgetter: dotted path ("a.b.0"), integer parts index, item-first lookup.
Value attr_path(const Value& item, const Value& attr);
// Sort key: strings lower-cased unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive);

// Sequence and text filters defined in filters_more.cpp (registered by builtins.cpp).
Value f_wordcount(const Value& v, ArgReader& r);
Value f_center(const Value& v, ArgReader& r);
Value f_truncate(const Value& v, ArgReader& r);
Value f_batch(const Value& v, ArgReader& r);
Value f_slice(const Value& v, ArgReader& r);
Value f_groupby(const Value& v, ArgReader& r);
Value f_format(const Value& v, ArgReader& r);

bool has_filter(const std::string& name);
bool has_test(const std::string& name);
// `value | name(args)`. Throws moeserve::Error (without line; the caller adds it).
Value apply_filter(const std::string& name, const Value& value, CallArgs& args);
// `value is name(args)`.
bool apply_test(const std::string& name, const Value& value, CallArgs& args);
// obj.name: bound methods of str/dict/list first (Python getattr), then items.
Value get_attr(const Value& obj, const std::string& name);
// obj[key]: items first, then attributes (jinja2 getitem).
Value get_item(const Value& obj, const Value& key);
// Python slicing obj[start:stop:step]; null entries are Undefined/None values.
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Python iteration: list items, dict keys, string characters; Undefined iterates empty.
List iterate(const Value& v);
// len(v) (code points for strings); throws for unsized values.
int64_t py_len(const Value& v);
// Global functions: range, dict, namespace, raise_exception, strftime_now, ...
Value make_global(const std::string& name);
// Throws the UndefinedError for an Undefined operand.
[[noreturn]] void undefined_error(const Value& u);

}  // namespace moeserve::jinja
