#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "gguf/gguf.h"
#include "gguf/gguf_test_util.h"
#include "gguf/writer.h"
#include "support/test_util.h"

namespace metro::gguf {
namespace {

using metro::testing::raw_header;
using metro::testing::small_valid_gguf;

Expected<File> parse(const std::vector<uint8_t>& b) { return File::parse(b); }

void expect_refused(const std::vector<uint8_t>& bytes, const std::string& needle) {
  auto f = File::parse(bytes);
  ASSERT_FALSE(f.ok()) << "expected refusal containing '" << needle << "'";
  EXPECT_NE(f.status().message().find(needle), std::string::npos) << f.status().message();
}

TEST(GgufReader, RoundTripsEveryValueType) {
  Writer w;
  w.add_u8("k.u8", 200);
  w.add_i8("k.i8", -100);
  w.add_u16("k.u16", 60000);
  w.add_i16("k.i16", -30000);
  w.add_u32("k.u32", 4000000000u);
  w.add_i32("k.i32", -2000000000);
  w.add_u64("k.u64", 1ull << 60);
  w.add_i64("k.i64", -(1ll << 60));
  w.add_f32("k.f32", 0.5f);
  w.add_f64("k.f64", -1e300);
  w.add_bool("k.bool", false);
  w.add_string("k.str", "héllo");
  w.add_string_array("k.strs", {"x", "yy"});
  w.add_i32_array("k.ints", {1, -2, 3});
  // A nested array: [[1, 2], [3]] of u16.
  Encoder nested;
  nested.put<uint32_t>(static_cast<uint32_t>(ValueType::kArray));
  nested.put<uint64_t>(2);
  nested.put<uint32_t>(static_cast<uint32_t>(ValueType::kU16));
  nested.put<uint64_t>(2);
  nested.put<uint16_t>(1);
  nested.put<uint16_t>(2);
  nested.put<uint32_t>(static_cast<uint32_t>(ValueType::kU16));
  nested.put<uint64_t>(1);
  nested.put<uint16_t>(3);
  w.add_raw("k.nested", ValueType::kArray, nested.bytes());
  const auto bytes = w.serialize();  // File::parse borrows the bytes: keep them alive
  auto f = parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(*f->get_uint("k.u8"), 200u);
  EXPECT_EQ(*f->get_int("k.i8"), -100);
  EXPECT_EQ(*f->get_uint("k.u16"), 60000u);
  EXPECT_EQ(*f->get_int("k.i16"), -30000);
  EXPECT_EQ(*f->get_u32("k.u32"), 4000000000u);
  EXPECT_EQ(*f->get_int("k.i32"), -2000000000);
  EXPECT_EQ(*f->get_uint("k.u64"), 1ull << 60);
  EXPECT_EQ(*f->get_int("k.i64"), -(1ll << 60));
  EXPECT_EQ(*f->get_f32("k.f32"), 0.5f);
  EXPECT_EQ(*f->get_double("k.f64"), -1e300);
  EXPECT_EQ(*f->get_bool("k.bool"), false);
  EXPECT_EQ(*f->get_string("k.str"), "héllo");
  auto strs = f->get_string_array("k.strs");
  ASSERT_TRUE(strs.ok());
  ASSERT_EQ(strs->size(), 2u);
  EXPECT_EQ((*strs)[1], "yy");
  EXPECT_EQ(*f->get_int_array("k.ints"), (std::vector<int64_t>{1, -2, 3}));
  const Value* n = f->find("k.nested");
  ASSERT_NE(n, nullptr);
  ASSERT_EQ(n->array_size(), 2u);
  EXPECT_EQ(n->array_at(0).array_size(), 2u);
  EXPECT_EQ(*n->array_at(0).array_at(1).as_uint(), 2u);
  EXPECT_EQ(*n->array_at(1).array_at(0).as_uint(), 3u);
  EXPECT_EQ(f->metadata().size(), 15u);
}

TEST(GgufReader, TypedGettersNameTheKeyAndWhatWasFound) {
  const auto bytes = small_valid_gguf();
  auto f = parse(bytes);
  ASSERT_TRUE(f.ok());
  auto s = f->get_u32("test.words");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("test.words"), std::string::npos);
  EXPECT_NE(s.status().message().find("array"), std::string::npos);
  auto m = f->get_string("no.such.key");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(m.status().message().find("no.such.key"), std::string::npos);
  auto neg = f->get_uint("test.neg");
  EXPECT_FALSE(neg.ok());
  EXPECT_EQ(*f->get_int("test.neg"), -3);
}

TEST(GgufReader, TensorTableAndData) {
  auto bytes = small_valid_gguf();
  auto f = parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->tensors().size(), 2u);
  const TensorInfo* a = f->find_tensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->n_dims, 2u);
  EXPECT_EQ(a->ne[0], 4u);
  EXPECT_EQ(a->ne[1], 2u);
  EXPECT_EQ(a->n_elements, 8u);
  EXPECT_EQ(a->n_bytes, 32u);
  EXPECT_EQ(a->type(), GgmlType::kF32);
  EXPECT_EQ(f->data_offset() % 32, 0u);
  float x;
  std::memcpy(&x, a->data, 4);
  EXPECT_EQ(x, 1.5f);
  const TensorInfo* b = f->find_tensor("b");
  std::memcpy(&x, b->data, 4);
  EXPECT_EQ(x, -1.0f);
  EXPECT_EQ(b->offset % f->alignment(), 0u);
}

