// Model shards against the whole model.
//  - Pipeline stages (layer ranges handing the residual stream on) run the same ops in the
//    same order on the same values as the whole model, so they give its bits exactly.
//  - Tensor-parallel ranks compute every head and every FFN column as the whole model does;
//    only the output and down projections' sums are split into per-rank partial sums added
//    up by the all-reduce, which changes their rounding. On a model whose other ranks'
//    columns of those projections are zero, the partial sums are the whole sums exactly
//    (adding exact zeros changes no float), so every rank must give the whole model's bits;
//    on a dense model the results are compared within a bound from the rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "dist/communicator.h"
#include "gguf/writer.h"
#include "kv/kv_arena.h"
#include "model/model.h"
#include "model/reference_forward.h"
#include "support/synthetic_model.h"
#include "support/test_util.h"

namespace metro::model {
namespace {

using kernels::DType;
using metro::testing::make_synthetic_model;
using metro::testing::SyntheticModelSpec;

constexpr int kBlock = 4;
// Two sequences in one arena of 8 blocks: sequence 0 up to 16 positions, sequence 1 up to 8.
const std::vector<std::vector<int32_t>> kTables = {{5, 1, 6, 3}, {0, 7}};

std::unique_ptr<Model> load(const std::vector<uint8_t>& bytes, const ModelOptions& opts = {}) {
  auto f = gguf::File::parse(bytes);
  EXPECT_TRUE(f.ok()) << f.status().message();
  auto m = Model::from_file(std::move(*f), opts);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(*m) : nullptr;
}

// One model (a shard, or the whole) with its own KV arena and workspace.
struct Stage {
  std::unique_ptr<Model> model;
  std::unique_ptr<kv::KvArena> arena;  // the two sequences of kTables
  std::unique_ptr<SequenceKv> single;  // or one sequence of n_ctx positions
  Workspace ws;
  std::vector<std::span<const int32_t>> tables;

