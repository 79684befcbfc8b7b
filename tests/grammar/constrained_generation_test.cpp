// Structured outputs through the engine on the default model: sampled and greedy outputs
// under a JSON schema parse and have the schema's shape, constrained and free requests
// share batches without touching each other's text, and speculation (drafts checked
// against the grammar) gives the same constrained text as without it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/speculative/ngram.h"
#include "grammar/cache.h"
#include "grammar/json_schema.h"
#include "server/tool_calls.h"
#include "support/test_util.h"

namespace metro::grammar {
namespace {

using metro::testing::collect;
using metro::testing::default_model;
using metro::testing::Generation;
using metro::testing::greedy_request;
using metro::testing::sanitized;

std::unique_ptr<engine::Engine> make_engine(engine::EngineConfig cfg = {}) {
  const auto& sm = default_model();
  if (cfg.n_threads == 0) cfg.n_threads = 2;
  auto e = engine::Engine::create(sm.model, *sm.tokenizer, cfg);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return std::move(*e);
}

const char* kSchema = R"({"type":"object","properties":{
    "name":{"type":"string","maxLength":12},
    "age":{"type":"integer","minimum":0},
    "tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2}},
  "required":["name","age"]})";

std::shared_ptr<const CompiledGrammar> person_grammar(GrammarCache& cache) {
  auto g = cache.get("person", [] { return json_schema_grammar(nlohmann::ordered_json::parse(kSchema)); });
  EXPECT_TRUE(g.ok()) << g.status().message();
  return *g;
}

// The schema's shape, checked without the grammar.
void expect_person(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << text;
  ASSERT_TRUE(j.is_object()) << text;
  ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
  EXPECT_LE(j["name"].get<std::string>().size(), 12u * 4) << text;  // 12 characters, up to 4 bytes each
  ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer() && j["age"].get<int64_t>() >= 0) << text;
  if (j.contains("tags")) {
    ASSERT_TRUE(j["tags"].is_array() && j["tags"].size() <= 2) << text;
    for (const auto& t : j["tags"]) EXPECT_TRUE(t == "a" || t == "b") << text;
  }
  for (const auto& [k, v] : j.items()) {
    (void)v;
    EXPECT_TRUE(k == "name" || k == "age" || k == "tags") << text;
  }
}

engine::Request person_request(const std::shared_ptr<const CompiledGrammar>& g, int max_tokens) {
  const auto& tok = *default_model().tokenizer;
  engine::Request r = greedy_request(tok.encode("A person, as JSON with name, age and tags:", true, false), max_tokens);
  r.grammar = g;
  return r;
}

TEST(StructuredOutput, SampledAndGreedyOutputsHaveTheSchemasShape) {
  REQUIRE_MODEL();
  auto eng = make_engine();
  GrammarCache cache(*default_model().tokenizer);
  auto g = person_grammar(cache);
  const int runs = sanitized() ? 3 : 10;
  int stopped = 0;
  for (int i = 0; i <= runs; ++i) {
    engine::Request r = person_request(g, 96);
    if (i > 0) {
      r.sampling.temperature = 1.0f;
      r.sampling.seed = 77 + static_cast<uint64_t>(i);
      r.sampling.has_seed = true;
    }
    const Generation out = collect(*eng->submit(r));
    if (out.reason == engine::FinishReason::kLength) continue;  // cut by max_tokens
    ASSERT_EQ(out.reason, engine::FinishReason::kStop) << out.text;
    ++stopped;
    expect_person(out.text);
  }
  EXPECT_GE(stopped, (runs + 1) / 2);
  EXPECT_GT(g->cache_stats().hits, 0u);
}

TEST(StructuredOutput, ConstrainedAndFreeRequestsShareABatch) {
  REQUIRE_MODEL();
  auto eng = make_engine();
  GrammarCache cache(*default_model().tokenizer);
  auto g = person_grammar(cache);
  const auto& tok = *default_model().tokenizer;
  engine::Request free = greedy_request(tok.encode("The weather today is", true, false), 24);
  free.stop.ignore_eos = true;
  const Generation alone = collect(*eng->submit(free));
  const Generation constrained_alone = collect(*eng->submit(person_request(g, 64)));
  std::vector<engine::Handle> hs;
  hs.push_back(*eng->submit(free));
  for (int i = 0; i < 3; ++i) hs.push_back(*eng->submit(person_request(g, 64)));
  EXPECT_EQ(collect(hs[0]).tokens, alone.tokens) << "a free request's text changed beside constrained ones";
  for (size_t i = 1; i < hs.size(); ++i) {
    const Generation out = collect(hs[i]);
    EXPECT_EQ(out.tokens, constrained_alone.tokens) << i;
    if (out.reason == engine::FinishReason::kStop) expect_person(out.text);
  }
}

