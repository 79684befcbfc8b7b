#include "server/http_session.h"

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/bind_handler.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <optional>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "server/framing.h"
#include "server/teacher_capture.h"

namespace metro::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

// Bytes a client may pipeline while its previous request runs; reading pauses beyond.
constexpr size_t kMaxBufferedAhead = 64 * 1024;
// After an error response, discard at most this much of an unread body before closing, so
// the client reads the response instead of a connection reset.
constexpr size_t kMaxLingerBytes = 16u << 20;
constexpr auto kLingerTime = std::chrono::seconds(2);

std::chrono::nanoseconds seconds_ns(int s) { return std::chrono::seconds(s); }

std::string hex(size_t n) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%zx", n);
  return buf;
}

}  // namespace

HttpSession::HttpSession(Socket socket, ServerCore& core)
    : socket_(std::move(socket)),
      strand_(socket_.get_executor()),
      core_(core),
      read_timer_(strand_),
      write_timer_(strand_),
      fault_timer_(strand_) {
  core_.metrics().connections.fetch_add(1);
}

HttpSession::~HttpSession() {
  end_call(/*client_gone=*/true);
  core_.remove_connection(registry_id_);
  core_.metrics().connections.fetch_sub(1);
}

void HttpSession::start() {
  std::weak_ptr<HttpSession> weak = weak_from_this();
  registry_id_ = core_.add_connection([weak] {
    if (auto s = weak.lock()) asio::post(s->strand_, [s] { s->close_if_idle(); });
  });
  asio::post(strand_, [self = shared_from_this()] {
    boost::system::error_code ec;
    self->socket_.set_option(tcp::no_delay(true), ec);  // SSE chunks are small: send at once
    // A smaller send buffer bounds what a client that stops reading can leave queued.
    if (const int sndbuf = self->core_.config().socket_send_buffer; sndbuf > 0) {
      self->socket_.set_option(asio::socket_base::send_buffer_size(sndbuf), ec);
    }
    self->begin_request();
  });
}

// ---------------------------------------------------------------------------------------
// Reading

void HttpSession::begin_request() {
  phase_ = Phase::kReadRequest;
  const ServerConfig& cfg = core_.config();
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(cfg.max_header_bytes));
  parser_->body_limit(static_cast<uint64_t>(cfg.limits.max_body_bytes));
  request_bytes_seen_ = buf_.size() > 0;
  continue_sent_ = false;
  framing_checked_ = false;
  request_start_ns_ = now_ns();
  last_read_ns_ = request_start_ns_;
  request_id_.clear();
  trace_.reset();
  request_method_.clear();
  request_tenant_.clear();
  response_variant_.clear();
  response_variant_key_.clear();
  response_model_.clear();
  injected_fault_ = false;
  outcome_response_id_.clear();
  outcome_ttft_s_ = -1.0;
  outcome_tpot_s_ = -1.0;
  access_fields_ = nullptr;
  parse_buffered();
}

void HttpSession::arm_read() {
  if (read_in_flight_ || phase_ == Phase::kClosed || read_ended_) return;
  if ((phase_ == Phase::kPrepare || phase_ == Phase::kGenerate || phase_ == Phase::kRespondDone) &&
      buf_.size() >= kMaxBufferedAhead) {
    return;  // a pipelining client waits until its previous request is answered
  }
  read_in_flight_ = true;
  socket_.async_read_some(asio::buffer(read_chunk_),
                          beast::bind_front_handler(&HttpSession::on_read, shared_from_this()));
  if (phase_ == Phase::kReadRequest) arm_read_timer();
}

void HttpSession::on_read(boost::system::error_code ec, size_t n) {
  read_in_flight_ = false;
  if (phase_ == Phase::kClosed) return;
  if (phase_ == Phase::kLinger) {
    linger_bytes_ += n;
    if (ec || linger_bytes_ > kMaxLingerBytes) {
      close();
    } else {
      arm_read();
    }
    return;
  }
  if (ec) {
    if (phase_ == Phase::kPrepare || phase_ == Phase::kGenerate) {
      if (ec == asio::error::eof) {
        peer_write_closed();  // a half-close still wants its answer
      } else {
        client_gone();
      }
    } else {
      close();
    }
    return;
  }
  const auto dst = buf_.prepare(n);
  std::memcpy(dst.data(), read_chunk_.data(), n);
  buf_.commit(n);
  last_read_ns_ = now_ns();
  if (phase_ == Phase::kReadRequest) {
    parse_buffered();
  } else {
    arm_read();
  }
}

