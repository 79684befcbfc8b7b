// Precision tiers in the engine: each tier serves exactly what a one-tier engine of its
// model serves (greedy tokens, embeddings), pins by class, kind and request field hold in
// steps that mix both tiers (two passes over one KV arena), every output says which tiers
// made it, and the quality monitor rolls a damaged low tier back on a live engine within a
// bounded number of sampled requests.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "base/clock.h"
#include "base/fp16.h"
#include "engine/engine.h"
#include "engine_test_util.h"
#include "gguf/gguf.h"
#include "model/requantize.h"
#include "support/synthetic_model.h"

namespace metro::engine {
namespace {

using adaptive::Tier;
using adaptive::TierPolicy;
using testing::collect;
using testing::default_model;
using testing::Generation;
using testing::greedy_request;

constexpr uint8_t kHighBit = 1u << static_cast<int>(Tier::kHigh);
constexpr uint8_t kLowBit = 1u << static_cast<int>(Tier::kLow);

// The default model requantized in memory; `damage` may edit the bytes first.
std::shared_ptr<const model::Model> derived(kernels::DType type,
                                            const std::function<void(std::vector<uint8_t>&, const gguf::File&)>& damage = {}) {
  model::QuantPlan plan;
  plan.type = type;
  auto bytes = model::requantize(default_model().model->file(), plan);
  EXPECT_TRUE(bytes.ok()) << bytes.status().to_string();
  if (!bytes.ok()) return nullptr;
  if (damage) {
    auto f = gguf::File::parse(*bytes);
    EXPECT_TRUE(f.ok());
    if (!f.ok()) return nullptr;
    damage(*bytes, *f);
  }
  auto file = gguf::File::copy_of(*bytes);
  EXPECT_TRUE(file.ok());
  if (!file.ok()) return nullptr;
  auto m = model::Model::from_file(std::move(*file));
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return nullptr;
  return std::shared_ptr<const model::Model>(std::move(*m));
}

const std::shared_ptr<const model::Model>& low_q4_0() {
  static const std::shared_ptr<const model::Model> m = derived(kernels::DType::kQ4_0);
  return m;
}

EngineConfig small_config() {
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.ctx_total = 4096;
  return cfg;
}

std::unique_ptr<Engine> engine_of(std::shared_ptr<const model::Model> m, EngineConfig cfg) {
  auto e = Engine::create(std::move(m), *default_model().tokenizer, cfg);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(*e) : nullptr;
}

std::unique_ptr<Engine> tiered(TierPolicy policy, std::shared_ptr<const model::Model> low, int shadow_every = 0) {
  EngineConfig cfg = small_config();
  cfg.low_tier = std::move(low);
  cfg.tier_control.policy = policy;
  cfg.shadow.every = shadow_every;
  return engine_of(default_model().model, cfg);
}

std::vector<int32_t> prompt(const char* text) { return default_model().tokenizer->encode(text, true, false); }

Request embed_request(const char* text) {
  Request r;
  r.kind = RequestKind::kEmbed;
  r.prompt = prompt(text);
  return r;
}

TEST(Tiers, EachTierServesExactlyWhatItsModelServesAloneInMixedSteps) {
  ASSERT_NE(default_model().model, nullptr);
  ASSERT_NE(low_q4_0(), nullptr);
  auto high_only = engine_of(default_model().model, small_config());
  auto low_only = engine_of(low_q4_0(), small_config());
  auto eng = tiered(TierPolicy::kLow, low_q4_0());
  ASSERT_TRUE(high_only && low_only && eng);

  const Request standard = greedy_request(
      prompt("The history of the railway begins in the early nineteenth century, when engineers in the north of "
             "England first ran steam locomotives on iron rails between the coal mines and the"),
      24);
  Request realtime = greedy_request(prompt("Write a short poem about the sea."), 24);
  realtime.sla_class = SlaClass::kRealtime;
  Request pinned_high = greedy_request(prompt("List three prime numbers:"), 24);
  pinned_high.tier = Tier::kHigh;
  Request embed_high = embed_request("A sentence to embed with the high tier.");
  Request embed_low = embed_request("Another sentence, pinned to the low tier.");
  embed_low.tier = Tier::kLow;

  const Generation want_standard = collect(*low_only->submit(standard));
  const Generation want_realtime = collect(*high_only->submit(realtime));
  const Generation want_pinned = collect(*high_only->submit(pinned_high));
  const Generation want_embed_high = collect(*high_only->submit(embed_high));
  const Generation want_embed_low = collect(*low_only->submit(embed_low));
  // The two tiers disagree on this text (else the test could not tell them apart).
  EXPECT_NE(collect(*high_only->submit(standard)).tokens, want_standard.tokens);

  // Together: every step holds requests of both tiers.
  auto hs = eng->submit_all({standard, realtime, pinned_high, embed_high, embed_low});
  ASSERT_EQ(hs.size(), 5u);
  for (const auto& h : hs) ASSERT_TRUE(h.ok());
  const Generation got_standard = collect(*hs[0]), got_realtime = collect(*hs[1]), got_pinned = collect(*hs[2]);
  const Generation got_embed_high = collect(*hs[3]), got_embed_low = collect(*hs[4]);
  EXPECT_EQ(got_standard.tokens, want_standard.tokens);
  EXPECT_EQ(got_realtime.tokens, want_realtime.tokens);
  EXPECT_EQ(got_pinned.tokens, want_pinned.tokens);
  EXPECT_EQ(got_standard.usage.tiers, kLowBit);
  EXPECT_EQ(got_realtime.usage.tiers, kHighBit);
  EXPECT_EQ(got_pinned.usage.tiers, kHighBit);
  ASSERT_EQ(got_embed_high.embedding.size(), want_embed_high.embedding.size());
  ASSERT_EQ(got_embed_low.embedding.size(), want_embed_low.embedding.size());
  for (size_t i = 0; i < want_embed_high.embedding.size(); ++i) {
    EXPECT_NEAR(got_embed_high.embedding[i], want_embed_high.embedding[i], 1e-4f) << i;
    EXPECT_NEAR(got_embed_low.embedding[i], want_embed_low.embedding[i], 1e-4f) << i;
  }
  // The prefix cache holds the low tier's blocks of `standard` now; the same prompt pinned to
  // the high tier must not reuse them (KV depends on the weights).
  Request standard_high = standard;
  standard_high.tier = Tier::kHigh;
  const Generation again = collect(*eng->submit(standard_high));
  EXPECT_EQ(again.tokens, collect(*high_only->submit(standard)).tokens);
  EXPECT_EQ(again.usage.tiers, kHighBit);
  // And the low tier finds its own blocks.
  const Generation low_again = collect(*eng->submit(standard));
  EXPECT_EQ(low_again.tokens, want_standard.tokens);
  EXPECT_GT(low_again.usage.cached_prompt_tokens, 0);
  const EngineStats st = eng->stats();
  EXPECT_TRUE(st.tiers);
  EXPECT_EQ(st.tier.tier, Tier::kLow);
  EXPECT_GT(st.tier_steps[0], 0u);
  EXPECT_GT(st.tier_steps[1], 0u);
  EXPECT_GT(st.tier_bytes[0], st.tier_bytes[1]);  // Q4_1 is larger than Q4_0
}

TEST(Tiers, HighPolicyIsTheHighModelAlone) {
  ASSERT_NE(low_q4_0(), nullptr);
  auto high_only = engine_of(default_model().model, small_config());
  auto eng = tiered(TierPolicy::kHigh, low_q4_0());
  ASSERT_TRUE(high_only && eng);
  const Request r = greedy_request(prompt("Once upon a time"), 32);
  const Generation want = collect(*high_only->submit(r));
  const Generation got = collect(*eng->submit(r));
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.usage.tiers, kHighBit);
  EXPECT_EQ(eng->stats().tier_steps[1], 0u);
}

// What the steps told their observers about admission's margin.
class MarginWatch final : public StepObserver {
 public:
  void on_step(const StepReport& r) override {
    std::lock_guard<std::mutex> lock(mu_);
    last_ = r.admission_ttft_margin_cap;
  }
  double last() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