TEST(StructuredOutput, SpeculationKeepsTheConstrainedText) {
  REQUIRE_MODEL();
  GrammarCache cache(*default_model().tokenizer);
  auto g = person_grammar(cache);
  const Generation want = collect(*make_engine()->submit(person_request(g, 64)));
  engine::EngineConfig cfg;
  cfg.proposer = std::make_shared<engine::speculative::NgramProposer>();
  cfg.max_draft_tokens = 8;
  cfg.adaptive_drafts = false;
  auto eng = make_engine(cfg);
  engine::Request r = person_request(g, 64);
  // A prediction that is partly wrong and partly outside the grammar.
  r.prediction = default_model().tokenizer->encode(want.text.substr(0, want.text.size() / 2) + "}} not json",
                                                   false, false);
  const Generation got = collect(*eng->submit(r));
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_GT(eng->stats().draft_tokens, 0u);
}

// Jump-forward: tokens the grammar forces are verified in the step that finds them; greedy
// and seeded sampled texts are those without it, alone and in a batch, in fewer steps.
TEST(StructuredOutput, JumpForwardKeepsTheTextInFewerSteps) {
  REQUIRE_MODEL();
  const auto& tok = *default_model().tokenizer;
  GrammarCache cache(tok);
  server::ToolRequest tools;
  tools.format = server::ToolFormat::kHermes;
  tools.mode = server::ToolRequest::Mode::kRequired;
  tools.functions.push_back({"get_weather", "", nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"location":{"type":"string","maxLength":24},
          "unit":{"enum":["celsius","fahrenheit"]}},"required":["location","unit"]})")});
  tools.functions.push_back({"get_time", "", nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"zone":{"type":"string","maxLength":24}},"required":["zone"]})")});
  auto g = cache.get("tools", [&] { return server::tool_call_grammar(tools); });
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto request = [&](int i) {
    engine::Request r = greedy_request(tok.encode("Call a tool for the weather in Paris:", true, false), 56);
    r.grammar = *g;
    if (i > 0) {
      r.sampling.temperature = 0.9f;
      r.sampling.seed = 5 + static_cast<uint64_t>(i);
      r.sampling.has_seed = true;
    }
    return r;
  };
  const int n = 4;
  for (int batch : {1, n}) {
    std::vector<Generation> outs[2];
    uint64_t steps[2] = {0, 0};
    for (int on = 0; on < 2; ++on) {
      engine::EngineConfig cfg;
      cfg.jump_forward = on == 1;
      auto eng = make_engine(cfg);
      if (batch == 1) {
        for (int i = 0; i < n; ++i) outs[on].push_back(collect(*eng->submit(request(i))));
      } else {
        std::vector<engine::Handle> hs;
        for (int i = 0; i < n; ++i) hs.push_back(*eng->submit(request(i)));
        for (engine::Handle& h : hs) outs[on].push_back(collect(h));
      }
      const engine::EngineStats st = eng->stats();
      steps[on] = st.steps;
      const auto forced = static_cast<size_t>(engine::speculative::DraftSource::kGrammar);
      if (on == 1) {
        EXPECT_GT(st.spec_proposed[forced], 0u) << "no token was forced";
        EXPECT_EQ(st.spec_accepted[forced], st.spec_proposed[forced]) << "a forced token was not accepted";
      } else {
        EXPECT_EQ(st.spec_proposed[forced], 0u);
      }
    }
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(outs[1][static_cast<size_t>(i)].tokens, outs[0][static_cast<size_t>(i)].tokens)
          << "batch " << batch << " request " << i << ": " << outs[0][static_cast<size_t>(i)].text;
      EXPECT_EQ(outs[1][static_cast<size_t>(i)].reason, outs[0][static_cast<size_t>(i)].reason);
    }
    if (batch == 1) {
      EXPECT_LT(steps[1], steps[0]);
    }
  }
}

