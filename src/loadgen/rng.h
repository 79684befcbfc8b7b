// A seeded random source and the few distributions the load generator draws from.
//
// std::*_distribution results differ between standard libraries, so a workload drawn with
// them would change with the toolchain. These are written out so that `--seed S` names the
// same requests, arrivals and prompts everywhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#include "base/hash.h"

namespace metro::loadgen {

// xoshiro256** seeded through splitmix64. Not for secrets.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (auto& s : s_) {
      x += 0x9e3779b97f4a7c15ull;
      s = mix64(x);
    }
  }
  // An independent stream for one purpose (arrivals, lengths, words...), so that changing how
  // many draws one purpose makes does not shift the others.
  static Rng stream(uint64_t seed, std::string_view purpose) {
    return Rng(hash_bytes(purpose.data(), purpose.size(), seed));
  }

  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in the open interval (0, 1): never 0, so log() of it is finite.
  double uniform01() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }

  // Uniform integer in [0, n). n > 0. The modulo bias is below 2^-40 for n < 2^24.
  uint64_t below(uint64_t n) { return next() % n; }

  // Standard normal (Box-Muller; one of the pair is dropped to keep the state simple).
  double normal() {
    const double u1 = uniform01(), u2 = uniform01();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  double exponential(double rate) { return -std::log(uniform01()) / rate; }

  // Gamma(shape k, scale theta), k > 0: Marsaglia and Tsang's squeeze method for k >= 1,
  // boosted by U^(1/k) for k < 1.
  double gamma(double k, double theta) {
    if (k < 1.0) return gamma(k + 1.0, theta) * std::pow(uniform01(), 1.0 / k);
    const double d = k - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x, v;
      do {
        x = normal();
        v = 1.0 + c * x;
      } while (v <= 0.0);
      v = v * v * v;
      const double u = uniform01();
      if (u < 1.0 - 0.0331 * x * x * x * x) return d * v * theta;
      if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v * theta;
    }
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace metro::loadgen
