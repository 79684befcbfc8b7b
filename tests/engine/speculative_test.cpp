// Speculative decoding: the n-gram proposer's sources (its own context, the shared pool,
// the request's prediction), the draft-model proposers (another model, the model with
// layers skipped), the controller's choice of k, and the engine's promise that
// drafts never change the output: greedy tokens equal those without speculation at 1, 4,
// 16 and 64 concurrent sequences with preemption and aborts in the mix, and sampled tokens
// keep the model's distribution (a chi-square test on a small synthetic model).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "engine/speculative/controller.h"
#include "engine/speculative/draft_model.h"
#include "engine/speculative/ngram.h"
#include "engine_test_util.h"
#include "model/model.h"
#include "support/synthetic_model.h"
#include "tokenizer/tokenizer.h"

namespace metro::engine {
namespace {

using speculative::DraftCandidate;
using speculative::DraftController;
using speculative::DraftCost;
using speculative::DraftSource;
using speculative::ModelProposer;
using speculative::ModelProposerOptions;
using speculative::NgramOptions;
using speculative::NgramProposer;
using speculative::ProposeInput;
using speculative::StepShape;
using testing::collect;
using testing::default_model;
using testing::Generation;
using testing::greedy_request;
using testing::sanitized;

sched::SeqState seq_of(uint64_t id, std::vector<int32_t> tokens, int n_prompt, uint64_t scope = 0) {
  sched::SeqState s;
  s.id = id;
  s.tokens = std::move(tokens);
  s.n_prompt = n_prompt;
  s.cache_scope = scope;
  return s;
}

std::vector<int32_t> propose(NgramProposer& p, const sched::SeqState& s, int k, DraftSource* src,
                             std::span<const int32_t> prediction = {}) {
  std::vector<int32_t> out;
  *src = p.propose(ProposeInput{1, &s, prediction}, k, out);
  return out;
}

TEST(NgramProposer, ContinuesTheLatestEarlierOccurrenceOfTheLongestTail) {
  NgramProposer p(NgramOptions{.min_n = 2, .max_n = 4, .pool_n = 0});
  // ... 5 6 7 8 9 ... 1 5 6 7 -> the tail "5 6 7" occurred before, followed by 8 9 10.
  auto s = seq_of(1, {1, 2, 5, 6, 7, 8, 9, 10, 3, 4, 1, 5, 6, 7}, 3);
  DraftSource src;
  EXPECT_EQ(propose(p, s, 3, &src), (std::vector<int32_t>{8, 9, 10}));
  EXPECT_EQ(src, DraftSource::kContext);
  // A span that runs into the tail repeats on: "1 2 1 2 1 2" proposes 1 2 1 2.
  auto r = seq_of(2, {9, 1, 2, 1, 2, 1, 2}, 1);
  EXPECT_EQ(propose(p, r, 4, &src), (std::vector<int32_t>{1, 2, 1, 2}));
  // No earlier occurrence: nothing.
  auto u = seq_of(3, {1, 2, 3, 4, 5, 6}, 2);
  EXPECT_TRUE(propose(p, u, 4, &src).empty());
  EXPECT_EQ(src, DraftSource::kNone);
  // The index grows with the sequence: append the continuation and ask again.
  s.tokens.insert(s.tokens.end(), {8, 9});
  EXPECT_EQ(propose(p, s, 2, &src), (std::vector<int32_t>{10, 3}));
  p.forget(1);
  p.forget(2);
  p.forget(3);
  EXPECT_EQ(p.tracked_sequences(), 0u);
}

TEST(NgramProposer, ThePoolSharesWithinAScopeOnly) {
  NgramProposer p(NgramOptions{.min_n = 3, .max_n = 4, .pool_n = 4, .pool_entries = 1024});
  const uint64_t tenant_a = 11, tenant_b = 22;
  DraftSource src;
  // A first sequence of tenant A says "40 41 42 43 44 45 46".
  auto first = seq_of(1, {7, 40, 41, 42, 43, 44, 45, 46, 8}, 2, tenant_a);
  propose(p, first, 4, &src);
  // A second sequence of the same tenant, ending in "40 41 42", gets the rest from the pool.
  auto second = seq_of(2, {9, 9, 40, 41, 42}, 2, tenant_a);
  EXPECT_EQ(propose(p, second, 4, &src), (std::vector<int32_t>{43, 44, 45, 46}));
  EXPECT_EQ(src, DraftSource::kPool);
  // Another tenant's identical sequence does not see tenant A's n-grams.
  auto other = seq_of(3, {9, 9, 40, 41, 42}, 2, tenant_b);
  EXPECT_TRUE(propose(p, other, 4, &src).empty());
}

TEST(NgramProposer, FollowsThePredictionAndRealignsAfterAnEdit) {
  NgramProposer p(NgramOptions{.pool_n = 0});
  const std::vector<int32_t> pred = {50, 51, 52, 53, 54, 55, 56, 57, 58, 59};
  DraftSource src;
  auto s = seq_of(1, {1, 2, 3}, 3);
  EXPECT_EQ(propose(p, s, 4, &src, pred), (std::vector<int32_t>{50, 51, 52, 53}));
  EXPECT_EQ(src, DraftSource::kPrediction);
  // The model kept 50 51 and then said 52: the cursor moves on.
  s.tokens.insert(s.tokens.end(), {50, 51, 52});
  EXPECT_EQ(propose(p, s, 3, &src, pred), (std::vector<int32_t>{53, 54, 55}));
  // An edit: the model wrote 99 98 instead of 53, then went back to the prediction's 55 56.
  s.tokens.insert(s.tokens.end(), {99, 98, 55, 56});
  EXPECT_EQ(propose(p, s, 3, &src, pred), (std::vector<int32_t>{57, 58, 59}));
  // At the end of the prediction, the other sources take over (none here).
  s.tokens.insert(s.tokens.end(), {57, 58, 59});
  EXPECT_TRUE(propose(p, s, 3, &src, pred).empty());
}

TEST(DraftController, DraftsWhenGuessesAreGoodAndStopsWhenTheyAreNot) {
  DraftController c;
  // A step whose fixed part dominates: 10 ms, 1 ms per draft row (a decode on this CPU).
  for (int i = 0; i < 64; ++i) {
    const int rows = i % 9;
    c.observe_step(0.010 + 0.001 * rows + 1e-5 * (i % 3), 1, 0, rows);
  }
  EXPECT_NEAR(c.draft_row_seconds(), 0.001, 2e-4);
  std::vector<DraftCandidate> one = {{1, DraftSource::kContext, 8, 0}};
  for (int i = 0; i < 10; ++i) c.observe(1, DraftSource::kContext, 8, 7);
  c.plan(one, StepShape{1, 0, 255});
  EXPECT_EQ(one[0].k, 8) << "acceptance " << c.acceptance(1, DraftSource::kContext);
  // The same sequence's guesses start failing: its k falls to 0.
  for (int i = 0; i < 40; ++i) c.observe(1, DraftSource::kContext, 2, 0);
  c.plan(one, StepShape{1, 0, 255});
  EXPECT_EQ(one[0].k, 0) << "acceptance " << c.acceptance(1, DraftSource::kContext);
}

TEST(DraftController, TurnsDraftsDownWhenTheStepIsComputeBound) {
  DraftController c;
  // Each row (a decode or a draft) costs 1 ms over a 2 ms fixed part: at 64 decodes a draft
  // row costs 1/66 of the step and returns at most 0.6 of a token: never worth it there;
  // alone, a draft of acceptance 0.6 is.
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    const int seqs = 1 + static_cast<int>(rng() % 64), rows = static_cast<int>(rng() % 16);
    c.observe_step(0.002 + 0.001 * (seqs + rows), seqs, 0, rows);
  }
  for (uint64_t s = 1; s <= 64; ++s) {
    for (int i = 0; i < 10; ++i) c.observe(s, DraftSource::kContext, 5, 3);
  }
  std::vector<DraftCandidate> many;
  for (uint64_t s = 1; s <= 64; ++s) many.push_back({s, DraftSource::kContext, 8, 0});
  c.plan(many, StepShape{64, 0, 192});
  for (const auto& d : many) EXPECT_EQ(d.k, 0);
  std::vector<DraftCandidate> one = {{1, DraftSource::kContext, 8, 0}};
  c.plan(one, StepShape{1, 0, 255});
  EXPECT_GT(one[0].k, 0);
}

TEST(DraftController, PricesADraftModelsPassesAndStopsWhenTheyCostMoreThanTheyGive) {
  DraftController c;
  // A 10 ms step, draft rows at 0.5 ms; guesses accepted 9 times in 10.
  for (int i = 0; i < 64; ++i) {
    const int rows = i % 9;
    c.observe_step(0.010 + 0.0005 * rows, 1, 0, rows);
  }
  for (int i = 0; i < 20; ++i) c.observe(1, DraftSource::kDraftModel, 8, 8);
  std::vector<DraftCandidate> one = {{1, DraftSource::kDraftModel, 8, 0}};
  StepShape shape{1, 0, 255};
  // A draft model ten times cheaper than the step: drafting pays.
  shape.draft_cost = DraftCost{0.001, 0.0001};
  c.plan(one, shape);
  EXPECT_GE(one[0].k, 6);
  // One as slow as the step gives less than it costs: none.
  shape.draft_cost = DraftCost{0.010, 0.001};
  c.plan(one, shape);
  EXPECT_EQ(one[0].k, 0);
  // A long unread prompt and a short answer: the catch-up is not earned back; spread over a
  // long answer it is.
  shape.draft_cost = DraftCost{0.001, 0.0001, 0.0005};
  one[0].catch_up = 400;
  one[0].remaining = 8;
  c.plan(one, shape);
  EXPECT_EQ(one[0].k, 0);
  one[0].remaining = 2000;
  c.plan(one, shape);
  EXPECT_GE(one[0].k, 6);
  // Before the step's fit is trusted, the last step's time is the scale; without it, none.
  DraftController cold;
  std::vector<DraftCandidate> d = {{1, DraftSource::kDraftModel, 4, 0}};
  for (int i = 0; i < 20; ++i) cold.observe(1, DraftSource::kDraftModel, 4, 4);
  StepShape cs{1, 0, 255};
  cs.draft_cost = DraftCost{0.001, 0.0001};
  cold.plan(d, cs);
  EXPECT_EQ(d[0].k, 0);
  cs.last_step_s = 0.010;
  cold.plan(d, cs);
  EXPECT_GT(d[0].k, 0);
}

TEST(DraftModel, LayerListsParseAndBadOnesAreRefused) {
  auto l = speculative::parse_layer_list("3,10-12,20");
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(*l, (std::vector<int>{3, 10, 11, 12, 20}));
  for (const char* bad : {"", "a", "3,", "5-2", "1--2", "1,,2", "12345678", "-3"}) {
    EXPECT_FALSE(speculative::parse_layer_list(bad).ok()) << bad;
  }
}

TEST(DraftModel, RefusesADraftModelWithAnotherVocabulary) {
  const auto& sm = default_model();
  metro::testing::SyntheticModelSpec spec;
  spec.n_vocab = 300;
  const std::vector<uint8_t> bytes = metro::testing::make_synthetic_model(spec);  // outlives the model
  auto f = gguf::File::parse(bytes);
  ASSERT_TRUE(f.ok());
  auto other = model::Model::from_file(std::move(*f));
  ASSERT_TRUE(other.ok());
  auto p = ModelProposer::create(std::shared_ptr<const model::Model>(std::move(*other)), *sm.model, {});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("vocabulary"), std::string::npos) << p.status().message();
  // The model itself, or the model with layers skipped, reads the same vocabulary.
  EXPECT_TRUE(ModelProposer::create(sm.model, *sm.model, {}).ok());
  auto self = speculative::make_self_draft(*sm.model, {25, 26, 27, 28, 29});
  ASSERT_TRUE(self.ok()) << self.status().message();
  EXPECT_EQ((*self)->kv_layers(), static_cast<int>(sm.model->hparams().n_layer) - 5);
  EXPECT_TRUE(ModelProposer::create(*self, *sm.model, {}).ok());
}

