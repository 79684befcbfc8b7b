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
