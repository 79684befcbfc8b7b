// base/residency.h: resident pages counted as mincore reports them, ranges merged, pages
// locked, and MappedFile::give_back returning pages of a copy.
#include "base/residency.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "base/mapped_file.h"
#include "support/test_util.h"

namespace metro {
namespace {

class Pages {
 public:
  explicit Pages(size_t n) : page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))), n_(n) {
    void* p = mmap(nullptr, n * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    base_ = static_cast<uint8_t*>(p);
  }
  ~Pages() { munmap(base_, n_ * page_); }
  uint8_t* page(size_t i) const { return base_ + i * page_; }
  size_t size() const { return page_; }

 private:
  size_t page_, n_;
  uint8_t* base_ = nullptr;
};

TEST(Residency, CountsTouchedPagesAndTheCoveredPartOfEdgePages) {
  Pages p(16);
  const size_t ps = p.size();
  for (size_t i : {1u, 2u, 5u, 9u}) std::memset(p.page(i), 1, ps);
  ByteRanges all = {{p.page(0), 16 * ps}};
  EXPECT_EQ(resident_bytes(all), 4 * ps);
  // Half of page 1 and half of page 3 (not touched): half a page.
  EXPECT_EQ(resident_bytes({{p.page(1) + ps / 2, 2 * ps}}), ps / 2 + ps);
  EXPECT_EQ(resident_bytes({{p.page(10), 3 * ps}}), 0u);
  // Overlapping ranges merge, so the shared pages count once.
  ByteRanges overlapping = {{p.page(1), 2 * ps}, {p.page(2), 4 * ps}, {p.page(9), 10}, {p.page(9) + 10, 20}};
  ByteRanges merged = merge_ranges(overlapping);
  ASSERT_EQ(merged.size(), 2u);
  EXPECT_EQ(merged[0].data(), p.page(1));
  EXPECT_EQ(merged[0].size(), 5 * ps);
  EXPECT_EQ(merged[1].size(), 30u);
  EXPECT_EQ(resident_bytes(merged), 3 * ps + 30);
}

TEST(Residency, LockingFaultsThePagesIn) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer replaces mlock with a no-op";
#endif
  Pages p(8);
  ByteRanges r = {{p.page(0), 8 * p.size()}};
  EXPECT_EQ(resident_bytes(r), 0u);
  auto locked = lock_ranges(r);
  if (!locked.ok()) {
    // An unprivileged process with a small RLIMIT_MEMLOCK: the error says which limit.
    EXPECT_NE(locked.status().message().find("RLIMIT_MEMLOCK"), std::string::npos) << locked.status().message();
    GTEST_SKIP() << "mlock refused here: " << locked.status().message();
  }
  EXPECT_EQ(*locked, 8 * p.size());
  EXPECT_EQ(resident_bytes(r), 8 * p.size());
  munlock(p.page(0), 8 * p.size());
}

TEST(Residency, GivingBackPagesOfACopyDropsThemAndLeavesTheRest) {
  const size_t ps = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<uint8_t> bytes(8 * ps);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 1);
  auto f = MappedFile::copy_of(bytes);
  ASSERT_TRUE(f.ok());
  const ByteRanges whole = {f->bytes()};
  EXPECT_EQ(resident_bytes(whole), bytes.size());
  // From the middle of page 1 to the middle of page 5: pages 2, 3 and 4 go.
  EXPECT_EQ(f->give_back(ps + ps / 2, 4 * ps), 3 * ps);
  EXPECT_EQ(resident_bytes(whole), 5 * ps);
  EXPECT_EQ(std::memcmp(f->data(), bytes.data(), 2 * ps), 0);
  EXPECT_EQ(std::memcmp(f->data() + 5 * ps, bytes.data() + 5 * ps, 3 * ps), 0);
  EXPECT_EQ(f->give_back(0, ps / 2), 0u);             // no whole page
  EXPECT_EQ(f->give_back(bytes.size(), ps), 0u);      // past the end
  EXPECT_EQ(f->give_back(7 * ps, 10 * ps), ps);       // clipped to the end
}

// ReadOptions::map_ranges: the whole pages inside the ranges are mapped from the file, the
// rest read; the bytes are the file's either way. Given back, the mapped pages stop being
// the file's: truncating the file then cannot fault the copy's other bytes.
TEST(Residency, ReadMapsTheRangesAskedAndGivesThemBack) {
  const size_t ps = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<uint8_t> bytes(10 * ps + 123);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 13 + 5);
  testing::TempFile file(".bin");
  file.write(bytes);
  MappedFile::ReadOptions o;
  o.chunk_bytes = 4096;
  o.map_ranges = {{ps + 10, 3 * ps}, {6 * ps, 4 * ps + 123}, {3 * ps, ps / 2}};
  size_t last = 0;
  o.on_chunk = [&](size_t done, size_t total) {
    EXPECT_GT(done, last);
    EXPECT_EQ(total, bytes.size());
    last = done;
  };
  auto f = MappedFile::read(file.path(), o);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(last, bytes.size());
  ASSERT_EQ(f->size(), bytes.size());
  EXPECT_EQ(std::memcmp(f->data(), bytes.data(), bytes.size()), 0);
  // Pages 2, 3 and 6..9 are mapped (whole pages inside the ranges), the rest are not.
  EXPECT_EQ(testing::mapped_rss(file.path()), 6 * ps);
  EXPECT_EQ(f->give_back(2 * ps, 2 * ps), 2 * ps);
  EXPECT_EQ(f->give_back(6 * ps, 4 * ps), 4 * ps);
  EXPECT_EQ(testing::mapped_rss(file.path()), 0u);
  EXPECT_EQ(truncate(file.path().c_str(), 0), 0);
  // Read pages (0, 1, 4, 5 and the tail) are the copy's own: readable after truncation.
  EXPECT_EQ(std::memcmp(f->data(), bytes.data(), 2 * ps), 0);
  EXPECT_EQ(std::memcmp(f->data() + 4 * ps, bytes.data() + 4 * ps, 2 * ps), 0);
  EXPECT_EQ(std::memcmp(f->data() + 10 * ps, bytes.data() + 10 * ps, 123), 0);
}

TEST(Residency, MajorFaultsOnlyGrow) {
  const uint64_t a = major_page_faults();
  const uint64_t b = major_page_faults();
  EXPECT_LE(a, b);
}

}  // namespace
}  // namespace metro
