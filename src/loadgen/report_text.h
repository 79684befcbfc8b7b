// The human-readable report on stdout, and the progress line on a terminal.
#pragma once

#include <span>
#include <string>

#include "loadgen/runner.h"
#include "loadgen/stats.h"

namespace metro::loadgen {

// A run's figures: totals, throughput, goodput, errors, latency percentiles (ms), and a
// table per class when there are classes. `title` heads it.
std::string format_run_report(const RunSummary& summary, const std::string& title);

// One row per rate of a --rate-sweep.
std::string format_sweep_table(std::span<const RunSummary> runs);

// "[ 37/64] 12 in flight, 3 queued, 2 failed, 1520 tokens, 88.1 tok/s, 17.3 s" (no newline).
std::string progress_line(const Progress& p);

// "4/s" or "inf".
std::string rate_label(double rate_per_s);

}  // namespace metro::loadgen
