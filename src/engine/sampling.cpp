#include "engine/sampling.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <memory>
#include <random>

#include "kernels/ops.h"

namespace metro::engine {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// A plain draw over the whole vocabulary walks block sums first, then one block.
constexpr size_t kSampleBlock = 256;

// Weights in [0, 1] by quarters of each octave's mantissa range, heaviest first: bucket 0
// holds (0.875, 1], the last 0 (and anything below 2^-126). Monotone: a heavier weight
// never has a later bucket.
uint32_t weight_bucket(float w) {
  constexpr uint32_t kOne = 0x3F800000u;  // the bits of 1.0f
  const uint32_t bits = std::bit_cast<uint32_t>(w);
  return bits >= kOne ? 0u : std::min(kWeightBuckets - 1, (kOne - bits) >> 21);
}

// Sum of w[0, n) in double, four chains so the adds do not wait on each other.
double sum_weights(const float* w, size_t n) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a0 += w[i];
    a1 += w[i + 1];
    a2 += w[i + 2];
    a3 += w[i + 3];
  }
  for (; i < n; ++i) a0 += w[i];
  return (a0 + a1) + (a2 + a3);
}

bool in_range(float v, float lo, float hi) { return v >= lo && v <= hi; }  // false for NaN

std::string num(float v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
  return buf;
}

float log_sum_exp(std::span<const float> x) {
  float m = kNegInf;
  for (float v : x) m = std::max(m, v);
  if (!std::isfinite(m)) return m;
  double s = 0.0;
  for (float v : x) s += std::exp(static_cast<double>(v - m));
  return m + static_cast<float>(std::log(s));
}

}  // namespace

template <class Weight>
void BucketHist::fill(size_t n, Weight weight_at) {
  // Four interleaved copies, so that adds to one bucket do not wait on each other.
  std::array<std::array<double, kWeightBuckets>, 4> m{};
  std::array<std::array<uint32_t, kWeightBuckets>, 4> k{};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (size_t j = 0; j < 4; ++j) {
      const float v = weight_at(i + j);
      const uint32_t b = weight_bucket(v);
      m[j][b] += v;
      ++k[j][b];
    }
  }
  for (; i < n; ++i) {
    const float v = weight_at(i);
    m[0][weight_bucket(v)] += v;
    ++k[0][weight_bucket(v)];
  }
  total = 0.0;
  for (uint32_t b = 0; b < kWeightBuckets; ++b) {
    mass[b] = (m[0][b] + m[1][b]) + (m[2][b] + m[3][b]);
    count[b] = k[0][b] + k[1][b] + k[2][b] + k[3][b];
    total += mass[b];
  }
}

uint32_t BucketHist::reaching_count(uint32_t want) const {
  uint32_t b = 0;
  for (uint64_t cum = count[0]; b + 1 < kWeightBuckets && cum < want;) cum += count[++b];
  return b;
}

uint32_t BucketHist::reaching_mass(double want) const {
  uint32_t b = 0;
  for (double cum = mass[0]; b + 1 < kWeightBuckets && cum < want;) cum += mass[++b];
  return b;
}

Status SamplingParams::validate(int32_t n_vocab) const {
  if (!in_range(temperature, 0.0f, 100.0f)) {
    return invalid_argument("temperature must be in [0, 100], got " + num(temperature));
  }
  if (!in_range(top_p, 0.0f, 1.0f) || top_p == 0.0f) {
    return invalid_argument("top_p must be in (0, 1], got " + num(top_p));
  }
  if (!in_range(min_p, 0.0f, 1.0f)) return invalid_argument("min_p must be in [0, 1], got " + num(min_p));
  if (top_k < 0) return invalid_argument("top_k must be >= 0, got " + std::to_string(top_k));
  if (!in_range(repetition_penalty, 0.01f, 100.0f)) {
    return invalid_argument("repetition_penalty must be in (0, 100], got " + num(repetition_penalty));
  }
  if (!in_range(presence_penalty, -2.0f, 2.0f)) {
    return invalid_argument("presence_penalty must be in [-2, 2], got " + num(presence_penalty));
  }
  if (!in_range(frequency_penalty, -2.0f, 2.0f)) {
    return invalid_argument("frequency_penalty must be in [-2, 2], got " + num(frequency_penalty));
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0 || id >= n_vocab) {
      return invalid_argument("logit_bias token id " + std::to_string(id) + " is outside the vocabulary");
    }
    if (!in_range(bias, -100.0f, 100.0f)) {
      return invalid_argument("logit_bias values must be in [-100, 100], got " + num(bias));
    }
  }
  if (top_logprobs < 0 || top_logprobs > 20) {
    return invalid_argument("top_logprobs must be in [0, 20], got " + std::to_string(top_logprobs));
  }
  return {};
}

