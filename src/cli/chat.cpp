// `moeserve chat MODEL`: a terminal chat with the in-process engine, or with a running
// server (`--base-url URL`). Both go through the OpenAI chat/completions streaming API
// (chat_transport.h): in process that is the OpenAIService of `serve`'s own stack
// (serve_stack.h), so the chat template, the reasoning and tool-call parsers and the engine
// are serve's. Ctrl-C stops the answer being streamed (the request is aborted as on a client
// disconnect), Ctrl-D (end of input) exits. stdin not a terminal: one user message per line,
// answers printed plainly (no prompt, no ANSI).
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli/chat_transport.h"
#include "cli/chat_view.h"
#include "cli/registry.h"
#include "cli/serve_stack.h"
#include "core/bounded_json.h"
#include "core/error.h"
#include "core/log.h"

#ifdef MOESERVE_HAVE_LIBEDIT
#include <editline/readline.h>
#include <poll.h>

#include <clocale>

#include <cerrno>
#endif

namespace {

using namespace moeserve;
using ojson = nlohmann::ordered_json;
using cli::parse_reasoning_mode;
using cli::reasoning_mode_name;
using cli::ReasoningMode;

struct ChatArgs {
  std::string model, base_url, api_key, system, tools_file, history_file, reasoning;
  double temperature = -1, top_p = -1;  // < 0: not sent (the server's defaults)
  int max_tokens = 0;                   // 0: not sent
  cli::ServeArgs serve;                 // the in-process engine (a few of serve's flags)
};

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

#ifdef MOESERVE_HAVE_LIBEDIT
// libedit's character reader (rl_getc_function). A Ctrl-C that lands after the prompt is drawn
// but before libedit blocks in read() does not interrupt that read: the flag is set and the
// read waits on for a key (seen under load: Ctrl-C at the prompt gave no fresh prompt). This
// reader waits in short poll() slices and returns EOF once the flag is set, so readline()
// returns. libedit takes the value as one wide character: UTF-8 input is decoded here into
// its code point, as libedit's own reader would.
int read_byte(int fd) {
  for (;;) {
    if (g_interrupted.load()) return EOF;
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, 50);
    if (r == 0 || (r < 0 && errno == EINTR)) continue;
    if (r < 0) return EOF;
    unsigned char c;
    const ssize_t n = ::read(fd, &c, 1);
    if (n == 1) return c;
    if (n < 0 && errno == EINTR) continue;
    return EOF;
  }
}
extern "C" int interruptible_getc(FILE* f) {
  const int fd = fileno(f);
  const int b0 = read_byte(fd);
  if (b0 == EOF || b0 < 0xC0 || b0 >= 0xF8) return b0;  // ASCII, EOF, or a stray byte as is
  const int extra = b0 >= 0xF0 ? 3 : b0 >= 0xE0 ? 2 : 1;
  int cp = b0 & (0x3F >> extra);
  for (int i = 0; i < extra; ++i) {
    const int b = read_byte(fd);
    if (b == EOF) return EOF;
    if ((b & 0xC0) != 0x80) return 0xFFFD;  // malformed: the replacement character
    cp = (cp << 6) | (b & 0x3F);
  }
  return cp;
}
#endif

// One line from the user. tty: libedit (line editing, history) when built with it.
class LineReader {
 public:
  LineReader(bool tty, std::string history_file) : tty_(tty), history_file_(std::move(history_file)) {
#ifdef MOESERVE_HAVE_LIBEDIT
    if (tty_ && !history_file_.empty()) read_history(history_file_.c_str());
#endif
  }
  ~LineReader() {
#ifdef MOESERVE_HAVE_LIBEDIT
    if (tty_ && !history_file_.empty()) write_history(history_file_.c_str());
#endif
  }
  enum class Got { Line, Interrupted, End };
  Got read(const std::string& prompt, std::string* line) {
    g_interrupted.store(false);
#ifdef MOESERVE_HAVE_LIBEDIT
    if (tty_) {
      if (!initialized_) {  // before the first readline() (rl_initialize reads both)
        // The terminal's character set (LC_CTYPE only): in the C locale libedit drops every
        // non-ASCII character typed (an accented letter or a CJK question vanished from the line).
        std::setlocale(LC_CTYPE, "");
        rl_getc_function = interruptible_getc;
        initialized_ = true;
      }
      char* s = readline(prompt.c_str());
      // A Ctrl-C ends the read (interruptible_getc returns EOF): readline returns NULL, or the
      // partial line typed so far, which the interrupt discards.
      if (g_interrupted.exchange(false)) {
        std::free(s);
        return Got::Interrupted;
      }
      if (!s) return Got::End;
      *line = s;
      std::free(s);
      if (!line->empty()) add_history(line->c_str());
      return Got::Line;
    }
#endif
    if (tty_) {
      std::fputs(prompt.c_str(), stdout);
      std::fflush(stdout);
    }
    if (std::getline(std::cin, *line)) return Got::Line;
    if (g_interrupted.exchange(false) && !std::cin.eof()) {
      std::cin.clear();
      return Got::Interrupted;
    }
    return Got::End;
  }

