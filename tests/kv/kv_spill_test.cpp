// The KV spill tier: the manager hands evicted prefix-cache blocks to it and restores them on
// later hits (with a tier held in memory), and the file tier keeps, bounds, checks and
// gives back their bytes; a damaged file or a full disk never serves wrong KV.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <vector>

#include "backends/registry.h"
#include "kv/file_spill.h"
#include "kv/kv_cache_manager.h"
#include "kv/prefix_hint.h"

namespace metro::kv {
namespace {

// A tier that keeps (hash -> key) in memory, failing restores on request.
struct MemoryTier : KvSpillTier {
  struct Kept {
    uint64_t parent;
    std::vector<int32_t> tokens;
  };
  std::map<uint64_t, Kept> kept;
  std::vector<BlockId> evicted, restored_into;
  bool fail_restores = false;
  void on_evict(BlockId b, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) override {
    evicted.push_back(b);
    kept[hash] = Kept{parent, {tokens.begin(), tokens.end()}};
  }
  bool worth_restoring(uint64_t hash, int) override { return kept.count(hash) != 0; }
  bool restore(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens, BlockId dst) override {
    auto it = kept.find(hash);
    if (fail_restores || it == kept.end() || it->second.parent != parent ||
        !std::equal(tokens.begin(), tokens.end(), it->second.tokens.begin(), it->second.tokens.end())) {
      return false;
    }
    restored_into.push_back(dst);
    return true;
  }
};

std::vector<int32_t> prompt(int n, int seed) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(seed * 1000 + i);
  return p;
}

// Runs a prompt's blocks through the manager as a step would: look up, allocate the rest,
// commit, free. Returns the tokens found cached.
int run_prompt(KvCacheManager& kv, SeqId id, const std::vector<int32_t>& p) {
  const int cached = kv.computed_blocks(id, p);
  EXPECT_TRUE(kv.allocate(id, static_cast<int>(p.size()) - cached).has_value());
  kv.commit(id, p, static_cast<int>(p.size()));
  kv.free(id);
  return cached;
}

TEST(KvSpill, EvictedBlocksGoToTheTierAndComeBackOnALaterHit) {
  KvCacheManager kv(KvCacheConfig{8, 4, true, 7});
  MemoryTier tier;
  kv.set_spill(&tier);
  const auto a = prompt(4 * 4 + 1, 1);  // 4 full blocks
  EXPECT_EQ(run_prompt(kv, 1, a), 0);
  EXPECT_TRUE(tier.evicted.empty());
  // Two other prompts take every block: a's 4 cached blocks are evicted, each handed over.
  EXPECT_EQ(run_prompt(kv, 2, prompt(4 * 4 + 1, 2)), 0);
  EXPECT_EQ(run_prompt(kv, 3, prompt(4 * 4 + 1, 3)), 0);
  EXPECT_GE(tier.evicted.size(), 4u);
  EXPECT_EQ(kv.pool().n_used(), 0);
  // a again: its chain is read back from the tier instead of computed.
  const int cached = kv.computed_blocks(4, a);
  EXPECT_EQ(cached, 16);
  EXPECT_EQ(kv.stats().restored_tokens, 16u);
  EXPECT_GE(tier.restored_into.size(), 4u);
  for (BlockId b : kv.table(4)) EXPECT_TRUE(kv.pool().is_cached(b)) << "a restored block is cached again";
  kv.free(4);
  EXPECT_EQ(kv.pool().n_used(), 0);
}

TEST(KvSpill, AFailedRestoreEndsTheChainAndLeaksNoBlock) {
  KvCacheManager kv(KvCacheConfig{8, 4, true, 7});
  MemoryTier tier;
  kv.set_spill(&tier);
  const auto a = prompt(4 * 4 + 1, 1);
  run_prompt(kv, 1, a);
  run_prompt(kv, 2, prompt(4 * 4 + 1, 2));
  run_prompt(kv, 3, prompt(4 * 4 + 1, 3));
  tier.fail_restores = true;
  const int32_t free_before = kv.pool().n_free();
  EXPECT_EQ(kv.computed_blocks(4, a), 0);
  EXPECT_EQ(kv.pool().n_free(), free_before);
  kv.free(4);
  // Random churn with restores that sometimes fail: every block comes back.
  std::mt19937 rng(5);
  for (int i = 0; i < 300; ++i) {
    tier.fail_restores = rng() % 4 == 0;
    const SeqId id = 100 + static_cast<SeqId>(i);
    const auto p = prompt(1 + static_cast<int>(rng() % 24), static_cast<int>(rng() % 6));
    const int cached = kv.computed_blocks(id, p);
    if (kv.allocate(id, static_cast<int>(p.size()) - cached)) kv.commit(id, p, static_cast<int>(p.size()));
    kv.free(id);
    ASSERT_EQ(kv.pool().n_used(), 0) << "step " << i;
  }
  EXPECT_GT(kv.stats().restored_tokens, 0u);
}

struct ArenaFixture {
  kernels::KvPageLayout layout{kernels::DType::kF16, 4, 1, 32};
  KvArena arena{backends::default_backend(), 2, layout, 6};
  std::string dir;
  ArenaFixture() {
    dir = (std::filesystem::temp_directory_path() / ("metro-spill-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(dir);
  }
  ~ArenaFixture() { std::filesystem::remove_all(dir); }
  std::vector<uint8_t> fill(BlockId b, int seed) {
    std::vector<uint8_t> bytes(arena.block_bytes());
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 31 + static_cast<size_t>(seed) * 7);
    arena.write_block(b, bytes);
    return bytes;
  }
  std::vector<uint8_t> read(BlockId b) {
    std::vector<uint8_t> bytes(arena.block_bytes());
    arena.read_block(b, bytes);
    return bytes;
  }
};

const std::vector<int32_t> kTokens = {1, 2, 3, 4};

TEST(FileSpill, KeepsEvictedBytesAndGivesThemBackOnlyUnderTheirKey) {
  ArenaFixture f;
  auto t = FileSpillTier::open(FileSpillConfig{f.dir, static_cast<int64_t>(f.arena.block_bytes()) * 4}, f.arena);
  ASSERT_TRUE(t.ok()) << t.status().message();
  const auto want = f.fill(0, 1);
  (*t)->on_evict(0, 11, 5, kTokens);
  f.fill(0, 2);  // the pool reuses the block at once
  // Served from the copy while it waits for the writer, or from the file after.
  EXPECT_TRUE((*t)->worth_restoring(11, 0));
  ASSERT_TRUE((*t)->restore(11, 5, kTokens, 1));
  EXPECT_EQ(f.read(1), want);
  (*t)->flush();
  f.fill(1, 3);
  ASSERT_TRUE((*t)->restore(11, 5, kTokens, 2));
  EXPECT_EQ(f.read(2), want);
  // Another key never reads it.
  EXPECT_FALSE((*t)->restore(11, 6, kTokens, 3));
  EXPECT_FALSE((*t)->restore(11, 5, std::vector<int32_t>{1, 2, 3, 5}, 3));
  EXPECT_FALSE((*t)->restore(12, 5, kTokens, 3));
  EXPECT_FALSE((*t)->worth_restoring(12, 0));
  const FileSpillStats s = (*t)->stats();
  EXPECT_EQ(s.writes, 1u);
  EXPECT_EQ(s.blocks, 1);
  EXPECT_EQ(s.restores, 2u);
  const std::string path = (*t)->path();
  EXPECT_TRUE(std::filesystem::exists(path));
  t->reset();
  EXPECT_FALSE(std::filesystem::exists(path)) << "the file goes with the tier";
}

TEST(FileSpill, AFullFileDropsItsLeastRecentlyUsedBlocks) {
  ArenaFixture f;
  auto t = FileSpillTier::open(FileSpillConfig{f.dir, static_cast<int64_t>(f.arena.block_bytes()) * 2}, f.arena);
  ASSERT_TRUE(t.ok());
  auto hint = std::make_shared<PrefixHint>(0, 16);  // what admission reads: the blocks held
  (*t)->set_hint(hint);
  std::vector<std::vector<uint8_t>> want;
  for (int i = 0; i < 3; ++i) {
    want.push_back(f.fill(0, 10 + i));
    (*t)->on_evict(0, 100 + static_cast<uint64_t>(i), 5, kTokens);
    (*t)->flush();
    if (i == 1) {
      ASSERT_TRUE((*t)->restore(100, 5, kTokens, 1));  // 100 used again: 101 is the oldest
    }
  }
  EXPECT_EQ((*t)->stats().blocks, 2);
  EXPECT_EQ((*t)->stats().capacity_blocks, 2);
  EXPECT_FALSE((*t)->worth_restoring(101, 0));
  EXPECT_EQ(hint->spilled_size(), 2u);
  EXPECT_TRUE(hint->spilled(100));
  EXPECT_FALSE(hint->spilled(101));
  EXPECT_TRUE(hint->spilled(102));
  ASSERT_TRUE((*t)->restore(100, 5, kTokens, 2));
  EXPECT_EQ(f.read(2), want[0]);
  ASSERT_TRUE((*t)->restore(102, 5, kTokens, 3));
  EXPECT_EQ(f.read(3), want[2]);
  EXPECT_LE(static_cast<int64_t>(std::filesystem::file_size((*t)->path())),
            static_cast<int64_t>(f.arena.block_bytes()) * 2);
}

TEST(FileSpill, DamagedOrTruncatedBytesAreDetectedAndNeverUsed) {
  ArenaFixture f;
  auto t = FileSpillTier::open(FileSpillConfig{f.dir, static_cast<int64_t>(f.arena.block_bytes()) * 4}, f.arena);
  ASSERT_TRUE(t.ok());
  f.fill(0, 1);
  (*t)->on_evict(0, 11, 5, kTokens);
  f.fill(0, 2);
  (*t)->on_evict(0, 12, 5, kTokens);
  (*t)->flush();
  const int fd = ::open((*t)->path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const uint8_t junk = 0xee;
  ASSERT_EQ(::pwrite(fd, &junk, 1, 17), 1);  // one byte of the first slot
  f.fill(3, 9);
  const auto untouched = f.read(3);
  EXPECT_FALSE((*t)->restore(11, 5, kTokens, 3));
  EXPECT_EQ((*t)->stats().corrupt, 1u);
  EXPECT_FALSE((*t)->worth_restoring(11, 0)) << "a damaged block is dropped";
  // Truncated: the second slot is gone from the file.
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(f.arena.block_bytes())), 0);
  ::close(fd);
  EXPECT_FALSE((*t)->restore(12, 5, kTokens, 3));
  EXPECT_EQ((*t)->stats().corrupt, 2u);
  EXPECT_EQ(f.read(3), untouched) << "a failed restore writes nothing into the block";
}

// A prefetch reads a held block into memory (checksum verified) ahead of its restore: the
// restore is then served from memory even if the file changes after, once, and damage seen
// at read-ahead time drops the block as a restore would.
TEST(FileSpill, PrefetchReadsAheadAndTheRestoreComesFromMemory) {
  ArenaFixture f;
  auto t = FileSpillTier::open(FileSpillConfig{f.dir, static_cast<int64_t>(f.arena.block_bytes()) * 4}, f.arena);
  ASSERT_TRUE(t.ok());
  auto hint = std::make_shared<PrefixHint>(0, 16);
  (*t)->set_hint(hint);
  const auto want = f.fill(0, 1);
  (*t)->on_evict(0, 11, 5, kTokens);
  f.fill(0, 2);
  (*t)->on_evict(0, 12, 5, kTokens);
  (*t)->flush();
  EXPECT_TRUE(hint->spilled(11) && hint->spilled(12));
  const uint64_t keys[] = {11, 99};  // 99: not held, skipped
  (*t)->prefetch(keys);
  (*t)->flush();
  EXPECT_EQ((*t)->stats().prefetched, 1u);
  // The file loses the block's bytes after the read-ahead: the staged copy is what counts.
  const int fd = ::open((*t)->path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const uint8_t junk = 0xee;
  ASSERT_EQ(::pwrite(fd, &junk, 1, 17), 1);
  ASSERT_TRUE((*t)->restore(11, 5, kTokens, 1));
  EXPECT_EQ(f.read(1), want);
  EXPECT_EQ((*t)->stats().prefetch_hits, 1u);
  // Used once: the next restore reads the (now damaged) file and refuses it.
  EXPECT_FALSE((*t)->restore(11, 5, kTokens, 2));
  EXPECT_EQ((*t)->stats().corrupt, 1u);
  EXPECT_FALSE(hint->spilled(11)) << "a dropped block leaves the hint";
  // Damage found by the read-ahead itself: the block is dropped and never staged.
  ASSERT_EQ(::pwrite(fd, &junk, 1, static_cast<off_t>(f.arena.block_bytes()) + 17), 1);
  ::close(fd);
  const uint64_t second[] = {12};
  (*t)->prefetch(second);
  (*t)->flush();
  EXPECT_EQ((*t)->stats().prefetched, 1u);
  EXPECT_EQ((*t)->stats().corrupt, 2u);
  EXPECT_FALSE((*t)->worth_restoring(12, 0));
  EXPECT_FALSE(hint->spilled(12));
}

// Read-ahead copies are bounded: one call queues no more than max_prefetch_bytes holds, and
// past it a later read-ahead pushes the oldest copy out, whose block is then read from the
// file again when restored.
TEST(FileSpill, PrefetchedCopiesAreBounded) {
  ArenaFixture f;
  const int64_t bb = static_cast<int64_t>(f.arena.block_bytes());
  FileSpillConfig cfg{f.dir, bb * 8};
  cfg.max_prefetch_bytes = bb * 2;
  auto t = FileSpillTier::open(cfg, f.arena);
  ASSERT_TRUE(t.ok());
  std::vector<std::vector<uint8_t>> want;
  for (uint64_t k = 0; k < 3; ++k) {
    want.push_back(f.fill(0, static_cast<int>(20 + k)));
    (*t)->on_evict(0, 200 + k, 5, kTokens);
    (*t)->flush();
  }
  const uint64_t keys[] = {200, 201, 202};
  (*t)->prefetch(keys);
  (*t)->flush();
  EXPECT_EQ((*t)->stats().prefetched, 2u) << "the third was not queued: no room for its copy";
  const uint64_t third[] = {202};
  (*t)->prefetch(third);
  (*t)->flush();
  EXPECT_EQ((*t)->stats().prefetched, 3u);
  for (uint64_t k = 0; k < 3; ++k) {
    ASSERT_TRUE((*t)->restore(200 + k, 5, kTokens, 1));
    EXPECT_EQ(f.read(1), want[k]);
  }
  EXPECT_EQ((*t)->stats().prefetch_hits, 2u) << "the oldest copy made room for the third";
}

TEST(FileSpill, AFailingWriteTurnsTheTierOffAndKeepsWhatItHas) {
  ArenaFixture f;
  const int64_t bb = static_cast<int64_t>(f.arena.block_bytes());
  // In a child process: a file size limit of one block makes the second write fail (EFBIG,
  // as a full disk fails with ENOSPC).
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    auto t = FileSpillTier::open(FileSpillConfig{f.dir, bb * 4}, f.arena);
    if (!t.ok()) ::_exit(10);
    rlimit lim{static_cast<rlim_t>(bb), static_cast<rlim_t>(bb)};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(11);
    const auto want = f.fill(0, 1);
    (*t)->on_evict(0, 11, 5, kTokens);
    (*t)->flush();
    f.fill(0, 2);
    (*t)->on_evict(0, 12, 5, kTokens);
    (*t)->flush();
    (*t)->on_evict(0, 13, 5, kTokens);
    (*t)->flush();
    const FileSpillStats s = (*t)->stats();
    if (s.writes != 1 || !s.failed || s.dropped < 2) ::_exit(12);
    if (!(*t)->restore(11, 5, kTokens, 1) || f.read(1) != want) ::_exit(13);
    if ((*t)->worth_restoring(12, 0)) ::_exit(14);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(FileSpill, FilesOfDeadProcessesAreRemovedAtOpen) {
  ArenaFixture f;
  std::filesystem::create_directories(f.dir);
  // pid_max is at most 2^22: this pid runs nowhere. A file of a live process stays.
  const auto stale = std::filesystem::path(f.dir) / "kv-spill-4999999-0.bin";
  const auto live = std::filesystem::path(f.dir) / ("kv-spill-" + std::to_string(::getppid()) + "-0.bin");
  const auto other = std::filesystem::path(f.dir) / "notes.txt";
  for (const auto& p : {stale, live, other}) std::ofstream(p) << "x";
  auto t = FileSpillTier::open(FileSpillConfig{f.dir, 1 << 20}, f.arena);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(live));
  EXPECT_TRUE(std::filesystem::exists(other));
}

TEST(FileSpill, BadSettingsAreRefused) {
  ArenaFixture f;
  EXPECT_FALSE(FileSpillTier::open(FileSpillConfig{"", 1 << 20}, f.arena).ok());
  EXPECT_FALSE(FileSpillTier::open(FileSpillConfig{f.dir, 10}, f.arena).ok());
  EXPECT_FALSE(FileSpillTier::open(FileSpillConfig{"/proc/metro-no", 1 << 20}, f.arena).ok());
}

}  // namespace
}  // namespace metro::kv
