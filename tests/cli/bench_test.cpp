// metro bench: the --kv-type option reaches the KV cache it measures.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/test_util.h"

namespace metro {
namespace {

using metro::testing::run_metro;

nlohmann::json bench_json(const std::string& kv_type) {
  auto r = run_metro({"bench", "-m", metro::testing::default_model_path(), "--batch", "2", "-p", "32", "-n", "4",
                      "-r", "1", "-t", "1", "--kv-type", kv_type, "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

TEST(BenchCli, KvTypeSetsTheCacheItMeasures) {
  REQUIRE_MODEL();
  const nlohmann::json f16 = bench_json("f16");
  const nlohmann::json q8 = bench_json("q8_0");
  ASSERT_TRUE(f16.contains("batch") && q8.contains("batch"));
  EXPECT_EQ(f16["kv_type"], "f16");
  EXPECT_EQ(q8["kv_type"], "q8_0");
  const double f16_bytes = f16["batch"][0]["kv_bytes"].get<double>();
  const double q8_bytes = q8["batch"][0]["kv_bytes"].get<double>();
  // Q8_0 stores 34 bytes per 32 values against F16's 64: the same pages in 0.53x the memory.
  EXPECT_NEAR(q8_bytes / f16_bytes, 34.0 / 64.0, 0.01);
  EXPECT_GT(q8["batch"][0]["decode_tps"].get<double>(), 0.0);
}

TEST(BenchCli, RefusesAnUnknownKvType) {
  auto r = run_metro({"bench", "-m", "none.gguf", "--kv-type", "q4_0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--kv-type must be f16 or q8_0"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace metro
