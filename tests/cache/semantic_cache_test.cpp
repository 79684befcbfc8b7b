// The semantic cache on synthetic embeddings: hits by similarity within a namespace only,
// thresholds that learn from verification, TTL and size bounds, concurrent use; and the key
// the server builds for a request.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "cache/semantic_cache.h"
#include "server/openai_request.h"
#include "server/semantic_key.h"

namespace metro::cache {
namespace {

constexpr int kDim = 32;

std::vector<float> unit(std::vector<float> v) {
  double n = 0.0;
  for (float x : v) n += static_cast<double>(x) * x;
  for (float& x : v) x = static_cast<float>(x / std::sqrt(n));
  return v;
}

std::vector<float> random_unit(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(kDim);
  for (float& x : v) x = d(rng);
  return unit(v);
}

// A vector at cosine `c` from `base` (towards another random direction).
std::vector<float> at_cosine(const std::vector<float>& base, double c, uint32_t seed) {
  std::vector<float> o = random_unit(seed);
  double dot = 0.0;
  for (int i = 0; i < kDim; ++i) dot += static_cast<double>(o[i]) * base[i];
  for (int i = 0; i < kDim; ++i) o[i] = static_cast<float>(o[i] - dot * base[i]);
  o = unit(o);
  std::vector<float> v(kDim);
  const double s = std::sqrt(1.0 - c * c);
  for (int i = 0; i < kDim; ++i) v[i] = static_cast<float>(c * base[i] + s * o[i]);
  return v;
}

std::shared_ptr<const CachedResponse> answer(const std::string& text) {
  auto r = std::make_shared<CachedResponse>();
  engine::Event d;
  d.text = text;
  r->events.push_back(d);
  r->text = text;
  return r;
}

SemanticCacheConfig config() {
  SemanticCacheConfig c;
  c.dim = kDim;
  c.threshold = 0.9;
  c.verify_share = 0.0;
  c.seed = 7;
  return c;
}

TEST(SemanticCache, HitsParaphrasesOfItsNamespaceOnly) {
  SemanticCache sc(config());
  const auto q = random_unit(1);
  sc.insert(1, q, answer("Paris"), 0.0);
  Lookup near = sc.lookup(1, at_cosine(q, 0.95, 2), 1.0);
  ASSERT_TRUE(near.hit);
  EXPECT_NEAR(near.similarity, 0.95, 1e-3);
  EXPECT_EQ(near.response->text, "Paris");
  EXPECT_FALSE(sc.lookup(1, at_cosine(q, 0.85, 3), 1.0).hit);  // below the threshold
  EXPECT_FALSE(sc.lookup(1, random_unit(4), 1.0).hit);          // unrelated
  EXPECT_FALSE(sc.lookup(2, q, 1.0).hit);                       // another namespace (tenant)
  const SemanticCacheStats s = sc.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.entries, 1u);
  EXPECT_GT(s.bytes, 0u);
}

TEST(SemanticCache, TheNearestEntryAnswers) {
  SemanticCache sc(config());
  const auto a = random_unit(10);
  const auto b = at_cosine(a, 0.93, 11);
  sc.insert(5, a, answer("A"), 0.0);
  sc.insert(5, b, answer("B"), 0.0);
  EXPECT_EQ(sc.lookup(5, a, 1.0).response->text, "A");
  EXPECT_EQ(sc.lookup(5, b, 1.0).response->text, "B");
  // The same question again replaces its entry instead of adding one.
  sc.insert(5, a, answer("A2"), 2.0);
  EXPECT_EQ(sc.stats().entries, 2u);
  EXPECT_EQ(sc.lookup(5, a, 3.0).response->text, "A2");
}

TEST(SemanticCache, EntriesExpireAfterTheirTtl) {
  SemanticCacheConfig c = config();
  c.ttl_s = 10.0;
  SemanticCache sc(c);
  const auto q = random_unit(20);
  sc.insert(1, q, answer("x"), 100.0);
  EXPECT_TRUE(sc.lookup(1, q, 109.0).hit);
  EXPECT_FALSE(sc.lookup(1, q, 111.0).hit);
  EXPECT_EQ(sc.stats().expired, 1u);
  EXPECT_EQ(sc.stats().entries, 0u);
  // Its slot is reused by the next insert.
  sc.insert(1, random_unit(21), answer("y"), 112.0);
  EXPECT_EQ(sc.stats().entries, 1u);
}

TEST(SemanticCache, SizeIsBoundedLeastRecentlyUsedFirst) {
  SemanticCacheConfig c = config();
  c.max_entries = 300;  // past the index's first capacity (256): it grows
  SemanticCache sc(c);
  std::vector<std::vector<float>> v;
  for (int i = 0; i < 300; ++i) {
    v.push_back(random_unit(100 + static_cast<uint32_t>(i)));
    sc.insert(static_cast<uint64_t>(i % 2), v.back(), answer(std::to_string(i)), 0.0);
  }
  EXPECT_EQ(sc.stats().entries, 300u);
  ASSERT_TRUE(sc.lookup(0, v[0], 1.0).hit);  // entry 0 is now the most recently used
  for (int i = 300; i < 310; ++i) sc.insert(0, random_unit(100 + static_cast<uint32_t>(i)), answer("n"), 2.0);
  const SemanticCacheStats s = sc.stats();
  EXPECT_EQ(s.entries, 300u);
  EXPECT_EQ(s.evictions, 10u);
  EXPECT_TRUE(sc.lookup(0, v[0], 3.0).hit);   // kept: used recently
  EXPECT_FALSE(sc.lookup(1, v[1], 3.0).hit);  // evicted: the oldest unused
}

TEST(SemanticCache, AVerifiedDisagreementTightensThenDropsTheEntry) {
  SemanticCache sc(config());
  const auto q = random_unit(30);
  sc.insert(1, q, answer("x"), 0.0);
  const auto para = at_cosine(q, 0.94, 31);
  Lookup l = sc.lookup(1, para, 1.0);
  ASSERT_TRUE(l.hit);
  sc.report(l.entry, l.similarity, /*agreed=*/false);
  EXPECT_FALSE(sc.lookup(1, para, 1.0).hit);  // that distance was wrong for this entry
  Lookup closer = sc.lookup(1, at_cosine(q, 0.99, 32), 1.0);
  ASSERT_TRUE(closer.hit);
  sc.report(closer.entry, closer.similarity, false);
  EXPECT_FALSE(sc.lookup(1, q, 1.0).hit);  // a second disagreement dropped it
  const SemanticCacheStats s = sc.stats();
  EXPECT_EQ(s.verified_disagree, 2u);
  EXPECT_EQ(s.dropped, 1u);
  EXPECT_EQ(s.entries, 0u);
}

TEST(SemanticCache, GlobalThresholdRisesWithMeasuredErrors) {
  SemanticCacheConfig c = config();
  c.max_error = 0.05;
  SemanticCache sc(c);
  const double before = sc.stats().threshold;
  for (int i = 0; i < 20; ++i) sc.report(0, 0.95, /*agreed=*/i % 5 != 0);  // 20% wrong
  EXPECT_GT(sc.stats().threshold, before);
  EXPECT_EQ(sc.stats().verified_agree, 16u);
}

TEST(SemanticCache, VerificationIsDrawnAtItsShare) {
  SemanticCacheConfig c = config();
  c.verify_share = 0.25;
  SemanticCache sc(c);
  const auto q = random_unit(40);
  sc.insert(1, q, answer("x"), 0.0);
  int verify = 0;
  for (int i = 0; i < 2000; ++i) verify += sc.lookup(1, q, 1.0).verify ? 1 : 0;
  EXPECT_NEAR(verify / 2000.0, 0.25, 0.04);
}

TEST(SemanticCache, ConcurrentUseLosesNothing) {
  SemanticCache sc(config());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&sc, t] {
      for (int i = 0; i < 200; ++i) {
        const auto v = random_unit(static_cast<uint32_t>(1000 * t + i));
        sc.insert(static_cast<uint64_t>(t), v, answer("a"), 0.0);
        EXPECT_TRUE(sc.lookup(static_cast<uint64_t>(t), v, 0.0).hit);
      }
    });
  }
  for (auto& th : threads) th.join();
  const SemanticCacheStats s = sc.stats();
  EXPECT_EQ(s.entries, 800u);
  EXPECT_EQ(s.hits, 800u);
}