// Prompts whose continuations repeat what they say, so that n-gram drafts are accepted.
std::vector<std::vector<int32_t>> repetitive_prompts(int n) {
  static const char* kItems[] = {"apple, pear, plum", "red, green, blue", "one, two, three", "north, south, east",
                                 "Monday, Tuesday, Wednesday", "salt, pepper, oil", "cat, dog, bird",
                                 "rain, snow, wind"};
  const auto& tok = *default_model().tokenizer;
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::string list = kItems[i % 8];
    std::string text = "Repeat the list forever: " + list + ", " + list + ", " + list + ", " + list + ", " +
                       std::to_string(i) + ", " + list + ",";
    out.push_back(tok.encode(text, true, false));
  }
  return out;
}

// Engine stats are published at the end of a step, after the step's events: wait for the
// step that finished the last request.
void wait_settled(const Engine& eng) {
  uint64_t steps = eng.stats().steps;
  for (int i = 0; i < 1000; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const EngineStats st = eng.stats();
    if (st.running == 0 && st.waiting == 0 && st.steps == steps) return;
    steps = st.steps;
  }
  ADD_FAILURE() << "the engine did not settle";
}

std::unique_ptr<Engine> engine_with(EngineConfig cfg) {
  const auto& sm = default_model();
  cfg.n_threads = 2;
  auto e = Engine::create(sm.model, *sm.tokenizer, cfg);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return std::move(*e);
}

