// Python string formatting (see format.h). Numbers go through snprintf, whose %f/%e/%g
// output matches Python's for the same precision.
#include "tokenizer/jinja/format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "tokenizer/jinja/builtins.h"

namespace moeserve::jinja {
namespace {

struct Spec {
  char32_t fill = U' ';
  char align = 0;  // < > ^ = (0: default)
  char sign = '-';
  bool alt = false;
  int width = 0;
  char group = 0;
  int prec = -1;
  char type = 0;
};

Spec parse_spec(const std::string& s) {
  Spec sp;
  std::u32string u = utf8_decode(s);
  size_t k = 0;
  auto is_align = [](char32_t c) { return c == U'<' || c == U'>' || c == U'^' || c == U'='; };
  if (u.size() >= 2 && is_align(u[1])) sp.fill = u[0], sp.align = static_cast<char>(u[1]), k = 2;
  else if (!u.empty() && is_align(u[0])) sp.align = static_cast<char>(u[0]), k = 1;
  if (k < u.size() && (u[k] == U'+' || u[k] == U'-' || u[k] == U' ')) sp.sign = static_cast<char>(u[k++]);
  if (k < u.size() && u[k] == U'#') sp.alt = true, ++k;
  if (k < u.size() && u[k] == U'0') {
    if (!sp.align) sp.fill = U'0', sp.align = '=';
    ++k;
  }
  while (k < u.size() && u[k] >= U'0' && u[k] <= U'9') sp.width = sp.width * 10 + static_cast<int>(u[k++] - U'0');
  if (k < u.size() && (u[k] == U',' || u[k] == U'_')) sp.group = static_cast<char>(u[k++]);
  if (k < u.size() && u[k] == U'.') {
    sp.prec = 0;
    if (++k >= u.size() || u[k] < U'0' || u[k] > U'9') fail("Format specifier missing precision");
    while (k < u.size() && u[k] >= U'0' && u[k] <= U'9') sp.prec = sp.prec * 10 + static_cast<int>(u[k++] - U'0');
  }
  if (k < u.size()) sp.type = static_cast<char>(u[k++]);
  if (k != u.size()) fail("Invalid format specifier '{}'", s);
  return sp;
}

std::string group_digits(const std::string& digits, char sep) {
  std::string out;
  int n = static_cast<int>(digits.size());
  for (int k = 0; k < n; ++k) {
    if (k && (n - k) % 3 == 0) out += sep;
    out += digits[static_cast<size_t>(k)];
  }
  return out;
}

std::string pad(const std::string& sign, const std::string& body, const Spec& sp, char dflt_align) {
  int len = static_cast<int>(utf8_decode(sign + body).size());
  if (len >= sp.width) return sign + body;
  std::string f;
  utf8_append(f, sp.fill);
  int n = sp.width - len;
  auto rep = [&](int m) { std::string o; for (int k = 0; k < m; ++k) o += f; return o; };
  switch (sp.align ? sp.align : dflt_align) {
    case '<': return sign + body + rep(n);
    case '^': return rep(n / 2) + sign + body + rep(n - n / 2);
    case '=': return sign + rep(n) + body;
    default: return rep(n) + sign + body;
  }
}

std::string cfmt(const char* f, int prec, double x) {
  char buf[512];
  int n = std::snprintf(buf, sizeof buf, f, prec, x);
  if (n < 0 || n >= static_cast<int>(sizeof buf)) fail("number too large to format");
  return std::string(buf, static_cast<size_t>(n));
}

std::string format_number(const Value& v, const Spec& sp) {
  bool is_float = v.kind == Value::Kind::Float;
  char t = sp.type;
  if (!t) t = is_float ? 0 : 'd';
  if (!is_float && (t == 'f' || t == 'F' || t == 'e' || t == 'E' || t == 'g' || t == 'G' || t == '%'))
    return format_number(Value::floating(v.as_double()), sp);
  if (is_float && (t == 'd' || t == 'x' || t == 'X' || t == 'o' || t == 'b' || t == 'c'))
    fail("Unknown format code '{}' for object of type 'float'", t);
  std::string sign, body;
  if (is_float) {
    double x = v.f;
    if (std::signbit(x) && !std::isnan(x)) sign = "-", x = -x;
    else if (sp.sign != '-') sign = std::string(1, sp.sign);
    if (std::isinf(x) || std::isnan(x)) body = std::isnan(x) ? "nan" : "inf";
    else if (t == 'f' || t == 'F') body = cfmt("%.*f", sp.prec < 0 ? 6 : sp.prec, x);
    else if (t == 'e' || t == 'E') body = cfmt(t == 'e' ? "%.*e" : "%.*E", sp.prec < 0 ? 6 : sp.prec, x);
    else if (t == 'g' || t == 'G') body = cfmt(t == 'g' ? "%.*g" : "%.*G", sp.prec < 0 ? 6 : std::max(sp.prec, 1), x);
    else if (t == '%') body = cfmt("%.*f", sp.prec < 0 ? 6 : sp.prec, x * 100) + "%";
    else if (sp.prec < 0) body = py_float_repr(x);
    else {  // no type, with precision: like 'g' but keeps a ".0" on whole numbers
      body = cfmt("%.*g", std::max(sp.prec, 1), x);
      if (body.find_first_of(".einf") == std::string::npos) body += ".0";
    }
    if (sp.group && (t == 'f' || t == 'F' || t == 0 || t == '%')) {
      size_t e = body.find_first_not_of("0123456789");
      body = group_digits(body.substr(0, e), sp.group) + (e == std::string::npos ? "" : body.substr(e));
    }
  } else {
    int64_t x = v.kind == Value::Kind::Bool ? v.b : v.i;
    uint64_t mag = x < 0 ? 0 - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
    if (x < 0) sign = "-";
    else if (sp.sign != '-') sign = std::string(1, sp.sign);
    if (t == 'c') return pad("", [&] { std::string o; utf8_append(o, static_cast<char32_t>(x)); return o; }(), sp, '<');
    int base = t == 'x' || t == 'X' ? 16 : t == 'o' ? 8 : t == 'b' ? 2 : 10;
    if (base == 10 && t != 'd' && t != 'n') fail("Unknown format code '{}' for object of type 'int'", t);
    const char* digs = t == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
    do { body.insert(body.begin(), digs[mag % static_cast<uint64_t>(base)]); mag /= static_cast<uint64_t>(base); } while (mag);
    if (sp.group) body = group_digits(body, sp.group);
    if (sp.alt && base != 10) sign += t == 'X' ? "0X" : t == 'x' ? "0x" : t == 'o' ? "0o" : "0b";
  }
  return pad(sign, body, sp, '>');
}

}  // namespace

std::string py_format_spec(const Value& v, const std::string& spec) {
  if (spec.empty()) return py_str(v);
  Spec sp = parse_spec(spec);
  if (v.is_number() && v.kind != Value::Kind::Bool) return format_number(v, sp);
  if (v.kind == Value::Kind::Bool && sp.type && sp.type != 's') return format_number(Value::integer(v.b), sp);
  if (sp.type && sp.type != 's') fail("Unknown format code '{}' for object of type '{}'", sp.type, v.type_name());
  if (!v.is_string() && v.kind != Value::Kind::Bool) fail("unsupported format string passed to {}.__format__", v.type_name());
  std::string s = py_str(v);
  if (sp.prec >= 0) {
    std::u32string u = utf8_decode(s);
    if (u.size() > static_cast<size_t>(sp.prec)) s = utf8_encode(u.substr(0, static_cast<size_t>(sp.prec)));
  }
  if (sp.align == '=') fail("'=' alignment not allowed in string format specifier");
  return pad("", s, sp, '<');
}

std::string py_percent_format(const std::string& f, const Value& args) {
  List a = args.is_list() && args.is_tuple ? *args.list : List{args};
  const Value* mapping = args.is_dict() ? &args : nullptr;
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t k = 0; k < f.size(); ++k) {
    if (f[k] != '%') {
      out += f[k];
      continue;
    }
    if (++k >= f.size()) fail("incomplete format");
    const Value* v = nullptr;
    if (f[k] == '(') {
      size_t e = f.find(')', k);
      if (e == std::string::npos) fail("incomplete format key");
      if (!mapping) fail("format requires a mapping");
      v = mapping->find(f.substr(k + 1, e - k - 1));
      if (!v) fail("KeyError: '{}'", f.substr(k + 1, e - k - 1));
      used_mapping = true;
      k = e + 1;
    }
    Spec sp;
    bool left = false, zero = false;
    for (; k < f.size() && std::string("-+ #0").find(f[k]) != std::string::npos; ++k) {
      if (f[k] == '-') left = true;
      else if (f[k] == '0') zero = true;
      else if (f[k] == '#') sp.alt = true;
      else if (sp.sign != '+') sp.sign = f[k];
    }
    while (k < f.size() && std::isdigit(static_cast<unsigned char>(f[k]))) sp.width = sp.width * 10 + (f[k++] - '0');
    if (k < f.size() && f[k] == '.') {
      sp.prec = 0;
      while (++k < f.size() && std::isdigit(static_cast<unsigned char>(f[k]))) sp.prec = sp.prec * 10 + (f[k] - '0');
    }
    if (k >= f.size()) fail("incomplete format");
    char c = f[k];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (!v) {
      if (next >= a.size()) fail("not enough arguments for format string");
      v = &a[next++];
    }
    sp.align = left ? '<' : '>';
    if (c == 's' || c == 'r' || c == 'a') {
      std::string s = c == 's' ? py_str(*v) : py_repr(*v);
      if (sp.prec >= 0) {
        std::u32string u = utf8_decode(s);
        if (u.size() > static_cast<size_t>(sp.prec)) s = utf8_encode(u.substr(0, static_cast<size_t>(sp.prec)));
      }
      out += pad("", s, sp, '>');
      continue;
    }
    if (std::string("diouxXeEfFgGc").find(c) == std::string::npos) fail("unsupported format character '{}'", c);
    if (!v->is_number()) fail("%{} format: a real number is required, not {}", c, v->type_name());
    if (zero && !left) sp.fill = U'0', sp.align = '=';
    Value num = *v;
    if (c == 'd' || c == 'i' || c == 'u' || c == 'x' || c == 'X' || c == 'o' || c == 'c') {
      if (num.kind == Value::Kind::Float) {
        if (c == 'x' || c == 'X' || c == 'o' || c == 'c') fail("%{} format: an integer is required, not float", c);
        num = Value::integer(static_cast<int64_t>(num.f));
      }
      sp.type = c == 'i' || c == 'u' ? 'd' : c;
    } else {
      sp.type = c;
      if (sp.prec < 0) sp.prec = 6;
    }
    out += format_number(num, sp);
  }
  if (!used_mapping && !mapping && next < a.size()) fail("not all arguments converted during string formatting");
  return out;
}

