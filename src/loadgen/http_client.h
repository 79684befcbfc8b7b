// An asynchronous HTTP/1.1 client for one server, built for many concurrent streamed
// responses on a single thread. It hands body bytes to the caller as they arrive (chunked
// transfer coding removed), keeps connections alive and reuses them, and bounds every
// request with a deadline.
//
// Threading: everything runs on the io_context given to the constructor; call send() from
// that context's thread (or before it runs). Callbacks run there too.
//
// Boost.Beast stays inside http_client.cpp: only that translation unit pays for it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "loadgen/url.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace metro::loadgen {

enum class TransportError : uint8_t {
  kNone,
  kConnect,   // no connection to the server
  kTimeout,   // the request's deadline passed
  kClosed,    // the connection ended (or broke) before the response was complete
  kProtocol,  // the bytes were not an HTTP/1.1 response
  kAborted,   // on_body asked to stop
};

// The key a failure is counted under in reports.
inline std::string_view transport_error_name(TransportError e) {
  switch (e) {
    case TransportError::kNone: return "none";
    case TransportError::kConnect: return "connect_error";
    case TransportError::kTimeout: return "timeout";
    case TransportError::kClosed: return "disconnected";
    case TransportError::kProtocol: return "bad_response";
    case TransportError::kAborted: return "bad_response";
  }
  return "unknown";
}

struct HttpOutcome {
  TransportError error = TransportError::kNone;
  std::string message;  // what went wrong, for the report
  int status = 0;       // 0 when no response head arrived
};

struct HttpRequest {
  std::string method = "POST";
  std::string target;  // path and query, e.g. "/v1/completions"
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;    // sent with Content-Type: application/json when not empty
};

struct HttpCallbacks {
  std::function<void(int status)> on_head;              // once, when the status line and headers are in
  std::function<bool(std::string_view bytes)> on_body;  // body bytes as they arrive; false aborts
  std::function<void(const HttpOutcome&)> on_done;      // exactly once, last
};

struct HttpClientStats {
  size_t connections_opened = 0;
  size_t connections_reused = 0;
  size_t stale_retries = 0;  // a kept-alive connection the server had closed; resent on a new one
};

class HttpClient {
 public:
  HttpClient(boost::asio::io_context& io, Url url);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Looks the host up (blocking, once). Call before send().
  Status resolve();
  // Starts one exchange; callbacks report its progress. timeout_s bounds the whole exchange.
  void send(HttpRequest request, HttpCallbacks callbacks, double timeout_s);
  // Closes connections kept for reuse.
  void close_idle();
  HttpClientStats stats() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace metro::loadgen
