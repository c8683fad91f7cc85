// Test doubles for the server: a byte-level Frontend with a few added tokens and a scripted
// Engine on its own thread (the real engine's threading contract: on_output runs on the
// engine thread).
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include <algorithm>

#include "core/error.h"
#include "engine/engine.h"
#include "server/frontend.h"

namespace moeserve::server::fakes {

// ids 0..255: bytes; 256.. added tokens (256 is the special EOS).
class FakeFrontend : public Frontend {
 public:
  static constexpr int32_t kEos = 256;
  std::vector<std::string> added = {"</s>", "<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"};
  std::vector<int32_t> encode(const std::string& text, bool add_special) const override {
    std::vector<int32_t> ids;
    (void)add_special;
    for (size_t i = 0; i < text.size();) {
      bool hit = false;
      for (size_t a = 0; a < added.size(); ++a) {
        if (text.compare(i, added[a].size(), added[a]) == 0) {
          ids.push_back(256 + static_cast<int32_t>(a));
          i += added[a].size();
          hit = true;
          break;
        }
      }
      if (!hit) ids.push_back(static_cast<unsigned char>(text[i++]));
    }
    return ids;
  }
  std::string piece(int32_t id, bool skip_special) const {
    if (id < 256) return std::string(1, static_cast<char>(id));
    if (id == kEos && skip_special) return "";
    return added.at(id - 256);
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string s;
    for (auto id : ids) s += piece(id, skip_special);
    return s;
  }
  class Dec : public IncrementalDecoder {
   public:
    Dec(const FakeFrontend& f, bool skip) : f_(f), skip_(skip) {}
    std::string push(int32_t id) override {
      buf_ += f_.piece(id, skip_);
      size_t n = utf8_complete_prefix(buf_);
      std::string out = buf_.substr(0, n);
      buf_.erase(0, n);
      return out;
    }
    std::string finish() override {
      std::string out = buf_.empty() ? "" : "\xEF\xBF\xBD";
      buf_.clear();
      return out;
    }

   private:
    const FakeFrontend& f_;
    bool skip_;
    std::string buf_;
  };
  std::unique_ptr<IncrementalDecoder> incremental(bool skip) const override { return std::make_unique<Dec>(*this, skip); }
  std::string render_chat(const ChatRenderInputs& in) const override {
    std::string s;
    for (auto& m : in.messages) {
      if (m.value("role", "") == "raise") throw Error("template error: raise_exception");
      s += m.value("role", "") + ":" + (m["content"].is_string() ? m["content"].get<std::string>() : "") + "\n";
    }
    if (in.add_generation_prompt) s += "assistant:";
    return s;
  }
  int vocab_size() const override { return 256 + static_cast<int>(added.size()); }
  std::vector<int32_t> eos_token_ids() const override { return {kEos}; }
};

// Emits a scripted output per request, `tokens_per_step` tokens per delivery, one step
// every `step_us` microseconds for all running requests.
class FakeEngine : public Engine {
 public:
  // Output tokens for a request (EOS is appended unless the script ends otherwise).
  std::function<std::vector<int32_t>(const Request&)> script = [](const Request& r) {
    std::vector<int32_t> out(r.prompt_ids.rbegin(), r.prompt_ids.rend());  // the reversed prompt
    if (r.params.seed) out.push_back('0' + static_cast<int32_t>(*r.params.seed % 10));
    return out;
  };
  int tokens_per_step = 1;
  int step_us = 200;

  explicit FakeEngine(EngineConfig cfg = {}) : cfg_(std::move(cfg)) {
    thread_ = std::thread([this] { loop(); });
  }
  ~FakeEngine() override { shutdown(std::chrono::milliseconds(0)); }

  bool submit(Request r) override {
    if (static_cast<int>(r.prompt_ids.size()) >= 100000) throw Error("prompt too long");
    std::lock_guard lk(mu_);
    if (stopping_ || static_cast<int>(waiting_.size()) >= cfg_.max_waiting_requests) return false;
    waiting_.push_back(std::move(r));
    cv_.notify_one();
    return true;
  }
  void abort(const std::string& id) override {
    std::lock_guard lk(mu_);
    aborts_.push_back(id);
    cv_.notify_one();
  }
  EngineStats stats() const override {
    std::lock_guard lk(mu_);
    EngineStats s;
    s.num_running = static_cast<int>(running_.size());
    s.num_waiting = static_cast<int>(waiting_.size());
    s.kv_cache_usage = running_.empty() ? 0.0 : 0.01 * running_.size();
    return s;
  }
  const EngineConfig& config() const override { return cfg_; }
  ExecutorInfo executor_info() const override { return {261, 4096, 16, 1000}; }
  void shutdown(std::chrono::milliseconds grace) override {
    {
      std::lock_guard lk(mu_);
      if (!thread_.joinable()) return;
      stopping_ = true;
      deadline_ = std::chrono::steady_clock::now() + grace;
      cv_.notify_one();
    }
    thread_.join();
  }
  int max_running_seen() const { return max_running_; }

