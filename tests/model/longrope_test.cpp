// phi3's LongRoPE: two sets of per-pair frequency factors, the long one for a context per
// sequence past the original, and a factor on cos and sin. Against llama.cpp on a tiny
// phi3 file (tests/fixtures/longrope, made by make_fixture.py there), and against the
// double-precision reference forward pass on synthetic files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "model/model.h"
#include "model/reference_forward.h"
#include "support/model_run.h"
#include "support/synthetic_model.h"
#include "support/test_util.h"

namespace metro::model {
namespace {

using Rows = std::vector<std::vector<float>>;
using metro::testing::max_abs_diff;
using metro::testing::sequence_logits;

// The fixture: the same tokens at a context of 512 (the original one: short factors) and
// 1024 (long factors), llama.cpp's logits for each. metro's must match the case of its own
// context closely (F32 weights: only F16 KV rounding and summation order differ) and be far
// from the other case's, which differs by up to 1.5.
TEST(LongRope, MatchesLlamaCppAtAShortAndALongContext) {
  std::ifstream in(metro::testing::source_path("tests/fixtures/longrope/phi3_longrope_tiny_logits.json"));
  const auto fx = nlohmann::json::parse(in);
  auto m = Model::load(metro::testing::source_path("tests/fixtures/longrope/phi3_longrope_tiny.gguf"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  const HParams& hp = (*m)->hparams();
  EXPECT_TRUE(hp.has_longrope);
  EXPECT_EQ(hp.rope_orig_ctx, 512u);
  EXPECT_FLOAT_EQ(hp.rope_attn_factor, 1.19f);
  EXPECT_FALSE(hp.long_rope(512));
  EXPECT_TRUE(hp.long_rope(513));
  EXPECT_TRUE(hp.long_rope(0));  // the trained context, 4096
  const auto toks = fx["tokens"].get<std::vector<int32_t>>();
  std::vector<Rows> want;
  for (const auto& c : fx["cases"]) want.push_back(c["logits"].get<Rows>());
  ASSERT_EQ(want.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const int n_ctx = fx["cases"][i]["n_ctx"].get<int>();
    for (int chunk : {40, 7}) {
      const Rows got = sequence_logits(**m, toks, chunk, 2, 16, n_ctx);
      ASSERT_EQ(got.size(), toks.size());
      const double own = max_abs_diff(got, want[i]), other = max_abs_diff(got, want[1 - i]);
      std::printf("longrope: n_ctx %d, chunk %d: largest difference %.4f from llama.cpp's logits (%.4f from the "
                  "other context's)\n", n_ctx, chunk, own, other);
      EXPECT_LT(own, 0.02) << "n_ctx " << n_ctx;
      EXPECT_GT(other, 0.5) << "n_ctx " << n_ctx;
    }
  }
}

// Synthetic phi3 files: the model against the reference at both contexts; the factors and
// the attention factor each change the answer.
TEST(LongRope, PicksItsFactorsByContextAgainstTheReference) {
  metro::testing::SyntheticModelSpec spec;
  spec.arch = "phi3";
  spec.fused = true;
  spec.tied_output = false;
  spec.n_ctx = 256;
  spec.longrope_orig_ctx = 32;
  spec.rope_attn_factor = 1.19f;
  const auto bytes = metro::testing::make_synthetic_model(spec);
  auto f = gguf::File::parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  auto m = Model::from_file(std::move(*f));
  ASSERT_TRUE(m.ok()) << m.status().message();
  std::vector<int32_t> toks;
  for (int i = 0; i < 40; ++i) toks.push_back((i * 37 + 11) % static_cast<int>(spec.n_vocab));
  auto file = gguf::File::parse(bytes);
  ASSERT_TRUE(file.ok());
  auto ref_short = reference_forward(*file, toks, {}, 32);
  auto ref_long = reference_forward(*file, toks, {}, 256);
  ASSERT_TRUE(ref_short.ok() && ref_long.ok());
  EXPECT_GT(max_abs_diff(*ref_short, *ref_long), 0.05);
  for (const auto& [n_ctx, ref] : {std::pair{32, &*ref_short}, std::pair{256, &*ref_long}, std::pair{0, &*ref_long}}) {
    const double d = max_abs_diff(sequence_logits(**m, toks, 13, 2, 16, n_ctx), *ref);
    EXPECT_LT(d, 0.01) << "n_ctx " << n_ctx;
  }
  spec.rope_attn_factor = 0;  // 1: no factor on cos and sin
  const std::vector<uint8_t> plain_bytes = metro::testing::make_synthetic_model(spec);  // the parsed file views it
  auto plain = gguf::File::parse(plain_bytes);
  ASSERT_TRUE(plain.ok());
  auto ref_plain = reference_forward(*plain, toks, {}, 256);
  ASSERT_TRUE(ref_plain.ok());
  EXPECT_GT(max_abs_diff(*ref_plain, *ref_long), 0.05);
}

}  // namespace
}  // namespace metro::model
