// Elementwise ops: dispatched kernel vs the scalar reference, in GB/s of memory touched
// (inputs read + outputs written). Rows the size of SmolLM2-135M's hidden (576) and FFN
// (1536) dims fit L1/L2; the 1M-element rows show the streaming rate.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace metro::kernels {
namespace {

std::vector<float> random_vec(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

void set_bytes(benchmark::State& state, int64_t n, int streams) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n * 4 * streams);
}

template <bool kRef>
void BM_rms_norm(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto x = random_vec(n, -2, 2, 1), w = random_vec(n, 0.5f, 1.5f, 2);
  std::vector<float> y(x.size());
  for (auto _ : state) {
    if constexpr (kRef) ref::rms_norm(x.data(), w.data(), y.data(), n, 1e-5f);
    else rms_norm(x.data(), w.data(), y.data(), n, 1e-5f);
    benchmark::DoNotOptimize(y.data());
  }
  set_bytes(state, n, 3);
}

template <bool kRef>
void BM_swiglu(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto g = random_vec(n, -6, 6, 1), u = random_vec(n, -2, 2, 2);
  std::vector<float> y(g.size());
  for (auto _ : state) {
    if constexpr (kRef) ref::swiglu(g.data(), u.data(), y.data(), n);
    else swiglu(g.data(), u.data(), y.data(), n);
    benchmark::DoNotOptimize(y.data());
  }
  set_bytes(state, n, 3);
}

template <bool kRef>
void BM_gelu(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto x = random_vec(n, -6, 6, 1);
  std::vector<float> y(x.size());
  for (auto _ : state) {
    if constexpr (kRef) ref::gelu(x.data(), y.data(), n);
    else gelu(x.data(), y.data(), n);
    benchmark::DoNotOptimize(y.data());
  }
  set_bytes(state, n, 2);
}

template <bool kRef>
void BM_softmax(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto x0 = random_vec(n, -10, 10, 1);
  std::vector<float> x = x0;
  for (auto _ : state) {
    // Softmax of a softmax stays finite, so iterating in place is fine.
    if constexpr (kRef) ref::softmax(x.data(), n);
    else softmax(x.data(), n);
    benchmark::DoNotOptimize(x.data());
  }
  set_bytes(state, n, 2);
}

template <bool kRef>
void BM_add(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto a = random_vec(n, -1, 1, 1), b = random_vec(n, -1, 1, 2);
  std::vector<float> y(a.size());
  for (auto _ : state) {
    if constexpr (kRef) ref::add(a.data(), b.data(), y.data(), n);
    else add(a.data(), b.data(), y.data(), n);
    benchmark::DoNotOptimize(y.data());
  }
  set_bytes(state, n, 3);
}

template <bool kRef>
void BM_dot(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto a = random_vec(n, -1, 1, 1), b = random_vec(n, -1, 1, 2);
  for (auto _ : state) {
    float d;
    if constexpr (kRef) d = ref::dot_f32(a.data(), b.data(), n);
    else d = dot_f32(a.data(), b.data(), n);
    benchmark::DoNotOptimize(d);
  }
  set_bytes(state, n, 2);
}

template <bool kRef>
void BM_exp(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto x = random_vec(n, -20, 20, 1);
  std::vector<float> y(x.size());
  for (auto _ : state) {
    if constexpr (kRef) ref::exp_f32(x.data(), y.data(), n);
    else exp_f32(x.data(), y.data(), n);
    benchmark::DoNotOptimize(y.data());
  }
  set_bytes(state, n, 2);
}

// One token's Q (9 heads) and K (3 heads) of SmolLM2-135M, angles computed once.
template <bool kRef>
void BM_rope_token(benchmark::State& state) {
  RopeConfig cfg;
  cfg.head_dim = 64;
  cfg.n_rot = 64;
  cfg.freq_base = 100000.0f;
  cfg.mode = RopeMode::kNeox;
  const Rope rope(cfg);
  auto q = random_vec(9 * 64, -1, 1, 1), k = random_vec(3 * 64, -1, 1, 2);
  float c[32], s[32];
  int64_t pos = 0;
  for (auto _ : state) {
    rope.angles(pos++ & 4095, c, s);
    if constexpr (kRef) {
      ref::rope_rotate(q.data(), 9, 64, 64, cfg.mode, c, s);
      ref::rope_rotate(k.data(), 3, 64, 64, cfg.mode, c, s);
    } else {
      rope.apply(q.data(), 9, c, s);
      rope.apply(k.data(), 3, c, s);
    }
    benchmark::DoNotOptimize(q.data());
  }
  set_bytes(state, 12 * 64, 2);
}

using BenchFn = void (*)(benchmark::State&);

void register_pair(const char* name, BenchFn fast, BenchFn reference) {
  for (int64_t n : {int64_t{576}, int64_t{1536}, int64_t{1} << 20}) {
    benchmark::RegisterBenchmark(name, fast)->Arg(n);
    benchmark::RegisterBenchmark((std::string(name) + "_ref").c_str(), reference)->Arg(n);
  }
}

int register_all() {
  register_pair("BM_rms_norm", BM_rms_norm<false>, BM_rms_norm<true>);
  register_pair("BM_swiglu", BM_swiglu<false>, BM_swiglu<true>);
  register_pair("BM_gelu", BM_gelu<false>, BM_gelu<true>);
  register_pair("BM_softmax", BM_softmax<false>, BM_softmax<true>);
  register_pair("BM_add", BM_add<false>, BM_add<true>);
  register_pair("BM_dot", BM_dot<false>, BM_dot<true>);
  register_pair("BM_exp", BM_exp<false>, BM_exp<true>);
  benchmark::RegisterBenchmark("BM_rope_token", BM_rope_token<false>);
  benchmark::RegisterBenchmark("BM_rope_token_ref", BM_rope_token<true>);
  return 0;
}

[[maybe_unused]] const int kRegistered = register_all();

}  // namespace
}  // namespace metro::kernels
