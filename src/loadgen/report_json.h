// The --json document: the configuration, then every run's figures and requests.
//
// {
//   "tool": "metro bench-serve", "schema_version": 1,
//   "config": { ...what the command line asked, as given by the caller... },
//   "runs": [ {                      // one per rate; one run without --rate-sweep
//       "rate_per_s": 4 | null,      // null: all at once (--rate inf)
//       "duration_s", "peak_in_flight", "http": {connections_opened, ...},
//       "overall": GROUP, "classes": {NAME: GROUP, ...},
//       "requests": [ {session, turn, class, http_status, error, ttft_s, ...}, ... ] } ]
// }
// GROUP: requests, ok, failed, errors_by_status {"429": n, "timeout": n, ...},
//   input_tokens, output_tokens, throughput {requests_per_s, output_tokens_per_s,
//   total_tokens_per_s}, latency percentiles ttft_s, tpot_s, itl_s, e2e_s, queue_s
//   ({n, mean, p50, p90, p99, min, max}), goodput (null without --slo).
// Unmeasured figures are null. docs/bench-serve.md lists every field.
#pragma once

#include <nlohmann/json.hpp>
#include <span>

#include "loadgen/runner.h"
#include "loadgen/stats.h"

namespace metro::loadgen {

inline constexpr int kJsonSchemaVersion = 1;

nlohmann::json group_to_json(const GroupSummary& g);
nlohmann::json request_to_json(const RequestRecord& r);
nlohmann::json run_to_json(const RunSummary& summary, const RunResult& run);

// `config` is embedded as it is.
nlohmann::json report_to_json(const nlohmann::json& config, std::span<const RunSummary> summaries,
                              std::span<const RunResult> runs);

}  // namespace metro::loadgen