void TokenHistory::set_prompt(std::span<const int32_t> prompt) {
  prompt_sorted_.assign(prompt.begin(), prompt.end());
  std::sort(prompt_sorted_.begin(), prompt_sorted_.end());
  prompt_sorted_.erase(std::unique(prompt_sorted_.begin(), prompt_sorted_.end()), prompt_sorted_.end());
}

bool TokenHistory::in_prompt(int32_t id) const {
  return std::binary_search(prompt_sorted_.begin(), prompt_sorted_.end(), id);
}

float raw_logprob(std::span<const float> logits, int32_t id, float* lse_out) {
  const float lse = log_sum_exp(logits);
  if (lse_out) *lse_out = lse;
  return logits[static_cast<size_t>(id)] - lse;
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int n) {
  std::vector<TokenLogprob> out;
  if (n <= 0) return out;
  const float lse = log_sum_exp(logits);
  std::vector<std::pair<float, int32_t>> c(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) c[i] = {logits[i], static_cast<int32_t>(i)};
  const size_t k = std::min(c.size(), static_cast<size_t>(n));
  std::partial_sort(c.begin(), c.begin() + static_cast<long>(k), c.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  for (size_t i = 0; i < k; ++i) out.push_back({c[i].second, c[i].first - lse});
  return out;
}

size_t keep_candidates(std::span<const float> w, int top_k, float top_p, float min_p, SamplerScratch& s) {
  // Only tokens that can survive top-k, top-p and min-p become (weight, id) candidates:
  // counts and mass per weight bucket say which buckets can hold them.
  const size_t n = w.size();
  const bool top_k_on = top_k > 0 && static_cast<size_t>(top_k) < n;
  const bool top_p_on = top_p < 1.0f;
  BucketHist& h = s.hist;
  if (top_k_on || top_p_on) h.fill(n, [&](size_t i) { return w[i]; });
  uint32_t limit = kWeightBuckets - 1;  // the last bucket that can hold a candidate
  if (top_k_on) {
    limit = h.reaching_count(static_cast<uint32_t>(top_k));
  } else if (top_p_on) {
    limit = h.reaching_mass(top_p * h.total);
  }
  // Weights >= min_p lie in buckets up to min_p's. (Not with top-k and top-p together:
  // top-p's mass is then that of all top-k survivors, so they must all be candidates.)
  if (min_p > 0.0f && !(top_k_on && top_p_on)) limit = std::min(limit, weight_bucket(min_p));
  auto& c = s.cand;
  c.clear();
  for (size_t i = 0; i < n; ++i) {
    if (weight_bucket(w[i]) <= limit) c.push_back({w[i], static_cast<int32_t>(i)});
  }
  auto by_weight = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = c.size();
  if (top_k_on && keep > static_cast<size_t>(top_k)) {
    keep = static_cast<size_t>(top_k);
    std::nth_element(c.begin(), c.begin() + static_cast<long>(keep - 1), c.end(), by_weight);
  }
  // top-p: the smallest set of the heaviest candidates holding top_p of the mass (of the
  // top-k survivors, or of every token). Mass per bucket says which bucket the cut falls
  // in; only that bucket is sorted, so a flat distribution costs a few passes instead of a
  // sort of the whole vocabulary.
  if (top_p_on) {
    // Without top-k, h already counts every token and the candidates hold all of the
    // buckets up to the cut; with it, count the top-k survivors.
    if (top_k_on) h.fill(keep, [&](size_t i) { return c[i].first; });
    const double target = top_p * h.total;
    const uint32_t cut = h.reaching_mass(target);
    double before = 0.0;  // mass of the buckets above the cut's
    for (uint32_t b = 0; b < cut; ++b) before += h.mass[b];
    const auto first = c.begin(), last = c.begin() + static_cast<long>(keep);
    const auto mid = std::partition(first, last, [&](const auto& e) { return weight_bucket(e.first) < cut; });
    const auto end = std::partition(mid, last, [&](const auto& e) { return weight_bucket(e.first) == cut; });
    std::sort(mid, end, by_weight);
    double cum = before;
    auto it = mid;
    while (it != end) {
      cum += (it++)->first;
      if (cum >= target) break;
    }
    keep = std::max<size_t>(1, static_cast<size_t>(it - first));
  }
  // min-p: drop candidates below min_p x the best one's probability (the best has weight
  // 1: neither top-k nor top-p removes it).
  if (min_p > 0.0f) {
    size_t m = 0;
    for (size_t j = 0; j < keep; ++j) {
      if (c[j].first >= min_p) c[m++] = c[j];
    }
    keep = std::max<size_t>(m, 1);
  }
  return keep;
}

std::span<float> SamplingState::mutable_logits() {
  if (logits.data() != scratch->logits.data() || logits.size() != scratch->logits.size()) {
    scratch->logits.assign(raw.begin(), raw.end());
    logits = scratch->logits;
  }
  return scratch->logits;
}

double Distribution::prob(int32_t id) const {
  if (token >= 0) return id == token ? 1.0 : 0.0;
  if (!(total > 0.0) || id < 0) return 0.0;
  if (!weights.empty()) return static_cast<size_t>(id) < weights.size() ? weights[static_cast<size_t>(id)] / total : 0.0;
  for (const auto& [w, c] : candidates) {
    if (c == id) return w / total;
  }
  return 0.0;
}

namespace {

class LogitBias final : public SamplerStep {
 public:
  explicit LogitBias(std::vector<std::pair<int32_t, float>> bias) : bias_(std::move(bias)) {}
  const char* name() const override { return "logit_bias"; }
  void apply(SamplingState& s) override {
    std::span<float> l = s.mutable_logits();
    for (const auto& [id, b] : bias_) l[static_cast<size_t>(id)] += b;
  }

 private:
  std::vector<std::pair<int32_t, float>> bias_;
};

// Multiplicative (CTRL-style) over prompt and generated tokens.
class RepetitionPenalty final : public SamplerStep {
 public:
  explicit RepetitionPenalty(float penalty) : penalty_(penalty) {}
  const char* name() const override { return "repetition_penalty"; }
  void apply(SamplingState& s) override {
    std::span<float> l = s.mutable_logits();
    auto penalize = [&](int32_t id) {
      float& v = l[static_cast<size_t>(id)];
      v = v > 0 ? v / penalty_ : v * penalty_;
    };
    for (const auto& [id, count] : s.history->generated()) {
      if (!s.history->in_prompt(id)) penalize(id);
    }
    for (int32_t id : s.history->prompt_tokens()) {
      if (id >= 0 && static_cast<size_t>(id) < l.size()) penalize(id);
    }
  }

 private:
  float penalty_;
};

// Additive (OpenAI-style) over generated tokens only.
class PresenceFrequencyPenalty final : public SamplerStep {
 public:
  PresenceFrequencyPenalty(float presence, float frequency) : presence_(presence), frequency_(frequency) {}
  const char* name() const override { return "presence_frequency_penalty"; }
  void apply(SamplingState& s) override {
    std::span<float> l = s.mutable_logits();
    for (const auto& [id, count] : s.history->generated()) {
      l[static_cast<size_t>(id)] -= presence_ + frequency_ * static_cast<float>(count);
    }
  }

 private:
  float presence_, frequency_;
};

// Temperature 0: the first largest logit (deterministic on ties).
class Greedy final : public SamplerStep {
 public:
  const char* name() const override { return "greedy"; }
  void apply(SamplingState& s) override {
    s.token = static_cast<int32_t>(kernels::argmax(s.logits.data(), static_cast<int64_t>(s.logits.size())));
    s.form = SamplingState::Form::kToken;
  }
};

// Unnormalized probabilities exp((l - max) / T), so later steps work on weights without
// recomputing exponentials.
class Softmax final : public SamplerStep {
 public:
  explicit Softmax(float temperature) : inv_t_(1.0f / temperature) {}
  const char* name() const override { return "softmax"; }
  void apply(SamplingState& s) override {
    std::vector<float>& w = s.scratch->weights;
    w.resize(s.logits.size());
    kernels::softmax_weights(s.logits.data(), w.data(), static_cast<int64_t>(w.size()), inv_t_);
    s.form = SamplingState::Form::kWeights;
  }

 private:
  float inv_t_;
};

// Top-k, then top-p, then min-p (keep_candidates).
class Truncate final : public SamplerStep {
 public:
  Truncate(int top_k, float top_p, float min_p) : top_k_(top_k), top_p_(top_p), min_p_(min_p) {}
  const char* name() const override { return "truncate"; }
  void apply(SamplingState& s) override {
    s.n_candidates = keep_candidates(s.scratch->weights, top_k_, top_p_, min_p_, *s.scratch);
    s.form = SamplingState::Form::kCandidates;
  }

 private:
  int top_k_;
  float top_p_, min_p_;
};

// A seeded draw over weights (through block sums: one pass over the blocks, then one
// block) or over the candidates left.
class Draw final : public SamplerStep {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}
  const char* name() const override { return "draw"; }
  void apply(SamplingState& s) override {
    s.token = s.form == SamplingState::Form::kCandidates ? draw_kept(s) : draw_plain(*s.scratch);
    s.form = SamplingState::Form::kToken;
  }

 private:
  int32_t draw_plain(SamplerScratch& s) {
    int32_t chosen = -1;
    const float* w = s.weights.data();
    const size_t n = s.weights.size();
    const size_t n_blocks = (n + kSampleBlock - 1) / kSampleBlock;
    s.block_sums.resize(n_blocks);
    double sum = 0.0;
    for (size_t b = 0; b < n_blocks; ++b) {
      const size_t begin = b * kSampleBlock;
      s.block_sums[b] = sum_weights(w + begin, std::min(kSampleBlock, n - begin));
      sum += s.block_sums[b];
    }
    std::uniform_real_distribution<double> u(0.0, sum);
    double r = u(rng_);
    size_t b = 0;
    while (b + 1 < n_blocks && r >= s.block_sums[b]) r -= s.block_sums[b++];
    // Rounding can leave r above the weights left in the block: then its last token of any
    // weight wins, or, in a block of none, the last such token of all.
    const size_t end = std::min(n, (b + 1) * kSampleBlock);
    for (size_t j = b * kSampleBlock; j < end; ++j) {
      if (w[j] <= 0.0f) continue;
      chosen = static_cast<int32_t>(j);
      r -= w[j];
      if (r < 0.0) break;
    }
    for (size_t j = n; chosen < 0 && j-- > 0;) {
      if (w[j] > 0.0f) chosen = static_cast<int32_t>(j);
    }
    return chosen;
  }

  int32_t draw_kept(const SamplingState& st) {
    const auto& c = st.scratch->cand;
    const size_t keep = st.n_candidates;
    double sum = 0.0;
    for (size_t j = 0; j < keep; ++j) sum += c[j].first;
    std::uniform_real_distribution<double> u(0.0, sum);
    double r = u(rng_);
    for (size_t j = 0; j < keep; ++j) {
      r -= c[j].first;
      if (r <= 0.0) return c[j].second;
    }
    return c[keep - 1].second;  // rounding left r above the last weight
  }

  std::mt19937_64 rng_;
};

}  // namespace

