// The KV seam of speculative decoding: lookahead slots for draft tokens, truncate() giving
// back the slots of rejected drafts, and commit() publishing accepted tokens only.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace metro::kv {
namespace {

std::vector<int32_t> iota_tokens(int n, int32_t start = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(KvSpeculative, LookaheadIsReservedLikeNewTokensAllOrNothing) {
  KvCacheManager m({.n_blocks = 4, .block_size = 4});
  ASSERT_TRUE(m.allocate(1, 6));
  EXPECT_EQ(m.blocks_needed(1, 1, 1), 0);  // 8 slots fit in 2 blocks
  EXPECT_EQ(m.blocks_needed(1, 1, 2), 1);
  EXPECT_EQ(m.blocks_needed(1, 1, 2), m.blocks_needed(1, 3));
  EXPECT_EQ(m.blocks_needed(1, 1, 10), 3);
  EXPECT_FALSE(m.allocate(1, 1, 10).has_value()) << "needs 3 blocks, 2 free";
  EXPECT_EQ(m.n_slots(1), 6);
  EXPECT_EQ(m.table(1).size(), 2u);
  EXPECT_EQ(m.n_free_blocks(), 2);
  auto t = m.allocate(1, 1, 9);  // 16 slots: 4 blocks
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->size(), 4u);
  EXPECT_EQ(m.n_slots(1), 16);
  EXPECT_EQ(m.n_free_blocks(), 0);
}

TEST(KvSpeculative, TruncateGivesBackWholeBlocksAndKeepsThePartialOne) {
  KvCacheManager m({.n_blocks = 8, .block_size = 4});
  ASSERT_TRUE(m.allocate(1, 5, 10));  // 15 slots: 4 blocks
  const std::vector<BlockId> before(m.table(1).begin(), m.table(1).end());
  m.truncate(1, 6);  // keeps blocks 0 and 1 (slots 4, 5 used, 6, 7 stale)
  EXPECT_EQ(m.n_slots(1), 6);
  ASSERT_EQ(m.table(1).size(), 2u);
  EXPECT_EQ(m.table(1)[0], before[0]);
  EXPECT_EQ(m.table(1)[1], before[1]);
  EXPECT_EQ(m.n_free_blocks(), 6);
  EXPECT_EQ(m.pool().ref_count(before[2]), 0);
  EXPECT_EQ(m.pool().ref_count(before[3]), 0);
  m.truncate(1, 6);  // no-op
  EXPECT_EQ(m.table(1).size(), 2u);
  m.truncate(1, 4);  // on a block boundary: the second block goes too
  EXPECT_EQ(m.table(1).size(), 1u);
  EXPECT_EQ(m.blocks_needed(1, 1), 1);
  ASSERT_TRUE(m.allocate(1, 2));  // continues at slot 4 in a fresh block
  EXPECT_EQ(m.n_slots(1), 6);
  EXPECT_EQ(m.table(1).size(), 2u);
  m.truncate(1, 0);
  EXPECT_TRUE(m.table(1).empty());
  EXPECT_EQ(m.n_free_blocks(), 8);
  m.free(1);
  EXPECT_EQ(m.stats().blocks_used, 0);
}

// Drafts that were computed and rejected never reach the prefix cache: a later prompt made
// of the accepted tokens plus the rejected drafts hits only the accepted full blocks, and
// the next commit after the truncate hashes the tokens that were really accepted.
TEST(KvSpeculative, RejectedDraftsNeverReachThePrefixCache) {
  KvCacheManager m({.n_blocks = 16, .block_size = 4});
  auto hint = m.prefix_hint();
  const auto prompt = iota_tokens(8);
  ASSERT_TRUE(m.allocate(1, 8));
  m.commit(1, prompt, 8);
  EXPECT_EQ(m.n_committed(1), 8);
  // A speculative step: 8 draft tokens ahead of the committed ones; 2 are accepted.
  const std::vector<int32_t> drafts = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(m.allocate(1, 0, 8));
  EXPECT_EQ(m.n_slots(1), 16);
  EXPECT_EQ(m.table(1).size(), 4u);
  const std::vector<BlockId> draft_table(m.table(1).begin(), m.table(1).end());
  auto accepted = concat(prompt, {1, 2});
  m.commit(1, accepted, 10);
  m.truncate(1, 10);
  EXPECT_EQ(m.n_committed(1), 8) << "block 2 is not full of accepted tokens";
  EXPECT_EQ(m.table(1).size(), 3u);
  EXPECT_FALSE(m.pool().is_cached(draft_table[2]));
  EXPECT_FALSE(m.pool().is_cached(draft_table[3]));

  auto with_drafts = concat(concat(prompt, drafts), {99});
  EXPECT_EQ(hint->cached_tokens(with_drafts), 8);
  EXPECT_EQ(m.computed_blocks(2, with_drafts), 8);
  m.free(2);

  // The sequence goes on with a correction token and more accepted tokens.
  auto real = concat(accepted, {50, 51, 52, 53, 54, 55});  // 16 tokens
  ASSERT_TRUE(m.allocate(1, 6));
  m.commit(1, real, 16);
  EXPECT_EQ(m.n_committed(1), 16);
  EXPECT_EQ(m.computed_blocks(3, with_drafts), 8) << "the drafts are still not cached";
  auto real_prompt = concat(real, {7});
  EXPECT_EQ(hint->cached_tokens(real_prompt), 16);
  EXPECT_EQ(m.computed_blocks(4, real_prompt), 16) << "the chained hash continues after truncate";
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(m.table(4)[i], m.table(1)[i]);
  m.free(3);
  m.free(4);
  m.free(1);
  EXPECT_EQ(m.stats().blocks_used, 0);
  EXPECT_EQ(hint->size(), static_cast<size_t>(m.stats().blocks_cached));
}

// A child forked past the parent's committed blocks inherits their chained hashes: it
// cannot truncate into them, and its own next block chains from the shared prefix.
TEST(KvSpeculative, ForkedChildInheritsTheCommittedChain) {
  KvCacheManager m({.n_blocks = 16, .block_size = 4});
  const auto a = iota_tokens(12);
  ASSERT_TRUE(m.allocate(1, 12));
  m.commit(1, a, 12);
  ASSERT_TRUE(m.fork(1, 2, 8).has_value());
  EXPECT_EQ(m.n_committed(2), 8);
  auto b = concat(std::vector<int32_t>(a.begin(), a.begin() + 8), {70, 71, 72, 73});
  ASSERT_TRUE(m.allocate(2, 4));
  m.commit(2, b, 12);
  EXPECT_EQ(m.n_committed(2), 12);
  EXPECT_EQ(m.computed_blocks(3, concat(b, {1})), 12);
  EXPECT_EQ(m.table(3)[2], m.table(2)[2]);
  EXPECT_NE(m.table(2)[2], m.table(1)[2]);
}

TEST(KvSpeculativeDeathTest, TruncateRefusesCommittedAndUnreservedSlots) {
  KvCacheManager m({.n_blocks = 8, .block_size = 4});
  const auto a = iota_tokens(8);
  ASSERT_TRUE(m.allocate(1, 6, 4));
  m.commit(1, a, 8);
  EXPECT_DEATH(m.truncate(1, 7), "committed");
  EXPECT_DEATH(m.truncate(1, 11), "reserved");
  EXPECT_DEATH(m.truncate(2, 0), "unknown");
  m.truncate(1, 8);
  EXPECT_EQ(m.n_slots(1), 8);
}

TEST(KvSpeculativeDeathTest, TruncateRefusesToEndInsideASharedBlock) {
  // Forked full blocks are shared by reference even when not committed (prefix cache off).
  KvCacheManager m({.n_blocks = 8, .block_size = 4, .prefix_cache = false});
  ASSERT_TRUE(m.allocate(1, 8));
  ASSERT_TRUE(m.fork(1, 2, 8).has_value());
  EXPECT_EQ(m.n_committed(2), 0);
  EXPECT_DEATH(m.truncate(2, 6), "shared");
  m.truncate(2, 4);  // on a block boundary: only drops the reference
  EXPECT_EQ(m.pool().ref_count(m.table(1)[1]), 1);
}

TEST(KvSpeculativeDeathTest, CommitRefusesUnreservedSlots) {
  KvCacheManager m({.n_blocks = 8, .block_size = 4});
  const auto a = iota_tokens(8);
  ASSERT_TRUE(m.allocate(1, 6));
  EXPECT_DEATH(m.commit(1, a, 8), "reserved");
  m.commit(1, a, 6);
  EXPECT_EQ(m.n_committed(1), 4);
}

// Random churn of many sequences under speculative steps. The test keeps its own model of
// every sequence and a fake KV memory holding, for each slot, the token whose KV was last
// written there; after every operation it checks the manager's bookkeeping against the
// model and that every accepted token's slot still holds that token (nothing shared, cached
// or kept was overwritten, and no prefix hit returned a block of other tokens).
class SpeculativeChurn {
 public:
  static constexpr int kBlocks = 48, kBlockSize = 4, kMaxLen = 72;
  static constexpr size_t kMaxLive = 24;

