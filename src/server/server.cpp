#include "server/server.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <csignal>

#include "base/clock.h"
#include "base/log.h"
#include "server/http_session.h"
#include "server/kv_events_publisher.h"
#include "server/server_core.h"
#include "cache/semantic_cache.h"
#include "server/teacher_capture.h"

namespace metro::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

constexpr auto kDrainPoll = std::chrono::milliseconds(20);
// After a drain timeout aborts what is left, how long aborted requests get to say so.
constexpr int64_t kAbortGraceNs = 2'000'000'000;

constexpr std::string_view kBusyResponse =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 114\r\n"
    "Retry-After: 1\r\nConnection: close\r\n\r\n"
    R"({"error":{"message":"too many open connections","type":"server_error","param":null,"code":"too_many_connections"}})";

// Stops every engine (running requests end with reason abort), then the embeddings window
// (what it holds goes to the stopped engines and is refused).
void stop_engines(ServerCore& core) {
  for (const auto& m : core.front_door().models().all()) m->engine->shutdown();
  if (gateway::EmbedBatcher* window = core.front_door().embed_window()) window->stop();
}

}  // namespace

ServerCore::ServerCore(ServerConfig config, PrepQueue* prep_pool)
    : config_(std::move(config)),
      front_door_(config_.front_door),
      prep_pool_(prep_pool),
      responses_(config_.response_store_bytes) {
  if (!front_door_) {
    gateway::FrontDoorConfig fd;
    fd.admission = gateway::AdmissionMode::kOff;
    fd.calibrate = false;
    front_door_ = std::make_shared<gateway::FrontDoor>(fd);
  }
  metrics_registration_ = front_door_->metrics().add([this](metrics::Exposition& e) {
    metrics_.collect(e);
    if (config_.teacher_capture) config_.teacher_capture->export_metrics(e);
    if (config_.semantic_cache) config_.semantic_cache->export_metrics(e);
    if (config_.kv_events) config_.kv_events->export_metrics(e);
    if (config_.vllm_metric_names) export_vllm_names(e);
  });
}

// The names vLLM exports for the same quantities, per served model (model_name = its id).
void ServerCore::export_vllm_names(metrics::Exposition& e) const {
  for (const auto& m : front_door_->models().all()) {
    const engine::EngineStats st = m->engine->stats();
    const std::string l = metrics::labels({{"model_name", m->id()}});
    const double kv = st.kv_blocks_total > 0 ? static_cast<double>(st.kv_blocks_used) / st.kv_blocks_total : 0.0;
    e.gauge("vllm:num_requests_waiting", "Requests waiting to be processed (metro_requests_waiting).", l, st.waiting);
    e.gauge("vllm:num_requests_running", "Requests in the model's steps (metro_requests_running).", l, st.running);
    e.gauge("vllm:kv_cache_usage_perc", "KV cache usage, 0 to 1 (metro_kv_usage_ratio).", l, kv);
    e.gauge("vllm:gpu_cache_usage_perc", "KV cache usage, 0 to 1 (the older name of vllm:kv_cache_usage_perc).", l, kv);
    e.counter("vllm:prompt_tokens_total", "Prompt tokens computed (metro_prompt_tokens_total).", l,
              static_cast<double>(st.prompt_tokens));
    e.counter("vllm:generation_tokens_total", "Tokens generated (metro_generation_tokens_total).", l,
              static_cast<double>(st.generated_tokens));
  }
}

ServerCore::~ServerCore() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(loads_mu_);
    threads.swap(load_threads_);
  }
  for (auto& t : threads) t.join();
}

Status ServerCore::start_model_load(const std::string& name, const std::string& variant, const std::string& path) {
  if (!config_.load_model) return unimplemented("this server cannot load models while serving");
  const std::string id = variant.empty() ? name : name + "@" + variant;
  std::lock_guard lock(loads_mu_);
  for (const ModelLoad& l : loads_) {
    if (l.id == id && l.state == "loading") return invalid_argument("'" + id + "' is loading already");
  }
  loads_.push_back(ModelLoad{id, path, "loading", "", 0.0});
  const size_t index = loads_.size() - 1;
  load_threads_.emplace_back([this, name, variant, path, index] {
    const int64_t t0 = now_ns();
    const Status st = config_.load_model(*front_door_, name, variant, path);
    std::lock_guard done(loads_mu_);
    ModelLoad& l = loads_[index];
    l.state = st.ok() ? "loaded" : "failed";
    l.error = st.ok() ? "" : st.message();
    l.seconds = static_cast<double>(now_ns() - t0) * 1e-9;
    if (st.ok()) {
      METRO_LOG_INFO("admin: loaded %s from %s in %.2f s", l.id.c_str(), path.c_str(), l.seconds);
    } else {
      METRO_LOG_WARN("admin: loading %s from %s failed: %s", l.id.c_str(), path.c_str(), st.message().c_str());
    }
  });
  return Status();
}

