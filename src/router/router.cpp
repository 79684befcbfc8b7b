#include "router/router.h"

#include <algorithm>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "base/metrics.h"

namespace metro::router {

namespace {

constexpr size_t kMaxHeaderBytes = 64 * 1024;
constexpr const char* kLostEvent =
    "data: {\"error\": {\"message\": \"the replica serving this stream was lost\", \"type\": \"server_error\", "
    "\"code\": \"upstream_lost\"}}\n\n";

void set_timeout(int fd, double seconds) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

bool send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool send_all(int fd, const std::string& s) { return send_all(fd, s.data(), s.size()); }

// A connected socket to host:port within `timeout_s`, or -1.
int connect_to(const std::string& host, uint16_t port, double timeout_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int flags = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, static_cast<int>(timeout_s * 1000)) == 1 ? 0 : -1;
      int err = 0;
      socklen_t len = sizeof(err);
      if (rc == 0 && (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)) rc = -1;
    }
    if (rc != 0) {
      ::close(fd);
      fd = -1;
      continue;
    }
    fcntl(fd, F_SETFL, flags);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  freeaddrinfo(res);
  return fd;
}

// One HTTP/1.0 exchange: the status and the body, or status 0. `extra`: header lines,
// each ending in \r\n.
std::pair<int, std::string> http_call(const Upstream& u, const std::string& method, const std::string& path,
                                      const std::string& extra, const std::string& body, double timeout_s) {
  const int fd = connect_to(u.host, u.port, timeout_s);
  if (fd < 0) return {0, {}};
  set_timeout(fd, timeout_s);
  std::string out;
  std::string req = method + " " + path + " HTTP/1.0\r\nHost: " + u.host + "\r\n" + extra;
  if (method == "POST") req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  if (send_all(fd, req)) {
    char buf[16384];
    for (;;) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
      if (out.size() > (size_t{8} << 20)) break;
    }
  }
  ::close(fd);
  int status = 0;
  if (out.rfind("HTTP/1.", 0) == 0 && out.size() > 12) status = std::atoi(out.c_str() + 9);
  const size_t b = out.find("\r\n\r\n");
  return {status, b == std::string::npos ? std::string() : out.substr(b + 4)};
}

std::pair<int, std::string> http_get(const Upstream& u, const std::string& path, double timeout_s) {
  return http_call(u, "GET", path, "", "", timeout_s);
}

