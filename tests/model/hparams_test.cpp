#include "model/hparams.h"

#include <gtest/gtest.h>

#include "gguf/writer.h"
#include "support/test_util.h"

namespace metro::model {
namespace {

// Metadata of a tiny llama with `layers_present` attn_norm tensors in the file.
std::vector<uint8_t> tiny_llama(uint32_t block_count, uint32_t layers_present, uint32_t n_embd,
                                uint32_t n_head, uint32_t n_head_kv) {
  gguf::Writer w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.embedding_length", n_embd);
  w.add_u32("llama.block_count", block_count);
  w.add_u32("llama.attention.head_count", n_head);
  w.add_u32("llama.attention.head_count_kv", n_head_kv);
  w.add_u32("llama.feed_forward_length", 32);
  w.add_u32("llama.context_length", 128);
  w.add_string_array("tokenizer.ggml.tokens", {"a", "b", "c"});
  std::vector<uint8_t> d(static_cast<size_t>(n_embd) * 4, 0);
  for (uint32_t il = 0; il < layers_present; ++il) {
    (void)w.add_tensor("blk." + std::to_string(il) + ".attn_norm.weight", gguf::GgmlType::kF32,
                       {n_embd}, d);
  }
  return w.serialize();
}

TEST(HParams, ReadsTinyLlama) {
  auto bytes = tiny_llama(2, 2, 16, 4, 2);
  auto f = gguf::File::parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  auto h = HParams::from_gguf(*f);
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->head_dim, 4u);
  EXPECT_EQ(h->n_gqa(), 2u);
  EXPECT_EQ(h->n_vocab, 3u);
  EXPECT_TRUE(h->tied_output);
  EXPECT_EQ(h->kv_bytes_per_token(2.0), 2u * 2 * 2 * 4 * 2);
}

TEST(HParams, RefusesLayerCountAboveTensorsPresent) {
  auto bytes = tiny_llama(1000, 2, 16, 4, 2);
  auto f = gguf::File::parse(bytes);
  ASSERT_TRUE(f.ok());
  auto h = HParams::from_gguf(*f);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("blk.2.attn_norm.weight"), std::string::npos)
      << h.status().message();
}

TEST(HParams, RefusesHeadCountsThatDoNotDivide) {
  auto bytes = tiny_llama(1, 1, 16, 3, 3);
  auto f = gguf::File::parse(bytes);
  ASSERT_TRUE(f.ok());
  auto h = HParams::from_gguf(*f);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("head_count"), std::string::npos) << h.status().message();
  auto bytes2 = tiny_llama(1, 1, 16, 4, 3);
  auto f2 = gguf::File::parse(bytes2);
  ASSERT_TRUE(f2.ok());
  EXPECT_FALSE(HParams::from_gguf(*f2).ok());
}

TEST(HParams, RefusesUnknownArchitectureByName) {
  gguf::Writer w;
  w.add_string("general.architecture", "mamba");
  auto bytes = w.serialize();
  auto f = gguf::File::parse(bytes);
  ASSERT_TRUE(f.ok());
  auto h = HParams::from_gguf(*f);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("mamba"), std::string::npos);
}

// YaRN from metadata: factor, original context and the beta and attention keys; a factor
// below 1 or betas the wrong way round are refused.
TEST(HParams, ReadsYarnScaling) {
  auto make = [](float factor, float beta_fast) {
    gguf::Writer w;
    w.add_string("general.architecture", "qwen3");
    w.add_u32("qwen3.embedding_length", 16);
    w.add_u32("qwen3.block_count", 1);
    w.add_u32("qwen3.attention.head_count", 4);
    w.add_u32("qwen3.feed_forward_length", 32);
    w.add_u32("qwen3.context_length", 131072);
    w.add_string("qwen3.rope.scaling.type", "yarn");
    w.add_f32("qwen3.rope.scaling.factor", factor);
    w.add_u32("qwen3.rope.scaling.original_context_length", 32768);
    w.add_f32("qwen3.rope.scaling.yarn_beta_fast", beta_fast);
    w.add_string_array("tokenizer.ggml.tokens", {"a", "b", "c"});
    std::vector<uint8_t> d(16 * 4, 0), hd(4 * 4, 0);
    (void)w.add_tensor("blk.0.attn_norm.weight", gguf::GgmlType::kF32, {16}, d);
    (void)w.add_tensor("blk.0.attn_q_norm.weight", gguf::GgmlType::kF32, {4}, hd);
    return w.serialize();
  };
  auto bytes = make(4.0f, 16.0f);
  auto f = gguf::File::parse(bytes);
  ASSERT_TRUE(f.ok());
  auto h = HParams::from_gguf(*f);
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->rope_scaling, RopeScaling::kYarn);
  EXPECT_EQ(h->rope_scale_factor, 4.0f);
  EXPECT_EQ(h->rope_orig_ctx, 32768u);
  EXPECT_EQ(h->yarn_beta_fast, 16.0f);
  EXPECT_EQ(h->yarn_beta_slow, 1.0f);
  EXPECT_EQ(h->rope_type, RopeType::kNeox);
  EXPECT_TRUE(h->has_qk_norm);
  const kernels::RopeConfig rc = rope_config(*h, nullptr);
  EXPECT_EQ(rc.yarn.factor, 4.0f);
  EXPECT_EQ(rc.yarn.orig_ctx, 32768);
  EXPECT_EQ(rc.linear_scale, 1.0f);
  for (auto [factor, beta] : {std::pair{0.5f, 32.0f}, std::pair{4.0f, 0.5f}}) {
    auto b = make(factor, beta);
    auto g = gguf::File::parse(b);
    ASSERT_TRUE(g.ok());
    EXPECT_FALSE(HParams::from_gguf(*g).ok()) << factor << " " << beta;
  }
}

TEST(HParams, DefaultModelHasSmolLM2Shape) {
  REQUIRE_MODEL();
  auto f = gguf::File::open(metro::testing::default_model_path());
  ASSERT_TRUE(f.ok()) << f.status().message();
  auto h = HParams::from_gguf(*f);
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->architecture, "llama");
  EXPECT_EQ(h->n_layer, 30u);
  EXPECT_EQ(h->n_embd, 576u);
  EXPECT_EQ(h->n_head, 9u);
  EXPECT_EQ(h->n_head_kv, 3u);
  EXPECT_EQ(h->head_dim, 64u);
  EXPECT_EQ(h->n_ff, 1536u);
  EXPECT_EQ(h->n_vocab, 49152u);
  EXPECT_TRUE(h->tied_output);
}

}  // namespace
}  // namespace metro::model