std::vector<ModelLoad> ServerCore::model_loads() const {
  std::lock_guard lock(loads_mu_);
  return loads_;
}

struct Server::Impl {
  explicit Impl(const PrepQueueLimits& prep_limits)
      : prep(prep_limits),
        strand(asio::make_strand(ioc)),
        acceptor(strand),
        signals(strand),
        drain_timer(strand),
        accept_retry_timer(strand),
        work(asio::make_work_guard(ioc)) {}

  asio::io_context ioc;
  PrepQueue prep;
  asio::strand<asio::io_context::executor_type> strand;  // accept, signals, drain
  tcp::acceptor acceptor;
  asio::signal_set signals;
  asio::steady_timer drain_timer;
  asio::steady_timer accept_retry_timer;
  asio::executor_work_guard<asio::io_context::executor_type> work;
  std::vector<std::thread> io_threads;
  std::thread loader_thread;

  ServerCore* core = nullptr;
  Loader loader;
  Callbacks callbacks;

  std::mutex mu;
  std::condition_variable cv;
  std::optional<int> exit_code;

  // Strand-only state.
  bool sigint_seen = false;
  bool drain_started = false;
  int64_t drain_deadline_ns = 0;
  int64_t abort_deadline_ns = 0;
  bool engine_stopped = false;

  void finish(int code) {
    // From here on, connections are refused (at once when called on the strand, as the
    // drain does; the loader thread's failure posts it there).
    asio::dispatch(strand, [this] {
      boost::system::error_code ec;
      acceptor.close(ec);
    });
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!exit_code) exit_code = code;
    }
    cv.notify_all();
  }

  void do_accept() {
    acceptor.async_accept(asio::make_strand(ioc), [this](boost::system::error_code ec, tcp::socket socket) {
      if (ec) {
        if (!acceptor.is_open() || ec == asio::error::operation_aborted) return;
        // Out of descriptors or similar: back off instead of spinning.
        METRO_LOG_WARN("accept failed: %s", ec.message().c_str());
        accept_retry_timer.expires_after(std::chrono::milliseconds(50));
        accept_retry_timer.async_wait([this](boost::system::error_code e) {
          if (!e) do_accept();
        });
        return;
      }
      if (core->metrics().connections.load() >= core->config().max_connections) {
        core->metrics().rejected_connections.fetch_add(1);
        auto s = std::make_shared<tcp::socket>(std::move(socket));
        asio::async_write(*s, asio::buffer(kBusyResponse.data(), kBusyResponse.size()),
                          [s](boost::system::error_code, size_t) {
                            boost::system::error_code ignored;
                            s->shutdown(tcp::socket::shutdown_both, ignored);
                            s->close(ignored);
                          });
      } else {
        std::make_shared<HttpSession>(std::move(socket), *core)->start();
      }
      do_accept();
    });
  }

  void wait_signal() {
    signals.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      if (sig == SIGINT && (sigint_seen || drain_started)) {
        finish(130);
        return;
      }
      if (sig == SIGINT) sigint_seen = true;
      begin_drain(sig == SIGINT ? "SIGINT" : "SIGTERM");
      wait_signal();
    });
  }

  void begin_drain(const char* what) {
    if (drain_started) return;
    drain_started = true;
    core->set_draining();
    // The listener stays open until the process is done: orchestrators probe /health and
    // /ready on new connections during a drain, and a refused probe reads as a dead
    // process. Every other request on them gets 503 server_draining, and each connection
    // closes after its response.
    if (callbacks.on_drain) callbacks.on_drain(what);
    core->close_idle_connections();
    const int64_t timeout_ns = static_cast<int64_t>(core->config().drain_timeout_s * 1e9);
    drain_deadline_ns = now_ns() + std::max<int64_t>(0, timeout_ns);
    poll_drain();
  }

  void poll_drain() {
    const int64_t now = now_ns();
    // Requests are done once their connections have written everything and closed (a
    // draining server closes each connection after its response).
    if (core->metrics().inflight_requests.load() == 0 && core->metrics().connections.load() == 0) {
      finish(0);
      return;
    }
    if (!engine_stopped && now >= drain_deadline_ns) {
      engine_stopped = true;
      abort_deadline_ns = now + kAbortGraceNs;
      METRO_LOG_WARN("drain timeout: aborting %lld request(s) still in flight",
                     static_cast<long long>(core->metrics().inflight_requests.load()));
      // Every request still running ends with reason abort; its client gets an error.
      stop_engines(*core);
    }
    if (engine_stopped && now >= abort_deadline_ns) {
      finish(0);
      return;
    }
    drain_timer.expires_after(kDrainPoll);
    drain_timer.async_wait([this](boost::system::error_code ec) {
      if (!ec) poll_drain();
    });
  }
};

