#include "loadgen/http_client.h"

#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <limits>
#include <optional>

namespace metro::loadgen {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

namespace {

struct Connection {
  explicit Connection(asio::io_context& io) : socket(io) {}
  tcp::socket socket;
  beast::flat_buffer buffer;
};

}  // namespace

struct HttpClient::Impl {
  Impl(asio::io_context& io_in, Url url_in) : io(io_in), url(std::move(url_in)) {}
  ~Impl() { close_idle(); }

  void close_idle() {
    for (auto& c : idle) {
      error_code ignored;
      c->socket.close(ignored);
    }
    idle.clear();
  }

  asio::io_context& io;
  Url url;
  tcp::resolver::results_type endpoints;
  std::vector<std::unique_ptr<Connection>> idle;
  HttpClientStats stats;
};

namespace {

// One request and its response, over a pooled or a new connection.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(std::shared_ptr<HttpClient::Impl> client, HttpRequest request, HttpCallbacks callbacks,
           double timeout_s)
      : client_(std::move(client)),
        callbacks_(std::move(callbacks)),
        deadline_(client_->io),
        timeout_s_(timeout_s) {
    message_.method_string(request.method);
    message_.target(request.target);
    message_.version(11);
    message_.set(http::field::host, client_->url.host_header());
    message_.set(http::field::user_agent, "metro-bench-serve");
    message_.set(http::field::accept, "application/json, text/event-stream");
    for (const auto& [name, value] : request.headers) message_.set(name, value);
    if (!request.body.empty()) {
      message_.set(http::field::content_type, "application/json");
      message_.body() = std::move(request.body);
    }
    message_.keep_alive(true);
    message_.prepare_payload();
  }