TEST(GgufReader, HonoursCustomAlignment) {
  Writer w;
  w.set_alignment(64);
  std::vector<uint8_t> d(2 * 34, 0);
  ASSERT_TRUE(w.add_tensor("q", GgmlType::kQ8_0, {64}, d).ok());
  ASSERT_TRUE(w.add_tensor("r", GgmlType::kQ8_0, {32}, {d.data(), 34}).ok());
  const auto bytes = w.serialize();  // File::parse borrows the bytes: keep them alive
  auto f = parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(f->find_tensor("r")->offset, 128u);
}

TEST(GgufReader, ReadsVersion2) {
  auto bytes = small_valid_gguf();
  bytes[4] = 2;
  auto f = parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->version(), 2u);
}

// --- docs/reliability.md 1: bad magic, unknown version, truncated anywhere -------------------

TEST(GgufHostile, BadMagic) {
  auto bytes = small_valid_gguf();
  bytes[0] = 'X';
  expect_refused(bytes, "bad magic at offset 0");
}

TEST(GgufHostile, UnknownVersions) {
  auto bytes = small_valid_gguf();
  bytes[4] = 99;
  expect_refused(bytes, "unsupported GGUF version 99");
  bytes[4] = 1;
  expect_refused(bytes, "version 1");
}

TEST(GgufHostile, BigEndianRefusedClearly) {
  auto bytes = small_valid_gguf();
  bytes[4] = 0;
  bytes[7] = 3;  // version 3 written big-endian
  auto f = parse(bytes);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), ErrorCode::kUnimplemented);
  EXPECT_NE(f.status().message().find("big-endian"), std::string::npos);
}

TEST(GgufHostile, TruncatedAtEveryByte) {
  auto bytes = small_valid_gguf();
  auto whole = parse(bytes);
  ASSERT_TRUE(whole.ok());
  // Padding after the last tensor's data is not needed; every shorter prefix is broken.
  const TensorInfo* last = whole->find_tensor("b");
  const size_t needed = whole->data_offset() + last->offset + last->n_bytes;
  ASSERT_LT(needed, bytes.size() + 1);
  for (size_t n = 0; n < needed; ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<long>(n));
    auto f = parse(cut);
    ASSERT_FALSE(f.ok()) << "prefix of " << n << " bytes was accepted";
    EXPECT_NE(f.status().message().find("offset"), std::string::npos)
        << "no offset in: " << f.status().message();
  }
}

// --- docs/reliability.md 2: counts and sizes that overflow ----------------------------------

