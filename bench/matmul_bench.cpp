// matmul throughput on SmolLM2-135M's shapes: GB/s of weights streamed and GFLOP/s
// (2 * n * k * m per product), with 1 and 2 threads, activation quantization included.
//
// Weights rotate over enough copies to exceed the L3 cache (--benchmark_filter=.../warm
// runs keep one copy hot instead), since in a forward pass every matrix comes from DRAM.
// Peaks of the reference machine (docs: BENCHMARKING.md): 13-19 GB/s read with 2
// threads, ~125 GFLOP/s FP32 FMA; llama.cpp reaches ~51 GFLOP/s-equivalent on Q4_1 pp512.
//
// On a shared machine, 2-thread figures are only meaningful when no other process wants a
// core: the pool's spin barriers lose a scheduler quantum (~10 ms) whenever one of its
// threads is preempted. `chrt -f 10 build/bin/metro_kernel_bench` isolates the run.
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/aligned.h"
#include "base/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/quant_ref.h"

namespace metro::kernels {
namespace {

constexpr size_t kColdBytes = 96u << 20;  // > 32 MiB L3, like a whole model

struct Shape {
  const char* name;
  int64_t n, k;
};

struct Config {
  DType type;
  Shape shape;
  int64_t m;
  int threads;
  bool repack;
  bool cold;
};

// n x k weights quantized once; `copies` repacked or wrapped copies of them.
struct WeightSet {
  std::vector<std::unique_ptr<AlignedBuffer<uint8_t>>> raw;
  std::vector<Weight> weights;
};

WeightSet make_weights(const Config& c) {
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> f(static_cast<size_t>(c.shape.k));
  const size_t row = row_bytes(c.type, c.shape.k);
  auto first = std::make_unique<AlignedBuffer<uint8_t>>(row * static_cast<size_t>(c.shape.n));
  for (int64_t j = 0; j < c.shape.n; ++j) {
    for (auto& v : f) v = 0.05f * nd(rng);
    quantize_row_ref(c.type, f.data(), first->data() + static_cast<size_t>(j) * row, c.shape.k);
  }
  const size_t bytes = row * static_cast<size_t>(c.shape.n);
  const size_t copies = c.cold ? std::max<size_t>(1, kColdBytes / bytes) : 1;
  WeightSet s;
  for (size_t i = 0; i < copies; ++i) {
    auto buf = std::make_unique<AlignedBuffer<uint8_t>>(bytes);
    std::memcpy(buf->data(), first->data(), bytes);
    s.weights.push_back(make_weight(c.type, buf->data(), c.shape.n, c.shape.k, c.repack));
    if (c.repack && s.weights.back().layout != 0) continue;  // the copy is inside the Weight
    s.raw.push_back(std::move(buf));
  }
  return s;
}

void bm_matmul(benchmark::State& state, Config c) {
  WeightSet ws = make_weights(c);
  ThreadPool pool(c.threads);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(c.m * c.shape.k));
  for (auto& v : x) v = nd(rng);
  AlignedBuffer<uint8_t> acts(quantized_acts_bytes(c.type, c.m, c.shape.k));
  AlignedBuffer<float> y(static_cast<size_t>(c.m * c.shape.n));
  size_t next = 0;
  for (auto _ : state) {
    const Weight& w = ws.weights[next];
    next = next + 1 == ws.weights.size() ? 0 : next + 1;
    pool.run([&](int ith, int nth) {
      const QuantizedActs qa = quantize_acts(c.type, x.data(), c.m, c.shape.k,
                                             static_cast<size_t>(c.shape.k), acts.data(), ith, nth);
      pool.barrier();
      matmul(w, qa, y.data(), static_cast<size_t>(c.shape.n), ith, nth);
    });
    benchmark::DoNotOptimize(y.data());
  }
  const double bytes = static_cast<double>(row_bytes(c.type, c.shape.k)) * static_cast<double>(c.shape.n);
  const double flops = 2.0 * static_cast<double>(c.shape.n * c.shape.k * c.m);
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(kernel_isa()) + " " + ws.weights[0].describe());
}

const Shape kShapes[] = {
    {"576x576", 576, 576},    // attn q, out
    {"192x576", 192, 576},    // attn k, v
    {"1536x576", 1536, 576},  // ffn gate, up
    {"576x1536", 576, 1536},  // ffn down
};
const Shape kHead = {"49152x576", 49152, 576};  // tied output head

void register_all() {
  std::vector<Config> configs;
  for (DType t : {DType::kQ4_1, DType::kQ4_0, DType::kQ8_0, DType::kF16}) {
    for (const Shape& s : kShapes) {
      for (int64_t m : {1, 4, 16, 32, 128, 512}) {
        for (int th : {1, 2}) configs.push_back({t, s, m, th, true, true});
      }
    }
  }
  for (int64_t m : {1, 4, 16}) {
    for (int th : {1, 2}) configs.push_back({DType::kQ8_0, kHead, m, th, true, true});
  }
  // The K-quants, on the one shape of the default model whose rows divide into 256-blocks.
  // Each also row-major, to show what its x8 layout buys.
  for (DType t : {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    for (int64_t m : {1, 16}) {
      for (int th : {1, 2}) {
        configs.push_back({t, kShapes[3], m, th, true, true});
        configs.push_back({t, kShapes[3], m, th, false, true});
      }
    }
  }
  // What repacking buys, and warm-cache (L2/L3 resident) figures, on the busiest shape.
  for (DType t : {DType::kQ4_1, DType::kQ4_0, DType::kQ8_0}) {
    for (int64_t m : {1, 32, 512}) {
      for (int th : {1, 2}) {
        configs.push_back({t, kShapes[2], m, th, false, true});
        configs.push_back({t, kShapes[2], m, th, true, false});
      }
    }
  }
  for (const Config& c : configs) {
    const std::string name = "matmul/" + std::string(dtype_name(c.type)) + "/" + c.shape.name + "/m:" +
                             std::to_string(c.m) + "/threads:" + std::to_string(c.threads) +
                             (c.repack ? "" : "/row-major") + (c.cold ? "" : "/warm");
    benchmark::RegisterBenchmark(name.c_str(), bm_matmul, c)->UseRealTime()->MinTime(0.2);
  }
}

const bool kRegistered = (register_all(), true);

}  // namespace
}  // namespace metro::kernels
