#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/hash.h"
#include "engine/engine_test_util.h"
#include "support/synthetic_model.h"

#include "support/test_util.h"

namespace metro {
namespace {

// llama.cpp's llama-perplexity on the same file and window (tests/fixtures/perplexity/README.md).
constexpr double kLlamaCppPerplexity = 36.5254;

// Under ASan+UBSan (METRO_SANITIZED) the comparisons with llama.cpp's figures are the release
// run's: the sanitized run scores one window through the same code, for the memory checks,
// and checks the result is a perplexity.
bool compare_with_llama_cpp() { return !metro::testing::sanitized(); }

std::vector<std::string> windows() {
  return compare_with_llama_cpp() ? std::vector<std::string>{} : std::vector<std::string>{"--chunks", "1"};
}

std::vector<std::string> args(std::vector<std::string> a) {
  for (auto& w : windows()) a.push_back(w);
  return a;
}

void expect_perplexity(double ppl, double llama_cpp, const char* what) {
  if (compare_with_llama_cpp()) {
    EXPECT_NEAR(ppl, llama_cpp, 0.01 * llama_cpp) << what;
  } else {
    EXPECT_TRUE(std::isfinite(ppl) && ppl > 1.0) << what << ": " << ppl;
  }
}

TEST(Perplexity, WithinOnePercentOfLlamaCpp) {
  REQUIRE_MODEL();
  auto r = metro::testing::run_metro(args({"perplexity", "-m", metro::testing::default_model_path(), "-f",
                                           metro::testing::source_path("tests/fixtures/perplexity/metro_essay.txt"),
                                           "--ctx", "256", "--json", "-t", "2"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const double ppl = j["perplexity"].get<double>();
  EXPECT_EQ(j["windows"], compare_with_llama_cpp() ? 5 : 1);
  expect_perplexity(ppl, kLlamaCppPerplexity, "f16 KV");
  std::printf("perplexity: metro %.4f, llama.cpp %.4f (%.3f%%)\n", ppl, kLlamaCppPerplexity,
              100.0 * (ppl - kLlamaCppPerplexity) / kLlamaCppPerplexity);
}

// The same with a Q8_0 KV cache: llama-perplexity -fa on -ctk q8_0 -ctv q8_0 (the README).
constexpr double kLlamaCppPerplexityQ8Kv = 36.5937;

TEST(Perplexity, Q8KvWithinOnePercentOfLlamaCpp) {
  REQUIRE_MODEL();
  const std::string model = metro::testing::default_model_path();
  const std::string text = metro::testing::source_path("tests/fixtures/perplexity/metro_essay.txt");
  auto q8 = metro::testing::run_metro(
      args({"perplexity", "-m", model, "-f", text, "--ctx", "256", "--json", "-t", "2", "--kv-type", "q8_0"}));
  auto f16 = metro::testing::run_metro(args({"perplexity", "-m", model, "-f", text, "--ctx", "256", "--json", "-t", "2"}));
  ASSERT_EQ(q8.exit_code, 0) << q8.err;
  ASSERT_EQ(f16.exit_code, 0) << f16.err;
  auto jq = nlohmann::json::parse(q8.out);
  auto jf = nlohmann::json::parse(f16.out);
  EXPECT_EQ(jq["kv_type"], "q8_0");
  EXPECT_EQ(jf["kv_type"], "f16");
  const double ppl = jq["perplexity"].get<double>();
  expect_perplexity(ppl, kLlamaCppPerplexityQ8Kv, "Q8_0 KV");
  // The flag reaches the cache: rounding keys and values to 8 bits moves the result.
  EXPECT_NE(ppl, jf["perplexity"].get<double>());
  std::printf("perplexity, Q8_0 KV: metro %.4f, llama.cpp %.4f (%.3f%%)\n", ppl, kLlamaCppPerplexityQ8Kv,
              100.0 * (ppl - kLlamaCppPerplexityQ8Kv) / kLlamaCppPerplexityQ8Kv);
}

// metro quantize's Q2_K and Q3_K files: llama.cpp reads them and scores them as metro does
// (llama-perplexity on the files this test makes; tests/fixtures/perplexity/README.md). The
// default model's 576-wide matrices do not divide into 256-blocks, so only its ffn_down
// matrices take the K-quant; the rest fall back to Q4_0.
TEST(Perplexity, LowBitFilesReadAsLlamaCppReadsThem) {
  REQUIRE_MODEL();
  struct Case {
    const char* type;
    uint64_t file_hash;    // hash_bytes of the file llama.cpp scored
    double llama_cpp_ppl;  // its figure
  };
  std::vector<Case> cases = {Case{"q2_k", 0x2864bcf0c636a0c9ull, 119.0890}, Case{"q3_k", 0x8e674ff7a73cd138ull, 59.9206}};
  if (!compare_with_llama_cpp()) cases.pop_back();  // the same search code, once
  for (const Case& c : cases) {
    metro::testing::TempFile out(".gguf");
    auto q = metro::testing::run_metro({"quantize", metro::testing::default_model_path(), out.path(), "--type", c.type});
    ASSERT_EQ(q.exit_code, 0) << q.err;
    std::ifstream in(out.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const uint64_t h = hash_bytes(bytes.data(), bytes.size());
    EXPECT_EQ(h, c.file_hash) << c.type << ": the quantizer's output changed; remake the README's figures (hash 0x"
                              << std::hex << h << ")";
    auto r = metro::testing::run_metro(args({"perplexity", "-m", out.path(), "-f",
                                             metro::testing::source_path("tests/fixtures/perplexity/metro_essay.txt"),
                                             "--ctx", "256", "--json", "-t", "2"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const double ppl = nlohmann::json::parse(r.out)["perplexity"].get<double>();
    expect_perplexity(ppl, c.llama_cpp_ppl, c.type);
    std::printf("perplexity, %s: metro %.4f, llama.cpp %.4f (%.3f%%)\n", c.type, ppl, c.llama_cpp_ppl,
                100.0 * (ppl - c.llama_cpp_ppl) / c.llama_cpp_ppl);
  }
}

// --kl-vs: against itself every distribution is the same (KL 0, top-1 100%); against the
// model with its ffn_down matrices in Q3_K, KL grows and the reference's perplexity is the
// model's own; against `exact`
// (the double forward of the same weights) only the implementation's rounding is left.
TEST(Perplexity, KlDivergenceAgainstAnotherModelAndTheExactForward) {
  REQUIRE_MODEL();
  const std::string model = metro::testing::default_model_path();
  const std::string text = metro::testing::source_path("tests/fixtures/perplexity/metro_essay.txt");
  auto run = [&](const std::string& m, const std::string& vs, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"perplexity", "-m", m, "-f", text, "--json", "-t", "2", "--kl-vs", vs};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = metro::testing::run_metro(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
  };
  const auto self = run(model, model, {"--ctx", "128", "--chunks", "2"});
  EXPECT_EQ(self["kl_mean"].get<double>(), 0.0);
  EXPECT_EQ(self["top1_agreement"].get<double>(), 1.0);
  EXPECT_EQ(self["ref_perplexity"].get<double>(), self["perplexity"].get<double>());

  metro::testing::TempFile q3(".gguf"), plan(".json");
  plan.write(std::string(R"({"type": "keep", "tensors": {"blk.*.ffn_down.weight": "q3_k"}})"));
  auto q = metro::testing::run_metro({"quantize", model, q3.path(), "--plan", plan.path()});
  ASSERT_EQ(q.exit_code, 0) << q.err;
  const auto low = run(q3.path(), model, args({"--ctx", "256"}));
  const double kl = low["kl_mean"].get<double>();
  EXPECT_GT(kl, 0.01);
  EXPECT_LT(kl, 1.0);
  EXPECT_GE(low["kl_p99"].get<double>(), kl);
  EXPECT_LT(low["top1_agreement"].get<double>(), 1.0);
  EXPECT_GT(low["top1_agreement"].get<double>(), 0.5);
  expect_perplexity(low["ref_perplexity"].get<double>(), kLlamaCppPerplexity, "the reference's");
  std::printf("Q3_K ffn_down vs Q4_1: KL mean %.4f, p99 %.4f, top-1 %.2f%%\n", kl, low["kl_p99"].get<double>(),
              100.0 * low["top1_agreement"].get<double>());

  const auto exact = run(model, "exact", {"--ctx", "32", "--chunks", "1"});
  EXPECT_LT(exact["kl_mean"].get<double>(), 0.01);
  EXPECT_GT(exact["kl_mean"].get<double>(), 0.0);  // int8 activations round
  EXPECT_GE(exact["top1_agreement"].get<double>(), 0.8);
  std::printf("vs exact: KL mean %.6f, top-1 %.2f%%\n", exact["kl_mean"].get<double>(),
              100.0 * exact["top1_agreement"].get<double>());

  // Another vocabulary is refused.
  metro::testing::TempFile other(".gguf");
  other.write(metro::testing::make_synthetic_model(metro::testing::SyntheticModelSpec{}));
  auto bad = metro::testing::run_metro({"perplexity", "-m", model, "-f", text, "--kl-vs", other.path()});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("vocabularies differ"), std::string::npos) << bad.err;
}

// Gemma 3 270M on the essay in windows of `ctx` tokens against llama-perplexity on the same
// file and text (tests/fixtures/perplexity/README.md).
void expect_gemma3_perplexity(const char* ctx, double llama_cpp) {
  auto r = metro::testing::run_metro(args({"perplexity", "-m", metro::testing::gemma3_model_path(), "-f",
                                           metro::testing::source_path("tests/fixtures/perplexity/metro_essay.txt"),
                                           "--ctx", ctx, "--json", "-t", "2"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const double ppl = nlohmann::json::parse(r.out)["perplexity"].get<double>();
  const std::string what = std::string("gemma3 --ctx ") + ctx;
  expect_perplexity(ppl, llama_cpp, what.c_str());
  std::printf("perplexity, %s: metro %.4f, llama.cpp %.4f (%.3f%%)\n", what.c_str(), ppl, llama_cpp,
              100.0 * (ppl - llama_cpp) / llama_cpp);
}

// Windows inside the 512-token sliding window, where full attention is exact.
TEST(Perplexity, Gemma3WithinOnePercentOfLlamaCpp) {
  REQUIRE_GEMMA3();
  expect_gemma3_perplexity("256", 32.8753);
}

// Past the window: 720-token windows, whose scored second halves (positions 360-719) reach
// beyond the 512 keys the sliding-window layers see.
TEST(Perplexity, Gemma3PastItsSlidingWindowWithinOnePercentOfLlamaCpp) {
  REQUIRE_GEMMA3();
  expect_gemma3_perplexity("720", 27.0290);
}

TEST(Perplexity, RefusesAnUnknownKvType) {
  auto r = metro::testing::run_metro({"perplexity", "-m", "none.gguf", "-f", "none.txt", "--kv-type", "q4_0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--kv-type must be f16 or q8_0"), std::string::npos) << r.err;
}

TEST(Perplexity, RefusesTextShorterThanAWindow) {
  REQUIRE_MODEL();
  metro::testing::TempFile f(".txt");
  f.write(std::string("just a few words"));
  auto r = metro::testing::run_metro({"perplexity", "-m", metro::testing::default_model_path(), "-f", f.path()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("fewer than one window"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace metro
