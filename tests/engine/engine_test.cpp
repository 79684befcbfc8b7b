// The engine end to end on the default model: batch invariance, prefix caching,
// preemption, n > 1, stop conditions, aborts and embeddings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "base/clock.h"
#include "engine/engine_test_util.h"
#include "engine/step_trace.h"
#include "gguf/writer.h"
#include "support/test_util.h"

namespace metro::engine {
namespace {

using metro::testing::collect;
using metro::testing::collect_choices;
using metro::testing::default_model;
using metro::testing::Generation;
using metro::testing::greedy_request;
using metro::testing::sanitized;

std::unique_ptr<Engine> make_engine(EngineConfig cfg) {
  const auto& sm = default_model();
  if (cfg.n_threads == 0) cfg.n_threads = 2;
  auto e = Engine::create(sm.model, *sm.tokenizer, cfg);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return std::move(*e);
}

std::vector<std::vector<int32_t>> prompts(int n) {
  static const char* kTopics[] = {"trains", "the ocean", "bread", "prime numbers", "Paris",
                                  "a cat", "volcanoes", "jazz"};
  const auto& tok = *default_model().tokenizer;
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::string p = "Question " + std::to_string(i) + ": write ";
    for (int k = 0; k <= i % 5; ++k) p += "a few words ";
    p += std::string("about ") + kTopics[i % 8] + ".";
    out.push_back(tok.encode(p, true, false));
  }
  return out;
}

// Greedy continuations of every prompt (exactly max_tokens each: EOS ignored).
std::vector<std::vector<int32_t>> run_all(Engine& e, const std::vector<std::vector<int32_t>>& ps,
                                          int max_tokens, bool together) {
  auto req = [&](const std::vector<int32_t>& p) {
    Request r = greedy_request(p, max_tokens);
    r.stop.ignore_eos = true;
    return r;
  };
  std::vector<std::vector<int32_t>> out(ps.size());
  if (together) {
    std::vector<Handle> hs;
    for (const auto& p : ps) hs.push_back(*e.submit(req(p)));
    for (size_t i = 0; i < hs.size(); ++i) out[i] = collect(hs[i]).tokens;
  } else {
    for (size_t i = 0; i < ps.size(); ++i) out[i] = collect(*e.submit(req(ps[i]))).tokens;
  }
  return out;
}

TEST(Engine, BatchInvarianceAcrossChunkSizesAndBlockSizes) {
  REQUIRE_MODEL();
  const int n = sanitized() ? 8 : 32, gen = sanitized() ? 4 : 12;
  auto ps = prompts(n);
  EngineConfig solo;
  solo.max_seqs = 1;
  auto alone = run_all(*make_engine(solo), ps, gen, false);
  for (const auto& a : alone) ASSERT_EQ(static_cast<int>(a.size()), gen);
  for (int chunk : {7, 64, 512}) {
    for (int block : {16, 32}) {
      if (sanitized() && !(chunk == 7 && block == 32)) continue;
      EngineConfig cfg;
      cfg.max_seqs = 32;
      cfg.max_batch_tokens = chunk;
      cfg.kv_block = block;
      auto got = run_all(*make_engine(cfg), ps, gen, true);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(got[static_cast<size_t>(i)], alone[static_cast<size_t>(i)])
            << "prompt " << i << " chunk " << chunk << " block " << block;
      }
    }
  }
}

TEST(Engine, PrefixCacheHitsAndSameOutput) {
  REQUIRE_MODEL();
  const auto& tok = *default_model().tokenizer;
  std::string shared = "You are a helpful assistant. ";
  while (tok.encode(shared, true, false).size() < 200) shared += "Answer briefly and precisely. ";
  auto base = tok.encode(shared, true, false);
  base.resize(200);
  auto a = base, b = base;
  for (int32_t t : tok.encode(" First question: why is the sky blue?", false, false)) a.push_back(t);
  for (int32_t t : tok.encode(" Second question: what is rust?", false, false)) b.push_back(t);

  EngineConfig off;
  off.prefix_cache = false;
  auto eng_off = make_engine(off);
  Generation b_nocache = collect(*eng_off->submit(greedy_request(b, 8)));
  EXPECT_EQ(b_nocache.usage.cached_prompt_tokens, 0);

  auto eng = make_engine({});
  Generation ga = collect(*eng->submit(greedy_request(a, 8)));
  EXPECT_EQ(ga.usage.cached_prompt_tokens, 0);
  // The estimate other threads get (admission control) matches what the request then finds.
  const int estimate = eng->cached_prefix_tokens(b);
  EXPECT_GE(estimate, 192);
  EXPECT_EQ(eng_off->cached_prefix_tokens(b), 0);
  Generation gb = collect(*eng->submit(greedy_request(b, 8)));
  EXPECT_GE(gb.usage.cached_prompt_tokens, 192);
  EXPECT_EQ(gb.usage.cached_prompt_tokens, estimate);

  // An admitted prompt not yet computed credits the prompts behind it that share its
  // prefix, while it is held (what admission asks during a burst).
  auto c = b;
  c[0] = c[0] == 7 ? 8 : 7;  // a prefix nothing has computed
  auto d = c;
  d.back() = d.back() == 7 ? 8 : 7;
  EXPECT_EQ(eng->cached_prefix_tokens(d, true), 0);
  auto hold = eng->hold_pending_prefix(c);
  ASSERT_NE(hold, nullptr);
  EXPECT_EQ(eng->cached_prefix_tokens(d), 0);
  EXPECT_GE(eng->cached_prefix_tokens(d, true), 192);
  hold.reset();
  EXPECT_EQ(eng->cached_prefix_tokens(d, true), 0);
  EXPECT_EQ(eng_off->hold_pending_prefix(c), nullptr);
  EXPECT_EQ(gb.usage.prompt_tokens, static_cast<int>(b.size()));
  EXPECT_EQ(gb.tokens, b_nocache.tokens);
  EXPECT_GT(eng->stats().prefix_hits, 0u);
}