  explicit Stage(std::unique_ptr<Model> m, int single_ctx = 0) : model(std::move(m)) {
    if (single_ctx > 0) {
      single = std::make_unique<SequenceKv>(*model, single_ctx);
      ws = model->make_workspace({32, 32, 1, single_ctx / 16 + 1});
      return;
    }
    arena = std::make_unique<kv::KvArena>(model->backend(), model->kv_layers(),
                                          model->kv_layout(DType::kF16, kBlock), 8);
    ws = model->make_workspace({32, 32, 4, 8});
    tables.assign(kTables.begin(), kTables.end());
  }
  KvView view() const { return single ? single->view() : arena->view(tables); }
};

// Prompts of both sequences (logits at their last tokens), a decode of both, then a chunk of
// sequence 0 beside a decode of sequence 1 (logits at every token).
std::vector<Batch> scenario(int n_vocab) {
  std::vector<Batch> steps(3);
  int id = 7;
  auto tok = [&] { return (id = (id * 37 + 11) % n_vocab); };
  for (int p = 0; p < 9; ++p) steps[0].add(tok(), p, 0, p == 8);
  for (int p = 0; p < 5; ++p) steps[0].add(tok(), p, 1, p == 4);
  steps[1].add(tok(), 9, 0, true);
  steps[1].add(tok(), 5, 1, true);
  for (int p = 10; p < 13; ++p) steps[2].add(tok(), p, 0, true);
  steps[2].add(tok(), 6, 1, true);
  return steps;
}

struct StepResult {
  std::vector<float> logits, hidden;
};

std::vector<float> copy(const float* p, size_t n) { return p ? std::vector<float>(p, p + n) : std::vector<float>{}; }

// Runs every step through the stages in order, each later stage starting from the
// previous one's residual.
std::vector<StepResult> run_pipeline(std::vector<Stage*> stages, const std::vector<Batch>& steps, bool want_hidden) {
  ThreadPool pool(2);
  std::vector<StepResult> results;
  ForwardOptions fo;
  fo.want_hidden = want_hidden;
  for (const Batch& b : steps) {
    std::span<const float> residual;
    StepResult r;
    for (size_t s = 0; s < stages.size(); ++s) {
      Stage& st = *stages[s];
      auto out = st.model->forward(b, residual, st.view(), st.ws, pool, fo);
      EXPECT_TRUE(out.ok()) << out.status().message();
      if (!out.ok()) return results;
      const size_t n_embd = st.model->hparams().n_embd;
      if (s + 1 < stages.size()) {
        EXPECT_EQ(out->logits, nullptr);
        EXPECT_NE(out->residual, nullptr);
        residual = {out->residual, static_cast<size_t>(b.size()) * n_embd};
      } else {
        EXPECT_EQ(out->residual, nullptr);
        r.logits = copy(out->logits, static_cast<size_t>(out->n_rows) * static_cast<size_t>(out->n_vocab));
        r.hidden = copy(out->hidden, want_hidden ? static_cast<size_t>(b.size()) * n_embd : 0);
      }
    }
    results.push_back(std::move(r));
  }
  return results;
}

// Every rank runs every step on its own thread (one pool thread each); the ranks meet in
// the all-reduces.
std::vector<std::vector<StepResult>> run_ranks(std::vector<Stage*> ranks, const std::vector<Batch>& steps,
                                               backends::StepObserver* observer0 = nullptr) {
  std::vector<std::vector<StepResult>> results(ranks.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r) {
    threads.emplace_back([&, r] {
      ThreadPool pool(1);
      ForwardOptions fo;
      fo.observer = r == 0 ? observer0 : nullptr;
      Stage& st = *ranks[r];
      for (const Batch& b : steps) {
        auto out = st.model->forward(b, st.view(), st.ws, pool, fo);
        EXPECT_TRUE(out.ok()) << out.status().message();
        if (!out.ok()) std::abort();  // the other ranks would wait in an all-reduce forever
        results[r].push_back({copy(out->logits, static_cast<size_t>(out->n_rows) * static_cast<size_t>(out->n_vocab)), {}});
      }
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp must not see the null data of an empty vector.
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void expect_same_results(const std::vector<StepResult>& got, const std::vector<StepResult>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t s = 0; s < want.size(); ++s) {
    ASSERT_FALSE(want[s].logits.empty());
    EXPECT_TRUE(same_bits(got[s].logits, want[s].logits)) << what << ": logits of step " << s;
    EXPECT_TRUE(same_bits(got[s].hidden, want[s].hidden)) << what << ": hidden states of step " << s;
  }
}

struct Variant {
  std::string name;
  SyntheticModelSpec spec;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  SyntheticModelSpec s;
  s.n_layer = 4;
  for (DType t : {DType::kF16, DType::kQ8_0, DType::kQ4_1}) {
    s.matrix_type = t;
    s.embd_type = t == DType::kF16 ? DType::kF16 : DType::kQ8_0;
    v.push_back({std::string(kernels::dtype_name(t)), s});
  }
  s.matrix_type = DType::kF16;
  s.embd_type = DType::kF16;
  s.arch = "qwen2";
  s.qkv_bias = true;
  s.tied_output = false;
  v.push_back({"qwen2 biases, untied head", s});
  s.arch = "qwen3";
  s.qkv_bias = false;
  s.qk_norm = true;
  v.push_back({"qwen3 head norms", s});
  s.arch = "phi3";
  s.qk_norm = false;
  s.fused = true;
  v.push_back({"phi3 fused projections", s});
  return v;
}

TEST(Shard, PipelineStagesGiveTheWholeModelsBits) {
  for (const Variant& var : variants()) {
    SCOPED_TRACE(var.name);
    const auto bytes = make_synthetic_model(var.spec);
    const auto steps = scenario(static_cast<int>(var.spec.n_vocab));
    Stage whole(load(bytes));
    for (bool hidden : {false, true}) {
      const auto want = run_pipeline({&whole}, steps, hidden);
      for (const std::vector<std::pair<int, int>>& ranges :
           {std::vector<std::pair<int, int>>{{0, 2}, {2, 4}}, std::vector<std::pair<int, int>>{{0, 1}, {1, 3}, {3, -1}}}) {
        std::vector<std::unique_ptr<Stage>> owned;
        std::vector<Stage*> stages;
        std::string what = hidden ? "with hidden states, stages" : "stages";
        for (auto [b, e] : ranges) {
          ModelOptions o;
          o.shard.layer_begin = b;
          o.shard.layer_end = e;
          owned.push_back(std::make_unique<Stage>(load(bytes, o)));
          stages.push_back(owned.back().get());
          what += " [" + std::to_string(b) + ", " + std::to_string(e) + ")";
          EXPECT_EQ(owned.back()->model->kv_layers(), (e < 0 ? 4 : e) - b);
        }
        expect_same_results(run_pipeline(stages, steps, hidden), want, what);
      }
    }
  }
}

// Ranks 0 and 1 of 2, each model built with the other rank's output and down columns zero.
TEST(Shard, TensorParallelRanksGiveTheWholeModelsBitsWhenTheOtherRanksColumnsAreZero) {
  for (const Variant& var : variants()) {
    for (int live : {0, 1}) {
      SCOPED_TRACE(var.name + ", only rank " + std::to_string(live) + "'s columns nonzero");
      SyntheticModelSpec spec = var.spec;
      const int dead = 1 - live;
      // Which columns the dead rank holds (its heads' and its FFN columns), from a bound
      // shard of the dense model.
      const auto dense = make_synthetic_model(var.spec);
      auto group = dist::make_local_group(2);
      ModelOptions probe;
      probe.shard.tp_rank = dead;
      probe.shard.tp_size = 2;
      probe.comm = group[static_cast<size_t>(dead)];
      const ShardGeometry g = load(dense, probe)->shard();
      const uint32_t hd = spec.n_embd / spec.n_head;
      spec.zero_attn_output_cols = {static_cast<uint32_t>(g.head_begin) * hd, static_cast<uint32_t>(g.head_end) * hd};
      spec.zero_ffn_down_cols = {static_cast<uint32_t>(g.ff_begin), static_cast<uint32_t>(g.ff_end)};

      const auto bytes = make_synthetic_model(spec);
      const auto steps = scenario(static_cast<int>(spec.n_vocab));
      Stage whole(load(bytes));
      const auto want = run_pipeline({&whole}, steps, false);
      std::vector<std::unique_ptr<Stage>> ranks;
      for (int r = 0; r < 2; ++r) {
        ModelOptions o;
        o.shard.tp_rank = r;
        o.shard.tp_size = 2;
        o.comm = group[static_cast<size_t>(r)];
        ranks.push_back(std::make_unique<Stage>(load(bytes, o)));
        EXPECT_EQ(ranks.back()->model->kv_layout(DType::kF16, kBlock).n_head_kv, 1);
      }
      backends::StepProfile profile;
      const auto got = run_ranks({ranks[0].get(), ranks[1].get()}, steps, &profile);
      expect_same_results(got[0], want, "rank 0");
      expect_same_results(got[1], want, "rank 1");
      // Two all-reduces per layer and step.
      EXPECT_EQ(profile.calls(backends::OpKind::kAllReduce), 2 * static_cast<int>(spec.n_layer) * 3);
    }
  }
}

double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// On a dense model the ranks' sums differ from the whole's in rounding only: each
// projection's output is the same float evaluation of the same products, summed in
// another association, which is within the same rounding bound of the exact sum. So the
// ranks' logits lie about as far from the exact forward pass (reference_forward, in
// double) as the whole model's do, and from each other at most the sum of the two
// distances: we allow 2x the whole model's measured distance to the exact pass on each
// side, i.e. |ranks - whole| <= 4 |whole - exact|. Every rank holds the same bits.
TEST(Shard, TensorParallelRanksMatchTheWholeWithinTheRoundingOfTheirSums) {
  for (DType t : {DType::kF16, DType::kQ8_0}) {
    for (int n_ranks : {2, 3}) {
      SCOPED_TRACE(std::string(kernels::dtype_name(t)) + ", " + std::to_string(n_ranks) + " ranks");
      SyntheticModelSpec spec;
      spec.n_layer = 3;
      spec.n_head = 8;
      spec.n_head_kv = 4;  // head_dim 32
      spec.matrix_type = t;
      spec.embd_type = t == DType::kF16 ? DType::kF16 : DType::kQ8_0;
      const auto bytes = make_synthetic_model(spec);
      std::vector<int32_t> toks;
      for (int i = 0; i < 24; ++i) toks.push_back((i * 53 + 5) % static_cast<int>(spec.n_vocab));
      std::vector<Batch> step(1);
      for (int i = 0; i < 24; ++i) step[0].add(toks[static_cast<size_t>(i)], i, 0, true);

      Stage whole(load(bytes), 32);
      const auto want = run_pipeline({&whole}, step, false);
      auto group = dist::make_local_group(n_ranks);
      std::vector<std::unique_ptr<Stage>> owned;
      std::vector<Stage*> ranks;
      for (int r = 0; r < n_ranks; ++r) {
        ModelOptions o;
        o.shard.tp_rank = r;
        o.shard.tp_size = n_ranks;
        o.comm = group[static_cast<size_t>(r)];
        owned.push_back(std::make_unique<Stage>(load(bytes, o), 32));
        ranks.push_back(owned.back().get());
      }
      const auto got = run_ranks(ranks, step);

      auto f = gguf::File::parse(bytes);
      auto exact = reference_forward(*f, toks);
      ASSERT_TRUE(exact.ok()) << exact.status().message();
      std::vector<float> exact_flat;
      for (const auto& row : *exact) exact_flat.insert(exact_flat.end(), row.begin(), row.end());
      const double whole_err = rel_rms(want[0].logits, exact_flat);
      EXPECT_GT(whole_err, 0.0);
      for (int r = 0; r < n_ranks; ++r) {
        EXPECT_TRUE(same_bits(got[static_cast<size_t>(r)][0].logits, got[0][0].logits)) << "rank " << r;
      }
      EXPECT_LE(rel_rms(got[0][0].logits, want[0].logits), 4 * whole_err);
    }
  }
}

// A mixture-of-experts model: pipeline stages give its bits; tensor-parallel ranks slice
// every expert's FFN columns (the router runs whole on each rank, so they route alike) and
// match the whole within the rounding of their sums.
TEST(Shard, MixtureOfExpertsInStagesAndRanks) {
  SyntheticModelSpec spec;
  spec.arch = "qwen3moe";
  spec.qk_norm = true;
  spec.n_layer = 3;
  spec.n_head = 8;
  spec.n_head_kv = 4;
  spec.n_expert = 8;
  spec.n_expert_used = 2;
  spec.n_ff_exp = 128;
  const auto bytes = make_synthetic_model(spec);
  std::vector<int32_t> toks;
  for (int i = 0; i < 24; ++i) toks.push_back((i * 53 + 5) % static_cast<int>(spec.n_vocab));
  std::vector<Batch> step(1);
  for (int i = 0; i < 24; ++i) step[0].add(toks[static_cast<size_t>(i)], i, 0, true);
  Stage whole(load(bytes), 32);
  const auto want = run_pipeline({&whole}, step, false);

  ModelOptions first, second;
  first.shard.layer_end = 1;
  second.shard.layer_begin = 1;
  Stage a(load(bytes, first), 32), b(load(bytes, second), 32);
  expect_same_results(run_pipeline({&a, &b}, step, false), want, "two stages");

  auto group = dist::make_local_group(2);
  std::vector<std::unique_ptr<Stage>> owned;
  std::vector<Stage*> ranks;
  for (int r = 0; r < 2; ++r) {
    ModelOptions o;
    o.shard.tp_rank = r;
    o.shard.tp_size = 2;
    o.comm = group[static_cast<size_t>(r)];
    owned.push_back(std::make_unique<Stage>(load(bytes, o), 32));
    ASSERT_TRUE(owned.back()->model);
    EXPECT_EQ(owned.back()->model->weights().layers[0].exp_gate[0]->n_rows(), 64);
    ranks.push_back(owned.back().get());
  }
  const auto got = run_ranks(ranks, step);
  auto f = gguf::File::parse(bytes);
  auto exact = reference_forward(*f, toks);
  ASSERT_TRUE(exact.ok()) << exact.status().message();
  std::vector<float> exact_flat;
  for (const auto& row : *exact) exact_flat.insert(exact_flat.end(), row.begin(), row.end());
  const double whole_err = rel_rms(want[0].logits, exact_flat);
  EXPECT_TRUE(same_bits(got[1][0].logits, got[0][0].logits));
  EXPECT_LE(rel_rms(got[0][0].logits, want[0].logits), 4 * whole_err);

  // A shared expert is not sliced yet: refused by name.
  spec.arch = "qwen2moe";
  spec.qk_norm = false;
  spec.n_ff_shexp = 128;
  const auto shared_bytes = make_synthetic_model(spec);  // parse() reads these bytes in place
  auto f2 = gguf::File::parse(shared_bytes);
  ASSERT_TRUE(f2.ok());
  ModelOptions o;
  o.shard.tp_size = 2;
  o.comm = group[0];
  auto refused = Model::from_file(std::move(*f2), o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("shared expert"), std::string::npos) << refused.status().message();
}

// The default model: two pipeline stages give its bits; three tensor-parallel ranks (one KV
// head each) hold the same bits as each other and pick its greedy tokens.
TEST(Shard, DefaultModelInStagesAndRanks) {
  REQUIRE_MODEL();
  const std::string path = metro::testing::default_model_path();
  auto load_path = [&](const ModelOptions& o) {
    auto m = Model::load(path, o);
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? std::move(*m) : nullptr;
  };
  constexpr int kCtx = 64;
  const std::vector<int32_t> prompt = {1,    9690, 198,   2683, 359,  253,  5356, 5646, 11173, 3365,
                                       3511, 308,  34519, 28,   7018, 411,  407,  19712, 8182, 2};
  // The whole model's greedy steps: the prompt, then one decode per token it picks.
  Stage whole(load_path({}), kCtx);
  ThreadPool pool(2);
  std::vector<Batch> steps(1);
  for (size_t i = 0; i < prompt.size(); ++i) steps[0].add(prompt[i], static_cast<int32_t>(i), 0, i + 1 == prompt.size());
  std::vector<StepResult> want;
  std::vector<int32_t> picked;
  for (int s = 0; s < 6; ++s) {
    auto out = whole.model->forward(steps.back(), whole.view(), whole.ws, pool);
    ASSERT_TRUE(out.ok()) << out.status().message();
    want.push_back({copy(out->logits, static_cast<size_t>(out->n_vocab)), {}});
    const auto row = out->row(0);
    picked.push_back(static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()));
    if (s == 5) break;
    steps.emplace_back();
    steps.back().add(picked.back(), static_cast<int32_t>(prompt.size()) + s, 0, true);
  }

  ModelOptions first, second;
  first.shard.layer_end = 15;
  second.shard.layer_begin = 15;
  Stage a(load_path(first), kCtx), b(load_path(second), kCtx);
  EXPECT_EQ(a.model->kv_layers(), 15);
  expect_same_results(run_pipeline({&a, &b}, steps, false), want, "stages [0, 15) and [15, 30)");

  auto group = dist::make_local_group(3);
  std::vector<std::unique_ptr<Stage>> owned;
  for (int r = 0; r < 3; ++r) {
    ModelOptions o;
    o.shard.tp_rank = r;
    o.shard.tp_size = 3;
    o.comm = group[static_cast<size_t>(r)];
    owned.push_back(std::make_unique<Stage>(load_path(o), kCtx));
    EXPECT_EQ(owned.back()->model->shard().n_head(), 3);
  }
  const auto got = run_ranks({owned[0].get(), owned[1].get(), owned[2].get()}, steps);
  for (size_t s = 0; s < steps.size(); ++s) {
    for (int r = 1; r < 3; ++r) {
      EXPECT_TRUE(same_bits(got[static_cast<size_t>(r)][s].logits, got[0][s].logits)) << "rank " << r << " step " << s;
    }
    const auto& row = got[0][s].logits;
    EXPECT_EQ(std::max_element(row.begin(), row.end()) - row.begin(), picked[s]) << "step " << s;
  }
}

// The file of `bytes` with only the layers `keep` (renumbered from 0) and block_count to match.
std::vector<uint8_t> keep_layers(const std::vector<uint8_t>& bytes, const std::vector<int>& keep) {
  auto f = gguf::File::parse(bytes);
  EXPECT_TRUE(f.ok());
  gguf::Writer w;
  for (const auto& kv : f->metadata()) {
    if (kv.key.ends_with(".block_count")) {
      w.add_u32(kv.key, static_cast<uint32_t>(keep.size()));
    } else {
      w.add_value(kv.key, kv.value);
    }
  }
  for (const auto& t : f->tensors()) {
    std::string name(t.name);
    if (name.starts_with("blk.")) {
      const size_t dot = name.find('.', 4);
      const int layer = std::stoi(name.substr(4, dot - 4));
      auto it = std::find(keep.begin(), keep.end(), layer);
      if (it == keep.end()) continue;
      name = "blk." + std::to_string(it - keep.begin()) + name.substr(dot);
    }
    EXPECT_TRUE(w.add_tensor(name, t.type(), std::vector<uint64_t>(t.ne, t.ne + t.n_dims), {t.data, t.n_bytes}).ok());
  }
  return w.serialize();
}

// A model that skips layers is the model without them: the bits of a file that holds only
// the other layers, through prompts, decodes and mixed steps, with hidden states too.
TEST(Shard, SkippedLayersGiveTheBitsOfTheModelWithoutThem) {
  for (const Variant& var : variants()) {
    SCOPED_TRACE(var.name);
    const auto bytes = make_synthetic_model(var.spec);  // 4 layers
    const auto steps = scenario(static_cast<int>(var.spec.n_vocab));
    for (const std::vector<int>& skip : {std::vector<int>{1, 3}, std::vector<int>{3}, std::vector<int>{0, 1, 2}}) {
      std::vector<int> keep;
      for (int l = 0; l < 4; ++l) {
        if (std::find(skip.begin(), skip.end(), l) == skip.end()) keep.push_back(l);
      }
      const std::vector<uint8_t> kept = keep_layers(bytes, keep);  // outlives the model reading it
      Stage without(load(kept));
      ModelOptions o;
      o.shard.skip = skip;
      Stage skipping(load(bytes, o));
      EXPECT_EQ(skipping.model->kv_layers(), static_cast<int>(keep.size()));
      for (bool hidden : {false, true}) {
        expect_same_results(run_pipeline({&skipping}, steps, hidden), run_pipeline({&without}, steps, hidden),
                            "skipping " + std::to_string(skip.size()) + " layers");
      }
    }
  }
}

TEST(Shard, RefusesWhatDoesNotFit) {
  SyntheticModelSpec spec;  // 2 layers, 2 KV heads
  const auto bytes = make_synthetic_model(spec);
  auto refuse = [&](const ModelOptions& o, const std::string& words) {
    auto f = gguf::File::parse(bytes);
    auto m = Model::from_file(std::move(*f), o);
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find(words), std::string::npos) << m.status().message();
  };
  ModelOptions o;
  o.shard.layer_begin = 1;
  o.shard.layer_end = 1;
  refuse(o, "non-empty range");
  o.shard.layer_end = 3;
  refuse(o, "non-empty range");
  o = {};
  o.shard.skip = {0, 1};
  refuse(o, "every one of its layers");
  o.shard.skip = {2};
  refuse(o, "outside the shard");
  o = {};
  o.shard.tp_size = 3;
  o.comm = dist::make_local_group(3)[0];
  refuse(o, "KV heads");
  o = {};
  o.shard.tp_size = 2;
  refuse(o, "communicator");
  o.comm = dist::make_local_group(3)[0];
  refuse(o, "communicator");
  // K-quant blocks of 256 columns cannot be cut at a head boundary of 128 columns.
  SyntheticModelSpec kq;
  kq.matrix_type = DType::kQ4_K;
  kq.embd_type = DType::kQ8_0;
  const auto kq_bytes = make_synthetic_model(kq);
  o.comm = dist::make_local_group(2)[0];
  auto f = gguf::File::parse(kq_bytes);
  auto m = Model::from_file(std::move(*f), o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("attn_output"), std::string::npos) << m.status().message();

  // A residual where a shard starts the model, none where it does not; a KV view of
  // another shape.
  ModelOptions second;
  second.shard.layer_begin = 1;
  Stage later(load(bytes, second));
  Stage first(load(bytes));
  ThreadPool pool(1);
  Batch b;
  b.add(3, 0, 0, true);
  const std::vector<float> residual(spec.n_embd, 0.5f);
  EXPECT_FALSE(first.model->forward(b, residual, first.view(), first.ws, pool).ok());
  EXPECT_FALSE(later.model->forward(b, later.view(), later.ws, pool).ok());
  EXPECT_FALSE(later.model->forward(b, std::span<const float>(residual).first(10), later.view(), later.ws, pool).ok());
  EXPECT_TRUE(later.model->forward(b, residual, later.view(), later.ws, pool).ok());
  EXPECT_FALSE(later.model->forward(b, residual, first.view(), later.ws, pool).ok());
}

}  // namespace
}  // namespace metro::model