 private:
  bool tty_;
  std::string history_file_;
  bool initialized_ = false;
};

class ChatSession {
 public:
  ChatSession(const ChatArgs& a, cli::ChatTransport& t, std::string model, bool tty)
      : a_(a), t_(t), model_(std::move(model)), tty_(tty), system_(a.system) {
    if (!parse_reasoning_mode(a.reasoning.empty() ? (tty ? "collapse" : "show") : a.reasoning, &mode_))
      fail("--reasoning {}: expected show, collapse or hide", a.reasoning);
    if (!a.tools_file.empty()) {
      std::ifstream f(a.tools_file);
      MS_CHECK(f.good(), "--tools: cannot read {}", a.tools_file);
      tools_ = parse_json_bounded<ojson>(std::string(std::istreambuf_iterator<char>(f), {}), a.tools_file);
      MS_CHECK(tools_.is_array(), "--tools {}: expected a JSON list of tools", a.tools_file);
    }
  }

  // A line typed by the user: a command or a message. False: exit.
  bool on_line(const std::string& line) {
    if (line.empty()) return true;
    if (line[0] != '/') {
      messages_.push_back({{"role", "user"}, {"content", line}});
      answer();
      return true;
    }
    const size_t sp = line.find(' ');
    const std::string cmd = line.substr(0, sp);
    std::string arg = sp == std::string::npos ? "" : line.substr(sp + 1);
    if (cmd == "/exit" || cmd == "/quit") return false;
    if (cmd == "/help") {
      info("/reset: new conversation  /system TEXT: system prompt (/system alone clears it)\n"
           "/reasoning show|collapse|hide  /thoughts: the last reasoning  /tool TEXT: a tool result\n"
           "/exit (or Ctrl-D)  Ctrl-C: stop the answer");
    } else if (cmd == "/reset") {
      messages_.clear();
      info("conversation reset");
    } else if (cmd == "/system") {
      system_ = arg;
      info(arg.empty() ? "system prompt cleared" : "system prompt set");
    } else if (cmd == "/reasoning") {
      if (arg.empty() || parse_reasoning_mode(arg, &mode_)) info(std::string("reasoning: ") + reasoning_mode_name(mode_));
      else info("usage: /reasoning show|collapse|hide");
    } else if (cmd == "/thoughts") {
      info(last_reasoning_.empty() ? "(the last answer had no reasoning)" : last_reasoning_);
    } else if (cmd == "/tool") {
      if (last_call_id_.empty()) {
        info("no tool call to answer");
      } else {
        messages_.push_back({{"role", "tool"}, {"tool_call_id", last_call_id_}, {"content", arg}});
        answer();
      }
    } else {
      info("unknown command " + cmd + " (/help lists them)");
    }
    return true;
  }

 private:
  void info(const std::string& s) {
    std::fprintf(stdout, tty_ ? "\033[2m%s\033[0m\n" : "%s\n", s.c_str());
    std::fflush(stdout);
  }

  ojson request_body() const {
    ojson msgs = ojson::array();
    if (!system_.empty()) msgs.push_back({{"role", "system"}, {"content", system_}});
    for (const auto& m : messages_) msgs.push_back(m);
    ojson b = {{"model", model_}, {"messages", msgs}, {"stream", true}};
    if (a_.temperature >= 0) b["temperature"] = a_.temperature;
    if (a_.top_p >= 0) b["top_p"] = a_.top_p;
    if (a_.max_tokens > 0) b["max_tokens"] = a_.max_tokens;
    if (!tools_.is_null()) b["tools"] = tools_;
    return b;
  }

  void answer() {
    cli::AnswerView view(stdout, tty_, mode_);
    std::string stream_error;
    g_interrupted.store(false);
    const auto r = t_.stream_chat(
        request_body().dump(),
        [&](const std::string& data) {
          if (data == "[DONE]" || !stream_error.empty()) return;
          nlohmann::json j;
          try {
            j = parse_json_bounded(data, "stream event");
          } catch (const std::exception&) {
            stream_error = "malformed stream event: " + data.substr(0, 200);
            return;
          }
          stream_error = view.on_chunk(j);
        },
        g_interrupted);
    std::string error = stream_error;
    if (!r.cancelled && error.empty() && r.status != 200) error = describe_http_error(r);
    view.finish(r.cancelled, error);
    g_interrupted.store(false);
    last_reasoning_ = view.reasoning();
    if (!view.content().empty() || !view.tool_calls().empty()) {
      messages_.push_back(view.message());  // a stopped answer is kept as far as it got
      last_call_id_ = view.tool_calls().empty() ? "" : view.tool_calls().back().id;
    } else if (!error.empty() && !messages_.empty() && messages_.back()["role"] != "assistant") {
      messages_.erase(messages_.end() - 1);  // refused: the message is not part of the conversation
    }
  }