TEST(GgufHostile, HugeCounts) {
  expect_refused(raw_header(3, std::numeric_limits<uint64_t>::max(), 0).bytes(),
                 "more than the file can hold");
  expect_refused(raw_header(3, 0, std::numeric_limits<uint64_t>::max()).bytes(),
                 "more than the file can hold");
  expect_refused(raw_header(3, 0, (1ull << 63) / 13 + 5).bytes(), "more than the file");
}

TEST(GgufHostile, HugeStringLength) {
  auto e = raw_header(3, 0, 1);
  e.put<uint64_t>(std::numeric_limits<uint64_t>::max());  // key length
  e.put<uint64_t>(0);
  expect_refused(e.bytes(), "claims");
}

TEST(GgufHostile, HugeArrayCountOverflowsByteSize) {
  auto e = raw_header(3, 0, 1);
  e.put_string("k");
  e.put<uint32_t>(static_cast<uint32_t>(ValueType::kArray));
  e.put<uint32_t>(static_cast<uint32_t>(ValueType::kU64));
  e.put<uint64_t>((1ull << 61) + 1);  // x 8 bytes overflows 64 bits
  for (int i = 0; i < 4; ++i) e.put<uint64_t>(0);
  expect_refused(e.bytes(), "more than the");
}

TEST(GgufHostile, NestedArraysTooDeep) {
  auto e = raw_header(3, 0, 1);
  e.put_string("k");
  e.put<uint32_t>(static_cast<uint32_t>(ValueType::kArray));
  for (int d = 0; d < 20; ++d) {
    e.put<uint32_t>(static_cast<uint32_t>(ValueType::kArray));
    e.put<uint64_t>(1);
  }
  e.put<uint32_t>(static_cast<uint32_t>(ValueType::kU8));
  e.put<uint64_t>(0);
  expect_refused(e.bytes(), "nests deeper");
}

std::vector<uint8_t> one_tensor_file(const std::vector<uint64_t>& dims, uint32_t type,
                                     uint64_t offset, size_t data_bytes) {
  auto e = raw_header(3, 1, 0);
  e.put_string("t");
  e.put<uint32_t>(static_cast<uint32_t>(dims.size()));
  for (uint64_t d : dims) e.put<uint64_t>(d);
  e.put<uint32_t>(type);
  e.put<uint64_t>(offset);
  e.pad_to(32);
  e.bytes().resize(e.size() + data_bytes, 0);
  return e.bytes();
}

TEST(GgufHostile, DimensionProductOverflow) {
  expect_refused(one_tensor_file({(1ull << 42) + 1, 1ull << 42}, 0, 0, 64), "overflows");
  expect_refused(one_tensor_file({static_cast<uint64_t>(INT64_MAX), 2}, 0, 0, 64), "overflows");
  expect_refused(one_tensor_file({(1ull << 42) + 1}, 0, 0, 64), "outside the data section");
}

TEST(GgufHostile, ZeroDimensionAndTooManyDims) {
  expect_refused(one_tensor_file({4, 0}, 0, 0, 64), "zero dimension");
  expect_refused(one_tensor_file({1, 1, 1, 1, 1}, 0, 0, 64), "5 dimensions");
}

TEST(GgufHostile, UnknownTensorTypeRefusedById) {
  expect_refused(one_tensor_file({32}, 77, 0, 256), "unknown tensor type id 77");
  expect_refused(one_tensor_file({32}, 4, 0, 256), "unknown tensor type id 4");  // retired
}

TEST(GgufHostile, RowNotMultipleOfBlock) {
  expect_refused(one_tensor_file({33}, 2 /*Q4_0*/, 0, 256), "not a multiple of its block size");
}

TEST(GgufHostile, BadAlignmentValues) {
  for (uint32_t bad : {0u, 3u, 48u, 1u << 30}) {
    auto e = raw_header(3, 0, 1);
    e.put_string("general.alignment");
    e.put<uint32_t>(static_cast<uint32_t>(ValueType::kU32));
    e.put<uint32_t>(bad);
    expect_refused(e.bytes(), "general.alignment");
  }
  auto e = raw_header(3, 0, 1);
  e.put_string("general.alignment");
  e.put<uint32_t>(static_cast<uint32_t>(ValueType::kString));
  e.put_string("32");
  expect_refused(e.bytes(), "general.alignment");
}

