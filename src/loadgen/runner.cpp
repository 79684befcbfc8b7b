#include "loadgen/runner.h"

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <memory>

#include "loadgen/response_meter.h"

namespace metro::loadgen {
namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

class Run {
 public:
  Run(const Workload& w, const RunOptions& o, const ProgressFn& progress)
      : w_(w),
        o_(o),
        progress_(progress),
        client_(io_, o.url),
        arrival_timer_(io_),
        progress_timer_(io_) {}

  Expected<RunResult> run() {
    METRO_RETURN_IF_ERROR(client_.resolve());
    arrivals_ = arrival_offsets(o_.arrivals, w_.sessions.size(), o_.seed);
    first_record_.reserve(w_.sessions.size());
    size_t n = 0;
    for (const auto& s : w_.sessions) {
      first_record_.push_back(n);
      n += s.turns.size();
    }
    result_.requests.resize(n);
    history_.resize(w_.sessions.size());
    for (size_t s = 0; s < w_.sessions.size(); ++s) {
      for (size_t t = 0; t < w_.sessions[s].turns.size(); ++t) {
        RequestRecord& r = result_.requests[first_record_[s] + t];
        r.session = s;
        r.turn = t;
        r.class_name = w_.sessions[s].class_name;
        r.input_words = w_.sessions[s].turns[t].input_words;
        r.max_tokens = w_.sessions[s].turns[t].max_tokens;
      }
    }
    result_.rate_per_s = o_.arrivals.rate_per_s;
    t0_ = Clock::now();
    if (n > 0) {
      release_due();
      if (progress_) tick_progress();
      io_.run();
    }
    for (const auto& r : result_.requests) result_.duration_s = std::max(result_.duration_s, r.done_s);
    result_.http = client_.stats();
    client_.close_idle();
    if (progress_) progress_(snapshot());
    return std::move(result_);
  }

 private:
  double now_s() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

  // Releases every session whose arrival time has come, then waits for the next one.
  void release_due() {
    const double now = now_s();
    while (next_session_ < arrivals_.size() && arrivals_[next_session_] <= now) {
      release(next_session_, 0, arrivals_[next_session_]);
      ++next_session_;
    }
    pump();
    if (next_session_ < arrivals_.size()) {
      arrival_timer_.expires_at(t0_ + seconds(arrivals_[next_session_]));
      arrival_timer_.async_wait([this](boost::system::error_code ec) {
        if (!ec) release_due();
      });
    }
  }

  void release(size_t session, size_t turn, double scheduled_s) {
    result_.requests[first_record_[session] + turn].scheduled_s = scheduled_s;
    ready_.push_back({session, turn});
  }

  void pump() {
    while (!ready_.empty() && (o_.max_concurrency == 0 || in_flight_ < o_.max_concurrency)) {
      auto [s, t] = ready_.front();
      ready_.pop_front();
      dispatch(s, t);
    }
  }

  void dispatch(size_t s, size_t t) {
    const Session& session = w_.sessions[s];
    RequestRecord& rec = result_.requests[first_record_[s] + t];
    const bool later_turns = t + 1 < session.turns.size();
    auto messages = request_messages(session, t, history_[s]);
    HttpRequest req;
    req.target = endpoint_path(o_.url.path, o_.body.endpoint);
    req.body = request_body(o_.body, messages, session.turns[t].max_tokens);
    if (!o_.api_key.empty()) req.headers.emplace_back("Authorization", "Bearer " + o_.api_key);
    if (session.class_name != kDefaultClass) req.headers.emplace_back("X-Metro-Class", session.class_name);
    if (later_turns) {
      history_[s].push_back({"user", session.turns[t].user});
    }
    ++in_flight_;
    result_.peak_in_flight = std::max(result_.peak_in_flight, in_flight_);
    rec.sent_s = now_s();
    auto meter = std::make_shared<ResponseMeter>(rec, o_.body.stream, later_turns);
    HttpCallbacks cb;
    cb.on_head = [this, meter](int status) { meter->on_head(now_s(), status); };
    cb.on_body = [this, meter](std::string_view bytes) { return meter->on_body(now_s(), bytes); };
    cb.on_done = [this, meter, s, t](const HttpOutcome& outcome) {
      meter->on_done(now_s(), outcome);
      finished(s, t);
    };
    client_.send(std::move(req), std::move(cb), o_.timeout_s);
  }

