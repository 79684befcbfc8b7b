// A model under a memory budget (ModelOptions::mem_budget, `metro serve --mem-budget`): its
// experts live in a cold store, the logits are bit-identical to the model held whole, the
// store keeps what the budget leaves after the matrices every step reads, and a budget
// below those is refused by name.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/residency.h"
#include "model/model.h"
#include "support/model_run.h"
#include "support/synthetic_model.h"
#include "support/test_util.h"

namespace metro::model {
namespace {

using kernels::DType;
using metro::testing::Logits;
using metro::testing::sequence_logits;
using metro::testing::SyntheticModelSpec;

SyntheticModelSpec moe_spec(DType type) {
  SyntheticModelSpec spec = metro::testing::qwen3moe_spec(type);
  spec.n_expert = 16;
  spec.n_ff_exp = 256;
  return spec;
}

Expected<std::unique_ptr<Model>> load_with(const std::string& path, uint64_t budget) {
  ModelOptions o;
  o.mem_budget.bytes = budget;
  o.mem_budget.store.dir = metro::testing::disk_dir();
  return Model::load(path, o);
}

// One token per step: each step's MoE ops touch n_used experts' three matrices per layer.
TEST(MemBudget, ColdExpertsGiveTheSameLogitsWithinTheBudget) {
  for (DType type : {DType::kQ4_0, DType::kQ4_K, DType::kF16}) {
    SCOPED_TRACE(kernels::dtype_name(type));
    metro::testing::TempFile file;
    file.write(metro::testing::make_synthetic_model(moe_spec(type)));
    auto whole = Model::load(file.path());
    ASSERT_TRUE(whole.ok()) << whole.status().message();
    const uint64_t all = total_bytes((*whole)->weight_memory());
    // Just the hot part plus room for about one layer's chosen experts.
    auto probe = load_with(file.path(), all);
    ASSERT_TRUE(probe.ok()) << probe.status().message();
    const ColdStore* ps = (*probe)->cold_store();
    ASSERT_NE(ps, nullptr);
    const ColdStore::Stats p0 = ps->stats();
    // Each expert's three matrices in both layers, and the F16 embedding table (300 rows of
    // 512 bytes) in 64 KiB pieces.
    EXPECT_EQ(p0.entries, 16 * 3 * 2 + 3);
    const uint64_t hot = total_bytes((*probe)->weight_memory());
    EXPECT_LT(hot, all);
    const uint64_t entry = p0.bytes / static_cast<uint64_t>(p0.entries);
    const uint64_t budget = hot + 8 * entry;

    auto cold = load_with(file.path(), budget);
    ASSERT_TRUE(cold.ok()) << cold.status().message();
    const Model& m = **cold;
    EXPECT_GT(m.file_given_back(), 0u);  // the experts' mapped file pages, once copied
    const auto toks = metro::testing::random_tokens(24, 300, 5);
    const Logits want = sequence_logits(**whole, toks, 1);
    const Logits got = sequence_logits(m, toks, 1);
    ASSERT_EQ(got.size(), want.size());
    for (size_t t = 0; t < want.size(); ++t) ASSERT_EQ(got[t], want[t]) << "position " << t;
    const ColdStore::Stats s = m.cold_store()->stats();
    EXPECT_EQ(s.budget, 8 * entry);
    EXPECT_LE(s.mapped, s.budget);
    EXPECT_GT(s.releases, 0u);  // 24 tokens route to more experts than 8 entries hold
    EXPECT_GT(s.faults_in, s.releases);
    // What the process really holds of the store, as the kernel counts it.
    EXPECT_LE(metro::testing::mapped_rss(m.cold_store()->path()), s.budget);
    // Prefill in one step: every expert at once, then decode again within the budget.
    EXPECT_EQ(sequence_logits(m, toks, 24), sequence_logits(**whole, toks, 24));
    EXPECT_EQ(sequence_logits(m, toks, 1), want);
    EXPECT_LE(m.cold_store()->stats().mapped, s.budget);
  }
}

TEST(MemBudget, RefusesABudgetBelowWhatEveryStepReads) {
  metro::testing::TempFile file;
  file.write(metro::testing::make_synthetic_model(moe_spec(DType::kQ4_0)));
  auto probe = load_with(file.path(), uint64_t{1} << 40);
  ASSERT_TRUE(probe.ok());
  const uint64_t hot = total_bytes((*probe)->weight_memory());
  auto low = load_with(file.path(), hot - 1);
  ASSERT_FALSE(low.ok());
  EXPECT_NE(low.status().message().find("every step reads"), std::string::npos) << low.status().message();
  EXPECT_TRUE(load_with(file.path(), hot).ok());  // nothing left for experts: each step reads its own in

  // A dense model with a head tied to its F16 embedding: the head reads the table's bytes in
  // place beside its repacked copy, so nothing goes cold; a budget below it is refused and
  // says what can be cold.
  SyntheticModelSpec dense;
  dense.matrix_type = DType::kQ4_0;
  metro::testing::TempFile dfile;
  dfile.write(metro::testing::make_synthetic_model(dense));
  auto d = load_with(dfile.path(), uint64_t{1} << 40);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ((*d)->cold_store(), nullptr);
  auto dlow = load_with(dfile.path(), 4096);
  ASSERT_FALSE(dlow.ok());
  EXPECT_NE(dlow.status().message().find("only the experts"), std::string::npos) << dlow.status().message();
}

// A dense model with a head of its own: its embedding table is cold, in pieces a step touches
// by its tokens' rows; logits bit-identical, and a budget that leaves room for two pieces
// keeps what is mapped within it.
TEST(MemBudget, AnUntiedEmbeddingTableIsColdByRows) {
  SyntheticModelSpec spec;
  spec.matrix_type = DType::kQ4_0;
  spec.embd_type = DType::kQ8_0;
  spec.tied_output = false;
  spec.n_vocab = 2000;  // 2000 rows of 272 bytes: 9 pieces
  metro::testing::TempFile file;
  file.write(metro::testing::make_synthetic_model(spec));
  auto whole = Model::load(file.path());
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  auto probe = load_with(file.path(), uint64_t{1} << 40);
  ASSERT_TRUE(probe.ok()) << probe.status().message();
  ASSERT_NE((*probe)->cold_store(), nullptr);
  EXPECT_EQ((*probe)->cold_store()->stats().entries, 9);
  const uint64_t hot = total_bytes((*probe)->weight_memory());
  EXPECT_EQ(total_bytes((*whole)->weight_memory()) - hot, 2000u * 272u);  // the table, no longer hot
  auto cold = load_with(file.path(), hot + 2 * (uint64_t{64} << 10));
  ASSERT_TRUE(cold.ok()) << cold.status().message();
  const auto toks = metro::testing::random_tokens(40, 2000, 9);
  // Steps of 16 tokens touch more pieces than the budget holds (each step keeps its own),
  // then steps of one token bring what is mapped back within it.
  EXPECT_EQ(sequence_logits(**cold, toks, 16), sequence_logits(**whole, toks, 16));
  EXPECT_EQ(sequence_logits(**cold, toks, 1), sequence_logits(**whole, toks, 1));
  const ColdStore::Stats s = (*cold)->cold_store()->stats();
  EXPECT_GT(s.releases, 0u);
  EXPECT_LE(s.mapped, s.budget);
  EXPECT_LE(metro::testing::mapped_rss((*cold)->cold_store()->path()), s.budget);
}

}  // namespace
}  // namespace metro::model
