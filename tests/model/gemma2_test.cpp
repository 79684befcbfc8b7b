// gemma2 against llama.cpp on a tiny file (tests/fixtures/gemma2, made by make_fixture.py
// there): windows on every other layer, norms after attention and FFN, attention scores and
// logits soft-capped. The caps are set low enough to bind, and the fixture also holds
// llama.cpp's logits of the same weights with caps that never bind.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "support/model_run.h"
#include "support/test_util.h"

namespace metro::model {
namespace {

using Rows = std::vector<std::vector<float>>;
using metro::testing::max_abs_diff;
using metro::testing::sequence_logits;

TEST(Gemma2, MatchesLlamaCppWithCapsThatBind) {
  std::ifstream in(metro::testing::source_path("tests/fixtures/gemma2/gemma2_tiny_logits.json"));
  const auto fx = nlohmann::json::parse(in);
  auto m = Model::load(metro::testing::source_path("tests/fixtures/gemma2/gemma2_tiny.gguf"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  const HParams& hp = (*m)->hparams();
  EXPECT_EQ(hp.architecture, "gemma2");
  EXPECT_EQ(hp.sliding_window, 8u);
  EXPECT_TRUE(hp.is_local_layer(0) && !hp.is_local_layer(1));
  EXPECT_FLOAT_EQ(hp.attn_softcap, 1.5f);
  EXPECT_FLOAT_EQ(hp.final_softcap, 4.0f);
  const auto toks = fx["tokens"].get<std::vector<int32_t>>();
  const Rows want = fx["logits"].get<Rows>(), uncapped = fx["uncapped_logits"].get<Rows>();
  const double caps_move = max_abs_diff(want, uncapped);
  for (int chunk : {40, 7, 1}) {
    const Rows got = sequence_logits(**m, toks, chunk, 2, 16, 512);
    ASSERT_EQ(got.size(), toks.size());
    const double own = max_abs_diff(got, want);
    std::printf("gemma2: chunk %d: largest difference %.5f from llama.cpp's logits (the caps move them by %.4f)\n",
                chunk, own, caps_move);
    // metro keeps K and V in F16 pages, llama.cpp here in F32: a few thousandths on logits
    // of magnitude up to 4, against the caps' 6.4.
    EXPECT_LT(own, 0.01) << "chunk " << chunk;
  }
  EXPECT_GT(caps_move, 0.1);
}

}  // namespace
}  // namespace metro::model