void HttpSession::arm_read_timer() {
  const ServerConfig& cfg = core_.config();
  const int64_t idle_ns =
      (request_bytes_seen_ ? seconds_ns(cfg.idle_timeout_s) : seconds_ns(cfg.keepalive_timeout_s)).count();
  int64_t deadline = last_read_ns_ + idle_ns;
  if (request_bytes_seen_) deadline = std::min(deadline, request_start_ns_ + seconds_ns(cfg.request_timeout_s).count());
  read_timer_.expires_after(std::chrono::nanoseconds(std::max<int64_t>(0, deadline - now_ns())));
  read_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (!ec) self->on_read_timer();
  });
}

void HttpSession::on_read_timer() {
  if (phase_ != Phase::kReadRequest) return;
  const ServerConfig& cfg = core_.config();
  const int64_t now = now_ns();
  const int64_t idle_ns =
      (request_bytes_seen_ ? seconds_ns(cfg.idle_timeout_s) : seconds_ns(cfg.keepalive_timeout_s)).count();
  const bool idle = now - last_read_ns_ >= idle_ns;
  const bool too_long = request_bytes_seen_ && now - request_start_ns_ >= seconds_ns(cfg.request_timeout_s).count();
  if (!idle && !too_long) {
    arm_read_timer();
    return;
  }
  if (!request_bytes_seen_) {
    close();  // an idle keep-alive connection
    return;
  }
  ApiError e = bad_request(too_long ? "the request took too long to arrive" : "the connection was idle too long", "",
                           "request_timeout");
  e.status = 408;
  respond(HttpResponse::error(e), "other", /*close_after=*/true);
}

void HttpSession::parse_buffered() {
  while (phase_ == Phase::kReadRequest) {
    if (buf_.size() == 0) {
      arm_read();
      return;
    }
    request_bytes_seen_ = true;
    beast::error_code ec;
    const size_t used = parser_->put(buf_.data(), ec);
    buf_.consume(used);
    if (ec == http::error::need_more) {
      arm_read();
      return;
    }
    if (ec) {
      on_parse_error(ec);
      return;
    }
    if (parser_->is_header_done() && !framing_checked_) {
      framing_checked_ = true;
      if (std::optional<ApiError> e = check_framing(parser_->get())) {
        respond(HttpResponse::error(*e), "other", /*close_after=*/true);
        return;
      }
    }
    if (parser_->is_done()) {
      on_request();
      return;
    }
    if (parser_->is_header_done() && !continue_sent_) {
      continue_sent_ = true;
      if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
        out_ += "HTTP/1.1 100 Continue\r\n\r\n";
        flush();
      }
    }
    if (used == 0) {
      arm_read();
      return;
    }
  }
}

void HttpSession::on_parse_error(boost::system::error_code ec) {
  const ServerConfig& cfg = core_.config();
  ApiError e;
  if (ec == http::error::header_limit) {
    e = bad_request("the request headers are larger than " + std::to_string(cfg.max_header_bytes) + " bytes", "",
                    "headers_too_large");
    e.status = 431;
  } else if (ec == http::error::body_limit) {
    e = bad_request("the request body is larger than " + std::to_string(cfg.limits.max_body_bytes) + " bytes", "",
                    "body_too_large");
    e.status = 413;
  } else {
    e = bad_request("malformed HTTP request: " + ec.message(), "", "bad_http");
  }
  respond(HttpResponse::error(e), "other", /*close_after=*/true);
}

void HttpSession::on_request() {
  read_timer_.cancel();
  http::request<http::string_body> req = parser_->release();
  parser_.reset();
  keep_alive_ = req.keep_alive();
  chunked_ = req.version() >= 11;
  head_request_ = req.method() == http::verb::head;
  RequestHead head;
  head.method = std::string(req.method_string());
  head.target = std::string(req.target());
  head.authorization = std::string(req[http::field::authorization]);
  head.content_type = std::string(req[http::field::content_type]);
  head.if_none_match = std::string(req[http::field::if_none_match]);
  if (auto it = req.find("X-Metro-Class"); it != req.end()) head.metro_class = std::string(it->value());
  if (auto it = req.find("X-Metro-Deadline-Ms"); it != req.end()) head.metro_deadline_ms = std::string(it->value());
  request_id_ = request_id_for(req["x-request-id"]);
  trace_ = parse_traceparent(req["traceparent"]);
  request_method_ = head.method;
  RouteDecision d = route_request(head, core_);
  request_tenant_ = d.call.tenant;
  if (d.response) {
    respond(*d.response, d.endpoint);
    return;
  }
  prepare(*d.model_call, std::move(req.body()), std::move(d.call), d.endpoint);
}

