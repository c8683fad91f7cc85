#include "server/errors.h"

#include "server/json_text.h"

namespace moeserve::server {

std::string error_body(int status, const std::string& type, const std::string& message,
                       const std::optional<std::string>& param) {
  std::string out = "{\"error\":{\"message\":";
  // Messages may quote user input (a model name, a field): keep the body valid UTF-8.
  if (valid_utf8(message)) {
    append_json_string(out, message);
  } else {
    append_json_string(out, "(message contained invalid UTF-8)");
  }
  out += ",\"type\":";
  append_json_string(out, type);
  out += ",\"param\":";
  if (param && valid_utf8(*param)) append_json_string(out, *param);
  else out += "null";
  out += ",\"code\":" + std::to_string(status) + "}}";
  return out;
}

std::string error_body(const ApiError& e) { return error_body(e.status, e.type, e.what(), e.param); }

}  // namespace moeserve::server
