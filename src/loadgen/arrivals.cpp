#include "loadgen/arrivals.h"

#include <cmath>
#include <string>

#include "loadgen/rng.h"

namespace metro::loadgen {

Status ArrivalProcess::validate() const {
  if (!(rate_per_s > 0.0)) {
    return invalid_argument("--rate must be a positive number of requests per second or 'inf', got " +
                            std::to_string(rate_per_s));
  }
  if (!(burstiness > 0.0) || !std::isfinite(burstiness)) {
    return invalid_argument("--burstiness must be a positive finite number (1 = Poisson), got " +
                            std::to_string(burstiness));
  }
  return Status::ok_status();
}

std::vector<double> arrival_offsets(const ArrivalProcess& process, size_t n, uint64_t seed) {
  METRO_CHECK(process.validate().ok());
  std::vector<double> out(n, 0.0);
  if (process.all_at_once() || n == 0) return out;
  Rng rng = Rng::stream(seed, "arrivals");
  const double scale = 1.0 / (process.rate_per_s * process.burstiness);
  double t = 0.0;
  for (size_t i = 1; i < n; ++i) {
    t += rng.gamma(process.burstiness, scale);
    out[i] = t;
  }
  return out;
}

}  // namespace metro::loadgen