// The prefix cache is scoped per tenant by default: a tenant finds its own prefixes, never
// another's (cached_tokens and time to first token would tell it what the other sent);
// configured global, every request shares them.
TEST(Engine, PrefixCacheIsScopedPerTenant) {
  REQUIRE_MODEL();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back(300 + (i * 37) % 900);
  auto request = [&](const std::string& tenant) {
    Request r = greedy_request(prompt, 2);
    r.tenant = tenant;
    return r;
  };
  for (PrefixCacheScope scope : {PrefixCacheScope::kTenant, PrefixCacheScope::kGlobal}) {
    EngineConfig cfg;
    cfg.prefix_cache_scope = scope;
    auto eng = make_engine(cfg);
    const bool global = scope == PrefixCacheScope::kGlobal;
    Generation a1 = collect(*eng->submit(request("alice")));
    EXPECT_EQ(a1.usage.cached_prompt_tokens, 0);
    EXPECT_EQ(eng->cached_prefix_tokens(prompt, false, "alice"), 64);
    EXPECT_EQ(eng->cached_prefix_tokens(prompt, false, "bob"), global ? 64 : 0);
    EXPECT_EQ(eng->cached_prefix_tokens(prompt, false, ""), global ? 64 : 0);
    Generation b = collect(*eng->submit(request("bob")));
    EXPECT_EQ(b.usage.cached_prompt_tokens, global ? 64 : 0) << (global ? "global" : "tenant");
    Generation a2 = collect(*eng->submit(request("alice")));
    EXPECT_EQ(a2.usage.cached_prompt_tokens, 64);
    EXPECT_EQ(a1.tokens, b.tokens);  // the scope changes sharing, never outputs
    EXPECT_EQ(a1.tokens, a2.tokens);
    // A pending prefix credits only requests of its own scope.
    auto other = prompt;
    other[0] = 299;
    auto hold = eng->hold_pending_prefix(other, "alice");
    EXPECT_EQ(eng->cached_prefix_tokens(other, true, "alice"), 64);
    EXPECT_EQ(eng->cached_prefix_tokens(other, true, "bob"), global ? 64 : 0);
  }
}