// Runs every prompt at once; requests whose index is in `abort_after_first` are aborted
// after their first event. Returns the tokens of the others (empty for the aborted ones).
std::vector<std::vector<int32_t>> run_concurrent(Engine& eng, const std::vector<std::vector<int32_t>>& ps, int n_out,
                                                 const std::vector<size_t>& abort_after_first = {}) {
  std::vector<Request> reqs;
  for (const auto& p : ps) {
    Request r = greedy_request(p, n_out);
    r.stop.ignore_eos = true;
    reqs.push_back(r);
  }
  auto handles = eng.submit_all(reqs);
  std::vector<std::vector<int32_t>> out(ps.size());
  for (size_t i : abort_after_first) {
    EXPECT_TRUE(handles[i].ok());
    // The requests aborted are among the first admitted, so their first event comes within
    // a few steps even where a KV budget preempts and every step runs draft passes.
    auto e = handles[i]->stream->pop(std::chrono::milliseconds(120000));
    EXPECT_TRUE(e.has_value());
    eng.abort(handles[i]->id);
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(handles[i].ok()) << handles[i].status().message();
    const Generation g = collect(*handles[i]);
    if (std::find(abort_after_first.begin(), abort_after_first.end(), i) == abort_after_first.end()) {
      out[i] = g.tokens;
    }
  }
  return out;
}

