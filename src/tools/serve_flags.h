// The one table of `moeserve serve` flags, with vLLM's spelling (shared/reference/serving-api.md
// §9). It drives `serve` (src/cli/serve_args.cpp registers every row with CLI11: implemented
// rows bind to ServeArgs, the others are checked after parsing), `service` (which parses its
// serve flags with the same registration and rejects what serve would reject) and `plan`'s
// recommended command line (spelling() throws for a name that is not an implemented row), so
// the three cannot drift.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::serve_flags {

enum class Kind {
  Implemented,  // bound to a ServeArgs field (vLLM semantics)
  NoOp,         // accepted; one warning line says why it changes nothing here
  Unsupported,  // "not supported yet: FLAG" + `why` (the alternative), before loading
};
enum class Arity { Flag, One, Many };

struct FlagSpec {
  std::string name;        // long name without "--", vLLM spelling ("max-num-seqs")
  std::string short_name;  // vLLM's multi-letter short form without "-" ("tp"), or ""
  Kind kind = Kind::Implemented;
  Arity arity = Arity::One;
  bool negatable = false;  // also --no-NAME (argparse BooleanOptionalAction)
  std::string group;       // --help section; "" = hidden (test-only)
  // Implemented: the help text. NoOp: why it changes nothing. Unsupported: why, and what to
  // do instead.
  std::string why;
  // For rows whose meaning depends on the value (--dtype, --kv-cache-dtype, --load-format):
  // values accepted with the no-op warning, and values the implementation honours; any other
  // value is "not supported yet" with `unsupported_value_why`.
  std::vector<std::string> noop_values, ok_values;
  std::string unsupported_value_why;
};

const std::vector<FlagSpec>& table();
// The row for a long name ("max-num-seqs", "no-enable-prefix-caching") or short name ("tp");
// nullptr when none.
const FlagSpec* find(std::string_view name);
// "--NAME" for an implemented row; throws moeserve::Error otherwise (plan uses it, so a
// recommended command line can only name flags serve implements).
std::string spelling(std::string_view name);
// The closest long names to `name` (edit distance <= 3), best first, for "did you mean".
std::vector<std::string> suggestions(std::string_view name);
// The message for a flag serve does not know at all.
std::string unknown_flag_message(const std::string& arg);

}  // namespace moeserve::serve_flags
