// In-memory store of Responses API responses (`store: true`) for GET /v1/responses/{id},
// POST /v1/responses/{id}/cancel and `previous_response_id`. Bounded by a byte cap and an
// entry cap; the least recently used entries are evicted first (an in-flight response is
// never evicted while it runs). Thread-safe: io threads of different connections use it.
#pragma once
#include <cstddef>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "server/json_text.h"

namespace moeserve::server {

struct StoredResponse {
  std::string id;
  std::string status;  // in_progress | completed | incomplete | failed | cancelled
  std::string json;    // the Response object
  // The conversation a follow-up continues from: this response's input messages (previous
  // responses' included, instructions not) and its output as chat messages.
  ojson messages = ojson::array();
  bool cancel_requested = false;
  std::function<void()> cancel;  // in flight only: aborts the generation (any thread)
};

struct ResponseStoreLimits {
  size_t max_entries = 4096;
  size_t max_bytes = 256u << 20;
};

class ResponseStore {
 public:
  explicit ResponseStore(ResponseStoreLimits limits = {}) : limits_(limits) {}
  // Inserts or replaces (keeps cancel_requested set by cancel()); evicts to the caps.
  void put(StoredResponse r);
  std::optional<StoredResponse> get(const std::string& id);  // marks it recently used
  // In flight: sets cancel_requested, calls its cancel hook and returns true. Otherwise
  // false (not found: nullopt from get).
  bool cancel(const std::string& id);
  bool erase(const std::string& id);
  size_t size() const;
  size_t bytes() const;

 private:
  static size_t cost(const StoredResponse& r);
  void evict();  // mu_ held

  ResponseStoreLimits limits_;
  mutable std::mutex mu_;
  std::list<StoredResponse> lru_;  // front: most recently used
  std::unordered_map<std::string, std::list<StoredResponse>::iterator> index_;
  size_t bytes_ = 0;
};

}  // namespace moeserve::server
