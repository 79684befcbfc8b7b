// Distributions of prompt and output lengths in tokens, as given on the command line.
//
//   128                    fixed: every request the same
//   fixed:128              the same, spelled out
//   uniform:64-256         uniform integers in [64, 256]
//   loguniform:16-2048     floor(exp(U[ln 16, ln 2049))): as many requests of 16-32 tokens
//                          as of 1024-2048 (the simulator's "mixed lengths", tests/sched/sim)
//   lognormal              the chat-trace preset of the side it is used for (see below)
//   lognormal:MEDIAN,SIGMA[,MAX]
//                          exp(N(ln MEDIAN, SIGMA^2)) rounded, clamped to [1, MAX];
//                          MAX defaults to MEDIAN * e^(3 SIGMA) (the 99.87th percentile)
//
// The presets reproduce the mean prompt and output lengths that the vLLM paper (Kwon et al.,
// SOSP 2023) reports for ShareGPT conversations, 161 and 338 tokens, with SIGMA = 1: a long
// right tail in which a few requests are five to ten times the median, the shape those
// traces show. They are not fitted to the raw traces (nothing is downloaded); they give
// chat-like spread with the right means. mean = MEDIAN * e^(SIGMA^2 / 2).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"
#include "loadgen/rng.h"

namespace metro::loadgen {

enum class LengthSide { kInput, kOutput };  // which preset a bare `lognormal` means

struct LengthDist {
  enum class Kind { kFixed, kUniform, kLogUniform, kLognormal };
  Kind kind = Kind::kFixed;
  int64_t fixed = 128;
  int64_t lo = 0, hi = 0;  // uniform and loguniform, inclusive
  double median = 0.0, sigma = 0.0;
  int64_t max = 0;         // lognormal clamp

  static Expected<LengthDist> parse(std::string_view spec, LengthSide side);
  int64_t sample(Rng& rng) const;
  double mean() const;  // exact for fixed/uniform, within ~0.1 for loguniform; unclamped for lognormal
  std::string to_string() const;
};

// The presets' parameters (documented above and in docs/bench-serve.md).
inline constexpr double kChatInputMedian = 100.0;   // mean 164.9
inline constexpr double kChatOutputMedian = 205.0;  // mean 338.0
inline constexpr double kChatSigma = 1.0;

}  // namespace metro::loadgen