std::string py_str_format(const std::string& fmt_s, CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t k = 0; k < fmt_s.size(); ++k) {
    char c = fmt_s[k];
    if (c == '{' && k + 1 < fmt_s.size() && fmt_s[k + 1] == '{') { out += '{'; ++k; continue; }
    if (c == '}' && k + 1 < fmt_s.size() && fmt_s[k + 1] == '}') { out += '}'; ++k; continue; }
    if (c == '}') fail("Single '}}' encountered in format string");
    if (c != '{') { out += c; continue; }
    size_t e = fmt_s.find('}', k);
    if (e == std::string::npos) fail("Single '{{' encountered in format string");
    std::string field = fmt_s.substr(k + 1, e - k - 1), spec, conv;
    if (size_t colon = field.find(':'); colon != std::string::npos) spec = field.substr(colon + 1), field.resize(colon);
    if (size_t bang = field.find('!'); bang != std::string::npos) conv = field.substr(bang + 1), field.resize(bang);
    const Value* v = nullptr;
    if (field.empty()) {
      if (auto_idx < a.pos->size()) v = &(*a.pos)[auto_idx++];
      else fail("Replacement index {} out of range for positional args tuple", auto_idx);
    } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
      size_t idx = std::stoul(field);
      if (idx < a.pos->size()) v = &(*a.pos)[idx];
      else fail("Replacement index {} out of range for positional args tuple", idx);
    } else {
      for (auto& [kn, kv] : *a.kw)
        if (kn == field) v = &kv;
      if (!v) fail("KeyError: '{}'", field);
    }
    Value val = *v;
    if (conv == "r" || conv == "a") val = Value::string(py_repr(*v));
    else if (conv == "s") val = Value::string(py_str(*v));
    else if (!conv.empty()) fail("Unknown conversion specifier {}", conv);
    out += py_format_spec(val, spec);
    k = e;
  }
  return out;
}

}  // namespace moeserve::jinja
