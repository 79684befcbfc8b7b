#include "engine/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "kernels/ops.h"

namespace metro::engine {
namespace {

std::vector<float> logits_from_probs(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back(static_cast<float>(std::log(x)));
  return l;
}

std::map<int32_t, int> draw_counts(const SamplingParams& sp, const std::vector<float>& logits,
                                   int n, uint64_t seed = 7) {
  Sampler s(sp, seed);
  TokenHistory h;
  SamplerScratch scratch;
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) counts[s.sample(logits, h, scratch).token]++;
  return counts;
}

TEST(Sampling, GreedyTakesArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p, 1);
  TokenHistory h;
  SamplerScratch sc;
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 3.0f, 3.0f, -1.0f}, h, sc).token, 1);
}

TEST(Sampling, DrawFollowsSoftmaxWithinStatisticalBounds) {
  const std::vector<double> probs = {0.5, 0.25, 0.15, 0.1};
  SamplingParams p;  // temperature 1
  const int n = 20000;
  auto counts = draw_counts(p, logits_from_probs(probs), n);
  for (size_t i = 0; i < probs.size(); ++i) {
    const double expect = probs[i] * n;
    const double sd = std::sqrt(n * probs[i] * (1 - probs[i]));
    EXPECT_NEAR(counts[static_cast<int32_t>(i)], expect, 5 * sd) << "token " << i;
  }
}

TEST(Sampling, TemperatureSharpens) {
  const std::vector<double> probs = {0.6, 0.4};
  SamplingParams p;
  p.temperature = 0.5f;  // p^(1/T) renormalised: 0.36/(0.36+0.16) = 0.6923
  const int n = 20000;
  auto counts = draw_counts(p, logits_from_probs(probs), n);
  const double q = 0.36 / 0.52;
  EXPECT_NEAR(counts[0], q * n, 5 * std::sqrt(n * q * (1 - q)));
}

TEST(Sampling, SameSeedSameOutputDifferentSeedDiffers) {
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(std::sin(static_cast<double>(i)));
  SamplingParams p;
  auto run = [&](uint64_t seed) {
    Sampler s(p, seed);
    TokenHistory h;
    SamplerScratch sc;
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) out.push_back(s.sample(l, h, sc).token);
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

// A vocabulary the size of a real model's: the plain draw walks sums of blocks first, so the
// heavy tokens sit in different blocks, at block edges and in the last, partial block, among
// 49,999 light ones (including -inf, which must never be drawn).
TEST(Sampling, PlainDrawOverALargeVocabularyFollowsSoftmax) {
  const size_t n = 50000;
  std::vector<float> l(n);
  for (size_t i = 0; i < n; ++i) l[i] = static_cast<float>(-3.0 + std::sin(static_cast<double>(i)));
  for (size_t i = 7; i < n; i += 997) l[i] = -std::numeric_limits<float>::infinity();
  const std::vector<size_t> heavy = {0, 255, 256, 4097, 30000, 49999};
  for (size_t k = 0; k < heavy.size(); ++k) l[heavy[k]] = 6.0f + 0.5f * static_cast<float>(k);
  double z = 0;
  for (float v : l) z += std::exp(static_cast<double>(v));
  double light = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::find(heavy.begin(), heavy.end(), i) == heavy.end()) light += std::exp(static_cast<double>(l[i]));
  }
  for (float temp : {1.0f, 0.8f}) {
    SCOPED_TRACE(temp);
    SamplingParams p;
    p.temperature = temp;
    std::vector<double> w(n);
    double zt = 0;
    for (size_t i = 0; i < n; ++i) zt += w[i] = std::exp(static_cast<double>(l[i]) / temp);
    const int draws = 10000;
    auto counts = draw_counts(p, l, draws, 11);
    int other = draws;
    for (size_t id : heavy) {
      const double q = w[id] / zt;
      EXPECT_NEAR(counts[static_cast<int32_t>(id)], q * draws, 5 * std::sqrt(draws * q * (1 - q)) + 1) << id;
      other -= counts[static_cast<int32_t>(id)];
    }
    double q_light = 0;
    for (size_t i = 0; i < n; ++i) {
      if (std::find(heavy.begin(), heavy.end(), i) == heavy.end()) q_light += w[i] / zt;
    }
    EXPECT_NEAR(other, q_light * draws, 5 * std::sqrt(draws * q_light * (1 - q_light)) + 1);
    for (const auto& [id, c] : counts) EXPECT_TRUE(std::isfinite(l[static_cast<size_t>(id)])) << id;
  }
  EXPECT_GT(light / z, 0.05);  // the light tokens are drawn often enough to be checked
}

