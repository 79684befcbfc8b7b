// Which handler answers a request: the route table of `metro serve`.
//
//   GET  /, /ui/...             web UI            GET  /health    200 while the process lives
//   GET  /ready                 200 once loaded   GET  /metrics   Prometheus text
//   GET  /v1/models             POST /v1/completions, /v1/chat/completions, /v1/embeddings
//   GET  /v1/models/{id}        POST /v1/responses, /tokenize, /detokenize
//   GET, DELETE /v1/responses/{id}   a stored response of the caller's tenant
//   POST /v1/feedback           a rating of an answer (server/feedback.h)
//   /admin/...                  the admin API, behind its own key (server/admin_routes.h)
//
// Cheap routes are answered at once on the I/O thread; model routes pass auth, loading,
// draining and content-type checks here and are then prepared on a worker thread.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/server_core.h"

namespace metro::server {

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;

  static HttpResponse json(int status, std::string body);
  static HttpResponse error(const ApiError& e);
};

// The parts of a request that routing looks at (kept free of Beast types).
struct RequestHead {
  std::string method;         // "GET", "POST", ...
  std::string target;         // path and query
  std::string authorization;  // Authorization header
  std::string content_type;
  std::string if_none_match;  // If-None-Match: the web UI's cached ETags
  std::optional<std::string> metro_class;  // X-Metro-Class
  std::optional<std::string> metro_deadline_ms;  // X-Metro-Deadline-Ms
};

struct RouteDecision {
  std::string endpoint;                  // metrics label: the path without query
  std::optional<HttpResponse> response;  // answer now, or
  std::optional<Endpoint> model_call;    // prepare and run this model endpoint
  CallContext call;
};

RouteDecision route_request(const RequestHead& head, ServerCore& core);

// %XX escapes of a path segment or query value decoded (clients escape '/' and spaces in
// model ids); a malformed escape stays as it is.
std::string percent_decode(const std::string& s);

}  // namespace metro::server
