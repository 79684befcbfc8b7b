#include "loadgen/fake_openai_server.h"

#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstdio>
#include <deque>
#include <istream>
#include <memory>

namespace metro::loadgen::testing {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using nlohmann::json;

struct FakeOpenAiServer::Shared {
  explicit Shared(asio::io_context& io) : acceptor(io) {}
  tcp::acceptor acceptor;
  BehaviorFn behavior;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  mutable std::mutex mu;
  std::vector<FakeRequest> requests;
  size_t active = 0, peak = 0, accepted = 0;
};

int64_t fake_prompt_tokens(const json& body) {
  auto count = [](const std::string& s) {
    int64_t n = 0;
    bool in_word = false;
    for (char c : s) {
      const bool space = c == ' ' || c == '\n' || c == '\t';
      if (!space && !in_word) ++n;
      in_word = !space;
    }
    return n;
  };
  int64_t n = 0;
  if (body.contains("prompt") && body["prompt"].is_string()) n += count(body["prompt"].get<std::string>());
  if (body.contains("messages") && body["messages"].is_array()) {
    for (const auto& m : body["messages"]) {
      if (m.contains("content") && m["content"].is_string()) n += count(m["content"].get<std::string>());
    }
  }
  return n;
}

namespace {

std::string hex(size_t n) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%zx", n);
  return buf;
}

const char* reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

struct Segment {
  double delay_s = 0.0;
  std::string bytes;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, std::shared_ptr<FakeOpenAiServer::Shared> shared)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), shared_(std::move(shared)) {}

  void start() { read_head(); }

 private:
  void read_head() {
    asio::async_read_until(socket_, in_, "\r\n\r\n", [self = shared_from_this()](error_code ec, size_t n) {
      if (ec) return;
      self->on_head(n);
    });
  }

  void on_head(size_t n) {
    std::string head(asio::buffers_begin(in_.data()), asio::buffers_begin(in_.data()) + static_cast<std::ptrdiff_t>(n));
    in_.consume(n);
    req_ = FakeRequest{};
    size_t line_end = head.find("\r\n");
    std::string request_line = head.substr(0, line_end);
    size_t sp1 = request_line.find(' '), sp2 = request_line.rfind(' ');
    req_.method = request_line.substr(0, sp1);
    req_.target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
    for (size_t pos = line_end + 2; pos < head.size();) {
      size_t e = head.find("\r\n", pos);
      if (e == std::string::npos || e == pos) break;
      std::string line = head.substr(pos, e - pos);
      pos = e + 2;
      size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      std::string value = line.substr(colon + 1);
      while (!value.empty() && value.front() == ' ') value.erase(0, 1);
      req_.headers[name] = value;
    }
    size_t length = 0;
    if (auto it = req_.headers.find("content-length"); it != req_.headers.end()) {
      length = std::stoul(it->second);
    }
    const size_t have = in_.size();
    if (have >= length) return on_body(length);
    asio::async_read(socket_, in_, asio::transfer_exactly(length - have),
                     [self = shared_from_this(), length](error_code ec, size_t) {
                       if (ec) return;
                       self->on_body(length);
                     });
  }

  void on_body(size_t length) {
    req_.body.assign(asio::buffers_begin(in_.data()),
                     asio::buffers_begin(in_.data()) + static_cast<std::ptrdiff_t>(length));
    in_.consume(length);
    req_.json = json::parse(req_.body, nullptr, false);
    if (req_.json.is_discarded()) req_.json = nullptr;
    FakeBehavior b;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      req_.index = shared_->requests.size();
      req_.received_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - shared_->start).count();
      shared_->requests.push_back(req_);
      shared_->peak = std::max(shared_->peak, ++shared_->active);
    }
    if (shared_->behavior) b = shared_->behavior(req_);
    behavior_ = b;
    build_response(b);
    next_segment();
  }

  std::string head(int status, const char* content_type, const std::string& framing) const {
    std::string h = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) + "\r\n";
    h += std::string("Content-Type: ") + content_type + "\r\n";
    h += framing;
    h += behavior_.keep_alive && (behavior_.chunked || framing.find("Content-Length") != std::string::npos)
             ? "Connection: keep-alive\r\n"
             : "Connection: close\r\n";
    return h + "\r\n";
  }

  void add(double delay, std::string bytes) { segments_.push_back({delay, std::move(bytes)}); }

  void build_response(const FakeBehavior& b) {
    segments_.clear();
    close_after_ = !b.keep_alive || b.close_despite_keep_alive;
    if (req_.method == "GET" && req_.target.ends_with("/v1/models")) {
      std::string body = R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})";
      add(0, head(200, "application/json", "Content-Length: " + std::to_string(body.size()) + "\r\n") + body);
      return;
    }
    const bool chat = req_.target.ends_with("/chat/completions");
    if (b.status != 200 || req_.json.is_null() || !(chat || req_.target.ends_with("/completions"))) {
      const int status = b.status != 200 ? b.status : 404;
      std::string body = R"({"error":{"message":"fake error )" + std::to_string(status) +
                         R"(","type":"fake","code":)" + std::to_string(status) + "}}";
      add(0, head(status, "application/json", "Content-Length: " + std::to_string(body.size()) + "\r\n") + body);
      return;
    }
    const json& j = req_.json;
    const int64_t max_tokens = j.value("max_tokens", 16);
    const int64_t n = b.n_tokens >= 0 ? b.n_tokens : max_tokens;
    const int64_t prompt_tokens = fake_prompt_tokens(j);
    const bool stream = j.value("stream", false);
    const bool usage = b.send_usage && j.contains("stream_options") &&
                       j["stream_options"].value("include_usage", false);
    json usage_json = {{"prompt_tokens", prompt_tokens},
                       {"completion_tokens", n},
                       {"total_tokens", prompt_tokens + n},
                       {"prompt_tokens_details", {{"cached_tokens", prompt_tokens / 2}}}};
    if (!stream) {
      std::string text;
      for (int64_t i = 0; i < n; ++i) text += b.token_text;
      json choice = {{"index", 0}, {"finish_reason", "length"}};
      if (chat) {
        choice["message"] = {{"role", "assistant"}, {"content", text}};
      } else {
        choice["text"] = text;
      }
      json resp = {{"id", "fake"}, {"choices", json::array({choice})}, {"usage", usage_json}};
      std::string body = resp.dump();
      add(b.first_token_delay_s + b.token_interval_s * static_cast<double>(std::max<int64_t>(0, n - 1)),
          head(200, "application/json", "Content-Length: " + std::to_string(body.size()) + "\r\n") + body);
      return;
    }
    const std::string nl = b.crlf ? "\r\n" : "\n";
    auto event = [&](const json& payload) { return "data: " + payload.dump() + nl + nl; };
    auto chunk = [&](const json& delta_or_text, const json& finish) {
      json c = {{"index", 0}, {"finish_reason", finish}};
      if (chat) {
        c["delta"] = delta_or_text;
      } else {
        c["text"] = delta_or_text;
      }
      return json{{"id", "fake"}, {"object", chat ? "chat.completion.chunk" : "text_completion"},
                  {"choices", json::array({c})}};
    };
    // Frames one SSE event for the wire, and queues it as one or more writes.
    size_t event_no = 0;
    auto emit = [&](double delay, const std::string& sse) {
      ++event_no;
      if (!b.chunked) {
        if (!b.awkward_splits || sse.size() < 4) return add(delay, sse);
        const size_t cut = 1 + (event_no * 5) % (sse.size() - 2);
        add(delay, sse.substr(0, cut));
        add(0.002, sse.substr(cut));
        return;
      }
      if (!b.awkward_splits || sse.size() < 4) return add(delay, hex(sse.size()) + "\r\n" + sse + "\r\n");
      // Two HTTP chunks that cut the event somewhere inside, then three TCP writes that cut
      // the chunk framing itself (inside the size line, inside the data).
      const size_t cut = 1 + (event_no * 7) % (sse.size() - 2);
      std::string wire = hex(cut) + "\r\n" + sse.substr(0, cut) + "\r\n" + hex(sse.size() - cut) +
                         "\r\n" + sse.substr(cut) + "\r\n";
      const size_t w1 = 1, w2 = 1 + (wire.size() - 1) / 2;
      add(delay, wire.substr(0, w1));
      add(0.002, wire.substr(w1, w2 - w1));
      add(0.002, wire.substr(w2));
    };
    add(0, head(200, "text/event-stream", b.chunked ? "Transfer-Encoding: chunked\r\n" : ""));
    emit(0, ": fake server keep-alive comment" + nl + nl);
    if (chat) emit(0, event(chunk({{"role", "assistant"}, {"content", ""}}, nullptr)));
    for (int64_t i = 0; i < n; ++i) {
      if (b.disconnect_after_tokens >= 0 && i == b.disconnect_after_tokens) {
        drop_after_ = true;
        return;
      }
      json piece = chat ? json{{"content", b.token_text}} : json(b.token_text);
      emit(i == 0 ? b.first_token_delay_s : b.token_interval_s, event(chunk(piece, nullptr)));
    }
    if (b.disconnect_after_tokens >= 0 && b.disconnect_after_tokens >= n) {
      drop_after_ = true;
      return;
    }
    emit(0, event(chunk(chat ? json::object() : json(""), "length")));
    if (usage) {
      emit(0, event({{"id", "fake"}, {"choices", json::array()}, {"usage", usage_json}}));
    }
    emit(0, "data: [DONE]" + nl + nl);
    if (b.chunked) add(0, "0\r\n\r\n");
    if (!b.chunked) close_after_ = true;
  }

  void next_segment() {
    if (segments_.empty()) return response_done();
    Segment s = std::move(segments_.front());
    segments_.pop_front();
    auto write = [self = shared_from_this(), bytes = std::make_shared<std::string>(std::move(s.bytes))] {
      asio::async_write(self->socket_, asio::buffer(*bytes), [self, bytes](error_code ec, size_t) {
        if (ec) return self->finish_request();
        self->next_segment();
      });
    };
    if (s.delay_s <= 0) return write();
    timer_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(s.delay_s)));
    timer_.async_wait([write](error_code ec) {
      if (!ec) write();
    });
  }

  void finish_request() {
    if (finished_) return;
    finished_ = true;
    std::lock_guard<std::mutex> lock(shared_->mu);
    --shared_->active;
  }

  void response_done() {
    finish_request();
    if (drop_after_ || close_after_) {
      error_code ignored;
      if (drop_after_) {
        // An abrupt end: no chunk terminator, connection reset.
        socket_.set_option(asio::socket_base::linger(true, 0), ignored);
      } else {
        socket_.shutdown(tcp::socket::shutdown_send, ignored);
      }
      socket_.close(ignored);
      return;
    }
    finished_ = false;
    drop_after_ = false;
    read_head();
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  std::shared_ptr<FakeOpenAiServer::Shared> shared_;
  asio::streambuf in_;
  FakeRequest req_;
  FakeBehavior behavior_;
  std::deque<Segment> segments_;
  bool close_after_ = false;
  bool drop_after_ = false;
  bool finished_ = false;
};

