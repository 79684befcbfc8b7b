// The sampler on one row of logits the size of SmolLM2's vocabulary (49,152), as the engine
// calls it once per generated token after each step (docs/benchmarks.md, "Sampling").
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/sampling.h"

namespace metro::engine {
namespace {

// A Gaussian floor (sd 2) under 20 candidates from `head` down in steps of 0.5. With a head of
// 16 the candidates hold 96% of the mass (a confident step); with 12, 31% (a flat one, where
// top_p 0.9 reaches deep into the floor).
std::vector<float> model_like_logits(size_t n, float head) {
  std::mt19937 rng(3);
  std::normal_distribution<float> floor(0.0f, 2.0f);
  std::vector<float> l(n);
  for (float& v : l) v = floor(rng);
  for (size_t i = 0; i < 20; ++i) l[(i * 7919) % n] = head - 0.5f * static_cast<float>(i);
  return l;
}

// Args: mode 0 greedy, 1 temperature 1 (the API default), 2 top_p 0.9, 3 top_k 40,
// 4 temperature 0.7 + repetition penalty 1.1 over a 512-token prompt, 5 top_p 0.9 on a flat
// step; all but 5 on a confident step.
void BM_sample(benchmark::State& state) {
  const size_t n = 49152;
  const auto logits = model_like_logits(n, state.range(0) == 5 ? 12.0f : 16.0f);
  SamplingParams p;
  TokenHistory h;
  std::vector<int32_t> prompt(512);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 977) % n);
  switch (state.range(0)) {
    case 0: p.temperature = 0.0f; break;
    case 1: break;
    case 2: p.top_p = 0.9f; break;
    case 3: p.top_k = 40; break;
    case 5: p.top_p = 0.9f; break;
    default:
      p.temperature = 0.7f;
      p.repetition_penalty = 1.1f;
      h.set_prompt(prompt);
      break;
  }
  Sampler s(p, 1);
  SamplerScratch scratch;
  for (auto _ : state) benchmark::DoNotOptimize(s.sample(logits, h, scratch).token);
}
BENCHMARK(BM_sample)->ArgName("mode")->DenseRange(0, 5)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace metro::engine
