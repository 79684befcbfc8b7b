// gguf::File::load reads the file into memory the File owns, unlike open (a map of the
// file): truncating the file afterwards neither faults nor changes a byte of the loaded one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "gguf/gguf.h"
#include "gguf/gguf_test_util.h"
#include "support/test_util.h"

namespace metro::gguf {
namespace {

using metro::testing::TempFile;

TEST(GgufLoad, LoadOwnsItsBytesAndOpenMaps) {
  TempFile tmp;
  const std::vector<uint8_t> bytes = metro::testing::small_valid_gguf();
  tmp.write(bytes);
  auto loaded = File::load(tmp.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_TRUE(loaded->owns_bytes());
  auto mapped = File::open(tmp.path());
  ASSERT_TRUE(mapped.ok()) << mapped.status().message();
  EXPECT_FALSE(mapped->owns_bytes());
  ASSERT_NE(loaded->stamp(), nullptr);
  EXPECT_EQ(loaded->stamp()->size, static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(*loaded->stamp(), *mapped->stamp());
  ASSERT_EQ(loaded->bytes().size(), bytes.size());
  EXPECT_EQ(std::memcmp(loaded->bytes().data(), bytes.data(), bytes.size()), 0);
}

// Every byte, every metadata value and every tensor stays readable and unchanged after the
// file is truncated to zero (a map would raise SIGBUS here).
TEST(GgufLoad, LoadedBytesSurviveTruncation) {
  TempFile tmp;
  const std::vector<uint8_t> bytes = metro::testing::small_valid_gguf();
  tmp.write(bytes);
  auto f = File::load(tmp.path());
  ASSERT_TRUE(f.ok()) << f.status().message();
  const size_t n_kv = f->metadata().size();
  ASSERT_EQ(::truncate(tmp.path().c_str(), 0), 0);
  ASSERT_EQ(f->bytes().size(), bytes.size());
  EXPECT_EQ(std::memcmp(f->bytes().data(), bytes.data(), bytes.size()), 0);
  EXPECT_EQ(f->metadata().size(), n_kv);
  for (const auto& kv : f->metadata()) EXPECT_FALSE(kv.value.to_display_string().empty());
  uint64_t sum = 0;
  for (const auto& t : f->tensors()) {
    for (uint64_t i = 0; i < t.n_bytes; ++i) sum += t.data[i];
  }
  (void)sum;
}

TEST(GgufLoad, FileCutShortWhileReadIsRefused) {
  TempFile tmp;
  const std::vector<uint8_t> bytes = metro::testing::small_valid_gguf();
  tmp.write(bytes);
  MappedFile::ReadOptions o;
  o.chunk_bytes = 1;  // at least a page is read at a time
  o.on_chunk = [&](size_t done, size_t) {
    if (done < 4 * 4096) {
      ASSERT_EQ(::truncate(tmp.path().c_str(), static_cast<off_t>(done)), 0);
    }
  };
  std::vector<uint8_t> big = bytes;
  big.resize(3 * 4096 + 100, 0);  // three pages and a bit: cut after the first
  tmp.write(big);
  auto f = File::load(tmp.path(), o);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("cut short while it was read (4096 of 12388 bytes)"), std::string::npos)
      << f.status().message();
}

TEST(GgufLoad, MissingFileIsAnErrorWithoutThePath) {
  auto f = File::load("/nonexistent/secret-dir/model.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message().find("secret-dir"), std::string::npos) << f.status().message();
  EXPECT_NE(f.status().message().find("model.gguf"), std::string::npos) << f.status().message();
}

}  // namespace
}  // namespace metro::gguf
