// One HTTP/1.1 connection: reads requests (Beast's parser under metro's limits and
// timeouts), answers cheap routes at once, and runs model requests without ever blocking
// its I/O thread: parsing and tokenizing happen on the prep pool, the engine pushes events
// that are posted back here, and output is written as the client takes it.
//
// Everything a session does runs on its strand. Life cycle of a model request:
//   read request -> prepare (prep pool: parse, tokenize, the gateway's front door admits)
//   -> submit (through the front door's Call) -> stream events -> done (Call::finish)
// While a request runs the socket is still read (bounded), so a client that goes away is
// noticed at once and its engine requests are aborted. Engine events are drained only when
// no write is pending: a client that stops reading leaves them in the engine's bounded
// per-request buffer, and the engine aborts the request when that fills.
#pragma once

#include <array>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "cache/semantic_cache.h"
#include "server/json_util.h"
#include "server/openai_response.h"
#include "server/request_id.h"
#include "server/routes.h"
#include "server/server_core.h"

namespace metro::server {

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  using Socket = boost::asio::ip::tcp::socket;

  HttpSession(Socket socket, ServerCore& core);
  ~HttpSession();
  HttpSession(const HttpSession&) = delete;
  HttpSession& operator=(const HttpSession&) = delete;

  void start();

 private:
  enum class Phase { kReadRequest, kPrepare, kGenerate, kRespondDone, kLinger, kClosed };

  // A model request in flight.
  struct CacheState;
  struct Call {
    std::shared_ptr<const gateway::ServedModel> model;
    std::shared_ptr<gateway::Call> admitted;  // the front door's side of it
    std::vector<engine::Handle> handles;
    std::unique_ptr<ResponseFormatter> formatter;
    std::optional<ResponseSpec> spec;  // until the handles are back
    std::string endpoint;
    int64_t start_ns = 0;
    int n_choices = 0;
    SlaClass sla_class = SlaClass::kStandard;
    uint64_t seq = 0;  // matches the front door's submit callback to this call
    // A stream's 200 and headers are sent with its first output, so that a request that
    // ends before any (shed past its deadline, aborted by a drain) is answered with its
    // error status and Retry-After instead of an error event inside a 200.
    bool stream_begun = false;
    // Teacher capture: each request's prompt, and by (request, choice) its output and finish.
    bool capture = false;
    std::vector<std::vector<int32_t>> capture_prompts;
    std::map<std::pair<size_t, int>, std::vector<engine::TokenInfo>> capture_outputs;
    std::map<std::pair<size_t, int>, std::string> capture_finish;
    // Semantic cache: the lookup this call made (null when it made none), whether it was
    // answered from it, and the events of its computed answer (kept once it completes, or
    // compared with the hit it verifies).
    std::shared_ptr<CacheState> cache;
    bool from_cache = false;
    std::vector<engine::Event> cache_events;
  };
  // A semantic cache lookup: the request's namespace and embedding, and what it found.
  struct CacheState {
    uint64_t ns = 0;
    std::vector<float> embedding;
    cache::Lookup found;
  };
  // What a prep thread hands back: the prepared request and, when admitted, its Call.
  struct Prepared {
    ApiResult<PreparedCall> result = ApiError{};
    std::shared_ptr<const gateway::ServedModel> model;
    std::shared_ptr<gateway::Call> admitted;
    std::optional<HttpResponse> direct;  // the whole answer (tokenize, detokenize): no engine call
    bool injected = false;   // `result` is a fault injected into the variant (--fault)
    double delay_s = 0.0;    // injected latency before it goes on
    bool capture = false;    // drawn for teacher capture
    std::shared_ptr<CacheState> cache;  // the semantic cache lookup, when one was made
  };

  // Reading and parsing.
  void arm_read();
  void on_read(boost::system::error_code ec, size_t n);
  void parse_buffered();
  void on_parse_error(boost::system::error_code ec);
  void on_request();
  void arm_read_timer();
  void on_read_timer();
  void begin_request();

