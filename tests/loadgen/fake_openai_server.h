// An in-process OpenAI-compatible server for tests of the load generator.
//
// It runs its own Asio loop on its own thread, on 127.0.0.1 and an ephemeral port, and
// answers /v1/completions, /v1/chat/completions (streamed or whole) and /v1/models. What it
// does with each request is the test's choice (FakeBehavior): status codes, delays before
// and between tokens, cutting every event across HTTP chunks and TCP writes at awkward
// places, dropping the connection mid-stream, lying about keep-alive.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace metro::loadgen::testing {

struct FakeRequest {
  size_t index = 0;  // arrival order
  std::string method;
  std::string target;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  nlohmann::json json;  // the parsed body, or null
  double received_s = 0.0;  // seconds since the server started

  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

struct FakeBehavior {
  int status = 200;                  // anything else: a JSON error body
  double first_token_delay_s = 0.0;  // before the first token
  double token_interval_s = 0.0;     // between tokens
  int n_tokens = -1;                 // -1: the request's max_tokens
  int disconnect_after_tokens = -1;  // >= 0: drop the connection after that many tokens
  bool awkward_splits = true;        // cut each event across two HTTP chunks and three writes
  bool crlf = false;                 // end SSE lines with CRLF instead of LF
  bool chunked = true;               // false: no Transfer-Encoding, the body ends at close
  bool keep_alive = true;            // false: "Connection: close", then close
  bool close_despite_keep_alive = false;  // say keep-alive, close anyway (a stale pooled socket)
  bool send_usage = true;            // honour stream_options.include_usage
  std::string token_text = " tok";
};

using BehaviorFn = std::function<FakeBehavior(const FakeRequest&)>;

class FakeOpenAiServer {
 public:
  explicit FakeOpenAiServer(BehaviorFn behavior = {});
  ~FakeOpenAiServer();
  FakeOpenAiServer(const FakeOpenAiServer&) = delete;
  FakeOpenAiServer& operator=(const FakeOpenAiServer&) = delete;

  uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::vector<FakeRequest> requests() const;
  size_t peak_concurrent_requests() const;
  size_t connections_accepted() const;

  // Internal, for the connection objects.
  struct Shared;

 private:
  boost::asio::io_context io_;
  std::shared_ptr<Shared> shared_;
  uint16_t port_ = 0;
  std::thread thread_;
};

// Prompt words of a request body (what the fake reports as prompt_tokens).
int64_t fake_prompt_tokens(const nlohmann::json& body);

}  // namespace metro::loadgen::testing