TEST(SemanticCache, RefusesBadConfig) {
  SemanticCacheConfig c = config();
  c.threshold = 1.5;
  EXPECT_FALSE(validate(c).ok());
  c = config();
  c.max_entries = 0;
  EXPECT_FALSE(validate(c).ok());
  EXPECT_TRUE(validate(config()).ok());
}

}  // namespace
}  // namespace metro::cache

namespace metro::server {
namespace {

PreparedCall greedy_call() {
  PreparedCall pc;
  pc.requests.resize(1);
  pc.requests[0].sampling.temperature = 0.0f;
  return pc;
}

TEST(SemanticKey, NamespacesEverythingButTheConversation) {
  const auto body = nlohmann::json::parse(R"({"model": "m", "temperature": 0, "max_tokens": 20,
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}],
    "metro": {"semantic_cache": true}, "stream": true})");
  PreparedCall pc = greedy_call();
  std::string why;
  auto k = semantic_key(Endpoint::kChatCompletions, body, pc, "team-a", "m", &why);
  ASSERT_TRUE(k) << why;
  EXPECT_EQ(k->text, "Capital of France?");
  auto other_text = body;
  other_text["messages"][1]["content"] = "What is France's capital?";
  other_text["stream"] = false;  // delivery only
  EXPECT_EQ(semantic_key(Endpoint::kChatCompletions, other_text, pc, "team-a", "m", &why)->ns, k->ns);
  auto other_system = body;
  other_system["messages"][0]["content"] = "Be verbose.";
  EXPECT_NE(semantic_key(Endpoint::kChatCompletions, other_system, pc, "team-a", "m", &why)->ns, k->ns);
  auto other_tokens = body;
  other_tokens["max_tokens"] = 21;
  EXPECT_NE(semantic_key(Endpoint::kChatCompletions, other_tokens, pc, "team-a", "m", &why)->ns, k->ns);
  EXPECT_NE(semantic_key(Endpoint::kChatCompletions, body, pc, "team-b", "m", &why)->ns, k->ns);
  EXPECT_NE(semantic_key(Endpoint::kChatCompletions, body, pc, "team-a", "m@canary", &why)->ns, k->ns);
  auto tier = body;
  tier["metro"]["tier"] = "low";  // changes the answer: part of the namespace
  EXPECT_NE(semantic_key(Endpoint::kChatCompletions, tier, pc, "team-a", "m", &why)->ns, k->ns);
}

