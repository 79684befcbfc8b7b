// BERT-family encoders on the real all-MiniLM-L6-v2 (`make model-minilm`), converted from
// its Hugging Face directory by `metro convert`'s code: token ids and embeddings against
// sentence-transformers' (tests/fixtures/embeddings, made by scripts/make_embedding_fixture.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/thread_pool.h"
#include "convert/convert.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "support/model_run.h"
#include "support/test_util.h"
#include "tokenizer/tokenizer.h"

namespace metro::model {
namespace {

using nlohmann::json;

json fixture() {
  std::ifstream in(metro::testing::source_path("tests/fixtures/embeddings/minilm_sentence_transformers.json"));
  return json::parse(in);
}

struct Converted {
  std::unique_ptr<Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tok;
};

Converted convert_minilm(kernels::DType type) {
  Converted c;
  convert::ConvertOptions opts;
  opts.type = type;
  auto bytes = convert::convert_hf(metro::testing::minilm_dir(), opts);
  EXPECT_TRUE(bytes.ok()) << bytes.status().message();
  if (!bytes.ok()) return c;
  auto file = gguf::File::copy_of(*bytes);
  EXPECT_TRUE(file.ok()) << file.status().message();
  if (!file.ok()) return c;
  auto tok = tokenizer::Tokenizer::from_gguf(*file);
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  if (!tok.ok()) return c;
  c.tok = std::make_unique<tokenizer::Tokenizer>(std::move(*tok));
  auto m = Model::from_file(std::move(*file));
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (m.ok()) c.model = std::move(*m);
  return c;
}

using metro::testing::cosine;

std::vector<std::vector<float>> embed(const Model& m, const std::vector<std::vector<int32_t>>& seqs) {
  return metro::testing::mean_pooled_embeddings(m, seqs);
}

std::vector<float> floats(const json& j) { return j.get<std::vector<float>>(); }

struct TypeCase {
  kernels::DType type;
  double min_cosine;  // per sentence, against sentence-transformers' F32 model
};

class MiniLm : public ::testing::TestWithParam<TypeCase> {
 protected:
  void SetUp() override { REQUIRE_MINILM(); }
};

// The converted model's ids equal the reference tokenizer's, and each sentence's embedding
// is within the bound of sentence-transformers' (0.999 in F32 and F16).
TEST_P(MiniLm, EmbeddingsMatchSentenceTransformers) {
  Converted c = convert_minilm(GetParam().type);
  ASSERT_TRUE(c.model && c.tok);
  EXPECT_TRUE(c.model->hparams().encoder);
  EXPECT_EQ(c.model->hparams().pooling, Pooling::kMean);
  const json fx = fixture();
  ASSERT_GE(fx["items"].size(), 50u);
  double worst = 1.0;
  std::string worst_text;
  for (const json& item : fx["items"]) {
    const std::string text = item["text"];
    const auto want_ids = item["ids"].get<std::vector<int32_t>>();
    // The reference matches special-token text ("[CLS]") in the input, as parse_special does.
    std::vector<int32_t> ids = c.tok->encode(text, /*add_special=*/true, /*parse_special=*/true);
    const int max_len = fx["max_seq_length"];
    if (static_cast<int>(ids.size()) > max_len) {  // the reference truncates: [CLS] ... [SEP]
      ids.resize(static_cast<size_t>(max_len - 1));
      ids.push_back(want_ids.back());
    }
    EXPECT_EQ(ids, want_ids) << text;
    const std::vector<float> e = embed(*c.model, {want_ids}).at(0);
    const double cs = cosine(e, floats(item["embedding"]));
    if (cs < worst) {
      worst = cs;
      worst_text = text;
    }
  }
  EXPECT_GE(worst, GetParam().min_cosine) << "worst sentence: " << worst_text;
  std::printf("[ MiniLM %s ] worst cosine to sentence-transformers over %zu sentences: %.6f\n",
              std::string(kernels::dtype_name(GetParam().type)).c_str(), fx["items"].size(), worst);
}

INSTANTIATE_TEST_SUITE_P(Types, MiniLm,
                         ::testing::Values(TypeCase{kernels::DType::kF32, 0.999}, TypeCase{kernels::DType::kF16, 0.999},
                                           TypeCase{kernels::DType::kQ8_0, 0.99}),
                         [](const auto& p) { return std::string(kernels::dtype_name(p.param.type)); });

// Sequences of one step attend only within themselves: a batch of three gives each the
// embedding it gets alone (bidirectional attention confined to its run).
TEST(Bert, SequencesInOneStepDoNotSeeEachOther) {
  REQUIRE_MINILM();
  Converted c = convert_minilm(kernels::DType::kF32);
  ASSERT_TRUE(c.model && c.tok);
  const std::vector<std::vector<int32_t>> seqs = {
      c.tok->encode("What is the capital of France?", true, false),
      c.tok->encode("A dog is running in the park, chasing a ball.", true, false),
      c.tok->encode("hi", true, false)};
  const auto together = embed(*c.model, seqs);
  ASSERT_EQ(together.size(), 3u);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto alone = embed(*c.model, {seqs[i]}).at(0);
    EXPECT_GT(cosine(alone, together[i]), 0.999999) << i;
  }
  // And the embeddings tell a paraphrase from a different question, which the semantic
  // cache relies on.
  const auto q = embed(*c.model, {c.tok->encode("What is the capital of France?", true, false),
                                  c.tok->encode("Which city is the capital of France?", true, false),
                                  c.tok->encode("What is the capital of Germany?", true, false)});
  EXPECT_GT(cosine(q[0], q[1]), 0.9);
  EXPECT_LT(cosine(q[0], q[2]), 0.8);
}

// nomic-bert (rotated queries and keys instead of learned positions, a fused QKV matrix, a
// SiLU-gated FFN, no product biases) on a tiny file against llama.cpp's embeddings of it
// (tests/fixtures/embeddings/make_nomic_fixture.py): the same token ids, and each sentence's
// mean-pooled embedding, alone and with the others in one step.
TEST(NomicBert, EmbeddingsMatchLlamaCpp) {
  std::ifstream in(metro::testing::source_path("tests/fixtures/embeddings/nomic_bert_tiny_embeddings.json"));
  const json fx = json::parse(in);
  auto file = gguf::File::open(metro::testing::source_path("tests/fixtures/embeddings/nomic_bert_tiny.gguf"));
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto tok = tokenizer::Tokenizer::from_gguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  auto m = Model::from_file(std::move(*file));
  ASSERT_TRUE(m.ok()) << m.status().message();
  const HParams& hp = (*m)->hparams();
  EXPECT_TRUE(hp.encoder && hp.encoder_rope && hp.fused_qkv);
  EXPECT_EQ(hp.rope_type, RopeType::kNeox);
  EXPECT_FLOAT_EQ(hp.rope_freq_base, 1000.0f);
  std::vector<std::vector<int32_t>> all;
  std::vector<std::vector<float>> want;
  for (const json& c : fx["cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok->encode(c["text"].get<std::string>(), true, false), ids) << c["text"];
    all.push_back(ids);
    want.push_back(floats(c["embedding"]));
  }
  ASSERT_GE(all.size(), 5u);
  const auto together = embed(**m, all);
  double worst = 1.0;
  for (size_t i = 0; i < all.size(); ++i) {
    const auto alone = embed(**m, {all[i]}).at(0);
    worst = std::min({worst, cosine(alone, want[i]), cosine(together[i], want[i])});
  }
  std::printf("[ nomic-bert ] worst cosine to llama.cpp over %zu sentences: %.7f\n", all.size(), worst);
  EXPECT_GT(worst, 0.99999);
  // The rotation is what tells these two apart: the same words in another order.
  const auto ab = embed(**m, {tok->encode("the train runs under the city", true, false),
                              tok->encode("the city runs under the train", true, false)});
  EXPECT_LT(cosine(ab[0], ab[1]), 0.999);
}

// An encoder has no output head: a batch that wants logits is refused, not computed.
TEST(Bert, RefusesLogits) {
  REQUIRE_MINILM();
  Converted c = convert_minilm(kernels::DType::kF16);
  ASSERT_TRUE(c.model);
  ThreadPool pool(1);
  WorkspaceLimits lim;
  lim.max_tokens = 8;
  Workspace ws = c.model->make_workspace(lim);
  SequenceKv kv(*c.model, 16);
  Batch b;
  b.add(101, 0, 0, false);
  b.add(102, 1, 0, true);
  auto out = c.model->forward(b, kv.view(), ws, pool);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("no output head"), std::string::npos) << out.status().message();
}

}  // namespace
}  // namespace metro::model
