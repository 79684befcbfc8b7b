// metro router: the policies on synthetic loads, and the router in process in front of
// fake replicas (raw sockets in the test) that answer, stream, vanish mid-stream, fail
// health checks and come back.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "router/policy.h"
#include "router/router.h"

namespace metro::router {
namespace {

std::vector<uint64_t> blocks(const std::string& text) { return prefix_block_hashes(text, 16); }

TEST(RouterPolicy, RoundRobinSkipsUnhealthyReplicas) {
  Picker p(Policy::kRoundRobin, 3);
  std::vector<ReplicaLoad> l(3);
  l[1].healthy = false;
  std::vector<int> got;
  for (int i = 0; i < 4; ++i) got.push_back(p.pick(l, {}));
  EXPECT_EQ(got, (std::vector<int>{0, 2, 0, 2}));
  for (auto& x : l) x.healthy = false;
  EXPECT_EQ(p.pick(l, {}), -1);
}

TEST(RouterPolicy, LeastLoadCountsInflightAndWaiting) {
  Picker p(Policy::kLeastLoad, 3);
  std::vector<ReplicaLoad> l(3);
  l[0].inflight = 3;
  l[1].waiting = 1.0;
  l[2].inflight = 1;
  l[2].waiting = 2.0;
  EXPECT_EQ(p.pick(l, {}), 1);
}

TEST(RouterPolicy, PrefixSticksToTheReplicaThatHoldsItUnderTheLoadBound) {
  PrefixConfig cfg;
  cfg.load_penalty = 0.5;
  Picker p(Policy::kPrefix, 2, cfg);
  std::vector<ReplicaLoad> l(2);
  const std::string shared(200, 'S');
  const int first = p.pick(l, blocks(shared + "question one"));
  ASSERT_GE(first, 0);
  EXPECT_EQ(p.matched(first, blocks(shared + "another question")), 200u / 16);
  // Busier, but within the bound: the cached prefix wins.
  l[static_cast<size_t>(first)].inflight = 2;
  EXPECT_EQ(p.pick(l, blocks(shared + "question two")), first);
  // Past the bound (least load x 1.5 + 4): the other replica, which then holds it too.
  l[static_cast<size_t>(first)].inflight = 5;
  const int other = p.pick(l, blocks(shared + "question three"));
  EXPECT_EQ(other, 1 - first);
  EXPECT_GT(p.matched(other, blocks(shared)), 0u);
  // A replica that left the pool forgets what it held.
  p.forget(first);
  EXPECT_EQ(p.matched(first, blocks(shared)), 0u);
  // Unrelated prompts spread by load.
  l[0].inflight = 0;
  l[1].inflight = 4;
  EXPECT_EQ(p.pick(l, blocks(std::string(100, 'x'))), 0);
}

TEST(RouterPolicy, ParsesNamesAndUpstreams) {
  Policy pol;
  EXPECT_TRUE(parse_policy("least-load", &pol));
  EXPECT_EQ(pol, Policy::kLeastLoad);
  EXPECT_FALSE(parse_policy("random", &pol));
  auto u = parse_upstream("http://127.0.0.1:8080/");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 8080);
  EXPECT_FALSE(parse_upstream("https://x:1").ok());
  EXPECT_FALSE(parse_upstream("http://x").ok());
  EXPECT_FALSE(parse_upstream("http://x:99999").ok());
}

// A fake replica: /health (200 unless told otherwise), /metrics, and chat requests answered
// as JSON naming the replica, as a three-event stream, or ("die" in the body) with one
// event then a closed connection.
class FakeReplica {
 public:
  explicit FakeReplica(std::string name) : name_(std::move(name)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(fd_, 64);
    thread_ = std::thread([this] { loop(); });
  }
  ~FakeReplica() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  uint16_t port() const { return port_; }
  std::atomic<bool> healthy{true};
  std::atomic<int> chats{0};

 private:
  void loop() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      std::string req;
      char buf[4096];
      ssize_t n;
      while (req.find("\r\n\r\n") == std::string::npos && (n = ::recv(c, buf, sizeof(buf), 0)) > 0) req.append(buf, n);
      const size_t cl = req.find("Content-Length: ");
      const size_t want = cl == std::string::npos ? 0 : std::stoul(req.substr(cl + 16));
      while (req.size() - req.find("\r\n\r\n") - 4 < want && (n = ::recv(c, buf, sizeof(buf), 0)) > 0) req.append(buf, n);
      std::string out;
      if (req.starts_with("GET /health")) {
        out = healthy ? "HTTP/1.0 200 OK\r\n\r\n{\"status\":\"ok\"}" : "HTTP/1.0 503 Unavailable\r\n\r\n{}";
      } else if (req.starts_with("GET /metrics")) {
        out = "HTTP/1.0 200 OK\r\n\r\n# TYPE metro_requests_waiting gauge\nmetro_requests_waiting{model=\"m\"} 3\n";
      } else {
        ++chats;
        if (req.find("\"stream\":true") != std::string::npos) {
          out = "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: {\"from\":\"" + name_ + "\"}\n\n";
          if (req.find("die") == std::string::npos) out += "data: {\"n\":2}\n\ndata: [DONE]\n\n";
        } else {
          out = "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"from\":\"" + name_ + "\"}";
        }
      }
      ::send(c, out.data(), out.size(), MSG_NOSIGNAL);
      ::close(c);
    }
  }
  std::string name_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// One request to the router: the whole response.
