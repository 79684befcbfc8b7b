// The HTTP transport in-process, without a model (it "loads" until the test ends): limits,
// status codes, keep-alive, timeouts, auth and drain (docs/reliability.md 19, 21, 22, 24, 25).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <optional>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/server.h"
#include "server/server_core.h"

namespace metro::server {
namespace {

using nlohmann::json;

// A blocking loopback HTTP/1.1 client that reads one response at a time.
class RawClient {
 public:
  explicit RawClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~RawClient() { ::close(fd_); }
  bool connected() const { return connected_; }

  void send(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }

  struct Response {
    int status = 0;
    std::string head;
    std::string body;
    bool ok = false;
  };

  // Reads one response with a Content-Length body; waits at most timeout_ms per read.
  Response read_response(int timeout_ms = 10000) {
    Response r;
    size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill(timeout_ms)) return r;
    }
    r.head = buf_.substr(0, end + 2);
    buf_.erase(0, end + 4);
    r.status = std::stoi(r.head.substr(9, 3));
    if (r.status == 100) return read_response(timeout_ms);
    size_t len = 0;
    const size_t cl = lower(r.head).find("content-length: ");
    if (cl != std::string::npos) len = std::stoul(r.head.substr(cl + 16));
    while (buf_.size() < len) {
      if (!fill(timeout_ms)) return r;
    }
    r.body = buf_.substr(0, len);
    buf_.erase(0, len);
    r.ok = true;
    return r;
  }

  // True when the server closes the connection within timeout_ms.
  // What arrives until the server closes (nullopt: still open after timeout_ms).
  std::optional<std::string> rest_until_closed(int timeout_ms) {
    std::string got;
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) <= 0) return std::nullopt;
      char c[4096];
      const ssize_t n = ::recv(fd_, c, sizeof(c), 0);
      if (n <= 0) return got;
      got.append(c, static_cast<size_t>(n));
    }
  }

  bool closed_within(int timeout_ms) {
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) <= 0) return false;
      char c[4096];
      const ssize_t n = ::recv(fd_, c, sizeof(c), 0);
      if (n <= 0) return true;
    }
  }

 private:
  static std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  bool fill(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    char c[65536];
    const ssize_t n = ::recv(fd_, c, sizeof(c), 0);
    if (n <= 0) return false;
    buf_.append(c, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  std::string buf_;
};

std::string get(const std::string& path, const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + extra + "\r\n";
}
std::string post(const std::string& path, const std::string& body, const std::string& extra = "") {
  return "POST " + path +
         " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n" + extra + "\r\n" + body;
}

// A server whose model never finishes loading (until the fixture ends).
class HttpServerTest : public ::testing::Test {
 protected:
  void start(ServerConfig cfg = {}) {
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    cfg.handle_signals = false;
    cfg.http_threads = 1;
    auto gate = release_.get_future().share();
    server_ = std::make_unique<Server>(std::move(cfg), [gate](gateway::FrontDoor&) -> Status {
      gate.wait();
      return unavailable("test over");
    });
    ASSERT_TRUE(server_->start().ok());
  }
  void TearDown() override {
    release_.set_value();
    if (server_) {
      EXPECT_EQ(server_->wait(), 1);  // the load "failed"
    }
    server_.reset();
  }
  RawClient::Response roundtrip(const std::string& req) {
    RawClient c(server_->port());
    EXPECT_TRUE(c.connected());
    c.send(req);
    return c.read_response();
  }
  static json error_of(const RawClient::Response& r) {
    json j = json::parse(r.body);
    EXPECT_TRUE(j.contains("error")) << r.body;
    return j["error"];
  }

  std::promise<void> release_;
  std::unique_ptr<Server> server_;
};

TEST_F(HttpServerTest, HealthAnswersWhileTheModelLoads) {  // docs/reliability.md 22
  start();
  auto h = roundtrip(get("/health"));
  ASSERT_TRUE(h.ok);
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(json::parse(h.body)["status"], "ok");
  auto ready = roundtrip(get("/ready"));
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(error_of(ready)["code"], "model_loading");
  for (const std::string path : {"/v1/completions", "/v1/chat/completions", "/v1/embeddings"}) {
    auto r = roundtrip(post(path, R"({"prompt":"x","messages":[{"role":"user","content":"x"}],"input":"x"})"));
    EXPECT_EQ(r.status, 503) << path;
    EXPECT_EQ(error_of(r)["code"], "model_loading");
    EXPECT_NE(r.head.find("Retry-After:"), std::string::npos);
  }
  EXPECT_EQ(roundtrip(get("/v1/models")).status, 503);
  auto metrics = roundtrip(get("/metrics"));
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("metro_model_loaded 0"), std::string::npos);
  EXPECT_NE(metrics.body.find("metro_http_requests_total{endpoint=\"/health\",status=\"200\"} 1"), std::string::npos);
  auto ui = roundtrip(get("/"));
  EXPECT_EQ(ui.status, 200);
  EXPECT_NE(ui.head.find("text/html"), std::string::npos);
  EXPECT_NE(ui.body.find("ui/app.js"), std::string::npos);
  auto app = roundtrip(get("/ui/app.js"));
  EXPECT_EQ(app.status, 200);
  EXPECT_NE(app.body.find("v1/chat/completions"), std::string::npos);
}