  void finished(size_t s, size_t t) {
    RequestRecord& rec = result_.requests[first_record_[s] + t];
    --in_flight_;
    ++done_;
    if (!rec.ok()) ++failed_;
    if (t + 1 < w_.sessions[s].turns.size()) {
      // The next turn resends what the server said, as a chat client would.
      history_[s].push_back({"assistant", std::move(rec.output_text)});
      rec.output_text.clear();
      release(s, t + 1, now_s());
    }
    pump();
    if (done_ == result_.requests.size()) {
      arrival_timer_.cancel();
      progress_timer_.cancel();
    }
  }

  Progress snapshot() const {
    Progress p;
    p.total = result_.requests.size();
    p.done = done_;
    p.failed = failed_;
    p.in_flight = in_flight_;
    p.queued = ready_.size();
    // Tokens streamed so far, finished or not, so that the rate moves during long requests.
    for (const auto& r : result_.requests) {
      p.output_tokens += r.usage_reported ? r.completion_tokens : r.n_content_chunks;
    }
    p.elapsed_s = now_s();
    return p;
  }

  void tick_progress() {
    progress_(snapshot());
    progress_timer_.expires_after(seconds(o_.progress_interval_s));
    progress_timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec && done_ < result_.requests.size()) tick_progress();
    });
  }

  const Workload& w_;
  const RunOptions& o_;
  const ProgressFn& progress_;
  asio::io_context io_;
  HttpClient client_;
  asio::steady_timer arrival_timer_;
  asio::steady_timer progress_timer_;
  Clock::time_point t0_;
  std::vector<double> arrivals_;
  std::vector<size_t> first_record_;
  std::vector<std::vector<ChatMessage>> history_;
  std::deque<std::pair<size_t, size_t>> ready_;
  size_t next_session_ = 0;
  size_t in_flight_ = 0;
  size_t done_ = 0;
  size_t failed_ = 0;
  RunResult result_;
};

}  // namespace

Expected<RunResult> run_workload(const Workload& workload, const RunOptions& options,
                                 const ProgressFn& on_progress) {
  METRO_RETURN_IF_ERROR(options.arrivals.validate());
  if (!(options.timeout_s > 0.0)) return invalid_argument("--timeout must be positive");
  Run run(workload, options, on_progress);
  return run.run();
}

Expected<std::string> discover_model(const Url& url, const std::string& api_key, double timeout_s) {
  asio::io_context io;
  HttpClient client(io, url);
  METRO_RETURN_IF_ERROR(client.resolve());
  HttpRequest req;
  req.method = "GET";
  req.target = models_path(url.path);
  if (!api_key.empty()) req.headers.emplace_back("Authorization", "Bearer " + api_key);
  std::string body;
  HttpOutcome result;
  HttpCallbacks cb;
  cb.on_body = [&](std::string_view b) {
    if (body.size() + b.size() > (1u << 20)) return false;
    body.append(b);
    return true;
  };
  cb.on_done = [&](const HttpOutcome& o) { result = o; };
  client.send(std::move(req), std::move(cb), timeout_s);
  io.run();
  client.close_idle();
  if (result.error != TransportError::kNone) {
    return unavailable("GET " + url.to_string() + models_path("") + ": " +
                       std::string(transport_error_name(result.error)) + " (" + result.message + ")");
  }
  if (result.status != 200) {
    return unavailable("GET /v1/models answered HTTP " + std::to_string(result.status) +
                       "; pass --model");
  }
  return parse_first_model_id(body);
}

}  // namespace metro::loadgen
