// metro bench-serve --url URL [...]: a load generator for OpenAI-compatible servers.
// The work is in src/loadgen; this file turns flags into options and writes the reports.
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loadgen/dataset.h"
#include "loadgen/report_json.h"
#include "loadgen/report_text.h"
#include "loadgen/runner.h"
#include "loadgen/slo.h"
#include "loadgen/stats.h"
#include "loadgen/svg_plot.h"
#include "loadgen/url.h"
#include "cli/commands.h"

namespace metro::cli {
namespace {

using nlohmann::json;
using namespace metro::loadgen;

constexpr double kInf = std::numeric_limits<double>::infinity();

Expected<double> parse_rate(const std::string& text) {
  if (text == "inf" || text == "infinity") return kInf;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(v > 0.0) || !std::isfinite(v)) {
    return invalid_argument("rate '" + text + "' is not a positive number of requests/s or 'inf'");
  }
  return v;
}

Expected<std::vector<double>> parse_rates(const std::string& list) {
  std::vector<double> out;
  size_t start = 0;
  for (;;) {
    size_t comma = list.find(',', start);
    METRO_ASSIGN_OR_RETURN(double r, parse_rate(list.substr(start, comma == std::string::npos ? comma : comma - start)));
    out.push_back(r);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// Thousands of streams need thousands of sockets: lift the soft descriptor limit.
void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    std::fprintf(stderr, "metro bench-serve: cannot write '%s'\n", path.c_str());
    return false;
  }
  return true;
}

int fail(const Status& s) {
  std::fprintf(stderr, "metro bench-serve: %s\n", s.message().c_str());
  return 1;
}

}  // namespace