// Runs the prompts on an engine of `cfg`, aborting two of them (at 4 and more) after their
// first event; the others' tokens must be `want`'s. Returns the engine's settled stats.
EngineStats run_and_compare(const EngineConfig& cfg, const std::vector<std::vector<int32_t>>& ps, int n_out,
                            const std::vector<std::vector<int32_t>>& want) {
  auto eng = engine_with(cfg);
  std::vector<size_t> aborted;
  // Two of the first requests: aborted while they draft, beside others still drafting. (A
  // request at the back of the queue may get its first event only after the rest have
  // finished, minutes on a loaded machine with draft passes in every step.)
  if (ps.size() >= 4) aborted = {1, 2};
  const auto got = run_concurrent(*eng, ps, n_out, aborted);
  wait_settled(*eng);
  for (size_t i = 0; i < ps.size(); ++i) {
    if (std::find(aborted.begin(), aborted.end(), i) != aborted.end()) continue;
    EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  }
  return eng->stats();
}

// Objectives no step can miss: the SLA policy then plans by tokens and memory alone, so that
// how many sequences run and whether memory runs short (preemption) do not depend on how
// fast a loaded machine runs the steps (its fitted step cost can leave room for a single
// decode per step, and then nothing is ever preempted).
void untimed(EngineConfig& c) {
  for (SlaClassConfig& k : c.sla.classes) {
    k.ttft_s = 3600.0;
    k.tpot_s = 3600.0;
    k.starve_s = 86400.0;
    k.starve_explicit = true;
  }
}