TEST(SemanticKey, OnlyDeterministicSingleAnswers) {
  const auto body = nlohmann::json::parse(R"({"prompt": "Once upon a time", "metro": {"semantic_cache": true}})");
  std::string why;
  PreparedCall pc = greedy_call();
  EXPECT_TRUE(semantic_key(Endpoint::kCompletions, body, pc, "", "m", &why));
  pc.requests[0].sampling.temperature = 0.8f;
  EXPECT_FALSE(semantic_key(Endpoint::kCompletions, body, pc, "", "m", &why));
  pc.requests[0].sampling.has_seed = true;  // seeded sampling repeats itself
  EXPECT_TRUE(semantic_key(Endpoint::kCompletions, body, pc, "", "m", &why));
  pc = greedy_call();
  pc.spec.n = 2;
  EXPECT_FALSE(semantic_key(Endpoint::kCompletions, body, pc, "", "m", &why));
  pc = greedy_call();
  pc.spec.logprobs = 3;
  EXPECT_FALSE(semantic_key(Endpoint::kCompletions, body, pc, "", "m", &why));
  EXPECT_FALSE(semantic_key(Endpoint::kEmbeddings, body, greedy_call(), "", "m", &why));
  EXPECT_TRUE(*asks_semantic_cache(body));
  EXPECT_FALSE(*asks_semantic_cache(nlohmann::json::parse(R"({"prompt": "x"})")));
  EXPECT_FALSE(asks_semantic_cache(nlohmann::json::parse(R"({"metro": {"semantic_cache": "yes"}})")).ok());
}

}  // namespace
}  // namespace metro::server
