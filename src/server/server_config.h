// Everything `metro serve` can be told about HTTP: where to listen, limits, keys, and the
// gateway front door requests pass. Engine settings travel separately (engine::EngineConfig),
// inside the model loader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "gateway/front_door.h"
#include "server/auth.h"

namespace metro::cache {
class SemanticCache;
class Embedder;
}  // namespace metro::cache

namespace metro::server {

class KvEventsPublisher;

class TeacherCapture;

// Bounds on what one request may ask for (docs/reliability.md).
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
  int http_threads = 2;                 // Asio I/O threads
  int prep_threads = 2;                 // threads that parse, render templates and tokenize
  int prep_queue = 4096;                // requests waiting for them, all tenants (503 beyond)
  int prep_queue_per_tenant = 1024;     // of which one tenant's (503 beyond)
  size_t prep_queue_bytes = size_t{256} << 20;            // their bodies' bytes, all tenants
  size_t prep_queue_bytes_per_tenant = size_t{64} << 20;  // of which one tenant's
  size_t max_header_bytes = 16u << 10;  // 431 above
  int max_connections = 4096;           // 503 to connections beyond
  int idle_timeout_s = 30;              // per read / per write progress
  int request_timeout_s = 120;          // to receive one whole request (headers and body)
  int keepalive_timeout_s = 60;         // an idle keep-alive connection is closed after
  // SO_SNDBUF of connections in bytes (0: the OS default, which grows to megabytes): with a
  // bounded buffer a client that stops reading stalls the stream's writes within a few
  // dozen kilobytes, and the write timeout then aborts its request.
  int socket_send_buffer = 64 * 1024;
  double drain_timeout_s = 30.0;        // SIGTERM: wait this long for in-flight requests
  bool handle_signals = true;           // SIGTERM/SIGINT drain (off for in-process tests)
  RequestLimits limits;
  // Bytes of stored /v1/responses answers (least recently used dropped first; 0: none kept).
  size_t response_store_bytes = size_t{64} << 20;
  ApiKeys api_keys;                     // empty: no authentication
  // The admin API's key (/admin/...; server/admin_routes.h); empty: no admin API.
  std::string admin_key;
  // Loads a model file and adds it to the front door as `name` (`variant`, "" for a new
  // name) while serving: the admin API's `load`. Null: the admin API cannot load.
  std::function<Status(gateway::FrontDoor&, const std::string& name, const std::string& variant,
                       const std::string& path)>
      load_model;
  // One JSON record per answered request on stderr (`--log-format json`): id, trace, method,
  // path, status, tenant, and for model calls model, class, tokens, TTFT, end-to-end time.
  bool access_log = false;
  // Teacher capture (--capture-teacher): sampled answers written as a distillation dataset;
  // null: off.
  std::shared_ptr<TeacherCapture> teacher_capture;
  // --metrics-compat vllm: /metrics also carries the vllm: names fleet schedulers read (the
  // Gateway API Inference Extension's endpoint picker): waiting and running requests, KV
  // cache use, prompt and generated tokens, labelled by model_name.
  bool vllm_metric_names = false;
  // Semantic response cache (--semantic-cache) and the encoder that embeds requests for it
  // (--cache-embed-model); null: off.
  std::shared_ptr<cache::SemanticCache> semantic_cache;
  std::shared_ptr<cache::Embedder> cache_embedder;
  // Prefix-cache events over ZeroMQ (--kv-events); null: off.
  std::shared_ptr<KvEventsPublisher> kv_events;
  // Quotas, admission, the models served; null: a front door that admits everything.
  std::shared_ptr<gateway::FrontDoor> front_door;
};

}  // namespace metro::server