  static std::string describe_http_error(const cli::StreamResult& r) {
    if (r.status == 0) return r.error;
    std::string msg = r.error;
    try {
      const auto j = parse_json_bounded(r.error, "error body");
      if (j.contains("error") && j["error"].is_object()) msg = j["error"].value("message", r.error);
      else if (j.contains("error") && j["error"].is_string()) msg = j["error"];
    } catch (const std::exception&) {
    }
    return "HTTP " + std::to_string(r.status) + (msg.empty() ? "" : ": " + msg);
  }

  const ChatArgs& a_;
  cli::ChatTransport& t_;
  std::string model_;
  bool tty_;
  std::string system_;
  ReasoningMode mode_ = ReasoningMode::Show;
  ojson tools_;
  std::vector<ojson> messages_;
  std::string last_reasoning_, last_call_id_;
};

// The model name to send: --base-url with MODEL uses it, else the server's first model.
std::string server_model(cli::ChatTransport& t, const std::string& given) {
  if (!given.empty()) return given;
  std::string body;
  const auto r = t.get("/v1/models", &body);
  MS_CHECK(r.status == 200, "GET /v1/models: {}", r.status == 0 ? r.error : "HTTP " + std::to_string(r.status) + " " + body);
  const auto j = parse_json_bounded(body, "GET /v1/models");
  MS_CHECK(j.contains("data") && j["data"].is_array() && !j["data"].empty(), "GET /v1/models: no model listed");
  return j["data"][0].value("id", std::string());
}

// In process on a local MiniMax-M2 folder (the demo model) with no parser flag given: MiniMax's
// parsers, as the README's serve command sets them, so that `moeserve chat assets/demo-model`
// shows the reasoning dimmed and the tool calls parsed instead of raw </think> and XML.
// Returns the note shown on a terminal, empty when nothing was chosen.
std::string default_parsers(cli::ServeArgs& s, CLI::App* sub) {
  for (const char* f : {"--reasoning-parser", "--tool-call-parser", "--enable-auto-tool-choice"})
    if (sub->count(f) > 0) return {};
  std::ifstream f(std::filesystem::path(s.model) / "config.json");
  if (!f) return {};  // a hub id or no config: as given
  std::stringstream ss;
  ss << f.rdbuf();
  const auto j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("model_type", std::string()) != "minimax_m2") return {};
  s.reasoning_parser = s.tool_call_parser = "minimax_m2";
  s.enable_auto_tool_choice = true;
  return "parsers: minimax_m2 reasoning and tool calls (config.json model_type; any parser flag overrides, "
         "--reasoning-parser '' for none)";
}

