// The hook through which a traffic policy (src/gateway) admits or refuses a request before
// any engine work is done (RELIABILITY.md 26-27). The server calls it once per HTTP request,
// after parsing and tokenizing, on a worker thread (never the I/O thread); it must be
// thread-safe and quick.
#pragma once

#include <functional>
#include <string>

#include "sched/seq_state.h"

namespace metro::server {

struct AdmissionRequest {
  std::string endpoint;  // "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
  sched::SlaClass sla_class = sched::SlaClass::kStandard;  // X-Metro-Class or metro_class
  std::string tenant;                                      // from the API key's tenant name; "" without keys
  int prompt_tokens = 0;                                   // over every prompt of the request
  int max_tokens = 0;                                      // per choice
  int n_choices = 1;                                       // prompts x n
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

}  // namespace metro::server