TEST(Sampling, TopKTopPMinPRestrictTheSupport) {
  const auto l = logits_from_probs({0.5, 0.3, 0.15, 0.05});
  SamplingParams k;
  k.top_k = 2;
  for (auto& [id, c] : draw_counts(k, l, 3000)) EXPECT_LT(id, 2);
  SamplingParams tp;
  tp.top_p = 0.7f;  // 0.5 then 0.8 >= 0.7: tokens {0, 1}
  auto c = draw_counts(tp, l, 3000);
  EXPECT_EQ(c.count(2) + c.count(3), 0u);
  EXPECT_GT(c[1], 0);
  SamplingParams tp2;
  tp2.top_p = 0.5f;  // the first token alone reaches 0.5
  EXPECT_EQ(draw_counts(tp2, l, 500).size(), 1u);
  SamplingParams mp;
  mp.min_p = 0.35f;  // keeps p >= 0.175: tokens {0, 1}
  auto m = draw_counts(mp, l, 3000);
  EXPECT_EQ(m.count(2) + m.count(3), 0u);
  EXPECT_GT(m[1], 0);
}

TEST(Sampling, TopPWorksOnAFlatLargeVocabulary) {
  // 5000 equal logits: top_p 0.9 must keep 4500 tokens, which needs the sorted prefix to grow.
  std::vector<float> l(5000, 0.0f);
  SamplingParams p;
  p.top_p = 0.9f;
  auto c = draw_counts(p, l, 3000);
  int max_id = 0;
  for (auto& [id, n] : c) max_id = std::max(max_id, id);
  EXPECT_LT(max_id, 4500);
  EXPECT_GT(max_id, 4000);
}

// top-k, then top-p, then min-p keep exactly what sorting the whole distribution says,
// however the sampler finds its cuts; and a draw takes only kept tokens.
TEST(Sampling, TopKTopPMinPKeepExactlyWhatAFullSortKeeps) {
  const size_t n = 8000;
  std::vector<float> l(n);
  for (size_t i = 0; i < n; ++i) l[i] = static_cast<float>(3.0 * std::sin(0.37 * static_cast<double>(i)));
  l[17] = l[4000] = l[7999] = *std::max_element(l.begin(), l.end());  // ties at the top
  std::vector<float> w(n);
  kernels::softmax_weights(l.data(), w.data(), static_cast<int64_t>(n), 1.0f);
  for (float top_p : {0.3f, 0.6f, 0.95f, 1.0f}) {
    for (int top_k : {0, 1, 40, 5000}) {
      for (float min_p : {0.0f, 0.02f, 0.3f}) {
        SCOPED_TRACE(testing::Message() << "top_p " << top_p << " top_k " << top_k << " min_p " << min_p);
        std::vector<std::pair<float, int32_t>> want;
        for (size_t i = 0; i < n; ++i) want.push_back({w[i], static_cast<int32_t>(i)});
        std::sort(want.begin(), want.end(), [](const auto& a, const auto& b) {
          return a.first > b.first || (a.first == b.first && a.second < b.second);
        });
        if (top_k > 0) want.resize(static_cast<size_t>(top_k));
        if (top_p < 1.0f) {
          double total = 0;
          for (const auto& e : want) total += e.first;
          size_t cut = 0;
          for (double cum = 0; cut < want.size();) {
            cum += want[cut++].first;
            if (cum >= top_p * total) break;
          }
          want.resize(cut);
        }
        std::erase_if(want, [&](const auto& e) { return e.first < min_p; });
        std::sort(want.begin(), want.end(), [](const auto& a, const auto& b) { return a.second < b.second; });

        SamplerScratch sc;
        const size_t keep = keep_candidates(w, top_k, top_p, min_p, sc);
        std::vector<std::pair<float, int32_t>> got(sc.cand.begin(), sc.cand.begin() + static_cast<long>(keep));
        std::sort(got.begin(), got.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
        ASSERT_EQ(got, want);

        if (top_p == 1.0f && top_k == 0 && min_p == 0.0f) continue;  // the plain draw
        std::vector<bool> kept(n, false);
        for (const auto& e : want) kept[static_cast<size_t>(e.second)] = true;
        SamplingParams p;
        p.top_p = top_p;
        p.top_k = top_k;
        p.min_p = min_p;
        for (const auto& [id, c] : draw_counts(p, l, 300, 5)) ASSERT_TRUE(kept[static_cast<size_t>(id)]) << id;
      }
    }
  }
}

TEST(Sampling, LogitBiasForcesAToken) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias = {{3, 100.0f}};
  Sampler s(p, 1);
  TokenHistory h;
  SamplerScratch sc;
  EXPECT_EQ(s.sample(std::vector<float>{5, 4, 3, 2}, h, sc).token, 3);
}

