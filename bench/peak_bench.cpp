// The machine's arithmetic ceilings, as metro bench's roofline measures them (roofline.h):
// vpmaddubsw and vfmadd231ps issue rates on registers, per thread count. Compare a
// kernel's GFLOP/s counter in matmul_bench (2 ops per multiply-add) with int8 GOP/s here.
#include <benchmark/benchmark.h>

#include <memory>

#include "base/cpu_features.h"
#include "base/thread_pool.h"
#include "kernels/roofline.h"

namespace metro::kernels {
namespace {

constexpr int64_t kIters = 1 << 20;

// Args: threads; `ops` operations per instruction of the loop.
void bm_peak(benchmark::State& state, void (*loop)(int64_t), double ops) {
  if (!cpu_features().has_avx2_level()) {
    state.SkipWithError("the peak loops are AVX2");
    return;
  }
  ThreadPool pool(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    pool.run([&](int, int) { loop(kIters); });
  }
  state.counters["GOP/s"] = benchmark::Counter(
      ops * kPeakLoopOpsPerIter * static_cast<double>(kIters) * static_cast<double>(pool.size()) / 1e9,
      benchmark::Counter::kIsIterationInvariantRate);
}

void BM_peak_int8(benchmark::State& state) { bm_peak(state, peak_loop_maddubs, 64.0); }
void BM_peak_fp32(benchmark::State& state) { bm_peak(state, peak_loop_fma, 16.0); }

BENCHMARK(BM_peak_int8)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_peak_fp32)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();

}  // namespace
}  // namespace metro::kernels