  SpeculativeChurn() : m_({.n_blocks = kBlocks, .block_size = kBlockSize}),
                       mem_(static_cast<size_t>(kBlocks * kBlockSize), -1) {}

  void run(uint32_t seed, int n_ops) {
    rng_.seed(seed);
    for (int op = 0; op < n_ops && !::testing::Test::HasFailure(); ++op) {
      const uint32_t r = rng_() % 16;
      if (live_.empty() || (r < 3 && live_.size() < kMaxLive)) admit();
      else if (r < 5) free_one();
      else if (r < 6) fork_one();
      else step_one();
      check();
    }
    while (!live_.empty()) {
      m_.free(live_.begin()->first);
      live_.erase(live_.begin());
      check();
    }
    EXPECT_EQ(m_.stats().blocks_used, 0) << "blocks leaked";
    EXPECT_EQ(m_.n_free_blocks(), kBlocks);
    EXPECT_GT(n_truncated_blocks_, 0) << "the churn never gave back a block";
    EXPECT_GT(n_draft_prompts_, 0) << "no prompt ever held a sequence's drafts";
  }

 private:
  struct Seq {
    std::vector<int32_t> tokens;   // accepted tokens; the last one is not computed yet
    int n_computed = 0;            // leading tokens whose KV is computed
    int reserved = 0;              // slots reserved: n_computed between steps
    std::vector<int32_t> drafted;  // the tokens of the last speculative step, drafts included
  };

