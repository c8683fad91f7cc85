#include "server/responses_store.h"

namespace moeserve::server {

size_t ResponseStore::cost(const StoredResponse& r) {
  // The JSON text dominates; the message tree is counted by its serialised size.
  return r.id.size() + r.json.size() + r.messages.dump().size() + 64;
}

void ResponseStore::put(StoredResponse r) {
  std::function<void()> stale_cancel;  // destroyed outside the lock
  std::lock_guard lk(mu_);
  auto it = index_.find(r.id);
  if (it != index_.end()) {
    r.cancel_requested = r.cancel_requested || it->second->cancel_requested;
    bytes_ -= cost(*it->second);
    stale_cancel = std::move(it->second->cancel);
    lru_.erase(it->second);
    index_.erase(it);
  }
  bytes_ += cost(r);
  lru_.push_front(std::move(r));
  index_[lru_.front().id] = lru_.begin();
  evict();
}

void ResponseStore::evict() {
  auto it = lru_.end();
  while ((lru_.size() > limits_.max_entries || bytes_ > limits_.max_bytes) && it != lru_.begin()) {
    --it;
    if (it->status == "in_progress") continue;  // still running: its completion re-puts it
    bytes_ -= cost(*it);
    index_.erase(it->id);
    it = lru_.erase(it);
  }
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id) {
  std::lock_guard lk(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second);
  return *it->second;
}

bool ResponseStore::cancel(const std::string& id) {
  std::function<void()> fn;
  {
    std::lock_guard lk(mu_);
    auto it = index_.find(id);
    if (it == index_.end() || it->second->status != "in_progress") return false;
    it->second->cancel_requested = true;
    fn = it->second->cancel;
  }
  if (fn) fn();
  return true;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lk(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  bytes_ -= cost(*it->second);
  lru_.erase(it->second);
  index_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lk(mu_);
  return lru_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard lk(mu_);
  return bytes_;
}

}  // namespace moeserve::server
