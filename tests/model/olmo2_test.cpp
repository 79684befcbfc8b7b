// olmo2 against llama.cpp on a tiny file (tests/fixtures/olmo2, made by make_fixture.py
// there) and against the double-precision reference forward: no norm before attention or
// the FFN, RMS norms over all of Q and all of K (not per head), norms of the sublayers'
// outputs before they join the stream.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/reference_forward.h"
#include "support/model_run.h"
#include "support/test_util.h"

namespace metro::model {
namespace {

using Rows = std::vector<std::vector<float>>;
using metro::testing::max_abs_diff;
using metro::testing::sequence_logits;

const char* kFixture = "tests/fixtures/olmo2/olmo2_tiny.gguf";

TEST(Olmo2, MatchesLlamaCppAndTheReference) {
  std::ifstream in(metro::testing::source_path("tests/fixtures/olmo2/olmo2_tiny_logits.json"));
  const auto fx = nlohmann::json::parse(in);
  auto m = Model::load(metro::testing::source_path(kFixture));
  ASSERT_TRUE(m.ok()) << m.status().message();
  const HParams& hp = (*m)->hparams();
  EXPECT_EQ(hp.architecture, "olmo2");
  EXPECT_FALSE(hp.pre_norms);
  EXPECT_TRUE(hp.has_post_norms && hp.has_qk_norm && hp.qk_norm_full);
  EXPECT_EQ(hp.rope_type, RopeType::kNeox);
  EXPECT_FALSE(hp.tied_output);
  const auto toks = fx["tokens"].get<std::vector<int32_t>>();
  const Rows want = fx["logits"].get<Rows>();
  auto f = gguf::File::open(metro::testing::source_path(kFixture));
  ASSERT_TRUE(f.ok());
  auto ref = reference_forward(*f, toks);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  EXPECT_LT(max_abs_diff(*ref, want), 1e-3) << "the reference forward is olmo2's as llama.cpp computes it";
  for (int chunk : {40, 7, 1}) {
    const Rows got = sequence_logits(**m, toks, chunk, 2, 16, 512);
    ASSERT_EQ(got.size(), toks.size());
    const double own = max_abs_diff(got, want), own_ref = max_abs_diff(got, *ref);
    std::printf("olmo2: chunk %d: largest difference %.5f from llama.cpp's logits, %.5f from the reference\n", chunk,
                own, own_ref);
    EXPECT_LT(own, 0.01) << "chunk " << chunk;  // metro's KV pages in F16, llama.cpp's in F32
    EXPECT_LT(own_ref, 0.01) << "chunk " << chunk;
  }
}

// Its query and key norms span every head, so a tensor-parallel slice (some heads) cannot
// compute them alone: refused by name rather than computed wrong.
TEST(Olmo2, TensorParallelSlicingIsRefused) {
  auto f = gguf::File::open(metro::testing::source_path(kFixture));
  ASSERT_TRUE(f.ok());
  ModelOptions opts;
  opts.shard.tp_size = 2;
  auto m = Model::from_file(std::move(*f), opts);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("tensor-parallel"), std::string::npos) << m.status().message();
}

}  // namespace
}  // namespace metro::model