struct Request {
  std::string method, target, version;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Reads one request (header, then a Content-Length body). Chunked request bodies are
// refused (OpenAI clients send a length). False on a malformed request or a closed socket;
// `error` then holds the response to send, if any.
bool read_request(int fd, size_t max_body, Request* r, std::string* error) {
  std::string buf;
  char tmp[16384];
  size_t end = std::string::npos;
  while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
    if (buf.size() > kMaxHeaderBytes) {
      *error = "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
      return false;
    }
    const ssize_t n = ::recv(fd, tmp, sizeof(tmp), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buf.append(tmp, static_cast<size_t>(n));
  }
  const std::string head = buf.substr(0, end);
  size_t line_end = head.find("\r\n");
  const std::string first = head.substr(0, line_end);
  const size_t s1 = first.find(' '), s2 = first.rfind(' ');
  if (s1 == std::string::npos || s2 == s1) {
    *error = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    return false;
  }
  r->method = first.substr(0, s1);
  r->target = first.substr(s1 + 1, s2 - s1 - 1);
  r->version = first.substr(s2 + 1);
  size_t content_length = 0;
  while (line_end != std::string::npos && line_end < head.size()) {
    const size_t next = head.find("\r\n", line_end + 2);
    const std::string line = head.substr(line_end + 2, (next == std::string::npos ? head.size() : next) - line_end - 2);
    line_end = next;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon), value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.erase(value.begin());
    const std::string ln = lower(name);
    if (ln == "content-length") content_length = static_cast<size_t>(std::strtoull(value.c_str(), nullptr, 10));
    if (ln == "transfer-encoding") {
      *error = "HTTP/1.1 411 Length Required\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
      return false;
    }
    r->headers.emplace_back(std::move(name), std::move(value));
  }
  if (content_length > max_body) {
    *error = "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    return false;
  }
  r->body = buf.substr(end + 4);
  while (r->body.size() < content_length) {
    const ssize_t n = ::recv(fd, tmp, sizeof(tmp), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    r->body.append(tmp, static_cast<size_t>(n));
  }
  r->body.resize(content_length);
  return true;
}

std::string json_response(int status, const std::string& reason, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

std::string error_body(const std::string& message, const std::string& code) {
  nlohmann::json j = {{"error", {{"message", message}, {"type", "server_error"}, {"code", code}}}};
  return j.dump();
}

// The text the prefix policy hashes: the chat messages' roles and contents in order, or the
// completion prompt; "" for anything else.
std::string prompt_text(const Request& r) {
  if (r.method != "POST") return {};
  const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return {};
  std::string text;
  if (auto m = j.find("messages"); m != j.end() && m->is_array()) {
    for (const auto& msg : *m) {
      if (!msg.is_object()) continue;
      text += msg.value("role", std::string()) + ":";
      if (auto c = msg.find("content"); c != msg.end()) text += c->is_string() ? c->get<std::string>() : c->dump();
      text += "\n";
    }
  } else if (auto p = j.find("prompt"); p != j.end()) {
    text = p->is_string() ? p->get<std::string>() : p->dump();
  } else if (auto in = j.find("input"); in != j.end()) {
    text = in->is_string() ? in->get<std::string>() : in->dump();
  }
  return text;
}

}  // namespace

Expected<Upstream> parse_upstream(const std::string& url) {
  std::string s = url;
  if (!s.starts_with("http://")) return invalid_argument("--upstream '" + url + "': expected http://HOST:PORT");
  s = s.substr(7);
  while (!s.empty() && s.back() == '/') s.pop_back();
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || s.find('/') != std::string::npos) {
    return invalid_argument("--upstream '" + url + "': expected http://HOST:PORT");
  }
  Upstream u;
  u.url = url;
  u.host = s.substr(0, colon);
  if (u.host.size() > 2 && u.host.front() == '[' && u.host.back() == ']') u.host = u.host.substr(1, u.host.size() - 2);
  const std::string p = s.substr(colon + 1);
  char* endp = nullptr;
  const long port = std::strtol(p.c_str(), &endp, 10);
  if (p.empty() || *endp != '\0' || port < 1 || port > 65535) {
    return invalid_argument("--upstream '" + url + "': bad port '" + p + "'");
  }
  u.port = static_cast<uint16_t>(port);
  return u;
}

struct Router::Replica {
  Upstream up;
  std::atomic<bool> healthy{true};
  std::atomic<int> inflight{0};
  std::atomic<double> waiting{0.0};
  std::atomic<int> failures{0};  // health checks failed in a row
  std::atomic<uint64_t> requests{0}, connect_errors{0}, lost{0}, left_pool{0};
};

Router::Router(RouterConfig cfg) : cfg_(std::move(cfg)) {
  for (const Upstream& u : cfg_.upstreams) {
    auto r = std::make_unique<Replica>();
    r->up = u;
    replicas_.push_back(std::move(r));
  }
  picker_ = std::make_unique<Picker>(cfg_.policy, replicas_.size(), cfg_.prefix);
}

Router::~Router() { stop(); }

Status Router::start() {
  if (replicas_.empty()) return invalid_argument("metro router needs at least one --upstream");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (getaddrinfo(cfg_.host.c_str(), std::to_string(cfg_.port).c_str(), &hints, &res) != 0 || res == nullptr) {
    return invalid_argument("cannot resolve --host '" + cfg_.host + "'");
  }
  listen_fd_ = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool ok = listen_fd_ >= 0 && ::bind(listen_fd_, res->ai_addr, res->ai_addrlen) == 0 && ::listen(listen_fd_, 512) == 0;
  freeaddrinfo(res);
  if (!ok) {
    const std::string why = std::strerror(errno);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
    return unavailable("cannot listen on " + cfg_.host + ":" + std::to_string(cfg_.port) + ": " + why);
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (!cfg_.kv_events.empty()) {
    if (cfg_.kv_events.size() != replicas_.size()) {
      return invalid_argument("--kv-events: give one endpoint per --upstream, in the same order (" +
                              std::to_string(cfg_.kv_events.size()) + " for " + std::to_string(replicas_.size()) + ")");
    }
    kv_index_ = std::make_unique<KvIndex>(replicas_.size());
    auto sub = KvSubscriber::start(cfg_.kv_events, kv_index_.get());
    if (!sub.ok()) return sub.status();
    kv_sub_ = std::move(*sub);
  }
  poll_once();  // the pool as it is now, before the first request
  poller_ = std::thread([this] { poll_loop(); });
  acceptor_ = std::thread([this] { accept_loop(); });
  return {};
}

void Router::stop() {
  if (stopping_.exchange(true)) return;
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(cfg_.drain_timeout_s), [&] { return open_connections_ == 0; });
  }
  cv_.notify_all();
  if (poller_.joinable()) poller_.join();
  kv_sub_.reset();
  // Connections still open past the drain timeout end when their replica answers or gives
  // up; the process exits without waiting for them.
}

