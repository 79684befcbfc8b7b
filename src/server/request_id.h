// Request ids and trace context of one HTTP request.
//
// Every response carries `x-request-id`: the client's own when it sent a usable one (1 to 128
// characters of letters, digits and -_.:/+=@), else one made here ("req_" and 24 random
// alphanumerics). A W3C `traceparent` header (version 00: 32 hex digits of trace id, 16 of
// parent span id, 2 of flags; all-zero ids invalid) ties the request to its caller's trace
// in the access log.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace metro::server {

std::string request_id_for(std::string_view incoming);

// `prefix` and 24 random alphanumerics (response, message, tool-call and request ids).
std::string random_id(std::string_view prefix);

struct TraceContext {
  std::string trace_id;   // 32 lower-case hex digits
  std::string parent_id;  // 16 lower-case hex digits
  bool sampled = false;
};
// Nullopt for a missing or malformed header (which a server ignores, as the spec says).
std::optional<TraceContext> parse_traceparent(std::string_view header);

}  // namespace metro::server
