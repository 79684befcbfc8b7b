// metro router --upstream URL [--upstream URL ...] [--policy prefix|least-load|round-robin]
//              [--host H] [--port P] [--health-period S]
//
// An OpenAI-compatible front over metro replicas (router/router.h, docs/server.md
// "Router"). SIGTERM / SIGINT: stop accepting, let open requests finish (30 s), exit 0.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "router/router.h"

namespace metro::cli {

int cmd_router(int argc, char** argv) {
  CLI::App app{"Route OpenAI requests over metro replicas", "metro router"};
  router::RouterConfig cfg;
  std::vector<std::string> upstreams;
  std::string policy = "prefix";
  app.add_option("--upstream", upstreams, "a replica, http://HOST:PORT (repeatable)")->required();
  app.add_option("--policy", policy, "prefix (cached-prefix affinity under a load bound), least-load or round-robin")
      ->check(CLI::IsMember({"prefix", "least-load", "round-robin"}))
      ->capture_default_str();
  app.add_option("--host", cfg.host, "address to listen on")->capture_default_str();
  app.add_option("--port", cfg.port, "port to listen on (0: any free one)")->capture_default_str();
  app.add_option("--health-period", cfg.health_period_s, "seconds between health and load polls of each replica")
      ->check(CLI::Range(0.05, 3600.0))
      ->capture_default_str();
  app.add_option("--upstream-timeout", cfg.upstream_timeout_s,
                 "seconds a replica may go without sending anything before its request is given up")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  app.add_option("--prefix-block", cfg.prefix.block_bytes, "bytes of prompt text per prefix block (prefix policy)")
      ->check(CLI::Range(16, 65536))
      ->capture_default_str();
  app.add_option("--kv-events", cfg.kv_events,
                 "a replica's KV-event endpoint (its `metro serve --kv-events`), tcp://HOST:PORT; one per --upstream, "
                 "in the same order (prefix policy: match prompts' tokens against what each replica holds)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (const std::string& u : upstreams) {
    auto up = router::parse_upstream(u);
    if (!up.ok()) return fail("router", up.status());
    cfg.upstreams.push_back(*up);
  }
  router::parse_policy(policy, &cfg.policy);
  // Every thread the router starts inherits the blocked signals; this one waits for them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  router::Router r(cfg);
  if (Status s = r.start(); !s.ok()) return fail("router", s);
  int healthy = 0;
  for (const auto& l : r.loads()) healthy += l.healthy ? 1 : 0;
  std::printf("metro router: listening on http://%s:%u | %zu replicas (%d healthy) | policy %s\n", cfg.host.c_str(),
              static_cast<unsigned>(r.port()), cfg.upstreams.size(), healthy, router::policy_name(cfg.policy));
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  std::printf("metro router: %s: draining\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  std::fflush(stdout);
  r.stop();
  std::printf("metro router: stopped\n");
  std::fflush(stdout);
  return 0;
}

}  // namespace metro::cli
