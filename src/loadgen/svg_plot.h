// SVG figures, written by hand (no plotting library): latency CDFs of one run, and
// throughput and p99 TTFT against the arrival rate of a --rate-sweep.
#pragma once

#include <span>
#include <string>

#include "loadgen/runner.h"
#include "loadgen/stats.h"

namespace metro::loadgen {

// Four panels (TTFT, TPOT, ITL, E2E): the fraction of requests (of token gaps, for ITL) at
// or below each latency, one curve for all requests and one per class. A panel whose largest
// value is over 100 times its smallest gets a logarithmic latency axis.
std::string latency_cdf_svg(const RunResult& run, const RunSummary& summary, const std::string& title);

// Two panels against the rate (evenly spaced, labelled, so that 'inf' has a place): output
// token throughput, and p99 TTFT; one curve for all requests and one per class.
std::string sweep_svg(std::span<const RunSummary> runs, const std::string& title);

// Escapes &, <, >, " for SVG text and attributes.
std::string svg_escape(std::string_view text);

}  // namespace metro::loadgen
