// The vocabulary against the rows of the output and embedding matrices: each row must have a
// token and each token a row, or the model is refused at load with the tensor's name and
// both sizes (a row without a token would be sampled and print as nothing).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "engine/engine.h"
#include "model/model.h"
#include "support/synthetic_model.h"
#include "tokenizer/tokenizer.h"

namespace metro::model {
namespace {

using metro::testing::make_synthetic_model;
using metro::testing::SyntheticModelSpec;

Expected<std::unique_ptr<Model>> load_spec(const SyntheticModelSpec& spec, std::vector<uint8_t>& keep) {
  keep = make_synthetic_model(spec);
  METRO_ASSIGN_OR_RETURN(gguf::File f, gguf::File::parse(keep));
  return Model::from_file(std::move(f));
}

void expect_refused(const Expected<std::unique_ptr<Model>>& m, const std::string& tensor,
                    const std::string& rows, const std::string& tokens) {
  ASSERT_FALSE(m.ok()) << "loaded a model whose vocabulary does not match " << tensor;
  const std::string& msg = m.status().message();
  EXPECT_NE(msg.find("'" + tensor + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(rows + " rows"), std::string::npos) << msg;
  EXPECT_NE(msg.find(tokens + " tokens"), std::string::npos) << msg;
}

// The probe's case, scaled down: 100 tokens against 300 rows, `vocab_size` saying 300.
TEST(ModelVocab, OutputRowsBeyondTheVocabularyAreRefused) {
  std::vector<uint8_t> keep;
  SyntheticModelSpec s;
  s.n_vocab = 300;
  s.n_tokens = 100;
  s.tied_output = false;
  expect_refused(load_spec(s, keep), "output.weight", "300", "100");
  // Tied: the embedding is the output matrix.
  s.tied_output = true;
  expect_refused(load_spec(s, keep), "token_embd.weight", "300", "100");
  // Without `vocab_size` the vocabulary's length is the model's: still named by tensor.
  s.write_vocab_size = false;
  expect_refused(load_spec(s, keep), "token_embd.weight", "300", "100");
}

TEST(ModelVocab, TokensBeyondTheRowsAreRefused) {
  std::vector<uint8_t> keep;
  SyntheticModelSpec s;
  s.n_vocab = 300;
  s.n_tokens = 320;
  auto m = load_spec(s, keep);
  expect_refused(m, "token_embd.weight", "300", "320");
  if (!m.ok()) {
    EXPECT_NE(m.status().message().find("tokens 300 and up have no row"), std::string::npos);
  }
}

TEST(ModelVocab, MatchingVocabularyLoads) {
  std::vector<uint8_t> keep;
  SyntheticModelSpec s;
  s.n_vocab = 320;
  auto m = load_spec(s, keep);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ((*m)->hparams().n_vocab, 320u);
}

// A tokenizer that does not come from the model's own file: the engine refuses it unless
// its size is the output matrix's, naming both.
TEST(ModelVocab, EngineRefusesATokenizerOfAnotherSize) {
  std::vector<uint8_t> keep_model, keep_tok;
  SyntheticModelSpec s;
  s.n_vocab = 300;
  auto m = load_spec(s, keep_model);
  ASSERT_TRUE(m.ok()) << m.status().message();
  std::shared_ptr<const Model> model = std::move(*m);
  for (uint32_t n : {100u, 400u}) {
    SyntheticModelSpec other;
    other.n_vocab = n;
    keep_tok = make_synthetic_model(other);
    auto f = gguf::File::parse(keep_tok);
    ASSERT_TRUE(f.ok());
    auto tok = tokenizer::Tokenizer::from_gguf(*f);
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    engine::EngineConfig cfg;
    cfg.n_threads = 1;
    cfg.ctx_total = 256;
    auto e = engine::Engine::create(model, *tok, cfg);
    ASSERT_FALSE(e.ok());
    const std::string& msg = e.status().message();
    EXPECT_NE(msg.find(std::to_string(n) + " tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'token_embd.weight' has 300 rows"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace metro::model