// --- docs/reliability.md 3: ranges outside the file, overlapping, misaligned ----------------

TEST(GgufHostile, TensorRangeOutsideFile) {
  expect_refused(one_tensor_file({8}, 0, 0, 16), "outside the data section");
  expect_refused(one_tensor_file({8}, 0, std::numeric_limits<uint64_t>::max() - 31, 64),
                 "outside the data section");
}

TEST(GgufHostile, MisalignedOffset) {
  expect_refused(one_tensor_file({8}, 0, 4, 128), "not a multiple of the alignment");
}

TEST(GgufHostile, OverlappingTensors) {
  auto e = raw_header(3, 2, 0);
  for (const char* name : {"x", "y"}) {
    e.put_string(name);
    e.put<uint32_t>(1);
    e.put<uint64_t>(16);
    e.put<uint32_t>(0);
    e.put<uint64_t>(name[0] == 'x' ? 0 : 32);  // x spans [0, 64), y starts at 32
  }
  e.pad_to(32);
  e.bytes().resize(e.size() + 128, 0);
  expect_refused(e.bytes(), "overlapping");
}

// --- docs/reliability.md 4 (format level): empty key, duplicates ----------------------------

TEST(GgufHostile, EmptyKeyAndDuplicates) {
  auto e = raw_header(3, 0, 1);
  e.put_string("");
  e.put<uint32_t>(static_cast<uint32_t>(ValueType::kU8));
  e.put<uint8_t>(1);
  expect_refused(e.bytes(), "empty key");

  auto d = raw_header(3, 0, 2);
  for (int i = 0; i < 2; ++i) {
    d.put_string("same");
    d.put<uint32_t>(static_cast<uint32_t>(ValueType::kU8));
    d.put<uint8_t>(1);
  }
  expect_refused(d.bytes(), "appears twice");

  auto t = raw_header(3, 2, 0);
  for (int i = 0; i < 2; ++i) {
    t.put_string("dup");
    t.put<uint32_t>(1);
    t.put<uint64_t>(8);
    t.put<uint32_t>(0);
    t.put<uint64_t>(static_cast<uint64_t>(i) * 32);
  }
  t.pad_to(32);
  t.bytes().resize(t.size() + 64, 0);
  expect_refused(t.bytes(), "appears twice");
}

TEST(GgufHostile, UnknownValueType) {
  auto e = raw_header(3, 0, 1);
  e.put_string("k");
  e.put<uint32_t>(13);
  e.put<uint64_t>(0);
  expect_refused(e.bytes(), "unknown value type 13");
}

TEST(GgufFile, OpenMissingFileDoesNotLeakPath) {
  auto f = File::open("/nonexistent/secret-dir/model.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message().find("secret-dir"), std::string::npos) << f.status().message();
  EXPECT_NE(f.status().message().find("model.gguf"), std::string::npos);
}

TEST(GgufFile, OpensWrittenFile) {
  metro::testing::TempFile tmp;
  Writer w;
  w.add_string("general.architecture", "x");
  std::vector<uint8_t> d(64, 0);
  ASSERT_TRUE(w.add_tensor("t", GgmlType::kF16, {32}, d).ok());
  ASSERT_TRUE(w.write(tmp.path()).ok());
  auto f = File::open(tmp.path());
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->tensors().size(), 1u);
  EXPECT_EQ(*f->get_string("general.architecture"), "x");
}

TEST(GgufWriter, RefusesDataOfTheWrongSize) {
  Writer w;
  std::vector<uint8_t> d(10, 0);
  EXPECT_FALSE(w.add_tensor("t", GgmlType::kF32, {4}, d).ok());
  EXPECT_FALSE(w.add_tensor("t", GgmlType::kQ4_0, {31}, d).ok());
}

}  // namespace
}  // namespace metro::gguf
