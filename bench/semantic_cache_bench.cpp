// The semantic cache's index at its default size: a lookup (and an insert) among N entries
// of one namespace, 384-dimensional (all-MiniLM-L6-v2's width), as `metro serve
// --semantic-cache` runs them per opted-in request (docs/benchmarks.md, "Semantic cache").
// The embedding itself is not in this figure; the server run in bench/semantic_cache.py has
// both.
#include <benchmark/benchmark.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "cache/semantic_cache.h"

namespace metro::cache {
namespace {

constexpr int kDim = 384;

std::vector<float> random_unit(std::mt19937& rng) {
  std::normal_distribution<float> d;
  std::vector<float> v(kDim);
  double n = 0.0;
  for (float& x : v) {
    x = d(rng);
    n += static_cast<double>(x) * x;
  }
  for (float& x : v) x = static_cast<float>(x / std::sqrt(n));
  return v;
}

std::shared_ptr<const CachedResponse> answer() {
  auto r = std::make_shared<CachedResponse>();
  r->text = "an answer of a few dozen bytes, as a short reply is";
  r->events.resize(3);
  return r;
}

// A cache of n entries in one namespace, built once per size (building 100,000 takes a
// while; the benchmark library calls a benchmark several times).
SemanticCache& filled(int64_t n) {
  static std::map<int64_t, std::unique_ptr<SemanticCache>> made;
  auto& sc = made[n];
  if (!sc) {
    SemanticCacheConfig cfg;
    cfg.dim = kDim;
    cfg.max_entries = static_cast<size_t>(n);
    sc = std::make_unique<SemanticCache>(cfg);
    std::mt19937 rng(1);
    const auto resp = answer();
    for (int64_t i = 0; i < n; ++i) sc->insert(1, random_unit(rng), resp, 0.0);
  }
  return *sc;
}

// Arg: entries in the namespace. Looks up fresh random vectors (misses: the whole candidate
// search runs).
void BM_semantic_lookup(benchmark::State& state) {
  SemanticCache& sc = filled(state.range(0));
  std::mt19937 rng(3);
  std::vector<std::vector<float>> queries;
  for (int i = 0; i < 256; ++i) queries.push_back(random_unit(rng));
  size_t q = 0;
  for (auto _ : state) {
    Lookup l = sc.lookup(1, queries[q++ % queries.size()], 1.0);
    benchmark::DoNotOptimize(l);
  }
  state.counters["entries"] = static_cast<double>(sc.stats().entries);
  state.counters["MiB"] = static_cast<double>(sc.stats().bytes) / (1 << 20);
}
BENCHMARK(BM_semantic_lookup)->Arg(1000)->Arg(100000)->Unit(benchmark::kMicrosecond)->Iterations(2000);

// Insert into a namespace already holding Arg entries (at the size bound: each insert
// evicts the least recently used).
void BM_semantic_insert(benchmark::State& state) {
  SemanticCache& sc = filled(state.range(0));
  std::mt19937 rng(2);
  const auto resp = answer();
  std::vector<std::vector<float>> vs;
  for (int i = 0; i < 256; ++i) vs.push_back(random_unit(rng));
  size_t k = 0;
  for (auto _ : state) sc.insert(1, vs[k++ % vs.size()], resp, 2.0);
}
BENCHMARK(BM_semantic_insert)->Arg(100000)->Unit(benchmark::kMicrosecond)->Iterations(500);

}  // namespace
}  // namespace metro::cache
