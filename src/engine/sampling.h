// Sampling: a chain of small steps (SamplerStep) that turns one row of logits into a token.
//
//   logit bias -> repetition / presence / frequency penalties -> temperature
//   -> top-k -> top-p -> min-p -> greedy (temperature 0) or a seeded draw
//
// The chain can also hand back the distribution its last step draws from (Sampler::
// distribution), which speculative decoding's verification of a draft model needs.
//
// Log-probabilities reported to the user are those of the model's raw distribution
// (log-softmax of the unprocessed logits), as vLLM reports them by default.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"

namespace metro::engine {

struct SamplingParams {
  float temperature = 1.0f;   // 0: greedy
  int top_k = 0;              // 0: off
  float top_p = 1.0f;         // 1: off
  float min_p = 0.0f;         // 0: off
  float repetition_penalty = 1.0f;  // over prompt and generated tokens; 1: off
  float presence_penalty = 0.0f;    // over generated tokens
  float frequency_penalty = 0.0f;   // over generated tokens
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;
  bool has_seed = false;      // without a seed the engine draws one
  int top_logprobs = 0;       // alternatives to report per token (0: none)
  bool logprobs = false;      // report the chosen token's log-probability

  // Validates ranges (NaN-safe: every check is written so NaN fails it).
  Status validate(int32_t n_vocab) const;
};

// Tokens a request has seen, for penalties: the prompt's distinct tokens and the counts of
// generated ones (sparse, so thousands of concurrent requests stay cheap).
class TokenHistory {
 public:
  void set_prompt(std::span<const int32_t> prompt);
  void add_generated(int32_t id) { ++generated_[id]; }
  bool in_prompt(int32_t id) const;
  std::span<const int32_t> prompt_tokens() const { return prompt_sorted_; }
  const std::unordered_map<int32_t, int>& generated() const { return generated_; }

 private:
  std::vector<int32_t> prompt_sorted_;  // distinct prompt tokens, sorted
  std::unordered_map<int32_t, int> generated_;
};

struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;                    // of the chosen token (raw distribution)
  std::vector<TokenLogprob> top;           // top_logprobs alternatives, best first
  bool grammar_done = false;               // the request's grammar is complete after it
};

// Softmax weights (in [0, 1]) by bucket: count and mass per quarter of each octave's
// mantissa range, heaviest bucket first (sampling.cpp, weight_bucket).
inline constexpr uint32_t kWeightBuckets = 512;
struct BucketHist {
  std::array<double, kWeightBuckets> mass{};
  std::array<uint32_t, kWeightBuckets> count{};
  double total = 0.0;
  // Replaces the counts with those of weight_at(0 .. n-1).
  template <class Weight>
  void fill(size_t n, Weight weight_at);
  // The first bucket by which the buckets so far hold `want` weights, or that much mass
  // (the last bucket if they never do).
  uint32_t reaching_count(uint32_t want) const;
  uint32_t reaching_mass(double want) const;
};

// Scratch reused across calls (one per engine thread; never shared between threads).
struct SamplerScratch {
  std::vector<float> logits;
  std::vector<float> weights;                   // softmax weights at the temperature
  std::vector<double> block_sums;               // of weights, per kSampleBlock
  std::vector<std::pair<float, int32_t>> cand;  // (value, id)
  BucketHist hist;
};

// Top-k, then top-p, then min-p over softmax weights w (the largest 1, as
// kernels::softmax_weights gives them; top_k 0, top_p 1 and min_p 0 are off): fills
// scratch.cand with (weight, id) pairs and returns how many of its first entries survive,
// in no particular order.
size_t keep_candidates(std::span<const float> w, int top_k, float top_p, float min_p, SamplerScratch& scratch);

// What flows through the sampler chain for one row of logits. Each step leaves it in a more
// processed form: logits (biased, penalized), then weights (softmax at the temperature,
// unnormalized), then candidates (what top-k / top-p / min-p keep), then a token.
struct SamplingState {
  enum class Form : uint8_t { kLogits, kWeights, kCandidates, kToken };

  std::span<const float> raw;     // the model's row (never modified)
  std::span<const float> logits;  // raw, or scratch->logits once a step changed them
  const TokenHistory* history = nullptr;
  SamplerScratch* scratch = nullptr;
  Form form = Form::kLogits;
  size_t n_candidates = 0;  // kCandidates: scratch->cand[0, n_candidates)
  int32_t token = -1;       // kToken

  // Logits a step may change: the first call copies the raw row (a copy costs as much as
  // the rest of a plain draw over a large vocabulary, so only steps that change logits ask).
  std::span<float> mutable_logits();
};

// One step of the sampler chain: reads the state, leaves it more processed. A step that
// draws owns its random state. The chain's last step picks the token.
class SamplerStep {
 public:
  virtual ~SamplerStep() = default;
  virtual const char* name() const = 0;
  virtual void apply(SamplingState& s) = 0;
};

// The distribution a chain draws its token from: what every step but the last produced.
// One of three forms: a single token (greedy), dense weights over the vocabulary, or a set
// of candidates; weights are unnormalized (`total` is their sum).
struct Distribution {
  int32_t token = -1;                                     // greedy: this token, probability 1
  std::span<const float> weights;                         // dense, by token id
  std::span<const std::pair<float, int32_t>> candidates;  // (weight, id)
  double total = 0.0;

  // The probability of `id` (0 outside the support).
  double prob(int32_t id) const;
};

class Sampler {
 public:
  // The chain for these parameters, only the steps that do something:
  //   logit_bias -> repetition_penalty -> presence/frequency penalties
  //   -> greedy (temperature 0) | softmax(temperature) -> top-k/top-p/min-p -> draw (seeded)
  Sampler(SamplingParams params, uint64_t seed);

  // Picks a token from one row of raw logits (not modified). `allowed` (a bit per token id,
  // or null for all) restricts the draw: the other tokens' logits become -inf before the
  // chain; the log-probabilities reported stay those of the raw row. At least one token
  // must be allowed.
  SampleResult sample(std::span<const float> logits, const TokenHistory& history, SamplerScratch& scratch,
                      const uint64_t* allowed = nullptr);
  // The processed distribution the next sample() of this row would draw from (every step
  // but the last). Views into `scratch`, valid until its next use. Draws nothing.
  Distribution distribution(std::span<const float> logits, const TokenHistory& history, SamplerScratch& scratch);

  const SamplingParams& params() const { return p_; }
  // The steps, in order (e.g. "logit_bias", "softmax", "truncate", "draw").
  std::vector<const char*> step_names() const;

 private:
  SamplingState run(std::span<const float> logits, const TokenHistory& history, SamplerScratch& scratch,
                    size_t n_steps, const uint64_t* allowed = nullptr);
  SamplingParams p_;
  std::vector<std::unique_ptr<SamplerStep>> chain_;
};

// log-softmax of `logits` at `id` and the top `n` (id, logprob) pairs of the raw row.
float raw_logprob(std::span<const float> logits, int32_t id, float* log_sum_exp_out = nullptr);
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int n);

}  // namespace metro::engine
