// metro sensitivity on the default model: the KL cost of lowering each ffn_down matrix of
// the last layers alone, and a plan for a byte budget that metro quantize applies.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/engine_test_util.h"
#include "gguf/gguf.h"
#include "support/test_util.h"

namespace metro {
namespace {

using metro::testing::run_metro;
using metro::testing::TempFile;

uint64_t matrix_bytes(const std::string& path) {
  auto f = gguf::File::open(path);
  EXPECT_TRUE(f.ok()) << f.status().message();
  uint64_t n = 0;
  if (f.ok()) {
    for (const auto& t : f->tensors()) n += t.n_dims == 2 ? t.n_bytes : 0;
  }
  return n;
}

TEST(SensitivityCli, CostsPerTensorAndAPlanThatQuantizeApplies) {
  REQUIRE_MODEL();
  const std::string model = metro::testing::default_model_path();
  const std::string text = metro::testing::source_path("tests/fixtures/perplexity/metro_essay.txt");
  const uint64_t before = matrix_bytes(model);
  // Under ASan+UBSan one matrix (three candidates) runs the same code; the release run costs
  // eleven.
  const bool one = metro::testing::sanitized();
  const uint64_t budget = one ? before - 1 : before - 400000;  // else two ffn_down matrices lowered at least
  TempFile plan(".json"), out(".gguf");
  auto r = run_metro({"sensitivity", "-m", model, "-f", text, "--types", "q4_0,q3_k,q2_k", "--tensors",
                      one ? "blk.29.ffn_down.weight" : "blk.2*.ffn_down.weight", "--ctx", "64", "--json", "-t", "2",
                      "--budget-bytes",
                      std::to_string(budget), "-o", plan.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["matrix_bytes"].get<uint64_t>(), before);
  const auto& moves = j["moves"];
  ASSERT_EQ(moves.size(), one ? 3u : 33u);  // blk.2 and blk.20-29, three formats each, all smaller than Q4_1
  std::map<std::string, double> kl_by_type;
  double last = 0.0;
  for (const auto& m : moves) {
    const std::string name = m["tensor"].get<std::string>();
    EXPECT_EQ(name.rfind("blk.2", 0), 0u) << name;
    EXPECT_NE(name.find(".ffn_down.weight"), std::string::npos) << name;
    const double kl = m["kl_mean"].get<double>();
    EXPECT_GE(kl, 0.0);
    kl_by_type[m["type"].get<std::string>()] += kl;
    const double per_byte = kl / static_cast<double>(m["bytes_before"].get<uint64_t>() - m["bytes_after"].get<uint64_t>());
    EXPECT_GE(per_byte, last);  // cheapest KL per byte first
    last = per_byte;
  }
  // Fewer bits cost more: summed over the matrices, Q2_K > Q3_K.
  EXPECT_GT(kl_by_type["Q2_K"], kl_by_type["Q3_K"]);
  EXPECT_GT(kl_by_type["Q3_K"], 0.0);

  const uint64_t planned = j["plan"]["bytes"].get<uint64_t>();
  EXPECT_LE(planned, budget);
  std::ifstream pin(plan.path());
  const auto p = nlohmann::json::parse(pin);
  EXPECT_EQ(p["type"], "keep");
  EXPECT_GE(p["tensors"].size(), one ? 1u : 2u);
  EXPECT_EQ(p["tensors"], j["plan"]["tensors"]);
  auto q = run_metro({"quantize", model, out.path(), "--plan", plan.path()});
  ASSERT_EQ(q.exit_code, 0) << q.err;
  EXPECT_EQ(matrix_bytes(out.path()), planned);

  // A budget the formats cannot reach is an error, and so is a budget without a file.
  auto small = run_metro({"sensitivity", "-m", model, "-f", text, "--types", "q4_0", "--tensors",
                          "blk.29.ffn_down.weight", "--ctx", "64", "--budget-bytes", "1", "-o", plan.path()});
  EXPECT_EQ(small.exit_code, 1);
  EXPECT_NE(small.err.find("cannot bring the matrices under the budget"), std::string::npos) << small.err;
  auto half = run_metro({"sensitivity", "-m", model, "-f", text, "--budget-bytes", "1"});
  EXPECT_EQ(half.exit_code, 1);
  EXPECT_NE(half.err.find("--budget-bytes and -o go together"), std::string::npos) << half.err;
}

}  // namespace
}  // namespace metro
