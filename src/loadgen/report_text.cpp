#include "loadgen/report_text.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>

namespace metro::loadgen {
namespace {

void appendf(std::string& out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void appendf(std::string& out, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (n > 0) out.append(buf, std::min<size_t>(static_cast<size_t>(n), sizeof(buf) - 1));
}

// Milliseconds with sensible precision, "-" when not measured.
std::string ms(double seconds) {
  if (std::isnan(seconds)) return "-";
  char buf[32];
  const double v = seconds * 1e3;
  std::snprintf(buf, sizeof(buf), v < 10 ? "%.2f" : v < 1000 ? "%.1f" : "%.0f", v);
  return buf;
}

std::string errors_text(const GroupSummary& g) {
  if (g.errors.empty()) return "none";
  std::string s;
  for (const auto& [key, n] : g.errors) {
    if (!s.empty()) s += ", ";
    s += key + ": " + std::to_string(n);
  }
  return s;
}

void latency_row(std::string& out, const char* name, const Distribution& d) {
  appendf(out, "  %-6s %9s %9s %9s %9s %9s %9s %8zu\n", name, ms(d.mean).c_str(), ms(d.p50).c_str(),
          ms(d.p90).c_str(), ms(d.p99).c_str(), ms(d.min).c_str(), ms(d.max).c_str(), d.n);
}

}  // namespace

std::string rate_label(double rate_per_s) {
  if (std::isinf(rate_per_s)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g/s", rate_per_s);
  return buf;
}

std::string format_run_report(const RunSummary& s, const std::string& title) {
  const GroupSummary& g = s.overall;
  std::string out;
  appendf(out, "== %s ==\n", title.c_str());
  appendf(out, "%-28s %.2f s (peak %zu in flight)\n", "duration", s.duration_s, s.peak_in_flight);
  appendf(out, "%-28s %zu ok, %zu failed of %zu\n", "requests", g.n_ok, g.n_failed, g.n_requests);
  appendf(out, "%-28s %s\n", "errors by status", errors_text(g).c_str());
  if (g.n_prompt_reported > 0) {
    appendf(out, "%-28s %lld (mean %.1f per request as the server counted; %.1f words asked)\n",
            "input tokens", static_cast<long long>(g.prompt_tokens),
            static_cast<double>(g.prompt_tokens) / static_cast<double>(g.n_prompt_reported),
            g.mean_input_words);
    if (g.n_cached_reported > 0) {
      appendf(out, "%-28s %lld (%.1f%% of input tokens, as the server reported)\n",
              "  from prefix cache", static_cast<long long>(g.cached_tokens),
              g.prompt_tokens > 0 ? 100.0 * static_cast<double>(g.cached_tokens) /
                                        static_cast<double>(g.prompt_tokens)
                                  : 0.0);
    }
  } else {
    appendf(out, "%-28s not reported by the server (%.1f words asked per request)\n",
            "input tokens", g.mean_input_words);
  }
  appendf(out, "%-28s %lld (%s)\n", "output tokens", static_cast<long long>(g.completion_tokens),
          g.n_usage_reported == g.n_ok ? "server usage figures"
                                       : (std::to_string(g.n_ok - g.n_usage_reported) +
                                          " requests counted by chunks")
                                             .c_str());
  appendf(out, "%-28s %.3f req/s\n", "request throughput", g.request_throughput);
  appendf(out, "%-28s %.2f tok/s\n", "output token throughput", g.output_token_throughput);
  appendf(out, "%-28s %.2f tok/s\n", "total token throughput", g.total_token_throughput);
  if (g.has_slo) {
    appendf(out, "%-28s %.3f req/s, %zu of %zu requests (%.1f%%) met their class's SLO\n",
            "goodput", g.goodput, g.n_good, g.n_requests, 100.0 * g.good_fraction);
    if (s.classes.empty()) appendf(out, "%-28s %s\n", "SLO", g.slo.to_string().c_str());
  }
  appendf(out, "\n  %-6s %9s %9s %9s %9s %9s %9s %8s\n", "ms", "mean", "p50", "p90", "p99", "min",
          "max", "n");
  latency_row(out, "TTFT", g.ttft);
  latency_row(out, "TPOT", g.tpot);
  latency_row(out, "ITL", g.itl);
  latency_row(out, "E2E", g.e2e);
  latency_row(out, "queue", g.queue);
  if (!s.classes.empty()) {
    appendf(out, "\n  %-12s %5s %5s %9s %9s %9s %9s %9s %9s %7s  %s\n", "class", "reqs", "fail",
            "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "E2E p99", "good%", "SLO");
    for (const auto& c : s.classes) {
      char good[16] = "-";
      if (c.has_slo) std::snprintf(good, sizeof(good), "%.1f", 100.0 * c.good_fraction);
      appendf(out, "  %-12s %5zu %5zu %9.2f %9s %9s %9s %9s %9s %7s  %s\n", c.name.c_str(),
              c.n_requests, c.n_failed, c.output_token_throughput, ms(c.ttft.p50).c_str(),
              ms(c.ttft.p99).c_str(), ms(c.tpot.p50).c_str(), ms(c.tpot.p99).c_str(),
              ms(c.e2e.p99).c_str(), good, c.has_slo ? c.slo.to_string().c_str() : "");
      if (!c.errors.empty()) appendf(out, "  %-12s errors: %s\n", "", errors_text(c).c_str());
    }
  }
  return out;
}

std::string format_sweep_table(std::span<const RunSummary> runs) {
  std::string out;
  appendf(out, "%8s %8s %10s %10s %10s %10s %10s %7s %s\n", "rate", "req/s", "out tok/s",
          "TTFT p50", "TTFT p99", "TPOT p50", "E2E p99", "good%", "failed");
  for (const auto& s : runs) {
    const auto& g = s.overall;
    char good[16] = "-";
    if (g.has_slo) std::snprintf(good, sizeof(good), "%.1f", 100.0 * g.good_fraction);
    appendf(out, "%8s %8.3f %10.2f %10s %10s %10s %10s %7s %zu\n", rate_label(s.rate_per_s).c_str(),
            g.request_throughput, g.output_token_throughput, ms(g.ttft.p50).c_str(),
            ms(g.ttft.p99).c_str(), ms(g.tpot.p50).c_str(), ms(g.e2e.p99).c_str(), good, g.n_failed);
  }
  appendf(out, "(latencies in ms)\n");
  return out;
}

std::string progress_line(const Progress& p) {
  std::string out;
  const int width = static_cast<int>(std::to_string(p.total).size());
  appendf(out, "[%*zu/%zu] %zu in flight, %zu queued, %zu failed, %lld tokens, %.1f tok/s, %.1f s",
          width, p.done, p.total, p.in_flight, p.queued, p.failed,
          static_cast<long long>(p.output_tokens),
          p.elapsed_s > 0 ? static_cast<double>(p.output_tokens) / p.elapsed_s : 0.0, p.elapsed_s);
  return out;
}

}  // namespace metro::loadgen
