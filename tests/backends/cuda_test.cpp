// The CUDA backend end to end on the default model, against the CPU backend: greedy
// generations, teacher-forced logits, and a batch of 16 sequences mixing prefill and
// decode chunks over both KV page types. Skipped (with the reason printed) where no CUDA
// device answers; the per-op checks are backend_ops_test.cpp's, run on every backend.
//
// The two backends quantize every product's activations the same way but sum in different
// orders, and 8-bit activation rounding is discontinuous: a one-ulp difference can move an
// activation across a rounding boundary (tests/model/golden_generation_test.cpp measures
// what that does on this model). So logits are compared with that test's tolerances, and a
// greedy choice may differ only where the CPU's own top-two margin is a near-tie.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/cuda/cuda_backend.h"
#include "backends/registry.h"
#include "kv/kv_arena.h"
#include "model/model.h"
#include "support/test_util.h"

namespace metro::backends {
namespace {

using kernels::DType;
using model::Batch;
using model::Model;
using nlohmann::json;

constexpr double kTieMargin = 0.5;            // as golden_generation_test.cpp's
constexpr double kLogitTolerance = 1.5;       // worst |logit difference| among the CPU's top 10
constexpr double kMeanLogitTolerance = 0.25;  // mean of those differences

#define REQUIRE_CUDA()                                                                                  \
  do {                                                                                                  \
    if (cuda_device_count() == 0)                                                                       \
      GTEST_SKIP() << "no CUDA device: "                                                                \
                   << (cuda_compiled() ? "none answers on this machine" : "this build has no CUDA backend"); \
  } while (0)

struct Pair {
  std::unique_ptr<Model> cpu, gpu;
  std::unique_ptr<Model> cpu_scalar;  // the CPU with its scalar kernels (with_scalar only)
};

Pair load_pair(bool with_scalar = false) {
  Pair p;
  model::ModelOptions o;
  if (with_scalar) {
    for (const auto& b : available_backends()) {
      if (b->name() != "cpu-scalar") continue;
      o.backend = b;
      auto s = Model::load(metro::testing::default_model_path(), o);
      EXPECT_TRUE(s.ok()) << s.status().message();
      if (s.ok()) p.cpu_scalar = std::move(s).value();
    }
    EXPECT_TRUE(p.cpu_scalar) << "no cpu-scalar backend listed";
  }
  o.backend = default_backend();
  auto c = Model::load(metro::testing::default_model_path(), o);
  EXPECT_TRUE(c.ok()) << c.status().message();
  auto cuda = make_cuda_backend(0);
  EXPECT_TRUE(cuda.ok()) << cuda.status().message();
  if (!c.ok() || !cuda.ok()) return p;
  o.backend = *cuda;
  auto g = Model::load(metro::testing::default_model_path(), o);
  EXPECT_TRUE(g.ok()) << g.status().message();
  if (!g.ok()) return p;
  p.cpu = std::move(c).value();
  p.gpu = std::move(g).value();
  return p;
}

json fixture() {
  std::ifstream in(metro::testing::source_path("tests/fixtures/generation/smollm2_q4_1_greedy.json"));
  return json::parse(in);
}

double top2_margin(const std::vector<float>& row) {
  std::vector<float> v(row);
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
  return static_cast<double>(v[0]) - v[1];
}

int32_t argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Differences of the GPU's logits from the CPU's at the CPU's 10 largest.
struct Diff {
  double worst = 0, sum = 0;
  int n = 0;
  void add(const std::vector<float>& cpu, const std::vector<float>& gpu) {
    std::vector<int> idx(cpu.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int>(i);
    std::partial_sort(idx.begin(), idx.begin() + 10, idx.end(),
                      [&](int a, int b) { return cpu[static_cast<size_t>(a)] > cpu[static_cast<size_t>(b)]; });
    for (int k = 0; k < 10; ++k) {
      const size_t i = static_cast<size_t>(idx[static_cast<size_t>(k)]);
      const double d = std::fabs(static_cast<double>(cpu[i]) - gpu[i]);
      worst = std::max(worst, d);
      sum += d;
      ++n;
    }
  }
  double mean() const { return n > 0 ? sum / n : 0.0; }
};

struct Greedy {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

Greedy generate(const Model& m, const std::vector<int32_t>& prompt, int n) {
  ThreadPool pool(2);
  model::WorkspaceLimits lim;
  lim.max_tokens = static_cast<int>(prompt.size());
  lim.max_logits = 1;
  lim.max_seqs = 1;
  lim.max_blocks_per_seq = static_cast<int>(prompt.size() + n) / 16 + 2;
  model::Workspace ws = m.make_workspace(lim);
  model::SequenceKv kv(m, static_cast<int>(prompt.size()) + n);
  Greedy g;
  Batch b;
  for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], static_cast<int32_t>(i), 0, i + 1 == prompt.size());
  for (int step = 0; step < n; ++step) {
    auto out = m.forward(b, kv.view(), ws, pool);
    EXPECT_TRUE(out.ok()) << out.status().message();
    if (!out.ok()) return g;
    auto row = out->row(0);
    g.logits.emplace_back(row.begin(), row.end());
    g.tokens.push_back(argmax(g.logits.back()));
    b.clear();
    b.add(g.tokens.back(), static_cast<int32_t>(prompt.size()) + step, 0, true);
  }
  return g;
}

TEST(Cuda, GreedyGenerationsMatchTheCpu) {
  REQUIRE_CUDA();
  REQUIRE_MODEL();
  const Pair p = load_pair();
  ASSERT_TRUE(p.cpu && p.gpu);
  const json fx = fixture();
  const int n = 32;
  Diff diff;
  int cases = 0;
  for (const auto& c : fx["cases"]) {
    if (++cases > 5) break;
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const Greedy a = generate(*p.cpu, prompt, n), b = generate(*p.gpu, prompt, n);
    ASSERT_EQ(a.tokens.size(), static_cast<size_t>(n));
    ASSERT_EQ(b.tokens.size(), static_cast<size_t>(n));
    int first = n;
    for (int i = 0; i < n; ++i) {
      diff.add(a.logits[static_cast<size_t>(i)], b.logits[static_cast<size_t>(i)]);  // the same context so far
      if (a.tokens[static_cast<size_t>(i)] != b.tokens[static_cast<size_t>(i)]) {
        first = i;
        break;
      }
    }
    if (first == n) {
      std::printf("cuda greedy %-14s: all %d tokens equal the CPU's\n", c["name"].get<std::string>().c_str(), n);
      continue;
    }
    const double margin = top2_margin(a.logits[static_cast<size_t>(first)]);
    std::printf("cuda greedy %-14s: first %d tokens equal; at %d the CPU's top-2 margin is %.3f (bound %.2f)\n",
                c["name"].get<std::string>().c_str(), first, first, margin, kTieMargin);
    EXPECT_LT(margin, kTieMargin) << c["name"] << ": CUDA chose " << b.tokens[static_cast<size_t>(first)]
                                  << ", the CPU " << a.tokens[static_cast<size_t>(first)] << " at step " << first;
  }
  std::printf("cuda greedy logits vs CPU (top 10): worst |diff| %.4f (bound %.2f), mean %.4f (bound %.2f)\n",
              diff.worst, kLogitTolerance, diff.mean(), kMeanLogitTolerance);
  EXPECT_LE(diff.worst, kLogitTolerance);
  EXPECT_LE(diff.mean(), kMeanLogitTolerance);
}

// A step whose shape recurs runs as a captured CUDA graph (docs/cuda.md): it must compute
// what launching its kernels one by one computes, bit for bit (the same kernels in the same
// order on the same data), over a prompt and decode steps that recur in shape.
TEST(Cuda, GraphedStepsMatchPlainLaunchesBitForBit) {
  REQUIRE_CUDA();
  REQUIRE_MODEL();
  // A backend's context reads METRO_CUDA_GRAPHS when it is made.
  const char* env = std::getenv("METRO_CUDA_GRAPHS");
  const std::string saved = env != nullptr ? env : "";
  auto load = [](const char* graphs) -> std::unique_ptr<Model> {
    setenv("METRO_CUDA_GRAPHS", graphs, 1);
    auto cuda = make_cuda_backend(0);
    EXPECT_TRUE(cuda.ok()) << cuda.status().message();
    if (!cuda.ok()) return nullptr;
    model::ModelOptions o;
    o.backend = *cuda;
    auto m = Model::load(metro::testing::default_model_path(), o);
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? std::move(m).value() : nullptr;
  };
  const std::unique_ptr<Model> plain = load("0"), graphed = load("1");
  if (env != nullptr) {
    setenv("METRO_CUDA_GRAPHS", saved.c_str(), 1);
  } else {
    unsetenv("METRO_CUDA_GRAPHS");
  }
  ASSERT_TRUE(plain && graphed);
  const json fx = fixture();
  const auto prompt = fx["cases"][0]["prompt_ids"].get<std::vector<int32_t>>();
  const int n = 24;
  const Greedy a = generate(*plain, prompt, n), b = generate(*graphed, prompt, n);
  ASSERT_EQ(a.tokens.size(), static_cast<size_t>(n));
  ASSERT_EQ(b.tokens.size(), static_cast<size_t>(n));
  EXPECT_EQ(a.tokens, b.tokens);
  int differing = 0;
  for (int i = 0; i < n; ++i) differing += a.logits[static_cast<size_t>(i)] != b.logits[static_cast<size_t>(i)];
  EXPECT_EQ(differing, 0) << "steps whose logits differ between graphed and plain launches";
  std::printf("cuda graphs: %d steps, %d with logits differing from plain launches\n", n, differing);
}

// Steps over n_seqs sequences in one arena (block ids interleaved across sequences, so no
// sequence's blocks are contiguous); the logits rows of every step.
std::vector<std::vector<std::vector<float>>> run_steps(const Model& m, const std::vector<Batch>& steps, int n_seqs,
                                                       int max_pos, DType kv_type) {
  const int bs = 16;
  const int bps = max_pos / bs + 1;
  kv::KvArena arena(m.backend(), m.kv_layers(), m.kv_layout(kv_type, bs), n_seqs * bps);
  std::vector<std::vector<kv::BlockId>> owned(static_cast<size_t>(n_seqs));
  std::vector<std::span<const kv::BlockId>> tables;
  for (int s = 0; s < n_seqs; ++s) {
    for (int j = 0; j < bps; ++j) owned[static_cast<size_t>(s)].push_back(j * n_seqs + s);
    tables.emplace_back(owned[static_cast<size_t>(s)]);
  }
  const model::KvView view = arena.view(tables);
  model::WorkspaceLimits lim;
  lim.max_tokens = 1;
  lim.max_logits = 1;
  for (const Batch& b : steps) {
    lim.max_tokens = std::max(lim.max_tokens, b.size());
    lim.max_logits = std::max(lim.max_logits, static_cast<int>(std::count(b.logits.begin(), b.logits.end(), 1)));
  }
  lim.max_seqs = n_seqs;
  lim.max_blocks_per_seq = bps;
  model::Workspace ws = m.make_workspace(lim);
  ThreadPool pool(2);
  std::vector<std::vector<std::vector<float>>> out;
  for (const Batch& b : steps) {
    auto r = m.forward(b, view, ws, pool);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return out;
    out.emplace_back();
    for (int row = 0; row < r->n_rows; ++row) {
      auto v = r->row(row);
      out.back().emplace_back(v.begin(), v.end());
    }
  }
  return out;
}

// 16 sequences: 8 prompts prefilled; then their first decode tokens beside the other 8
// prompts' prefill in one step; then 4 decode steps of all 16. Every prompt token of a
// prefill also wants logits in the mixed step (a wide logits product). The decode tokens
// are arbitrary (not the model's choices), which leaves the model in states where the
// activation-rounding noise grows more over 30 layers than on its own generations. So the
// bound is measured in the same run: the CPU's two kernel sets (scalar and SIMD: the same
// quantization, other summation orders) differ from each other by some spread, and the
// GPU may differ from the CPU by at most three times that at worst and twice that on
// average (and never by more than a fixed cap). Measured on an H200: with F16 KV the GPU is
// as close to the CPU as the CPU's kernel sets are to each other (worst 1.08 against 1.24);
// with Q8_0 KV it is further (worst 3.10 against 1.50, means 0.28 against 0.25), which
// docs/cuda.md lists as not yet explained.
TEST(Cuda, BatchOfSixteenMixingPrefillAndDecodeMatchesTheCpu) {
  REQUIRE_CUDA();
  REQUIRE_MODEL();
  const Pair p = load_pair(/*with_scalar=*/true);
  ASSERT_TRUE(p.cpu && p.gpu && p.cpu_scalar);
  const json fx = fixture();
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < 16; ++s) {
    auto ids = fx["cases"][static_cast<size_t>(s) % fx["cases"].size()]["prompt_ids"].get<std::vector<int32_t>>();
    ids.resize(std::min<size_t>(ids.size(), static_cast<size_t>(4 + 3 * s)));  // lengths 4 .. 49
    prompts.push_back(ids);
  }
  auto decode_token = [](int s, int step) { return static_cast<int32_t>(100 + 37 * s + 11 * step); };
  std::vector<Batch> steps(6);
  int max_pos = 0;
  for (int s = 0; s < 8; ++s) {
    const auto& pr = prompts[static_cast<size_t>(s)];
    for (size_t i = 0; i < pr.size(); ++i) steps[0].add(pr[i], static_cast<int32_t>(i), s, i + 1 == pr.size());
  }
  for (int s = 0; s < 16; ++s) {
    const auto& pr = prompts[static_cast<size_t>(s)];
    const int32_t n = static_cast<int32_t>(pr.size());
    if (s < 8) {
      steps[1].add(decode_token(s, 0), n, s, true);
    } else {
      for (int32_t i = 0; i < n; ++i) steps[1].add(pr[static_cast<size_t>(i)], i, s, s % 2 == 0 || i + 1 == n);
    }
    for (int d = 0; d < 4; ++d) {
      const int32_t pos = s < 8 ? n + 1 + d : n + d;
      steps[static_cast<size_t>(2 + d)].add(decode_token(s, d + 1), pos, s, true);
      max_pos = std::max(max_pos, static_cast<int>(pos));
    }
  }
  for (DType kv_type : {DType::kF16, DType::kQ8_0}) {
    SCOPED_TRACE(std::string("KV ") + std::string(kernels::dtype_name(kv_type)));
    const auto a = run_steps(*p.cpu, steps, 16, max_pos, kv_type);
    const auto b = run_steps(*p.gpu, steps, 16, max_pos, kv_type);
    const auto c = run_steps(*p.cpu_scalar, steps, 16, max_pos, kv_type);
    ASSERT_EQ(a.size(), steps.size());
    ASSERT_EQ(b.size(), steps.size());
    ASSERT_EQ(c.size(), steps.size());
    // The CPU's own spread: its scalar kernels against its SIMD ones, and the rows where
    // they pick different tokens.
    Diff spread, diff;
    double cpu_flip = 0;
    for (size_t st = 0; st < steps.size(); ++st) {
      ASSERT_EQ(a[st].size(), c[st].size());
      for (size_t r = 0; r < a[st].size(); ++r) {
        spread.add(a[st][r], c[st][r]);
        if (argmax(a[st][r]) != argmax(c[st][r])) cpu_flip = std::max(cpu_flip, top2_margin(a[st][r]));
      }
    }
    const double worst_bound = std::min(3 * kLogitTolerance, std::max(kLogitTolerance, 3 * spread.worst));
    const double mean_bound = std::min(3 * kMeanLogitTolerance, std::max(kMeanLogitTolerance, 2 * spread.mean()));
    const double tie_bound = std::min(3 * kTieMargin, std::max(kTieMargin, 2 * std::max(cpu_flip, spread.worst)));
    int rows = 0, equal = 0;
    double worst_flip = 0;
    for (size_t st = 0; st < steps.size(); ++st) {
      ASSERT_EQ(a[st].size(), b[st].size());
      for (size_t r = 0; r < a[st].size(); ++r) {
        diff.add(a[st][r], b[st][r]);
        ++rows;
        if (argmax(a[st][r]) == argmax(b[st][r])) {
          ++equal;
          continue;
        }
        const double margin = top2_margin(a[st][r]);
        worst_flip = std::max(worst_flip, margin);
        EXPECT_LT(margin, tie_bound) << "step " << st << " row " << r;
      }
    }
    std::printf("cuda batch of 16, KV %s: %d of %d logits rows pick the CPU's token (others at margins <= %.3f, "
                "bound %.3f); top-10 |diff| worst %.4f (bound %.4f), mean %.4f (bound %.4f); CPU scalar vs SIMD: "
                "worst %.4f, mean %.4f, flips at margins <= %.3f\n",
                std::string(kernels::dtype_name(kv_type)).c_str(), equal, rows, worst_flip, tie_bound, diff.worst,
                worst_bound, diff.mean(), mean_bound, spread.worst, spread.mean(), cpu_flip);
    EXPECT_LE(diff.worst, worst_bound);
    EXPECT_LE(diff.mean(), mean_bound);
  }
}

}  // namespace
}  // namespace metro::backends