  void start() {
    deadline_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(timeout_s_)));
    deadline_.async_wait([self = shared_from_this()](error_code ec) { self->on_deadline(ec); });
    if (!client_->idle.empty()) {
      conn_ = std::move(client_->idle.back());
      client_->idle.pop_back();
      reused_ = true;
      ++client_->stats.connections_reused;
      write();
    } else {
      connect();
    }
  }

 private:
  void connect() {
    conn_ = std::make_unique<Connection>(client_->io);
    reused_ = false;
    ++client_->stats.connections_opened;
    asio::async_connect(conn_->socket, client_->endpoints,
                        [self = shared_from_this()](error_code ec, const tcp::endpoint&) {
                          if (self->done_) return;
                          if (ec) return self->fail(TransportError::kConnect, ec);
                          error_code ignored;
                          self->conn_->socket.set_option(tcp::no_delay(true), ignored);
                          self->write();
                        });
  }

  void write() {
    http::async_write(conn_->socket, message_, [self = shared_from_this()](error_code ec, size_t) {
      if (self->done_) return;
      if (ec) {
        if (self->may_retry()) return self->retry();
        return self->fail(TransportError::kClosed, ec);
      }
      self->read_head();
    });
  }

  void read_head() {
    parser_.emplace();
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    http::async_read_header(conn_->socket, conn_->buffer, *parser_,
                            [self = shared_from_this()](error_code ec, size_t) {
                              if (self->done_) return;
                              if (ec) {
                                if (self->may_retry()) return self->retry();
                                return self->fail(self->classify(ec), ec);
                              }
                              self->status_ = self->parser_->get().result_int();
                              if (self->callbacks_.on_head) self->callbacks_.on_head(self->status_);
                              self->read_body();
                            });
  }

  void read_body() {
    if (parser_->is_done()) return complete();
    parser_->get().body().data = body_buf_.data();
    parser_->get().body().size = body_buf_.size();
    http::async_read_some(conn_->socket, conn_->buffer, *parser_,
                          [self = shared_from_this()](error_code ec, size_t) { self->on_body(ec); });
  }

  void on_body(error_code ec) {
    if (done_) return;
    const size_t n = body_buf_.size() - parser_->get().body().size;
    if (n > 0 && callbacks_.on_body &&
        !callbacks_.on_body(std::string_view(body_buf_.data(), n))) {
      return finish(TransportError::kAborted, "stopped reading: the body was not what was expected");
    }
    if (ec == http::error::need_buffer) ec = {};
    if (ec && !(ec == http::error::end_of_stream && parser_->is_done())) {
      return fail(classify(ec), ec);
    }
    if (parser_->is_done()) return complete();
    read_body();
  }

  void complete() {
    // Back to the pool before on_done runs, so that the request it releases can reuse it.
    if (parser_->keep_alive() && conn_->buffer.size() == 0 && !timed_out_) {
      client_->idle.push_back(std::move(conn_));
    }
    finish(TransportError::kNone, {});
  }

  // A kept-alive connection may have been closed by the server while idle; that shows up as
  // a failure before any byte of the response. Resend once on a fresh connection.
  bool may_retry() const {
    return reused_ && !retried_ && !timed_out_ && (!parser_ || !parser_->got_some()) &&
           conn_->buffer.size() == 0;
  }

  void retry() {
    retried_ = true;
    ++client_->stats.stale_retries;
    error_code ignored;
    conn_->socket.close(ignored);
    connect();
  }

  TransportError classify(error_code ec) const {
    if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
        ec == asio::error::eof || ec == asio::error::connection_reset ||
        ec == asio::error::broken_pipe || ec == asio::error::operation_aborted) {
      return TransportError::kClosed;
    }
    if (ec.category() == http::make_error_code(http::error::bad_version).category()) return TransportError::kProtocol;
    return TransportError::kClosed;
  }

  void fail(TransportError kind, error_code ec) {
    if (timed_out_) return finish(TransportError::kTimeout, "no complete response within the timeout");
    finish(kind, ec.message());
  }

  void on_deadline(error_code ec) {
    if (ec || done_) return;  // cancelled: the exchange ended first
    timed_out_ = true;
    if (conn_) {
      error_code ignored;
      conn_->socket.close(ignored);  // pending operations complete with operation_aborted
    } else {
      finish(TransportError::kTimeout, "no complete response within the timeout");
    }
  }

  void finish(TransportError error, std::string message) {
    if (done_) return;
    done_ = true;
    deadline_.cancel();
    if (error != TransportError::kNone && conn_) {
      error_code ignored;
      conn_->socket.close(ignored);
      conn_.reset();
    }
    HttpOutcome outcome{error, std::move(message), status_};
    if (callbacks_.on_done) callbacks_.on_done(outcome);
  }

  std::shared_ptr<HttpClient::Impl> client_;
  HttpCallbacks callbacks_;
  http::request<http::string_body> message_;
  std::unique_ptr<Connection> conn_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  asio::steady_timer deadline_;
  std::array<char, 8192> body_buf_;
  double timeout_s_;
  int status_ = 0;
  bool reused_ = false;
  bool retried_ = false;
  bool timed_out_ = false;
  bool done_ = false;
};

}  // namespace

HttpClient::HttpClient(asio::io_context& io, Url url)
    : impl_(std::make_shared<Impl>(io, std::move(url))) {}

HttpClient::~HttpClient() { impl_->close_idle(); }

Status HttpClient::resolve() {
  tcp::resolver resolver(impl_->io);
  error_code ec;
  impl_->endpoints = resolver.resolve(impl_->url.host, std::to_string(impl_->url.port), ec);
  if (ec || impl_->endpoints.empty()) {
    return unavailable("cannot resolve '" + impl_->url.host + "': " + ec.message());
  }
  return Status::ok_status();
}

void HttpClient::send(HttpRequest request, HttpCallbacks callbacks, double timeout_s) {
  METRO_CHECK(!impl_->endpoints.empty());
  std::make_shared<Exchange>(impl_, std::move(request), std::move(callbacks), timeout_s)->start();
}

void HttpClient::close_idle() { impl_->close_idle(); }

HttpClientStats HttpClient::stats() const { return impl_->stats; }

}  // namespace metro::loadgen