Sampler::Sampler(SamplingParams params, uint64_t seed) : p_(std::move(params)) {
  if (!p_.logit_bias.empty()) chain_.push_back(std::make_unique<LogitBias>(p_.logit_bias));
  if (p_.repetition_penalty != 1.0f) chain_.push_back(std::make_unique<RepetitionPenalty>(p_.repetition_penalty));
  if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    chain_.push_back(std::make_unique<PresenceFrequencyPenalty>(p_.presence_penalty, p_.frequency_penalty));
  }
  if (p_.temperature == 0.0f) {
    chain_.push_back(std::make_unique<Greedy>());
    return;
  }
  chain_.push_back(std::make_unique<Softmax>(p_.temperature));
  if (p_.top_k != 0 || p_.top_p < 1.0f || p_.min_p > 0.0f) {
    chain_.push_back(std::make_unique<Truncate>(p_.top_k, p_.top_p, p_.min_p));
  }
  chain_.push_back(std::make_unique<Draw>(seed));
}

std::vector<const char*> Sampler::step_names() const {
  std::vector<const char*> names;
  for (const auto& s : chain_) names.push_back(s->name());
  return names;
}

SamplingState Sampler::run(std::span<const float> raw, const TokenHistory& history, SamplerScratch& scratch,
                           size_t n_steps, const uint64_t* allowed) {
  SamplingState st;
  st.raw = raw;
  st.logits = raw;
  st.history = &history;
  st.scratch = &scratch;
  if (allowed != nullptr) {
    std::span<float> l = st.mutable_logits();
    const size_t n = l.size();
    for (size_t w = 0; w * 64 < n; ++w) {
      const uint64_t bits = allowed[w];
      if (bits == ~uint64_t{0}) continue;
      const size_t end = std::min(n, w * 64 + 64);
      for (size_t i = w * 64; i < end; ++i) {
        if (!((bits >> (i & 63)) & 1u)) l[i] = -std::numeric_limits<float>::infinity();
      }
    }
  }
  for (size_t i = 0; i < n_steps; ++i) chain_[i]->apply(st);
  return st;
}