std::vector<ReplicaLoad> Router::loads() const {
  std::vector<ReplicaLoad> out;
  for (const auto& r : replicas_) out.push_back({r->healthy.load(), r->inflight.load(), r->waiting.load()});
  return out;
}

void Router::mark(size_t r, bool ok, bool at_once) {
  Replica& rep = *replicas_[r];
  if (ok) {
    rep.failures.store(0);
    if (!rep.healthy.exchange(true)) METRO_LOG_INFO("router: %s is back in the pool", rep.up.url.c_str());
    return;
  }
  if ((rep.failures.fetch_add(1) + 1 >= 2 || at_once) && rep.healthy.exchange(false)) {
    ++rep.left_pool;
    picker_->forget(static_cast<int>(r));
    METRO_LOG_WARN("router: %s left the pool (health check failed)", rep.up.url.c_str());
  }
}

void Router::poll_once() {
  for (size_t i = 0; i < replicas_.size(); ++i) {
    Replica& rep = *replicas_[i];
    const auto [status, body] = http_get(rep.up, "/health", std::max(0.2, cfg_.health_period_s));
    mark(i, status == 200);
    if (status != 200) continue;
    const auto [ms, text] = http_get(rep.up, "/metrics", std::max(0.2, cfg_.health_period_s));
    if (ms != 200) continue;
    double waiting = 0.0;
    for (size_t p = 0; (p = text.find("metro_requests_waiting", p)) != std::string::npos; ++p) {
      if (p > 0 && text[p - 1] != '\n') continue;  // a HELP or TYPE line
      const size_t sp = text.find(' ', p), nl = text.find('\n', p);
      if (sp != std::string::npos && sp < nl) waiting += std::strtod(text.c_str() + sp + 1, nullptr);
    }
    rep.waiting.store(waiting);
  }
}

void Router::poll_loop() {
  std::unique_lock lock(mu_);
  while (!stopping_.load()) {
    cv_.wait_for(lock, std::chrono::duration<double>(cfg_.health_period_s), [&] { return stopping_.load(); });
    if (stopping_.load()) break;
    lock.unlock();
    poll_once();
    lock.lock();
  }
}

void Router::accept_loop() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_.load()) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    {
      std::lock_guard lock(mu_);
      ++open_connections_;
    }
    std::thread([this, fd] {
      serve(fd);
      ::close(fd);
      std::lock_guard lock(mu_);
      --open_connections_;
      cv_.notify_all();
    }).detach();
  }
}