TEST_F(HttpServerTest, UnknownRoutesAndMethods) {
  start();
  auto r = roundtrip(get("/v2/nothing"));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(error_of(r)["type"], "invalid_request_error");
  auto m = roundtrip(get("/v1/chat/completions"));
  EXPECT_EQ(m.status, 405);
  EXPECT_NE(m.head.find("Allow: POST"), std::string::npos);
  EXPECT_EQ(roundtrip(post("/health", "{}")).status, 405);
  EXPECT_EQ(roundtrip("DELETE /v1/models HTTP/1.1\r\nHost: x\r\n\r\n").status, 405);
}

TEST_F(HttpServerTest, HugeHeadersAre431AndHugeBodies413) {  // docs/reliability.md 19
  ServerConfig cfg;
  cfg.max_header_bytes = 4096;
  cfg.limits.max_body_bytes = 1 << 16;
  start(cfg);
  RawClient c(server_->port());
  c.send(get("/health", "X-Big: " + std::string(8000, 'a') + "\r\n"));
  auto r = c.read_response();
  EXPECT_EQ(r.status, 431);
  EXPECT_EQ(error_of(r)["code"], "headers_too_large");
  EXPECT_TRUE(c.closed_within(5000));

  // The body is refused from its Content-Length, before it is sent.
  RawClient b(server_->port());
  b.send(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
      "10000000\r\n\r\n{");
  auto big = b.read_response();
  EXPECT_EQ(big.status, 413);
  EXPECT_EQ(error_of(big)["code"], "body_too_large");
  // And the server still serves.
  EXPECT_EQ(roundtrip(get("/health")).status, 200);
}

TEST_F(HttpServerTest, MalformedHttpIs400) {
  start();
  RawClient c(server_->port());
  c.send("THIS IS NOT HTTP\r\n\r\n");
  auto r = c.read_response();
  EXPECT_EQ(r.status, 400);
  EXPECT_TRUE(c.closed_within(5000));
  EXPECT_EQ(roundtrip(get("/health")).status, 200);
}

