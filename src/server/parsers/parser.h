// Reasoning and tool-call parsers: turn a choice's generated text into reasoning, content
// and tool calls, incrementally.
//
// Both interfaces are push-based and chunk-independent: feeding the same text in any split
// yields the same concatenated output (parsers hold back text that might be the start of a
// marker until it is decided). Non-streaming responses run the same parser over the whole
// text, so streaming and non-streaming agree by construction.
//
// Adding a model family: write parsers/<family>.cpp implementing these classes and add its
// names to the tables in parsers/registry.cpp.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/json_text.h"
#include "structured/grammar.h"

namespace moeserve::server {

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  virtual ~ReasoningParser() = default;
  virtual void push(std::string_view text, ReasoningDelta& out) = 0;
  // End of generation: release anything held back.
  virtual void finish(ReasoningDelta& out) = 0;
  // false when the parser never fills `reasoning` (it is reported as null).
  virtual bool reports_reasoning() const { return true; }
};

struct ToolCallDelta {
  int index = 0;
  std::optional<std::string> id;    // first delta of a call only
  std::optional<std::string> name;  // first delta of a call only
  std::string arguments;            // JSON fragment; the concatenation is the arguments string
};

struct ToolParseDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text (Python json.dumps layout)
};

class ToolParser {
 public:
  virtual ~ToolParser() = default;
  virtual void push(std::string_view text, ToolParseDelta& out) = 0;
  virtual void finish(ToolParseDelta& out) = 0;
  // Calls parsed so far (complete after finish), in order; arguments as streamed.
  virtual const std::vector<ToolCall>& calls() const = 0;
};

// What a reasoning parser family may read from the request before generation: the rendered
// chat prompt (its last turn may already open or close the reasoning section) and the
// request's chat_template_kwargs (e.g. enable_thinking).
struct ReasoningRequest {
  std::string_view prompt;
  const ojson* chat_template_kwargs = nullptr;
};
// true when the request ends the reasoning section before the first output token (Qwen3 with
// enable_thinking false: the prompt ends "<think>\n\n</think>\n\n"). Then the whole output is
// content and a structured-output constraint starts at once. false for families without
// such a switch.
bool reasoning_ended_by_prompt(const std::string& name, const ReasoningRequest& req);
// `ended_by_prompt`: what reasoning_ended_by_prompt answered for the request.
std::unique_ptr<ReasoningParser> make_reasoning_parser(const std::string& name, bool ended_by_prompt = false);
// `tools` is the request's tools array (OpenAI format), used to type argument values.
std::unique_ptr<ToolParser> make_tool_parser(const std::string& name, const ojson& tools);
bool has_reasoning_parser(const std::string& name);
bool has_tool_parser(const std::string& name);
std::vector<std::string> reasoning_parser_names();
std::vector<std::string> tool_parser_names();

// Forced tool calls: the grammar of a tool parser family's own call syntax (one builder per
// family, next to its parser). `names` empty: any of `tools`; else only those (a named
// tool_choice). `parallel` false: exactly one call. Throws structured::GrammarError (a 400).
struct ToolCallGrammarRequest {
  const ojson& tools;
  std::vector<std::string> names;
  bool parallel = true;
};
bool has_tool_call_grammar(const std::string& parser_name);
structured::Grammar tool_call_grammar(const std::string& parser_name, const ToolCallGrammarRequest& req);
structured::Grammar minimax_m2_tool_call_grammar(const ToolCallGrammarRequest& req);  // parsers/minimax_m2_grammar.cpp
structured::Grammar hermes_tool_call_grammar(const ToolCallGrammarRequest& req);      // parsers/hermes_grammar.cpp
// For the families' grammars: the request's callable tools, (name, its "function" object), in
// order: well-formed function tools with a name, restricted to req.names when given.
std::vector<std::pair<std::string, const ojson*>> callable_tools(const ToolCallGrammarRequest& req);
// Appends [ \n]{0,8} to `alt` (bounded: a random model could loop on unbounded whitespace).
void add_leading_whitespace(structured::Grammar& g, structured::Alt& alt);

// Shared helpers for parsers.
// Length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_marker_suffix(std::string_view text, std::string_view marker);
// Python str.strip() (ASCII and Unicode whitespace).
std::string_view py_strip(std::string_view s);
// "call_" + 24 random hex digits.
std::string random_call_id();

}  // namespace moeserve::server