// Run-time LoRA adapters (Request::adapter) in one engine: an adapter's requests find only
// its own cached prefixes (its KV differs from the base's), the base's only the base's, the
// outputs are the same cached or not and differ from the base's; an adapter the model does
// not hold is refused.
TEST(Engine, LoraAdaptersShareTheEngineAndSaltThePrefixCache) {
  REQUIRE_MODEL();
  // Rank 4 on every layer's attn_q and ffn_up of the default model (576 wide, FFN 1536).
  gguf::Writer w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.type", "adapter");
  w.add_string("adapter.type", "lora");
  w.add_f32("adapter.lora.alpha", 4.0f);
  const uint64_t rank = 4, n_embd = 576, n_ff = 1536;
  for (int il = 0; il < 30; ++il) {
    for (const auto& [name, n_out] : {std::pair{"attn_q", n_embd}, std::pair{"ffn_up", n_ff}}) {
      const std::string t = "blk." + std::to_string(il) + "." + name + ".weight";
      std::vector<float> a(n_embd * rank), b(rank * n_out);
      for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * static_cast<float>(i + il)) * 0.3f;
      for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11f * static_cast<float>(i + il)) * 0.3f;
      ASSERT_TRUE(w.add_tensor(t + ".lora_a", gguf::GgmlType::kF32, {n_embd, rank},
                               {reinterpret_cast<const uint8_t*>(a.data()), a.size() * 4}).ok());
      ASSERT_TRUE(w.add_tensor(t + ".lora_b", gguf::GgmlType::kF32, {rank, n_out},
                               {reinterpret_cast<const uint8_t*>(b.data()), b.size() * 4}).ok());
    }
  }
  const std::string path = ::testing::TempDir() + "/engine_lora_adapter.gguf";
  {
    const std::vector<uint8_t> bytes = w.serialize();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  model::ModelOptions opts;
  opts.adapters = {{path, 1.0f}};
  auto m = model::Model::load(metro::testing::default_model_path(), opts);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EngineConfig cfg;
  cfg.n_threads = 2;
  auto e = Engine::create(std::shared_ptr<const model::Model>(std::move(*m)), *default_model().tokenizer, cfg);
  ASSERT_TRUE(e.ok()) << e.status().message();
  Engine& eng = **e;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back(300 + (i * 37) % 900);
  auto request = [&](int16_t adapter) {
    Request r = greedy_request(prompt, 6);
    r.adapter = adapter;
    return r;
  };
  Generation base1 = collect(*eng.submit(request(0)));
  EXPECT_EQ(eng.cached_prefix_tokens(prompt, false, "", 0), 64);
  EXPECT_EQ(eng.cached_prefix_tokens(prompt, false, "", 1), 0);
  Generation ad1 = collect(*eng.submit(request(1)));
  EXPECT_EQ(ad1.usage.cached_prompt_tokens, 0);
  Generation ad2 = collect(*eng.submit(request(1)));
  EXPECT_EQ(ad2.usage.cached_prompt_tokens, 64);
  Generation base2 = collect(*eng.submit(request(0)));
  EXPECT_EQ(base2.usage.cached_prompt_tokens, 64);
  EXPECT_EQ(ad1.tokens, ad2.tokens);
  EXPECT_EQ(base1.tokens, base2.tokens);
  EXPECT_NE(ad1.tokens, base1.tokens);
  // Both at once, in shared steps: the same outputs.
  auto h0 = eng.submit(request(0));
  auto h1 = eng.submit(request(1));
  ASSERT_TRUE(h0.ok() && h1.ok());
  EXPECT_EQ(collect(*h0).tokens, base1.tokens);
  EXPECT_EQ(collect(*h1).tokens, ad1.tokens);
  EXPECT_FALSE(eng.submit(request(2)).ok());
  std::remove(path.c_str());
}

TEST(Engine, PreemptionUnderATightBudgetKeepsOutputs) {
  REQUIRE_MODEL();
  // Every sequence grows to ~3 blocks of 16 while the budget holds 9: even the smaller
  // sanitizer-sized run must preempt.
  const int n = sanitized() ? 8 : 20, gen = 24;
  auto ps = prompts(n);
  EngineConfig roomy;
  roomy.max_seqs = 32;
  auto want = run_all(*make_engine(roomy), ps, gen, true);
  EngineConfig tight;
  tight.max_seqs = 32;
  tight.kv_block = 16;
  tight.ctx_total = 3 * 48;  // room for about three sequences
  tight.prefix_cache = false;
  auto eng = make_engine(tight);
  auto got = run_all(*eng, ps, gen, true);
  for (int i = 0; i < n; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)]) << i;
  EXPECT_GT(eng->stats().preemptions, 0u);
  EXPECT_EQ(eng->stats().kv_blocks_used, 0);
}

TEST(Engine, ChoicesShareThePromptAndMatchSeparateSeededRequests) {
  REQUIRE_MODEL();
  auto p = prompts(1)[0];
  Request r;
  r.prompt = p;
  r.n = 3;
  r.stop.max_tokens = 10;
  r.sampling.temperature = 0.9f;
  r.sampling.seed = 77;
  r.sampling.has_seed = true;
  auto eng = make_engine({});
  auto choices = collect_choices(*eng->submit(r), 3);
  EXPECT_EQ(choices[0].usage.completion_tokens,
            static_cast<int>(choices[0].tokens.size() + choices[1].tokens.size() + choices[2].tokens.size()));
  for (int i = 0; i < 3; ++i) {
    Request single = r;
    single.n = 1;
    single.sampling.seed = 77 + static_cast<uint64_t>(i);
    auto eng2 = make_engine({.prefix_cache = false});
    EXPECT_EQ(collect(*eng2->submit(single)).tokens, choices[static_cast<size_t>(i)].tokens) << "choice " << i;
  }
  std::set<std::vector<int32_t>> distinct;
  for (auto& c : choices) distinct.insert(c.tokens);
  EXPECT_GT(distinct.size(), 1u);
  EXPECT_EQ(eng->stats().kv_blocks_used, 0);
}

