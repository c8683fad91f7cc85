// Tool-call and reasoning parsers (src/server/parsers/) fed in random chunkings. First byte:
// which parser; next 8 bytes: the seed of the chunk sizes; the rest: model output text.
// Every parser must give the same concatenated output whatever the split (parser.h).
#include "fuzz_common.h"
#include "server/parsers/parser.h"

#include <exception>
#include <random>

using namespace moeserve;
using namespace moeserve::server;

namespace {
std::vector<std::string_view> chunks(std::string_view text, uint64_t seed) {
  std::vector<std::string_view> out;
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < text.size();) {
    size_t n = 1 + rng() % (seed % 3 == 0 ? 3 : 40);
    out.push_back(text.substr(i, n));
    i += n;
  }
  return out;
}

struct ToolOutcome {
  std::string content, args;
  std::vector<std::string> names;
  bool operator==(const ToolOutcome&) const = default;
};

ToolOutcome run_tool(const std::string& name, const ojson& tools, const std::vector<std::string_view>& pieces) {
  auto p = make_tool_parser(name, tools);
  ToolOutcome o;
  auto absorb = [&](ToolParseDelta& d) {
    o.content += d.content;
    for (auto& c : d.calls) {
      if (c.name) o.names.push_back(*c.name);
      o.args += std::to_string(c.index) + ":" + c.arguments + "|";
    }
  };
  for (auto piece : pieces) {
    ToolParseDelta d;
    p->push(piece, d);
    absorb(d);
  }
  ToolParseDelta d;
  p->finish(d);
  absorb(d);
  for (auto& c : p->calls()) o.args += "#" + c.name + c.arguments;
  return o;
}

ReasoningDelta run_reasoning(const std::string& name, const std::vector<std::string_view>& pieces) {
  auto p = make_reasoning_parser(name);
  ReasoningDelta all;
  for (auto piece : pieces) {
    ReasoningDelta d;
    p->push(piece, d);
    all.reasoning += d.reasoning;
    all.content += d.content;
  }
  ReasoningDelta d;
  p->finish(d);
  all.reasoning += d.reasoning;
  all.content += d.content;
  return all;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ojson kTools = ojson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"},
      "metric": {"type": "boolean"}, "tags": {"type": "array"}, "opts": {"type": "object"},
      "mixed": {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "e": {"enum": [1, "a", null]}}}}},
    {"type": "function", "function": {"name": "noargs"}}])");
  fuzz::Input in{data, size};
  const uint8_t which = in.byte();
  const uint64_t seed = in.u64();
  const std::string text = in.rest();
  const std::vector<std::string_view> whole{text};
  const auto split = chunks(text, seed);
  try {
    auto tool_names = tool_parser_names();
    auto reasoning_names = reasoning_parser_names();
    const size_t k = which % (tool_names.size() + reasoning_names.size());
    if (k < tool_names.size()) {
      const ojson& tools = (which & 0x80) ? ojson() : kTools;
      ToolOutcome a = run_tool(tool_names[k], tools, whole), b = run_tool(tool_names[k], tools, split);
      // Call ids are random; everything else must agree.
      FUZZ_ASSERT(a == b, "tool parser output depends on the chunking");
    } else {
      const std::string& name = reasoning_names[k - tool_names.size()];
      ReasoningDelta a = run_reasoning(name, whole), b = run_reasoning(name, split);
      FUZZ_ASSERT(a.reasoning == b.reasoning && a.content == b.content, "reasoning parser output depends on the chunking");
    }
  } catch (const std::exception&) {
  }
  return 0;
}
