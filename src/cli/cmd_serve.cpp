// metro serve -m MODEL [-m NAME=FILE | -m NAME@VARIANT=FILE ...] [--split NAME:VARIANT=PCT]
//             [--host 127.0.0.1] [--port 8080] [--model-name NAME | --served-model-name A B ...]
//             [--api-key-file F] [-t N] [engine flags] [limits]
// Serves the model over an OpenAI-compatible HTTP API (docs/server.md). The listener is up
// before the model loads, so /health answers at once and /ready turns 200 when it is loaded.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>

#include "backends/registry.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/residency.h"
#include "base/thread_pool.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/model_specs.h"
#include "cli/cache_flags.h"
#include "cli/tier_flags.h"
#include "base/sla.h"
#include "engine/engine.h"
#include "engine/step_trace.h"
#include "gateway/front_door.h"
#include "sched/scheduler.h"
#include "server/kv_events_publisher.h"
#include "server/server.h"
#include "server/teacher_capture.h"
#include "tokenizer/chat_template.h"

namespace metro::cli {
namespace {

// Thousands of connections need thousands of descriptors: raise the soft limit to the hard one.
void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  CLI::App app{"Serve a model over an OpenAI-compatible HTTP API", "metro serve"};
  std::vector<std::string> model_args, split_args, rollout_args, fault_args;
  gateway::GuardConfig guard_cfg;
  std::string model_name, api_key_file, admin_key_file, chat_template_file;
  std::string response_store = "64MiB", log_format = "text";
  std::string kv_memory, kv_type = "f16", max_body = "4MiB", prep_bytes = "256MiB", prep_bytes_tenant = "64MiB";
  server::ServerConfig sc;
  engine::EngineConfig ec;
  int port = 8080, threads = default_threads();
  bool no_prefix_cache = false, no_repack = false, mlock = false;
  std::string device = "cpu";
  app.add_option("-m,--model", model_args,
                 "GGUF model file; NAME=FILE serves another model under NAME, NAME@VARIANT=FILE a variant of NAME "
                 "(repeatable)")
      ->required();
  std::vector<std::string> lora_args;
  std::vector<std::pair<std::string, double>> lora_scaled_args;
  app.add_option("--lora", lora_args,
                 "NAME=FILE: serve the first model again with the LoRA adapter FILE merged into its weights, "
                 "as BASE:NAME (repeatable)");
  app.add_option("--lora-scaled", lora_scaled_args, "NAME=FILE SCALE: --lora at a scale (repeatable)");
  app.set_config("--config", "",
                 "read options from a TOML file: a key per long option, named as on the command line "
                 "(model = [\"a.gguf\", \"chat@canary=b.gguf\"], served-model-name = [\"chat\"], port = 8080, "
                 "rollout = [\"chat:canary=5,25,100@10m\"]); what the command line gives wins");
  app.allow_config_extras(CLI::config_extras_mode::error);  // a misspelt key is an error, not ignored
  app.add_option("--split", split_args,
                 "NAME:VARIANT=PERCENT: that share of NAME's requests goes to VARIANT, the same user (the `user` "
                 "field, else the API key) always to the same variant (repeatable)");
  app.add_option("--rollout", rollout_args,
                 "NAME:VARIANT=P1,P2,...@DURATION: VARIANT's share steps through the percents (e.g. 5,25,50,100@10m), "
                 "promoted after each DURATION while it is no worse than the primary on error rate, TTFT p99 and "
                 "TPOT p99, rolled back to 0 as soon as it is (repeatable)");
  app.add_option("--rollout-alpha", guard_cfg.alpha,
                 "false-alarm bound of the rollout tests: about 1/alpha canary requests pass on average before a "
                 "healthy canary is rolled back by chance")
      ->check(CLI::Range(1e-9, 0.5))
      ->capture_default_str();
  app.add_option("--rollout-min-requests", guard_cfg.min_step_requests,
                 "canary requests a rollout step must see before it is promoted")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--rollout-shadow-every", guard_cfg.shadow_every,
                 "shadow-score one of every N completed canary requests under rollout with both models, at the "
                 "lowest priority (0: no shadow scoring)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--rollout-shadow-kl", guard_cfg.shadow_kl,
                 "mean KL (nats per output token) from the primary above which a shadow-scored answer counts against "
                 "the canary")
      ->check(CLI::Range(1e-6, 100.0))
      ->capture_default_str();
  app.add_option("--fault", fault_args,
                 "TARGET:error=SHARE,status=CODE,latency=DURATION,latency_share=SHARE: inject faults into TARGET "
                 "(NAME, NAME@VARIANT or VARIANT) to rehearse rollbacks; off by default (repeatable)");
  app.add_option("--breaker-failures", guard_cfg.breaker.failures,
                 "failed requests in a row that open a variant's circuit breaker (0: no breaker)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--breaker-stuck", guard_cfg.breaker.stuck_s,
                 "seconds an engine with requests may make no progress before its breaker opens (0: never)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--breaker-open", guard_cfg.breaker.open_s,
                 "seconds an open breaker stays open before one probe request is let through")
      ->check(CLI::Range(0.01, 86400.0))
      ->capture_default_str();
  app.add_option("--host", sc.host, "address to listen on")->capture_default_str();
  app.add_option("--port", port, "port to listen on (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  auto* model_name_opt =
      app.add_option("--model-name", model_name, "model id in the API (default: the file name without .gguf)");
  std::vector<std::string> served_names;
  app.add_option("--served-model-name", served_names,
                 "names requests may give the model, one or more; the first is the one responses report and "
                 "/v1/models lists first (instead of --model-name)")
      ->expected(1, -1)
      ->excludes(model_name_opt);
  app.add_option("--response-store", response_store,
                 "memory for stored /v1/responses answers, what previous_response_id continues (0: none kept)")
      ->capture_default_str();
  app.add_option("--log-format", log_format,
                 "text, or json: log lines on stderr as JSON objects, with an access record per request "
                 "(id, trace, method, path, status, tenant, model, class, tokens, TTFT, end-to-end time)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_option("--api-key-file", api_key_file,
                 "file of API keys, one per line: `key [tenant] [class=C] [tpm=N] [burst=N] [concurrency=N] "
                 "[capture=R]`");
  app.add_option("--admin-key-file", admin_key_file,
                 "file whose first line is the admin API's key (/admin/models: splits, rollouts, rollbacks); "
                 "without it there is no admin API");
  server::CaptureConfig capture_cfg;
  std::string capture_max_bytes = "1GiB";
  app.add_option("--capture-teacher", capture_cfg.dir,
                 "write sampled answers as a distillation dataset in this directory: prompt and output ids "
                 "with the top-k log-probabilities of each output position (docs/server.md)");
  app.add_option("--capture-rate", capture_cfg.rate,
                 "share of requests captured; with --api-key-file only tenants with capture=R on their key "
                 "line are, each at its R")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--capture-top-k", capture_cfg.top_k, "alternatives captured per output position")
      ->check(CLI::Range(1, 20))
      ->capture_default_str();
  app.add_option("--capture-max-bytes", capture_max_bytes, "size of the dataset; samples past it are dropped")
      ->capture_default_str();
  app.add_option("--chat-template", chat_template_file, "Jinja chat template file (overrides the model's)");
  app.add_option("-t,--threads", threads, "compute threads")->check(CLI::Range(1, 1024));
  app.add_option("--kv-memory", kv_memory, "KV cache budget in bytes (e.g. 4GiB); overrides --ctx-total");
  std::string kv_spill_bytes = "4GiB";
  app.add_option("--kv-spill-dir", ec.kv_spill_dir,
                 "keep prefix-cache blocks evicted from memory in a file in this directory and read them back "
                 "on later hits (a file per model, removed at exit)");
  app.add_option("--kv-spill-bytes", kv_spill_bytes, "size of each model's spill file")->capture_default_str();
  server::KvEventsConfig kv_events;
  std::string kv_events_format = "map";
  app.add_option("--kv-events", kv_events.endpoint,
                 "publish prefix-cache block events over ZeroMQ in vLLM's layout: tcp://*:PORT binds, "
                 "tcp://HOST:PORT connects (needs libzmq5)");
  app.add_option("--kv-events-topic", kv_events.topic, "the topic frame of each --kv-events message");
  app.add_option("--kv-events-replay", kv_events.replay_endpoint,
                 "bind a ROUTER socket that resends buffered --kv-events batches from a sequence number");
  app.add_option("--kv-events-format", kv_events_format,
                 "map (vLLM's current layout) or array (the layout of earlier vLLM releases)")
      ->check(CLI::IsMember({"map", "array"}))
      ->capture_default_str();
  app.add_option("--ctx-total", ec.ctx_total, "KV cache budget in tokens (default 65536)")
      ->check(CLI::Range(1, 1 << 28));
  app.add_option("--kv-block", ec.kv_block, "tokens per KV block")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--kv-type", kv_type, "KV cache type: f16 or q8_0")->capture_default_str();
  app.add_flag("--no-prefix-cache", no_prefix_cache, "do not share KV blocks between equal prompt prefixes");
  std::string prefix_cache_scope = "tenant";
  app.add_option("--prefix-cache-scope", prefix_cache_scope,
                 "who shares prefix-cache blocks: tenant (requests of one API-key tenant) or global (every "
                 "request; cache hits then tell one tenant what another sent)")
      ->check(CLI::IsMember({"tenant", "global"}))
      ->capture_default_str();
  std::string sla_spec, admission_mode = "auto";
  double ttft_margin = 3.0;
  app.add_option("--sched", ec.sched, "scheduling policy: sla or fcfs")->capture_default_str();
  std::vector<std::string> sched_opts;
  app.add_option("--sched-opt", sched_opts,
                 "an option of the scheduling policy, KEY=VALUE (repeatable; docs/scheduling.md lists each "
                 "policy's keys)");
  app.add_option("--sla", sla_spec, "per-class objectives (see docs/scheduling.md)");
  app.add_option("--admission", admission_mode,
                 "refuse (503) requests that would miss their class's TTFT: on, off, or auto (on when the "
                 "scheduling policy serves classes in priority order, as sla does; off for fcfs)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--ttft-margin", ttft_margin, "refuse when predicted TTFT > margin x the class objective")
      ->check(CLI::Range(0.1, 100.0))
      ->capture_default_str();
  double shed_after = gateway::AdmissionConfig{}.shed_after;
  app.add_option("--shed-after", shed_after,
                 "with admission on: end an admitted request still without a first token after this many times "
                 "its class's bound (--ttft-margin x the class's TTFT objective) with 503 deadline_missed; 0: never")
      ->check(CLI::Range(0.0, 1000.0))
      ->capture_default_str();
  std::string tpot_slack = "on";
  app.add_option("--tpot-slack", tpot_slack,
                 "with --sched sla: decodes ahead of their class's TPOT pace let prompts have the step: on or off "
                 "(--sched-opt tpot_slack=...)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  std::string step_trace;
  app.add_option("--step-trace", step_trace,
                 "write one line per engine step to this file: seconds, prompt tokens, decodes, prompt attention "
                 "pairs, keys read by decodes (the step cost model's inputs), logit rows, seconds of attention "
                 "(bench/step_cost_fit.py fits them)");
  std::string tpot_cap = "all";
  app.add_option("--tpot-cap", tpot_cap,
                 "with --sched sla: a class's TPOT objective caps the step length when prompts of any class "
                 "are planned (all) or only prompts of lower classes (lower) (--sched-opt tpot_cap=...)")
      ->check(CLI::IsMember({"all", "lower"}))
      ->capture_default_str();
  double decode_share = 1.0;
  app.add_option("--decode-share", decode_share,
                 "with --sched sla: share of a step's time the running requests' decodes may fill before new "
                 "requests wait for a seat (the rest is left to prompts) (--sched-opt decode_share=...)")
      ->check(CLI::Range(0.05, 1.0))
      ->capture_default_str();
  std::string embed_window = "off";
  gateway::BatchWindowConfig window_cfg;
  app.add_option("--embed-window", embed_window,
                 "hold /v1/embeddings requests briefly so that several start in one engine step: on or off "
                 "(each class waits --embed-wait-fraction x its TTFT objective, at most --embed-max-wait)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--embed-wait-fraction", window_cfg.wait_fraction,
                 "embeddings window: a class's wait as a fraction of its TTFT objective")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--embed-max-wait", window_cfg.max_wait_cap_s, "embeddings window: longest wait in seconds")
      ->check(CLI::Range(0.0, 10.0))
      ->capture_default_str();
  app.add_option("--max-batch-tokens", ec.max_batch_tokens, "tokens per engine step")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  SpecFlags spec;
  add_spec_flags(app, spec, "off");
  app.add_option("--max-seqs", ec.max_seqs, "sequences per engine step")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--ctx", ec.n_ctx, "context per sequence (default: the model's)")->check(CLI::Range(0, 1 << 24));
  app.add_option("--stream-buffer", ec.stream_capacity,
                 "events buffered per request before a client that does not read is dropped")
      ->check(CLI::Range(4, 1 << 20))
      ->capture_default_str();
  app.add_flag("--no-repack", no_repack, "use weights in their GGUF layout");
  app.add_flag("--mlock", mlock,
               "lock the weights in RAM (never swapped out or dropped); fails at load when RLIMIT_MEMLOCK is too small");
  MemBudgetFlags budget_flags;
  add_mem_budget_flags(app, budget_flags);
  TierFlags tier_flags;
  add_tier_flags(app, tier_flags);
  CacheFlags cache_flags;
  add_cache_flags(app, cache_flags);
  std::string metrics_compat = "none";
  app.add_option("--metrics-compat", metrics_compat,
                 "vllm: /metrics also carries the vllm: names fleet schedulers read (num_requests_waiting, "
                 "num_requests_running, kv_cache_usage_perc, token counters)")
      ->check(CLI::IsMember({"none", "vllm"}))
      ->capture_default_str();
  app.add_option("--device", device, "where the model runs: " + backends::device_names())->capture_default_str();
  app.add_option("--drain-timeout", sc.drain_timeout_s, "seconds in-flight requests get after SIGTERM")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--max-body", max_body, "largest request body (413 above)")->capture_default_str();
  app.add_option("--max-header", sc.max_header_bytes, "largest request header block in bytes (431 above)")
      ->check(CLI::Range(1024, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-connections", sc.max_connections, "open connections (503 beyond)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-n", sc.limits.max_n, "largest n per request")->check(CLI::Range(1, 128))->capture_default_str();
  int max_inflight_choices = gateway::FrontDoorConfig{}.max_inflight_choices;
  app.add_option("--max-inflight-choices", max_inflight_choices, "choices over all concurrent requests (503 beyond)")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  app.add_option("--idle-timeout", sc.idle_timeout_s, "seconds a connection may stall a read or a write")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  app.add_option("--request-timeout", sc.request_timeout_s, "seconds to receive one whole request")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  app.add_option("--keepalive-timeout", sc.keepalive_timeout_s, "seconds an idle keep-alive connection stays open")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  app.add_option("--send-buffer", sc.socket_send_buffer,
                 "socket send buffer per connection in bytes (0: the OS default, which lets a client that stops "
                 "reading hold megabytes before its stream stalls)")
      ->check(CLI::Range(0, 1 << 26))
      ->capture_default_str();
  app.add_option("--http-threads", sc.http_threads, "HTTP I/O threads")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--prep-threads", sc.prep_threads, "threads that parse and tokenize requests")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--prep-queue", sc.prep_queue,
                 "requests that may wait to be parsed and tokenized, all tenants together (503 beyond)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--prep-queue-per-tenant", sc.prep_queue_per_tenant,
                 "of which one tenant's; the threads take tenants in turn (503 beyond)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--prep-queue-bytes", prep_bytes,
                 "request bodies that may wait to be parsed and tokenized, all tenants together (503 beyond)")
      ->capture_default_str();
  app.add_option("--prep-queue-bytes-per-tenant", prep_bytes_tenant, "of which one tenant's (503 beyond)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  sc.port = static_cast<uint16_t>(port);
  for (size_t i = 0; i < served_names.size(); ++i) {
    if (served_names[i].empty()) return fail("serve", invalid_argument("--served-model-name: a name may not be empty"));
    for (size_t j = 0; j < i; ++j) {
      if (served_names[j] == served_names[i]) {
        return fail("serve", invalid_argument("--served-model-name: '" + served_names[i] + "' is given twice"));
      }
    }
  }
  auto specs = parse_model_specs(model_args, model_name, served_names);
  if (!specs.ok()) return fail("serve", specs.status());
  // Run-time adapters need the CPU backend's LoRA op, and a precision tier's low model holds
  // none: there the adapters are merged into copies.
  const bool run_time_lora = device == "cpu" && tier_flags.tiers.empty();
  if (Status st = add_lora_specs(lora_args, lora_scaled_args, *specs, run_time_lora); !st.ok()) {
    return fail("serve", st);
  }
  auto splits = parse_splits(split_args, *specs);
  if (!splits.ok()) return fail("serve", splits.status());
  auto rollouts = parse_rollouts(rollout_args, *specs);
  if (!rollouts.ok()) return fail("serve", rollouts.status());
  for (const gateway::RolloutPlan& r : *rollouts) {
    for (const SplitSpec& sp : *splits) {
      if (sp.name == r.name && sp.variant == r.variant) {
        return fail("serve", invalid_argument("--rollout and --split both set the share of " + r.name + "@" +
                                              r.variant + "; give one"));
      }
    }
  }
  auto faults = parse_faults(fault_args, *specs);
  if (!faults.ok()) return fail("serve", faults.status());
  std::string names;
  for (const ServeModelSpec& m : *specs) {
    names += (names.empty() ? "" : ", ") + m.name + (m.variant.empty() ? "" : "@" + m.variant);
  }
  auto body_bytes = parse_size(max_body);
  if (!body_bytes.ok()) return fail("serve", body_bytes.status());
  if (*body_bytes < 1024) return fail("serve", invalid_argument("--max-body must be at least 1KiB"));
  sc.limits.max_body_bytes = static_cast<size_t>(*body_bytes);
  if (log_format == "json") {
    set_log_format(LogFormat::kJson);
    sc.access_log = true;
  }
  auto store_bytes = parse_size(response_store);
  if (!store_bytes.ok()) return fail("serve", store_bytes.status());
  sc.response_store_bytes = static_cast<size_t>(*store_bytes);
  for (auto [flag, text, out] : {std::tuple{"--prep-queue-bytes", &prep_bytes, &sc.prep_queue_bytes},
                                 std::tuple{"--prep-queue-bytes-per-tenant", &prep_bytes_tenant,
                                            &sc.prep_queue_bytes_per_tenant}}) {
    auto b = parse_size(*text);
    if (!b.ok()) return fail("serve", b.status());
    if (*b < 1) return fail("serve", invalid_argument(std::string(flag) + " must be positive"));
    *out = static_cast<size_t>(*b);
  }
  if (!ec.kv_spill_dir.empty()) {
    auto b = parse_size(kv_spill_bytes);
    if (!b.ok()) return fail("serve", b.status());
    ec.kv_spill_bytes = *b;
  }
  if (!kv_memory.empty()) {
    auto b = parse_size(kv_memory);
    if (!b.ok()) return fail("serve", b.status());
    ec.kv_memory_bytes = *b;
  }
  auto kv_dtype = parse_kv_type(kv_type);
  if (!kv_dtype.ok()) return fail("serve", kv_dtype.status());
  ec.kv_type = *kv_dtype;
  if (!sla_spec.empty()) {
    auto sla = parse_sla_spec(sla_spec);
    if (!sla.ok()) return fail("serve", sla.status());
    ec.sla = *sla;
  }
  ec.n_threads = threads;
  if (Status st = check_tier_flags(tier_flags); !st.ok()) return fail("serve", st);
  auto mem_budget = budget_flags.parse();
  if (!mem_budget.ok()) return fail("serve", mem_budget.status());
  if (mem_budget->bytes > 0 && !tier_flags.tiers.empty()) {
    return fail("serve", invalid_argument("--mem-budget and --tiers cannot be combined (a tier is a second copy of "
                                          "the weights, made from the file's bytes the budget gives back)"));
  }
  if (Status st = check_cache_flags(cache_flags); !st.ok()) return fail("serve", st);
  sc.vllm_metric_names = metrics_compat == "vllm";
  {
    engine::EngineConfig check = ec;
    if (Status s = apply_spec_flags(spec, check); !s.ok()) return fail("serve", s);
  }
  ec.prefix_cache = !no_prefix_cache;
  ec.prefix_cache_scope =
      prefix_cache_scope == "global" ? engine::PrefixCacheScope::kGlobal : engine::PrefixCacheScope::kTenant;
  ec.max_n = sc.limits.max_n;
  // The policy's options: what --sched-opt names, and the flags that map onto them when given.
  if (app.count("--tpot-slack")) ec.sched_options.emplace_back("tpot_slack", tpot_slack);
  if (app.count("--tpot-cap")) ec.sched_options.emplace_back("tpot_cap", tpot_cap);
  if (app.count("--decode-share")) ec.sched_options.emplace_back("decode_share", std::to_string(decode_share));
  for (const std::string& kv : sched_opts) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return fail("serve", invalid_argument("--sched-opt takes KEY=VALUE, got '" + kv + "'"));
    }
    ec.sched_options.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  {
    sched::SchedulerOptions so;
    so.objectives = ec.sla;
    so.policy = ec.sched_options;
    if (Status s = sched::check_scheduler_options(ec.sched, so); !s.ok()) return fail("serve", s);
  }
  if (!api_key_file.empty()) {
    auto keys = server::ApiKeys::load(api_key_file);
    if (!keys.ok()) return fail("serve", keys.status());
    sc.api_keys = std::move(*keys);
  }
  if (!admin_key_file.empty()) {
    std::ifstream in(admin_key_file);
    std::string line;
    if (!in || !std::getline(in, line)) {
      return fail("serve", invalid_argument("--admin-key-file " + admin_key_file + ": cannot read it"));
    }
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    if (line.size() < 16) {
      return fail("serve", invalid_argument("--admin-key-file " + admin_key_file +
                                            ": the key on its first line needs at least 16 characters"));
    }
    sc.admin_key = line;
  }
  if (!capture_cfg.dir.empty()) {
    auto b = parse_size(capture_max_bytes);
    if (!b.ok()) return fail("serve", b.status());
    capture_cfg.max_bytes = *b;
    for (const auto& [tenant, ts] : sc.api_keys.tenants()) {
      if (ts.capture_share) capture_cfg.tenant_rates[tenant] = *ts.capture_share;
    }
    if (sc.api_keys.enabled() && capture_cfg.tenant_rates.empty()) {
      return fail("serve", invalid_argument("--capture-teacher with --api-key-file captures only tenants that opt in, "
                                            "and none does: add capture=R to their key lines"));
    }
    auto cap = server::TeacherCapture::open(capture_cfg);
    if (!cap.ok()) return fail("serve", cap.status());
    METRO_LOG_INFO("teacher capture: %s (top %d per position)", (*cap)->jsonl_path().c_str(), (*cap)->top_k());
    sc.teacher_capture = std::shared_ptr<server::TeacherCapture>(std::move(*cap));
  }
  std::shared_ptr<engine::StepTraceWriter> trace;
  if (!step_trace.empty()) {
    auto t = engine::StepTraceWriter::open(step_trace);
    if (!t.ok()) return fail("serve", t.status());
    trace = *t;
  }
  // The gateway: tenant quotas from the key file, admission control on each model's queues.
  gateway::FrontDoorConfig fd;
  fd.admission = admission_mode == "on"    ? gateway::AdmissionMode::kOn
                 : admission_mode == "off" ? gateway::AdmissionMode::kOff
                                           : gateway::AdmissionMode::kAuto;
  fd.sla = ec.sla;
  fd.admission_cfg.ttft_margin = ttft_margin;
  fd.admission_cfg.shed_after = shed_after;
  fd.max_inflight_choices = max_inflight_choices;
  fd.guard = guard_cfg;
  for (const auto& [tenant, ts] : sc.api_keys.tenants()) {
    gateway::TenantQuota q;
    q.tokens_per_minute = ts.tokens_per_minute;
    q.burst_tokens = ts.burst_tokens;
    q.max_concurrent = ts.max_concurrent;
    fd.tenant_quotas.emplace_back(tenant, q);
  }
  if (embed_window == "on") fd.embed_window = window_cfg;
  if (Status s = gateway::validate(fd); !s.ok()) return fail("serve", s);

  std::optional<tokenizer::ChatTemplate> template_override;
  if (!chat_template_file.empty()) {
    auto t = read_chat_template(chat_template_file);
    if (!t.ok()) return fail("serve", t.status());
    template_override = std::move(*t);
  }
  raise_fd_limit();

  // Several engines take turns on one compute pool rather than oversubscribing the cores.
  if (specs->size() > 1 || cache_flags.on) ec.pool = std::make_shared<ThreadPool>(threads);
  if (Status st = build_semantic_cache(cache_flags, ec.pool, !no_repack, sc); !st.ok()) return fail("serve", st);
  if (!kv_events.endpoint.empty()) {
    if (no_prefix_cache) return fail("serve", invalid_argument("--kv-events reports the prefix cache, which is off"));
    kv_events.array_layout = kv_events_format == "array";
    auto pub = server::KvEventsPublisher::start(kv_events);
    if (!pub.ok()) return fail("serve", pub.status());
    sc.kv_events = *pub;
  }
  const int64_t t_start = now_ns();
  const std::shared_ptr<server::KvEventsPublisher> sc_kv_events = sc.kv_events;
  const model::MemBudget budget = *mem_budget;
  auto load_one = [=](gateway::FrontDoor& door, const ServeModelSpec& ms) -> Status {
    // The served model is a copy in memory; the file is polled so that an operator who
    // overwrites it learns (once, in the log) that a restart is needed to serve the new one.
    std::vector<model::LoraSpec> adapters;
    for (const auto& ad : ms.adapters) adapters.push_back(ad.second);
    METRO_ASSIGN_OR_RETURN(LoadedModel lm, load_model(ms.path, !no_repack, device, std::chrono::seconds(2),
                                                      /*progress=*/false, ms.lora, adapters, budget));
    std::optional<tokenizer::ChatTemplate> tmpl = template_override;
    if (!tmpl) {
      auto t = tokenizer::ChatTemplate::from_gguf(lm.model->file());
      if (t.ok()) {
        tmpl = std::move(*t);
      } else {
        std::fprintf(stderr,
                     "metro serve: warning: the model's chat template is unusable (%s); "
                     "/v1/chat/completions will answer 400\n",
                     t.status().message().c_str());
      }
    }
    engine::EngineConfig cfg = ec;  // a proposer of its own: it keeps per-sequence state
    if (sc_kv_events) {
      cfg.kv_events = [pub = sc_kv_events, bs = cfg.kv_block](std::vector<kv::KvEvent> events) {
        pub->publish(std::move(events), bs);
      };
    }
    METRO_RETURN_IF_ERROR(apply_spec_flags(spec, cfg, lm.model));
    METRO_ASSIGN_OR_RETURN(TierModels tiers, build_tiers(tier_flags, lm.model, !no_repack, cfg));
    METRO_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> eng, engine::Engine::create(tiers.high, *lm.tokenizer, cfg));
    // The file's copy is no longer read where the backend copied the weights into layouts
    // of its own; precision tiers keep it (their shadow scorer binds layers from it).
    if (!tiers.low) lm.model->give_back_unread_file_bytes();
    if (mlock) {
      for (const auto& m : {tiers.high, tiers.low}) {
        if (m) METRO_RETURN_IF_ERROR(m->lock_weights().status());
      }
    }
    if (trace) eng->add_observer(trace);
    auto served = std::make_shared<gateway::ServedModel>();
    served->name = ms.name;
    served->aliases = ms.aliases;
    served->variant = ms.variant;
    served->engine = std::shared_ptr<engine::Engine>(std::move(eng));
    served->chat_template = std::move(tmpl);
    served->created_unix_s = unix_time_seconds();
    METRO_RETURN_IF_ERROR(door.add_model(served));
    served->load_seconds = static_cast<double>(now_ns() - t_start) * 1e-9;
    for (size_t i = 0; i < ms.adapters.size(); ++i) {
      METRO_RETURN_IF_ERROR(door.add_adapter(ms.adapters[i].first, served, static_cast<int16_t>(i + 1)));
    }
    return Status();
  };
  auto loader = [=, models = *specs, shares = *splits, plans = *rollouts,
                 injected = *faults](gateway::FrontDoor& door) -> Status {
    for (const ServeModelSpec& ms : models) METRO_RETURN_IF_ERROR(load_one(door, ms));
    for (const SplitSpec& s : shares) METRO_RETURN_IF_ERROR(door.set_split(s.name, s.variant, s.share));
    for (const FaultTarget& f : injected) {
      METRO_RETURN_IF_ERROR(door.guard().set_fault(f.name, f.variant, f.spec));
      METRO_LOG_WARN("fault injection on %s%s: error %.2f (status %d), latency %.3f s to %.2f of its requests",
                     f.name.c_str(), f.variant.empty() ? "" : ("@" + f.variant).c_str(), f.spec.error, f.spec.status,
                     f.spec.latency_s, f.spec.latency_share);
    }
    for (const gateway::RolloutPlan& r : plans) METRO_RETURN_IF_ERROR(door.guard().start_rollout(r));
    return Status();
  };
  // The admin API's `load`: the same load as at start, while serving.
  sc.load_model = [load_one](gateway::FrontDoor& door, const std::string& name, const std::string& variant,
                             const std::string& path) {
    ServeModelSpec ms;
    ms.name = name;
    ms.variant = variant;
    ms.path = path;
    return load_one(door, ms);
  };
  auto door = std::make_shared<gateway::FrontDoor>(fd);
  sc.front_door = door;
  server::Server::Callbacks cb;
  cb.on_loaded = [threads, spec](const gateway::FrontDoor& d) {
    for (const auto& m : d.models().all()) {
      const engine::Engine& e = *m->engine;
      std::printf(
          "metro serve: model '%s' ready in %.2f s | context %d tokens | KV capacity %lld tokens "
          "(%.1f MiB, %s, block %d) | %d threads | prefix cache %s%s | scheduler %s, admission %s "
          "(measured prefill %.0f tokens/s) | speculation %s%s\n",
          m->id().c_str(), m->load_seconds, e.n_ctx(), static_cast<long long>(e.kv_capacity_tokens()),
          static_cast<double>(e.kv_bytes()) / (1 << 20), e.config().kv_type == kernels::DType::kQ8_0 ? "q8_0" : "f16",
          e.config().kv_block, threads, e.config().prefix_cache ? "on" : "off",
          !e.config().prefix_cache                                                  ? ""
          : e.config().prefix_cache_scope == engine::PrefixCacheScope::kGlobal ? " (global)"
                                                                                : " (per tenant)",
          e.scheduler_name(),
          m->admission ? "on" : "off", m->calibrated_prefill_tokens_per_s,
          e.config().proposer ? (spec.mode + ", k <= " + std::to_string(e.config().max_draft_tokens)).c_str() : "off",
          m->chat_template ? "" : " | no chat template");
      const model::Model& mm = e.model();
      const ByteRanges wm = mm.weight_memory();
      const uint64_t wbytes = total_bytes(wm);
      if (wbytes > 0) {
        std::printf("metro serve: weights %.1f MiB in RAM (%.1f MiB resident%s) | %.1f MiB of the file's copy given back\n",
                    static_cast<double>(wbytes) / (1 << 20), static_cast<double>(resident_bytes(wm)) / (1 << 20),
                    mm.weights_locked() > 0 ? ", locked" : "", static_cast<double>(mm.file_given_back()) / (1 << 20));
      }
      if (mm.mem_budget() > 0) {
        const ColdStore* cs = mm.cold_store();
        const ColdStore::Stats cst = cs ? cs->stats() : ColdStore::Stats{};
        std::printf("metro serve: memory budget %.1f MiB: %.1f MiB every step reads, %.1f MiB cold (experts, embedding rows) in %s "
                    "(at most %.1f MiB of them mapped in)\n",
                    static_cast<double>(mm.mem_budget()) / (1 << 20), static_cast<double>(wbytes) / (1 << 20),
                    static_cast<double>(cst.bytes) / (1 << 20), cs ? cs->path().c_str() : "(none)",
                    static_cast<double>(cst.budget) / (1 << 20));
      }
      const engine::EngineStats st = e.stats();
      if (st.tiers) {
        std::printf("metro serve: precision tiers: high %.1f MiB, low %.1f MiB | policy %s | shadow scoring %s\n",
                    static_cast<double>(st.tier_bytes[0]) / (1 << 20), static_cast<double>(st.tier_bytes[1]) / (1 << 20),
                    engine::adaptive::tier_policy_name(e.config().tier_control.policy),
                    e.config().shadow.every > 0 ? ("1 in " + std::to_string(e.config().shadow.every)).c_str() : "off");
      }
    }
    std::fflush(stdout);
  };
  cb.on_load_failed = [](const Status& s) {
    std::fprintf(stderr, "metro serve: cannot load the model: %s\n", s.message().c_str());
  };
  const double drain_s = sc.drain_timeout_s;
  cb.on_drain = [drain_s](const char* what) {
    std::printf("metro serve: %s: draining in-flight requests (up to %.0f s)\n", what, drain_s);
    std::fflush(stdout);
  };
  const std::string host = sc.host;
  const bool keys = sc.api_keys.enabled();
  const size_t n_keys = sc.api_keys.size();
  server::Server srv(std::move(sc), loader, cb);
  if (Status s = srv.start(); !s.ok()) return fail("serve", s);
  std::printf("metro serve: listening on http://%s:%u (web UI at /, API at /v1)%s; loading %s\n", host.c_str(),
              static_cast<unsigned>(srv.port()),
              keys ? (" with " + std::to_string(n_keys) + " API key(s)").c_str() : "", names.c_str());
  std::fflush(stdout);
  const int code = srv.wait();
  if (code == 130) {
    std::printf("metro serve: second SIGINT: exiting now\n");
    std::fflush(stdout);
    std::_Exit(130);  // in-flight work is abandoned on purpose; destructors would wait for it
  }
  std::printf("metro serve: stopped\n");
  std::fflush(stdout);
  return code;
}

}  // namespace metro::cli
