// The KV spill tier in a running engine: a prompt whose prefix-cache blocks memory evicted
// is read back from the spill file instead of computed, and generates exactly what it
// generated the first time. And the prefix cache's events (EngineConfig::kv_events) as the
// engine hands them on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>
#include <tuple>

#include "engine/engine_test_util.h"
#include "support/test_util.h"

namespace metro::engine {
namespace {

using metro::testing::collect;
using metro::testing::default_model;
using metro::testing::Generation;
using metro::testing::greedy_request;

std::vector<int32_t> long_prompt(const char* topic) {
  const auto& tok = *default_model().tokenizer;
  std::string text = std::string("Notes about ") + topic + ". ";
  while (tok.encode(text, true, false).size() < 200) text += std::string("More about ") + topic + ", in detail. ";
  auto ids = tok.encode(text, true, false);
  ids.resize(200);
  return ids;
}

TEST(EngineKvSpill, APromptWhoseBlocksLeftMemoryIsRestoredWithTheSameOutput) {
  REQUIRE_MODEL();
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("metro-engine-spill-" + std::to_string(::getpid()))).string();
  const auto a = long_prompt("trains"), b = long_prompt("the ocean"), c = long_prompt("volcanoes");
  auto run = [&](bool spill) {
    EngineConfig cfg;
    cfg.n_threads = 2;
    cfg.ctx_total = 320;  // 20 blocks of 16: two prompts of 200 tokens do not fit at once
    if (spill) {
      cfg.kv_spill_dir = dir;
      cfg.kv_spill_bytes = int64_t{256} << 20;
    }
    const auto& sm = default_model();
    auto e = Engine::create(sm.model, *sm.tokenizer, cfg);
    EXPECT_TRUE(e.ok()) << e.status().message();
    Engine& eng = **e;
    std::vector<Generation> out;
    int estimate = -1;  // what admission would be told of a's prefix before its second run
    for (const auto* p : {&a, &b, &c, &a}) {
      if (out.size() == 3) {
        estimate = eng.cached_prefix_tokens(a);
        // As admission does: a's blocks start coming back from the file before it runs
        // (asked again while they may still be queued for the writer: those are skipped).
        EXPECT_EQ(eng.prefetch_prefix(a) > 0, spill);
        for (int i = 0; spill && i < 1000 && eng.stats().spill->prefetched == 0; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          eng.prefetch_prefix(a);
        }
      }
      out.push_back(collect(*eng.submit(greedy_request(*p, 8))));
    }
    const EngineStats st = eng.stats();
    return std::make_tuple(out, st, estimate);
  };
  const auto [plain, plain_stats, plain_estimate] = run(false);
  const auto [spilled, spill_stats, spill_estimate] = run(true);
  // Admission's estimate counts what the tier would read back, and only with the tier.
  EXPECT_LT(plain_estimate, 64);
  EXPECT_GE(spill_estimate, 192);
  EXPECT_LE(spill_estimate, spilled[3].usage.cached_prompt_tokens);
  // Without the tier, b and c evicted a's blocks: a's second run computes (nearly) all of it.
  EXPECT_LT(plain[3].usage.cached_prompt_tokens, 64);
  // With it, they are read back: at least the 12 full blocks of a's 200 tokens.
  EXPECT_GE(spilled[3].usage.cached_prompt_tokens, 192);
  ASSERT_TRUE(spill_stats.spill.has_value());
  EXPECT_GE(spill_stats.restored_tokens, 160u);
  EXPECT_GT(spill_stats.spill->restores, 0u);
  // Read ahead at "admission", restored from memory in the step.
  EXPECT_GT(spill_stats.spill->prefetched, 0u);
  EXPECT_GT(spill_stats.spill->prefetch_hits, 0u);
  EXPECT_LE(spill_stats.spill->prefetch_hits, spill_stats.spill->prefetched);
  EXPECT_FALSE(plain_stats.spill.has_value());
  // The same greedy output, every time, with and without the tier.
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(spilled[i].tokens, plain[i].tokens) << "request " << i;
  }
  EXPECT_EQ(spilled[3].tokens, spilled[0].tokens);
  EXPECT_EQ(spill_stats.kv_blocks_used, 0);
  // Refused without the prefix cache it serves.
  EngineConfig bad;
  bad.prefix_cache = false;
  bad.kv_spill_dir = dir;
  bad.kv_spill_bytes = int64_t{1} << 20;
  const auto& sm = default_model();
  EXPECT_FALSE(Engine::create(sm.model, *sm.tokenizer, bad).ok());
  std::filesystem::remove_all(dir);
}

// A prompt's full blocks arrive as stored (its tokens, chained), prompts that push them out of
// a small cache as removed, the chain again when the prompt returns, and everything cleared
// when the engine stops.
TEST(EngineKvEvents, StoresRemovalsAndTheClearAtShutdown) {
  REQUIRE_MODEL();
  std::mutex mu;
  std::vector<kv::KvEvent> seen;
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.ctx_total = 320;  // 20 blocks of 16
  cfg.kv_events = [&](std::vector<kv::KvEvent> events) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& e : events) seen.push_back(std::move(e));
  };
  const auto a = long_prompt("trains"), b = long_prompt("the ocean"), c = long_prompt("volcanoes");
  auto stored_a = [&] {
    // The chain of stored blocks that starts with a's first block, and its tokens.
    std::vector<uint64_t> chain;
    std::vector<int32_t> tokens;
    for (const auto& e : seen) {
      if (e.kind != kv::KvEvent::Kind::kStored) continue;
      if (chain.empty() && !e.parent && std::equal(a.begin(), a.begin() + 16, e.token_ids.begin())) {
        chain = e.hashes;
        tokens = e.token_ids;
      } else if (!chain.empty() && e.parent && *e.parent == chain.back()) {
        chain.insert(chain.end(), e.hashes.begin(), e.hashes.end());
        tokens.insert(tokens.end(), e.token_ids.begin(), e.token_ids.end());
      }
    }
    return std::make_pair(chain, tokens);
  };
  {
    const auto& sm = default_model();
    auto e = Engine::create(sm.model, *sm.tokenizer, cfg);
    ASSERT_TRUE(e.ok()) << e.status().message();
    collect(*(*e)->submit(greedy_request(a, 4)));
    std::vector<uint64_t> first;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto [chain, tokens] = stored_a();
      ASSERT_EQ(chain.size(), 12u);  // 200 prompt tokens (+ 3 generated) fill 12 blocks of 16
      EXPECT_TRUE(std::equal(a.begin(), a.begin() + 192, tokens.begin()));
      first = chain;
      seen.clear();
    }
    collect(*(*e)->submit(greedy_request(b, 4)));
    collect(*(*e)->submit(greedy_request(c, 4)));
    {
      std::lock_guard<std::mutex> lock(mu);
      std::vector<uint64_t> removed;
      for (const auto& ev : seen) {
        if (ev.kind == kv::KvEvent::Kind::kRemoved) removed.insert(removed.end(), ev.hashes.begin(), ev.hashes.end());
      }
      for (uint64_t h : first) EXPECT_NE(std::find(removed.begin(), removed.end(), h), removed.end()) << h;
      seen.clear();
    }
    collect(*(*e)->submit(greedy_request(a, 4)));
    {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(stored_a().first, first);  // the same hashes: the same blocks computed again
      seen.clear();
    }
  }
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().kind, kv::KvEvent::Kind::kAllCleared);
}

}  // namespace
}  // namespace metro::engine
