#include "structured/json_schema.h"
#include "core/bounded_json.h"

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "structured/json_numbers.h"
#include "structured/matcher.h"
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
                                       "exclusiveMinimum", "exclusiveMaximum", "$ref", "nullable", "uniqueItems",
                                       "minProperties", "maxProperties", "multipleOf"};

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
    Alt pos{Symbol::set(digit_set(1, 9))};
    if (o_.bounded_numbers) g_.repeat(Alt{Symbol::set(digit_set(0, 9))}, 0, 17, "json_digits", pos);
    else pos.push_back(Symbol::ref(g_.star(Alt{Symbol::set(digit_set(0, 9))}, "json_digits")));
    nz.insert(nz.end(), pos.begin(), pos.end());
    integer_ = g_.add_rule("json_integer", {lit("0"), pos, nz});
    return integer_;
  }
  int32_t number() {
    if (number_ >= 0) return number_;
    Alt d1{Symbol::set(digit_set(0, 9))};
    const bool b = o_.bounded_numbers;
    auto digits_rule = [&](int lo, int hi) {  // [0-9]{lo,hi} (hi < 0: unbounded)
      Alt a;
      g_.repeat(d1, lo, hi, "json_digits", a);
      return g_.add_rule("json_digits", {a});
    };
    Alt nonzero{Symbol::set(digit_set(1, 9)), Symbol::ref(digits_rule(0, b ? 17 : -1))};
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

  // Draft-4 style `"exclusiveMinimum": true` next to `minimum`.
  static bool draft4_flag(const json& s, const char* key) {
    return s.contains(key) && s[key].is_boolean() && s[key].get<bool>();
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
    get("minimum", true, draft4_flag(s, "exclusiveMinimum"));
    get("maximum", false, draft4_flag(s, "exclusiveMaximum"));
    get("exclusiveMinimum", true, true);
    get("exclusiveMaximum", false, true);
    const int64_t mult = multiple_of(s);
    if (!has_lo && !has_hi && mult == 1) return {Alt{Symbol::ref(integer())}};
    if (has_lo && has_hi && lo > hi) throw GrammarError("integer bounds admit no value (minimum > maximum)");
    auto naturals = [&](int64_t a, int64_t b, std::vector<Alt>& into) {
      if (mult == 1) natural_range(g_, a, b, into);
      else natural_multiples(g_, a, b, mult, into);
    };
    std::vector<Alt> out;
    // Negative part: -n for n in [max(1, -hi), -lo].
    if (!has_lo || lo < 0) {
      int64_t nlo = has_hi ? std::max<int64_t>(1, -hi) : 1;
      int64_t nhi = has_lo ? -lo : -1;
      if (nhi < 0 || nlo <= nhi) {
        std::vector<Alt> nat;
        naturals(nlo, nhi, nat);
        for (auto& a : nat) { Alt x = lit("-"); x.insert(x.end(), a.begin(), a.end()); out.push_back(std::move(x)); }
      }
    }
    if (!has_hi || hi >= 0) naturals(has_lo ? std::max<int64_t>(0, lo) : 0, has_hi ? hi : -1, out);
    if (out.empty()) throw GrammarError("integer bounds and 'multipleOf' admit no value");
    return out;
  }

  // multipleOf on integers: a positive whole number (1 when absent).
  static int64_t multiple_of(const json& s) {
    if (!s.contains("multipleOf")) return 1;
    const json& v = s["multipleOf"];
    double d = v.is_number() ? v.get<double>() : 0;
    if (!(d > 0) || std::floor(d) != d)
      throw GrammarError("'multipleOf' must be a positive whole number for type 'integer' (fractional multipleOf is not supported)");
    if (d > 10000) throw GrammarError("'multipleOf' above the supported limit of 10000");
    return static_cast<int64_t>(d);
  }

  // Numbers with bounds: exactly the plain decimals in range (json_numbers.h); no bounds:
  // any JSON number.
  std::vector<Alt> number_alts(const json& s) {
    if (s.contains("multipleOf"))
      throw GrammarError("JSON schema keyword 'multipleOf' is supported only for type 'integer', not 'number'");
    std::optional<NumberBound> lo, hi;
    auto get = [&](const char* key, bool is_min, bool exclusive) {
      if (!s.contains(key) || s[key].is_boolean()) return;
      NumberBound b{parse_decimal(s[key], key), !exclusive};
      std::optional<NumberBound>& cur = is_min ? lo : hi;
      int c = cur ? compare(b.value, cur->value) : 0;
      if (!cur || (is_min ? c > 0 : c < 0) || (c == 0 && !b.inclusive)) cur = b;
    };
    get("minimum", true, draft4_flag(s, "exclusiveMinimum"));
    get("maximum", false, draft4_flag(s, "exclusiveMaximum"));
    get("exclusiveMinimum", true, true);
    get("exclusiveMaximum", false, true);
    if (!lo && !hi) return {Alt{Symbol::ref(number())}};
    NumberCaps caps;
    if (o_.bounded_numbers) caps = NumberCaps{18, 16};  // as number()'s bounded form
    return number_range_alts(g_, lo, hi, caps);
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
    for (const char* k : {"patternProperties", "propertyNames", "dependentRequired", "dependentSchemas",
                          "unevaluatedProperties"})
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
    // One "key": value alternative per declared property, in order (with its requiredness).
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
    if (s.contains("minProperties") || s.contains("maxProperties")) {
      int minp = int_field(s, "minProperties", 0), maxp = int_field(s, "maxProperties", -1);
      if (maxp >= 0 && maxp < minp) throw GrammarError("maxProperties < minProperties: no object matches");
      return counted_object_alts(kvs, req, extra, minp, maxp);
    }
    if (props.empty()) {
      if (extra) return generic_object_alts(*extra);
      Alt e = lit("{"); ws(e); Grammar::literal("}", e);
      return {e};
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

  // minProperties / maxProperties: the declared-order member chain of object_alts with the
  // count of members written so far in the rule key. tail(k, c): c >= 1 members written,
  // declared members k.. may follow (required ones must), then additional members. Counts
  // saturate at minProperties when there is no maximum, so rules are O(members x count).
  std::vector<Alt> counted_object_alts(const std::vector<Alt>& kvs, const std::vector<bool>& req,
                                       const std::optional<Symbol>& extra, int minp, int maxp) {
    const int n = static_cast<int>(kvs.size());
    auto sat = [&](int c) { return maxp >= 0 ? c : std::min(c, minp); };
    auto room = [&](int c) { return maxp < 0 || c + 1 <= maxp; };
    Alt xkv;
    if (extra) { xkv = {Symbol::ref(string())}; kv_sep(xkv); xkv.push_back(*extra); }
    auto member = [&](const Alt& kv, Symbol next, bool sep) {
      Alt a;
      if (sep) item_sep(a);
      a.insert(a.end(), kv.begin(), kv.end());
      a.push_back(next);
      return a;
    };
    std::map<std::pair<int, int>, std::optional<Symbol>> memo;
    std::function<std::optional<Symbol>(int, int)> tail = [&](int k, int c) -> std::optional<Symbol> {
      auto key = std::make_pair(k, c);
      if (auto it = memo.find(key); it != memo.end()) return it->second;
      std::vector<Alt> alts;
      if (k == n && extra && maxp < 0 && c == minp) {  // saturated: any number of extras more
        int32_t r = g_.add_rule("json_obj_count");
        g_.rules[r].alts = {Alt{}, member(xkv, Symbol::ref(r), true)};
        return memo[key] = Symbol::ref(r);
      }
      if (k == n) {
        if (c >= minp) alts.push_back(Alt{});
        if (extra && room(c))
          if (auto t = tail(n, sat(c + 1))) alts.push_back(member(xkv, *t, true));
      } else {
        if (room(c))
          if (auto t = tail(k + 1, sat(c + 1))) alts.push_back(member(kvs[k], *t, true));
        if (!req[k])
          if (auto t = tail(k + 1, c)) alts.push_back(Alt{*t});
      }
      std::optional<Symbol> out;
      if (!alts.empty()) out = Symbol::ref(g_.add_rule("json_obj_count", std::move(alts)));
      return memo[key] = out;
    };
    std::vector<Alt> firsts;
    bool all_optional = true;
    for (int k = 0; k < n; ++k) {
      if (maxp != 0)
        if (auto t = tail(k + 1, sat(1))) firsts.push_back(member(kvs[k], *t, false));
      if (req[k]) { all_optional = false; break; }
    }
    if (all_optional && extra && maxp != 0)
      if (auto t = tail(n, sat(1))) firsts.push_back(member(xkv, *t, false));
    std::vector<Alt> out;
    if (!firsts.empty()) {
      Alt a = lit("{");
      ws(a);
      a.push_back(Symbol::ref(g_.add_rule("json_members", std::move(firsts))));
      ws(a);
      Grammar::literal("}", a);
      out.push_back(std::move(a));
    }
    if (all_optional && minp == 0) { Alt e = lit("{"); ws(e); Grammar::literal("}", e); out.push_back(std::move(e)); }
    if (out.empty()) throw GrammarError("minProperties / maxProperties admit no object with these properties");
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
    auto only = [&](const char* key, bool type_ok = false) {
      for (auto& [k, v] : s.items())
        if (k != key && !kAnnotations.count(k) && k != "nullable" && !(type_ok && k == "type"))
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
    if (s.contains("const") || s.contains("enum")) return value_list_alts(s, depth);
    std::vector<std::string> types;
    if (s.contains("type")) {
      types = type_list(s);
    } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties") ||
               s.contains("minProperties") || s.contains("maxProperties")) {
      types = {"object"};
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
      types = {"array"};
    } else if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength")) {
      types = {"string"};
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum") ||
               s.contains("multipleOf")) {
      types = {"number"};
    } else {
      return {Alt{Symbol::ref(any_value())}};
    }
    std::vector<Alt> out;
    for (auto& t : types) {
      std::vector<Alt> part;
      if (t == "string") part = string_alts(s);
      else if (t == "integer") part = integer_alts(s);
      else if (t == "number") part = number_alts(s);
      else if (t == "boolean") part = {lit("true"), lit("false")};
      else if (t == "null") part = {lit("null")};
      else if (t == "array") part = array_schema_alts(s, depth, name);
      else if (t == "object") part = object_alts(s, depth, name);
      else throw GrammarError("unknown JSON schema type '" + t + "'");
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }

  // const / enum and the keywords next to them: both must hold (pydantic's Literal writes
  // {"const": "cat", "type": "string"}), so a value outside the other keywords is not in the
  // language. `type` alone is checked directly; other keywords by matching the value's text
  // with the schema minus const / enum, compiled on a grammar of its own (so unsupported ones
  // are still named).
  std::vector<Alt> value_list_alts(const json& s, int depth) {
    const bool is_const = s.contains("const");
    if (is_const && s.contains("enum")) throw GrammarError("keyword 'enum' next to 'const' is not supported");
    const json values = is_const ? json::array({s["const"]}) : s["enum"];
    if (!is_const && (!values.is_array() || values.empty())) throw GrammarError("'enum' must be a non-empty array");
    json rest = json::object();
    for (auto& [k, v] : s.items())
      if (k != "const" && k != "enum" && !kAnnotations.count(k) && k != "nullable") rest[k] = v;
    std::function<bool(const json&)> ok = [](const json&) { return true; };
    std::shared_ptr<CompiledGrammar> cg;
    if (rest.size() == 1 && rest.contains("type")) {
      ok = [types = type_list(rest)](const json& v) { return value_has_type(v, types); };
    } else if (!rest.empty()) {
      Grammar check;
      SchemaCompiler c(check, root_, o_);
      check.root = c.compile(rest, depth + 1, "value_check");
      cg = std::make_shared<CompiledGrammar>(check, byte_vocab());
      ok = [&](const json& v) {
        int32_t st = cg->step_bytes(cg->initial_state(), compact_dump(v));
        return st >= 0 && cg->accepting(st);
      };
    }
    std::vector<Alt> alts;
    for (auto& v : values)
      if (ok(v)) alts.push_back(lit(compact_dump(v)));
    if (!alts.empty()) return alts;
    if (rest.size() == 1 && rest.contains("type")) {
      if (is_const) throw GrammarError(fmt::format("'const' value {} is not of the schema's 'type' {}", values[0].dump(), rest["type"].dump()));
      throw GrammarError(fmt::format("no 'enum' value is of the schema's 'type' {}", rest["type"].dump()));
    }
    std::string kws;
    for (auto& [k, v] : rest.items()) kws += (kws.empty() ? "'" : ", '") + k + "'";
    if (is_const) throw GrammarError(fmt::format("'const' value {} does not satisfy the keywords next to it ({})", values[0].dump(), kws));
    throw GrammarError(fmt::format("no 'enum' value satisfies the keywords next to it ({})", kws));
  }

  // One token per byte: for matching a const / enum value's text.
  static std::shared_ptr<const TokenVocab> byte_vocab() {
    static const std::shared_ptr<const TokenVocab> v = [] {
      auto voc = std::make_shared<TokenVocab>();
      for (int b = 0; b < 256; ++b) voc->token_bytes.push_back(std::string(1, char(b)));
      voc->special.assign(256, false);
      voc->build();
      return voc;
    }();
    return v;
  }

  static std::vector<std::string> type_list(const json& s) {
    std::vector<std::string> types;
    const json& t = s["type"];
    if (t.is_string()) types.push_back(t.get<std::string>());
    else if (t.is_array() && t.empty()) throw GrammarError("'type' must not be an empty array");
    else if (t.is_array()) for (auto& x : t) { if (!x.is_string()) throw GrammarError("'type' entries must be strings"); types.push_back(x.get<std::string>()); }
    else throw GrammarError("'type' must be a string or an array of strings");
    return types;
  }

  // JSON Schema's type test; an integer is a number with no fraction (1.0 is an integer).
  static bool value_has_type(const json& v, const std::vector<std::string>& types) {
    for (const auto& t : types) {
      if (t == "string" ? v.is_string()
          : t == "number" ? v.is_number()
          : t == "integer" ? (v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))
          : t == "boolean" ? v.is_boolean()
          : t == "null" ? v.is_null()
          : t == "array" ? v.is_array()
          : t == "object" ? v.is_object()
          : throw GrammarError("unknown JSON schema type '" + t + "'"))
        return true;
    }
    return false;
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