  int32_t tok() { return static_cast<int32_t>(rng_() % 6); }  // few ids: prefixes repeat
  size_t slot(SeqId id, int pos) const {
    const auto t = m_.table(id);
    return static_cast<size_t>(t[static_cast<size_t>(pos / kBlockSize)]) * kBlockSize +
           static_cast<size_t>(pos % kBlockSize);
  }
  void write(SeqId id, int pos, int32_t token) { mem_[slot(id, pos)] = token; }
  SeqId pick() {
    auto it = live_.begin();
    std::advance(it, static_cast<long>(rng_() % live_.size()));
    return it->first;
  }

  void admit() {
    std::vector<int32_t> prompt;
    const uint32_t kind = rng_() % 3;
    if (kind == 1 && !live_.empty()) {
      const Seq& o = live_[pick()];
      prompt.assign(o.tokens.begin(), o.tokens.begin() + static_cast<long>(rng_() % o.tokens.size()));
    } else if (kind == 2 && !live_.empty()) {
      prompt = live_[pick()].drafted;
      if (!prompt.empty()) ++n_draft_prompts_;
    } else {
      prompt = {1, 2, 3, 4, 5, 0, 1, 2};
    }
    const int tail = static_cast<int>(rng_() % 12);
    for (int i = 0; i < tail; ++i) prompt.push_back(tok());
    if (prompt.size() < 2) prompt.push_back(tok());
    if (static_cast<int>(prompt.size()) > kMaxLen) prompt.resize(kMaxLen);
    const SeqId id = next_id_++;
    const int hinted = m_.prefix_hint()->cached_tokens(prompt);
    const int cached = m_.computed_blocks(id, prompt);
    ASSERT_EQ(hinted, cached) << "the hint mirrors the cache";
    live_[id] = Seq{prompt, cached, cached, {}};
  }