TEST(Speculative, GreedyOutputsEqualThoseWithoutAtEveryConcurrency) {
  const int n_out = sanitized() ? 12 : 40;
  std::vector<int> levels = {1, 4, 16, 64};
  if (sanitized()) levels = {1, 4, 16};
  for (int n : levels) {
    SCOPED_TRACE("concurrency " + std::to_string(n));
    const auto ps = repetitive_prompts(n);
    EngineConfig base;
    untimed(base);
    base.max_seqs = 64;
    base.max_batch_tokens = 256;
    // A KV budget that cannot hold every sequence at 16 and 64: preemption in the mix.
    base.ctx_total = n >= 16 ? 96 * 16 : 0;
    const auto want = run_concurrent(*engine_with(base), ps, n_out);
    for (bool adaptive : {false, true}) {
      SCOPED_TRACE(adaptive ? "controller on" : "every proposed token");
      EngineConfig cfg = base;
      cfg.proposer = std::make_shared<NgramProposer>();
      cfg.max_draft_tokens = 6;
      cfg.adaptive_drafts = adaptive;
      const EngineStats st = run_and_compare(cfg, ps, n_out, want);
      // With the controller on, 16 and 64 decodes a step may well be judged too busy to draft.
      if (!adaptive || n <= 4) {
        EXPECT_GT(st.accepted_tokens, 0u);
      }
      EXPECT_LE(st.accepted_tokens, st.draft_tokens);
      EXPECT_EQ(st.kv_blocks_used, 0);
      if (!adaptive && n == 64) {
        EXPECT_GT(st.preemptions, 0u);
      }
      uint64_t by_source = 0;
      for (uint64_t v : st.spec_proposed) by_source += v;
      EXPECT_EQ(by_source, st.draft_tokens);
    }
  }
}

// A draft-model proposer for the default model: the model itself (its drafts nearly always
// accepted: long accepted runs) or the model with its last five layers skipped (drafts
// often rejected: rollback of the draft's KV every step).
std::shared_ptr<ModelProposer> model_proposer(bool self_draft, int64_t kv_tokens = 65536) {
  const auto& sm = default_model();
  ModelProposerOptions o;
  o.source = self_draft ? DraftSource::kSelf : DraftSource::kDraftModel;
  o.max_k = 6;
  o.kv_tokens = kv_tokens;
  std::shared_ptr<const model::Model> draft = sm.model;
  if (self_draft) {
    auto m = speculative::make_self_draft(*sm.model, {25, 26, 27, 28, 29});
    EXPECT_TRUE(m.ok()) << m.status().message();
    draft = *m;
  }
  auto p = ModelProposer::create(draft, *sm.model, o, sm.model);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return std::shared_ptr<ModelProposer>(std::move(*p));
}

TEST(Speculative, DraftModelGreedyOutputsEqualThoseWithoutAtEveryConcurrency) {
  const int n_out = sanitized() ? 10 : 32;
  std::vector<int> levels = {1, 4, 16, 64};
  if (sanitized()) levels = {1, 4};
  for (int n : levels) {
    SCOPED_TRACE("concurrency " + std::to_string(n));
    const auto ps = repetitive_prompts(n);
    EngineConfig base;
    untimed(base);
    base.max_seqs = 64;
    base.max_batch_tokens = 256;
    base.ctx_total = n >= 16 ? 96 * 16 : 0;  // preemption at 16 and 64
    const auto want = run_concurrent(*engine_with(base), ps, n_out);
    struct Arm {
      const char* name;
      bool self_draft;
      int64_t kv_tokens;
      bool adaptive;
    };
    for (const Arm& arm : {Arm{"draft model", false, 65536, false}, Arm{"self-draft", true, 65536, false},
                           Arm{"draft model, 8 blocks of KV", false, 128, false},
                           Arm{"draft model, controller on", false, 65536, true}}) {
      SCOPED_TRACE(arm.name);
      EngineConfig cfg = base;
      auto proposer = model_proposer(arm.self_draft, arm.kv_tokens);
      cfg.proposer = proposer;
      cfg.max_draft_tokens = 6;
      cfg.adaptive_drafts = arm.adaptive;
      const EngineStats st = run_and_compare(cfg, ps, n_out, want);
      const uint64_t verified = st.spec_proposed[static_cast<size_t>(proposer->model_source())];
      EXPECT_EQ(verified, st.draft_tokens);
      if (!arm.adaptive) {
        EXPECT_GT(st.accepted_tokens, 0u);
        // The model drafting for itself is right but for near ties of its batched numerics.
        if (!arm.self_draft && arm.kv_tokens > 128) {
          EXPECT_GT(st.accepted_tokens * 10, st.draft_tokens * 9);
        }
      }
      EXPECT_EQ(st.kv_blocks_used, 0);
      // Every sequence ended: the proposer gave back all of its draft KV.
      EXPECT_EQ(proposer->tracked_sequences(), 0u);
      EXPECT_EQ(proposer->free_blocks(), proposer->total_blocks());
    }
  }
}