TEST_F(HttpServerTest, KeepAliveAndPipelining) {
  start();
  RawClient c(server_->port());
  c.send(get("/health"));
  EXPECT_EQ(c.read_response().status, 200);
  c.send(get("/health") + get("/nope") + get("/ready"));
  EXPECT_EQ(c.read_response().status, 200);
  EXPECT_EQ(c.read_response().status, 404);
  EXPECT_EQ(c.read_response().status, 503);
  c.send("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  auto last = c.read_response();
  EXPECT_EQ(last.status, 200);
  EXPECT_NE(last.head.find("Connection: close"), std::string::npos);
  EXPECT_TRUE(c.closed_within(5000));
}

TEST_F(HttpServerTest, ConnectionLimit) {
  ServerConfig cfg;
  cfg.max_connections = 2;
  start(cfg);
  RawClient a(server_->port()), b(server_->port());
  a.send(get("/health"));
  b.send(get("/health"));
  EXPECT_EQ(a.read_response().status, 200);
  EXPECT_EQ(b.read_response().status, 200);
  RawClient c(server_->port());
  c.send(get("/health"));
  auto r = c.read_response();
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(error_of(r)["code"], "too_many_connections");
}

TEST_F(HttpServerTest, SlowClientsTimeOut) {  // docs/reliability.md 21
  ServerConfig cfg;
  cfg.idle_timeout_s = 1;
  cfg.keepalive_timeout_s = 1;
  start(cfg);
  RawClient slow(server_->port());
  slow.send("GET /health HTTP/1.1\r\nHost");  // then nothing
  auto r = slow.read_response(5000);
  EXPECT_EQ(r.status, 408);
  EXPECT_TRUE(slow.closed_within(5000));
  RawClient idle(server_->port());  // connects and never sends
  EXPECT_TRUE(idle.closed_within(5000));
  EXPECT_EQ(roundtrip(get("/health")).status, 200);
}

TEST_F(HttpServerTest, ApiKeysGuardV1) {
  ServerConfig cfg;
  auto keys = ApiKeys::parse("sk-test-key-1 team-a\n");
  ASSERT_TRUE(keys.ok());
  cfg.api_keys = std::move(*keys);
  start(cfg);
  auto none = roundtrip(post("/v1/completions", R"({"prompt":"x"})"));
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(error_of(none)["code"], "invalid_api_key");
  auto wrong = roundtrip(post("/v1/completions", R"({"prompt":"x"})", "Authorization: Bearer sk-test-key-2\r\n"));
  EXPECT_EQ(wrong.status, 401);
  EXPECT_EQ(wrong.body.find("sk-test"), std::string::npos);  // never echoes keys
  EXPECT_EQ(roundtrip(get("/v1/models", "Authorization: Bearer nope-nope\r\n")).status, 401);
  // The right key passes auth (and meets the loading model).
  auto right = roundtrip(post("/v1/completions", R"({"prompt":"x"})", "Authorization: Bearer sk-test-key-1\r\n"));
  EXPECT_EQ(right.status, 503);
  EXPECT_EQ(roundtrip(get("/health")).status, 200);  // not under /v1: open
  // Without a key nobody learns which routes exist: 401 before 404 and 405.
  EXPECT_EQ(roundtrip(get("/v1/nonexistent")).status, 401);
  EXPECT_EQ(roundtrip(post("/v1/files", "{}")).status, 401);
  EXPECT_EQ(roundtrip(get("/v1/completions")).status, 401);
  EXPECT_EQ(roundtrip(get("/v1/nonexistent", "Authorization: Bearer sk-test-key-1\r\n")).status, 404);
  EXPECT_EQ(roundtrip(get("/v1/completions", "Authorization: Bearer sk-test-key-1\r\n")).status, 405);
}

TEST_F(HttpServerTest, DrainClosesIdleConnectionsAndStops) {  // docs/reliability.md 25
  start();
  RawClient idle(server_->port());
  idle.send(get("/health"));
  EXPECT_EQ(idle.read_response().status, 200);
  server_->request_drain();
  EXPECT_TRUE(idle.closed_within(5000));
  EXPECT_EQ(server_->wait(), 0);  // nothing in flight: stops at once
  RawClient late(server_->port());
  EXPECT_FALSE(late.connected() && (late.send(get("/health")), late.read_response(1000).ok));
  release_.set_value();
  server_.reset();
  release_ = std::promise<void>();
}

// Framing the parser would accept but RFC 9112 refuses: a Transfer-Encoding not ending in
// chunked (400) or with another coding (501), each closing the connection so that nothing
// after the header is read as a request; HTTP/1.1 without exactly one Host (400).
TEST_F(HttpServerTest, TransferEncodingAndHostAreChecked) {  // docs/reliability.md 34
  start();
  const std::string smuggled = get("/health");
  struct Case {
    const char* te;
    int status;
  };
  for (const Case& c : {Case{"xchunked", 400}, Case{"chunked, identity", 400}, Case{"identity", 400},
                        Case{"gzip, chunked", 501}, Case{"chunked, chunked", 501}}) {
    RawClient client(server_->port());
    client.send(std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n") +
                "Transfer-Encoding: " + c.te + "\r\n\r\n" + "{}" + smuggled);
    EXPECT_EQ(client.read_response().status, c.status) << c.te;
    const std::optional<std::string> rest = client.rest_until_closed(5000);
    ASSERT_TRUE(rest) << c.te << ": the connection stays open";
    EXPECT_EQ(rest->find("HTTP/1.1"), std::string::npos) << c.te << ": the smuggled request was answered";
  }
  RawClient no_host(server_->port());
  no_host.send("GET /health HTTP/1.1\r\n\r\n");
  EXPECT_EQ(no_host.read_response().status, 400);
  RawClient two_hosts(server_->port());
  two_hosts.send("GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
  EXPECT_EQ(two_hosts.read_response().status, 400);
  RawClient old(server_->port());
  old.send("GET /health HTTP/1.0\r\n\r\n");
  EXPECT_EQ(old.read_response().status, 200);
  RawClient chunked(server_->port());  // a well-formed chunked body is read as one request
  chunked.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n");
  EXPECT_EQ(chunked.read_response().status, 503);  // reaches the (loading) model
}

// Probes keep working through a drain: the listener stays open, /health answers 200 and
// /ready 503 server_draining on new connections, until the last request is done.
TEST_F(HttpServerTest, HealthAndReadyAnswerDuringADrain) {  // docs/reliability.md 38
  start();
  RawClient busy(server_->port());
  busy.send("GET /health HTTP/1.1\r\nHost: x\r\n");  // a request still arriving holds the drain
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server_->request_drain();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int i = 0; i < 3; ++i) {
    RawClient probe(server_->port());
    ASSERT_TRUE(probe.connected());
    probe.send(get("/health"));
    EXPECT_EQ(probe.read_response().status, 200);
    RawClient ready(server_->port());
    ready.send(get("/ready"));
    RawClient::Response r = ready.read_response();
    EXPECT_EQ(r.status, 503);
    EXPECT_NE(r.body.find("server_draining"), std::string::npos) << r.body;
  }
  busy.send("\r\n");
  EXPECT_EQ(busy.read_response().status, 200);
  EXPECT_EQ(server_->wait(), 0);
  release_.set_value();
  server_.reset();
  release_ = std::promise<void>();
}

TEST(HttpServerLoadTest, LoadFailureEndsWait) {
  ServerConfig cfg;
  cfg.port = 0;
  cfg.handle_signals = false;
  Status seen;
  Server::Callbacks cb;
  cb.on_load_failed = [&](const Status& s) { seen = s; };
  Server s(
      cfg, [](gateway::FrontDoor&) -> Status { return data_loss("bad file"); }, cb);
  ASSERT_TRUE(s.start().ok());
  EXPECT_EQ(s.wait(), 1);
  EXPECT_EQ(seen.message(), "bad file");
}

}  // namespace
}  // namespace metro::server