  void free_one() {
    const SeqId id = pick();
    m_.free(id);
    live_.erase(id);
  }

  void fork_one() {
    const SeqId parent = pick();
    const Seq& p = live_[parent];
    const SeqId child = next_id_++;
    const int free_before = m_.n_free_blocks();
    auto copy = m_.fork(parent, child, p.n_computed);
    if (!copy) {
      EXPECT_FALSE(m_.has(child));
      EXPECT_EQ(m_.n_free_blocks(), free_before);
      return;
    }
    if (*copy) {
      std::copy_n(mem_.begin() + (*copy)->src * kBlockSize, kBlockSize,
                  mem_.begin() + (*copy)->dst * kBlockSize);
    }
    live_[child] = Seq{p.tokens, p.n_computed, p.n_computed, {}};
  }

  void step_one() {
    const SeqId id = pick();
    Seq& s = live_[id];
    if (static_cast<int>(s.tokens.size()) >= kMaxLen) {
      free_one_id(id);
      return;
    }
    const int uncomputed = static_cast<int>(s.tokens.size()) - s.n_computed;
    const bool prefill = uncomputed > 1;
    const int n_new = prefill ? 1 + static_cast<int>(rng_() % static_cast<uint32_t>(uncomputed)) : 1;
    const int n_draft = prefill ? 0 : static_cast<int>(rng_() % 9);
    const std::vector<BlockId> table_before(m_.table(id).begin(), m_.table(id).end());
    const int free_before = m_.n_free_blocks();
    if (!m_.allocate(id, n_new, n_draft)) {
      EXPECT_EQ(std::vector<BlockId>(m_.table(id).begin(), m_.table(id).end()), table_before);
      EXPECT_EQ(m_.n_slots(id), s.n_computed);
      EXPECT_EQ(m_.n_free_blocks(), free_before);
      if (rng_() % 2 == 0) free_one_id(id);  // preempted
      return;
    }
    s.reserved = s.n_computed + n_new + n_draft;
    check();
    for (int i = 0; i < n_new; ++i) write(id, s.n_computed + i, s.tokens[static_cast<size_t>(s.n_computed + i)]);
    if (n_draft > 0) s.drafted.assign(s.tokens.begin(), s.tokens.begin() + s.n_computed + n_new);
    for (int i = 0; i < n_draft; ++i) {
      const int32_t d = tok();
      s.drafted.push_back(d);
      write(id, s.n_computed + n_new + i, d);
    }
    // Verification: a prefix of the drafts is accepted; the token after it differs from
    // the first rejected draft.
    const int n_accepted = n_draft == 0 ? 0 : static_cast<int>(rng_() % static_cast<uint32_t>(n_draft + 1));
    s.n_computed += n_new;
    for (int i = 0; i < n_accepted; ++i) {
      s.tokens.push_back(s.drafted[static_cast<size_t>(s.n_computed)]);
      ++s.n_computed;
    }
    if (s.n_computed == static_cast<int>(s.tokens.size())) {
      int32_t next = tok();
      if (n_accepted < n_draft) {
        while (next == s.drafted[static_cast<size_t>(s.n_computed)]) next = tok();
      }
      s.tokens.push_back(next);
    }
    // Commits of a random accepted count (a lagging commit is allowed), and truncates back
    // to the accepted count, sometimes in two moves, before or after the commit.
    const bool commit_first = rng_() % 2 == 0;
    if (commit_first) commit(id, s);
    if (rng_() % 3 == 0) {
      const int mid = s.n_computed + static_cast<int>(rng_() % static_cast<uint32_t>(s.reserved - s.n_computed + 1));
      truncate(id, s, mid);
      check();
    }
    truncate(id, s, s.n_computed);
    if (!commit_first) commit(id, s);
  }

