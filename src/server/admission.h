// The hook through which a traffic policy (src/gateway) admits or refuses a request before
// any engine work is done (RELIABILITY.md 26-27). The server calls it once per HTTP request,
// after parsing and tokenizing, on a worker thread (never the I/O thread); it must be
// thread-safe and quick.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sched/seq_state.h"

namespace metro::server {

struct AdmissionRequest {
  std::string endpoint;  // "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
  sched::SlaClass sla_class = sched::SlaClass::kStandard;  // X-Metro-Class or metro_class
  std::string tenant;                                      // from the API key's tenant name; "" without keys
  int prompt_tokens = 0;                                   // over every prompt of the request
  int cached_prompt_tokens = 0;                            // of which the prefix cache holds now, or will
                                                           // once requests admitted earlier with the same
                                                           // prefix compute it (estimate)
  int max_tokens = 0;                                      // per choice
  int n_choices = 1;                                       // prompts x n
  int64_t deadline_ns = 0;                                 // first token due by then (now_ns clock); 0: none
  int64_t start_ns = 0;                                    // when admission was asked (now_ns clock)
  // Set by the server once admitted: its prompts registered as pending prefixes
  // (Engine::hold_pending_prefix), released with the first token.
  std::vector<std::shared_ptr<const void>> pending_prefixes;
};

struct AdmissionDecision {
  bool admit = true;
  int status = 503;  // 429 (tenant over quota) or 503 (server full)
  std::string code;  // e.g. "rate_limit_exceeded", "overloaded"
  std::string message;
  int retry_after_seconds = 1;

  static AdmissionDecision accept() { return {}; }
  static AdmissionDecision reject(int status, std::string code, std::string message, int retry_after_seconds) {
    return {false, status, std::move(code), std::move(message), retry_after_seconds};
  }
};

using AdmissionHook = std::function<AdmissionDecision(const AdmissionRequest&)>;

// How an admitted request ended.
struct AdmissionOutcome {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  bool completed = false;  // false: aborted, client gone, refused after admission, engine error
};

// For policies that count admitted requests as queued or in flight. Each admitted request
// gets exactly one release (when its first token is out, or when it ends without one) and
// then exactly one done. Called on I/O threads: must be thread-safe and quick.
using AdmissionReleaseHook = std::function<void(const AdmissionRequest&)>;
using AdmissionDoneHook = std::function<void(const AdmissionRequest&, const AdmissionOutcome&)>;

}  // namespace metro::server