TEST(Speculative, PredictionDraftsAreCountedInTheUsage) {
  const auto& tok = *default_model().tokenizer;
  Request r = greedy_request(tok.encode("Write the numbers from one to ten in words:", true, false), 24);
  r.stop.ignore_eos = true;
  const Generation plain = collect(*engine_with({})->submit(r));
  // The prediction: the output itself, with one token changed in the middle.
  Request with = r;
  with.prediction = plain.tokens;
  with.prediction[10] = (with.prediction[10] + 1) % 1000;
  EngineConfig cfg;
  cfg.proposer = std::make_shared<NgramProposer>();
  cfg.max_draft_tokens = 8;
  cfg.adaptive_drafts = false;
  auto eng = engine_with(cfg);
  const Generation g = collect(*eng->submit(with));
  EXPECT_EQ(g.tokens, plain.tokens);
  EXPECT_GT(g.usage.accepted_prediction_tokens, 15);
  EXPECT_GE(g.usage.rejected_prediction_tokens, 1);
  wait_settled(*eng);
  const EngineStats st = eng->stats();
  EXPECT_EQ(st.spec_accepted[static_cast<size_t>(DraftSource::kPrediction)],
            static_cast<uint64_t>(g.usage.accepted_prediction_tokens));
  // Turned off per request: no drafts at all.
  Request off = with;
  off.speculative = false;
  const uint64_t drafts_before = eng->stats().draft_tokens;
  EXPECT_EQ(collect(*eng->submit(off)).tokens, plain.tokens);
  wait_settled(*eng);
  EXPECT_EQ(eng->stats().draft_tokens, drafts_before);
}

// ---- sampled outputs keep the model's distribution -------------------------------------

struct Synthetic {
  std::vector<uint8_t> bytes;
  std::shared_ptr<const model::Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tok;
};

const std::vector<int32_t> kSyntheticPrompt = {3, 4, 5, 3, 4, 5, 3, 4};
constexpr int kSyntheticTokens = 3;

// A one-layer model over a 24-token vocabulary; models of other seeds share the vocabulary.
metro::testing::SyntheticModelSpec synthetic_spec(uint64_t seed) {
  metro::testing::SyntheticModelSpec spec;
  spec.n_embd = 64;
  spec.n_layer = 1;
  spec.n_head = 2;
  spec.n_head_kv = 1;
  spec.n_ff = 128;
  spec.n_vocab = 24;
  spec.n_ctx = 64;
  spec.seed = seed;
  return spec;
}

Synthetic synthetic_model() {
  Synthetic s;
  s.bytes = metro::testing::make_synthetic_model(synthetic_spec(7));
  auto f = gguf::File::parse(s.bytes);
  EXPECT_TRUE(f.ok());
  auto t = tokenizer::Tokenizer::from_gguf(*f);
  EXPECT_TRUE(t.ok()) << t.status().message();
  s.tok = std::make_unique<tokenizer::Tokenizer>(std::move(*t));
  auto m = model::Model::from_file(std::move(*f));
  EXPECT_TRUE(m.ok()) << m.status().message();
  s.model = std::move(*m);
  return s;
}

