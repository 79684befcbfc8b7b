// An engine serving a model whose every layer has a sliding window gives each sequence's KV
// blocks back behind the window (kv::KvCacheConfig::window, from Model::kv_release_window):
// long generations of several sequences run at once in a pool far smaller than their
// contexts, without preemption, and their greedy tokens equal those of the same engine with
// room for everything and of the model run alone.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/speculative/ngram.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "support/model_run.h"
#include "support/synthetic_model.h"
#include "tokenizer/tokenizer.h"

namespace metro::engine {
namespace {

using metro::testing::collect;
using metro::testing::greedy_request;

struct Windowed {
  std::vector<uint8_t> bytes;
  std::shared_ptr<const model::Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tok;
};

// mistral with a window of 24 on every layer.
Windowed windowed_model(uint32_t window) {
  metro::testing::SyntheticModelSpec spec;
  spec.arch = "mistral";
  spec.n_embd = 64;
  spec.n_head = 4;
  spec.n_head_kv = 2;
  spec.n_ff = 128;
  spec.n_ctx = 1024;
  spec.sliding_window = window;
  Windowed w;
  w.bytes = metro::testing::make_synthetic_model(spec);
  auto f = gguf::File::parse(w.bytes);
  EXPECT_TRUE(f.ok());
  auto t = tokenizer::Tokenizer::from_gguf(*f);
  EXPECT_TRUE(t.ok()) << t.status().message();
  w.tok = std::make_unique<tokenizer::Tokenizer>(std::move(*t));
  auto m = model::Model::from_file(std::move(*f));
  EXPECT_TRUE(m.ok()) << m.status().message();
  w.model = std::move(*m);
  return w;
}

// Stats are published at the end of a step, after its events: wait for the step that
// finished the last request (at most 10 s).
EngineStats settled(const Engine& e) {
  EngineStats st = e.stats();
  for (int i = 0; i < 500 && (st.running != 0 || st.waiting != 0 || st.kv_blocks_used != 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    st = e.stats();
  }
  return st;
}

std::vector<std::vector<int32_t>> run_all(const Windowed& w, int ctx_total, const std::vector<std::vector<int32_t>>& prompts,
                                          int max_tokens, EngineStats* stats, bool speculate = false) {
  EngineConfig cfg;
  cfg.n_threads = 2;
  if (speculate) {  // drafts computed past the end, the rejected ones truncated, over the holes
    cfg.proposer = std::make_shared<speculative::NgramProposer>();
    cfg.max_draft_tokens = 4;
    cfg.adaptive_drafts = false;
  }
  cfg.ctx_total = ctx_total;
  cfg.kv_block = 16;
  auto e = Engine::create(w.model, *w.tok, cfg);
  EXPECT_TRUE(e.ok()) << e.status().message();
  std::vector<Handle> hs;
  for (const auto& p : prompts) {
    Request r = greedy_request(p, max_tokens);
    r.stop.ignore_eos = true;
    auto h = (*e)->submit(std::move(r));
    EXPECT_TRUE(h.ok()) << h.status().message();
    hs.push_back(*h);
  }
  std::vector<std::vector<int32_t>> out;
  for (const auto& h : hs) out.push_back(collect(h).tokens);
  *stats = settled(**e);
  return out;
}

TEST(EngineWindow, SequencesHoldAWindowOfBlocksAndGenerateAsWithout) {
  const Windowed w = windowed_model(24);
  ASSERT_TRUE(w.model);
  EXPECT_EQ(w.model->kv_release_window(), 24u);
  const int n_gen = metro::testing::sanitized() ? 60 : 200;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(metro::testing::random_tokens(40 + 7 * i, 300, 50 + i));

  // 4 sequences of up to 261 tokens: 68 blocks of 16 without release; the pool holds 24.
  EngineStats tight, roomy, drafted;
  const auto got = run_all(w, 24 * 16, prompts, n_gen, &tight);
  const auto want = run_all(w, 4096, prompts, n_gen, &roomy);
  const auto spec = run_all(w, 24 * 16, prompts, n_gen, &drafted, true);
  EXPECT_EQ(tight.preemptions, 0u);
  EXPECT_EQ(tight.kv_blocks_used, 0);
  EXPECT_GT(drafted.draft_tokens, drafted.accepted_tokens);  // some drafts were rejected
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), static_cast<size_t>(n_gen)) << i;
    EXPECT_EQ(got[i], want[i]) << "sequence " << i;
    EXPECT_EQ(spec[i], want[i]) << "sequence " << i << " with drafts";
  }
  // The model alone (a private KV of the whole context, nothing released) on the first:
  // its greedy continuation from the logits of every position.
  std::vector<int32_t> seq = prompts[0];
  const size_t n_check = static_cast<size_t>(std::min(n_gen, 40));
  for (size_t k = 0; k < n_check; ++k) {
    const auto logits = metro::testing::sequence_logits(*w.model, seq, 64);
    const auto& last = logits.back();
    seq.push_back(static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
  }
  EXPECT_EQ(std::vector<int32_t>(seq.begin() + static_cast<long>(prompts[0].size()), seq.end()),
            std::vector<int32_t>(got[0].begin(), got[0].begin() + static_cast<long>(n_check)));
}

// n > 1: the choices fork from the prompt after its blocks behind the window are released
// (the prompt is longer than the window); each choice continues as the single one does.
TEST(EngineWindow, ChoicesForkPastReleasedBlocks) {
  const Windowed w = windowed_model(24);
  ASSERT_TRUE(w.model);
  const auto prompt = metro::testing::random_tokens(70, 300, 77);
  EngineStats one_stats;
  const auto one = run_all(w, 24 * 16, {prompt}, 40, &one_stats);
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.ctx_total = 24 * 16;
  auto e = Engine::create(w.model, *w.tok, cfg);
  ASSERT_TRUE(e.ok()) << e.status().message();
  Request r = greedy_request(prompt, 40);
  r.stop.ignore_eos = true;
  r.n = 3;
  auto h = (*e)->submit(std::move(r));
  ASSERT_TRUE(h.ok()) << h.status().message();
  const auto choices = metro::testing::collect_choices(*h, 3);
  ASSERT_EQ(choices.size(), 3u);
  for (const auto& c : choices) EXPECT_EQ(c.tokens, one[0]);
  EXPECT_EQ(settled(**e).kv_blocks_used, 0);
}

// A model with a global layer (gemma-style pattern) or no window releases nothing.
TEST(EngineWindow, OnlyModelsWindowedInEveryLayerRelease) {
  metro::testing::SyntheticModelSpec spec;
  spec.arch = "gemma3";
  spec.n_layer = 6;
  spec.qk_norm = true;
  spec.post_norms = true;
  spec.sliding_window = 16;
  auto l = metro::testing::load_synthetic(spec);
  ASSERT_TRUE(l.model);
  EXPECT_EQ(l.model->kv_release_window(), 0u);
  spec = {};
  auto plain = metro::testing::load_synthetic(spec);
  ASSERT_TRUE(plain.model);
  EXPECT_EQ(plain.model->kv_release_window(), 0u);
}

}  // namespace
}  // namespace metro::engine