  void commit(SeqId id, const Seq& s) {
    const int n = rng_() % 4 == 0 ? static_cast<int>(rng_() % static_cast<uint32_t>(s.n_computed + 1)) : s.n_computed;
    m_.commit(id, s.tokens, n);
    EXPECT_GE(m_.n_committed(id), n / kBlockSize * kBlockSize);
  }

  void truncate(SeqId id, Seq& s, int n_tokens) {
    const size_t before = m_.table(id).size();
    m_.truncate(id, n_tokens);
    n_truncated_blocks_ += static_cast<int>(before - m_.table(id).size());
    s.reserved = n_tokens;
  }

  void free_one_id(SeqId id) {
    m_.free(id);
    live_.erase(id);
  }

  void check() {
    std::vector<int> holders(static_cast<size_t>(kBlocks), 0);
    int n_distinct = 0;
    for (const auto& [id, s] : live_) {
      ASSERT_TRUE(m_.has(id));
      ASSERT_EQ(m_.n_slots(id), s.reserved);
      const auto t = m_.table(id);
      ASSERT_EQ(t.size(), static_cast<size_t>((s.reserved + kBlockSize - 1) / kBlockSize))
          << "a table covers exactly its reserved tokens";
      std::vector<BlockId> sorted(t.begin(), t.end());
      std::sort(sorted.begin(), sorted.end());
      ASSERT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "a block twice in one table";
      for (BlockId b : t) {
        ASSERT_TRUE(b >= 0 && b < kBlocks);
        if (holders[static_cast<size_t>(b)]++ == 0) ++n_distinct;
      }
      ASSERT_LE(m_.n_committed(id), s.n_computed);
      // Blocks with slots still to be written belong to this sequence alone.
      for (size_t i = static_cast<size_t>(s.n_computed / kBlockSize); i < t.size(); ++i) {
        ASSERT_EQ(m_.pool().ref_count(t[i]), 1);
        ASSERT_FALSE(m_.pool().is_cached(t[i]));
      }
      for (int p = 0; p < s.n_computed; ++p) {
        ASSERT_EQ(mem_[slot(id, p)], s.tokens[static_cast<size_t>(p)])
            << "seq " << id << " position " << p << ": its KV slot holds another token";
      }
    }
    for (BlockId b = 0; b < kBlocks; ++b) {
      ASSERT_EQ(m_.pool().ref_count(b), holders[static_cast<size_t>(b)]) << "block " << b;
    }
    const KvCacheStats st = m_.stats();
    ASSERT_EQ(st.blocks_used, n_distinct);
    ASSERT_EQ(st.blocks_used + m_.n_free_blocks(), st.blocks_total);
    ASSERT_EQ(m_.prefix_hint()->size(), static_cast<size_t>(st.blocks_cached));
  }

  KvCacheManager m_;
  std::vector<int32_t> mem_;
  std::mt19937 rng_;
  std::map<SeqId, Seq> live_;
  SeqId next_id_ = 1;
  int n_truncated_blocks_ = 0, n_draft_prompts_ = 0;
};

TEST(KvSpeculative, TruncateAndLookaheadUnderRandomChurnKeepTheInvariants) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    SpeculativeChurn churn;
    churn.run(seed, 4000);
  }
}

}  // namespace
}  // namespace metro::kv
