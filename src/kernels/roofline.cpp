// Peak measurements for the roofline (roofline.h).
#include "kernels/roofline.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "base/aligned.h"
#include "base/clock.h"
#include "base/cpu_features.h"

namespace metro::kernels {
namespace {

using LoopFn = void (*)(int64_t);

// Rounds of `loop` per second on one thread, from a short timed run.
double rounds_per_second(LoopFn loop) {
  int64_t iters = 1 << 16;
  for (;;) {
    const int64_t t0 = now_ns();
    loop(iters);
    const int64_t dt = now_ns() - t0;
    if (dt > 5'000'000 || iters > (int64_t{1} << 40)) return static_cast<double>(iters) / (static_cast<double>(dt) * 1e-9);
    iters *= 4;
  }
}

// Sum over the pool's threads of instructions per second, every thread looping at once.
double issue_rate(ThreadPool& pool, LoopFn loop, double seconds) {
  const auto iters = static_cast<int64_t>(rounds_per_second(loop) * seconds);
  double best = 0;
  std::vector<double> rates(static_cast<size_t>(pool.size()));
  for (int pass = 0; pass < 3; ++pass) {
    pool.run([&](int ith, int) {
      const int64_t t0 = now_ns();
      loop(iters);
      const int64_t dt = now_ns() - t0;
      rates[static_cast<size_t>(ith)] = static_cast<double>(iters) * kPeakLoopOpsPerIter / (static_cast<double>(dt) * 1e-9);
    });
    double sum = 0;
    for (double r : rates) sum += r;
    best = std::max(best, sum);
  }
  return best;
}

}  // namespace

double measure_int8_peak(ThreadPool& pool, double seconds) {
  if (!cpu_features().has_avx2_level()) return 0.0;
  // 32 byte products and 32 additions (of adjacent pairs, then saturated) per instruction.
  return issue_rate(pool, peak_loop_maddubs, seconds) * 64.0 / 1e9;
}

double measure_fp32_peak(ThreadPool& pool, double seconds) {
  if (!cpu_features().has_avx2_level()) return 0.0;
  return issue_rate(pool, peak_loop_fma, seconds) * 16.0 / 1e9;  // 8 lanes x (multiply + add)
}

double measure_read_bandwidth(ThreadPool& pool) {
  const size_t n = (512u << 20) / sizeof(uint64_t);
  AlignedBuffer<uint64_t> buf(n);
  for (size_t i = 0; i < n; i += 512) buf[i] = i;
  std::vector<uint64_t> sinks(static_cast<size_t>(pool.size()) * 8);
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const int64_t t0 = now_ns();
    pool.parallel_for(n / 8, [&](size_t b, size_t e, int ith) {
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
      const uint64_t* p = buf.data();
      for (size_t i = b * 8; i < e * 8; i += 8) {
        a0 ^= p[i];
        a1 ^= p[i + 1];
        a2 ^= p[i + 2];
        a3 ^= p[i + 3];
        a4 ^= p[i + 4];
        a5 ^= p[i + 5];
        a6 ^= p[i + 6];
        a7 ^= p[i + 7];
      }
      sinks[static_cast<size_t>(ith) * 8] = a0 ^ a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ a7;
    });
    const double s = static_cast<double>(now_ns() - t0) * 1e-9;
    best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / s / 1e9);
  }
  volatile uint64_t keep = sinks[0];
  (void)keep;
  return best;
}

MachinePeaks measure_peaks(ThreadPool& pool) {
  MachinePeaks p;
  p.int8_gops = measure_int8_peak(pool);
  p.fp32_gflops = measure_fp32_peak(pool);
  p.read_gbps = measure_read_bandwidth(pool);
  return p;
}

}  // namespace metro::kernels
