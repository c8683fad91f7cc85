// The serving stack of `moeserve serve` without its HTTP listener: the model resolved, the
// tokenizer and chat template loaded, the engine built and warmed up, and the OpenAI service
// (the one generation pipeline: template, tokenizer, reasoning and tool parsers) on top.
// `serve` puts an HttpServer in front of it; `chat` drives the same service in process
// (cli/chat_transport.h), so both answer through one pipeline.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "cli/serve_args.h"
#include "engine/engine.h"
#include "server/metrics.h"
#include "server/openai_service.h"
#include "server/tokenizer_frontend.h"

namespace moeserve::cli {

struct ServeStack {
  std::string model_arg;  // the model as given (the default served name)
  server::ServiceConfig config;
  // Declared in construction order; the service (which uses the others) goes first.
  std::unique_ptr<server::TokenizerFrontend> frontend;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::Metrics> metrics;
  std::unique_ptr<server::OpenAIService> service;
  ~ServeStack();
};

// What the loader reports as it goes: `phase` for the /health 503 body ("loading weights"),
// `status` for systemd's STATUS= line.
using StackProgress = std::function<void(const std::string& phase, const std::string& status)>;

// Checks that need no model (parsers known, device available) and fills serve's defaults
// (device, batch sizes). Throws moeserve::Error.
void check_stack_args(ServeArgs& a);
// Resolves (downloads) the model, loads tokenizer, template and weights, warms the engine up
// with one token and builds the service. `a.model` becomes the resolved folder.
std::unique_ptr<ServeStack> load_serve_stack(ServeArgs& a, const StackProgress& progress);

}  // namespace moeserve::cli
