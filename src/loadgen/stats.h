// Summaries of a run: latency percentiles, throughput, goodput and errors, overall and per
// class.
//
// Percentiles interpolate linearly between the two nearest order statistics (the rule of
// numpy.percentile's default and of vLLM's benchmark): for n sorted values x[0..n-1],
// p-th percentile = x[i] + f * (x[i+1] - x[i]) where i + f = p/100 * (n - 1).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "loadgen/request_record.h"
#include "loadgen/runner.h"
#include "loadgen/slo.h"

namespace metro::loadgen {

// The p-th percentile (0 <= p <= 100) of sorted values; NaN when there are none.
double percentile_sorted(std::span<const double> sorted, double p);

struct Distribution {
  size_t n = 0;
  double mean = kNotMeasured, p50 = kNotMeasured, p90 = kNotMeasured, p99 = kNotMeasured;
  double min = kNotMeasured, max = kNotMeasured;

  // NaN values are skipped.
  static Distribution of(std::vector<double> values);
};

struct GroupSummary {
  std::string name;  // "all" or a class name
  size_t n_requests = 0;
  size_t n_ok = 0;
  size_t n_failed = 0;
  std::map<std::string, size_t> errors;  // by RequestRecord::error

  int64_t prompt_tokens = 0;      // successful requests, as the server counted them
  size_t n_prompt_reported = 0;   // how many of those reported a count
  int64_t cached_tokens = 0;      // prompt tokens the server served from its prefix cache
  size_t n_cached_reported = 0;
  int64_t completion_tokens = 0;  // successful requests
  size_t n_usage_reported = 0;    // successful requests whose output count came from usage
  double mean_input_words = 0.0;  // what the dataset asked for (generated prompts)

  double request_throughput = 0.0;       // successful requests / run duration
  double output_token_throughput = 0.0;  // output tokens of successful requests / duration
  double total_token_throughput = 0.0;   // prompt + output tokens / duration

  Distribution ttft, tpot, itl, e2e, queue;

  Slo slo;              // the class's SLO; for "all", the all-class limits (each request is
                        // still judged by its own class's SLO)
  bool has_slo = false;
  size_t n_good = 0;    // requests meeting every limit of their class's SLO
  double goodput = 0.0;        // n_good / duration
  double good_fraction = 0.0;  // n_good / n_requests
};

struct RunSummary {
  double rate_per_s = 0.0;
  double duration_s = 0.0;
  size_t peak_in_flight = 0;
  GroupSummary overall;
  std::vector<GroupSummary> classes;  // sorted by name; empty when all are "default"
};

RunSummary summarize(const RunResult& run, const SloSet& slos);

// ITL samples of a group, pooled across its requests (for CDFs).
std::vector<double> pooled_itl(std::span<const RequestRecord> requests, const std::string& class_name);

}  // namespace metro::loadgen
