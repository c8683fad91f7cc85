// OpenAI-style API errors, as vLLM answers them:
//   {"error": {"message": "...", "type": "BadRequestError", "param": null, "code": 400}}
// `code` equals the HTTP status. Handlers throw ApiError; the HTTP layer renders it.
#pragma once
#include <optional>
#include <stdexcept>
#include <string>

namespace moeserve::server {

struct ApiError : std::runtime_error {
  int status;
  std::string type;
  std::optional<std::string> param;
  ApiError(int status_, std::string type_, const std::string& message, std::optional<std::string> param_ = {})
      : std::runtime_error(message), status(status_), type(std::move(type_)), param(std::move(param_)) {}
};

inline ApiError bad_request(const std::string& msg, std::optional<std::string> param = {}) {
  return ApiError(400, "BadRequestError", msg, std::move(param));
}
inline ApiError not_found(const std::string& msg, std::optional<std::string> param = {}) {
  return ApiError(404, "NotFoundError", msg, std::move(param));
}
inline ApiError internal_error(const std::string& msg) { return ApiError(500, "InternalServerError", msg); }

// The JSON body for an error (compact, one line).
std::string error_body(const ApiError& e);
std::string error_body(int status, const std::string& type, const std::string& message,
                       const std::optional<std::string>& param = {});

}  // namespace moeserve::server