// ---------------------------------------------------------------------------------------
// Model requests

void HttpSession::prepare(Endpoint endpoint, std::string body, CallContext call, std::string endpoint_label) {
  // Before any work that grows with the body: the tenant's concurrency slot (and an empty
  // token bucket) is decided here, so a tenant cannot have more of its requests parsed and
  // tokenized than its quota lets run.
  SlaClass cls = call.default_class.value_or(SlaClass::kStandard);
  if (call.class_header) parse_sla_class(*call.class_header, &cls);  // validated later
  std::shared_ptr<gateway::TenantSlot> slot;
  gateway::Decision d = core_.front_door().enter(call.tenant, cls, &slot);
  if (!d.admit) {
    respond(HttpResponse::error(refusal_error(d)), endpoint_label);
    return;
  }
  phase_ = Phase::kPrepare;
  preparing_ = true;
  core_.metrics().inflight_requests.fetch_add(1);
  const int64_t start = request_start_ns_;
  const std::string tenant = call.tenant;
  const size_t body_bytes = body.size();
  const PrepQueue::Submit queued = core_.prep_pool().submit(
      tenant, body_bytes, [self = shared_from_this(), endpoint, body = std::move(body), call = std::move(call),
               slot = std::move(slot), label = endpoint_label, start]() mutable {
        Prepared p = self->prepare_on_worker(endpoint, body, call, std::move(slot));
        asio::post(self->strand_, [self, p = std::move(p), label = std::move(label), start]() mutable {
          self->on_prepared(std::move(p), std::move(label), start);
        });
      });
  if (queued != PrepQueue::Submit::kQueued) {
    // Too much is waiting to be tokenized (in all, or of this tenant): refuse now rather
    // than after the wait. The job and its tenant slot were dropped with it.
    preparing_ = false;
    core_.metrics().inflight_requests.fetch_sub(1);
    respond(HttpResponse::error(unavailable_error(
                queued == PrepQueue::Submit::kTenantFull
                    ? "too many of your requests are waiting to be tokenized; retry shortly"
                    : "too many requests are waiting to be tokenized; retry shortly",
                "overloaded")),
            endpoint_label);
    return;
  }
  arm_read();  // notice a client that leaves while its request is prepared or generated
}

void HttpSession::on_prepared(Prepared p, std::string label, int64_t start_ns) {
  if (p.delay_s > 0.0 && phase_ == Phase::kPrepare) {
    // Injected latency (--fault): the request goes on after the delay, unless its client
    // leaves meanwhile (the admitted call then ends with the held Prepared).
    const double d = p.delay_s;
    p.delay_s = 0.0;
    auto held = std::make_shared<Prepared>(std::move(p));
    fault_timer_.expires_after(std::chrono::microseconds(static_cast<int64_t>(d * 1e6)));
    fault_timer_.async_wait([self = shared_from_this(), held, label = std::move(label), start_ns](
                                boost::system::error_code) mutable {
      self->on_prepared(std::move(*held), std::move(label), start_ns);
    });
    return;
  }
  preparing_ = false;
  ServerMetrics& metrics = core_.metrics();
  if (phase_ != Phase::kPrepare) {  // the client left meanwhile; nothing was submitted
    metrics.inflight_requests.fetch_sub(1);
    return;  // p.admitted ends here (not completed)
  }
  if (p.model && !p.direct) {
    response_model_ = p.model->name;
    response_variant_ = p.model->variant.empty() ? "primary" : p.model->variant;
    response_variant_key_ = p.model->variant;
    injected_fault_ = p.injected;
  }
  if (p.direct) {
    metrics.inflight_requests.fetch_sub(1);
    respond(*p.direct, label);
    return;
  }
  if (!p.result.ok()) {
    metrics.inflight_requests.fetch_sub(1);
    respond(HttpResponse::error(p.result.error()), label);
    return;
  }
  PreparedCall& pc = *p.result;
  auto call = std::make_unique<Call>();
  call->model = std::move(p.model);
  call->admitted = std::move(p.admitted);
  call->endpoint = label;
  call->start_ns = start_ns;
  call->n_choices = static_cast<int>(pc.requests.size()) * std::max(1, pc.spec.n);
  if (!pc.requests.empty()) call->sla_class = pc.requests.front().sla_class;
  call->spec = std::move(pc.spec);
  call->seq = ++call_seq_;
  if (p.capture) {
    call->capture = true;
    for (const engine::Request& rq : pc.requests) call->capture_prompts.push_back(rq.prompt);
  }
  call_ = std::move(call);
  call_->cache = std::move(p.cache);
  if (call_->cache && call_->cache->found.hit && !call_->cache->found.verify) {
    serve_from_cache();
    return;
  }
  // The front door submits at once or, for embeddings in a batching window, with the rest of
  // their batch; either way the handles come back on this strand. Meanwhile the session
  // stays in kPrepare (a client that leaves ends the call).
  preparing_ = true;
  std::weak_ptr<HttpSession> weak = weak_from_this();
  const uint64_t seq = call_->seq;
  call_->admitted->submit(std::move(pc.requests), [weak, seq](Expected<std::vector<engine::Handle>> handles) {
    if (auto s = weak.lock()) {
      asio::post(s->strand_, [s, seq, handles = std::move(handles)]() mutable {
        s->on_submitted(seq, std::move(handles));
      });
    }
    // A session that is gone has ended its call, which aborts what started.
  });
}

