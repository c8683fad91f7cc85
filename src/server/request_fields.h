// Typed reads of request fields, shared by every route (chat, completions, /tokenize,
// /detokenize and the routes added later): a field that is present with the wrong type is
// an ApiError 400 whose message names the field and the expected type, as pydantic words it
// for vLLM ("1 validation error: body.n: Input should be a valid integer (got string)").
// Absent fields and JSON null read as "not given".
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/errors.h"
#include "server/json_text.h"

namespace moeserve::server {

// "null", "boolean", "string", "array", "object" or "number".
std::string json_type_name(const ojson& v);

// Throws the 400 for `field` (a dotted path below `body`) holding `got` instead of `want`.
[[noreturn]] void type_error(const std::string& field, const char* want, const ojson& got);

// The member `key` of `obj`, or nullptr when it is absent or null.
const ojson* field(const ojson& obj, const char* key);

// `where` prefixes the field name in messages ("stream_options" -> body.stream_options.x).
std::optional<bool> get_bool(const ojson& obj, const char* key, std::string_view where = {});
// Integers that fit in int64 (integral floats such as 5.0 too, as pydantic accepts them).
std::optional<int64_t> get_int(const ojson& obj, const char* key, std::string_view where = {});
// A finite number within a float's range (the JSON parser already refuses numbers that
// overflow a double; the engine computes in float).
std::optional<double> get_num(const ojson& obj, const char* key, std::string_view where = {});
std::optional<std::string> get_str(const ojson& obj, const char* key, std::string_view where = {});
// Present-and-typed containers; nullptr when absent or null.
const ojson* get_object(const ojson& obj, const char* key, std::string_view where = {});
const ojson* get_array(const ojson& obj, const char* key, std::string_view where = {});
// A list of token ids in [0, vocab) (vocab <= 0: any id in [0, 2^31)); out-of-range ids
// say "Token id N is out of vocabulary" with the field as param.
std::optional<std::vector<int32_t>> get_token_ids(const ojson& obj, const char* key, int vocab,
                                                  std::string_view where = {});

// The request body as a JSON object: malformed JSON, invalid UTF-8, numbers beyond a double
// and nesting deeper than the JSON depth limit are 400s, and so is valid JSON that is not
// an object.
ojson parse_request_object(std::string_view body);

}  // namespace moeserve::server