void accept_loop(std::shared_ptr<FakeOpenAiServer::Shared> shared) {
  shared->acceptor.async_accept([shared](error_code ec, tcp::socket socket) {
    if (ec) return;
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      ++shared->accepted;
    }
    error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    std::make_shared<Connection>(std::move(socket), shared)->start();
    accept_loop(shared);
  });
}

}  // namespace

FakeOpenAiServer::FakeOpenAiServer(BehaviorFn behavior) : shared_(std::make_shared<Shared>(io_)) {
  shared_->behavior = std::move(behavior);
  tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
  shared_->acceptor.open(ep.protocol());
  shared_->acceptor.set_option(asio::socket_base::reuse_address(true));
  shared_->acceptor.bind(ep);
  shared_->acceptor.listen(4096);
  port_ = shared_->acceptor.local_endpoint().port();
  accept_loop(shared_);
  thread_ = std::thread([this] { io_.run(); });
}

FakeOpenAiServer::~FakeOpenAiServer() {
  io_.stop();
  thread_.join();
}

std::vector<FakeRequest> FakeOpenAiServer::requests() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->requests;
}

size_t FakeOpenAiServer::peak_concurrent_requests() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->peak;
}

size_t FakeOpenAiServer::connections_accepted() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->accepted;
}

}  // namespace metro::loadgen::testing
