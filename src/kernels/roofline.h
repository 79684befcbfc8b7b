// The machine's ceilings for a roofline: the int8 and FP32 arithmetic peaks of the kernel
// ISA and the streaming read bandwidth, each measured with a pool's threads. `metro bench`
// reports achieved rates as fractions of these; bench/peak_bench.cpp runs the same loops.
#pragma once

#include <cstdint>

#include "base/thread_pool.h"

namespace metro::kernels {

struct MachinePeaks {
  double int8_gops = 0;    // byte products (vpmaddubsw), a multiply and an add counted as 2 ops
  double fp32_gflops = 0;  // fused multiply-adds, 2 flops per lane
  double read_gbps = 0;    // sequential reads of a buffer far larger than the caches
};

// Each runs its loop on every thread of `pool` at once for about `seconds` and returns the
// sum of the threads' rates (the best of three passes). The arithmetic peaks are 0 where
// the CPU has no AVX2 (the scalar kernels have no peak worth a roofline).
double measure_int8_peak(ThreadPool& pool, double seconds = 0.05);
double measure_fp32_peak(ThreadPool& pool, double seconds = 0.05);
double measure_read_bandwidth(ThreadPool& pool);
MachinePeaks measure_peaks(ThreadPool& pool);

// The raw loops (AVX2 only): `iters` rounds of 12 independent vpmaddubsw / vfmadd231ps on
// registers, so that only the issue rate of the instruction limits them.
void peak_loop_maddubs(int64_t iters);
void peak_loop_fma(int64_t iters);
inline constexpr int kPeakLoopOpsPerIter = 12;

}  // namespace metro::kernels
