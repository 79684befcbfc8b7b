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
