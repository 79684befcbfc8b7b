#include "loadgen/length_dist.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <vector>

namespace metro::loadgen {
namespace {

constexpr int64_t kMaxTokens = 1'000'000;

Expected<int64_t> parse_count(std::string_view s, std::string_view spec) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < 1 || v > kMaxTokens) {
    return invalid_argument("length '" + std::string(spec) + "': '" + std::string(s) +
                            "' is not a token count in [1, 1000000]");
  }
  return v;
}

Expected<double> parse_positive(std::string_view s, std::string_view spec) {
  std::string tmp(s);
  char* end = nullptr;
  double v = std::strtod(tmp.c_str(), &end);
  if (tmp.empty() || end != tmp.c_str() + tmp.size() || !(v > 0.0) || !std::isfinite(v)) {
    return invalid_argument("length '" + std::string(spec) + "': '" + tmp +
                            "' is not a positive number");
  }
  return v;
}

LengthDist lognormal(double median, double sigma, int64_t max) {
  LengthDist d;
  d.kind = LengthDist::Kind::kLognormal;
  d.median = median;
  d.sigma = sigma;
  d.max = max > 0 ? max
                  : std::min<int64_t>(kMaxTokens,
                                      static_cast<int64_t>(std::ceil(median * std::exp(3.0 * sigma))));
  return d;
}

}  // namespace

Expected<LengthDist> LengthDist::parse(std::string_view spec, LengthSide side) {
  const std::string_view usage =
      "; use N, fixed:N, uniform:MIN-MAX, loguniform:MIN-MAX, lognormal or lognormal:MEDIAN,SIGMA[,MAX]";
  if (spec.empty()) return invalid_argument("empty length" + std::string(usage));
  auto colon = spec.find(':');
  std::string_view kind = spec.substr(0, colon);
  std::string_view args = colon == std::string_view::npos ? std::string_view() : spec.substr(colon + 1);
  if (colon == std::string_view::npos && !kind.empty() && kind[0] >= '0' && kind[0] <= '9') {
    METRO_ASSIGN_OR_RETURN(int64_t n, parse_count(spec, spec));
    LengthDist d;
    d.fixed = n;
    return d;
  }
  if (kind == "fixed") {
    METRO_ASSIGN_OR_RETURN(int64_t n, parse_count(args, spec));
    LengthDist d;
    d.fixed = n;
    return d;
  }
  if (kind == "uniform" || kind == "loguniform") {
    auto dash = args.find('-');
    if (dash == std::string_view::npos) {
      return invalid_argument("length '" + std::string(spec) + "': " + std::string(kind) + " needs MIN-MAX");
    }
    METRO_ASSIGN_OR_RETURN(int64_t lo, parse_count(args.substr(0, dash), spec));
    METRO_ASSIGN_OR_RETURN(int64_t hi, parse_count(args.substr(dash + 1), spec));
    if (lo > hi) return invalid_argument("length '" + std::string(spec) + "': MIN is above MAX");
    LengthDist d;
    d.kind = kind == "uniform" ? Kind::kUniform : Kind::kLogUniform;
    d.lo = lo;
    d.hi = hi;
    return d;
  }
  if (kind == "lognormal") {
    if (colon == std::string_view::npos) {
      return lognormal(side == LengthSide::kInput ? kChatInputMedian : kChatOutputMedian,
                       kChatSigma, 0);
    }
    std::vector<std::string_view> parts;
    for (size_t start = 0;;) {
      size_t comma = args.find(',', start);
      parts.push_back(args.substr(start, comma == std::string_view::npos ? comma : comma - start));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (parts.size() < 2 || parts.size() > 3) {
      return invalid_argument("length '" + std::string(spec) + "': lognormal takes MEDIAN,SIGMA[,MAX]");
    }
    METRO_ASSIGN_OR_RETURN(double median, parse_positive(parts[0], spec));
    METRO_ASSIGN_OR_RETURN(double sigma, parse_positive(parts[1], spec));
    int64_t max = 0;
    if (parts.size() == 3) {
      METRO_ASSIGN_OR_RETURN(max, parse_count(parts[2], spec));
    }
    if (sigma > 4.0) return invalid_argument("length '" + std::string(spec) + "': SIGMA above 4");
    if (median < 1.0 || median > static_cast<double>(kMaxTokens)) {
      return invalid_argument("length '" + std::string(spec) + "': MEDIAN outside [1, 1000000]");
    }
    return lognormal(median, sigma, max);
  }
  return invalid_argument("unknown length '" + std::string(spec) + "'" + std::string(usage));
}

int64_t LengthDist::sample(Rng& rng) const {
  switch (kind) {
    case Kind::kFixed:
      return fixed;
    case Kind::kUniform:
      return lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(hi - lo + 1)));
    case Kind::kLogUniform: {
      // floor(exp(U[ln lo, ln(hi + 1)))): every integer in [lo, hi] with probability
      // proportional to ln((v + 1) / v), so each doubling of length is as likely as the next.
      const double l0 = std::log(static_cast<double>(lo)), l1 = std::log(static_cast<double>(hi) + 1.0);
      const auto v = static_cast<int64_t>(std::exp(l0 + rng.uniform01() * (l1 - l0)));
      return std::clamp(v, lo, hi);
    }
    case Kind::kLognormal: {
      double v = std::round(median * std::exp(sigma * rng.normal()));
      if (!(v >= 1.0)) return 1;
      return v >= static_cast<double>(max) ? max : static_cast<int64_t>(v);
    }
  }
  return fixed;
}

double LengthDist::mean() const {
  switch (kind) {
    case Kind::kFixed:
      return static_cast<double>(fixed);
    case Kind::kUniform:
      return 0.5 * static_cast<double>(lo + hi);
    case Kind::kLogUniform: {
      // E[floor(X)] for X log-uniform on [lo, hi + 1): the continuous mean less ~1/2.
      const double a = static_cast<double>(lo), b = static_cast<double>(hi) + 1.0;
      return (b - a) / std::log(b / a) - 0.5;
    }
    case Kind::kLognormal:
      return median * std::exp(0.5 * sigma * sigma);
  }
  return 0.0;
}

std::string LengthDist::to_string() const {
  char buf[96];
  switch (kind) {
    case Kind::kFixed:
      std::snprintf(buf, sizeof(buf), "fixed:%lld", static_cast<long long>(fixed));
      break;
    case Kind::kUniform:
      std::snprintf(buf, sizeof(buf), "uniform:%lld-%lld", static_cast<long long>(lo),
                    static_cast<long long>(hi));
      break;
    case Kind::kLogUniform:
      std::snprintf(buf, sizeof(buf), "loguniform:%lld-%lld", static_cast<long long>(lo),
                    static_cast<long long>(hi));
      break;
    case Kind::kLognormal:
      std::snprintf(buf, sizeof(buf), "lognormal:%g,%g,%lld", median, sigma,
                    static_cast<long long>(max));
      break;
  }
  return buf;
}

}  // namespace metro::loadgen
