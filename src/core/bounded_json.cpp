#include "core/bounded_json.h"

#include <fmt/format.h>

#include <atomic>
#include <utility>
#include <vector>

namespace moeserve {

namespace {
std::atomic<int> g_depth_limit{kDefaultJsonDepthLimit};

template <typename Json>
int value_depth(const Json& root, int stop_above) {
  // Explicit stack of (node, depth): no recursion whatever the shape.
  std::vector<std::pair<const Json*, int>> stack{{&root, root.is_structured() ? 1 : 0}};
  int deepest = 0;
  while (!stack.empty()) {
    auto [node, depth] = stack.back();
    stack.pop_back();
    if (depth > deepest) deepest = depth;
    if (deepest > stop_above) return deepest;
    if (!node->is_structured()) continue;
    for (const auto& child : *node)
      if (child.is_structured()) stack.emplace_back(&child, depth + 1);
  }
  return deepest;
}
}  // namespace

int json_depth_limit() { return g_depth_limit.load(std::memory_order_relaxed); }

void set_json_depth_limit(int levels) {
  MS_CHECK(levels >= 1 && levels <= kMaxJsonDepthLimit, "JSON nesting limit must be in [1, {}], got {}",
           kMaxJsonDepthLimit, levels);
  g_depth_limit.store(levels, std::memory_order_relaxed);
}

JsonDepthError::JsonDepthError(std::string_view what, int limit_)
    : Error(fmt::format("{}: JSON nested deeper than {} levels (the nesting limit)", what, limit_)), limit(limit_) {}

int json_nesting_depth(std::string_view text, int stop_above) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // the escaped character cannot end the string
      else if (c == '"') in_string = false;
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > deepest) {
          deepest = depth;
          if (deepest > stop_above) return deepest;
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default: break;
    }
  }
  return deepest;
}

int json_value_depth(const nlohmann::json& j, int stop_above) { return value_depth(j, stop_above); }
int json_value_depth(const nlohmann::ordered_json& j, int stop_above) { return value_depth(j, stop_above); }

}  // namespace moeserve