void HttpSession::on_submitted(uint64_t seq, Expected<std::vector<engine::Handle>> handles) {
  if (!call_ || call_->seq != seq || phase_ != Phase::kPrepare) return;  // ended meanwhile
  preparing_ = false;
  if (!handles.ok()) {
    const Endpoint endpoint = call_->spec->endpoint;
    const std::string param = endpoint == Endpoint::kChatCompletions ? "messages"
                              : endpoint == Endpoint::kCompletions   ? "prompt"
                                                                     : "input";
    const std::string label = call_->endpoint;
    end_call(/*client_gone=*/false);
    respond(HttpResponse::error(error_from_status(handles.status(), param)), label);
    return;
  }
  call_->handles = std::move(*handles);
  start_call(std::move(*call_->spec));
}

void HttpSession::start_call(ResponseSpec spec) {
  Call& call = *call_;
  const Endpoint endpoint = spec.endpoint;
  call.formatter = std::make_unique<ResponseFormatter>(std::move(spec), call.model->tokenizer(), call.handles.size(),
                                                       make_response_id(endpoint), unix_time_seconds());
  phase_ = Phase::kGenerate;
  std::weak_ptr<HttpSession> weak = weak_from_this();
  for (const engine::Handle& h : call_->handles) {
    // Runs on the engine thread: only schedule work here, coalescing bursts of pushes.
    h.stream->set_notify([weak] {
      auto s = weak.lock();
      if (!s || s->notify_pending_.exchange(true)) return;
      asio::post(s->strand_, [s] {
        s->notify_pending_.store(false);
        s->pump_events();
      });
    });
  }
  pump_events();
}

void HttpSession::begin_stream() {
  Call& call = *call_;
  if (call.stream_begun) return;
  call.stream_begun = true;
  if (!keep_alive_ || !chunked_ || core_.draining()) close_after_response_ = true;
  out_ += "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\n";
  if (request_id_.empty()) request_id_ = request_id_for({});
  out_ += "x-request-id: " + request_id_ + "\r\n";
  if (!response_variant_.empty()) out_ += "x-metro-variant: " + response_variant_ + "\r\n";
  if (chunked_) out_ += "Transfer-Encoding: chunked\r\n";
  out_ += close_after_response_ ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n";
  core_.metrics().count_request(call.endpoint, 200);
}

