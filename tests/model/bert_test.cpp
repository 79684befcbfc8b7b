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

std::vector<float> normalized(std::vector<double> v) {
  double n = 0.0;
  for (double x : v) n += x * x;
  n = std::sqrt(n);
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i] / n);
  return out;
}

// Mean-pooled, normalized embeddings of several sequences computed in one step.
std::vector<std::vector<float>> embed(const Model& m, const std::vector<std::vector<int32_t>>& seqs) {
  ThreadPool pool(2);
  int total = 0;
  for (const auto& s : seqs) total += static_cast<int>(s.size());
  WorkspaceLimits lim;
  lim.max_tokens = total;
  lim.max_logits = 1;
  lim.max_seqs = static_cast<int>(seqs.size());
  lim.max_blocks_per_seq = 64;
  Workspace ws = m.make_workspace(lim);
  // An encoder keeps no KV: each sequence's table only has to cover its positions.
  KvView kv;
  kv.layout = m.kv_layout(kernels::DType::kF16, 16);
  kv.n_layer = m.kv_layers();
  kv.n_blocks = 64;
  std::vector<int32_t> table(64);
  for (int i = 0; i < 64; ++i) table[static_cast<size_t>(i)] = i;
  Batch b;
  for (size_t s = 0; s < seqs.size(); ++s) {
    kv.tables.emplace_back(table);
    for (size_t i = 0; i < seqs[s].size(); ++i) b.add(seqs[s][i], static_cast<int32_t>(i), static_cast<int32_t>(s), false);
  }
  ForwardOptions fo;
  fo.want_hidden = true;
  auto out = m.forward(b, kv, ws, pool, fo);
  EXPECT_TRUE(out.ok()) << out.status().message();
  std::vector<std::vector<float>> result;
  if (!out.ok()) return result;
  const int n_embd = static_cast<int>(m.hparams().n_embd);
  int t = 0;
  for (const auto& s : seqs) {
    std::vector<double> sum(static_cast<size_t>(n_embd), 0.0);
    for (size_t i = 0; i < s.size(); ++i, ++t) {
      const float* h = out->hidden_row(t, n_embd);
      for (int d = 0; d < n_embd; ++d) sum[static_cast<size_t>(d)] += h[d];
    }
    result.push_back(normalized(std::move(sum)));
  }
  return result;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double dot = 0.0, na = 0.0, nb = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    na += static_cast<double>(a[i]) * a[i];
    nb += static_cast<double>(b[i]) * b[i];
  }
  return dot / std::sqrt(na * nb);
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
