#include "structured/json_schema.h"
#include "core/bounded_json.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>

#include "structured/regex.h"

namespace moeserve::structured {
namespace {

using json = nlohmann::ordered_json;

const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$schema", "$id",
                                             "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                             "definitions", "strict", "discriminator", "example", "$anchor"};
const std::set<std::string> kKnown = {"type", "properties", "required", "additionalProperties", "enum", "const",
                                       "anyOf", "oneOf", "allOf", "items", "prefixItems", "minItems", "maxItems",
                                       "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
                                       "exclusiveMinimum", "exclusiveMaximum", "$ref", "nullable", "uniqueItems"};

const std::map<std::string, std::string> kFormats = {
    {"date", R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))"},
    {"time", R"(([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
    {"date-time",
     R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
    {"email",
     R"([a-zA-Z0-9.!#$%&'*+/=?^_`{|}~-]+@[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*)"},
    {"uri", R"([a-zA-Z][a-zA-Z0-9+.\-]*:[^\x00-\x20"\\<>^`{|}\x7f]*)"},
    {"ipv4", R"(((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))"},
};

ByteSet digits(int lo, int hi) {
  ByteSet b;
  for (int d = lo; d <= hi; ++d) b.set('0' + d);
  return b;
}

int num_digits(int64_t v) {
  int n = 1;
  while (v >= 10) { v /= 10; ++n; }
  return n;
}

int64_t pow10(int w) {
  int64_t p = 1;
  while (w-- > 0) p *= 10;
  return p;
}

// Fixed-width decimal strings in [lo, hi] (leading zeros allowed) as digit-class sequences.
void range_fixed(int64_t lo, int64_t hi, int w, Alt prefix, std::vector<Alt>& out) {
  if (w == 0) { out.push_back(std::move(prefix)); return; }
  int64_t p = pow10(w - 1);
  int64_t dl = lo / p, dh = hi / p;
  auto with = [&](int a, int b) { Alt x = prefix; x.push_back(Symbol::set(digits(a, b))); return x; };
  if (dl == dh) { range_fixed(lo % p, hi % p, w - 1, with(int(dl), int(dl)), out); return; }
  if (lo % p != 0) { range_fixed(lo % p, p - 1, w - 1, with(int(dl), int(dl)), out); ++dl; }
  bool tail = hi % p != p - 1;
  if (tail) --dh;
  if (dl <= dh) {
    Alt x = with(int(dl), int(dh));
    for (int k = 1; k < w; ++k) x.push_back(Symbol::set(digits(0, 9)));
    out.push_back(std::move(x));
  }
  if (tail) range_fixed(0, hi % p, w - 1, with(int(hi / p), int(hi / p)), out);
}

// Natural numbers in [lo, hi] written without leading zeros; hi < 0 means unbounded.
void natural_range(Grammar& g, int64_t lo, int64_t hi, std::vector<Alt>& out) {
  int dlo = num_digits(lo);
  int dhi = hi < 0 ? dlo : num_digits(hi);
  for (int d = dlo; d <= dhi; ++d) {
    int64_t a = std::max<int64_t>(lo, d == 1 ? 0 : pow10(d - 1));
    int64_t b = (hi < 0 || d < dhi) ? pow10(d) - 1 : std::min<int64_t>(hi, pow10(d) - 1);
    if (a <= b) range_fixed(a, b, d, {}, out);
  }
  if (hi < 0) {  // any number with more than dhi digits
    Alt x{Symbol::set(digits(1, 9))};
    g.repeat(Alt{Symbol::set(digits(0, 9))}, dhi, -1, "int_digits", x);
    out.push_back(std::move(x));
  }
}

class SchemaCompiler {
 public:
  SchemaCompiler(Grammar& g, const json& root, const JsonSchemaOptions& o) : g_(g), root_(root), o_(o) {}

  int32_t compile(const json& s, int depth, const std::string& name) {
    if (depth > o_.max_depth) throw GrammarError(fmt::format("JSON schema nested deeper than {} levels", o_.max_depth));
    int32_t r = g_.add_rule(name);
    std::vector<Alt> alts = alternatives(s, depth, name);
    g_.rules[r].alts = std::move(alts);
    return r;
  }

  int32_t any_value() {
    if (any_ >= 0) return any_;
    any_ = g_.add_rule("json_any");
    int32_t obj = g_.add_rule("json_any_object"), arr = g_.add_rule("json_any_array");
    g_.rules[any_].alts = {Alt{Symbol::ref(number())}, Alt{Symbol::ref(string())}, lit("true"), lit("false"),
                           lit("null"), Alt{Symbol::ref(arr)}, Alt{Symbol::ref(obj)}};
    g_.rules[arr].alts = array_alts(Symbol::ref(any_), 0, -1);
    g_.rules[obj].alts = generic_object_alts(Symbol::ref(any_));
    return any_;
  }

 private:
  Grammar& g_;
  const json& root_;
  JsonSchemaOptions o_;
  std::map<std::string, int32_t> refs_;
  int32_t ws_ = -1, string_ = -1, char_ = -1, number_ = -1, integer_ = -1, any_ = -1;

  static Alt lit(std::string_view s) { Alt a; Grammar::literal(s, a); return a; }
  void ws(Alt& a) {
    if (!o_.any_whitespace) return;
    if (ws_ < 0) {
      ByteSet b;
      for (char c : {' ', '\n', '\r', '\t'}) b.set(uint8_t(c));
      ws_ = g_.star(Alt{Symbol::set(b)}, "ws");
    }
    a.push_back(Symbol::ref(ws_));
  }
  void item_sep(Alt& a) {
    if (!o_.any_whitespace) { Grammar::literal(", ", a); return; }
    ws(a); Grammar::literal(",", a); ws(a);
  }
  void kv_sep(Alt& a) {
    if (!o_.any_whitespace) { Grammar::literal(": ", a); return; }
    ws(a); Grammar::literal(":", a); ws(a);
  }
  int32_t str_char() {
    if (char_ >= 0) return char_;
    Alt plain;
    g_.codepoints({{0, 0x1f}, {'"', '"'}, {'\\', '\\'}}, true, plain);
    ByteSet esc1, hex;
    for (char c : std::string("\"\\/bfnrt")) esc1.set(uint8_t(c));
    for (char c : std::string("0123456789abcdefABCDEF")) hex.set(uint8_t(c));
    Alt e1 = lit("\\"), eu = lit("\\u");
    e1.push_back(Symbol::set(esc1));
    for (int k = 0; k < 4; ++k) eu.push_back(Symbol::set(hex));
    char_ = g_.add_rule("json_char", {plain, e1, eu});
    return char_;
  }
  int32_t string() {
    if (string_ >= 0) return string_;
    Alt a = lit("\"");
    a.push_back(Symbol::ref(g_.star(Alt{Symbol::ref(str_char())}, "json_chars")));
    Grammar::literal("\"", a);
    string_ = g_.add_rule("json_string", {a});
    return string_;
  }
  int32_t integer() {
    if (integer_ >= 0) return integer_;
    Alt nz{Symbol::byte('-')};
    Alt pos{Symbol::set(digits(1, 9))};
    if (o_.bounded_numbers) g_.repeat(Alt{Symbol::set(digits(0, 9))}, 0, 17, "json_digits", pos);
    else pos.push_back(Symbol::ref(g_.star(Alt{Symbol::set(digits(0, 9))}, "json_digits")));
    nz.insert(nz.end(), pos.begin(), pos.end());
    integer_ = g_.add_rule("json_integer", {lit("0"), pos, nz});
    return integer_;
  }
  int32_t number() {
    if (number_ >= 0) return number_;
    Alt d1{Symbol::set(digits(0, 9))};
    const bool b = o_.bounded_numbers;
    auto digits_rule = [&](int lo, int hi) {  // [0-9]{lo,hi} (hi < 0: unbounded)
      Alt a;
      g_.repeat(d1, lo, hi, "json_digits", a);
      return g_.add_rule("json_digits", {a});
    };
    Alt nonzero{Symbol::set(digits(1, 9)), Symbol::ref(digits_rule(0, b ? 17 : -1))};
    int32_t intpart = g_.add_rule("json_int_part", {lit("0"), nonzero});
    Alt frac = lit(".");
    frac.push_back(Symbol::ref(digits_rule(1, b ? 16 : -1)));
    ByteSet e, sign;
    e.set('e'); e.set('E'); sign.set('+'); sign.set('-');
    Alt exp{Symbol::set(e), Symbol::ref(g_.optional(Alt{Symbol::set(sign)}, "json_sign")), Symbol::ref(digits_rule(1, b ? 2 : -1))};
    Alt a{Symbol::ref(g_.optional(lit("-"), "json_minus")), Symbol::ref(intpart), Symbol::ref(g_.optional(frac, "json_frac")),
          Symbol::ref(g_.optional(exp, "json_exp"))};
    number_ = g_.add_rule("json_number", {a});
    return number_;
  }

  std::vector<Alt> array_alts(Symbol elem, int min_items, int max_items) {
    std::vector<Alt> alts;
    if (max_items != 0) {
      Alt a = lit("[");
      ws(a);
      a.push_back(elem);
      Alt more;
      item_sep(more);
      more.push_back(elem);
      g_.repeat(more, std::max(0, min_items - 1), max_items < 0 ? -1 : max_items - 1, "json_items", a);
      ws(a);
      Grammar::literal("]", a);
      alts.push_back(std::move(a));
    }
    if (min_items == 0) {
      Alt e = lit("[");
      ws(e);
      Grammar::literal("]", e);
      alts.push_back(std::move(e));
    }
    return alts;
  }

  std::vector<Alt> generic_object_alts(Symbol value) {
    Alt kv{Symbol::ref(string())};
    kv_sep(kv);
    kv.push_back(value);
    Alt a = lit("{");
    ws(a);
    a.insert(a.end(), kv.begin(), kv.end());
    Alt more;
    item_sep(more);
    more.insert(more.end(), kv.begin(), kv.end());
    a.push_back(Symbol::ref(g_.star(more, "json_members")));
    ws(a);
    Grammar::literal("}", a);
    Alt e = lit("{");
    ws(e);
    Grammar::literal("}", e);
    return {a, e};
  }

  const json& resolve(const std::string& ref) {
    if (ref == "#") return root_;
    if (ref.rfind("#/", 0) != 0) throw GrammarError("unsupported $ref '" + ref + "': only local references (#/...) are supported");
    try {
      return root_.at(json::json_pointer(ref.substr(1)));
    } catch (const std::exception&) {
      throw GrammarError("$ref '" + ref + "' does not resolve inside the schema");
    }
  }

  int32_t ref_rule(const std::string& ref, int depth) {
    auto it = refs_.find(ref);
    if (it != refs_.end()) return it->second;
    const json& target = resolve(ref);
    int32_t r = g_.add_rule("ref");
    refs_[ref] = r;  // before compiling: recursive references point here
    g_.rules[r].alts = alternatives(target, depth + 1, "ref");
    return r;
  }

  static int64_t as_bound(const json& v, const char* key) {
    if (!v.is_number()) throw GrammarError(fmt::format("'{}' must be a number", key));
    double d = v.get<double>();
    if (!std::isfinite(d) || std::fabs(d) > 1e17) throw GrammarError(fmt::format("'{}' is out of the supported range", key));
    return 0;
  }

  std::vector<Alt> integer_alts(const json& s) {
    bool has_lo = false, has_hi = false;
    int64_t lo = 0, hi = 0;
    auto get = [&](const char* key, bool is_min, bool exclusive) {
      if (!s.contains(key)) return;
      const json& v = s[key];
      if (v.is_boolean()) return;  // draft-4 flag, applied below
      as_bound(v, key);
      double d = v.get<double>();
      int64_t b = is_min ? int64_t(std::ceil(d)) : int64_t(std::floor(d));
      if (exclusive && double(b) == d) b += is_min ? 1 : -1;
      if (is_min) { lo = has_lo ? std::max(lo, b) : b; has_lo = true; }
      else { hi = has_hi ? std::min(hi, b) : b; has_hi = true; }
    };
    bool excl_min4 = s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean() && s["exclusiveMinimum"].get<bool>();
    bool excl_max4 = s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean() && s["exclusiveMaximum"].get<bool>();
    get("minimum", true, excl_min4);
    get("maximum", false, excl_max4);
    get("exclusiveMinimum", true, true);
    get("exclusiveMaximum", false, true);
    if (!has_lo && !has_hi) return {Alt{Symbol::ref(integer())}};
    if (has_lo && has_hi && lo > hi) throw GrammarError("integer bounds admit no value (minimum > maximum)");
    std::vector<Alt> out;
    // Negative part: -n for n in [max(1, -hi), -lo].
    if (!has_lo || lo < 0) {
      int64_t nlo = has_hi ? std::max<int64_t>(1, -hi) : 1;
      int64_t nhi = has_lo ? -lo : -1;
      if (nhi < 0 || nlo <= nhi) {
        std::vector<Alt> nat;
        natural_range(g_, nlo, nhi, nat);
        for (auto& a : nat) { Alt x = lit("-"); x.insert(x.end(), a.begin(), a.end()); out.push_back(std::move(x)); }
      }
    }
    if (!has_hi || hi >= 0) natural_range(g_, has_lo ? std::max<int64_t>(0, lo) : 0, has_hi ? hi : -1, out);
    return out;
  }

  std::vector<Alt> string_alts(const json& s) {
    bool has_len = s.contains("minLength") || s.contains("maxLength");
    int n_special = int(has_len) + int(s.contains("pattern")) + int(s.contains("format"));
    if (n_special > 1) throw GrammarError("combining 'pattern', 'format' and 'minLength'/'maxLength' in one string schema is not supported");
    Alt a = lit("\"");
    if (s.contains("pattern") || s.contains("format")) {
      std::string pattern;
      if (s.contains("pattern")) {
        if (!s["pattern"].is_string()) throw GrammarError("'pattern' must be a string");
        pattern = s["pattern"].get<std::string>();
      } else {
        if (!s["format"].is_string()) throw GrammarError("'format' must be a string");
        auto f = kFormats.find(s["format"].get<std::string>());
        if (f == kFormats.end()) throw GrammarError("unsupported JSON schema format '" + s["format"].get<std::string>() + "'");
        pattern = f->second;
      }
      try {
        a.push_back(Symbol::ref(add_regex_rule(g_, pattern, "pattern")));
      } catch (const GrammarError& e) {
        throw GrammarError(std::string("in 'pattern': ") + e.what());
      }
    } else if (has_len) {
      int lo = int_field(s, "minLength", 0), hi = int_field(s, "maxLength", -1);
      g_.repeat(Alt{Symbol::ref(str_char())}, lo, hi, "json_str_len", a);
    } else {
      return {Alt{Symbol::ref(string())}};
    }
    Grammar::literal("\"", a);
    return {a};
  }

  static int int_field(const json& s, const char* key, int dflt) {
    if (!s.contains(key)) return dflt;
    const json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) throw GrammarError(fmt::format("'{}' must be a non-negative integer", key));
    if (v.get<int64_t>() > 10000) throw GrammarError(fmt::format("'{}' above the supported limit of 10000", key));
    return static_cast<int>(v.get<int64_t>());
  }

  Symbol sub(const json& s, int depth, const std::string& name) {
    if (s.is_object() && s.size() == 1 && s.contains("$ref") && s["$ref"].is_string())
      return Symbol::ref(ref_rule(s["$ref"].get<std::string>(), depth));
    return Symbol::ref(compile(s, depth + 1, name));
  }

  std::vector<Alt> array_schema_alts(const json& s, int depth, const std::string& name) {
    int lo = int_field(s, "minItems", 0), hi = int_field(s, "maxItems", -1);
    if (hi >= 0 && hi < lo) throw GrammarError("maxItems < minItems: no array matches");
    if (s.contains("uniqueItems") && s["uniqueItems"].is_boolean() && s["uniqueItems"].get<bool>())
      throw GrammarError("unsupported JSON schema keyword 'uniqueItems'");
    bool extra_ok = true;
    Symbol elem = Symbol::ref(0);
    if (s.contains("items")) {
      const json& it = s["items"];
      if (it.is_boolean() && !it.get<bool>()) extra_ok = false;
      else if (it.is_boolean() || (it.is_object() && it.empty())) elem = Symbol::ref(any_value());
      else if (it.is_object()) elem = sub(it, depth, name + "_item");
      else throw GrammarError("'items' must be a schema (an object or a boolean)");
    } else if (s.contains("prefixItems")) {
      extra_ok = false;  // xgrammar's strict mode: no items beyond prefixItems unless `items` says so
    } else {
      elem = Symbol::ref(any_value());
    }
    if (!s.contains("prefixItems")) {
      if (!extra_ok) return array_alts(elem, 0, 0);
      return array_alts(elem, lo, hi);
    }
    const json& pre = s["prefixItems"];
    if (!pre.is_array()) throw GrammarError("'prefixItems' must be an array of schemas");
    int k = static_cast<int>(pre.size());
    std::vector<Symbol> ps;
    for (int i = 0; i < k; ++i) ps.push_back(sub(pre[i], depth, fmt::format("{}_prefix{}", name, i)));
    // tail(j): what may follow after j items.
    int32_t next = -1;
    for (int j = k; j >= 1; --j) {
      std::vector<Alt> alts;
      if (j >= lo) alts.push_back(Alt{});
      if (j < k) {
        Alt a;
        item_sep(a);
        a.push_back(ps[j]);
        a.push_back(Symbol::ref(next));
        alts.push_back(std::move(a));
      } else if (extra_ok && (hi < 0 || hi > k)) {
        Alt more;
        item_sep(more);
        more.push_back(elem);
        Alt a;
        g_.repeat(more, std::max(0, lo - k), hi < 0 ? -1 : hi - k, "json_items", a);
        alts = {a};
      } else if (alts.empty()) {
        throw GrammarError("minItems exceeds prefixItems while no further items are allowed");
      }
      next = g_.add_rule("json_tuple", std::move(alts));
    }
    std::vector<Alt> out;
    if (k > 0 && (hi < 0 || hi >= 1)) {
      Alt a = lit("[");
      ws(a);
      a.push_back(ps[0]);
      a.push_back(Symbol::ref(next));
      ws(a);
      Grammar::literal("]", a);
      out.push_back(std::move(a));
    }
    if (lo == 0) { Alt e = lit("["); ws(e); Grammar::literal("]", e); out.push_back(std::move(e)); }
    return out;
  }

  std::vector<Alt> object_alts(const json& s, int depth, const std::string& name) {
    for (const char* k : {"patternProperties", "minProperties", "maxProperties", "propertyNames", "dependentRequired",
                          "dependentSchemas", "unevaluatedProperties"})
      if (s.contains(k)) throw GrammarError(fmt::format("unsupported JSON schema keyword '{}'", k));
    json props = s.value("properties", json::object());
    if (!props.is_object()) throw GrammarError("'properties' must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) throw GrammarError("'required' must be an array of strings");
      for (auto& r : s["required"]) {
        if (!r.is_string()) throw GrammarError("'required' must be an array of strings");
        required.insert(r.get<std::string>());
        if (!props.contains(r.get<std::string>())) props[r.get<std::string>()] = json::object();
      }
    }
    // additionalProperties: absent = false when properties are listed (xgrammar strict), else any.
    std::optional<Symbol> extra;
    if (s.contains("additionalProperties")) {
      const json& ap = s["additionalProperties"];
      if (ap.is_boolean()) { if (ap.get<bool>()) extra = Symbol::ref(any_value()); }
      else if (ap.is_object()) extra = ap.empty() ? Symbol::ref(any_value()) : sub(ap, depth, name + "_extra");
      else throw GrammarError("'additionalProperties' must be a boolean or a schema");
    } else if (props.empty()) {
      extra = Symbol::ref(any_value());
    }
    if (props.empty()) {
      if (extra) return generic_object_alts(*extra);
      Alt e = lit("{"); ws(e); Grammar::literal("}", e);
      return {e};
    }
    std::vector<Alt> kvs;
    std::vector<bool> req;
    int i = 0;
    for (auto& [key, ps] : props.items()) {
      Alt kv = lit(json(key).dump());
      kv_sep(kv);
      kv.push_back(sub(ps, depth, fmt::format("{}_{}", name, i++)));
      kvs.push_back(std::move(kv));
      req.push_back(required.count(key) > 0);
    }
    int n = static_cast<int>(kvs.size());
    // tail[i]: after at least one member, members i.. in order (optional ones skippable),
    // then (if allowed) additional members.
    std::vector<int32_t> tail(n + 1);
    {
      std::vector<Alt> end{Alt{}};
      if (extra) {
        Alt kv{Symbol::ref(string())};
        kv_sep(kv);
        kv.push_back(*extra);
        Alt more;
        item_sep(more);
        more.insert(more.end(), kv.begin(), kv.end());
        end = {Alt{Symbol::ref(g_.star(more, "json_extra"))}};
      }
      tail[n] = g_.add_rule("json_obj_tail", std::move(end));
    }
    for (int k = n - 1; k >= 0; --k) {
      Alt with;
      item_sep(with);
      with.insert(with.end(), kvs[k].begin(), kvs[k].end());
      with.push_back(Symbol::ref(tail[k + 1]));
      std::vector<Alt> alts{with};
      if (!req[k]) alts.push_back(Alt{Symbol::ref(tail[k + 1])});
      tail[k] = g_.add_rule("json_obj_tail", std::move(alts));
    }
    // first[i]: the first member present is i (all before it optional).
    std::vector<Alt> firsts;
    bool all_optional = true;
    for (int k = 0; k < n; ++k) {
      Alt f = kvs[k];
      f.push_back(Symbol::ref(tail[k + 1]));
      firsts.push_back(std::move(f));
      if (req[k]) { all_optional = false; break; }
    }
    if (all_optional && extra) {  // only additional members
      Alt kv{Symbol::ref(string())};
      kv_sep(kv);
      kv.push_back(*extra);
      kv.push_back(Symbol::ref(tail[n]));
      firsts.push_back(std::move(kv));
    }
    Alt a = lit("{");
    ws(a);
    a.push_back(Symbol::ref(g_.add_rule("json_members", std::move(firsts))));
    ws(a);
    Grammar::literal("}", a);
    std::vector<Alt> out{a};
    if (all_optional) { Alt e = lit("{"); ws(e); Grammar::literal("}", e); out.push_back(std::move(e)); }
    return out;
  }

  json merge_all_of(const json& s) {
    json merged = json::object();
    json props = json::object();
    json req = json::array();
    for (auto& part0 : s["allOf"]) {
      const json& part = (part0.is_object() && part0.contains("$ref")) ? resolve(part0["$ref"].get<std::string>()) : part0;
      if (!part.is_object()) throw GrammarError("'allOf' entries must be schemas");
      for (auto& [k, v] : part.items()) {
        if (kAnnotations.count(k)) continue;
        if (k == "properties") { for (auto& [pk, pv] : v.items()) props[pk] = pv; }
        else if (k == "required") { for (auto& r : v) req.push_back(r); }
        else if (k == "type" && v == "object") merged["type"] = "object";
        else if (k == "additionalProperties") merged[k] = v;
        else throw GrammarError("'allOf' is supported only for object schemas (found keyword '" + k + "')");
      }
    }
    for (auto& [k, v] : s.items())
      if (k != "allOf" && !kAnnotations.count(k)) {
        if (k == "properties") { for (auto& [pk, pv] : v.items()) props[pk] = pv; }
        else if (k == "required") { for (auto& r : v) req.push_back(r); }
        else merged[k] = v;
      }
    merged["type"] = "object";
    merged["properties"] = props;
    if (!req.empty()) merged["required"] = req;
    return merged;
  }

  std::vector<Alt> alternatives(const json& s, int depth, const std::string& name) {
    if (depth > o_.max_depth) throw GrammarError(fmt::format("JSON schema nested deeper than {} levels", o_.max_depth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return {Alt{Symbol::ref(any_value())}};
      throw GrammarError("schema 'false' matches nothing");
    }
    if (!s.is_object()) throw GrammarError("a JSON schema must be an object or a boolean");
    for (auto& [k, v] : s.items())
      if (!kKnown.count(k) && !kAnnotations.count(k)) throw GrammarError("unsupported JSON schema keyword '" + k + "'");
    if (s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>()) {
      json inner = s;
      inner.erase("nullable");
      std::vector<Alt> alts = alternatives(inner, depth + 1, name);
      alts.push_back(lit("null"));
      return alts;
    }
    auto only = [&](const char* key) {
      for (auto& [k, v] : s.items())
        if (k != key && !kAnnotations.count(k) && k != "nullable")
          throw GrammarError(fmt::format("keyword '{}' next to '{}' is not supported", k, key));
    };
    if (s.contains("$ref")) {
      only("$ref");
      if (!s["$ref"].is_string()) throw GrammarError("'$ref' must be a string");
      return {Alt{Symbol::ref(ref_rule(s["$ref"].get<std::string>(), depth))}};
    }
    if (s.contains("allOf")) {
      if (!s["allOf"].is_array() || s["allOf"].empty()) throw GrammarError("'allOf' must be a non-empty array");
      if (s["allOf"].size() == 1 && s.size() == 1) return alternatives(s["allOf"][0], depth + 1, name);
      return alternatives(merge_all_of(s), depth + 1, name);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      only(key);
      if (!s[key].is_array() || s[key].empty()) throw GrammarError(fmt::format("'{}' must be a non-empty array", key));
      std::vector<Alt> alts;
      int i = 0;
      for (auto& part : s[key]) alts.push_back(Alt{sub(part, depth, fmt::format("{}_any{}", name, i++))});
      return alts;
    }
    if (s.contains("const")) {
      only("const");
      return {lit(compact_dump(s["const"]))};
    }
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) throw GrammarError("'enum' must be a non-empty array");
      std::vector<Alt> alts;
      for (auto& v : s["enum"]) alts.push_back(lit(compact_dump(v)));
      return alts;
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array() && t.empty()) throw GrammarError("'type' must not be an empty array");
      else if (t.is_array()) for (auto& x : t) { if (!x.is_string()) throw GrammarError("'type' entries must be strings"); types.push_back(x.get<std::string>()); }
      else throw GrammarError("'type' must be a string or an array of strings");
    } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
      types = {"object"};
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
      types = {"array"};
    } else if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength")) {
      types = {"string"};
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum")) {
      types = {"number"};
    } else {
      return {Alt{Symbol::ref(any_value())}};
    }
    std::vector<Alt> out;
    for (auto& t : types) {
      std::vector<Alt> part;
      if (t == "string") part = string_alts(s);
      else if (t == "integer") part = integer_alts(s);
      else if (t == "number") {
        for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
          if (s.contains(k)) throw GrammarError(fmt::format("JSON schema keyword '{}' is supported only for type 'integer', not 'number'", k));
        part = {Alt{Symbol::ref(number())}};
      } else if (t == "boolean") part = {lit("true"), lit("false")};
      else if (t == "null") part = {lit("null")};
      else if (t == "array") part = array_schema_alts(s, depth, name);
      else if (t == "object") part = object_alts(s, depth, name);
      else throw GrammarError("unknown JSON schema type '" + t + "'");
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }

  std::string compact_dump(const json& v) const {
    if (o_.any_whitespace) return v.dump();
    // xgrammar's compact form uses ", " and ": " inside values too.
    std::string out;
    if (v.is_object()) {
      out = "{";
      bool first = true;
      for (auto& [k, x] : v.items()) { out += (first ? "" : ", ") + json(k).dump() + ": " + compact_dump(x); first = false; }
      return out + "}";
    }
    if (v.is_array()) {
      out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + compact_dump(v[i]);
      return out + "]";
    }
    return v.dump();
  }
};

}  // namespace

int32_t add_json_schema_rule(Grammar& g, const json& schema, const JsonSchemaOptions& opts, const std::string& name) {
  SchemaCompiler c(g, schema, opts);
  return c.compile(schema, 0, name);
}

Grammar grammar_from_json_schema(const json& schema, const JsonSchemaOptions& opts) {
  Grammar g;
  g.root = add_json_schema_rule(g, schema, opts, "root");
  g.check_no_left_recursion();
  return g;
}

Grammar grammar_from_json_schema_text(std::string_view text, const JsonSchemaOptions& opts) {
  json schema;
  try {
    schema = parse_json_bounded<json>(text, "JSON schema");
  } catch (const JsonDepthError& e) {
    throw GrammarError(e.what(), 0);
  } catch (const json::parse_error& e) {
    throw GrammarError(std::string("invalid JSON schema: ") + e.what(), e.byte > 0 ? e.byte - 1 : 0);
  } catch (const json::out_of_range& e) {  // a number beyond a double (1e400)
    throw GrammarError(std::string("invalid JSON schema: ") + e.what());
  }
  return grammar_from_json_schema(schema, opts);
}

Grammar grammar_for_any_json_object(const JsonSchemaOptions& opts) {
  return grammar_from_json_schema(json{{"type", "object"}}, opts);
}

}  // namespace moeserve::structured