void Router::serve(int fd) {
  set_timeout(fd, 60.0);  // a client's request arrives within a minute
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  Request req;
  std::string error;
  if (!read_request(fd, cfg_.max_body_bytes, &req, &error)) {
    if (!error.empty()) send_all(fd, error);
    return;
  }
  if (req.method == "GET" && req.target == "/health") {
    int healthy = 0;
    for (const auto& r : replicas_) healthy += r->healthy.load() ? 1 : 0;
    send_all(fd, json_response(healthy > 0 ? 200 : 503, healthy > 0 ? "OK" : "Service Unavailable",
                               nlohmann::json{{"status", healthy > 0 ? "ok" : "no healthy replica"},
                                              {"healthy_replicas", healthy},
                                              {"replicas", replicas_.size()}}
                                   .dump()));
    return;
  }
  if (req.method == "GET" && req.target == "/metrics") {
    const std::string body = metrics_text();
    send_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    return;
  }
  const std::vector<uint64_t> blocks = prefix_block_hashes(prompt_text(req), cfg_.prefix.block_bytes);
  // The request as the replica gets it: HTTP/1.0, so the answer's body ends with the
  // connection, and no hop-by-hop headers.
  std::string out = req.method + " " + req.target + " HTTP/1.0\r\n";
  for (const auto& [name, value] : req.headers) {
    const std::string ln = lower(name);
    if (ln == "connection" || ln == "keep-alive" || ln == "host" || ln == "content-length" || ln == "expect") continue;
    out += name + ": " + value + "\r\n";
  }
  std::vector<size_t> held;  // prompt tokens each replica's cache holds, by its KV events
  if (kv_index_ && cfg_.policy == Policy::kPrefix && req.method == "POST" && kv_index_->block_size() > 0) {
    std::string auth;
    for (const auto& [name, value] : req.headers) {
      const std::string ln = lower(name);
      if (ln == "authorization" || ln == "x-api-key") auth += name + ": " + value + "\r\n";
    }
    const std::vector<int32_t> tokens = prompt_tokens(req.body, auth);
    if (!tokens.empty()) {
      for (size_t k = 0; k < replicas_.size(); ++k) {
        held.push_back(kv_index_->matched(static_cast<int>(k), tokens) * static_cast<size_t>(kv_index_->block_size()));
      }
    }
  }
  int r = -1, up = -1;
  for (size_t attempt = 0; attempt < replicas_.size() && up < 0; ++attempt) {
    r = picker_->pick(loads(), blocks, held.empty() ? nullptr : &held);
    if (r >= 0 && !held.empty() && held[static_cast<size_t>(r)] > 0) ++kv_routed_;
    if (r < 0) break;
    Replica& rep = *replicas_[static_cast<size_t>(r)];
    up = connect_to(rep.up.host, rep.up.port, cfg_.connect_timeout_s);
    if (up < 0) {
      ++rep.connect_errors;
      mark(static_cast<size_t>(r), false, /*at_once=*/true);  // out until it answers a health check
    }
  }
  if (up < 0) {
    ++no_replica_;
    send_all(fd, json_response(503, "Service Unavailable", error_body("no replica is available", "no_replica")));
    return;
  }
  Replica& rep = *replicas_[static_cast<size_t>(r)];
  ++rep.requests;
  rep.inflight.fetch_add(1);
  set_timeout(up, cfg_.upstream_timeout_s);
  set_timeout(fd, cfg_.upstream_timeout_s);
  out += "Host: " + rep.up.host + ":" + std::to_string(rep.up.port) + "\r\nContent-Length: " +
         std::to_string(req.body.size()) + "\r\nConnection: close\r\n\r\n" + req.body;
  bool sent_any = false, sse = false, done_seen = false, head_done = false, upstream_ok = false;
  std::string head, tail;
  if (send_all(up, out)) {
    char buf[16384];
    for (;;) {
      const ssize_t n = ::recv(up, buf, sizeof(buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) {
        upstream_ok = true;  // the replica closed after its answer (or died: see below)
        break;
      }
      if (n < 0) break;  // reset, or no bytes for upstream_timeout_s
      std::string_view chunk(buf, static_cast<size_t>(n));
      if (!head_done) {
        head.append(chunk);
        const size_t e = head.find("\r\n\r\n");
        if (e != std::string::npos) {
          head_done = true;
          sse = lower(head.substr(0, e)).find("content-type: text/event-stream") != std::string::npos;
        }
      }
      if (sse) {  // remember enough of the end to see the stream's [DONE]
        tail.append(chunk);
        if (tail.find("data: [DONE]") != std::string::npos) done_seen = true;
        if (tail.size() > 64) tail.erase(0, tail.size() - 64);
      }
      if (!send_all(fd, buf, static_cast<size_t>(n))) break;  // the client left: dropping `up` tells the replica
      sent_any = true;
    }
  }
  ::close(up);
  rep.inflight.fetch_sub(1);
  if (!sent_any) {
    ++rep.lost;
    send_all(fd, json_response(502, "Bad Gateway", error_body("the replica did not answer", "upstream_lost")));
  } else if (sse && !done_seen) {
    ++rep.lost;
    send_all(fd, kLostEvent);
  } else if (!upstream_ok) {
    ++rep.lost;
  }
}

std::vector<int32_t> Router::prompt_tokens(const std::string& body, const std::string& auth) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return {};
  std::vector<int32_t> ids;
  if (auto p = j.find("prompt"); p != j.end() && p->is_array() && !p->empty() && (*p)[0].is_number_integer()) {
    for (const auto& t : *p) {
      if (!t.is_number_integer()) return {};
      ids.push_back(t.get<int32_t>());
    }
    return ids;  // already token ids
  }
  const bool chat = j.contains("messages") && j["messages"].is_array();
  if (!chat && !(j.contains("prompt") && j["prompt"].is_string())) return {};
  // Any replica serves the same model; take the healthy ones in turn.
  const size_t n = replicas_.size();
  const size_t start = next_tokenizer_.fetch_add(1);
  for (size_t k = 0; k < n; ++k) {
    const Replica& rep = *replicas_[(start + k) % n];
    if (!rep.healthy.load()) continue;
    // A replica too busy to tokenize within half a second would delay every request:
    // the prompt is routed by its text instead.
    const auto [status, text] = http_call(rep.up, "POST", "/tokenize", auth, body, std::min(0.5, cfg_.connect_timeout_s));
    if (status != 200) break;
    const nlohmann::json a = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!a.is_object() || !a.contains("tokens") || !a["tokens"].is_array()) break;
    for (const auto& t : a["tokens"]) {
      if (!t.is_number_integer()) return {};
      ids.push_back(t.get<int32_t>());
    }
    return ids;
  }
  ++tokenize_failed_;
  return {};
}

