#include "server/request_fields.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/bounded_json.h"

namespace moeserve::server {

namespace {
std::string path_of(std::string_view where, const char* key) {
  return where.empty() ? std::string(key) : fmt::format("{}.{}", where, key);
}
}  // namespace

std::string json_type_name(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null: return "null";
    case ojson::value_t::boolean: return "boolean";
    case ojson::value_t::string: return "string";
    case ojson::value_t::array: return "array";
    case ojson::value_t::object: return "object";
    default: return "number";
  }
}

void type_error(const std::string& field, const char* want, const ojson& got) {
  throw bad_request(
      fmt::format("1 validation error: body.{}: Input should be {} (got {})", field, want, json_type_name(got)), field);
}

const ojson* field(const ojson& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<bool> get_bool(const ojson& obj, const char* key, std::string_view where) {
  const ojson* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) type_error(path_of(where, key), "a valid boolean", *v);
  return v->get<bool>();
}

std::optional<int64_t> get_int(const ojson& obj, const char* key, std::string_view where) {
  const ojson* v = field(obj, key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) type_error(path_of(where, key), "an integer that fits in 64 bits", *v);
    return static_cast<int64_t>(u);
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {  // pydantic accepts integral floats (5.0)
    double d = v->get<double>();
    if (std::isfinite(d) && d == std::trunc(d) && std::fabs(d) < 9.2e18) return static_cast<int64_t>(d);
  }
  type_error(path_of(where, key), "a valid integer", *v);
}

std::optional<double> get_num(const ojson& obj, const char* key, std::string_view where) {
  const ojson* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) type_error(path_of(where, key), "a valid number", *v);
  const double d = v->get<double>();
  // No numeric request field may be non-finite or beyond a float (the engine's type).
  if (!std::isfinite(d) || std::fabs(d) > double(std::numeric_limits<float>::max()))
    throw bad_request(fmt::format("1 validation error: body.{}: Input should be a finite number", path_of(where, key)),
                      path_of(where, key));
  return d;
}

std::optional<std::string> get_str(const ojson& obj, const char* key, std::string_view where) {
  const ojson* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) type_error(path_of(where, key), "a valid string", *v);
  return v->get<std::string>();
}

const ojson* get_object(const ojson& obj, const char* key, std::string_view where) {
  const ojson* v = field(obj, key);
  if (v && !v->is_object()) type_error(path_of(where, key), "a valid dictionary", *v);
  return v;
}

const ojson* get_array(const ojson& obj, const char* key, std::string_view where) {
  const ojson* v = field(obj, key);
  if (v && !v->is_array()) type_error(path_of(where, key), "a valid list", *v);
  return v;
}

std::optional<std::vector<int32_t>> get_token_ids(const ojson& obj, const char* key, int vocab, std::string_view where) {
  const ojson* arr = get_array(obj, key, where);
  if (!arr) return std::nullopt;
  const std::string name = path_of(where, key);
  std::vector<int32_t> ids;
  ids.reserve(arr->size());
  for (const auto& e : *arr) {
    if (!e.is_number_integer()) type_error(name, "a list of integers", e);
    const bool negative = e.is_number_integer() && !e.is_number_unsigned() && e.get<int64_t>() < 0;
    const uint64_t u = negative ? 0 : e.get<uint64_t>();
    const uint64_t bound = vocab > 0 ? static_cast<uint64_t>(vocab) : static_cast<uint64_t>(INT32_MAX) + 1;
    if (negative || u >= bound) {
      std::string shown = negative ? std::to_string(e.get<int64_t>()) : std::to_string(u);
      throw bad_request(fmt::format("Token id {} is out of vocabulary", shown), name);
    }
    ids.push_back(static_cast<int32_t>(u));
  }
  return ids;
}

ojson parse_request_object(std::string_view body) {
  if (!valid_utf8(body)) throw bad_request("Request body is not valid UTF-8");
  ojson j;
  try {
    j = parse_json_bounded<ojson>(body, "request body");
  } catch (const JsonDepthError& e) {
    throw bad_request(e.what());
  } catch (const ojson::out_of_range& e) {  // 1e400: a number beyond a double
    throw bad_request(fmt::format("JSON decode error: {}", e.what()));
  } catch (const ojson::exception& e) {
    throw bad_request(fmt::format("JSON decode error: {}", e.what()));
  }
  if (!j.is_object()) type_error("body", "a valid dictionary", j);
  return j;
}

}  // namespace moeserve::server
