#include "sched/step_cost_fit.h"

#include <gtest/gtest.h>

#include <random>

namespace metro::sched {
namespace {

struct Step {
  int prefill = 0, decodes = 0;
  double pairs = 0, ctx = 0;
};

// Steps like a server's: some prompt chunks at varied positions, decodes at varied contexts.
Step random_step(std::mt19937& rng) {
  std::uniform_int_distribution<int> chunk(0, 256), pos(0, 2000), dec(0, 24), ctx(16, 2500);
  Step s;
  const int n_chunks = std::uniform_int_distribution<int>(0, 2)(rng);
  for (int c = 0; c < n_chunks; ++c) {
    const int n = chunk(rng);
    s.prefill += n;
    s.pairs += StepCostModel::pairs(n, pos(rng));
  }
  s.decodes = dec(rng);
  for (int d = 0; d < s.decodes; ++d) s.ctx += ctx(rng);
  return s;
}

double truth(const Step& s, double fixed, double tok, double pair, double key) {
  return fixed + tok * (s.prefill + s.decodes) + pair * s.pairs + key * s.ctx;
}

// n random steps whose time is truth(...) times a normal factor of mean 1 and sd `noise`.
void feed(StepCostFit* f, std::mt19937* rng, int n, double fixed, double tok, double pair, double key,
          double noise = 0.0) {
  std::normal_distribution<double> factor(1.0, noise);
  for (int i = 0; i < n; ++i) {
    const Step s = random_step(*rng);
    const double t = truth(s, fixed, tok, pair, key);
    f->observe(noise > 0.0 ? t * factor(*rng) : t, s.prefill, s.decodes, s.pairs, s.ctx);
  }
}

TEST(StepCostFit, EmptyUntilItHasSteps) {
  StepCostFit f;
  EXPECT_FALSE(f.fit().has_value());
}

// The first steps give a per-token cost alone, every second counted in it: timed, and on
// the safe side for the chunks that follow.
TEST(StepCostFit, FirstStepsGiveAPerTokenCostAlone) {
  StepCostFit f;
  f.observe(0.30, 256, 0, StepCostModel::pairs(256, 0), 0.0);
  auto m = f.fit();
  ASSERT_TRUE(m.has_value());
  EXPECT_DOUBLE_EQ(m->per_prefill_token_s, 0.30 / 256);
  EXPECT_DOUBLE_EQ(m->per_decode_seq_s, m->per_prefill_token_s);
  EXPECT_EQ(m->fixed_s, 0.0);
  EXPECT_EQ(m->per_attention_pair_s, 0.0);
  f.observe(0.02, 0, 4, 0.0, 4 * 300.0);
  m = f.fit();
  ASSERT_TRUE(m.has_value());
  // Through the origin on tokens: (256 x 0.30 + 4 x 0.02) / (256^2 + 4^2).
  EXPECT_NEAR(m->per_prefill_token_s, (256 * 0.30 * 0.995 + 4 * 0.02) / (256.0 * 256 * 0.995 + 16), 1e-12);
  StepCostFit idle;
  idle.observe(0.001, 0, 0, 0.0, 0.0);  // a step with no tokens says nothing per token
  EXPECT_FALSE(idle.fit().has_value());
}

TEST(StepCostFit, RecoversTheCostsOfNoisySteps) {
  StepCostFit f;
  std::mt19937 rng(3);
  feed(&f, &rng, 600, 0.005, 0.001, 1e-6, 3.5e-6, 0.05);
  const auto m = f.fit();
  ASSERT_TRUE(m.has_value());
  EXPECT_NEAR(m->per_prefill_token_s, 0.001, 0.0001);
  EXPECT_NEAR(m->per_decode_seq_s, 0.001, 0.0001);
  EXPECT_NEAR(m->per_attention_pair_s, 1e-6, 1e-7);
  EXPECT_NEAR(m->per_decode_ctx_s, 3.5e-6, 3.5e-7);
  EXPECT_NEAR(m->fixed_s, 0.005, 0.003);
}

// A term the steps do not pay for comes out zero, never negative (a negative attention
// cost would let the scheduler plan unbounded chunks late in a prompt).
TEST(StepCostFit, ATermThatCostsNothingIsZeroNotNegative) {
  StepCostFit f;
  std::mt19937 rng(5);
  feed(&f, &rng, 600, 0.005, 0.001, 0.0, 3e-6, 0.1);
  const auto m = f.fit();
  ASSERT_TRUE(m.has_value());
  EXPECT_GE(m->per_attention_pair_s, 0.0);
  EXPECT_LT(m->per_attention_pair_s, 1e-7);
  EXPECT_NEAR(m->per_decode_ctx_s, 3e-6, 4e-7);
}

// Exponential forgetting: a host that became twice as slow is followed within a few
// hundred steps.
TEST(StepCostFit, FollowsAChangeOfSpeed) {
  StepCostFit f;
  std::mt19937 rng(7);
  feed(&f, &rng, 1000, 0.005, 0.001, 1e-6, 3e-6);
  feed(&f, &rng, 1000, 0.010, 0.002, 2e-6, 6e-6);
  const auto m = f.fit();
  ASSERT_TRUE(m.has_value());
  EXPECT_NEAR(m->per_prefill_token_s, 0.002, 0.0001);
  EXPECT_NEAR(m->per_attention_pair_s, 2e-6, 1e-7);
  EXPECT_NEAR(m->per_decode_ctx_s, 6e-6, 3e-7);
}

// Only decodes, all at one context: tokens and keys cannot be told apart. The fit must
// still predict those steps (whatever split it picks) and stay non-negative.
TEST(StepCostFit, CollinearStepsStillPredict) {
  StepCostFit f;
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> dec(1, 16);
  for (int i = 0; i < 400; ++i) {
    const int d = dec(rng);
    Step s{.prefill = 0, .decodes = d, .pairs = 0, .ctx = 1000.0 * d};
    f.observe(truth(s, 0.004, 0.001, 0.0, 3e-6), s.prefill, s.decodes, s.pairs, s.ctx);
  }
  const auto m = f.fit();
  ASSERT_TRUE(m.has_value());
  EXPECT_GE(m->per_decode_ctx_s, 0.0);
  EXPECT_GE(m->fixed_s, 0.0);
  for (int d : {1, 8, 16}) {
    const double want = 0.004 + d * (0.001 + 3e-3);
    const double got = m->fixed_s + d * m->decode_s(999);
    EXPECT_NEAR(got, want, 0.02 * want) << d << " decodes";
  }
}

}  // namespace
}  // namespace metro::sched