std::string ask(uint16_t port, const std::string& method, const std::string& path, const std::string& body = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return {};
  }
  const std::string req = method + " " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

RouterConfig config_for(const std::vector<const FakeReplica*>& reps, Policy policy) {
  RouterConfig cfg;
  cfg.port = 0;
  cfg.policy = policy;
  cfg.health_period_s = 0.05;
  cfg.upstream_timeout_s = 5.0;
  for (const FakeReplica* r : reps) cfg.upstreams.push_back(*parse_upstream("http://127.0.0.1:" + std::to_string(r->port())));
  return cfg;
}

TEST(Router, ForwardsAnswersAndStreamsAndEndsALostStreamWithAnError) {
  FakeReplica a("a"), b("b");
  Router r(config_for({&a, &b}, Policy::kRoundRobin));
  ASSERT_TRUE(r.start().ok());
  const std::string x = ask(r.port(), "POST", "/v1/chat/completions", R"({"messages":[]})");
  const std::string y = ask(r.port(), "POST", "/v1/chat/completions", R"({"messages":[]})");
  EXPECT_NE(x.find("200 OK"), std::string::npos) << x;
  EXPECT_NE((x + y).find("\"from\":\"a\""), std::string::npos);
  EXPECT_NE((x + y).find("\"from\":\"b\""), std::string::npos);  // round robin
  const std::string s = ask(r.port(), "POST", "/v1/chat/completions", R"({"stream":true})");
  EXPECT_NE(s.find("data: [DONE]"), std::string::npos) << s;
  EXPECT_EQ(s.find("upstream_lost"), std::string::npos) << s;
  const std::string lost = ask(r.port(), "POST", "/v1/chat/completions", R"({"stream":true,"x":"die"})");
  EXPECT_NE(lost.find("data: {\"from\""), std::string::npos) << lost;
  EXPECT_NE(lost.find("\"code\": \"upstream_lost\""), std::string::npos) << lost;
  const std::string m = ask(r.port(), "GET", "/metrics");
  EXPECT_NE(m.find("metro_router_upstream_lost_total"), std::string::npos);
  EXPECT_NE(m.find("metro_router_requests_total"), std::string::npos);
  EXPECT_NE(ask(r.port(), "GET", "/health").find("200 OK"), std::string::npos);
  r.stop();
}

TEST(Router, UnhealthyReplicasLeaveThePoolAndComeBack) {
  FakeReplica a("a"), b("b");
  Router r(config_for({&a, &b}, Policy::kLeastLoad));
  ASSERT_TRUE(r.start().ok());
  // Their /metrics report 3 waiting each.
  for (int i = 0; i < 100 && r.loads()[0].waiting != 3.0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(r.loads()[0].waiting, 3.0);
  a.healthy = false;
  for (int i = 0; i < 200 && r.loads()[0].healthy; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_FALSE(r.loads()[0].healthy);
  const int before = a.chats.load();
  for (int i = 0; i < 6; ++i) EXPECT_NE(ask(r.port(), "POST", "/v1/completions", "{}").find("\"from\":\"b\""), std::string::npos);
  EXPECT_EQ(a.chats.load(), before);
  a.healthy = true;
  for (int i = 0; i < 200 && !r.loads()[0].healthy; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(r.loads()[0].healthy);
  b.healthy = false;
  for (int i = 0; i < 200 && r.loads()[1].healthy; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_NE(ask(r.port(), "POST", "/v1/completions", "{}").find("\"from\":\"a\""), std::string::npos);
  a.healthy = false;
  for (int i = 0; i < 200 && r.loads()[0].healthy; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_NE(ask(r.port(), "POST", "/v1/completions", "{}").find("503"), std::string::npos);
  EXPECT_NE(ask(r.port(), "GET", "/health").find("503"), std::string::npos);
  r.stop();
}

TEST(Router, AReplicaThatRefusesConnectionsIsSkipped) {
  FakeReplica a("a");
  RouterConfig cfg = config_for({&a}, Policy::kRoundRobin);
  // A port nothing listens on (bound, then closed).
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(s);
  cfg.upstreams.push_back(*parse_upstream("http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port))));
  cfg.health_period_s = 60.0;  // no poll between the requests: the refusal itself takes it out
  Router r(cfg);
  ASSERT_TRUE(r.start().ok());
  for (int i = 0; i < 4; ++i) EXPECT_NE(ask(r.port(), "POST", "/v1/completions", "{}").find("\"from\":\"a\""), std::string::npos);
  r.stop();
}

}  // namespace
}  // namespace metro::router
