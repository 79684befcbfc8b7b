// Everything `metro serve` can be told about HTTP: where to listen, limits, keys, hooks.
// Engine settings travel separately (engine::EngineConfig), inside the model loader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "gateway/embed_batcher.h"
#include "server/admission.h"
#include "server/auth.h"

namespace metro::server {

// Bounds on what one request may ask for (RELIABILITY.md 11, 12, 17, 19).
struct RequestLimits {
  int max_n = 16;                    // n per request (the engine's EngineConfig::max_n too)
  int max_prompts = 64;              // entries of an array prompt / embeddings input
  int max_choices = 64;              // prompts x n per request
  int max_logprobs = 20;             // completions `logprobs`, chat `top_logprobs`
  int max_stop = 16;                 // stop strings per request
  size_t max_stop_bytes = 256;       // bytes per stop string
  int max_logit_bias = 1024;         // logit_bias entries
  int max_messages = 4096;           // chat messages per request
  size_t max_body_bytes = 4u << 20;  // 413 above
};

struct ServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;                 // 0: any free port (see Server::port())
  std::string model_name;               // what /v1/models lists and requests must name
  int http_threads = 2;                 // Asio I/O threads
  int prep_threads = 2;                 // threads that parse, render templates and tokenize
  size_t max_header_bytes = 16u << 10;  // 431 above
  int max_connections = 4096;           // 503 to connections beyond
  int idle_timeout_s = 30;              // per read / per write progress
  int request_timeout_s = 120;          // to receive one whole request (headers and body)
  int keepalive_timeout_s = 60;         // an idle keep-alive connection is closed after
  int socket_send_buffer = 0;           // SO_SNDBUF of connections in bytes; 0: the OS default
  int max_inflight_choices = 8192;      // sum of choices over concurrent requests; 503 above
  double drain_timeout_s = 30.0;        // SIGTERM: wait this long for in-flight requests
  bool handle_signals = true;           // SIGTERM/SIGINT drain (off for in-process tests)
  RequestLimits limits;
  ApiKeys api_keys;                        // empty: no authentication
  AdmissionHook admission;                 // empty: admit everything
  AdmissionReleaseHook admission_release;  // optional: see admission.h
  AdmissionDoneHook admission_done;        // optional: see admission.h
  // Embeddings batching window (--embed-window); null: embeddings go to the engine at once.
  std::shared_ptr<gateway::EmbedBatcher> embed_window;
};

}  // namespace metro::server
