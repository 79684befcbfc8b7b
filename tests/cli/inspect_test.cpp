#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gguf/gguf_test_util.h"
#include "support/test_util.h"

namespace metro {
namespace {

using metro::testing::run_metro;
using metro::testing::TempFile;

TEST(InspectCli, DefaultModelJson) {
  REQUIRE_MODEL();
  auto r = run_metro({"inspect", metro::testing::default_model_path(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "llama");
  EXPECT_EQ(j["n_layer"], 30);
  EXPECT_EQ(j["n_embd"], 576);
  EXPECT_EQ(j["n_head"], 9);
  EXPECT_EQ(j["n_head_kv"], 3);
  EXPECT_EQ(j["n_ff"], 1536);
  EXPECT_EQ(j["n_vocab"], 49152);
  EXPECT_EQ(j["n_ctx_train"], 8192);
  EXPECT_EQ(j["n_tensors"], 272);
  // 134.5 M parameters: embeddings 49152*576 + 30 layers.
  EXPECT_NEAR(j["n_params"].get<double>(), 134.5e6, 0.1e6);
  EXPECT_GT(j["file_bytes"].get<uint64_t>(), 90u << 20);
  EXPECT_EQ(j["kv_bytes_per_token_f16"], 2 * 30 * 3 * 64 * 2);
  EXPECT_EQ(j["tokenizer"]["model"], "gpt2");
  EXPECT_TRUE(j["tokenizer"]["chat_template"].get<bool>());
  // The layouts the kernels will use, and bytes of weights a decode token reads (~92 MiB).
  EXPECT_NE(j["weight_layouts"].get<std::string>().find("Q4_1"), std::string::npos);
  EXPECT_NEAR(j["weight_bytes_per_token"].get<double>(), 92.0 * (1 << 20), 2.0 * (1 << 20));
}

TEST(InspectCli, DefaultModelText) {
  REQUIRE_MODEL();
  auto r = run_metro({"inspect", metro::testing::default_model_path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("layers:          30"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("chat template:   present"), std::string::npos) << r.out;
}

// A mixture-of-experts file (tests/fixtures/moe): its experts in JSON and text, and the
// weights a decode token reads counting its 2 experts of 8, not all of them.
TEST(InspectCli, MixtureOfExperts) {
  const std::string path = metro::testing::source_path("tests/fixtures/moe/qwen2moe_tiny.gguf");
  auto r = run_metro({"inspect", path, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "qwen2moe");
  EXPECT_EQ(j["experts"]["count"], 8);
  EXPECT_EQ(j["experts"]["used"], 2);
  EXPECT_EQ(j["experts"]["n_ff"], 32);
  EXPECT_EQ(j["experts"]["shared_n_ff"], 96);
  EXPECT_EQ(j["experts"]["weights_norm"], false);
  EXPECT_EQ(j["experts"]["gating"], "softmax");
  // F32 weights: the embedding row (256 B), the head (256 x 64), and per layer Q, K, V, O
  // (64x64, 32x64, 32x64, 64x64), the router (8x64), the shared expert (3 of 96x64) and 2 of
  // the 8 experts' 3 matrices of 32x64 (all 8 would add 6 x 3 x 8 KiB a layer).
  const uint64_t layer = 4 * (64 * 64 + 32 * 64 + 32 * 64 + 64 * 64 + 8 * 64 + 3 * 96 * 64 + 2 * 3 * 32 * 64);
  EXPECT_EQ(j["weight_bytes_per_token"].get<uint64_t>(), 256 + 4 * 256 * 64 + 2 * layer);
  auto t = run_metro({"inspect", path});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("experts:         2 of 8 per token, 32 wide, softmax weights as routed; a shared expert 96 wide"),
            std::string::npos)
      << t.out;
}

TEST(InspectCli, MalformedFileIsOneLineExitOne) {
  auto bytes = metro::testing::small_valid_gguf();
  bytes.resize(bytes.size() / 2);
  TempFile tmp;
  tmp.write(bytes);
  auto r = run_metro({"inspect", tmp.path()});
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.exit_code, 1);
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  EXPECT_NE(r.err.find("offset"), std::string::npos) << r.err;
}

TEST(InspectCli, MissingFile) {
  auto r = run_metro({"inspect", "/definitely/not/here.gguf"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.signal, 0);
}

}  // namespace
}  // namespace metro