// Guesses from a random stream of its own (not the sampler's): any proposer whose guesses
// do not depend on the sampling draws keeps the distribution.
class RandomProposer final : public speculative::Proposer {
 public:
  explicit RandomProposer(int vocab) : vocab_(vocab) {}
  DraftSource propose(const ProposeInput&, int k, std::vector<int32_t>& out) override {
    for (int i = 0; i < k; ++i) out.push_back(static_cast<int32_t>(rng_() % static_cast<uint32_t>(vocab_)));
    return DraftSource::kContext;
  }

 private:
  int vocab_;
  std::mt19937 rng_{99};
};

enum class Arm { kPlain, kNgram, kRandom, kDraftModel };

// Another synthetic model with the same vocabulary: a draft model that is often wrong.
std::shared_ptr<const model::Model> synthetic_draft() {
  static const std::vector<uint8_t> bytes = metro::testing::make_synthetic_model(synthetic_spec(8));
  auto f = gguf::File::parse(bytes);
  EXPECT_TRUE(f.ok());
  auto m = model::Model::from_file(std::move(*f));
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::shared_ptr<const model::Model>(std::move(*m));
}

// Counts of the generated tokens after the first (what drafts are verified for) over `n`
// seeded requests; `prediction` is every request's predicted output.
std::map<std::vector<int32_t>, int> sample_tails(const Synthetic& s, const SamplingParams& sp, Arm arm, int n,
                                                 uint64_t seed0, const std::vector<int32_t>& prediction,
                                                 uint64_t* accepted) {
  EngineConfig cfg;
  cfg.n_threads = 1;
  cfg.max_seqs = 64;
  if (arm != Arm::kPlain) {
    if (arm == Arm::kNgram) {
      cfg.proposer = std::make_shared<NgramProposer>();
    } else if (arm == Arm::kDraftModel) {
      ModelProposerOptions o;
      o.max_k = 3;
      o.n_ctx = 64;
      o.kv_tokens = 64 * 16;
      auto p = ModelProposer::create(synthetic_draft(), *s.model, o);
      EXPECT_TRUE(p.ok()) << p.status().message();
      cfg.proposer = std::move(*p);
    } else {
      cfg.proposer = std::make_shared<RandomProposer>(static_cast<int>(s.tok->n_vocab()));
    }
    cfg.max_draft_tokens = 3;
    cfg.adaptive_drafts = false;
  }
  auto e = Engine::create(s.model, *s.tok, cfg);
  EXPECT_TRUE(e.ok());
  std::map<std::vector<int32_t>, int> counts;
  for (int done = 0; done < n;) {
    std::vector<Request> batch;
    for (int i = 0; i < 64 && done + i < n; ++i) {
      Request r;
      r.prompt = kSyntheticPrompt;
      r.sampling = sp;
      r.sampling.seed = seed0 + static_cast<uint64_t>(done + i);
      r.sampling.has_seed = true;
      r.stop.max_tokens = kSyntheticTokens;
      r.stop.ignore_eos = true;
      if ((done + i) % 2) r.prediction = prediction;  // the other half drafts from n-gram lookup alone
      batch.push_back(r);
    }
    auto hs = (*e)->submit_all(batch);
    for (auto& h : hs) {
      EXPECT_TRUE(h.ok());
      const Generation g = collect(*h);
      EXPECT_EQ(g.tokens.size(), static_cast<size_t>(kSyntheticTokens));
      if (g.tokens.size() > 1) ++counts[std::vector<int32_t>(g.tokens.begin() + 1, g.tokens.end())];
    }
    done += static_cast<int>(batch.size());
  }
  wait_settled(**e);
  *accepted = (*e)->stats().accepted_tokens;
  return counts;
}

// Two-sample chi-square over categories with at least 10 draws in all (the rest pooled);
// true when the samples differ at p < 0.001 (Wilson-Hilferty approximation).
bool differ(const std::map<std::vector<int32_t>, int>& a, const std::map<std::vector<int32_t>, int>& b, double* stat,
            int* df) {
  std::map<std::vector<int32_t>, std::pair<int, int>> both;
  for (const auto& [k, v] : a) both[k].first += v;
  for (const auto& [k, v] : b) both[k].second += v;
  double chi = 0.0;
  int cats = 0;
  std::pair<int, int> rest{0, 0};
  auto add = [&](int x, int y) {
    chi += static_cast<double>((x - y) * (x - y)) / static_cast<double>(x + y);
    ++cats;
  };
  for (const auto& [k, v] : both) {
    if (v.first + v.second >= 10) {
      add(v.first, v.second);
    } else {
      rest.first += v.first;
      rest.second += v.second;
    }
  }
  if (rest.first + rest.second > 0) add(rest.first, rest.second);
  *stat = chi;
  *df = std::max(1, cats - 1);
  const double d = *df, z = 3.09;
  const double crit = d * std::pow(1.0 - 2.0 / (9.0 * d) + z * std::sqrt(2.0 / (9.0 * d)), 3.0);
  return chi > crit;
}