int cmd_bench_serve(int argc, char** argv) {
  CLI::App app{"Load-test an OpenAI-compatible server: latency percentiles, throughput, goodput",
               "metro bench-serve"};
  std::string url_text, api_key, model, endpoint = "completions", dataset = "synthetic";
  std::string rate_text = "inf", input_len_text, output_len_text = "64", classes_text, sweep_text;
  std::string json_path, plot_path;
  std::vector<std::string> slo_specs;
  size_t num_requests = 0, max_concurrency = 0;
  double burstiness = 1.0, timeout_s = 600.0;
  uint64_t seed = 0;
  int num_prefixes = 4, turns = 4;
  int64_t prefix_len = 448;
  bool no_stream = false, no_ignore_eos = false, quiet = false;
  std::optional<double> temperature;

  app.add_option("--url", url_text, "server base URL, e.g. http://127.0.0.1:8080")->required();
  app.add_option("--api-key", api_key, "bearer token (default: $OPENAI_API_KEY)");
  app.add_option("--model", model, "model name to request (default: the first of /v1/models)");
  app.add_option("--endpoint", endpoint, "completions or chat")->check(CLI::IsMember({"completions", "chat"}));
  app.add_option("--dataset", dataset, "synthetic, shared-prefix, multi-turn, or FILE.jsonl");
  app.add_option("--num-requests", num_requests,
                 "requests to send (default 64; a JSONL file: its record count)");
  app.add_option("--rate", rate_text, "arrivals per second, or inf to release all at once");
  app.add_option("--burstiness", burstiness, "gamma shape of arrival gaps: 1 Poisson, <1 bursty");
  app.add_option("--max-concurrency", max_concurrency, "most requests in flight (0: no cap)");
  app.add_option("--input-len", input_len_text,
                 "prompt length in tokens: N, uniform:MIN-MAX, loguniform:MIN-MAX, "
                 "lognormal[:MEDIAN,SIGMA[,MAX]] "
                 "(default 128; shared-prefix 512)");
  app.add_option("--output-len", output_len_text, "max_tokens per request, same forms (default 64)");
  app.add_option("--num-prefixes", num_prefixes, "shared-prefix: distinct system prompts (K)");
  app.add_option("--prefix-len", prefix_len, "shared-prefix: tokens in each system prompt");
  app.add_option("--turns", turns, "multi-turn: turns per conversation");
  app.add_option("--classes", classes_text, "class mix, e.g. realtime:0.2,standard:0.3,batch:0.5");
  app.add_option("--slo", slo_specs,
                 "SLO, e.g. ttft=0.5,tpot=0.1 or realtime:ttft=0.3,tpot=0.05 (repeatable)");
  app.add_option("--seed", seed, "seed of arrivals, lengths, prompts and classes");
  app.add_option("--json", json_path, "write every figure and the configuration as JSON");
  app.add_option("--plot", plot_path, "write an SVG: latency CDFs, or rate-sweep curves");
  app.add_option("--rate-sweep", sweep_text, "run once per rate, e.g. 1,2,4,8,inf");
  app.add_option("--timeout", timeout_s, "seconds before a request counts as timed out");
  app.add_option("--temperature", temperature, "sampling temperature to send (default: server's)");
  app.add_flag("--no-stream", no_stream, "ask for whole responses (then only E2E is measured)");
  app.add_flag("--no-ignore-eos", no_ignore_eos, "do not send ignore_eos (for strict OpenAI servers)");
  app.add_flag("--quiet", quiet, "no progress line");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  auto url = parse_url(url_text);
  if (!url.ok()) return fail(url.status());
  if (api_key.empty()) {
    if (const char* env = std::getenv("OPENAI_API_KEY")) api_key = env;
  }
  if (!sweep_text.empty() && app.count("--rate") > 0) {
    return fail(invalid_argument("give --rate or --rate-sweep, not both"));
  }
  std::vector<double> rates;
  if (!sweep_text.empty()) {
    auto r = parse_rates(sweep_text);
    if (!r.ok()) return fail(r.status());
    rates = *r;
  } else {
    auto r = parse_rate(rate_text);
    if (!r.ok()) return fail(r.status());
    rates.push_back(*r);
  }

  DatasetOptions data;
  data.dataset = dataset;
  data.num_requests = num_requests;
  data.num_prefixes = num_prefixes;
  data.prefix_len = prefix_len;
  data.turns = turns;
  data.seed = seed;
  if (input_len_text.empty()) input_len_text = dataset == "shared-prefix" ? "512" : "128";
  auto in_len = LengthDist::parse(input_len_text, LengthSide::kInput);
  if (!in_len.ok()) return fail(in_len.status());
  auto out_len = LengthDist::parse(output_len_text, LengthSide::kOutput);
  if (!out_len.ok()) return fail(out_len.status());
  data.input_len = *in_len;
  data.output_len = *out_len;
  auto mix = ClassMix::parse(classes_text);
  if (!mix.ok()) return fail(mix.status());
  data.classes = *mix;
  auto slos = SloSet::parse(slo_specs);
  if (!slos.ok()) return fail(slos.status());
  auto workload = build_workload(data);
  if (!workload.ok()) return fail(workload.status());

  RunOptions run;
  run.url = *url;
  run.api_key = api_key;
  run.body.endpoint = endpoint == "chat" ? Endpoint::kChat : Endpoint::kCompletions;
  run.body.stream = !no_stream;
  run.body.ignore_eos = !no_ignore_eos;
  run.body.temperature = temperature;
  run.arrivals.burstiness = burstiness;
  run.max_concurrency = max_concurrency;
  run.seed = seed;
  run.timeout_s = timeout_s;
  for (double r : rates) {
    run.arrivals.rate_per_s = r;
    if (Status s = run.arrivals.validate(); !s.ok()) return fail(s);
  }

  raise_fd_limit();
  run.body.model = model;
  if (model.empty()) {
    auto m = discover_model(run.url, api_key, std::min(timeout_s, 30.0));
    if (m.ok()) {
      run.body.model = *m;
    } else {
      std::fprintf(stderr, "metro bench-serve: %s; sending requests without a model name\n",
                   m.status().message().c_str());
    }
  }

  const bool show_progress = !quiet && isatty(STDERR_FILENO);
  ProgressFn progress;
  if (show_progress) {
    progress = [](const Progress& p) {
      std::fprintf(stderr, "\r\033[K%s", progress_line(p).c_str());
      std::fflush(stderr);
    };
  }

  json config = {{"url", run.url.to_string()},
                 {"endpoint", endpoint},
                 {"model", run.body.model},
                 {"stream", run.body.stream},
                 {"ignore_eos", run.body.ignore_eos},
                 {"include_usage", run.body.include_usage},
                 {"temperature", temperature ? json(*temperature) : json(nullptr)},
                 {"dataset", dataset},
                 {"workload_kind", workload->kind},
                 {"num_requests", workload->n_requests()},
                 {"num_sessions", workload->sessions.size()},
                 {"input_len", data.input_len.to_string()},
                 {"output_len", data.output_len.to_string()},
                 {"num_prefixes", dataset == "shared-prefix" ? json(num_prefixes) : json(nullptr)},
                 {"prefix_len", dataset == "shared-prefix" ? json(prefix_len) : json(nullptr)},
                 {"turns", dataset == "multi-turn" ? json(turns) : json(nullptr)},
                 {"rates", json::array()},
                 {"burstiness", burstiness},
                 {"max_concurrency", max_concurrency},
                 {"classes", data.classes.to_string()},
                 {"slo", slo_specs},
                 {"seed", seed},
                 {"timeout_s", timeout_s}};
  for (double r : rates) config["rates"].push_back(std::isinf(r) ? json("inf") : json(r));

  std::vector<RunResult> results;
  std::vector<RunSummary> summaries;
  for (double r : rates) {
    run.arrivals.rate_per_s = r;
    auto res = run_workload(*workload, run, progress);
    if (show_progress) std::fprintf(stderr, "\r\033[K");
    if (!res.ok()) return fail(res.status());
    summaries.push_back(summarize(*res, *slos));
    results.push_back(std::move(*res));
    char title[512];
    std::snprintf(title, sizeof(title), "%s, %zu requests, rate %s, burstiness %g, max concurrency %s, %s",
                  workload->kind.c_str(), workload->n_requests(), rate_label(r).c_str(), burstiness,
                  max_concurrency == 0 ? "none" : std::to_string(max_concurrency).c_str(),
                  endpoint.c_str());
    std::printf("%s\n", format_run_report(summaries.back(), title).c_str());
    std::fflush(stdout);
  }
  if (rates.size() > 1) std::printf("rate sweep\n%s", format_sweep_table(summaries).c_str());

  if (!json_path.empty()) {
    json doc = report_to_json(config, summaries, results);
    if (!write_file(json_path, doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n")) return 1;
  }
  if (!plot_path.empty()) {
    const std::string title = "metro bench-serve: " + workload->kind + " @ " + run.url.to_string();
    const std::string svg = rates.size() > 1 ? sweep_svg(summaries, title)
                                             : latency_cdf_svg(results[0], summaries[0], title);
    if (!write_file(plot_path, svg)) return 1;
  }
  size_t n_ok = 0;
  for (const auto& s : summaries) n_ok += s.overall.n_ok;
  if (n_ok == 0) {
    std::fprintf(stderr, "metro bench-serve: no request succeeded (see errors by status)\n");
    return 1;
  }
  return 0;
}

}  // namespace metro::cli
