#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "support/test_util.h"

namespace metro {
namespace {

// llama.cpp's llama-perplexity on the same file and window (tests/fixtures/perplexity/README.md).
constexpr double kLlamaCppPerplexity = 36.5254;

TEST(Perplexity, WithinOnePercentOfLlamaCpp) {
  REQUIRE_MODEL();
  auto r = metro::testing::run_metro({"perplexity", "-m", metro::testing::default_model_path(), "-f",
                                      metro::testing::source_path("tests/fixtures/perplexity/metro_essay.txt"),
                                      "--ctx", "256", "--json", "-t", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const double ppl = j["perplexity"].get<double>();
  EXPECT_EQ(j["windows"], 5);
  EXPECT_NEAR(ppl, kLlamaCppPerplexity, 0.01 * kLlamaCppPerplexity);
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
      {"perplexity", "-m", model, "-f", text, "--ctx", "256", "--json", "-t", "2", "--kv-type", "q8_0"});
  auto f16 = metro::testing::run_metro({"perplexity", "-m", model, "-f", text, "--ctx", "256", "--json", "-t", "2"});
  ASSERT_EQ(q8.exit_code, 0) << q8.err;
  ASSERT_EQ(f16.exit_code, 0) << f16.err;
  auto jq = nlohmann::json::parse(q8.out);
  auto jf = nlohmann::json::parse(f16.out);
  EXPECT_EQ(jq["kv_type"], "q8_0");
  EXPECT_EQ(jf["kv_type"], "f16");
  const double ppl = jq["perplexity"].get<double>();
  EXPECT_NEAR(ppl, kLlamaCppPerplexityQ8Kv, 0.01 * kLlamaCppPerplexityQ8Kv);
  // The flag reaches the cache: rounding keys and values to 8 bits moves the result.
  EXPECT_NE(ppl, jf["perplexity"].get<double>());
  std::printf("perplexity, Q8_0 KV: metro %.4f, llama.cpp %.4f (%.3f%%)\n", ppl, kLlamaCppPerplexityQ8Kv,
              100.0 * (ppl - kLlamaCppPerplexityQ8Kv) / kLlamaCppPerplexityQ8Kv);
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
