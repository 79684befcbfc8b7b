// metro bench: the --kv-type option reaches the KV cache it measures; the roofline counts
// the model's own arithmetic.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "gguf/gguf.h"
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

// Multiply-adds per token of the default model's products, read off its tensors: every
// matrix of a layer and the head (the tied embedding when there is no output.weight).
double product_macs_from_file(bool with_head) {
  auto f = gguf::File::open(metro::testing::default_model_path());
  EXPECT_TRUE(f.ok());
  if (!f.ok()) return 0;
  double total = 0;
  bool has_output = false;
  for (const gguf::TensorInfo& t : f->tensors()) {
    const std::string name(t.name);
    if (name == "output.weight") has_output = true;
    const bool layer_matrix = name.rfind("blk.", 0) == 0 && t.n_dims == 2;
    if (layer_matrix) total += static_cast<double>(t.ne[0]) * static_cast<double>(t.ne[1]);
  }
  if (with_head) {
    const gguf::TensorInfo* head = f->find_tensor(has_output ? "output.weight" : "token_embd.weight");
    EXPECT_NE(head, nullptr);
    if (head) total += static_cast<double>(head->ne[0]) * static_cast<double>(head->ne[1]);
  }
  return total;
}

TEST(BenchCli, TheRooflineCountsTheModelsArithmetic) {
  REQUIRE_MODEL();
  const int p = 32, n = 4, ns = 2;
  const nlohmann::json j = bench_json("f16");
  ASSERT_TRUE(j.contains("roofline") && j.contains("batch")) << j.dump();
  const nlohmann::json& roof = j["roofline"];
  const double macs = product_macs_from_file(true), macs_no_head = product_macs_from_file(false);
  EXPECT_EQ(roof["product_macs_per_token"].get<double>(), macs);
  EXPECT_EQ(roof["products_bound_by"], "int8");  // Q4_1 layers and a Q8_0 head
  if (j["kernel_isa"] == "avx2") {
    // Both loops issue two instructions a cycle on AVX2 cores: 64 int8 ops against 16 flops.
    const double int8 = roof["int8_peak_gops"].get<double>(), fp32 = roof["fp32_peak_gflops"].get<double>();
    EXPECT_GT(fp32, 0.0);
    EXPECT_GT(int8 / fp32, 2.0);
    EXPECT_LT(int8 / fp32, 8.0);
  }
  // SmolLM2-135M: 30 layers, 9 query heads of 64 values; each (query, key) pair is a QK and
  // a PV product per head.
  const double attn_per_key = 2.0 * 30 * 9 * (64 + 64);
  const nlohmann::json& row = j["batch"][0];
  double decode_keys = 0, prefill_keys = 0;
  for (int pos = p; pos < p + n; ++pos) decode_keys += pos + 1;
  for (int pos = 0; pos < p; ++pos) prefill_keys += pos + 1;
  const double decode_ops = ns * (n * 2.0 * macs + decode_keys * attn_per_key);
  const double prefill_ops = ns * ((p * macs_no_head + (macs - macs_no_head)) * 2.0 + prefill_keys * attn_per_key);
  const double decode_s = ns * n / row["decode_tps"].get<double>();
  const double prefill_s = ns * p / row["prefill_tps"].get<double>();
  EXPECT_NEAR(row["decode_gops"].get<double>(), decode_ops / decode_s / 1e9, 1e-6 * row["decode_gops"].get<double>());
  EXPECT_NEAR(row["prefill_gops"].get<double>(), prefill_ops / prefill_s / 1e9, 1e-6 * row["prefill_gops"].get<double>());
  EXPECT_GT(row["decode_peak_fraction"].get<double>(), 0.0);
  EXPECT_LT(row["decode_peak_fraction"].get<double>(), 1.0);
}

// --profile without --batch times one more prompt op by op: its products' GOP/s are the
// prompt's product arithmetic over the time the profile gave them.
TEST(BenchCli, TheProfileTimesAPromptOpByOp) {
  REQUIRE_MODEL();
  const int p = 32;
  auto r = run_metro({"bench", "-m", metro::testing::default_model_path(), "-p", std::to_string(p), "-n", "4", "-r",
                      "1", "-t", "1", "--profile", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("prefill_profile_ms") && j.contains("prefill_profile_gops")) << j.dump();
  const nlohmann::json& ms = j["prefill_profile_ms"];
  double sum = 0;
  for (const auto& [op, v] : ms.items()) {
    if (op != "total") sum += v.get<double>();
  }
  // The total adds the backend's waits (none to speak of on the CPU) to the ops.
  EXPECT_LE(sum, ms["total"].get<double>() * (1 + 1e-9));
  EXPECT_GT(sum, 0.95 * ms["total"].get<double>());
  const double macs = product_macs_from_file(true), macs_no_head = product_macs_from_file(false);
  const double ops = 2.0 * (p * macs_no_head + (macs - macs_no_head));
  EXPECT_NEAR(j["prefill_profile_gops"]["project"].get<double>(), ops / (ms["project"].get<double>() * 1e-3) / 1e9,
              1e-6 * j["prefill_profile_gops"]["project"].get<double>());
  EXPECT_GT(j["prefill_profile_gops"]["attention"].get<double>(), 0.0);
}

TEST(BenchCli, RefusesAnUnknownKvType) {
  auto r = run_metro({"bench", "-m", "none.gguf", "--kv-type", "q4_0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--kv-type must be f16 or q8_0"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace metro
