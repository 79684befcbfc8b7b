#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace metro::engine {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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

Sampler::Sampler(SamplingParams params, uint64_t seed) : p_(std::move(params)), rng_(seed) {}

SampleResult Sampler::sample(std::span<const float> raw, const TokenHistory& history,
                             SamplerScratch& s) {
  SampleResult res;
  const size_t n = raw.size();
  s.logits.assign(raw.begin(), raw.end());
  std::vector<float>& l = s.logits;

  // 1. logit bias
  for (const auto& [id, bias] : p_.logit_bias) l[static_cast<size_t>(id)] += bias;

  // 2. penalties. Repetition (multiplicative, CTRL-style) over prompt and generated tokens;
  //    presence and frequency (additive, OpenAI-style) over generated tokens only.
  if (p_.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t id) {
      float& v = l[static_cast<size_t>(id)];
      v = v > 0 ? v / p_.repetition_penalty : v * p_.repetition_penalty;
    };
    for (const auto& [id, count] : history.generated()) {
      if (!history.in_prompt(id)) penalize(id);
    }
    for (int32_t id : history.prompt_tokens()) {
      if (id >= 0 && static_cast<size_t>(id) < n) penalize(id);
    }
  }
  if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    for (const auto& [id, count] : history.generated()) {
      l[static_cast<size_t>(id)] -= p_.presence_penalty + p_.frequency_penalty * static_cast<float>(count);
    }
  }

  // 3. greedy: argmax (first index on ties, deterministic)
  int32_t chosen = -1;
  if (p_.temperature == 0.0f) {
    chosen = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  } else {
    // 4. temperature: candidates carry unnormalised probabilities exp((l - max) / T), so
    //    every later step works on weights without recomputing exponentials.
    const float inv_t = 1.0f / p_.temperature;
    const float maxl = *std::max_element(l.begin(), l.end());
    auto& c = s.cand;
    c.resize(n);
    for (size_t i = 0; i < n; ++i) {
      c[i] = {std::exp((l[i] - maxl) * inv_t), static_cast<int32_t>(i)};
    }
    auto by_weight = [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    size_t keep = n;
    if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
      keep = static_cast<size_t>(p_.top_k);
      std::nth_element(c.begin(), c.begin() + static_cast<long>(keep - 1), c.end(), by_weight);
    }
    // 5. top-p: sort a prefix, growing it only when the mass is spread thinly.
    if (p_.top_p < 1.0f) {
      double total = 0.0;
      for (size_t i = 0; i < keep; ++i) total += c[i].first;
      const double target = p_.top_p * total;
      // Sorts c[from, to) into place as the best of c[from, keep): select, then sort.
      auto sort_prefix = [&](size_t from, size_t to) {
        auto b = c.begin() + static_cast<long>(from), m = c.begin() + static_cast<long>(to);
        if (to < keep) std::nth_element(b, m, c.begin() + static_cast<long>(keep), by_weight);
        std::sort(b, m, by_weight);
      };
      size_t sorted = std::min(keep, static_cast<size_t>(256));
      sort_prefix(0, sorted);
      double cum = 0.0;
      size_t i = 0;
      for (;;) {
        for (; i < sorted; ++i) {
          cum += c[i].first;
          if (cum >= target) break;
        }
        if (i < sorted || sorted == keep) break;
        const size_t grow = std::min(keep, sorted * 8);
        sort_prefix(sorted, grow);
        sorted = grow;
      }
      keep = std::min(keep, i + 1);
    }
    // 6. min-p: drop candidates below min_p x the best one's probability (the best has
    //    weight 1 unless top-k removed nothing above it, which it cannot).
    if (p_.min_p > 0.0f) {
      size_t m = 0;
      for (size_t j = 0; j < keep; ++j) {
        if (c[j].first >= p_.min_p) c[m++] = c[j];
      }
      keep = std::max<size_t>(m, 1);
    }
    // 7. seeded draw over what is left
    double sum = 0.0;
    for (size_t j = 0; j < keep; ++j) sum += c[j].first;
    std::uniform_real_distribution<double> u(0.0, sum);
    double r = u(rng_);
    chosen = c[keep - 1].second;
    for (size_t j = 0; j < keep; ++j) {
      r -= c[j].first;
      if (r <= 0.0) {
        chosen = c[j].second;
        break;
      }
    }
  }
  res.token = chosen;
  if (p_.logprobs || p_.top_logprobs > 0) {
    res.logprob = raw_logprob(raw, chosen);
    res.top = top_logprobs(raw, p_.top_logprobs);
  }
  return res;
}

}  // namespace metro::engine
