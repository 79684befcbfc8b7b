// granite against llama.cpp on a tiny file (tests/fixtures/granite, made by make_fixture.py
// there) and against the double-precision reference forward: llama's layer with granite's
// four factors (embeddings, q·k, each sublayer's output before it joins the stream, and the
// logits). The fixture also holds llama.cpp's logits of the same weights with neutral
// factors, to show that each run depends on them.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/writer.h"
#include "model/model.h"
#include "model/reference_forward.h"
#include "support/model_run.h"
#include "support/test_util.h"

namespace metro::model {
namespace {

using Rows = std::vector<std::vector<float>>;
using metro::testing::max_abs_diff;
using metro::testing::sequence_logits;

const char* kFixture = "tests/fixtures/granite/granite_tiny.gguf";

TEST(Granite, MatchesLlamaCppAndTheReferenceWithItsFactors) {
  std::ifstream in(metro::testing::source_path("tests/fixtures/granite/granite_tiny_logits.json"));
  const auto fx = nlohmann::json::parse(in);
  auto m = Model::load(metro::testing::source_path(kFixture));
  ASSERT_TRUE(m.ok()) << m.status().message();
  const HParams& hp = (*m)->hparams();
  EXPECT_EQ(hp.architecture, "granite");
  EXPECT_FLOAT_EQ(hp.embd_scale, 12.0f);
  EXPECT_FLOAT_EQ(hp.attn_scale, 1.0f / 64);
  EXPECT_FLOAT_EQ(hp.residual_scale, 0.22f);
  EXPECT_FLOAT_EQ(hp.logit_scale, 8.0f);
  EXPECT_TRUE(hp.tied_output);
  EXPECT_EQ(hp.rope_type, RopeType::kNormal);
  const auto toks = fx["tokens"].get<std::vector<int32_t>>();
  const Rows want = fx["logits"].get<Rows>(), neutral = fx["neutral_logits"].get<Rows>();
  const double factors_move = max_abs_diff(want, neutral);
  auto f = gguf::File::open(metro::testing::source_path(kFixture));
  ASSERT_TRUE(f.ok());
  auto ref = reference_forward(*f, toks);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  const Rows& ref_rows = *ref;
  const double ref_vs_llama = max_abs_diff(ref_rows, want);
  for (int chunk : {40, 7, 1}) {
    const Rows got = sequence_logits(**m, toks, chunk, 2, 16, 512);
    ASSERT_EQ(got.size(), toks.size());
    const double own = max_abs_diff(got, want);
    const double own_ref = max_abs_diff(got, ref_rows);
    std::printf("granite: chunk %d: largest difference %.5f from llama.cpp's logits, %.5f from the reference "
                "(the factors move them by %.4f)\n",
                chunk, own, own_ref, factors_move);
    // metro keeps K and V in F16 pages, llama.cpp here in F32.
    EXPECT_LT(own, 0.01) << "chunk " << chunk;
    EXPECT_LT(own_ref, 0.01) << "chunk " << chunk;
  }
  EXPECT_LT(ref_vs_llama, 1e-3) << "the reference forward reads the factors as llama.cpp does";
  EXPECT_GT(factors_move, 0.5);
}

// The same file without one of its keys: the logit scale is required (llama.cpp refuses a
// granite file without it too); each other factor left out is 1 (q·k: 1/sqrt of the head
// size), so the logits change.
TEST(Granite, ALogitScaleIsRequiredAndTheOtherFactorsDefault) {
  auto f = gguf::File::open(metro::testing::source_path(kFixture));
  ASSERT_TRUE(f.ok());
  auto without = [&](std::string_view key) {
    gguf::Writer w;
    w.copy_metadata(*f, key);
    for (const gguf::TensorInfo& t : f->tensors()) {
      std::vector<uint64_t> dims(t.ne, t.ne + t.n_dims);
      EXPECT_TRUE(w.add_tensor(t.name, t.type(), dims, std::span<const uint8_t>(t.data, t.n_bytes)).ok());
    }
    return w.serialize();
  };
  const std::vector<uint8_t> no_logit = without("granite.logit_scale");
  auto g = gguf::File::parse(no_logit);
  ASSERT_TRUE(g.ok());
  auto hp = HParams::from_gguf(*g);
  ASSERT_FALSE(hp.ok());
  EXPECT_NE(hp.status().message().find("granite.logit_scale"), std::string::npos) << hp.status().message();
  const std::vector<int32_t> toks = {5, 77, 12, 200, 31, 9};
  auto base = reference_forward(*f, toks);
  ASSERT_TRUE(base.ok());
  for (const char* key : {"granite.embedding_scale", "granite.attention.scale", "granite.residual_scale"}) {
    const std::vector<uint8_t> bytes = without(key);
    auto h = gguf::File::parse(bytes);
    ASSERT_TRUE(h.ok());
    auto p = HParams::from_gguf(*h);
    ASSERT_TRUE(p.ok()) << key << ": " << p.status().message();
    auto m = Model::from_file(std::move(*h), {});
    ASSERT_TRUE(m.ok()) << key << ": " << m.status().message();
    const Rows got = sequence_logits(**m, toks, 6, 2, 16, 512);
    auto h2 = gguf::File::parse(bytes);
    auto ref = reference_forward(*h2, toks);
    ASSERT_TRUE(ref.ok());
    EXPECT_LT(max_abs_diff(got, *ref), 0.01) << key;
    EXPECT_GT(max_abs_diff(*ref, *base), 0.05) << key << " changes the logits";
  }
}

}  // namespace
}  // namespace metro::model