Server::Server(ServerConfig config, Loader loader, Callbacks callbacks)
    : impl_(std::make_unique<Impl>(PrepQueueLimits{config.prep_threads, config.prep_queue, config.prep_queue_per_tenant,
                                                     config.prep_queue_bytes, config.prep_queue_bytes_per_tenant})) {
  core_ = std::make_unique<ServerCore>(std::move(config), &impl_->prep);
  impl_->core = core_.get();
  impl_->loader = std::move(loader);
  impl_->callbacks = std::move(callbacks);
}

Server::~Server() {
  if (!impl_) return;
  Impl& im = *impl_;
  asio::post(im.strand, [&im] {
    boost::system::error_code ec;
    im.acceptor.close(ec);
    im.signals.cancel(ec);
    im.drain_timer.cancel();
    im.accept_retry_timer.cancel();
  });
  if (im.loader_thread.joinable()) im.loader_thread.join();
  // Requests still running end with reason abort, and calls held by the embeddings window
  // are refused, while the I/O threads still run to answer them; sessions then close.
  stop_engines(*core_);
  im.work.reset();
  im.ioc.stop();
  for (std::thread& t : im.io_threads) t.join();
  im.prep.drain_and_join();
  impl_.reset();  // destroys pending handlers and with them the sessions, which use core_
}

Status Server::start() {
  Impl& im = *impl_;
  const ServerConfig& cfg = core_->config();
  boost::system::error_code ec;
  tcp::resolver resolver(im.ioc);
  auto results = resolver.resolve(cfg.host, std::to_string(cfg.port), tcp::resolver::passive, ec);
  if (ec || results.empty()) return invalid_argument("cannot resolve --host " + cfg.host + ": " + ec.message());
  const tcp::endpoint ep = *results.begin();
  im.acceptor.open(ep.protocol(), ec);
  if (!ec) im.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) im.acceptor.bind(ep, ec);
  if (!ec) im.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return io_error("cannot listen on " + cfg.host + ":" + std::to_string(cfg.port) + ": " + ec.message());
  port_ = im.acceptor.local_endpoint(ec).port();

  if (cfg.handle_signals) {
    im.signals.add(SIGINT, ec);
    if (!ec) im.signals.add(SIGTERM, ec);
    if (ec) return io_error("cannot install signal handlers: " + ec.message());
    asio::post(im.strand, [&im] { im.wait_signal(); });
  }
  asio::post(im.strand, [&im] { im.do_accept(); });
  for (int i = 0; i < std::max(1, cfg.http_threads); ++i) {
    im.io_threads.emplace_back([&im] { im.ioc.run(); });
  }
  im.loader_thread = std::thread([&im, core = core_.get()] {
    Status s = im.loader(core->front_door());
    if (s.ok() && core->front_door().models().empty()) s = internal_error("the loader served no model");
    if (!s.ok()) {
      if (im.callbacks.on_load_failed) im.callbacks.on_load_failed(s);
      im.finish(1);
      return;
    }
    core->set_loaded();
    if (im.callbacks.on_loaded) im.callbacks.on_loaded(core->front_door());
  });
  return {};
}

int Server::wait() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->exit_code.has_value(); });
  return *impl_->exit_code;
}

void Server::request_drain() {
  Impl* im = impl_.get();
  asio::post(im->strand, [im] { im->begin_drain("request"); });
}

}  // namespace metro::server