TEST(Speculative, SampledOutputsKeepTheModelsDistribution) {
  const Synthetic s = synthetic_model();
  const int n = sanitized() ? 600 : 3000;
  struct Case {
    const char* name;
    SamplingParams sp;
  };
  // The synthetic model's logits spread over about sqrt(n_embd) = 8: temperatures of that
  // order give distributions over many tokens.
  std::vector<Case> cases(3);
  cases[0].name = "temperature 8";
  cases[0].sp.temperature = 8.0f;
  cases[0].sp.top_k = 0;
  cases[0].sp.top_p = 1.0f;
  cases[1].name = "temperature 6, top-k 5";
  cases[1].sp.temperature = 6.0f;
  cases[1].sp.top_k = 5;
  cases[1].sp.top_p = 1.0f;
  cases[2].name = "temperature 8, top-p 0.8, repetition penalty 1.3";
  cases[2].sp.temperature = 8.0f;
  cases[2].sp.top_k = 0;
  cases[2].sp.top_p = 0.8f;
  cases[2].sp.repetition_penalty = 1.3f;
  // The prediction: the greedy continuation, so that drafts are often right.
  std::vector<int32_t> greedy;
  {
    EngineConfig cfg;
    cfg.n_threads = 1;
    auto e = Engine::create(s.model, *s.tok, cfg);
    ASSERT_TRUE(e.ok());
    Request r;
    r.prompt = kSyntheticPrompt;
    r.stop.max_tokens = kSyntheticTokens;
    r.stop.ignore_eos = true;
    r.sampling.temperature = 0.0f;
    greedy = collect(*(*e)->submit(r)).tokens;
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    uint64_t unused = 0;
    // Different seeds for each arm: the test compares distributions, not streams.
    const auto plain = sample_tails(s, c.sp, Arm::kPlain, n, 1, greedy, &unused);
    for (Arm arm : {Arm::kNgram, Arm::kRandom, Arm::kDraftModel}) {
      const char* name = arm == Arm::kNgram ? "n-gram" : arm == Arm::kRandom ? "random" : "draft model";
      SCOPED_TRACE(name);
      uint64_t acc_on = 0;
      const uint64_t seed = arm == Arm::kNgram ? 1000003 : arm == Arm::kRandom ? 3000017 : 5000011;
      const auto spec = sample_tails(s, c.sp, arm, n, seed, greedy, &acc_on);
      EXPECT_GT(acc_on, static_cast<uint64_t>(n / 50)) << "drafts were rarely accepted: the test would prove little";
      double chi = 0.0;
      int df = 0;
      EXPECT_FALSE(differ(plain, spec, &chi, &df)) << "chi-square " << chi << " with " << df << " df";
      std::printf("  %s, %s: %llu drafts accepted, chi-square %.1f with %d df\n", c.name, name,
                  static_cast<unsigned long long>(acc_on), chi, df);
    }
    // The test has power: a slightly different temperature is told apart at this n.
    SamplingParams hotter = c.sp;
    hotter.temperature *= 1.3f;
    const auto other = sample_tails(s, hotter, Arm::kPlain, n, 2000003, greedy, &unused);
    double chi2 = 0.0;
    int df2 = 0;
    EXPECT_TRUE(differ(plain, other, &chi2, &df2)) << "chi-square " << chi2 << " with " << df2 << " df";
    std::printf("  %s, temperature x1.3 (must differ): chi-square %.1f with %d df\n", c.name, chi2, df2);
  }
}

}  // namespace
}  // namespace metro::engine