void HttpSession::pump_events() {
  if (!call_ || phase_ != Phase::kGenerate || write_in_flight_) return;
  ResponseFormatter& fmt = *call_->formatter;
  std::string sse;
  std::deque<engine::Event> events;
  for (size_t i = 0; i < call_->handles.size(); ++i) {
    events.clear();
    call_->handles[i].stream->drain(&events);
    if (call_->capture) capture_events(i, events);
    if (call_->cache && !call_->from_cache && i == 0) {
      call_->cache_events.insert(call_->cache_events.end(), events.begin(), events.end());
    }
    for (const engine::Event& e : events) fmt.on_event(i, e, &sse);
  }
  if (fmt.spec().stream && !sse.empty()) {
    // A failure before any output is answered as an error response (complete_call), not
    // inside a stream; what the formatter wrote for it is dropped with the stream.
    if (call_->stream_begun || !fmt.failure()) {
      begin_stream();
      append_chunk(sse);
    }
  }
  if (fmt.first_token_ns() > 0) call_->admitted->first_token();
  if (fmt.all_done()) {
    complete_call();
    return;
  }
  flush();
}

void HttpSession::complete_call() {
  ResponseFormatter& fmt = *call_->formatter;
  ServerMetrics& metrics = core_.metrics();
  const int64_t now = now_ns();
  metrics.observe_e2e(static_cast<double>(now - call_->start_ns) * 1e-9);
  if (fmt.spec().endpoint != Endpoint::kEmbeddings) {
    // A call never scheduled (shed past its deadline, aborted) has no queue time to show.
    const int64_t q = fmt.usage().queue_ns;
    metrics.observe_call(fmt.usage().prompt_tokens, fmt.usage().completion_tokens,
                         q > 0 || fmt.first_token_ns() > 0 ? static_cast<double>(q) * 1e-9 : -1.0,
                         fmt.finish_reasons());
  }
  outcome_response_id_ = fmt.id();
  if (fmt.first_token_ns() > 0) {
    outcome_ttft_s_ = static_cast<double>(fmt.first_token_ns() - call_->start_ns) * 1e-9;
    metrics.observe_ttft(outcome_ttft_s_);
    const int per_choice = fmt.generated_tokens() / std::max(1, call_->n_choices);
    if (per_choice > 1) {
      outcome_tpot_s_ = static_cast<double>(fmt.last_token_ns() - fmt.first_token_ns()) * 1e-9 / (per_choice - 1);
      metrics.observe_tpot(outcome_tpot_s_);
    }
  }
  const std::string label = call_->endpoint;
  if (fmt.spec().stream && (call_->stream_begun || !fmt.failure())) {
    begin_stream();
    append_chunk(fmt.finish());
    if (chunked_) out_ += "0\r\n\r\n";
    note_call_for_log();
    const bool failed_midway = fmt.failure() && fmt.failure()->status >= 500;  // fmt dies with the call
    end_call(false);
    phase_ = Phase::kRespondDone;
    count_variant(200, failed_midway);
    access_log(200, label);
    flush();
    return;
  }
  HttpResponse r = fmt.failure() ? HttpResponse::error(*fmt.failure()) : HttpResponse::json(200, fmt.finish());
  note_call_for_log();
  end_call(false);
  respond(r, label);
}

void HttpSession::end_call(bool client_gone) {
  if (!call_) return;
  gateway::CallOutcome outcome;
  for (const engine::Handle& h : call_->handles) h.stream->set_notify(nullptr);
  if (call_->formatter) {
    const ResponseFormatter& fmt = *call_->formatter;
    const engine::Usage& u = fmt.usage();
    outcome.completed = !client_gone && fmt.all_done() && !fmt.failure();
    outcome.prompt_tokens = u.prompt_tokens;
    outcome.completion_tokens = u.completion_tokens;
  }
  if (call_->capture && outcome.completed) submit_capture();
  if (call_->cache) settle_semantic_cache(outcome.completed);
  // Aborts in the engine whatever did not complete, and settles quotas and queues.
  call_->admitted->finish(outcome);
  preparing_ = false;
  core_.metrics().inflight_requests.fetch_sub(1);
  call_.reset();
}

void HttpSession::capture_events(size_t request_index, const std::deque<engine::Event>& events) {
  for (const engine::Event& e : events) {
    const std::pair<size_t, int> key{request_index, e.index};
    if (e.kind == engine::Event::Kind::kDelta) {
      auto& out = call_->capture_outputs[key];
      out.insert(out.end(), e.tokens.begin(), e.tokens.end());
    } else if (e.kind == engine::Event::Kind::kFinish) {
      call_->capture_finish[key] = engine::finish_reason_name(e.reason);
    }
  }
}