// A client that does not read, with many choices: the stream fills while the children are
// forked from the parent's prompt, the request is aborted mid-fork, and no block may leak.
TEST(Engine, AbortWhileForkingChoicesLeavesNoBlocks) {
  REQUIRE_MODEL();
  EngineConfig cfg;
  cfg.stream_capacity = 4;
  auto eng = make_engine(cfg);
  Request r = greedy_request(prompts(1)[0], 64);
  r.n = 8;
  r.stop.ignore_eos = true;
  Handle h = *eng->submit(r);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // a client that does not read
  collect_choices(h, 8);  // what fit, then the final event (always accepted)
  EXPECT_EQ(eng->stats().requests_aborted, 1u);
  for (int i = 0; i < 100 && eng->stats().kv_blocks_used != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(eng->stats().kv_blocks_used, 0);
  // The engine still serves.
  EXPECT_EQ(collect(*eng->submit(greedy_request(prompts(1)[0], 4))).tokens.size(), 4u);
}

// A request whose deadline passes before its first token is ended (finish kAbort, code
// deadline_missed) and its KV freed; one that got its first token in time runs on past its
// deadline; neither disturbs the request ahead of them.
TEST(Engine, ADeadlinePassedBeforeTheFirstTokenEndsTheRequest) {
  REQUIRE_MODEL();
  auto eng = make_engine({.max_seqs = 1, .sched = "fcfs"});
  const auto ps = prompts(3);
  const int long_tokens = sanitized() ? 48 : 160;
  Request ahead = greedy_request(ps[0], long_tokens);
  ahead.stop.ignore_eos = true;
  Handle first = *eng->submit(ahead);
  // Waits behind `first` (one seat): its first token cannot come in 20 ms.
  Request late = greedy_request(ps[1], 8);
  late.deadline_ns = now_ns() + 20'000'000;
  Handle second = *eng->submit(late);
  Event fin;
  for (;;) {
    auto e = second.stream->pop(std::chrono::milliseconds(120000));
    ASSERT_TRUE(e.has_value());
    EXPECT_FALSE(e->kind == Event::Kind::kDelta && !e->tokens.empty()) << "a token came before the deadline";
    if (e->kind == Event::Kind::kFinish) fin = *e;
    if (e->kind == Event::Kind::kDone) break;
  }
  EXPECT_EQ(fin.reason, FinishReason::kAbort);
  EXPECT_EQ(fin.code, "deadline_missed");
  EXPECT_NE(fin.message.find("deadline"), std::string::npos) << fin.message;
  const Generation g = collect(first);
  EXPECT_EQ(g.reason, FinishReason::kLength);
  EXPECT_EQ(static_cast<int>(g.tokens.size()), long_tokens);
  EXPECT_EQ(eng->stats().requests_expired, 1u);
  // Alone, its first token comes well inside the deadline, and it runs on past it.
  Request in_time = greedy_request(ps[2], long_tokens);
  in_time.stop.ignore_eos = true;
  const int64_t t0 = now_ns();
  in_time.deadline_ns = t0 + (sanitized() ? 3'000'000'000 : 400'000'000);
  const Generation g2 = collect(*eng->submit(in_time));
  EXPECT_EQ(g2.reason, FinishReason::kLength);
  EXPECT_EQ(static_cast<int>(g2.tokens.size()), long_tokens);
  EXPECT_EQ(eng->stats().requests_expired, 1u);
  for (int i = 0; i < 100 && eng->stats().kv_blocks_used != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(eng->stats().kv_blocks_used, 0);
}

// A request whose output has begun and then stalls past its max_stall_ns is ended the same
// way (here a bound far below a step, so the first check after its first token ends it);
// one with a roomy bound runs to its end.
TEST(Engine, OutputStalledPastItsBoundEndsTheRequest) {
  REQUIRE_MODEL();
  auto eng = make_engine({});
  const auto ps = prompts(2);
  Request tight = greedy_request(ps[0], 4000);
  tight.stop.ignore_eos = true;
  tight.max_stall_ns = 1;
  Handle h = *eng->submit(tight);
  Event fin;
  int tokens = 0;
  for (;;) {
    auto e = h.stream->pop(std::chrono::milliseconds(120000));
    ASSERT_TRUE(e.has_value());
    if (e->kind == Event::Kind::kDelta) tokens += static_cast<int>(e->tokens.size());
    if (e->kind == Event::Kind::kFinish) fin = *e;
    if (e->kind == Event::Kind::kDone) break;
  }
  EXPECT_EQ(fin.reason, FinishReason::kAbort);
  EXPECT_EQ(fin.code, "deadline_missed");
  EXPECT_GE(tokens, 1);
  EXPECT_LT(tokens, 4000);
  Request roomy = greedy_request(ps[1], 24);
  roomy.stop.ignore_eos = true;
  roomy.max_stall_ns = 60'000'000'000;
  const Generation g = collect(*eng->submit(roomy));
  EXPECT_EQ(g.reason, FinishReason::kLength);
  EXPECT_EQ(g.tokens.size(), 24u);
  EXPECT_EQ(eng->stats().requests_expired, 1u);
  for (int i = 0; i < 100 && eng->stats().kv_blocks_used != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(eng->stats().kv_blocks_used, 0);
}

TEST(Engine, StopConditionsAndUsage) {
  REQUIRE_MODEL();
  auto eng = make_engine({});
  auto p = prompts(1)[0];
  Generation full = collect(*eng->submit(greedy_request(p, 16)));
  ASSERT_EQ(full.tokens.size(), 16u);
  EXPECT_EQ(full.reason, FinishReason::kLength);
  EXPECT_EQ(full.usage.completion_tokens, 16);
  EXPECT_EQ(full.usage.prompt_tokens, static_cast<int>(p.size()));
  // A stop string taken from the middle of the greedy text ends generation before it.
  ASSERT_GT(full.text.size(), 8u);
  const std::string stop = full.text.substr(full.text.size() / 2, 3);
  Request r = greedy_request(p, 16);
  r.stop.stop = {stop};
  Generation s = collect(*eng->submit(r));
  EXPECT_EQ(s.reason, FinishReason::kStop);
  EXPECT_EQ(s.text, full.text.substr(0, full.text.find(stop)));
  // A stop token: the 4th greedy token.
  Request t = greedy_request(p, 16);
  t.stop.stop_token_ids = {full.tokens[3]};
  Generation st = collect(*eng->submit(t));
  EXPECT_EQ(st.reason, FinishReason::kStop);
  EXPECT_LE(st.tokens.size(), 4u);
}

// --step-trace (a StepObserver): one line per step with what the cost model is fitted from.
// A chunked prompt's lines add up to the prompt and its whole causal triangle of (query,
// key) pairs; each decode reads its context.
TEST(Engine, StepTraceRecordsEachStepsWork) {
  REQUIRE_MODEL();
  const std::string path = ::testing::TempDir() + "metro_step_trace.txt";
  const auto p = prompts(3)[2];
  const int64_t n = static_cast<int64_t>(p.size());
  ASSERT_GT(n, 16);
  {
    auto trace = StepTraceWriter::open(path);
    ASSERT_TRUE(trace.ok());
    auto eng = make_engine({.max_batch_tokens = 16});
    eng->add_observer(*trace);
    ASSERT_EQ(collect(*eng->submit(greedy_request(p, 5))).tokens.size(), 5u);
  }  // the last owner of the writer closes the file
  std::ifstream in(path);
  ASSERT_TRUE(in.good());
  std::string header;
  std::getline(in, header);
  EXPECT_EQ(header.rfind("# step_s", 0), 0u);
  double step_s = 0, pairs = 0, keys = 0, attention_s = 0, total_pairs = 0, total_keys = 0;
  int prefill = 0, decodes = 0, rows = 0, total_prefill = 0, total_decodes = 0, total_rows = 0, lines = 0;
  while (in >> step_s >> prefill >> decodes >> pairs >> keys >> rows >> attention_s) {
    EXPECT_GT(step_s, 0.0);
    EXPECT_LE(prefill, 16);
    EXPECT_GT(attention_s, 0.0);  // every step attends
    EXPECT_LT(attention_s, step_s);
    total_rows += rows;
    total_prefill += prefill;
    total_decodes += decodes;
    total_pairs += pairs;
    total_keys += keys;
    ++lines;
  }
  EXPECT_EQ(total_prefill, n);
  EXPECT_EQ(total_decodes, 4);  // the first token comes from the prompt's last chunk
  EXPECT_DOUBLE_EQ(total_pairs, static_cast<double>(n * (n + 1) / 2));
  EXPECT_DOUBLE_EQ(total_keys, static_cast<double>(4 * n + 1 + 2 + 3 + 4));  // keys n+1 .. n+4
  EXPECT_EQ(lines, static_cast<int>((n + 15) / 16) + 4);
  EXPECT_EQ(total_rows, 5);  // the prompt's last chunk and the four decodes
  std::remove(path.c_str());

  auto bad = StepTraceWriter::open("/nonexistent-dir/trace.txt");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--step-trace"), std::string::npos);
  EXPECT_EQ(bad.status().message().find("nonexistent"), std::string::npos);  // no paths in errors
}

// Admission judges a class's pace from two counts in every step report: the output tokens
// given to sequences whose output had begun (first tokens excluded) and how many had begun.
class PaceWatch : public StepObserver {
 public:
  void on_step(const StepReport& r) override {
    std::lock_guard lock(mu);
    for (size_t k = 0; k < r.begun_by_class.size(); ++k) {
      output[k] += r.output_tokens_by_class[k];
      max_begun[k] = std::max(max_begun[k], r.begun_by_class[k]);
      EXPECT_LE(r.output_tokens_by_class[k], r.begun_by_class[k]);  // one token each, no drafts here
    }
  }
  std::mutex mu;
  std::array<int, kNumSlaClasses> output{};
  std::array<int, kNumSlaClasses> max_begun{};
};

TEST(Engine, StepReportsCountEachClassesOutputAndBegunRequests) {
  REQUIRE_MODEL();
  auto watch = std::make_shared<PaceWatch>();
  {
    auto eng = make_engine({.max_batch_tokens = 16});
    eng->add_observer(watch);
    const auto ps = prompts(3);
    Request batch = greedy_request(ps[0], 6);
    batch.sla_class = SlaClass::kBatch;
    Request standard = greedy_request(ps[1], 9);
    auto a = eng->submit(batch);
    auto b = eng->submit(standard);
    ASSERT_EQ(collect(*a).tokens.size(), 6u);
    ASSERT_EQ(collect(*b).tokens.size(), 9u);
  }  // the engine's thread has ended: every report is in
  std::lock_guard lock(watch->mu);
  EXPECT_EQ(watch->output[static_cast<size_t>(SlaClass::kBatch)], 5);
  EXPECT_EQ(watch->output[static_cast<size_t>(SlaClass::kStandard)], 8);
  EXPECT_EQ(watch->output[static_cast<size_t>(SlaClass::kRealtime)], 0);
  EXPECT_EQ(watch->max_begun[static_cast<size_t>(SlaClass::kBatch)], 1);
  EXPECT_EQ(watch->max_begun[static_cast<size_t>(SlaClass::kStandard)], 1);
  EXPECT_EQ(watch->max_begun[static_cast<size_t>(SlaClass::kRealtime)], 0);
}

// Every policy fits the step cost from the engine's step reports (FCFS schedules nothing by
// it; /metrics and bench/sla_scenarios.py --capacity-def model read it).
TEST(Engine, FitsItsStepCostUnderEveryPolicy) {
  REQUIRE_MODEL();
  EngineConfig cfg;
  cfg.sched = "fcfs";
  cfg.max_batch_tokens = 16;
  auto eng = make_engine(cfg);
  EXPECT_EQ(eng->stats().scheduler.step_cost.per_prefill_token_s, 0.0);  // nothing timed yet
  const auto p = prompts(3)[2];
  ASSERT_EQ(collect(*eng->submit(greedy_request(p, 8))).tokens.size(), 8u);
  const EngineStats st = eng->stats();
  const sched::StepCostModel& c = st.scheduler.step_cost;
  EXPECT_GT(c.per_prefill_token_s, 0.0);
  EXPECT_EQ(c.per_decode_seq_s, c.per_prefill_token_s);  // one per-token term
  // A token costs less than all the steps took together (each step computes one or more).
  EXPECT_LT(c.per_prefill_token_s, st.step_seconds_total);
  EXPECT_EQ(st.scheduler.step_budget_tokens, 16);
}

TEST(Engine, RefusesWhatCanNeverFit) {
  REQUIRE_MODEL();
  auto eng = make_engine({.ctx_total = 256});
  auto r = greedy_request(std::vector<int32_t>(300, 5), 4);
  auto h = eng->submit(r);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), ErrorCode::kOutOfRange);
  EXPECT_FALSE(eng->submit(greedy_request({}, 4)).ok());
  EXPECT_FALSE(eng->submit(greedy_request({-1}, 4)).ok());
  EXPECT_FALSE(eng->submit(greedy_request({1 << 20}, 4)).ok());
  EXPECT_FALSE(eng->submit(greedy_request({1, 2}, 0)).ok());
  auto ctx = greedy_request({1, 2}, 100000);
  EXPECT_EQ(eng->submit(ctx).status().code(), ErrorCode::kOutOfRange);
}

TEST(Engine, StressRandomArrivalsAndAbortsLeaveNoBlocks) {
  REQUIRE_MODEL();
  const int total = sanitized() ? 100 : 1000;
  auto eng = make_engine({.ctx_total = 4096, .max_batch_tokens = 128, .max_seqs = 32});
  std::mt19937 rng(5);
  const auto& tok = *default_model().tokenizer;
  std::vector<Handle> live;
  int finished = 0;
  for (int i = 0; i < total; ++i) {
    std::vector<int32_t> prompt;
    const int len = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < len; ++k) prompt.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(tok.n_vocab())));
    Request r = greedy_request(prompt, 1 + static_cast<int>(rng() % 6));
    r.n = rng() % 10 == 0 ? 2 : 1;
    auto h = eng->submit(r);
    ASSERT_TRUE(h.ok()) << h.status().message();
    live.push_back(*h);
    if (rng() % 4 == 0) eng->abort(live[rng() % live.size()].id);
    if (rng() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    if (live.size() > 64) {
      collect_choices(live.front(), 2);
      live.erase(live.begin());
      ++finished;
    }
  }
  for (auto& h : live) {
    collect_choices(h, 2);
    ++finished;
  }
  EXPECT_EQ(finished, total);
  // The gauges are refreshed on the engine thread right after a request's last event: give
  // it a moment (a choice's finish event can reach us before that refresh).
  auto settled = [&] {
    const auto s = eng->stats();
    return s.kv_blocks_used == 0 && s.running == 0 && s.waiting == 0;
  };
  for (int i = 0; i < 100 && !settled(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto st = eng->stats();
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
}

TEST(Engine, EmbeddingsAreUnitNormAndDeterministic) {
  REQUIRE_MODEL();
  auto eng = make_engine({});
  const auto& tok = *default_model().tokenizer;
  Request r;
  r.kind = RequestKind::kEmbed;
  r.prompt = tok.encode("The quick brown fox jumps over the lazy dog.", true, false);
  Generation a = collect(*eng->submit(r));
  ASSERT_EQ(a.embedding.size(), default_model().model->hparams().n_embd);
  double norm = 0;
  for (float v : a.embedding) norm += static_cast<double>(v) * v;
  EXPECT_NEAR(std::sqrt(norm), 1.0, 1e-5);
  // Alongside a generation, and again: the same vector.
  auto g = eng->submit(greedy_request(prompts(1)[0], 8));
  Generation b = collect(*eng->submit(r));
  collect(*g);
  EXPECT_EQ(a.embedding, b.embedding);
  Request other = r;
  other.prompt = tok.encode("Completely unrelated words about tax law.", true, false);
  Generation c = collect(*eng->submit(other));
  double dot = 0;
  for (size_t i = 0; i < a.embedding.size(); ++i) dot += static_cast<double>(a.embedding[i]) * c.embedding[i];
  EXPECT_LT(dot, 0.9999);
}

// submit_all: the requests enter the intake together, so an idle engine computes every
// embedding of the batch in one step (what the embeddings batching window relies on); a
// refused request answers in its slot without stopping the others.
TEST(Engine, SubmitAllStartsTogetherAndAnswersEachSlot) {
  REQUIRE_MODEL();
  EngineConfig cfg;
  cfg.sched = "fcfs";
  auto eng = make_engine(cfg);
  const auto& tok = *default_model().tokenizer;
  const char* texts[] = {"The quick brown fox.", "Tax law is complicated.", "Jazz was born in New Orleans."};
  std::vector<Request> batch;
  std::vector<std::vector<float>> alone;
  for (const char* t : texts) {
    Request r;
    r.kind = RequestKind::kEmbed;
    r.prompt = tok.encode(t, true, false);
    alone.push_back(collect(*eng->submit(r)).embedding);
    batch.push_back(r);
  }
  Request bad;
  bad.kind = RequestKind::kEmbed;
  bad.prompt = {-5};
  batch.insert(batch.begin() + 1, bad);
  // The last step of the runs alone is counted after its event: wait until the count settles.
  uint64_t steps_before = eng->stats().steps;
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const uint64_t now = eng->stats().steps;
    if (now == steps_before) break;
    steps_before = now;
  }
  std::vector<Expected<Handle>> hs = eng->submit_all(batch);
  ASSERT_EQ(hs.size(), 4u);
  ASSERT_FALSE(hs[1].ok());
  EXPECT_EQ(hs[1].status().code(), ErrorCode::kInvalidArgument);
  const size_t order[] = {0, 2, 3};
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(hs[order[k]].ok());
    const std::vector<float> v = collect(*hs[order[k]]).embedding;
    ASSERT_EQ(v.size(), alone[k].size());
    for (size_t d = 0; d < v.size(); ++d) ASSERT_NEAR(v[d], alone[k][d], 1e-4) << "input " << k << " dim " << d;
  }
  // A step's counters are published after its events: wait for them, then a little more in
  // case a second step is still being counted.
  for (int i = 0; i < 500 && eng->stats().steps == steps_before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(eng->stats().steps - steps_before, 1u);  // every input in one step
}


// Proposes the tokens of a script (prompt and the continuation the engine gives without
// speculation), every `wrong_every`-th position made wrong (0: none wrong, 1: all wrong).
class ScriptProposer final : public speculative::Proposer {
 public:
  ScriptProposer(std::vector<std::vector<int32_t>> scripts, int wrong_every)
      : scripts_(std::move(scripts)), wrong_every_(wrong_every) {}
  speculative::DraftSource propose(const speculative::ProposeInput& in, int k, std::vector<int32_t>& out) override {
    const sched::SeqState& seq = *in.seq;
    ++calls;
    for (const auto& script : scripts_) {
      if (script.size() < seq.tokens.size() || !std::equal(seq.tokens.begin(), seq.tokens.end(), script.begin())) {
        continue;
      }
      for (size_t p = seq.tokens.size(); p < script.size() && out.size() < static_cast<size_t>(k); ++p) {
        const bool wrong = wrong_every_ > 0 && p % static_cast<size_t>(wrong_every_) == 0;
        out.push_back(wrong ? (script[p] + 1) % 1000 : script[p]);
      }
      return speculative::DraftSource::kContext;
    }
    return speculative::DraftSource::kNone;
  }
  int calls = 0;

 private:
  std::vector<std::vector<int32_t>> scripts_;
  int wrong_every_;
};

// Speculation-ready step: drafts are computed with the sequence's next token in one step and
// verified by the sampler row by row, so the output is exactly what the engine gives without
// them, right drafts save steps, wrong ones only cost compute, and rejected drafts give
// their KV back.
TEST(Engine, DraftsAreVerifiedAndNeverChangeTheOutput) {
  REQUIRE_MODEL();
  const auto ps = prompts(3);
  const int n_out = sanitized() ? 12 : 24;
  auto plain = make_engine({});
  const auto want = run_all(*plain, ps, n_out, /*together=*/true);
  const uint64_t plain_steps = plain->stats().steps;
  std::vector<std::vector<int32_t>> scripts;
  for (size_t i = 0; i < ps.size(); ++i) {
    scripts.push_back(ps[i]);
    scripts.back().insert(scripts.back().end(), want[i].begin(), want[i].end());
  }
  for (int wrong_every : {0, 3, 1}) {
    SCOPED_TRACE("wrong every " + std::to_string(wrong_every));
    auto proposer = std::make_shared<ScriptProposer>(scripts, wrong_every);
    EngineConfig cfg;
    cfg.proposer = proposer;
    cfg.max_draft_tokens = 4;
    cfg.adaptive_drafts = false;
    auto eng = make_engine(cfg);
    EXPECT_EQ(run_all(*eng, ps, n_out, /*together=*/true), want);
    const EngineStats st = eng->stats();
    EXPECT_GT(proposer->calls, 0);
    EXPECT_GT(st.draft_tokens, 0u);
    EXPECT_LE(st.accepted_tokens, st.draft_tokens);
    EXPECT_EQ(st.generated_tokens, static_cast<uint64_t>(3 * n_out));
    EXPECT_EQ(st.kv_blocks_used, 0);
    if (wrong_every == 0) {
      EXPECT_EQ(st.accepted_tokens, st.draft_tokens);
      EXPECT_LT(st.steps, plain_steps);  // up to five tokens a step instead of one
    }
    if (wrong_every == 1) {
      EXPECT_EQ(st.accepted_tokens, 0u);
    }
  }
}

// With sampling, each row is drawn from the model's processed distribution with the
// request's own random stream, so a seeded request gives the same tokens with drafts.
TEST(Engine, DraftsKeepSeededSamplingExact) {
  REQUIRE_MODEL();
  const auto p = prompts(2)[1];
  Request r = greedy_request(p, 20);
  r.sampling.temperature = 0.9f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = 1234;
  r.sampling.has_seed = true;
  r.stop.ignore_eos = true;
  auto plain = make_engine({});
  const std::vector<int32_t> want = collect(*plain->submit(r)).tokens;
  std::vector<int32_t> script = p;
  script.insert(script.end(), want.begin(), want.end());
  EngineConfig cfg;
  cfg.proposer = std::make_shared<ScriptProposer>(std::vector<std::vector<int32_t>>{script}, 0);
  cfg.max_draft_tokens = 3;
  cfg.adaptive_drafts = false;
  auto eng = make_engine(cfg);
  EXPECT_EQ(collect(*eng->submit(r)).tokens, want);
  EXPECT_GT(eng->stats().accepted_tokens, 0u);
  // max_tokens and stop tokens hold with drafts: nothing past them is emitted.
  Request shorter = r;
  shorter.stop.max_tokens = 7;
  EXPECT_EQ(collect(*eng->submit(shorter)).tokens, std::vector<int32_t>(want.begin(), want.begin() + 7));
  Request stopped = r;
  stopped.stop.stop_token_ids = {want[5]};
  const auto got = collect(*eng->submit(stopped)).tokens;
  const size_t first = static_cast<size_t>(std::find(want.begin(), want.end(), want[5]) - want.begin());
  EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.begin() + static_cast<long>(first) + 1));
}

}  // namespace
}  // namespace metro::engine
