// metro's block formats against gguf-py, an outside implementation of the GGUF formats
// (tests/fixtures/kernels/README.md says how the data was made).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/dtype.h"
#include "kernels/quant_ref.h"
#include "support/test_util.h"

namespace metro::kernels {
namespace {

struct Case {
  std::string kind, name;
  DType type;
  int64_t n;
  std::vector<uint8_t> quant;
  std::vector<float> f32;
};

DType dtype_named(const std::string& s) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (dtype_name(static_cast<DType>(i)) == s) return static_cast<DType>(i);
  }
  ADD_FAILURE() << "unknown type " << s;
  return DType::kF32;
}

std::vector<Case> load_cases() {
  const std::string dir = metro::testing::source_path("tests/fixtures/kernels/");
  std::ifstream mf(dir + "manifest.json");
  std::ifstream bf(dir + "fixtures.bin", std::ios::binary);
  EXPECT_TRUE(mf && bf) << "fixtures missing in " << dir;
  const auto manifest = nlohmann::json::parse(mf);
  const std::vector<uint8_t> blob((std::istreambuf_iterator<char>(bf)), std::istreambuf_iterator<char>());
  std::vector<Case> cases;
  for (const auto& c : manifest.at("cases")) {
    Case k;
    k.kind = c.at("kind");
    k.name = c.at("name");
    k.type = dtype_named(c.at("type"));
    k.n = c.at("n");
    const size_t qo = c.at("quant").at("offset"), qn = c.at("quant").at("bytes");
    const size_t fo = c.at("f32").at("offset"), fn = c.at("f32").at("bytes");
    EXPECT_LE(qo + qn, blob.size());
    EXPECT_LE(fo + fn, blob.size());
    EXPECT_EQ(fn, static_cast<size_t>(k.n) * 4);
    EXPECT_EQ(qn, row_bytes(k.type, k.n));
    if (qo + qn > blob.size() || fo + fn > blob.size()) continue;
    k.quant.assign(blob.begin() + static_cast<long>(qo), blob.begin() + static_cast<long>(qo + qn));
    k.f32.resize(fn / 4);
    std::memcpy(k.f32.data(), blob.data() + fo, fn);
    cases.push_back(std::move(k));
  }
  return cases;
}

// Bit equality, so -0.0 vs 0.0 or a last-bit difference counts.
void expect_same_floats(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    ASSERT_EQ(a, b) << what << " element " << i << ": metro " << got[i] << ", gguf-py " << want[i];
  }
}

TEST(GoldenGgufPy, DequantizeMatchesExactly) {
  int model = 0, synthetic = 0;
  for (const Case& c : load_cases()) {
    if (c.kind == "quantize") continue;
    std::vector<float> y(static_cast<size_t>(c.n));
    dequantize_row_ref(c.type, c.quant.data(), y.data(), c.n);
    expect_same_floats(y, c.f32, c.kind + " " + c.name);
    (c.kind == "model" ? model : synthetic)++;
  }
  EXPECT_GE(model, 4);
  EXPECT_EQ(synthetic, 12);  // every block format metro reads from files, and F16/BF16
}

// The 32-block quantizers and F16/BF16 reproduce gguf-py's bytes (which equal ggml's
// reference quantizers): same scale choice, same float operations, ties rounded away
// from zero. gguf-py has no quantizer for the K-quants.
TEST(GoldenGgufPy, QuantizeMatchesBytes) {
  int n_cases = 0;
  for (const Case& c : load_cases()) {
    if (c.kind != "quantize") continue;
    std::vector<uint8_t> q(row_bytes(c.type, c.n));
    quantize_row_ref(c.type, c.f32.data(), q.data(), c.n);
    const int64_t bs = traits(c.type).block_size, bpb = traits(c.type).bytes_per_block;
    for (int64_t b = 0; b < c.n / bs; ++b) {
      ASSERT_EQ(0, std::memcmp(q.data() + b * bpb, c.quant.data() + b * bpb, static_cast<size_t>(bpb)))
          << c.name << " block " << b;
    }
    ++n_cases;
  }
  EXPECT_EQ(n_cases, 7);
}

// The model fixtures are the model's own bytes: the first rows of each tensor.
TEST(GoldenGgufPy, ModelFixturesComeFromTheDefaultModel) {
  REQUIRE_MODEL();
  auto file = gguf::File::open(metro::testing::default_model_path());
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  for (const Case& c : load_cases()) {
    if (c.kind != "model") continue;
    const gguf::TensorInfo* t = file->find_tensor(c.name);
    ASSERT_NE(t, nullptr) << c.name;
    ASSERT_EQ(dtype_from_ggml(t->type()), c.type);
    ASSERT_LE(c.quant.size(), t->n_bytes);
    EXPECT_EQ(0, std::memcmp(t->data, c.quant.data(), c.quant.size())) << c.name;
  }
}

}  // namespace
}  // namespace metro::kernels