void HttpSession::submit_capture() {
  Call& call = *call_;
  std::vector<CaptureSample> samples;
  const int n = std::max(1, call.formatter->spec().n);
  for (auto& [key, tokens] : call.capture_outputs) {
    if (key.first >= call.capture_prompts.size() || tokens.empty()) continue;
    CaptureSample s;
    s.id = call.formatter->id();
    s.request_id = request_id_;
    s.model = call.model->name;
    s.variant = call.model->variant;
    s.tenant = request_tenant_;
    s.endpoint = call.endpoint;
    s.created_unix_s = unix_time_seconds();
    s.choice = static_cast<int>(key.first) * n + key.second;
    auto fin = call.capture_finish.find(key);
    s.finish_reason = fin == call.capture_finish.end() ? "" : fin->second;
    s.prompt = call.capture_prompts[key.first];
    s.output = std::move(tokens);
    samples.push_back(std::move(s));
  }
  core_.config().teacher_capture->submit(std::move(samples));
}

// ---------------------------------------------------------------------------------------
// Writing

void HttpSession::respond(const HttpResponse& r, const std::string& endpoint_label, bool close_after) {
  if (close_after || !keep_alive_ || core_.draining()) close_after_response_ = true;
  std::string& o = out_;
  o += "HTTP/1.1 ";
  o += std::to_string(r.status);
  o += ' ';
  o += http_reason(r.status);
  o += "\r\n";
  if (r.status != 304) {  // a 304 has no body and describes none
    o += "Content-Type: ";
    o += r.content_type;
    o += "\r\nContent-Length: ";
    o += std::to_string(r.body.size());
    o += "\r\n";
  }
  for (const auto& [k, v] : r.headers) {
    o += k;
    o += ": ";
    o += v;
    o += "\r\n";
  }
  if (request_id_.empty()) request_id_ = request_id_for({});
  o += "x-request-id: " + request_id_ + "\r\n";
  if (!response_variant_.empty()) o += "x-metro-variant: " + response_variant_ + "\r\n";
  o += close_after_response_ ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n";
  if (!head_request_) o += r.body;
  core_.metrics().count_request(endpoint_label, r.status);
  count_variant(r.status);
  access_log(r.status, endpoint_label);
  phase_ = Phase::kRespondDone;
  read_timer_.cancel();
  flush();
}

void HttpSession::count_variant(int status, bool failed_midway) {
  if (response_variant_.empty()) return;
  core_.metrics().count_variant_request(response_model_, response_variant_, status);
  // A 503 is a load refusal (admission, draining), not the variant failing; an injected
  // fault counts whatever its status.
  const bool failed = injected_fault_ || failed_midway || (status >= 500 && status != 503);
  gateway::VariantGuard& guard = core_.front_door().guard();
  guard.observe(response_model_, response_variant_key_, failed, outcome_ttft_s_, outcome_tpot_s_);
  if (status == 200 && !failed) {
    // Feedback may name the answer by its body's id or its x-request-id.
    guard.remember(outcome_response_id_, request_tenant_, response_model_, response_variant_key_);
    guard.remember(request_id_, request_tenant_, response_model_, response_variant_key_);
  }
}

void HttpSession::note_call_for_log() {
  if (!core_.config().access_log || !call_ || !call_->formatter) return;
  const ResponseFormatter& fmt = *call_->formatter;
  const engine::Usage& u = fmt.usage();
  Json f = Json::object();
  if (call_->model) f["model"] = call_->model->id();
  f["class"] = sla_class_name(call_->sla_class);
  f["prompt_tokens"] = u.prompt_tokens;
  f["cached_tokens"] = u.cached_prompt_tokens;
  f["completion_tokens"] = u.completion_tokens;
  f["stream"] = fmt.spec().stream;
  if (fmt.first_token_ns() > 0) f["ttft_s"] = static_cast<double>(fmt.first_token_ns() - call_->start_ns) * 1e-9;
  access_fields_ = std::move(f);
}

void HttpSession::access_log(int status, const std::string& endpoint_label) {
  if (!core_.config().access_log) return;
  Json j = Json::object();
  j["ts"] = log_timestamp();
  j["level"] = "info";
  j["msg"] = "request";
  j["id"] = request_id_;
  if (trace_) {
    j["trace_id"] = trace_->trace_id;
    j["parent_id"] = trace_->parent_id;
  }
  j["method"] = request_method_;
  j["path"] = endpoint_label;
  j["status"] = status;
  j["tenant"] = request_tenant_;
  if (access_fields_.is_object()) {
    for (auto it = access_fields_.begin(); it != access_fields_.end(); ++it) j[it.key()] = it.value();
  }
  j["e2e_s"] = static_cast<double>(now_ns() - request_start_ns_) * 1e-9;
  log_line(dump_json(j));
}