TEST(Sampling, PenaltiesFollowTheirDefinitions) {
  // presence 0.5 + frequency 1.0 x 2 occurrences = -2.5 on token 0: 3.0 -> 0.5 < 1.0
  SamplingParams p;
  p.temperature = 0.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 1.0f;
  Sampler s(p, 1);
  TokenHistory h;
  h.add_generated(0);
  h.add_generated(0);
  SamplerScratch sc;
  EXPECT_EQ(s.sample(std::vector<float>{3.0f, 1.0f}, h, sc).token, 1);
  TokenHistory h1;
  h1.add_generated(0);  // 3.0 - 1.5 = 1.5 > 1.0
  EXPECT_EQ(s.sample(std::vector<float>{3.0f, 1.0f}, h1, sc).token, 0);

  // repetition 2: positive logits halve, negative double; applies to prompt tokens too.
  SamplingParams r;
  r.temperature = 0.0f;
  r.repetition_penalty = 2.0f;
  Sampler rs(r, 1);
  TokenHistory hp;
  std::vector<int32_t> prompt = {0};
  hp.set_prompt(prompt);
  EXPECT_EQ(rs.sample(std::vector<float>{3.0f, 2.0f}, hp, sc).token, 1);  // 1.5 < 2
  EXPECT_EQ(rs.sample(std::vector<float>{3.0f, 1.0f}, hp, sc).token, 0);  // 1.5 > 1
  std::vector<int32_t> prompt2 = {1};
  hp.set_prompt(prompt2);
  EXPECT_EQ(rs.sample(std::vector<float>{-1.5f, -1.0f}, hp, sc).token, 0);  // -1.5 > -2
}

TEST(Sampling, LogprobsAreTheRawLogSoftmax) {
  const std::vector<float> l = {1.0f, 2.0f, 0.5f, -1.0f};
  double z = 0;
  for (float v : l) z += std::exp(static_cast<double>(v));
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = true;
  p.top_logprobs = 3;
  p.logit_bias = {{0, 10.0f}};  // processing must not change reported logprobs
  Sampler s(p, 1);
  TokenHistory h;
  SamplerScratch sc;
  auto r = s.sample(l, h, sc);
  EXPECT_EQ(r.token, 0);
  EXPECT_NEAR(r.logprob, 1.0 - std::log(z), 1e-5);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].id, 1);
  EXPECT_EQ(r.top[1].id, 0);
  EXPECT_EQ(r.top[2].id, 2);
  EXPECT_NEAR(r.top[0].logprob, 2.0 - std::log(z), 1e-5);
}

TEST(SamplingParams, ValidationIsNanSafe) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto bad = [](SamplingParams p) { return !p.validate(100).ok(); };
  SamplingParams ok;
  EXPECT_TRUE(ok.validate(100).ok());
  SamplingParams t;
  t.temperature = nan;
  EXPECT_TRUE(bad(t));
  EXPECT_NE(t.validate(100).message().find("NaN"), std::string::npos);
  t.temperature = inf;
  EXPECT_TRUE(bad(t));
  t.temperature = -1;
  EXPECT_TRUE(bad(t));
  SamplingParams tp;
  tp.top_p = nan;
  EXPECT_TRUE(bad(tp));
  tp.top_p = 0.0f;
  EXPECT_TRUE(bad(tp));
  SamplingParams mp;
  mp.min_p = nan;
  EXPECT_TRUE(bad(mp));
  SamplingParams pp;
  pp.presence_penalty = nan;
  EXPECT_TRUE(bad(pp));
  pp.presence_penalty = 3;
  EXPECT_TRUE(bad(pp));
  SamplingParams fp;
  fp.frequency_penalty = -inf;
  EXPECT_TRUE(bad(fp));
  SamplingParams rp;
  rp.repetition_penalty = 0;
  EXPECT_TRUE(bad(rp));
  SamplingParams lb;
  lb.logit_bias = {{100, 1.0f}};
  EXPECT_TRUE(bad(lb));
  lb.logit_bias = {{1, nan}};
  EXPECT_TRUE(bad(lb));
  SamplingParams tk;
  tk.top_k = -1;
  EXPECT_TRUE(bad(tk));
  SamplingParams tl;
  tl.top_logprobs = 21;
  EXPECT_TRUE(bad(tl));
}