std::string Router::metrics_text() const {
  metrics::Exposition e;
  for (const auto& r : replicas_) {
    const std::string l = metrics::labels({{"upstream", r->up.url}});
    e.gauge("metro_router_upstream_healthy", "1 while the replica is in the pool.", l, r->healthy.load() ? 1 : 0);
    e.gauge("metro_router_upstream_inflight", "Requests the router has open to the replica.", l, r->inflight.load());
    e.gauge("metro_router_upstream_waiting", "The replica's waiting requests at the last poll.", l, r->waiting.load());
    e.counter("metro_router_requests_total", "Requests forwarded to the replica.", l,
              static_cast<double>(r->requests.load()));
    e.counter("metro_router_upstream_connect_errors_total", "Connections to the replica that failed.", l,
              static_cast<double>(r->connect_errors.load()));
    e.counter("metro_router_upstream_lost_total", "Answers the replica ended early (streams ended with an error event).",
              l, static_cast<double>(r->lost.load()));
    e.counter("metro_router_upstream_left_pool_total", "Times the replica left the pool.", l,
              static_cast<double>(r->left_pool.load()));
  }
  e.counter("metro_router_no_replica_total", "Requests answered 503: no replica available.", "",
            static_cast<double>(no_replica_.load()));
  if (kv_index_) {
    for (size_t k = 0; k < replicas_.size(); ++k) {
      e.gauge("metro_router_kv_blocks", "Blocks the replica's KV events say its prefix cache holds.",
              metrics::labels({{"upstream", replicas_[k]->up.url}}), static_cast<double>(kv_index_->blocks(static_cast<int>(k))));
    }
    e.counter("metro_router_kv_event_batches_total", "KV-event batches applied.", "",
              static_cast<double>(kv_sub_ ? kv_sub_->batches() : 0));
    e.counter("metro_router_kv_event_gaps_total", "Sequence gaps in a replica's KV events (its view cleared).", "",
              static_cast<double>(kv_sub_ ? kv_sub_->gaps() : 0));
    e.counter("metro_router_kv_event_bad_total", "KV-event messages that were not an EventBatch (the view cleared).", "",
              static_cast<double>(kv_sub_ ? kv_sub_->bad() : 0));
    e.counter("metro_router_kv_events_skipped_total", "Events that could not be placed (an unknown parent, a bad field).",
              "", static_cast<double>(kv_index_->skipped()));
    e.counter("metro_router_kv_routed_total", "Requests sent to a replica its KV events say holds part of the prompt.",
              "", static_cast<double>(kv_routed_.load()));
    e.counter("metro_router_tokenize_failed_total", "Prompts no replica's /tokenize answered (routed by text).", "",
              static_cast<double>(tokenize_failed_.load()));
  }
  e.gauge("metro_router_policy_info", "The routing policy.", metrics::labels({{"policy", policy_name(cfg_.policy)}}), 1);
  return e.text();
}

}  // namespace metro::router
