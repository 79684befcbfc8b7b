// Runs a workload against a server: releases sessions on the arrival schedule, keeps at
// most --max-concurrency requests in flight, sends each with the client, and measures it.
//
// Everything runs on the calling thread, on one Asio event loop: thousands of concurrent
// streams cost sockets and a few kilobytes each, not threads. Times are taken when the
// loop handles an event, so a saturated client inflates latencies; the progress line shows
// in-flight counts to judge that.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "loadgen/arrivals.h"
#include "loadgen/dataset.h"
#include "loadgen/http_client.h"
#include "loadgen/openai_protocol.h"
#include "loadgen/request_record.h"
#include "loadgen/url.h"

namespace metro::loadgen {

struct RunOptions {
  Url url;
  std::string api_key;     // sent as "Authorization: Bearer KEY" when not empty
  BodyOptions body;        // endpoint, model, streaming, usage, ignore_eos
  ArrivalProcess arrivals;
  size_t max_concurrency = 0;  // 0: no cap
  uint64_t seed = 0;
  double timeout_s = 600.0;    // per request
  double progress_interval_s = 0.25;
};

struct Progress {
  size_t total = 0;
  size_t done = 0;
  size_t failed = 0;
  size_t in_flight = 0;
  size_t queued = 0;  // released but waiting for a slot under the concurrency cap
  int64_t output_tokens = 0;  // received so far, by all requests
  double elapsed_s = 0.0;
};

using ProgressFn = std::function<void(const Progress&)>;

struct RunResult {
  double rate_per_s = 0.0;  // the arrival rate asked for (infinity: all at once)
  double duration_s = 0.0;  // from the first request sent to the last response ended
  std::vector<RequestRecord> requests;  // in workload order: session by session, turn by turn
  size_t peak_in_flight = 0;
  HttpClientStats http;
};

// Returns an error only when the run could not start (the host does not resolve); failed
// requests are results, recorded in RunResult::requests.
Expected<RunResult> run_workload(const Workload& workload, const RunOptions& options,
                                 const ProgressFn& on_progress = {});

// The first model GET /v1/models names: what to put in "model" when --model is not given.
Expected<std::string> discover_model(const Url& url, const std::string& api_key, double timeout_s);

}  // namespace metro::loadgen