  // Model requests.
  void prepare(Endpoint endpoint, std::string body, CallContext call, std::string endpoint_label);
  Prepared prepare_on_worker(Endpoint endpoint, std::string_view body, const CallContext& call,
                             std::shared_ptr<gateway::TenantSlot> slot);
  static ApiError refusal_error(const gateway::Decision& d);
  void begin_stream();
  void on_prepared(Prepared p, std::string endpoint_label, int64_t start_ns);
  // The front door submitted call `seq`: its handles, or the engine's refusal.
  void on_submitted(uint64_t seq, Expected<std::vector<engine::Handle>> handles);
  // The call's engine requests are submitted: build its formatter and start streaming.
  void start_call(ResponseSpec spec);
  void pump_events();
  void complete_call();
  void end_call(bool client_gone);
  // Teacher capture: what a drawn call's events carry, and its samples once it completed.
  void capture_events(size_t request_index, const std::deque<engine::Event>& events);
  void submit_capture();
  // Semantic cache (http_session_cache.cpp): the lookup of an opted-in request on the prep
  // thread (an error only for a malformed opt-in); a hit answered with its cached events;
  // a completed computed answer kept, or compared with the hit it verifies.
  std::optional<ApiError> look_up_semantic_cache(Endpoint endpoint, const nlohmann::json& body, PreparedCall& pc,
                                                 const CallContext& call, Prepared& p);
  void serve_from_cache();
  void settle_semantic_cache(bool completed);

  // Writing.
  void respond(const HttpResponse& r, const std::string& endpoint_label, bool close_after = false);
  // The access record of the request answered with `status` (--log-format json).
  void access_log(int status, const std::string& endpoint_label);
  // What the access record tells of a model call: taken before the call ends.
  void note_call_for_log();
  // Counts the answer under its variant and tells the variant guard how it went.
  void count_variant(int status, bool failed_midway = false);
  void append_chunk(const std::string& data);
  void flush();
  void on_write(boost::system::error_code ec);
  void after_response();

  // Closing.
  void peer_write_closed();
  void arm_peer_check();
  void client_gone();
  void close();
  void linger_close();
  void close_if_idle();

  Socket socket_;
  const Socket::executor_type strand_;
  ServerCore& core_;
  uint64_t registry_id_ = 0;
  Phase phase_ = Phase::kReadRequest;
  boost::beast::flat_buffer buf_;           // received, not yet parsed
  std::array<char, 16 * 1024> read_chunk_;  // a read in flight fills this, never buf_
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  bool read_in_flight_ = false;
  bool read_ended_ = false;  // the client shut its side: nothing more to read
  bool request_bytes_seen_ = false;  // of the request being read
  bool continue_sent_ = false;
  bool framing_checked_ = false;  // check_framing ran on this request's header
  bool head_request_ = false;
  int64_t request_start_ns_ = 0;
  // The request being answered: its id (x-request-id), trace context, method, tenant, and
  // the access record's fields of its model call.
  std::string request_id_;
  std::optional<TraceContext> trace_;
  std::string request_method_;
  std::string request_tenant_;
  std::string response_model_;    // the name and variant (x-metro-variant) that served it,
  std::string response_variant_;  // once known ("primary" for the primary)
  std::string response_variant_key_;  // the variant as the registry names it ("" the primary)
  // What the variant guard learns from this request: an injected fault, TTFT and TPOT (-1:
  // none measured).
  bool injected_fault_ = false;
  std::string outcome_response_id_;  // the answer's id in its body (feedback names it)
  double outcome_ttft_s_ = -1.0;
  double outcome_tpot_s_ = -1.0;
  Json access_fields_;
  int64_t last_read_ns_ = 0;
  boost::asio::steady_timer read_timer_;
  boost::asio::steady_timer write_timer_;
  boost::asio::steady_timer fault_timer_;  // injected latency (--fault)

  bool keep_alive_ = true;
  bool close_after_response_ = false;
  bool chunked_ = true;  // HTTP/1.1 streams are chunked; 1.0 streams end with the connection
  std::string out_;      // queued bytes
  std::string writing_;  // bytes of the write in flight
  bool write_in_flight_ = false;
  uint64_t write_seq_ = 0;

  std::unique_ptr<Call> call_;
  bool preparing_ = false;
  uint64_t call_seq_ = 0;
  std::atomic<bool> notify_pending_{false};
  size_t linger_bytes_ = 0;
};

}  // namespace metro::server