void HttpSession::append_chunk(const std::string& data) {
  if (data.empty()) return;
  if (!chunked_) {
    out_ += data;
    return;
  }
  out_ += hex(data.size());
  out_ += "\r\n";
  out_ += data;
  out_ += "\r\n";
}

void HttpSession::flush() {
  if (write_in_flight_ || out_.empty() || phase_ == Phase::kClosed || phase_ == Phase::kLinger) return;
  writing_.swap(out_);
  out_.clear();
  write_in_flight_ = true;
  const uint64_t seq = ++write_seq_;
  write_timer_.expires_after(std::chrono::seconds(core_.config().idle_timeout_s));
  write_timer_.async_wait([self = shared_from_this(), seq](boost::system::error_code ec) {
    // A client that takes nothing for a whole idle timeout is gone as far as we care.
    if (!ec && self->write_in_flight_ && self->write_seq_ == seq) self->client_gone();
  });
  asio::async_write(socket_, asio::buffer(writing_),
                    [self = shared_from_this()](boost::system::error_code ec, size_t) { self->on_write(ec); });
}

void HttpSession::on_write(boost::system::error_code ec) {
  write_in_flight_ = false;
  write_timer_.cancel();
  writing_.clear();
  if (phase_ == Phase::kClosed || phase_ == Phase::kLinger) return;
  if (ec) {
    client_gone();
    return;
  }
  if (phase_ == Phase::kGenerate) pump_events();
  if (write_in_flight_) return;
  if (!out_.empty()) {
    flush();
  } else if (phase_ == Phase::kRespondDone) {
    after_response();
  }
}

void HttpSession::after_response() {
  if (close_after_response_ || !keep_alive_ || core_.draining()) {
    linger_close();
    return;
  }
  begin_request();
}

// ---------------------------------------------------------------------------------------
// Closing

void HttpSession::client_gone() {
  if (phase_ == Phase::kClosed) return;
  if (call_ || preparing_) core_.metrics().client_disconnects.fetch_add(1);
  end_call(/*client_gone=*/true);
  close();
}

// The client ended its side of the connection with a request in flight. That is either a
// half-close (shutdown(SHUT_WR) after a complete request: it still reads, and is answered)
// or a full close (it is gone). Reads cannot tell them apart; the kernel of a client that
// closed fully answers any byte sent to it with a reset. So a response that has not begun
// is preceded by an interim "100 Continue" (RFC 9110 allows any number of 1xx responses
// before the final one, and clients must skip those they did not expect), and the socket
// is checked for that reset while the request runs. A stream that has begun needs no probe:
// its own chunks do the same. Nothing more is read, and the connection closes after the
// answer.
void HttpSession::peer_write_closed() {
  read_ended_ = true;
  close_after_response_ = true;
  const bool response_begun = phase_ == Phase::kGenerate && call_ && call_->stream_begun;
  if (!response_begun && chunked_) {  // chunked_: HTTP/1.1, which may be sent a 1xx
    out_ += "HTTP/1.1 100 Continue\r\n\r\n";
    flush();
  }
  arm_peer_check();
}

void HttpSession::arm_peer_check() {
  read_timer_.expires_after(std::chrono::milliseconds(100));
  read_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec || (self->phase_ != Phase::kPrepare && self->phase_ != Phase::kGenerate)) return;
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(self->socket_.native_handle(), SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0) {
      self->client_gone();
      return;
    }
    self->arm_peer_check();
  });
}

void HttpSession::close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  end_call(/*client_gone=*/true);
  boost::system::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  read_timer_.cancel();
  write_timer_.cancel();
}

void HttpSession::linger_close() {
  phase_ = Phase::kLinger;
  linger_bytes_ = 0;
  boost::system::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) {
    close();
    return;
  }
  read_timer_.expires_after(kLingerTime);
  read_timer_.async_wait([self = shared_from_this()](boost::system::error_code e) {
    if (!e) self->close();
  });
  arm_read();
}

void HttpSession::close_if_idle() {
  if (phase_ == Phase::kReadRequest && !request_bytes_seen_) close();
}

}  // namespace metro::server