// The chain holds only the steps that do something, in the documented order.
TEST(SamplerChain, StepsFollowTheParameters) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  // step_names() hands back C strings: compare their text, not their addresses.
  std::vector<std::string> names;
  for (const char* n : Sampler(greedy, 1).step_names()) names.emplace_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"greedy"}));
  SamplingParams plain;
  names.clear();
  for (const char* n : Sampler(plain, 1).step_names()) names.emplace_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"softmax", "draw"}));
  SamplingParams all;
  all.logit_bias = {{1, 2.0f}};
  all.repetition_penalty = 1.1f;
  all.frequency_penalty = 0.5f;
  all.top_k = 5;
  names.clear();
  for (const char* n : Sampler(all, 1).step_names()) names.emplace_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"logit_bias", "repetition_penalty", "presence_frequency_penalty",
                                             "softmax", "truncate", "draw"}));
}

// distribution() hands back what the last step draws from: the softmax of the processed
// logits, renormalized over what truncation keeps; a point mass for greedy. It draws nothing.
TEST(SamplerChain, DistributionIsWhatTheDrawSamplesFrom) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.5f, 0.0f, 1.0f};
  TokenHistory h;
  SamplerScratch sc;
  auto softmax = [](std::vector<double> l, double t) {
    double m = *std::max_element(l.begin(), l.end()), sum = 0.0;
    for (double& v : l) sum += (v = std::exp((v - m) / t));
    for (double& v : l) v /= sum;
    return l;
  };
  SamplingParams p;
  p.temperature = 0.7f;
  p.logit_bias = {{2, 3.0f}};  // token 2: -1 + 3 = 2
  Sampler dense(p, 3);
  Distribution d = dense.distribution(logits, h, sc);
  ASSERT_FALSE(d.weights.empty());
  const std::vector<double> want = softmax({0.5, 2.0, 2.0, 1.5, 0.0, 1.0}, 0.7);
  double sum = 0.0;
  for (int32_t id = 0; id < 6; ++id) {
    EXPECT_NEAR(d.prob(id), want[static_cast<size_t>(id)], 1e-6) << id;
    sum += d.prob(id);
  }
  EXPECT_NEAR(sum, 1.0, 1e-9);
  EXPECT_EQ(d.prob(6), 0.0);
  EXPECT_EQ(d.prob(-1), 0.0);

  p.top_k = 3;  // tokens 1, 2, 3 survive
  Sampler top(p, 3);
  d = top.distribution(logits, h, sc);
  ASSERT_EQ(d.candidates.size(), 3u);
  const std::vector<double> kept = softmax({2.0, 2.0, 1.5}, 0.7);
  EXPECT_NEAR(d.prob(1), kept[0], 1e-6);
  EXPECT_NEAR(d.prob(2), kept[1], 1e-6);
  EXPECT_NEAR(d.prob(3), kept[2], 1e-6);
  EXPECT_EQ(d.prob(0), 0.0);
  // Asking for the distribution consumed no randomness: the draws that follow are those of
  // a fresh sampler with the same seed.
  Sampler fresh(p, 3);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(top.sample(logits, h, sc).token, fresh.sample(logits, h, sc).token);

  SamplingParams g;
  g.temperature = 0.0f;
  Sampler greedy(g, 1);
  d = greedy.distribution(logits, h, sc);
  EXPECT_EQ(d.token, 1);
  EXPECT_EQ(d.prob(1), 1.0);
  EXPECT_EQ(d.prob(3), 0.0);
}

}  // namespace
}  // namespace metro::engine
