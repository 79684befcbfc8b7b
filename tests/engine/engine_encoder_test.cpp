// An encoder (all-MiniLM-L6-v2, converted in memory) behind the engine: every input is
// computed whole in one step under both schedulers, whatever else shares the step, so its
// embedding is the one it gets alone; generation is refused.
#include <gtest/gtest.h>

#include <cmath>

#include "convert/convert.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "support/model_run.h"
#include "support/test_util.h"
#include "tokenizer/tokenizer.h"

namespace metro::engine {
namespace {

struct Encoder {
  std::shared_ptr<const model::Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tok;
};

Encoder load_minilm() {
  Encoder e;
  auto bytes = convert::convert_hf(metro::testing::minilm_dir(), {});
  EXPECT_TRUE(bytes.ok()) << bytes.status().message();
  if (!bytes.ok()) return e;
  auto file = gguf::File::copy_of(*bytes);
  EXPECT_TRUE(file.ok());
  if (!file.ok()) return e;
  auto tok = tokenizer::Tokenizer::from_gguf(*file);
  EXPECT_TRUE(tok.ok());
  if (!tok.ok()) return e;
  e.tok = std::make_unique<tokenizer::Tokenizer>(std::move(*tok));
  auto m = model::Model::from_file(std::move(*file));
  EXPECT_TRUE(m.ok());
  if (m.ok()) e.model = std::shared_ptr<const model::Model>(std::move(*m));
  return e;
}

Request embed_request(std::vector<int32_t> prompt) {
  Request r;
  r.kind = RequestKind::kEmbed;
  r.prompt = std::move(prompt);
  return r;
}

using metro::testing::cosine;

class EngineEncoder : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { REQUIRE_MINILM(); }
};

// Inputs longer than the configured step budget still go whole (the engine raises the
// budget to the context), and 24 concurrent inputs of many lengths each get their own
// embedding.
TEST_P(EngineEncoder, ConcurrentInputsEachGetTheirOwnEmbedding) {
  Encoder enc = load_minilm();
  ASSERT_TRUE(enc.model);
  EngineConfig cfg;
  cfg.sched = GetParam();
  cfg.max_batch_tokens = 64;  // below the longest input: raised to the context for an encoder
  cfg.n_threads = 2;
  auto eng = Engine::create(enc.model, *enc.tok, cfg);
  ASSERT_TRUE(eng.ok()) << eng.status().message();
  std::vector<std::vector<int32_t>> inputs;
  for (int i = 0; i < 24; ++i) {
    std::string text = "Sentence " + std::to_string(i) + ":";
    for (int w = 0; w < (i * 7) % 40 + 1; ++w) text += " word" + std::to_string((w * 13 + i) % 97);
    inputs.push_back(enc.tok->encode(text, true, false));
  }
  inputs.push_back(std::vector<int32_t>(120, 2003));  // 120 tokens: past the step budget of 64
  std::vector<std::vector<float>> alone;
  for (const auto& in : inputs) {
    auto h = (*eng)->submit(embed_request(in));
    ASSERT_TRUE(h.ok());
    alone.push_back(metro::testing::collect(*h).embedding);
  }
  std::vector<Handle> handles;
  for (const auto& in : inputs) {
    auto h = (*eng)->submit(embed_request(in));
    ASSERT_TRUE(h.ok());
    handles.push_back(*h);
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    const metro::testing::Generation g = metro::testing::collect(handles[i]);
    ASSERT_EQ(g.embedding.size(), 384u) << i;
    EXPECT_GT(cosine(g.embedding, alone[i]), 0.99999) << i;
    EXPECT_EQ(g.usage.prompt_tokens, static_cast<int>(inputs[i].size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Schedulers, EngineEncoder, ::testing::Values("sla", "fcfs"));

TEST(EngineEncoderRefusals, GenerationAndOverlongInputs) {
  REQUIRE_MINILM();
  Encoder enc = load_minilm();
  ASSERT_TRUE(enc.model);
  auto eng = Engine::create(enc.model, *enc.tok, EngineConfig{});
  ASSERT_TRUE(eng.ok());
  auto gen = (*eng)->submit(metro::testing::greedy_request({101, 2003, 102}, 4));
  ASSERT_FALSE(gen.ok());
  EXPECT_NE(gen.status().message().find("embeddings only"), std::string::npos);
  auto longer = (*eng)->submit(embed_request(std::vector<int32_t>(600, 2003)));  // context 512
  EXPECT_FALSE(longer.ok());
}

}  // namespace
}  // namespace metro::engine
