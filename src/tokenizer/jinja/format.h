// Python string formatting as chat templates use it: `'%5.2f' % x`, `'{:>8}'.format(x)`,
// format(x, spec) and the `format` filter.
#pragma once
#include <string>

#include "tokenizer/jinja/value.h"

namespace moeserve::jinja {

// format(v, spec) with Python's mini-language: [[fill]align][sign][#][0][width][,|_][.prec][type].
std::string py_format_spec(const Value& v, const std::string& spec);
// printf-style `fmt % args` (args: a tuple, a dict for %(name)s, or a single value).
std::string py_percent_format(const std::string& fmt, const Value& args);
// str.format(*pos, **kw): {} {0} {name} fields with !r/!s and :spec.
std::string py_str_format(const std::string& fmt, CallArgs& a);

}  // namespace moeserve::jinja
