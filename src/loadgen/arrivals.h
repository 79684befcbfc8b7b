// When requests arrive: a renewal process with gamma-distributed gaps.
//
// burstiness B is the gamma shape. B = 1 gives exponential gaps (a Poisson process); B < 1
// clusters arrivals into bursts separated by lulls, B > 1 spaces them more evenly. The mean
// rate stays R for every B: gaps have mean 1/R and coefficient of variation 1/sqrt(B).
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "base/status.h"

namespace metro::loadgen {

struct ArrivalProcess {
  double rate_per_s = std::numeric_limits<double>::infinity();  // infinity: all at once
  double burstiness = 1.0;                                      // gamma shape, > 0

  bool all_at_once() const { return rate_per_s == std::numeric_limits<double>::infinity(); }
  Status validate() const;
};

// Arrival offsets in seconds from the start, nondecreasing, the first at 0 (a run starts
// with its first request). All zeros when the rate is infinite. Same seed, same offsets.
std::vector<double> arrival_offsets(const ArrivalProcess& process, size_t n, uint64_t seed);

}  // namespace metro::loadgen