 private:
  struct Run {
    Request req;
    std::vector<int32_t> out;
    size_t pos = 0;
  };
  void loop() {
    for (;;) {
      std::vector<std::pair<std::function<void(RequestOutput&&)>, RequestOutput>> deliver;
      {
        std::unique_lock lk(mu_);
        cv_.wait_for(lk, std::chrono::microseconds(step_us), [&] { return stopping_ || !aborts_.empty(); });
        while (!waiting_.empty() && static_cast<int>(running_.size()) < cfg_.max_num_seqs) {
          Run r{std::move(waiting_.front()), {}, 0};
          waiting_.pop_front();
          r.out = script(r.req);
          running_.emplace(r.req.id, std::move(r));
        }
        max_running_ = std::max(max_running_, static_cast<int>(running_.size()));
        bool force = stopping_ && std::chrono::steady_clock::now() >= deadline_;
        for (auto& id : aborts_) finish(id, FinishReason::Abort, deliver);
        aborts_.clear();
        if (force) {
          std::vector<std::string> ids;
          for (auto& [id, r] : running_) ids.push_back(id);
          for (auto& id : ids) finish(id, FinishReason::Abort, deliver);
          while (!waiting_.empty()) {
            RequestOutput o;
            o.request_id = waiting_.front().id;
            o.finished = true;
            o.finish_reason = FinishReason::Abort;
            deliver.emplace_back(waiting_.front().on_output, std::move(o));
            waiting_.pop_front();
          }
        }
        for (auto it = running_.begin(); it != running_.end();) {
          Run& r = it->second;
          RequestOutput o;
          o.request_id = r.req.id;
          o.num_prompt_tokens = static_cast<int>(r.req.prompt_ids.size());
          bool done = false;
          for (int k = 0; k < tokens_per_step && !done; ++k) {
            int32_t tok = r.pos < r.out.size() ? r.out[r.pos] : FakeFrontend::kEos;
            if (r.pos >= r.out.size() && r.req.params.ignore_eos) tok = 'x';
            r.pos++;
            o.new_token_ids.push_back(tok);
            if (r.req.params.logprobs >= 0) {
              TokenLogprob lp{tok, -0.5f, {}};
              for (int t = 0; t < r.req.params.logprobs; ++t) lp.top.push_back({'a' + t, -1.0f - t});
              o.logprobs.push_back(lp);
            }
            bool is_stop = (tok == FakeFrontend::kEos && !r.req.params.ignore_eos) ||
                           std::count(r.req.params.stop_token_ids.begin(), r.req.params.stop_token_ids.end(), tok);
            if (is_stop) {
              done = true;
              o.finish_reason = FinishReason::Stop;
              o.stop_token_id = tok;
            } else if (static_cast<int>(r.pos) >= r.req.params.max_tokens) {
              done = true;
              o.finish_reason = FinishReason::Length;
            }
          }
          o.num_generated_tokens = static_cast<int>(r.pos);
          o.finished = done;
          deliver.emplace_back(r.req.on_output, std::move(o));
          it = done ? running_.erase(it) : std::next(it);
        }
        if (stopping_ && running_.empty() && waiting_.empty()) {
          lk.unlock();
          for (auto& [fn, o] : deliver) fn(std::move(o));
          return;
        }
      }
      for (auto& [fn, o] : deliver) fn(std::move(o));
    }
  }
  void finish(const std::string& id, FinishReason why,
              std::vector<std::pair<std::function<void(RequestOutput&&)>, RequestOutput>>& deliver) {
    auto it = running_.find(id);
    if (it == running_.end()) {
      for (auto w = waiting_.begin(); w != waiting_.end(); ++w) {
        if (w->id != id) continue;
        RequestOutput o;
        o.request_id = id;
        o.finished = true;
        o.finish_reason = why;
        deliver.emplace_back(w->on_output, std::move(o));
        waiting_.erase(w);
        return;
      }
      return;
    }
    RequestOutput o;
    o.request_id = id;
    o.finished = true;
    o.finish_reason = why;
    o.num_generated_tokens = static_cast<int>(it->second.pos);
    deliver.emplace_back(it->second.req.on_output, std::move(o));
    running_.erase(it);
  }

  EngineConfig cfg_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> waiting_;
  std::map<std::string, Run> running_;
  std::vector<std::string> aborts_;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point deadline_;
  int max_running_ = 0;
  std::thread thread_;
};

}  // namespace moeserve::server::fakes