int run_chat(ChatArgs& a, CLI::App* sub) {
  const bool tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
  if (!a.base_url.empty()) {
    for (const char* f : {"--device", "--reasoning-parser", "--tool-call-parser", "--enable-auto-tool-choice",
                          "--chat-template", "--tokenizer", "--max-model-len", "--seed", "--test-replay-backend"})
      if (sub->get_option_no_throw(f) && sub->count(f) > 0)
        fail("{} configures the in-process engine; with --base-url the server's settings apply", f);
  } else {
    MS_CHECK(!a.model.empty(), "chat: give a MODEL (a folder or hub repo id), or --base-url URL of a running server");
    MS_CHECK(a.api_key.empty(), "--api-key is for --base-url (the in-process engine needs no key)");
  }
#ifndef MOESERVE_HAVE_LIBEDIT
  MS_CHECK(a.history_file.empty(), "--history-file: this build has no libedit (install libedit-dev and rebuild)");
#endif
  // Other threads (engine, strand) keep SIGINT blocked: it reaches the thread reading input.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  std::unique_ptr<cli::ServeStack> stack;
  std::unique_ptr<cli::ChatTransport> transport;
  std::string model;
  if (a.base_url.empty()) {
    // Loading logs at info would bury the conversation: warnings only, unless asked for more.
    if (spdlog::get_level() == spdlog::level::info) spdlog::set_level(spdlog::level::warn);
    cli::ServeArgs& s = a.serve;
    s.model = a.model;
    s.max_num_seqs = 1;  // one conversation
    const std::string note = default_parsers(s, sub);
    cli::check_stack_args(s);
    if (tty) std::fprintf(stderr, "loading %s ...\n", a.model.c_str());
    if (tty && !note.empty()) std::fprintf(stderr, "\033[2m%s\033[0m\n", note.c_str());
    stack = cli::load_serve_stack(s, [](const std::string&, const std::string&) {});
    transport = cli::make_in_process_transport(*stack->service, stack->config.api_key);
    model = stack->config.served_model_names[0];
  } else {
    transport = cli::make_http_transport(a.base_url, a.api_key);
    model = server_model(*transport, a.model);
  }
  pthread_sigmask(SIG_UNBLOCK, &sigs, nullptr);
  struct sigaction sa {};
  sa.sa_handler = on_sigint;  // no SA_RESTART: a read at the prompt returns
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);

  int rc = 0;
  {
    ChatSession chat(a, *transport, model, tty);
    if (tty)
      std::printf("\033[2mmoeserve chat with %s%s. /help lists the commands; Ctrl-C stops an answer, Ctrl-D exits.\033[0m\n",
                  model.c_str(), a.base_url.empty() ? "" : (" at " + a.base_url).c_str());
    LineReader reader(tty, a.history_file);
    const std::string prompt = tty ? "\001\033[1;32m\002> \001\033[0m\002" : "";
    for (std::string line;;) {
      const auto got = reader.read(prompt, &line);
      if (got == LineReader::Got::End) break;
      if (got == LineReader::Got::Interrupted) {
        std::fputs("\n", stdout);  // Ctrl-C at the prompt: a fresh line, as a shell does
        continue;
      }
      if (!chat.on_line(line)) break;
    }
    if (tty) std::fputs("\n", stdout);
  }
  if (stack) {
    stack->engine->shutdown(std::chrono::milliseconds(0));
    stack->service->stop_preparation();
  }
  transport.reset();
  stack.reset();
  return rc;
}

moeserve::cli::RegisterSubcommand reg(
    "chat", "Chat with a model in the terminal (in process, or with a running server: --base-url)", [](CLI::App* sub) {
      auto a = std::make_shared<ChatArgs>();
      sub->add_option("model", a->model,
                      "model folder or hub repo id (in process); with --base-url: the model name to send (default: "
                      "the server's first)");
      sub->add_option("--base-url", a->base_url, "chat with a running server (http://HOST:PORT) instead");
      sub->add_option("--api-key", a->api_key, "with --base-url: the server's API key (sent as Bearer)");
      sub->add_option("--system", a->system, "system prompt (/system changes it)");
      sub->add_option("--tools", a->tools_file, "JSON file: a list of OpenAI tool definitions sent with every request");
      sub->add_option("--temperature", a->temperature, "sampling temperature (default: the server's)");
      sub->add_option("--top-p", a->top_p, "nucleus sampling (default: the server's)");
      sub->add_option("--max-tokens", a->max_tokens, "tokens per answer at most (default: the server's)");
      sub->add_option("--reasoning", a->reasoning,
                      "show | collapse (one line once the answer starts; the terminal default) | hide");
      sub->add_option("--history-file", a->history_file, "keep the typed lines in FILE across sessions (terminal)");
      cli::ServeArgs& s = a->serve;
      const std::string g = "In-process engine (as `serve`)";
      sub->add_option("--device", s.device, "cuda or cpu (default: cuda when available)")->group(g);
      sub->add_option("--reasoning-parser", s.reasoning_parser, "reasoning parser (minimax_m2, minimax_m2_append_think)")
          ->group(g);
      sub->add_option("--tool-call-parser", s.tool_call_parser, "tool-call parser (minimax_m2)")->group(g);
      sub->add_flag("--enable-auto-tool-choice", s.enable_auto_tool_choice, "allow tool_choice auto (with --tools)")
          ->group(g);
      sub->add_option("--chat-template", s.chat_template, "chat template file or text")->group(g);
      sub->add_option("--tokenizer", s.tokenizer, "tokenizer folder (default: the model's)")->group(g);
      sub->add_option("--max-model-len", s.max_model_len, "context length (default: from config.json)")->group(g);
      sub->add_option("--seed", s.seed, "sampling seed (default 0)")->group(g);
      sub->add_option("--speculative-config", s.speculative_config,
                      "speculative decoding as serve's flag (vLLM JSON: ngram, eagle3, mtp)")
          ->group(g);
#ifdef MOESERVE_HAS_TEST_BACKENDS
      sub->add_option("--test-replay-backend", s.replay_script, "TEST ONLY: scripted replay executor (JSON)")->group("");
#endif
      return [a, sub] { return run_chat(*a, sub); };
    });

}  // namespace