// A grammar with a trigger holds only once the output spells it: before, the text is what
// it is without the grammar; from the trigger on, it follows the grammar and stops when
// the grammar is complete. (Tool calls under tool_choice auto.)
TEST(StructuredOutput, AGrammarWithATriggerHoldsFromTheTriggerOn) {
  REQUIRE_MODEL();
  auto eng = make_engine();
  const auto& tok = *default_model().tokenizer;
  const std::vector<int32_t> prompt = tok.encode("The capital of France is", true, false);
  Generation free = collect(*eng->submit(greedy_request(prompt, 12)));
  ASSERT_GE(free.tokens.size(), 4u);
  // The trigger: the free output's third token, whole.
  const std::string trigger = tok.token_to_piece(free.tokens[2]);
  ASSERT_FALSE(trigger.empty());
  std::string before;
  for (int i = 0; i < 2; ++i) before += tok.token_to_piece(free.tokens[static_cast<size_t>(i)]);
  ASSERT_EQ(before.find(trigger), std::string::npos) << "pick a token that does not occur earlier";
  Builder b;
  const Element root = b.seq({b.literal(trigger), b.alt({b.literal(" [yes]"), b.literal(" [no]")})}, "root");
  GrammarCache cache(tok);
  auto g = cache.get("trigger:" + trigger, [&] { return Expected<Grammar>(b.take(root.index)); });
  ASSERT_TRUE(g.ok()) << g.status().message();
  for (const bool with_trigger : {true, false}) {
    engine::Request r = greedy_request(prompt, 12);
    r.grammar = *g;
    if (with_trigger) r.grammar_trigger = trigger;
    Generation out = collect(*eng->submit(r));
    if (with_trigger) {
      EXPECT_EQ(out.reason, engine::FinishReason::kStop);
      EXPECT_TRUE(out.text == before + trigger + " [yes]" || out.text == before + trigger + " [no]") << out.text;
    } else {
      // Without the trigger the grammar holds from the first byte: the output starts with it.
      EXPECT_EQ(out.text.rfind(trigger, 0), 0u) << out.text;
    }
  }
  // A trigger the output never spells leaves it free: the same text as without a grammar.
  engine::Request r = greedy_request(prompt, 12);
  r.grammar = *g;
  r.grammar_trigger = "\x01never\x01";
  EXPECT_EQ(collect(*eng->submit(r)).text, free.text);
}

// A free output that opens a constrained part with a control token (a tool-call format can
// open with one, as [TOOL_CALLS]): the text shows the control token, so that what reads the
// output finds the trigger where the grammar did.
TEST(StructuredOutput, AControlTokenThatTriggersTheGrammarKeepsItsText) {
  REQUIRE_MODEL();
  auto eng = make_engine();
  const auto& tok = *default_model().tokenizer;
  const std::vector<int32_t> im_start = tok.encode("<|im_start|>", false, true);
  ASSERT_EQ(im_start.size(), 1u);
  ASSERT_TRUE(tok.is_control(im_start[0]));
  Builder b;
  const Element root = b.seq({b.literal("<|im_start|>"), b.alt({b.literal(" yes"), b.literal(" no")})}, "root");
  GrammarCache cache(tok);
  auto g = cache.get("control", [&] { return Expected<Grammar>(b.take(root.index)); });
  ASSERT_TRUE(g.ok());
  engine::Request r = greedy_request(tok.encode("Say yes.", true, false), 8);
  r.grammar = *g;
  r.grammar_trigger = "<|im_start|>";
  r.sampling.logit_bias.push_back({im_start[0], 100.0f});  // the free part opens with it
  Generation out = collect(*eng->submit(r));
  EXPECT_EQ(out.reason, engine::FinishReason::kStop);
  ASSERT_FALSE(out.tokens.empty());
  EXPECT_EQ(out.tokens[0], im_start[0]);
  EXPECT_TRUE(out.text == "<|im_start|> yes" || out.text == "<|im_start|> no") << out.text;
}

// Spelled by a grammar from its first byte, a control token's text is made of ordinary
// tokens (the vocabulary trie leaves control tokens out).
TEST(StructuredOutput, AGrammarSpellsControlTextWithOrdinaryTokens) {
  REQUIRE_MODEL();
  auto eng = make_engine();
  const auto& tok = *default_model().tokenizer;
  Builder b;
  const Element root = b.seq({b.literal("<|im_start|>"), b.literal("ok")}, "root");
  GrammarCache cache(tok);
  auto g = cache.get("control-spelled", [&] { return Expected<Grammar>(b.take(root.index)); });
  ASSERT_TRUE(g.ok());
  engine::Request r = greedy_request(tok.encode("Say ok.", true, false), 16);
  r.grammar = *g;
  Generation out = collect(*eng->submit(r));
  EXPECT_EQ(out.reason, engine::FinishReason::kStop) << out.text;
  EXPECT_EQ(out.text, "<|im_start|>ok");
  for (int32_t id : out.tokens) EXPECT_FALSE(tok.is_control(id)) << id;
}

}  // namespace
}  // namespace metro::grammar
