// base/cold_store.h: entries written at load read back the same after their pages are given
// back; the least recently touched entries go first and the ones a step touches never do;
// the process's resident pages of the store (as /proc/self/smaps counts them) stay within
// the budget; a directory in memory is refused.
#include "base/cold_store.h"

#include <gtest/gtest.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <linux/magic.h>
#include <string>
#include <vector>

#include "support/test_util.h"

namespace metro {
namespace {

using testing::disk_dir;

// An entry's unit: whole 64 KiB (ColdStore aligns entries so that fault-around never maps
// a neighbour's pages).
constexpr size_t kUnit = size_t{64} << 10;

struct Filled {
  std::shared_ptr<ColdStore> store;
  std::vector<int> ids;
  std::vector<const uint8_t*> at;
  size_t bytes = 0;
};

// n entries of `bytes` each, entry i filled with bytes (i * 7 + j) % 251.
Filled fill(int n, size_t bytes, size_t chunk = size_t{1} << 20) {
  Filled f;
  ColdStore::Options o;
  o.dir = disk_dir();
  o.chunk_bytes = chunk;
  auto s = ColdStore::create(o);
  EXPECT_TRUE(s.ok()) << s.status().message();
  if (!s.ok()) return f;
  f.store = *s;
  f.bytes = bytes;
  for (int i = 0; i < n; ++i) {
    uint8_t* p = f.store->take(bytes);
    EXPECT_NE(p, nullptr);
    for (size_t j = 0; j < bytes; ++j) p[j] = static_cast<uint8_t>((static_cast<size_t>(i) * 7 + j) % 251);
    f.ids.push_back(f.store->add(p, bytes));
    f.at.push_back(p);
  }
  EXPECT_TRUE(f.store->seal().ok());
  return f;
}

bool intact(const Filled& f, int i) {
  for (size_t j = 0; j < f.bytes; ++j) {
    if (f.at[static_cast<size_t>(i)][j] != static_cast<uint8_t>((static_cast<size_t>(i) * 7 + j) % 251)) return false;
  }
  return true;
}

TEST(ColdStore, EntriesReadBackTheSameAfterRelease) {
  const size_t unit = kUnit;
  Filled f = fill(12, 5 * unit + 100, 4 * unit);  // entries larger than a chunk, sizes not a unit's multiple
  ASSERT_TRUE(f.store);
  const ColdStore::Stats s0 = f.store->stats();
  EXPECT_EQ(s0.entries, 12);
  EXPECT_EQ(s0.bytes, 12 * 6 * unit);
  EXPECT_EQ(s0.mapped, 0u);  // sealed: every entry released
  f.store->set_budget(2 * 6 * unit);
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 12; ++i) {
      const int id = f.ids[static_cast<size_t>(i)];
      f.store->touch({&id, 1});
      EXPECT_TRUE(intact(f, i)) << "entry " << i << " round " << round;
    }
  }
  const ColdStore::Stats s = f.store->stats();
  EXPECT_LE(s.mapped, s.budget);
  EXPECT_EQ(s.faults_in, 36u);    // each touch found its entry released: two fit, twelve cycle
  EXPECT_EQ(s.releases, 34u);
}

TEST(ColdStore, LeastRecentlyTouchedGoFirstAndAStepsOwnNever) {
  const size_t unit = kUnit;
  Filled f = fill(6, 4 * unit);
  ASSERT_TRUE(f.store);
  f.store->set_budget(3 * 4 * unit);
  f.store->touch(std::vector<int>{0, 1, 2});
  EXPECT_EQ(f.store->stats().releases, 0u);
  f.store->touch(std::vector<int>{0});  // 0 is now the most recent: 1 goes first
  f.store->touch(std::vector<int>{3});
  EXPECT_EQ(f.store->stats().releases, 1u);
  const uint64_t in_before = f.store->stats().faults_in;
  f.store->touch(std::vector<int>{0, 2, 3});  // all still in
  EXPECT_EQ(f.store->stats().faults_in, in_before);
  f.store->touch(std::vector<int>{1});  // back in: 0 (oldest of 0, 2, 3) goes
  f.store->touch(std::vector<int>{2, 3, 1});
  EXPECT_EQ(f.store->stats().faults_in, in_before + 1);
  // A step that needs more than the budget keeps all it touches, over the budget.
  f.store->touch(std::vector<int>{0, 1, 2, 3, 4, 5});
  EXPECT_EQ(f.store->stats().mapped, 6 * 4 * unit);
  f.store->touch(std::vector<int>{5});
  EXPECT_EQ(f.store->stats().mapped, 3 * 4 * unit);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(intact(f, i));
}

TEST(ColdStore, ResidentPagesStayWithinTheBudget) {
  const size_t mib = size_t{1} << 20;
  Filled f = fill(16, mib, 4 * mib);
  ASSERT_TRUE(f.store);
  EXPECT_LT(testing::mapped_rss(f.store->path()), mib);  // sealed: written out and dropped
  f.store->set_budget(4 * mib);
  uint64_t worst = 0;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 16; ++i) {
      const int id = f.ids[static_cast<size_t>(i)];
      f.store->touch({&id, 1});
      ASSERT_TRUE(intact(f, i));
      worst = std::max(worst, testing::mapped_rss(f.store->path()));
    }
  }
  EXPECT_LE(worst, 4 * mib);
  EXPECT_GE(worst, 3 * mib);  // the entries read are there: the measure sees them
  // With no budget left, only the last entry touched stays.
  f.store->set_budget(0);
  const int last = f.ids[3];
  f.store->touch({&last, 1});
  ASSERT_TRUE(intact(f, 3));
  EXPECT_LE(testing::mapped_rss(f.store->path()), mib);
}

TEST(ColdStore, RefusesADirectoryInMemory) {
  struct statfs fs {};
  if (statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC) GTEST_SKIP() << "no tmpfs at /dev/shm";
  ColdStore::Options o;
  o.dir = "/dev/shm";
  auto s = ColdStore::create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("tmpfs"), std::string::npos) << s.status().message();
  o.dir = "/nonexistent-metro-dir";
  EXPECT_FALSE(ColdStore::create(o).ok());
}

}  // namespace
}  // namespace metro