SampleResult Sampler::sample(std::span<const float> raw, const TokenHistory& history, SamplerScratch& scratch,
                             const uint64_t* allowed) {
  const SamplingState st = run(raw, history, scratch, chain_.size(), allowed);
  SampleResult res;
  res.token = st.token;
  if (allowed != nullptr && (res.token < 0 || !((allowed[static_cast<size_t>(res.token) >> 6] >>
                                                 (static_cast<unsigned>(res.token) & 63)) & 1u))) {
    // A masked token's weight underflows to zero or a subnormal: should one be drawn, the
    // most likely allowed token is taken instead.
    int32_t pick = -1;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (((allowed[i >> 6] >> (i & 63)) & 1u) && (pick < 0 || raw[i] > raw[static_cast<size_t>(pick)])) {
        pick = static_cast<int32_t>(i);
      }
    }
    res.token = pick;
  }
  if (p_.logprobs || p_.top_logprobs > 0) {
    res.logprob = raw_logprob(raw, res.token);
    res.top = top_logprobs(raw, p_.top_logprobs);
  }
  return res;
}

Distribution Sampler::distribution(std::span<const float> raw, const TokenHistory& history,
                                   SamplerScratch& scratch) {
  Distribution d;
  if (p_.temperature == 0.0f) {  // greedy's "draw" is deterministic: run it
    d.token = run(raw, history, scratch, chain_.size()).token;
    return d;
  }
  const SamplingState st = run(raw, history, scratch, chain_.size() - 1);
  if (st.form == SamplingState::Form::kCandidates) {
    d.candidates = std::span<const std::pair<float, int32_t>>(scratch.cand.data(), st.n_candidates);
    for (const auto& [w, id] : d.candidates) d.total += w;
  } else {
    d.weights = scratch.weights;
    d.total = sum_weights(scratch.weights.data(), scratch.weights.size());
  }
  return d;
}

}  // namespace metro::engine