 private:
  std::mutex mu_;
  double last_ = 0.0;
};

TEST(Tiers, AutoFollowsTheLoadIncludingCapacityRefusals) {
  ASSERT_NE(low_q4_0(), nullptr);
  EngineConfig cfg = small_config();
  cfg.low_tier = low_q4_0();
  cfg.tier_control.policy = TierPolicy::kAuto;
  cfg.tier_control.step_scale[static_cast<size_t>(adaptive::LoadMode::kHighLoad)] = 0.5;
  auto eng = engine_of(default_model().model, cfg);
  ASSERT_TRUE(eng);
  auto watch = std::make_shared<MarginWatch>();
  eng->add_observer(watch);
  const Request r = greedy_request(prompt("Once upon a time"), 8);
  EXPECT_EQ(collect(*eng->submit(r)).usage.tiers, kHighBit);  // idle: high
  EXPECT_TRUE(std::isinf(watch->last()));                      // admission as configured
  EXPECT_DOUBLE_EQ(eng->stats().tier.step_scale, 1.0);
  eng->note_overload(now_ns());  // the front door refused work for lack of capacity
  EXPECT_EQ(collect(*eng->submit(r)).usage.tiers, kLowBit);
  // The rest of the high-load row: admission refuses what would be late, steps are halved.
  EXPECT_DOUBLE_EQ(watch->last(), cfg.tier_control.high_load_ttft_margin);
  EXPECT_DOUBLE_EQ(eng->stats().tier.step_scale, 0.5);
  EXPECT_LE(eng->stats().scheduler.step_budget_tokens, cfg.max_batch_tokens / 2);
  Request realtime = r;
  realtime.sla_class = SlaClass::kRealtime;
  EXPECT_EQ(collect(*eng->submit(realtime)).usage.tiers, kHighBit);  // pinned
  const EngineStats st = eng->stats();
  EXPECT_EQ(st.tier.tier, Tier::kLow);
  EXPECT_EQ(st.tier.mode, adaptive::LoadMode::kHighLoad);
  EXPECT_EQ(st.tier.switches, 1u);
}

TEST(Tiers, RefusesALowTierOfAnotherModel) {
  testing::SyntheticModelSpec spec;
  spec.n_vocab = default_model().model->hparams().n_vocab;
  auto file = gguf::File::copy_of(testing::make_synthetic_model(spec));
  ASSERT_TRUE(file.ok());
  auto other = model::Model::from_file(std::move(*file));
  ASSERT_TRUE(other.ok());
  EngineConfig cfg = small_config();
  cfg.low_tier = std::shared_ptr<const model::Model>(std::move(*other));
  auto e = Engine::create(default_model().model, *default_model().tokenizer, cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("not the same model"), std::string::npos) << e.status().message();
}

// A low-tier engine whose every output is shadow-scored, acting after two samples; a
// rollback holds for the rest of the test.
EngineConfig monitored(std::shared_ptr<const model::Model> low) {
  EngineConfig cfg = small_config();
  cfg.low_tier = std::move(low);
  cfg.tier_control.policy = TierPolicy::kLow;
  cfg.tier_control.rollback_cooldown_s = 600.0;
  cfg.shadow.every = 1;
  cfg.shadow.min_samples = 2;
  return cfg;
}

// Waits until the engine's shadow scorer has scored `n` samples (60 s at most).
bool wait_scored(const Engine& e, uint64_t n) {
  for (int i = 0; i < 600; ++i) {
    if (e.stats().shadow.scored >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// A valid file whose one layer is wrong: the default model in Q8_0 with the scales of
// blk.1.ffn_down (blocks of an f16 scale and 32 int8) multiplied by 16.
std::shared_ptr<const model::Model> damaged_q8_0() {
  return derived(kernels::DType::kQ8_0, [](std::vector<uint8_t>& bytes, const gguf::File& f) {
    const gguf::TensorInfo* t = f.find_tensor("blk.1.ffn_down.weight");
    ASSERT_NE(t, nullptr);
    const size_t off = static_cast<size_t>(t->data - f.bytes().data());
    for (size_t b = 0; b < t->n_bytes; b += 34) {
      uint16_t h;
      std::memcpy(&h, &bytes[off + b], 2);
      h = fp32_to_fp16(fp16_to_fp32(h) * 16.0f);
      std::memcpy(&bytes[off + b], &h, 2);
    }
  });
}

TEST(Tiers, ShadowScoringRollsADamagedLowTierBackOnALiveEngine) {
  auto damaged = damaged_q8_0();
  ASSERT_NE(damaged, nullptr);
  EngineConfig cfg = monitored(damaged);
  cfg.shadow.kl_max = 0.5;
  auto eng = engine_of(default_model().model, cfg);
  ASSERT_TRUE(eng);
  const char* texts[] = {"The capital of France is", "Water boils at", "The first rule of programming is",
                         "A good breakfast includes", "The moon orbits"};
  int served_low = 0;
  uint64_t scored = 0;
  for (const char* text : texts) {
    const Generation g = collect(*eng->submit(greedy_request(prompt(text), 16)));
    if (g.usage.tiers != kLowBit) break;
    ++served_low;
    ASSERT_TRUE(wait_scored(*eng, ++scored));
  }
  // Two samples fill the window; the step after the second rolls back.
  EXPECT_EQ(served_low, 2);
  const EngineStats st = eng->stats();
  EXPECT_EQ(st.tier.rollbacks.count("shadow_kl"), 1u);
  EXPECT_EQ(st.tier.tier, Tier::kHigh);
  EXPECT_TRUE(st.tier.cooling_down);
  EXPECT_GT(st.shadow.last_kl, 0.5);
}

TEST(Tiers, ShadowScoringOfAFaithfulLowTierDoesNotRollBack) {
  auto faithful = derived(kernels::DType::kQ8_0);  // Q8_0 of the Q4_1 weights: near exact
  ASSERT_NE(faithful, nullptr);
  EngineConfig cfg = monitored(faithful);
  auto eng = engine_of(default_model().model, cfg);
  ASSERT_TRUE(eng);
  uint64_t scored = 0;
  for (const char* text : {"The capital of France is", "Water boils at", "The moon orbits"}) {
    const Generation g = collect(*eng->submit(greedy_request(prompt(text), 16)));
    EXPECT_EQ(g.usage.tiers, kLowBit);
    ASSERT_TRUE(wait_scored(*eng, ++scored));
  }
  const EngineStats st = eng->stats();
  EXPECT_TRUE(st.tier.rollbacks.empty());
  EXPECT_LT(st.shadow.kl_mean, 0.1);
  EXPECT_GT(st.shadow.top1_mean, 0.8);
}

TEST(Tiers, LayerDriftAloneRollsADamagedLowTierBack) {
  auto damaged = damaged_q8_0();
  ASSERT_NE(damaged, nullptr);
  EngineConfig cfg = monitored(damaged);
  cfg.shadow.kl_max = 100.0;  // KL never acts: the drift must
  cfg.shadow.drift_max = 0.5;
  auto eng = engine_of(default_model().model, cfg);
  ASSERT_TRUE(eng);
  uint64_t scored = 0;
  for (const char* text : {"The capital of France is", "Water boils at", "The moon orbits"}) {
    const Generation g = collect(*eng->submit(greedy_request(prompt(text), 16)));
    if (g.usage.tiers != kLowBit) break;
    ASSERT_TRUE(wait_scored(*eng, ++scored));
  }
  const EngineStats st = eng->stats();
  EXPECT_EQ(scored, 2u);
  EXPECT_EQ(st.tier.rollbacks.count("drift"), 1u);
  EXPECT_EQ(st.tier.rollbacks.count("shadow_kl"), 0u);
  EXPECT_EQ(st.tier.tier, Tier::kHigh);
}

TEST(ShadowScorer, LayerDriftPointsAtTheDamagedLayer) {
  auto damaged = damaged_q8_0();
  auto faithful = derived(kernels::DType::kQ8_0);
  ASSERT_TRUE(damaged && faithful);
  auto high_chain = adaptive::LayerChain::of(*default_model().model);
  auto bad_chain = adaptive::LayerChain::of(*damaged);
  auto good_chain = adaptive::LayerChain::of(*faithful);
  ASSERT_TRUE(high_chain.ok() && bad_chain.ok() && good_chain.ok());
  ThreadPool pool(2);
  const std::vector<int32_t> toks = prompt("The quick brown fox jumps over the lazy dog and runs away.");
  auto bad = adaptive::ShadowScorer::score(*default_model().model, *damaged, toks, 4, pool, &*high_chain, &*bad_chain);
  auto good = adaptive::ShadowScorer::score(*default_model().model, *faithful, toks, 4, pool, &*high_chain, &*good_chain);
  ASSERT_TRUE(bad.ok() && good.ok());
  const size_t L = default_model().model->hparams().n_layer;
  ASSERT_EQ(bad->drift.size(), L - 1);
  ASSERT_EQ(good->drift.size(), L - 1);
  EXPECT_LT(bad->drift[0], 0.05);  // before the damage
  EXPECT_GT(bad->drift[1], 1.0);   // at it (x16 is ln 16 ~ 2.8 on the layer's own output)
  for (double d : good->drift) EXPECT_LT(d, 0.1);
  // Layer by layer or whole, the logits are the same model's: the same KL.
  auto whole = adaptive::ShadowScorer::score(*default_model().model, *faithful, toks, 4, pool);
  ASSERT_TRUE(whole.ok());
  EXPECT_NEAR(whole->kl, good->kl, 1e-3 + 0.05 * whole->kl);
  EXPECT_TRUE(whole->drift.empty());
}

TEST(ShadowScorer, ScoresZeroForTheSameModelAndSeesADifferentOne) {
  ASSERT_NE(low_q4_0(), nullptr);
  ThreadPool pool(2);
  const std::vector<int32_t> toks = prompt("The quick brown fox jumps over the lazy dog and runs away.");
  const int n_prompt = 4;
  auto same = adaptive::ShadowScorer::score(*default_model().model, *default_model().model, toks, n_prompt, pool);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->positions, static_cast<int>(toks.size()) - n_prompt);
  EXPECT_NEAR(same->kl, 0.0, 1e-9);
  EXPECT_DOUBLE_EQ(same->top1, 1.0);
  auto other = adaptive::ShadowScorer::score(*default_model().model, *low_q4_0(), toks, n_prompt, pool);
  ASSERT_TRUE(other.ok());
  EXPECT_GT(other->kl, 0.01);
  EXPECT_FALSE(adaptive::ShadowScorer::score(*default_model().model, *low_q4_0(), toks, static_cast<int>(toks.size()), pool).ok());
}

}  // namespace
}  // namespace metro::engine
